"""Tiering throughput against the limit: pyarrow writing the same tables to the same store.

Starts a moto S3 server, writes ``--flushes`` multi-partition segment objects through
``LogWriter`` (SQLite coordinator; ``--records`` records per partition per flush, 16-byte
random keys, ~1 KiB semi-random values that compress about 2-3x, as in
bench/segment_codec.py, one header), then:

1. phases: the work of one tiering run timed piece by piece, without touching the
   index: the ranged GETs tiering plans (one per source object, 8 in flight), decode
   of every chunk, ``encode_tier`` of each partition, PUT of the results.
2. tiering: one timed ``run_tiering`` (plan, GETs, decode, encode, PUT, index swaps).
3. the limit, on the very tables tiering wrote (read back from its tier objects):
   ``pyarrow.parquet.write_table(table, compression=<same>)`` (pyarrow's defaults
   otherwise) + PUT to the same bucket, the tables in a pool as wide as tiering's
   (``pyarrow_*``); and the same preceded by GETs of every source segment object
   whole, 8 in flight (``pyarrow_with_read_*``), which is the work tiering cannot avoid
   (pyarrow cannot decode a segment object, so decoding is not in it). Best of 3 each.
4. GC (grace 1 s) removes the replaced segment objects.

MB/s are of source bytes (the segment chunks tiered, 10**6 bytes per MB) for every
figure, so they compare directly; ``ratio`` = tier MB/s / pyarrow MB/s. Prints JSON
lines; progress on stderr.

    .venv/bin/python bench/tiering.py [--flushes 200] [--partitions 4] [--records 50]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import httpx
import orjson
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spark_scan import best_of
from coordinator.janitors.catalog import Catalog, PartitionState
from coordinator.janitors.context import JanitorConfig, JanitorContext
from coordinator.janitors.gc import run_gc
from coordinator.janitors.tiering import (
    ENCODE_THREADS,
    FETCH_THREADS,
    TierRun,
    plan_fetches,
    run_tiering,
)
from coordinator.local import LocalCoordinator
from index.log import LogWriter
from segments.segment import SegmentBuilder, decode_chunk
from segments.store import ObjectStore, open_store
from segments.tier import TierReader, encode_tier
from segments.types import Record


def emit(**fields: object) -> None:
    print(orjson.dumps(fields).decode(), flush=True)


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """A moto S3 server on a free port: (process, endpoint), with test AWS credentials in
    the environment unless some are set."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(k, "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{endpoint}/moto-api/", timeout=1)
            return proc, endpoint
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto did not start")


WORDS = [b"lakelog", b"segment", b"chunk", b"batch", b"record", b"offset", b"topic", b"partition"]


def semi_random_value(rng: random.Random, size: int) -> bytes:
    """Repeated words mixed with random hex: compresses about 2-3x, like JSON payloads."""
    parts: list[bytes] = []
    n = 0
    while n < size:
        part = rng.choice(WORDS) if rng.random() < 0.6 else rng.randbytes(8).hex().encode()
        parts.append(part)
        n += len(part) + 1
    return b" ".join(parts)[:size]


