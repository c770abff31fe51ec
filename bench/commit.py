"""Commits per second of the coordinator, in-process on SQLite and on PostgreSQL.

For 1, 10 and 100 chunks per commit, with 1 writer and with 8 writer threads
sharing one ``LocalCoordinator`` (as an agent's flushers would), prints one JSON
line each:

    {"bench": "commit", "chunks_per_commit": 10, "writers": 8, "write_mode": "lock",
     "commits": ..., "seconds": ..., "commits_per_s": ..., "chunks_per_s": ...,
     "p50_ms": ..., "p99_ms": ...}

then the 8-thread cases again with ``write_mode="pool"`` (a connection per
thread, serialised by SQLite's busy handler instead of a Python lock) and one
case with ``synchronous=FULL`` (an fsync per commit), to show what those cost.

``bench_commits`` takes any ``Coordinator``; the "http" section runs it over
``HttpCoordinator`` against a ``lakelog coordinator`` process on SQLite (one
shared client for all writer threads, as an agent has), printing
``{"bench": "commit_http", ...}`` lines with the same figures.
The "postgresql" section runs the 1/10/100-chunk cases (1 and 8 writers) on a
throwaway PostgreSQL database (created and dropped on ``--pg-url``'s server)
and prints, per case, ``{"bench": "commit_ratio", "sqlite_commits_per_s": ...,
"postgresql_commits_per_s": ..., "sqlite_over_postgresql": ...}`` against the
SQLite figures of the same run (target: PostgreSQL within 2x). PostgreSQL
fsyncs its WAL at every commit (``synchronous_commit=on``), like SQLite's
``synchronous=FULL``, so the FULL case is printed beside it for a like-for-like
durability comparison.
Run: ``.venv/bin/python bench/commit.py [--section local|http|postgresql]``
(about two minutes for all); progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coordinator.client import ChunkCommit, Coordinator  # noqa: E402
from coordinator.db import WriteMode  # noqa: E402
from coordinator.local import LocalCoordinator  # noqa: E402

RECORDS_PER_CHUNK = 10
CHUNK_BYTES = 16_384


def bench_commits(
    coordinator: Coordinator,
    chunks_per_commit: int,
    n_commits: int,
    writers: int,
    *,
    partitions: int | None = None,
    max_seconds: float | None = None,
) -> dict[str, Any]:
    """Time ``n_commits`` commits of ``chunks_per_commit`` chunks from ``writers`` threads.

    Creates a fresh topic with ``partitions`` partitions (default: max(chunks, 10))
    and deletes it afterwards (not timed). Each commit covers distinct partitions,
    rotating so that every partition is written. With ``max_seconds``, writers stop
    early once that much time has passed (the figures count the commits made).

    Returns:
        ``{"chunks_per_commit", "writers", "commits", "seconds", "commits_per_s",
        "chunks_per_s", "cpu_s", "commits_per_cpu_s", "p50_ms", "p99_ms"}``; the caller
        adds "bench" and the setup. ``cpu_s`` is this process's CPU time (for an HTTP
        coordinator, the client's only).
    """
    n_partitions = partitions if partitions is not None else max(chunks_per_commit, 10)
    if chunks_per_commit > n_partitions:
        raise ValueError("chunks_per_commit cannot exceed the partition count")
    run = uuid.uuid4().hex[:8]
    topic = coordinator.create_topic(f"bench-commit-{run}", n_partitions)
    per_writer = [n_commits // writers + (w < n_commits % writers) for w in range(writers)]
    latencies: list[list[float]] = [[] for _ in range(writers)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(writers + 1)

    done = [0] * writers
    deadline = [float("inf")]

    def writer(w: int) -> None:
        try:
            barrier.wait()
            for i in range(per_writer[w]):
                if time.perf_counter() > deadline[0]:
                    break
                first = (w * 7 + i) % n_partitions
                chunks = [
                    ChunkCommit(
                        topic_id=topic.topic_id,
                        partition=(first + j) % n_partitions,
                        position=j * CHUNK_BYTES,
                        length=CHUNK_BYTES,
                        record_count=RECORDS_PER_CHUNK,
                        min_timestamp_ms=1_700_000_000_000 + i,
                        max_timestamp_ms=1_700_000_000_000 + i,
                    )
                    for j in range(chunks_per_commit)
                ]
                t0 = time.perf_counter()
                coordinator.commit(f"segments/{run}/{w:02d}/{i:08d}.seg", chunks)
                latencies[w].append(time.perf_counter() - t0)
                done[w] += 1
        except BaseException as e:
            errors.append(e)
            raise

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    barrier.wait()
    start, cpu_start = time.perf_counter(), time.process_time()
    if max_seconds is not None:
        deadline[0] = start + max_seconds
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    # CPU seconds of this whole process: on a shared machine, commits per CPU second
    # says more about the code than wall-clock time does.
    cpu = time.process_time() - cpu_start
    if errors:
        raise errors[0]
    coordinator.delete_topic(topic.name)
    lat = sorted(x for per in latencies for x in per)
    n_commits = sum(done)
    return {
        "chunks_per_commit": chunks_per_commit,
        "writers": writers,
        "commits": n_commits,
        "seconds": round(seconds, 3),
        "commits_per_s": round(n_commits / seconds, 1),
        "chunks_per_s": round(n_commits * chunks_per_commit / seconds, 1),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpu_s": round(cpu, 3),
        "commits_per_cpu_s": round(n_commits / cpu, 1) if cpu > 0 else None,
        "p50_ms": round(statistics.median(lat) * 1000, 3),
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 3),
    }


def _case(
    tmp: Path,
    chunks: int,
    commits: int,
    writers: int,
    write_mode: WriteMode = "lock",
    synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
    pg_url: str | None = None,
) -> dict[str, Any]:
    db = tmp / f"c{chunks}-w{writers}-{write_mode}-{synchronous}.db"
    backend = "sqlite" if pg_url is None else "postgresql"
    print(
        f"commit: {backend}, {chunks} chunks x {commits} commits, {writers} writers, "
        f"{write_mode}, synchronous={synchronous}",
        file=sys.stderr,
    )
    with LocalCoordinator(
        f"sqlite:///{db}" if pg_url is None else pg_url,
        write_mode=write_mode,
        synchronous=synchronous,
    ) as coordinator:
        # Warm up: connections, statement cache, the first pages of every table.
        bench_commits(coordinator, chunks, max(commits // 20, writers), writers)
        result = bench_commits(coordinator, chunks, commits, writers)
    line: dict[str, Any] = {"bench": "commit", "backend": backend}
    if pg_url is None:
        line |= {"write_mode": write_mode, "synchronous": synchronous}
    else:
        line |= {"synchronous_commit": "on"}
    line |= result
    print(json.dumps(line), flush=True)
    return line


def _pg_cases(tmp: Path, admin_url: str, counts: dict[int, int], scale: float) -> None:
    """The 1/10/100-chunk cases on SQLite and on a throwaway PostgreSQL database; ratios."""
    with _throwaway_pg(admin_url) as pg_url:
        for chunks, commits in counts.items():
            for writers in (1, 8):
                n = max(int(commits * scale), 8)
                lite = _case(tmp, chunks, n, writers)
                pg = _case(tmp, chunks, max(n // 3, 8), writers, pg_url=pg_url)
                ratio = lite["commits_per_s"] / pg["commits_per_s"]
                line = {
                    "bench": "commit_ratio",
                    "chunks_per_commit": chunks,
                    "writers": writers,
                    "sqlite_commits_per_s": lite["commits_per_s"],
                    "postgresql_commits_per_s": pg["commits_per_s"],
                    "sqlite_over_postgresql": round(ratio, 2),
                    "within_2x": ratio <= 2.0,
                }
                print(json.dumps(line), flush=True)
        full = _case(tmp, 10, max(int(1000 * scale), 8), 1, synchronous="FULL")
        pg = _case(tmp, 10, max(int(1000 * scale), 8), 1, pg_url=pg_url)
        line = {
            "bench": "commit_ratio_durable",
            "chunks_per_commit": 10,
            "writers": 1,
            "sqlite_full_commits_per_s": full["commits_per_s"],
            "postgresql_commits_per_s": pg["commits_per_s"],
            "sqlite_over_postgresql": round(full["commits_per_s"] / pg["commits_per_s"], 2),
        }
        print(json.dumps(line), flush=True)


def _http_cases(tmp: Path, scale: float) -> None:
    """The same cases over HTTP, against a coordinator process on its own SQLite file."""
    import socket
    import subprocess

    import httpx

    from coordinator.http.client import http_coordinator

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    url = f"http://127.0.0.1:{port}"
    db_url = f"sqlite:///{tmp / 'http.db'}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service.cli",
            "coordinator",
            "--db",
            db_url,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("coordinator process did not start")
            time.sleep(0.05)
        with http_coordinator(url, timeout=30) as coordinator:
            for chunks, commits in {1: 2000, 10: 1500, 100: 300}.items():
                for writers in (1, 8):
                    n = max(int(commits * scale), 8)
                    print(
                        f"commit_http: {chunks} chunks x {n} commits, {writers} writers",
                        file=sys.stderr,
                    )
                    bench_commits(coordinator, chunks, max(n // 20, writers), writers)
                    result = bench_commits(coordinator, chunks, n, writers)
                    line = {"bench": "commit_http", "backend": "sqlite", **result}
                    print(json.dumps(line), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def _throwaway_pg(admin_url: str) -> Iterator[str]:
    """The URL of a fresh PostgreSQL database on ``admin_url``'s server, dropped after."""
    import psycopg

    dbname = f"lakelog_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {dbname}")
    info = psycopg.conninfo.conninfo_to_dict(admin_url)
    try:
        yield (
            f"postgresql://{info.get('user', 'postgres')}@{info.get('host', '127.0.0.1')}:"
            f"{info.get('port', '5432')}/{dbname}"
        )
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")


