"""Kafka transactions with confluent-kafka's transactional producer (and aiokafka's and
kafka-python's) against real agents (issue 30): commit and abort as read_committed and
read_uncommitted consumers see them, fencing by a second instance of a transactional id,
offsets sent to a transaction, and the agents' abort of a transaction past its timeout.

The producer talks to one agent, consumers to the other: the transaction's state is in
the coordinator and its markers in the object store, so every agent answers alike.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AIOTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.list_transactions.v2.request import ListTransactionsRequest

from coordinator.http.client import http_coordinator
from coordinator.log.transactions import STALE_DECISION_S
from tests.integration.conftest import Cluster, ClusterFactory
from tests.integration.test_kafka_clients import (
    create_topic,
    kafka_call,
    plain_consumer,
    poll_records,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SENTINEL = b"sentinel"


def txn_producer(bootstrap: str, transactional_id: str, **extra: Any) -> Producer:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 5,
            **extra,
        }
    )
    p.init_transactions(30)
    return p


def open_transaction(
    bootstrap: str,
    transactional_id: str,
    topic: str,
    value: bytes,
    partition: int = 0,
    **extra: Any,
) -> Producer:
    """A transactional producer whose transaction is left open after ``value`` was
    stored (acknowledged) in ``partition``."""
    p = txn_producer(bootstrap, transactional_id, **extra)
    p.begin_transaction()
    p.produce(topic, value=value, partition=partition)
    assert p.flush(30) == 0
    return p


def produce_committed(p: Producer, topic: str, partitions: int, value: bytes) -> None:
    """One committed transaction holding ``value`` in each partition."""
    p.begin_transaction()
    for part in range(partitions):
        p.produce(topic, value=value, partition=part)
    p.commit_transaction(30)


def read(
    bootstrap: str, topic: str, partitions: int, isolation: str, *, until: bytes = SENTINEL
) -> list[bytes]:
    """Every value of ``topic`` from offset 0 up to the ``until`` record of each partition
    (a committed transaction's, written last), with ``isolation.level`` = ``isolation``."""
    c = plain_consumer(
        bootstrap,
        {"group.id": f"reader-{uuid.uuid4().hex[:8]}", "isolation.level": isolation},
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])

    def done(got: list[Any]) -> set[int]:
        return {m.partition() for m in got if m.value() == until}

    try:
        records = poll_records(c, lambda got: len(done(got)) == partitions)
    finally:
        c.close()
    got = [m.value() for m in records if m.value() != until]
    assert len(done(records)) == partitions, f"the {until!r} records never arrived: {got}"
    return got


def test_a_committed_transaction_is_seen_by_read_committed_consumers_only_once_committed(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """While the transaction is open its records (acknowledged, so committed to the log)
    are below no read_committed consumer's reach; after commit_transaction() returns,
    every one of them is, through the other agent."""
    topic = unique_topic("txn-commit")
    create_topic(kafka_cluster, topic, 2)
    producer_at, consumer_at = kafka_cluster.kafka
    p = txn_producer(producer_at, f"tx-{topic}")
    p.begin_transaction()
    values = [b"v%d" % i for i in range(20)]
    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=i % 2)
    assert p.flush(30) == 0
    early = Consumer(
        {
            "bootstrap.servers": consumer_at,
            "group.id": "unused",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
        }
    )
    early.assign([TopicPartition(topic, part, 0) for part in range(2)])
    try:
        seen = [early.poll(0.5) for _ in range(4)]
        assert [m for m in seen if m is not None and m.error() is None] == []
        p.commit_transaction(30)
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < len(values) and time.monotonic() < deadline:
            m = early.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
    finally:
        early.close()
    assert sorted(got) == sorted(values)
    produce_committed(p, topic, 2, SENTINEL)
    assert sorted(read(consumer_at, topic, 2, "read_committed")) == sorted(values)


def test_an_aborted_transaction_is_seen_by_read_uncommitted_consumers_only(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    topic = unique_topic("txn-abort")
    create_topic(kafka_cluster, topic, 1)
    producer_at, consumer_at = kafka_cluster.kafka
    p = txn_producer(producer_at, f"tx-{topic}")
    produce_committed(p, topic, 1, b"before")
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=b"aborted-%d" % i, partition=0)
    assert p.flush(30) == 0
    p.abort_transaction(30)
    produce_committed(p, topic, 1, b"after")
    produce_committed(p, topic, 1, SENTINEL)
    assert read(consumer_at, topic, 1, "read_committed") == [b"before", b"after"]
    assert read(consumer_at, topic, 1, "read_uncommitted") == [
        b"before",
        *(b"aborted-%d" % i for i in range(5)),
        b"after",
    ]


