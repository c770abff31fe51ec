"""The Parquet tier format: one topic-partition's committed records as one Parquet object.

A pure codec: bytes in, values out (pyarrow does the Parquet work; no I/O, no clock).
The tiering janitor writes these objects; agents serve consumers from them; Spark,
DuckDB and Polars read them directly.

Object key (see :func:`tier_object_key`)::

    tiered/<topic>/partition=<p>/<first offset:020d>-<last offset:020d>.parquet

Columns, in this order: exactly Spark's Kafka source (``KafkaRecordToRowConverter``
with ``includeHeaders=true``)::

    key            binary                    nullable (null key != empty key)
    value          binary                    nullable (null = tombstone)
    topic          string                    required
    partition      int32                     required
    offset         int64                     required; strictly increasing (gaps allowed:
                                             compaction leaves them)
    timestamp      timestamp[ms, tz=UTC]     required; Parquet INT64
                                             TIMESTAMP(MILLIS, isAdjustedToUTC=true), which
                                             Spark maps to TimestampType (not NTZ); Kafka's
                                             millisecond timestamps are kept exactly
    timestampType  int32                     required; 0 = CreateTime, 1 = LogAppendTime
    headers        list<element: struct<key: string, value: binary>>
                                             nullable; null when a record has no headers,
                                             as Spark's Kafka source yields; header values
                                             may be null

Spark declares every column of its Kafka source nullable. We mark the five columns
that can never be null as required: ``spark.read.parquet`` makes every column of a
file source nullable anyway, so Spark sees the same schema, and other readers learn
that those columns hold no nulls.

File layout choices (all standard Parquet, readable by any reader):

- Row groups hold at most ``row_group_rows`` records and about ``row_group_bytes`` of
  payload (key + value + headers, uncompressed), whichever comes first. The defaults
  (131,072 rows, 32 MiB) follow DuckDB's and Spark's scan granularity (~100k+ rows,
  tens of MiB per row group) while keeping the unit a consumer's fetch must read
  small: with zstd a 32 MiB row group is a single ranged GET of ~10-16 MiB.
- Statistics (min/max) on topic, partition, offset, timestamp and timestampType only:
  they are what readers prune by. Key/value statistics would be truncated payload
  bytes that bloat the footer and prune nothing.
- A page index and ``sorting_columns = [offset]`` let Spark (parquet-mr column-index
  filtering) and DuckDB skip pages and trust the order.
- CRC-32 page checksums on every page, verified on read, so that a flipped byte in
  record data raises :class:`CorruptSegmentError` instead of returning wrong records.
- Dictionary encoding only where values repeat (topic, partition, timestampType,
  key, header keys); values are mostly unique and would only pay the fallback.
- Footer key-value metadata (all values are decimal or UTF-8 strings)::

      lakelog.tier.version      "1"
      lakelog.topic             topic name
      lakelog.partition         partition
      lakelog.first_offset      offset of the first record
      lakelog.last_offset       offset of the last record
      lakelog.record_count      number of records (rows)
      lakelog.min_timestamp_ms  over all records
      lakelog.max_timestamp_ms
      lakelog.delete_horizons   (compacted objects holding tombstones only) JSON
                                [[from_offset, horizon_ms], ...] by rising from_offset:
                                the tombstones at offsets from one from_offset up to the
                                next may be dropped by compaction once the clock passes
                                horizon_ms (Kafka's delete horizon, KIP-534: set by the
                                first compaction that saw them, delete.retention.ms on)

      lakelog.integrity         "lklcrc1:<from:020d>:<crc:08x>": CRC-32 (zlib) of the
                                object's tail, bytes [from, size - 4) = page index, footer
                                and footer length, computed with the 8 CRC digits read as
                                "00000000". <from> is where the last row group ends.

Parquet checksums pages but not its footer, and pyarrow's metadata accessors abort the
process (uncaught C++ exceptions) on some corrupt footers. So :class:`TierReader`
checks the tail CRC before pyarrow parses anything, then cross-checks the key-value
metadata against the row-group statistics and row counts, and each row group it reads
against its statistics (first/last offset, row count). The tail is what a ranged reader
fetches first anyway, so the check costs no extra read. A single flipped byte anywhere
in the object either raises :class:`CorruptSegmentError` or changes nothing a reader
sees (page headers are not covered by a CRC; pyarrow refuses the ones that matter).
"""

