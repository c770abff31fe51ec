"""Transactions (issue 30) in the segments layer: markers, transactional batches, and
decoders that skip markers while counting their offsets."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import crc32c
import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.client import ChunkRef
from coordinator.janitors.tiering import run_tiering
from index.log import decode_entry
from segments.batches import (
    Pieces,
    check_batches,
    control_batch,
    fetch_batches,
    iter_batches,
    read_marker,
)
from segments.errors import CorruptRecordError, CorruptSegmentError
from segments.segment import (
    ChunkBatch,
    SegmentBuilder,
    SegmentReader,
    decode_chunk,
    drop_aborted,
    iter_chunk,
    iter_chunk_batches,
)
from segments.tier import TierReader
from segments.types import ChunkInfo, Record
from tests.unit.janitor_helpers import Harness

TOPIC = bytes(range(16))


def data_batch(
    n: int,
    producer_id: int = 5,
    *,
    transactional: bool = True,
    codec: int = 0,
    start_ts: int = 1_000,
    seq: int = 0,
) -> bytes:
    """A batch as a Kafka producer builds it (base offset 0, leader epoch -1); values
    name their record: b"p<producer id>-<seq + i>"."""
    b = DefaultRecordBatchBuilder(
        2, codec, int(transactional), producer_id, 0 if producer_id >= 0 else -1, seq, 1 << 30
    )
    for i in range(n):
        b.append(i, start_ts + i, b"k%d" % i, b"p%d-%d" % (producer_id, seq + i), [])
    return bytes(b.build())


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_a_control_batch_reads_back_as_kafka_writes_markers(commit: bool) -> None:
    """aiokafka's reader (what Kafka clients run) sees a valid transactional control batch
    whose one record holds the ControlRecordType key and the EndTransactionMarker value."""
    raw = control_batch(7, 3, commit, 1_234, coordinator_epoch=9)
    batch = DefaultRecordBatch(raw)
    assert batch.validate_crc()
    assert batch.is_control_batch and batch.is_transactional
    assert (batch.base_offset, batch.magic, batch.compression_type) == (0, 2, 0)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 3, -1)
    assert (batch.first_timestamp, batch.max_timestamp) == (1_234, 1_234)
    assert batch.last_offset_delta == 0 and batch.next_offset == 1
    assert int.from_bytes(raw[12:16], "big", signed=True) == -1  # partition leader epoch
    (record,) = list(batch)
    assert record.key == b"\x00\x00\x00" + (b"\x01" if commit else b"\x00")
    assert record.value == b"\x00\x00" + (9).to_bytes(4, "big")
    assert read_marker(raw) == (7, 3, commit)


def test_read_marker_answers_none_for_a_data_batch() -> None:
    assert read_marker(data_batch(2, 4)) is None
    assert read_marker(data_batch(2, -1, transactional=False)) is None


@pytest.mark.parametrize("codec", [0, 1, 4], ids=["none", "gzip", "zstd"])
def test_transactional_batches_of_idempotent_producers_are_accepted(codec: int) -> None:
    """A transactional batch is checked like any other and says it is transactional;
    plain and idempotent batches say they are not."""
    raw = data_batch(3, 5, codec=codec, seq=7)
    (info,) = check_batches(raw)
    assert info.transactional and info.idempotent and info.codec == codec
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (5, 0, 7)
    assert (info.record_count, info.min_timestamp_ms, info.max_timestamp_ms) == (3, 1000, 1002)
    plain = data_batch(1, -1, transactional=False)
    idempotent = data_batch(1, 5, transactional=False)
    assert [i.transactional for i in check_batches(plain + raw + idempotent)] == [
        False,
        True,
        False,
    ]


def test_a_stored_transactional_batch_decodes() -> None:
    """The segment decoder accepts the transactional bit it now stores."""
    raw = data_batch(3, 5)
    seg = SegmentBuilder()
    seg.append_batch(TOPIC, 0, raw, 3, 1000, 1002, (5, 0, 0))
    data, (chunk,) = seg.build()
    got = decode_chunk(data[chunk.position : chunk.position + chunk.length], 10, 3)
    assert [(o, r.value) for o, r in got] == [(10, b"p5-0"), (11, b"p5-1"), (12, b"p5-2")]


def test_a_transactional_batch_without_a_producer_id_is_corrupt() -> None:
    with pytest.raises(CorruptRecordError, match="transactional batch without a producer id"):
        check_batches(data_batch(2, 5, transactional=False) + data_batch(2, -1))


def test_producers_may_not_write_control_batches() -> None:
    """Markers come from the transaction coordinator only: a producer's control batch,
    alone or after a good batch, refuses the whole record set."""
    marker = control_batch(5, 0, True, 1_000)
    with pytest.raises(CorruptRecordError, match="control batch"):
        check_batches(marker)
    with pytest.raises(CorruptRecordError, match=r"Batch at byte \d+: a control batch"):
        check_batches(data_batch(2, 5) + marker)


# --- decoders skip markers ---------------------------------------------------------------


def marker(producer_id: int, commit: bool, ts: int) -> bytes:
    return control_batch(producer_id, 0, commit, ts)


def mixed_segment() -> tuple[bytes, ChunkInfo, list[tuple[int, bytes | None]]]:
    """One chunk of many batches, markers between data batches and last, and the
    (relative offset, value) of every record it holds. A marker has the chunk's highest
    timestamp, so the footer counts it."""
    seg = SegmentBuilder()
    seg.append(TOPIC, 0, [Record(b"r", b"rest%d" % i, 900 + i) for i in range(6)])
    seg.append_batch(TOPIC, 0, data_batch(3, 5, codec=1), 3, 1000, 1002)
    seg.append_batch(TOPIC, 0, data_batch(2, 6, seq=0), 2, 1000, 1001)
    seg.append_batch(TOPIC, 0, marker(5, True, 2_000), 1, 2_000, 2_000)
    seg.append_batch(TOPIC, 0, data_batch(1, 6, seq=2, codec=4), 1, 1000, 1000)
    seg.append_batch(TOPIC, 0, marker(6, False, 1_500), 1, 1_500, 1_500)
    seg.append_batch(TOPIC, 0, marker(9, True, 1_500), 1, 1_500, 1_500)
    seg.append(TOPIC, 0, [Record(None, b"after", 1_100)])
    seg.append_batch(TOPIC, 0, marker(7, True, 1_600), 1, 1_600, 1_600)
    data, (chunk,) = seg.build()
    values = [b"rest%d" % i for i in range(6)] + [b"p5-0", b"p5-1", b"p5-2", b"p6-0", b"p6-1"]
    offsets = list(range(11))
    values += [b"p6-2", b"after"]
    offsets += [12, 15]  # 11 is a marker; 13 and 14 too, and 16 ends the chunk
    return data, chunk, list(zip(offsets, values, strict=True))


def test_a_chunk_with_markers_between_and_after_data_batches() -> None:
    """Markers take their offsets (the records after them are numbered past them) but
    give no record; the footer counts offsets, and its timestamps count the markers'.
    Fetch still serves them as stored."""
    data, chunk, want = mixed_segment()
    assert chunk.record_count == 17
    body = data[chunk.position : chunk.position + chunk.length]
    got = decode_chunk(body, 100, 17)
    assert [(o - 100, r.value) for o, r in got] == want
    assert [(o - 100, r.value) for o, r in iter_chunk(body, 100, record_count=17)] == want
    records = SegmentReader(data).records(chunk, base_offset=100)
    assert records == got
    assert (chunk.min_timestamp_ms, chunk.max_timestamp_ms) == (900, 2_000)
    # Kafka clients need the markers: Fetch sends them, absolute offsets patched in.
    pieces = Pieces()
    assert fetch_batches(body, 100, 0, pieces, 1 << 20)
    out = bytes(pieces)
    assert len(out) == len(body)
    batches = []
    pos = 0
    while pos < len(out):
        end = pos + 12 + int.from_bytes(out[pos + 8 : pos + 12], "big")
        batches.append(DefaultRecordBatch(bytes(out[pos:end])))
        pos = end
    assert all(b.validate_crc() for b in batches)
    controls = [(b.base_offset, b.producer_id) for b in batches if b.is_control_batch]
    assert controls == [(111, 5), (113, 6), (114, 9), (116, 7)]


def test_the_record_count_checked_is_the_offsets_a_chunk_takes() -> None:
    """The index's record count includes markers: the count of records alone, or one
    more than the offsets, is a chunk cut short or too long."""
    data, chunk, want = mixed_segment()
    body = data[chunk.position : chunk.position + chunk.length]
    for wrong in (len(want), 16, 18):
        with pytest.raises(CorruptSegmentError, match=f"takes 17 offsets, expected {wrong}"):
            decode_chunk(body, 0, wrong)
        with pytest.raises(CorruptSegmentError, match="takes 17 offsets"):
            list(iter_chunk(body, 0, record_count=wrong))
    # A chunk cut at the batch before the last marker still decodes, but takes 16 offsets.
    last = list(iter_batches(body))[-1]
    with pytest.raises(CorruptSegmentError, match="takes 16 offsets, expected 17"):
        decode_chunk(body[: last[0]], 0, 17)
    ref = ChunkRef("o", chunk.position, chunk.length, 50, 17, 900, 2_000)
    assert [(r.offset - 50, r.value) for r in decode_entry(ref, body, "t", 0, 0)] == want
    with pytest.raises(CorruptSegmentError, match="takes 17 offsets, expected 16"):
        list(decode_entry(replace(ref, record_count=16), body, "t", 0, 0))


@pytest.mark.parametrize("where", ["first", "last", "alone"])
def test_a_marker_first_last_or_alone_in_its_chunk(where: str) -> None:
    """A chunk may start or end with a marker, or hold nothing else (a coordinator's
    flush of markers): the offsets still line up, and a marker alone gives no record."""
    seg = SegmentBuilder()
    if where == "last":
        seg.append_batch(TOPIC, 0, data_batch(2, 5), 2, 1000, 1001)
    seg.append_batch(TOPIC, 0, marker(5, True, 1_000), 1, 1_000, 1_000)
    if where == "first":
        seg.append_batch(TOPIC, 0, data_batch(2, 8), 2, 1000, 1001)
    data, (chunk,) = seg.build()
    body = data[chunk.position : chunk.position + chunk.length]
    want = {"first": [(1, b"p8-0"), (2, b"p8-1")], "last": [(0, b"p5-0"), (1, b"p5-1")]}
    got = [(o, r.value) for o, r in SegmentReader(data).records(chunk)]
    assert got == want.get(where, [])
    assert chunk.record_count == (1 if where == "alone" else 3)
    assert decode_chunk(body, 0, chunk.record_count) == SegmentReader(data).records(chunk)
    (marker_batch,) = [b for b in iter_chunk_batches(body, 40) if b.control]
    assert marker_batch.base_offset == {"first": 40, "last": 42, "alone": 40}[where]
    assert marker_batch.records == [] and marker_batch.offset_count == 1


def test_a_marker_in_a_log_append_time_topic() -> None:
    """build() stamps every batch of a LogAppendTime chunk, markers too; the footer's
    timestamps, the append time, still match what the reader counts."""
    seg = SegmentBuilder()
    seg.append_batch(TOPIC, 0, data_batch(2, 5), 2, 1000, 1001, log_append_time=True)
    seg.append_batch(TOPIC, 0, marker(5, False, 1_000), 1, 1_000, 1_000)
    data, (chunk,) = seg.build(append_time_ms=77_000)
    records = SegmentReader(data).records(chunk)
    assert [(o, r.timestamp_ms, r.timestamp_type) for o, r in records] == [
        (0, 77_000, 1),
        (1, 77_000, 1),
    ]


def test_a_bad_or_damaged_marker_is_corrupt() -> None:
    """Markers are CRC-checked like data, and only markers as control_batch writes them
    (one uncompressed transactional record) are read."""
    good = marker(5, True, 1_000)
    flipped = bytearray(good)
    flipped[-1] ^= 1
    with pytest.raises(CorruptSegmentError, match="CRC"):
        decode_chunk(bytes(flipped), 0, 1)
    not_transactional = bytearray(good)
    not_transactional[22] &= ~0x10
    stamp_crc(not_transactional)
    with pytest.raises(CorruptSegmentError, match="a control batch other than"):
        decode_chunk(bytes(not_transactional), 0, 1)
    two = DefaultRecordBatchBuilder(2, 0, 1, 5, 0, -1, 1 << 20)
    two.append(0, 1, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", [])
    two.append(1, 1, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", [])
    two_records = bytearray(two.build())
    two_records[22] |= 0x20
    stamp_crc(two_records)
    with pytest.raises(CorruptSegmentError, match="a control batch other than"):
        decode_chunk(bytes(two_records), 0, 2)


def stamp_crc(batch: bytearray) -> None:
    batch[17:21] = crc32c.crc32c(bytes(batch[21:])).to_bytes(4, "big")


def test_spark_scan_skips_markers() -> None:
    from index.plan import ScanTask, Slice
    from segments.store import open_store
    from spark.scan import read_task

    data, chunk, want = mixed_segment()
    store = open_store("memory://")
    store.put("segments/x/1.seg", data)
    s = Slice(
        "t", 0, "segment", "segments/x/1.seg", chunk.position, chunk.length, 500, 17, 500, 517
    )
    batches = list(read_task(store, ScanTask((s,)), ("offset", "value")))
    got = [
        (o - 500, v)
        for b in batches
        for o, v in zip(b.column("offset").to_pylist(), b.column("value").to_pylist(), strict=True)
    ]
    assert got == want


def test_readers_and_tiering_step_over_markers(h: Harness) -> None:
    """Through the index, before and after tiering (invariant 5): a read from a marker's
    offset gets the record after it (or nothing past the last one: no error, no spin);
    the tier object holds no marker, and its gaps are where the markers were."""
    topic_id = h.coordinator.create_topic("t", 1).topic_id
    now_ms = int(h.clock() * 1000)

    def flush(*parts: tuple[bytes, int] | list[Record]) -> None:
        seg = SegmentBuilder()
        for part in parts:
            if isinstance(part, list):
                seg.append(topic_id, 0, part)
            else:
                raw, n = part
                seg.append_batch(topic_id, 0, raw, n, now_ms, now_ms + n)
        h.writer.write(seg)

    def txn(n: int, pid: int, seq: int) -> tuple[bytes, int]:
        return data_batch(n, pid, start_ts=now_ms, seq=seq), n

    def end(pid: int, commit: bool) -> tuple[bytes, int]:
        return marker(pid, commit, now_ms), 1

    flush(end(4, False), [Record(b"a", b"rest0", now_ms)], txn(3, 5, 0))  # 0 marker, 1-4
    flush(end(5, True))  # 5: a chunk of one marker
    flush(txn(2, 5, 3), [Record(None, b"rest1", now_ms)], end(5, True))  # 6-8, 9 marker
    flush([Record(b"z", b"last", now_ms)], end(6, False))  # 10, 11 marker (the last offset)
    markers = [0, 5, 9, 11]
    assert h.coordinator.offsets("t", 0).high_watermark == 12

    def check() -> None:
        got = [(r.offset, r.value) for r in h.walk("t", 0)]
        assert got == [
            (1, b"rest0"),
            (2, b"p5-0"),
            (3, b"p5-1"),
            (4, b"p5-2"),
            (6, b"p5-3"),
            (7, b"p5-4"),
            (8, b"rest1"),
            (10, b"last"),
        ]
        after = [h.reader.read("t", 0, m, max_bytes=1) for m in markers]
        assert [[r.offset for r in one] for one in after] == [[1], [6], [10], []]

    check()
    report = run_tiering(h.ctx(), h.config())
    assert report.rows_replaced == 4
    (row,) = h.catalog.rows(topic_id, 0)
    assert (row.kind, row.base_offset, row.record_count) == ("parquet", 0, 12)
    tier = TierReader(h.store.get(row.object_key))
    assert (tier.first_offset, tier.last_offset, tier.record_count) == (1, 10, 8)
    check()


def test_iter_chunk_batches_says_who_wrote_each_batch() -> None:
    data, chunk, want = mixed_segment()
    body = data[chunk.position : chunk.position + chunk.length]
    batches = list(iter_chunk_batches(body, 100, record_count=17))
    assert [
        (b.base_offset, b.offset_count, b.producer_id, b.transactional, b.control) for b in batches
    ] == [
        (100, 6, -1, False, False),
        (106, 3, 5, True, False),
        (109, 2, 6, True, False),
        (111, 1, 5, True, True),
        (112, 1, 6, True, False),
        (113, 1, 6, True, True),
        (114, 1, 9, True, True),
        (115, 1, -1, False, False),
        (116, 1, 7, True, True),
    ]
    assert [(o - 100, r.value) for b in batches for o, r in b.records] == want
    assert batches[3].first_timestamp_ms == batches[3].max_timestamp_ms == 2_000


# --- aborted transactions -----------------------------------------------------------------


def aborted_segment() -> list[ChunkBatch]:
    """Two chunks of one partition (offsets 0-11, 12-16) as their batches:

    0-1 REST; 2-4 txn of 5 (aborted: 5, 2, 9); 5-6 txn of 6; 7 idempotent, not
    transactional, of 5; 8 commit of 6; 9 abort of 5; 10-11 txn of 5; | 12 commit of 5;
    13-14 txn of 5 (aborted: 5, 13, 15); 15 abort of 5; 16 REST.
    """
    one, two = SegmentBuilder(), SegmentBuilder()
    one.append(TOPIC, 0, [Record(None, b"rest%d" % i, 900) for i in range(2)])
    one.append_batch(TOPIC, 0, data_batch(3, 5, seq=0), 3, 1000, 1002)
    one.append_batch(TOPIC, 0, data_batch(2, 6, seq=0), 2, 1000, 1001)
    one.append_batch(TOPIC, 0, data_batch(1, 5, transactional=False, seq=3), 1, 1000, 1000)
    one.append_batch(TOPIC, 0, marker(6, True, 1_000), 1, 1_000, 1_000)
    one.append_batch(TOPIC, 0, marker(5, False, 1_000), 1, 1_000, 1_000)
    one.append_batch(TOPIC, 0, data_batch(2, 5, seq=4), 2, 1000, 1001)
    two.append_batch(TOPIC, 0, marker(5, True, 1_000), 1, 1_000, 1_000)
    two.append_batch(TOPIC, 0, data_batch(2, 5, seq=6), 2, 1000, 1001)
    two.append_batch(TOPIC, 0, marker(5, False, 1_000), 1, 1_000, 1_000)
    two.append(TOPIC, 0, [Record(None, b"rest2", 900)])
    out: list[ChunkBatch] = []
    for seg, base, count in ((one, 0, 12), (two, 12, 5)):
        data, (chunk,) = seg.build()
        body = data[chunk.position : chunk.position + chunk.length]
        out.extend(iter_chunk_batches(body, base, record_count=count))
    return out


def kept(batches: list[ChunkBatch], aborted: list[tuple[int, int, int]]) -> list[int]:
    return [offset for offset, _ in drop_aborted(batches, aborted)]


def test_drop_aborted_drops_the_records_of_aborted_transactions_only() -> None:
    """An aborted transaction's records go; the records of other producers inside its
    span, its producer's non-transactional batch, its producer's committed transaction
    and every marker's offset are not records it drops (markers give none anyway)."""
    batches = aborted_segment()
    every = [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 13, 14, 16]
    assert kept(batches, []) == every
    values = [r.value for _, r in drop_aborted(batches, [])]
    assert values[:5] == [b"rest0", b"rest1", b"p5-0", b"p5-1", b"p5-2"]
    # Unsorted, with a producer that wrote nothing here.
    aborted = [(5, 13, 15), (7, 0, 100), (5, 2, 9)]
    assert kept(batches, aborted) == [0, 1, 5, 6, 7, 10, 11, 16]
    assert kept(batches, [(6, 5, 8)]) == [0, 1, 2, 3, 4, 7, 10, 11, 13, 14, 16]
    assert kept(iter(batches), iter(aborted)) == [0, 1, 5, 6, 7, 10, 11, 16]  # one pass each


