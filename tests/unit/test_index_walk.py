"""``index.walk``: the one walk over a partition's index that the agent's reads and Spark's
planning share, with its two gap policies, against index pages the way the coordinator
serves them, and the ways a broken index could serve them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coordinator.client import ChunkRef
from coordinator.local import LocalCoordinator
from index.log import LogReader, LogWriter
from index.plan import Bounds, _slices
from index.walk import Span, seek_timestamp, walk
from segments.errors import IndexHoleError, OffsetOutOfRangeError
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.types import Record


def entry(base: int, count: int, key: str = "o", ts: tuple[int, int] = (0, 0)) -> ChunkRef:
    return ChunkRef(key, base, count, base, count, ts[0], ts[1])


def pages(entries: list[ChunkRef], size: int) -> tuple[Callable[[int], list[ChunkRef]], list[int]]:
    """``Coordinator.lookup`` over ``entries``: a page of ``size`` from the one holding the
    offset (or the first after it); also the offsets it was asked for."""
    asked: list[int] = []

    def lookup(at: int) -> list[ChunkRef]:
        asked.append(at)
        found = [r for r in entries if r.end_offset > at]
        return found[:size]

    return lookup, asked


def offsets(spans: list[Span]) -> list[tuple[int, int]]:
    return [(s.lo, s.hi) for s in spans]


@pytest.mark.parametrize("follow", [True, False])
def test_a_walk_over_many_pages_covers_the_range_once_clipped_to_its_ends(follow: bool) -> None:
    """500 entries of 10 offsets in pages of 16: the range [15, 4_985) needs 32 pages;
    every offset of it is in exactly one span, none outside it."""
    index = [entry(10 * i, 10) for i in range(500)]
    lookup, asked = pages(index, 16)
    spans = list(walk(lookup, 15, 4_985, follow_log_start=follow, where="t-0"))
    assert spans[0] == Span(index[1], 15, 20)
    assert spans[-1] == Span(index[498], 4_980, 4_985)
    covered = [o for s in spans for o in range(s.lo, s.hi)]
    assert covered == list(range(15, 4_985))
    assert len(asked) == 32


def test_overlapping_entries_give_disjoint_spans() -> None:
    """Tiering swapped a Parquet object covering [0, 30) in between two pages: the walk
    takes from each entry only what no earlier span took."""
    segments = [entry(0, 10, "seg"), entry(10, 10, "seg"), entry(20, 10, "seg")]
    tier = entry(0, 30, "tier")
    calls = iter([segments[:2], [tier]])
    spans = list(walk(lambda at: next(calls), 0, 30, follow_log_start=True, where="t-0"))
    assert [(s.ref.object_key, s.lo, s.hi) for s in spans] == [
        ("seg", 0, 10),
        ("seg", 10, 20),
        ("tier", 20, 30),
    ]


def test_a_live_read_follows_log_start_and_ends_when_nothing_is_left() -> None:
    """Retention dropped the first entries under the reader: it goes on from the first
    entry left; DeleteRecords past the end: nothing."""
    lookup, _ = pages([entry(30, 10), entry(40, 10)], 16)
    assert offsets(list(walk(lookup, 0, 50, follow_log_start=True, where="t-0"))) == [
        (30, 40),
        (40, 50),
    ]
    assert list(walk(lambda at: [], 0, 50, follow_log_start=True, where="t-0")) == []


@pytest.mark.parametrize("found", [[], [entry(30, 10)]], ids=["nothing", "later"])
def test_a_snapshot_read_fails_when_its_records_are_gone(found: list[ChunkRef]) -> None:
    """Spark planned [0, 40): the index no longer holds offset 0. The walk fails, naming
    the offset, instead of silently reading less than the snapshot said."""
    with pytest.raises(OffsetOutOfRangeError, match=r"t-0: .*no longer holds offset 0 \(of 0-39\)"):
        list(walk(lambda at: found, 0, 40, follow_log_start=False, where="t-0"))


@pytest.mark.parametrize("follow", [True, False])
def test_entries_that_do_not_move_the_cursor_raise_a_hole_instead_of_spinning(
    follow: bool,
) -> None:
    """A broken index answers a lookup at 10 with an entry ending at 10 (a hole at 10):
    asking again would get the same page forever."""
    lookup, asked = pages([entry(0, 10)], 16)

    def broken(at: int) -> list[ChunkRef]:
        return lookup(0)

    with pytest.raises(IndexHoleError, match="past offset 10, below the end of the read at 40"):
        list(walk(broken, 0, 40, follow_log_start=follow, where="t-0"))
    assert len(asked) == 2


def test_spark_planning_fails_on_a_hole_instead_of_planning_forever() -> None:
    """Before the shared walk, Spark's planner asked again from where the page ended and
    got the same page for ever. Now it raises like every other reader."""

    class Broken:
        def lookup(self, *args: Any, **kwargs: Any) -> list[ChunkRef]:
            return [entry(0, 10)]

    with pytest.raises(IndexHoleError):
        list(_slices(Broken(), "t", 0, 0, 40, Bounds()))  # type: ignore[arg-type]


def test_seek_timestamp_passes_a_straddling_entry_and_finds_the_next() -> None:
    """The entry found holds the time, but only below log-start: the next entry is read."""
    first, second = entry(0, 10, ts=(0, 500)), entry(10, 10, ts=(0, 600))
    tried: list[tuple[int, int]] = []

    def lookup(start: int) -> ChunkRef | None:
        return first if start < 10 else second if start < 20 else None

    def first_at(ref: ChunkRef, start: int) -> int | None:
        tried.append((ref.base_offset, start))
        return None if ref is first else max(start, ref.base_offset) + 3

    assert seek_timestamp(lookup, first_at, 5) == 13
    assert tried == [(0, 5), (10, 10)]
    assert seek_timestamp(lambda start: None, first_at, 0) is None


def test_seek_timestamp_passes_an_entry_whose_records_miss_its_own_max_timestamp() -> None:
    """A transaction marker (no record) may be what reaches an entry's max timestamp: the
    next entry is read, and past the last one there is no such record."""
    entries = [entry(0, 10, ts=(0, 500)), entry(10, 10, ts=(0, 600))]

    def lookup(start: int) -> ChunkRef | None:
        return next((e for e in entries if e.end_offset > start), None)

    assert seek_timestamp(lookup, lambda ref, start: ref.base_offset or None, 0) == 10
    assert seek_timestamp(lookup, lambda ref, start: None, 0) is None


def test_the_reader_walks_a_real_index_across_lookup_pages(tmp_path: Path) -> None:
    """The plain reader over a real coordinator and store: 40 one-record entries read in
    pages of 16 (the coordinator's default), from an offset in the middle."""
    coordinator = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    store = open_store(f"file://{tmp_path / 'data'}")
    try:
        topic_id = coordinator.create_topic("t", 1).topic_id
        writer = LogWriter(store, coordinator)
        for i in range(40):
            b = SegmentBuilder()
            b.append(topic_id, 0, [Record(None, b"v%d" % i, 1000 + i)])
            writer.write(b)
        reader = LogReader(store, coordinator)
        got = [(r.offset, r.value) for r in reader.records("t", 0, 7)]
        assert got == [(i, b"v%d" % i) for i in range(7, 40)]
        assert reader.offset_for_timestamp("t", 0, 1_030) == 30
        assert reader.offset_for_timestamp("t", 0, 5_000) is None
    finally:
        coordinator.close()
