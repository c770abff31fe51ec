"""Schema Registry client flows the way producers run them, against one real ``lakelog
serve`` process (SQLite, ``file://`` store, the Kafka listener on), with confluent-kafka's
own serializers and ``SchemaRegistryClient``:

- auto-registration on every start (``auto.register.schemas`` True, the default), also by a
  producer still on v1 after v2 exists;
- lookup-only serializers (``auto.register.schemas`` False) with the schema spelled
  otherwise than it was registered (another key order, a full name);
- Protobuf registered by ``ProtobufSerializer`` (a base64 ``FileDescriptorProto``) and the
  same schema sent as ``.proto`` text by a Java-style client, reformatted;
- references between schemas, changes inside referenced schemas, delete and re-register;
- records framed by the serializers produced through the Kafka listener and read back
  through the REST Proxy's Avro consumer.
"""

from __future__ import annotations

import base64
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.procs import Proc, free_port, wait_http

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: Startup takes seconds, more when other suites share the machine's two cores.
START_TIMEOUT_S = 60.0


class Serve:
    """One ``lakelog serve`` with its REST/registry URL and Kafka bootstrap address."""

    def __init__(self, proc: Proc, url: str, kafka: str) -> None:
        self.proc = proc
        self.url = url
        self.kafka = kafka


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    tmp = tmp_path_factory.mktemp("schema-clients")
    port, kafka_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    proc = Proc(
        [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--kafka-port",
            str(kafka_port),
            "--kafka-advertised",
            f"127.0.0.1:{kafka_port}",
        ],
        tmp / "serve.log",
        env={"PYTHONPATH": str(REPO)},
        cwd=tmp,
    )
    try:
        wait_http(f"{url}/health", timeout=START_TIMEOUT_S, proc=proc.popen)
        yield Serve(proc, url, f"127.0.0.1:{kafka_port}")
    finally:
        proc.stop()


@pytest.fixture
def client(serve: Serve) -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient({"url": serve.url}) as c:
        yield c


def _name() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def _topic(serve: Serve) -> str:
    """A new topic of one partition."""
    name = _name()
    cluster = httpx.get(f"{serve.url}/v3/clusters").json()["data"][0]["cluster_id"]
    r = httpx.post(
        f"{serve.url}/v3/clusters/{cluster}/topics",
        json={"topic_name": name, "partitions_count": 1},
    )
    assert r.status_code == 201, r.text
    return name


def _record(name: str, *fields: dict[str, Any], namespace: str = "io.shop") -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": namespace, "fields": list(fields)}


ORDER_V1 = _record("Order", {"name": "id", "type": "long"}, {"name": "item", "type": "string"})
ORDER_V2 = _record(
    "Order",
    {"name": "id", "type": "long"},
    {"name": "item", "type": "string"},
    {"name": "qty", "type": "int", "default": 1},
)


def _avro_serializer(
    client: SchemaRegistryClient, schema: dict[str, Any] | str, **conf: Any
) -> AvroSerializer:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return AvroSerializer(client, text, conf={"normalize.schemas": False, **conf})


def _schema_id(framed: bytes) -> int:
    assert framed[0] == 0
    return int.from_bytes(framed[1:5], "big")


# -- defect 1: re-registering an existing version ------------------------------------------


