"""Decode Confluent-framed Avro keys or values in a Spark job, with the registry's schemas.

Records produced with a schema (REST avro produce, Confluent's ``AvroSerializer``) hold
Confluent's wire format: magic byte 0, a 4-byte schema id, the Avro body. Spark's own
``from_avro`` needs the ``spark-avro`` package (not in the pyspark wheel) and does not
read that framing, so this module decodes in Python with fastavro::

    from spark.avro_values import with_avro_values

    df = session.read.format("lakelog").option(...).option("subscribe", "orders").load()
    orders = with_avro_values(df, "http://agent:8082", subject="orders-value")
    orders.select("offset", "value_avro.id", "value_avro.item").show()

``with_avro_values`` asks the registry (any agent) for the reader schema once, on the
driver: ``subject``'s latest version, a given ``version``, or ``schema_id``. It adds a
struct column (``<column>_avro`` unless ``output`` names another) typed from that
schema. On the executors each value's writer schema is fetched by the id in its
header, once per id and process, and fastavro resolves writer to reader (Avro's
schema resolution), so values written with older compatible versions read as the
reader schema. A null value stays null; a value that is not in the wire format, or
whose writer schema cannot be resolved to the reader's, fails the task.

JSON Schema values need no library: ``from_json(expr("cast(substring(value, 6) as
string)"), ddl)`` reads their JSON body (bytes 6 on, after the 5-byte header).

The Avro to Spark mapping is Spark's own (``from_avro``: ``SchemaConverters`` and
``AvroDeserializer`` in ``spark-avro``, which the pyspark wheel lacks), re-implemented:

- ``date`` -> date; ``timestamp-millis``/``-micros`` -> timestamp; ``local-timestamp-millis``
  /``-micros`` -> timestamp_ntz; ``decimal`` on bytes or fixed -> decimal(p, s); other logical
  types keep their base type as Spark does (``time-millis`` int, ``time-micros`` long,
  ``uuid`` string, ``duration`` binary); a logical type on the wrong base type is ignored;
- enum -> string, fixed -> binary, record -> struct, array, map<string, _>;
- unions: with null, nullable; one other branch -> that type; ``[int, long]`` -> long,
  ``[float, double]`` -> double; any other -> struct ``member0``, ``member1``, ... (null not
  counted) with the branch the value took set and the others null.

Values are decoded raw (no logical types) and converted here, so each value is exactly
the type its column declares; which union branch a value took is told by fastavro (named
types) or by a marker on the writer's branch (int/long, float/double look alike in Python).
References of a schema (``references``) are fetched and their named types loaded first.
This module depends on the registry's HTTP API only, never on ``service/``.
"""

from __future__ import annotations

import copy
import datetime as dt
import io
import json
import struct
import urllib.parse
import urllib.request
from decimal import Decimal
from typing import Any

import fastavro
from fastavro.read import LOGICAL_READERS

_HEADER = struct.Struct(">bI")
#: (registry URL, schema id) -> (raw writer schema, parsed, its named types)
_WRITERS: dict[tuple[str, int], Any] = {}
_PRIMITIVE = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
_NAMED = ("record", "enum", "fixed", "error")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_NTZ = dt.datetime(1970, 1, 1)
_MARK = "lakelog-union-branch"


class _Branch:
    """A union value with the reader branch it took (set by the marker's logical reader)."""

    __slots__ = ("index", "value")

    def __init__(self, index: int, value: Any) -> None:
        self.index, self.value = index, value


def _marked(data: Any, writer: Any, reader: Any) -> Any:
    index = reader.get("lakelog.branch") if isinstance(reader, dict) else None
    return data if index is None else _Branch(index, data)


for _number in ("int", "long", "float", "double"):
    LOGICAL_READERS[f"{_number}-{_MARK}"] = _marked


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _schema_doc(base: str, path: str) -> dict[str, Any]:
    doc = _get_json(f"{base}{path}")
    if doc.get("schemaType", "AVRO") != "AVRO":
        raise ValueError(f"{path} holds a {doc['schemaType']} schema, not Avro")
    return dict(doc)


def fetch_schema(
    registry_url: str,
    *,
    subject: str | None = None,
    version: int | str = "latest",
    schema_id: int | None = None,
) -> tuple[int, str]:
    """(schema id, Avro schema text) from the registry: by id, or a subject's version."""
    sid, text, _ = _fetch(registry_url, subject=subject, version=version, schema_id=schema_id)
    return sid, text


