"""Spark as data engineers use it: no registration, streams, writes.

Against the shared cluster (a coordinator process and agents over a moto S3 server):
Spark is given the coordinator's URL and nothing else about the store, records are
produced and read back through the agents' REST API, and the run's one SparkSession
(``spark`` in conftest) does the reading and writing; the no-registration test starts
its own session in a fresh process, on lakelog installed from its wheel.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from coordinator.http.client import http_coordinator
from segments.partitioning import partition_for_key
from segments.store import open_store
from tests.integration.conftest import Cluster
from tests.integration.test_consumer_api import BINARY, create_topic, request
from tests.integration.test_spark import Row, rest_view

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PAD = b"x" * 1000


def produce(
    cluster: Cluster,
    topic: str,
    records: list[dict[str, Any]],
    partition: int | None = None,
) -> list[tuple[int, int]]:
    """REST v2 binary produce (keys, values, headers given as bytes); (partition, offset)s."""

    def b64(v: bytes | None) -> str | None:
        return None if v is None else base64.b64encode(v).decode()

    body = {
        "records": [
            {
                "key": b64(r.get("key")),
                "value": b64(r["value"]),
                **(
                    {"headers": [{"key": k, "value": b64(v)} for k, v in r["headers"]]}
                    if r.get("headers")
                    else {}
                ),
            }
            for r in records
        ]
    }
    path = f"/topics/{topic}" + ("" if partition is None else f"/partitions/{partition}")
    r = request("POST", cluster.agents[0] + path, body, content_type=BINARY)
    assert r.status_code == 200, r.text
    return [(o["partition"], o["offset"]) for o in r.json()["offsets"]]


def as_json(offsets: str | dict[str, Any]) -> str:
    """Offsets from a query's progress (a JSON string or already parsed) as JSON text."""
    return offsets if isinstance(offsets, str) else json.dumps(offsets)


def lakelog(spark: Any, cluster: Cluster, topic: str, **options: str) -> Any:
    """A batch read through the coordinator only."""
    return (
        spark.read.format("lakelog")
        .options(coordinator=cluster.coordinator_url, subscribe=topic, **options)
        .load()
    )


def read_stream(spark: Any, cluster: Cluster, topic: str, **options: str) -> Any:
    """A stream from the earliest offsets, through the coordinator only."""
    return (
        spark.readStream.format("lakelog")
        .options(coordinator=cluster.coordinator_url, subscribe=topic)
        .options(startingOffsets="earliest", **options)
        .load()
    )


def rows_of(df: Any) -> list[Row]:
    """Rows as the REST view's tuples, sorted by (topic, partition, offset)."""
    out = []
    for r in df.collect():
        headers = tuple((h.key, h.value and bytes(h.value)) for h in r.headers or [])
        out.append(
            (
                r.topic,
                r.partition,
                r.offset,
                r.key and bytes(r.key),
                r.value and bytes(r.value),
                int(r.timestamp.timestamp() * 1000),
                headers,
            )
        )
    return sorted(out, key=lambda x: (x[0], x[1], x[2]))


@pytest.fixture
def topic_of(lakelog_cluster: Cluster) -> Callable[[int], str]:
    def make(partitions: int) -> str:
        return create_topic(lakelog_cluster, f"sw-{uuid.uuid4().hex[:10]}", partitions)

    return make


# --- no registration -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lakelog as ``pip install`` puts it: its wheel, installed (without deps) into a dir."""
    tmp = tmp_path_factory.mktemp("installed")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    wheel = tmp / "wheel"
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheel), str(ROOT)], check=True)
    (built,) = wheel.glob("lakelog-*.whl")
    site = tmp / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(built)], check=True)
    assert (site / "pyspark_lakelog.py").is_file()
    return site


def python_with_only(packages: Path, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """A command and environment running this venv's Python with ``packages`` as the only
    copy of lakelog on the path, Spark's Python workers included. The venv's own editable
    install of this checkout (a ``.pth`` file; ``make install``'s compat mode) is left out:
    ``-S`` skips the ``site`` module that would read it, and the venv's site-packages come
    back through ``PYTHONPATH``, where no ``.pth`` file is read."""
    site = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    worker = tmp_path / "python"
    worker.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    worker.chmod(0o755)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(packages), *site]),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": str(worker),
    }
    return [sys.executable, "-S"], env


