"""lakelog.max.decompressed.bytes on Spark's side of the bucket: scans never inflate a
batch past the topic's bound (planned with each slice), and writes refuse a row over
the lower of max.message.bytes and that bound, as REST produce does."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from coordinator.local import LocalCoordinator
from index.log import LogWriter
from index.plan import Bounds, plan_tasks
from segments.errors import BatchTooLargeError, RecordTooLargeError
from segments.localfs import FileStore
from segments.segment import SegmentBuilder
from segments.types import Record
from spark.scan import read_task
from spark.write import TaskWriter

MiB = 1 << 20
BOUND = "lakelog.max.decompressed.bytes"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[LocalCoordinator, FileStore]]:
    c = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    yield c, FileStore(str(tmp_path / "data"))
    c.close()


def test_scans_do_not_inflate_a_batch_over_the_topic_bound(
    env: tuple[LocalCoordinator, FileStore],
) -> None:
    """A zstd batch of 3 MiB stored under a 4 MiB bound reads; once the bound is 2 MiB,
    the scan planned after fails that batch naming the config (a bomb stored before the
    bound existed takes no executor down)."""
    c, store = env
    c.create_topic("t", 1, {BOUND: str(4 * MiB)})
    b = SegmentBuilder(compression="zstd", max_batch_bytes=8 * MiB)
    b.append(c.get_topic("t").topic_id, 0, [Record(b"k", bytes(3 * MiB), 1000, ())])
    LogWriter(store, c).write(b)
    tasks = pickle.loads(pickle.dumps(plan_tasks(c, store, {("t", 0): (0, 1)}, Bounds(), MiB)))
    assert sum(rb.num_rows for t in tasks for rb in read_task(store, t)) == 1
    c.alter_configs("t", {BOUND: str(2 * MiB)})
    tasks = plan_tasks(c, store, {("t", 0): (0, 1)}, Bounds(), MiB)
    with pytest.raises(BatchTooLargeError, match=r"lakelog\.max\.decompressed\.bytes"):
        sum(rb.num_rows for t in tasks for rb in read_task(store, t))


def test_writes_refuse_a_row_over_the_bound(env: tuple[LocalCoordinator, FileStore]) -> None:
    """max.message.bytes 8 MiB, bound 2 MiB: a 3 MiB row is refused before anything is
    uploaded; a 1 MiB row is written."""
    c, store = env
    c.create_topic("t", 1, {"max.message.bytes": str(8 * MiB), BOUND: str(2 * MiB)})
    w = TaskWriter(LogWriter(store, c), c.get_topic, "t", "none", 64 * MiB)
    with pytest.raises(RecordTooLargeError, match=r"lakelog\.max\.decompressed\.bytes"):
        w.add(pa.RecordBatch.from_pydict({"value": [bytes(3 * MiB)]}))
    w.add(pa.RecordBatch.from_pydict({"value": [bytes(MiB)]}))
    assert w.finish().records == 1
