"""JSON Schema: the ``jsonschema`` library checks schemas and validates values; the
compatibility rules are ours, because no library has them.

References resolve through the ``referencing`` library: each reference's schema is
a resource under its reference name, so ``{"$ref": "address.json"}`` finds the
schema registered as ``address.json``.

Compatibility (hand-written, following the rules Confluent documents for JSON
Schema): a reader is compatible with a writer when every document the writer
accepts, the reader accepts too. The check walks both schemas together and
reports each rule a change breaks:

- ``type``: the reader's types must cover the writer's ("number" covers
  "integer"); removing types narrows.
- objects: a property the writer allows but the reader constrains more is
  checked recursively; a property added to an *open* content model
  (``additionalProperties`` absent or true) is incompatible unless it accepts
  anything, since old data may hold any value under that name; a property
  removed from a *closed* model (``additionalProperties: false``) is
  incompatible; closing an open model is incompatible; new ``required``
  names are incompatible.
- bounds: ``maxLength``, ``maxItems``, ``maxProperties``, ``maximum``,
  ``exclusiveMaximum`` may only grow or go away; their ``min`` twins may only
  shrink or go away; ``multipleOf`` must divide the writer's; ``pattern`` and
  ``const`` may only stay or go; ``enum`` may only gain values;
  ``uniqueItems`` may only be dropped.
- ``items`` (a schema, or a list for tuples) is checked recursively.
- ``oneOf``/``anyOf``: every writer alternative must be readable by some reader
  alternative; a non-combined writer must be readable by one of the reader's.
- ``allOf``, ``not``, ``if``/``then``/``else`` and ``$ref`` are compared as they
  are: any change to them is reported (no library proves inclusion of these).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jsonschema
import orjson
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT7

from segments.errors import InvalidSchemaError, RecordSchemaError
from service.registry.schemas import ParsedSchema, load_json

_UPPER_BOUNDS = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum")
_LOWER_BOUNDS = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum")
_OPAQUE = ("allOf", "not", "if", "then", "else", "$ref", "dependencies", "patternProperties")


class JsonSchema:
    """A JSON Schema document with its references."""

    schema_type = "JSON"

    def __init__(self, canonical: str, doc: Any, validator: Any, resources: list[Any]) -> None:
        self.canonical = canonical
        self.doc = doc
        self._validator = validator
        self._resources = resources  # (name, doc) of this schema's references, transitively

    @classmethod
    def parse(cls, text: str, dependencies: Sequence[tuple[str, ParsedSchema]]) -> JsonSchema:
        doc = load_json(text)
        if not isinstance(doc, dict | bool):
            raise InvalidSchemaError("Invalid schema: a JSON Schema is an object or a boolean")
        resources: list[Any] = []
        for name, dep in dependencies:
            if not isinstance(dep, JsonSchema):
                raise InvalidSchemaError(
                    "Invalid schema: a JSON Schema can reference JSON Schema only"
                )
            resources += [*dep._resources, (name, dep.doc)]
        registry: Registry[Any] = Registry().with_resources(
            (name, Resource.from_contents(d, default_specification=DRAFT7)) for name, d in resources
        )
        cls_ = validator_for(doc, default=jsonschema.Draft7Validator)
        try:
            cls_.check_schema(doc)
        except SchemaError as e:
            raise InvalidSchemaError(f"Invalid schema: {e.message}") from None
        validator = cls_(doc, registry=registry)
        return cls(orjson.dumps(doc).decode(), doc, validator, resources)

    def record_name(self) -> str | None:
        title = self.doc.get("title") if isinstance(self.doc, dict) else None
        return title if isinstance(title, str) else None

    def _check(self, value: object) -> None:
        try:
            if self._validator.is_valid(value):  # the common case; best_match costs more
                return
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        except Unresolvable as e:
            raise RecordSchemaError(f"JSON Schema reference not resolvable: {e}") from None
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            raise RecordSchemaError(
                f"Invalid JSON: {error.message}" + (f" at /{where}" if where else "")
            )

    def encode(self, values: Sequence[object]) -> list[bytes]:
        out = []
        for value in values:
            self._check(value)
            out.append(orjson.dumps(value))
        return out

    def decode(self, body: bytes | memoryview) -> object:
        try:
            return orjson.loads(bytes(body))
        except orjson.JSONDecodeError as e:
            raise RecordSchemaError(f"JSON deserialization failed: {e}") from None

    def incompatibilities(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, JsonSchema):
            return ["not a JSON Schema"]
        return reader_problems(self.doc, writer.doc, "#")


# -- compatibility ---------------------------------------------------------------------


def _types(schema: dict[str, Any]) -> set[str] | None:
    t = schema.get("type")
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def _accepts_all(schema: Any) -> bool:
    return schema is True or schema == {}


def _open(schema: dict[str, Any]) -> bool:
    return _accepts_all(schema.get("additionalProperties", True))


def reader_problems(reader: Any, writer: Any, path: str) -> list[str]:
    """Why some document valid under ``writer`` may be invalid under ``reader``."""
    if _accepts_all(reader) or writer is False:
        return []
    if reader is False or writer is True:
        return [f"{path}: the new schema accepts less than the old one"]
    if writer == {}:
        return [f"{path}: the old schema accepted anything"]
    if reader == writer:
        return []
    problems: list[str] = []
    for keyword in ("oneOf", "anyOf"):
        if keyword in reader or keyword in writer:
            return _combined(reader, writer, path)
    problems += [f"{path}: {k} changed" for k in _OPAQUE if reader.get(k) != writer.get(k)]
    r_types, w_types = _types(reader), _types(writer)
    if r_types is not None:
        if w_types is None:
            problems.append(f"{path}: type restricted to {sorted(r_types)}")
        else:
            widened = r_types | ({"integer"} if "number" in r_types else set())
            missing = w_types - widened
            if missing:
                problems.append(f"{path}: type {sorted(missing)} no longer accepted")
    problems += [
        f"{path}: {k} added or decreased"
        for k in _UPPER_BOUNDS
        if k in reader and (k not in writer or reader[k] < writer[k])
    ]
    problems += [
        f"{path}: {k} added or increased"
        for k in _LOWER_BOUNDS
        if k in reader and (k not in writer or reader[k] > writer[k])
    ]
    if "multipleOf" in reader:
        w_multiple = writer.get("multipleOf")
        if w_multiple is None or (w_multiple / reader["multipleOf"]) % 1 != 0:
            problems.append(f"{path}: multipleOf added or changed")
    problems += [
        f"{path}: {k} added or changed"
        for k in ("pattern", "const")
        if k in reader and reader.get(k) != writer.get(k)
    ]
    if "enum" in reader:
        w_enum = writer.get("enum")
        if w_enum is None or any(v not in reader["enum"] for v in w_enum):
            problems.append(f"{path}: enum narrowed")
    if reader.get("uniqueItems") is True and writer.get("uniqueItems") is not True:
        problems.append(f"{path}: uniqueItems added")
    problems += _object_problems(reader, writer, path)
    problems += _items_problems(reader, writer, path)
    return problems


def _object_problems(reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
    problems: list[str] = []
    r_props: dict[str, Any] = reader.get("properties", {})
    w_props: dict[str, Any] = writer.get("properties", {})
    w_extra = writer.get("additionalProperties", True)
    r_extra = reader.get("additionalProperties", True)
    for name, r_prop in r_props.items():
        where = f"{path}/properties/{name}"
        if name in w_props:
            problems += reader_problems(r_prop, w_props[name], where)
        elif w_extra is not False:
            # Old data may hold this name with whatever the old model let through.
            problems += [
                p.replace("the old schema accepted anything", "property added to an open model")
                for p in reader_problems(r_prop, w_extra if w_extra is not True else {}, where)
            ]
    for name, w_prop in w_props.items():
        if name not in r_props:
            where = f"{path}/properties/{name}"
            if r_extra is False:
                problems.append(f"{where}: property removed from a closed content model")
            elif not _accepts_all(r_extra):
                problems += reader_problems(r_extra, w_prop, where)
    if not _open(reader):
        if _open(writer):
            problems.append(f"{path}: additionalProperties narrowed (content model closed)")
        elif r_extra is not False and w_extra is not False:
            problems += reader_problems(r_extra, w_extra, f"{path}/additionalProperties")
    added = set(reader.get("required", [])) - set(writer.get("required", []))
    if added:
        problems.append(f"{path}: required properties added: {sorted(added)}")
    return problems


def _items_problems(reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
    r_items, w_items = reader.get("items"), writer.get("items")
    if r_items is None:
        return []
    if isinstance(r_items, list) or isinstance(w_items, list):
        if not (isinstance(r_items, list) and isinstance(w_items, list)):
            return [f"{path}/items: changed between a schema and a tuple"]
        problems = []
        for i, (r, w) in enumerate(zip(r_items, w_items, strict=False)):
            problems += reader_problems(r, w, f"{path}/items/{i}")
        if len(r_items) != len(w_items):
            problems.append(f"{path}/items: tuple length changed")
        return problems
    return reader_problems(r_items, {} if w_items is None else w_items, f"{path}/items")


def _combined(reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
    r_alts = reader.get("oneOf") or reader.get("anyOf") or [reader]
    w_alts = writer.get("oneOf") or writer.get("anyOf") or [writer]
    problems = []
    for i, w in enumerate(w_alts):
        if all(reader_problems(r, w, path) for r in r_alts):
            problems.append(f"{path}: alternative {i} of the old schema no longer accepted")
    return problems
