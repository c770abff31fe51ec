"""The Kafka Fetch handler's reads (``service.kafka.handlers``), over a real coordinator and
store in process."""

from __future__ import annotations

import struct
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.local import LocalCoordinator
from index.cache import IndexCache
from index.log import LogReader, LogWriter
from segments.errors import StorageUnavailableError
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.types import Record
from service.kafka.handlers import _read_partitions
from service.read_cache import CachingLogReader, RangeCache


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


class CountingStore:
    """A store that records its ranged GETs; ``fail`` makes them raise."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.gets: list[tuple[str, int, int]] = []
        self.fail: Exception | None = None
        self.lock = threading.Lock()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self.lock:
            self.gets.append((key, start, length))
        if self.fail is not None:
            raise self.fail
        data: bytes = self.store.get_range(key, start, length)
        return data


def _many_partitions(tmp_path: Path, partitions: int, objects: int) -> tuple[Any, Any, Any]:
    """A topic of ``partitions`` partitions written as ``objects`` segment objects, each
    holding a chunk of 3 records of every partition (as a flush at 1,000 partitions does)."""
    coordinator = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    store = open_store(f"file://{tmp_path / 'data'}")
    writer = LogWriter(store, coordinator)
    info = coordinator.create_topic("wide", partitions)
    for o in range(objects):
        b = SegmentBuilder()
        for p in range(partitions):
            b.append(
                info.topic_id, p, [Record(None, b"%d-%d-%d" % (o, p, i), 1000) for i in range(3)]
            )
        writer.write(b)
    return coordinator, store, info


def _fetch_all(state: Any, partitions: int, max_bytes: int = 1 << 20) -> list[Any]:
    wanted = [("wide", p, 0, 1 << 20, None) for p in range(partitions)]
    return _read_partitions(state, wanted, max_bytes)  # type: ignore[arg-type]


def _reader(store: Any, coordinator: Any, **kwargs: Any) -> CachingLogReader:
    return CachingLogReader(
        store, coordinator, RangeCache(1 << 20, 8 << 20), IndexCache(100_000, 60), **kwargs
    )


def test_a_fetch_of_many_partitions_reads_each_object_once(tmp_path: Path) -> None:
    """Issue 29: at 1,000 partitions an object holds a small chunk of every partition, and a
    catch-up Fetch sent one ranged GET per chunk (27x slower than at 8 partitions).
    Expected: one GET per object for a Fetch of all partitions (more objects than GETs in
    flight at once, read_ahead=2), and the same answer as a reader without a cache."""
    coordinator, store, _ = _many_partitions(tmp_path, 40, 5)
    counting = CountingStore(store)
    reader = _reader(counting, coordinator, read_ahead=2)
    plain = SimpleNamespace(coordinator=coordinator, reader=LogReader(store, coordinator))
    try:
        reads = _fetch_all(SimpleNamespace(coordinator=coordinator, reader=reader), 40)
        expected = _fetch_all(plain, 40)
        assert [r.error for r in reads] == [ErrorCode.none] * 40
        assert [bytes(r.records) for r in reads] == [bytes(r.records) for r in expected]
        assert all(batch_offsets(bytes(r.records))[-1][1] == 14 for r in reads)
        assert len(counting.gets) == 5
        assert len({key for key, _, _ in counting.gets}) == 5
        # Everything is cached now: the same Fetch again sends no GET.
        again = _fetch_all(SimpleNamespace(coordinator=coordinator, reader=reader), 40)
        assert [bytes(r.records) for r in again] == [bytes(r.records) for r in expected]
        assert len(counting.gets) == 5
    finally:
        reader.close()
        coordinator.close()


def test_a_run_longer_than_the_span_limit_takes_several_gets(tmp_path: Path) -> None:
    """One GET reads at most ``max_span`` bytes (bounded memory per GET in flight): a
    Fetch wanting a whole object longer than that reads it in several GETs, none over
    the limit (except a chunk longer than it, read alone), and answers the same."""
    coordinator, store, _ = _many_partitions(tmp_path, 40, 2)
    counting = CountingStore(store)
    chunk = coordinator.lookup("wide", 0, 0)[0].length
    reader = _reader(counting, coordinator, max_span=10 * chunk)
    plain = SimpleNamespace(coordinator=coordinator, reader=LogReader(store, coordinator))
    try:
        reads = _fetch_all(SimpleNamespace(coordinator=coordinator, reader=reader), 40)
        assert [bytes(r.records) for r in reads] == [
            bytes(r.records) for r in _fetch_all(plain, 40)
        ]
        assert all(length <= 10 * chunk + 40 for _, _, length in counting.gets)
        assert 2 * 4 <= len(counting.gets) < 2 * 40
    finally:
        reader.close()
        coordinator.close()


def test_a_fetch_reads_ahead_no_more_than_its_max_bytes(tmp_path: Path) -> None:
    """The GETs before the reads are planned within the Fetch's max_bytes: a Fetch of
    40 partitions with room for 5 partitions' records reads those, and the first entry
    of each other partition (the read opens it to see whether its first batch fits),
    not the other partitions' other entries."""
    coordinator, store, _ = _many_partitions(tmp_path, 40, 3)
    counting = CountingStore(store)
    reader = _reader(counting, coordinator)
    first = coordinator.lookup("wide", 0, 0)
    per_partition = sum(r.length for r in first)
    try:
        reads = _fetch_all(
            SimpleNamespace(coordinator=coordinator, reader=reader), 40, 5 * per_partition
        )
        assert sum(len(r.records) for r in reads) <= 5 * per_partition
        assert [bool(r.records) for r in reads] == [True] * 5 + [False] * 35
        assert reader.wait_read_ahead(10)
        fetched = sum(length for _, _, length in counting.gets)
        assert fetched <= 5 * per_partition + 35 * (first[0].length + 8)
        assert len(counting.gets) == 3
    finally:
        reader.close()
        coordinator.close()


