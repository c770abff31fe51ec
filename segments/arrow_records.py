"""Kafka v2 RecordBatches built column-wise from Arrow arrays: no Python per record.

What ``segments.segment`` builds record by record through aiokafka's codec, built here
for a whole Arrow column at once with ``pyarrow.compute`` kernels, for writers that hold
their records as Arrow (Spark writes). The bytes are the same layout (the batch header
drawn in ``segments.segment``; each record Kafka's varint record)::

    record = varint(length of the rest) i8 attributes(0) varlong timestampDelta(0)
             varint offsetDelta varint keyLength(-1: null) key
             varint valueLength(-1: null) value varint headerCount
             headerCount x (varint keyLength key varint valueLength(-1: null) value)

Every record of a call has the same timestamp (the writer's clock), so timestampDelta
is 0. Varints are zigzag-encoded, 7 bits a byte, least significant group first.

How: each varint column is made as 64-bit words (one per record, its bytes in the
word's little-endian order, the continuation bits set), whose buffer read as bytes and
filtered to the bytes in use is the column's bytes; ``binary_join_element_wise`` then
concatenates, record by record, the varint columns and the key, value and header columns
into the records' bytes, back to back. A batch's records are one slice of that buffer.

Kafka's key partitioning (murmur2) is here too, column-wise (:func:`partitions_for_keys`),
checked against ``segments.partitioning`` (aiokafka's port of the Java client's hash).

Pure functions over Arrow arrays: no I/O.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import crc32c
import pyarrow as pa
import pyarrow.compute as pc
from aiokafka.codec import gzip_encode, lz4_encode, snappy_encode, zstd_encode

from segments.partitioning import partition_for_key

__all__ = [
    "HeaderBlobs",
    "arange",
    "as_large_binary",
    "batch_bytes",
    "byte_count",
    "cut_batches",
    "encode_records",
    "header_blobs",
    "partitions_for_keys",
    "record_offsets",
    "record_sizes_estimate",
    "varints",
]

_LITTLE_ENDIAN = sys.byteorder == "little"
_HEADER = struct.Struct(">qiibIhiqqqhii")  # the v2 RecordBatch header, 61 bytes
HEADER_SIZE = _HEADER.size
_CRC_FROM = 21
_ATTRIBUTES_AT = 21
#: aiokafka's encoders, as its batch builder compresses (a batch stays plain when
#: compression does not make it smaller).
_ENCODERS: dict[int, Callable[[bytes], bytes]] = {
    1: gzip_encode,
    2: snappy_encode,
    3: lz4_encode,
    4: zstd_encode,
}
#: Varint widths: zigzag values below 2**35 (lengths below 2**31, Kafka's bound) take
#: at most five bytes.
_MAX_VARINT = 5
_EMPTY = pa.scalar(b"", pa.large_binary())
_TWO_ZEROS = pa.scalar(b"\x00\x00", pa.large_binary())  # attributes 0, timestampDelta 0

_I64 = pa.int64()
_U32 = pa.uint32()
_U8 = pa.uint8()
_LB = pa.large_binary()


def as_large_binary(array: pa.Array) -> pa.Array:
    """A string or binary column (any offset width) as ``large_binary``; strings as their
    UTF-8 bytes. Other types are refused."""
    t = array.type
    if pa.types.is_large_binary(t):
        return array
    if pa.types.is_large_string(t):
        return array.view(_LB)
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return pc.cast(array if pa.types.is_binary(t) else array.view(pa.binary()), _LB)
    if pa.types.is_null(t):
        return pa.nulls(len(array), _LB)
    raise TypeError(f"expected a string or binary column, not {t}")


def arange(n: int) -> pa.Array:
    """0, 1, ..., n - 1 as int64."""
    if n == 0:
        return pa.array([], _I64)
    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, _I64), n)), 1)


_FIRST_BYTE_CACHE: dict[int, pa.Array] = {}


def _first_bytes(n: int) -> pa.Array:
    """A boolean per byte of ``n`` 8-byte words: True for each word's first byte."""
    cached = _FIRST_BYTE_CACHE.get(n)
    if cached is None:
        one = pa.py_buffer(b"\x01" + b"\x00" * 7)
        data = pa.py_buffer(one.to_pybytes() * n)
        cached = pc.cast(pa.Array.from_buffers(_U8, 8 * n, [None, data]), pa.bool_())
        if len(_FIRST_BYTE_CACHE) > 8:
            _FIRST_BYTE_CACHE.clear()
        _FIRST_BYTE_CACHE[n] = cached
    return cached


def zigzag(values: pa.Array) -> pa.Array:
    """Kafka's zigzag of int64 values >= -1 (lengths, -1 for null): 2v, or 1 for -1."""
    return pc.if_else(pc.equal(values, -1), pa.scalar(1, _I64), pc.multiply(values, 2))


