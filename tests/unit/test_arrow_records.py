"""Kafka batches built column-wise from Arrow (``segments.arrow_records``) against the
record-by-record codec: the same varints, the same partitions, records that aiokafka's
reader (and the segment decoder) reads back whatever the codec."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from segments.arrow_records import (
    VECTOR_KEY_BYTES,
    arange,
    as_large_binary,
    batch_bytes,
    encode_records,
    header_blobs,
    partitions_for_keys,
    record_offsets,
    varints,
)
from segments.partitioning import partition_for_key
from segments.segment import COMPRESSIONS, SegmentBuilder, SegmentReader

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def varint(z: int) -> bytes:
    out = bytearray()
    while z >= 0x80:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def test_varints_are_kafkas_for_every_width() -> None:
    values = [0, 1, 127, 128, 300, 16383, 16384, (1 << 21) - 1, 1 << 21, 1 << 28, (1 << 35) - 1]
    values += [random.randrange(1 << 35) for _ in range(500)]
    got = varints(pa.array(values, pa.int64())).to_pylist()
    assert got == [varint(v) for v in values]
    assert varints(pa.array([5, 0], pa.int64())).to_pylist() == [b"\x05", b"\x00"]
    assert varints(pa.array([], pa.int64())).to_pylist() == []


@pytest.mark.parametrize("partitions", [1, 3, 12, 1000])
def test_partitions_for_keys_are_murmur2s(partitions: int) -> None:
    """Every length (block tails of 0-3 bytes), a null, an empty key, keys longer than
    the column-wise bound (hashed one by one), and a slice of the column."""
    keys: list[bytes | None] = [os.urandom(random.randrange(0, 70)) for _ in range(2000)]
    keys += [None, b"", os.urandom(VECTOR_KEY_BYTES + 1), b"\xff" * 9, b"key-7"]
    column = pa.array(keys, pa.large_binary())
    want = [None if k is None else partition_for_key(k, partitions) for k in keys]
    assert partitions_for_keys(column, partitions).to_pylist() == want
    assert partitions_for_keys(column.slice(7, 300), partitions).to_pylist() == want[7:307]


def test_as_large_binary_takes_strings_and_binaries_of_both_widths() -> None:
    for t in (pa.string(), pa.large_string()):
        assert as_large_binary(pa.array(["é", None], t)).to_pylist() == ["é".encode(), None]
    for t in (pa.binary(), pa.large_binary()):
        assert as_large_binary(pa.array([b"x", None], t).slice(1)).to_pylist() == [None]
    with pytest.raises(TypeError, match="string or binary"):
        as_large_binary(pa.array([1]))


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_records_read_back_through_the_segment_codec(compression: str) -> None:
    """Null and empty keys and values, headers with null values and non-ASCII keys, a
    value of 20 KiB (a 3-byte length varint), offset deltas past 127: each batch, made
    from a sliced column, decodes to the rows it was made of."""
    n = 600
    keys = [None if i % 4 == 0 else b"" if i % 9 == 0 else b"k%d" % i for i in range(n)]
    values = [None if i % 7 == 0 else os.urandom(20_000 if i == 5 else i % 50) for i in range(n)]
    headers = [
        None if i % 3 else [{"key": f"ké{j}", "value": None if j else b"v"} for j in range(i % 4)]
        for i in range(n)
    ]
    table = pa.RecordBatch.from_pydict(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": pa.array(headers, HEADERS),
        }
    ).slice(100)
    rows = n - 100
    blobs = header_blobs(table.column(2), rows)
    encoded = encode_records(
        as_large_binary(table.column(0)), as_large_binary(table.column(1)), blobs, arange(rows)
    )
    offsets = record_offsets(encoded)
    data = memoryview(encoded.buffers()[2])
    codec = COMPRESSIONS.index(compression)
    builder = SegmentBuilder()
    topic_id = bytes(16)
    # Two batches: offset deltas restart at 0 in the second (encoded again for it).
    builder.append_batch(
        topic_id, 0, batch_bytes(data[: offsets[rows]], rows, 1234, codec), rows, 1234, 1234
    )
    again = encode_records(
        as_large_binary(table.column(0)), as_large_binary(table.column(1)), blobs, arange(rows)
    )
    builder.append_batch(
        topic_id,
        0,
        batch_bytes(memoryview(again.buffers()[2]), rows, 1234, codec),
        rows,
        1234,
        1234,
    )
    data_object, _ = builder.build()
    reader = SegmentReader(data_object)
    (chunk,) = reader.chunks
    got = reader.records(chunk)
    assert [o for o, _ in got] == list(range(2 * rows))
    for at, (_offset, record) in enumerate(got):
        i = 100 + at % rows
        assert (record.key, record.value, record.timestamp_ms) == (keys[i], values[i], 1234)
        want = tuple((h["key"], h["value"]) for h in headers[i] or [])
        assert record.headers == want


def test_records_are_the_bytes_aiokafka_builds() -> None:
    """Uncompressed, the batch is byte for byte aiokafka's (same header, same records)."""
    keys = [b"a", None, b"ccc"]
    values = [b"x" * 200, b"", None]
    heads = [[{"key": "h", "value": b"1"}], None, [{"key": "z", "value": None}]]
    blobs = header_blobs(pa.array(heads, HEADERS), 3)
    encoded = encode_records(
        pa.array(keys, pa.large_binary()), pa.array(values, pa.large_binary()), blobs, arange(3)
    )
    ours = batch_bytes(memoryview(encoded.buffers()[2]), 3, 99, 0)
    theirs = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for i in range(3):
        theirs.append(i, 99, keys[i], values[i], [(h["key"], h["value"]) for h in heads[i] or []])
    assert ours == bytes(theirs.build())
