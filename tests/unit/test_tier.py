"""Parquet tier format: Spark schema, round trip, pruning and corruption (segments/tier.py)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segments import tier
from segments.errors import CorruptSegmentError
from segments.memory import MemoryStore
from segments.tier import (
    TIER_SCHEMA,
    TierReader,
    encode_tier,
    tier_object_key,
)
from segments.types import ConsumedRecord, Record

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOPIC = "orders.v1"
PARTITION = 7

# --- helpers and strategies -------------------------------------------------------------

nullable_bytes = st.one_of(st.none(), st.just(b""), st.binary(max_size=40))
records_st = st.builds(
    Record,
    key=nullable_bytes,
    value=nullable_bytes,
    timestamp_ms=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    headers=st.lists(st.tuples(st.text(max_size=8), nullable_bytes), max_size=3).map(tuple),
    timestamp_type=st.sampled_from([0, 1]),  # kept by tiering (Kafka's timestampType)
)


@st.composite
def offset_records(draw: st.DrawFn) -> list[tuple[int, Record]]:
    """1-60 records at strictly increasing offsets; gaps (compaction) allowed."""
    recs = draw(st.lists(records_st, min_size=1, max_size=60))
    offset = draw(st.integers(min_value=0, max_value=2**62))
    out = []
    for rec in recs:
        out.append((offset, rec))
        offset += draw(st.sampled_from([1, 1, 1, 2, 1000]))
    return out


def consumed(pairs: Sequence[tuple[int, Record]]) -> list[ConsumedRecord]:
    return [
        ConsumedRecord(
            TOPIC, PARTITION, off, r.key, r.value, r.timestamp_ms, r.headers, r.timestamp_type
        )
        for off, r in pairs
    ]


def sample(n: int, first: int = 0, step: int = 1) -> list[tuple[int, Record]]:
    """n small records at first, first+step, ...; every kind of key, value and header."""
    out = []
    for i in range(n):
        key = None if i % 4 == 0 else (b"" if i % 4 == 1 else b"k%d" % (i % 10))
        value = None if i % 9 == 0 else b"value-%d-" % i * (i % 5)
        headers = (("trace", b"t%d" % i), ("empty", None)) if i % 3 == 0 else ()
        out.append((first + i * step, Record(key, value, 1_700_000_000_000 + i, headers)))
    return out


def read_all(data: bytes) -> tuple[tuple[Any, ...], list[ConsumedRecord], pa.Table]:
    r = TierReader(data)
    meta = (
        r.topic,
        r.partition,
        r.first_offset,
        r.last_offset,
        r.record_count,
        r.min_timestamp_ms,
        r.max_timestamp_ms,
    )
    return meta, r.records(0), r.table()


# --- schema -----------------------------------------------------------------------------


def test_schema_is_sparks_kafka_source_schema() -> None:
    """Names, order and types are those of Spark's Kafka source with includeHeaders=true.

    Spark (KafkaRecordToRowConverter): key binary, value binary, topic string, partition
    int, offset long, timestamp timestamp, timestampType int,
    headers array<struct<key:string,value:binary>>; key/value/headers nullable.
    """
    spark_to_arrow = {
        "binary": pa.binary(),
        "string": pa.string(),
        "int": pa.int32(),
        "long": pa.int64(),
        # Spark's TimestampType = instant; Parquet TIMESTAMP(isAdjustedToUTC=true).
        "timestamp": pa.timestamp("ms", tz="UTC"),
        "array<struct<key:string,value:binary>>": pa.list_(
            pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
        ),
    }
    spark = [
        ("key", "binary", True),
        ("value", "binary", True),
        ("topic", "string", False),
        ("partition", "int", False),
        ("offset", "long", False),
        ("timestamp", "timestamp", False),
        ("timestampType", "int", False),
        ("headers", "array<struct<key:string,value:binary>>", True),
    ]
    expected = pa.schema([pa.field(n, spark_to_arrow[t], nullable=null) for n, t, null in spark])
    assert TIER_SCHEMA.equals(expected, check_metadata=True)

    data = encode_tier(TOPIC, PARTITION, sample(3))
    assert pq.read_schema(io.BytesIO(data)).equals(TIER_SCHEMA, check_metadata=False)
    parquet_schema = str(pq.ParquetFile(io.BytesIO(data)).schema)
    # What Spark's ParquetSchemaConverter maps to TimestampType (not TimestampNTZType).
    assert "required int64 field_id=-1 timestamp (Timestamp(isAdjustedToUTC=true, " in (
        parquet_schema
    )
    assert "timeUnit=milliseconds" in parquet_schema
    # The standard 3-level LIST, read by Spark as array<struct<...>>.
    assert "optional group field_id=-1 headers (List)" in parquet_schema
    assert "repeated group field_id=-1 list" in parquet_schema


def test_plain_pyarrow_reads_what_we_read() -> None:
    """Other readers (pq.read_table, so Spark/DuckDB/Polars alike) see the same rows."""
    data = encode_tier(TOPIC, PARTITION, sample(50), row_group_rows=16)
    ours = TierReader(data).table()
    theirs = pq.read_table(io.BytesIO(data)).replace_schema_metadata(None)
    assert theirs.equals(ours)
    assert ours.schema.equals(TIER_SCHEMA, check_metadata=True)
    assert ours.column("topic").unique().to_pylist() == [TOPIC]
    assert ours.column("partition").unique().to_pylist() == [PARTITION]
    assert ours.column("timestampType").unique().to_pylist() == [0]
    # No headers -> null, as Spark's Kafka source yields; a null header value stays null.
    headers = ours.column("headers").to_pylist()
    assert headers[1] is None
    assert headers[0] == [{"key": "trace", "value": b"t0"}, {"key": "empty", "value": None}]


def test_footer_has_metadata_statistics_and_sort_order() -> None:
    """Readers that know nothing of lakelog find our metadata, offset/time stats and order."""
    pairs = sample(40, first=100, step=3)
    data = encode_tier(TOPIC, PARTITION, pairs, row_group_rows=16, compression="zstd")
    md = pq.read_metadata(io.BytesIO(data))
    kv = {k.decode(): v.decode() for k, v in md.metadata.items()}
    assert re.fullmatch(r"lklcrc1:\d{20}:[0-9a-f]{8}", kv.pop("lakelog.integrity"))
    assert {k: v for k, v in kv.items() if k.startswith("lakelog.")} == {
        "lakelog.tier.version": "1",
        "lakelog.topic": TOPIC,
        "lakelog.partition": str(PARTITION),
        "lakelog.first_offset": "100",
        "lakelog.last_offset": str(100 + 39 * 3),
        "lakelog.record_count": "40",
        "lakelog.min_timestamp_ms": "1700000000000",
        "lakelog.max_timestamp_ms": "1700000000039",
    }
    assert md.num_row_groups == 3
    names = TIER_SCHEMA.names
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        assert rg.sorting_columns == (pq.SortingColumn(names.index("offset")),)
        off = rg.column(names.index("offset"))
        assert off.statistics.has_min_max
        assert off.compression == "ZSTD"
        assert rg.column(names.index("timestamp")).statistics.has_min_max
        assert not rg.column(names.index("value")).is_stats_set  # payload: no stats
        assert rg.column(names.index("offset")).has_offset_index  # page index written
    first = md.row_group(1).column(names.index("offset")).statistics
    assert (first.min, first.max) == (100 + 16 * 3, 100 + 31 * 3)


# --- round trip -------------------------------------------------------------------------


@PROPERTY
@given(
    pairs=offset_records(),
    row_group_rows=st.integers(min_value=1, max_value=20),
    as_consumed=st.booleans(),
    compression=st.sampled_from(["zstd", "none", "snappy", "gzip", "lz4"]),
    data=st.data(),
)
def test_round_trip(
    pairs: list[tuple[int, Record]],
    row_group_rows: int,
    as_consumed: bool,
    compression: str,
    data: st.DataObject,
) -> None:
    """decode(encode(x)) == x: None vs b"", headers (None values), ms timestamps, offsets."""
    expected = consumed(pairs)
    source: Iterable[tuple[int, Record] | ConsumedRecord] = expected if as_consumed else pairs
    blob = encode_tier(
        TOPIC, PARTITION, iter(source), row_group_rows=row_group_rows, compression=compression
    )
    reader = TierReader(blob)
    assert reader.records(0) == expected
    assert (reader.topic, reader.partition) == (TOPIC, PARTITION)
    assert (reader.first_offset, reader.last_offset) == (pairs[0][0], pairs[-1][0])
    assert reader.record_count == len(pairs)
    stamps = [r.timestamp_ms for _, r in pairs]
    assert (reader.min_timestamp_ms, reader.max_timestamp_ms) == (min(stamps), max(stamps))
    # Row groups partition the records in order, each at most row_group_rows.
    groups = reader.row_groups
    assert [g.record_count for g in groups] == [
        min(row_group_rows, len(pairs) - i) for i in range(0, len(pairs), row_group_rows)
    ]
    assert [(g.first_offset, g.last_offset) for g in groups] == [
        (pairs[i][0], pairs[min(i + row_group_rows, len(pairs)) - 1][0])
        for i in range(0, len(pairs), row_group_rows)
    ]
    # A random starting point (maybe in a gap) and limit give the matching slice.
    lo, hi = pairs[0][0] - 2, pairs[-1][0] + 2
    start = data.draw(st.integers(min_value=max(0, lo), max_value=hi), label="from_offset")
    limit = data.draw(st.one_of(st.none(), st.integers(0, 70)), label="max_records")
    tail = [r for r in expected if r.offset >= start]
    assert reader.records(start, limit) == (tail if limit is None else tail[:limit])
    # The Arrow view holds the same values.
    table = reader.table()
    assert table.column("offset").to_pylist() == [o for o, _ in pairs]
    assert table.column("key").to_pylist() == [r.key for _, r in pairs]
    assert table.column("value").to_pylist() == [r.value for _, r in pairs]
    assert table.column("timestamp").cast(pa.int64()).to_pylist() == stamps


def test_row_groups_are_cut_by_payload_bytes() -> None:
    """row_group_bytes closes a row group once its payload reaches the target."""
    pairs = [(i, Record(None, b"x" * 1000, 0)) for i in range(100)]
    reader = TierReader(encode_tier(TOPIC, PARTITION, pairs, row_group_bytes=10_000))
    # 1000 bytes of value + 24 of per-record overhead: the 10th record reaches 10,240.
    assert [g.record_count for g in reader.row_groups] == [10] * 10
    assert reader.records(0) == consumed(pairs)


# --- reading from an offset and pruning --------------------------------------------------


@pytest.fixture
def five_groups() -> tuple[TierReader, list[ConsumedRecord]]:
    """100 records at offsets 1000, 1002, ..., 1198 in 5 row groups of 20."""
    pairs = sample(100, first=1000, step=2)
    return TierReader(encode_tier(TOPIC, PARTITION, pairs, row_group_rows=20)), consumed(pairs)


def offsets(records: Sequence[ConsumedRecord]) -> list[int]:
    return [r.offset for r in records]


def test_records_from_offset_inside_at_boundary_and_past_end(
    five_groups: tuple[TierReader, list[ConsumedRecord]],
) -> None:
    """from_offset inside a group, on group edges, in a gap, before the start and past the end."""
    reader, everything = five_groups
    assert [(g.first_offset, g.last_offset) for g in reader.row_groups] == [
        (1000 + 40 * i, 1038 + 40 * i) for i in range(5)
    ]
    # Inside row group 1.
    assert offsets(reader.records(1050, 3)) == [1050, 1052, 1054]
    # In a gap (odd offsets do not exist): starts at the next record.
    assert offsets(reader.records(1051, 2)) == [1052, 1054]
    # First offset of group 2, and last offset of group 1 spilling into group 2.
    assert offsets(reader.records(1080, 2)) == [1080, 1082]
    assert offsets(reader.records(1078, 3)) == [1078, 1080, 1082]
    # Before the first offset: everything; max_records across three groups.
    assert reader.records(0) == everything
    assert offsets(reader.records(900, 45)) == offsets(everything[:45])
    assert reader.records(1010, 0) == []
    # The last offset, then past the end: nothing, and no row group decoded.
    assert offsets(reader.records(1198)) == [1198]
    before = reader.row_groups_read
    assert reader.records(1199) == []
    assert reader.records(10**12) == []
    assert reader.row_groups_read == before
    with pytest.raises(ValueError):
        reader.records(0, -1)


def test_reads_decode_only_the_row_groups_needed(
    five_groups: tuple[TierReader, list[ConsumedRecord]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning is real: pyarrow is asked for the overlapping row groups only.

    TierReader._scan is the one call that decodes row data (a dataset fragment limited
    to row_group_ids); the spy records what it is asked for.
    """
    reader, everything = five_groups
    asked: list[list[int]] = []
    original = TierReader._scan

    def spy(self: TierReader, row_groups: list[int], columns: list[str]) -> pa.Table:
        asked.append(list(row_groups))
        table = original(self, row_groups, columns)
        assert table.num_rows == sum(reader.row_groups[i].record_count for i in row_groups)
        return table

    monkeypatch.setattr(TierReader, "_scan", spy)

    assert offsets(reader.records(1170, 3)) == [1170, 1172, 1174]
    assert asked == [[4]]
    asked.clear()
    # A limit that ends inside group 2 stops there: groups 3 and 4 are never read.
    assert len(reader.records(1030, 30)) == 30
    assert asked == [[0], [1], [2]]
    asked.clear()
    table = reader.table(columns=["offset", "value"], offset_range=(1041, 1081))
    assert asked == [[1, 2]]
    assert table.column_names == ["offset", "value"]
    assert table.column("offset").to_pylist() == list(range(1042, 1081, 2))
    assert table.column("value").to_pylist() == [r.value for r in everything[21:41]]
    asked.clear()
    assert reader.table(offset_range=(1199, 5000)).num_rows == 0
    assert reader.table(offset_range=(1050, 1050)).num_rows == 0
    assert asked == []
    assert reader.table(offset_range=(1050, 1050)).schema.equals(TIER_SCHEMA)
    assert reader.row_groups_read == 6


