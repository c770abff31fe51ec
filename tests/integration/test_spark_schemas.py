"""Spark reads schema-framed values produced over REST: Avro through
``spark.avro_values.with_avro_values`` (the registry's schemas, writer resolved to reader),
JSON Schema through the documented ``from_json`` over the body after the 5-byte header."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from spark.avro_values import with_avro_values
from tests.integration.conftest import Cluster, create_topic

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


def _read(spark: Any, cluster: Cluster, topic: str) -> Any:
    """A batch read of ``topic`` through the coordinator and the bucket."""
    return (
        spark.read.format("lakelog")
        .option("coordinator", cluster.coordinator_url)
        .option("store", cluster.store_url)
        .option("store.endpoint", cluster.store_endpoint)
        .option("subscribe", topic)
        .load()
    )


def test_spark_decodes_avro_and_json_schema_values(spark: Any, lakelog_cluster: Cluster) -> None:
    cluster = lakelog_cluster
    agent = cluster.agents[0]
    topic = f"spark-sr-{uuid.uuid4().hex[:8]}"
    create_topic(cluster, topic, 1)
    _produce(agent, topic, "avro", V1, [{"id": 1, "item": "apple"}, {"id": 2, "item": "pear"}])
    _produce(
        agent, topic, "avro", V2, [{"id": 3, "item": "fig", "qty": 5, "note": {"string": "x"}}]
    )

    df = _read(spark, cluster, topic)
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
    create_topic(cluster, json_topic, 1)
    schema = '{"type":"object","properties":{"id":{"type":"integer"},"item":{"type":"string"}}}'
    _produce(agent, json_topic, "jsonschema", schema, [{"id": 7, "item": "kiwi"}])
    js = _read(spark, cluster, json_topic).selectExpr(
        "from_json(cast(substring(value, 6) as string), 'id long, item string') AS v"
    )
    assert [r.v.asDict() for r in js.collect()] == [{"id": 7, "item": "kiwi"}]


LOGICAL = {
    "type": "record",
    "name": "Every",
    "namespace": "io.spark",
    "fields": [
        {"name": "d", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "lts", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "ltu", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {
            "name": "dec",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {
            "name": "fdec",
            "type": {
                "type": "fixed",
                "name": "F8",
                "size": 8,
                "logicalType": "decimal",
                "precision": 12,
                "scale": 3,
            },
        },
        {"name": "il", "type": ["int", "long"]},
        {"name": "fd", "type": ["null", "float", "double"]},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "BLUE"]}},
        {"name": "multi", "type": ["null", "int", "long", "string", "Color"]},
        {"name": "opt", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
    ],
}


def test_spark_maps_every_logical_type_and_union_as_from_avro(
    spark: Any, lakelog_cluster: Cluster
) -> None:
    """Spark's own ``from_avro`` types: dates and (local) timestamps as such, time-* as their
    int/long, uuid as a string, decimals on bytes and fixed, [int, long] as long, [float,
    double] as double, other unions as member structs holding the branch taken."""
    import datetime as dt
    import json
    from decimal import Decimal

    cluster = lakelog_cluster
    agent = cluster.agents[0]
    topic = f"spark-lt-{uuid.uuid4().hex[:8]}"
    create_topic(cluster, topic, 1)
    base = {
        "d": 19000, "tm": 3_600_000, "tu": 7_200_000_000, "ts": 1_700_000_000_123,
        "tsu": 1_700_000_000_123_456, "lts": 1_700_000_000_123, "ltu": 1_700_000_000_123_456,
        "u": "2f0b9c2e-8f7a-4c63-9d1e-0a6b5c4d3e2f", "dec": "\u0000\u0000\u0030\u0039",
        "fdec": "\u0000\u0000\u0000\u0000\u0000\u0001\u00e2\u0040", "color": "BLUE",
    }  # fmt: skip
    values = [
        {**base, "il": {"int": 7}, "fd": {"float": 1.5}, "multi": {"long": 2**40},
         "opt": {"long": 1_700_000_000_000}},
        {**base, "il": {"long": 2**40}, "fd": None, "multi": None, "opt": None},
        {**base, "il": {"int": 1}, "fd": {"double": 2.25}, "multi": {"int": 5}, "opt": None},
        {**base, "il": {"int": 1}, "fd": None, "multi": {"string": "s"}, "opt": None},
    ]  # fmt: skip
    _produce(agent, topic, "avro", json.dumps(LOGICAL), values)
    df = _read(spark, cluster, topic)
    decoded = with_avro_values(df, agent, subject=f"{topic}-value").orderBy("offset")
    types = {f.name: f.dataType.simpleString() for f in decoded.schema["value_avro"].dataType}
    assert types == {
        "d": "date", "tm": "int", "tu": "bigint", "ts": "timestamp", "tsu": "timestamp",
        "lts": "timestamp_ntz", "ltu": "timestamp_ntz", "u": "string", "dec": "decimal(9,2)",
        "fdec": "decimal(12,3)", "il": "bigint", "fd": "double", "color": "string",
        "multi": "struct<member0:int,member1:bigint,member2:string,member3:string>",
        "opt": "timestamp",
    }  # fmt: skip
    rows = [r.value_avro.asDict(recursive=True) for r in decoded.collect()]
    first = rows[0]
    assert first["d"] == dt.date(1970, 1, 1) + dt.timedelta(days=19000)
    assert (first["tm"], first["tu"]) == (3_600_000, 7_200_000_000)
    assert first["lts"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000)
    assert first["ltu"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert first["u"] == "2f0b9c2e-8f7a-4c63-9d1e-0a6b5c4d3e2f"
    assert (first["dec"], first["fdec"]) == (Decimal("123.45"), Decimal("123.456"))
    assert (first["color"], first["il"], first["fd"]) == ("BLUE", 7, 1.5)
    assert [r["multi"] for r in rows] == [
        {"member0": None, "member1": 2**40, "member2": None, "member3": None},
        None,  # (an enum value in a union beside a string: see the report's open item)
        {"member0": 5, "member1": None, "member2": None, "member3": None},
        {"member0": None, "member1": None, "member2": "s", "member3": None},
    ]
    assert [r["il"] for r in rows] == [7, 2**40, 1, 1]
    assert [r["fd"] for r in rows] == [1.5, None, 2.25, None]
    assert rows[0]["opt"] is not None and rows[1]["opt"] is None
    # Timestamps are instants: the session time zone renders them, the value is the same.
    epoch_ms = decoded.selectExpr("unix_millis(value_avro.ts) AS ms").first()["ms"]
    assert epoch_ms == 1_700_000_000_123