def run_job(
    source: str, packages: Path, tmp_path: Path, args: list[str], timeout: float
) -> tuple[Any, str]:
    """``source`` run as a script in ``tmp_path`` by ``python_with_only(packages)`` with
    ``args``, which must succeed: the JSON of its last line out, and its error output."""
    script = tmp_path / "job.py"
    script.write_text(source)
    python, env = python_with_only(packages, tmp_path)
    proc = subprocess.run(
        [*python, str(script), *args],
        cwd=tmp_path,  # nothing of this tree on the path but ``packages``
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


FRESH_SESSION = """
import json, sys
from pyspark.sql import SparkSession

session = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
session.sparkContext.setLogLevel("ERROR")
options = {"coordinator": sys.argv[1], "subscribe": sys.argv[2]}
df = session.read.format("lakelog").options(**options).load()
filtered = df.where("partition = 1 AND offset >= 3").select("partition", "offset", "value")
result = {
    "schema": df.schema.simpleString(),
    "pushdown": session.conf.get("spark.sql.python.filterPushdown.enabled"),
    "count": df.count(),
    "rows": [[r.partition, r.offset, bytes(r.value).decode()] for r in filtered.collect()],
}
# Then register(), twice, with Spark's warnings shown: Spark found the source by itself,
# so neither call replaces it.
session.sparkContext.setLogLevel("WARN")
import spark as lakelog_spark
result["registered"] = [lakelog_spark.register(session), lakelog_spark.register(session)]
result["count_after"] = session.read.format("lakelog").options(**options).load().count()
print(json.dumps(result))
"""


def test_a_fresh_session_needs_no_registration(
    installed: Path, lakelog_cluster: Cluster, topic_of: Callable[[int], str], tmp_path: Path
) -> None:
    """A new process with lakelog installed: a fresh SparkSession reads a topic with only
    ``coordinator`` and ``subscribe``, no register() call and no store option (Spark's
    lookup of ``pyspark_*`` modules finds the source; the coordinator tells the bucket).
    Filter pushdown is off there, as in any new session: filters still give the right rows.
    ``spark.register(session)`` afterwards leaves the source Spark found alone (twice: no
    "replaced a statically registered" warning), and it still reads. (One process for both:
    each Spark start here costs tens of seconds of the suite.)
    """
    topic = topic_of(2)
    for p in range(2):
        produce(lakelog_cluster, topic, [{"value": f"{p}-{i}".encode()} for i in range(8)], p)
    args = [lakelog_cluster.coordinator_url, topic]
    result, stderr = run_job(FRESH_SESSION, installed, tmp_path, args, timeout=240)
    assert result["pushdown"] == "false"
    assert result["schema"].startswith("struct<key:binary,value:binary,topic:string,")
    assert result["count"] == 16
    assert result["rows"] == [[1, i, f"1-{i}"] for i in range(3, 8)]
    assert result["registered"] == [False, False]
    assert result["count_after"] == 16
    assert "registered data source" not in stderr, stderr[-4000:]


REGISTER_TWICE = """
import json, sys
from pyspark.sql import SparkSession
import spark as lakelog_spark

session = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
registered = [lakelog_spark.register(session), lakelog_spark.register(session)]
options = {"coordinator": sys.argv[1], "subscribe": sys.argv[2]}
df = session.read.format("lakelog").options(**options).load()
print(json.dumps({"registered": registered, "count": df.count()}))
"""


def test_register_registers_a_source_spark_did_not_find_once(
    installed: Path,
    lakelog_cluster: Cluster,
    topic_of: Callable[[int], str],
    tmp_path: Path,
) -> None:
    """``spark.register(session)`` registers a source Spark did not find exactly once: the
    second call does not make Spark warn that a data source "previously registered" was
    replaced, and the source reads. Not found: the packages on the path without the
    top-level ``pyspark_lakelog`` module Spark's lookup looks for. (A source Spark found by
    itself: ``test_a_fresh_session_needs_no_registration``.)"""
    topic = topic_of(1)
    produce(lakelog_cluster, topic, [{"value": b"%d" % i} for i in range(5)], 0)
    path = tmp_path / "packages"
    path.mkdir()
    for package in ("service", "spark", "segments", "index", "coordinator"):
        (path / package).symlink_to(installed / package)
    args = [lakelog_cluster.coordinator_url, topic]
    result, stderr = run_job(REGISTER_TWICE, path, tmp_path, args, timeout=600)
    assert result == {"registered": [True, False], "count": 5}
    assert "registered data source" not in stderr, stderr[-4000:]


# --- streams ---------------------------------------------------------------------------


def test_micro_batches_are_batch_reads_of_their_offsets(
    spark: Any, lakelog_cluster: Cluster, topic_of: Callable[[int], str], tmp_path: Path
) -> None:
    """Trigger.AvailableNow with maxOffsetsPerTrigger: several micro-batches, each at most
    the limit, each exactly what a batch read of its start and end offsets returns, all
    of them together every record once; headers with includeHeaders."""
    topic = topic_of(3)
    for p in range(3):
        produce(
            lakelog_cluster,
            topic,
            [
                {"key": b"k%d" % i, "value": b"%d-%d" % (p, i), "headers": [("h", b"%d" % i)]}
                for i in range(150 + 50 * p)
            ],
            p,
        )
    batches: dict[int, list[Row]] = {}

    def sink(df: Any, batch_id: int) -> None:
        batches[batch_id] = rows_of(df)

    stream = read_stream(
        spark, lakelog_cluster, topic, maxOffsetsPerTrigger="250", includeHeaders="true"
    )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    assert query.exception() is None
    progress = {p["batchId"]: p["sources"][0] for p in query.recentProgress if p["numInputRows"]}
    assert len(batches) == 3 and set(progress) == set(batches), progress
    everything = []
    for batch_id, rows in sorted(batches.items()):
        assert 0 < len(rows) <= 250
        # Offsets as the checkpoint holds them (the first batch starts at "earliest").
        start, end = progress[batch_id]["startOffset"], progress[batch_id]["endOffset"]
        again = lakelog(
            spark,
            lakelog_cluster,
            topic,
            includeHeaders="true",
            startingOffsets="earliest" if start in (None, "null") else as_json(start),
            endingOffsets=as_json(end),
        )
        assert rows == rows_of(again), batch_id
        everything += rows
    assert sorted(everything) == rest_view(lakelog_cluster.agents, topic, 3, 600)


def test_stream_stopped_and_restarted_reads_every_record_once(
    spark: Any, lakelog_cluster: Cluster, topic_of: Callable[[int], str], tmp_path: Path
) -> None:
    """Race: producers keep writing over REST while a query (file sink, checkpoint) runs,
    is stopped, restarted from its checkpoint, stopped again, and drained with
    Trigger.AvailableNow once the producers stop.

    Expected: the sink holds every produced record exactly once: per partition the
    offsets 0..n-1 without a gap or a repeat, each with the value produced there.
    """
    topic = topic_of(3)
    produced: dict[tuple[int, int], bytes] = {}
    stop = threading.Event()

    def keep_producing() -> None:
        i = 0
        while not stop.is_set():
            values = [f"r{i + j}".encode() for j in range(60)]
            placed = produce(lakelog_cluster, topic, [{"value": v} for v in values], i % 3)
            produced.update(zip(placed, values, strict=True))
            i += 60
            time.sleep(0.1)  # a steady trickle: the drain reads it all, 400 a batch

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(**trigger: Any) -> Any:
        stream = read_stream(spark, lakelog_cluster, topic, maxOffsetsPerTrigger="400")
        stream = stream.selectExpr("partition", "offset", "value")
        return (
            stream.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    def run_a_while(batches: int) -> None:
        query = start(processingTime="300 milliseconds")
        deadline = time.monotonic() + 90
        try:
            while sum(1 for p in query.recentProgress if p["numInputRows"]) < batches:
                assert query.exception() is None and time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            query.stop()

    producer = threading.Thread(target=keep_producing)
    producer.start()
    try:
        run_a_while(2)
        run_a_while(2)  # from the checkpoint, producers still writing
    finally:
        stop.set()
        producer.join()
    drain = start(availableNow=True)
    assert drain.awaitTermination(180)
    assert drain.exception() is None

    got: dict[tuple[int, int], bytes] = {}
    for r in spark.read.parquet(str(out)).collect():
        assert (r.partition, r.offset) not in got, (r.partition, r.offset)
        got[(r.partition, r.offset)] = bytes(r.value)
    assert got == produced
    for p in range(3):
        offsets = sorted(o for q, o in got if q == p)
        assert offsets == list(range(len(offsets)))
    assert len(got) >= 4 * 400


# --- writes ------------------------------------------------------------------------------


def test_write_then_read_back_over_rest(
    spark: Any, lakelog_cluster: Cluster, topic_of: Callable[[int], str]
) -> None:
    """df.write.format("lakelog") with the Kafka sink's columns, several tasks and several
    objects per task: read back over REST, each row once, offsets contiguous from 0 in
    every partition, keyed rows where murmur2 puts them, explicit partitions kept,
    headers kept; a second write (topic column) continues the offsets."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        StringType,
        StructField,
        StructType,
    )

    topic = topic_of(4)
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType(
        [
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("partition", IntegerType()),
            StructField("headers", ArrayType(header)),
        ]
    )
    data = [
        (
            None if i % 5 == 0 else f"user-{i % 37}",
            b"v%05d" % i,
            i % 4 if i % 11 == 0 else None,
            [("i", b"%d" % i)] if i % 3 == 0 else None,
        )
        for i in range(3000)
    ]
    df = spark.createDataFrame(data, schema).repartition(3)
    (
        df.write.format("lakelog")
        .option("coordinator", lakelog_cluster.coordinator_url)
        .option("topic", topic)
        .option("maxBytesPerObject", "16384")
        .mode("append")
        .save()
    )
    second = spark.createDataFrame(
        [(topic, b"w%05d" % i) for i in range(500)], "topic string, value binary"
    )
    second.write.format("lakelog").option("coordinator", lakelog_cluster.coordinator_url).mode(
        "append"
    ).save()

    rows = rest_view(lakelog_cluster.agents, topic, 4, 3500)
    by_value = {r[4]: r for r in rows}
    assert len(by_value) == 3500  # each row once
    for p in range(4):
        assert [r[2] for r in rows if r[1] == p] == list(range(sum(1 for r in rows if r[1] == p)))
    for key, value, partition, headers in data:
        row = by_value[value]
        if partition is not None:
            assert row[1] == partition
        elif key is not None:
            assert row[1] == partition_for_key(key.encode(), 4)
        assert row[3] == (None if key is None else key.encode())
        assert row[6] == (tuple(headers) if headers else ())
    # The second write came after the first: its rows follow in every partition.
    for p in range(4):
        values = [r[4] for r in rows if r[1] == p]
        firsts = [i for i, v in enumerate(values) if v.startswith(b"w")]
        assert firsts == list(range(len(values) - len(firsts), len(values)))


def test_a_killed_write_task_leaves_nothing_visible_twice(
    spark: Any, lakelog_cluster: Cluster, topic_of: Callable[[int], str]
) -> None:
    """Race: the first attempt of one write task dies mid-write (the Python worker of its
    value UDF exits at row 800); the attempt's writer has uploaded the rows it was given
    (checked below: the kill was mid-write); Spark retries the task, the retry writes it
    all.

    Expected: every row visible exactly once over REST; the killed attempt's objects
    are in the bucket but were never committed (orphans, for garbage collection).

    (The UDF exits at once: its rows reach the writer only in whole batches, so a UDF
    that waited for the attempt's first upload waited in vain until its deadline.)
    """
    topic = topic_of(2)
    store = open_store(lakelog_cluster.store_url, endpoint_url=lakelog_cluster.store_endpoint)
    before = {o.key for o in store.list("segments/")}

    from pyspark.sql import functions as F

    @F.udf("binary", useArrow=False)  # type: ignore[misc]
    def value(i: int) -> bytes:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context.partitionId() == 0 and context.attemptNumber() == 0 and i == 800:
            os._exit(1)
        # 1 KiB values: the JVM's 64 KiB socket buffers pass rows on to the writer.
        return b"v%06d" % i + PAD

    # Small Arrow batches into the writer, small objects: it uploads as rows arrive.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        df = spark.range(0, 2000, 1, 2).select(
            F.col("id").cast("string").cast("binary").alias("key"), value("id").alias("value")
        )
        (
            df.write.format("lakelog")
            .option("coordinator", lakelog_cluster.coordinator_url)
            .option("topic", topic)
            .option("maxBytesPerObject", str(64 << 10))
            .mode("append")
            .save()
        )
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    got = rest_view(lakelog_cluster.agents, topic, 2, 2000)
    assert sorted(r[4] for r in got) == [b"v%06d" % i + PAD for i in range(2000)]
    new = {o.key for o in store.list("segments/")} - before
    with http_coordinator(lakelog_cluster.coordinator_url) as coordinator:
        committed = coordinator.committed_object_keys(sorted(new))
    assert new - committed, "the killed attempt uploaded nothing: the test did not kill mid-write"


def test_write_stream_copies_a_topic(
    spark: Any, lakelog_cluster: Cluster, topic_of: Callable[[int], str], tmp_path: Path
) -> None:
    """readStream of one topic into writeStream of another (key and value, the topic
    option): the copy holds every record once, keyed records placed by murmur2."""
    source, target = topic_of(2), topic_of(3)
    for p in range(2):
        produce(
            lakelog_cluster,
            source,
            [{"key": b"k%d" % (i % 17), "value": b"%d-%d" % (p, i)} for i in range(300)],
            p,
        )
    query = (
        read_stream(spark, lakelog_cluster, source, maxOffsetsPerTrigger="250")
        .select("key", "value")
        .writeStream.format("lakelog")
        .option("coordinator", lakelog_cluster.coordinator_url)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    assert query.exception() is None
    copied = rest_view(lakelog_cluster.agents, target, 3, 600)
    assert sorted(r[4] for r in copied) == sorted(
        b"%d-%d" % (p, i) for p in range(2) for i in range(300)
    )
    for r in copied:
        assert r[1] == partition_for_key(r[3], 3)
    orjson.dumps(copied[0][4].decode())  # values are the source's bytes, not re-encoded


def test_write_stream_rerun_of_a_recorded_batch_writes_nothing_twice(
    spark: Any, lakelog_cluster: Cluster, topic_of: Callable[[int], str], tmp_path: Path
) -> None:
    """A copy query (checkpointLocation as an option: the sink's identity) runs to the
    end; then its last micro-batch's entry in the checkpoint's commit log is removed, as
    when the driver dies after the sink committed and before Spark recorded it. The
    restarted query runs that micro-batch again: the copy still holds every record
    once (the sink finds the batch's key stored and commits nothing)."""
    source, target = topic_of(2), topic_of(2)
    for p in range(2):
        produce(lakelog_cluster, source, [{"value": b"%d-%d" % (p, i)} for i in range(200)], p)
    checkpoint = tmp_path / "checkpoint"

    def run() -> int:
        query = (
            read_stream(spark, lakelog_cluster, source, maxOffsetsPerTrigger="150")
            .select("value")
            .writeStream.format("lakelog")
            .option("coordinator", lakelog_cluster.coordinator_url)
            .option("topic", target)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180)
        assert query.exception() is None
        return sum(p["numInputRows"] for p in query.recentProgress)

    assert run() == 400
    expected = sorted(b"%d-%d" % (p, i) for p in range(2) for i in range(200))
    assert sorted(r[4] for r in rest_view(lakelog_cluster.agents, target, 2, 400)) == expected
    log = checkpoint / "commits"
    batches = sorted(int(f.name) for f in log.iterdir() if f.name.isdigit())
    assert len(batches) >= 2, batches  # several micro-batches
    (log / str(batches[-1])).unlink()  # Spark will run the last one again
    (log / f".{batches[-1]}.crc").unlink(missing_ok=True)
    assert run() > 0  # the last micro-batch ran again, its rows written again
    assert sorted(r[4] for r in rest_view(lakelog_cluster.agents, target, 2, 400)) == expected
    with http_coordinator(lakelog_cluster.coordinator_url) as coordinator:
        assert sum(coordinator.offsets(target, p).high_watermark for p in range(2)) == 400


def test_writes_that_cannot_be_done_say_why(
    spark: Any, lakelog_cluster: Cluster, topic_of: Callable[[int], str]
) -> None:
    """Overwrite, a column the Kafka sink does not have, an unknown topic: refused when the
    write is planned, with the reason, and nothing written."""
    topic = topic_of(1)
    url = lakelog_cluster.coordinator_url
    df = spark.createDataFrame([("k", "v", 3)], "key string, value string, offset bigint")
    cases = [
        (df.select("key", "value").write.mode("overwrite"), topic, "append-only"),
        (df.write.mode("append"), topic, "'offset' is not one of the Kafka sink's columns"),
        (df.select("value").write.mode("append"), "no-such-topic-x", "does not exist"),
    ]
    for writer, target, message in cases:
        with pytest.raises(Exception, match=message):
            writer.format("lakelog").option("coordinator", url).option("topic", target).save()
    with http_coordinator(url) as coordinator:
        assert coordinator.offsets(topic, 0).high_watermark == 0
