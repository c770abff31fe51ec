"""The Kafka door's transaction handlers (``service.kafka.transactions``) over a scripted
transaction coordinator: what each API answers, per version, for each answer or error
of the coordinator, and what the ACLs let through. The coordinator's own behaviour is
``coordinator.log.transactions``' (its tests); real clients are in
``tests/integration/test_kafka_transactions.py``."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.add_offsets_to_txn.v1.request import AddOffsetsToTxnRequest as AddOffsetsV1
from kio.schema.add_partitions_to_txn.v1 import request as apv1
from kio.schema.add_partitions_to_txn.v3 import request as apv3
from kio.schema.add_partitions_to_txn.v5 import request as apv5
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.end_txn.v1.request import EndTxnRequest as EndTxnV1
from kio.schema.end_txn.v5.request import EndTxnRequest as EndTxnV5
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v0.request import FindCoordinatorRequest as FindCoordinatorV0
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.init_producer_id.v3.request import InitProducerIdRequest as InitV3
from kio.schema.init_producer_id.v6.request import InitProducerIdRequest as InitV6
from kio.schema.list_transactions.v2.request import ListTransactionsRequest
from kio.schema.txn_offset_commit.v5 import request as tocv5

from coordinator.client import PendingMarkers, TopicInfo, TopicPartition, TransactionInfo
from coordinator.client import TxnProducer as Producer
from coordinator.security.model import Authorizer, Operation, ResourceType
from segments.errors import (
    ConcurrentTransactionsError,
    CoordinatorUnavailableError,
    InvalidTxnStateError,
    StorageUnavailableError,
    TopicNotFoundError,
    TransactionFencedError,
)
from service.kafka import groups, transactions
from service.kafka.acl import RULES, Access
from service.kafka.framing import Request, RequestHeader, encode_response, request_class
from service.kafka.handlers import KafkaContext, init_producer_id
from service.kafka.server import HANDLERS
from tests.kafka_wire import make

TOPICS = {"t": TopicInfo("t", uuid.uuid4().bytes, 2), "u": TopicInfo("u", uuid.uuid4().bytes, 1)}
PENDING = PendingMarkers("tx", 7, 1, False, ((TOPICS["t"].topic_id, 0),))


class Txns:
    """A transaction coordinator that answers from ``script`` (method -> a list of
    answers or exceptions, taken in turn) and records every call."""

    def __init__(self, **script: list[Any]) -> None:
        self.script = script
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def method(*args: Any, **_kwargs: Any) -> Any:
            self.calls.append((name, args))
            answers = self.script.get(name, [None])
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            if isinstance(answer, Exception):
                raise answer
            return answer

        return method

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.calls if n == name]


class Topics:
    async def get(self, name: str) -> TopicInfo:
        if name not in TOPICS:
            raise TopicNotFoundError(f"Topic '{name}' not found.")
        return TOPICS[name]


class Writer:
    def __init__(self, fail: int = 0) -> None:
        self.written: list[PendingMarkers] = []
        self.fail = fail

    def write_markers(self, pending: PendingMarkers) -> None:
        if self.fail:
            self.fail -= 1
            raise StorageUnavailableError("the store is down")
        self.written.append(pending)


def context(txns: Txns, writer: Writer | None = None) -> KafkaContext:
    state = SimpleNamespace(
        txns=txns,
        coordinator=txns,
        topics=Topics(),
        writer=writer or Writer(),
        gate=None,
        broker_id=3,
        settings=SimpleNamespace(kafka_transaction_abort_interval_ms=10),
    )
    return KafkaContext(state, "agent-host", 9092)  # type: ignore[arg-type]


class Denying(Authorizer):
    """Allows everything but the (operation, resource type, name) triples in ``denied``."""

    def __init__(self, *denied: tuple[Operation, ResourceType, str]) -> None:
        self.denied = set(denied)

    def authorize(
        self, principal: str, host: str, op: Operation, rtype: ResourceType, name: str
    ) -> bool:
        return (op, rtype, name) not in self.denied

    def authorize_any(self, principal: str, host: str, op: Operation, rtype: ResourceType) -> bool:
        return True


def access(api_key: int, *denied: tuple[Operation, ResourceType, str]) -> Access:
    return Access(RULES[api_key], Denying(*denied) if denied else None, "User:alice")


def call(handler: Any, ctx: KafkaContext, body: Any, acl: Access | None = None) -> Any:
    header = RequestHeader(body.__api_key__, body.__version__, 1, "test")
    return asyncio.run(handler(ctx, Request(header, body), acl or access(body.__api_key__)))


TXN_ID = ResourceType.TRANSACTIONAL_ID


# -- FindCoordinator, InitProducerId -------------------------------------------------------


def test_find_coordinator_answers_this_agent_for_a_transactional_id() -> None:
    ctx = context(Txns())
    body = FindCoordinatorRequest(key_type=1, coordinator_keys=("tx", "secret"))
    got = call(
        groups.find_coordinator, ctx, body, access(10, (Operation.DESCRIBE, TXN_ID, "secret"))
    )
    tx, secret = got.coordinators
    assert (tx.error_code, tx.node_id, tx.host, tx.port) == (ErrorCode.none, 3, "agent-host", 9092)
    assert (secret.error_code, secret.node_id) == (
        ErrorCode.transactional_id_authorization_failed,
        -1,
    )


def test_find_coordinator_v0_asks_for_a_group() -> None:
    """v0 has no key type (groups only): it was read as if it had one, and the connection
    closed on the AttributeError."""
    got = call(groups.find_coordinator, context(Txns()), FindCoordinatorV0(key="g"))
    assert (got.error_code, got.node_id, got.port) == (ErrorCode.none, 3, 9092)


def init_body(cls: Any = InitV6, **fields: Any) -> Any:
    return cls(
        transactional_id="tx",
        transaction_timeout=datetime.timedelta(seconds=60),
        **fields,
    )


def test_init_producer_id_writes_the_aborted_transactions_markers_then_asks_again() -> None:
    """An ongoing transaction of the id is aborted by InitProducerId: its markers are
    written before the new instance gets its epoch; only the first ask carries the
    request's producer id and epoch (KIP-360's check)."""
    txns = Txns(init_transaction=[Producer(7, 1, PENDING), Producer(7, 2)])
    writer = Writer()
    got = call(init_producer_id, context(txns, writer), init_body(producer_id=7, producer_epoch=0))
    assert (got.error_code, got.producer_id, got.producer_epoch) == (ErrorCode.none, 7, 2)
    assert writer.written == [PENDING]
    assert txns.called("init_transaction") == [("tx", 60_000, 7, 0), ("tx", 60_000, -1, -1)]


def test_init_producer_id_errors_per_version() -> None:
    """Fenced: PRODUCER_FENCED from v4 (KIP-588), INVALID_PRODUCER_EPOCH before; markers
    that cannot be written: CONCURRENT_TRANSACTIONS (the client retries); the coordinator
    unreachable: COORDINATOR_NOT_AVAILABLE; two-phase commit (KIP-939): INVALID_REQUEST."""
    fenced = Txns(init_transaction=[TransactionFencedError("newer")])
    assert (
        call(init_producer_id, context(fenced), init_body()).error_code == ErrorCode.producer_fenced
    )
    got = call(
        init_producer_id, context(fenced), init_body(InitV3, producer_id=7, producer_epoch=0)
    )
    assert got.error_code == ErrorCode.invalid_producer_epoch
    stuck = Txns(init_transaction=[Producer(7, 1, PENDING)])
    got = call(init_producer_id, context(stuck, Writer(fail=1)), init_body())
    assert (got.error_code, got.producer_id) == (ErrorCode.concurrent_transactions, -1)
    down = Txns(init_transaction=[CoordinatorUnavailableError("down")])
    assert call(init_producer_id, context(down), init_body()).error_code == (
        ErrorCode.coordinator_not_available
    )
    two_pc = Txns()
    got = call(init_producer_id, context(two_pc), init_body(enable2_pc=True))
    assert got.error_code == ErrorCode.invalid_request and two_pc.calls == []


def test_init_producer_id_gives_up_after_a_few_rounds() -> None:
    """Other instances keep beginning transactions: CONCURRENT_TRANSACTIONS, no loop."""
    txns = Txns(init_transaction=[Producer(7, 1, PENDING)])
    got = call(init_producer_id, context(txns), init_body())
    assert got.error_code == ErrorCode.concurrent_transactions
    assert len(txns.called("init_transaction")) == transactions.INIT_ROUNDS


# -- AddPartitionsToTxn ----------------------------------------------------------------------


def add_v3(topics: dict[str, tuple[int, ...]], module: Any = apv3) -> Any:
    return module.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="tx",
        v3_and_below_producer_id=7,
        v3_and_below_producer_epoch=1,
        v3_and_below_topics=tuple(
            module.AddPartitionsToTxnTopic(name=n, partitions=ps) for n, ps in topics.items()
        ),
    )


def codes_v3(resp: Any) -> dict[tuple[str, int], ErrorCode]:
    return {
        (t.name, p.partition_index): p.partition_error_code
        for t in resp.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


def test_add_partitions_adds_them_all() -> None:
    txns = Txns()
    got = codes_v3(call(transactions.add_partitions_to_txn, context(txns), add_v3({"t": (0, 1)})))
    assert got == {("t", 0): ErrorCode.none, ("t", 1): ErrorCode.none}
    assert txns.called("add_txn_partitions") == [
        ("tx", 7, 1, [TopicPartition("t", 0), TopicPartition("t", 1)])
    ]


def test_one_unknown_or_denied_partition_fails_the_request_and_adds_none() -> None:
    """As Kafka: the failed partitions get their error, the others OPERATION_NOT_ATTEMPTED,
    and nothing is added."""
    txns = Txns()
    body = add_v3({"t": (0, 5), "nope": (0,), "u": (0,)})
    acl = access(24, (Operation.WRITE, ResourceType.TOPIC, "u"))
    got = codes_v3(call(transactions.add_partitions_to_txn, context(txns), body, acl))
    assert got == {
        ("t", 0): ErrorCode.operation_not_attempted,
        ("t", 5): ErrorCode.unknown_topic_or_partition,
        ("nope", 0): ErrorCode.unknown_topic_or_partition,
        ("u", 0): ErrorCode.topic_authorization_failed,
    }
    assert txns.calls == []


def test_add_partitions_errors_per_version() -> None:
    """WRITE on the transactional id first; fenced is INVALID_PRODUCER_EPOCH before v2;
    every partition gets the coordinator's error."""
    acl = access(24, (Operation.WRITE, TXN_ID, "tx"))
    got = codes_v3(
        call(transactions.add_partitions_to_txn, context(Txns()), add_v3({"t": (0,)}), acl)
    )
    assert got == {("t", 0): ErrorCode.transactional_id_authorization_failed}
    fenced = Txns(add_txn_partitions=[TransactionFencedError("newer")])
    got = codes_v3(call(transactions.add_partitions_to_txn, context(fenced), add_v3({"t": (0, 1)})))
    assert set(got.values()) == {ErrorCode.producer_fenced}
    got = codes_v3(
        call(transactions.add_partitions_to_txn, context(fenced), add_v3({"t": (0,)}, apv1))
    )
    assert set(got.values()) == {ErrorCode.invalid_producer_epoch}
    busy = Txns(add_txn_partitions=[ConcurrentTransactionsError("ending")])
    got = codes_v3(call(transactions.add_partitions_to_txn, context(busy), add_v3({"t": (0,)})))
    assert set(got.values()) == {ErrorCode.concurrent_transactions}


