"""Spark reads where they meet admin calls and a damaged index (issue 22, read side).

Against the shared cluster (a coordinator process and agents over a moto S3 server),
with the run's one SparkSession; records are produced over REST and topics deleted and
created through the v3 API, as users do.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator.http.client import http_coordinator
from index.log import LogWriter
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.types import Record
from tests.conftest import sql_rows
from tests.integration.conftest import Cluster
from tests.integration.test_consumer_api import create_topic
from tests.integration.test_spark_stream_write import lakelog, produce, read_stream

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _topic(cluster: Cluster, prefix: str, partitions: int = 1) -> str:
    return create_topic(cluster, f"{prefix}-{uuid.uuid4().hex[:10]}", partitions)


def _delete_topic(cluster: Cluster, topic: str) -> None:
    r = httpx.delete(f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics/{topic}")
    assert r.status_code == 204, r.text


def _values(n: int, tag: str) -> list[dict[str, Any]]:
    return [{"value": b"%s-%d" % (tag.encode(), i)} for i in range(n)]


def _drain(
    spark: Any, cluster: Cluster, topic: str, checkpoint: Path, **options: str
) -> tuple[list[tuple[int, bytes]], Any]:
    """One Trigger.AvailableNow run of a checkpointed stream: (offset, value) rows read and
    the query's exception (None when it ended well)."""
    rows: list[tuple[int, bytes]] = []

    def sink(df: Any, _batch: int) -> None:
        rows.extend((r.offset, bytes(r.value)) for r in df.select("offset", "value").collect())

    query = (
        read_stream(spark, cluster, topic, **options)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(Exception):  # a failed query: its exception is returned
        query.awaitTermination(180)
    return sorted(rows), query.exception()


def test_a_checkpointed_stream_over_a_recreated_topic_reports_the_offset_that_went_back(
    spark: Any, lakelog_cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 22 defect 8, as Spark's Kafka source behaves. A query read 100 records and
    checkpointed offset 100; the topic is deleted, created again and given 30 records.
    Restarted from its checkpoint, the query fails ("offset was changed"); with
    failOnDataLoss=false it goes on from the new offset (30) and then reads the 80
    records that follow, never leaving a partition stuck at the old offset."""
    cluster = lakelog_cluster
    topic = _topic(cluster, "recreated-stream")
    produce(cluster, topic, _values(100, "old"), 0)
    checkpoint = tmp_path / "checkpoint"
    rows, error = _drain(spark, cluster, topic, checkpoint)
    assert error is None and [o for o, _ in rows] == list(range(100))

    _delete_topic(cluster, topic)
    create_topic(cluster, topic, 1)
    produce(cluster, topic, _values(30, "new"), 0)
    rows, error = _drain(spark, cluster, topic, checkpoint)
    assert error is not None and "offset was changed from 100 to 30" in str(error), error
    assert rows == []

    rows, error = _drain(spark, cluster, topic, checkpoint, failOnDataLoss="false")
    assert error is None and rows == []
    produce(cluster, topic, _values(80, "more"), 0)
    rows, error = _drain(spark, cluster, topic, checkpoint, failOnDataLoss="false")
    assert error is None
    assert rows == [(30 + i, b"more-%d" % i) for i in range(80)]


def test_a_running_stream_outlives_a_deleted_subscribe_topic_without_failing_on_data_loss(
    spark: Any, lakelog_cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 22 defect 8. A running query subscribed to two topics, failOnDataLoss=false:
    one topic is deleted (the query goes on reading the other), then created again with
    new records, which the query reads from the new topic's first offset, told by its
    id."""
    cluster = lakelog_cluster
    keep, gone = _topic(cluster, "kept"), _topic(cluster, "deleted")
    produce(cluster, keep, _values(10, "k"), 0)
    produce(cluster, gone, _values(10, "g"), 0)
    got: list[tuple[str, int, bytes]] = []

    def sink(df: Any, _batch: int) -> None:
        rows = df.select("topic", "offset", "value").collect()
        got.extend((r.topic, r.offset, bytes(r.value)) for r in rows)

    query = (
        spark.readStream.format("lakelog")
        .options(coordinator=cluster.coordinator_url, subscribe=f"{keep},{gone}")
        .options(startingOffsets="earliest", failOnDataLoss="false")
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def wait_for(count: int, what: str) -> None:
        deadline = time.monotonic() + 120
        while len(got) < count:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"{what}: {len(got)} rows of {count}"
            time.sleep(0.2)

    try:
        wait_for(20, "before the deletion")
        _delete_topic(cluster, gone)
        produce(cluster, keep, _values(5, "k2"), 0)
        wait_for(25, "after the deletion")
        create_topic(cluster, gone, 1)
        produce(cluster, gone, _values(7, "again"), 0)
        wait_for(32, "after the topic came back")
        assert query.exception() is None
    finally:
        query.stop()
    assert sorted(x for x in got if x[0] == gone and x[2].startswith(b"again")) == [
        (gone, i, b"again-%d" % i) for i in range(7)
    ]
    assert sorted(x[1] for x in got if x[0] == keep) == list(range(15))


def test_a_start_at_a_timestamp_counts_only_records_from_log_start(
    spark: Any, lakelog_cluster: Cluster
) -> None:
    """Issue 22 defect 3 in Spark. One index entry holds recent records below log-start
    and older ones above it; the next entry is recent. startingTimestamp between the
    two: the read starts at the next entry, not at log-start (whose records are older
    than asked)."""
    cluster = lakelog_cluster
    topic = _topic(cluster, "ts-spark")
    with http_coordinator(cluster.coordinator_url) as coordinator:
        store = open_store(cluster.store_url, endpoint_url=cluster.store_endpoint)
        writer = LogWriter(store, coordinator)
        topic_id = coordinator.get_topic(topic).topic_id
        first = [Record(None, b"a%d" % i, 2000 + i) for i in range(5)]
        first += [Record(None, b"b%d" % i, 1000 + i) for i in range(5)]
        for records in (first, [Record(None, b"c%d" % i, 3000 + i) for i in range(5)]):
            builder = SegmentBuilder()
            builder.append(topic_id, 0, records)
            writer.write(builder)
        assert coordinator.delete_records(topic, 0, 5) == 5
        store.close()
    df = lakelog(spark, cluster, topic, startingTimestamp="1500")
    assert sorted((r.offset, bytes(r.value)) for r in df.collect()) == [
        (10 + i, b"c%d" % i) for i in range(5)
    ]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("where", [5, 10])
def test_spark_reads_fail_on_a_hole_instead_of_spinning(
    spark: Any, lakelog_cluster: Cluster, tmp_path: Path, where: int
) -> None:
    """Issue 22 defect 4: an index entry deleted behind the coordinator's back (in the
    middle, or the last: the index ends before the high watermark). A batch read and a
    stream both fail, naming the hole, instead of planning forever."""
    cluster = lakelog_cluster
    topic = _topic(cluster, "hole-spark")
    for i in range(3):
        produce(cluster, topic, _values(5, f"r{i}"), 0)
    with http_coordinator(cluster.coordinator_url) as coordinator:
        topic_id = coordinator.get_topic(topic).topic_id
    sql_rows(
        f"sqlite:///{cluster.tmp / 'meta.db'}",
        "DELETE FROM index_entries WHERE topic_id = ? AND partition = 0 AND base_offset = ?",
        (topic_id, where),
    )
    hole = {5: "holds no entry at offset 5", 10: "ends at offset 10, before"}[where]
    with pytest.raises(Exception, match=f"IndexHoleError: .*{hole}"):
        lakelog(spark, cluster, topic).collect()
    rows, error = _drain(spark, cluster, topic, tmp_path / "checkpoint")
    assert error is not None and hole in str(error), error
    assert rows == []
