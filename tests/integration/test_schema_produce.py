"""The REST Proxy's schema formats on real agent processes, checked with Confluent's own
serializers (confluent-kafka): their bytes produced over REST v2 binary are consumed over
REST v2 avro/jsonschema/protobuf, and REST v2 schema produce is read back as raw bytes and
decoded by Confluent's deserializers. Bad input gets its exact error and stores nothing.

A Kafka producer with the Confluent serializer (the wire-protocol door) will be one more
case here: the bytes it writes are exactly what ``_serialize`` makes below.
"""

from __future__ import annotations

import base64
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from index.log import LogReader
from segments.types import ConsumedRecord
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

AVRO_SCHEMA = (
    '{"type":"record","name":"Order","namespace":"io.example","fields":'
    '[{"name":"id","type":"long"},{"name":"item","type":"string"},'
    '{"name":"note","type":["null","string"],"default":null}]}'
)
PROTO_SCHEMA = (
    'syntax = "proto3";\npackage io.example;\nmessage Order { int64 id = 1; string item = 2; }\n'
)
JSON_SCHEMA = (
    '{"type":"object","title":"Order","properties":{"id":{"type":"integer"},'
    '"item":{"type":"string"}},"required":["id","item"]}'
)


def _order_class() -> Any:
    """A Protobuf message class built with protobuf's own API (as protoc's output would be)."""
    fd = descriptor_pb2.FileDescriptorProto(
        name="order.proto", package="io.example", syntax="proto3"
    )
    msg = fd.message_type.add(name="Order")
    t = descriptor_pb2.FieldDescriptorProto
    msg.field.add(name="id", number=1, type=t.TYPE_INT64, label=t.LABEL_OPTIONAL)
    msg.field.add(name="item", number=2, type=t.TYPE_STRING, label=t.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("io.example.Order"))


Order = _order_class()

# The JSON form of each test value, as the REST API carries it per format.
REST_VALUES = {
    "avro": [
        {"id": 1, "item": "apple", "note": None},
        {"id": 2, "item": "pear", "note": {"string": "ripe"}},
    ],
    "jsonschema": [{"id": 1, "item": "apple"}, {"id": 2, "item": "pear"}],
    "protobuf": [{"id": "1", "item": "apple"}, {"id": "2", "item": "pear"}],
}
FORMATS = tuple(REST_VALUES)


@pytest.fixture(scope="module")
def cluster(lakelog_cluster: Cluster) -> Cluster:
    return lakelog_cluster


@pytest.fixture
def registry(cluster: Cluster) -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient({"url": cluster.agents[1]}) as client:
        yield client


@pytest.fixture
def topic(cluster: Cluster) -> str:
    return new_topic(cluster)


def new_topic(cluster: Cluster) -> str:
    name = f"orders-{uuid.uuid4().hex[:10]}"
    r = httpx.post(
        f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics",
        json={"topic_name": name, "partitions_count": 1},
    )
    assert r.status_code == 201, r.text
    return name


def read_all(reader: LogReader, topic: str) -> list[ConsumedRecord]:
    out: list[ConsumedRecord] = []
    while batch := reader.read(topic, 0, len(out), max_bytes=1 << 20):
        out.extend(batch)
    return out


def produce_v2(agent: str, topic: str, fmt: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{agent}/topics/{topic}",
        json=body,
        headers={"content-type": f"application/vnd.kafka.{fmt}.v2+json"},
    )


