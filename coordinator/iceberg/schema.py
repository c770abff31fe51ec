"""A topic table's shape: Iceberg schema, partition spec, properties and locations (pure).

The schema is the tier format's columns (``segments.tier``), with Iceberg field ids::

    1 key            binary       optional
    2 value          binary       optional
    3 topic          string       required
    4 partition      int          required     (the partition spec: identity(partition))
    5 offset         long         required
    6 timestamp      timestamptz  required     (Parquet TIMESTAMP(MILLIS, UTC))
    7 timestampType  int          required
    8 headers        list<struct<10 key string, 11 value binary>> optional (element 9)

Tier objects carry no Parquet field ids, so the table maps columns by name
(``schema.name-mapping.default``), as Iceberg's spec provides for imported files.
Column metrics: full bounds on partition, offset and timestamp (what engines prune by,
the same columns the tier objects keep statistics for); none on payload columns.

Locations: the table's metadata (metadata files, manifests, manifest lists) lives under
``iceberg/<topic id hex>/metadata/`` in the bucket, beside (never under) the ``tiered/``
and ``segments/`` prefixes that garbage collection lists; data files are the tier objects
at their own keys. A topic deleted and created again is a new table at a new prefix.
"""

from __future__ import annotations

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

#: The namespace every topic table is in: ``<catalog>.topics.<topic>``.
NAMESPACE = "topics"
#: Where the tables' own files live in the bucket.
METADATA_PREFIX = "iceberg/"
#: Snapshot summary key: JSON {database key: last change number the snapshot includes}.
CHANGES_PROPERTY = "lakelog.changes"

TABLE_SCHEMA = Schema(
    NestedField(1, "key", BinaryType(), required=False),
    NestedField(2, "value", BinaryType(), required=False),
    NestedField(3, "topic", StringType(), required=True),
    NestedField(4, "partition", IntegerType(), required=True),
    NestedField(5, "offset", LongType(), required=True),
    NestedField(6, "timestamp", TimestamptzType(), required=True),
    NestedField(7, "timestampType", IntegerType(), required=True),
    NestedField(
        8,
        "headers",
        ListType(
            9,
            StructType(
                NestedField(10, "key", StringType(), required=False),
                NestedField(11, "value", BinaryType(), required=False),
            ),
            element_required=False,
        ),
        required=False,
    ),
)

PARTITION_SPEC = PartitionSpec(
    PartitionField(source_id=4, field_id=1000, transform=IdentityTransform(), name="partition")
)


def table_prefix(topic_id: bytes) -> str:
    """The bucket prefix of a topic table's own files (``iceberg/<topic id hex>/``)."""
    return f"{METADATA_PREFIX}{topic_id.hex()}/"


def table_properties(store_url: str, topic: str, topic_id: bytes) -> dict[str, str]:
    """The properties every topic table is created with."""
    return {
        "schema.name-mapping.default": create_mapping_from_schema(TABLE_SCHEMA).model_dump_json(),
        "write.metadata.path": f"{store_url}/{table_prefix(topic_id)}metadata",
        "write.data.path": f"{store_url}/tiered/{topic}",
        "write.metadata.metrics.default": "none",
        "write.metadata.metrics.column.partition": "full",
        "write.metadata.metrics.column.offset": "full",
        "write.metadata.metrics.column.timestamp": "full",
        # Appends merge small manifests; old metadata files are deleted as they age out.
        "commit.manifest-merge.enabled": "true",
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "20",
        # Outside engines read; only lakelog writes (the REST catalog refuses commits).
        "lakelog.topic": topic,
        "lakelog.topic-id": topic_id.hex(),
        "lakelog.read-only": "true",
    }
