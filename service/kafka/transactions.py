"""Kafka's transaction APIs over the coordinator's transactions (issue 30).

Every agent is every transactional id's transaction coordinator (FindCoordinator answers
with the agent asked): a transaction's state lives in the coordinator
(``coordinator.client.TransactionCoordinator``, reached as ``AgentState.txns``), so each
call of a transactional producer may reach any agent.

A decided transaction ends with a marker in each of its partitions. The agent that
decides it writes them (``LogWriter.write_markers``: one segment object, committed like
data) before it answers: EndTxn answers once its markers are committed, so a
read_committed consumer that polls after ``commit_transaction()`` returned sees the
records. InitProducerId that aborts the id's earlier transaction writes that
transaction's markers before it answers too. Markers an agent could not write (it died,
the store failed) are written by whichever agent's :func:`expiry_loop` finds them next
(``abort_expired_transactions`` returns them), as are the aborts of transactions past
their timeout. Writing a marker twice is harmless, so several agents may race on it.

Fencing answers as Kafka answers each version: PRODUCER_FENCED where the version knows it
(KIP-588), INVALID_PRODUCER_EPOCH before. Errors the client may simply retry (the
coordinator or the store unavailable, markers that could not be written yet) are
answered with codes every transactional client retries: COORDINATOR_NOT_AVAILABLE (it
finds a coordinator again: any agent) and CONCURRENT_TRANSACTIONS.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import re
import time
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.client import PendingMarkers, TopicPartition, TransactionInfo, TxnProducer
from segments.errors import ConcurrentTransactionsError, LakelogError
from service.executors import Kind, call, run
from service.kafka.acl import (
    CLUSTER_DENIED,
    GROUP_DENIED,
    TRANSACTIONAL_ID_DENIED,
    Access,
)
from service.kafka.errors import code_for
from service.kafka.framing import Request, build, millis, nested
from service.kafka.handlers import KafkaContext, resolve_topic, response_cls
from service.state import AgentState

log = logging.getLogger(__name__)

#: How many times InitProducerId writes an aborted transaction's markers and asks again
#: before it answers CONCURRENT_TRANSACTIONS (the client retries). One round is the
#: usual case; more means other instances of the id keep beginning transactions.
INIT_ROUNDS = 4
#: Kafka's transaction states, the names ListTransactions filters by.
STATES = frozenset(
    {
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    }
)
#: The first version of each API that knows PRODUCER_FENCED (KIP-588); older ones get
#: INVALID_PRODUCER_EPOCH, which their clients treat as fencing too. TxnOffsetCommit has
#: no such version: Kafka's group coordinator answers it INVALID_PRODUCER_EPOCH.
FENCED_SINCE = {22: 4, 24: 2, 25: 2, 26: 2, 28: 1 << 15}
#: DescribeTransactions' start time of no transaction (-1 ms, as Kafka's coordinator
#: answers it; the field is not nullable), and of an id answered with an error (0 ms, the
#: field's default, as Kafka leaves it).
NO_START = datetime.datetime.fromtimestamp(-0.001, tz=datetime.UTC)
UNSET = datetime.datetime.fromtimestamp(0, tz=datetime.UTC)


def txn_code(exc: BaseException, api_key: int, version: int) -> ErrorCode:
    """The code a transactional API answers for ``exc`` at ``version`` (see the module doc).

    A retriable error other than CONCURRENT_TRANSACTIONS is COORDINATOR_NOT_AVAILABLE: the
    codes ``code_for`` gives those (REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR) are not among
    the ones transactional clients retry on these APIs (Java's EndTxn handler fails on
    them), and from a transaction coordinator they mean "try again", which is what this
    one says.
    """
    code = code_for(exc)
    if code == ErrorCode.producer_fenced and version < FENCED_SINCE.get(api_key, 0):
        return ErrorCode.invalid_producer_epoch
    if (
        isinstance(exc, LakelogError)
        and exc.retriable
        and code != ErrorCode.concurrent_transactions
    ):
        return ErrorCode.coordinator_not_available
    return code


async def write_markers(state: AgentState, pending: PendingMarkers) -> None:
    """Write and commit a decided transaction's markers (on the flush pool: a PUT and a
    commit, as a flush).

    Raises:
        ConcurrentTransactionsError: they could not be written now (the cause is
            chained): the decision holds, and a retry of the request or an agent's
            expiry task writes them.
    """
    try:
        await run(Kind.FLUSH, state.writer.write_markers, pending)
    except LakelogError as e:
        log.warning(
            "markers of transaction %r (producer %d) not written: %s",
            pending.transactional_id,
            pending.producer_id,
            e.message,
        )
        raise ConcurrentTransactionsError(
            f"The markers of the transaction are not written yet: {e.message}"
        ) from e


# -- InitProducerId with a transactional id ------------------------------------------------


async def init_transactional(
    ctx: KafkaContext, transactional_id: str, body: Any, version: int
) -> tuple[ErrorCode, int, int]:
    """InitProducerId for ``transactional_id``: (error code, producer id, epoch).

    When the id's earlier transaction is aborted by this call, its markers are written
    here and the coordinator asked again (at most :data:`INIT_ROUNDS` times): the new
    instance starts with no transaction of the id left open. Only the first ask carries
    the request's producer id and epoch (KIP-360's check); the next ones continue the
    same request, whose check has passed.
    """
    coordinator = ctx.state.txns
    timeout_ms = millis(body.transaction_timeout)
    producer_id = int(getattr(body, "producer_id", -1))
    epoch = int(getattr(body, "producer_epoch", -1))
    try:
        for _ in range(INIT_ROUNDS):
            got: TxnProducer = await call(
                coordinator.init_transaction, transactional_id, timeout_ms, producer_id, epoch
            )
            if got.pending is None:
                return ErrorCode.none, got.producer_id, got.epoch
            await write_markers(ctx.state, got.pending)
            producer_id, epoch = -1, -1
    except LakelogError as e:
        return txn_code(e, 22, version), -1, -1
    return ErrorCode.concurrent_transactions, -1, -1


# -- AddPartitionsToTxn ------------------------------------------------------------------


async def add_partitions_to_txn(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Partitions join a transaction; from v4 (broker to broker, batched) several
    transactions at once, each maybe ``verify_only``.

    Per transaction, as Kafka: WRITE on the transactional id (before v4; v4+ needs
    CLUSTER_ACTION on the cluster instead), then WRITE on each topic; a partition denied
    or unknown fails the transaction: those partitions get their error, the others
    OPERATION_NOT_ATTEMPTED, and nothing is added. Otherwise every partition gets the
    coordinator's answer.

    ``verify_only`` answers, per partition, whether the ongoing transaction of that
    producer id and epoch holds it, from ``list_transactions`` (one coordinator call;
    only brokers send it, and lakelog's commit verifies transactional batches itself).
    """
    body = req.body
    version = req.header.api_version
    resp = response_cls(type(body))
    part_cls, topic_cls = (
        nested(resp, "AddPartitionsToTxnPartitionResult"),
        nested(resp, "AddPartitionsToTxnTopicResult"),
    )
    if version < 4:
        transactions = [
            (
                body.v3_and_below_transactional_id,
                body.v3_and_below_producer_id,
                body.v3_and_below_producer_epoch,
                False,
                body.v3_and_below_topics,
            )
        ]
    else:
        if not access.cluster():
            return build(
                resp, throttle_time=0, error_code=CLUSTER_DENIED, results_by_transaction=()
            )
        transactions = [
            (t.transactional_id, t.producer_id, t.producer_epoch, t.verify_only, t.topics)
            for t in body.transactions
        ]
    listed: list[TransactionInfo] | None = None
    results = []
    for transactional_id, producer_id, epoch, verify_only, topics in transactions:
        codes: dict[tuple[str, int], ErrorCode] = {}
        if version < 4 and not access.transactional_id(transactional_id):
            codes = {(t.name, p): TRANSACTIONAL_ID_DENIED for t in topics for p in t.partitions}
        else:
            allowed = access.topic if version < 4 else _anything
            wanted: list[TopicPartition] = []
            for t in topics:
                named = await resolve_topic(ctx, t.name, allowed)
                for p in t.partitions:
                    if named.info is None:
                        codes[(t.name, p)] = named.error
                    elif not 0 <= p < named.info.partitions:
                        codes[(t.name, p)] = ErrorCode.unknown_topic_or_partition
                    else:
                        wanted.append(TopicPartition(t.name, p))
            if codes:  # one failed: the transaction adds none of them
                codes.update(dict.fromkeys(wanted, ErrorCode.operation_not_attempted))
            elif verify_only:
                if listed is None:
                    try:
                        listed = await call(ctx.state.txns.list_transactions)
                    except LakelogError as e:
                        listed = []
                        codes = dict.fromkeys(wanted, txn_code(e, 24, version))
                if not codes:
                    codes = _verified(listed, transactional_id, producer_id, epoch, wanted)
                    if version < 5:  # TRANSACTION_ABORTABLE is v5's (KIP-890)
                        codes = {
                            tp: ErrorCode.invalid_txn_state
                            if c == ErrorCode.transaction_abortable
                            else c
                            for tp, c in codes.items()
                        }
            else:
                code = ErrorCode.none
                try:
                    await call(
                        ctx.state.txns.add_txn_partitions,
                        transactional_id,
                        producer_id,
                        epoch,
                        wanted,
                    )
                except LakelogError as e:
                    code = txn_code(e, 24, version)
                codes = dict.fromkeys(wanted, code)
        results.append((transactional_id, _topic_results(topic_cls, part_cls, topics, codes)))
    if version < 4:
        return build(resp, throttle_time=0, results_by_topic_v3_and_below=results[0][1])
    result_cls = nested(resp, "AddPartitionsToTxnResult")
    return build(
        resp,
        throttle_time=0,
        error_code=ErrorCode.none,
        results_by_transaction=tuple(
            build(result_cls, transactional_id=tid, topic_results=topic_results)
            for tid, topic_results in results
        ),
    )