def phases(store: ObjectStore, catalog: Catalog, parts: list[PartitionState]) -> dict[str, float]:
    """Seconds per phase of the work tiering does, measured alone (the index is untouched)."""
    config = JanitorConfig(tier_age_s=0)
    runs = [TierRun(p, tuple(catalog.rows(p.topic_id, p.partition))) for p in parts]
    plan = plan_fetches([r for run in runs for r in run.rows])
    out: dict[str, float] = {"gets": len(plan)}
    started = time.perf_counter()
    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        datas = list(pool.map(lambda f: store.get_range(f.object_key, f.start, f.length), plan))
    out["get_s"] = time.perf_counter() - started
    started = time.perf_counter()
    by_row = {
        r: decode_chunk(f.chunk(data, r), r.base_offset, r.record_count)
        for f, data in zip(plan, datas, strict=True)
        for r in f.rows
    }
    decoded = [[x for r in run.rows for x in by_row[r]] for run in runs]
    out["decode_s"] = time.perf_counter() - started
    started = time.perf_counter()
    encoded = [
        encode_tier(run.part.topic, run.part.partition, recs, compression=config.tier_compression)
        for run, recs in zip(runs, decoded, strict=True)
    ]
    out["encode_s"] = time.perf_counter() - started
    started = time.perf_counter()
    with ThreadPoolExecutor(ENCODE_THREADS) as pool:
        list(pool.map(lambda i: store.put(f"phases/{i}.parquet", encoded[i]), range(len(encoded))))
    out["put_s"] = time.perf_counter() - started
    for i in range(len(encoded)):
        store.delete(f"phases/{i}.parquet")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flushes", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--records", type=int, default=50, help="records per partition per flush")
    ap.add_argument("--value-bytes", type=int, default=1024)
    ap.add_argument("--segment-compression", default="none")
    a = ap.parse_args()
    moto, endpoint = start_moto()
    tmp = Path(tempfile.mkdtemp(prefix="bench-tiering-"))
    try:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        store = open_store("s3://bench/lakelog", endpoint_url=endpoint)
        coordinator = LocalCoordinator(f"sqlite:///{tmp / 'meta.db'}")
        coordinator.create_topic("bench", a.partitions)
        topic_id = coordinator.get_topic("bench").topic_id
        writer = LogWriter(store, coordinator)
        rng = random.Random(7)
        note(f"writing {a.flushes} segment objects ...")
        ts = int(time.time() * 1000)
        for f in range(a.flushes):
            b = SegmentBuilder(compression=a.segment_compression)
            for p in range(a.partitions):
                b.append(
                    topic_id,
                    p,
                    [
                        Record(
                            rng.randbytes(16),
                            semi_random_value(rng, a.value_bytes),
                            ts + i,
                            (("n", str(i).encode()),),
                        )
                        for i in range(a.records)
                    ],
                )
            writer.write(b)
            if f % 50 == 0:
                note(f"  {f}/{a.flushes}")
        catalog = Catalog(coordinator.db)
        parts = catalog.partitions("bench")
        segment_keys = [o.key for o in store.list("")]
        objects_before = len(segment_keys)
        rows_before = catalog.index_row_count()
        source_bytes = sum(r.length for p in parts for r in catalog.rows(topic_id, p.partition))
        mb = source_bytes / 1e6

        note("phases of the tiering work, timed alone ...")
        phase = phases(store, catalog, parts)

        note("tiering ...")
        # The default grace (600 s): a 1 s grace would let tiering swap in only objects
        # PUT less than 0.5 s earlier. GC below passes its own 1 s grace.
        config = JanitorConfig(tier_age_s=0)
        ctx = JanitorContext(catalog, coordinator.store, store)
        started = time.perf_counter()
        report = run_tiering(ctx, config)
        tier_s = time.perf_counter() - started
        if report.aborted or report.rows_replaced != rows_before:
            raise SystemExit(f"tiering did not replace every index row: {report.as_dict()}")
        rows_after = catalog.index_row_count()

        note("pyarrow baseline: the same tables, write_table + PUT (best of 3) ...")
        tables = [
            TierReader(store.get(r.object_key)).table()
            for p in parts
            for r in catalog.rows(topic_id, p.partition)
        ]

        def write(i: int) -> None:
            sink = io.BytesIO()
            pq.write_table(tables[i], sink, compression=config.tier_compression)
            store.put(f"baseline/{i}.parquet", sink.getvalue())

        def baseline() -> None:
            with ThreadPoolExecutor(ENCODE_THREADS) as pool:
                list(pool.map(write, range(len(tables))))

        def baseline_with_read() -> None:
            with ThreadPoolExecutor(FETCH_THREADS) as pool:
                list(pool.map(store.get, segment_keys))
            baseline()

        baseline_s = best_of(3, baseline)
        baseline_read_s = best_of(3, baseline_with_read)
        for i in range(len(tables)):
            store.delete(f"baseline/{i}.parquet")
        objects_tiered = sum(1 for _ in store.list(""))

        time.sleep(2.1)  # S3 modification times are whole seconds; grace is 1 s
        gc = run_gc(ctx, 1.0)
        objects_after = sum(1 for _ in store.list(""))

        emit(
            bench="tiering",
            partitions=a.partitions,
            records=a.flushes * a.partitions * a.records,
            segment_compression=a.segment_compression,
            tier_compression=config.tier_compression,
            source_mb=round(mb, 2),
            tier_out_mb=round(report.bytes_rewritten / 1e6, 2),
            tier_seconds=round(tier_s, 3),
            tier_mb_s=round(mb / tier_s, 1),
            pyarrow_seconds=round(baseline_s, 3),
            pyarrow_mb_s=round(mb / baseline_s, 1),
            ratio=round(baseline_s / tier_s, 2),
            pyarrow_with_read_seconds=round(baseline_read_s, 3),
            pyarrow_with_read_mb_s=round(mb / baseline_read_s, 1),
            ratio_with_read=round(baseline_read_s / tier_s, 2),
            tier_gets=phase["gets"],
            phase_get_s=round(phase["get_s"], 3),
            phase_decode_s=round(phase["decode_s"], 3),
            phase_encode_s=round(phase["encode_s"], 3),
            phase_put_s=round(phase["put_s"], 3),
            tier_objects_written=report.objects_written,
            objects_before=objects_before,
            objects_after_tiering=objects_tiered,
            objects_after_gc=objects_after,
            gc_deleted=gc.objects_deleted,
            index_rows_before=rows_before,
            index_rows_after=rows_after,
        )
        coordinator.close()
        store.close()
    finally:
        moto.kill()
        moto.wait(10)


if __name__ == "__main__":
    main()
