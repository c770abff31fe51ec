"""Avro schemas: fastavro parses, encodes and decodes; Apache Avro checks compatibility.

- Parsing: ``fastavro.parse_schema`` (with the named types of the references
  loaded first) refuses bad schemas; Apache Avro's parser must accept it too,
  since its ``ReaderWriterCompatibilityChecker`` (Avro's schema-resolution rules,
  the ones Confluent's registry applies) works on its own schema objects.
- The REST API carries Avro values in Avro's JSON encoding (unions as
  ``{"type": value}``, bytes as ``\\u00XX`` strings), as kafka-rest does:
  ``fastavro.json_reader`` decodes them, ``fastavro.validation`` checks them,
  ``schemaless_writer`` writes the binary body. Consuming reverses it with
  ``schemaless_reader`` and ``json_writer``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import avro.errors
import avro.name
import avro.schema
import fastavro
import orjson
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from fastavro.validation import ValidationError, validate

from segments.errors import InvalidSchemaError, RecordSchemaError
from service.registry.schemas import ParsedSchema, load_json

#: What fastavro and avro raise for a schema or datum they refuse.
_SCHEMA_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    fastavro.schema.SchemaParseException,
    fastavro.schema.UnknownType,
    avro.errors.AvroException,
)
_DATA_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    IndexError,
    EOFError,
    OverflowError,
)


class AvroSchema:
    """An Avro schema with the named types of its references."""

    schema_type = "AVRO"

    def __init__(
        self,
        canonical: str,
        parsed: Any,
        named: dict[str, Any],
        checked: avro.schema.Schema,
        names: avro.name.Names,
    ) -> None:
        self.canonical = canonical
        self._parsed = parsed
        self._named = named  # fastavro's named types, the references' included
        self._checked = checked
        self._names = names  # Apache Avro's, likewise

    @classmethod
    def parse(cls, text: str, dependencies: Sequence[tuple[str, ParsedSchema]]) -> AvroSchema:
        doc = load_json(text)
        named: dict[str, Any] = {}
        names = avro.name.Names()
        for _, dep in dependencies:
            if not isinstance(dep, AvroSchema):
                raise InvalidSchemaError("Invalid schema: an Avro schema can reference Avro only")
            named.update(dep._named)
            names.names.update(dep._names.names)
        try:
            parsed = fastavro.parse_schema(doc, named_schemas=named)
            checked = avro.schema.make_avsc_object(doc, names)
        except _SCHEMA_ERRORS as e:
            raise InvalidSchemaError(f"Invalid schema: {e}") from None
        return cls(orjson.dumps(doc).decode(), parsed, named, checked, names)

    def record_name(self) -> str | None:
        return getattr(self._checked, "fullname", None)

    def encode(self, values: Sequence[object]) -> list[bytes]:
        if not values:
            return []
        # One decoder for the whole batch: Avro-JSON text, one value per line.
        lines = io.StringIO(b"\n".join(orjson.dumps(v) for v in values).decode())
        out: list[bytes] = []
        buf = io.BytesIO()
        try:
            for datum in fastavro.json_reader(lines, self._parsed):
                validate(datum, self._parsed, raise_errors=True)
                buf.seek(0)
                buf.truncate()
                fastavro.schemaless_writer(buf, self._parsed, datum)
                out.append(buf.getvalue())
        except ValidationError as e:
            detail = "; ".join(str(x) for x in e.errors)
            raise RecordSchemaError(
                f"Conversion of JSON to Avro failed: record {len(out)}: {detail}"
            ) from None
        except _DATA_ERRORS as e:
            raise RecordSchemaError(
                f"Conversion of JSON to Avro failed: record {len(out)}: {type(e).__name__}: {e}"
            ) from None
        return out

    def decode(self, body: bytes | memoryview) -> object:
        try:
            datum = fastavro.schemaless_reader(io.BytesIO(body), self._parsed, None)
            text = io.StringIO()
            fastavro.json_writer(text, self._parsed, [datum])
            return orjson.loads(text.getvalue())
        except _DATA_ERRORS as e:
            raise RecordSchemaError(f"Avro deserialization failed: {e}") from None

    def incompatibilities(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, AvroSchema):
            return ["not an Avro schema"]
        checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
        result = checker.get_compatibility(self._checked, writer._checked)
        if result.compatibility is SchemaCompatibilityType.compatible:
            return []
        kinds = [k.value for k in result.incompatibilities]
        return [
            f"{kind.upper()} at {location}: {message}"
            for kind, location, message in zip(
                kinds, sorted(result.locations), sorted(result.messages), strict=False
            )
        ] or ["incompatible"]
