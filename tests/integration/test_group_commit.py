"""Group commit in a coordinator process: many agents' commits share its transactions.

One ``lakelog coordinator`` process per backend (SQLite, PostgreSQL); the writers
are other processes talking HTTP to it, as agents do.
"""

from __future__ import annotations

import multiprocessing
import re
import threading
from multiprocessing.synchronize import Barrier as MpBarrier
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator.client import ChunkCommit
from coordinator.http.client import http_coordinator
from coordinator.local import LocalCoordinator
from segments.errors import PartitionNotFoundError
from tests.conftest import backend_of, new_db_url
from tests.integration.test_metadata_concurrency import (
    PARTITIONS,
    TOPICS,
    CommitRecord,
    check_log,
    write_commits,
)
from tests.procs import start_coordinator

pytestmark = pytest.mark.integration

PROCESSES = 4
THREADS_PER_PROCESS = 4  # 16 writers in all
COMMITS_PER_WRITER = 150


def http_writers(
    url: str,
    proc: int,
    topic_ids: list[bytes],
    poisoned: bool,
    barrier: MpBarrier,
    results: Any,
) -> None:
    """A child process: 4 writer threads sharing one HttpCoordinator (as an agent's
    flushers do); with ``poisoned``, one more thread commits only to a partition past
    the topic's count."""
    out: list[CommitRecord] = []
    errors: list[str] = []
    poison_errors: list[str] = []
    lock = threading.Lock()
    with http_coordinator(url, timeout=60) as coord:

        def writer(t: int) -> None:
            try:
                done = write_commits(
                    coord,  # type: ignore[arg-type]  # the Coordinator protocol
                    f"p{proc}t{t}",
                    topic_ids,
                    COMMITS_PER_WRITER,
                    proc * 100 + t,
                )
            except BaseException as e:
                errors.append(repr(e))
                return
            with lock:
                out.extend(done)

        def poison() -> None:
            for i in range(COMMITS_PER_WRITER):
                try:
                    coord.commit(
                        f"poison/{proc}/{i}",
                        [ChunkCommit(topic_ids[0], PARTITIONS, 0, 10, 1, 1, 2)],
                    )
                    poison_errors.append("committed")
                except PartitionNotFoundError:
                    pass
                except BaseException as e:
                    poison_errors.append(repr(e))

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(THREADS_PER_PROCESS)]
        if poisoned:
            threads.append(threading.Thread(target=poison))
        barrier.wait(timeout=60)
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    results.put((proc, out, errors, poison_errors))


def run_http_writers(url: str, topic_ids: list[bytes]) -> tuple[list[CommitRecord], list[str]]:
    """``http_writers`` in PROCESSES spawned processes against the coordinator at ``url``
    (process 0 also sends the poisoned commits): every commit they made, and what the
    poisoned ones were told when they did not fail as they should."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=http_writers, args=(url, p, topic_ids, p == 0, barrier, results))
        for p in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    records: list[CommitRecord] = []
    poison_failures: list[str] = []
    try:
        for _ in procs:
            n, out, errors, poison_errors = results.get(timeout=300)
            assert errors == [], f"process {n}: {errors}"
            poison_failures += poison_errors
            records += out
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return records, poison_failures


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} not on /metrics"
    return float(match.group(1))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_sixteen_writers_in_four_processes_share_transactions(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    """Race: 16 writers (4 processes x 4 threads, over HTTP) commit 1-5 chunks each at
    once to one coordinator process, while a poisoned writer commits to a partition
    past the topic's count. Expected: every poisoned commit fails alone with
    PartitionNotFoundError and leaves nothing; every other commit succeeds; offsets
    run contiguously per partition and each writer was told exactly the offsets the
    index holds for its object; and the coordinator ran fewer transactions than
    commits (they were grouped)."""
    db_url = new_db_url(request, backend, tmp_path)
    assert backend_of(db_url) == backend
    with LocalCoordinator(db_url) as local:
        topic_ids = [local.create_topic(f"topic-{i}", PARTITIONS).topic_id for i in range(TOPICS)]
    proc, url = start_coordinator(tmp_path, db_url)
    try:
        records, poison_failures = run_http_writers(url, topic_ids)
        assert poison_failures == []
        assert len(records) == PROCESSES * THREADS_PER_PROCESS * COMMITS_PER_WRITER
        check_log(db_url, records)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    finally:
        proc.stop()
    commits = _metric(metrics, "lakelog_coordinator_group_commit_requests_total")
    batches = _metric(metrics, "lakelog_coordinator_group_commit_batches_total")
    assert commits == len(records) + COMMITS_PER_WRITER  # the poisoned ones ran too
    assert batches < commits
    assert _metric(metrics, "lakelog_coordinator_group_commit_largest_batch") > 1