def add_v5(verify_only: bool, *parts: int, tid: str = "tx", epoch: int = 1) -> Any:
    return apv5.AddPartitionsToTxnRequest(
        transactions=(
            apv5.AddPartitionsToTxnTransaction(
                transactional_id=tid,
                producer_id=7,
                producer_epoch=epoch,
                verify_only=verify_only,
                topics=(apv5.AddPartitionsToTxnTopic(name="t", partitions=parts),),
            ),
        )
    )


def test_verify_only_answers_from_the_transactions_state_without_adding() -> None:
    listed = [TransactionInfo("tx", 7, 1, "Ongoing", 60_000, 1, (TopicPartition("t", 0),))]
    txns = Txns(list_transactions=[listed])
    got = call(transactions.add_partitions_to_txn, context(txns), add_v5(True, 0, 1))
    assert got.error_code == ErrorCode.none
    (result,) = got.results_by_transaction
    assert result.transactional_id == "tx"
    codes = {
        p.partition_index: p.partition_error_code
        for p in result.topic_results[0].results_by_partition
    }
    assert codes == {0: ErrorCode.none, 1: ErrorCode.transaction_abortable}
    assert txns.called("add_txn_partitions") == []
    stale = call(transactions.add_partitions_to_txn, context(txns), add_v5(True, 0, epoch=0))
    part = stale.results_by_transaction[0].topic_results[0].results_by_partition[0]
    assert part.partition_error_code == ErrorCode.producer_fenced


