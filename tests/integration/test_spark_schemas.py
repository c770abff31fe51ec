"""Spark reads schema-framed values produced over REST: Avro through
``spark.avro_values.with_avro_values`` (the registry's schemas, writer resolved to reader),
JSON Schema through the documented ``from_json`` over the body after the 5-byte header."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from spark.avro_values import with_avro_values
from tests.integration.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

V1 = (
    '{"type":"record","name":"Order","namespace":"io.spark","fields":'
    '[{"name":"id","type":"long"},{"name":"item","type":"string"}]}'
)
V2 = (
    '{"type":"record","name":"Order","namespace":"io.spark","fields":'
    '[{"name":"id","type":"long"},{"name":"item","type":"string"},'
    '{"name":"qty","type":"int","default":1},'
    '{"name":"note","type":["null","string"],"default":null}]}'
)


def _produce(agent: str, topic: str, fmt: str, schema: str, values: list[Any]) -> None:
    r = httpx.post(
        f"{agent}/topics/{topic}/partitions/0",
        json={"value_schema": schema, "records": [{"value": v} for v in values]},
        headers={"content-type": f"application/vnd.kafka.{fmt}.v2+json"},
    )
    assert r.status_code == 200, r.text


def test_spark_decodes_avro_and_json_schema_values(spark: Any, lakelog_cluster: Cluster) -> None:
    cluster = lakelog_cluster
    agent = cluster.agents[0]
    topic = f"spark-sr-{uuid.uuid4().hex[:8]}"
    r = httpx.post(
        f"{agent}/v3/clusters/{cluster.cluster_id}/topics",
        json={"topic_name": topic, "partitions_count": 1},
    )
    assert r.status_code == 201
    _produce(agent, topic, "avro", V1, [{"id": 1, "item": "apple"}, {"id": 2, "item": "pear"}])
    _produce(
        agent, topic, "avro", V2, [{"id": 3, "item": "fig", "qty": 5, "note": {"string": "x"}}]
    )

    df = (
        spark.read.format("lakelog")
        .option("coordinator", cluster.coordinator_url)
        .option("store", cluster.store_url)
        .option("store.endpoint", cluster.store_endpoint)
        .option("subscribe", topic)
        .load()
    )
    decoded = with_avro_values(df, agent, subject=f"{topic}-value")
    rows = decoded.orderBy("offset").select("offset", "value_avro.*").collect()
    # v1's records read as the latest schema: the new fields take their defaults.
    assert [tuple(r) for r in rows] == [
        (0, 1, "apple", 1, None),
        (1, 2, "pear", 1, None),
        (2, 3, "fig", 5, "x"),
    ]
    first = with_avro_values(df, agent, subject=f"{topic}-value", version=1, output="v1")
    assert [r.v1.asDict() for r in first.orderBy("offset").limit(1).collect()] == [
        {"id": 1, "item": "apple"}
    ]

    json_topic = f"spark-js-{uuid.uuid4().hex[:8]}"
    httpx.post(
        f"{agent}/v3/clusters/{cluster.cluster_id}/topics",
        json={"topic_name": json_topic, "partitions_count": 1},
    ).raise_for_status()
    schema = '{"type":"object","properties":{"id":{"type":"integer"},"item":{"type":"string"}}}'
    _produce(agent, json_topic, "jsonschema", schema, [{"id": 7, "item": "kiwi"}])
    js = (
        spark.read.format("lakelog")
        .option("coordinator", cluster.coordinator_url)
        .option("store", cluster.store_url)
        .option("store.endpoint", cluster.store_endpoint)
        .option("subscribe", json_topic)
        .load()
        .selectExpr("from_json(cast(substring(value, 6) as string), 'id long, item string') AS v")
    )
    assert [r.v.asDict() for r in js.collect()] == [{"id": 7, "item": "kiwi"}]
