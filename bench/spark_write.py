"""Spark writes (``df.write.format("lakelog")``) against Spark's own floor and REST produce.

local[2], the embedded store (SQLite + file://), one topic of 4 partitions per case.
``--rows`` rows (default 500,000) of a key (``key-<id % 1000>``) and a 200-byte value
are made in the JVM once and cached (so no case pays for making them), then written:

- ``spark_noop``: Spark's ``noop`` sink: what reading the cached rows costs.
- ``arrow_floor``: a Python ``DataSourceArrowWriter`` that only counts its Arrow batches:
  what moving the rows to Python workers costs, the ceiling of any Python sink.
- ``spark_write``: ``format("lakelog")``, key + value (objects from the tasks, commits
  from the driver); ``vs_floor`` is its share of ``arrow_floor``.
- ``spark_write_headers``: the same rows with a ``partition`` column (id % 4) and one
  header each (``h`` = 8 bytes).
- ``task_writer``: ``spark.write.TaskWriter`` alone, in this process, over Arrow batches of
  10,000 rows (Spark's default ``maxRecordsPerBatch``) of the same shape: the Python side's
  own rate, without Spark. ``task_writer_headers``: the same with partition and headers.
- ``rest_produce`` (unless ``--no-rest``): the same records over REST v2 (binary, 500 keyed
  records per request, 8 closed-loop clients) into ``lakelog serve`` on its own file://
  store (``bench/spark_scan.py``'s load), and ``spark_write_vs_rest``.

Every Spark figure is the best of ``--repeat`` runs after a warm-up write. One JSON line
per case: rows/s, MB/s of key + value, load average. Usage:
``python bench/spark_write.py [--rows N] [--repeat R] [--no-rest]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import spark_scan  # noqa: E402
from spark_scan import best_of, generated_columns, progress, rest_produce, start_spark  # noqa: E402

from coordinator.local import LocalCoordinator  # noqa: E402
from index.log import LogWriter  # noqa: E402
from segments.store import open_store  # noqa: E402
from spark.write import TaskWriter  # noqa: E402

PARTITIONS = 4
VALUE_BYTES = 200
KEY_BYTES = 7  # "key-" + up to 3 digits: 6.9 on average, counted as 7


def emit(case: str, rows: int, seconds: float, **extra: Any) -> None:
    figures = {
        "bench": "spark_write",
        "case": case,
        "rows": rows,
        "seconds": round(seconds, 3),
        "rows_per_s": round(rows / seconds, 1),
        "mb_per_s": round(rows * (KEY_BYTES + VALUE_BYTES) / seconds / 1e6, 1),
        "load_avg": round(os.getloadavg()[0], 2),
        **extra,
    }
    print(orjson.dumps(figures).decode(), flush=True)
    progress(f"{case}: {seconds:.3f} s")


def arrow_batches(rows: int, headers: bool) -> Iterator[pa.RecordBatch]:
    noise = os.urandom(1 << 20)
    size = 10_000
    for start in range(0, rows, size):
        ids = range(start, min(start + size, rows))
        cols: dict[str, Any] = {
            "key": [f"key-{i % 1000}" for i in ids],
            "value": [noise[(i * 7919) % 1_000_000 :][:VALUE_BYTES] for i in ids],
        }
        if headers:
            cols["partition"] = pa.array([i % PARTITIONS for i in ids], pa.int32())
            cols["headers"] = [[{"key": "h", "value": b"%08d" % (i % 10**8)}] for i in ids]
        yield pa.RecordBatch.from_pydict(cols)


def task_writer(tmp: Path, coord: LocalCoordinator, rows: int, headers: bool) -> float:
    """Seconds for TaskWriter alone to take ``rows`` rows (batches made beforehand)."""
    batches = list(arrow_batches(rows, headers))
    topic = f"tw{int(headers)}"
    coord.create_topic(topic, PARTITIONS)
    store = open_store(f"file://{tmp / 'data'}")
    started = time.perf_counter()
    w = TaskWriter(LogWriter(store, coord), coord.get_topic, topic, "none", 16 << 20)
    for batch in batches:
        w.add(batch)
    written = w.finish()
    seconds = time.perf_counter() - started
    assert written.records == rows, written.records
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-rest", action="store_true")
    args = ap.parse_args()
    n = args.rows // PARTITIONS * PARTITIONS
    tmp, db, coord, store = spark_scan.embedded("lakelog-spark-write-")

    emit("task_writer", n, task_writer(tmp, coord, n, headers=False))
    emit("task_writer_headers", n, task_writer(tmp, coord, n, headers=True))

    from pyspark.sql import functions as F
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class CountMessage(WriterCommitMessage):
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class CountWriter(DataSourceArrowWriter):
        def write(self, iterator: Iterator[pa.RecordBatch]) -> CountMessage:
            return CountMessage(sum(b.num_rows for b in iterator))

    class CountSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "benchcount"

        def writer(self, schema: Any, overwrite: bool) -> CountWriter:
            return CountWriter()

    session = start_spark()
    session.dataSource.register(CountSource)
    options = {"db": db, "store": store.url}
    rows = session.range(0, n, 1, 4).select(F.col("id"), *generated_columns()).cache()
    assert rows.count() == n
    plain = rows.select("key", "value")
    with_headers = rows.select(
        "key",
        "value",
        (F.col("id") % PARTITIONS).cast("int").alias("partition"),
        F.array(F.struct(F.lit("h").alias("key"), F.substring("value", 1, 8).alias("value"))).alias(
            "headers"
        ),
    )

    def noop() -> None:
        plain.write.format("noop").mode("overwrite").save()

    noop()
    emit("spark_noop", n, best_of(args.repeat, noop))

    def floor() -> None:
        plain.write.format("benchcount").mode("append").save()

    floor()
    floor_s = best_of(args.repeat, floor)
    emit("arrow_floor", n, floor_s)

    counter = iter(range(1_000_000))

    def write(df: Any) -> None:
        topic = f"w{next(counter)}"
        coord.create_topic(topic, PARTITIONS)
        df.write.format("lakelog").options(**options, topic=topic).mode("append").save()
        written = sum(coord.offsets(topic, p).high_watermark for p in range(PARTITIONS))
        assert written == n, written

    write(plain)  # warm-up
    write_s = best_of(args.repeat, lambda: write(plain))
    headers_s = best_of(args.repeat, lambda: write(with_headers))
    session.stop()
    emit("spark_write", n, write_s, vs_floor=round(floor_s / write_s, 3))
    emit("spark_write_headers", n, headers_s, vs_floor=round(floor_s / headers_s, 3))
    if not args.no_rest:
        progress(f"REST produce of {n:,} records into lakelog serve")
        try:
            rest_s = rest_produce(tmp, n)
        except Exception as e:  # a loaded machine may not start the server in time
            print(
                orjson.dumps(
                    {"bench": "spark_write", "case": "rest_produce", "skipped": repr(e)}
                ).decode()
            )
        else:
            emit("rest_produce", n, rest_s, spark_write_vs_rest=round(rest_s / write_s, 3))
    coord.close()


if __name__ == "__main__":
    main()
