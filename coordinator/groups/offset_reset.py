"""Where ``reset-offsets`` moves a group's committed offsets: Kafka's rules, as pure functions.

``kafka-consumer-groups --reset-offsets`` semantics (Kafka 3.x ``ConsumerGroupCommand``):

=============  =================================================================
strategy       new offset of each partition
=============  =================================================================
EARLIEST       the log-start offset
LATEST         the high watermark (log-end)
OFFSET n       n, clamped into [log-start, high watermark]
SHIFT n        the committed offset + n, clamped; a partition without a committed
               offset cannot be shifted (NoOffsetError)
TIMESTAMP t    the first offset whose record timestamp is >= t (epoch ms), else the
               high watermark (Kafka's offsetsForTimes answering null)
=============  =================================================================

``--to-datetime`` and ``--by-duration`` are TIMESTAMP: the tool turns them into epoch
milliseconds. The timestamp lookups themselves read records, so the caller (the
agent, which has the read path) does them and passes the answers in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from coordinator.client import PartitionOffsets, TopicPartition
from segments.errors import NoOffsetError


class ResetStrategy(StrEnum):
    EARLIEST = "EARLIEST"
    LATEST = "LATEST"
    OFFSET = "OFFSET"
    SHIFT = "SHIFT"
    TIMESTAMP = "TIMESTAMP"


#: Strategies that need a value (the offset, the shift, the epoch milliseconds).
NEEDS_VALUE = frozenset({ResetStrategy.OFFSET, ResetStrategy.SHIFT, ResetStrategy.TIMESTAMP})


@dataclass(frozen=True, slots=True)
class PlannedReset:
    """One partition of a reset plan: where its committed offset is, and goes."""

    tp: TopicPartition
    current: int | None  # the committed offset, None without one
    new: int
    bounds: PartitionOffsets


def plan_reset(
    strategy: ResetStrategy,
    value: int | None,
    partitions: Sequence[TopicPartition],
    bounds: Mapping[TopicPartition, PartitionOffsets],
    committed: Mapping[TopicPartition, int],
    by_timestamp: Mapping[TopicPartition, int | None] | None = None,
) -> list[PlannedReset]:
    """The new committed offset of each partition, in the order given.

    Args:
        bounds: log-start and high watermark of every partition of ``partitions``.
        committed: the group's committed offsets (partitions without one absent).
        by_timestamp: TIMESTAMP only: each partition's first offset at or after the
            timestamp, None when there is none.

    Raises:
        ValueError: a strategy that needs a value without one, a TIMESTAMP plan without
            ``by_timestamp``, a partition missing from ``bounds``.
        NoOffsetError: SHIFT of a partition without a committed offset.
    """
    if strategy in NEEDS_VALUE and value is None:
        raise ValueError(f"{strategy} needs a value")
    plan = []
    for tp in partitions:
        b = bounds[tp]
        current = committed.get(tp)
        if strategy is ResetStrategy.EARLIEST:
            new = b.log_start
        elif strategy is ResetStrategy.LATEST:
            new = b.high_watermark
        elif strategy is ResetStrategy.OFFSET:
            assert value is not None
            new = value
        elif strategy is ResetStrategy.SHIFT:
            assert value is not None
            if current is None:
                raise NoOffsetError(
                    f"Cannot shift offset for partition {tp.topic}-{tp.partition} since there "
                    "is no current committed offset."
                )
            new = current + value
        else:
            if by_timestamp is None:
                raise ValueError("a TIMESTAMP plan needs the offsets found by timestamp")
            found = by_timestamp.get(tp)
            new = b.high_watermark if found is None else found
        plan.append(PlannedReset(tp, current, clamp(new, b), b))
    return plan


def clamp(offset: int, bounds: PartitionOffsets) -> int:
    """``offset`` moved into [log-start, high watermark] (Kafka's checkOffsetsRange)."""
    return min(max(offset, bounds.log_start), bounds.high_watermark)
