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
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Producer

from tests.integration.conftest import Cluster
from tests.integration.test_consumer_api import Consumer as RestConsumer
from tests.integration.test_kafka_clients import consume_all, create_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The producers' CreateTime: 2001-09-09, far from any append time.
OLD_MS = 1_000_000_000_000


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
    r = httpx.post(
        f"{kafka_cluster.agents[1]}/v3/clusters/{kafka_cluster.cluster_id}/topics/{topic}/records",
        json={
            "partition_id": 0,
            "timestamp": "2001-09-09T01:46:40Z",
            "value": {"type": "BINARY", "data": base64.b64encode(b"rest").decode()},
        },
    )
    assert r.status_code == 200 and r.json()["error_code"] == 200, r.text
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
