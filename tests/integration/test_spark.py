"""The ``lakelog`` Spark data source against real stores, record for record.

The run's one SparkSession (``spark`` in conftest). Two backends: a coordinator process
over a moto S3 server (the shared ``lakelog_cluster``; Spark is given only the
coordinator's URL and learns the bucket from it) and an offline ``file://`` store with a
SQLite coordinator database (the ``db`` and ``store`` options). Records are written
with the storage API (``LogWriter``) and the expected records are what consumers read
through ``LogReader`` (the REST consumer's path) or the REST consumer itself. Tiering is
done by the tiering janitor at realistic sizes (``realistic``), and simulated in the
small tests: tier objects written with ``segments.tier`` (small row groups, so that
pruning shows) and index rows swapped in one SQL transaction, as the janitor does;
retention moves log-start the same way.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from coordinator.client import Coordinator
from coordinator.http.client import http_coordinator
from coordinator.janitors.catalog import Catalog
from coordinator.janitors.context import JanitorConfig, JanitorContext
from coordinator.janitors.runner import run_janitor
from coordinator.local import LocalCoordinator
from index.log import LogReader, LogWriter
from segments.segment import SegmentBuilder
from segments.store import ObjectStore, open_store
from segments.tier import encode_tier, tier_object_key
from segments.types import ConsumedRecord, Record
from tests.integration.conftest import Cluster
from tests.integration.test_consumer_api import Consumer, unb64

pytestmark = [pytest.mark.integration, pytest.mark.slow]

Row = tuple[str, int, int, bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]]
T0 = 1_700_000_000_000


@dataclass
class Env:
    """A store and coordinator to write with, and the options Spark reads them with."""

    name: str
    store: ObjectStore
    coordinator: Coordinator
    db_path: Path
    options: dict[str, str]
    #: Agents to consume from over REST (the s3 cluster's; none offline).
    agents: list[str] = field(default_factory=list)

    def topic(self, partitions: int = 3) -> tuple[str, bytes]:
        name = f"spark-{self.name}-{uuid.uuid4().hex[:8]}"
        return name, self.coordinator.create_topic(name, partitions).topic_id


@pytest.fixture(scope="module", params=["s3", "file"])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if request.param == "s3":
        cluster: Cluster = request.getfixturevalue("lakelog_cluster")
        store = open_store(cluster.store_url, endpoint_url=cluster.store_endpoint)
        coordinator = http_coordinator(cluster.coordinator_url)
        # Only the coordinator: it tells where the bucket is (URL and endpoint).
        options = {"coordinator": cluster.coordinator_url}
        yield Env("s3", store, coordinator, cluster.tmp / "meta.db", options, cluster.agents)
        coordinator.close()
        return
    tmp = tmp_path_factory.mktemp("spark-file")
    db_url = f"sqlite:///{tmp / 'meta.db'}"
    local = LocalCoordinator(db_url)
    store = open_store(f"file://{tmp / 'data'}")
    yield Env("file", store, local, tmp / "meta.db", {"db": db_url, "store": store.url})
    local.close()


def produce(env: Env, topic: str, topic_id: bytes, partitions: int, writes: int, n: int) -> None:
    """``writes`` segment objects, each with ``n`` records for every partition."""
    writer = LogWriter(env.store, env.coordinator)
    for w in range(writes):
        builder = SegmentBuilder(compression="zstd" if w % 2 else "none")
        for p in range(partitions):
            records = []
            for i in range(n):
                seq = (w * n + i) * partitions + p
                key = None if seq % 7 == 0 else f"k{seq % 5}".encode()
                value = None if seq % 11 == 0 else orjson.dumps({"seq": seq, "p": p})
                headers = (("h", f"{seq}".encode()), ("n", None)) if seq % 3 == 0 else ()
                records.append(Record(key, value, T0 + seq * 10, headers))
            builder.append(topic_id, p, records)
        writer.write(builder)


def expected(
    env: Env, topic: str, partition: int, start: int = 0, end: int | None = None
) -> list[Row]:
    """What a consumer reads: LogReader from start up to end (the high watermark)."""
    reader = LogReader(env.store, env.coordinator)
    hw = env.coordinator.offsets(topic, partition).high_watermark if end is None else end
    out: list[ConsumedRecord] = []
    offset = start
    while offset < hw:
        batch = reader.read(topic, partition, offset, max_bytes=1 << 30)
        if not batch:
            break
        out.extend(r for r in batch if offset <= r.offset < hw)
        offset = batch[-1].offset + 1
    return [
        (r.topic, r.partition, r.offset, r.key, r.value, r.timestamp_ms, r.headers) for r in out
    ]


def read(spark: Any, env: Env, where: str | None = None, **options: str) -> list[Row]:
    """Read through Spark; rows as tuples sorted by (topic, partition, offset)."""
    df = spark.read.format("lakelog").options(**env.options, includeHeaders="true", **options)
    df = df.load()
    if where:
        df = df.where(where)
    df = df.selectExpr(
        "topic",
        "partition",
        "offset",
        "key",
        "value",
        "unix_millis(timestamp) AS ts",
        "timestampType",
        "headers",
    )
    rows = []
    for r in df.collect():
        assert r.timestampType == 0
        headers = tuple(
            (h.key, None if h.value is None else bytes(h.value)) for h in r.headers or []
        )
        rows.append(
            (
                r.topic,
                r.partition,
                r.offset,
                None if r.key is None else bytes(r.key),
                None if r.value is None else bytes(r.value),
                r.ts,
                headers,
            )
        )
    return sorted(rows, key=lambda x: (x[0], x[1], x[2]))


def tier(env: Env, topic: str, topic_id: bytes, partition: int, upto: int) -> str:
    """Rewrite the partition's entries ending at or before ``upto`` as one tier object.

    What the tiering janitor does: PUT the Parquet object, then swap the index rows in
    one transaction. Row groups of 40 records so that pruning is visible.
    """
    records = expected(env, topic, partition)
    first = records[0][2]
    rows = [r for r in records if r[2] < upto]
    data = encode_tier(
        topic,
        partition,
        [ConsumedRecord(*r) for r in rows],
        row_group_rows=40,
    )
    key = tier_object_key(topic, partition, first, upto - 1)
    env.store.put(key, data)
    conn = sqlite3.connect(env.db_path, timeout=30)
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            gone = conn.execute(
                "DELETE FROM index_entries WHERE topic_id = ? AND partition = ? "
                "AND base_offset + record_count <= ?",
                (topic_id, partition, upto),
            ).rowcount
            assert gone > 0
            (object_id,) = conn.execute(
                "INSERT INTO objects (object_key, size, committed_at) VALUES (?, ?, ?) "
                "RETURNING object_id",
                (key, len(data), time.time()),
            ).fetchone()
            conn.execute(
                "INSERT INTO index_entries (topic_id, partition, base_offset, record_count, "
                "object_id, position, length, min_ts, max_ts, kind) "
                "VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, 'parquet')",
                (
                    topic_id,
                    partition,
                    first,
                    upto - first,
                    object_id,
                    len(data),
                    min(r[5] for r in rows),
                    max(r[5] for r in rows),
                ),
            )
    finally:
        conn.close()
    return key


def move_log_start(env: Env, topic_id: bytes, partition: int, log_start: int) -> None:
    """Retention: log-start moves on, entries wholly below it go (one transaction)."""
    conn = sqlite3.connect(env.db_path, timeout=30)
    try:
        with conn:
            conn.execute(
                "UPDATE partitions SET log_start_offset = ? WHERE topic_id = ? AND partition = ?",
                (log_start, topic_id, partition),
            )
            conn.execute(
                "DELETE FROM index_entries WHERE topic_id = ? AND partition = ? "
                "AND base_offset + record_count <= ?",
                (topic_id, partition, log_start),
            )
    finally:
        conn.close()


def trace_events(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture(scope="module")
def orders(env: Env) -> tuple[str, bytes]:
    """A topic of 3 partitions x 6 objects x 25 records, untouched by the tests."""
    topic, topic_id = env.topic(3)
    produce(env, topic, topic_id, 3, 6, 25)
    return topic, topic_id


def all_expected(env: Env, topic: str, partitions: int = 3) -> list[Row]:
    return [row for p in range(partitions) for row in expected(env, topic, p)]


# --- record-for-record equality ----------------------------------------------------------


def test_everything_equals_what_consumers_read(spark: Any, env: Env, orders: Any) -> None:
    """A full read is the consumers' records, with Spark's Kafka source schema: headers
    only with includeHeaders=true, as Spark's Kafka source."""
    topic, _ = orders
    kafka = (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int"
    )
    df = spark.read.format("lakelog").options(**env.options, subscribe=topic).load()
    assert df.schema.simpleString() == kafka + ">"
    df = df.sparkSession.read.format("lakelog").options(**env.options, subscribe=topic)
    df = df.option("includeHeaders", "true").load()
    assert df.schema.simpleString() == (kafka + ",headers:array<struct<key:string,value:binary>>>")
    want = all_expected(env, topic)
    assert len(want) == 450
    assert read(spark, env, subscribe=topic, maxBytesPerTask="16384") == want


