"""Writes where they meet garbage collection (issue 22, write side, defect 1).

Against a coordinator process that runs garbage collection every second with a grace
period of one second (``lakelog coordinator --janitors gc --janitor-interval gc=1
--gc-grace-s 1``), over a ``file://`` store, as the issue's reproducer: a commit never
makes visible an object that garbage collection may have deleted, and uploads that a
running job still holds are not collected.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.client import ChunkCommit
from coordinator.http.client import http_coordinator
from index.log import LogReader, LogWriter, UploadedSegment
from segments.errors import ObjectDeletedError
from segments.segment import SegmentBuilder
from segments.store import ObjectStore, open_store
from segments.types import Record
from tests.procs import Proc, start_coordinator

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class GcCluster:
    """A coordinator collecting garbage every second (grace 1 s) and its store."""

    def __init__(self, proc: Proc, url: str, store_url: str) -> None:
        self.proc = proc
        self.url = url
        self.store_url = store_url
        self.store: ObjectStore = open_store(store_url)
        self.coordinator = http_coordinator(url)

    def topic(self, partitions: int) -> tuple[str, bytes]:
        name = f"gc-{uuid.uuid4().hex[:10]}"
        return name, self.coordinator.create_topic(name, partitions).topic_id

    def wait_gone(self, key: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while key in {o.key for o in self.store.list("segments/")}:
            assert time.monotonic() < deadline, f"{key} never collected:\n{self.proc.output()}"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def gc_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcCluster]:
    tmp = tmp_path_factory.mktemp("gc-cluster")
    data = tmp / "data"
    data.mkdir()
    store_url = data.as_uri()
    args = ["--janitors", "gc", "--janitor-interval", "gc=1", "--gc-grace-s", "1"]
    proc, url = start_coordinator(
        tmp, f"sqlite:///{tmp / 'meta.db'}", store_url=store_url, args=args
    )
    cluster = GcCluster(proc, url, store_url)
    try:
        yield cluster
    finally:
        cluster.coordinator.close()
        proc.stop()


def _upload(cluster: GcCluster, topic_id: bytes, n: int) -> UploadedSegment:
    builder = SegmentBuilder()
    builder.append(topic_id, 0, [Record(None, b"v%d" % i, 1_000 + i, ()) for i in range(n)])
    return LogWriter(cluster.store, cluster.coordinator).upload(builder)


def _commits(uploaded: UploadedSegment) -> list[ChunkCommit]:
    return [
        ChunkCommit(
            c.topic_id,
            c.partition,
            c.position,
            c.length,
            c.record_count,
            c.min_timestamp_ms,
            c.max_timestamp_ms,
        )
        for c in uploaded.chunks
    ]


def test_a_commit_after_gc_took_the_object_fails(gc_cluster: GcCluster) -> None:
    """Defect 1, the race itself: an object uploaded without a lease is collected as an
    orphan once the grace period passed; its late commit is refused with a clear error
    (ObjectDeletedError over HTTP, 409) and assigns no offsets; it never succeeds."""
    topic, topic_id = gc_cluster.topic(1)
    uploaded = _upload(gc_cluster, topic_id, 10)
    gc_cluster.wait_gone(uploaded.object_key)
    with pytest.raises(ObjectDeletedError, match="deleted by garbage collection"):
        gc_cluster.coordinator.commit(uploaded.object_key, _commits(uploaded))
    assert gc_cluster.coordinator.offsets(topic, 0).high_watermark == 0


def test_an_agent_flush_whose_object_was_collected_uploads_again(gc_cluster: GcCluster) -> None:
    """Defect 1, agent side: a flush whose commit comes after garbage collection took its
    object (a commit retried through a long coordinator outage) still holds the bytes: it
    PUTs them under a new key and commits that, so the acked records are readable."""
    topic, topic_id = gc_cluster.topic(1)
    writer = LogWriter(gc_cluster.store, gc_cluster.coordinator)
    uploaded = _upload(gc_cluster, topic_id, 10)
    gc_cluster.wait_gone(uploaded.object_key)
    result = writer.commit(uploaded)
    assert result.object_key != uploaded.object_key and result.base_offsets == [0]
    reader = LogReader(gc_cluster.store, gc_cluster.coordinator)
    assert [r.value for r in reader.read(topic, 0, 0)] == [b"v%d" % i for i in range(10)]


def test_pending_uploads_outlive_the_grace_period_while_their_lease_lives(
    gc_cluster: GcCluster,
) -> None:
    """An upload registered under a write lease is left alone past the grace period while
    the lease is renewed; released, it is an orphan like any other."""
    _, topic_id = gc_cluster.topic(1)
    lease = f"test-{uuid.uuid4().hex}"
    builder = SegmentBuilder()
    builder.append(topic_id, 0, [Record(None, b"x", 1_000, ())])
    uploaded = LogWriter(gc_cluster.store, gc_cluster.coordinator).upload(
        builder, before_put=lambda key: gc_cluster.coordinator.keep_pending(lease, [key], 60)
    )
    time.sleep(3.5)  # three collections past the grace period
    assert uploaded.object_key in {o.key for o in gc_cluster.store.list("segments/")}
    assert gc_cluster.coordinator.pending_object_keys([uploaded.object_key]) == {
        uploaded.object_key
    }
    gc_cluster.coordinator.release_pending(lease)
    gc_cluster.wait_gone(uploaded.object_key)


def test_a_spark_write_with_a_slow_task_keeps_every_record(
    spark: Any, gc_cluster: GcCluster, tmp_path: Path
) -> None:
    """Defect 1, the issue's reproducer: a two-task write whose second task takes a few
    seconds, against garbage collection every second with a grace of one second. The
    first task's object waits for the driver's commit (pending under the job's write
    lease, renewed by the running task): all 1,000 records are readable after (on main:
    high watermark 1000, the first task's records gone)."""
    from pyspark.sql.types import StringType, StructField, StructType

    topic, _ = gc_cluster.topic(2)

    def slow_second_task(index: int, rows: Iterator[int]) -> Iterator[tuple[str]]:
        if index == 1:
            time.sleep(5)
        return ((str(i),) for i in rows)

    schema = StructType([StructField("value", StringType())])
    rdd = spark.sparkContext.parallelize(range(1000), 2).mapPartitionsWithIndex(slow_second_task)
    df = spark.createDataFrame(rdd, schema)
    df.write.format("lakelog").options(coordinator=gc_cluster.url, topic=topic).mode(
        "append"
    ).save()

    offsets = [gc_cluster.coordinator.offsets(topic, p).high_watermark for p in range(2)]
    assert sum(offsets) == 1000
    reader = LogReader(gc_cluster.store, gc_cluster.coordinator)
    values = sorted(
        int(r.value or b"") for p in range(2) for r in reader.read(topic, p, 0, max_bytes=1 << 30)
    )
    assert values == list(range(1000))
    assert (
        gc_cluster.coordinator.pending_object_keys(
            [o.key for o in gc_cluster.store.list("segments/")]
        )
        == set()
    ), "the job's lease is released after its commit"
