"""Avro schemas: fastavro parses, encodes and decodes; Apache Avro checks compatibility.

- Parsing: ``fastavro.parse_schema`` (with the named types of the references
  loaded first) refuses bad schemas; Apache Avro's parser must accept it too,
  since its ``ReaderWriterCompatibilityChecker`` (Avro's schema-resolution rules,
  the ones Confluent's registry applies) works on its own schema objects.
- Canonical form (``canonical_text``): what Confluent's registry stores and compares,
  Avro's own JSON form of the parsed schema (Java's ``Schema.toString``): keys in a fixed
  order, ``name`` + ``namespace`` (the namespace only where it differs from the enclosing
  one), a named type written in full once and by name after, a primitive without
  properties as its bare name, no whitespace. Unlike the parsing canonical form it keeps
  what changes a schema's meaning or documentation: defaults, ``doc``, aliases, ``order``,
  logical types and other properties. So the same schema with another key order, a full
  name instead of namespace + name, or other spacing is the same text and the same id.
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


#: Avro's type names: a named type's reference is written in full if its short name is one.
_PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))
_TYPE_NAMES = _PRIMITIVES | {"record", "enum", "array", "map", "union", "fixed"}
#: Keys that are not properties, per kind (Java's SCHEMA_RESERVED, ENUM_RESERVED, ...).
_SCHEMA_KEYS = frozenset(("doc", "fields", "items", "name", "namespace", "size", "symbols"))
_SCHEMA_KEYS |= {"values", "type", "aliases"}
_ENUM_KEYS = _SCHEMA_KEYS | {"default"}
_FIELD_KEYS = frozenset(("default", "doc", "name", "order", "type", "aliases"))


def _split_name(name: str, namespace: str | None) -> tuple[str, str | None]:
    """(short name, namespace or None) of a name as Avro resolves it."""
    if "." in name:
        space, _, short = name.rpartition(".")
        return short, space or None
    return name, namespace or None


def _full(short: str, space: str | None) -> str:
    return f"{space}.{short}" if space else short


class _Canonical:
    """Writes a schema document in Avro's own JSON form (see the module docstring)."""

    def __init__(self, known: set[str]) -> None:
        self.known = set(known)  # full names already written in full (or referenced)

    def _qualified(self, full: str, current: str | None) -> str:
        short, space = _split_name(full, None)
        if space is not None and space == current and short not in _TYPE_NAMES:
            return short
        return full

    def _reference(self, name: str, current: str | None) -> str:
        if "." not in name and current and f"{current}.{name}" in self.known:
            return self._qualified(f"{current}.{name}", current)
        return self._qualified(name, current)

    def _props(self, node: dict[str, Any], reserved: frozenset[str]) -> dict[str, Any]:
        return {k: v for k, v in node.items() if k not in reserved}

    def _name(self, node: dict[str, Any], current: str | None) -> tuple[dict[str, Any], str]:
        short, space = _split_name(node["name"], node.get("namespace", current))
        out: dict[str, Any] = {"name": short}
        if space is not None:
            if space != current:
                out["namespace"] = space
        elif current is not None:
            out["namespace"] = ""
        return out, _full(short, space)

    def _aliases(self, node: dict[str, Any], full: str) -> dict[str, Any]:
        aliases = node.get("aliases") or []
        if not aliases:
            return {}
        _, space = _split_name(full, None)
        written = [self._qualified(_full(*_split_name(a, space)), space) for a in aliases]
        return {"aliases": written}

    def write(self, node: Any, current: str | None) -> Any:
        if isinstance(node, str):
            return node if node in _PRIMITIVES else self._reference(node, current)
        if isinstance(node, list):
            return [self.write(branch, current) for branch in node]
        kind = node["type"]
        if not isinstance(kind, str):
            return self.write(kind, current)
        if kind in _PRIMITIVES:
            props = self._props(node, _SCHEMA_KEYS)
            return {"type": kind, **props} if props else kind
        if kind == "array":
            items = self.write(node["items"], current)
            return {"type": "array", "items": items, **self._props(node, _SCHEMA_KEYS)}
        if kind == "map":
            values = self.write(node["values"], current)
            return {"type": "map", "values": values, **self._props(node, _SCHEMA_KEYS)}
        if kind not in ("record", "error", "enum", "fixed"):
            return self._reference(kind, current)
        name, full = self._name(node, current)
        if full in self.known:
            return self._qualified(full, current)
        self.known.add(full)
        out: dict[str, Any] = {"type": kind, **name}
        if node.get("doc") is not None:
            out["doc"] = node["doc"]
        _, space = _split_name(full, None)
        if kind in ("record", "error"):
            out["fields"] = [self._field(f, space) for f in node["fields"]]
            out.update(self._props(node, _SCHEMA_KEYS))
        elif kind == "enum":
            out["symbols"] = node["symbols"]
            if node.get("default") is not None:
                out["default"] = node["default"]
            out.update(self._props(node, _ENUM_KEYS))
        else:
            out["size"] = node["size"]
            out.update(self._props(node, _SCHEMA_KEYS))
        out.update(self._aliases(node, full))
        return out

    def _field(self, field: dict[str, Any], space: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": field["name"], "type": self.write(field["type"], space)}
        if field.get("doc") is not None:
            out["doc"] = field["doc"]
        if "default" in field:
            default = field["default"]
            if isinstance(default, str) and out["type"] in ("float", "double"):
                default = float(default)  # Avro reads a numeric default given as text
            out["default"] = default
        order = str(field.get("order", "ascending")).lower()
        if order != "ascending":
            out["order"] = order
        if field.get("aliases"):
            out["aliases"] = list(field["aliases"])
        out.update(self._props(field, _FIELD_KEYS))
        return out


def canonical_text(doc: Any, known: set[str] | frozenset[str] = frozenset()) -> str:
    """``doc`` (a parsed, valid Avro schema document) in Avro's own JSON form.

    Args:
        known: full names of the named types the references define (written by name).
    """
    return orjson.dumps(_Canonical(set(known)).write(doc, None)).decode()


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
        known = set(named)  # the references' named types; parse_schema adds this schema's
        try:
            parsed = fastavro.parse_schema(doc, named_schemas=named)
            checked = avro.schema.make_avsc_object(doc, names)
        except _SCHEMA_ERRORS as e:
            raise InvalidSchemaError(f"Invalid schema: {e}") from None
        return cls(canonical_text(doc, known), parsed, named, checked, names)

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