def test_drop_aborted_goes_by_record_when_a_span_cuts_a_batch() -> None:
    """A record belongs to a transaction by its own offset: a span that starts or ends
    inside a batch drops only the records inside it."""
    batches = aborted_segment()
    assert kept(batches, [(5, 3, 9)]) == [0, 1, 2, 5, 6, 7, 10, 11, 13, 14, 16]
    assert kept(batches, [(5, 0, 3), (5, 11, 13)]) == [0, 1, 4, 5, 6, 7, 10, 14, 16]
    # A span holding only a marker drops nothing.
    assert kept(batches, [(5, 12, 12)]) == [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 13, 14, 16]


def test_a_timestamp_seek_passes_a_chunk_whose_latest_is_a_marker(h: Harness) -> None:
    """A marker is written after its transaction's records, so its timestamp is often its
    chunk's latest, and the index's max timestamp: a seek to a time only the marker
    reaches goes on to the next record, before and after tiering (it used to call the
    chunk corrupt)."""
    topic_id = h.coordinator.create_topic("t", 1).topic_id
    seg = SegmentBuilder()
    seg.append_batch(topic_id, 0, data_batch(3, 5, start_ts=1_000), 3, 1_000, 1_002)
    seg.append_batch(topic_id, 0, marker(5, True, 5_000), 1, 5_000, 5_000)
    h.writer.write(seg)
    h.produce("t", 0, [Record(None, b"later", 3_000)])
    for _ in range(2):
        assert h.reader.offset_for_timestamp("t", 0, 1_001) == 1
        assert h.reader.offset_for_timestamp("t", 0, 2_000) == 4
        assert h.reader.offset_for_timestamp("t", 0, 4_000) is None
        run_tiering(h.ctx(), h.config())
    assert [r.kind for r in h.catalog.rows(topic_id, 0)] == ["parquet"]


