"""Group commit: the leader/follower committer alone (fake batches), then through
LocalCoordinator on SQLite and PostgreSQL (``db_url`` runs each test once per backend).

The multi-process test through a coordinator process is in
``tests/integration/test_group_commit.py``.
"""

from __future__ import annotations

import threading
import time

import pytest

from coordinator.client import ChunkCommit
from coordinator.local import LocalCoordinator
from coordinator.log.group_commit import GroupCommitter, PendingCommit
from segments.errors import (
    CommitConflictError,
    CoordinatorUnavailableError,
    PartitionNotFoundError,
    ProducerConflictError,
    TopicNotFoundError,
)
from tests.conftest import sql_rows

TID = b"t" * 16


def chunk(partition: int, count: int = 1, topic_id: bytes = TID) -> ChunkCommit:
    return ChunkCommit(topic_id, partition, 0, 10, count, 1, 2)


class Recorder:
    """A batch function that records its batches; the first one waits for ``release``."""

    def __init__(self, poison: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.poison = poison

    def __call__(self, batch: list[PendingCommit]) -> None:
        self.batches.append([r.object_key for r in batch])
        if len(self.batches) == 1:
            self.entered.set()
            assert self.release.wait(10)
        if self.poison is not None and any(r.object_key == self.poison for r in batch):
            raise OverflowError("poisoned")
        for r in batch:
            r.bases = [len(self.batches)]


def run_all(committer: GroupCommitter, keys: list[str]) -> dict[str, object]:
    """Commit each key from its own thread; each key's outcome (bases or the error)."""
    out: dict[str, object] = {}

    def one(key: str) -> None:
        try:
            out[key] = committer.commit(PendingCommit(key, [chunk(0)]))
        except Exception as e:
            out[key] = e

    threads = [threading.Thread(target=one, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_a_lone_commit_runs_at_once_in_a_batch_of_one() -> None:
    rec = Recorder()
    rec.release.set()
    committer = GroupCommitter(rec)
    assert committer.commit(PendingCommit("a", [chunk(0)])) == [1]
    assert rec.batches == [["a"]]
    assert committer.stats.batches == 1
    assert committer.stats.requests == 1


def test_commits_arriving_during_a_batch_share_the_next_one() -> None:
    """Race: the leader's batch is held open while 15 more callers arrive. Expected: the
    15 all go in the second batch, in arrival order, each answered with its own batch."""
    rec = Recorder()
    committer = GroupCommitter(rec)
    first = threading.Thread(target=committer.commit, args=(PendingCommit("k00", [chunk(0)]),))
    first.start()
    assert rec.entered.wait(10)
    out: dict[str, object] = {}
    threads = []
    for i in range(1, 16):
        key = f"k{i:02d}"
        t = threading.Thread(
            target=lambda k=key: out.__setitem__(k, committer.commit(PendingCommit(k, [chunk(0)])))
        )
        t.start()
        threads.append(t)
        while len(committer._queue) < i:
            time.sleep(0.001)
    rec.release.set()
    for t in [first, *threads]:
        t.join(10)
    assert rec.batches == [["k00"], [f"k{i:02d}" for i in range(1, 16)]]
    assert out == {f"k{i:02d}": [2] for i in range(1, 16)}
    assert committer.stats.largest_batch == 15


def behind_a_held_batch(
    committer: GroupCommitter, rec: Recorder, keys: list[str], later: tuple[str, ...] = ()
) -> dict[str, object]:
    """Hold a first batch ("x") open, queue ``keys`` (a thread each), then ``later`` once
    those are queued; release; every outcome (bases or the error) by key."""
    first = threading.Thread(target=committer.commit, args=(PendingCommit("x", [chunk(0)]),))
    first.start()
    assert rec.entered.wait(10)
    result: dict[str, object] = {}
    runner = threading.Thread(target=lambda: result.update(run_all(committer, keys)))
    runner.start()
    threads = [first, runner]
    queued = len(keys)
    for key in [None, *later]:
        if key is not None:
            t = threading.Thread(target=committer.commit, args=(PendingCommit(key, [chunk(0)]),))
            t.start()
            threads.append(t)
            queued += 1
        while len(committer._queue) < queued:
            time.sleep(0.001)
    rec.release.set()
    for t in threads:
        t.join(10)
    return result


def test_a_batch_that_fails_as_a_whole_is_run_again_one_commit_at_a_time() -> None:
    """A batch function that raises (the failing request unknown): every request of the
    batch runs alone; only the poisoned one fails."""
    rec = Recorder(poison="k03")
    committer = GroupCommitter(rec)
    result = behind_a_held_batch(committer, rec, [f"k{i:02d}" for i in range(1, 8)])
    assert isinstance(result.pop("k03"), OverflowError)
    assert all(isinstance(v, list) for v in result.values())
    assert committer.stats.solo_reruns == 1
    assert len(rec.batches[1]) == 7  # the shared attempt, then one by one
    assert [[k] for k in rec.batches[1]] == rec.batches[2:]


def test_a_retriable_failure_fails_the_whole_batch_at_once() -> None:
    """The database unreachable is no request's fault: no one-by-one re-run (each would
    wait for the database again); every request gets the retriable error."""

    class Down(Recorder):
        def __call__(self, batch: list[PendingCommit]) -> None:
            super().__call__(batch)
            if len(self.batches) > 1:
                raise CoordinatorUnavailableError("database down")

    rec = Down()
    committer = GroupCommitter(rec)
    result = behind_a_held_batch(committer, rec, [f"k{i}" for i in range(5)])
    assert all(isinstance(v, CoordinatorUnavailableError) for v in result.values())
    assert len(rec.batches) == 2  # the held one, then the five together, once
    assert committer.stats.solo_reruns == 0


def test_a_retriable_conflict_of_one_request_fails_only_that_request() -> None:
    """A ProducerConflictError is retriable but one request's doing (PostgreSQL with
    several coordinators: another transaction stored one of the batch's idempotency
    keys between the claim and the store, metadata.py's ``_store_request_keys``): the
    batch runs again one commit at a time and only the conflicting request fails."""

    class Conflict(Recorder):
        def __call__(self, batch: list[PendingCommit]) -> None:
            if len(self.batches) >= 1 and any(r.object_key == "k2" for r in batch):
                self.batches.append([r.object_key for r in batch])
                raise ProducerConflictError("key stored by another transaction meanwhile")
            super().__call__(batch)

    rec = Conflict()
    committer = GroupCommitter(rec)
    result = behind_a_held_batch(committer, rec, [f"k{i}" for i in range(5)])
    assert isinstance(result.pop("k2"), ProducerConflictError)
    assert all(isinstance(v, list) for v in result.values()), result
    assert committer.stats.solo_reruns == 1


def test_one_key_is_never_twice_in_a_batch() -> None:
    rec = Recorder()
    committer = GroupCommitter(rec)
    behind_a_held_batch(committer, rec, ["a", "b"], later=("a",))
    assert sorted(rec.batches[1]) == ["a", "b"]
    assert rec.batches[2] == ["a"]


def test_a_batch_stops_at_its_chunk_limit() -> None:
    rec = Recorder()
    committer = GroupCommitter(rec, max_chunks=3)
    result = behind_a_held_batch(committer, rec, [f"k{i}" for i in range(7)])
    assert [len(b) for b in rec.batches[1:]] == [3, 3, 1]
    assert all(isinstance(v, list) for v in result.values())


# -- through LocalCoordinator, both backends ---------------------------------------------


def test_sixteen_writers_share_transactions_and_poisoned_commits_fail_alone(
    c: LocalCoordinator, db_url: str
) -> None:
    """Race: 16 threads on one coordinator commit at once (2-4 chunks over 2 topics x 8
    partitions); three of them send only poison: a partition past the topic's count, an
    unknown topic, a retry of a committed key with other chunks. Expected: each poisoned
    commit raises its own error and writes nothing; every other commit gets offsets that
    run contiguously per partition and match the index exactly; commits shared
    transactions (fewer batches than commits)."""
    topics = [c.create_topic(f"g{i}", 8).topic_id for i in range(2)]
    c.commit("taken", [ChunkCommit(topics[0], 0, 0, 10, 1, 1, 2)])
    writers, rounds = 16, 30
    barrier = threading.Barrier(writers)
    told: dict[str, list[tuple[bytes, int, int, int]]] = {"taken": [(topics[0], 0, 0, 1)]}
    errors: dict[str, list[BaseException]] = {}
    poison = {
        13: lambda i: [ChunkCommit(topics[0], 8, 0, 10, 1, 1, 2)],
        14: lambda i: [ChunkCommit(b"u" * 16, 0, 0, 10, 1, 1, 2)],
        15: lambda i: [ChunkCommit(topics[1], 1, 0, 10, 1, 1, 2)],
    }

    def writer(w: int) -> None:
        errs: list[BaseException] = []
        errors[f"w{w}"] = errs
        barrier.wait()
        for i in range(rounds):
            key = "taken" if w == 15 else f"w{w}/{i}"
            if w in poison:
                chunks = poison[w](i)
            else:
                n = 2 + (w + i) % 3
                chunks = [
                    ChunkCommit(
                        topics[(w + j) % 2], (w * 3 + i + j) % 8, j * 10, 10, w % 5 + 1, 1, 2
                    )
                    for j in range(n)
                ]
            try:
                bases = c.commit(key, chunks)
            except Exception as e:
                errs.append(e)
                continue
            told[key] = [
                (ch.topic_id, ch.partition, b, ch.record_count)
                for ch, b in zip(chunks, bases, strict=True)
            ]

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(not errors[f"w{w}"] for w in range(13)), errors
    assert len(errors["w13"]) == rounds
    assert all(isinstance(e, PartitionNotFoundError) for e in errors["w13"])
    assert all(isinstance(e, TopicNotFoundError) for e in errors["w14"]) and errors["w14"]
    assert all(isinstance(e, CommitConflictError) for e in errors["w15"]) and errors["w15"]
    assert len(told) == 13 * rounds + 1
    index: dict[tuple[bytes, int], list[tuple[int, int, str]]] = {}
    for t, p, base, count, key in sql_rows(
        db_url,
        "SELECT e.topic_id, e.partition, e.base_offset, e.record_count, o.object_key "
        "FROM index_entries e JOIN objects o ON o.object_id = e.object_id "
        "ORDER BY e.topic_id, e.partition, e.base_offset",
    ):
        index.setdefault((bytes(t), p), []).append((base, count, key))
    expected: dict[tuple[bytes, int], list[tuple[int, int, str]]] = {}
    for key, entries in told.items():
        for t, p, base, count in entries:
            expected.setdefault((t, p), []).append((base, count, key))
    assert {tp: sorted(v) for tp, v in expected.items()} == index
    hwm = {
        (bytes(t), p): h
        for t, p, h in sql_rows(
            db_url, "SELECT topic_id, partition, high_watermark FROM partitions"
        )
    }
    for tp, rows in index.items():
        offset = 0
        for base, count, _ in rows:
            assert base == offset, f"{tp}: gap or overlap at {base}"
            offset += count
        assert offset == hwm[tp]
    keys = {k for (k,) in sql_rows(db_url, "SELECT object_key FROM objects")}
    assert keys == set(told)  # nothing of a poisoned commit stayed
    stats = c.store.group_commit_stats
    assert stats.requests == writers * rounds + 1
    assert stats.batches < stats.requests


def test_a_batch_mixing_a_retry_a_new_commit_and_a_missing_partition(
    c: LocalCoordinator,
) -> None:
    """commit_batch directly: the retry gets its first offsets, the new commit its own,
    the missing partition its error; only the new commit advances the log."""
    topic = c.create_topic("mix", 2)
    first = c.commit("old", [ChunkCommit(topic.topic_id, 0, 0, 10, 5, 1, 2)])
    batch = [
        PendingCommit("old", [ChunkCommit(topic.topic_id, 0, 0, 10, 5, 1, 2)]),
        PendingCommit("bad", [ChunkCommit(topic.topic_id, 2, 0, 10, 5, 1, 2)]),
        PendingCommit("new", [ChunkCommit(topic.topic_id, 0, 0, 10, 3, 1, 2)]),
        PendingCommit("new2", [ChunkCommit(topic.topic_id, 0, 0, 10, 4, 1, 2)]),
    ]
    c.store.commit_batch(batch)
    assert batch[0].outcome() == first == [0]
    with pytest.raises(PartitionNotFoundError):
        batch[1].outcome()
    assert batch[2].outcome() == [5]
    assert batch[3].outcome() == [8]
    assert c.offsets("mix", 0).high_watermark == 12
