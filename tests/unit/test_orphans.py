"""find_orphans: uncommitted objects past the grace period, asked about in batches."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import cast

from coordinator.client import Coordinator
from coordinator.janitors import orphans
from coordinator.janitors.orphans import find_orphans
from segments.memory import MemoryStore


class CommittedKeys:
    """Only the Coordinator methods find_orphans needs; records every committed call."""

    def __init__(self, committed: set[str], pending: frozenset[str] = frozenset()) -> None:
        self.committed = committed
        self.pending = pending
        self.calls: list[list[str]] = []

    def committed_object_keys(self, keys: Sequence[str]) -> set[str]:
        self.calls.append(list(keys))
        return {k for k in keys if k in self.committed}

    def pending_object_keys(self, keys: Sequence[str]) -> set[str]:
        return {k for k in keys if k in self.pending}


def _coord(fake: CommittedKeys) -> Coordinator:
    return cast(Coordinator, fake)


def test_reports_uncommitted_keys_only() -> None:
    store = MemoryStore()
    for key in ("segments/aa/1.seg", "segments/bb/2.seg", "segments/cc/3.seg"):
        store.put(key, b"x" * 10)
    fake = CommittedKeys({"segments/bb/2.seg"})
    found = find_orphans(store, _coord(fake), grace_s=0, now=time.time() + 1)
    assert [o.key for o in found] == ["segments/aa/1.seg", "segments/cc/3.seg"]
    assert all(o.size == 10 for o in found)


def test_pending_uploads_are_no_orphans() -> None:
    """An upload under a live write lease (a running Spark job's) waits for its commit."""
    store = MemoryStore()
    for key in ("segments/aa/1.seg", "segments/bb/2.seg"):
        store.put(key, b"x")
    fake = CommittedKeys(set(), pending=frozenset({"segments/aa/1.seg"}))
    found = find_orphans(store, _coord(fake), grace_s=0, now=time.time() + 1)
    assert [o.key for o in found] == ["segments/bb/2.seg"]


def test_grace_period_hides_young_objects() -> None:
    store = MemoryStore()
    store.put("segments/aa/old.seg", b"o")
    time.sleep(0.02)
    store.put("segments/aa/young.seg", b"y")
    old_t = store.head("segments/aa/old.seg").last_modified
    young_t = store.head("segments/aa/young.seg").last_modified
    assert young_t > old_t
    fake = CommittedKeys(set())
    now = young_t + 100.0
    # A grace between the two ages: only the older object is past it.
    grace = 100.0 + (young_t - old_t) / 2
    assert [o.key for o in find_orphans(store, _coord(fake), grace, now=now)] == [
        "segments/aa/old.seg"
    ]
    assert find_orphans(store, _coord(fake), grace_s=3600, now=now) == []
    # Objects inside the grace period are not even asked about.
    assert fake.calls == [["segments/aa/old.seg"]]


def test_only_the_prefix_is_considered() -> None:
    store = MemoryStore()
    store.put("segments/aa/1.seg", b"s")
    store.put("tiered/t/partition=0/0-9.parquet", b"p")
    found = find_orphans(store, _coord(CommittedKeys(set())), 0, now=time.time() + 1)
    assert [o.key for o in found] == ["segments/aa/1.seg"]
    found = find_orphans(store, _coord(CommittedKeys(set())), 0, prefix="", now=time.time() + 1)
    assert [o.key for o in found] == ["segments/aa/1.seg", "tiered/t/partition=0/0-9.parquet"]


def test_asks_in_batches_and_keeps_key_order() -> None:
    store = MemoryStore()
    n = orphans.BATCH * 2 + 7
    keys = [f"segments/{i % 7:02d}/{i:05d}.seg" for i in range(n)]
    for k in keys:
        store.put(k, b"")
    committed = set(keys[::3])
    fake = CommittedKeys(committed)
    found = find_orphans(store, _coord(fake), 0, now=time.time() + 1)
    assert [o.key for o in found] == sorted(set(keys) - committed)
    assert [len(c) for c in fake.calls] == [orphans.BATCH, orphans.BATCH, 7]
    assert sorted(k for call in fake.calls for k in call) == sorted(keys)


def test_empty_store_asks_nothing() -> None:
    fake = CommittedKeys(set())
    assert find_orphans(MemoryStore(), _coord(fake), 0) == []
    assert fake.calls == []