def test_table_rejects_unknown_columns_and_reversed_ranges(
    five_groups: tuple[TierReader, list[ConsumedRecord]],
) -> None:
    reader, _ = five_groups
    with pytest.raises(ValueError, match="unknown tier columns"):
        reader.table(columns=["offset", "nope"])
    with pytest.raises(ValueError, match="bad offset range"):
        reader.table(offset_range=(10, 5))


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pairs", "match"),
    [
        ([(5, Record(None, b"a", 0)), (4, Record(None, b"b", 0))], "strictly increasing"),
        ([(5, Record(None, b"a", 0)), (5, Record(None, b"b", 0))], "strictly increasing"),
        ([(-1, Record(None, b"a", 0))], "out of range"),
        ([], "at least one record"),
        ([(0, Record(None, b"a", 2**63))], "int64"),
        ([(0, Record(None, b"a", 0, (("\ud800", None),)))], "cannot be encoded"),
    ],
)
def test_bad_records_are_refused(pairs: list[tuple[int, Record]], match: str) -> None:
    """Unsorted, duplicate or negative offsets, nothing at all, unencodable values."""
    with pytest.raises(ValueError, match=match):
        encode_tier(TOPIC, PARTITION, pairs)


def test_bad_options_and_foreign_records_are_refused() -> None:
    other = ConsumedRecord(TOPIC, PARTITION + 1, 0, None, b"x", 0)
    with pytest.raises(ValueError, match="in a tier object of"):
        encode_tier(TOPIC, PARTITION, [other])
    with pytest.raises(ValueError, match="compression"):
        encode_tier(TOPIC, PARTITION, sample(1), compression="brotli")
    with pytest.raises(ValueError):
        encode_tier(TOPIC, PARTITION, sample(1), row_group_rows=0)
    with pytest.raises(ValueError):
        encode_tier("", PARTITION, sample(1))
    with pytest.raises(ValueError):
        encode_tier(TOPIC, 2**31, sample(1))


