"""Orphan objects: in the store, older than a grace period, never committed, not pending.

A flush that crashed between its PUT and its commit leaves such an object
(invariant 3). Nothing reads it, since the index never pointed at it; garbage
collection (a later janitor) deletes it. This module only reports.
"""

from __future__ import annotations

from coordinator import clock
from coordinator.client import Coordinator
from segments.store import ObjectInfo, ObjectStore

#: Keys per ``committed_object_keys`` call: one round trip (and one SQL IN list) each.
BATCH = 500


def find_orphans(
    store: ObjectStore,
    coordinator: Coordinator,
    grace_s: float,
    prefix: str = "segments/",
    *,
    now: float | None = None,
) -> list[ObjectInfo]:
    """Objects under ``prefix`` older than ``grace_s`` that no commit names and no live
    write lease holds, in key order.

    The grace period covers flushes in flight: an object PUT a moment ago whose
    commit has not landed yet is not an orphan. Stores that keep modification
    times in whole seconds (S3) make objects look up to a second older; keep
    ``grace_s`` far above that for anything that deletes.

    Args:
        now: the clock, epoch seconds (tests pin it); default ``clock.now()``.
    """
    cutoff = (clock.now() if now is None else now) - grace_s
    orphans: list[ObjectInfo] = []
    batch: list[ObjectInfo] = []

    def flush() -> None:
        keys = [o.key for o in batch]
        committed = coordinator.committed_object_keys(keys)
        # Uploads under a live write lease (a long Spark job's) wait for their commit.
        pending = coordinator.pending_object_keys([k for k in keys if k not in committed])
        orphans.extend(o for o in batch if o.key not in committed and o.key not in pending)
        batch.clear()

    # Listing first, then asking: an object committed after the listing shows as
    # committed; one PUT after the listing is simply not seen until next time.
    for info in store.list(prefix):
        if info.last_modified <= cutoff:
            batch.append(info)
            if len(batch) >= BATCH:
                flush()
    if batch:
        flush()
    return orphans
