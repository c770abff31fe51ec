"""The REST Proxy's schema formats: avro, jsonschema and protobuf keys and values.

Produce turns the JSON form of each key and value into Confluent's wire format
(``service.registry.wire``) with a schema from the registry; consume turns it
back. The routes (``service.v2.produce``, ``service.v3.records``,
``service.v2.consumers``) call in here and keep their own checks.

Schemas on v2 produce (REST-API.md section 2.2): ``key_schema_id`` /
``value_schema_id`` name a registered schema; ``key_schema`` / ``value_schema``
give its text, registered (or found) under the TopicNameStrategy subject
``<topic>-key`` / ``<topic>-value`` as kafka-rest's auto-registration does. Keys
present without a key schema: 422 42201; values without a value schema: 422
42202; an unknown id, an invalid schema or a value that does not fit: 422
42205; a schema the subject's compatibility level refuses: 408 40801. All of it
is decided before anything is buffered, so a refused request stores nothing.

v3 produce (``key``/``value`` objects): ``schema_id``; or ``schema_version``
with ``subject`` or the subject name strategy; or ``schema`` (raw text,
registered under the subject); or ``type`` alone (the subject's latest
version). ``subject_name_strategy``: TOPIC_NAME (default), RECORD_NAME,
TOPIC_RECORD_NAME (the record name comes from the schema, so those two need
``schema`` or ``schema_id``).

Every schema lookup goes through ``SchemaRegistry``'s caches: after the first
request with a given schema, producing costs no call to the coordinator.

With authorization on, a produce uses the registry with its principal's rights on the
registry's own routes (``service.security.acl``), through :class:`ProduceSchemas`: naming a
schema (by id, subject version or text) needs DESCRIBE on the cluster, as reading the
registry does, whether the subject exists or not (so a producer cannot probe which
subjects exist); a schema text not yet registered under its subject is registered only
with ALTER on the cluster (as ``POST /subjects/{subject}/versions``), else refused as a
serializer with ``auto.register.schemas=false`` would be: 403 40301.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Final

import orjson

from coordinator.schemas.model import LATEST, StoredSchema, SubjectVersion
from coordinator.security.model import Operation, ResourceType
from segments.errors import (
    AuthorizationError,
    KeySchemaMissingError,
    MalformedRequestError,
    RecordSchemaError,
    RequestError,
    SchemaRegistryError,
    UnprocessableRequestError,
    ValueSchemaMissingError,
)
from segments.types import ConsumedRecord
from service.registry.core import SchemaRegistry
from service.registry.schemas import ParsedSchema
from service.registry.wire import SchemaFramingError, frame, unframe
from service.security.acl import CLUSTER_NAME, Rights

#: Embedded format (v2 content type, consumer format) -> registry schema type.
SCHEMA_TYPE_OF_FORMAT: Final = {"avro": "AVRO", "jsonschema": "JSON", "protobuf": "PROTOBUF"}
#: v3 ``type`` -> registry schema type.
SCHEMA_TYPE_OF_V3: Final = {"AVRO": "AVRO", "JSONSCHEMA": "JSON", "PROTOBUF": "PROTOBUF"}
_V3_TYPE_OF_SCHEMA: Final = {v: k for k, v in SCHEMA_TYPE_OF_V3.items()}
_STRATEGIES: Final = ("TOPIC_NAME", "RECORD_NAME", "TOPIC_RECORD_NAME")

# A v2 record as service.v2.produce parses it: key, value, explicit partition, headers.
V2Record = tuple[bytes | None, bytes | None, int | None, Any]


class ProduceSchemas:
    """The registry as one produce request's principal may use it (see the module doc)."""

    def __init__(self, registry: SchemaRegistry, access: Rights) -> None:
        self.registry = registry
        self.access = access

    async def _may(self, operation: Operation) -> bool:
        denied = await self.access.denied(operation, ResourceType.CLUSTER, [CLUSTER_NAME])
        return not denied

    async def _read(self) -> None:
        if not await self._may(Operation.DESCRIBE):
            raise AuthorizationError(
                "Not authorized to use the schema registry's schemas: producing with a "
                "schema needs DESCRIBE on the cluster, as reading the registry does."
            )

    async def parse(self, schema_type: str, text: str) -> ParsedSchema:
        return await self.registry.parse(schema_type, text)

    async def by_id(self, schema_id: int) -> tuple[StoredSchema, ParsedSchema]:
        await self._read()
        return await self.registry.by_id(schema_id)

    async def version(self, subject: str, version: int) -> SubjectVersion:
        await self._read()
        return await self.registry.version(subject, version)

    async def latest(self, subject: str) -> SubjectVersion:
        await self._read()
        return await self.registry.latest(subject)

    async def id_for(self, subject: str, schema_type: str, text: str) -> tuple[int, ParsedSchema]:
        """The id of ``text`` under ``subject``, registered first only with ALTER."""
        await self._read()
        if await self._may(Operation.ALTER):
            return await self.registry.id_for(subject, schema_type, text)
        found = await self.registry.find_id(subject, schema_type, text)
        if found is None:
            raise AuthorizationError(
                f"Not authorized to register a schema under subject {subject}: it is not "
                "registered there, and registering needs ALTER on the cluster (as POST "
                "/subjects/{subject}/versions)."
            )
        return found


