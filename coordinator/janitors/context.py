"""What every janitor gets (context), is tuned by (config) and hands back (report)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordinator import clock

if TYPE_CHECKING:
    from coordinator.janitors.catalog import Catalog
    from coordinator.log.store import MetadataStore
    from coordinator.shards import ShardedCatalog, ShardedStore
    from segments.store import ObjectStore

JANITORS = ("tier", "retention", "compact", "gc", "table")

MiB = 1 << 20

#: Called after each unit of work: (units done, units in total, what was just done).
Progress = Callable[[int, int, str], None]

DEFAULT_INTERVALS_S = {
    "tier": 60.0,
    "retention": 60.0,
    "compact": 600.0,
    "gc": 300.0,
    "table": 60.0,
}


def _default_intervals() -> dict[str, float]:
    return dict(DEFAULT_INTERVALS_S)


def _default_row_group_bytes() -> int:
    """``segments.tier``'s row-group size, imported when a config is made: the settings
    that make one are read by every command, most of which never tier (and need not
    load pyarrow to start)."""
    from segments.tier import DEFAULT_ROW_GROUP_BYTES

    return DEFAULT_ROW_GROUP_BYTES


@dataclass(frozen=True, slots=True)
class JanitorConfig:
    """Which janitors run in the background, how often, and their thresholds.

    Attributes:
        enabled: janitors the coordinator runs on their intervals (empty: none).
        intervals_s: seconds between the end of one run and the start of the next,
            cluster-wide (the lease row keeps the schedule).
        tier_age_s: segment chunks committed at least this long ago are tiered.
        tier_untiered_bytes: a partition holding this many untiered bytes is tiered
            whatever their age.
        tier_target_bytes: source bytes per tier object (a run of chunks is cut here).
        tier_compression: Parquet compression of tier objects.
        tier_row_group_bytes: a tier object's row group closes at this many payload
            bytes (Spark reads cut objects into pieces of whole row groups).
        gc_grace_s: an unreferenced or orphan object is deleted this long after it
            lost its last index entry (or was written). Must exceed the longest read
            (lookup to GET, including agents' index cache TTL) and flush (PUT to commit).
        lease_ttl_s: a janitor lease lasts this long unless renewed (every third of it).
        tick_s: how often the runner looks for due janitors.
    """

    enabled: frozenset[str] = frozenset()
    intervals_s: dict[str, float] = field(default_factory=_default_intervals)
    tier_age_s: float = 600.0
    tier_untiered_bytes: int = 256 * MiB
    tier_target_bytes: int = 64 * MiB
    tier_compression: str = "zstd"
    tier_row_group_bytes: int = field(default_factory=_default_row_group_bytes)
    gc_grace_s: float = 600.0
    lease_ttl_s: float = 60.0
    tick_s: float = 1.0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.enabled) - set(JANITORS))
        if unknown:
            raise ValueError(f"unknown janitors {unknown}; expected some of {list(JANITORS)}")
        unknown = sorted(set(self.intervals_s) - set(JANITORS))
        if unknown:
            raise ValueError(f"intervals for unknown janitors {unknown}")
        if self.gc_grace_s <= 0 or self.lease_ttl_s <= 0 or self.tick_s <= 0:
            raise ValueError("gc_grace_s, lease_ttl_s and tick_s must be > 0")
        if (
            self.tier_target_bytes < 1
            or self.tier_untiered_bytes < 0
            or self.tier_age_s < 0
            or self.tier_row_group_bytes < 1
        ):
            raise ValueError("bad tiering thresholds")

    def interval_s(self, janitor: str) -> float:
        return self.intervals_s.get(janitor, DEFAULT_INTERVALS_S[janitor])

    @property
    def max_swap_delay_s(self) -> float:
        """A tier object older than this is never swapped in: GC may call it an orphan."""
        return self.gc_grace_s / 2


def _no_check() -> None:
    return None


@dataclass
class JanitorContext:
    """The database, the store, the clock, the lease check and a progress callback."""

    catalog: Catalog | ShardedCatalog
    metadata: MetadataStore | ShardedStore
    store: ObjectStore
    now: Callable[[], float] = clock.now
    #: Raises (LeaseLostError) when the run must stop; called between units of work.
    check: Callable[[], None] = _no_check
    progress: Progress | None = None

    def report_progress(self, done: int, total: int, what: str) -> None:
        if self.progress is not None:
            self.progress(done, total, what)


@dataclass
class JanitorReport:
    """What one run did. ``aborted``: swaps refused because the index changed meanwhile."""

    janitor: str
    partitions: int = 0
    rows_replaced: int = 0
    rows_written: int = 0
    rows_dropped: int = 0
    objects_written: int = 0
    bytes_read: int = 0
    bytes_rewritten: int = 0
    objects_deleted: int = 0
    orphans_deleted: int = 0
    records_dropped: int = 0
    aborted: int = 0
    #: Topic tables (coordinator.iceberg): snapshots committed and expired.
    snapshots_published: int = 0
    snapshots_expired: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def did_work(self) -> bool:
        """Whether the run read, wrote, dropped, deleted or aborted anything (``partitions``
        counts the partitions it looked at, work or not)."""
        idle = ("janitor", "partitions", "seconds")
        return any(getattr(self, k) for k in self.__dataclass_fields__ if k not in idle)