from __future__ import annotations

import bisect
import io
import itertools
import json
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from segments.errors import CorruptSegmentError
from segments.store import ObjectStore
from segments.types import ConsumedRecord, Headers, Record

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_ROW_GROUP_BYTES",
    "DEFAULT_ROW_GROUP_ROWS",
    "TIER_FORMAT_VERSION",
    "TIER_SCHEMA",
    "TIMESTAMP_TYPE_CREATE_TIME",
    "TierReader",
    "TierRowGroup",
    "encode_tier",
    "tier_object_key",
]

TIER_FORMAT_VERSION = 1
DEFAULT_ROW_GROUP_ROWS = 131_072
DEFAULT_ROW_GROUP_BYTES = 32 << 20
COMPRESSIONS = ("none", "snappy", "gzip", "lz4", "zstd")
TIMESTAMP_TYPE_CREATE_TIME = 0

HEADERS_TYPE = pa.list_(
    pa.field(
        "element",
        pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]),
    )
)

#: Spark's Kafka source columns (see the module docstring for nullability).
TIER_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("timestampType", pa.int32(), nullable=False),
        pa.field("headers", HEADERS_TYPE),
    ]
)

_COLUMN_INDEX = {name: i for i, name in enumerate(TIER_SCHEMA.names)}
# Parquet leaf columns and physical types. Checked before any statistics are touched:
# pyarrow aborts the process (an uncaught C++ exception) when it builds statistics for a
# column chunk whose footer type was corrupted.
_LEAF_TYPES = (
    ("key", "BYTE_ARRAY"),
    ("value", "BYTE_ARRAY"),
    ("topic", "BYTE_ARRAY"),
    ("partition", "INT32"),
    ("offset", "INT64"),
    ("timestamp", "INT64"),
    ("timestampType", "INT32"),
    ("headers.list.element.key", "BYTE_ARRAY"),
    ("headers.list.element.value", "BYTE_ARRAY"),
)
_STATS_COLUMNS = ["topic", "partition", "offset", "timestamp", "timestampType"]
_DICTIONARY_COLUMNS = ["topic", "partition", "timestampType", "key", "headers.list.element.key"]
# What a ConsumedRecord needs; topic and partition come from the (cross-checked) footer.
_RECORD_COLUMNS = ["key", "value", "offset", "timestamp", "timestampType", "headers"]
# Per-record overhead counted towards row_group_bytes: offset, timestamp, levels.
_ROW_OVERHEAD = 24

_MD_VERSION = "lakelog.tier.version"
_MD_TOPIC = "lakelog.topic"
_MD_PARTITION = "lakelog.partition"
_MD_FIRST = "lakelog.first_offset"
_MD_LAST = "lakelog.last_offset"
_MD_COUNT = "lakelog.record_count"
_MD_MIN_TS = "lakelog.min_timestamp_ms"
_MD_MAX_TS = "lakelog.max_timestamp_ms"
_MD_HORIZONS = "lakelog.delete_horizons"
_MD_INTEGRITY = "lakelog.integrity"
_INTEGRITY_PREFIX = b"lklcrc1:"

# The dataset scanner decodes columns in parallel (~1.8x pq.ParquetFile.read_row_groups
# on two cores) and verifies page checksums too.
_FORMAT = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True)
)

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def tier_object_key(topic: str, partition: int, first_offset: int, last_offset: int) -> str:
    """The object key of the tier object holding offsets [first_offset, last_offset].

    ``tiered/<topic>/partition=<p>/<first>-<last>.parquet`` as in DESIGN.md, refined:
    both offsets are zero-padded to 20 digits (Kafka's log file naming; an int64 has at
    most 19), so that a listing in key order is a listing in offset order.

    Raises:
        ValueError: an empty topic or one containing "/", a negative partition or
            offset, or last_offset < first_offset.
    """
    if not topic or "/" in topic:
        raise ValueError(f"topic {topic!r} cannot name a tier object")
    if partition < 0 or first_offset < 0 or last_offset < first_offset:
        raise ValueError(f"bad tier range: partition {partition}, {first_offset}-{last_offset}")
    return f"tiered/{topic}/partition={partition}/{first_offset:020d}-{last_offset:020d}.parquet"


