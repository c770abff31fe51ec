"""Segment object format: round trip, framing, and corruption detection (segments/segment.py)."""

from __future__ import annotations

import struct
import uuid

import crc32c
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from segments import segment
from segments.errors import CorruptSegmentError
from segments.segment import COMPRESSIONS, SegmentBuilder, SegmentReader, decode_chunk
from segments.types import ChunkInfo, Record

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TOPIC_A = uuid.UUID(int=1).bytes
TOPIC_B = uuid.UUID(int=2).bytes

# --- strategies -------------------------------------------------------------------------

nullable_bytes = st.one_of(st.none(), st.binary(max_size=40))
records_st = st.builds(
    Record,
    key=nullable_bytes,
    value=nullable_bytes,
    timestamp_ms=st.integers(min_value=0, max_value=2**63 - 1),
    headers=st.lists(st.tuples(st.text(max_size=8), nullable_bytes), max_size=3).map(tuple),
    timestamp_type=st.just(0),  # producers' records: CreateTime (LogAppendTime is stamped)
)
topic_partitions = st.tuples(
    st.sampled_from([TOPIC_A, TOPIC_B, uuid.UUID(int=2**128 - 1).bytes]),
    st.integers(min_value=0, max_value=2**31 - 1),
)
# Several appends, often hitting the same topic-partition again.
appends_st = st.lists(
    st.tuples(st.integers(min_value=0, max_value=3), st.lists(records_st, max_size=8)),
    min_size=1,
    max_size=6,
)
Appends = list[tuple[tuple[bytes, int], list[Record]]]


@st.composite
def segments_st(draw: st.DrawFn) -> tuple[str, int, Appends]:
    """(compression, max_batch_bytes, appends) with at least one record."""
    tps = draw(st.lists(topic_partitions, min_size=4, max_size=4))
    appends = [(tps[i], recs) for i, recs in draw(appends_st)]
    if not any(recs for _, recs in appends):
        appends.append((tps[0], [draw(records_st)]))
    compression = draw(st.sampled_from(COMPRESSIONS))
    max_batch_bytes = draw(st.sampled_from([62, 150, 400, 1 << 20]))  # small ones split batches
    return compression, max_batch_bytes, appends


def build(
    compression: str, max_batch_bytes: int, appends: Appends
) -> tuple[bytes, list[ChunkInfo]]:
    builder = SegmentBuilder(compression, max_batch_bytes)
    for (topic_id, partition), recs in appends:
        builder.append(topic_id, partition, recs)
    return builder.build()


def expected_chunks(appends: Appends) -> dict[tuple[bytes, int], list[Record]]:
    """Records per topic-partition in append order; dict order = first-appended order."""
    out: dict[tuple[bytes, int], list[Record]] = {}
    for tp, recs in appends:
        if recs:
            out.setdefault(tp, []).extend(recs)
    return out


def chunk_bytes(data: bytes, info: ChunkInfo) -> bytes:
    return data[info.position : info.position + info.length]


def read_everything(data: bytes) -> None:
    """Open the object and decode every chunk (what a reader of the whole object does)."""
    reader = SegmentReader(data)
    for info in reader.chunks:
        reader.records(info, base_offset=7)


def batch_headers(chunk: bytes) -> list[tuple[int, int, int]]:
    """(base offset, record count, attributes) of each batch, walking the Length fields."""
    out = []
    pos = 0
    while pos < len(chunk):
        base, length = struct.unpack_from(">qi", chunk, pos)
        (attributes,) = struct.unpack_from(">h", chunk, pos + 21)
        (count,) = struct.unpack_from(">i", chunk, pos + 57)
        out.append((base, count, attributes))
        pos += 12 + length
    assert pos == len(chunk)
    return out


# --- round trip -------------------------------------------------------------------------

ONE_RECORD = ("none", 1 << 20, [((TOPIC_A, 0), [Record(None, None, 0)])])


