"""The Kafka Fetch handler's reads (``service.kafka.handlers``), over a real coordinator and
store in process."""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.local import LocalCoordinator
from index.log import LogWriter
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.types import Record
from service.kafka.handlers import _read_partitions
from service.read_cache import CachingLogReader, IndexCache, RangeCache


def batch_offsets(records: bytes) -> list[tuple[int, int]]:
    """(base offset, last offset) of each RecordBatch in a Fetch answer's records."""
    out = []
    at = 0
    while at < len(records):
        base, length = struct.unpack_from(">qi", records, at)
        (last_delta,) = struct.unpack_from(">i", records, at + 23)
        out.append((base, base + last_delta))
        at += 12 + length
    return out


class CommitAfterOffsets:
    """A coordinator through which a commit lands right after every ``offsets_many``
    answer: the Fetch has read its high watermarks, its reads come after the commit."""

    def __init__(self, coordinator: LocalCoordinator, commit: Any) -> None:
        self.inner = coordinator
        self.commit_next = commit

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def offsets_many(self, partitions: Any) -> Any:
        found = self.inner.offsets_many(partitions)
        self.commit_next()
        return found


def test_a_fetch_never_returns_records_past_the_high_watermark_it_reports(
    tmp_path: Path,
) -> None:
    """Issue 22 suspicion (b), proven: the race is a commit landing between the Fetch's
    read of the high watermarks and its read of the index. Expected: the answer's batches
    all end below the high watermark it reports (Kafka never serves past it)."""
    coordinator = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    store = open_store(f"file://{tmp_path / 'data'}")
    writer = LogWriter(store, coordinator)
    info = coordinator.create_topic("f", 1)
    written = 0

    def commit() -> None:
        nonlocal written
        b = SegmentBuilder()
        b.append(info.topic_id, 0, [Record(None, b"v%d" % (written + i), 1000) for i in range(5)])
        writer.write(b)
        written += 5

    commit()
    racing = CommitAfterOffsets(coordinator, commit)
    reader = CachingLogReader(
        store,
        racing,  # type: ignore[arg-type]
        RangeCache(1 << 20, 1 << 20),
        IndexCache(1000, 60),
    )
    state = SimpleNamespace(coordinator=racing, reader=reader)
    try:
        for offset in (0, 5):
            (read,) = _read_partitions(state, [("f", 0, offset, 1 << 20, None)], 1 << 20)  # type: ignore[arg-type]
            batches = batch_offsets(bytes(read.records))
            assert batches, "the fetch found nothing"
            assert batches[0][0] == offset
            assert max(last for _, last in batches) < read.high_watermark, (batches, read)
    finally:
        reader.close()
        coordinator.close()


def test_a_fetch_by_topic_id_of_a_recreated_topic_answers_unknown_topic_id(
    tmp_path: Path,
) -> None:
    """A Fetch v13+ names its topic by id; the agent's metadata (up to metadata_ttl_s old)
    may still map that id to the name a topic created again since now holds. Expected:
    UNKNOWN_TOPIC_ID and no record of the new topic; by name (or by the new id) the new
    topic's records."""
    coordinator = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    store = open_store(f"file://{tmp_path / 'data'}")
    writer = LogWriter(store, coordinator)
    old = coordinator.create_topic("r", 1)
    coordinator.delete_topic("r")
    new = coordinator.create_topic("r", 1)
    b = SegmentBuilder()
    b.append(new.topic_id, 0, [Record(None, b"new", 1000)])
    writer.write(b)
    reader = CachingLogReader(store, coordinator, RangeCache(1 << 20, 1 << 20), IndexCache(10, 60))
    state = SimpleNamespace(coordinator=coordinator, reader=reader)
    try:
        wanted = [("r", 0, 0, 1 << 20, old.topic_id), ("r", 0, 0, 1 << 20, new.topic_id)]
        by_old, by_new = _read_partitions(state, wanted, 1 << 20)  # type: ignore[arg-type]
        assert by_old.error == ErrorCode.unknown_topic_id and not by_old.records
        assert by_new.error == ErrorCode.none and batch_offsets(bytes(by_new.records)) == [(0, 0)]
        (by_name,) = _read_partitions(state, [("r", 0, 0, 1 << 20, None)], 1 << 20)  # type: ignore[arg-type]
        assert by_name.error == ErrorCode.none and by_name.records
    finally:
        reader.close()
        coordinator.close()
