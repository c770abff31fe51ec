"""Planning a Spark read: its options resolved against one snapshot of the offsets.

``plan_read`` asks the coordinator, once per partition, for the log-start offset and
the high watermark (the snapshot), resolves the starting and ending offsets (or
timestamps) against it, then has ``index.plan.plan_tasks`` cut the ranges into scan
tasks. Streams resolve their offsets here too (``subscribed_topics``,
``start_at_timestamp``).

No pyspark here: the bench and tests call it directly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

from coordinator.client import (
    Coordinator,
    IndexWant,
    PartitionOffsets,
    TopicInfo,
    TransactionCoordinator,
)
from index.plan import Bounds, ScanTask, plan_tasks
from index.walk import seek_timestamp
from segments.errors import PartitionNotFoundError, TopicNotFoundError
from segments.store import ObjectStore
from spark.options import EARLIEST, LATEST, ReadOptions

if TYPE_CHECKING:
    from spark.access import TopicAccess

__all__ = ["Plan", "plan_read", "start_at_timestamp", "subscribed_topics"]


@dataclass(frozen=True, slots=True)
class Plan:
    """A read's snapshot and tasks.

    ``snapshot``: (log-start, high watermark) per topic-partition at planning time;
    ``ranges``: the offsets [start, end) read from each.
    """

    snapshot: dict[tuple[str, int], tuple[int, int]]
    ranges: dict[tuple[str, int], tuple[int, int]]
    tasks: list[ScanTask] = field(default_factory=list)


def subscribed_topics(
    opts: ReadOptions,
    coordinator: Coordinator,
    access: TopicAccess | None = None,
    *,
    missing_ok: bool = False,
) -> list[TopicInfo]:
    """The topics ``subscribe`` names or ``subscribePattern`` matches, now; with
    ``access``, only those the job may see, and each one it may READ. ``missing_ok``:
    ``subscribe`` topics that do not exist are left out.

    Raises:
        ValueError: a ``subscribe`` topic does not exist (unless ``missing_ok``).
        AuthorizationError: a topic the job may not READ (``spark.access``).
    """
    if opts.topics is not None:
        if access is not None:  # before existence, which a denied job must not learn
            access.readable(opts.topics, pattern=False)
        out = []
        for name in opts.topics:
            try:
                out.append(coordinator.get_topic(name))
            except TopicNotFoundError:
                if not missing_ok:
                    raise ValueError(f"subscribe: unknown topic {name!r}") from None
        return out
    assert opts.pattern is not None
    # Spark's subscribePattern matches whole names (java.util.regex.Matcher.matches).
    regex = re.compile(opts.pattern)
    matched = [t for t in coordinator.list_topics() if regex.fullmatch(t.name)]
    if access is None:
        return matched
    seen = set(access.readable([t.name for t in matched], pattern=True))
    return [t for t in matched if t.name in seen]


def _topics(
    opts: ReadOptions, coordinator: Coordinator, bounds: Bounds, access: TopicAccess | None
) -> list[TopicInfo]:
    out = subscribed_topics(opts, coordinator, access)
    for spec in (opts.starting, opts.ending):
        if isinstance(spec, dict):
            names = {t.name: t for t in out}
            for topic, parts in spec.items():
                if topic not in names:
                    raise ValueError(f"offsets name topic {topic!r}, which this read does not read")
                missing = [p for p in parts if p >= names[topic].partitions]
                if missing:
                    raise ValueError(
                        f"offsets name unknown partition(s) {missing} of topic {topic!r} "
                        f"({names[topic].partitions} partitions)"
                    )
    return [t for t in out if bounds.topics is None or t.name in bounds.topics]


def _offset_for_timestamp(
    coordinator: Coordinator,
    store: ObjectStore,
    topic: str,
    partition: int,
    ts: int,
    log_start: int,
) -> int | None:
    """The first offset at or after ``log_start`` whose record timestamp is >= ts, or None
    (``index.walk.seek_timestamp``)."""
    from spark.scan import first_offset_at_or_after

    return seek_timestamp(
        lambda start: coordinator.lookup_timestamp(topic, partition, ts, start),
        lambda ref, start: first_offset_at_or_after(store, topic, partition, ref, ts, start),
        log_start,
    )


def start_at_timestamp(
    opts: ReadOptions,
    coordinator: Coordinator,
    store: ObjectStore,
    topic: str,
    partition: int,
    log_start: int,
    hw: int,
) -> int:
    """The first offset at or after ``startingTimestamp`` (batch reads and streams alike).

    Raises:
        ValueError: no record is that recent and ``startingOffsetsByTimestampStrategy`` is
            ``error`` (with ``latest``: the high watermark, nothing to read).
    """
    assert opts.starting_timestamp is not None
    found = _offset_for_timestamp(
        coordinator, store, topic, partition, opts.starting_timestamp, log_start
    )
    if found is None:
        if opts.timestamp_strategy == "error":
            raise ValueError(
                f"startingTimestamp {opts.starting_timestamp}: no record of {topic}-{partition} "
                "at or after it (set startingOffsetsByTimestampStrategy=latest to read nothing)"
            )
        found = hw
    return min(max(found, log_start), hw)


def _resolve(
    opts: ReadOptions,
    coordinator: Coordinator,
    store: ObjectStore,
    topic: str,
    partition: int,
    log_start: int,
    hw: int,
) -> tuple[int, int]:
    """The offsets [start, end) this read takes from one partition, within the snapshot."""
    tp = f"{topic}-{partition}"
    if opts.starting_timestamp is not None:
        start = start_at_timestamp(opts, coordinator, store, topic, partition, log_start, hw)
    elif isinstance(opts.starting, dict):
        parts = opts.starting.get(topic)
        if parts is None or partition not in parts:
            raise ValueError(f"startingOffsets JSON must name every partition; {tp} is missing")
        start = parts[partition]
        if start == EARLIEST:
            start = log_start
        elif start < log_start:
            if opts.fail_on_data_loss:
                raise ValueError(
                    f"startingOffsets {start} of {tp} is before its log-start offset "
                    f"{log_start}: those records were deleted (failOnDataLoss=false reads "
                    "from log-start instead)"
                )
            start = log_start
    else:
        start = log_start
    if opts.ending_timestamp is not None:
        found = _offset_for_timestamp(
            coordinator, store, topic, partition, opts.ending_timestamp, log_start
        )
        end = hw if found is None else min(found, hw)
    elif isinstance(opts.ending, dict):
        parts = opts.ending.get(topic)
        if parts is None or partition not in parts:
            raise ValueError(f"endingOffsets JSON must name every partition; {tp} is missing")
        end = hw if parts[partition] == LATEST else min(parts[partition], hw)
    else:
        end = hw
    if start > end:
        if opts.starting_timestamp is not None or opts.ending_timestamp is not None:
            return start, start
        raise ValueError(f"{tp}: starting offset {start} is after ending offset {end}")
    return start, end


def stable_snapshot(
    opts: ReadOptions,
    coordinator: Coordinator,
    offsets: Mapping[tuple[str, int], PartitionOffsets],
) -> dict[tuple[str, int], PartitionOffsets]:
    """A read_committed read's snapshot: each partition's high watermark replaced by its
    last stable offset (records from there on belong to undecided transactions). One
    call for every partition. A read_uncommitted read's snapshot is ``offsets``."""
    if not opts.read_committed or not offsets:
        return dict(offsets)
    keys = list(offsets)
    views = cast(TransactionCoordinator, coordinator).stable_offsets(
        # From the high watermark on: only the offset is wanted here, not aborted ranges.
        [IndexWant(t, p, o.high_watermark, o.topic_id or None) for (t, p), o in offsets.items()]
    )
    return {
        k: replace(offsets[k], high_watermark=views[i].last_stable) if i in views else offsets[k]
        for i, k in enumerate(keys)
    }


