"""Executing a scan task: read its objects, yield Arrow record batches.

Segment chunks: the chunks of one object that lie close together are fetched with one
ranged GET, decoded with :func:`segments.segment.decode_chunk` and turned into columns.
Parquet tier objects are opened with :func:`segments.tier.open_tier` (ranged GETs: the
tail first, its CRC checked before pyarrow parses the footer), then only the row groups
that overlap the slice and pass the timestamp bounds are read, and only the columns asked
for. Rows outside the slice's offsets or the timestamp bounds are dropped, so a task
never returns a record past the planning snapshot.

Batches carry the Spark Arrow schema of the requested columns (every field nullable,
timestamps in microseconds, UTC), which is what Spark's Python data source checks.

No pyspark here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from coordinator.client import ChunkRef
from index.plan import Bounds, ScanTask, Slice
from segments.errors import CorruptSegmentError, ObjectNotFoundError
from segments.segment import decode_chunk, drop_aborted, iter_chunk_batches
from segments.store import ObjectStore
from segments.tier import TIER_SCHEMA, group_stat, open_tier

__all__ = [
    "COLUMNS",
    "SPARK_ARROW_SCHEMA",
    "ScanStats",
    "first_offset_at_or_after",
    "read_task",
]

_HEADER_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)

#: What Spark's Python data source expects for the Kafka source columns.
SPARK_ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", _HEADER_TYPE),
    ]
)
COLUMNS = tuple(SPARK_ARROW_SCHEMA.names)

# Chunks of one object closer than this are fetched with one GET (the gap is read and
# thrown away: cheaper than another request on S3).
_COALESCE_GAP = 1 << 20


@dataclass(slots=True)
class ScanStats:
    """What one task read: the figures the ``trace`` option records."""

    objects_opened: int = 0
    gets: int = 0
    bytes_read: int = 0
    row_groups_read: int = 0
    row_groups_skipped: int = 0
    records: int = 0

    def count_get(self, nbytes: int) -> None:
        self.gets += 1
        self.bytes_read += nbytes

    def as_json(self) -> dict[str, int]:
        return {
            "objects_opened": self.objects_opened,
            "gets": self.gets,
            "bytes_read": self.bytes_read,
            "row_groups_read": self.row_groups_read,
            "row_groups_skipped": self.row_groups_skipped,
            "records": self.records,
        }


def append_trace(path: str, event: dict[str, Any]) -> None:
    """One JSON line appended with a single write (O_APPEND), so tasks do not interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, orjson.dumps(event) + b"\n")
    finally:
        os.close(fd)


# --- segment chunks ----------------------------------------------------------------------


