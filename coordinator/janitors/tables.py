"""The ``table`` janitor: topic tables (``coordinator.iceberg``) kept up to date and trimmed.

One run publishes every table's pending changes (each as one snapshot), then expires
snapshots past their topic's ``table.snapshot.retention.ms`` (keeping
``table.snapshot.min.count``), releases the tier objects no retained snapshot names to
garbage collection, and deletes table files nothing reachable names (and deleted topics'
tables) once older than ``gc_grace_s``.

Tiering, compaction and retention also publish the tables of what they ran over at their
end (:func:`publish_after`), so a table is as fresh as the tiering run that last touched
it; the janitor catches what other paths changed (DeleteRecords, a run that stopped
before publishing) within its interval.
"""

from __future__ import annotations

import logging
import time

from coordinator.janitors.context import JanitorConfig, JanitorContext, JanitorReport
from coordinator.janitors.leases import LeaseLostError

log = logging.getLogger(__name__)


def run_tables(
    ctx: JanitorContext, config: JanitorConfig, topic: str | None = None
) -> JanitorReport:
    """Publish, expire and clean every topic table (or ``topic``'s)."""
    started = time.perf_counter()
    from coordinator.iceberg.tables import TopicTables  # pyiceberg loads when tables run

    report = JanitorReport("table")
    tables = TopicTables(ctx.catalog, ctx.store, ctx.now)
    published = tables.publish_all(topic, ctx.check)
    report.snapshots_published = published.snapshots
    report.objects_written = published.files_added
    if topic is None:
        expired = tables.expire_all(config.gc_grace_s, ctx.check)
    else:
        expired = tables.expire(tables.topic_id(topic), topic, config.gc_grace_s)
    report.snapshots_expired = expired.snapshots_expired
    report.objects_deleted = expired.metadata_deleted
    report.seconds = time.perf_counter() - started
    return report


def publish_after(ctx: JanitorContext, report: JanitorReport, topic: str | None) -> JanitorReport:
    """Publish the tables a tiering, compaction or retention run changed (all, or
    ``topic``'s). A failure is logged, not raised: the index swaps are done, and the
    ``table`` janitor publishes them on its next run."""
    from coordinator.iceberg.tables import TopicTables

    try:
        published = TopicTables(ctx.catalog, ctx.store, ctx.now).publish_all(topic, ctx.check)
    except LeaseLostError:
        raise
    except Exception:
        log.exception("%s: publishing topic tables failed; the table janitor will", report.janitor)
        return report
    report.snapshots_published += published.snapshots
    return report
