"""The PostgreSQL metadata store across a restart of the PostgreSQL server.

This stops and starts the machine's shared PostgreSQL cluster (for about a
second): it is marked ``slow`` and runs on PostgreSQL only, since SQLite has no
server to restart.
"""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from pathlib import Path

import pytest

from coordinator.client import ChunkCommit
from coordinator.local import LocalCoordinator
from segments.errors import CoordinatorUnavailableError
from tests.conftest import new_db_url, sql_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.serial]


def pg_ctl(action: str) -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action, "-m", "fast"]
        if action == "stop"
        else ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        timeout=60,
        capture_output=True,
    )


def test_commits_fail_retriably_during_a_restart_and_resume_after(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Race: a writer commits in a loop (retrying a failed commit with the same key, as an
    agent does) while the PostgreSQL server stops for a second and starts again.
    Expected: during the outage commits fail with the retriable
    CoordinatorUnavailableError only; afterwards they succeed through the same
    LocalCoordinator with no manual step; every acknowledged commit is in the index and
    the partition's offsets run contiguously from 0 to the high watermark."""
    if not Path("/etc/postgresql").is_dir():
        pytest.skip("no local PostgreSQL cluster to restart (pg_ctlcluster)")
    db_url = new_db_url(request, "postgresql", tmp_path)
    coord = LocalCoordinator(db_url, timeout_s=1.0)
    topic = coord.create_topic("t", 2)
    acked: list[tuple[int, int, int]] = []  # (partition, base, count)
    failures: list[CoordinatorUnavailableError] = []
    others: list[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        seq = 0
        while not stop.is_set():
            chunks = [ChunkCommit(topic.topic_id, p, 0, 10, 1 + seq % 3 + p, 1, 1) for p in (0, 1)]
            try:
                bases = coord.commit(f"obj/{seq:06d}", chunks)
            except CoordinatorUnavailableError as e:
                failures.append(e)
                time.sleep(0.05)
                continue  # retry the same object key
            except BaseException as e:
                others.append(e)
                return
            acked.extend(
                (c.partition, b, c.record_count) for c, b in zip(chunks, bases, strict=True)
            )
            seq += 1
            time.sleep(0.002)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.5)
        before = len(acked)
        pg_ctl("stop")
        time.sleep(1.0)
        pg_ctl("start")
        restarted = time.monotonic()
        # Recovered: new commits are acknowledged within a few seconds of the start.
        while time.monotonic() - restarted < 20 and len(acked) < before + 100 + 2 * len(failures):
            time.sleep(0.05)
        after_restart = len(acked)
    finally:
        stop.set()
        thread.join(timeout=30)
    try:
        assert others == []
        assert before > 20
        assert failures, "the outage went unnoticed"
        assert all(e.retriable for e in failures)
        assert after_restart > before + 40, "commits did not resume after the restart"
        for p in (0, 1):
            spans = sorted((b, n) for q, b, n in acked if q == p)
            assert spans[0][0] == 0
            assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(spans))
            stored = sql_rows(
                db_url,
                "SELECT base_offset, record_count FROM index_entries "
                "WHERE topic_id = ? AND partition = ? ORDER BY base_offset",
                (topic.topic_id, p),
            )
            assert [tuple(r) for r in stored] == spans
            assert coord.offsets("t", p).high_watermark == spans[-1][0] + spans[-1][1]
    finally:
        coord.close()
