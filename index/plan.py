"""Planning a read of offset ranges: index entries cut into scan tasks.

``plan_tasks`` walks each partition's index over the range it is given
(``index.walk``, as a snapshot read: records gone since the range was resolved fail the
plan). Every entry becomes a :class:`Slice` that owns a disjoint offset range
``[lo, hi)``: entries looked up page by page may overlap when tiering swapped rows in
between (a Parquet row that replaced the segment rows already seen), and the disjoint
ranges make a record come out exactly once whatever the index did meanwhile. Slices are
then packed into :class:`ScanTask` s: small segment chunks merged up to
``max_bytes_per_task``, big Parquet objects cut into pieces of whole row groups (their
footers read while planning, ``segments.tier.tier_row_groups``; a piece reads the row
groups whose first offset falls in it).

Pushed-down filters arrive as :class:`Bounds`: partitions and topics prune whole
partitions, offset bounds narrow the ranges, timestamp bounds drop entries whose
min/max timestamps miss them (and, in the task, row groups and rows).

Spark's batch reads, streams and history tables plan with it (``spark.plan`` resolves
their options into ranges first; ``spark.scan`` reads the tasks). No pyspark here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import cast

from coordinator.client import ChunkRef, Coordinator, IndexWant, TransactionCoordinator
from coordinator.log.topic_configs import max_decompressed_bytes
from index.walk import walk
from segments.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from segments.errors import OffsetOutOfRangeError, TopicNotFoundError
from segments.store import ObjectStore
from segments.tier import tier_row_groups

__all__ = ["Bounds", "ScanTask", "Slice", "pack_slices", "plan_tasks"]

# Index entries fetched per coordinator lookup while walking a partition.
_LOOKUP_PAGE = 1000
# Task sizing (compressed bytes). Segment chunks cost ~0.25 s of Python decoding per MiB,
# so small tasks still outweigh Spark's per-task cost (a reused worker) and spread over
# the cores; Parquet objects are cut into pieces of whole row groups.
_MIN_TASK_BYTES = 256 << 10
# Tier object footers read at once while planning (only of objects to be cut in pieces).
_FOOTER_THREADS = 8


@dataclass(frozen=True, slots=True)
class Bounds:
    """Pushed-down filters, as inclusive bounds (None: unbounded)."""

    topics: frozenset[str] | None = None
    partitions: frozenset[int] | None = None
    min_offset: int | None = None
    max_offset: int | None = None
    min_ts: int | None = None
    max_ts: int | None = None

    def ts_overlaps(self, lo: int, hi: int) -> bool:
        """Whether timestamps in [lo, hi] can pass the timestamp bounds."""
        return (self.min_ts is None or hi >= self.min_ts) and (
            self.max_ts is None or lo <= self.max_ts
        )


@dataclass(frozen=True, slots=True)
class Slice:
    """Offsets [lo, hi) of one index entry (a segment chunk or a Parquet object).

    ``position`` and ``length`` are the index entry's: for a Parquet object, 0 and the
    object's size (where its footer is), whatever piece of it this slice reads. For a
    piece of a split Parquet object, only row groups whose first offset lies in
    [rg_lo, rg_hi) are read (their rows still clipped to [lo, hi)), and ``cost`` is the
    piece's share of the object's bytes: what task packing counts.
    """

    topic: str
    partition: int
    kind: str
    object_key: str
    position: int
    length: int
    base_offset: int
    record_count: int
    lo: int
    hi: int
    rg_lo: int = 0
    rg_hi: int = 2**63 - 1
    cost: int = -1
    #: The topic's lakelog.max.decompressed.bytes: no batch is inflated past it.
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    #: A read_committed read of a segment chunk: the aborted transactions (producer id,
    #: first offset, abort marker's offset) whose records it leaves out
    #: (``segments.segment.drop_aborted``). Tier objects hold committed records only.
    aborted: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.cost < 0:
            object.__setattr__(self, "cost", self.length)

    @classmethod
    def of(
        cls,
        topic: str,
        partition: int,
        ref: ChunkRef,
        lo: int,
        hi: int,
        max_decompressed: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    ) -> Slice:
        """Offsets [lo, hi) of the index entry ``ref``."""
        return cls(
            topic,
            partition,
            ref.kind,
            ref.object_key,
            ref.position,
            ref.length,
            ref.base_offset,
            ref.record_count,
            lo,
            hi,
            max_decompressed=max_decompressed,
        )


@dataclass(frozen=True, slots=True)
class ScanTask:
    """The slices one Spark task reads, grouped by object."""

    slices: tuple[Slice, ...]

    @property
    def nbytes(self) -> int:
        return sum(s.cost for s in self.slices)


def _slices(
    coordinator: Coordinator,
    topic: str,
    partition: int,
    start: int,
    end: int,
    bounds: Bounds,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    topic_id: bytes | None = None,
) -> Iterator[Slice]:
    """Disjoint slices covering [start, end) from the index (of ``topic_id`` only, if
    given), pruned by timestamp bounds.

    Raises:
        ValueError: the topic or records of the range were deleted while planning.
    """

    def page(at: int) -> list[ChunkRef]:
        return coordinator.lookup(topic, partition, at, _LOOKUP_PAGE, topic_id=topic_id)

    where = f"{topic}-{partition}"
    try:
        for ref, lo, hi in walk(page, start, end, follow_log_start=False, where=where):
            if bounds.ts_overlaps(ref.min_timestamp_ms, ref.max_timestamp_ms):
                yield Slice.of(topic, partition, ref, lo, hi, max_decompressed)
    except TopicNotFoundError:
        raise ValueError(
            f"{where}: the topic was deleted (or deleted and created again) while planning; "
            "run the read again"
        ) from None
    except OffsetOutOfRangeError as e:
        raise ValueError(f"{e}: records were deleted while planning; run the read again") from None


def _with_aborted(
    coordinator: Coordinator,
    slices: list[Slice],
    ranges: Mapping[tuple[str, int], tuple[int, int]],
    topic_ids: Mapping[str, bytes] | None,
) -> list[Slice]:
    """``slices`` with the aborted transactions of their partitions that overlap them."""
    keys = list(ranges)
    wants = [
        IndexWant(t, p, ranges[(t, p)][0], None if topic_ids is None else topic_ids.get(t))
        for t, p in keys
    ]
    views = cast(TransactionCoordinator, coordinator).stable_offsets(wants) if wants else {}
    aborted = {keys[i]: view.aborted for i, view in views.items() if view.aborted}
    if not aborted:
        return slices
    out = []
    for s in slices:
        overlapping = tuple(
            a for a in aborted.get((s.topic, s.partition), ()) if a[1] < s.hi and a[2] >= s.lo
        )
        out.append(replace(s, aborted=overlapping) if overlapping and s.kind == "segment" else s)
    return out


#: (first offset, last offset, compressed bytes) of each row group of a tier object.
RowGroups = list[tuple[int, int, int]]


def _split(s: Slice, max_bytes: int, groups: RowGroups) -> list[Slice]:
    """A big Parquet object's slice as pieces of whole row groups, about max_bytes each.

    A piece reads the row groups whose first offset lies in [rg_lo, rg_hi); row groups
    wholly outside [lo, hi) are left out of the count (no piece reads their rows).
    """
    inside = [g for g in groups if g[1] >= s.lo and g[0] < s.hi]
    pieces: list[list[tuple[int, int, int]]] = []
    size = 0
    for g in inside:
        if not pieces or size + g[2] > max_bytes:
            pieces.append([])
            size = 0
        pieces[-1].append(g)
        size += g[2]
    if len(pieces) <= 1:
        return [s]
    # Row groups are assigned by their first offset, which may lie before lo: the first
    # piece takes everything below, the last everything above. Every piece keeps the
    # object's length: the reader finds the footer with it.
    cuts = [0, *(piece[0][0] for piece in pieces[1:]), 2**63 - 1]
    return [
        replace(s, rg_lo=cuts[i], rg_hi=cuts[i + 1], cost=sum(g[2] for g in piece))
        for i, piece in enumerate(pieces)
    ]


def _row_groups(store: ObjectStore, slices: list[Slice]) -> dict[Slice, RowGroups]:
    """The row groups of each slice's tier object, footers fetched in parallel."""
    if not slices:
        return {}

    def groups(s: Slice) -> RowGroups:
        return tier_row_groups(store, s.object_key, s.length, s.topic, s.partition)

    with ThreadPoolExecutor(min(_FOOTER_THREADS, len(slices))) as pool:
        return dict(zip(slices, pool.map(groups, slices), strict=True))