def test_a_fetch_starts_reading_what_the_next_fetch_wants(tmp_path: Path) -> None:
    """Read-ahead by runs: a Fetch whose partitions each take 2 entries reads those and
    starts on the next 2 of each, one GET per object; the next Fetch sends no GET."""
    coordinator, store, _ = _many_partitions(tmp_path, 8, 6)
    counting = CountingStore(store)
    reader = _reader(counting, coordinator)
    state = SimpleNamespace(coordinator=coordinator, reader=reader)
    two = sum(r.length for r in coordinator.lookup("wide", 0, 0)[:2])
    try:
        wanted = [("wide", p, 0, two, None) for p in range(8)]
        reads = _read_partitions(state, wanted, 1 << 20)  # type: ignore[arg-type]
        assert all(batch_offsets(bytes(r.records))[-1][1] == 5 for r in reads)
        assert reader.wait_read_ahead(10)
        assert len(counting.gets) == 4  # objects 0-1 now, 2-3 ahead
        wanted = [("wide", p, 6, two, None) for p in range(8)]
        reads = _read_partitions(state, wanted, 1 << 20)  # type: ignore[arg-type]
        assert all(batch_offsets(bytes(r.records))[-1][1] == 11 for r in reads)
        assert reader.wait_read_ahead(10)
        assert len(counting.gets) == 6  # objects 4-5 ahead
    finally:
        reader.close()
        coordinator.close()


def test_a_failed_get_of_a_run_fails_its_partitions_as_a_failed_chunk_get_does(
    tmp_path: Path,
) -> None:
    """The store failing: every partition answers the retriable storage error, nothing is
    cached, and the next Fetch (store back) reads everything."""
    coordinator, store, _ = _many_partitions(tmp_path, 10, 2)
    counting = CountingStore(store)
    counting.fail = StorageUnavailableError("S3 is down")
    reader = _reader(counting, coordinator)
    state = SimpleNamespace(coordinator=coordinator, reader=reader)
    try:
        reads = _fetch_all(state, 10)
        assert {r.error for r in reads} == {ErrorCode.kafka_storage_error}
        assert all(not r.records for r in reads)
        counting.fail = None
        reads = _fetch_all(state, 10)
        assert [r.error for r in reads] == [ErrorCode.none] * 10
        assert all(batch_offsets(bytes(r.records))[-1][1] == 5 for r in reads)
    finally:
        reader.close()
        coordinator.close()


