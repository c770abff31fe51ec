"""Walking a partition's index: an offset range in, the entries that hold it out.

Every reader of the log turns (topic, partition, [start, end)) into index entries the
same way, here: the agent's reads (``LogReader.entries``, under the Kafka and REST
doors), Spark's planning (``spark.plan``) and the timestamp seeks of both (Kafka's
ListOffsets by time, Spark's ``startingTimestamp``). What differs between them is
said by arguments, not written again:

- **how a page is looked up**: ``lookup(offset)``, the caller's (the agent goes
  through its index cache and starts read-ahead; Spark asks the coordinator for big
  pages of one topic id);
- **what a gap at the cursor means** (``follow_log_start``): to a live read, the
  log-start moved past the cursor meanwhile (retention, DeleteRecords) and the read goes
  on from the first entry there is; to a read of a snapshot (Spark), records it
  planned to read are gone, and the read fails.

Either way, entries that do not move the cursor (a hole the index should never have)
raise ``IndexHoleError`` instead of asking again forever.

Owns no state and does no I/O of its own; imports ``ChunkRef`` and errors only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeVar

from coordinator.client import ChunkRef
from segments.errors import IndexHoleError, OffsetOutOfRangeError

__all__ = ["Span", "seek_timestamp", "walk"]

T = TypeVar("T")


class Span(NamedTuple):
    """One index entry and the offsets [lo, hi) a walk takes from it (disjoint from
    every other span of the walk, even where entries overlap)."""

    ref: ChunkRef
    lo: int
    hi: int


def walk(
    lookup: Callable[[int], list[ChunkRef]],
    start: int,
    end: int,
    *,
    follow_log_start: bool,
    where: str,
) -> Iterator[Span]:
    """The spans covering offsets [start, end), in order, looked up page by page.

    ``lookup(offset)``: index entries from the one holding ``offset`` on (a page;
    ``Coordinator.lookup``). ``where`` names the partition in errors. Lazy: a page is
    looked up when the walk reaches it, so a caller that stops early asks no further.

    Raises:
        OffsetOutOfRangeError: (``follow_log_start`` False) the index no longer holds an
            offset of the range: records were deleted since the caller read its bounds.
        IndexHoleError: entries that leave the cursor where it was.
    """
    cursor = start
    while cursor < end:
        refs = lookup(cursor)
        if not refs or refs[0].base_offset > cursor:
            if not follow_log_start:
                raise OffsetOutOfRangeError(
                    f"{where}: the index no longer holds offset {cursor} (of {start}-{end - 1})"
                )
            if not refs:
                return  # log-start passed the end meanwhile (DeleteRecords)
            cursor = refs[0].base_offset
        before = cursor
        for ref in refs:
            lo, hi = max(ref.base_offset, cursor), min(ref.end_offset, end)
            if lo >= hi:
                if ref.base_offset >= end:
                    return
                continue
            yield Span(ref, lo, hi)
            cursor = hi
            if cursor >= end:
                return
        if cursor <= before:
            raise IndexHoleError(
                f"The index of {where} holds no entry past offset {cursor}, below the end "
                f"of the read at {end}."
            )


def seek_timestamp(
    lookup: Callable[[int], ChunkRef | None],
    first_at: Callable[[ChunkRef, int], T | None],
    log_start: int,
) -> T | None:
    """The first record at or after ``log_start`` at or after a time (Kafka's ListOffsets
    by timestamp), or None: no record is that recent.

    ``lookup(start)``: the first index entry from ``start`` on whose max timestamp
    reaches the time (``Coordinator.lookup_timestamp``); ``first_at(entry, start)``: the
    first of its records at or after ``start`` that does (the caller decodes). The entry
    found may hold no such record: one that straddles log-start may hold its recent
    records below it only, and an entry's max timestamp counts its transaction markers
    (issue 30), which are no records. Either way the next entry is read.
    """
    start = log_start
    while True:
        ref = lookup(start)
        if ref is None:
            return None
        found = first_at(ref, start)
        if found is not None:
            return found
        start = ref.end_offset
