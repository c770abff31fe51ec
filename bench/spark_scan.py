"""The ``lakelog`` Spark data source at realistic size (local[2], file:// store).

Writes ``--records`` records (default 2,000,000: 200 random bytes each, 4 partitions, in
segment objects of 10,000 records per partition) twice: topic ``tiered``, then tiered
by the real tiering janitor (its defaults: 64 MiB tier objects, 32 MiB row groups), and
topic ``untiered``. One JSON line per figure (progress on stderr); every Spark figure is
the best of ``--repeat`` runs of a whole query (``load()`` to result, planning
included), after a warm-up query:

- ``pyarrow_direct``: pyarrow reading the tier objects straight from their files
  (``pq.read_table``, all columns, decoded only): the floor.
- ``spark_tiered``: ``spark.read.format("lakelog")`` over ``tiered``, all columns into
  the JVM and aggregated there.
- ``spark_parquet_native``: Spark's own Parquet reader on the same tier files, the same
  aggregate; ``lakelog_vs_native`` (> 1: the lakelog source is faster) is the issue's
  target (>= 1.0: we hold the index, Spark lists the files and reads their footers).
- ``spark_tiered_columns``: the same with a user schema of the four columns the
  aggregate uses (Spark's reader decodes only those; a Python source is told only
  through a schema).
- ``spark_fixed``: the same query reading 4 records: Spark's per-query cost.
- ``spark_untiered``: the same records as segment chunks (Kafka record batches decoded
  in the Python workers).
- ``spark_stream``: ``readStream`` over ``tiered`` with ``Trigger.AvailableNow`` and
  ``maxOffsetsPerTrigger`` a quarter of the records, into Spark's ``noop`` sink.
- ``spark_write`` vs ``rest_produce``: ``--write-records`` records of the same size
  written by ``df.write.format("lakelog")`` (objects from the tasks, commits from the
  driver) and produced over REST v2 (binary, 500 keyed records per request, 8
  closed-loop clients) into ``lakelog serve`` on its own file:// store: records/s each
  and ``vs_rest``.

MB/s counts key + value bytes. Usage: ``python bench/spark_scan.py [--records N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from produce import RawConn, v2_raw_ok  # noqa: E402

from coordinator.janitors.catalog import Catalog  # noqa: E402
from coordinator.janitors.context import JanitorConfig, JanitorContext  # noqa: E402
from coordinator.janitors.runner import run_janitor  # noqa: E402
from coordinator.local import LocalCoordinator  # noqa: E402
from index.log import LogWriter  # noqa: E402
from segments.segment import SegmentBuilder  # noqa: E402
from segments.store import ObjectStore, open_store  # noqa: E402
from segments.types import Record  # noqa: E402
from tests import procs  # noqa: E402
from tests.procs import Proc, free_port, wait_http  # noqa: E402

PARTITIONS = 4
VALUE_BYTES = 200
PER_OBJECT = 10_000  # records per partition per segment object
NOISE = os.urandom(1 << 22)  # values are slices of this: incompressible, cheap to make


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def value_of(i: int) -> bytes:
    at = (i * 7919) % (len(NOISE) - VALUE_BYTES)
    return NOISE[at : at + VALUE_BYTES]


def key_of(i: int) -> bytes:
    return b"key-%d" % (i % 1000)


def produce(store: ObjectStore, coord: LocalCoordinator, topic: str, records: int) -> int:
    """``records`` records over the partitions, PER_OBJECT per partition per object."""
    topic_id = coord.create_topic(topic, PARTITIONS).topic_id
    writer = LogWriter(store, coord)
    per_partition = records // PARTITIONS
    payload = 0
    for start in range(0, per_partition, PER_OBJECT):
        builder = SegmentBuilder(compression="zstd")
        for p in range(PARTITIONS):
            batch = []
            for i in range(start, min(start + PER_OBJECT, per_partition)):
                n = i * PARTITIONS + p
                key, value = key_of(n), value_of(n)
                payload += len(key) + len(value)
                batch.append(Record(key, value, 1_700_000_000_000 + n))
            builder.append(topic_id, p, batch)
        writer.write(builder)
        if start % (PER_OBJECT * 10) == 0:
            progress(f"  {topic}: {start * PARTITIONS:,} records written")
    return payload


def spark_agg(df: Any) -> tuple[int, int]:
    """The bench's aggregate over all columns: (rows, key + value bytes)."""
    from pyspark.sql import functions as F

    row = df.agg(
        F.count("*").alias("n"),
        F.sum(F.length("key") + F.length("value")).alias("b"),
        F.max("offset"),
        F.count("timestamp"),
    ).collect()[0]
    return int(row.n), int(row.b or 0)


