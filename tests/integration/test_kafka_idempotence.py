"""Idempotent Kafka producers across an agent's crash (DESIGN.md invariant 7)."""

from __future__ import annotations

import datetime
import time
from collections import Counter
from dataclasses import replace
from typing import Any

import httpx
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest

from tests.integration.conftest import Cluster, ClusterFactory
from tests.integration.test_kafka_clients import (
    _raw_produce,
    consume_all,
    create_topic,
    kafka_call,
    watermarks,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def idempotent_producer(cluster: Cluster, message_timeout_ms: int, **extra: Any) -> Producer:
    """librdkafka's idempotent producer, given every agent of ``cluster`` to bootstrap from."""
    return Producer(
        {
            "bootstrap.servers": ",".join(cluster.kafka),
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": message_timeout_ms,
            **extra,
        }
    )


class Deliveries:
    """An on_delivery callback: the (value, partition, offset) of each message acknowledged,
    in the order of the acknowledgements, and the errors of the others."""

    def __init__(self) -> None:
        self.acked: list[tuple[bytes, int, int]] = []
        self.errors: list[Any] = []

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.acked.append((msg.value(), msg.partition(), msg.offset()))


def test_idempotent_producer_survives_agent_sigkill(
    cluster_factory: ClusterFactory, unique_topic: Any
) -> None:
    """Race: an agent is SIGKILLed while an idempotent producer streams to it, so some
    batches were committed but never acknowledged. The producer retries them through the
    other agent: every record is stored exactly once (none lost, none twice), each
    partition's offsets contiguous."""
    cluster = cluster_factory(kafka=True, agent_env={"LAKELOG_LINGER_MS": "20"})
    topic = unique_topic("idem")
    create_topic(cluster, topic, 4)
    p = idempotent_producer(cluster, 120_000, partitioner="murmur2_random")
    report = Deliveries()
    total = 3000
    for i in range(total):
        p.produce(topic, key=b"%d" % (i % 97), value=b"rec-%d" % i, on_delivery=report)
        p.poll(0)
        if i == total // 2:
            # Half sent, some acknowledged, the rest in flight: kill agent 0 now.
            deadline = time.monotonic() + 60
            while len(report.acked) < 300 and time.monotonic() < deadline:
                p.poll(0.05)
            assert len(report.acked) >= 300, "no acknowledgement before the kill"
            cluster.agent_procs[0].kill()
    assert p.flush(150) == 0, "records still unacknowledged"
    assert report.errors == []
    assert len(report.acked) == total
    got = consume_all(cluster.kafka[1], topic, 4, total)
    values = Counter(m.value() for m in got)
    assert [v for v, n in values.items() if n > 1] == []  # nothing stored twice
    assert set(values) == {b"rec-%d" % i for i in range(total)}  # nothing lost
    assert {(m.value(), m.partition(), m.offset()) for m in got} == set(report.acked)
    for part in range(4):
        offsets = sorted(m.offset() for m in got if m.partition() == part)
        assert offsets == list(range(len(offsets)))


def _idempotent_batch(pid: int, epoch: int, seq: int, n: int) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, 0, pid, epoch, seq, 1 << 20)
    for i in range(n):
        b.append(i, 1000, None, b"seq-%d" % (seq + i), [])
    return bytes(b.build())


def test_a_retry_through_another_agent_is_stored_once(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """Race: a producer's ack is lost and it retries the same batch through the other
    agent: the retry is answered with the first offsets and nothing is stored twice.
    A gap is OUT_OF_ORDER_SEQUENCE_NUMBER; an epoch older than the producer's latest is
    INVALID_PRODUCER_EPOCH (after the epoch is bumped)."""
    topic = unique_topic("retry")
    create_topic(kafka_cluster, topic, 1)
    a, b = kafka_cluster.kafka
    init = InitProducerIdRequest(
        transactional_id=None,
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=-1,
        producer_epoch=-1,
    )
    got = kafka_call(a, init)
    assert got.error_code == ErrorCode.none and got.producer_epoch == 0
    pid = got.producer_id
    first = _raw_produce(a, topic, 0, _idempotent_batch(pid, 0, 0, 5))
    assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
    retry = _raw_produce(b, topic, 0, _idempotent_batch(pid, 0, 0, 5))
    assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 0)
    nxt = _raw_produce(b, topic, 0, _idempotent_batch(pid, 0, 5, 3))
    assert (nxt.error_code, nxt.base_offset) == (ErrorCode.none, 5)
    assert watermarks(kafka_cluster, topic) == (0, 8)  # 5 + 3, not 13
    gap = _raw_produce(a, topic, 0, _idempotent_batch(pid, 0, 20, 1))
    assert gap.error_code == ErrorCode.out_of_order_sequence_number
    # Kafka's InitProducerId without a transactional id ignores the id and epoch it
    # carries: a new producer id, never a bump (nor INVALID_PRODUCER_EPOCH).
    again = kafka_call(a, replace(init, producer_id=pid, producer_epoch=0))
    assert again.error_code == ErrorCode.none and again.producer_id != pid
    assert again.producer_epoch == 0
    # The epoch bump that fences older batches is lakelog's REST call (same producer state).
    bumped = httpx.post(
        f"{kafka_cluster.agents[1]}/v3/clusters/{kafka_cluster.cluster_id}/producers",
        json={"producer_id": pid, "producer_epoch": 0},
    ).json()
    assert bumped == {"producer_id": pid, "producer_epoch": 1}
    assert _raw_produce(b, topic, 0, _idempotent_batch(pid, 1, 0, 2)).error_code == 0
    stale = _raw_produce(a, topic, 0, _idempotent_batch(pid, 0, 8, 1))
    assert stale.error_code == ErrorCode.invalid_producer_epoch
    assert watermarks(kafka_cluster, topic) == (0, 10)


def test_an_idempotent_producer_goes_on_when_its_topic_is_created_again(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """A topic deleted and created again under its name while librdkafka's idempotent
    producer writes to it: the new incarnation holds no state of that producer, which
    keeps counting where it stood. As in Kafka (KIP-360: no state, any sequence) its
    next batches are stored, at the new topic's first offsets; an
    OUT_OF_ORDER_SEQUENCE_NUMBER there is fatal to the producer (what the chaos run
    showed on the recreated ``churn`` topic)."""
    topic = unique_topic("again")
    create_topic(kafka_cluster, topic, 1)
    p = idempotent_producer(kafka_cluster, 60_000)
    report = Deliveries()
    for i in range(40):
        p.produce(topic, value=b"first-%d" % i, partition=0, on_delivery=report)
    assert p.flush(60) == 0 and report.errors == []
    r = httpx.delete(
        f"{kafka_cluster.agents[0]}/v3/clusters/{kafka_cluster.cluster_id}/topics/{topic}"
    )
    assert r.status_code == 204, r.text
    create_topic(kafka_cluster, topic, 1)
    for i in range(40):
        p.produce(topic, value=b"second-%d" % i, partition=0, on_delivery=report)
        p.poll(0)
    assert p.flush(90) == 0
    assert report.errors == []
    assert report.acked[40:] == [(b"second-%d" % i, 0, i) for i in range(40)]
    got = consume_all(kafka_cluster.kafka[1], topic, 1, 40)
    assert [(m.value(), m.partition(), m.offset()) for m in got] == report.acked[40:]