def test_offset_range(spark: Any, env: Env, orders: Any) -> None:
    """Per-partition JSON offsets (with -2 earliest, -1 latest) read exactly that range."""
    topic, _ = orders
    rows = read(
        spark,
        env,
        subscribe=topic,
        startingOffsets=orjson.dumps({topic: {"0": 30, "1": -2, "2": 149}}).decode(),
        endingOffsets=orjson.dumps({topic: {"0": 77, "1": 3, "2": -1}}).decode(),
    )
    want = expected(env, topic, 0, 30, 77) + expected(env, topic, 1, 0, 3)
    want += expected(env, topic, 2, 149, 150)
    assert rows == want


def test_empty_range_reads_nothing(spark: Any, env: Env, orders: Any) -> None:
    """A plan without tasks (start == end everywhere) is an empty result, not a task error.

    Spark runs one placeholder task with ``InputPartition(None)`` when the reader plans
    none; reading it used to fail an assertion.
    """
    topic, _ = orders
    same = orjson.dumps({topic: {"0": 5, "1": 0, "2": 7}}).decode()
    assert read(spark, env, subscribe=topic, startingOffsets=same, endingOffsets=same) == []


def test_timestamp_range(spark: Any, env: Env, orders: Any) -> None:
    """startingTimestamp/endingTimestamp: offsets of the first records at or after each."""
    topic, _ = orders
    start_ts, end_ts = T0 + 1000, T0 + 3005
    rows = read(
        spark, env, subscribe=topic, startingTimestamp=str(start_ts), endingTimestamp=str(end_ts)
    )
    reader = LogReader(env.store, env.coordinator)
    want: list[Row] = []
    for p in range(3):
        lo = reader.offset_for_timestamp(topic, p, start_ts)
        hi = reader.offset_for_timestamp(topic, p, end_ts)
        assert lo is not None and hi is not None and lo < hi
        want += expected(env, topic, p, lo, hi)
    assert rows == want
    assert all(start_ts <= r[5] < end_ts for r in rows)