# --- corruption ---------------------------------------------------------------------------

SMALL = encode_tier(TOPIC, PARTITION, sample(8), row_group_rows=4)
SMALL_READ = read_all(SMALL)


def flip(buf: bytes, index: int, mask: int) -> bytes:
    out = bytearray(buf)
    out[index] ^= mask
    return bytes(out)


def test_every_single_bit_flip_raises_or_changes_nothing() -> None:
    """Each byte of a small object flipped in turn: CorruptSegmentError or the same records.

    Page data is covered by page CRCs, the page index and footer by the tail CRC; a flip
    in a page header that pyarrow does not need changes nothing. It must never yield other
    records, and never crash the interpreter: pyarrow aborts the process on some corrupt
    footers (ColumnChunk size statistics, statistics of a mistyped column).
    """
    raised = 0
    for index in range(len(SMALL)):
        try:
            got = read_all(flip(SMALL, index, 1 << (index % 8)))
        except CorruptSegmentError:
            raised += 1
            continue
        assert got[0] == SMALL_READ[0], index
        assert got[1] == SMALL_READ[1], index
        assert got[2].equals(SMALL_READ[2]), index
    assert raised > len(SMALL) // 2


def test_flipped_byte_in_record_data_is_refused() -> None:
    """Flips in the value column's page payload (checksummed) always raise, in every row group.

    Each value chunk here is one data page: a ~25-byte Thrift page header, then the
    payload; the second half of the chunk is payload. (Flips in the header are in the
    sweep above: they raise or change nothing.)
    """
    md = pq.read_metadata(io.BytesIO(SMALL))
    value_col = TIER_SCHEMA.names.index("value")
    for rg in range(md.num_row_groups):
        chunk = md.row_group(rg).column(value_col)
        start, size = chunk.data_page_offset, chunk.total_compressed_size
        assert size > 60
        for index in range(start + size // 2, start + size):
            for mask in (0x01, 0x80):
                with pytest.raises(CorruptSegmentError):
                    read_all(flip(SMALL, index, mask))


@PROPERTY
@given(pairs=offset_records(), cut=st.integers(min_value=0))
def test_truncated_object_is_refused(pairs: list[tuple[int, Record]], cut: int) -> None:
    """Every proper prefix of an object raises CorruptSegmentError at open."""
    blob = encode_tier(TOPIC, PARTITION, pairs, row_group_rows=7)
    with pytest.raises(CorruptSegmentError):
        TierReader(blob[: cut % len(blob)])


@pytest.mark.parametrize(
    "blob",
    [b"", b"PAR1", b"PAR1PAR1", b"not parquet at all" * 10, pq.read_schema.__doc__.encode()],
)
def test_garbage_is_refused(blob: bytes) -> None:
    with pytest.raises(CorruptSegmentError):
        TierReader(blob)


def sealed(table: pa.Table, kv: dict[str, str]) -> bytes:
    """A Parquet file with a valid lakelog integrity marker but content of our choosing."""
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, table.schema) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata({**kv, "lakelog.integrity": tier._integrity_value(4, 0)})
    return tier._seal(sink)