def test_a_second_instance_fences_the_first(kafka_cluster: Cluster, unique_topic: Any) -> None:
    """Race: a producer's instance is replaced (same transactional.id) mid-transaction.
    The new instance's init_transactions() aborts what the old one left open; the old
    one's commit fails with a fatal fencing error; none of its records is ever
    read_committed."""
    topic = unique_topic("txn-fence")
    create_topic(kafka_cluster, topic, 1)
    a, b = kafka_cluster.kafka
    tid = f"tx-{topic}"
    zombie = open_transaction(a, tid, topic, b"zombie")
    fresh = txn_producer(b, tid)
    with pytest.raises(KafkaException) as failed:
        zombie.commit_transaction(30)
    error = failed.value.args[0]
    assert error.fatal(), error
    assert error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), error
    produce_committed(fresh, topic, 1, b"fresh")
    produce_committed(fresh, topic, 1, SENTINEL)
    assert read(b, topic, 1, "read_committed") == [b"fresh"]


def test_describe_and_list_transactions_show_the_coordinators_state(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """DescribeTransactions and ListTransactions (what kafka-transactions.sh sends), raw,
    through the agent the producer does not use: Ongoing with its partitions while open,
    CompleteCommit after."""
    topic = unique_topic("txn-describe")
    create_topic(kafka_cluster, topic, 2)
    producer_at, other = kafka_cluster.kafka
    tid = f"tx-{topic}"
    p = open_transaction(producer_at, tid, topic, b"x", partition=1)
    describe = DescribeTransactionsRequest(transactional_ids=(tid, "no-such-id"))
    ongoing, unknown = kafka_call(other, describe).transaction_states
    assert (ongoing.error_code, ongoing.transaction_state) == (ErrorCode.none, "Ongoing")
    assert [(t.topic, t.partitions) for t in ongoing.topics] == [(topic, (1,))]
    assert ongoing.transaction_start_time.year >= 2024
    assert unknown.error_code == ErrorCode.transactional_id_not_found
    listed = kafka_call(
        other,
        ListTransactionsRequest(
            state_filters=("Ongoing",), producer_id_filters=(ongoing.producer_id,)
        ),
    )
    assert [(t.transactional_id, t.transaction_state) for t in listed.transaction_states] == [
        (tid, "Ongoing")
    ]
    p.commit_transaction(30)
    # (Not described: a transaction no longer ongoing has start time -1, as Kafka answers
    # it, which kio's reader refuses to decode.)
    done = kafka_call(other, ListTransactionsRequest(transactional_id_pattern=tid))
    assert [(t.transaction_state, t.producer_id) for t in done.transaction_states] == [
        ("CompleteCommit", ongoing.producer_id)
    ]


def committed_offset(bootstrap: str, group: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=30)
    finally:
        c.close()
    return int(tp.offset)


def test_offsets_sent_to_a_transaction_are_committed_only_with_it(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """A consume-transform-produce step: send_offsets_to_transaction() then abort leaves
    the group's committed offset as it was; then commit stores it."""
    source, sink = unique_topic("txn-in"), unique_topic("txn-out")
    create_topic(kafka_cluster, source, 1)
    create_topic(kafka_cluster, sink, 1)
    producer_at, consumer_at = kafka_cluster.kafka
    group = f"g-{source}"
    consumer = Consumer(
        {"bootstrap.servers": consumer_at, "group.id": group, "enable.auto.commit": False}
    )
    try:
        metadata = consumer.consumer_group_metadata()
        p = txn_producer(producer_at, f"tx-{source}")
        assert committed_offset(consumer_at, group, source) < 0  # nothing committed yet
        p.begin_transaction()
        p.produce(sink, value=b"out-1", partition=0)
        p.send_offsets_to_transaction([TopicPartition(source, 0, 7)], metadata, 30)
        p.abort_transaction(30)
        assert committed_offset(consumer_at, group, source) < 0
        p.begin_transaction()
        p.produce(sink, value=b"out-2", partition=0)
        p.send_offsets_to_transaction([TopicPartition(source, 0, 9)], metadata, 30)
        p.commit_transaction(30)
        assert committed_offset(consumer_at, group, source) == 9
    finally:
        consumer.close()
    produce_committed(p, sink, 1, SENTINEL)
    assert read(consumer_at, sink, 1, "read_committed") == [b"out-2"]


def test_aiokafkas_transactional_producer_and_read_committed_consumer(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """aiokafka (its own protocol code, not librdkafka's): an aborted transaction then a
    committed one; its read_committed consumer gets only the committed records."""
    topic = unique_topic("txn-aio")
    create_topic(kafka_cluster, topic, 1)
    producer_at, consumer_at = kafka_cluster.kafka

    async def main() -> list[bytes]:
        p = AIOKafkaProducer(bootstrap_servers=producer_at, transactional_id=f"tx-{topic}")
        await p.start()
        try:
            async with p.transaction():
                await p.send_and_wait(topic, b"committed-1", partition=0)
            await p.begin_transaction()
            await p.send_and_wait(topic, b"aborted", partition=0)
            await p.abort_transaction()
            async with p.transaction():
                await p.send_and_wait(topic, b"committed-2", partition=0)
                await p.send_and_wait(topic, SENTINEL, partition=0)
        finally:
            await p.stop()
        c = AIOKafkaConsumer(
            bootstrap_servers=consumer_at,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await c.start()
        got: list[bytes] = []
        try:
            c.assign([AIOTopicPartition(topic, 0)])
            async with asyncio.timeout(30):
                while SENTINEL not in got:
                    batch = await c.getmany(timeout_ms=500)
                    got.extend(m.value for msgs in batch.values() for m in msgs)
        finally:
            await c.stop()
        return got

    assert asyncio.run(main()) == [b"committed-1", b"committed-2", SENTINEL]


def test_kafka_pythons_transactional_producer_and_read_committed_consumer(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """kafka-python (its own protocol code, synchronous): a committed transaction, an
    aborted one whose records were acknowledged (so in the log) before the abort, then a
    committed one; its read_committed consumer gets exactly the committed records, its
    read_uncommitted consumer the aborted ones too."""
    topic = unique_topic("txn-kafka-python")
    create_topic(kafka_cluster, topic, 2)
    producer_at, consumer_at = kafka_cluster.kafka
    p = KafkaProducer(bootstrap_servers=producer_at, transactional_id=f"tx-{topic}")
    try:
        p.init_transactions()
        p.begin_transaction()
        committed = [p.send(topic, b"committed-%d" % i, partition=i % 2) for i in range(6)]
        p.commit_transaction()
        assert all(f.succeeded() for f in committed)
        p.begin_transaction()
        aborted = [p.send(topic, b"aborted-%d" % i, partition=i % 2) for i in range(4)]
        p.flush()
        assert all(f.succeeded() for f in aborted)
        p.abort_transaction()
        p.begin_transaction()
        p.send(topic, b"committed-6", partition=0)
        for part in range(2):
            p.send(topic, SENTINEL, partition=part)
        p.commit_transaction()
    finally:
        p.close()

    def read_all(isolation: str) -> list[bytes]:
        c = KafkaConsumer(
            bootstrap_servers=consumer_at,
            isolation_level=isolation,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        c.assign([KTopicPartition(topic, part) for part in range(2)])
        got: list[bytes] = []
        done: set[int] = set()
        deadline = time.monotonic() + 30
        try:
            while len(done) < 2 and time.monotonic() < deadline:
                for tp, records in c.poll(timeout_ms=500).items():
                    for r in records:
                        if r.value == SENTINEL:
                            done.add(tp.partition)
                        else:
                            got.append(r.value)
        finally:
            c.close()
        assert len(done) == 2, f"the sentinels never arrived: {got}"
        return sorted(got)

    assert read_all("read_committed") == [b"committed-%d" % i for i in range(7)]
    assert read_all("read_uncommitted") == sorted(
        [*(b"committed-%d" % i for i in range(7)), *(b"aborted-%d" % i for i in range(4))]
    )


def test_a_topic_deleted_mid_transaction(kafka_cluster: Cluster, unique_topic: Any) -> None:
    """Race: one of a transaction's topics is deleted between its records and the commit.
    The commit succeeds (the deleted topic's partition gets no marker: its log is gone)
    and the other topic's records are read_committed."""
    kept, doomed = unique_topic("txn-kept"), unique_topic("txn-doomed")
    create_topic(kafka_cluster, kept, 1)
    create_topic(kafka_cluster, doomed, 1)
    producer_at, consumer_at = kafka_cluster.kafka
    p = txn_producer(producer_at, f"tx-{kept}")
    p.begin_transaction()
    p.produce(kept, value=b"kept", partition=0)
    p.produce(doomed, value=b"doomed", partition=0)
    assert p.flush(30) == 0
    r = httpx.delete(
        f"{kafka_cluster.agents[0]}/v3/clusters/{kafka_cluster.cluster_id}/topics/{doomed}"
    )
    assert r.status_code == 204, r.text
    p.commit_transaction(30)
    produce_committed(p, kept, 1, SENTINEL)
    assert read(consumer_at, kept, 1, "read_committed") == [b"kept"]


def test_markers_left_unwritten_are_written_by_an_agents_sweep(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """Fault: the agent deciding a commit goes away before it writes the markers (modelled
    by deciding it through the coordinator's API, as EndTxn does, and writing nothing).
    The records stay below the last stable offset until an agent's sweep, finding the
    decision stale (``coordinator.log.transactions.STALE_DECISION_S``), writes the
    markers: then they are read_committed, the client's own commit (an EndTxn of the
    same decision) succeeds, and the id begins its next transaction."""
    topic = unique_topic("txn-orphaned")
    create_topic(kafka_cluster, topic, 1)
    producer_at, consumer_at = kafka_cluster.kafka
    tid = f"tx-{topic}"
    p = open_transaction(producer_at, tid, topic, b"decided")
    (state,) = kafka_call(
        consumer_at, DescribeTransactionsRequest(transactional_ids=(tid,))
    ).transaction_states
    coordinator = http_coordinator(kafka_cluster.coordinator_url)
    try:
        pending = coordinator.end_transaction(tid, state.producer_id, state.producer_epoch, True)
    finally:
        coordinator.close()
    assert pending is not None and len(pending.partitions) == 1
    deadline = time.monotonic() + STALE_DECISION_S + 30
    listed = ListTransactionsRequest(transactional_id_pattern=tid)
    while time.monotonic() < deadline:
        states = kafka_call(consumer_at, listed).transaction_states
        if [s.transaction_state for s in states] == ["CompleteCommit"]:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"the markers were never written: {states}")
    p.commit_transaction(30)  # the client's own EndTxn: the same decision, answered as done
    produce_committed(p, topic, 1, SENTINEL)
    assert read(consumer_at, topic, 1, "read_committed") == [b"decided"]


def test_a_transaction_goes_on_when_an_agent_is_killed(
    cluster_factory: ClusterFactory, unique_topic: Any
) -> None:
    """Fault: the agent that coordinates a transaction (and leads some of its partitions)
    is SIGKILLed mid-transaction. The producer finds the other agent (any agent is every
    id's coordinator), retries what was unacknowledged there, and commits: every record
    is read_committed exactly once."""
    cluster = cluster_factory(kafka=True, agent_env={"LAKELOG_LINGER_MS": "20"})
    topic = unique_topic("txn-kill")
    create_topic(cluster, topic, 4)
    p = txn_producer(
        ",".join(cluster.kafka),
        f"tx-{topic}",
        **{"message.timeout.ms": 120_000, "transaction.timeout.ms": 180_000},
    )
    p.begin_transaction()
    values = [b"r%d" % i for i in range(400)]
    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=i % 4)
        p.poll(0)
        if i == 200:
            assert p.flush(30) == 0
            cluster.agent_procs[0].kill()
    p.commit_transaction(120)
    produce_committed(p, topic, 4, SENTINEL)
    got = read(cluster.kafka[1], topic, 4, "read_committed")
    assert sorted(got) == sorted(values)


def test_a_transaction_past_its_timeout_is_aborted_by_the_agents(
    cluster_factory: ClusterFactory, unique_topic: Any
) -> None:
    """Race: the producer stalls mid-transaction longer than transaction.timeout.ms. An
    agent's sweep aborts it (its markers written, the last stable offset moves on) and
    fences the producer: its commit fails, nothing of it is read_committed, and a new
    instance of the id goes on."""
    cluster = cluster_factory(
        kafka=True, agent_env={"LAKELOG_KAFKA_TRANSACTION_ABORT_INTERVAL_MS": "300"}
    )
    topic = unique_topic("txn-timeout")
    create_topic(cluster, topic, 1)
    a, b = cluster.kafka
    tid = f"tx-{topic}"
    stalled = open_transaction(a, tid, topic, b"stalled", **{"transaction.timeout.ms": 2000})
    time.sleep(4)  # past the timeout, and a few sweeps
    with pytest.raises(KafkaException):
        stalled.commit_transaction(30)
    fresh = txn_producer(b, tid)
    produce_committed(fresh, topic, 1, b"fresh")
    produce_committed(fresh, topic, 1, SENTINEL)
    assert read(b, topic, 1, "read_committed") == [b"fresh"]
    assert read(b, topic, 1, "read_uncommitted") == [b"stalled", b"fresh"]


def test_tiered_aborted_transactions_do_not_hide_later_committed_records(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """Found by the whole-system checker: two transactional ids alternate aborted and
    committed transactions, tiering rewrites them (aborted records and markers left out),
    more transactions follow. A read_committed consumer from offset 0 reads every
    committed record. Before the fix the aborted transactions were still named in Fetch
    answers while their markers were gone, and librdkafka, waiting for those markers,
    dropped the producers' later committed batches (12 of 24 missing)."""
    topic = unique_topic("tiertxn")
    create_topic(kafka_cluster, topic, 1)
    at, reader_at = kafka_cluster.kafka
    producers = {n: txn_producer(at, f"{n}-{topic}") for n in ("p", "q")}
    committed: list[bytes] = []

    def rounds(first: int, last: int) -> None:
        for i in range(first, last):
            for name, p in producers.items():
                values = [f"{name}{i}-{j}".encode() for j in range(3)]
                p.begin_transaction()
                for v in values:
                    p.produce(topic, value=v, partition=0)
                assert p.flush(30) == 0
                if i % 2:
                    p.commit_transaction(30)
                    committed.extend(values)
                else:
                    p.abort_transaction(30)

    rounds(0, 4)
    r = httpx.post(
        f"{kafka_cluster.coordinator_url}/v1/janitors/tier/run", json={"tier_age_s": 0}, timeout=60
    )
    assert r.status_code == 200, r.text
    rounds(4, 8)
    produce_committed(producers["p"], topic, 1, SENTINEL)
    got = read(reader_at, topic, 1, "read_committed")
    assert got == committed


def test_a_consume_transform_produce_loop_writes_each_record_once_across_a_crash(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """The exactly-once loop (as Kafka Streams runs it): a group member consumes
    read_committed, produces each record transformed and sends its offsets in the same
    transaction; every third transaction aborts (the member rewinds to its committed
    offsets and does the work again). Half-way the process "crashes" in the middle of a
    transaction (records produced, offsets sent, nothing committed); a new instance (same
    transactional id, same group) fences it, aborting what it left, and carries on from
    the committed offsets. The output holds every input record transformed exactly once."""
    source, sink = unique_topic("ctp-in"), unique_topic("ctp-out")
    create_topic(kafka_cluster, source, 2)
    create_topic(kafka_cluster, sink, 2)
    producer_at, consumer_at = kafka_cluster.kafka
    plain = Producer({"bootstrap.servers": producer_at, "enable.idempotence": True})
    inputs = [b"r%03d" % i for i in range(120)]
    for i, v in enumerate(inputs):
        plain.produce(source, value=v, partition=i % 2)
    assert plain.flush(30) == 0
    group, tid = f"g-{source}", f"tx-{source}"

    def member() -> tuple[Consumer, Producer]:
        c = Consumer(
            {
                "bootstrap.servers": consumer_at,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
        c.subscribe([source])
        return c, txn_producer(producer_at, tid)

    def rewind(c: Consumer) -> None:
        """Back to the group's committed offsets (after an abort)."""
        for tp in c.committed(c.assignment(), 30):
            c.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))

    def run(c: Consumer, p: Producer, rounds: int, crash: bool) -> int:
        done = n = idle = 0
        deadline = time.monotonic() + 90
        while done < rounds and idle < 3 and time.monotonic() < deadline:
            msgs = [m for m in c.consume(10, 1.0) if m.error() is None]
            if not msgs:
                idle += done > 0  # the input is exhausted once work was done
                continue
            idle = 0
            n += 1
            p.begin_transaction()
            for m in msgs:
                p.produce(sink, value=b"T:" + m.value(), partition=m.partition())
            positions = [tp for tp in c.position(c.assignment()) if tp.offset >= 0]
            p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 30)
            if crash and done == rounds - 1:
                assert p.flush(30) == 0
                return done  # dies mid-transaction: never commits nor aborts
            if n % 3 == 0:
                p.abort_transaction(30)
                rewind(c)
                continue
            p.commit_transaction(30)
            done += 1
        return done

    c, p = member()
    run(c, p, 4, crash=True)
    c.close()  # the group moves on; the producer is simply abandoned
    c, p2 = member()  # fences the first instance, aborts its open transaction
    try:
        run(c, p2, 1000, crash=False)  # until the input is exhausted
    finally:
        c.close()
    produce_committed(p2, sink, 2, SENTINEL)
    out = read(consumer_at, sink, 2, "read_committed")
    assert sorted(out) == sorted(b"T:" + v for v in inputs)