@PROPERTY
@given(segments_st(), st.integers(min_value=0, max_value=2**62))
@example(ONE_RECORD, 0)
@example(("gzip", 62, [((TOPIC_A, 5), [Record(b"", b"", 0, (("", b""),))] * 3)]), 10)
def test_round_trip(spec: tuple[str, int, Appends], base_offset: int) -> None:
    """decode(encode(x)) == x: chunks in first-appended order, records and None/b"" exact."""
    compression, max_batch_bytes, appends = spec
    want = expected_chunks(appends)
    builder = SegmentBuilder(compression, max_batch_bytes)
    for (topic_id, partition), recs in appends:
        builder.append(topic_id, partition, recs)
    estimate = builder.estimated_size
    assert builder.record_count == sum(len(r) for r in want.values())
    data, infos = builder.build()

    if compression == "none":
        assert estimate == len(data)
    assert builder.estimated_size == len(data)  # exact once every batch is closed
    reader = SegmentReader(data)
    assert reader.chunks == infos
    assert [(c.topic_id, c.partition) for c in infos] == list(want)
    position = 0
    for info, recs in zip(infos, want.values(), strict=True):
        # Every byte is consumed: chunks tile the object up to the footer.
        assert info.position == position
        position += info.length
        assert info.record_count == len(recs)
        assert info.min_timestamp_ms == min(r.timestamp_ms for r in recs)
        assert info.max_timestamp_ms == max(r.timestamp_ms for r in recs)
        got = reader.records(info, base_offset)
        assert got == list(enumerate(recs, start=base_offset))
        assert decode_chunk(chunk_bytes(data, info), base_offset) == got
        view = memoryview(data)[info.position : info.position + info.length]
        assert decode_chunk(view, base_offset, info.record_count) == got
        # Relative base offsets: each batch starts at the count of records before it.
        before = 0
        for base, count, _ in batch_headers(chunk_bytes(data, info)):
            assert base == before
            before += count
        assert before == len(recs)
    footer_length = 4 + 60 * len(infos)
    assert position + footer_length + 16 == len(data)


# --- truncation and corruption ------------------------------------------------------------


@PROPERTY
@given(segments_st(), st.integers(min_value=0))
@example(ONE_RECORD, 0)
def test_truncated_object_is_refused(spec: tuple[str, int, Appends], cut: int) -> None:
    """Any strict prefix of a segment object raises CorruptSegmentError, never fewer records."""
    body, _ = build(*spec)
    with pytest.raises(CorruptSegmentError):
        read_everything(body[: cut % len(body)])


@PROPERTY
@given(segments_st(), st.data())
def test_truncated_chunk_is_refused(spec: tuple[str, int, Appends], data: st.DataObject) -> None:
    """A ranged GET that returned a strict prefix of a chunk raises CorruptSegmentError.

    With the record count (as the index supplies it) every cut is caught, even one that
    falls exactly between two batches; without it every cut inside a batch is.
    """
    body, infos = build(*spec)
    info = data.draw(st.sampled_from(infos))
    chunk = chunk_bytes(body, info)
    cut = data.draw(st.integers(0, len(chunk) - 1))
    with pytest.raises(CorruptSegmentError):
        decode_chunk(chunk[:cut], 0, info.record_count)
    boundaries = {0}
    pos = 0
    while pos < len(chunk):
        pos += 12 + struct.unpack_from(">i", chunk, pos + 8)[0]
        boundaries.add(pos)
    if cut not in boundaries:
        with pytest.raises(CorruptSegmentError):
            decode_chunk(chunk[:cut], 0)


def flip(buf: bytes, index: int, mask: int) -> bytes:
    out = bytearray(buf)
    out[index] ^= mask
    return bytes(out)


@PROPERTY
@given(segments_st(), st.integers(min_value=0), st.integers(min_value=1, max_value=255))
@example(ONE_RECORD, 0, 1)  # the first batch's BaseOffset, which the batch CRC skips
@example(ONE_RECORD, 12, 1)  # its PartitionLeaderEpoch, also skipped by the batch CRC
def test_flipped_byte_in_object_is_refused(
    spec: tuple[str, int, Appends], index: int, mask: int
) -> None:
    """One flipped byte anywhere (chunk, footer, trailer) raises CorruptSegmentError."""
    body, _ = build(*spec)
    with pytest.raises(CorruptSegmentError):
        read_everything(flip(body, index % len(body), mask))