def _anything(name: str) -> bool:
    return True


def _verified(
    listed: list[TransactionInfo],
    transactional_id: str,
    producer_id: int,
    epoch: int,
    wanted: list[TopicPartition],
) -> dict[tuple[str, int], ErrorCode]:
    """verify_only's answer per partition: NONE if the ongoing transaction of that
    producer id and epoch holds it, else TRANSACTION_ABORTABLE; a producer id or epoch
    that is not the id's fails them all (as the commit would refuse its batches)."""
    info = next((i for i in listed if i.transactional_id == transactional_id), None)
    if info is None or info.producer_id != producer_id:
        return dict.fromkeys(wanted, ErrorCode.invalid_producer_id_mapping)
    if info.epoch != epoch:
        return dict.fromkeys(wanted, ErrorCode.producer_fenced)
    held = set(info.partitions) if info.state == "Ongoing" else set()
    return {
        (tp.topic, tp.partition): ErrorCode.none if tp in held else ErrorCode.transaction_abortable
        for tp in wanted
    }


def _topic_results(
    topic_cls: type, part_cls: type, topics: Iterable[Any], codes: dict[tuple[str, int], ErrorCode]
) -> tuple[Any, ...]:
    """AddPartitionsToTxn's per-topic results, in the request's order."""
    return tuple(
        build(
            topic_cls,
            name=t.name,
            results_by_partition=tuple(
                build(part_cls, partition_index=p, partition_error_code=codes[(t.name, p)])
                for p in t.partitions
            ),
        )
        for t in topics
    )