def _segment_batch(
    store: ObjectStore,
    group: Sequence[Slice],
    columns: Sequence[str],
    bounds: Bounds,
    stats: ScanStats,
) -> Iterator[pa.RecordBatch]:
    """Slices of one object, in position order, close together: one GET, then decode."""
    start = group[0].position
    end = max(s.position + s.length for s in group)
    data = store.get_range(group[0].object_key, start, end - start)
    stats.count_get(len(data))
    if len(data) != end - start:
        raise CorruptSegmentError(
            f"{group[0].object_key}: {len(data)} bytes at {start}, the index says {end - start}"
        )
    view = memoryview(data)
    want = set(columns)
    min_ts, max_ts = bounds.min_ts, bounds.max_ts
    for s in group:
        chunk = view[s.position - start : s.position + s.length - start]
        # One pass over the decoded records fills only the wanted columns (no per-column
        # passes, no intermediate list of kept records).
        offsets: list[int] = []
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        stamps: list[int] = []
        types: list[int] = []
        headers: list[list[dict[str, Any]] | None] = []
        lo, hi = s.lo, s.hi
        decoded = (
            drop_aborted(
                iter_chunk_batches(chunk, s.base_offset, s.max_decompressed, s.record_count),
                s.aborted,
            )
            if s.aborted
            else decode_chunk(chunk, s.base_offset, s.record_count, s.max_decompressed)
        )
        for off, rec in decoded:
            if off < lo or off >= hi:
                continue
            ts = rec.timestamp_ms
            if (min_ts is not None and ts < min_ts) or (max_ts is not None and ts > max_ts):
                continue
            offsets.append(off)
            stamps.append(ts)
            types.append(rec.timestamp_type)
            keys.append(rec.key)
            values.append(rec.value)
            if "headers" in want:
                headers.append(
                    [{"key": k, "value": v} for k, v in rec.headers] if rec.headers else None
                )
        n = len(offsets)
        if not n:
            continue
        arrays: list[pa.Array] = []
        for name in columns:
            if name == "key":
                arrays.append(pa.array(keys, pa.binary()))
            elif name == "value":
                arrays.append(pa.array(values, pa.binary()))
            elif name == "topic":
                arrays.append(pa.array([s.topic] * n, pa.string()))
            elif name == "partition":
                arrays.append(pa.array([s.partition] * n, pa.int32()))
            elif name == "offset":
                arrays.append(pa.array(offsets, pa.int64()))
            elif name == "timestamp":
                ms = pa.array(stamps, pa.int64())
                arrays.append(pc.multiply(ms, 1000).cast(pa.timestamp("us", tz="UTC")))
            elif name == "timestampType":
                arrays.append(pa.array(types, pa.int32()))
            else:  # headers: null when a record has none, as Spark's Kafka source
                arrays.append(pa.array(headers, _HEADER_TYPE))
        stats.records += n
        yield pa.RecordBatch.from_arrays(arrays, schema=_schema(columns))


def _schema(columns: Sequence[str]) -> pa.Schema:
    return pa.schema([SPARK_ARROW_SCHEMA.field(c) for c in columns])


# --- Parquet tier objects ----------------------------------------------------------------


_OFFSET_COL = TIER_SCHEMA.names.index("offset")
_TS_COL = TIER_SCHEMA.names.index("timestamp")


def _parquet_batches(
    store: ObjectStore,
    s: Slice,
    columns: Sequence[str],
    bounds: Bounds,
    stats: ScanStats,
) -> Iterator[pa.RecordBatch]:
    """One Parquet slice: tail, then the row groups that may hold wanted rows."""
    try:
        pf = open_tier(store, s.object_key, s.length, s.topic, s.partition, stats.count_get)
        md = pf.metadata
        wanted: list[int] = []
        for i in range(md.num_row_groups):
            group = md.row_group(i)
            first, last = group_stat(group, _OFFSET_COL)
            if not s.rg_lo <= first < s.rg_hi or last < s.lo or first >= s.hi:
                continue
            ts_lo, ts_hi = group_stat(group, _TS_COL)
            if not bounds.ts_overlaps(ts_lo, ts_hi):
                continue
            wanted.append(i)
        stats.row_groups_skipped += md.num_row_groups - len(wanted)
        if not wanted:
            return
        read_cols = list(dict.fromkeys([*columns, "offset", "timestamp"]))
        stats.row_groups_read += len(wanted)
        for i in wanted:
            table = pf.read_row_group(i, columns=read_cols)
            yield from _finish(table, s, columns, bounds, stats)
    except (pa.ArrowException, OSError) as exc:
        raise CorruptSegmentError(f"tier object {s.object_key}: {exc}") from exc