# --- encode ------------------------------------------------------------------------------


class _Columns:
    """Column lists being filled, plus the row-group boundaries by payload size."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.timestamp_types: list[int] = []
        self.header_starts: list[int] = [0]
        self.header_null: list[bool] = []
        self.header_keys: list[str] = []
        self.header_values: list[bytes | None] = []
        self.sizes: list[int] = []

    def add(
        self,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        ts: int,
        headers: Headers,
        ts_type: int = 0,
    ) -> None:
        if self.offsets and offset <= self.offsets[-1]:
            raise ValueError(
                f"offsets must be strictly increasing: {offset} after {self.offsets[-1]}"
            )
        if offset < 0 or offset > _INT64_MAX:
            raise ValueError(f"offset {offset} out of range")
        if not _INT64_MIN <= ts <= _INT64_MAX:
            raise ValueError(f"timestamp {ts} out of the int64 range")
        size = _ROW_OVERHEAD + len(key or b"") + len(value or b"")
        self.keys.append(key)
        self.values.append(value)
        self.offsets.append(offset)
        self.timestamps.append(ts)
        self.timestamp_types.append(ts_type)
        for hkey, hvalue in headers:
            self.header_keys.append(hkey)
            self.header_values.append(hvalue)
            size += len(hkey) + len(hvalue or b"")
        self.header_starts.append(len(self.header_keys))
        self.header_null.append(not headers)
        self.sizes.append(size)


def _row_groups(sizes: Sequence[int], max_rows: int, max_bytes: int) -> list[tuple[int, int]]:
    """(start, length) of each row group: cut at max_rows rows or once max_bytes is reached."""
    groups: list[tuple[int, int]] = []
    start = 0
    acc = 0
    for i, size in enumerate(sizes):
        acc += size
        if i + 1 - start >= max_rows or acc >= max_bytes:
            groups.append((start, i + 1 - start))
            start = i + 1
            acc = 0
    if start < len(sizes):
        groups.append((start, len(sizes) - start))
    return groups


def encode_tier(
    topic: str,
    partition: int,
    records: Iterable[tuple[int, Record] | ConsumedRecord],
    *,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
    compression: str = "zstd",
    delete_horizons: Sequence[tuple[int, int]] = (),
) -> bytes:
    """Encode one topic-partition's records, in offset order, as a tier object.

    Args:
        topic: the topic name written in every row and in the footer.
        partition: the partition written in every row and in the footer.
        records: ``(offset, Record)`` pairs, or ConsumedRecords of this topic-partition,
            with strictly increasing offsets (gaps allowed).
        row_group_rows: at most this many records per row group.
        row_group_bytes: close a row group once its payload reaches this many bytes.
        compression: one of :data:`COMPRESSIONS`.
        delete_horizons: ``(from_offset, horizon_ms)`` by rising offset: the delete
            horizon of the tombstones from each offset on (see the module docstring).

    Returns:
        The Parquet object's bytes.

    Raises:
        ValueError: no records, offsets not strictly increasing or negative, a
            ConsumedRecord of another topic-partition, a timestamp outside int64, a header
            key that is not valid Unicode, or bad options.
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, not {compression!r}")
    if row_group_rows < 1 or row_group_bytes < 1:
        raise ValueError("row_group_rows and row_group_bytes must be >= 1")
    if not topic:
        raise ValueError("topic must not be empty")
    if not 0 <= partition < 2**31:
        raise ValueError(f"partition {partition} out of range")

    cols = _Columns()
    for item in records:
        if isinstance(item, ConsumedRecord):
            if item.topic != topic or item.partition != partition:
                raise ValueError(
                    f"record of {item.topic}/{item.partition} in a tier object of "
                    f"{topic}/{partition}"
                )
            cols.add(
                item.offset,
                item.key,
                item.value,
                item.timestamp_ms,
                item.headers,
                item.timestamp_type,
            )
        else:
            offset, rec = item
            cols.add(offset, rec.key, rec.value, rec.timestamp_ms, rec.headers, rec.timestamp_type)
    count = len(cols.offsets)
    if count == 0:
        raise ValueError("a tier object needs at least one record")

    try:
        header_entries = pa.StructArray.from_arrays(
            [
                pa.array(cols.header_keys, pa.string()),
                pa.array(cols.header_values, pa.binary()),
            ],
            fields=list(HEADERS_TYPE.value_type),
        )
        headers = pa.ListArray.from_arrays(
            pa.array(cols.header_starts, pa.int32()),
            header_entries,
            type=HEADERS_TYPE,
            mask=pa.array(cols.header_null, pa.bool_()),
        )
        table = pa.Table.from_arrays(
            [
                pa.array(cols.keys, pa.binary()),
                pa.array(cols.values, pa.binary()),
                pa.repeat(pa.scalar(topic, pa.string()), count),
                pa.repeat(pa.scalar(partition, pa.int32()), count),
                pa.array(cols.offsets, pa.int64()),
                pa.array(cols.timestamps, TIER_SCHEMA.field("timestamp").type),
                pa.array(cols.timestamp_types, pa.int32()),
                headers,
            ],
            schema=TIER_SCHEMA,
        )
    except (pa.ArrowException, UnicodeEncodeError, OverflowError) as exc:
        raise ValueError(f"records cannot be encoded: {exc}") from exc

    metadata = {
        _MD_VERSION: str(TIER_FORMAT_VERSION),
        _MD_TOPIC: topic,
        _MD_PARTITION: str(partition),
        _MD_FIRST: str(cols.offsets[0]),
        _MD_LAST: str(cols.offsets[-1]),
        _MD_COUNT: str(count),
        _MD_MIN_TS: str(min(cols.timestamps)),
        _MD_MAX_TS: str(max(cols.timestamps)),
    }
    if delete_horizons:
        froms = [f for f, _ in delete_horizons]
        if froms != sorted(set(froms)):
            raise ValueError(f"delete horizons must rise by offset: {delete_horizons}")
        metadata[_MD_HORIZONS] = json.dumps([[f, h] for f, h in delete_horizons])
    sink = io.BytesIO()
    with pq.ParquetWriter(
        sink,
        TIER_SCHEMA,
        compression=compression,
        use_dictionary=_DICTIONARY_COLUMNS,
        write_statistics=_STATS_COLUMNS,
        write_page_index=True,
        write_page_checksum=True,
        sorting_columns=[pq.SortingColumn(_COLUMN_INDEX["offset"])],
    ) as writer:
        for start, length in _row_groups(cols.sizes, row_group_rows, row_group_bytes):
            # Each write_table call starts a new row group: that is how groups are cut.
            writer.write_table(table.slice(start, length), row_group_size=length)
        # Row groups are written out when closed, so this is where the page index begins.
        metadata[_MD_INTEGRITY] = _integrity_value(sink.tell(), 0)
        writer.add_key_value_metadata(metadata)
    return _seal(sink)