@PROPERTY
@given(segments_st(), st.data())
def test_flipped_byte_in_chunk_is_refused(
    spec: tuple[str, int, Appends], data: st.DataObject
) -> None:
    """One flipped byte anywhere in a chunk fails decode_chunk, even without a record count.

    Every batch byte is checked: BaseOffset by contiguity, Length by framing, leader
    epoch and magic by value, CRC and everything after it by the CRC-32C.
    """
    body, infos = build(*spec)
    info = data.draw(st.sampled_from(infos))
    chunk = chunk_bytes(body, info)
    index = data.draw(st.integers(0, len(chunk) - 1))
    mask = data.draw(st.integers(1, 255))
    with pytest.raises(CorruptSegmentError):
        decode_chunk(flip(chunk, index, mask), 0)


@pytest.mark.parametrize("field_offset", [0, 7, 8, 11, 12, 15, 16, 17, 20, 21, 60])
def test_every_batch_header_field_is_checked(field_offset: int) -> None:
    """Each header field, including the two the batch CRC skips (base offset, leader epoch)."""
    body, infos = build(*ONE_RECORD)
    chunk = chunk_bytes(body, infos[0])
    for mask in (0x01, 0x80):
        with pytest.raises(CorruptSegmentError):
            decode_chunk(flip(chunk, field_offset, mask), 0)


def test_empty_and_short_chunks_are_refused_without_crashing() -> None:
    """aiokafka's C batch reader crashes on a short buffer: it must never be handed one."""
    body, infos = build(*ONE_RECORD)
    chunk = chunk_bytes(body, infos[0])
    for cut in range(len(chunk)):
        with pytest.raises(CorruptSegmentError):
            decode_chunk(chunk[:cut], 0)
    with pytest.raises(CorruptSegmentError, match="empty chunk"):
        decode_chunk(b"", 0, 0)


def test_wrong_record_count_and_extra_bytes_are_refused() -> None:
    body, infos = build(*ONE_RECORD)
    chunk = chunk_bytes(body, infos[0])
    assert decode_chunk(chunk, 0, 1) == [(0, Record(None, None, 0))]
    with pytest.raises(CorruptSegmentError, match="expected 2"):
        decode_chunk(chunk, 0, 2)
    with pytest.raises(CorruptSegmentError):
        decode_chunk(chunk + b"\x00", 0)
    # Two copies of a one-record batch: the second claims base offset 0 again.
    with pytest.raises(CorruptSegmentError, match="base offset 0, expected 1"):
        decode_chunk(chunk + chunk, 0)


def test_footer_with_valid_crc_but_gap_is_refused() -> None:
    """Footer entries must tile the chunk region, even when the CRC matches."""
    body, infos = build(*ONE_RECORD)
    info = infos[0]
    shifted = ChunkInfo(
        info.topic_id,
        info.partition,
        info.position + 1,
        info.length - 1,
        info.record_count,
        info.min_timestamp_ms,
        info.max_timestamp_ms,
    )
    forged = chunk_bytes(body, info) + segment._encode_footer([shifted])
    with pytest.raises(CorruptSegmentError, match="footer entry 0"):
        SegmentReader(forged)
    again = ChunkInfo(
        info.topic_id,
        info.partition,  # the same topic-partition twice
        info.length,
        info.length,
        info.record_count,
        info.min_timestamp_ms,
        info.max_timestamp_ms,
    )
    duplicated = chunk_bytes(body, info) * 2 + segment._encode_footer([info, again])
    with pytest.raises(CorruptSegmentError, match="footer entry 1"):
        SegmentReader(duplicated)


def test_magic_and_version_are_checked() -> None:
    body, _ = build(*ONE_RECORD)
    assert body[-12:-4] == b"LKLSEG\x00\x01"
    with pytest.raises(CorruptSegmentError, match="bad magic"):
        SegmentReader(body[:-12] + b"XXXXXX" + body[-6:])
    with pytest.raises(CorruptSegmentError, match="unsupported segment format version 2"):
        SegmentReader(body[:-6] + b"\x00\x02" + body[-4:])
    with pytest.raises(CorruptSegmentError, match="too short"):
        SegmentReader(b"")


