"""Full-scan throughput of the ``lakelog`` Spark data source (local[2], file:// store).

One JSON line per figure (progress on stderr); every Spark figure is the best of
``--repeat`` runs of a whole query (``load()`` to result, planning included), after a
warm-up query (workers started, modules imported):

- ``pyarrow_direct``: pyarrow reading the tier objects of the tiered topic straight
  from their files (``pq.read_table``, all columns, decoded only): the limit.
- ``spark_tiered``: ``spark.read.format("lakelog")`` over the same topic, all columns
  through Arrow into the JVM and aggregated there. ``vs_pyarrow`` is the issue's
  end-to-end target (>= 0.5). ``vs_pyarrow_scan`` is like for like: the query's fixed
  cost (``spark_fixed``) taken off first, so both sides only read and decode.
- ``spark_tiered_noop``: the same scan into Spark's ``noop`` sink (rows into the JVM,
  no aggregation).
- ``spark_parquet_native``: Spark's own Parquet reader on the same files, the same
  aggregate: what any Spark job pays for these bytes.
- ``spark_fixed``: the same query reading 2 records: Spark's per-query cost
  (analysis, the Python planner round trips, job and task scheduling).
- ``spark_untiered``: the same records as segment chunks (Kafka record batches decoded
  in the Python workers).

MB/s counts key + value bytes. Usage: ``python bench/spark_scan.py [--records N]``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator.local import LocalCoordinator
from index.log import LogReader, LogWriter
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.tier import encode_tier, tier_object_key
from segments.types import ConsumedRecord, Record

PARTITIONS = 2
VALUE_BYTES = 200


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def produce(store: Any, coord: LocalCoordinator, topic: str, records: int) -> int:
    """``records`` records per partition in segment objects of 10,000 per partition."""
    topic_id = coord.create_topic(topic, PARTITIONS).topic_id
    writer = LogWriter(store, coord)
    pad = b"x" * (VALUE_BYTES - 40)
    payload = 0
    per_object = 10_000
    for start in range(0, records, per_object):
        builder = SegmentBuilder(compression="zstd")
        for p in range(PARTITIONS):
            batch = []
            for i in range(start, min(start + per_object, records)):
                key = f"key-{i % 1000}".encode()
                value = orjson.dumps({"i": i, "p": p}) + pad
                payload += len(key) + len(value)
                batch.append(Record(key, value, 1_700_000_000_000 + i))
            builder.append(topic_id, p, batch)
        writer.write(builder)
    return payload


def tier_all(store: Any, coord: LocalCoordinator, db: Path, topic: str) -> list[str]:
    """Each partition as one tier object; the index rows swapped as the janitor does."""
    keys = []
    topic_id = coord.get_topic(topic).topic_id
    reader = LogReader(store, coord)
    for p in range(PARTITIONS):
        hw = coord.offsets(topic, p).high_watermark
        records: list[ConsumedRecord] = []
        while len(records) < hw:
            records.extend(reader.read(topic, p, len(records), max_bytes=64 << 20))
        data = encode_tier(topic, p, records)
        key = tier_object_key(topic, p, 0, hw - 1)
        store.put(key, data)
        keys.append(key)
        with sqlite3.connect(db) as conn:
            conn.execute(
                "DELETE FROM index_entries WHERE topic_id = ? AND partition = ?", (topic_id, p)
            )
            (object_id,) = conn.execute(
                "INSERT INTO objects (object_key, size, committed_at) VALUES (?, ?, ?) "
                "RETURNING object_id",
                (key, len(data), time.time()),
            ).fetchone()
            conn.execute(
                "INSERT INTO index_entries (topic_id, partition, base_offset, record_count, "
                "object_id, position, length, min_ts, max_ts, kind) "
                "VALUES (?, ?, 0, ?, ?, 0, ?, ?, ?, 'parquet')",
                (
                    topic_id,
                    p,
                    hw,
                    object_id,
                    len(data),
                    min(r.timestamp_ms for r in records),
                    max(r.timestamp_ms for r in records),
                ),
            )
    return keys


def spark_agg(df: Any) -> tuple[int, int]:
    """The bench's aggregate over all columns: (rows, key + value bytes)."""
    from pyspark.sql import functions as F

    row = df.agg(
        F.count("*").alias("n"),
        F.sum(F.length("key") + F.length("value")).alias("b"),
        F.max("offset"),
        F.count("timestamp"),
        F.count("headers"),
    ).collect()[0]
    return int(row.n), int(row.b or 0)