def test_partly_tiered_and_retention(spark: Any, env: Env, tmp_path: Path) -> None:
    """Parquet rows then segment chunks read as one log; after retention, from log-start."""
    topic, topic_id = env.topic(2)
    produce(env, topic, topic_id, 2, 6, 30)
    before = all_expected(env, topic, 2)
    tier(env, topic, topic_id, 0, 120)  # 4 of 6 chunks of partition 0
    tier(env, topic, topic_id, 1, 60)
    trace = tmp_path / "trace.jsonl"
    assert read(spark, env, subscribe=topic, trace=str(trace)) == before
    tasks = [e for e in trace_events(trace) if e["event"] == "task"]
    assert sum(t["row_groups_read"] for t in tasks) == 3 + 2  # 120/40 + 60/40 rounded up

    # An offset range inside the Parquet object, and one across its end.
    rows = read(
        spark,
        env,
        subscribe=topic,
        startingOffsets=orjson.dumps({topic: {"0": 45, "1": 50}}).decode(),
        endingOffsets=orjson.dumps({topic: {"0": 85, "1": 95}}).decode(),
    )
    assert rows == [
        r for r in before if (r[1] == 0 and 45 <= r[2] < 85) or (r[1] == 1 and 50 <= r[2] < 95)
    ]

    # Retention: partition 0 starts mid-Parquet-object, partition 1 mid-chunk.
    move_log_start(env, topic_id, 0, 100)
    move_log_start(env, topic_id, 1, 75)
    rows = read(spark, env, subscribe=topic)
    assert rows == expected(env, topic, 0, 100) + expected(env, topic, 1, 75)
    assert rows == [r for r in before if r[2] >= (100 if r[1] == 0 else 75)]
    with pytest.raises(Exception, match="before its log-start offset 100"):
        read(
            spark,
            env,
            subscribe=topic,
            startingOffsets=orjson.dumps({topic: {"0": 5, "1": -2}}).decode(),
        )
    relaxed = read(
        spark,
        env,
        subscribe=topic,
        failOnDataLoss="false",
        startingOffsets=orjson.dumps({topic: {"0": 5, "1": -2}}).decode(),
    )
    assert relaxed == rows