def test_records_outside_the_object_are_refused() -> None:
    body, infos = build(*ONE_RECORD)
    reader = SegmentReader(body)
    info = infos[0]
    beyond = ChunkInfo(info.topic_id, 0, len(body) - 10, 100, 1, 0, 0)
    with pytest.raises(CorruptSegmentError, match="outside"):
        reader.records(beyond)


# --- builder behaviour --------------------------------------------------------------------


def test_empty_segment_round_trips() -> None:
    builder = SegmentBuilder()
    builder.append(TOPIC_A, 0, [])  # no records: no chunk
    data, infos = builder.build()
    assert infos == []
    assert len(data) == builder.estimated_size == 4 + 16
    assert SegmentReader(data).chunks == []


def test_unknown_compression_and_tiny_batches_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown compression 'brotli'"):
        SegmentBuilder("brotli")
    with pytest.raises(ValueError, match="max_batch_bytes"):
        SegmentBuilder("none", max_batch_bytes=61)


@pytest.mark.parametrize(
    ("topic_id", "partition", "record", "error"),
    [
        (b"short", 0, Record(None, None, 0), ValueError),
        (TOPIC_A, -1, Record(None, None, 0), ValueError),
        (TOPIC_A, 2**31, Record(None, None, 0), ValueError),
        # -1 is refused: aiokafka's C builder would write the next record's timestamp.
        (TOPIC_A, 0, Record(None, None, -1), ValueError),
        (TOPIC_A, 0, Record(None, None, 2**63), ValueError),
        (TOPIC_A, 0, Record("key", None, 0), TypeError),  # type: ignore[arg-type]
        (TOPIC_A, 0, Record(None, bytearray(b"v"), 0), TypeError),  # type: ignore[arg-type]
        (TOPIC_A, 0, Record(None, None, 0, ((b"k", None),)), TypeError),  # type: ignore[arg-type]
        (TOPIC_A, 0, Record(None, None, 0, (("k", "v"),)), TypeError),  # type: ignore[arg-type]
        (TOPIC_A, 0, Record(None, None, 0, (("\udc80", None),)), ValueError),
    ],
)
def test_bad_records_are_refused_atomically(
    topic_id: bytes, partition: int, record: Record, error: type[Exception]
) -> None:
    """A refused append (last record bad) leaves nothing of itself in the segment."""
    builder = SegmentBuilder()
    good = Record(b"k", b"v", 5)
    builder.append(TOPIC_B, 1, [good])
    with pytest.raises(error):
        builder.append(topic_id, partition, [good, good, record])
    assert builder.record_count == 1
    data, infos = builder.build()
    assert [(c.topic_id, c.partition, c.record_count) for c in infos] == [(TOPIC_B, 1, 1)]
    assert SegmentReader(data).records(infos[0]) == [(0, good)]


def test_build_is_final_and_repeatable() -> None:
    builder = SegmentBuilder()
    builder.append(TOPIC_A, 0, [Record(b"k", b"v", 1)])
    first = builder.build()
    assert builder.build() == first
    with pytest.raises(RuntimeError, match="already built"):
        builder.append(TOPIC_A, 0, [Record(b"k", b"v", 1)])


def test_batches_split_at_max_batch_bytes() -> None:
    """1 KiB records with 4 KiB batches: several batches, none far past the limit."""
    recs = [Record(b"k%05d" % i, bytes([i % 256]) * 1024, i) for i in range(40)]
    builder = SegmentBuilder("none", max_batch_bytes=4096)
    builder.append(TOPIC_A, 0, recs[:15])
    builder.append(TOPIC_A, 0, recs[15:])
    data, infos = builder.build()
    chunk = chunk_bytes(data, infos[0])
    headers = batch_headers(chunk)
    assert len(headers) == 14  # 3 records (~3.1 KiB) per 4 KiB batch
    assert [base for base, _, _ in headers] == list(range(0, 40, 3))
    pos = 0
    while pos < len(chunk):
        length = 12 + struct.unpack_from(">i", chunk, pos + 8)[0]
        assert length <= 4096
        pos += length
    assert SegmentReader(data).records(infos[0]) == list(enumerate(recs))