def _fetch(
    registry_url: str,
    *,
    subject: str | None = None,
    version: int | str = "latest",
    schema_id: int | None = None,
) -> tuple[int, str, list[Any]]:
    """(id, text, the documents of its references, deepest first)."""
    base = registry_url.rstrip("/")
    if schema_id is not None:
        doc = _schema_doc(base, f"/schemas/ids/{schema_id}")
        sid = schema_id
    elif subject is not None:
        quoted = urllib.parse.quote(subject, safe="")
        doc = _schema_doc(base, f"/subjects/{quoted}/versions/{version}")
        sid = int(doc["id"])
    else:
        raise ValueError("give a subject or a schema_id")
    deps: list[Any] = []
    for ref in doc.get("references") or []:
        _, text, inner = _fetch(base, subject=ref["subject"], version=ref["version"])
        deps += [*inner, json.loads(text)]
    return sid, str(doc["schema"]), deps


def _named(deps: list[Any]) -> dict[str, Any]:
    named: dict[str, Any] = {}
    for dep in deps:
        fastavro.parse_schema(dep, named_schemas=named)
    return named


def _strip_logical(node: Any, in_union: bool = False) -> Any:
    """A writer schema without logical types (values decode raw); the number branches of
    unions get the marker logical type instead, which tags their values with the branch."""
    if isinstance(node, list):
        return [_strip_logical(n, True) for n in node]
    if isinstance(node, str):
        if in_union and node in ("int", "long", "float", "double"):
            return {"type": node, "logicalType": _MARK}
        return node
    out = {k: v for k, v in node.items() if k != "logicalType"}
    kind = out.get("type")
    if kind in ("record", "error"):
        out["fields"] = [{**f, "type": _strip_logical(f["type"])} for f in out["fields"]]
    elif kind == "array":
        out["items"] = _strip_logical(out["items"])
    elif kind == "map":
        out["values"] = _strip_logical(out["values"])
    elif isinstance(kind, (dict, list)):
        out["type"] = _strip_logical(kind)
    elif in_union and kind in ("int", "long", "float", "double"):
        out["logicalType"] = _MARK
    return out


def _writer(registry_url: str, schema_id: int) -> Any:
    key = (registry_url, schema_id)
    found = _WRITERS.get(key)
    if found is None:
        _, text, deps = _fetch(registry_url, schema_id=schema_id)
        named = _named([_strip_logical(d) for d in deps])
        found = fastavro.parse_schema(_strip_logical(json.loads(text)), named_schemas=named)
        _WRITERS[key] = found
    return found


class _Reader:
    """A reader schema: the document Spark's types come from, and fastavro's parsed form with
    each union branch numbered (``lakelog.branch``, counting non-null branches)."""

    def __init__(self, doc: Any, deps: list[Any]) -> None:
        self.doc = doc
        self.named: dict[str, Any] = {}
        for dep in deps:
            self._collect(dep, None)
        self._collect(doc, None)
        named: dict[str, Any] = {}
        for dep in deps:
            fastavro.parse_schema(self._numbered(dep), named_schemas=named)
        self.parsed = fastavro.parse_schema(self._numbered(doc), named_schemas=named)

    def _collect(self, node: Any, space: str | None) -> None:
        if isinstance(node, list):
            for n in node:
                self._collect(n, space)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in _NAMED:
                full = _fullname(node, space)
                self.named[full] = node
                space = full.rpartition(".")[0] or None
            for key in ("fields",):
                for f in node.get(key, []):
                    self._collect(f["type"], space)
            for key in ("items", "values"):
                if key in node:
                    self._collect(node[key], space)
            if isinstance(kind, (dict, list)):
                self._collect(kind, space)

    def _numbered(self, node: Any) -> Any:
        node = copy.deepcopy(node)

        def walk(n: Any) -> Any:
            if isinstance(n, list):
                members = [b for b in n if b != "null"]
                out = []
                for b in n:
                    b = walk(b)
                    # Only numbers need the branch told (int/long, float/double look alike
                    # in Python); other branches stay as written, so resolution is unchanged.
                    if _base(b)[0] in ("int", "long", "float", "double") and b in members:
                        index = members.index(b)
                        b = {"type": b} if isinstance(b, str) else b
                        b["lakelog.branch"] = index
                    out.append(b)
                return out
            if isinstance(n, dict):
                if n.get("type") in ("record", "error"):
                    n["fields"] = [{**f, "type": walk(f["type"])} for f in n["fields"]]
                for key in ("items", "values"):
                    if key in n:
                        n[key] = walk(n[key])
            return n

        return walk(node)

    def resolve(self, node: Any, space: str | None) -> tuple[Any, str | None]:
        """A named reference's definition (and its namespace); others as they are."""
        if isinstance(node, str) and node not in _PRIMITIVE:
            full = node if "." in node or space is None else f"{space}.{node}"
            found = self.named.get(full) or self.named.get(node)
            if found is None:
                raise ValueError(f"unknown Avro type {node!r}")
            return found, _fullname(found, space).rpartition(".")[0] or None
        if isinstance(node, dict) and node.get("type") in _NAMED:
            return node, _fullname(node, space).rpartition(".")[0] or None
        if isinstance(node, dict) and not isinstance(node.get("type"), str):
            return self.resolve(node["type"], space)
        return node, space