def varint_widths(z: pa.Array) -> pa.Array:
    """Bytes each varint of the zigzagged values ``z`` (int64, >= 0) takes."""
    width: pa.Array = pa.repeat(pa.scalar(1, _I64), len(z))
    top = pc.max(z).as_py() if len(z) else 0
    for k in range(1, _MAX_VARINT):
        if top is None or top < 1 << (7 * k):
            break
        width = pc.add(width, pc.cast(pc.greater_equal(z, 1 << (7 * k)), _I64))
    return width


def varints(z: pa.Array, widths: pa.Array | None = None) -> pa.Array:
    """The varint bytes of each zigzagged value of ``z`` (int64, 0 <= z < 2**35), as a
    ``large_binary`` column."""
    n = len(z)
    if n == 0:
        return pa.array([], _LB)
    if not _LITTLE_ENDIAN:  # the word trick below reads words as bytes, low byte first
        return pa.array([_varint_bytes(v) for v in z.to_pylist()], _LB)
    if widths is None:
        widths = varint_widths(z)
    top = pc.max(widths).as_py()
    word = pc.bit_wise_and(z, 0x7F)
    for k in range(1, top):
        part = pc.shift_left(pc.bit_wise_and(pc.shift_right(z, 7 * k), 0x7F), 8 * k)
        more = pc.shift_left(pc.cast(pc.greater_equal(z, 1 << (7 * k)), _I64), 8 * k - 1)
        word = pc.bit_wise_or(word, pc.bit_wise_or(part, more))
    offsets = pc.cumulative_sum(widths)
    offsets_buf = pa.concat_arrays([pa.array([0], _I64), offsets]).buffers()[1]
    if top == 1:
        data = pc.cast(word, _U8)
    else:
        word = word.combine_chunks() if isinstance(word, pa.ChunkedArray) else word
        as_bytes = pa.Array.from_buffers(
            _U8, 8 * n, [None, word.buffers()[1]], offset=8 * word.offset
        )
        # A word's bytes after its last are 0; its bytes before are not (continuation
        # bit), nor its last unless it is the first (a varint of 0 is one 0 byte).
        keep = pc.or_(pc.not_equal(as_bytes, 0), _first_bytes(n))
        data = pc.filter(as_bytes, keep)
    return pa.Array.from_buffers(_LB, n, [None, offsets_buf, data.buffers()[1]], offset=0)


def _varint_bytes(z: int) -> bytes:
    out = bytearray()
    while True:
        if z < 0x80:
            out.append(z)
            return bytes(out)
        out.append((z & 0x7F) | 0x80)
        z >>= 7


def byte_count(column: pa.Array) -> pa.Array:
    """Byte length of each value as int64, 0 for null."""
    return pc.fill_null(pc.cast(pc.binary_length(column), _I64), 0)


def _lengths(column: pa.Array) -> pa.Array:
    """Byte length of each value as int64, -1 for null."""
    return pc.fill_null(pc.cast(pc.binary_length(column), _I64), -1)


def _nonneg(lengths: pa.Array) -> pa.Array:
    return pc.max_element_wise(lengths, 0)


@dataclass(frozen=True, slots=True)
class HeaderBlobs:
    """Each record's headers, encoded: their count and their bytes after the count."""

    counts: pa.Array  # int64
    blobs: pa.Array  # large_binary, "" for none
    sizes: pa.Array  # int64: what max.message.bytes counts of them (see check_record_size)

    def map(self, fn: Callable[[pa.Array], pa.Array]) -> HeaderBlobs:
        """The same with ``fn`` applied to each column (a filter, a take)."""
        return HeaderBlobs(fn(self.counts), fn(self.blobs), fn(self.sizes))


