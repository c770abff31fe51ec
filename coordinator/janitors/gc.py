"""Garbage collection: delete objects nothing references, a grace period later.

Two kinds of garbage:

- Committed objects whose last index entry went (tiering, compaction, retention,
  a deleted topic): ``objects.unreferenced_at`` says since when. Deleted once
  that is at least ``grace_s`` ago; the grace period covers readers that looked
  the entry up just before it went and have not fetched yet.
- Orphans: objects under ``segments/`` or ``tiered/`` that no commit or swap ever
  named (a flush or a janitor that died between its PUT and its commit), older
  than ``grace_s`` by the store's modification time and not pending (registered
  under a live write lease: a Spark job's uploads waiting for its driver's commit);
  found by listing.

Commit and collection agree through the database (invariant 9): before an object is
deleted its key gets a tombstone, a row of ``objects`` with ``deleted_at`` set (the
committed row becomes one; an orphan's is inserted unless the key is committed). A
commit inserts that same unique key, so of a commit and a collection exactly one
wins: a commit that comes after fails with ``ObjectDeletedError``, never succeeds over
a deleted object. Tombstones are purged after ``TOMBSTONE_KEEP_S``, expired write
leases (and their pending keys) at each run.

Invariants: an object an index entry references is never deleted (both paths
check at the database, in the same run, just before deleting); an orphan written
at t is deleted by the first run at or after t + grace. With sharded metadata
(``coordinator.shards``) every check asks every shard, and a shard that does not
answer ends the run before it deletes anything more.
"""

from __future__ import annotations

import time

from coordinator.janitors.context import JanitorContext, JanitorReport
from coordinator.janitors.orphans import find_orphans

#: Where objects live; anything else in the bucket is not ours to delete.
PREFIXES = ("segments/", "tiered/")
#: How long a tombstone outlives its object: a commit of the key later than this (a
#: writer stalled for a day with its lease lapsed) is no longer refused by it.
TOMBSTONE_KEEP_S = 24 * 3600.0
#: Objects per database transaction and per store delete request (S3's DeleteObjects
#: takes 1,000): a pass costs two round trips per batch, not per object.
BATCH = 500


def run_gc(ctx: JanitorContext, grace_s: float) -> JanitorReport:
    """One garbage-collection pass (see the module docstring)."""
    started = time.perf_counter()
    report = JanitorReport("gc")
    now = ctx.now()
    ctx.catalog.purge_deleted_topics()
    ctx.catalog.purge_leases(now, now - grace_s)
    ctx.catalog.purge_tombstones(now - max(TOMBSTONE_KEEP_S, grace_s))
    ctx.catalog.mark_unreferenced(now)
    due = ctx.catalog.due_for_deletion(now - grace_s)
    orphans = [
        o
        for prefix in PREFIXES
        for o in find_orphans(ctx.store, ctx.metadata, grace_s, prefix, now=now)
    ]
    total = len(due) + len(orphans)
    done = 0
    for i in range(0, len(due), BATCH):
        ctx.check()
        part = due[i : i + BATCH]
        # Rows first, conditionally: if this process dies before the deletes, the
        # objects are orphans that the listing finds; none outlives its row the other
        # way. Sharded: only those no shard has a row for any more (every shard asked).
        forgotten = ctx.catalog.forget_objects([token for token, _ in part])
        keys = [key for token, key in part if token in forgotten]
        ctx.store.delete_many(keys)
        report.objects_deleted += len(keys)
        done += len(part)
        ctx.report_progress(done, total, part[-1][1])
    for i in range(0, len(orphans), BATCH):
        ctx.check()
        part_keys = [o.key for o in orphans[i : i + BATCH]]
        # Tombstones first: a commit of a key that landed since the listing wins here
        # (that object is no orphan), one that comes later fails.
        claimed = ctx.catalog.claim_orphans(part_keys, now)
        keys = [key for key in part_keys if key in claimed]
        ctx.store.delete_many(keys)
        report.orphans_deleted += len(keys)
        done += len(part_keys)
        ctx.report_progress(done, total, part_keys[-1])
    report.seconds = time.perf_counter() - started
    return report