def _finish(
    table: pa.Table, s: Slice, columns: Sequence[str], bounds: Bounds, stats: ScanStats
) -> Iterator[pa.RecordBatch]:
    """One row group's table as Spark batches: clipped to the slice, filtered by timestamp.

    Offsets strictly increase within a tier object, so the rows in [lo, hi) are one
    contiguous run: a zero-copy slice instead of a filter that copies every column (a
    full scan keeps every row). Only timestamp bounds need a real filter.
    """
    offsets = table.column("offset")
    n = table.num_rows
    if n and (offsets[0].as_py() < s.lo or offsets[-1].as_py() >= s.hi):
        # Sorted offsets: the number below a bound is where the run starts or ends.
        start = pc.sum(pc.less(offsets, s.lo)).as_py() or 0
        end = pc.sum(pc.less(offsets, s.hi)).as_py() or 0
        table = table.slice(start, end - start)
    if bounds.min_ts is not None or bounds.max_ts is not None:
        ms = table.column("timestamp").cast(pa.int64())
        masks = []
        if bounds.min_ts is not None:
            masks.append(pc.greater_equal(ms, bounds.min_ts))
        if bounds.max_ts is not None:
            masks.append(pc.less_equal(ms, bounds.max_ts))
        table = table.filter(masks[0] if len(masks) == 1 else pc.and_(*masks))
    if table.num_rows == 0:
        return
    schema = _schema(columns)
    # Only the timestamp needs a real cast (ms -> us); the rest already has Spark's types.
    arrays = [
        col if col.type == schema.field(c).type else col.cast(schema.field(c).type)
        for c, col in ((c, table.column(c)) for c in columns)
    ]
    stats.records += table.num_rows
    yield from pa.Table.from_arrays(arrays, schema=schema).to_batches()


# --- tasks -------------------------------------------------------------------------------


def read_task(
    store: ObjectStore,
    task: ScanTask,
    columns: Sequence[str] = COLUMNS,
    bounds: Bounds = Bounds(),
    stats: ScanStats | None = None,
) -> Iterator[pa.RecordBatch]:
    """Every record of the task's slices (within their offsets and the bounds), in order.

    Raises:
        CorruptSegmentError: an object's bytes fail their checks.
        ObjectNotFoundError: an object was deleted since planning: tiering, compaction or
            retention replaced it and garbage collection removed it after its grace
            period (the message says so; never are other rows read instead).
    """
    stats = stats if stats is not None else ScanStats()
    slices = list(task.slices)
    opened: set[str] = set()
    i = 0
    while i < len(slices):
        s = slices[i]
        opened.add(s.object_key)
        group = [s]
        i += 1
        # Following chunks of the same object close after this one: one GET for all.
        while (
            s.kind == "segment"
            and i < len(slices)
            and slices[i].kind == "segment"
            and slices[i].object_key == s.object_key
            and 0 <= slices[i].position - (group[-1].position + group[-1].length) <= _COALESCE_GAP
        ):
            group.append(slices[i])
            i += 1
        try:
            if s.kind == "parquet":
                yield from _parquet_batches(store, s, columns, bounds, stats)
            else:
                yield from _segment_batch(store, group, columns, bounds, stats)
        except ObjectNotFoundError as exc:
            raise ObjectNotFoundError(
                f"{s.object_key} (offsets {s.lo}-{s.hi - 1} of {s.topic}-{s.partition}) was "
                "deleted after this read was planned: tiering, compaction or retention "
                "replaced it and garbage collection removed it once its grace period "
                "(the coordinator's --gc-grace-s) had passed. A read must finish within "
                "that grace period of its planning; run the query again (it plans a new "
                "snapshot) or raise --gc-grace-s"
            ) from exc
    stats.objects_opened = len(opened)


def first_offset_at_or_after(
    store: ObjectStore, topic: str, partition: int, ref: ChunkRef, ts: int, from_offset: int = 0
) -> int | None:
    """In one index entry, the first offset at or after ``from_offset`` (log-start) whose
    timestamp is >= ts (None: none is)."""
    s = Slice.of(topic, partition, ref, max(ref.base_offset, from_offset), ref.end_offset)
    bounds = Bounds(min_ts=ts)
    for batch in read_task(store, ScanTask((s,)), ("offset",), bounds):
        if batch.num_rows:
            return int(batch.column(0)[0].as_py())
    return None
