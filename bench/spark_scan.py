"""Full-scan throughput of the ``lakelog`` Spark data source (local[2], file:// store).

Three figures, one JSON line each (progress on stderr):

- ``pyarrow_direct``: pyarrow reading the tier objects of the tiered topic straight
  from their files (``pq.read_table``, all columns): the limit for the tiered scan.
- ``spark_tiered``: ``spark.read.format("lakelog")`` over the same topic (all columns
  through Arrow into the JVM, aggregated there), and its ratio to pyarrow (target >= 0.5).
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


def spark_scan(session: Any, options: dict[str, str], topic: str) -> tuple[float, int, int]:
    from pyspark.sql import functions as F

    df = session.read.format("lakelog").options(**options, subscribe=topic).load()
    t = time.perf_counter()
    row = df.agg(
        F.count("*").alias("n"),
        F.sum(F.length("key") + F.length("value")).alias("b"),
        F.max("offset"),
        F.count("timestamp"),
        F.count("headers"),
    ).collect()[0]
    return time.perf_counter() - t, int(row.n), int(row.b)


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

    best = float("inf")
    for _ in range(args.repeat):
        t = time.perf_counter()
        rows = sum(pq.read_table(tmp / "data" / k).num_rows for k in keys)
        best = min(best, time.perf_counter() - t)
    assert rows == total
    direct = {"rows_per_s": total / best, "mb_per_s": payload / best / 1e6}
    print(
        orjson.dumps(
            {
                "bench": "spark_scan",
                "case": "pyarrow_direct",
                "rows": total,
                "seconds": round(best, 3),
                **{k: round(v, 1) for k, v in direct.items()},
            }
        ).decode()
    )

    progress("starting Spark local[2]")
    from pyspark.sql import SparkSession

    import spark as lakelog_spark

    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    lakelog_spark.register(session)
    options = {"db": f"sqlite:///{db}", "store": store.url}
    spark_scan(session, options, "tiered")  # warm-up: workers started, modules imported
    for case, topic in (("spark_tiered", "tiered"), ("spark_untiered", "untiered")):
        best = float("inf")
        for _ in range(args.repeat):
            seconds, n, b = spark_scan(session, options, topic)
            assert n == total and b == payload, (n, b)
            best = min(best, seconds)
        figures: dict[str, Any] = {
            "bench": "spark_scan",
            "case": case,
            "rows": total,
            "seconds": round(best, 3),
            "rows_per_s": round(total / best, 1),
            "mb_per_s": round(payload / best / 1e6, 1),
        }
        if case == "spark_tiered":
            figures["vs_pyarrow"] = round((total / best) / direct["rows_per_s"], 3)
        print(orjson.dumps(figures).decode(), flush=True)
        progress(f"{case}: {best:.2f} s")
    session.stop()
    coord.close()


if __name__ == "__main__":
    main()