def test_a_reader_from_an_offset_decodes_no_batch_below_it() -> None:
    """A reader resuming inside a chunk (every fetch after the first) decodes only what it
    reads: a batch wholly below its offset is framed and CRC-checked, never decoded, and
    the records of the batch holding the offset come from it on. Shown with a first
    batch whose records are garbage under a valid CRC: reading from the second batch
    works, reading from the start meets the garbage."""
    recs = [Record(b"k%05d" % i, bytes([i % 256]) * 1024, i) for i in range(9)]
    builder = SegmentBuilder("none", max_batch_bytes=4096)
    builder.append(TOPIC_A, 0, recs)
    data, infos = builder.build()
    chunk = bytearray(chunk_bytes(data, infos[0]))
    assert [base for base, _, _ in batch_headers(bytes(chunk))] == [0, 3, 6]
    chunk[61:63] = b"\xff\xff"  # the first record's length varint: never ends
    struct.pack_into(">I", chunk, 17, crc32c.crc32c(bytes(chunk[21 : 12 + batch_len(chunk)])))
    got = list(segment.iter_chunk(bytes(chunk), 100, record_count=9, from_offset=104))
    assert got == [(100 + i, recs[i]) for i in range(4, 9)]
    with pytest.raises(CorruptSegmentError, match="undecodable"):
        list(segment.iter_chunk(bytes(chunk), 100, record_count=9, from_offset=102))


def batch_len(chunk: bytes | bytearray) -> int:
    return int(struct.unpack_from(">i", chunk, 8)[0])


@pytest.mark.parametrize("compression", COMPRESSIONS[1:])
def test_each_codec_really_compresses(compression: str) -> None:
    """Repetitive records: the compressed object is far smaller and its batches carry the codec."""
    recs = [
        Record(b"key-%d" % (i % 10), b"lakelog " * 128, 1_700_000_000_000 + i) for i in range(500)
    ]
    plain = SegmentBuilder("none")
    plain.append(TOPIC_A, 3, recs)
    plain_data, _ = plain.build()
    packed = SegmentBuilder(compression)
    packed.append(TOPIC_A, 3, recs)
    packed_data, infos = packed.build()
    assert len(packed_data) * 5 < len(plain_data)
    codec = COMPRESSIONS.index(compression)
    assert {attrs for _, _, attrs in batch_headers(chunk_bytes(packed_data, infos[0]))} == {codec}
    assert SegmentReader(packed_data).records(infos[0], 1000) == list(enumerate(recs, start=1000))


# --- LogAppendTime ----------------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_log_append_time_chunks_are_stamped_at_build(compression: str) -> None:
    """A chunk of a LogAppendTime topic gets the append time on every batch (attributes
    bit 3, MaxTimestamp, a CRC that still checks) and in the footer; readers decode
    every record at that time, type 1. Other chunks keep their CreateTime."""
    stamped, plain = uuid.uuid4().bytes, uuid.uuid4().bytes
    builder = SegmentBuilder(compression=compression, max_batch_bytes=200)
    recs = [Record(b"k", b"v" * 50, 1_000 + i, (("h", b"x"),)) for i in range(10)]
    builder.append(stamped, 0, recs, log_append_time=True)
    builder.append(plain, 0, recs[:2])
    with pytest.raises(ValueError, match="append_time_ms"):
        builder.build()
    data, infos = builder.build(append_time_ms=1_700_000_000_123)
    reader = SegmentReader(data)
    assert (infos[0].min_timestamp_ms, infos[0].max_timestamp_ms) == (1_700_000_000_123,) * 2
    assert (infos[1].min_timestamp_ms, infos[1].max_timestamp_ms) == (1_000, 1_001)
    got = [r for _, r in reader.records(infos[0])]
    assert got == [r._replace(timestamp_ms=1_700_000_000_123, timestamp_type=1) for r in recs]
    assert [r for _, r in reader.records(infos[1])] == recs[:2]
    assert len(list(segment.iter_chunk(chunk_bytes(data, infos[0]), 0))) == 10