def test_several_topics(spark: Any, env: Env, orders: Any) -> None:
    """subscribe with a list and subscribePattern both read every named topic."""
    topic, _ = orders
    other, other_id = env.topic(1)
    produce(env, other, other_id, 1, 2, 10)
    want = sorted(all_expected(env, topic) + expected(env, other, 0))
    assert read(spark, env, subscribe=f"{topic},{other}") == want
    prefix = other.rsplit("-", 1)[0]
    pattern_rows = read(spark, env, subscribePattern=f"{prefix}-.*")
    assert {r[0] for r in pattern_rows} >= {topic, other}
    assert [r for r in pattern_rows if r[0] in (topic, other)] == want


# --- pruning, snapshot, errors -----------------------------------------------------------


def test_filters_prune_objects_and_row_groups(spark: Any, env: Env, tmp_path: Path) -> None:
    """Filters on partition, offset and timestamp open fewer objects and row groups."""
    topic, topic_id = env.topic(2)
    produce(env, topic, topic_id, 2, 6, 40)
    tier(env, topic, topic_id, 0, 200)  # 5 row groups of 40
    everything = all_expected(env, topic, 2)

    def traced(where: str | None) -> tuple[list[Row], list[dict[str, Any]]]:
        trace = tmp_path / f"{uuid.uuid4().hex}.jsonl"
        rows = read(spark, env, where, subscribe=topic, trace=str(trace))
        return rows, [e for e in trace_events(trace) if e["event"] == "task"]

    _, full = traced(None)
    # The tier object and the 6 segment objects (the last holds chunks of both partitions).
    assert sum(t["objects_opened"] for t in full) == 1 + 6
    assert sum(t["row_groups_read"] for t in full) == 5

    rows, tasks = traced("partition = 0 AND offset >= 90 AND offset < 130")
    assert rows == [r for r in everything if r[1] == 0 and 90 <= r[2] < 130]
    assert sum(t["objects_opened"] for t in tasks) == 1
    assert sum(t["row_groups_read"] for t in tasks) == 2  # [80, 120) and [120, 160)

    rows, tasks = traced("partition = 1 AND offset = 239")
    assert rows == [r for r in everything if r[1] == 1 and r[2] == 239]
    assert sum(t["objects_opened"] for t in tasks) == 1

    lo, hi = T0 + 40 * 2 * 10, T0 + 80 * 2 * 10  # partition 0's offsets ~40..80
    rows, tasks = traced(
        f"partition = 0 AND timestamp >= timestamp_millis({lo}) "
        f"AND timestamp < timestamp_millis({hi})"
    )
    assert rows == [r for r in everything if r[1] == 0 and lo <= r[5] < hi]
    assert rows
    assert sum(t["row_groups_read"] for t in tasks) < 5