def _integrity_value(covered_from: int, crc: int) -> str:
    return f"{_INTEGRITY_PREFIX.decode()}{covered_from:020d}:{crc:08x}"


def _tail_crc(data: memoryview | bytes, covered_from: int, crc_at: int) -> int:
    """CRC-32 of [covered_from, len - 4) with the 8 CRC digits at crc_at read as zeros."""
    end = len(data) - 4
    crc = zlib.crc32(data[covered_from:crc_at])
    crc = zlib.crc32(b"00000000", crc)
    return zlib.crc32(data[crc_at + 8 : end], crc)


class _Short(Exception):
    """The footer, or the bytes its CRC covers, begin before the tail at hand: at ``start``."""

    def __init__(self, start: int) -> None:
        self.start = start


def _find_integrity(data: memoryview | bytes, at: int = 0, size: int = -1) -> tuple[int, int, int]:
    """(covered_from, position of the CRC digits, stored CRC) from the footer's marker,
    positions in the object.

    ``data``: the object, or its tail from ``at`` (``size`` the object's; the object's
    first bytes are then not checked).

    Raises:
        CorruptSegmentError: no Parquet trailer, no marker or more than one, a bad value.
        _Short: the tail is too short: the footer or what the CRC covers begins before it.
    """
    size = at + len(data) if size < 0 else size
    if size < 12 or bytes(data[-4:]) != b"PAR1" or (at == 0 and bytes(data[:4]) != b"PAR1"):
        raise _corrupt("not a Parquet object (magic)")
    footer_len = int.from_bytes(data[-8:-4], "little")
    footer_start = size - 8 - footer_len
    if footer_start < 4:
        raise _corrupt(f"footer length {footer_len} does not fit in {size} bytes")
    if footer_start < at:
        raise _Short(footer_start)
    footer = bytes(data[footer_start - at : size - 8 - at])
    marker = footer.find(_INTEGRITY_PREFIX)
    if marker < 0 or footer.find(_INTEGRITY_PREFIX, marker + 1) >= 0:
        raise _corrupt("no single integrity marker in the footer")
    value_at = marker + len(_INTEGRITY_PREFIX)
    value = footer[value_at : value_at + 29]  # 20 digits, ":", 8 hex digits
    try:
        if len(value) != 29 or value[20:21] != b":":
            raise ValueError(value)
        covered_from = int(value[:20].decode("ascii"), 10)
        crc = int(value[21:].decode("ascii"), 16)
    except ValueError as exc:  # UnicodeDecodeError too
        raise _corrupt(f"bad integrity marker {value!r}") from exc
    if not 4 <= covered_from <= footer_start:
        raise _corrupt(f"integrity marker covers from {covered_from}")
    if covered_from < at:
        raise _Short(covered_from)
    return covered_from, footer_start + value_at + 21, crc