def _matrix(tmp: Path, args: argparse.Namespace) -> None:
    """Chunk rows/s and commit latency for every (backend, writers, chunks per commit).

    Writers are threads sharing one ``LocalCoordinator`` (as a coordinator process
    serves many agents). Each case runs for at most ``--case-seconds`` after a short
    warm-up, on a fresh topic of max(chunks, 100) partitions (so the writers of the
    big cases all touch the same rows, as agents flushing over every partition do);
    one ``{"bench": "commit_matrix", ...}`` line per case.
    """
    backends = args.backends.split(",")
    writers_list = [int(x) for x in args.writers.split(",")]
    chunks_list = [int(x) for x in args.chunks.split(",")]
    with ExitStack() as stack:
        urls = {
            "sqlite": f"sqlite:///{tmp / 'matrix.db'}",
            "postgresql": (
                stack.enter_context(_throwaway_pg(args.pg_url)) if "postgresql" in backends else ""
            ),
        }
        for backend in backends:
            # FULL: SQLite syncs its WAL at every commit, as PostgreSQL does (equal
            # durability); NORMAL (lakelog's default) syncs at checkpoints.
            sync = args.sqlite_synchronous
            with LocalCoordinator(urls[backend], synchronous=sync) as coordinator:
                for chunks in chunks_list:
                    for writers in writers_list:
                        print(
                            f"commit_matrix: {backend}, {chunks} chunks, {writers} writers",
                            file=sys.stderr,
                        )
                        # Enough commits to fill the time budget at any plausible speed.
                        n = max(writers * 4, int(2_000_000 / chunks))
                        parts = max(chunks, 100)
                        bench_commits(  # warm-up
                            coordinator, chunks, writers * 2, writers, partitions=parts
                        )
                        result = bench_commits(
                            coordinator,
                            chunks,
                            n,
                            writers,
                            partitions=parts,
                            max_seconds=args.case_seconds,
                        )
                        line = {
                            "bench": "commit_matrix",
                            "backend": backend,
                            "label": args.label,
                            "sqlite_synchronous": args.sqlite_synchronous,
                            **result,
                        }
                        print(json.dumps(line), flush=True)