# --- properties ---------------------------------------------------------------------------

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# One batch of a chunk: ("rest", n) our own records, ("txn", n, producer id) a
# transactional producer's batch, ("marker", producer id, commit).
batch_st = st.one_of(
    st.tuples(st.just("rest"), st.integers(1, 4)),
    st.tuples(st.just("txn"), st.integers(1, 4), st.integers(0, 3)),
    st.tuples(st.just("marker"), st.integers(0, 3), st.booleans()),
)


def build_mixed(items: list[tuple[Any, ...]]) -> tuple[bytes, ChunkInfo, list[tuple[int, bytes]]]:
    seg = SegmentBuilder()
    want: list[tuple[int, bytes]] = []
    at = 0
    for i, item in enumerate(items):
        if item[0] == "rest":
            values = [b"r%d-%d" % (i, j) for j in range(item[1])]
            seg.append(TOPIC, 0, [Record(None, v, 1_000) for v in values])
        elif item[0] == "txn":
            values = [b"p%d-%d" % (item[2], i * 10 + j) for j in range(item[1])]
            raw = data_batch(item[1], item[2], seq=i * 10)
            seg.append_batch(TOPIC, 0, raw, item[1], 1_000, 1_000 + item[1] - 1)
        else:
            values = []
            seg.append_batch(TOPIC, 0, marker(item[1], item[2], 2_000), 1, 2_000, 2_000)
            at += 1
        want.extend((at + j, v) for j, v in enumerate(values))
        at += len(values)
    data, (chunk,) = seg.build()
    return data, chunk, want