# -- AddOffsetsToTxn -----------------------------------------------------------------------


async def add_offsets_to_txn(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """The group's offsets may be committed in the transaction (TxnOffsetCommit next).
    WRITE on the transactional id, then READ on the group, as Kafka checks them."""
    body = req.body
    resp = response_cls(type(body))
    code = ErrorCode.none
    if not access.transactional_id(body.transactional_id):
        code = TRANSACTIONAL_ID_DENIED
    elif not access.group(body.group_id):
        code = GROUP_DENIED
    else:
        try:
            await call(
                ctx.state.txns.add_txn_group,
                body.transactional_id,
                body.producer_id,
                body.producer_epoch,
                body.group_id,
            )
        except LakelogError as e:
            code = txn_code(e, 25, req.header.api_version)
    return build(resp, throttle_time=0, error_code=code)


# -- TxnOffsetCommit -----------------------------------------------------------------------


async def txn_offset_commit(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Offsets held in the transaction: the group's committed offsets when it commits,
    dropped when it aborts.

    As Kafka: WRITE on the transactional id, else every partition gets
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED; READ on the group, else
    GROUP_AUTHORIZATION_FAILED; a topic the principal may not READ gets
    TOPIC_AUTHORIZATION_FAILED and an unknown one UNKNOWN_TOPIC_OR_PARTITION, and the
    other partitions are committed. v5 (KIP-890 part 2) adds the group to the
    transaction itself, as Kafka's does. The v3+ member fields (generation, member id)
    are not checked against the group: the transaction's producer epoch fences a zombie
    producer, not a zombie consumer (Kafka's KIP-447 check is not done here).
    """
    body = req.body
    version = req.header.api_version
    resp = response_cls(type(body))
    codes: dict[tuple[str, int], ErrorCode] = {}
    offsets: dict[TopicPartition, tuple[int, str]] = {}
    denied = None
    if not access.transactional_id(body.transactional_id):
        denied = TRANSACTIONAL_ID_DENIED
    elif not access.group(body.group_id):
        denied = GROUP_DENIED
    for t in body.topics:
        if denied is not None:
            codes.update({(t.name, p.partition_index): denied for p in t.partitions})
            continue
        named = await resolve_topic(ctx, t.name, access.topic)
        for p in t.partitions:
            key = (t.name, p.partition_index)
            if named.info is None:
                codes[key] = named.error
            elif not 0 <= p.partition_index < named.info.partitions:
                codes[key] = ErrorCode.unknown_topic_or_partition
            else:
                offsets[TopicPartition(t.name, p.partition_index)] = (
                    int(p.committed_offset),
                    p.committed_metadata or "",
                )
    if offsets:
        code = ErrorCode.none
        coordinator = ctx.state.txns
        ids = (body.transactional_id, body.producer_id, body.producer_epoch)
        try:
            if version >= 5:
                await call(coordinator.add_txn_group, *ids, body.group_id)
            await call(
                coordinator.txn_commit_offsets,
                *ids,
                body.group_id,
                offsets,
                getattr(body, "member_id", ""),  # v3+ (KIP-447)
                getattr(body, "generation_id", -1),
            )
        except LakelogError as e:
            code = txn_code(e, 28, version)
        codes.update({(tp.topic, tp.partition): code for tp in offsets})
    part_cls, topic_cls = (
        nested(resp, "TxnOffsetCommitResponsePartition"),
        nested(resp, "TxnOffsetCommitResponseTopic"),
    )
    return build(
        resp,
        throttle_time=0,
        topics=tuple(
            build(
                topic_cls,
                name=t.name,
                partitions=tuple(
                    build(
                        part_cls,
                        partition_index=p.partition_index,
                        error_code=codes[(t.name, p.partition_index)],
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        ),
    )


# -- EndTxn --------------------------------------------------------------------------------


async def end_txn(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Commit or abort the transaction; answered once its markers are committed.

    The decision is durable before the markers are written: when they cannot be written
    now the answer is CONCURRENT_TRANSACTIONS, the client sends the same EndTxn again,
    and the coordinator answers it with the same markers (or they were written meanwhile
    by an agent's expiry task). v5's producer id and epoch are the request's: lakelog
    does not bump the epoch per transaction (KIP-890 part 2's transaction version 2 is
    not advertised, so clients do not expect it).
    """
    body = req.body
    version = req.header.api_version
    resp = response_cls(type(body))
    code = ErrorCode.none
    if not access.transactional_id(body.transactional_id):
        code = TRANSACTIONAL_ID_DENIED
    else:
        try:
            pending: PendingMarkers | None = await call(
                ctx.state.txns.end_transaction,
                body.transactional_id,
                body.producer_id,
                body.producer_epoch,
                body.committed,
            )
            if pending is not None:
                await write_markers(ctx.state, pending)
        except LakelogError as e:
            code = txn_code(e, 26, version)
    ok = code == ErrorCode.none
    return build(
        resp,
        throttle_time=0,
        error_code=code,
        producer_id=body.producer_id if ok else -1,
        producer_epoch=body.producer_epoch if ok else -1,
    )


# -- DescribeTransactions, ListTransactions --------------------------------------------------


async def describe_transactions(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Each transactional id's state. An id the principal may not DESCRIBE gets
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED, an unknown one TRANSACTIONAL_ID_NOT_FOUND; the
    partitions listed are those of topics it may DESCRIBE (as Kafka leaves the others
    out)."""
    body = req.body
    resp = response_cls(type(body))
    state_cls, topic_cls = nested(resp, "TransactionState"), nested(resp, "TopicData")
    allowed = [t for t in body.transactional_ids if access.transactional_id(t)]
    known: dict[str, TransactionInfo] = {}
    failure: ErrorCode | None = None
    if allowed:
        try:
            infos = await call(ctx.state.txns.list_transactions)
            known = {i.transactional_id: i for i in infos}
        except LakelogError as e:
            failure = txn_code(e, 65, req.header.api_version)
    out = []
    for tid in body.transactional_ids:
        info = known.get(tid)
        if tid not in allowed or info is None:
            code = (
                TRANSACTIONAL_ID_DENIED
                if tid not in allowed
                else failure or ErrorCode.transactional_id_not_found
            )
            out.append(
                build(
                    state_cls,
                    error_code=code,
                    transactional_id=tid,
                    transaction_state="",
                    transaction_timeout=0,
                    transaction_start_time=UNSET,
                    producer_id=-1,
                    producer_epoch=-1,
                    topics=(),
                )
            )
            continue
        by_topic: dict[str, list[int]] = {}
        for tp in info.partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        out.append(
            build(
                state_cls,
                error_code=ErrorCode.none,
                transactional_id=tid,
                transaction_state=info.state,
                transaction_timeout=info.timeout_ms,
                transaction_start_time=_start_time(info.started_ms),
                producer_id=info.producer_id,
                producer_epoch=info.epoch,
                topics=tuple(
                    build(topic_cls, topic=topic, partitions=tuple(sorted(parts)))
                    for topic, parts in sorted(by_topic.items())
                    if access.topic(topic)
                ),
            )
        )
    return build(resp, throttle_time=0, transaction_states=tuple(out))


def _start_time(started_ms: int) -> datetime.datetime:
    if started_ms < 0:
        return NO_START
    return datetime.datetime.fromtimestamp(started_ms / 1000, tz=datetime.UTC)


async def list_transactions(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """The transactional ids the principal may DESCRIBE (the others are left out), by
    the request's filters: states (a name Kafka does not know is answered in
    ``unknown_state_filters`` and matches nothing), producer ids, v1's duration (ongoing
    transactions running longer than it) and v2's transactional id pattern (a regular
    expression matching the whole id; one that does not compile is
    INVALID_REGULAR_EXPRESSION)."""
    body = req.body
    resp = response_cls(type(body))
    state_cls = nested(resp, "TransactionState")
    states = set(body.state_filters)
    unknown = tuple(s for s in body.state_filters if s not in STATES)
    producer_ids = set(body.producer_id_filters)
    duration_ms = int(getattr(body, "duration_filter", -1))
    pattern = None
    if getattr(body, "transactional_id_pattern", None):
        try:
            pattern = re.compile(body.transactional_id_pattern)
        except re.error:
            return build(
                resp,
                throttle_time=0,
                error_code=ErrorCode.invalid_regular_expression,
                unknown_state_filters=unknown,
                transaction_states=(),
            )
    try:
        infos = await call(ctx.state.txns.list_transactions)
    except LakelogError as e:
        return build(
            resp,
            throttle_time=0,
            error_code=txn_code(e, 66, req.header.api_version),
            unknown_state_filters=unknown,
            transaction_states=(),
        )
    now_ms = time.time_ns() // 1_000_000

    def wanted(i: TransactionInfo) -> bool:
        if states and i.state not in states:
            return False
        if producer_ids and i.producer_id not in producer_ids:
            return False
        if duration_ms >= 0 and (i.started_ms < 0 or now_ms - i.started_ms <= duration_ms):
            return False
        if pattern is not None and pattern.fullmatch(i.transactional_id) is None:
            return False
        return access.transactional_id(i.transactional_id)

    return build(
        resp,
        throttle_time=0,
        error_code=ErrorCode.none,
        unknown_state_filters=unknown,
        transaction_states=tuple(
            build(
                state_cls,
                transactional_id=i.transactional_id,
                producer_id=i.producer_id,
                transaction_state=i.state,
            )
            for i in infos
            if wanted(i)
        ),
    )


# -- transaction timeouts ------------------------------------------------------------------


async def expire_once(state: AgentState) -> int:
    """Abort the transactions past their timeout and write the markers of every decided
    transaction still open; returns how many transactions' markers were written."""
    now_ms = time.time_ns() // 1_000_000
    pending = await call(state.txns.abort_expired_transactions, now_ms)
    written = 0
    for markers in pending:
        try:
            await write_markers(state, markers)
            written += 1
        except ConcurrentTransactionsError:
            pass  # logged; the next round tries again
    return written


async def expiry_loop(state: AgentState) -> None:
    """:func:`expire_once` every ``kafka_transaction_abort_interval_ms``; a failure is logged and
    the next round tries again (the loop must outlive a bad answer, as the heartbeat's)."""
    while True:
        await asyncio.sleep(state.settings.kafka_transaction_abort_interval_ms / 1000)
        try:
            await expire_once(state)
        except LakelogError as e:
            log.warning("aborting expired transactions failed: %s", e.message)
        except Exception:
            log.exception("aborting expired transactions failed unexpectedly; retrying")