def main(argv: list[str] | None = None) -> None:
    """Run every case; ``--scale`` multiplies the commit counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the commit counts")
    parser.add_argument(
        "--section",
        choices=("all", "local", "http", "postgresql", "matrix"),
        default="all",
        help="which cases to run",
    )
    parser.add_argument(
        "--pg-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL server (maintenance database) for the postgresql section",
    )
    parser.add_argument("--backends", default="sqlite,postgresql", help="matrix: backends")
    parser.add_argument("--writers", default="1,8,32", help="matrix: writer threads")
    parser.add_argument("--chunks", default="1,100,1000,10000", help="matrix: chunks per commit")
    parser.add_argument(
        "--case-seconds", type=float, default=3.0, help="matrix: time budget of each case"
    )
    parser.add_argument("--label", default="", help="matrix: a label copied into each line")
    parser.add_argument(
        "--sqlite-synchronous",
        choices=("NORMAL", "FULL"),
        default="NORMAL",
        help="matrix: SQLite's synchronous (FULL: a WAL sync per commit, as PostgreSQL)",
    )
    args = parser.parse_args(argv)
    counts = {1: 6000, 10: 4000, 100: 600}
    with tempfile.TemporaryDirectory(prefix="lakelog-bench-commit-") as d:
        tmp = Path(d)
        if args.section == "matrix":
            _matrix(tmp, args)
            return
        if args.section in ("all", "postgresql"):
            _pg_cases(tmp, args.pg_url, counts, args.scale)
        if args.section in ("all", "http"):
            _http_cases(tmp, args.scale)
        if args.section in ("http", "postgresql"):
            return
        for chunks, commits in counts.items():
            n = max(int(commits * args.scale), 8)
            _case(tmp, chunks, n, 1)
            _case(tmp, chunks, n, 8)
        for chunks, commits in counts.items():
            _case(tmp, chunks, max(int(commits * args.scale) // 2, 8), 8, write_mode="pool")
        _case(tmp, 10, max(int(1000 * args.scale), 8), 1, synchronous="FULL")


if __name__ == "__main__":
    main()