def test_a_fetch_over_more_objects_than_one_lookup_page_reads_each_object_once(
    tmp_path: Path,
) -> None:
    """Each partition's chunks in 20 objects, more than one index lookup returns (16): the
    reads before the Fetch follow the index page after page, so each object is still read
    with one GET (not the first 16 with one GET each and the rest chunk by chunk)."""
    coordinator, store, _ = _many_partitions(tmp_path, 10, 20)
    assert len(coordinator.lookup("wide", 0, 0)) == 16
    counting = CountingStore(store)
    reader = _reader(counting, coordinator)
    plain = SimpleNamespace(coordinator=coordinator, reader=LogReader(store, coordinator))
    try:
        reads = _fetch_all(SimpleNamespace(coordinator=coordinator, reader=reader), 10)
        assert [bytes(r.records) for r in reads] == [
            bytes(r.records) for r in _fetch_all(plain, 10)
        ]
        assert all(batch_offsets(bytes(r.records))[-1][1] == 59 for r in reads)
        assert len(counting.gets) == 20
    finally:
        reader.close()
        coordinator.close()


def test_a_read_committed_fetch_stops_at_the_last_stable_offset_inside_a_chunk(
    tmp_path: Path,
) -> None:
    """One chunk holds a plain batch (offsets 0-1), then an open transaction's batch
    (2-4): a read_committed Fetch returns the first batch only and reports the last
    stable offset 2; read_uncommitted returns both. Once the transaction aborts, the
    answer names it (producer id, first offset 2) and holds its abort marker (5)."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from coordinator.client import ChunkCommit, TopicPartition
    from coordinator.log.producers import ProducerBatch
    from service.kafka.handlers import LATEST, _offset_for

    coordinator = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    store = open_store(f"file://{tmp_path / 'data'}")
    writer = LogWriter(store, coordinator)
    info = coordinator.create_topic("x", 1)
    txn = coordinator.init_transaction("app", 60_000)
    pid, epoch = txn.producer_id, txn.epoch
    coordinator.add_txn_partitions("app", pid, epoch, [TopicPartition("x", 0)])

    def raw(count: int, producer: tuple[int, int, int] | None) -> bytes:
        p = producer or (-1, -1, -1)
        b = DefaultRecordBatchBuilder(2, 0, int(producer is not None), *p, 1 << 20)
        for i in range(count):
            b.append(i, 1000, None, b"v", [])
        return bytes(b.build())

    seg = SegmentBuilder()
    seg.append_batch(info.topic_id, 0, raw(2, None), 2, 1000, 1000)
    seg.append_batch(info.topic_id, 0, raw(3, (pid, epoch, 0)), 3, 1000, 1000)
    data, [chunk] = seg.build()
    store.put("segments/aa/txn.seg", data)
    coordinator.commit(
        "segments/aa/txn.seg",
        [
            ChunkCommit(
                info.topic_id,
                0,
                chunk.position,
                chunk.length,
                5,
                1000,
                1000,
                producer_batches=(ProducerBatch(pid, epoch, 0, 3, 2, transactional=True),),
            )
        ],
    )
    reader = CachingLogReader(store, coordinator, RangeCache(1 << 20, 1 << 20), IndexCache(10, 60))
    state = SimpleNamespace(coordinator=coordinator, reader=reader, txns=coordinator)
    want = [("x", 0, 0, 1 << 20, None)]
    try:
        (committed,) = _read_partitions(state, want, 1 << 20, True)  # type: ignore[arg-type]
        assert batch_offsets(bytes(committed.records)) == [(0, 1)]
        assert (committed.high_watermark, committed.last_stable) == (5, 2)
        assert committed.aborted == ()
        (everything,) = _read_partitions(state, want, 1 << 20)  # type: ignore[arg-type]
        assert batch_offsets(bytes(everything.records)) == [(0, 1), (2, 4)]
        assert everything.last_stable is None
        (at_lso,) = _read_partitions(state, [("x", 0, 2, 1 << 20, None)], 1 << 20, True)  # type: ignore[arg-type]
        assert at_lso.error == ErrorCode.none and not at_lso.records
        assert _offset_for(state, "x", 0, LATEST, True) == (2, -1)  # type: ignore[arg-type]
        assert _offset_for(state, "x", 0, LATEST) == (5, -1)  # type: ignore[arg-type]

        pending = coordinator.end_transaction("app", pid, epoch, False)
        assert pending is not None
        writer.write_markers(pending)
        (after,) = _read_partitions(state, want, 1 << 20, True)  # type: ignore[arg-type]
        assert batch_offsets(bytes(after.records)) == [(0, 1), (2, 4), (5, 5)]
        assert (after.last_stable, after.aborted) == (6, ((pid, 2, 5),))
    finally:
        reader.close()
        coordinator.close()
