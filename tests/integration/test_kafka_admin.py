"""Kafka admin clients against the agents: topics, partitions, configs, records, cluster."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from confluent_kafka.error import KafkaException
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KNewTopic

from tests.integration.conftest import Cluster
from tests.integration.test_kafka_clients import _batch, _raw_produce, plain_consumer

pytestmark = pytest.mark.integration


def _admin(cluster: Cluster, agent: int = 0) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.kafka[agent]})


def _code(future: Any) -> int:
    try:
        future.result(30)
    except KafkaException as e:
        return int(e.args[0].code())
    return 0


def _v3(cluster: Cluster, path: str) -> Any:
    r = httpx.get(f"{cluster.agents[1]}/v3/clusters/{cluster.cluster_id}{path}")
    assert r.status_code == 200, r.text
    return r.json()


def test_topics_partitions_and_configs(kafka_cluster: Cluster, unique_topic: Any) -> None:
    """Create (with configs), describe, alter both ways, grow and delete through the wire;
    REST sees every change, and errors carry Kafka's codes."""
    admin = _admin(kafka_cluster)
    topic = unique_topic("adm")
    fs = admin.create_topics(
        [NewTopic(topic, 2, 1, config={"retention.ms": "3600000", "cleanup.policy": "delete"})]
    )
    assert _code(fs[topic]) == 0
    assert _v3(kafka_cluster, f"/topics/{topic}")["partitions_count"] == 2
    assert _code(admin.create_topics([NewTopic(topic, 2, 1)])[topic]) == 36  # exists
    bad = unique_topic("bad")
    assert _code(admin.create_topics([NewTopic(bad, 0, 1)])[bad]) == 37  # invalid partitions
    assert _code(admin.create_topics([NewTopic("a/b", 1, 1)])["a/b"]) == 17  # invalid name
    assert _code(admin.create_topics([NewTopic(bad, 1, 1, config={"nope": "1"})])[bad]) == 40

    res = ConfigResource("topic", topic)
    configs = admin.describe_configs([res])[res].result(30)
    assert configs["retention.ms"].value == "3600000" and not configs["retention.ms"].is_default
    assert configs["segment.ms"].is_default

    inc = ConfigResource(
        "topic",
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry(
                "cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND
            ),
            ConfigEntry("max.message.bytes", "50000", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    assert _code(admin.incremental_alter_configs([inc])[inc]) == 0
    configs = admin.describe_configs([res])[res].result(30)
    assert configs["retention.ms"].is_default
    assert configs["cleanup.policy"].value == "delete,compact"
    assert configs["max.message.bytes"].value == "50000"
    rest = {c["name"]: c["value"] for c in _v3(kafka_cluster, f"/topics/{topic}/configs")["data"]}
    assert rest["max.message.bytes"] == "50000"

    assert _code(admin.create_partitions([NewPartitions(topic, 5)])[topic]) == 0
    assert _code(admin.create_partitions([NewPartitions(topic, 3)])[topic]) == 37
    assert _v3(kafka_cluster, f"/topics/{topic}")["partitions_count"] == 5
    meta = admin.list_topics(topic, timeout=30)
    assert len(meta.topics[topic].partitions) == 5
    # Every topic: librdkafka's all-topics Metadata v12 has bytes past its body (Kafka
    # ignores them; so do we).
    everything = admin.list_topics(timeout=30)
    assert topic in everything.topics and len(everything.brokers) == len(kafka_cluster.agents)

    assert _code(admin.delete_topics([topic])[topic]) == 0
    assert _code(admin.delete_topics([topic])[topic]) == 3  # unknown topic or partition
    assert (
        httpx.get(
            f"{kafka_cluster.agents[0]}/v3/clusters/{kafka_cluster.cluster_id}/topics/{topic}"
        ).status_code
        == 404
    )


def test_kafka_python_admin_and_legacy_alter_configs(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """kafka-python's admin: create, describe cluster (both agents are brokers)."""
    admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.kafka[1])
    topic = unique_topic("kpa")
    admin.create_topics([KNewTopic(topic, 3, 1, topic_configs={"retention.ms": "1000"})])
    cluster = admin.describe_cluster()
    assert len(cluster["brokers"]) == 2
    assert cluster["cluster_id"] == kafka_cluster.cluster_id
    assert sorted(admin.list_topics()).count(topic) == 1
    admin.close()


def test_delete_records_moves_log_start(kafka_cluster: Cluster, unique_topic: Any) -> None:
    """DeleteRecords raises the low watermark: consumers start there, REST shows it,
    and an offset past the high watermark is OFFSET_OUT_OF_RANGE."""
    topic = unique_topic("delrec")
    admin = _admin(kafka_cluster)
    assert _code(admin.create_topics([NewTopic(topic, 1, 1)])[topic]) == 0
    for _ in range(4):
        _raw_produce(kafka_cluster.kafka[0], topic, 0, _batch(5))
    (done,) = admin.delete_records([TopicPartition(topic, 0, 12)]).values()
    assert done.result(30).low_watermark == 12
    (past,) = admin.delete_records([TopicPartition(topic, 0, 99)]).values()
    with pytest.raises(KafkaException) as err:
        past.result(30)
    assert err.value.args[0].code() == 1  # OFFSET_OUT_OF_RANGE
    # Position 0 is now out of range: the consumer resets to the earliest offset, 12; the
    # batch holding 12 comes whole and the client skips the records before it.
    c = plain_consumer(kafka_cluster.kafka[1], {"auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 0)])
    offsets: list[int] = []
    deadline = time.monotonic() + 30
    while len(offsets) < 8 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            offsets.append(m.offset())
    c.close()
    assert offsets == list(range(12, 20))
    part = _v3(kafka_cluster, f"/topics/{topic}/partitions/0")
    assert part["partition_id"] == 0