def header_blobs(headers: pa.Array | None, n: int) -> HeaderBlobs:
    """The Kafka sink's ``headers`` column (``array<struct<key:string,value:binary>>``)
    as each record's encoded headers; ``None``: no headers at all.

    Raises:
        TypeError: a header with a null key (Kafka header keys are strings).
    """
    zeros = pa.repeat(pa.scalar(0, _I64), n)
    if headers is None or n == 0 or headers.null_count == n:
        return HeaderBlobs(zeros, pa.repeat(_EMPTY, n), zeros)
    counts = pc.fill_null(pc.cast(pc.list_value_length(headers), _I64), 0)
    entries = pc.list_flatten(headers)
    if len(entries) == 0:
        return HeaderBlobs(counts, pa.repeat(_EMPTY, n), zeros)
    if entries.null_count:
        raise TypeError("a header is null: each needs a key (string) and a value")
    names = dict(zip((f.name for f in entries.type), entries.flatten(), strict=True))
    keys, values = names["key"], names["value"]
    if keys.null_count:
        raise TypeError("header key must be str, not NoneType")
    keys_b, values_b = as_large_binary(keys), as_large_binary(values)
    key_len, value_len = _lengths(keys_b), _lengths(values_b)
    each = pc.binary_join_element_wise(
        varints(zigzag(key_len)),
        keys_b,
        varints(zigzag(value_len)),
        values_b,
        _EMPTY,
        null_handling="replace",
        null_replacement="",
    )
    # Per record: the run of its entries' bytes (entries are in record order).
    bounds = pa.concat_arrays([pa.array([0], _I64), pc.cumulative_sum(counts)])
    entry_offsets = _offsets(each)
    blob_offsets = pc.take(entry_offsets, bounds)
    start = blob_offsets[0].as_py()
    if start:
        blob_offsets = pc.subtract(blob_offsets, start)
    data = _data(each).slice(start) if start else _data(each)
    blobs = pa.Array.from_buffers(_LB, n, [None, blob_offsets.buffers()[1], data])
    # As check_record_size counts a header: its key's characters, its value's bytes, 10.
    size = pc.add(pc.add(pc.cast(pc.utf8_length(keys), _I64), _nonneg(value_len)), 10)
    summed = pc.take(pa.concat_arrays([pa.array([0], _I64), pc.cumulative_sum(size)]), bounds)
    sizes = pc.subtract(summed.slice(1), summed.slice(0, n))
    return HeaderBlobs(counts, blobs, sizes)


def _offsets(array: pa.Array) -> pa.Array:
    """The int64 offsets (n + 1) of a ``large_binary`` array, its slice taken into account."""
    buf = array.buffers()[1]
    return pa.Array.from_buffers(_I64, len(array) + 1, [None, buf], offset=array.offset)


def _data(array: pa.Array) -> pa.Buffer:
    return array.buffers()[2]


def record_offsets(encoded: pa.Array) -> list[int]:
    """Where each record of :func:`encode_records`' answer starts in its data buffer,
    and where the last ends (n + 1 ints)."""
    offsets: list[int] = _offsets(encoded).to_pylist()
    return offsets


def encode_records(
    keys: pa.Array,
    values: pa.Array,
    headers: HeaderBlobs,
    offset_deltas: pa.Array,
) -> pa.Array:
    """Each record's bytes (``large_binary``), given its offset delta in its batch.

    ``keys``, ``values``: ``large_binary`` (null: a null key or value).
    """
    key_len, value_len = _lengths(keys), _lengths(values)
    z_delta, z_key, z_value = zigzag(offset_deltas), zigzag(key_len), zigzag(value_len)
    w_delta, w_key, w_value = varint_widths(z_delta), varint_widths(z_key), varint_widths(z_value)
    w_count = varint_widths(pc.multiply(headers.counts, 2))
    body = pc.add(
        pc.add(
            pc.add(pc.add(w_delta, w_key), pc.add(w_value, w_count)),
            pc.add(_nonneg(key_len), _nonneg(value_len)),
        ),
        pc.add(pc.binary_length(headers.blobs).cast(_I64), 2),  # + attributes, timestampDelta
    )
    return pc.binary_join_element_wise(
        varints(pc.multiply(body, 2)),
        _TWO_ZEROS,
        varints(z_delta, w_delta),
        varints(z_key, w_key),
        keys,
        varints(z_value, w_value),
        values,
        varints(pc.multiply(headers.counts, 2), w_count),
        headers.blobs,
        _EMPTY,
        null_handling="replace",
        null_replacement="",
    )


def record_sizes_estimate(keys: pa.Array, values: pa.Array, headers: HeaderBlobs) -> pa.Array:
    """An upper bound of each record's encoded bytes (for cutting batches before the
    offset deltas are known): five bytes for every varint but the header blobs'."""
    return pc.add(
        pc.add(_nonneg(_lengths(keys)), _nonneg(_lengths(values))),
        pc.add(pc.binary_length(headers.blobs).cast(_I64), 2 + 4 * _MAX_VARINT),
    )


