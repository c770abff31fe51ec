"""Producers' RecordBatches: checked, stored as they came in segment chunks, served back."""

from __future__ import annotations

import os

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from segments.batches import Pieces, check_batches, encode_records, fetch_batches
from segments.errors import CorruptRecordError, InvalidRecordError
from segments.segment import COMPRESSIONS, SegmentBuilder, SegmentReader, decode_chunk
from segments.types import ConsumedRecord, Record

TOPIC = bytes(range(16))


def producer_batch(
    n: int, codec: int = 0, start_ts: int = 1_000, producer_id: int = -1, seq: int = -1
) -> bytes:
    """A batch as a Kafka producer builds it (base offset 0, leader epoch -1)."""
    b = DefaultRecordBatchBuilder(
        2, codec, 0, producer_id, 0 if producer_id >= 0 else -1, seq, 1 << 30
    )
    for i in range(n):
        b.append(i, start_ts + (i * 7) % 5, b"k%d" % i, os.urandom(50), [("h", b"v")])
    return bytes(b.build())


@pytest.mark.parametrize("codec", range(len(COMPRESSIONS)), ids=COMPRESSIONS)
def test_producer_batches_of_every_codec_are_stored_byte_for_byte(codec: int) -> None:
    """REST records and producer batches share one chunk; the batch keeps its codec and
    bytes (only BaseOffset and leader epoch change) and decodes at the right offsets."""
    raw = producer_batch(30, codec)
    (info,) = check_batches(raw)
    assert (info.record_count, info.min_timestamp_ms, info.max_timestamp_ms) == (30, 1000, 1004)
    seg = SegmentBuilder()
    seg.append(TOPIC, 0, [Record(b"a", b"rest", 5)])
    relative = seg.append_batch(TOPIC, 0, raw, 30, info.min_timestamp_ms, info.max_timestamp_ms)
    seg.append(TOPIC, 0, [Record(b"b", b"rest2", 6)])
    data, (chunk,) = seg.build()
    assert relative == 1
    assert chunk.record_count == 32 and (chunk.min_timestamp_ms, chunk.max_timestamp_ms) == (
        5,
        1004,
    )
    body = data[chunk.position : chunk.position + chunk.length]
    assert raw[21:] in body  # attributes through the last record: untouched
    records = SegmentReader(data).records(chunk, base_offset=100)
    assert [o for o, _ in records] == list(range(100, 132))
    assert records[1][1].key == b"k0" and records[-1][1].value == b"rest2"
    # Fetch: base offsets absolute, everything else as stored; the CRC still holds.
    pieces = Pieces()
    assert fetch_batches(body, 100, 101, pieces, 1 << 20)
    out = bytes(pieces)
    second_at = 12 + int.from_bytes(out[8:12], "big")
    first = DefaultRecordBatch(bytes(out[:second_at]))  # the REST batch before 101 is left out
    assert first.base_offset == 101 and first.validate_crc()
    second = DefaultRecordBatch(bytes(out[second_at:]))
    assert second.base_offset == 131 and second.validate_crc()
    assert second_at + 12 + int.from_bytes(out[second_at + 8 : second_at + 12], "big") == len(out)
    small = Pieces()
    assert not fetch_batches(body, 100, 0, small, 10)  # nothing fits the budget
    assert bytes(small) == b""
    assert not fetch_batches(body, 100, 0, small, 10, first_may_exceed=True)
    assert DefaultRecordBatch(bytes(small)).base_offset == 100  # but the first goes in