def test_foreign_parquet_is_refused() -> None:
    """Valid Parquet that is not a tier object is refused: no marker, schema, metadata."""
    ours = TierReader(SMALL).table()
    md = {k.decode(): v.decode() for k, v in pq.read_metadata(io.BytesIO(SMALL)).metadata.items()}
    del md["lakelog.integrity"]
    # The right schema and metadata but no integrity marker (e.g. written by Spark).
    sink = io.BytesIO()
    pq.write_table(ours, sink)
    with pytest.raises(CorruptSegmentError, match="integrity"):
        TierReader(sink.getvalue())
    other = pa.table({"offset": pa.array([1, 2], pa.int64())})
    with pytest.raises(CorruptSegmentError, match="schema"):
        TierReader(sealed(other, md))
    with pytest.raises(CorruptSegmentError, match="version"):
        TierReader(sealed(ours, {k: v for k, v in md.items() if k != "lakelog.tier.version"}))
    assert TierReader(sealed(ours, md)).records(0) == SMALL_READ[1]  # the control


@pytest.mark.parametrize(
    ("key", "lie"),
    [
        ("lakelog.record_count", "9"),
        ("lakelog.topic", "other"),
        ("lakelog.partition", "8"),
        ("lakelog.first_offset", "1"),
        ("lakelog.max_timestamp_ms", "1"),
    ],
)
def test_metadata_that_disagrees_with_statistics_is_refused(key: str, lie: str) -> None:
    """A sealed, well-formed footer whose key-value metadata lies is refused."""
    table = TierReader(SMALL).table()
    md = {k.decode(): v.decode() for k, v in pq.read_metadata(io.BytesIO(SMALL)).metadata.items()}
    with pytest.raises(CorruptSegmentError):
        TierReader(sealed(table, {**md, key: lie}))