def _is_named_ref(node: Any) -> bool:
    return isinstance(node, str) and node not in _PRIMITIVE


def _fullname(node: dict[str, Any], space: str | None) -> str:
    name = str(node["name"])
    if "." in name:
        return name
    ns = node.get("namespace", space)
    return f"{ns}.{name}" if ns else name


def _base(node: Any) -> tuple[str, dict[str, Any]]:
    """(Avro type name, the node's attributes) of a resolved node."""
    if isinstance(node, str):
        return node, {}
    if isinstance(node, list):
        return "union", {}
    return str(node["type"]), node


def _decimal_of(attrs: dict[str, Any], kind: str) -> tuple[int, int] | None:
    """(precision, scale) of a valid decimal logical type, as Avro validates it."""
    if attrs.get("logicalType") != "decimal":
        return None
    precision, scale = attrs.get("precision"), attrs.get("scale", 0)
    if not isinstance(precision, int) or precision <= 0 or not isinstance(scale, int):
        return None
    if scale < 0 or scale > precision:
        return None
    if kind == "fixed" and precision > int((8 * attrs["size"] - 1) * 0.30102999566398):
        return None
    return precision, scale


def _union_members(node: list[Any]) -> list[Any]:
    return [b for b in node if b != "null"]


def _union_shape(reader: _Reader, node: list[Any], space: str | None) -> str:
    """``single``, ``long``, ``double`` or ``struct`` (see the module docstring)."""
    members = _union_members(node)
    if len(members) == 1:
        return "single"
    kinds = {_base(reader.resolve(m, space)[0])[0] for m in members}
    if len(members) == 2 and kinds == {"int", "long"}:
        return "long"
    if len(members) == 2 and kinds == {"float", "double"}:
        return "double"
    return "struct"


def spark_ddl(schema: Any, named: dict[str, Any] | None = None) -> str:
    """The Spark SQL type (DDL) ``from_avro`` gives an Avro schema (JSON form)."""
    reader = _Reader.__new__(_Reader)
    reader.named = dict(named or {})
    reader._collect(schema, None)
    return _ddl(reader, schema, None, set())


def _ddl(reader: _Reader, node: Any, space: str | None, records: set[str]) -> str:
    node, space = reader.resolve(node, space)
    kind, attrs = _base(node)
    if kind == "union":
        members = _union_members(node)
        shape = _union_shape(reader, node, space)
        if not members:
            return "void"
        if shape == "single":
            return _ddl(reader, members[0], space, records)
        if shape in ("long", "double"):
            return "bigint" if shape == "long" else "double"
        fields = ", ".join(
            f"member{i}: {_ddl(reader, m, space, records)}" for i, m in enumerate(members)
        )
        return f"struct<{fields}>"
    logical = attrs.get("logicalType")
    if kind == "int":
        return "date" if logical == "date" else "int"
    if kind == "long":
        if logical in ("timestamp-millis", "timestamp-micros"):
            return "timestamp"
        if logical in ("local-timestamp-millis", "local-timestamp-micros"):
            return "timestamp_ntz"
        return "bigint"
    if kind in ("bytes", "fixed"):
        decimal = _decimal_of(attrs, kind)
        return f"decimal({decimal[0]},{decimal[1]})" if decimal else "binary"
    simple = {"null": "void", "boolean": "boolean", "float": "float", "double": "double"}
    if kind in simple:
        return simple[kind]
    if kind in ("string", "enum"):
        return "string"
    if kind in ("record", "error"):
        full = _fullname(attrs, space)
        if full in records:
            raise ValueError(f"recursive Avro record {full}: Spark cannot type it")
        inner = records | {full}
        sub_space = full.rpartition(".")[0] or None
        fields = ", ".join(
            f"`{f['name']}`: {_ddl(reader, f['type'], sub_space, inner)}" for f in attrs["fields"]
        )
        return f"struct<{fields}>"
    if kind == "array":
        return f"array<{_ddl(reader, attrs['items'], space, records)}>"
    if kind == "map":
        return f"map<string, {_ddl(reader, attrs['values'], space, records)}>"
    raise ValueError(f"unsupported Avro type {kind!r}")


