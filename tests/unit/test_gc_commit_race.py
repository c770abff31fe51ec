"""Commit vs garbage collection, decided in the database (issue 22 defect 1, invariant 9).

On SQLite and PostgreSQL (the ``db_url`` fixture), through the coordinator's own
classes: a commit and the collection of the same key never both win.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from coordinator.client import ChunkCommit
from coordinator.janitors.catalog import Catalog
from coordinator.local import LocalCoordinator
from segments.errors import (
    AuthorizationError,
    ObjectDeletedError,
    PartitionNotFoundError,
    TopicNotFoundError,
)
from tests.conftest import new_db_url, sql_rows


def _chunk(topic_id: bytes, count: int = 1) -> ChunkCommit:
    return ChunkCommit(topic_id, 0, 0, 10, count, 1_000, 1_000)


def test_commit_and_orphan_claim_race_has_exactly_one_winner(
    coord: LocalCoordinator, db_url: str
) -> None:
    """Race: one thread commits keys while another claims the same keys as orphans
    (garbage collection's step before its delete), in the same order. Expected: for
    every key exactly one of them wins; the high watermark counts only the winning
    commits and no index entry names a claimed (deleted) key."""
    topic_id = coord.create_topic("race", 1).topic_id
    catalog = Catalog(coord.db)
    keys = [f"segments/race/{i:04d}.seg" for i in range(60)]
    committed: dict[str, bool] = {}
    claimed: dict[str, bool] = {}
    start = threading.Barrier(2)

    def commit_all() -> None:
        start.wait()
        for key in keys:
            try:
                coord.commit(key, [_chunk(topic_id)])
                committed[key] = True
            except ObjectDeletedError:
                committed[key] = False

    def claim_all() -> None:
        start.wait()
        for i in range(0, len(keys), 3):  # a few keys a transaction, as GC claims them
            part = keys[i : i + 3]
            took = catalog.claim_orphans(part, time.time())
            claimed.update((k, k in took) for k in part)

    threads = [threading.Thread(target=commit_all), threading.Thread(target=claim_all)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(committed[k] != claimed[k] for k in keys), (committed, claimed)
    wins = sum(committed.values())
    assert coord.offsets("race", 0).high_watermark == wins
    named = {
        k
        for (k,) in sql_rows(
            db_url,
            "SELECT o.object_key FROM index_entries e JOIN objects o ON o.object_id = e.object_id",
        )
    }
    assert named == {k for k in keys if committed[k]}
    assert coord.committed_object_keys(keys) == named


def test_a_collected_committed_object_cannot_be_committed_again(coord: LocalCoordinator) -> None:
    """A commit whose answer was lost is retried after retention dropped its entries and
    garbage collection deleted the object: the retry fails (ObjectDeletedError) instead
    of committing the key a second time over a deleted object."""
    topic_id = coord.create_topic("collected", 1).topic_id
    key = f"segments/x/{uuid.uuid4().hex}.seg"
    assert coord.commit(key, [_chunk(topic_id, 5)]) == [0]
    coord.delete_records("collected", 0, -1)
    catalog = Catalog(coord.db)
    catalog.mark_unreferenced(time.time())
    [(object_id, due_key)] = catalog.due_for_deletion(time.time() + 1)
    assert due_key == key and catalog.forget_objects([object_id]) == {object_id}
    assert catalog.due_for_deletion(time.time() + 1) == []
    assert coord.committed_object_keys([key]) == set()
    with pytest.raises(ObjectDeletedError):
        coord.commit(key, [_chunk(topic_id, 5)])
    assert coord.offsets("collected", 0).high_watermark == 5
    # A tombstone is claimed again (a run that died between its tombstone and its delete).
    assert catalog.claim_orphans([key], time.time()) == {key}
    assert catalog.purge_tombstones(time.time() + 1) == 1


def test_leases_keep_pending_keys_until_they_expire(coord: LocalCoordinator) -> None:
    """A pending key counts while its lease lives; an expired lease and its keys are
    purged; a released lease drops its keys at once."""
    catalog = Catalog(coord.db)
    assert coord.keep_pending("job-a", ["k1", "k2"], 60) == set()
    assert coord.keep_pending("job-b", ["k3"], 0.001) == set()
    time.sleep(0.01)
    assert coord.pending_object_keys(["k1", "k2", "k3", "k4"]) == {"k1", "k2"}
    assert catalog.purge_leases(time.time(), time.time()) == 1
    coord.release_pending("job-a")
    assert coord.pending_object_keys(["k1", "k2", "k3"]) == set()
    with pytest.raises(ValueError):
        coord.keep_pending("job-c", [], 0)
    # A key collected already is reported to its writer.
    assert catalog.claim_orphans(["k9"], time.time()) == {"k9"}
    assert coord.keep_pending("job-d", ["k9"], 60) == {"k9"}


def test_a_lease_belongs_to_the_principal_that_took_it(coord: LocalCoordinator) -> None:
    """Another user can neither renew, release nor move keys out of a lease (nothing
    changes when refused); its own user and trusted callers (principal None: agents)
    can; keys may move between one user's own leases."""
    alice, bob = "User:alice", "User:bob"
    assert coord.keep_pending("job-a", ["k1"], 60, principal=alice) == set()
    for call in (
        lambda: coord.keep_pending("job-a", [], 0.001, principal=bob),
        lambda: coord.keep_pending("job-b", ["k2", "k1"], 60, principal=bob),
        lambda: coord.release_pending("job-a", principal=bob),
    ):
        with pytest.raises(AuthorizationError, match="another principal"):
            call()
    time.sleep(0.01)
    assert coord.pending_object_keys(["k1", "k2"]) == {"k1"}  # job-b was never made
    assert coord.keep_pending("job-b", ["k2"], 60, principal=bob) == set()
    assert coord.keep_pending("job-a2", ["k1"], 60, principal=alice) == set()  # her own
    assert coord.keep_pending("job-a", [], 60) == set()  # an agent renews any lease
    coord.release_pending("job-a2", principal=alice)
    coord.release_pending("job-b")  # and releases any
    assert coord.pending_object_keys(["k1", "k2"]) == set()


def test_deleting_a_topic_while_commits_hold_its_partitions_leaves_no_entry(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Issue 22 defect 6, on PostgreSQL (several coordinators on one database). Race:
    commits into a topic's partitions while the topic is deleted. A commit that locked
    the partitions before the delete reached them inserted its index entries after the
    delete had removed the topic's entries, and they stayed (no foreign keys since
    migration 11): their objects were never collected. Expected: no index entry of a
    deleted topic survives, whatever the interleaving; every commit either lands before
    the delete (its entries go with the topic) or fails with not found."""
    url = new_db_url(request, "postgresql", tmp_path)
    coords = [LocalCoordinator(url) for _ in range(3)]
    try:
        for round_ in range(12):
            name = f"doomed-{round_}"
            topic_id = coords[0].create_topic(name, 4).topic_id
            stop = threading.Event()

            def hammer(
                c: LocalCoordinator,
                n: int,
                topic_id: bytes = topic_id,
                stop: threading.Event = stop,
            ) -> None:
                i = 0
                while not stop.is_set():
                    key = f"segments/d/{topic_id.hex()}-{n}-{i}.seg"
                    i += 1
                    try:
                        c.commit(key, [ChunkCommit(topic_id, p, 0, 10, 1, 1, 1) for p in range(4)])
                    except (TopicNotFoundError, PartitionNotFoundError):
                        return

            threads = [threading.Thread(target=hammer, args=(coords[n % 3], n)) for n in range(6)]
            for t in threads:
                t.start()
            time.sleep(0.05)
            coords[round_ % 3].delete_topic(name)
            stop.set()
            for t in threads:
                t.join()
            left = sql_rows(
                url, "SELECT COUNT(*) FROM index_entries WHERE topic_id = ?", (topic_id,)
            )
            assert left == [(0,)], f"round {round_}: index entries of the deleted topic survive"
    finally:
        for c in coords:
            c.close()