def consume_v2(agent: str, topic: str, fmt: str, count: int) -> list[dict[str, Any]]:
    """Every record of partition 0 through a REST consumer of format ``fmt``."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    ctl = {"content-type": "application/vnd.kafka.v2+json"}
    r = httpx.post(f"{agent}/consumers/{group}", json={"format": fmt}, headers=ctl)
    assert r.status_code == 200, r.text
    base = r.json()["base_uri"]
    parts = {"partitions": [{"topic": topic, "partition": 0}]}
    assert httpx.post(f"{base}/assignments", json=parts, headers=ctl).status_code == 204
    assert httpx.post(f"{base}/positions/beginning", json=parts, headers=ctl).status_code == 204
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        r = httpx.get(
            f"{base}/records",
            params={"timeout": 1000},
            headers={"accept": f"application/vnd.kafka.{fmt}.v2+json"},
        )
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == f"application/vnd.kafka.{fmt}.v2+json"
        got += r.json()
    httpx.delete(base, headers=ctl)
    return got


def _serializers(fmt: str, client: SchemaRegistryClient) -> tuple[Any, Any]:
    if fmt == "avro":
        return AvroSerializer(client, AVRO_SCHEMA), AvroDeserializer(client)
    if fmt == "jsonschema":
        return JSONSerializer(JSON_SCHEMA, client), JSONDeserializer(
            None, schema_registry_client=client
        )
    return (
        ProtobufSerializer(Order, client, {"use.deprecated.format": False}),
        ProtobufDeserializer(
            Order, {"use.deprecated.format": False}, schema_registry_client=client
        ),
    )


def _native(fmt: str, i: int) -> Any:
    """The i-th test value as Confluent's serializers take it."""
    if fmt == "avro":
        return {"id": i + 1, "item": ["apple", "pear"][i], "note": [None, "ripe"][i]}
    if fmt == "jsonschema":
        return {"id": i + 1, "item": ["apple", "pear"][i]}
    return Order(id=i + 1, item=["apple", "pear"][i])


