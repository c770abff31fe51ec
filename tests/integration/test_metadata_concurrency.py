"""Many writers on one metadata database: threads in one process and processes.

Every test runs on SQLite (one shared file) and on PostgreSQL (one shared
database). Child processes are started with the ``spawn`` context, so each
opens its own ``LocalCoordinator`` on the shared database exactly as a separate
agent host would.
"""

from __future__ import annotations

import itertools
import multiprocessing
import random
import threading
import time
from collections import defaultdict, deque
from multiprocessing.synchronize import Barrier as MpBarrier
from pathlib import Path
from typing import Any

import pytest

from coordinator.client import ChunkCommit
from coordinator.db import MIGRATIONS
from coordinator.local import LocalCoordinator
from tests.conftest import backend_of, new_db_url, sql_rows

pytestmark = pytest.mark.integration

TOPICS = 5
PARTITIONS = 10
THREAD_WRITERS = 8
PROCESS_WRITERS = 8
COMMITS_PER_WRITER = 625  # 16 writers x 625 = 10,000 commits

# (writer, seq, object key, [(topic_id, partition, base_offset, record_count), ...])
CommitRecord = tuple[str, int, str, list[tuple[bytes, int, int, int]]]


def write_commits(
    coord: LocalCoordinator, writer: str, topic_ids: list[bytes], n: int, seed: int
) -> list[CommitRecord]:
    """``n`` commits of 1-5 chunks on random partitions with random record counts."""
    rng = random.Random(seed)
    population = [(t, p) for t in topic_ids for p in range(PARTITIONS)]
    out: list[CommitRecord] = []
    for seq in range(n):
        targets = rng.sample(population, rng.randint(1, 5))
        chunks = []
        position = 0
        for topic_id, partition in targets:
            length = rng.randint(1, 4096)
            ts = 1_700_000_000_000 + seq
            chunks.append(
                ChunkCommit(topic_id, partition, position, length, rng.randint(1, 50), ts, ts)
            )
            position += length
        key = f"segments/{writer}/{seq:06d}.seg"
        bases = coord.commit(key, chunks)
        out.append(
            (
                writer,
                seq,
                key,
                [
                    (c.topic_id, c.partition, base, c.record_count)
                    for c, base in zip(chunks, bases, strict=True)
                ],
            )
        )
    return out


def process_writer(
    db_url: str,
    writer: str,
    topic_ids: list[bytes],
    n: int,
    seed: int,
    barrier: MpBarrier,
    results: Any,
) -> None:
    """A child process: its own coordinator, then ``n`` commits once everyone is ready."""
    coord = LocalCoordinator(db_url)
    try:
        barrier.wait(timeout=60)
        results.put((writer, write_commits(coord, writer, topic_ids, n, seed), None))
    except BaseException as e:
        results.put((writer, [], repr(e)))
    finally:
        coord.close()


def open_fresh_databases(db_urls: list[str], barrier: MpBarrier, results: Any) -> None:
    """A child process: each round, open a fresh database at the same moment as the others."""
    for r, db_url in enumerate(db_urls):
        barrier.wait(timeout=60)
        try:
            with LocalCoordinator(db_url) as coord:
                results.put((r, coord.cluster_id(), None))
        except BaseException as e:
            results.put((r, None, repr(e)))


def check_log(db_url: str, records: list[CommitRecord]) -> None:
    """Assert the invariants of the committed log against what the writers were told."""
    hwm = {
        (t, p): h
        for t, p, s, h in sql_rows(
            db_url, "SELECT topic_id, partition, log_start_offset, high_watermark FROM partitions"
        )
        if s == 0
    }
    index: dict[tuple[bytes, int], list[tuple[int, int, str]]] = defaultdict(list)
    for t, p, base, count, key in sql_rows(
        db_url,
        "SELECT e.topic_id, e.partition, e.base_offset, e.record_count, o.object_key "
        "FROM index_entries e JOIN objects o ON o.object_id = e.object_id "
        "ORDER BY e.topic_id, e.partition, e.base_offset",
    ):
        index[(t, p)].append((base, count, key))
    assert len(hwm) == TOPICS * PARTITIONS

    told: dict[tuple[bytes, int], list[tuple[int, int, str]]] = defaultdict(list)
    for _, _, key, chunks in records:
        for t, p, base, count in chunks:
            told[(t, p)].append((base, count, key))

    for tp, high_watermark in hwm.items():
        rows = index[tp]
        # Contiguous from 0 to the high watermark: no gap, no overlap.
        expected_base = 0
        for base, count, _ in rows:
            assert base == expected_base, f"{tp}: gap or overlap at {base}"
            expected_base = base + count
        assert expected_base == high_watermark
        assert sum(count for _, count, _ in told[tp]) == high_watermark
        # What each writer was told is exactly what the index holds.
        assert sorted(told[tp]) == rows

    # Each writer's own commits got increasing offsets on every partition.
    last: dict[tuple[str, bytes, int], int] = {}
    for writer, _, _, chunks in sorted(records, key=lambda r: (r[0], r[1])):
        for t, p, base, _ in chunks:
            assert base > last.get((writer, t, p), -1)
            last[(writer, t, p)] = base

    # One serial order explains every partition: the per-partition orders of commits
    # never contradict each other (the union of "A before B" edges has no cycle).
    successors: dict[str, set[str]] = defaultdict(set)
    indegree: dict[str, int] = {r[2]: 0 for r in records}
    for rows in index.values():
        for (_, _, a), (_, _, b) in itertools.pairwise(rows):
            if b not in successors[a]:
                successors[a].add(b)
                indegree[b] += 1
    ready = deque(k for k, d in indegree.items() if d == 0)
    ordered = 0
    while ready:
        k = ready.popleft()
        ordered += 1
        for nxt in successors[k]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    assert ordered == len(indegree), "commits interleaved: no serial order fits every partition"