# --- object keys ----------------------------------------------------------------------------


def test_object_key_layout_and_order() -> None:
    """Zero-padded offsets: key order is offset order."""
    assert tier_object_key("orders", 3, 0, 41) == (
        "tiered/orders/partition=3/00000000000000000000-00000000000000000041.parquet"
    )
    ranges = [(0, 9), (10, 99), (100, 100), (101, 2**63 - 1)]
    keys = [tier_object_key("t", 0, a, b) for a, b in ranges]
    assert sorted(keys) == keys
    for bad in [("a/b", 0, 0, 1), ("", 0, 0, 1), ("t", -1, 0, 1), ("t", 0, 5, 4), ("t", 0, -1, 1)]:
        with pytest.raises(ValueError):
            tier_object_key(*bad)


def test_import_pulls_no_io_modules() -> None:
    """The tier codec is pure: importing it loads no store, HTTP, SQL or event-loop code."""
    probe = "import json, sys; import segments.tier; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(json.loads(out))
    forbidden = {"boto3", "botocore", "fastapi", "starlette", "httpx", "sqlite3", "asyncio"}
    assert "pyarrow.parquet" in loaded
    assert loaded & forbidden == set()


def test_delete_horizons_round_trip_and_default_to_unseen() -> None:
    """A compacted object's tombstone horizons come back by offset; an object written
    without them (by tiering) has none: its tombstones were never seen by compaction."""
    pairs = [(o, Record(b"k%d" % o, None, 1000, ())) for o in (3, 5, 9, 12)]
    plain = TierReader(encode_tier("t", 0, pairs))
    assert plain.delete_horizons == () and plain.delete_horizon(5) is None
    stamped = TierReader(encode_tier("t", 0, pairs, delete_horizons=[(3, 70_000), (9, 90_000)]))
    assert [stamped.delete_horizon(o) for o in (3, 5, 9, 12)] == [70_000, 70_000, 90_000, 90_000]
    with pytest.raises(ValueError, match="rise by offset"):
        encode_tier("t", 0, pairs, delete_horizons=[(9, 1), (3, 2)])


