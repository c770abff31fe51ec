"""The segment object format: one flush of many topic-partitions in one object.

A pure codec: bytes in, values out. No I/O, no clock, no event loop. Records are
encoded and decoded by aiokafka's Kafka v2 RecordBatch codec (its C extension when
installed); this module only frames batches into chunks and chunks into an object.

Byte layout (all integers big-endian; u = unsigned, i = signed)::

    segment object = chunk[0] chunk[1] ... chunk[n-1] footer trailer

    chunk            one topic-partition: >= 1 Kafka v2 RecordBatches, back to back.
                     Chunks tile [0, footer start) in footer order: no gaps, no overlap.

    RecordBatch      (Kafka's layout, written by aiokafka; 61-byte header, then records)
      0   i64  BaseOffset            RELATIVE: offsets of this chunk before this batch
                                     (first batch 0). NOT covered by the batch CRC, so a
                                     reader may patch it; we only check it for contiguity.
      8   i32  Length                bytes after this field; >= 49, inside the chunk
      12  i32  PartitionLeaderEpoch  always -1 (NOT covered by the CRC: checked == -1)
      16  i8   Magic                 always 2 (checked)
      17  u32  CRC                   CRC-32C of bytes [21, 12 + Length): attributes
                                     through the last record
      21  i16  Attributes            compression codec in bits 0-2 (0 none, 1 gzip,
                                     2 snappy, 3 lz4, 4 zstd); bit 3 LogAppendTime (set
                                     by the agent for topics with
                                     message.timestamp.type=LogAppendTime, with
                                     MaxTimestamp the append time, as Kafka does); bit 4
                                     transactional (a transactional producer's batch);
                                     bit 5 control (with bit 4: a transaction marker,
                                     one uncompressed record); every other bit 0
                                     (segments.batches checks producers')
      23  i32  LastOffsetDelta       record count - 1
      27  i64  FirstTimestamp        CreateTime of the first record (epoch ms)
      35  i64  MaxTimestamp
      43  i64  ProducerId            -1 in batches we build; a Kafka producer's batch
      51  i16  ProducerEpoch         (SegmentBuilder.append_batch, stored as it came)
      53  i32  BaseSequence          keeps its idempotent producer id, epoch, sequence
      57  i32  RecordCount           >= 1
      61  ...  records               Kafka's varint records, compressed as a whole when
                                     the codec is not none and compression helps

    footer           covered, with the trailer's first 12 bytes, by the trailer CRC
      u32  chunk count n
      n x 60-byte entries, in chunk (= first-appended) order:
        16 bytes  topic id (uuid.UUID.bytes)
        i32       partition            >= 0
        i64       position             byte offset of the chunk in the object
        i64       length               bytes of the chunk
        i64       record count         >= 1: offsets the chunk takes, its records
                                       and its transaction markers (one each)
        i64       min timestamp (ms)   over the chunk's records and markers
        i64       max timestamp (ms)

    trailer          the object's last 16 bytes
      u32     footer length      bytes of the footer (4 + 60 n)
      8 bytes magic              b"LKLSEG" + u16 format version (now 1)
      u32     CRC-32C            of [footer start, object length - 4): the whole footer,
                                 the footer length and the magic

Every byte is checked by something: batch bytes from Attributes on by the batch CRC,
BaseOffset by contiguity, Length by framing (and the CRC of the range it names),
PartitionLeaderEpoch and Magic by value, footer and trailer by the trailer CRC and the
tiling of chunks. One flipped byte therefore always raises ``CorruptSegmentError``.

Transactions (issue 30): a control batch (attributes bit 5, with bit 4) is a transaction
marker, written by ``segments.batches.control_batch`` and appended like a producer's
batch. It takes one offset and is no record: every decoder here skips it (the offsets
after it count it), and Kafka Fetch serves it as stored.

A ranged GET of one chunk ([position, position + length)) decodes on its own with
:func:`decode_chunk`; pass the record count from the index so that a chunk cut exactly
at a batch boundary is caught too.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import crc32c
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c

from segments.compression import (
    DECOMPRESSED_CONFIG,
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    OverLimitError,
    plain_batch,
)
from segments.errors import BatchTooLargeError, CorruptSegmentError
from segments.types import ChunkInfo, Record

__all__ = [
    "COMPRESSIONS",
    "FORMAT_VERSION",
    "MAGIC",
    "ChunkBatch",
    "SegmentBuilder",
    "SegmentReader",
    "decode_chunk",
    "drop_aborted",
    "iter_chunk",
    "iter_chunk_batches",
]

COMPRESSIONS: tuple[str, ...] = ("none", "gzip", "snappy", "lz4", "zstd")
# Kafka's attribute codes, in the same order as COMPRESSIONS.
_CODEC_IDS = {name: code for code, name in enumerate(COMPRESSIONS)}

FORMAT_VERSION = 1
_MAGIC_PREFIX = b"LKLSEG"
MAGIC = _MAGIC_PREFIX + struct.pack(">H", FORMAT_VERSION)

_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")  # Kafka v2 RecordBatch header, 61 bytes
_BATCH_HEADER_SIZE = _BATCH_HEADER.size
_LENGTH_FIELD_END = 12  # BaseOffset + Length: the bytes Length does not count
_BATCH_PREFIX = struct.Struct(">qiib")  # BaseOffset, Length, PartitionLeaderEpoch, Magic
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")
_LEADER_EPOCH_AT = 12
_RECORD_BATCH_MAGIC = 2
_NO_LEADER_EPOCH = -1
_CODEC_MASK = 0x07
_LOG_APPEND_TIME = 0x08  # attributes bit 3: every record's timestamp is MaxTimestamp
_TRANSACTIONAL = 0x10  # attributes bit 4: a transactional producer's batch
_CONTROL = 0x20  # attributes bit 5: a transaction marker (segments.batches.control_batch)
#: An idempotent batch for the commit: (producer id, epoch, base sequence, record count,
#: relative offset, transactional), ``coordinator.log.producers.ProducerBatch``'s fields.
_ProducerBatch = tuple[int, int, int, int, int, bool]
_ATTRIBUTES_AT = 21
_MAX_TIMESTAMP_AT = 35
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_CRC = struct.Struct(">I")
_CRC_AT = 17
_CRC_FROM = 21  # the batch CRC covers Attributes through the last record

_FOOTER_COUNT = struct.Struct(">I")
_FOOTER_ENTRY = struct.Struct(">16siqqqqq")
_TRAILER = struct.Struct(">I8sI")
_CRC_SIZE = 4  # the trailer's last field

_INT32_MAX = (1 << 31) - 1
_INT64_MAX = (1 << 63) - 1
_TOPIC_ID_LEN = 16


class SegmentBuilder:
    """Collects records of many topic-partitions and builds one segment object.

    Records are encoded into Kafka batches as they are appended (so ``append`` is
    where bad records are refused and ``estimated_size`` sees compressed batches);
    ``build`` closes the open batches and writes the footer.

    Args:
        compression: one of :data:`COMPRESSIONS`, applied per batch.
        max_batch_bytes: a batch is closed before it grows past this many
            (uncompressed) bytes; a single larger record gets a batch of its own.

    Raises:
        ValueError: an unknown compression or a max_batch_bytes below a batch header.
    """

    def __init__(self, compression: str = "none", max_batch_bytes: int = 1 << 20) -> None:
        if compression not in _CODEC_IDS:
            raise ValueError(f"unknown compression {compression!r}; expected one of {COMPRESSIONS}")
        if max_batch_bytes <= _BATCH_HEADER_SIZE:
            raise ValueError(f"max_batch_bytes must exceed {_BATCH_HEADER_SIZE}")
        self._codec = _CODEC_IDS[compression]
        self._max_batch_bytes = max_batch_bytes
        self._chunks: dict[tuple[bytes, int], _ChunkBuffer] = {}
        self._record_count = 0
        self._bytes = 0  # closed batches as built + open batches as written so far
        self._built: tuple[bytes, list[ChunkInfo]] | None = None

    @property
    def estimated_size(self) -> int:
        """Bytes the built object would take now; exact once built.

        Closed batches count as built (compressed); open ones as written so far
        (uncompressed), so with compression this overstates large open batches.
        """
        footer = _FOOTER_COUNT.size + _FOOTER_ENTRY.size * len(self._chunks) + _TRAILER.size
        return self._bytes + footer

    @property
    def record_count(self) -> int:
        """Records appended so far, over all topic-partitions."""
        return self._record_count

    def append(
        self,
        topic_id: bytes,
        partition: int,
        records: Sequence[Record],
        *,
        log_append_time: bool = False,
    ) -> None:
        """Add records to the chunk of (topic_id, partition), after those appended before.

        ``log_append_time``: the topic has message.timestamp.type=LogAppendTime; its
        chunk's batches get the append time when the object is built (``build``).

        All-or-nothing: every record is checked before any is encoded, so a refused
        call leaves the builder as it was. An empty ``records`` is a no-op.

        Raises:
            TypeError: a field of the wrong type (key/value not bytes or None, ...).
            ValueError: topic_id not 16 bytes, partition or timestamp out of range.
            RuntimeError: ``build`` was already called.
        """
        self.append_groups(topic_id, {partition: records}, log_append_time=log_append_time)

    def append_groups(
        self,
        topic_id: bytes,
        groups: Mapping[int, Sequence[Record]],
        *,
        log_append_time: bool = False,
    ) -> None:
        """``append`` for several partitions of one topic at once, all or nothing.

        Every partition and record of every group is checked before any is encoded,
        so a refused call leaves the builder as it was (one request's records are
        all buffered, or none).

        Raises:
            TypeError, ValueError, RuntimeError: as ``append``.
        """
        ready: list[tuple[int, list[_Prepared]]] = []
        for partition, records in groups.items():
            self._check_target(topic_id, partition)
            prepared = [_prepare(record) for record in records]
            if prepared:
                ready.append((partition, prepared))
        for partition, prepared in ready:
            self._append_prepared(topic_id, partition, prepared)
            if log_append_time:
                self._chunks[(topic_id, partition)].log_append_time = True

    def _append_prepared(self, topic_id: bytes, partition: int, prepared: list[_Prepared]) -> None:
        chunk = self._chunks.get((topic_id, partition))
        if chunk is None:
            chunk = self._chunks[(topic_id, partition)] = _ChunkBuffer(topic_id, partition)
        # Hot loop: state in locals, written back once (and around a batch close).
        builder, in_batch, written = chunk.builder, chunk.batch_count, 0
        for timestamp, key, value, headers in prepared:
            if builder is None:
                builder = self._new_batch()
                written += _BATCH_HEADER_SIZE
            meta = builder.append(in_batch, timestamp, key, value, headers)
            if meta is None:  # the batch is full: close it, the record opens the next one
                chunk.builder, chunk.batch_count = builder, in_batch
                self._close_batch(chunk)
                builder, in_batch = self._new_batch(), 0
                written += _BATCH_HEADER_SIZE
                meta = builder.append(0, timestamp, key, value, headers)
            written += meta.size
            in_batch += 1
        chunk.builder, chunk.batch_count = builder, in_batch
        timestamps = [p[0] for p in prepared]
        chunk.min_ts = min(chunk.min_ts, *timestamps)
        chunk.max_ts = max(chunk.max_ts, *timestamps)
        chunk.record_count += len(prepared)
        self._record_count += len(prepared)
        self._bytes += written

    def append_batch(
        self,
        topic_id: bytes,
        partition: int,
        batch: bytes | memoryview,
        record_count: int,
        min_timestamp_ms: int,
        max_timestamp_ms: int,
        producer: tuple[int, int, int] | None = None,
        *,
        log_append_time: bool = False,
        transactional: bool = False,
    ) -> int:
        """Add one producer's RecordBatch, as it is, after the records of the chunk so far.

        ``producer``: (producer id, epoch, base sequence) of an idempotent producer's
        batch, listed by :meth:`producer_batches` for the commit to check; with
        ``transactional``, the batch is part of that producer's transaction.

        The batch must have been checked (``segments.batches.check_batches`` gives the
        count and timestamps); it is stored byte for byte whatever its codec, with only
        its BaseOffset (relative in the chunk) and PartitionLeaderEpoch (-1) rewritten,
        neither of which the batch CRC covers.

        Returns:
            The batch's relative offset in the chunk (records appended before it).

        Raises:
            ValueError: topic_id not 16 bytes, partition out of range, a record count
                below 1, or a batch shorter than a header.
            RuntimeError: ``build`` was already called.
        """
        self._check_target(topic_id, partition)
        if record_count < 1 or len(batch) < _BATCH_HEADER_SIZE:
            raise ValueError("a batch holds a header and at least one record")
        chunk = self._chunks.get((topic_id, partition))
        if chunk is None:
            chunk = self._chunks[(topic_id, partition)] = _ChunkBuffer(topic_id, partition)
        self._close_batch(chunk)  # records appended before this batch come first
        relative = chunk.closed_records
        data = bytearray(batch)
        _BASE_OFFSET.pack_into(data, 0, relative)
        _LEADER_EPOCH.pack_into(data, _LEADER_EPOCH_AT, _NO_LEADER_EPOCH)
        chunk.batches.append(data)
        if producer is not None:
            chunk.producer_batches.append((*producer, record_count, relative, transactional))
        chunk.closed_records += record_count
        chunk.record_count += record_count
        chunk.log_append_time = chunk.log_append_time or log_append_time
        chunk.min_ts = min(chunk.min_ts, min_timestamp_ms)
        chunk.max_ts = max(chunk.max_ts, max_timestamp_ms)
        self._record_count += record_count
        self._bytes += len(data)
        return relative

    def producer_batches(self) -> dict[tuple[bytes, int], list[_ProducerBatch]]:
        """Idempotent batches per (topic id, partition): (producer id, epoch, base
        sequence, record count, relative offset, transactional), in chunk order."""
        return {
            key: list(chunk.producer_batches)
            for key, chunk in self._chunks.items()
            if chunk.producer_batches
        }

    def _check_target(self, topic_id: bytes, partition: int) -> None:
        """Raises what ``append`` and ``append_batch`` document for their first two args."""
        if self._built is not None:
            raise RuntimeError("segment already built; start a new SegmentBuilder")
        if not isinstance(topic_id, bytes) or len(topic_id) != _TOPIC_ID_LEN:
            raise ValueError("topic_id must be 16 bytes (uuid.UUID.bytes)")
        if type(partition) is not int or not 0 <= partition <= _INT32_MAX:
            raise ValueError(f"partition must be an int in [0, 2**31): {partition!r}")

    def build(self, append_time_ms: int | None = None) -> tuple[bytes, list[ChunkInfo]]:
        """Close every open batch and return the object's bytes and its footer entries.

        Chunks appended with ``log_append_time`` get the append time (``append_time_ms``,
        epoch ms: the writer's clock) on every batch, as a Kafka broker stamps it:
        attributes bit 3 set, MaxTimestamp the append time, the CRC computed again; the
        chunk's timestamps in the footer are the append time too.

        Calling it again returns the same result; ``append`` is refused afterwards.

        Raises:
            ValueError: a chunk needs the append time and ``append_time_ms`` is None.
        """
        if self._built is not None:
            return self._built
        if append_time_ms is None and any(c.log_append_time for c in self._chunks.values()):
            raise ValueError("LogAppendTime chunks need append_time_ms")
        parts: list[bytes | bytearray] = []
        infos: list[ChunkInfo] = []
        position = 0
        for chunk in self._chunks.values():
            self._close_batch(chunk)
            if chunk.log_append_time and append_time_ms is not None:
                for batch in chunk.batches:
                    stamp_log_append_time(batch, append_time_ms)
                chunk.min_ts = chunk.max_ts = append_time_ms
            length = sum(len(batch) for batch in chunk.batches)
            parts.extend(chunk.batches)
            infos.append(
                ChunkInfo(
                    topic_id=chunk.topic_id,
                    partition=chunk.partition,
                    position=position,
                    length=length,
                    record_count=chunk.record_count,
                    min_timestamp_ms=chunk.min_ts,
                    max_timestamp_ms=chunk.max_ts,
                )
            )
            position += length
        footer = _encode_footer(infos)
        parts.append(footer)
        self._built = (b"".join(parts), infos)
        for chunk in self._chunks.values():  # the batches now live in the built object only
            chunk.batches.clear()
        return self._built

    def _new_batch(self) -> DefaultRecordBatchBuilder:
        # magic 2, not transactional, producer id/epoch/sequence -1 (no idempotence).
        return DefaultRecordBatchBuilder(2, self._codec, 0, -1, -1, -1, self._max_batch_bytes)

    def _close_batch(self, chunk: _ChunkBuffer) -> None:
        builder = chunk.builder
        if builder is None:
            return
        written = builder.size()
        batch = builder.build()
        # aiokafka writes BaseOffset 0; ours is the records of the chunk before the batch.
        _BASE_OFFSET.pack_into(batch, 0, chunk.closed_records)
        chunk.batches.append(batch)
        chunk.closed_records += chunk.batch_count
        chunk.batch_count = 0
        chunk.builder = None
        self._bytes += len(batch) - written


class SegmentReader:
    """Reads a whole segment object: the footer at once, each chunk on demand.

    Raises:
        CorruptSegmentError: bad magic or version, footer length, footer CRC, or
            footer entries that do not tile the object's chunk region exactly.
    """

    chunks: list[ChunkInfo]

    def __init__(self, data: bytes | memoryview) -> None:
        self._data = _byte_view(data)
        self.chunks = _decode_footer(self._data)

    def records(self, chunk: ChunkInfo, base_offset: int = 0) -> list[tuple[int, Record]]:
        """Decode one chunk of this object; offsets are ``base_offset`` + relative offset.

        Markers give no record, but their timestamps count in the footer's (their batch
        was appended like any other).

        Raises:
            CorruptSegmentError: the chunk's bytes fail any check of :func:`decode_chunk`,
                lie outside the object, or disagree with the footer's timestamps.
        """
        end = chunk.position + chunk.length
        if chunk.position < 0 or chunk.length <= 0 or end > len(self._data):
            raise CorruptSegmentError(
                f"chunk [{chunk.position}, {end}) lies outside the {len(self._data)}-byte object"
            )
        out: list[tuple[int, Record]] = []
        markers: list[int] = []
        for batch in iter_chunk_batches(
            self._data[chunk.position : end], base_offset, record_count=chunk.record_count
        ):
            if batch.control:
                # A marker's one record has the batch's timestamp, as the footer counted it.
                if not batch.attributes & _LOG_APPEND_TIME:
                    markers.append(batch.first_timestamp_ms)
                markers.append(batch.max_timestamp_ms)
            else:
                out.extend(batch.records)
        timestamps = [record.timestamp_ms for _, record in out] + markers
        if (min(timestamps), max(timestamps)) != (chunk.min_timestamp_ms, chunk.max_timestamp_ms):
            raise CorruptSegmentError("chunk timestamps disagree with the segment footer")
        return out


def decode_chunk(
    data: bytes | memoryview,
    base_offset: int,
    record_count: int | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> list[tuple[int, Record]]:
    """Decode one chunk: the bytes [position, position + length) of a segment object.

    Every batch is checked (framing, magic 2, leader epoch -1, attributes, CRC-32C),
    relative offsets must run 0, 1, 2, ... across batches, every byte must be consumed
    and, if ``record_count`` is given, the chunk must take exactly that many offsets.
    Without ``record_count`` a chunk cut exactly between two batches cannot be told
    from a shorter chunk: callers that know the count (the footer, the index) pass it.
    A batch whose records take more than ``max_decompressed_bytes`` once decompressed
    (the topic's ``lakelog.max.decompressed.bytes``) is not inflated past that bound.

    Control batches (transaction markers) take their offset but give no record, so a
    chunk may return fewer records than ``record_count``, or none.

    Returns:
        (base_offset + relative offset, record) pairs, in offset order.

    Raises:
        BatchTooLargeError: a batch over ``max_decompressed_bytes``.
        CorruptSegmentError: on any inconsistency; never returns wrong records.
    """
    return list(iter_chunk(data, base_offset, max_decompressed_bytes, record_count))


def iter_chunk(
    data: bytes | memoryview,
    base_offset: int,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    record_count: int | None = None,
    from_offset: int = 0,
) -> Iterator[tuple[int, Record]]:
    """:func:`decode_chunk` one batch at a time: a reader that stops early decompresses
    no further batch, so it holds one batch's records, not the chunk's. Each batch is
    checked whole before any of its records is yielded. ``record_count`` (offsets, as
    the index counts them) is checked once the last batch is read: a reader that stops
    early does not check it.

    ``from_offset``: only records from that offset on are yielded; a batch wholly below
    it is framed and its CRC checked, but not decompressed or decoded (a reader resuming
    inside a chunk, as every fetch after the first does, pays for what it reads).

    Raises:
        BatchTooLargeError, CorruptSegmentError: as :func:`decode_chunk`.
    """
    records: Iterator[tuple[int, Record]] = _decode(
        data, base_offset, max_decompressed_bytes, record_count, False, from_offset
    )
    return records


class ChunkBatch(NamedTuple):
    """One checked batch of a stored chunk and its records (:func:`iter_chunk_batches`)."""

    #: Absolute offset of its first record (a marker's own offset).
    base_offset: int
    #: Offsets it takes: its record count (a marker takes one).
    offset_count: int
    #: -1 for a batch of a producer that is not idempotent (all of lakelog's own).
    producer_id: int
    producer_epoch: int
    attributes: int
    #: The header's FirstTimestamp and MaxTimestamp.
    first_timestamp_ms: int
    max_timestamp_ms: int
    #: (offset, record) pairs; none for a control batch.
    records: list[tuple[int, Record]]

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def control(self) -> bool:
        """A transaction marker: its offset is taken, its record is not data."""
        return bool(self.attributes & _CONTROL)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.offset_count - 1


def iter_chunk_batches(
    data: bytes | memoryview,
    base_offset: int,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    record_count: int | None = None,
) -> Iterator[ChunkBatch]:
    """:func:`iter_chunk` by batch, with what the batch header says of its producer:
    for readers that must know which producer wrote a record and whether it is part of
    a transaction (``drop_aborted``), and that see markers (as batches without records).

    Raises:
        BatchTooLargeError, CorruptSegmentError: as :func:`decode_chunk`.
    """
    batches: Iterator[ChunkBatch] = _decode(
        data, base_offset, max_decompressed_bytes, record_count, True
    )
    return batches


def drop_aborted(
    batches: Iterable[ChunkBatch], aborted: Iterable[tuple[int, int, int]]
) -> Iterator[tuple[int, Record]]:
    """The records of ``batches`` that no aborted transaction holds, in order.

    ``aborted``: (producer id, first offset, last offset) of each aborted transaction,
    the last offset being its abort marker's. A record is dropped when its batch is
    transactional, of that producer id, and its offset lies in [first, last]: Kafka's
    read_committed consumers drop exactly these (a non-transactional batch is never
    aborted). Markers give no record either way. With no aborted transaction this is
    every record of the batches, so a reader may always call it. One producer's
    transactions must not overlap (they do not: a producer ends one before it starts
    the next).
    """
    spans: dict[int, list[tuple[int, int]]] = {}
    for producer_id, first, last in aborted:
        spans.setdefault(producer_id, []).append((first, last))
    for of_producer in spans.values():
        of_producer.sort()
    starts = {pid: [first for first, _ in of_producer] for pid, of_producer in spans.items()}
    for batch in batches:
        ranges = spans.get(batch.producer_id) if batch.transactional else None
        if ranges is None:
            yield from batch.records
            continue
        lo, hi = batch.base_offset, batch.last_offset
        # The ranges holding part of the batch: one producer's transactions do not
        # overlap, so they are the last ones starting at or before its end.
        near = []
        i = bisect.bisect_right(starts[batch.producer_id], hi) - 1
        while i >= 0 and ranges[i][1] >= lo:
            near.append(ranges[i])
            i -= 1
        if not near:
            yield from batch.records
        elif any(f <= lo and hi <= la for f, la in near):
            continue  # wholly aborted: the usual case, a batch inside its transaction
        else:
            for offset, record in batch.records:
                if not any(f <= offset <= la for f, la in near):
                    yield offset, record


def _decode(
    data: bytes | memoryview,
    base_offset: int,
    max_decompressed_bytes: int,
    record_count: int | None,
    by_batch: bool,
    from_offset: int = 0,
) -> Iterator[Any]:
    """The one chunk decoder: (offset, record) pairs from ``from_offset`` on, or with
    ``by_batch`` a ChunkBatch per batch. One loop for both, so that the records' path
    pays one test per batch for the other (a call per batch cost up to a tenth with
    one-record batches)."""
    view = _byte_view(data)
    size = len(view)
    if size == 0:
        raise CorruptSegmentError("empty chunk: a chunk holds at least one batch")
    expected = 0  # offsets taken by the batches before this one
    pos = 0
    while pos < size:
        if size - pos < _BATCH_HEADER_SIZE:
            raise CorruptSegmentError(f"truncated batch header at byte {pos} of the chunk")
        batch_base, length, epoch, magic = _BATCH_PREFIX.unpack_from(view, pos)
        end = pos + _LENGTH_FIELD_END + length
        if length < _BATCH_HEADER_SIZE - _LENGTH_FIELD_END or end > size:
            raise CorruptSegmentError(f"batch at byte {pos}: length {length} overruns the chunk")
        if magic != _RECORD_BATCH_MAGIC:
            raise CorruptSegmentError(f"batch at byte {pos}: magic {magic}, expected 2")
        if epoch != _NO_LEADER_EPOCH:
            raise CorruptSegmentError(f"batch at byte {pos}: leader epoch {epoch}, expected -1")
        if batch_base != expected:
            raise CorruptSegmentError(
                f"batch at byte {pos}: base offset {batch_base}, expected {expected}"
            )
        header = _BATCH_HEADER.unpack_from(view, pos)
        attributes, last_delta, count = header[5], header[6], header[12]
        if attributes & ~(_CODEC_MASK | _LOG_APPEND_TIME | _TRANSACTIONAL | _CONTROL) or (
            attributes & _CODEC_MASK > _CODEC_IDS["zstd"]
        ):
            raise CorruptSegmentError(f"batch at byte {pos}: unsupported attributes {attributes}")
        if count < 1 or last_delta != count - 1:
            raise CorruptSegmentError(f"batch at byte {pos}: bad record count {count}")
        if attributes & _CONTROL and (
            count != 1 or attributes & _CODEC_MASK or not attributes & _TRANSACTIONAL
        ):
            # segments.batches.control_batch writes every marker; producers' are refused.
            raise CorruptSegmentError(
                f"batch at byte {pos}: a control batch other than one uncompressed "
                f"transactional record (attributes {attributes}, {count} records)"
            )
        # The C batch reader trusts its input (a short buffer crashes it), so it only ever
        # sees a range whose header was checked above and whose CRC is checked first.
        if crc32c.crc32c(view[pos + _CRC_FROM : end]) != header[4]:
            raise CorruptSegmentError(f"batch at byte {pos}: CRC-32C mismatch")
        records: list[tuple[int, Record]] = []
        if not by_batch and base_offset + expected + count <= from_offset:
            pass  # wholly below the reader's offset: checked, not decoded
        elif not attributes & _CONTROL:
            # A marker takes its offset and is no record: the CRC covers its bytes, and
            # readers of markers (segments.batches.read_marker) decode it themselves.
            # aiokafka inflates without a bound: it is handed the records already
            # decompressed, by a decompression that stops at the bound.
            try:
                batch = DefaultRecordBatch(plain_batch(view[pos:end], max_decompressed_bytes))
            except OverLimitError as err:
                raise BatchTooLargeError(
                    f"batch at byte {pos} decompresses to more than {err.limit} bytes "
                    f"({DECOMPRESSED_CONFIG}); it is not read (raise the topic's "
                    f"{DECOMPRESSED_CONFIG} to read it)"
                ) from None
            except ValueError as err:
                raise CorruptSegmentError(f"batch at byte {pos}: undecodable: {err}") from None
            relative = batch_base  # == offsets taken before this batch
            append = records.append
            # LogAppendTime: the decoder gives every record the batch's MaxTimestamp.
            stamp_type = 1 if attributes & _LOG_APPEND_TIME else 0
            try:
                for record in batch:
                    if record.offset != relative:
                        raise CorruptSegmentError(f"batch at byte {pos}: offsets not contiguous")
                    if base_offset + relative >= from_offset:
                        append(
                            (
                                base_offset + relative,
                                Record(
                                    record.key,
                                    record.value,
                                    record.timestamp,
                                    tuple(record.headers),
                                    stamp_type,
                                ),
                            )
                        )
                    relative += 1
            except CorruptSegmentError:
                raise
            except Exception as err:  # each codec library raises its own types: corrupt
                raise CorruptSegmentError(f"batch at byte {pos}: undecodable: {err!r}") from err
            del batch
            if relative != expected + count:
                raise CorruptSegmentError(f"batch at byte {pos}: holds fewer records than {count}")
        if by_batch:
            yield ChunkBatch(
                base_offset + expected,
                count,
                header[9],
                header[10],
                attributes,
                header[7],
                header[8],
                records,
            )
        else:
            yield from records
        expected += count
        pos = end
    if record_count is not None and expected != record_count:
        raise CorruptSegmentError(f"chunk takes {expected} offsets, expected {record_count}")


@dataclass(slots=True, eq=False)
class _ChunkBuffer:
    """One topic-partition's batches while a segment is being built."""

    topic_id: bytes
    partition: int
    batches: list[bytearray] = field(default_factory=list)
    builder: DefaultRecordBatchBuilder | None = None
    batch_count: int = 0  # records in the open batch
    closed_records: int = 0  # records in closed batches
    record_count: int = 0
    min_ts: int = _INT64_MAX
    max_ts: int = -1
    producer_batches: list[_ProducerBatch] = field(default_factory=list)
    log_append_time: bool = False


def stamp_log_append_time(batch: bytearray, append_time_ms: int) -> None:
    """Mark one v2 RecordBatch LogAppendTime in place, as a Kafka broker does: attributes
    bit 3, MaxTimestamp = ``append_time_ms``, and the CRC (which covers both) again."""
    attributes = _I16.unpack_from(batch, _ATTRIBUTES_AT)[0]
    _I16.pack_into(batch, _ATTRIBUTES_AT, attributes | _LOG_APPEND_TIME)
    _I64.pack_into(batch, _MAX_TIMESTAMP_AT, append_time_ms)
    _CRC.pack_into(batch, _CRC_AT, crc32c.crc32c(memoryview(batch)[_CRC_FROM:]))


_BYTES_OR_NONE = (bytes, type(None))
_NO_HEADERS: list[tuple[str, bytes | None]] = []  # shared: the batch builder only reads it
_Prepared = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def _prepare(record: Record) -> _Prepared:
    """Check one record against what the batch codec accepts; return its codec arguments.

    Raises:
        TypeError, ValueError: as ``SegmentBuilder.append`` documents.
    """
    key, value, timestamp = record.key, record.value, record.timestamp_ms
    # type() checks first: the common case costs two tuple lookups, subclasses still pass.
    if type(key) not in _BYTES_OR_NONE and not isinstance(key, bytes):
        raise TypeError(f"record key must be bytes or None, not {type(key).__name__}")
    if type(value) not in _BYTES_OR_NONE and not isinstance(value, bytes):
        raise TypeError(f"record value must be bytes or None, not {type(value).__name__}")
    if type(timestamp) is not int:
        raise TypeError(f"timestamp_ms must be an int, not {type(timestamp).__name__}")
    # Negative timestamps are refused: Kafka allows only -1 ("none"), and aiokafka's C
    # builder mistakes a first timestamp of -1 for "unset" and writes the wrong one.
    if not 0 <= timestamp <= _INT64_MAX:
        raise ValueError(f"timestamp_ms must be in [0, 2**63): {timestamp}")
    if not record.headers:
        return timestamp, key, value, _NO_HEADERS
    headers: list[tuple[str, bytes | None]] = []
    for h_key, h_value in record.headers:
        if not isinstance(h_key, str):
            raise TypeError(f"header key must be str, not {type(h_key).__name__}")
        try:
            h_key.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"header key {h_key!r} is not valid UTF-8 text") from err
        if h_value is not None and not isinstance(h_value, bytes):
            raise TypeError(f"header value must be bytes or None, not {type(h_value).__name__}")
        headers.append((h_key, h_value))
    return timestamp, key, value, headers


