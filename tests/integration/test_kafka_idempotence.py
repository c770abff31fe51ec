"""Idempotent Kafka producers across an agent's crash (DESIGN.md invariant 7)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.integration.conftest import ClusterFactory
from tests.integration.test_kafka_clients import consume_all, create_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]


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
    p = Producer(
        {
            "bootstrap.servers": ",".join(cluster.kafka),
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
            "partitioner": "murmur2_random",
        }
    )
    acked: list[tuple[bytes, int, int]] = []
    errors: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.append((msg.value(), msg.partition(), msg.offset()))

    total = 3000
    killed = False
    for i in range(total):
        p.produce(topic, key=b"%d" % (i % 97), value=b"rec-%d" % i, on_delivery=report)
        p.poll(0)
        if i % 50 == 0:
            time.sleep(0.01)  # keep batches flowing while the kill lands
        if not killed and len(acked) > 1000:
            cluster.agent_procs[0].kill()
            killed = True
    assert p.flush(150) == 0, "records still unacknowledged"
    assert killed
    assert errors == []
    assert len(acked) == total
    got = consume_all(cluster.kafka[1], topic, 4, total)
    values = Counter(m.value() for m in got)
    assert [v for v, n in values.items() if n > 1] == []  # nothing stored twice
    assert set(values) == {b"rec-%d" % i for i in range(total)}  # nothing lost
    assert {(m.value(), m.partition(), m.offset()) for m in got} == set(acked)
    for part in range(4):
        offsets = sorted(m.offset() for m in got if m.partition() == part)
        assert offsets == list(range(len(offsets)))