def generated_columns() -> list[Any]:
    """The key and value columns the JVM makes from ``id``: ``key-<id % 1000>`` and 200
    bytes (three SHA-512s and 8 bytes of a SHA-256)."""
    from pyspark.sql import functions as F

    return [
        F.concat(F.lit("key-"), (F.col("id") % 1000).cast("string")).alias("key"),
        F.concat(
            *(
                F.unhex(F.sha2(F.concat(F.lit(str(s)), F.col("id").cast("string")), 512))
                for s in range(3)
            ),
            F.substring(F.unhex(F.sha2(F.col("id").cast("string"), 256)), 1, 8),
        ).alias("value"),
    ]


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
        "bench": extra.pop("bench", "spark_scan"),
        "case": case,
        "rows": rows,
        "seconds": round(seconds, 3),
        "rows_per_s": round(rows / seconds, 1),
        "mb_per_s": round(payload / seconds / 1e6, 1),
        "load_avg": round(os.getloadavg()[0], 2),
        **extra,
    }
    print(orjson.dumps(figures).decode(), flush=True)
    progress(f"{case}: {seconds:.3f} s")


def rest_produce(tmp: Path, records: int) -> float:
    """Seconds for ``lakelog serve`` to ack ``records`` records sent over REST v2."""
    port = free_port()
    home = tmp / "serve"
    home.mkdir()
    base = f"http://127.0.0.1:{port}"
    proc = Proc(
        [
            *(sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1"),
            *("--port", str(port), "--log-level", "warning", "--janitors", "none"),
            *("--coordinator-port", "0"),
        ],
        home / "serve.log",
        env={"PYTHONPATH": str(ROOT)},
        cwd=home,
    )
    try:
        wait_http(f"{base}/health", timeout=90.0, proc=proc.popen)
        cluster = httpx.get(f"{base}/v3/clusters").json()["data"][0]["cluster_id"]
        httpx.post(
            f"{base}/v3/clusters/{cluster}/topics",
            json={"topic_name": "rest", "partitions_count": PARTITIONS},
        ).raise_for_status()
        per_request, clients = 500, 8
        bodies = [
            orjson.dumps(
                {
                    "records": [
                        {
                            "key": base64.b64encode(key_of(n)).decode(),
                            "value": base64.b64encode(value_of(n)).decode(),
                        }
                        for n in range(b * per_request, (b + 1) * per_request)
                    ]
                }
            )
            for b in range(16)
        ]
        requests = records // per_request

        async def load() -> float:
            conns = [await RawConn.open(base) for _ in range(clients)]
            host = base.removeprefix("http://")
            sent = 0

            async def client(conn: RawConn) -> None:
                nonlocal sent
                while sent < requests:
                    body = bodies[sent % len(bodies)]
                    sent += 1
                    status, answer = await conn.post(
                        host, "/topics/rest", body, "application/vnd.kafka.binary.v2+json"
                    )
                    assert v2_raw_ok(status, answer), answer[:200]

            started = time.perf_counter()
            await asyncio.gather(*(client(c) for c in conns))
            seconds = time.perf_counter() - started
            for c in conns:
                c.close()
            return seconds

        return asyncio.run(load())
    finally:
        proc.stop()


def start_spark() -> Any:
    """A local[2] SparkSession (2 GiB driver) with the lakelog source registered (this
    checkout's: an editable install is not listed)."""
    progress("starting Spark local[2]")
    return procs.start_spark({"spark.driver.memory": "2g"})


def embedded(prefix: str) -> tuple[Path, str, LocalCoordinator, ObjectStore]:
    """Spark's environment, and a coordinator and store (SQLite + file://) in a new
    directory named ``prefix...``: (directory, database URL, coordinator, store)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    db = f"sqlite:///{tmp / 'meta.db'}"
    return tmp, db, LocalCoordinator(db), open_store(f"file://{tmp / 'data'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=2_000_000, help="records per topic")
    ap.add_argument("--write-records", type=int, default=1_000_000, help="records written")
    ap.add_argument("--repeat", type=int, default=2, help="best of this many runs")
    args = ap.parse_args()
    tmp, db, coord, store = embedded("lakelog-spark-bench-")
    total = args.records // PARTITIONS * PARTITIONS
    progress(f"writing {total:,} records twice under {tmp}")
    payload = produce(store, coord, "tiered", total)
    produce(store, coord, "untiered", total)
    progress("tiering 'tiered' with the tiering janitor")
    started = time.perf_counter()
    ctx = JanitorContext(Catalog(coord.db), coord.store, store)
    report = run_janitor("tier", ctx, JanitorConfig(tier_age_s=0), "tiered")
    keys = [o.key for o in store.list("tiered/tiered/")]
    row_groups = sum(pq.ParquetFile(tmp / "data" / k).num_row_groups for k in keys)
    emit(
        "tiering",
        total,
        payload,
        time.perf_counter() - started,
        tier_objects=report.objects_written,
        row_groups=row_groups,
    )

    def direct() -> None:
        assert sum(pq.read_table(tmp / "data" / k).num_rows for k in keys) == total

    pyarrow_s = best_of(args.repeat, direct)
    emit("pyarrow_direct", total, payload, pyarrow_s)

    session = start_spark()
    options = {"db": db, "store": store.url}

    def lakelog(topic: str, **extra: str) -> Any:
        return session.read.format("lakelog").options(**options, subscribe=topic, **extra).load()

    def scan(topic: str) -> None:
        assert spark_agg(lakelog(topic)) == (total, payload)

    first = orjson.dumps({"tiered": {str(p): 1 for p in range(PARTITIONS)}}).decode()
    scan("tiered")  # warm-up: workers started, modules imported
    fixed_s = best_of(args.repeat, lambda: spark_agg(lakelog("tiered", endingOffsets=first)))
    tiered_s = best_of(args.repeat, lambda: scan("tiered"))
    tasks = lakelog("tiered").rdd.getNumPartitions()
    emit(
        "spark_tiered",
        total,
        payload,
        tiered_s,
        tasks=tasks,
        vs_pyarrow=round(pyarrow_s / tiered_s, 3),
    )
    # Spark prunes the columns its own reader decodes; a Python source cannot see which
    # the query needs, but a user schema names them: the like-for-like case.
    columns = "key binary, value binary, offset bigint, timestamp timestamp"

    def scan_columns() -> None:
        df = session.read.format("lakelog").schema(columns)
        df = df.options(**options, subscribe="tiered").load()
        assert spark_agg(df) == (total, payload)

    columns_s = best_of(args.repeat, scan_columns)
    parquet_dir = f"file://{tmp / 'data' / 'tiered' / 'tiered'}"

    def native() -> None:
        df = session.read.option("recursiveFileLookup", "true").parquet(parquet_dir)
        assert spark_agg(df) == (total, payload)

    native()  # warm-up
    native_s = best_of(args.repeat, native)
    emit(
        "spark_parquet_native",
        total,
        payload,
        native_s,
        vs_pyarrow=round(pyarrow_s / native_s, 3),
        lakelog_vs_native=round(native_s / tiered_s, 3),
    )
    emit(
        "spark_tiered_columns",
        total,
        payload,
        columns_s,
        lakelog_vs_native=round(native_s / columns_s, 3),
    )
    emit("spark_fixed", PARTITIONS, 0, fixed_s)
    untiered_s = best_of(args.repeat, lambda: scan("untiered"))
    emit("spark_untiered", total, payload, untiered_s, vs_tiered=round(tiered_s / untiered_s, 3))

    def stream() -> None:
        checkpoint = tmp / f"checkpoint-{time.monotonic_ns()}"
        query = (
            session.readStream.format("lakelog")
            .options(**options, subscribe="tiered", startingOffsets="earliest")
            .option("maxOffsetsPerTrigger", str(total // 4))
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert sum(p["numInputRows"] for p in query.recentProgress) == total

    stream_s = best_of(args.repeat, stream)
    emit("spark_stream", total, payload, stream_s, micro_batches=4)

    n = args.write_records // PARTITIONS * PARTITIONS
    coord.create_topic("written", PARTITIONS)
    # 200 bytes per value as above (3 x SHA-512 + 8), keys as above: made in the JVM.
    rows = session.range(0, n, 1, 4).select(*generated_columns())
    rows.write.format("noop").mode("overwrite").save()  # warm-up: the rows themselves
    started = time.perf_counter()
    rows.write.format("lakelog").options(**options, topic="written").mode("append").save()
    write_s = time.perf_counter() - started
    written = sum(coord.offsets("written", p).high_watermark for p in range(PARTITIONS))
    assert written == n, written
    write_payload = n * (VALUE_BYTES + 7)
    progress(f"REST produce of {n:,} records into lakelog serve")
    rest_s = rest_produce(tmp, n)
    emit("spark_write", n, write_payload, write_s, vs_rest=round(rest_s / write_s, 3))
    emit("rest_produce", n, write_payload, rest_s)
    session.stop()
    coord.close()


if __name__ == "__main__":
    main()
