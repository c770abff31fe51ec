"""message.timestamp.type=LogAppendTime (issue 22 defect 10): Kafka stamps the append time.

A topic so configured gets the append time on every batch, whatever the producer said:
in the batch header for Kafka clients (attributes bit 3, MaxTimestamp), as the
timestamp REST consumers read, and as Spark's ``timestampType`` 1.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import httpx
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Producer

from tests.integration.conftest import Cluster
from tests.integration.test_consumer_api import Consumer as RestConsumer
from tests.integration.test_kafka_clients import consume_all, create_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The producers' CreateTime: 2001-09-09, far from any append time.
OLD_MS = 1_000_000_000_000


def produce_old_over_rest(cluster: Cluster, topic: str) -> dict[str, Any]:
    """One v3 record "rest" to partition 0 through the second agent, with a CreateTime of
    2001-09-09: its delivery report (a 200 asserted)."""
    r = httpx.post(
        f"{cluster.agents[1]}/v3/clusters/{cluster.cluster_id}/topics/{topic}/records",
        json={
            "partition_id": 0,
            "timestamp": "2001-09-09T01:46:40Z",
            "value": {"type": "BINARY", "data": base64.b64encode(b"rest").decode()},
        },
    )
    assert r.status_code == 200 and r.json()["error_code"] == 200, r.text
    report: dict[str, Any] = r.json()
    return report


def test_log_append_time_is_stamped_for_kafka_rest_and_spark(
    kafka_cluster: Cluster, unique_topic: Any, spark: Any
) -> None:
    """Records produced with an old CreateTime, by a Kafka client and over REST v3, come
    back with the append time: a Kafka consumer sees TIMESTAMP_LOG_APPEND_TIME and a time
    within the produce; a REST consumer reads that time; Spark reads timestampType 1.
    On main the producer's 2001 timestamps came back, type CreateTime."""
    topic = unique_topic("lat")
    create_topic(kafka_cluster, topic, 1, **{"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": kafka_cluster.kafka[0], "linger.ms": 5})
    for i in range(5):
        p.produce(topic, value=b"k%d" % i, partition=0, timestamp=OLD_MS)
    assert p.flush(30) == 0
    produce_old_over_rest(kafka_cluster, topic)
    after = int(time.time() * 1000) + 1

    got = consume_all(kafka_cluster.kafka[1], topic, 1, 6)
    assert [m.value() for m in got] == [b"k0", b"k1", b"k2", b"k3", b"k4", b"rest"]
    for m in got:
        kind, ts = m.timestamp()
        assert kind == TIMESTAMP_LOG_APPEND_TIME and before <= ts <= after, (kind, ts)

    rest = RestConsumer.create(
        kafka_cluster.agents, f"lat-{topic}", **{"auto.offset.reset": "earliest"}
    )
    rest.assign(topic, 0)
    records: list[Any] = []
    deadline = time.monotonic() + 20
    while len(records) < 6 and time.monotonic() < deadline:
        records.extend(rest.fetch(500))
    assert len(records) == 6
    assert [r["timestamp"] for r in records] == [m.timestamp()[1] for m in got]

    rows = (
        spark.read.format("lakelog")
        .options(coordinator=kafka_cluster.coordinator_url, subscribe=topic)
        .load()
        .select("timestampType", "timestamp")
        .collect()
    )
    assert [r.timestampType for r in rows] == [1] * 6
    assert all(before <= int(r.timestamp.timestamp() * 1000) <= after for r in rows)


def test_the_produce_answers_carry_the_append_time(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """Kafka's Produce answer holds ``log_append_time_ms`` for a LogAppendTime topic (-1
    otherwise): a confluent-kafka delivery report then says TIMESTAMP_LOG_APPEND_TIME
    with the time the records carry. The REST v3 answer's timestamp is that time too.
    Before: the reports showed the producer's CreateTime (2001) for both."""
    stamped = unique_topic("lat-answer")
    plain = unique_topic("ct-answer")
    create_topic(kafka_cluster, stamped, 1, **{"message.timestamp.type": "LogAppendTime"})
    create_topic(kafka_cluster, plain, 1)
    reports: list[tuple[str, int, tuple[int, int]]] = []

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        reports.append((msg.topic(), msg.offset(), msg.timestamp()))

    p = Producer({"bootstrap.servers": kafka_cluster.kafka[0], "linger.ms": 5})
    for topic in (stamped, plain):
        for i in range(3):
            p.produce(topic, value=b"v%d" % i, partition=0, timestamp=OLD_MS, on_delivery=delivered)
    assert p.flush(30) == 0
    report = produce_old_over_rest(kafka_cluster, stamped)
    answered = report["timestamp"]

    got = consume_all(kafka_cluster.kafka[1], stamped, 1, 4)
    stored = {m.offset(): m.timestamp()[1] for m in got}
    mine = sorted((o, ts) for t, o, ts in reports if t == stamped)
    assert [o for o, _ in mine] == [0, 1, 2]
    for offset, (kind, ts) in mine:
        assert kind == TIMESTAMP_LOG_APPEND_TIME and ts == stored[offset], (kind, ts, stored)
    # The v3 answer is an ISO-8601 date-time of the stamped time (ms precision).
    from datetime import datetime

    answered_ms = int(datetime.fromisoformat(answered.replace("Z", "+00:00")).timestamp() * 1000)
    assert answered_ms == stored[3], (answered, stored[3])
    others = [ts for t, _, ts in reports if t == plain]
    assert others == [(TIMESTAMP_CREATE_TIME, OLD_MS)] * 3, others