@PROPERTY
@given(st.lists(batch_st, min_size=1, max_size=12), st.integers(0, 1 << 40))
def test_any_mix_of_markers_and_data_decodes_at_the_right_offsets(
    items: list[tuple[Any, ...]], base: int
) -> None:
    data, chunk, want = build_mixed(items)
    body = data[chunk.position : chunk.position + chunk.length]
    got = decode_chunk(body, base, chunk.record_count)
    assert [(o - base, r.value) for o, r in got] == want
    assert SegmentReader(data).records(chunk, base) == got
    assert chunk.record_count == sum(1 if i[0] == "marker" else i[1] for i in items)
    batches = list(iter_chunk_batches(body, base, record_count=chunk.record_count))
    markers, at = [], 0
    for item in items:
        if item[0] == "marker":
            markers.append(at)
        at += 1 if item[0] == "marker" else item[1]
    assert [b.base_offset - base for b in batches if b.control] == markers
    assert list(drop_aborted(batches, [])) == got


@PROPERTY
@given(st.lists(batch_st, min_size=1, max_size=6), st.data())
def test_a_flipped_byte_in_a_chunk_with_markers_is_refused(
    items: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    """Markers are checked like every batch: framing, contiguity, CRC."""
    seg_data, chunk, want = build_mixed([*items, ("marker", 1, False)])
    body = seg_data[chunk.position : chunk.position + chunk.length]
    assert [(o, r.value) for o, r in decode_chunk(body, 0, chunk.record_count)] == want
    index = data.draw(st.integers(0, len(body) - 1))
    mask = data.draw(st.integers(1, 255))
    flipped = bytearray(body)
    flipped[index] ^= mask
    with pytest.raises(CorruptSegmentError):
        decode_chunk(bytes(flipped), 0)


@PROPERTY
@given(
    st.integers(0, (1 << 63) - 1),
    st.integers(0, (1 << 15) - 1),
    st.booleans(),
    st.integers(0, (1 << 63) - 1),
    st.integers(-(1 << 31), (1 << 31) - 1),
)
def test_control_batch_round_trips(
    producer_id: int, epoch: int, commit: bool, ts: int, coordinator_epoch: int
) -> None:
    raw = control_batch(producer_id, epoch, commit, ts, coordinator_epoch)
    assert read_marker(raw) == (producer_id, epoch, commit)
    (record,) = list(DefaultRecordBatch(raw))
    assert record.timestamp == ts
    assert int.from_bytes(record.value[2:], "big", signed=True) == coordinator_epoch
    assert decode_chunk(raw, 0, 1) == []