def test_a_flipped_byte_or_bad_header_is_corrupt() -> None:
    raw = bytearray(producer_batch(3))
    raw[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC"):
        check_batches(raw)
    with pytest.raises(CorruptRecordError):
        check_batches(producer_batch(3)[:-1])
    with pytest.raises(CorruptRecordError):
        check_batches(b"")
    magic1 = bytearray(producer_batch(1))
    magic1[16] = 1
    with pytest.raises(CorruptRecordError, match="magic"):
        check_batches(magic1)


def test_several_batches_in_one_record_set() -> None:
    a, b = producer_batch(2, producer_id=5, seq=0), producer_batch(3, 1, producer_id=5, seq=2)
    infos = check_batches(a + b)
    assert [(i.position, i.record_count, i.base_sequence) for i in infos] == [
        (0, 2, 0),
        (len(a), 3, 2),
    ]
    assert infos[1].idempotent and infos[1].producer_id == 5


def test_tier_rows_encode_as_batches_with_offset_gaps() -> None:
    rows = [ConsumedRecord("t", 0, o, b"k", b"v%d" % o, 10 + o) for o in (5, 6, 9, 12)]
    data = encode_records(rows, max_batch_bytes=120)
    got = []
    pos = 0
    while pos < len(data):
        batch = DefaultRecordBatch(data[pos:])
        assert batch.validate_crc()
        got.extend((r.offset, r.value, r.timestamp) for r in batch)
        pos += 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
    assert got == [(r.offset, r.value, r.timestamp_ms) for r in rows]


def test_decode_chunk_reads_producer_batches_like_our_own() -> None:
    raw = producer_batch(4, codec=4)
    seg = SegmentBuilder("gzip")
    seg.append_batch(TOPIC, 3, raw, 4, 1000, 1004)
    data, (chunk,) = seg.build()
    got = decode_chunk(data[chunk.position : chunk.position + chunk.length], 0, 4)
    assert [o for o, _ in got] == [0, 1, 2, 3]


def test_spark_scan_reads_producer_batches_of_every_codec_and_size() -> None:
    """spark/scan.py decodes chunks holding producers' batches (each codec, one of 3 MiB,
    past our own 1 MiB batch size) beside REST records, at the right offsets."""
    from index.plan import ScanTask, Slice
    from segments.store import open_store
    from spark.scan import read_task

    seg = SegmentBuilder()
    seg.append(TOPIC, 0, [Record(b"r", b"rest", 1)])
    for codec in range(len(COMPRESSIONS)):
        raw = producer_batch(20, codec)
        (info,) = check_batches(raw)
        seg.append_batch(TOPIC, 0, raw, 20, info.min_timestamp_ms, info.max_timestamp_ms)
    big = DefaultRecordBatchBuilder(2, 4, 0, -1, -1, -1, 1 << 30)
    for i in range(3):
        big.append(i, 7, None, os.urandom(1 << 20), [])
    big_raw = bytes(big.build())
    (info,) = check_batches(big_raw)
    seg.append_batch(TOPIC, 0, big_raw, 3, 7, 7)
    data, (chunk,) = seg.build()
    store = open_store("memory://")
    store.put("segments/x/1.seg", data)
    total = 1 + 20 * len(COMPRESSIONS) + 3
    s = Slice(
        "t",
        0,
        "segment",
        "segments/x/1.seg",
        chunk.position,
        chunk.length,
        500,
        total,
        500,
        500 + total,
    )
    batches = list(read_task(store, ScanTask((s,)), ("offset", "value")))
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    values = [v for b in batches for v in b.column("value").to_pylist()]
    assert offsets == list(range(500, 500 + total))
    assert values[0] == b"rest" and len(values[-1]) == 1 << 20


@pytest.mark.parametrize("codec", range(len(COMPRESSIONS)), ids=COMPRESSIONS)
def test_a_compacted_topics_batches_need_keys_in_every_record(codec: int) -> None:
    """``keys_required`` (a compacted topic): one keyless record, in a batch of any codec,
    refuses the set; the same set passes without it, and keyed batches pass with it."""
    b = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 30)
    for i, key in enumerate([b"k0", None, b"k2"]):
        b.append(i, 1_000, key, b"v", [])
    keyless = bytes(b.build())
    with pytest.raises(InvalidRecordError, match=r"without key \(record 1 of the batch at byte"):
        check_batches(producer_batch(2, codec) + keyless, keys_required=True)
    assert len(check_batches(keyless)) == 1
    assert len(check_batches(producer_batch(3, codec), keys_required=True)) == 1
