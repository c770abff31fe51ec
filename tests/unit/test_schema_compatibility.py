"""Compatibility levels and rules against the cases in Confluent's documentation
(schema evolution summary for Avro; content models for JSON Schema; the Protobuf rules),
plus the wire format's pure codecs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segments.errors import InvalidSchemaError, RecordSchemaError
from service.registry.schemas import (
    ParsedSchema,
    check_compatibility,
    parse_schema,
    versions_to_check,
)
from service.registry.wire import (
    SchemaFramingError,
    decode_message_indexes,
    encode_message_indexes,
    frame,
    unframe,
)


def avro(*fields: dict[str, object]) -> ParsedSchema:
    return parse_schema("AVRO", json.dumps({"type": "record", "name": "R", "fields": fields}))


F1 = {"name": "f1", "type": "string"}
F2_REQUIRED = {"name": "f2", "type": "string"}
F2_OPTIONAL = {"name": "f2", "type": "string", "default": "foo"}


def compatible(level: str, new: ParsedSchema, old: ParsedSchema) -> bool:
    return not check_compatibility(level, new, [(1, old)])


# Confluent's summary: BACKWARD may delete fields and add optional ones; FORWARD may add
# fields and delete optional ones; FULL may add and delete optional fields only.
@pytest.mark.parametrize(
    ("change", "old", "new", "backward", "forward"),
    [
        ("add optional field", avro(F1), avro(F1, F2_OPTIONAL), True, True),
        ("add required field", avro(F1), avro(F1, F2_REQUIRED), False, True),
        ("delete optional field", avro(F1, F2_OPTIONAL), avro(F1), True, True),
        ("delete required field", avro(F1, F2_REQUIRED), avro(F1), True, False),
        (
            "widen int to long",
            avro({"name": "n", "type": "int"}),
            avro({"name": "n", "type": "long"}),
            True,
            False,
        ),
        (
            "change string to int",
            avro({"name": "n", "type": "string"}),
            avro({"name": "n", "type": "int"}),
            False,
            False,
        ),
    ],
)
def test_avro_rules(
    change: str, old: ParsedSchema, new: ParsedSchema, backward: bool, forward: bool
) -> None:
    assert compatible("BACKWARD", new, old) is backward, change
    assert compatible("FORWARD", new, old) is forward, change
    assert compatible("FULL", new, old) is (backward and forward), change
    assert compatible("NONE", new, old) is True


def test_transitive_levels_check_every_version() -> None:
    assert versions_to_check("BACKWARD", [1, 2, 3]) == [3]
    assert versions_to_check("BACKWARD_TRANSITIVE", [1, 2, 3]) == [1, 2, 3]
    assert versions_to_check("FULL_TRANSITIVE", []) == []
    assert versions_to_check("NONE", [1, 2]) == []
    # v3 drops f1's default-less sibling: fine against v2 (which lacks f2), not against v1.
    v1 = avro(F1, F2_REQUIRED)
    v2 = avro(F1)
    v3 = avro(F1, {"name": "f3", "type": "int", "default": 0})
    olds = [(1, v1), (2, v2)]
    assert check_compatibility("FORWARD", v3, olds[-1:]) == []
    assert check_compatibility("FORWARD_TRANSITIVE", v3, olds) != []


def js(doc: object) -> ParsedSchema:
    return parse_schema("JSON", json.dumps(doc))


OPEN = {"type": "object", "properties": {"a": {"type": "string"}}}
CLOSED = {**OPEN, "additionalProperties": False}


def with_b(doc: dict[str, object], **extra: object) -> dict[str, object]:
    props = {"a": {"type": "string"}, "b": {"type": "integer"}}
    return {**doc, "properties": props, **extra}


# Confluent's content models: an open model may not gain properties (old data may hold any
# value under the new name), a closed one may not lose them.
@pytest.mark.parametrize(
    ("change", "old", "new", "backward", "forward"),
    [
        ("add property to open model", OPEN, with_b(OPEN), False, True),
        ("add property to closed model", CLOSED, with_b(CLOSED), True, False),
        ("remove property from open model", with_b(OPEN), OPEN, True, False),
        ("remove property from closed model", with_b(CLOSED), CLOSED, False, True),
        ("close an open model", OPEN, CLOSED, False, True),
        ("add required property", CLOSED, with_b(CLOSED, required=["b"]), False, False),
        ("drop a required name", with_b(CLOSED, required=["b"]), with_b(CLOSED), True, False),
        ("widen integer to number", {"type": "integer"}, {"type": "number"}, True, False),
        (
            "narrow string to enum",
            {"type": "string"},
            {"type": "string", "enum": ["x"]},
            False,
            True,
        ),
        (
            "extend an enum",
            {"type": "string", "enum": ["x"]},
            {"type": "string", "enum": ["x", "y"]},
            True,
            False,
        ),
        ("add maxLength", {"type": "string"}, {"type": "string", "maxLength": 4}, False, True),
        (
            "anyOf gains an alternative",
            {"type": "string"},
            {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            True,
            False,
        ),
        (
            "items narrowed",
            {"type": "array", "items": {"type": "number"}},
            {"type": "array", "items": {"type": "integer"}},
            False,
            True,
        ),
    ],
)
def test_json_schema_rules(
    change: str, old: dict[str, object], new: dict[str, object], backward: bool, forward: bool
) -> None:
    assert compatible("BACKWARD", js(new), js(old)) is backward, change
    assert compatible("FORWARD", js(new), js(old)) is forward, change


def proto(body: str, package: str = "demo") -> ParsedSchema:
    return parse_schema("PROTOBUF", f'syntax = "proto3";\npackage {package};\n{body}\n')


@pytest.mark.parametrize(
    ("change", "old", "new", "ok"),
    [
        (
            "add field",
            "message M { string a = 1; }",
            "message M { string a = 1; int32 b = 2; }",
            True,
        ),
        (
            "remove field",
            "message M { string a = 1; int32 b = 2; }",
            "message M { string a = 1; }",
            True,
        ),
        ("rename field", "message M { string a = 1; }", "message M { string z = 1; }", True),
        ("int32 to int64", "message M { int32 a = 1; }", "message M { int64 a = 1; }", True),
        ("string to int32", "message M { string a = 1; }", "message M { int32 a = 1; }", False),
        (
            "make repeated (a string: Confluent allows it)",
            "message M { string a = 1; }",
            "message M { repeated string a = 1; }",
            True,
        ),
        (
            "remove message",
            "message M { string a = 1; } message N { string b = 1; }",
            "message M { string a = 1; }",
            False,
        ),
        (
            "move two fields into a new oneof",
            "message M { string a = 1; string b = 2; }",
            "message M { oneof o { string a = 1; string b = 2; } }",
            False,
        ),
        (
            "move one field into a new oneof",
            "message M { string a = 1; }",
            "message M { oneof o { string a = 1; } }",
            True,
        ),
    ],
)
def test_protobuf_rules(change: str, old: str, new: str, ok: bool) -> None:
    assert compatible("FULL", proto(new), proto(old)) is ok, change


def test_protobuf_package_change_is_one_change() -> None:
    """Messages are matched by their name in the file: a package rename is PACKAGE_CHANGED
    (incompatible in Confluent's rules too), not every message removed."""
    old, new = proto("message M { string a = 1; }"), proto("message M { string a = 1; }", "other")
    assert check_compatibility("BACKWARD", new, [(1, old)]) == ["version 1: PACKAGE_CHANGED at #/"]


def test_types_never_mix() -> None:
    assert check_compatibility("NONE", js({}), [(1, avro(F1))]) == [
        "version 1: schema type AVRO cannot become JSON"
    ]


@pytest.mark.parametrize(
    ("schema_type", "text"),
    [
        ("AVRO", '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}'),
        ("AVRO", "not json"),
        ("JSON", '{"type": 12}'),
        ("PROTOBUF", 'syntax = "proto3"; message M { strin a = 1; }'),
        ("PROTOBUF", 'syntax = "proto3";'),
        ("XML", "<a/>"),
    ],
)
def test_malformed_schemas_are_invalid(schema_type: str, text: str) -> None:
    with pytest.raises(InvalidSchemaError):
        parse_schema(schema_type, text)


def test_values_that_do_not_fit_are_refused() -> None:
    with pytest.raises(RecordSchemaError, match="record 1"):
        avro(F1).encode([{"f1": "ok"}, {"f1": 5}])
    with pytest.raises(RecordSchemaError, match="not of type 'string' at /a"):
        js(OPEN).encode([{"a": 1}])
    with pytest.raises(RecordSchemaError, match="record 0"):
        proto("message M { string a = 1; }").encode([{"a": 1}])


def test_round_trips_through_each_format() -> None:
    a = avro(F1, {"name": "u", "type": ["null", "long"], "default": None})
    assert [a.decode(b) for b in a.encode([{"f1": "x", "u": {"long": 5}}])] == [
        {"f1": "x", "u": {"long": 5}}
    ]
    p = proto("message M { string a = 1; int64 n = 2; }")
    (body,) = p.encode([{"a": "x", "n": "7"}])
    assert body[0] == 0  # the message-index array [0]
    assert p.decode(body) == {"a": "x", "n": "7"}


# -- wire format ---------------------------------------------------------------------------


@given(st.integers(0, 2**31 - 1), st.binary(max_size=64))
def test_frame_round_trip(schema_id: int, body: bytes) -> None:
    got_id, rest = unframe(frame(schema_id, body))
    assert (got_id, bytes(rest)) == (schema_id, body)


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=8))
def test_message_indexes_round_trip(indexes: list[int]) -> None:
    data = encode_message_indexes(indexes)
    assert decode_message_indexes(data + b"tail") == (indexes, len(data))


def test_bad_framing_is_refused() -> None:
    assert encode_message_indexes([0]) == b"\x00"
    with pytest.raises(SchemaFramingError):
        unframe(b"\x00\x00")
    with pytest.raises(SchemaFramingError):
        unframe(b"\x01\x00\x00\x00\x01")
    with pytest.raises(SchemaFramingError):
        decode_message_indexes(b"\x04\x80")