def pack_slices(slices: list[Slice], max_bytes: int, store: ObjectStore) -> list[ScanTask]:
    """Slices into scan tasks of about ``max_bytes`` (see ``_pack``; ``spark.history``)."""
    total = sum(s.length for s in slices)
    return _pack(slices, min(max_bytes, max(_MIN_TASK_BYTES, total // 8)), store)


def _pack(slices: list[Slice], max_bytes: int, store: ObjectStore) -> list[ScanTask]:
    """Consecutive slices into tasks of about max_bytes.

    A Parquet object bigger than that is cut into pieces of whole row groups (its footer
    read here); a slice bigger than max_bytes that cannot be cut is a task of its own.
    """
    big = [s for s in slices if s.kind == "parquet" and s.length > max_bytes]
    layouts = _row_groups(store, big)
    tasks: list[ScanTask] = []
    current: list[Slice] = []
    size = 0
    for s in slices:
        pieces = _split(s, max_bytes, layouts[s]) if s in layouts else [s]
        for piece in pieces:
            if current and size + piece.cost > max_bytes:
                tasks.append(ScanTask(tuple(current)))
                current, size = [], 0
            current.append(piece)
            size += piece.cost
    if current:
        tasks.append(ScanTask(tuple(current)))
    return tasks


def plan_tasks(
    coordinator: Coordinator,
    store: ObjectStore,
    ranges: Mapping[tuple[str, int], tuple[int, int]],
    bounds: Bounds,
    max_bytes_per_task: int,
    topic_ids: Mapping[str, bytes] | None = None,
    *,
    read_committed: bool = False,
) -> list[ScanTask]:
    """Scan tasks reading offsets [start, end) of each topic-partition (within the bounds).

    What a batch read plans after resolving its offsets, and what a stream plans for
    each micro-batch: the same range gives the same records either way. ``topic_ids``:
    the id each topic had when the ranges were resolved; the index of a topic deleted
    (and created again) meanwhile is not read as if it were the same log.

    ``read_committed``: the ranges end at or below each partition's last stable offset
    (the caller's snapshot); each segment slice is given the aborted transactions whose
    records it must leave out. Their ranges are final below that offset, so the same
    range planned again (a micro-batch after a restart) reads the same records.

    Raises:
        ValueError: the index no longer holds a range's records (see :func:`_slices`).
    """
    slices: list[Slice] = []
    limits: dict[str, int] = {}
    for (topic, partition), (start, end) in ranges.items():
        if bounds.min_offset is not None:
            start = max(start, bounds.min_offset)
        if bounds.max_offset is not None:
            end = min(end, bounds.max_offset + 1)
        if start < end:
            if topic not in limits:
                limits[topic] = max_decompressed_bytes(coordinator.get_topic(topic))
            topic_id = None if topic_ids is None else topic_ids.get(topic)
            slices.extend(
                _slices(coordinator, topic, partition, start, end, bounds, limits[topic], topic_id)
            )
    if read_committed:
        slices = _with_aborted(coordinator, slices, ranges, topic_ids)
    # Object by object: a segment object holds a chunk of every partition its flush had,
    # and a task fetches the chunks of one object with one GET (the order of rows within
    # a task means nothing to Spark).
    slices.sort(key=lambda s: (s.object_key, s.position, s.lo))
    # Big reads get at least ~8 tasks, so that every executor core has work.
    total = sum(s.length for s in slices)
    target = min(max_bytes_per_task, max(_MIN_TASK_BYTES, total // 8))
    return _pack(slices, target, store)