def _check_type(parsed: ParsedSchema, schema_type: str, schema_id: int) -> None:
    if parsed.schema_type != schema_type:
        raise RecordSchemaError(
            f"Schema {schema_id} is a {parsed.schema_type} schema, not {schema_type}."
        )


async def _v2_schema(
    registry: ProduceSchemas, subject: str, schema_type: str, text: object, schema_id: object
) -> tuple[int, ParsedSchema] | None:
    """The schema a v2 body names for one side (key or value), or None if it names none."""
    if schema_id is not None:
        if type(schema_id) is not int:
            raise MalformedRequestError("Bad Request: a schema id must be an integer.")
        _, parsed = await registry.by_id(schema_id)
        _check_type(parsed, schema_type, schema_id)
        return schema_id, parsed
    if text is not None:
        if not isinstance(text, str):
            raise MalformedRequestError("Bad Request: a schema must be a string.")
        return await registry.id_for(subject, schema_type, text)
    return None


def _encode(
    parsed: ParsedSchema, schema_id: int, items: Sequence[bytes | None]
) -> list[bytes | None]:
    """JSON bytes (as the v2 parser left them) to framed bodies; None stays None."""
    present = [orjson.loads(item) for item in items if item is not None]
    bodies = iter(parsed.encode(present))
    return [None if item is None else frame(schema_id, next(bodies)) for item in items]


async def encode_v2(
    registry: ProduceSchemas, topic: str, fmt: str, body: bytes, records: list[V2Record]
) -> tuple[list[V2Record], int | None, int | None]:
    """Encode a v2 schema-format request's keys and values.

    Args:
        body: the request body (for ``key_schema``, ``value_schema_id``, ...).
        records: the records as ``service.v2.produce`` parsed them, keys and values
            still JSON bytes.

    Returns:
        (records with framed keys and values, key schema id, value schema id)

    Raises:
        KeySchemaMissingError, ValueSchemaMissingError, RecordSchemaError, and the
        registry's errors (see the module docstring for their codes).
    """
    doc = orjson.loads(body)
    schema_type = SCHEMA_TYPE_OF_FORMAT[fmt]
    keys = [r[0] for r in records]
    values = [r[1] for r in records]
    key = await _v2_schema(
        registry, f"{topic}-key", schema_type, doc.get("key_schema"), doc.get("key_schema_id")
    )
    value = await _v2_schema(
        registry,
        f"{topic}-value",
        schema_type,
        doc.get("value_schema"),
        doc.get("value_schema_id"),
    )
    if key is None and any(k is not None for k in keys):
        raise KeySchemaMissingError(
            "Request includes keys but does not include key schema or key schema id"
        )
    if value is None and any(v is not None for v in values):
        raise ValueSchemaMissingError(
            "Request includes values but does not include value schema or value schema id"
        )
    if key is not None:
        keys = _encode(key[1], key[0], keys)
    if value is not None:
        values = _encode(value[1], value[0], values)
    out = [(k, v, r[2], r[3]) for k, v, r in zip(keys, values, records, strict=True)]
    return out, None if key is None else key[0], None if value is None else value[0]


# -- v3 ----------------------------------------------------------------------------------


def wants_schema(data: object) -> bool:
    """Whether a v3 key/value object asks for a registry schema."""
    if not isinstance(data, dict):
        return False
    kind = data.get("type")
    if isinstance(kind, str) and kind.upper() in SCHEMA_TYPE_OF_V3:
        return True
    return kind is None and any(
        data.get(f) is not None for f in ("schema_id", "schema_version", "schema", "subject")
    )


async def _v3_subject(
    registry: ProduceSchemas, topic: str, side: str, data: dict[str, Any], record_name: str | None
) -> str:
    subject = data.get("subject")
    if subject is not None:
        if not isinstance(subject, str):
            raise MalformedRequestError(f"Bad Request: {side}.subject must be a string.")
        return subject
    strategy = str(data.get("subject_name_strategy") or "TOPIC_NAME").upper()
    if strategy not in _STRATEGIES:
        raise MalformedRequestError(
            f"Bad Request: {side}.subject_name_strategy must be one of {', '.join(_STRATEGIES)}."
        )
    if strategy == "TOPIC_NAME":
        return f"{topic}-{side}"
    if record_name is None:
        raise RecordSchemaError(
            f"{side}: subject_name_strategy {strategy} needs the schema (schema or schema_id) "
            "to name the record."
        )
    return record_name if strategy == "RECORD_NAME" else f"{topic}-{record_name}"


