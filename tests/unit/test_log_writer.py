"""LogWriter's PUT path when the store's answer is lost."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from coordinator.client import ChunkCommit
from coordinator.local import LocalCoordinator
from index.log import LogReader, LogWriter
from segments.errors import (
    CoordinatorUnavailableError,
    PartialCommitError,
    PreconditionFailedError,
    StorageUnavailableError,
)
from segments.memory import MemoryStore
from segments.segment import SegmentBuilder
from segments.types import Record


class LostAnswerStore(MemoryStore):
    """The first PUT is written but its answer is lost, as after a reset or a late 500."""

    def __init__(self) -> None:
        super().__init__()
        self.puts = 0

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> None:
        self.puts += 1
        super().put(key, data, if_none_match=if_none_match)
        if self.puts == 1:
            raise StorageUnavailableError("connection reset after the write")


def test_a_lost_put_answer_does_not_fail_the_flush(tmp_path: Path) -> None:
    """The retry meets 412 on the object it wrote itself: same bytes -> the write succeeded."""
    store = LostAnswerStore()
    coord = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    topic = coord.create_topic("t", 1)
    builder = SegmentBuilder()
    builder.append(topic.topic_id, 0, [Record(b"k", b"v", 1)])
    result = LogWriter(store, coord).write(builder)
    assert store.puts == 2  # the retry really hit the existing object
    assert result.base_offsets == [0]
    assert [r.value for r in LogReader(store, coord).read("t", 0, 0)] == [b"v"]
    coord.close()


def test_a_412_on_other_bytes_still_fails(tmp_path: Path) -> None:
    """Someone else's object under our key is never taken for ours."""
    store = MemoryStore()
    coord = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    writer = LogWriter(store, coord)
    store.put("segments/x/y.seg", b"not ours")
    with pytest.raises(PreconditionFailedError):
        writer._put_new("segments/x/y.seg", b"ours")
    coord.close()


class HalfCommitting(LocalCoordinator):
    """Commits partition 0's chunk and reports partition 1's shard as down, as a sharded
    coordinator does when one of its databases fails mid-commit."""

    def commit(self, object_key: str, chunks: Sequence[ChunkCommit]) -> list[int]:
        kept = [c for c in chunks if c.partition == 0]
        (base,) = super().commit(object_key, kept)
        raise PartialCommitError(
            "one shard failed",
            [base if c.partition == 0 else None for c in chunks],
            [None if c.partition == 0 else CoordinatorUnavailableError("down") for c in chunks],
        )


def test_a_partial_commit_tells_the_listeners_what_committed(tmp_path: Path) -> None:
    """The read cache and waiting fetches hear of the chunks that did commit (else a
    consumer of those partitions waits out its long-poll and reads the object again)."""
    coord = HalfCommitting(f"sqlite:///{tmp_path / 'meta.db'}")
    topic = coord.create_topic("t", 2)
    builder = SegmentBuilder()
    for p in (0, 1):
        builder.append(topic.topic_id, p, [Record(b"k", b"v%d" % p, 1)])
    writer = LogWriter(MemoryStore(), coord)
    heard: list[tuple[list[int], list[int]]] = []
    writer.listeners.append(
        lambda result, data: heard.append(
            ([c.partition for c in result.chunks], result.base_offsets)
        )
    )
    with pytest.raises(PartialCommitError):
        writer.write(builder)
    assert heard == [([0], [0])]
    coord.close()