def test_user_schema_reads_only_those_columns(spark: Any, env: Env, orders: Any) -> None:
    """A schema with a subset of the columns yields exactly those columns."""
    topic, _ = orders
    df = (
        spark.read.format("lakelog")
        .schema("partition int, offset bigint, value binary")
        .options(**env.options, subscribe=topic)
        .load()
        .where("partition = 1")
    )
    got = sorted((r.offset, None if r.value is None else bytes(r.value)) for r in df.collect())
    assert got == [(r[2], r[4]) for r in expected(env, topic, 1)]
    assert df.columns == ["partition", "offset", "value"]


def test_read_never_sees_past_its_snapshot(spark: Any, env: Env, tmp_path: Path) -> None:
    """Race: a producer thread commits objects while Spark plans and reads.

    Expected: every partition yields exactly the offsets [0, high watermark at planning)
    recorded in the plan's trace, although the high watermark has moved on by the end.
    """
    topic, topic_id = env.topic(2)
    produce(env, topic, topic_id, 2, 3, 20)
    stop = threading.Event()

    def keep_producing() -> None:
        while not stop.is_set():
            produce(env, topic, topic_id, 2, 1, 20)

    producer = threading.Thread(target=keep_producing)
    producer.start()
    trace = tmp_path / "trace.jsonl"
    try:
        time.sleep(0.2)
        rows = read(spark, env, subscribe=topic, trace=str(trace), maxBytesPerTask="2048")
        time.sleep(0.3)
    finally:
        stop.set()
        producer.join()
    (plan,) = [e for e in trace_events(trace) if e["event"] == "plan"]
    for p in range(2):
        _log_start, hw = plan["snapshot"][f"{topic}-{p}"]
        offsets = [r[2] for r in rows if r[1] == p]
        assert offsets == list(range(0, hw))
        assert env.coordinator.offsets(topic, p).high_watermark > hw
        assert [r for r in rows if r[1] == p] == expected(env, topic, p, 0, hw)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "no-such-topic-x"}, "unknown topic 'no-such-topic-x'"),
        ({"subscribe": "{t}", "subscribePattern": "x.*"}, "exactly one of the options"),
        ({}, "exactly one of the options"),
        ({"subscribe": "{t}", "startingOffsets": '{"{t}": {"0": 1'}, "cannot parse"),
        ({"subscribe": "{t}", "startingOffsets": '{"{t}": {"9": 1}}'}, "unknown partition"),
        ({"subscribe": "{t}", "startingOffsets": "latest"}, "not allowed for a batch read"),
        ({"subscribe": "{t}", "endingTimestamp": "soon"}, "epoch milliseconds"),
        ({"subscribe": "{t}", "bogus": "1"}, "unknown lakelog option"),
    ],
)
def test_bad_options_fail_at_planning(
    spark: Any, env: Env, orders: Any, options: dict[str, str], message: str
) -> None:
    """Bad options fail with a message naming the problem, when the query is planned."""
    topic, _ = orders
    opts = {k: v.replace("{t}", topic) for k, v in options.items()}
    with pytest.raises(Exception, match=message):
        spark.read.format("lakelog").options(**env.options, **opts).load().collect()


# --- realistic sizes ---------------------------------------------------------------------


@dataclass
class Realistic:
    """A topic as the issue found it: history tiered by the janitor, an untiered tail."""

    topic: str
    partitions: int
    tier_objects: int
    tail_chunks: int
    rows: list[Row]


def rest_view(agents: list[str], topic: str, partitions: int, total: int) -> list[Row]:
    """Every record of the topic as a REST v2 consumer fetches it (binary, from earliest)."""
    consumer = Consumer.create(agents, f"spark-view-{uuid.uuid4().hex[:8]}")
    consumer.assign(topic, *range(partitions))
    r = consumer.call(
        "POST",
        "/positions/beginning",
        {"partitions": [{"topic": topic, "partition": p} for p in range(partitions)]},
    )
    assert r.status_code == 204, r.text
    rows: list[Row] = []
    deadline = time.monotonic() + 120
    while len(rows) < total and time.monotonic() < deadline:
        for rec in consumer.fetch(timeout_ms=1000, max_bytes=16 << 20):
            headers = tuple((h["key"], unb64(h["value"])) for h in rec["headers"] or [])
            rows.append(
                (
                    rec["topic"],
                    rec["partition"],
                    rec["offset"],
                    unb64(rec["key"]),
                    unb64(rec["value"]),
                    rec["timestamp"],
                    headers,
                )
            )
    consumer.delete()
    assert len(rows) == total
    return sorted(rows, key=lambda x: (x[0], x[1], x[2]))