def test_producer_still_on_v1_registers_after_v2_exists(
    client: SchemaRegistryClient, serve: Serve
) -> None:
    """Auto-registration on every start: v1's producer keeps working once a compatible v2
    is the latest; the registry answers v1's id, registers nothing, and REST produce with
    the old ``value_schema`` works too."""
    topic = _topic(serve)
    ctx = SerializationContext(topic, MessageField.VALUE)
    v1_id = _schema_id(_avro_serializer(client, ORDER_V1)({"id": 1, "item": "pen"}, ctx))
    v2_id = _schema_id(_avro_serializer(client, ORDER_V2)({"id": 2, "item": "ink", "qty": 3}, ctx))
    assert v2_id != v1_id
    # A new process of the old producer (fresh client cache) starts and registers v1 again.
    with SchemaRegistryClient({"url": serve.url}) as fresh:
        again = _avro_serializer(fresh, ORDER_V1)({"id": 3, "item": "cap"}, ctx)
    assert _schema_id(again) == v1_id
    assert client.get_versions(f"{topic}-value") == [1, 2]

    r = httpx.post(
        f"{serve.url}/topics/{topic}",
        json={"value_schema": json.dumps(ORDER_V1), "records": [{"value": {"id": 4, "item": "x"}}]},
        headers={"content-type": "application/vnd.kafka.avro.v2+json"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["value_schema_id"] == v1_id


# -- defect 2: Avro canonical form -----------------------------------------------------------


def test_avro_lookup_only_serializer_finds_schema_spelled_otherwise(
    client: SchemaRegistryClient, serve: Serve
) -> None:
    """A schema registered by one tool is found by a lookup-only serializer whose schema
    text has another key order and a full name instead of namespace + name: same id, no
    new version, and the framed records decode with Confluent's deserializer."""
    topic = _name()
    subject = f"{topic}-value"
    registered = client.register_schema(subject, Schema(json.dumps(ORDER_V1), "AVRO"))
    respelled = (
        '{"fields": [{"type": "long", "name": "id"}, {"name": "item", "type": "string"}],'
        ' "type": "record", "name": "io.shop.Order"}'
    )
    ser = _avro_serializer(client, respelled, **{"auto.register.schemas": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    framed = ser({"id": 7, "item": "cup"}, ctx)
    assert _schema_id(framed) == registered
    found = client.lookup_schema(subject, Schema(respelled, "AVRO"))
    assert (found.schema_id, found.version) == (registered, 1)
    assert client.register_schema(subject, Schema(respelled, "AVRO")) == registered
    assert client.get_versions(subject) == [1]
    assert AvroDeserializer(client)(framed, ctx) == {"id": 7, "item": "cup"}
    # What the registry serves is the canonical text (Avro's own JSON form of the schema).
    assert httpx.get(f"{serve.url}/schemas/ids/{registered}/schema").json() == ORDER_V1


def test_kafka_produce_with_serializer_reads_back_over_rest(serve: Serve) -> None:
    """Records framed by ``AvroSerializer`` and produced through the Kafka listener read
    back through the REST Proxy's Avro consumer as their JSON values."""
    topic = _topic(serve)
    with SchemaRegistryClient({"url": serve.url}) as client:
        ser = _avro_serializer(client, ORDER_V2)
        producer = Producer({"bootstrap.servers": serve.kafka, "linger.ms": 5})
        for i in range(3):
            value = ser(
                {"id": i, "item": f"n{i}", "qty": i},
                SerializationContext(topic, MessageField.VALUE),
            )
            producer.produce(topic, value=value)
        assert producer.flush(30) == 0
    group, inst = f"g{_name()}", "c1"
    base = f"{serve.url}/consumers/{group}"
    r = httpx.post(
        base,
        json={"name": inst, "format": "avro", "auto.offset.reset": "earliest"},
        headers={"content-type": "application/vnd.kafka.v2+json"},
    )
    assert r.status_code == 200, r.text
    sub = f"{base}/instances/{inst}"
    httpx.post(
        f"{sub}/subscription",
        json={"topics": [topic]},
        headers={"content-type": "application/vnd.kafka.v2+json"},
    ).raise_for_status()
    values: list[Any] = []
    for _ in range(20):
        got = httpx.get(f"{sub}/records", headers={"accept": "application/vnd.kafka.avro.v2+json"})
        assert got.status_code == 200, got.text
        values += [rec["value"] for rec in got.json()]
        if len(values) >= 3:
            break
    assert values == [{"id": i, "item": f"n{i}", "qty": i} for i in range(3)]
    httpx.delete(sub)


# -- defect 3: Protobuf canonical form -------------------------------------------------------

ORDER_PROTO = """
syntax = "proto3";
package shop.v1;

import "google/protobuf/timestamp.proto";

message Order {
  int64 id = 1;
  string item = 2;
  repeated string tags = 3;
  map<string, int32> counts = 4;
  google.protobuf.Timestamp at = 5;
  oneof payment { string card = 6; int64 voucher = 7; }
  optional string note = 8;
  Status status = 9;
  message Line { string sku = 1; int32 qty = 2; }
  repeated Line lines = 10;
}

enum Status { UNKNOWN = 0; OPEN = 1; CLOSED = 2; }
"""

ORDER_PROTO_REFORMATTED = """syntax="proto3";package shop.v1;
import "google/protobuf/timestamp.proto";
// the same file, laid out by another hand
message Order{int64 id=1;string item=2;repeated string tags=3;map<string,int32> counts=4;
.google.protobuf.Timestamp at=5;oneof payment{string card=6;int64 voucher=7;}
optional string note=8;.shop.v1.Status status=9;
message Line{string sku=1;int32 qty=2;}repeated Order.Line lines=10;}
enum Status{UNKNOWN=0;OPEN=1;CLOSED=2;}
"""


def _compile(text: str, tmp: Path) -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc

    (tmp / "order.proto").write_text(text)
    include = str(Path(protoc.__file__).parent / "_proto")
    assert (
        protoc.main(
            [
                "protoc",
                f"-I{tmp}",
                f"-I{include}",
                "--include_imports",
                f"--descriptor_set_out={tmp / 'out.pb'}",
                "order.proto",
            ]
        )
        == 0
    )
    return descriptor_pb2.FileDescriptorSet.FromString((tmp / "out.pb").read_bytes())


def _message_class(files: descriptor_pb2.FileDescriptorSet, name: str) -> Any:
    pool = descriptor_pool.DescriptorPool()
    for fd in files.file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def test_protobuf_serializer_and_proto_text_resolve_to_one_schema(
    client: SchemaRegistryClient, serve: Serve, tmp_path: Path
) -> None:
    """``ProtobufSerializer`` registers a base64 ``FileDescriptorProto``; a Java client
    registers the ``.proto`` text, and another the same text reformatted: one id, one
    version, and the deserializer reads the records back."""
    topic = _name()
    subject = f"{topic}-value"
    order_cls = _message_class(_compile(ORDER_PROTO, tmp_path), "shop.v1.Order")
    ser = ProtobufSerializer(order_cls, client, {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    msg = order_cls(id=5, item="kite", tags=["a", "b"], note="n")
    msg.counts["x"] = 2
    framed = ser(msg, ctx)
    first_id = _schema_id(framed)
    assert client.register_schema(subject, Schema(ORDER_PROTO, "PROTOBUF")) == first_id
    assert client.register_schema(subject, Schema(ORDER_PROTO_REFORMATTED, "PROTOBUF")) == first_id
    found = client.lookup_schema(subject, Schema(ORDER_PROTO_REFORMATTED, "PROTOBUF"))
    assert (found.schema_id, found.version) == (first_id, 1)
    assert client.get_versions(subject) == [1]
    back = ProtobufDeserializer(order_cls, {"use.deprecated.format": False})(framed, ctx)
    assert back == msg
    # The stored text is .proto text (not base64) that compiles to the same messages.
    text = httpx.get(f"{serve.url}/schemas/ids/{first_id}/schema").text
    assert "message Order" in text and "map<string, int32> counts = 4" in text
    again = _message_class(_compile(text, tmp_path), "shop.v1.Order")
    assert again.FromString(msg.SerializeToString()) == again(
        id=5, item="kite", tags=["a", "b"], note="n", counts={"x": 2}
    )


# -- defect 7: compatibility against latest of a new subject ---------------------------------


def test_compatibility_of_a_new_subject(client: SchemaRegistryClient, serve: Serve) -> None:
    subject = f"{_name()}-value"
    assert client.test_compatibility(subject, Schema(json.dumps(ORDER_V1), "AVRO")) is True
    r = httpx.post(
        f"{serve.url}/compatibility/subjects/{subject}/versions/latest",
        json={"schema": json.dumps(ORDER_V1)},
        params={"verbose": "true"},
    )
    assert r.json() == {"is_compatible": True, "messages": []}
    r = httpx.post(
        f"{serve.url}/compatibility/subjects/{subject}/versions/3",
        json={"schema": json.dumps(ORDER_V1)},
    )
    assert (r.status_code, r.json()) == (
        404,
        {"error_code": 40402, "message": "Version 3 not found."},
    )
    r = httpx.post(
        f"{serve.url}/compatibility/subjects/{subject}/versions/latest",
        json={"schema": "{nope"},
        params={"verbose": "true"},
    )
    assert r.status_code == 200
    assert r.json()["is_compatible"] is False
    assert r.json()["messages"][0].startswith("Invalid schema")


# -- defects 4 and 5: JSON Schema as pydantic writes it, references --------------------------


def _pydantic_v1() -> dict[str, Any]:
    return {
        "$defs": {
            "Address": {
                "properties": {"city": {"title": "City", "type": "string"}},
                "required": ["city"],
                "title": "Address",
                "type": "object",
            }
        },
        "properties": {
            "name": {"title": "Name", "type": "string"},
            "home": {"$ref": "#/$defs/Address"},
        },
        "required": ["name", "home"],
        "title": "Customer",
        "type": "object",
    }


def test_json_schema_defs_and_references_are_compared(
    client: SchemaRegistryClient, serve: Serve
) -> None:
    """pydantic's layout (``$defs`` + ``$ref``): a change inside a definition is checked; a
    reference moved from a subject's v1 to an incompatible v2 is refused; a required property
    added with a default is compatible where Confluent's STRICT rules have it (a closed model,
    pydantic's extra="forbid"), not in an open one."""
    subject = f"{_name()}-value"
    client.set_compatibility(subject, "BACKWARD")
    v1 = _pydantic_v1()
    client.register_schema(subject, Schema(json.dumps(v1), "JSON"))
    narrowed = _pydantic_v1()
    narrowed["$defs"]["Address"]["properties"]["city"] = {"type": "integer"}
    assert client.test_compatibility(subject, Schema(json.dumps(narrowed), "JSON")) is False
    # Required with a default: compatible where Confluent's STRICT rules allow it (a property
    # already there made required; a property added to a closed model, pydantic's
    # extra="forbid"), not added to an open model.
    with_default = _pydantic_v1()
    with_default["properties"]["tier"] = {"type": "string", "default": "basic"}
    with_default["required"].append("tier")
    assert client.test_compatibility(subject, Schema(json.dumps(with_default), "JSON")) is False
    closed_subject = f"{_name()}-value"
    closed_v1 = {**v1, "additionalProperties": False}
    client.register_schema(closed_subject, Schema(json.dumps(closed_v1), "JSON"))
    closed = {**with_default, "additionalProperties": False}
    assert client.test_compatibility(closed_subject, Schema(json.dumps(closed), "JSON")) is True

    # References: Address lives in its own subject; Customer refers to it by name.
    addr_subject = f"{_name()}-address"
    address = {"type": "object", "properties": {"city": {"type": "string"}}}
    client.register_schema(addr_subject, Schema(json.dumps(address), "JSON"))
    client.set_compatibility(addr_subject, "NONE")
    address_v2 = {"type": "object", "properties": {"city": {"type": "integer"}}}
    client.register_schema(addr_subject, Schema(json.dumps(address_v2), "JSON"))
    customer = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "home": {"$ref": "address.json"}},
    }
    cust_subject = f"{_name()}-value"
    refs_v1 = [SchemaReference("address.json", addr_subject, 1)]
    refs_v2 = [SchemaReference("address.json", addr_subject, 2)]
    client.register_schema(cust_subject, Schema(json.dumps(customer), "JSON", refs_v1))
    moved = Schema(json.dumps(customer), "JSON", refs_v2)
    assert client.test_compatibility(cust_subject, moved) is False
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(cust_subject, moved)
    assert refused.value.error_code == 409
    assert "home" in refused.value.error_message


def test_json_serializer_auto_registers_on_every_start(
    client: SchemaRegistryClient, serve: Serve
) -> None:
    topic = _name()
    ctx = SerializationContext(topic, MessageField.VALUE)
    schema = json.dumps(_pydantic_v1())
    value = {"name": "Ada", "home": {"city": "Paris"}}
    ids = set()
    for _ in range(3):  # three deploys, each a fresh client
        with SchemaRegistryClient({"url": serve.url}) as fresh:
            ids.add(_schema_id(JSONSerializer(schema, fresh)(value, ctx)))
    assert len(ids) == 1
    assert client.get_versions(f"{topic}-value") == [1]


# -- defects 5 and 6: Protobuf imports and Confluent's rules ---------------------------------


def test_protobuf_reference_to_incompatible_version_is_refused(
    client: SchemaRegistryClient, serve: Serve
) -> None:
    """A message imported from another subject changes incompatibly between the referenced
    versions: moving the reference is refused (Confluent compares the imported message)."""
    dep = f"{_name()}-dep"
    client.set_compatibility(dep, "NONE")
    home_v1 = 'syntax = "proto3";\npackage acme;\nmessage Home { int32 device = 1; }\n'
    home_v2 = 'syntax = "proto3";\npackage acme;\nmessage Home { string device = 1; }\n'
    client.register_schema(dep, Schema(home_v1, "PROTOBUF"))
    client.register_schema(dep, Schema(home_v2, "PROTOBUF"))
    main = 'syntax = "proto3";\nimport "home.proto";\nmessage Device { acme.Home home = 1; }\n'
    subject = f"{_name()}-value"
    client.register_schema(
        subject, Schema(main, "PROTOBUF", [SchemaReference("home.proto", dep, 1)])
    )
    moved = Schema(main, "PROTOBUF", [SchemaReference("home.proto", dep, 2)])
    assert client.test_compatibility(subject, moved) is False


def test_protobuf_changes_confluent_allows(client: SchemaRegistryClient) -> None:
    """string -> repeated string, enum -> int32 and a map field's entry are accepted under
    BACKWARD, as Confluent's Protobuf rules have them."""
    subject = f"{_name()}-value"
    v1 = (
        'syntax = "proto3";\nmessage M {\n  string name = 1;\n  Kind kind = 2;\n'
        "  map<string, string> attrs = 3;\n}\nenum Kind { A = 0; B = 1; }\n"
    )
    v2 = (
        'syntax = "proto3";\nmessage M {\n  repeated string name = 1;\n  int32 kind = 2;\n'
        "  map<string, bytes> attrs = 3;\n}\n"
    )
    client.register_schema(subject, Schema(v1, "PROTOBUF"))
    assert client.test_compatibility(subject, Schema(v2, "PROTOBUF")) is True
    client.register_schema(subject, Schema(v2, "PROTOBUF"))
    assert client.get_versions(subject) == [1, 2]


def test_delete_and_reregister_keeps_the_id(client: SchemaRegistryClient) -> None:
    subject = f"{_name()}-value"
    text = json.dumps(ORDER_V1)
    first = client.register_schema(subject, Schema(text, "AVRO"))
    assert client.delete_subject(subject) == [1]
    assert client.delete_subject(subject, permanent=True) == [1]
    respelled = json.dumps(ORDER_V1, indent=2, sort_keys=True)
    assert client.register_schema(subject, Schema(respelled, "AVRO")) == first


def test_base64_serialized_format_round_trips(client: SchemaRegistryClient, serve: Serve) -> None:
    subject = f"{_name()}-value"
    schema_id = client.register_schema(subject, Schema(ORDER_PROTO, "PROTOBUF"))
    r = httpx.get(f"{serve.url}/schemas/ids/{schema_id}", params={"format": "serialized"})
    fd = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(r.json()["schema"]))
    assert [m.name for m in fd.message_type] == ["Order"]
    assert fd.package == "shop.v1"