async def encode_v3(
    registry: ProduceSchemas, topic: str, side: str, data: dict[str, Any]
) -> tuple[bytes | None, dict[str, Any]]:
    """A v3 key or value with a schema: (framed bytes, its delivery report).

    Raises:
        MalformedRequestError (400), RecordSchemaError (42205), the registry's errors.
    """
    kind = data.get("type")
    wanted = None if kind is None else SCHEMA_TYPE_OF_V3.get(str(kind).upper())
    schema_id, schema_version, text = (
        data.get("schema_id"),
        data.get("schema_version"),
        data.get("schema"),
    )
    version: int | None = None
    subject: str | None = None
    if schema_id is not None:
        if type(schema_id) is not int:
            raise MalformedRequestError(f"Bad Request: {side}.schema_id must be an integer.")
        _, parsed = await registry.by_id(schema_id)
    elif text is not None:
        if not isinstance(text, str) or wanted is None:
            raise MalformedRequestError(
                f"Bad Request: {side}.schema must be a string, with {side}.type set."
            )
        parsed = await registry.parse(wanted, text)
        subject = await _v3_subject(registry, topic, side, data, parsed.record_name())
        schema_id, parsed = await registry.id_for(subject, wanted, text)
    else:
        if schema_version is not None and type(schema_version) is not int:
            raise MalformedRequestError(f"Bad Request: {side}.schema_version must be an integer.")
        subject = await _v3_subject(registry, topic, side, data, None)
        sv = await (
            registry.latest(subject)
            if schema_version is None or schema_version == LATEST
            else registry.version(subject, schema_version)
        )
        schema_id, version = sv.schema.schema_id, sv.version
        _, parsed = await registry.by_id(schema_id)
    if wanted is not None:
        _check_type(parsed, wanted, schema_id)
    payload = data.get("data")
    framed = None if payload is None else frame(schema_id, parsed.encode([payload])[0])
    report: dict[str, Any] = {
        "type": _V3_TYPE_OF_SCHEMA[parsed.schema_type],
        "size": 0 if framed is None else len(framed),
        "schema_id": schema_id,
    }
    if subject is not None:
        report["subject"] = subject
    if version is not None:
        report["schema_version"] = version
    return framed, report


async def prepare_v3(
    registry: ProduceSchemas, topic: str, doc: object
) -> tuple[object, dict[str, dict[str, Any]]]:
    """A v3 record with its schema keys/values replaced by their framed bytes (as BINARY
    data, which ``service.v3.records`` takes as it is) and their delivery reports."""
    if not isinstance(doc, dict):
        return doc, {}
    reports: dict[str, dict[str, Any]] = {}
    out = doc
    for side in ("key", "value"):
        data = doc.get(side)
        if not wants_schema(data):
            continue
        assert isinstance(data, dict)
        framed, reports[side] = await encode_v3(registry, topic, side, data)
        if out is doc:
            out = dict(doc)
        out[side] = {
            "type": "BINARY",
            "data": None if framed is None else base64.b64encode(framed).decode("ascii"),
        }
    return out, reports


# -- consume ---------------------------------------------------------------------------------


async def _decode(
    registry: SchemaRegistry, data: bytes | None, schema_type: str, side: str
) -> object:
    if data is None:
        return None
    try:
        schema_id, body = unframe(data)
    except SchemaFramingError as e:
        if side == "key":  # Karapace's fallback: keys written without a schema stay bytes
            return base64.b64encode(data).decode("ascii")
        raise UnprocessableRequestError(f"{side} deserialization error: {e}") from None
    try:
        _, parsed = await registry.by_id(schema_id)
        _check_type(parsed, schema_type, schema_id)
        return parsed.decode(body)
    except (RequestError, SchemaRegistryError) as e:
        raise UnprocessableRequestError(f"{side} deserialization error: {e.message}") from None


async def render_records(
    registry: SchemaRegistry, records: Sequence[ConsumedRecord], fmt: str
) -> list[dict[str, Any]]:
    """Records for a consumer of a schema format: keys and values as their JSON form.

    Raises:
        UnprocessableRequestError: a value not in the wire format, an unknown schema id,
            or bytes that do not decode with their schema (nothing is consumed then).
    """
    schema_type = SCHEMA_TYPE_OF_FORMAT[fmt]

    async def render(r: ConsumedRecord) -> dict[str, Any]:
        return {
            "topic": r.topic,
            "key": await _decode(registry, r.key, schema_type, "key"),
            "value": await _decode(registry, r.value, schema_type, "value"),
            "partition": r.partition,
            "offset": r.offset,
            "timestamp": r.timestamp_ms,
            "headers": [
                {"key": k, "value": None if v is None else base64.b64encode(v).decode()}
                for k, v in r.headers
            ],
        }

    return [await render(r) for r in records]