def test_the_batched_form_needs_cluster_action() -> None:
    acl = access(24, (Operation.CLUSTER_ACTION, ResourceType.CLUSTER, "kafka-cluster"))
    got = call(transactions.add_partitions_to_txn, context(Txns()), add_v5(False, 0), acl)
    assert got.error_code == ErrorCode.cluster_authorization_failed
    assert got.results_by_transaction == ()


# -- AddOffsetsToTxn, TxnOffsetCommit ----------------------------------------------------------


def test_add_offsets_checks_the_id_then_the_group() -> None:
    body = AddOffsetsV1(transactional_id="tx", producer_id=7, producer_epoch=1, group_id="g")
    txns = Txns()
    assert call(transactions.add_offsets_to_txn, context(txns), body).error_code == ErrorCode.none
    assert txns.called("add_txn_group") == [("tx", 7, 1, "g")]
    denied = access(25, (Operation.READ, ResourceType.GROUP, "g"))
    got = call(transactions.add_offsets_to_txn, context(Txns()), body, denied)
    assert got.error_code == ErrorCode.group_authorization_failed
    fenced = Txns(add_txn_group=[TransactionFencedError("newer")])
    got = call(transactions.add_offsets_to_txn, context(fenced), body)
    assert got.error_code == ErrorCode.invalid_producer_epoch  # v1: before PRODUCER_FENCED