def batch_bytes(
    records: memoryview | bytes, count: int, timestamp_ms: int, codec: int
) -> bytearray:
    """One v2 RecordBatch around ``count`` encoded records: BaseOffset 0, no producer
    id, FirstTimestamp = MaxTimestamp = ``timestamp_ms``; compressed with ``codec``
    (Kafka's attribute code) when that makes it smaller."""
    attributes = 0
    body: bytes | memoryview = records
    encoder = _ENCODERS.get(codec)
    if encoder is not None:
        packed = encoder(bytes(records))
        if len(packed) < len(records):
            body, attributes = packed, codec
    header = bytearray(
        _HEADER.pack(
            0,
            HEADER_SIZE - 12 + len(body),
            -1,
            2,
            0,
            attributes,
            count - 1,
            timestamp_ms,
            timestamp_ms,
            -1,
            -1,
            -1,
            count,
        )
    )
    crc = crc32c.crc32c(body, value=crc32c.crc32c(memoryview(header)[_CRC_FROM:]))
    struct.pack_into(">I", header, 17, crc)
    header += body  # one copy of the records
    return header


def cut_batches(
    run_ends: list[int], estimates: list[int], max_batch_bytes: int
) -> Iterator[tuple[int, int]]:
    """[start, end) row ranges of batches: within each run (rows [previous end, end) of
    one partition), as many rows as fit ``max_batch_bytes`` by their cumulative
    ``estimates`` (running sums, one per row); a row that does not fit alone gets a
    batch of its own."""
    from bisect import bisect_right

    budget = max_batch_bytes - HEADER_SIZE
    start = 0
    for end in run_ends:
        at = start
        while at < end:
            before = estimates[at - 1] if at else 0
            stop = bisect_right(estimates, before + budget, at, end)
            stop = max(stop, at + 1)
            yield at, stop
            at = stop
        start = end


# Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), column-wise.
_SEED = 0x9747B28C
_M = 0x5BD1E995
#: Keys longer than this are hashed one by one (each 4-byte block is a pass over the
#: column): long keys are rare, and a few passes cost more than a few Python calls.
VECTOR_KEY_BYTES = 128


def _u32(value: int) -> pa.Scalar:
    return pa.scalar(value, _U32)


def partitions_for_keys(keys: pa.Array, partitions: int) -> pa.Array:
    """``toPositive(murmur2(key)) % partitions`` for each non-null key of a
    ``large_binary`` column (int64; null where the key is null), as
    ``segments.partitioning.partition_for_key`` gives one key's."""
    n = len(keys)
    if n == 0:
        return pa.array([], _I64)
    lengths = pc.cast(pc.fill_null(pc.binary_length(keys), 0), _I64)
    if pc.max(lengths).as_py() > VECTOR_KEY_BYTES:
        long = pc.greater(lengths, VECTOR_KEY_BYTES)
        short_keys = pc.if_else(long, pa.scalar(b"", _LB), keys)
        hashed = partitions_for_keys(short_keys, partitions).to_pylist()
        for i in pc.indices_nonzero(long).to_pylist():
            hashed[i] = partition_for_key(keys[i].as_py(), partitions)
        return pa.array(hashed, _I64)
    data = pa.Array.from_buffers(_U8, len(_data(keys)) if _data(keys) else 0, [None, _data(keys)])
    starts = _offsets(keys).slice(0, n)
    m = _u32(_M)
    h = pc.bit_wise_xor(pc.cast(lengths, _U32), _u32(_SEED))
    blocks = pc.divide(lengths, 4)
    last = max(len(data) - 1, 0)

    def byte_at(pos: pa.Array) -> pa.Array:
        return pc.cast(pc.take(data, pc.min_element_wise(pos, last)), _U32)

    if len(data):
        for i in range(pc.max(blocks).as_py()):
            at = pc.add(starts, 4 * i)
            k = byte_at(at)
            for b in range(1, 4):
                k = pc.bit_wise_or(k, pc.shift_left(byte_at(pc.add(at, b)), _u32(8 * b)))
            k = pc.multiply(k, m)
            k = pc.bit_wise_xor(k, pc.shift_right(k, _u32(24)))
            k = pc.multiply(k, m)
            mixed = pc.bit_wise_xor(pc.multiply(h, m), k)
            h = pc.if_else(pc.greater(blocks, i), mixed, h)
        tail = pc.add(starts, pc.multiply(blocks, 4))
        extra = pc.subtract(lengths, pc.multiply(blocks, 4))
        for b in (2, 1):
            h = pc.if_else(
                pc.greater(extra, b),
                pc.bit_wise_xor(h, pc.shift_left(byte_at(pc.add(tail, b)), _u32(8 * b))),
                h,
            )
        h = pc.if_else(pc.greater(extra, 0), pc.multiply(pc.bit_wise_xor(h, byte_at(tail)), m), h)
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(13)))
    h = pc.multiply(h, m)
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(15)))
    positive = pc.cast(pc.bit_wise_and(h, _u32(0x7FFFFFFF)), _I64)
    quotient = pc.divide(positive, partitions)
    part = pc.subtract(positive, pc.multiply(quotient, partitions))
    return pc.if_else(pc.is_valid(keys), part, pa.scalar(None, _I64))
