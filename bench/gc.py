"""Garbage collection's pace: objects deleted per second by one pass, on moto S3.

Starts a moto S3 server and a coordinator database (``--db sqlite``: a file;
``--db postgres``: a new database on the local PostgreSQL, dropped at the end), writes
``--objects`` one-chunk segment objects through ``LogWriter`` to one topic, deletes the
topic; a first GC pass stamps its objects unreferenced. Then it puts as many orphans
(objects no commit names) beside them; after the grace (1 s) a second pass deletes
everything, and is the one timed. Each line: objects and orphans deleted, seconds,
objects/s, the database. Progress on stderr.

    .venv/bin/python bench/gc.py [--objects 2000] [--db sqlite|postgres]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.tiering import emit, note, start_moto
from coordinator.janitors.catalog import Catalog
from coordinator.janitors.context import JanitorContext
from coordinator.janitors.gc import run_gc
from coordinator.local import LocalCoordinator
from index.log import LogWriter
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.types import Record

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def database(kind: str, tmp: Path) -> tuple[str, str | None]:
    """(the coordinator's URL, the PostgreSQL database to drop after, if any)."""
    if kind == "sqlite":
        return f"sqlite:///{tmp / 'meta.db'}", None
    import psycopg

    name = f"lakelog_bench_gc_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"postgresql://postgres@127.0.0.1:5432/{name}", name


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=2000)
    ap.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    args = ap.parse_args()
    moto, endpoint = start_moto()
    tmp = Path(tempfile.mkdtemp(prefix="bench-gc-"))
    db_url, drop = database(args.db, tmp)
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket="bench-gc")
    store = open_store("s3://bench-gc", endpoint_url=endpoint)
    coordinator = LocalCoordinator(db_url)
    try:
        topic_id = coordinator.create_topic("gc", 1).topic_id
        writer = LogWriter(store, coordinator)
        for i in range(args.objects):
            b = SegmentBuilder()
            b.append(topic_id, 0, [Record(key=None, value=b"v%d" % i, timestamp_ms=0)])
            writer.write(b)
            if i % 500 == 499:
                note(f"{i + 1} objects written")
        coordinator.delete_topic("gc")
        ctx = JanitorContext(Catalog(coordinator.db), coordinator.store, store)
        run_gc(ctx, 1.0)  # stamps the topic's objects unreferenced: their grace starts
        for i in range(args.objects):
            store.put(f"segments/orphans/{i:06d}.seg", b"x")
        time.sleep(1.5)
        started = time.perf_counter()
        report = run_gc(ctx, 1.0)
        seconds = time.perf_counter() - started
        deleted = report.objects_deleted + report.orphans_deleted
        emit(
            bench="gc",
            db=args.db,
            objects_deleted=report.objects_deleted,
            orphans_deleted=report.orphans_deleted,
            seconds=round(seconds, 2),
            objects_per_s=round(deleted / seconds, 1),
        )
    finally:
        coordinator.close()
        moto.kill()
        if drop is not None:
            import psycopg

            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {drop} WITH (FORCE)")


if __name__ == "__main__":
    main()
