"""JSON Schema: the ``jsonschema`` library checks schemas and validates values; the
compatibility rules are Confluent's diff (``service.registry.jsonschema_diff``).

References resolve through the ``referencing`` library: each reference's schema is
a resource under its reference name, so ``{"$ref": "address.json"}`` finds the
schema registered as ``address.json`` -- when validating values and when comparing
schemas, so a change inside a referenced schema is a change of this one.
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
from service.registry.jsonschema_diff import Loader, Node, incompatibilities
from service.registry.schemas import ParsedSchema, load_json


class JsonSchema:
    """A JSON Schema document with its references."""

    schema_type = "JSON"

    def __init__(self, canonical: str, doc: Any, validator: Any, resources: list[Any]) -> None:
        self.canonical = canonical
        self.doc = doc
        self._validator = validator
        self._resources = resources  # (name, doc) of this schema's references, transitively
        self._tree: Node | None = None

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

    def tree(self) -> Node:
        """The schema as Confluent's diff sees it (typed nodes, references followed)."""
        if self._tree is None:
            self._tree = Loader(self._resources).load_root(self.doc)
        return self._tree

    def incompatibilities(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, JsonSchema):
            return ["not a JSON Schema"]
        return incompatibilities(writer.tree(), self.tree())
