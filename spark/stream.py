"""The offsets of a Structured Streaming read: where a stream starts, how far a
micro-batch goes, and which offset ranges a micro-batch reads.

Offsets are Spark's Kafka source's JSON form, ``{"topic": {"0": 23, "1": 7}}``: the
next offset to read per partition. Spark keeps them in the query's checkpoint, so a
restarted query replans each unfinished micro-batch from exactly the offsets it had,
and :func:`micro_batch_ranges` turns them into the same ranges, hence the same
records, as a batch read with those ``startingOffsets``/``endingOffsets``.

- a new query starts at ``startingTimestamp`` (as batch reads resolve it) or
  ``startingOffsets``;
- new partitions and (with ``subscribePattern``) new topics start at their earliest
  offset, as in Spark's Kafka source;
- ``maxOffsetsPerTrigger`` is shared out in proportion to each partition's backlog
  (rounded down, but never to no progress at all), as Spark's Kafka source does;
- data loss fails the micro-batch with ``failOnDataLoss`` (the default) and is skipped
  without it, as Spark's Kafka source reports it: a range whose start was deleted
  meanwhile (retention: it starts at log-start), a partition whose offset went back
  ("offset was changed": its topic was deleted and created again; the stream goes on
  from the new offset), partitions that are gone (a deleted topic: a deleted
  ``subscribe`` topic is left out, and read from its beginning should it come back).
  A topic deleted and created again between two micro-batches of a running query is
  told by its id, whatever its offsets: it is read as a new topic, from its beginning.

No pyspark here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Set
from typing import TYPE_CHECKING

from coordinator.client import Coordinator, PartitionOffsets
from segments.errors import PartitionNotFoundError, TopicNotFoundError
from segments.store import ObjectStore
from spark.options import EARLIEST, LATEST, ReadOptions
from spark.plan import stable_snapshot, start_at_timestamp, subscribed_topics

if TYPE_CHECKING:
    from spark.access import TopicAccess

__all__ = [
    "StreamOffsets",
    "current_offsets",
    "from_json",
    "initial_offsets",
    "latest_offsets",
    "micro_batch_ranges",
    "to_json",
]

#: Offsets per (topic, partition).
StreamOffsets = dict[tuple[str, int], int]


def to_json(offsets: Mapping[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """``{(t, p): o}`` as Spark's Kafka source writes it: ``{t: {"p": o}}``, sorted."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json(offsets: Mapping[str, Mapping[str, int]]) -> StreamOffsets:
    """The inverse of :func:`to_json` (offsets read back from a checkpoint)."""
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def current_offsets(
    opts: ReadOptions,
    coordinator: Coordinator,
    access: TopicAccess | None = None,
    *,
    missing_ok: bool = False,
) -> dict[tuple[str, int], PartitionOffsets]:
    """Log-start, high watermark and topic id of every partition the stream subscribes to
    (and, with ``access``, may read), now; the high watermark is the last stable offset
    for a read_committed stream (``stable_snapshot``). ``missing_ok``: a ``subscribe`` topic that
    does not exist (deleted while the query runs) is left out.

    Raises:
        ValueError: a ``subscribe`` topic does not exist (unless ``missing_ok``).
        AuthorizationError: a topic the job may not READ.
    """
    infos = subscribed_topics(opts, coordinator, access, missing_ok=missing_ok)
    out: dict[tuple[str, int], PartitionOffsets] = {}
    for info in infos:
        for p in range(info.partitions):
            try:
                out[(info.name, p)] = coordinator.offsets(info.name, p)
            except (TopicNotFoundError, PartitionNotFoundError):
                continue  # deleted or being added right now: not in this trigger
    return stable_snapshot(opts, coordinator, out)


def initial_offsets(
    opts: ReadOptions,
    coordinator: Coordinator,
    store: ObjectStore | None = None,
    access: TopicAccess | None = None,
) -> StreamOffsets:
    """Where a new query starts: ``startingTimestamp`` if given (``store`` then reads the
    index entry that holds it), else ``startingOffsets`` (default ``latest``), resolved now.

    Raises:
        ValueError: JSON offsets naming a partition the stream does not read or missing
            one; no record at or after ``startingTimestamp`` with the ``error`` strategy.
    """
    now = current_offsets(opts, coordinator, access)
    if opts.starting_timestamp is not None:
        assert store is not None, "startingTimestamp needs the store"
        return {
            (t, p): start_at_timestamp(
                opts, coordinator, store, t, p, o.log_start, o.high_watermark
            )
            for (t, p), o in now.items()
        }
    spec = opts.starting
    if spec == "earliest":
        return {tp: o.log_start for tp, o in now.items()}
    if spec == "latest":
        return {tp: o.high_watermark for tp, o in now.items()}
    assert isinstance(spec, dict)
    out: StreamOffsets = {}
    for (topic, partition), o in now.items():
        given = spec.get(topic, {}).get(partition)
        if given is None:
            raise ValueError(
                f"startingOffsets JSON must name every partition; {topic}-{partition} is missing"
            )
        out[(topic, partition)] = (
            o.log_start if given == EARLIEST else o.high_watermark if given == LATEST else given
        )
    unknown = [f"{t}-{p}" for t, parts in spec.items() for p in parts if (t, p) not in now]
    if unknown:
        raise ValueError(f"startingOffsets names partitions this stream does not read: {unknown}")
    return out


