"""Spark writes without Spark (``spark.write``): Kafka-sink rows into segment objects,
placed as every producer places them, committed only by the job commit, once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pyarrow as pa
import pytest

from coordinator.client import Coordinator
from coordinator.local import LocalCoordinator
from index.log import LogReader, LogWriter
from segments.batches import iter_batches
from segments.errors import CoordinatorUnavailableError, InvalidRecordError
from segments.partitioning import partition_for_key
from segments.segment import SegmentReader
from segments.store import ObjectStore, open_store
from spark.write import (
    ObjectsWritten,
    TaskWriter,
    check_sink_schema,
    commit_objects,
    delete_objects,
)


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[LocalCoordinator]:
    c = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    c.create_topic("t", 4)
    c.create_topic("u", 2)
    yield c
    c.close()


@pytest.fixture
def store() -> ObjectStore:
    return open_store("memory://")


def task(store: ObjectStore, coordinator: LocalCoordinator, **kw: object) -> TaskWriter:
    args: dict[str, object] = {"topic": "t", "compression": "zstd", "max_bytes": 1 << 20}
    args.update(kw)
    return TaskWriter(LogWriter(store, coordinator), coordinator.get_topic, **args)  # type: ignore[arg-type]


def all_records(store: ObjectStore, c: LocalCoordinator, topic: str, n: int) -> list[tuple]:
    reader = LogReader(store, c)
    out = []
    for p in range(n):
        for r in reader.read(topic, p, 0, max_bytes=1 << 30):
            out.append((r.partition, r.offset, r.key, r.value, r.headers))
    return out


def test_sink_schema_is_the_kafka_sinks() -> None:
    check_sink_schema({"key": "string", "value": "binary", "topic": "string"}, None)
    check_sink_schema({"value": "string"}, "t")
    with pytest.raises(ValueError, match="needs a 'value' column"):
        check_sink_schema({"key": "binary"}, "t")
    with pytest.raises(ValueError, match="'topic' column or the option"):
        check_sink_schema({"value": "binary"}, None)
    with pytest.raises(ValueError, match="column 'partition' must be int, not bigint"):
        check_sink_schema({"value": "binary", "partition": "bigint"}, "t")
    with pytest.raises(ValueError, match="'offset' is not one of the Kafka sink's columns"):
        check_sink_schema({"value": "binary", "offset": "bigint"}, "t")


def test_rows_are_placed_like_every_producer_and_invisible_until_the_job_commit(
    store: ObjectStore, coordinator: LocalCoordinator
) -> None:
    """Explicit partitions win, keys go where murmur2 puts them, keyless rows of one
    batch stick to one partition; nothing is visible before commit_objects."""
    w = task(store, coordinator, topic=None)
    keys = [None if i % 4 == 0 else f"key-{i}" for i in range(200)]
    batch = pa.RecordBatch.from_pydict(
        {
            "key": keys,
            "value": [b"v%d" % i for i in range(200)],
            "topic": ["t" if i % 2 else "u" for i in range(200)],
            "partition": [1 if i % 10 == 3 else None for i in range(200)],
            "headers": [
                [{"key": "i", "value": b"%d" % i}] if i % 7 == 0 else None for i in range(200)
            ],
        }
    )
    w.add(batch)
    written = w.finish(0, 0)
    assert written.records == 200 and len(written.objects) == 1
    assert all_records(store, coordinator, "t", 4) == []  # uploaded, not committed

    commit_objects(store, coordinator, [written])
    got = {r[3]: r for r in all_records(store, coordinator, "t", 4)}
    got.update({r[3]: r for r in all_records(store, coordinator, "u", 2)})
    assert len(got) == 200
    keyless: dict[str, set[int]] = {}
    for i, key in enumerate(keys):
        p, _off, k, _v, headers = got[b"v%d" % i]
        topic, n = ("t", 4) if i % 2 else ("u", 2)
        if i % 10 == 3:
            assert p == 1
        elif key is not None:
            assert p == partition_for_key(key.encode(), n)
        else:
            keyless.setdefault(topic, set()).add(p)
        assert k == (None if key is None else key.encode())
        assert headers == ((("i", b"%d" % i),) if i % 7 == 0 else ())
    assert all(len(ps) == 1 for ps in keyless.values())  # sticky within a batch


def test_a_task_uploads_an_object_per_max_bytes_and_a_repeated_commit_changes_nothing(
    store: ObjectStore, coordinator: LocalCoordinator
) -> None:
    # Incompressible values: objects are cut by their (zstd-compressed) bytes.
    w = task(store, coordinator, max_bytes=4096)
    for b in range(10):
        w.add(
            pa.RecordBatch.from_pydict(
                {"value": [os.urandom(100) + b"%d" % (b * 20 + i) for i in range(20)]}
            )
        )
    written = w.finish(3, 1)
    assert len(written.objects) >= 4
    first = commit_objects(store, coordinator, [written, None])
    again = commit_objects(store, coordinator, [written])  # the driver retried its commit
    assert [r.base_offsets for r in again] == [r.base_offsets for r in first]
    records = all_records(store, coordinator, "t", 4)
    assert len(records) == 200
    for p in range(4):
        offsets = [r[1] for r in records if r[0] == p]
        assert offsets == list(range(len(offsets)))


def test_refusals_and_abort(store: ObjectStore, coordinator: LocalCoordinator) -> None:
    w = task(store, coordinator)
    with pytest.raises(ValueError, match="partition 9 of topic 't' does not exist"):
        w.add(pa.RecordBatch.from_pydict({"value": [b"v"], "partition": pa.array([9], pa.int32())}))
    w = task(store, coordinator, topic=None)
    with pytest.raises(ValueError, match="topic is null"):
        w.add(pa.RecordBatch.from_pydict({"value": [b"v"], "topic": pa.array([None], pa.string())}))
    w = task(store, coordinator)
    w.add(pa.RecordBatch.from_pydict({"value": [b"v"]}))
    written = w.finish()
    assert delete_objects(store, coordinator, [written, None]) == 1
    assert list(store.list("segments/")) == []


def test_a_compacted_topic_takes_only_keyed_rows(
    store: ObjectStore, coordinator: LocalCoordinator
) -> None:
    """As Kafka and REST producers: a row without a key for a compacted topic fails the
    task (InvalidRecordError, naming the topic partition); keyed rows are written."""
    coordinator.create_topic("c", 1, {"cleanup.policy": "compact"})
    w = task(store, coordinator, topic="c")
    with pytest.raises(InvalidRecordError, match="without key in topic partition c-0"):
        w.add(pa.RecordBatch.from_pydict({"key": [b"k", None], "value": [b"v", b"w"]}))
    w = task(store, coordinator, topic="c")
    w.add(pa.RecordBatch.from_pydict({"key": [b"k"], "value": [b"v"]}))
    commit_objects(store, coordinator, [w.finish()])
    assert [r[2:4] for r in all_records(store, coordinator, "c", 1)] == [(b"k", b"v")]


def test_abort_after_a_commit_failed_part_way_keeps_the_committed_objects(
    store: ObjectStore, coordinator: LocalCoordinator
) -> None:
    """The driver commits object by object: when a later commit fails, Spark aborts, and
    the objects committed before it are in the index: deleting them would lose acked
    records. Abort deletes only the uncommitted ones, and nothing if it cannot tell."""
    tasks = []
    for value in (b"first", b"second"):
        w = task(store, coordinator)
        w.add(pa.RecordBatch.from_pydict({"value": [value]}))
        tasks.append(w.finish())
    commit_objects(store, coordinator, [tasks[0]])  # the second commit "failed"
    (kept,), (dropped,) = ([k for k, _, _ in t.objects] for t in tasks)

    class Unreachable:
        def committed_object_keys(self, keys: list[str]) -> set[str]:
            raise CoordinatorUnavailableError("down")

    assert delete_objects(store, cast(Coordinator, Unreachable()), tasks) == 0
    assert {o.key for o in store.list("segments/")} == {kept, dropped}
    assert delete_objects(store, coordinator, tasks) == 1
    assert [o.key for o in store.list("segments/")] == [kept]
    assert [r[3] for r in all_records(store, coordinator, "t", 4)] == [b"first"]


def test_an_arrow_batch_larger_than_an_object_spans_objects_of_bounded_batches(
    store: ObjectStore, coordinator: LocalCoordinator
) -> None:
    """One Arrow batch of ~3 MB into objects of 256 KiB: it is cut across objects (each
    at most one Kafka batch over the bound), its Kafka batches hold at most
    max_batch_bytes (a 200 KiB row, larger than that, gets a batch of its own), and
    every row reads back in its partition, in order, with its headers."""
    coordinator.create_topic("big", 3, {"max.message.bytes": str(1 << 20)})
    max_bytes, max_batch = 256 << 10, 64 << 10
    n = 3000
    keys = [b"k%d" % i for i in range(n)]
    values = [os.urandom(200 << 10 if i == 1234 else 1000) for i in range(n)]
    headers = [[{"key": "i", "value": b"%d" % i}] if i % 2 else None for i in range(n)]
    w = task(store, coordinator, topic="big", max_bytes=max_bytes, max_batch_bytes=max_batch)
    w.add(pa.RecordBatch.from_pydict({"key": keys, "value": values, "headers": headers}))
    written = w.finish()
    assert written.records == n
    assert len(written.objects) >= 3 * n * 1000 // max_bytes // 4
    lone = 0
    for key, size, _chunks in written.objects:
        data = store.get(key)
        biggest = 0
        for chunk in SegmentReader(data).chunks:
            at = chunk.position
            for pos, end, _rel, count in iter_batches(data[at : at + chunk.length]):
                assert end - pos <= max_batch or count == 1, (end - pos, count)
                lone += end - pos > max_batch
                biggest = max(biggest, end - pos)
        assert size < max_bytes + biggest + 4096  # cut after the batch that filled it
    assert lone == 1  # the 200 KiB row
    commit_objects(store, coordinator, [written])
    got = all_records(store, coordinator, "big", 3)
    assert len(got) == n
    for p in range(3):
        rows = [i for i in range(n) if partition_for_key(keys[i], 3) == p]
        mine = [r for r in got if r[0] == p]
        assert [r[1] for r in mine] == list(range(len(rows)))
        assert [(r[2], r[3]) for r in mine] == [(keys[i], values[i]) for i in rows]
        assert [r[4] for r in mine] == [(("i", b"%d" % i),) if i % 2 else () for i in rows]


def test_a_log_append_time_topic_gets_its_batches_stamped(
    store: ObjectStore, coordinator: LocalCoordinator
) -> None:
    """Batches built column-wise are stamped like the agent's: timestampType 1, every
    record the object's append time (after the rows' own time)."""
    coordinator.create_topic("lat", 2, {"message.timestamp.type": "LogAppendTime"})
    w = task(store, coordinator, topic="lat", compression="lz4")
    w.add(pa.RecordBatch.from_pydict({"key": [b"a", b"b", b"c"], "value": [b"1", b"2", b"3"]}))
    commit_objects(store, coordinator, [w.finish()])
    reader = LogReader(store, coordinator)
    got = [r for p in range(2) for r in reader.read("lat", p, 0, max_bytes=1 << 20)]
    assert len(got) == 3 and {r.timestamp_type for r in got} == {1}
    assert len({r.timestamp_ms for r in got}) == 1


def test_a_stream_batch_run_again_after_a_crash_is_committed_once(
    store: ObjectStore, coordinator: LocalCoordinator
) -> None:
    """A stream's micro-batch of three tasks (one writing several objects, two topics in
    another) is committed in one transaction with its key. Spark runs the batch again
    (its commit here done, not recorded by Spark before a crash), the rows split over
    tasks another way: nothing is committed twice and the rerun's objects are deleted.
    The next batch is new; a retried commit of the same objects answers the same
    offsets; without a key (no sink id) a rerun writes every row again."""

    def tasks(split: int) -> list[ObjectsWritten | None]:
        out: list[ObjectsWritten | None] = []
        rows = 120
        per = rows // split
        for p in range(split):
            w = task(store, coordinator, topic=None, max_bytes=4096 if p == 0 else 1 << 20)
            idx = range(p * per, (p + 1) * per)
            w.add(
                pa.RecordBatch.from_pydict(
                    {
                        "key": [b"k%d" % i for i in idx],
                        "value": [b"%d" % i + os.urandom(200) * (p == 0) for i in idx],
                        "topic": ["t" if i % 3 else "u" for i in idx],
                    }
                )
            )
            out.append(w.finish(p, 0))
        return out

    def count() -> int:
        return len(all_records(store, coordinator, "t", 4)) + len(
            all_records(store, coordinator, "u", 2)
        )

    first = tasks(3)
    assert first[0] is not None and len(first[0].objects) >= 2
    committed = commit_objects(store, coordinator, first, "spark-sink:q:7")
    assert count() == 120
    again = commit_objects(store, coordinator, first, "spark-sink:q:7")  # a retried commit
    assert [r.base_offsets for r in again] == [r.base_offsets for r in committed]
    rerun = tasks(2)  # Spark runs batch 7 again, its rows split in two tasks now
    assert commit_objects(store, coordinator, rerun, "spark-sink:q:7") == []
    assert count() == 120
    keys = {o.key for o in store.list("segments/")}
    assert not keys & {k for t in rerun if t for k, _, _ in t.objects}  # deleted
    commit_objects(store, coordinator, tasks(3), "spark-sink:q:8")  # the next batch is new
    assert count() == 240
    commit_objects(store, coordinator, tasks(3), None)
    commit_objects(store, coordinator, tasks(3), None)  # no sink id: at least once
    assert count() == 480