def best_of(repeat: int, run: Any) -> float:
    """The best wall time of ``repeat`` calls of ``run()`` (the machine is shared)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return best


def emit(case: str, rows: int, payload: int, seconds: float, **extra: Any) -> None:
    figures = {
        "bench": "spark_scan",
        "case": case,
        "rows": rows,
        "seconds": round(seconds, 3),
        "rows_per_s": round(rows / seconds, 1),
        "mb_per_s": round(payload / seconds / 1e6, 1),
        **extra,
    }
    print(orjson.dumps(figures).decode(), flush=True)
    progress(f"{case}: {seconds:.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=250_000, help="records per partition")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    tmp = Path(tempfile.mkdtemp(prefix="lakelog-spark-bench-"))
    db = tmp / "meta.db"
    coord = LocalCoordinator(f"sqlite:///{db}")
    store = open_store(f"file://{tmp / 'data'}")
    progress(f"writing {args.records * PARTITIONS:,} records twice under {tmp}")
    payload = produce(store, coord, "tiered", args.records)
    produce(store, coord, "untiered", args.records)
    progress("tiering 'tiered'")
    keys = tier_all(store, coord, db, "tiered")
    total = args.records * PARTITIONS

    def direct() -> None:
        assert sum(pq.read_table(tmp / "data" / k).num_rows for k in keys) == total

    pyarrow_s = best_of(args.repeat, direct)
    emit("pyarrow_direct", total, payload, pyarrow_s)

    progress("starting Spark local[2]")
    from pyspark.sql import SparkSession

    import spark as lakelog_spark

    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    lakelog_spark.register(session)
    options = {"db": f"sqlite:///{db}", "store": store.url}

    def lakelog(topic: str, **extra: str) -> Any:
        return session.read.format("lakelog").options(**options, subscribe=topic, **extra).load()

    def scan(topic: str) -> None:
        assert spark_agg(lakelog(topic)) == (total, payload)

    first2 = orjson.dumps({"tiered": {str(p): 1 for p in range(PARTITIONS)}}).decode()
    scan("tiered")  # warm-up: workers started, modules imported
    fixed_s = best_of(args.repeat, lambda: spark_agg(lakelog("tiered", endingOffsets=first2)))
    tiered_s = best_of(args.repeat, lambda: scan("tiered"))
    scan_s = max(tiered_s - fixed_s, 1e-9)
    emit(
        "spark_tiered",
        total,
        payload,
        tiered_s,
        vs_pyarrow=round(pyarrow_s / tiered_s, 3),
        scan_seconds=round(scan_s, 3),
        vs_pyarrow_scan=round(pyarrow_s / scan_s, 3),
    )
    noop_s = best_of(
        args.repeat,
        lambda: lakelog("tiered").write.format("noop").mode("overwrite").save(),
    )
    emit("spark_tiered_noop", total, payload, noop_s, vs_pyarrow=round(pyarrow_s / noop_s, 3))
    parquet_dir = f"file://{tmp / 'data' / 'tiered' / 'tiered'}"

    def native() -> None:
        assert spark_agg(session.read.parquet(parquet_dir)) == (total, payload)

    native_s = best_of(args.repeat, native)
    emit(
        "spark_parquet_native",
        total,
        payload,
        native_s,
        vs_pyarrow=round(pyarrow_s / native_s, 3),
        lakelog_vs_native=round(native_s / tiered_s, 3),
    )
    emit("spark_fixed", 2, 0, fixed_s)
    untiered_s = best_of(args.repeat, lambda: scan("untiered"))
    emit("spark_untiered", total, payload, untiered_s)
    session.stop()
    coord.close()


if __name__ == "__main__":
    main()