def _seal(sink: io.BytesIO) -> bytes:
    """Patch the footer's CRC placeholder with the CRC of the object's tail."""
    with sink.getbuffer() as buf:
        covered_from, crc_at, _ = _find_integrity(buf)
        crc = _tail_crc(buf, covered_from, crc_at)
    sink.seek(crc_at)
    sink.write(b"%08x" % crc)
    return sink.getvalue()


# --- read by ranged GETs ---------------------------------------------------------------

#: The first ranged GET of a tier object: its tail, usually footer and page index.
TAIL_BYTES = 64 << 10


class _RangedFile(io.RawIOBase):
    """A read-only file over one object: ranged GETs, with the tail already in memory."""

    def __init__(
        self, store: ObjectStore, key: str, size: int, tail: bytes, counted: Callable[[int], None]
    ) -> None:
        super().__init__()
        self._store, self._key, self._size = store, key, size
        self._tail, self._tail_at = tail, size - len(tail)
        self._pos = 0
        self._counted = counted

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
            self._counted(len(data))
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _checked_tail(store: ObjectStore, key: str, size: int, counted: Callable[[int], None]) -> bytes:
    """The object's tail, at least from where its CRC coverage starts, the CRC verified:
    what ``TierReader`` checks of a whole object, with one ranged GET of the last
    ``TAIL_BYTES`` (another from the footer's start when the footer begins before them,
    and another from where the CRC's coverage starts when that does)."""

    def fetch(start: int) -> bytes:
        data = store.get_range(key, start, size - start)
        counted(len(data))
        if len(data) != size - start:
            raise _corrupt(f"{key} is shorter than the index says ({size})")
        return data

    at = max(0, size - TAIL_BYTES)
    tail = fetch(at)
    while True:
        try:
            covered_from, crc_at, crc = _find_integrity(tail, at, size)
            break
        except _Short as short:
            at, tail = short.start, fetch(short.start)
        except CorruptSegmentError as exc:
            raise CorruptSegmentError(f"{exc} ({key})") from None
    if _tail_crc(tail, covered_from - at, crc_at - at) != crc:
        raise _corrupt(f"footer CRC mismatch ({key})")
    return tail


def open_tier(
    store: ObjectStore,
    key: str,
    size: int,
    topic: str,
    partition: int,
    counted: Callable[[int], None] = lambda n: None,
) -> pq.ParquetFile:
    """A tier object read by ranged GETs, as readers that want only some of its row groups
    (and columns) open it: its tail first, the footer's CRC checked before pyarrow parses
    it (pyarrow aborts the process on some corrupt footers), then its schema and its
    topic-partition. Row groups are fetched when read. ``counted(n)``: told of each GET.

    Raises:
        CorruptSegmentError: the footer fails its checks; another schema or topic-partition.
        pa.ArrowException, OSError: pyarrow refuses the footer.
        ObjectNotFoundError: the object is gone.
    """
    tail = _checked_tail(store, key, size, counted)
    source = _RangedFile(store, key, size, tail, counted)
    pf = pq.ParquetFile(source, pre_buffer=True, page_checksum_verification=True)
    kv = {k.decode(): v.decode() for k, v in (pf.metadata.metadata or {}).items()}
    if not pf.schema_arrow.equals(TIER_SCHEMA, check_metadata=False):
        raise CorruptSegmentError(f"{key}: not the tier schema")
    if kv.get(_MD_TOPIC) != topic or kv.get(_MD_PARTITION) != str(partition):
        raise CorruptSegmentError(
            f"{key}: holds {kv.get(_MD_TOPIC)}-{kv.get(_MD_PARTITION)}, the index says "
            f"{topic}-{partition}"
        )
    return pf