@pytest.mark.slow
def test_threads_and_processes_commit_contiguous_offsets(db_url: str) -> None:
    """Race: 8 threads sharing one LocalCoordinator and 8 processes each with its own,
    all committing at once to one database (10,000 commits of 1-5 chunks over 5 topics
    x 10 partitions; on PostgreSQL commits touching common partitions contend for their
    row locks, taken in one fixed order). Expected: no deadlock and no error; per
    partition the index rows run contiguously from 0 to the high watermark, match exactly
    the base offsets the writers were told, each writer's commits get increasing offsets,
    and one serial commit order fits every partition."""
    coord = LocalCoordinator(db_url)
    topic_ids = [coord.create_topic(f"topic-{i}", PARTITIONS).topic_id for i in range(TOPICS)]

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESS_WRITERS + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=process_writer,
            args=(db_url, f"p{i}", topic_ids, COMMITS_PER_WRITER, 1000 + i, barrier, results),
        )
        for i in range(PROCESS_WRITERS)
    ]
    records: list[CommitRecord] = []
    thread_errors: list[BaseException] = []
    lock = threading.Lock()

    def thread_writer(i: int) -> None:
        try:
            done = write_commits(coord, f"t{i}", topic_ids, COMMITS_PER_WRITER, i)
        except BaseException as e:
            thread_errors.append(e)
            raise
        with lock:
            records.extend(done)

    threads = [threading.Thread(target=thread_writer, args=(i,)) for i in range(THREAD_WRITERS)]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(timeout=60)  # every process has opened its coordinator
        started = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for _ in procs:
            writer, done, error = results.get(timeout=120)
            assert error is None, f"{writer}: {error}"
            records.extend(done)
        elapsed = time.monotonic() - started
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        coord.close()
    assert not thread_errors
    assert all(proc.exitcode == 0 for proc in procs)
    assert len(records) == (THREAD_WRITERS + PROCESS_WRITERS) * COMMITS_PER_WRITER
    assert len({r[2] for r in records}) == len(records)
    assert {r[0] for r in records} == {f"t{i}" for i in range(THREAD_WRITERS)} | {
        f"p{i}" for i in range(PROCESS_WRITERS)
    }
    check_log(db_url, records)
    assert elapsed < 60


def test_processes_migrating_a_fresh_database_at_once(
    request: pytest.FixtureRequest, db_url: str, tmp_path: Path
) -> None:
    """Race: 4 processes open the same brand-new database at the same moment, 5 times
    over (SQLite: the file lock; PostgreSQL: the advisory lock). Expected: all succeed,
    agree on one cluster id, and each migration is recorded exactly once."""
    n_procs, rounds = 4, 5
    backend = backend_of(db_url)
    urls = [new_db_url(request, backend, tmp_path / f"round-{r}") for r in range(rounds)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n_procs)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=open_fresh_databases, args=(urls, barrier, results))
        for _ in range(n_procs)
    ]
    for proc in procs:
        proc.start()
    try:
        outcomes = [results.get(timeout=120) for _ in range(n_procs * rounds)]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    assert [e for _, _, e in outcomes if e is not None] == []
    by_round: dict[int, set[str]] = defaultdict(set)
    for r, cluster_id, _ in outcomes:
        by_round[r].add(cluster_id)
    assert {r: len(ids) for r, ids in by_round.items()} == {r: 1 for r in range(rounds)}
    for url in urls:
        versions = [v for (v,) in sql_rows(url, "SELECT version FROM schema_version ORDER BY 1")]
        assert versions == [m.version for m in MIGRATIONS]
        assert sql_rows(url, "SELECT COUNT(*) FROM meta") == [(1,)]
        if backend == "sqlite":
            assert sql_rows(url, "PRAGMA journal_mode") == [("wal",)]
