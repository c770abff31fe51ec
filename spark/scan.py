"""Executing a scan task: read its objects, yield Arrow record batches.

Segment chunks: the chunks of one object that lie close together are fetched with one
ranged GET, decoded with :func:`segments.segment.decode_chunk` and turned into columns.
Parquet tier objects are read with ranged GETs through pyarrow: the tail first (its CRC
is checked before pyarrow parses the footer, as :class:`segments.tier.TierReader` does),
then only the row groups that overlap the slice and pass the timestamp bounds, and only
the columns asked for. Rows outside the slice's offsets or the timestamp bounds are
dropped, so a task never returns a record past the planning snapshot.

Batches carry the Spark Arrow schema of the requested columns (every field nullable,
timestamps in microseconds, UTC), which is what Spark's Python data source checks.

No pyspark here.
"""

from __future__ import annotations

import io
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from segments.errors import CorruptSegmentError, ObjectNotFoundError
from segments.segment import decode_chunk
from segments.store import ObjectStore
from segments.tier import TIER_SCHEMA
from segments.types import ChunkRef
from spark.plan import Bounds, ScanTask, Slice

__all__ = [
    "COLUMNS",
    "SPARK_ARROW_SCHEMA",
    "ScanStats",
    "first_offset_at_or_after",
    "read_task",
    "tier_row_groups",
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
# The first ranged GET of a Parquet object: its tail, usually footer and page index.
_TAIL_BYTES = 64 << 10
_INTEGRITY_PREFIX = b"lklcrc1:"


@dataclass(slots=True)
class ScanStats:
    """What one task read: the figures the ``trace`` option records."""

    objects_opened: int = 0
    gets: int = 0
    bytes_read: int = 0
    row_groups_read: int = 0
    row_groups_skipped: int = 0
    records: int = 0

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
    stats.gets += 1
    stats.bytes_read += len(data)
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
        for off, rec in decode_chunk(chunk, s.base_offset, s.record_count, s.max_decompressed):
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


class _RangedFile(io.RawIOBase):
    """A read-only file over one object: ranged GETs, with the tail already in memory."""

    def __init__(
        self, store: ObjectStore, key: str, size: int, tail: bytes, stats: ScanStats
    ) -> None:
        super().__init__()
        self._store, self._key, self._size = store, key, size
        self._tail, self._tail_at = tail, size - len(tail)
        self._pos = 0
        self._stats = stats

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._size - self._pos)
        if want <= 0:
            return 0
        if self._pos >= self._tail_at:
            at = self._pos - self._tail_at
            data = self._tail[at : at + want]
        else:
            data = self._store.get_range(self._key, self._pos, want)
            self._stats.gets += 1
            self._stats.bytes_read += len(data)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _checked_tail(store: ObjectStore, key: str, size: int, stats: ScanStats) -> bytes:
    """The object's tail from the first row group's end on, its lakelog CRC verified.

    pyarrow aborts the process on some corrupt footers, so nothing reaches it unchecked
    (the marker's format is documented in ``segments.tier``).

    Raises:
        CorruptSegmentError: no Parquet trailer, no single marker, a CRC mismatch.
    """

    def fetch(start: int) -> bytes:
        data = store.get_range(key, start, size - start)
        stats.gets += 1
        stats.bytes_read += len(data)
        if len(data) != size - start:
            raise CorruptSegmentError(f"{key}: object is shorter than the index says ({size})")
        return data

    if size < 12:
        raise CorruptSegmentError(f"tier object {key}: {size} bytes is no Parquet object")
    tail_at = max(0, size - _TAIL_BYTES)
    tail = fetch(tail_at)
    if tail[-4:] != b"PAR1":
        raise CorruptSegmentError(f"tier object {key}: not a Parquet object (magic)")
    footer_len = int.from_bytes(tail[-8:-4], "little")
    footer_at = size - 8 - footer_len
    if footer_at < 4:
        raise CorruptSegmentError(f"tier object {key}: footer length {footer_len} does not fit")
    if footer_at < tail_at:
        tail_at, tail = footer_at, fetch(footer_at)
    footer = tail[footer_at - tail_at : -8]
    at = footer.find(_INTEGRITY_PREFIX)
    if at < 0 or footer.find(_INTEGRITY_PREFIX, at + 1) >= 0:
        raise CorruptSegmentError(f"tier object {key}: no single integrity marker in the footer")
    value = footer[at + len(_INTEGRITY_PREFIX) : at + len(_INTEGRITY_PREFIX) + 29]
    try:
        if len(value) != 29 or value[20:21] != b":":
            raise ValueError(value)
        covered_from, crc = int(value[:20]), int(value[21:], 16)
    except ValueError:
        raise CorruptSegmentError(f"tier object {key}: bad integrity marker {value!r}") from None
    if not 4 <= covered_from <= footer_at:
        raise CorruptSegmentError(f"tier object {key}: marker covers from {covered_from}")
    if covered_from < tail_at:
        tail_at, tail = covered_from, fetch(covered_from)
    crc_at = footer_at - tail_at + at + len(_INTEGRITY_PREFIX) + 21
    start = covered_from - tail_at
    actual = zlib.crc32(tail[start:crc_at])
    actual = zlib.crc32(b"00000000", actual)
    actual = zlib.crc32(tail[crc_at + 8 : len(tail) - 4], actual)
    if actual != crc:
        raise CorruptSegmentError(f"tier object {key}: footer CRC mismatch")
    return tail