def _convert(reader: _Reader, node: Any, space: str | None, value: Any) -> Any:
    """A raw decoded value as the Python value of its Spark type (see the module docstring)."""
    if value is None:
        return None
    node, space = reader.resolve(node, space)
    kind, attrs = _base(node)
    if kind == "union":
        members = _union_members(node)
        shape = _union_shape(reader, node, space)
        index: int | None = None
        if isinstance(value, _Branch):
            index, value = value.index, value.value
        elif isinstance(value, tuple):  # a named type, by its (reader) name
            name, value = value
            index = _named_branch(reader, members, space, name)
        else:
            index = _branch_of(reader, members, space, value)
        member = members[index]
        converted = _convert(reader, member, space, value)
        if shape == "single":
            return converted
        if shape == "long":
            return int(converted)
        if shape == "double":
            return float(converted)
        out: dict[str, Any] = {f"member{i}": None for i in range(len(members))}
        out[f"member{index}"] = converted
        return out
    if isinstance(value, _Branch):
        value = value.value
    logical = attrs.get("logicalType")
    if kind == "int":
        return _EPOCH.date() + dt.timedelta(days=value) if logical == "date" else int(value)
    if kind == "long":
        if logical in ("timestamp-millis", "local-timestamp-millis"):
            base = _EPOCH if logical == "timestamp-millis" else _EPOCH_NTZ
            return base + dt.timedelta(milliseconds=value)
        if logical in ("timestamp-micros", "local-timestamp-micros"):
            base = _EPOCH if logical == "timestamp-micros" else _EPOCH_NTZ
            return base + dt.timedelta(microseconds=value)
        return int(value)
    if kind in ("float", "double"):
        return float(value)
    if kind in ("bytes", "fixed"):
        raw = value.encode() if isinstance(value, str) else bytes(value)
        decimal = _decimal_of(attrs, kind)
        if decimal is None:
            return raw
        return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-decimal[1])
    if kind == "string":
        return value.decode() if isinstance(value, bytes) else str(value)
    if kind in ("record", "error"):
        sub_space = _fullname(attrs, space).rpartition(".")[0] or None
        return {
            f["name"]: _convert(reader, f["type"], sub_space, value.get(f["name"]))
            for f in attrs["fields"]
        }
    if kind == "array":
        return [_convert(reader, attrs["items"], space, v) for v in value]
    if kind == "map":
        return {k: _convert(reader, attrs["values"], space, v) for k, v in value.items()}
    return value  # boolean, enum (its symbol)


def _named_branch(reader: _Reader, members: list[Any], space: str | None, name: str) -> int:
    """The branch of a named type, by the name fastavro reports (full or short)."""
    for i, m in enumerate(members):
        node, _ = reader.resolve(m, space)
        named = isinstance(node, dict) and "name" in node
        if named and name in (_fullname(node, space), node["name"]):
            return i
    raise ValueError(f"no union branch named {name!r}")


def _branch_of(reader: _Reader, members: list[Any], space: str | None, value: Any) -> int:
    """The branch of a value whose Python type tells it (each unnamed Avro type appears once
    in a union; int/long and float/double carry a marker instead)."""
    wanted = {
        bool: ("boolean",), str: ("string",), bytes: ("bytes",), list: ("array",),
        dict: ("map",), int: ("int", "long"), float: ("float", "double"),
    }.get(type(value), ())  # fmt: skip
    for i, m in enumerate(members):
        if _base(reader.resolve(m, space)[0])[0] in wanted:
            return i
    raise ValueError(f"no union branch for a {type(value).__name__} value")


def decode(data: bytes | None, registry_url: str, reader: Any) -> Any:
    """One framed Avro value as Python values of ``reader``'s Spark type (None stays None).

    Raises:
        ValueError: the bytes are not in Confluent's wire format.
    """
    if data is None:
        return None
    if len(data) < _HEADER.size or data[0] != 0:
        raise ValueError("value is not in the schema registry's wire format")
    _, schema_id = _HEADER.unpack_from(data)
    writer = _writer(registry_url, schema_id)
    if not isinstance(reader, _Reader):  # a plain schema document
        reader = _Reader(reader, [])
    raw = fastavro.schemaless_reader(
        io.BytesIO(data[_HEADER.size :]), writer, reader.parsed, return_named_type=True
    )
    return _convert(reader, reader.doc, None, raw)


def with_avro_values(
    df: Any,
    registry_url: str,
    *,
    subject: str | None = None,
    version: int | str = "latest",
    schema_id: int | None = None,
    column: str = "value",
    output: str | None = None,
) -> Any:
    """``df`` with a struct column of ``column``'s Avro values decoded (see the module doc)."""
    from pyspark.sql import functions as F

    _, text, deps = _fetch(registry_url, subject=subject, version=version, schema_id=schema_id)
    doc = json.loads(text)
    reader = _Reader(doc, deps)
    spark_type = _ddl(reader, doc, None, set())  # udf() takes a DDL string as its return type

    def decode_one(data: bytes | None) -> Any:
        return decode(data, registry_url, reader)

    udf = F.udf(decode_one, spark_type, useArrow=False)  # rows of dicts; no pandas needed
    return df.withColumn(output or f"{column}_avro", udf(F.col(column)))
