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
from coordinator.orphans import find_orphans

#: Where objects live; anything else in the bucket is not ours to delete.
PREFIXES = ("segments/", "tiered/")
#: How long a tombstone outlives its object: a commit of the key later than this (a
#: writer stalled for a day with its lease lapsed) is no longer refused by it.
TOMBSTONE_KEEP_S = 24 * 3600.0


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
    for object_id, key in due:
        ctx.check()
        # Row first, conditionally: if this process dies before the delete, the object
        # is an orphan that the listing finds; it never outlives its row the other way.
        # Sharded: True only once no shard has a row for the key (every shard asked).
        if ctx.catalog.forget_object(object_id):
            ctx.store.delete(key)
            report.objects_deleted += 1
        done += 1
        ctx.report_progress(done, total, key)
    for orphan in orphans:
        ctx.check()
        # Tombstone first: a commit of the key that landed since the listing wins here
        # (the object is no orphan), one that comes later fails.
        if ctx.catalog.claim_orphan(orphan.key, now):
            ctx.store.delete(orphan.key)
            report.orphans_deleted += 1
        done += 1
        ctx.report_progress(done, total, orphan.key)
    report.seconds = time.perf_counter() - started
    return report
