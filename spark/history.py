"""Reads through a topic's table: as of a time or a snapshot, and the latest value per key.

``asOfTimestamp`` / ``asOfSnapshot``: the topic as its table held it then, records that
retention, DeleteRecords or compaction have dropped since included (while the snapshot
is retained: ``table.snapshot.retention.ms``). The snapshot's data files are the tier
objects themselves; each becomes a Parquet slice of the usual scan tasks (offset range
from the file's statistics, clipped by ``startingOffsets``/``endingOffsets``), read by
the same task code as a live read. The table comes from the coordinator's Iceberg REST
catalog (``<coordinator>/iceberg``, with the job's credential) or, with ``db``, from the
database directly.

``latestByKey``: Kafka's compaction as a view: per topic-partition the record with the
highest offset of each key; a key whose latest record is a tombstone (null value) is
absent, and keyless records are left out. Tasks are one per topic-partition (a key lives
in one partition), reduced with pyarrow.

No pyspark here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.client import StoreLocation
from index.plan import Bounds, ScanTask, Slice, pack_slices
from segments.store import absolute_store_url
from spark.options import EARLIEST, LATEST, ReadOptions

__all__ = ["by_partition", "latest_by_key", "plan_history", "table_catalog"]

_OFFSET_FIELD = 5  # the offset column's Iceberg field id (coordinator.iceberg.schema)
NAMESPACE = "topics"


@contextmanager
def table_catalog(opts: ReadOptions, location: StoreLocation) -> Iterator[Any]:
    """A pyiceberg catalog of the topic tables: the coordinator's REST catalog, or (with
    ``db``) one over the database and store directly."""
    conn = opts.connection
    if conn.coordinator is not None:
        from pyiceberg.catalog import load_catalog

        props: dict[str, Any] = {
            "type": "rest",
            "uri": conn.coordinator.split(",")[0].strip().rstrip("/") + "/iceberg",
        }
        if conn.user is not None:
            props["auth"] = {
                "type": "basic",
                "basic": {"username": conn.user, "password": conn.password or ""},
            }
        if location.endpoint:
            props["s3.endpoint"] = location.endpoint
        if location.region:
            props["s3.region"] = location.region
        yield load_catalog("lakelog", **props)
        return
    from coordinator.iceberg.tables import TopicTables
    from spark.connect import get_store, opened

    with opened(conn) as coordinator:
        catalog = coordinator.janitor_catalog()  # type: ignore[attr-defined]
        yield TopicTables(catalog, get_store(location)).iceberg


def _offset(raw: bytes) -> int:
    return int.from_bytes(raw, "little", signed=True)


def plan_history(
    opts: ReadOptions, catalog: Any, location: StoreLocation, bounds: Bounds
) -> list[ScanTask]:
    """Scan tasks over the table snapshot the options name, for every subscribed topic.

    Raises:
        ValueError: a topic without a table, or no snapshot at that time or with that id
            (too early, or expired).
    """
    from pyiceberg.exceptions import NoSuchTableError

    if opts.topics is not None:
        topics = list(opts.topics)
    else:
        pattern = re.compile(opts.pattern or "")
        topics = [t for _, t in catalog.list_tables(NAMESPACE) if pattern.fullmatch(t)]
    root = absolute_store_url(location.url).rstrip("/") + "/"
    slices: list[Slice] = []
    for topic in topics:
        if bounds.topics is not None and topic not in bounds.topics:
            continue
        try:
            table = catalog.load_table((NAMESPACE, topic))
        except NoSuchTableError:
            raise ValueError(f"topic {topic!r} has no table (no such topic?)") from None
        if opts.as_of_snapshot is not None:
            snapshot = table.snapshot_by_id(opts.as_of_snapshot)
        else:
            snapshot = table.snapshot_as_of_timestamp(opts.as_of_timestamp)
        if snapshot is None:
            kept = sorted(s.timestamp_ms for s in table.snapshots())
            raise ValueError(
                f"topic {topic!r}: no table snapshot "
                + (
                    f"{opts.as_of_snapshot}"
                    if opts.as_of_snapshot is not None
                    else f"as of {opts.as_of_timestamp} ms"
                )
                + f" (retained snapshots from {kept[0] if kept else 'none'} ms; older ones "
                "expired, see table.snapshot.retention.ms)"
            )
        for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
            f = task.file
            partition = int(f.partition[0])
            if bounds.partitions is not None and partition not in bounds.partitions:
                continue
            if not f.file_path.startswith(root):
                raise ValueError(f"table file {f.file_path} is not in the store {root}")
            first = _offset(f.lower_bounds[_OFFSET_FIELD])
            end = _offset(f.upper_bounds[_OFFSET_FIELD]) + 1
            lo, hi = _clip(opts, topic, partition, first, end, bounds)
            if lo < hi:
                key = f.file_path[len(root) :]
                slices.append(
                    Slice(
                        topic,
                        partition,
                        "parquet",
                        key,
                        0,
                        f.file_size_in_bytes,
                        first,
                        end - first,
                        lo,
                        hi,
                    )
                )
    from spark.connect import get_store

    slices.sort(key=lambda s: (s.topic, s.partition, s.lo))
    return pack_slices(slices, opts.max_bytes_per_task, get_store(location))


def _clip(
    opts: ReadOptions, topic: str, partition: int, lo: int, hi: int, bounds: Bounds
) -> tuple[int, int]:
    """A file's offsets [lo, hi) within startingOffsets/endingOffsets and the bounds."""
    if isinstance(opts.starting, dict):
        start = opts.starting.get(topic, {}).get(partition, EARLIEST)
        if start != EARLIEST:
            lo = max(lo, start)
    if isinstance(opts.ending, dict):
        end = opts.ending.get(topic, {}).get(partition, LATEST)
        if end != LATEST:
            hi = min(hi, end)
    if bounds.min_offset is not None:
        lo = max(lo, bounds.min_offset)
    if bounds.max_offset is not None:
        hi = min(hi, bounds.max_offset + 1)
    return lo, hi


def by_partition(tasks: Sequence[ScanTask]) -> list[ScanTask]:
    """The same slices, one task per topic-partition (for ``latestByKey``)."""
    groups: dict[tuple[str, int], list[Slice]] = {}
    for task in tasks:
        for s in task.slices:
            groups.setdefault((s.topic, s.partition), []).append(s)
    return [
        ScanTask(tuple(sorted(v, key=lambda s: (s.lo, s.object_key))))
        for _, v in sorted(groups.items())
    ]


def latest_by_key(table: pa.Table) -> pa.Table:
    """Per key, the row with the highest offset; tombstones (null values) and keyless rows
    dropped. ``table`` holds one topic-partition's rows, with key, value and offset."""
    keyed = table.filter(pc.is_valid(table.column("key")))
    if keyed.num_rows == 0:
        return keyed
    latest = keyed.group_by("key").aggregate([("offset", "max")])
    wanted = pc.is_in(keyed.column("offset"), value_set=latest.column("offset_max"))
    # Offsets are unique within a partition: the max offsets name exactly the latest rows.
    rows = keyed.filter(wanted)
    return rows.filter(pc.is_valid(rows.column("value"))).sort_by("offset")