@pytest.fixture(scope="module")
def realistic(env: Env) -> Realistic:
    """4 partitions: 60,000 records of 200 random bytes in 400 chunks, tiered by the real
    janitor into ~1.2 MiB Parquet objects of ~100 KiB row groups (3 per partition, ~12
    row groups each), then an untiered tail of 320 small chunks (8,000 records).

    Small against a real topic, but every limit the planner has is crossed at the task
    size the reads use: objects cut into pieces, hundreds of chunks merged into a task,
    many row groups per object.
    """
    partitions = 4
    topic, topic_id = env.topic(partitions)
    rng = random.Random(11)
    writer = LogWriter(env.store, env.coordinator)

    def write(objects: int, per_partition: int) -> None:
        for _ in range(objects):
            builder = SegmentBuilder(compression="zstd")
            for p in range(partitions):
                records = []
                for _ in range(per_partition):
                    n = rng.randrange(1 << 30)
                    key = None if n % 13 == 0 else f"user-{n % 97}".encode()
                    headers = (("n", str(n).encode()),) if n % 5 == 0 else ()
                    records.append(Record(key, rng.randbytes(200), T0 + n % 100_000, headers))
                builder.append(topic_id, p, records)
            writer.write(builder)

    write(100, 150)
    local = LocalCoordinator(f"sqlite:///{env.db_path}")
    try:
        ctx = JanitorContext(Catalog(local.db), local.store, env.store)
        config = JanitorConfig(
            tier_age_s=0, tier_target_bytes=1200 << 10, tier_row_group_bytes=100 << 10
        )
        report = run_janitor("tier", ctx, config, topic)
    finally:
        local.close()
    assert report.rows_replaced == 100 * partitions
    write(80, 25)
    if env.agents:
        rows = rest_view(env.agents, topic, partitions, 100 * 150 * 4 + 80 * 25 * 4)
    else:
        rows = all_expected(env, topic, partitions)
    assert len(rows) == 68_000
    return Realistic(topic, partitions, report.objects_written, 80 * partitions, rows)


def test_realistic_topic_reads_as_rest_consumers_see_it(
    spark: Any, env: Env, realistic: Realistic, tmp_path: Path
) -> None:
    """Tier objects cut into pieces over tasks, hundreds of chunks merged into tasks, many
    row groups: every record as the REST consumer reads it (s3: the agents' REST API;
    offline: its read path), with a task size that cuts objects and the default one.

    Before the fix, every task reading a piece of a cut object failed with "not a
    Parquet object (magic)": the piece's share of the object's size was taken for the
    object's size when looking for its footer.
    """
    t = realistic
    assert t.tier_objects >= 3 * t.partitions
    trace = tmp_path / "trace.jsonl"
    rows = read(spark, env, subscribe=t.topic, maxBytesPerTask=str(512 << 10), trace=str(trace))
    assert rows == t.rows

    events = trace_events(trace)
    (plan,) = [e for e in events if e["event"] == "plan"]
    tasks = [e for e in events if e["event"] == "task"]
    assert plan["objects"] == t.tier_objects + 80  # 80 tail objects, 4 chunks each
    # Each tier object went to several tasks, each task reading some of its row groups.
    parquet_tasks = [e for e in tasks if e["row_groups_read"]]
    assert len(parquet_tasks) >= 2 * t.tier_objects
    assert sum(e["row_groups_read"] for e in tasks) >= 10 * t.tier_objects
    # The 320 tail chunks were merged into few tasks, and fetched object by object: one
    # GET for an object's 4 chunks (two where a task boundary cuts an object).
    tail_tasks = [e for e in tasks if not e["row_groups_read"] and e["records"]]
    assert 0 < len(tail_tasks) <= 8
    assert sum(e["gets"] for e in tail_tasks) <= 80 + len(tail_tasks)
    assert sum(e["records"] for e in tasks) == len(t.rows)

    # The default task size, summed per partition in Spark: the same records.
    from pyspark.sql import functions as F

    got = (
        spark.read.format("lakelog")
        .options(**env.options, subscribe=t.topic)
        .load()
        .groupBy("partition")
        .agg(
            F.count("*").alias("n"),
            F.sum("offset").alias("offsets"),
            F.sum(F.crc32("value")).alias("values"),
        )
        .collect()
    )
    want: dict[int, tuple[int, int, int]] = {}
    for row in t.rows:
        n, offsets, values = want.get(row[1], (0, 0, 0))
        want[row[1]] = (n + 1, offsets + row[2], values + zlib.crc32(row[4] or b""))
    assert {r.partition: (r.n, r.offsets, r.values) for r in got} == want