def group_stat(group: Any, column: int) -> tuple[int, int]:
    """The (min, max) statistics of an int column of a row group's metadata.

    Raises:
        CorruptSegmentError: the row group has none.
    """
    stats = group.column(column).statistics
    if stats is None or not stats.has_min_max:
        raise CorruptSegmentError(f"row group without statistics on column {column}")
    return int(stats.min_raw), int(stats.max_raw)


def tier_row_groups(
    store: ObjectStore, key: str, size: int, topic: str, partition: int
) -> list[tuple[int, int, int]]:
    """(first offset, last offset, compressed bytes) of every row group of a tier object,
    from one ranged GET of its tail: what a planner cuts a big tier object into pieces by.

    Raises:
        CorruptSegmentError: the footer fails its checks.
        ObjectNotFoundError: the object is gone.
    """
    offset_col = TIER_SCHEMA.names.index("offset")
    try:
        md = open_tier(store, key, size, topic, partition).metadata
        out = []
        for i in range(md.num_row_groups):
            group = md.row_group(i)
            first, last = group_stat(group, offset_col)
            nbytes = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
            out.append((first, last, nbytes))
        return out
    except (pa.ArrowException, OSError) as exc:
        raise CorruptSegmentError(f"tier object {key}: {exc}") from exc


# --- decode ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TierRowGroup:
    """One row group of a tier object, from the footer's statistics."""

    index: int
    first_offset: int
    last_offset: int
    record_count: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    compressed_bytes: int


def _corrupt(message: str) -> CorruptSegmentError:
    return CorruptSegmentError(f"tier object: {message}")


