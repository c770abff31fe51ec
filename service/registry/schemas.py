"""Parsed registry schemas: one interface over Avro, JSON Schema and Protobuf.

``parse_schema(type, text, dependencies)`` validates a schema with its format's
library and returns a :class:`ParsedSchema`: the canonical text the registry
stores, the record name (for RecordNameStrategy subjects), an encoder from the
REST API's JSON form to the body bytes, a decoder back, and the compatibility
check against an older version. ``check_compatibility`` applies a
compatibility level (NONE, BACKWARD, FORWARD, FULL and their TRANSITIVE forms)
over a subject's versions.

No I/O, except that Protobuf text is compiled by ``protoc`` in a subprocess
(``service.registry.protobuf_format``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from segments.errors import InvalidSchemaError


class ParsedSchema(Protocol):
    """A schema its library has parsed and checked."""

    schema_type: str
    #: The text the registry stores and compares (whitespace-free JSON for Avro and JSON
    #: Schema; Protobuf as given).
    canonical: str

    def record_name(self) -> str | None:
        """The fully qualified record (message, title) name, for RecordNameStrategy."""
        ...

    def encode(self, values: Sequence[object]) -> list[bytes]:
        """JSON values (as the REST API carries them) to bodies (after the 5-byte header).

        Raises:
            RecordSchemaError: a value that does not fit the schema.
        """
        ...

    def decode(self, body: bytes | memoryview) -> object:
        """A body (after the 5-byte header) to its JSON value.

        Raises:
            RecordSchemaError: bytes that are not data of this schema.
        """
        ...

    def incompatibilities(self, writer: ParsedSchema) -> list[str]:
        """Why data written with ``writer`` cannot be read with this schema (empty: it can)."""
        ...


#: One compatibility level: (check new as reader of old, check old as reader of new,
#: against every older version rather than the latest only).
_LEVELS: dict[str, tuple[bool, bool, bool]] = {
    "NONE": (False, False, False),
    "BACKWARD": (True, False, False),
    "BACKWARD_TRANSITIVE": (True, False, True),
    "FORWARD": (False, True, False),
    "FORWARD_TRANSITIVE": (False, True, True),
    "FULL": (True, True, False),
    "FULL_TRANSITIVE": (True, True, True),
}


def versions_to_check(level: str, versions: Sequence[int]) -> list[int]:
    """Which of a subject's live versions (ascending) a new schema is checked against."""
    backward, forward, transitive = _LEVELS[level]
    if not (backward or forward) or not versions:
        return []
    return list(versions) if transitive else [versions[-1]]


def check_compatibility(
    level: str, new: ParsedSchema, olds: Sequence[tuple[int, ParsedSchema]]
) -> list[str]:
    """Problems of ``new`` against ``olds`` ((version, schema) pairs) under ``level``.

    BACKWARD: the new schema reads data written with the old one; FORWARD: the old
    reads the new's; FULL: both. Schemas of another type are always incompatible.
    """
    backward, forward, _ = _LEVELS[level]
    problems: list[str] = []
    for version, old in olds:
        if old.schema_type != new.schema_type:
            problems.append(
                f"version {version}: schema type {old.schema_type} cannot become {new.schema_type}"
            )
            continue
        if backward:
            problems += [f"version {version}: {p}" for p in new.incompatibilities(old)]
        if forward:
            problems += [
                f"version {version} (reading new data): {p}" for p in old.incompatibilities(new)
            ]
    return problems


def load_json(text: str) -> Any:
    """A schema's JSON text (Avro and JSON Schema are JSON). Raises InvalidSchemaError."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InvalidSchemaError(
            f"Invalid schema: not valid JSON (line {e.lineno}, column {e.colno})"
        ) from None


def parse_schema(
    schema_type: str, text: str, dependencies: Sequence[tuple[str, ParsedSchema]] = ()
) -> ParsedSchema:
    """Parse and check ``text`` as ``schema_type``.

    Args:
        dependencies: (reference name, parsed schema) of each reference, in order.

    Raises:
        InvalidSchemaError: an unknown type, or a schema its library refuses.
    """
    if schema_type == "AVRO":
        from service.registry.avro_format import AvroSchema

        return AvroSchema.parse(text, dependencies)
    if schema_type == "JSON":
        from service.registry.jsonschema_format import JsonSchema

        return JsonSchema.parse(text, dependencies)
    if schema_type == "PROTOBUF":
        from service.registry.protobuf_format import ProtobufSchema

        return ProtobufSchema.parse(text, dependencies)
    raise InvalidSchemaError(f"Invalid schema type {schema_type}")