def _serialize(fmt: str, client: SchemaRegistryClient, topic: str) -> list[bytes]:
    serializer, _ = _serializers(fmt, client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [serializer(_native(fmt, i), ctx) for i in range(2)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_confluent_serialized_bytes_consume_as_schema_format(
    cluster: Cluster, registry: SchemaRegistryClient, topic: str, fmt: str
) -> None:
    """Confluent's serializer registers the schema (through our registry) and frames the
    values; produced over REST v2 binary, a REST consumer of the format decodes them."""
    framed = _serialize(fmt, registry, topic)
    assert all(b[0] == 0 for b in framed)
    body = {"records": [{"value": base64.b64encode(b).decode()} for b in framed]}
    r = produce_v2(cluster.agents[0], topic, "binary", body)
    assert r.status_code == 200, r.text
    got = consume_v2(cluster.agents[1], topic, fmt, 2)
    assert [g["value"] for g in got] == REST_VALUES[fmt]
    assert [g["key"] for g in got] == [None, None]


@pytest.mark.parametrize("fmt", FORMATS)
def test_rest_schema_produce_decodes_with_confluent_deserializers(
    cluster: Cluster, registry: SchemaRegistryClient, reader: LogReader, topic: str, fmt: str
) -> None:
    """REST v2 produce with ``value_schema`` stores Confluent's wire format: the raw bytes,
    read from the bucket, decode with Confluent's deserializers."""
    schema = {"avro": AVRO_SCHEMA, "jsonschema": JSON_SCHEMA}.get(fmt)
    if schema is None:  # Protobuf: the .proto text
        schema = PROTO_SCHEMA
    body = {"value_schema": schema, "records": [{"value": v} for v in REST_VALUES[fmt]]}
    r = produce_v2(cluster.agents[0], topic, fmt, body)
    assert r.status_code == 200, r.text
    answer = r.json()
    schema_id = answer["value_schema_id"]
    assert isinstance(schema_id, int) and answer["key_schema_id"] is None
    assert [o["offset"] for o in answer["offsets"]] == [0, 1]
    assert registry.get_latest_version(f"{topic}-value").schema_id == schema_id

    # The same schema again by id: the same subject version, the same framing.
    again = produce_v2(
        cluster.agents[1],
        topic,
        fmt,
        {"value_schema_id": schema_id, "records": [{"value": REST_VALUES[fmt][0]}]},
    )
    assert again.status_code == 200, again.text
    assert again.json()["value_schema_id"] == schema_id

    stored = read_all(reader, topic)
    assert len(stored) == 3
    _, deserializer = _serializers(fmt, registry)
    ctx = SerializationContext(topic, MessageField.VALUE)
    for rec, i in zip(stored, (0, 1, 0), strict=True):
        assert rec.value is not None and rec.value[0] == 0
        assert int.from_bytes(rec.value[1:5], "big") == schema_id
        decoded = deserializer(rec.value, ctx)
        expected = _native(fmt, i)
        assert decoded == expected


def test_keys_use_the_key_subject(
    cluster: Cluster, registry: SchemaRegistryClient, topic: str
) -> None:
    body = {
        "key_schema": '"string"',
        "value_schema": '"long"',
        "records": [{"key": "k1", "value": 7}, {"key": "k2", "value": 8}],
    }
    r = produce_v2(cluster.agents[0], topic, "avro", body)
    assert r.status_code == 200, r.text
    ids = (r.json()["key_schema_id"], r.json()["value_schema_id"])
    assert ids == (
        registry.get_latest_version(f"{topic}-key").schema_id,
        registry.get_latest_version(f"{topic}-value").schema_id,
    )
    got = consume_v2(cluster.agents[1], topic, "avro", 2)
    assert [(g["key"], g["value"]) for g in got] == [("k1", 7), ("k2", 8)]


def _error(r: httpx.Response) -> tuple[int, dict[str, Any]]:
    return r.status_code, r.json()


def test_bad_input_gets_its_exact_error_and_stores_nothing(
    cluster: Cluster, reader: LogReader, topic: str
) -> None:
    agent = cluster.agents[0]
    good = {"value_schema": AVRO_SCHEMA, "records": [{"value": REST_VALUES["avro"][0]}]}
    assert produce_v2(agent, topic, "avro", good).status_code == 200
    stored = len(read_all(reader, topic))

    mismatch = produce_v2(
        agent,
        topic,
        "avro",
        {
            "value_schema": AVRO_SCHEMA,
            "records": [{"value": REST_VALUES["avro"][0]}, {"value": {"id": "x", "item": "a"}}],
        },
    )
    assert _error(mismatch) == (
        422,
        {
            "error_code": 42205,
            "message": "Conversion of JSON to Avro failed: record 1: "
            "io.example.Order.id is <x> of type <class 'str'> expected long",
        },
    )
    unknown = produce_v2(
        agent, topic, "avro", {"value_schema_id": 999_999, "records": [{"value": 1}]}
    )
    assert _error(unknown) == (422, {"error_code": 42205, "message": "Schema 999999 not found"})
    incompatible = produce_v2(
        agent, topic, "avro", {"value_schema": '"string"', "records": [{"value": "x"}]}
    )
    status, body = _error(incompatible)
    assert (status, body["error_code"]) == (408, 40801)
    assert body["message"].startswith(
        "Schema being registered is incompatible with an earlier schema for subject "
        f'"{topic}-value"'
    )
    malformed = produce_v2(
        agent, topic, "avro", {"value_schema": '{"type": "recrd"}', "records": [{"value": 1}]}
    )
    assert _error(malformed)[1]["error_code"] == 42205
    assert _error(malformed)[1]["message"].startswith("Invalid schema:")
    no_key_schema = produce_v2(
        agent, topic, "avro", {"value_schema": AVRO_SCHEMA, "records": [{"key": "k", "value": 1}]}
    )
    assert _error(no_key_schema) == (
        422,
        {
            "error_code": 42201,
            "message": "Request includes keys but does not include key schema or key schema id",
        },
    )
    json_topic = new_topic(cluster)
    no_value_schema = produce_v2(
        agent, json_topic, "jsonschema", {"records": [{"value": {"a": 1}}]}
    )
    assert _error(no_value_schema) == (
        422,
        {
            "error_code": 42202,
            "message": "Request includes values but does not include value schema or value "
            "schema id",
        },
    )
    invalid_json = produce_v2(
        agent,
        json_topic,
        "jsonschema",
        {"value_schema": JSON_SCHEMA, "records": [{"value": {"id": 1}}]},
    )
    assert _error(invalid_json) == (
        422,
        {"error_code": 42205, "message": "Invalid JSON: 'item' is a required property"},
    )
    assert len(read_all(reader, topic)) == stored
    assert read_all(reader, json_topic) == []


def test_undecodable_values_are_refused_on_consume(cluster: Cluster, topic: str) -> None:
    """A value without the registry's framing cannot be read by an avro consumer: 422, and
    the consumer's position does not move past it."""
    body = {"records": [{"value": base64.b64encode(b"plain").decode()}]}
    assert produce_v2(cluster.agents[0], topic, "binary", body).status_code == 200
    group = f"g-{uuid.uuid4().hex[:8]}"
    ctl = {"content-type": "application/vnd.kafka.v2+json"}
    base = httpx.post(
        f"{cluster.agents[1]}/consumers/{group}",
        json={"format": "avro", "auto.offset.reset": "earliest"},
        headers=ctl,
    ).json()["base_uri"]
    parts = {"partitions": [{"topic": topic, "partition": 0}]}
    assert httpx.post(f"{base}/assignments", json=parts, headers=ctl).status_code == 204
    accept = {"accept": "application/vnd.kafka.avro.v2+json"}
    for _ in range(2):
        r = httpx.get(f"{base}/records", params={"timeout": 2000}, headers=accept)
        assert _error(r) == (
            422,
            {
                "error_code": 42206,
                "message": "value deserialization error: unknown magic byte 112: not schema "
                "registry framing",
            },
        )
    httpx.delete(base, headers=ctl)


def _store_calls(agent: str) -> float:
    text = httpx.get(f"{agent}/metrics").text
    return sum(
        float(v) for v in re.findall(r"^lakelog_schema_store_calls_total\{.*\} (\S+)$", text, re.M)
    )


def test_schema_lookups_are_cached(cluster: Cluster, topic: str) -> None:
    """After the first request, producing with the same schema costs no store call."""
    agent = cluster.agents[0]
    body = {"value_schema": AVRO_SCHEMA, "records": [{"value": REST_VALUES["avro"][0]}]}
    first = produce_v2(agent, topic, "avro", body)
    assert first.status_code == 200
    by_id = {"value_schema_id": first.json()["value_schema_id"], "records": body["records"]}
    assert produce_v2(agent, topic, "avro", by_id).status_code == 200
    before = _store_calls(agent)
    assert before > 0
    for payload in (body, by_id, body, by_id):
        assert produce_v2(agent, topic, "avro", payload).status_code == 200
    assert _store_calls(agent) == before


def v3_produce(cluster: Cluster, topic: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r = httpx.post(
        f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics/{topic}/records",
        content=b"".join(orjson.dumps(rec) for rec in records),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200, r.text
    return [orjson.loads(line) for line in r.text.splitlines() if line.strip()]


def test_v3_produce_with_schema_fields(
    cluster: Cluster, registry: SchemaRegistryClient, reader: LogReader, topic: str
) -> None:
    value = REST_VALUES["avro"][0]
    first, by_id, by_version, latest, by_record_name = v3_produce(
        cluster,
        topic,
        [
            {"value": {"type": "AVRO", "schema": AVRO_SCHEMA, "data": value}},
            {"value": {"schema_id": -1, "data": value}},  # replaced below
            {"value": {"schema_version": 1, "data": value}},
            {"value": {"type": "AVRO", "data": value}},
            {
                "value": {
                    "type": "AVRO",
                    "schema": AVRO_SCHEMA,
                    "subject_name_strategy": "TOPIC_RECORD_NAME",
                    "data": value,
                }
            },
        ],
    )
    schema_id = first["value"]["schema_id"]
    assert first["error_code"] == 200
    assert first["value"] == {
        "type": "AVRO",
        "size": first["value"]["size"],
        "schema_id": schema_id,
        "subject": f"{topic}-value",
    }
    assert by_id["error_code"] == 42205  # no schema -1
    assert by_version["value"]["schema_version"] == 1
    assert latest["value"]["schema_id"] == schema_id
    assert by_record_name["value"]["subject"] == f"{topic}-io.example.Order"
    (again,) = v3_produce(cluster, topic, [{"value": {"schema_id": schema_id, "data": value}}])
    assert again["value"]["schema_id"] == schema_id
    stored = read_all(reader, topic)
    assert len(stored) == 5  # every record but the refused one
    _, deserializer = _serializers("avro", registry)
    ctx = SerializationContext(topic, MessageField.VALUE)
    assert all(deserializer(r.value, ctx)["item"] == "apple" for r in stored)
