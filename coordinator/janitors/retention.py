"""Retention: ``retention.ms`` and ``retention.bytes`` advance log-start, per partition.

Kafka's rules, with an index entry in the role of a log segment (Kafka deletes
whole segments, never part of one):

- ``retention.ms`` (-1: forever): the oldest entries whose newest record
  (``max_ts``) is older than ``now - retention.ms`` go, up to the first one that
  is not expired.
- ``retention.bytes`` (-1: unlimited): the oldest entries go while what stays is
  still at least ``retention.bytes`` (so a partition may hold up to one entry
  more than the limit, as in Kafka). Sizes are stored bytes: a segment chunk's
  length, a tier object's size.

Log-start moves to the end of the last entry that goes; entries wholly below it
are dropped in the same transaction (their objects become garbage). Only topics
whose ``cleanup.policy`` includes ``delete`` are touched. Consumers positioned
below the new log-start follow their ``auto.offset.reset`` policy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from coordinator.janitors.catalog import IndexRow
from coordinator.janitors.context import JanitorContext, JanitorReport
from coordinator.log.topic_configs import effective_configs


def new_log_start(
    rows: Sequence[IndexRow],
    log_start: int,
    retention_ms: int,
    retention_bytes: int,
    now_ms: int,
) -> int:
    """Where log-start goes under the two policies (``log_start`` if nowhere)."""
    live = [r for r in rows if r.end_offset > log_start]
    start = log_start
    if retention_ms >= 0:
        cutoff = now_ms - retention_ms
        for r in live:
            if r.max_ts >= cutoff:
                break
            start = max(start, r.end_offset)
    if retention_bytes >= 0:
        excess = sum(r.length for r in live) - retention_bytes
        for r in live:
            if excess - r.length < 0:
                break
            excess -= r.length
            start = max(start, r.end_offset)
    return start


def deletes(configs: dict[str, str]) -> bool:
    policy = effective_configs(configs)["cleanup.policy"]
    return "delete" in [p.strip() for p in policy.split(",")]


def run_retention(ctx: JanitorContext, topic: str | None = None) -> JanitorReport:
    """Apply retention to every partition (of ``topic``, if given)."""
    started = time.perf_counter()
    report = JanitorReport("retention")
    parts = [p for p in ctx.catalog.partitions(topic) if deletes(p.configs)]
    for i, part in enumerate(parts):
        ctx.check()
        configs = effective_configs(part.configs)
        rows = ctx.catalog.rows(part.topic_id, part.partition)
        now = ctx.now()
        start = new_log_start(
            rows,
            part.log_start,
            int(configs["retention.ms"]),
            int(configs["retention.bytes"]),
            int(now * 1000),
        )
        if start > part.log_start:
            moved = ctx.catalog.advance_log_start(part.topic_id, part.partition, start, now)
            if moved is not None:
                report.rows_dropped += sum(1 for r in rows if r.end_offset <= start)
                report.records_dropped += start - part.log_start
        report.partitions += 1
        ctx.report_progress(i + 1, len(parts), f"{part.topic}/{part.partition}")
    report.seconds = time.perf_counter() - started
    return report