def plan_read(
    opts: ReadOptions,
    coordinator: Coordinator,
    store: ObjectStore,
    bounds: Bounds = Bounds(),
    access: TopicAccess | None = None,
) -> Plan:
    """One snapshot of the index for this read, cut into scan tasks; with ``access``,
    of the topics the job may read (see :func:`subscribed_topics`).

    Raises:
        ValueError: an unknown topic or partition, offsets that do not fit the snapshot
            (see :func:`_resolve`), or an index that lost records while planning.
        AuthorizationError: a topic the job may not READ.
    """
    snapshot: dict[tuple[str, int], tuple[int, int]] = {}
    ranges: dict[tuple[str, int], tuple[int, int]] = {}
    topic_ids: dict[str, bytes] = {}
    found: dict[tuple[str, int], PartitionOffsets] = {}
    for info in _topics(opts, coordinator, bounds, access):
        topic_ids[info.name] = info.topic_id
        for partition in range(info.partitions):
            if bounds.partitions is not None and partition not in bounds.partitions:
                continue
            try:
                found[(info.name, partition)] = coordinator.offsets(info.name, partition)
            except PartitionNotFoundError:
                continue  # partitions being added right now: not in this snapshot
    for (topic, partition), offsets in stable_snapshot(opts, coordinator, found).items():
        log_start, hw = offsets.log_start, offsets.high_watermark
        snapshot[(topic, partition)] = (log_start, hw)
        ranges[(topic, partition)] = _resolve(
            opts, coordinator, store, topic, partition, log_start, hw
        )
    tasks = plan_tasks(
        coordinator,
        store,
        ranges,
        bounds,
        opts.max_bytes_per_task,
        topic_ids,
        read_committed=opts.read_committed,
    )
    return Plan(snapshot, ranges, tasks)
