"""Kafka v2 RecordBatches as producers send them and as Fetch returns them: pure functions.

The batch layout is the one drawn at the top of ``segments.segment``; what matters here::

    0   i64  BaseOffset            patched: relative in a chunk, absolute in a Fetch answer
    8   i32  Length                bytes after this field
    12  i32  PartitionLeaderEpoch  not covered by the CRC; stored as -1
    16  i8   Magic                 2
    17  u32  CRC                   CRC-32C of bytes [21, 12 + Length)
    21  i16  Attributes            codec in bits 0-2; bit 3 LogAppendTime (refused from
                                   producers), bit 4 transactional (accepted from
                                   idempotent producers), bit 5 control (refused:
                                   only lakelog writes markers)
    23  i32  LastOffsetDelta
    27  i64  FirstTimestamp
    35  i64  MaxTimestamp
    43  i64  ProducerId            >= 0 for idempotent producers
    51  i16  ProducerEpoch
    53  i32  BaseSequence
    57  i32  RecordCount

A producer's batch is checked (framing, magic, CRC, attributes, its records'
decompressed size against a bound, and every record decoded once so that its count,
offset deltas and timestamps are known and a batch that cannot be read back is refused;
for a compacted topic, that every record has a key)
and then stored byte for byte: neither decompressed into the store nor re-encoded. Only
BaseOffset and PartitionLeaderEpoch, which the CRC does not cover, are ever rewritten.

Transactions (issue 30): a transactional producer's batches are stored like any other;
the coordinator ends each transaction with a marker, :func:`control_batch`, stored in the
partition's log where it takes one offset. Fetch serves markers as stored (Kafka clients
need them to drop aborted records); every decoder into records skips them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import crc32c
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from segments.compression import (
    DECOMPRESSED_CONFIG,
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    OverLimitError,
    plain_batch,
)
from segments.errors import (
    CorruptRecordError,
    CorruptSegmentError,
    InvalidRecordError,
    RecordTooLargeError,
)
from segments.types import ConsumedRecord

__all__ = [
    "BatchInfo",
    "Pieces",
    "check_batches",
    "compressed",
    "control_batch",
    "encode_records",
    "fetch_batches",
    "iter_batches",
    "read_marker",
]

_HEADER = struct.Struct(">qiibIhiqqqhii")  # 61 bytes
HEADER_SIZE = _HEADER.size
_LENGTH_FIELD_END = 12
_CRC_FROM = 21  # the CRC covers Attributes through the last record
_BASE_OFFSET = struct.Struct(">q")
_CODEC_MASK = 0x07
_MAX_CODEC = 4  # zstd
_TIMESTAMP_TYPE = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_CRC = struct.Struct(">I")
_CRC_AT = 17
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = 21
_CONTROL_KEY = struct.Struct(">hh")  # ControlRecordType: version 0, type
_END_TXN_MARKER = struct.Struct(">hi")  # EndTransactionMarker: version 0, coordinator epoch
ABORT = 0
COMMIT = 1


#: Pieces shorter than this are copied into one buffer rather than kept by reference.
SMALL_PIECE = 16 << 10


class Pieces:
    """Bytes kept as the pieces they are made of, in order, never joined.

    A Fetch answer of many MiB is mostly views of chunks the read cache holds: kept as
    views, they reach the socket with no copy in Python (joining them, then encoding the
    answer around them, cost two copies of every byte served). A piece shorter than
    ``SMALL_PIECE`` is copied into a buffer shared with its short neighbours, so that
    many small batches do not become many small writes.
    """

    __slots__ = ("_tail", "parts", "size")

    def __init__(self) -> None:
        self.parts: list[bytes | bytearray | memoryview] = []
        self.size = 0
        self._tail: bytearray | None = None

    def __iadd__(self, data: bytes | bytearray | memoryview | Pieces) -> Pieces:
        n = len(data)
        if isinstance(data, Pieces):
            for part in data.parts:
                self += part
            return self
        if n < SMALL_PIECE:
            if self._tail is None:
                self._tail = bytearray()
                self.parts.append(self._tail)
            self._tail += data
        else:
            self.parts.append(data)
            self._tail = None
        self.size += n
        return self

    write = __iadd__  # a file-like target for encoders (kio's writers)

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    def clear(self) -> None:
        self.parts.clear()
        self.size = 0
        self._tail = None


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """One checked producer batch: where it lies in the request and what it holds."""

    position: int
    length: int
    record_count: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    attributes: int

    @property
    def idempotent(self) -> bool:
        return self.producer_id >= 0

    @property
    def transactional(self) -> bool:
        """Part of a transaction: its records wait for a commit or abort marker."""
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def codec(self) -> int:
        return self.attributes & _CODEC_MASK


def check_batches(
    data: bytes | memoryview,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    *,
    keys_required: bool = False,
) -> list[BatchInfo]:
    """Check the RecordBatches of one partition of a Produce request.

    Records are decompressed by :func:`segments.compression.plain_batch`, which stops at
    ``max_decompressed_bytes`` (the topic's ``lakelog.max.decompressed.bytes``).
    ``keys_required``: the topic is compacted, and a record without a key is refused.

    Raises:
        CorruptRecordError: bad framing, magic, CRC, attributes, or records that do not
            decode or do not match the header (Kafka's CORRUPT_MESSAGE); also an empty
            record set, a control batch (markers are written by lakelog, never by a
            producer) and a transactional batch without a producer id (a transaction
            belongs to an idempotent producer).
        RecordTooLargeError: a batch whose records take more than
            ``max_decompressed_bytes`` once decompressed (Kafka's MESSAGE_TOO_LARGE).
        InvalidRecordError: with ``keys_required``, a record without a key (Kafka's
            INVALID_RECORD).
    """
    view = memoryview(data)
    size = len(view)
    if size == 0:
        raise CorruptRecordError("The record set is empty.")
    out: list[BatchInfo] = []
    pos = 0
    while pos < size:
        if size - pos < HEADER_SIZE:
            raise CorruptRecordError(f"Truncated batch header at byte {pos}.")
        (_, length, _, magic, crc, attributes, last_delta, _, _, pid, epoch, seq, count) = (
            _HEADER.unpack_from(view, pos)
        )
        end = pos + _LENGTH_FIELD_END + length
        if length < HEADER_SIZE - _LENGTH_FIELD_END or end > size:
            raise CorruptRecordError(f"Batch at byte {pos}: length {length} overruns the data.")
        if magic != 2:
            raise CorruptRecordError(f"Batch at byte {pos}: magic {magic}; only v2 is accepted.")
        if attributes & _CONTROL:
            raise CorruptRecordError(
                f"Batch at byte {pos}: a control batch; only the transaction coordinator "
                "writes markers."
            )
        if attributes & _TRANSACTIONAL and pid < 0:
            raise CorruptRecordError(
                f"Batch at byte {pos}: a transactional batch without a producer id "
                f"({pid}); transactions need an idempotent producer."
            )
        if attributes & ~(_CODEC_MASK | _TRANSACTIONAL) or attributes & _CODEC_MASK > _MAX_CODEC:
            raise CorruptRecordError(f"Batch at byte {pos}: unsupported attributes {attributes}.")
        if count < 1 or last_delta != count - 1:
            raise CorruptRecordError(
                f"Batch at byte {pos}: {count} records with last offset delta {last_delta}."
            )
        # crc32c (kio's dependency) uses the CPU's CRC instruction: ~3x aiokafka's.
        if crc32c.crc32c(view[pos + _CRC_FROM : end]) != crc:
            raise CorruptRecordError(f"Batch at byte {pos}: CRC-32C mismatch.")
        try:
            plain = plain_batch(view[pos:end], max_decompressed_bytes)
        except OverLimitError as e:
            raise RecordTooLargeError(
                f"Batch at byte {pos}: its records decompress to more than {e.limit} bytes, "
                f"the topic's {DECOMPRESSED_CONFIG}."
            ) from None
        except ValueError as e:
            raise CorruptRecordError(f"Batch at byte {pos}: undecodable records: {e}") from None
        lo, hi = _check_records(DefaultRecordBatch(plain), pos, count, keys_required)
        del plain
        out.append(BatchInfo(pos, end - pos, count, lo, hi, pid, epoch, seq, attributes))
        pos = end
    return out


def _check_records(
    batch: DefaultRecordBatch, pos: int, count: int, keys_required: bool
) -> tuple[int, int]:
    """Decode every record once; returns (min, max) timestamp."""
    expected = 0
    lo, hi = 1 << 63, -(1 << 63)
    try:
        for record in batch:
            if record.offset != expected:
                raise CorruptRecordError(f"Batch at byte {pos}: offset deltas not contiguous.")
            if keys_required and record.key is None:
                raise InvalidRecordError(
                    f"Compacted topic cannot accept message without key (record {expected} "
                    f"of the batch at byte {pos})."
                )
            ts = record.timestamp
            lo = min(lo, ts)
            hi = max(hi, ts)
            expected += 1
    except (CorruptRecordError, InvalidRecordError):
        raise
    except Exception as e:  # each codec library raises its own types
        raise CorruptRecordError(f"Batch at byte {pos}: undecodable records: {e!r}") from e
    if expected != count:
        raise CorruptRecordError(f"Batch at byte {pos}: {expected} records, header says {count}.")
    if lo < -1:
        raise CorruptRecordError(f"Batch at byte {pos}: negative record timestamp {lo}.")
    return lo, hi


def compressed(data: bytes | memoryview) -> bool:
    """Whether any batch of a producer's record set names a codec (framing only; a
    malformed set answers True: checking it is left to :func:`check_batches`)."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        if len(view) - pos < HEADER_SIZE:
            return True
        header = _HEADER.unpack_from(view, pos)
        if header[5] & _CODEC_MASK or header[1] < HEADER_SIZE - _LENGTH_FIELD_END:
            return True
        pos += _LENGTH_FIELD_END + header[1]
    return False


def iter_batches(chunk: bytes | memoryview) -> Iterator[tuple[int, int, int, int]]:
    """(position, end, relative base offset, record count) of each batch of a stored chunk.

    Only framing is read (the chunk was checked when it was written and is checked
    again by whoever decodes it).

    Raises:
        CorruptSegmentError: a header that overruns the chunk.
    """
    view = memoryview(chunk)
    size = len(view)
    pos = 0
    while pos < size:
        if size - pos < HEADER_SIZE:
            raise CorruptSegmentError(f"truncated batch header at byte {pos} of the chunk")
        header = _HEADER.unpack_from(view, pos)
        end = pos + _LENGTH_FIELD_END + header[1]
        if header[1] < HEADER_SIZE - _LENGTH_FIELD_END or end > size:
            raise CorruptSegmentError(f"batch at byte {pos}: length {header[1]} overruns")
        yield pos, end, header[0], header[12]
        pos = end


def fetch_batches(
    chunk: bytes | memoryview,
    base_offset: int,
    from_offset: int,
    out: Pieces,
    budget: int,
    first_may_exceed: bool = False,
    until: int | None = None,
) -> bool:
    """Append a stored chunk's batches to ``out`` as a Fetch returns them.

    Each gets its absolute base offset (a piece of its own: the rest of the batch goes
    as a view of ``chunk``, not a copy); nothing else of a batch changes, so its CRC
    still holds. Batches wholly below ``from_offset`` are left out; the batch holding
    it goes whole (clients skip the records before their position, as with Kafka).
    Batches are added while ``out`` stays within ``budget`` bytes; with
    ``first_may_exceed`` an empty ``out`` takes its first batch whatever its size.
    ``until``: no batch from that offset on (a read_committed Fetch stops at the last
    stable offset, which may fall inside a chunk: it is always a batch's base offset).

    Returns:
        False once a batch did not fit or ``until`` was reached (the caller stops),
        else True.
    """
    view = memoryview(chunk)
    for pos, end, relative, count in iter_batches(view):
        if base_offset + relative + count <= from_offset:
            continue
        if until is not None and base_offset + relative >= until:
            return False
        if len(out) + end - pos > budget and (out or not first_may_exceed):
            return False
        out += _BASE_OFFSET.pack(base_offset + relative)
        out += view[pos + _BASE_OFFSET.size : end]
    return True


def control_batch(
    producer_id: int,
    epoch: int,
    commit: bool,
    timestamp_ms: int,
    coordinator_epoch: int = 0,
) -> bytes:
    """One transaction marker, as Kafka writes it at the end of a transaction.

    A v2 batch (base offset 0, leader epoch -1, no compression, base sequence -1) with
    the transactional and control attributes and one record: its key is the
    ControlRecordType (version 0, type 1 = COMMIT or 0 = ABORT), its value the
    EndTransactionMarker (version 0, coordinator epoch). The marker takes one offset of
    the partition; Fetch serves it as stored, and every decoder into records skips it.
    """
    # aiokafka's builder writes the transactional bit but has no control bit: it is set
    # here and the CRC (which covers the attributes) computed again.
    builder = DefaultRecordBatchBuilder(2, 0, 1, producer_id, epoch, -1, 1 << 20)
    key = _CONTROL_KEY.pack(0, COMMIT if commit else ABORT)
    value = _END_TXN_MARKER.pack(0, coordinator_epoch)
    builder.append(0, timestamp_ms, key, value, [])
    batch: bytearray = builder.build()
    (attributes,) = _ATTRIBUTES.unpack_from(batch, _ATTRIBUTES_AT)
    _ATTRIBUTES.pack_into(batch, _ATTRIBUTES_AT, attributes | _TRANSACTIONAL | _CONTROL)
    _CRC.pack_into(batch, _CRC_AT, crc32c.crc32c(memoryview(batch)[_CRC_FROM:]))
    return bytes(batch)


def read_marker(batch: bytes | memoryview) -> tuple[int, int, bool] | None:
    """(producer id, producer epoch, commit) of a control batch; None for a data batch.

    Only the first batch of ``batch`` is read, and only its header and first record.

    Raises:
        CorruptSegmentError: a control batch whose record is not a transaction marker.
    """
    view = memoryview(batch)
    if len(view) < HEADER_SIZE:
        raise CorruptSegmentError("truncated batch header")
    header = _HEADER.unpack_from(view, 0)
    if not header[5] & _CONTROL:
        return None
    end = _LENGTH_FIELD_END + header[1]
    records = list(DefaultRecordBatch(bytes(view[:end])))
    key = records[0].key if records else None
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptSegmentError("a control batch without a control record key")
    _, kind = _CONTROL_KEY.unpack_from(key)
    if kind not in (ABORT, COMMIT):
        raise CorruptSegmentError(f"a control record of unknown type {kind}")
    return header[9], header[10], kind == COMMIT


def encode_records(records: Iterable[ConsumedRecord], max_batch_bytes: int = 1 << 20) -> bytes:
    """Records (e.g. tier rows) encoded as uncompressed batches with absolute offsets.

    Offsets may have gaps (compaction): each batch's records carry their deltas from
    the batch's base offset, as a compacted Kafka log's batches do.
    """
    out = bytearray()
    builder: DefaultRecordBatchBuilder | None = None
    base = 0
    for rec in records:
        if builder is not None:
            meta = builder.append(
                rec.offset - base, rec.timestamp_ms, rec.key, rec.value, list(rec.headers)
            )
            if meta is not None:
                continue
            out += _finish(builder, base)
        base = rec.offset
        builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, max_batch_bytes)
        builder.append(0, rec.timestamp_ms, rec.key, rec.value, list(rec.headers))
    if builder is not None:
        out += _finish(builder, base)
    return bytes(out)


def _finish(builder: DefaultRecordBatchBuilder, base: int) -> bytearray:
    batch: bytearray = builder.build()
    _BASE_OFFSET.pack_into(batch, 0, base)
    return batch
