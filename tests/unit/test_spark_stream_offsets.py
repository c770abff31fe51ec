"""The offsets of a lakelog stream (``spark.stream``), without Spark: where a stream
starts, how far a micro-batch goes under maxOffsetsPerTrigger, what it reads after
retention, on a real LocalCoordinator."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.client import ChunkCommit, PartitionOffsets
from coordinator.local import LocalCoordinator
from index.log import LogWriter
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.types import Record
from spark.options import ReadOptions, parse_options
from spark.stream import (
    from_json,
    initial_offsets,
    latest_offsets,
    micro_batch_ranges,
    to_json,
)


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[LocalCoordinator]:
    c = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    topic = c.create_topic("t", 2)
    for i, (p, n) in enumerate([(0, 30), (1, 10), (0, 20)]):
        c.commit(f"segments/x/{i}.seg", [ChunkCommit(topic.topic_id, p, 0, 100, n, 1, 2)])
    yield c
    c.close()


def opts(**options: str) -> ReadOptions:
    base = {"subscribe": "t", "db": "sqlite:///x", "store": "memory://"}
    return parse_options({**base, **options}, streaming=True)


def test_offsets_round_trip_spark_kafka_json() -> None:
    offsets = {("b", 1): 7, ("a", 0): 3, ("a", 10): 0}
    assert to_json(offsets) == {"a": {"0": 3, "10": 0}, "b": {"1": 7}}
    assert from_json(to_json(offsets)) == offsets


def test_initial_offsets_follow_starting_offsets(coordinator: LocalCoordinator) -> None:
    """Streams start at latest by default, as Spark's Kafka source; earliest and JSON too."""
    assert initial_offsets(opts(), coordinator) == {("t", 0): 50, ("t", 1): 10}
    assert initial_offsets(opts(startingOffsets="earliest"), coordinator) == {
        ("t", 0): 0,
        ("t", 1): 0,
    }
    given = opts(startingOffsets='{"t": {"0": 12, "1": -1}}')
    assert initial_offsets(given, coordinator) == {("t", 0): 12, ("t", 1): 10}
    with pytest.raises(ValueError, match="must name every partition"):
        initial_offsets(opts(startingOffsets='{"t": {"0": 12}}'), coordinator)


def test_max_offsets_per_trigger_shares_the_limit_by_backlog() -> None:
    """Each partition gets its share of the limit (a share under one record rounds up,
    others down); never past the high watermark; all of it without a limit."""
    now = {
        ("t", 0): PartitionOffsets(0, 1000),
        ("t", 1): PartitionOffsets(0, 100),
        ("t", 2): PartitionOffsets(0, 1),
    }
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    assert latest_offsets(now, start, None) == {("t", 0): 1000, ("t", 1): 100, ("t", 2): 1}
    end = latest_offsets(now, start, 110)
    assert end == {("t", 0): 99, ("t", 1): 9, ("t", 2): 1}
    assert sum(end.values()) <= 110
    assert latest_offsets(now, start, 5000) == {("t", 0): 1000, ("t", 1): 100, ("t", 2): 1}


def test_new_partitions_start_at_their_earliest_and_a_cap_holds() -> None:
    """A partition missing from the start (added meanwhile) starts at its log-start;
    with Trigger.AvailableNow's cap nothing past it is read, and a partition the cap
    does not know gets nothing."""
    now = {("t", 0): PartitionOffsets(0, 50), ("t", 1): PartitionOffsets(5, 20)}
    assert latest_offsets(now, {("t", 0): 40}, None) == {("t", 0): 50, ("t", 1): 20}
    assert latest_offsets(now, {("t", 0): 40}, None, cap={("t", 0): 45}) == {
        ("t", 0): 45,
        ("t", 1): 5,
    }


def test_micro_batch_ranges_after_retention(coordinator: LocalCoordinator, tmp_path: Path) -> None:
    """A range whose first records retention deleted fails with failOnDataLoss (the
    default) and starts at log-start without it; empty ranges are left out."""
    with sqlite3.connect(tmp_path / "meta.db") as conn:  # what retention does to log-start
        conn.execute("UPDATE partitions SET log_start_offset = 30 WHERE partition = 0")
    start, end = {("t", 0): 10, ("t", 1): 10}, {("t", 0): 50, ("t", 1): 10}
    with pytest.raises(ValueError, match=r"offsets 10-29 of t-0 were deleted"):
        micro_batch_ranges(opts(), coordinator, start, end)
    relaxed = opts(failOnDataLoss="false")
    assert micro_batch_ranges(relaxed, coordinator, start, end) == {("t", 0): (30, 50)}
    assert micro_batch_ranges(opts(), coordinator, {("t", 0): 35}, {("t", 0): 50}) == {
        ("t", 0): (35, 50)
    }