def commit_v5(offsets: dict[str, dict[int, int]]) -> Any:
    return tocv5.TxnOffsetCommitRequest(
        transactional_id="tx",
        group_id="g",
        producer_id=7,
        producer_epoch=1,
        generation_id=3,
        member_id="m",
        group_instance_id=None,
        topics=tuple(
            tocv5.TxnOffsetCommitRequestTopic(
                name=n,
                partitions=tuple(
                    tocv5.TxnOffsetCommitRequestPartition(
                        partition_index=p,
                        committed_offset=o,
                        committed_leader_epoch=-1,
                        committed_metadata=None,
                    )
                    for p, o in ps.items()
                ),
            )
            for n, ps in offsets.items()
        ),
    )


def test_txn_offset_commit_holds_the_known_partitions_offsets() -> None:
    """v5 adds the group to the transaction itself (KIP-890 part 2); an unknown topic or
    partition, or one the principal may not READ, gets its error, the others are held,
    with the member and generation the request names (KIP-447's check)."""
    txns = Txns()
    body = commit_v5({"t": {0: 10, 4: 1}, "u": {0: 3}, "nope": {0: 1}})
    acl = access(28, (Operation.READ, ResourceType.TOPIC, "u"))
    got = call(transactions.txn_offset_commit, context(txns), body, acl)
    codes = {(t.name, p.partition_index): p.error_code for t in got.topics for p in t.partitions}
    assert codes == {
        ("t", 0): ErrorCode.none,
        ("t", 4): ErrorCode.unknown_topic_or_partition,
        ("u", 0): ErrorCode.topic_authorization_failed,
        ("nope", 0): ErrorCode.unknown_topic_or_partition,
    }
    assert [n for n, _ in txns.calls] == ["add_txn_group", "txn_commit_offsets"]
    assert txns.called("txn_commit_offsets") == [
        ("tx", 7, 1, "g", {TopicPartition("t", 0): (10, "")}, "m", 3)
    ]


def test_txn_offset_commit_errors() -> None:
    denied = access(28, (Operation.WRITE, TXN_ID, "tx"))
    got = call(transactions.txn_offset_commit, context(Txns()), commit_v5({"t": {0: 1}}), denied)
    assert got.topics[0].partitions[0].error_code == ErrorCode.transactional_id_authorization_failed
    fenced = Txns(txn_commit_offsets=[TransactionFencedError("newer")])
    got = call(transactions.txn_offset_commit, context(fenced), commit_v5({"t": {0: 1}}))
    assert got.topics[0].partitions[0].error_code == ErrorCode.invalid_producer_epoch