def _stat(group: Any, column: int) -> tuple[int, int]:
    stats = group.column(column).statistics
    if stats is None or not stats.has_min_max:
        raise CorruptSegmentError(f"row group without statistics on column {column}")
    lo, hi = stats.min_raw, stats.max_raw
    return int(lo), int(hi)


_OFFSET_COL = TIER_SCHEMA.names.index("offset")
_TS_COL = TIER_SCHEMA.names.index("timestamp")


def _open_tier(store: ObjectStore, s: Slice, stats: ScanStats) -> pq.ParquetFile:
    """The slice's tier object, its footer checked (CRC, schema, topic-partition).

    Only the tail is fetched here; row groups are fetched when read.

    Raises:
        CorruptSegmentError: see :func:`_checked_tail`; another schema or topic-partition.
        pa.ArrowException, OSError: pyarrow refuses the footer.
    """
    tail = _checked_tail(store, s.object_key, s.length, stats)
    source = _RangedFile(store, s.object_key, s.length, tail, stats)
    pf = pq.ParquetFile(source, pre_buffer=True, page_checksum_verification=True)
    kv = {k.decode(): v.decode() for k, v in (pf.metadata.metadata or {}).items()}
    if not pf.schema_arrow.equals(TIER_SCHEMA, check_metadata=False):
        raise CorruptSegmentError(f"{s.object_key}: not the tier schema")
    if kv.get("lakelog.topic") != s.topic or kv.get("lakelog.partition") != str(s.partition):
        raise CorruptSegmentError(
            f"{s.object_key}: holds {kv.get('lakelog.topic')}-{kv.get('lakelog.partition')}"
            f", the index says {s.topic}-{s.partition}"
        )
    return pf


def tier_row_groups(store: ObjectStore, s: Slice) -> list[tuple[int, int, int]]:
    """(first offset, last offset, compressed bytes) of every row group of a tier object.

    What the planner cuts a big tier object into task-sized pieces with: one ranged GET
    of the object's tail.

    Raises:
        CorruptSegmentError: the footer fails its checks.
        ObjectNotFoundError: the object is gone.
    """
    try:
        md = _open_tier(store, s, ScanStats()).metadata
        out = []
        for i in range(md.num_row_groups):
            group = md.row_group(i)
            first, last = _stat(group, _OFFSET_COL)
            size = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
            out.append((first, last, size))
        return out
    except (pa.ArrowException, OSError) as exc:
        raise CorruptSegmentError(f"tier object {s.object_key}: {exc}") from exc


def _parquet_batches(
    store: ObjectStore,
    s: Slice,
    columns: Sequence[str],
    bounds: Bounds,
    stats: ScanStats,
) -> Iterator[pa.RecordBatch]:
    """One Parquet slice: tail, then the row groups that may hold wanted rows."""
    try:
        pf = _open_tier(store, s, stats)
        md = pf.metadata
        wanted: list[int] = []
        for i in range(md.num_row_groups):
            group = md.row_group(i)
            first, last = _stat(group, _OFFSET_COL)
            if not s.rg_lo <= first < s.rg_hi or last < s.lo or first >= s.hi:
                continue
            ts_lo, ts_hi = _stat(group, _TS_COL)
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
    s = Slice(
        topic,
        partition,
        ref.kind,
        ref.object_key,
        ref.position,
        ref.length,
        ref.base_offset,
        ref.record_count,
        max(ref.base_offset, from_offset),
        ref.end_offset,
    )
    bounds = Bounds(min_ts=ts)
    for batch in read_task(store, ScanTask((s,)), ("offset",), bounds):
        if batch.num_rows:
            return int(batch.column(0)[0].as_py())
    return None