def _encode_footer(infos: list[ChunkInfo]) -> bytes:
    """Footer entries, footer length, magic and the CRC over all of them."""
    footer = bytearray(_FOOTER_COUNT.pack(len(infos)))
    for info in infos:
        footer += _FOOTER_ENTRY.pack(
            info.topic_id,
            info.partition,
            info.position,
            info.length,
            info.record_count,
            info.min_timestamp_ms,
            info.max_timestamp_ms,
        )
    footer_length = len(footer)
    footer += _TRAILER.pack(footer_length, MAGIC, 0)
    crc = calc_crc32c(bytes(footer[:-_CRC_SIZE]))
    struct.pack_into(">I", footer, len(footer) - _CRC_SIZE, crc)
    return bytes(footer)


def _decode_footer(view: memoryview) -> list[ChunkInfo]:
    """Validate the trailer and footer of a whole object and return its chunk entries."""
    size = len(view)
    if size < _TRAILER.size:
        raise CorruptSegmentError(f"{size} bytes: too short for a segment object")
    footer_length, magic, crc = _TRAILER.unpack_from(view, size - _TRAILER.size)
    if magic[: len(_MAGIC_PREFIX)] != _MAGIC_PREFIX:
        raise CorruptSegmentError("not a segment object: bad magic")
    if magic != MAGIC:
        (version,) = struct.unpack_from(">H", magic, len(_MAGIC_PREFIX))
        raise CorruptSegmentError(f"unsupported segment format version {version}")
    footer_start = size - _TRAILER.size - footer_length
    if footer_length < _FOOTER_COUNT.size or footer_start < 0:
        raise CorruptSegmentError(f"footer length {footer_length} does not fit the object")
    if calc_crc32c(view[footer_start : size - _CRC_SIZE].tobytes()) != crc:
        raise CorruptSegmentError("footer CRC-32C mismatch")
    (count,) = _FOOTER_COUNT.unpack_from(view, footer_start)
    if footer_length != _FOOTER_COUNT.size + count * _FOOTER_ENTRY.size:
        raise CorruptSegmentError(f"footer length {footer_length} does not hold {count} chunks")
    chunks: list[ChunkInfo] = []
    seen: set[tuple[bytes, int]] = set()
    position = 0
    for i in range(count):
        fields = _FOOTER_ENTRY.unpack_from(
            view, footer_start + _FOOTER_COUNT.size + i * _FOOTER_ENTRY.size
        )
        info = ChunkInfo(*fields)
        if (
            info.position != position
            or info.length < _BATCH_HEADER_SIZE
            or info.partition < 0
            or info.record_count < 1
            or info.min_timestamp_ms > info.max_timestamp_ms
            or (info.topic_id, info.partition) in seen
        ):
            raise CorruptSegmentError(f"footer entry {i} is inconsistent: {info}")
        seen.add((info.topic_id, info.partition))
        chunks.append(info)
        position += info.length
    if position != footer_start:
        raise CorruptSegmentError(
            f"chunks end at byte {position}, the footer starts at {footer_start}"
        )
    return chunks


def _byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")