# -- EndTxn ----------------------------------------------------------------------------------


def end_body(cls: Any = EndTxnV5, commit: bool = True) -> Any:
    return cls(transactional_id="tx", producer_id=7, producer_epoch=1, committed=commit)


def test_end_txn_answers_once_the_markers_are_written() -> None:
    writer = Writer()
    txns = Txns(end_transaction=[PENDING])
    got = call(transactions.end_txn, context(txns, writer), end_body())
    assert (got.error_code, got.producer_id, got.producer_epoch) == (ErrorCode.none, 7, 1)
    assert writer.written == [PENDING]
    assert txns.called("end_transaction") == [("tx", 7, 1, True)]
    empty = Txns(end_transaction=[None])  # no partition: nothing to write
    assert call(transactions.end_txn, context(empty, writer), end_body()).error_code == 0
    assert writer.written == [PENDING]


def test_end_txn_errors() -> None:
    """Markers not written now: CONCURRENT_TRANSACTIONS, and the client's retry writes
    them; fenced per version; the other decision: INVALID_TXN_STATE."""
    writer = Writer(fail=1)
    txns = Txns(end_transaction=[PENDING])
    got = call(transactions.end_txn, context(txns, writer), end_body())
    assert (got.error_code, got.producer_id) == (ErrorCode.concurrent_transactions, -1)
    assert call(transactions.end_txn, context(txns, writer), end_body()).error_code == 0
    assert writer.written == [PENDING]
    fenced = Txns(end_transaction=[TransactionFencedError("timed out")])
    assert call(transactions.end_txn, context(fenced), end_body()).error_code == (
        ErrorCode.producer_fenced
    )
    assert call(transactions.end_txn, context(fenced), end_body(EndTxnV1)).error_code == (
        ErrorCode.invalid_producer_epoch
    )
    other = Txns(end_transaction=[InvalidTxnStateError("decided the other way")])
    assert call(transactions.end_txn, context(other), end_body()).error_code == (
        ErrorCode.invalid_txn_state
    )


# -- DescribeTransactions, ListTransactions ----------------------------------------------------

LISTED = [
    TransactionInfo(
        "a", 1, 0, "Ongoing", 60_000, 1_000, (TopicPartition("t", 1), TopicPartition("u", 0))
    ),
    TransactionInfo("b", 2, 3, "CompleteCommit", 60_000, -1),
    TransactionInfo("secret", 3, 0, "Ongoing", 60_000, 1_000),
]


def test_describe_transactions() -> None:
    """Unknown: TRANSACTIONAL_ID_NOT_FOUND; not DESCRIBE-able: denied; partitions of
    topics the principal may not DESCRIBE are left out, as Kafka does."""
    acl = access(
        65,
        (Operation.DESCRIBE, TXN_ID, "secret"),
        (Operation.DESCRIBE, ResourceType.TOPIC, "u"),
    )
    body = DescribeTransactionsRequest(transactional_ids=("a", "b", "nope", "secret"))
    got = call(
        transactions.describe_transactions, context(Txns(list_transactions=[LISTED])), body, acl
    )
    a, b, nope, secret = got.transaction_states
    assert (a.error_code, a.transaction_state, a.producer_id, a.producer_epoch) == (
        0,
        "Ongoing",
        1,
        0,
    )
    assert a.transaction_timeout == datetime.timedelta(minutes=1)
    assert a.transaction_start_time == datetime.datetime.fromtimestamp(1, tz=datetime.UTC)
    assert [(t.topic, t.partitions) for t in a.topics] == [("t", (1,))]
    assert (b.error_code, b.transaction_state, b.topics) == (0, "CompleteCommit", ())
    assert nope.error_code == ErrorCode.transactional_id_not_found
    assert secret.error_code == ErrorCode.transactional_id_authorization_failed


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, ["a", "b"]),
        ({"state_filters": ("Ongoing",)}, ["a"]),
        ({"producer_id_filters": (2, 3)}, ["b"]),
        ({"duration_filter": 1_000}, ["a"]),  # ongoing since 1970: longer than a second
        ({"transactional_id_pattern": "a|s.*"}, ["a"]),
    ],
)
def test_list_transactions_filters(filters: dict[str, Any], expected: list[str]) -> None:
    acl = access(66, (Operation.DESCRIBE, TXN_ID, "secret"))
    body = ListTransactionsRequest(**filters)
    got = call(transactions.list_transactions, context(Txns(list_transactions=[LISTED])), body, acl)
    assert got.error_code == ErrorCode.none
    assert [s.transactional_id for s in got.transaction_states] == expected


