"""Canonical forms: the same schema however it is spelled is one canonical text (and so one
id); a change of meaning or documentation is another. Avro's is its own JSON form (what
Confluent's registry stores); Protobuf's is ``.proto`` text printed from the compiled file,
whether the schema came as text or as a base64 ``FileDescriptorProto``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.registry.schemas import ParsedSchema, parse_schema


def avro(doc: Any, deps: list[tuple[str, ParsedSchema]] | None = None) -> str:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    return parse_schema("AVRO", text, deps or []).canonical


ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "io.shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": {"type": "string"}, "default": "", "doc": "what"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "again", "type": ["null", "Kind"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


@pytest.mark.parametrize(
    ("spelling", "text"),
    [
        ("keys reordered", json.dumps({k: ORDER[k] for k in reversed(list(ORDER))})),
        (
            "full name instead of namespace + name",
            json.dumps(
                {**{k: v for k, v in ORDER.items() if k != "namespace"}, "name": "io.shop.Order"}
            ),
        ),
        ("indented", json.dumps(ORDER, indent=4)),
        (
            "a nested type's own namespace spelled out",
            json.dumps(ORDER).replace('"name": "Kind"', '"name": "Kind", "namespace": "io.shop"'),
        ),
        (
            "a reference by full name",
            json.dumps(ORDER).replace('["null", "Kind"]', '["null", "io.shop.Kind"]'),
        ),
    ],
)
def test_avro_spellings_of_one_schema_are_one_text(spelling: str, text: str) -> None:
    assert avro(text) == avro(ORDER), spelling


def test_avro_canonical_text_is_avros_own_json_form() -> None:
    assert json.loads(avro(ORDER)) == {
        "type": "record",
        "name": "Order",
        "namespace": "io.shop",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "item", "type": "string", "doc": "what", "default": ""},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
            {"name": "again", "type": ["null", "Kind"], "default": None},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
    assert list(json.loads(avro(ORDER))) == ["type", "name", "namespace", "fields"]
    assert avro(avro(ORDER)) == avro(ORDER)  # idempotent


@pytest.mark.parametrize(
    ("change", "path", "value"),
    [
        ("a default", ("fields", 0, "default"), 0),
        ("a doc", ("fields", 0, "doc"), "the id"),
        ("an alias", ("fields", 0, "aliases"), ["ident"]),
        (
            "a logical type",
            ("fields", 0, "type"),
            {"type": "long", "logicalType": "timestamp-micros"},
        ),
        ("a property", ("connect.name",), "io.shop.Order"),
    ],
)
def test_avro_changes_of_meaning_are_kept(change: str, path: tuple[Any, ...], value: Any) -> None:
    doc = json.loads(json.dumps(ORDER))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert avro(doc) != avro(ORDER), change


def test_avro_reference_types_are_written_by_name() -> None:
    address = parse_schema(
        "AVRO",
        json.dumps(
            {
                "type": "record",
                "name": "Address",
                "namespace": "io.shop",
                "fields": [{"name": "city", "type": "string"}],
            }
        ),
    )
    person = {
        "type": "record",
        "name": "io.shop.Person",
        "fields": [{"name": "home", "type": "io.shop.Address"}],
    }
    assert json.loads(avro(person, [("io.shop.Address", address)]))["fields"] == [
        {"name": "home", "type": "Address"}
    ]