def test_a_stream_can_start_at_a_timestamp(tmp_path: Path) -> None:
    """startingTimestamp: each partition from its first record at or after it, as a batch
    read resolves it; none that recent fails, or starts at the end with strategy latest."""
    c = LocalCoordinator(f"sqlite:///{tmp_path / 'ts.db'}")
    store = open_store("memory://")
    try:
        topic = c.create_topic("t", 2)
        builder = SegmentBuilder()
        for p in range(2):
            builder.append(
                topic.topic_id, p, [Record(None, b"v", 1000 + 10 * i + p) for i in range(20)]
            )
        LogWriter(store, c).write(builder)
        start = opts(startingTimestamp="1101")
        assert initial_offsets(start, c, store) == {("t", 0): 11, ("t", 1): 10}
        with pytest.raises(ValueError, match="no record of t-0 at or after it"):
            initial_offsets(opts(startingTimestamp="5000"), c, store)
        late = opts(startingTimestamp="5000", startingOffsetsByTimestampStrategy="latest")
        assert initial_offsets(late, c, store) == {("t", 0): 20, ("t", 1): 20}
    finally:
        c.close()


def test_an_offset_that_went_back_is_data_loss_as_in_sparks_kafka_source(
    coordinator: LocalCoordinator,
) -> None:
    """Issue 22 defect 8: the high watermark below the checkpointed offset (the topic was
    deleted and created again) ends the micro-batch there, not at the old offset; the
    batch fails with Spark's "offset was changed", or reads nothing of that partition
    without failOnDataLoss (the stream goes on from the new offset)."""
    now = {("t", 0): PartitionOffsets(0, 30), ("t", 1): PartitionOffsets(0, 10)}
    start = {("t", 0): 100, ("t", 1): 10}
    end = latest_offsets(now, start, None)
    assert end == {("t", 0): 30, ("t", 1): 10}
    assert latest_offsets(now, start, 5) == end  # a limit shares out no negative backlog
    with pytest.raises(ValueError, match=r"t-0's offset was changed from 100 to 30"):
        micro_batch_ranges(opts(), coordinator, start, end)
    assert micro_batch_ranges(opts(failOnDataLoss="false"), coordinator, start, end) == {}


def test_partitions_that_are_gone_are_data_loss(coordinator: LocalCoordinator) -> None:
    """A partition in the start but no longer listed (its topic deleted) is left out of the
    end and fails the batch ("are gone"), or is skipped without failOnDataLoss."""
    now = {("t", 0): PartitionOffsets(0, 60)}
    start = {("t", 0): 50, ("gone", 0): 7}
    end = latest_offsets(now, start, None)
    assert end == {("t", 0): 60}
    with pytest.raises(ValueError, match=r"gone-0 are gone"):
        micro_batch_ranges(opts(), coordinator, start, end)
    relaxed = opts(failOnDataLoss="false")
    assert micro_batch_ranges(relaxed, coordinator, start, end) == {("t", 0): (50, 60)}


def test_a_topic_created_again_is_read_from_its_beginning(coordinator: LocalCoordinator) -> None:
    """Told by its id (the stream saw another one): a topic deleted and created again is
    data loss; without failOnDataLoss its partitions are read from the start of the new
    log, whatever the offsets say (here past the old checkpointed ones)."""
    start, end = {("t", 0): 20, ("t", 1): 5}, {("t", 0): 50, ("t", 1): 10}
    with pytest.raises(ValueError, match="topic t was deleted and created again"):
        micro_batch_ranges(opts(), coordinator, start, end, {"t"})
    relaxed = opts(failOnDataLoss="false")
    assert micro_batch_ranges(relaxed, coordinator, start, end, {"t"}) == {
        ("t", 0): (0, 50),
        ("t", 1): (0, 10),
    }
