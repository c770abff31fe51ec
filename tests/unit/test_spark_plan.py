"""Planning a Spark read (``spark.plan``) while an admin call lands between its snapshot and
its walk of the index, on a real LocalCoordinator and store (no pyspark)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.client import PartitionOffsets
from coordinator.local import LocalCoordinator
from index.log import LogWriter
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.types import Record
from spark.options import parse_options
from spark.plan import plan_read


class AfterSnapshot:
    """A coordinator that runs ``change`` once, right after the read's snapshot of the
    partition's offsets: the admin call lands between the snapshot and the index walk."""

    def __init__(self, inner: LocalCoordinator, change: Callable[[], None]) -> None:
        self.inner = inner
        self.change: Callable[[], None] | None = change

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        found = self.inner.offsets(topic, partition)
        change, self.change = self.change, None
        if change is not None:
            change()
        return found


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[LocalCoordinator, Any, Callable[[], None]]]:
    coordinator = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    store = open_store(f"file://{tmp_path / 'data'}")
    writer = LogWriter(store, coordinator)

    def write(n: int = 10) -> None:
        b = SegmentBuilder()
        b.append(coordinator.get_topic("t").topic_id, 0, [Record(None, b"v", 1000)] * n)
        writer.write(b)

    coordinator.create_topic("t", 1)
    write()
    write()
    yield coordinator, store, write
    coordinator.close()


def test_a_topic_recreated_while_planning_fails_the_read_instead_of_mixing_logs(
    parts: tuple[LocalCoordinator, Any, Callable[[], None]],
) -> None:
    """Race: the topic is deleted and created again (with more records than the snapshot
    saw) between the snapshot and the index walk. Expected: the read fails, naming the
    deletion; never tasks over the new log's objects for the old log's offsets."""
    coordinator, store, write = parts

    def recreate() -> None:
        coordinator.delete_topic("t")
        coordinator.create_topic("t", 1)
        write(30)

    opts = parse_options({"subscribe": "t", "db": "sqlite:///x", "store": "memory://"})
    with pytest.raises(ValueError, match=r"deleted and created again\) while planning"):
        plan_read(opts, AfterSnapshot(coordinator, recreate), store)  # type: ignore[arg-type]


def test_records_deleted_while_planning_fail_the_read(
    parts: tuple[LocalCoordinator, Any, Callable[[], None]],
) -> None:
    """Race: DeleteRecords moves log-start past the snapshot's start while the read plans.
    Expected: the read fails (records it was to return are gone), never skipping them."""
    coordinator, store, _ = parts
    opts = parse_options({"subscribe": "t", "db": "sqlite:///x", "store": "memory://"})
    cut = AfterSnapshot(coordinator, lambda: coordinator.delete_records("t", 0, 12))
    with pytest.raises(ValueError, match=r"no longer holds offset 0 .*deleted while planning"):
        plan_read(opts, cut, store)  # type: ignore[arg-type]