class TierReader:
    """Reads a tier object; checks its footer on construction.

    Args:
        data: the whole object.

    Raises:
        CorruptSegmentError: not a Parquet object, truncated, not our schema, or a footer
            whose metadata and statistics disagree.
    """

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        #: Row groups decoded so far (instrumentation: proves pruning in tests, metrics later).
        self.row_groups_read = 0
        # Before pyarrow parses anything: its metadata accessors abort the process (uncaught
        # C++ exceptions) on some corrupt footers, so the footer's CRC is checked first.
        view = memoryview(data).cast("B")
        covered_from, crc_at, crc = _find_integrity(view)
        if _tail_crc(view, covered_from, crc_at) != crc:
            raise _corrupt("footer CRC mismatch")
        try:
            buffer = pa.py_buffer(view)
            footer = pq.ParquetFile(pa.BufferReader(buffer))
            schema = footer.schema_arrow
            md = footer.metadata
            self._fragment = _FORMAT.make_fragment(pa.BufferReader(buffer))
            kv = {k.decode(): v.decode() for k, v in (md.metadata or {}).items()}
            groups = [md.row_group(i) for i in range(md.num_row_groups)]
            total_rows = md.num_rows
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            raise _corrupt(f"unreadable footer: {exc}") from exc
        if not schema.equals(TIER_SCHEMA, check_metadata=False):
            raise _corrupt(f"schema is not the tier schema: {schema}")
        try:
            if kv.get(_MD_VERSION) != str(TIER_FORMAT_VERSION):
                raise _corrupt(f"unknown format version {kv.get(_MD_VERSION)!r}")
            self.topic: str = kv[_MD_TOPIC]
            self.partition: int = int(kv[_MD_PARTITION])
            self.first_offset: int = int(kv[_MD_FIRST])
            self.last_offset: int = int(kv[_MD_LAST])
            self.record_count: int = int(kv[_MD_COUNT])
            self.min_timestamp_ms: int = int(kv[_MD_MIN_TS])
            self.max_timestamp_ms: int = int(kv[_MD_MAX_TS])
            #: ``(from_offset, horizon_ms)`` of the tombstones (see the module docstring).
            self.delete_horizons: tuple[tuple[int, int], ...] = tuple(
                (int(f), int(h)) for f, h in json.loads(kv.get(_MD_HORIZONS, "[]"))
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise _corrupt(f"bad key-value metadata: {exc}") from exc
        self.row_groups: tuple[TierRowGroup, ...] = tuple(
            self._check_group(i, g) for i, g in enumerate(groups)
        )
        self._check_totals(total_rows)

    def delete_horizon(self, offset: int) -> int | None:
        """The delete horizon (epoch ms) of a tombstone at ``offset``; None when no
        compaction has seen it yet."""
        i = bisect.bisect_right([f for f, _ in self.delete_horizons], offset) - 1
        return None if i < 0 else self.delete_horizons[i][1]

    def _check_group(self, index: int, group: Any) -> TierRowGroup:
        """A row group's statistics, checked against the footer's key-value metadata."""

        def minmax(name: str) -> tuple[Any, Any]:
            stats = group.column(_COLUMN_INDEX[name]).statistics
            if stats is None or not stats.has_min_max:
                raise _corrupt(f"row group {index} has no {name} statistics")
            return stats.min_raw, stats.max_raw

        try:
            leaves = tuple(
                (group.column(c).path_in_schema, group.column(c).physical_type)
                for c in range(group.num_columns)
            )
            if leaves != _LEAF_TYPES:
                raise _corrupt(f"row group {index} has columns {leaves}")
            topics = minmax("topic")
            partitions = minmax("partition")
            first, last = minmax("offset")
            min_ts, max_ts = minmax("timestamp")
            rows = group.num_rows
            size = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        except (pa.ArrowException, OSError, ValueError) as exc:  # ValueError: bad UTF-8
            raise _corrupt(f"row group {index}: {exc}") from exc
        topic = self.topic.encode()
        if topics != (topic, topic) and topics != (self.topic, self.topic):
            raise _corrupt(f"row group {index} holds topic {topics}, footer says {self.topic!r}")
        if partitions != (self.partition, self.partition):
            raise _corrupt(f"row group {index} holds partitions {partitions}")
        if rows < 1 or first > last or last - first + 1 < rows or min_ts > max_ts:
            raise _corrupt(f"row group {index}: {rows} rows, offsets {first}-{last}")
        return TierRowGroup(index, first, last, rows, min_ts, max_ts, size)

    def _check_totals(self, total_rows: int) -> None:
        """The footer's key-value metadata against the row groups, which must tile in order."""
        groups = self.row_groups
        if not groups:
            raise _corrupt("no row groups")
        for prev, cur in itertools.pairwise(groups):
            if cur.first_offset <= prev.last_offset:
                raise _corrupt(f"row groups {prev.index} and {cur.index} overlap or are unsorted")
        if (
            groups[0].first_offset != self.first_offset
            or groups[-1].last_offset != self.last_offset
            or sum(g.record_count for g in groups) != self.record_count
            or total_rows != self.record_count
            or min(g.min_timestamp_ms for g in groups) != self.min_timestamp_ms
            or max(g.max_timestamp_ms for g in groups) != self.max_timestamp_ms
        ):
            raise _corrupt("key-value metadata disagrees with the row groups")

    def _scan(self, row_groups: list[int], columns: list[str]) -> pa.Table:
        """The one place row data is decoded: these row groups' columns, nothing else."""
        fragment = self._fragment.subset(row_group_ids=row_groups)
        return fragment.to_table(columns=columns, schema=TIER_SCHEMA)

    def _read_groups(self, groups: Sequence[TierRowGroup], columns: Sequence[str]) -> pa.Table:
        """Decode columns (always with offset) of row groups, each checked against its stats."""
        wanted = list(columns) if "offset" in columns else [*columns, "offset"]
        self.row_groups_read += len(groups)
        try:
            table = self._scan([g.index for g in groups], wanted)
        except (pa.ArrowException, OSError) as exc:
            raise _corrupt(f"row groups {[g.index for g in groups]}: {exc}") from exc
        offsets = table.column("offset")
        if table.num_rows != sum(g.record_count for g in groups):
            raise _corrupt("row groups hold other row counts than their statistics")
        if table.num_rows > 1 and not pc.all(pc.greater(offsets[1:], offsets[:-1])).as_py():
            raise _corrupt("offsets are not strictly increasing")
        row = 0
        for group in groups:
            if (
                offsets[row].as_py() != group.first_offset
                or offsets[row + group.record_count - 1].as_py() != group.last_offset
            ):
                raise _corrupt(f"row group {group.index} disagrees with its statistics")
            row += group.record_count
        return table

    def _groups_overlapping(self, start: int, end: int | None) -> list[TierRowGroup]:
        """Row groups holding offsets in [start, end) by their statistics (end None: no end)."""
        if end is not None and end <= start:
            return []
        return [
            g
            for g in self.row_groups
            if g.last_offset >= start and (end is None or g.first_offset < end)
        ]

    def records(self, from_offset: int, max_records: int | None = None) -> list[ConsumedRecord]:
        """Records at offsets >= from_offset, in order, decoding only the row groups needed.

        Args:
            from_offset: the first offset wanted; it need not exist (gaps), and may lie
                before the first or after the last offset.
            max_records: at most this many records (None: all to the end).

        Raises:
            CorruptSegmentError: the row groups read fail their checksums or statistics.
        """
        if max_records is not None and max_records < 0:
            raise ValueError("max_records must be >= 0")
        out: list[ConsumedRecord] = []
        for group in self._groups_overlapping(from_offset, None):
            remaining = None if max_records is None else max_records - len(out)
            if remaining == 0:
                break
            table = self._read_groups([group], _RECORD_COLUMNS)
            skip = 0
            if group.first_offset < from_offset:
                skip = pc.sum(pc.less(table.column("offset"), from_offset)).as_py() or 0
            out.extend(self._to_records(table.slice(skip, remaining)))
        return out

    def _to_records(self, table: pa.Table) -> list[ConsumedRecord]:
        try:
            keys = table.column("key").to_pylist()
            values = table.column("value").to_pylist()
            offsets = table.column("offset").to_pylist()
            timestamps = table.column("timestamp").cast(pa.int64()).to_pylist()
            types = table.column("timestampType").to_pylist()
            header_lists = table.column("headers").to_pylist()
        except (pa.ArrowException, UnicodeDecodeError) as exc:
            raise _corrupt(f"undecodable records: {exc}") from exc
        topic, partition = self.topic, self.partition
        out = []
        for key, value, offset, ts, ts_type, hlist in zip(
            keys, values, offsets, timestamps, types, header_lists, strict=True
        ):
            headers: Headers = ()
            if hlist:
                if any(h is None or h["key"] is None for h in hlist):
                    raise _corrupt(f"null header at offset {offset}")
                headers = tuple((h["key"], h["value"]) for h in hlist)
            out.append(
                ConsumedRecord(topic, partition, offset, key, value, ts, headers, ts_type or 0)
            )
        return out

    def table(
        self,
        columns: Sequence[str] | None = None,
        offset_range: tuple[int, int] | None = None,
    ) -> pa.Table:
        """The rows as an Arrow table with :data:`TIER_SCHEMA`'s columns (or a subset).

        Args:
            columns: column names, in the order wanted (None: all, in schema order).
            offset_range: ``(start, end)``: only offsets in [start, end); only the row
                groups that overlap it are decoded.

        Raises:
            ValueError: an unknown column or start > end.
            CorruptSegmentError: the row groups read fail their checksums or statistics.
        """
        names = list(TIER_SCHEMA.names) if columns is None else list(columns)
        unknown = [c for c in names if c not in _COLUMN_INDEX]
        if unknown:
            raise ValueError(f"unknown tier columns: {unknown}")
        start, end = (0, None) if offset_range is None else offset_range
        if end is not None and start > end:
            raise ValueError(f"bad offset range {offset_range}")
        schema = pa.schema([TIER_SCHEMA.field(c) for c in names])
        groups = self._groups_overlapping(start, end)
        if not groups:
            return schema.empty_table()
        table = self._read_groups(groups, names)
        offsets = table.column("offset")
        # Rows are sorted by offset, so the range is one slice.
        skip = pc.sum(pc.less(offsets, start)).as_py() or 0
        stop = table.num_rows
        if end is not None:
            stop -= pc.sum(pc.greater_equal(offsets, end)).as_py() or 0
        return table.slice(skip, stop - skip).select(names).replace_schema_metadata(None)