def latest_offsets(
    now: Mapping[tuple[str, int], PartitionOffsets],
    start: Mapping[tuple[str, int], int],
    max_records: int | None,
    cap: Mapping[tuple[str, int], int] | None = None,
) -> StreamOffsets:
    """The end of the next micro-batch: every partition's high watermark (or ``cap``),
    at most ``max_records`` past ``start`` in all, shared in proportion to backlog.

    A partition missing from ``start`` is new: it starts at its log-start. A partition
    missing from ``cap`` (Trigger.AvailableNow) gets nothing new. As Spark's Kafka
    source: a partition gone from ``now`` is left out, and one whose high watermark went
    below ``start`` ends there (``micro_batch_ranges`` reports both as data loss).
    """
    begin: StreamOffsets = {}
    end: StreamOffsets = {}
    for tp, o in now.items():
        begin[tp] = start.get(tp, o.log_start)
        limit = o.high_watermark if cap is None else min(o.high_watermark, cap.get(tp, begin[tp]))
        end[tp] = limit
    backlog = {tp: max(end[tp] - begin[tp], 0) for tp in end}
    total = sum(backlog.values())
    if max_records is None or total <= max_records:
        return end
    for tp, lag in backlog.items():
        if lag == 0:
            continue  # nothing to share out (or its offset went back: it ends there)
        share = max_records * lag / total
        # Spark's Kafka source rounds a share below one record up, others down.
        take = math.ceil(share) if share < 1 else math.floor(share)
        end[tp] = begin[tp] + min(lag, take)
    return end


def micro_batch_ranges(
    opts: ReadOptions,
    coordinator: Coordinator,
    start: Mapping[tuple[str, int], int],
    end: Mapping[tuple[str, int], int],
    recreated: Set[str] = frozenset(),
) -> dict[tuple[str, int], tuple[int, int]]:
    """The offsets [from, to) each partition's micro-batch reads.

    ``recreated``: topics deleted and created again since ``start`` was planned (told by
    their ids): their partitions are read from their beginning, as new ones.

    Raises:
        ValueError: with ``failOnDataLoss``, a range whose first records were deleted
            (retention moved log-start past it), a partition whose offset went back
            (Spark's "offset was changed"), partitions gone from ``end`` (a deleted
            topic), a topic in ``recreated``.
    """
    gone = sorted(tp for tp in start if tp not in end)
    if gone:
        names = ", ".join(f"{t}-{p}" for t, p in gone)
        _data_loss(opts, f"partitions {names} are gone (deleted); some data may have been missed")
    for topic in sorted(recreated):
        _data_loss(
            opts, f"topic {topic} was deleted and created again; some data may have been missed"
        )
    ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for tp, stop in end.items():
        topic, partition = tp
        # A new partition (or one of a topic created again): from its very beginning.
        first = 0 if topic in recreated else start.get(tp, 0)
        if stop <= first:
            if stop < first:
                _data_loss(
                    opts,
                    f"partition {topic}-{partition}'s offset was changed from {first} to "
                    f"{stop} (its topic was deleted and created again?); some data may "
                    "have been missed",
                )
            continue
        try:
            log_start = coordinator.offsets(topic, partition).log_start
        except (TopicNotFoundError, PartitionNotFoundError):
            _data_loss(opts, f"{topic}-{partition} no longer exists")
            continue
        if first < log_start:
            _data_loss(
                opts,
                f"offsets {first}-{min(stop, log_start) - 1} of {topic}-{partition} were "
                f"deleted (log-start is now {log_start}) before this stream read them",
            )
            first = log_start
        if first < stop:
            ranges[tp] = (first, stop)
    return ranges


def _data_loss(opts: ReadOptions, what: str) -> None:
    if opts.fail_on_data_loss:
        raise ValueError(f"{what}; set failOnDataLoss=false to skip what is lost")
