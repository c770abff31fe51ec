"""The Schema Registry API on real agent processes (coordinator over HTTP, S3 on moto),
driven by confluent-kafka's ``SchemaRegistryClient`` (a client no one here wrote) and by
raw HTTP for every documented error code with its exact body."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

SR = "application/vnd.schemaregistry.v1+json"

PAYMENT_V1 = (
    '{"type":"record","name":"Payment","namespace":"io.example","fields":'
    '[{"name":"id","type":"string"},{"name":"amount","type":"double"}]}'
)
# Confluent's tutorial: a new field with a default is backward compatible...
PAYMENT_V2 = (
    '{"type":"record","name":"Payment","namespace":"io.example","fields":'
    '[{"name":"id","type":"string"},{"name":"amount","type":"double"},'
    '{"name":"region","type":"string","default":""}]}'
)
# ...and without one it is not.
PAYMENT_BAD = (
    '{"type":"record","name":"Payment","namespace":"io.example","fields":'
    '[{"name":"id","type":"string"},{"name":"amount","type":"double"},'
    '{"name":"region","type":"string"}]}'
)


@pytest.fixture(scope="module")
def agent(lakelog_cluster: Cluster) -> str:
    return lakelog_cluster.agents[0]


@pytest.fixture(scope="module")
def other_agent(lakelog_cluster: Cluster) -> str:
    return lakelog_cluster.agents[1]


@pytest.fixture
def client(agent: str) -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient({"url": agent}) as c:
        yield c


def _subject() -> str:
    return f"sr-{uuid.uuid4().hex[:10]}-value"


def test_confluent_client_registers_evolves_and_is_refused(
    client: SchemaRegistryClient, agent: str, other_agent: str
) -> None:
    subject = _subject()
    v1_id = client.register_schema(subject, Schema(PAYMENT_V1, "AVRO"))
    assert client.register_schema(subject, Schema(PAYMENT_V1, "AVRO")) == v1_id
    assert client.test_compatibility(subject, Schema(PAYMENT_V2, "AVRO")) is True
    assert client.test_compatibility(subject, Schema(PAYMENT_BAD, "AVRO")) is False
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(PAYMENT_BAD, "AVRO"))
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 409)
    assert "incompatible with an earlier schema" in refused.value.error_message
    v2_id = client.register_schema(subject, Schema(PAYMENT_V2, "AVRO"))
    assert v2_id != v1_id

    # Every agent serves the same registry: the other one sees what this one stored.
    with SchemaRegistryClient({"url": other_agent}) as other:
        check_other_agent(other, subject, v1_id, v2_id)

    # NONE lets an incompatible schema in; the config is the subject's own.
    client.set_compatibility(subject, "NONE")
    assert client.get_compatibility(subject) == "NONE"
    bad_id = client.register_schema(subject, Schema(PAYMENT_V1.replace("double", "string"), "AVRO"))
    assert client.get_versions(subject) == [1, 2, 3]

    assert client.delete_version(subject, 3) == 3
    assert client.get_versions(subject) == [1, 2]
    assert client.delete_subject(subject) == [1, 2]
    assert subject not in client.get_subjects()
    assert client.delete_subject(subject, permanent=True) == [1, 2, 3]
    # Ids are never reused: a new schema gets a new id; an old schema its old one.
    again = client.register_schema(subject, Schema(PAYMENT_V1, "AVRO"))
    assert again == v1_id
    assert bad_id not in (v1_id, v2_id)


def check_other_agent(other: SchemaRegistryClient, subject: str, v1_id: int, v2_id: int) -> None:
    assert other.get_versions(subject) == [1, 2]
    latest = other.get_latest_version(subject)
    assert (latest.schema_id, latest.version) == (v2_id, 2)
    assert other.get_schema(v1_id).schema_str == PAYMENT_V1
    found = other.lookup_schema(subject, Schema(PAYMENT_V1, "AVRO"))
    assert (found.schema_id, found.version) == (v1_id, 1)
    assert subject in other.get_subjects()
    assert other.get_subjects_by_schema_id(v1_id) == [subject]


def test_transitive_levels(client: SchemaRegistryClient) -> None:
    """FORWARD_TRANSITIVE checks every version; FORWARD the latest only."""
    subject = _subject()
    one = '{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}'
    two = (
        '{"type":"record","name":"R","fields":[{"name":"a","type":"int","default":0},'
        '{"name":"b","type":"int"}]}'
    )
    three = '{"type":"record","name":"R","fields":[{"name":"b","type":"int"}]}'
    client.set_compatibility(subject, "FORWARD")
    client.register_schema(subject, Schema(one, "AVRO"))
    client.register_schema(subject, Schema(two, "AVRO"))
    # v2 can read v3's data (a has a default); v1 cannot (a is required there).
    assert client.test_compatibility(subject, Schema(three, "AVRO")) is True
    client.set_compatibility(subject, "FORWARD_TRANSITIVE")
    assert client.test_compatibility_all_versions(subject, Schema(three, "AVRO")) is False
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(three, "AVRO"))
    assert refused.value.error_code == 409


def test_references_and_schema_types(client: SchemaRegistryClient, agent: str) -> None:
    base = _subject()
    user = _subject()
    address = (
        '{"type":"record","name":"Address","namespace":"io.example",'
        '"fields":[{"name":"city","type":"string"}]}'
    )
    person = (
        '{"type":"record","name":"Person","namespace":"io.example",'
        '"fields":[{"name":"home","type":"io.example.Address"}]}'
    )
    client.register_schema(base, Schema(address, "AVRO"))
    refs = [SchemaReference("io.example.Address", base, 1)]
    person_id = client.register_schema(user, Schema(person, "AVRO", refs))
    r = httpx.get(f"{agent}/schemas/ids/{person_id}")
    # Stored in Avro's own JSON form: a type of the schema's namespace by its short name.
    assert r.json() == {
        "references": [{"name": "io.example.Address", "subject": base, "version": 1}],
        "schema": person.replace('"io.example.Address"', '"Address"'),
    }
    assert httpx.get(f"{agent}/subjects/{base}/versions/1/referencedby").json() == [person_id]
    r = httpx.delete(f"{agent}/subjects/{base}/versions/1")
    assert r.status_code == 422
    assert r.json()["error_code"] == 42206
    # Without the reference the named type is unknown: an invalid schema.
    with pytest.raises(SchemaRegistryError) as invalid:
        client.register_schema(_subject(), Schema(person, "AVRO"))
    assert invalid.value.error_code == 42201
    assert sorted(client.get_schema_types()) == ["AVRO", "JSON", "PROTOBUF"]


def _error(r: httpx.Response) -> tuple[int, dict[str, Any], str]:
    return r.status_code, r.json(), r.headers["content-type"]


def test_every_documented_error_code_with_its_exact_body(agent: str) -> None:
    s = _subject()
    post = {"headers": {"content-type": SR}}
    v1 = httpx.post(f"{agent}/subjects/{s}/versions", json={"schema": PAYMENT_V1}, **post)
    assert v1.status_code == 200
    assert v1.headers["content-type"] == SR

    cases: list[tuple[httpx.Response, int, int, str]] = [
        (httpx.get(f"{agent}/subjects/nope-x/versions"), 404, 40401, "Subject 'nope-x' not found."),
        (httpx.get(f"{agent}/subjects/{s}/versions/7"), 404, 40402, "Version 7 not found."),
        (httpx.get(f"{agent}/schemas/ids/987654"), 404, 40403, "Schema 987654 not found"),
        (
            httpx.post(f"{agent}/subjects/{s}", json={"schema": PAYMENT_V2}, **post),
            404,
            40403,
            "Schema not found",
        ),
        (
            httpx.delete(f"{agent}/subjects/{s}/versions/1", params={"permanent": "true"}),
            404,
            40407,
            f"Subject '{s}' Version 1 was not deleted first before being permanently deleted",
        ),
        (
            httpx.delete(f"{agent}/subjects/{s}", params={"permanent": "true"}),
            404,
            40405,
            f"Subject '{s}' was not deleted first before being permanently deleted",
        ),
        (
            httpx.get(f"{agent}/config/{s}"),
            404,
            40408,
            f"Subject '{s}' does not have subject-level compatibility configured",
        ),
        (
            httpx.post(f"{agent}/subjects/{s}/versions", json={"schema": PAYMENT_BAD}, **post),
            409,
            409,
            f'Schema being registered is incompatible with an earlier schema for subject "{s}", '
            "details: [version 1: READER_FIELD_MISSING_DEFAULT_VALUE at /fields/2: region]",
        ),
        (
            httpx.post(f"{agent}/subjects/{s}/versions", json={"schema": "{nope"}, **post),
            422,
            42201,
            "Invalid schema: not valid JSON (line 1, column 2)",
        ),
        (
            httpx.post(
                f"{agent}/subjects/{s}/versions",
                json={"schema": "x", "schemaType": "XML"},
                **post,
            ),
            422,
            42201,
            "Invalid schema type XML",
        ),
        (
            httpx.get(f"{agent}/subjects/{s}/versions/0"),
            422,
            42202,
            "The specified version '0' is not a valid version id. Allowed values are between "
            '[1, 2^31-1] and the string "latest"',
        ),
        (
            httpx.put(f"{agent}/config/{s}", json={"compatibility": "SIDEWAYS"}, **post),
            422,
            42203,
            "Invalid compatibility level. Valid values are none, backward, forward, full, "
            "backward_transitive, forward_transitive, and full_transitive",
        ),
        (
            httpx.post(
                f"{agent}/subjects/{s}/versions",
                content=b"x",
                headers={"content-type": "text/plain"},
            ),
            415,
            415,
            "HTTP 415 Unsupported Media Type",
        ),
    ]
    for response, status, code, message in cases:
        assert _error(response) == (status, {"error_code": code, "message": message}, SR), (
            response.request.url
        )

    assert httpx.delete(f"{agent}/subjects/{s}/versions/1").json() == 1
    r = httpx.delete(f"{agent}/subjects/{s}/versions/1")
    assert _error(r) == (
        404,
        {
            "error_code": 40406,
            "message": f"Subject '{s}' Version 1 was soft deleted.Set permanent=true to delete "
            "permanently",
        },
        SR,
    )
    r = httpx.delete(f"{agent}/subjects/{s}")
    assert _error(r) == (
        404,
        {
            "error_code": 40404,
            "message": f"Subject '{s}' was soft deleted.Set permanent=true to delete permanently",
        },
        SR,
    )


def test_answers_have_confluents_shapes(agent: str) -> None:
    s = _subject()
    own = PAYMENT_V1.replace("io.example", f"io.shapes{uuid.uuid4().hex[:6]}")
    schema_id = httpx.post(f"{agent}/subjects/{s}/versions", json={"schema": own}).json()["id"]
    assert httpx.get(f"{agent}/subjects/{s}/versions/latest").json() == {
        "subject": s,
        "version": 1,
        "id": schema_id,
        "schema": own,
    }
    assert httpx.get(f"{agent}/subjects/{s}/versions/1/schema").text == own
    assert httpx.get(f"{agent}/schemas/ids/{schema_id}/schema").text == own
    assert httpx.get(f"{agent}/schemas/ids/{schema_id}/versions").json() == [
        {"subject": s, "version": 1}
    ]
    assert httpx.get(f"{agent}/config").json()["compatibilityLevel"] in {
        "BACKWARD",
        "NONE",
        "FULL",
        "FORWARD",
    }
    assert httpx.get(f"{agent}/config/{s}", params={"defaultToGlobal": "true"}).status_code == 200
    assert httpx.put(f"{agent}/config/{s}", json={"compatibility": "full"}).json() == {
        "compatibility": "FULL"
    }
    assert httpx.delete(f"{agent}/config/{s}").json() == {"compatibilityLevel": "FULL"}
    r = httpx.post(
        f"{agent}/compatibility/subjects/{s}/versions/latest",
        params={"verbose": "true"},
        json={"schema": PAYMENT_BAD},
    )
    assert r.json() == {
        "is_compatible": False,
        "messages": ["version 1: READER_FIELD_MISSING_DEFAULT_VALUE at /fields/2: region"],
    }
    assert httpx.get(f"{agent}/mode").json() == {"mode": "READWRITE"}