def test_list_transactions_unknown_state_and_bad_pattern() -> None:
    txns = Txns(list_transactions=[LISTED])
    got = call(
        transactions.list_transactions,
        context(txns),
        ListTransactionsRequest(state_filters=("Nope",)),
    )
    assert got.unknown_state_filters == ("Nope",) and got.transaction_states == ()
    got = call(
        transactions.list_transactions,
        context(txns),
        ListTransactionsRequest(transactional_id_pattern="("),
    )
    assert got.error_code == ErrorCode.invalid_regular_expression


# -- the timeout sweep -------------------------------------------------------------------------


def test_the_sweep_writes_every_decided_transactions_markers() -> None:
    """One transaction's markers failing to be written does not stop the others'."""
    other = PendingMarkers("ty", 8, 0, True, ((TOPICS["u"].topic_id, 0),))
    writer = Writer(fail=1)
    txns = Txns(abort_expired_transactions=[[PENDING, other]])
    state = context(txns, writer).state
    assert asyncio.run(transactions.expire_once(state)) == 1
    assert writer.written == [other]
    ((now_ms,),) = txns.called("abort_expired_transactions")
    assert abs(now_ms / 1000 - datetime.datetime.now(datetime.UTC).timestamp()) < 60


# -- every version ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api_key", "version"),
    [
        (k, v)
        for k in (22, 24, 25, 26, 28, 65, 66)
        for v in range(HANDLERS[k][0], HANDLERS[k][1] + 1)
    ],
)
def test_every_served_version_answers_and_encodes(api_key: int, version: int) -> None:
    """Each version's request, with a transactional id, is answered with a response of its
    own version that encodes (fields a version lacks are dropped, none is missing)."""
    cls = request_class(api_key, version)
    listed = [TransactionInfo("tx", 1, 0, "Ongoing", 60_000, 1_000, (TopicPartition("t", 0),))]
    txns = Txns(init_transaction=[Producer(1, 0)], list_transactions=[listed])
    given = {22: {"transactional_id": "tx"}, 65: {"transactional_ids": ("tx",)}}
    body = make(cls, string="tx", number=1, **given.get(api_key, {}))
    answer = call(HANDLERS[api_key][2], context(txns), body)
    assert type(answer).__version__ == version
    assert len(encode_response(1, answer)) > 8


def test_offset_fetch_require_stable_answers_offsets_a_transaction_holds_as_unstable() -> None:
    """OffsetFetch with ``require_stable`` (what read_committed consumers send): a
    partition whose offset an ongoing transaction holds answers UNSTABLE_OFFSET_COMMIT
    (the client asks again), the others their committed offsets; without the flag the
    coordinator is not asked."""
    from kio.schema.offset_fetch.v8 import request as ofv8

    from coordinator.groups.model import CommittedOffset

    t0, t1 = TopicPartition("orders", 0), TopicPartition("orders", 1)
    txns = Txns(
        kafka_committed=[{t0: CommittedOffset(5), t1: CommittedOffset(9)}],
        held_offsets=[[t1]],
    )

    def fetch(stable: bool) -> dict[int, tuple[int, int]]:
        body = ofv8.OffsetFetchRequest(
            groups=(
                ofv8.OffsetFetchRequestGroup(
                    group_id="g",
                    topics=(
                        ofv8.OffsetFetchRequestTopics(name="orders", partition_indexes=(0, 1)),
                    ),
                ),
            ),
            require_stable=stable,
        )
        got = call(groups.offset_fetch, context(txns), body)
        [group] = got.groups
        [topic] = group.topics
        return {p.partition_index: (p.committed_offset, p.error_code) for p in topic.partitions}

    assert fetch(True) == {0: (5, ErrorCode.none), 1: (-1, ErrorCode.unstable_offset_commit)}
    assert txns.called("held_offsets") == [("g",)]
    assert fetch(False) == {0: (5, ErrorCode.none), 1: (9, ErrorCode.none)}
    assert len(txns.called("held_offsets")) == 1