# --- janitors during a read --------------------------------------------------------------


@pytest.mark.parametrize("collected", [False, True], ids=["in-grace", "collected"])
def test_janitors_during_a_long_read(spark: Any, env: Env, tmp_path: Path, collected: bool) -> None:
    """Race: tiering (then garbage collection) runs after a read was planned, while most of
    its tasks have not run yet (the first two wait on a gate in a UDF; local[2] starts no
    other task meanwhile).

    Expected: within GC's grace period the tasks read the replaced segment objects, which
    are still there: the same rows. Once GC has deleted them, the job fails with an error
    that names the object and the grace period; never other rows.
    """
    from pyspark.sql import functions as F

    topic, topic_id = env.topic(1)
    produce(env, topic, topic_id, 1, 24, 40)
    want = expected(env, topic, 0)
    gate, trace = tmp_path / "gate", tmp_path / "trace.jsonl"
    gate_path = str(gate)

    @F.udf("boolean", useArrow=False)  # type: ignore[misc]
    def wait_for_gate(_offset: int) -> bool:
        while not os.path.exists(gate_path):
            time.sleep(0.02)
        return True

    df = spark.read.format("lakelog").options(**env.options, includeHeaders="true")
    df = df.options(subscribe=topic, maxBytesPerTask="2048", trace=str(trace)).load()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["rows"] = df.where(wait_for_gate("offset")).collect()
        except Exception as exc:
            outcome["error"] = exc

    job = threading.Thread(target=run)
    job.start()
    try:
        deadline = time.monotonic() + 60
        while not (trace.exists() and b'"plan"' in trace.read_bytes()):
            assert time.monotonic() < deadline and job.is_alive(), outcome
            time.sleep(0.05)
        assert trace_events(trace)[0]["tasks"] >= 12
        local = LocalCoordinator(f"sqlite:///{env.db_path}")
        try:
            ctx = JanitorContext(Catalog(local.db), local.store, env.store)
            tier = run_janitor("tier", ctx, JanitorConfig(tier_age_s=0), topic)
            assert tier.rows_replaced == 24
            if collected:
                gc, deleted = JanitorConfig(gc_grace_s=0.01), 0
                for _ in range(3):  # the grace runs from the swap (or the first GC run)
                    time.sleep(0.05)
                    deleted += run_janitor("gc", ctx, gc).objects_deleted
                assert deleted >= 24
        finally:
            local.close()
    finally:
        gate.touch()
        job.join(120)
    assert [r.kind for r in env.coordinator.lookup(topic, 0, 0)] == ["parquet"]
    if not collected:
        assert "error" not in outcome, outcome
        rows = sorted(outcome["rows"], key=lambda r: r.offset)
        assert [(r.offset, r.value and bytes(r.value)) for r in rows] == [
            (r[2], r[4]) for r in want
        ]
    else:
        assert "rows" not in outcome
        message = str(outcome["error"])
        assert "was deleted after this read was planned" in message, message
        assert "--gc-grace-s" in message
