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

The Avro to Spark type mapping below is hand-written (the JVM's ``SchemaConverters``
lives in ``spark-avro``): primitives, records, arrays, maps, enums (strings), fixed
(binary), nullable unions, ``decimal``, ``date`` and ``timestamp-*`` logical types.
This module depends on the registry's HTTP API only, never on ``service/``.
"""

from __future__ import annotations

import io
import json
import struct
import urllib.parse
import urllib.request
from typing import Any

import fastavro

_HEADER = struct.Struct(">bI")
_WRITERS: dict[tuple[str, int], Any] = {}  # (registry URL, schema id) -> parsed schema


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def fetch_schema(
    registry_url: str,
    *,
    subject: str | None = None,
    version: int | str = "latest",
    schema_id: int | None = None,
) -> tuple[int, str]:
    """(schema id, Avro schema text) from the registry: by id, or a subject's version."""
    base = registry_url.rstrip("/")
    if schema_id is not None:
        doc = _get_json(f"{base}/schemas/ids/{schema_id}")
        return schema_id, str(doc["schema"])
    if subject is None:
        raise ValueError("give a subject or a schema_id")
    quoted = urllib.parse.quote(subject, safe="")
    doc = _get_json(f"{base}/subjects/{quoted}/versions/{version}")
    if doc.get("schemaType", "AVRO") != "AVRO":
        raise ValueError(f"subject {subject} holds a {doc['schemaType']} schema, not Avro")
    return int(doc["id"]), str(doc["schema"])


def _writer(registry_url: str, schema_id: int) -> Any:
    key = (registry_url, schema_id)
    found = _WRITERS.get(key)
    if found is None:
        _, text = fetch_schema(registry_url, schema_id=schema_id)
        found = _WRITERS[key] = fastavro.parse_schema(json.loads(text))
    return found


def decode(data: bytes | None, registry_url: str, reader: Any) -> Any:
    """One framed Avro value as Python values of ``reader`` (None stays None).

    Raises:
        ValueError: the bytes are not in Confluent's wire format.
    """
    if data is None:
        return None
    if len(data) < _HEADER.size or data[0] != 0:
        raise ValueError("value is not in the schema registry's wire format")
    _, schema_id = _HEADER.unpack_from(data)
    writer = _writer(registry_url, schema_id)
    return fastavro.schemaless_reader(io.BytesIO(data[_HEADER.size :]), writer, reader)


_PRIMITIVES = {
    "null": "void",
    "boolean": "boolean",
    "int": "int",
    "long": "bigint",
    "float": "float",
    "double": "double",
    "bytes": "binary",
    "string": "string",
}


def spark_ddl(schema: Any, named: dict[str, Any] | None = None) -> str:
    """The Spark SQL type (DDL) of an Avro schema (JSON form)."""
    named = {} if named is None else named
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        return spark_ddl(named[schema], named)
    if isinstance(schema, list):
        rest = [s for s in schema if s != "null"]
        if len(rest) == 1:
            return spark_ddl(rest[0], named)  # nullable: every Spark field is
        fields = ", ".join(f"member{i}: {spark_ddl(s, named)}" for i, s in enumerate(rest))
        return f"struct<{fields}>"
    kind = schema["type"]
    logical = schema.get("logicalType")
    if logical == "decimal":
        return f"decimal({schema['precision']},{schema.get('scale', 0)})"
    if logical == "date":
        return "date"
    if logical in ("timestamp-millis", "timestamp-micros"):
        return "timestamp"
    if kind in ("record", "enum", "fixed"):
        named[schema["name"]] = schema
        if "namespace" in schema:
            named[f"{schema['namespace']}.{schema['name']}"] = schema
    if kind == "record":
        fields = ", ".join(
            f"`{f['name']}`: {spark_ddl(f['type'], named)}" for f in schema["fields"]
        )
        return f"struct<{fields}>"
    if kind == "enum":
        return "string"
    if kind == "fixed":
        return "binary"
    if kind == "array":
        return f"array<{spark_ddl(schema['items'], named)}>"
    if kind == "map":
        return f"map<string, {spark_ddl(schema['values'], named)}>"
    return spark_ddl(kind, named)


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

    _, text = fetch_schema(registry_url, subject=subject, version=version, schema_id=schema_id)
    doc = json.loads(text)
    reader = fastavro.parse_schema(doc)
    spark_type = spark_ddl(doc)  # udf() takes a DDL string as its return type

    def decode_one(data: bytes | None) -> Any:
        return decode(data, registry_url, reader)

    udf = F.udf(decode_one, spark_type, useArrow=False)  # rows of dicts; no pandas needed
    return df.withColumn(output or f"{column}_avro", udf(F.col(column)))