# --- read by ranged GETs (open_tier, tier_row_groups) ------------------------------------


def ranged(blob: bytes, size: int | None = None) -> tuple[MemoryStore, list[int]]:
    """A store holding ``blob`` as "t", and the sizes of the GETs made of it."""
    store, gets = MemoryStore(), []
    store.put("t", blob)
    get_range = store.get_range

    def counted(key: str, start: int, length: int) -> bytes:
        data = get_range(key, start, length)
        gets.append(len(data))
        return data

    store.get_range = counted  # type: ignore[method-assign]
    return store, gets


def test_a_footer_bigger_than_the_first_get_is_read_again_from_its_start() -> None:
    """600 row groups: the footer is past TAIL_BYTES, so the first GET (the last 64 KiB)
    does not hold it; open_tier reads again from the footer's start, then from where the
    CRC's coverage starts (the page index before the footer), checks the CRC and sees the
    same row groups as TierReader over the whole object."""
    blob = encode_tier(TOPIC, PARTITION, sample(1_200), row_group_rows=2)
    footer = int.from_bytes(blob[-8:-4], "little")
    assert footer > tier.TAIL_BYTES
    store, gets = ranged(blob)
    groups = tier.tier_row_groups(store, "t", len(blob), TOPIC, PARTITION)
    assert gets[0] == tier.TAIL_BYTES and gets[1] > footer
    assert len(gets) == 3 and gets[2] > gets[1]
    whole = TierReader(blob).row_groups
    assert [(g[0], g[1]) for g in groups] == [(g.first_offset, g.last_offset) for g in whole]
    assert [g[2] for g in groups] == [g.compressed_bytes for g in whole]


def test_every_bit_flip_in_the_tail_is_refused_by_the_ranged_open() -> None:
    """Each byte of the footer and trailer flipped in turn: open_tier raises
    CorruptSegmentError (never a crash, never a footer parsed unchecked)."""
    md = pq.read_metadata(io.BytesIO(SMALL))
    footer_at = len(SMALL) - 8 - md.serialized_size
    for index in range(footer_at, len(SMALL)):
        store, _ = ranged(flip(SMALL, index, 1 << (index % 8)))
        with pytest.raises(CorruptSegmentError):
            tier.tier_row_groups(store, "t", len(SMALL), TOPIC, PARTITION)


@pytest.mark.parametrize("cut", [1, 8, 100, len(SMALL) - 4])
def test_an_object_shorter_than_its_index_entry_is_refused_by_the_ranged_open(cut: int) -> None:
    store, _ = ranged(SMALL[:-cut])
    with pytest.raises(CorruptSegmentError, match="shorter than the index says"):
        tier.open_tier(store, "t", len(SMALL), TOPIC, PARTITION)


def test_the_ranged_open_refuses_another_partitions_object() -> None:
    store, _ = ranged(SMALL)
    with pytest.raises(CorruptSegmentError, match=f"holds {TOPIC}-{PARTITION}, the index says"):
        tier.open_tier(store, "t", len(SMALL), TOPIC, PARTITION + 1)
