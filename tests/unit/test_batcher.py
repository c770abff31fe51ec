"""The write batcher over a real LogWriter (memory store + SQLite LocalCoordinator)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.client import TopicInfo
from coordinator.local import LocalCoordinator
from index.log import LogReader, LogWriter
from segments.batches import encode_records
from segments.errors import (
    BufferFullError,
    CoordinatorUnavailableError,
    InternalError,
    InvalidTxnStateError,
    LakelogError,
    PartialCommitError,
    RecordTooLargeError,
    StorageUnavailableError,
)
from segments.memory import MemoryStore
from segments.segment import SegmentBuilder
from segments.types import ConsumedRecord, Record
from service.metrics import Metrics
from service.produce.batcher import (
    Batcher,
    BatcherConfig,
    PartlyCommittedError,
    RawBatch,
    group_records,
)


class FlakyStore(MemoryStore):
    """A memory store whose PUTs can be made to fail or to block."""

    def __init__(self) -> None:
        super().__init__("flaky")
        self.failure: BaseException | None = None  # raised by every PUT while set
        self.gate = threading.Event()
        self.gate.set()
        self.puts = 0

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> None:
        self.gate.wait(10)
        self.puts += 1
        if self.failure is not None:
            raise self.failure
        super().put(key, data, if_none_match=if_none_match)


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[LocalCoordinator]:
    c = LocalCoordinator(f"sqlite:///{tmp_path}/meta.db")
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def store() -> FlakyStore:
    return FlakyStore()


def rec(value: bytes, ts: int = 1_700_000_000_000) -> Record:
    return Record(b"k", value, ts)


def run(
    store: FlakyStore,
    coordinator: LocalCoordinator,
    config: BatcherConfig,
    body: Callable[[Batcher], Awaitable[Any]],
) -> tuple[Any, Metrics]:
    """Run ``body`` against a started Batcher, closing it afterwards."""
    metrics = Metrics()

    async def main() -> Any:
        batcher = Batcher(LogWriter(store, coordinator), config, metrics)
        await batcher.start()
        try:
            return await body(batcher)
        finally:
            await batcher.close()

    return asyncio.run(main()), metrics


def metric(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float:
    value = metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def test_concurrent_appends_get_contiguous_offsets_in_one_object_per_flush(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """Race: 40 requests over 2 topics x 8 partitions append concurrently into one buffer.

    Expected: every request gets offsets that read back its own records, offsets of
    each partition are 0..n-1 with no gap or duplicate, and the flush count equals the
    object count (one segment object per flush, however many partitions).
    """
    t1 = coordinator.create_topic("t1", 8)
    t2 = coordinator.create_topic("t2", 8)

    async def body(b: Batcher) -> list[tuple[TopicInfo, list[tuple[int, Record]], list[int]]]:
        async def one(i: int) -> tuple[TopicInfo, list[tuple[int, Record]], list[int]]:
            topic = (t1, t2)[i % 2]
            records = [(j % 8, rec(f"{i}-{j}".encode())) for j in range(i % 5 + 1)]
            return topic, records, await b.append(topic.topic_id, records)

        return list(await asyncio.gather(*(one(i) for i in range(40))))

    results, metrics = run(store, coordinator, BatcherConfig(linger_ms=20), body)
    reader = LogReader(store, coordinator)
    seen: dict[tuple[str, int], list[int]] = {}
    for topic, records, offsets in results:
        assert len(offsets) == len(records)
        for (partition, record), offset in zip(records, offsets, strict=True):
            got = reader.read(topic.name, partition, offset, max_bytes=1)[0]
            assert (got.offset, got.value) == (offset, record.value)
            seen.setdefault((topic.name, partition), []).append(offset)
    for offsets in seen.values():
        assert sorted(offsets) == list(range(len(offsets)))
    flushes = metric(metrics, "lakelog_flushes_total", {"result": "ok"})
    assert flushes >= 1
    assert len(list(store.list("segments/"))) == flushes == store.puts
    assert metric(metrics, "lakelog_produced_records_total") == sum(i % 5 + 1 for i in range(40))


def test_one_request_over_many_partitions_is_one_object(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    topic = coordinator.create_topic("wide", 500)

    async def body(b: Batcher) -> list[int]:
        return await b.append(topic.topic_id, [(p, rec(b"x")) for p in range(500)])

    offsets, _ = run(store, coordinator, BatcherConfig(linger_ms=5), body)
    assert offsets == [0] * 500
    assert len(list(store.list("segments/"))) == 1


def test_linger_delays_the_flush_and_flush_bytes_cuts_it_short(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    topic = coordinator.create_topic("t", 1)

    async def body(b: Batcher) -> tuple[float, float]:
        started = time.monotonic()
        await b.append(topic.topic_id, [(0, rec(b"small"))])
        lingered = time.monotonic() - started
        started = time.monotonic()
        await b.append(topic.topic_id, [(0, rec(b"x" * 4096))])  # over flush_bytes
        return lingered, time.monotonic() - started

    (lingered, cut), _ = run(
        store, coordinator, BatcherConfig(linger_ms=300, flush_bytes=1024), body
    )
    assert 0.29 <= lingered < 2.0
    assert cut < 0.25


@pytest.mark.parametrize(
    ("failure", "error_class", "retriable"),
    [
        # A bug (not a lakelog error): the same request would fail again, so it must
        # not be retried forever: non-retriable, logged with its traceback.
        (RuntimeError("disk on fire"), InternalError, False),
        (StorageUnavailableError("503 Slow Down"), StorageUnavailableError, True),
    ],
)
def test_failed_put_fails_exactly_that_flush(
    store: FlakyStore,
    coordinator: LocalCoordinator,
    failure: BaseException,
    error_class: type[LakelogError],
    retriable: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A PUT failure answers every request of that flush with the flush's error.

    Expected: requests of the failed flush get the error (none gets offsets), retriable
    only for a fault (never for an unexpected exception, whose traceback is logged);
    the next flush succeeds and starts at offset 0 (nothing of the failed flush was
    committed).
    """
    topic = coordinator.create_topic("t", 2)

    async def body(b: Batcher) -> tuple[list[Any], list[int]]:
        # A StorageUnavailableError is retried by LogWriter: it fails every attempt.
        store.failure = failure
        first = await asyncio.gather(
            b.append(topic.topic_id, [(0, rec(b"a")), (1, rec(b"b"))]),
            b.append(topic.topic_id, [(0, rec(b"c"))]),
            return_exceptions=True,
        )
        store.failure = None
        second = await b.append(topic.topic_id, [(0, rec(b"d")), (1, rec(b"e"))])
        return list(first), second

    (first, second), metrics = run(store, coordinator, BatcherConfig(linger_ms=20), body)
    for outcome in first:
        assert isinstance(outcome, error_class)
        assert outcome.retriable is retriable
        assert "disk on fire" not in outcome.message  # internals stay in the log
    assert second == [0, 0]
    tracebacks = [r for r in caplog.records if r.exc_info and r.name == "service.produce.batcher"]
    assert bool(tracebacks) is not retriable
    reader = LogReader(store, coordinator)
    assert [r.value for r in reader.read("t", 0, 0)] == [b"d"]
    assert [r.value for r in reader.read("t", 1, 0)] == [b"e"]
    assert metric(metrics, "lakelog_flushes_total", {"result": "error"}) == 1
    assert metric(metrics, "lakelog_produce_failed_records_total") == 3


def test_failed_commit_fails_the_flush_with_the_coordinators_error(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """The topic is deleted between append and commit: the commit's own error reaches
    the request (non-retriable TopicNotFoundError), and nothing is acked."""
    topic = coordinator.create_topic("doomed", 1)

    async def body(b: Batcher) -> BaseException | list[int]:
        store.gate.clear()  # hold the PUT until the topic is gone
        task = asyncio.ensure_future(b.append(topic.topic_id, [(0, rec(b"x"))]))
        await asyncio.sleep(0.1)
        coordinator.delete_topic("doomed")
        store.gate.set()
        try:
            return await task
        except LakelogError as exc:
            return exc

    outcome, _ = run(store, coordinator, BatcherConfig(linger_ms=1), body)
    assert isinstance(outcome, LakelogError)
    assert type(outcome).__name__ in ("TopicNotFoundError", "PartitionNotFoundError")


def test_buffer_full_waits_the_bound_then_raises(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """Race: a flush is stuck in its PUT while more records arrive.

    Expected: an append that does not fit waits buffer_wait_ms, then raises the
    retriable BufferFullError; one that fits is buffered; once the PUT finishes, the
    stuck and the buffered requests all get offsets (memory stays bounded meanwhile).
    """
    topic = coordinator.create_topic("t", 1)
    config = BatcherConfig(linger_ms=1, flush_bytes=1000, max_buffer_bytes=3000, buffer_wait_ms=300)

    async def body(b: Batcher) -> tuple[float, BaseException | None, list[list[int]]]:
        store.gate.clear()
        stuck = asyncio.ensure_future(b.append(topic.topic_id, [(0, rec(b"a" * 1500))]))
        await asyncio.sleep(0.1)  # the flush of `stuck` is now in flight, holding ~1.5 kB
        fits = asyncio.ensure_future(b.append(topic.topic_id, [(0, rec(b"b" * 1000))]))
        await asyncio.sleep(0.05)
        assert b.buffered_bytes <= config.max_buffer_bytes
        started = time.monotonic()
        error: BaseException | None = None
        try:
            await b.append(topic.topic_id, [(0, rec(b"c" * 1000))])
        except BufferFullError as exc:
            error = exc
        waited = time.monotonic() - started
        store.gate.set()
        return waited, error, [await stuck, await fits]

    (waited, error, offsets), metrics = run(store, coordinator, config, body)
    assert isinstance(error, BufferFullError)
    assert error.retriable
    assert 0.29 <= waited < 2.0
    assert offsets == [[0], [1]]
    assert metric(metrics, "lakelog_buffer_full_total") == 1


def test_waiting_append_is_admitted_when_the_flush_frees_space(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """An append that waits for space gets in once the in-flight flush completes."""
    topic = coordinator.create_topic("t", 1)
    config = BatcherConfig(
        linger_ms=1, flush_bytes=1000, max_buffer_bytes=2000, buffer_wait_ms=5000
    )

    async def body(b: Batcher) -> list[list[int]]:
        store.gate.clear()
        first = asyncio.ensure_future(b.append(topic.topic_id, [(0, rec(b"a" * 1500))]))
        await asyncio.sleep(0.1)
        second = asyncio.ensure_future(b.append(topic.topic_id, [(0, rec(b"b" * 1500))]))
        await asyncio.sleep(0.1)
        assert not second.done()
        store.gate.set()
        return [await first, await second]

    offsets, _ = run(store, coordinator, config, body)
    assert offsets == [[0], [1]]


def test_records_larger_than_the_whole_buffer_are_refused_at_once(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    topic = coordinator.create_topic("t", 1)

    async def body(b: Batcher) -> BaseException | None:
        try:
            await b.append(topic.topic_id, [(0, rec(b"x" * 5000))])
        except RecordTooLargeError as exc:
            return exc
        return None

    error, _ = run(store, coordinator, BatcherConfig(flush_bytes=1000, max_buffer_bytes=2000), body)
    assert isinstance(error, RecordTooLargeError)
    assert store.puts == 0


def test_close_flushes_what_is_buffered(store: FlakyStore, coordinator: LocalCoordinator) -> None:
    """close() during a long linger still writes and acks the buffered records."""
    topic = coordinator.create_topic("t", 1)
    metrics = Metrics()

    async def main() -> list[int]:
        b = Batcher(LogWriter(store, coordinator), BatcherConfig(linger_ms=60_000), metrics)
        await b.start()
        task = asyncio.ensure_future(b.append(topic.topic_id, [(0, rec(b"x")), (0, rec(b"y"))]))
        await asyncio.sleep(0.05)
        assert not task.done()
        started = time.monotonic()
        await b.close()
        assert time.monotonic() - started < 5
        return await task

    assert asyncio.run(main()) == [0, 1]
    assert [r.value for r in LogReader(store, coordinator).read("t", 0, 0)] == [b"x", b"y"]


def test_cancelled_request_does_not_break_its_flush(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """A request whose client went away (task cancelled) leaves the shared flush intact."""
    topic = coordinator.create_topic("t", 1)

    async def body(b: Batcher) -> list[int]:
        gone = asyncio.ensure_future(b.append(topic.topic_id, [(0, rec(b"gone"))]))
        kept = asyncio.ensure_future(b.append(topic.topic_id, [(0, rec(b"kept"))]))
        await asyncio.sleep(0)
        gone.cancel()
        return await kept

    offsets, _ = run(store, coordinator, BatcherConfig(linger_ms=50), body)
    assert offsets == [1]


def test_a_refused_request_leaves_none_of_its_records_behind(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """One request spans two partitions and the builder refuses its second group (a
    timestamp out of range: callers validate records, so this stands for a bug).

    Expected: the request fails with a non-retriable InternalError and none of its
    records is flushed (before, the first partition's records were flushed while the
    request failed, so a retry stored them twice); a request that shares the buffer
    is unaffected.
    """
    topic = coordinator.create_topic("t", 2)

    async def body(b: Batcher) -> list[int]:
        other = asyncio.ensure_future(b.append(topic.topic_id, [(0, rec(b"other"))]))
        await asyncio.sleep(0)  # "other" is in the buffer first
        with pytest.raises(InternalError) as refused:
            await b.append(topic.topic_id, [(0, rec(b"good")), (1, rec(b"bad", ts=-5))])
        assert not refused.value.retriable
        return await other

    other_offsets, _ = run(store, coordinator, BatcherConfig(linger_ms=20), body)
    assert other_offsets == [0]
    reader = LogReader(store, coordinator)
    assert [r.value for r in reader.read("t", 0, 0)] == [b"other"]
    assert reader.read("t", 1, 0) == []


def test_a_builder_failing_part_way_discards_its_buffer(
    store: FlakyStore, coordinator: LocalCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The builder raises after encoding the first of two groups (a codec bug).

    Expected: that buffer is never flushed (it holds records of a failed request):
    the failing request gets a non-retriable InternalError, the request that shared
    the buffer a retriable error (nothing of it was stored), and the next request
    is stored from offset 0.
    """
    topic = coordinator.create_topic("t", 2)
    real = SegmentBuilder._append_prepared
    calls = {"n": 0}

    def flaky(self: SegmentBuilder, *args: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # "other", then "good", then the second group of the request
            raise MemoryError("codec blew up")
        real(self, *args)

    monkeypatch.setattr(SegmentBuilder, "_append_prepared", flaky)

    async def body(b: Batcher) -> tuple[BaseException | list[int], list[int]]:
        other = asyncio.ensure_future(b.append(topic.topic_id, [(0, rec(b"other"))]))
        await asyncio.sleep(0)
        with pytest.raises(InternalError):
            await b.append(topic.topic_id, [(0, rec(b"good")), (1, rec(b"next"))])
        shared = await asyncio.gather(other, return_exceptions=True)
        return shared[0], await b.append(topic.topic_id, [(1, rec(b"after"))])

    (shared, after), _ = run(store, coordinator, BatcherConfig(linger_ms=20), body)
    assert isinstance(shared, BufferFullError) and shared.retriable
    assert after == [0]
    reader = LogReader(store, coordinator)
    assert reader.read("t", 0, 0) == []
    assert [r.value for r in reader.read("t", 1, 0)] == [b"after"]


class FirstPutBlocks(MemoryStore):
    """A memory store whose first PUT waits for ``release``; records PUTs as they end."""

    def __init__(self) -> None:
        super().__init__("first-blocks")
        self.release = threading.Event()
        self.first_started = threading.Event()
        self.later_done = threading.Event()
        self.done: list[str] = []
        self._first = True
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> None:
        with self._lock:
            first, self._first = self._first, False
        if first:
            self.first_started.set()
            assert self.release.wait(10)
        super().put(key, data, if_none_match=if_none_match)
        self.done.append("first" if first else "later")
        if not first:
            self.later_done.set()


@pytest.mark.parametrize("flights", [1, 2])
def test_two_flushes_in_flight_overlap_their_puts_and_commit_in_append_order(
    coordinator: LocalCoordinator, flights: int
) -> None:
    """Race: flush A's PUT hangs while request B (same partition) is appended and
    flushed. Expected with 2 in flight: B's PUT completes while A's hangs, yet B is not
    answered before A commits, and A gets offset 0, B offset 1 (commit order = append
    order). With 1 in flight B's PUT waits for A's flush to end."""
    topic = coordinator.create_topic("flights", 1)
    store = FirstPutBlocks()
    metrics = Metrics()

    async def main() -> tuple[list[int], list[int], list[str]]:
        batcher = Batcher(
            LogWriter(store, coordinator),
            BatcherConfig(linger_ms=0, flushes_in_flight=flights),
            metrics,
        )
        await batcher.start()
        try:
            a = asyncio.create_task(batcher.append(topic.topic_id, [(0, rec(b"a"))]))
            assert await asyncio.to_thread(store.first_started.wait, 10)
            b = asyncio.create_task(batcher.append(topic.topic_id, [(0, rec(b"b"))]))
            # B's PUT (with 2 in flight) ends well within this; with 1 it never starts.
            await asyncio.to_thread(store.later_done.wait, 1.0)
            seen = list(store.done)
            assert not a.done() and not b.done()  # B may not be answered before A commits
            store.release.set()
            return await a, await b, seen
        finally:
            await batcher.close()

    a, b, seen_while_a_hung = asyncio.run(main())
    assert (a, b) == ([0], [1])
    assert seen_while_a_hung == (["later"] if flights == 2 else [])
    assert store.done == ["later", "first"] if flights == 2 else ["first", "later"]


class ShardDown:
    """A coordinator whose partitions in ``down`` live on a shard that is unavailable:
    commits go through for the other chunks and raise PartialCommitError, as the sharded
    store does (``coordinator.shards``)."""

    def __init__(self, inner: LocalCoordinator, down: set[int]) -> None:
        self.inner = inner
        self.down = down

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def commit(self, object_key: str, chunks: list[Any]) -> list[int]:
        up = [c for c in chunks if c.partition not in self.down]
        if len(up) == len(chunks):
            return self.inner.commit(object_key, chunks)
        failure = CoordinatorUnavailableError("shard s2 is unavailable")
        if not up:
            raise failure
        bases = iter(self.inner.commit(object_key, up))
        answers = [None if c.partition in self.down else next(bases) for c in chunks]
        failures = [failure if c.partition in self.down else None for c in chunks]
        raise PartialCommitError("1 of 2 shards failed", answers, failures)


def test_a_partly_committed_flush_answers_each_request_by_its_partitions(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """One flush, three requests: on the partition that committed, on the one whose shard
    is down, on both. The first is acked; the second gets the shard's retriable error
    (nothing of it was stored); the third a PartlyCommittedError saying which of its
    records were stored, at which offsets, and why the others were not."""
    topic = coordinator.create_topic("halves", 2)
    shard = ShardDown(coordinator, {1})

    async def body(b: Batcher) -> list[Any]:
        async def one(records: list[tuple[int, Record]]) -> Any:
            try:
                return await b.append(topic.topic_id, records)
            except LakelogError as exc:
                return exc

        first = await asyncio.gather(
            one([(0, rec(b"a")), (0, rec(b"b"))]),
            one([(1, rec(b"c"))]),
            one([(0, rec(b"d")), (1, rec(b"e"))]),
        )
        shard.down.clear()
        return [*first, await one([(1, rec(b"c"))])]

    metrics = Metrics()

    async def main() -> Any:
        batcher = Batcher(LogWriter(store, shard), BatcherConfig(linger_ms=30), metrics)  # type: ignore[arg-type]
        await batcher.start()
        try:
            return await body(batcher)
        finally:
            await batcher.close()

    acked, down, both, retried = asyncio.run(main())
    assert acked == [0, 1]
    assert isinstance(down, CoordinatorUnavailableError) and down.retriable
    assert isinstance(both, PartlyCommittedError) and both.retriable
    assert both.offsets == [2, None]  # b"d" after b"a", b"b"; b"e" not stored
    assert both.errors[0] is None and isinstance(both.errors[1], CoordinatorUnavailableError)
    assert retried == [0]  # partition 1 never took the failed records
    assert coordinator.offsets("halves", 0).high_watermark == 3  # b"d" was stored too
    assert metric(metrics, "lakelog_flushes_total", {"result": "partial"}) == 1


def test_a_partly_committed_kafka_request_answers_each_batch(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """append_batches (Kafka Produce) over a partition that committed and one whose shard
    is down: a PartlyCommittedError with the first batch's offset and the second's error
    (the Produce handler answers each partition with its own code)."""
    topic = coordinator.create_topic("kafka-halves", 2)
    shard = ShardDown(coordinator, {1})

    def raw(partition: int, value: bytes) -> RawBatch:
        data = encode_records([ConsumedRecord("kafka-halves", partition, 0, None, value, 5, ())])
        return RawBatch(topic.topic_id, partition, data, 1, 5, 5)

    async def main() -> Any:
        batcher = Batcher(LogWriter(store, shard), BatcherConfig(linger_ms=30), Metrics())  # type: ignore[arg-type]
        await batcher.start()
        try:
            return await batcher.append_batches([raw(0, b"up"), raw(1, b"down")])
        except PartlyCommittedError as exc:
            return exc
        finally:
            await batcher.close()

    partly = asyncio.run(main())
    assert isinstance(partly, PartlyCommittedError)
    assert partly.offsets == [0, None]
    assert isinstance(partly.errors[1], CoordinatorUnavailableError)
    assert coordinator.offsets("kafka-halves", 0).high_watermark == 1
    assert coordinator.offsets("kafka-halves", 1).high_watermark == 0


def test_a_refused_request_key_fails_only_its_own_request(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """Race: one flush holds a keyed request whose key another agent stored since this
    agent's gate looked (modelled by sending the key twice; only the commit checks it)
    and another client's plain request. Only the keyed request fails: the commit refuses
    the object, and the batcher commits the other requests again without it."""
    from coordinator.log.producers import RequestKey

    topic = coordinator.create_topic("refused", 2)
    now = int(time.time() * 1000)
    key = RequestKey("k1", "digest", 0, 0, now, now + 60_000)

    async def body(b: Batcher) -> Any:
        await b.append(topic.topic_id, [(0, rec(b"first"))], key)
        return await asyncio.gather(
            b.append(topic.topic_id, [(0, rec(b"again"))], key),
            b.append(topic.topic_id, [(1, rec(b"other client"))]),
            return_exceptions=True,
        )

    (keyed, other), _ = run(store, coordinator, BatcherConfig(linger_ms=50), body)
    assert isinstance(keyed, LakelogError)
    assert other == [0], other
    reader = LogReader(store, coordinator)
    assert [r.value for r in reader.read("refused", 0, 0)] == [b"first"]
    assert [r.value for r in reader.read("refused", 1, 0)] == [b"other client"]


def test_a_refused_idempotent_batch_fails_only_its_request_and_the_rest_keep_order(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """One flush: plain batch A, an idempotent producer's duplicate D (refused only at
    commit: the sequence was stored by an earlier flush), plain B, all on partition 0,
    and a REST request C on partition 1. D alone fails; A, B and C are committed in
    append order at offsets that skip nothing and serve exactly their records."""
    topic = coordinator.create_topic("dup", 2)
    pid, _ = coordinator.init_producer_id()

    def raw(value: bytes, producer: tuple[int, int, int] | None = None) -> RawBatch:
        data = encode_records([ConsumedRecord("dup", 0, 0, None, value, 5, ())])
        return RawBatch(topic.topic_id, 0, data, 1, 5, 5, producer)

    async def body(b: Batcher) -> Any:
        assert await b.append_batches([raw(b"seq0", (pid, 0, 0))]) == [0]
        return await asyncio.gather(
            b.append_batches([raw(b"A")]),
            b.append_batches([raw(b"seq0 again", (pid, 0, 0))]),
            b.append_batches([raw(b"B1"), raw(b"B2")]),
            b.append(topic.topic_id, [(1, rec(b"C"))]),
            return_exceptions=True,
        )

    (a, dup, b2, c), _ = run(store, coordinator, BatcherConfig(linger_ms=50), body)
    assert isinstance(dup, LakelogError), dup
    assert (a, b2, c) == ([1], [2, 3], [0]), (a, b2, c)
    reader = LogReader(store, coordinator)
    assert [(r.offset, r.value) for r in reader.read("dup", 0, 0)] == [
        (0, b"seq0"),
        (1, b"A"),
        (2, b"B1"),
        (3, b"B2"),
    ]
    assert [r.value for r in reader.read("dup", 1, 0)] == [b"C"]


def test_a_refused_transactional_batch_fails_only_its_request(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """One flush: a transactional producer's batch for a partition its transaction did
    not add (refused only at commit: KIP-890's verification) and another client's plain
    batch. The transactional request alone fails, with INVALID_TXN_STATE's error; the
    other is committed (not failed with it, as one flush's commit is)."""
    topic = coordinator.create_topic("txn-refused", 1)
    txn = coordinator.init_transaction("tx", 60_000)

    def raw(value: bytes, producer: tuple[int, int, int] | None = None) -> RawBatch:
        data = encode_records([ConsumedRecord("txn-refused", 0, 0, None, value, 5, ())])
        return RawBatch(
            topic.topic_id, 0, data, 1, 5, 5, producer, transactional=producer is not None
        )

    async def body(b: Batcher) -> Any:
        return await asyncio.gather(
            b.append_batches([raw(b"not added", (txn.producer_id, txn.epoch, 0))]),
            b.append_batches([raw(b"plain")]),
            return_exceptions=True,
        )

    (refused, plain), _ = run(store, coordinator, BatcherConfig(linger_ms=50), body)
    assert isinstance(refused, InvalidTxnStateError), refused
    assert plain == [0], plain
    reader = LogReader(store, coordinator)
    assert [r.value for r in reader.read("txn-refused", 0, 0)] == [b"plain"]


def test_grouped_append_answers_offsets_in_request_order(
    store: FlakyStore, coordinator: LocalCoordinator
) -> None:
    """``append_grouped`` (a REST route's records, grouped as they were placed): records
    of interleaved partitions get their offsets in request order, after what another
    request appended to the same partitions, and read back as sent."""
    topic = coordinator.create_topic("g", 3)
    first = [(1, rec(b"a")), (1, rec(b"b"))]
    placed = [(2, rec(b"x0")), (1, rec(b"y0")), (2, rec(b"x1")), (0, rec(b"z0")), (1, rec(b"y1"))]

    async def body(b: Batcher) -> list[int]:
        before = asyncio.ensure_future(b.append(topic.topic_id, first))
        await asyncio.sleep(0)  # buffered first: its records come first in partition 1
        offsets = await b.append_grouped(topic.topic_id, group_records(placed))
        assert await before == [0, 1]
        return list(offsets)

    offsets, metrics = run(store, coordinator, BatcherConfig(linger_ms=20), body)
    assert offsets == [0, 2, 1, 0, 3]
    reader = LogReader(store, coordinator)
    for (partition, record), offset in zip(placed, offsets, strict=True):
        assert reader.read("g", partition, offset, max_bytes=1)[0].value == record.value
    assert metric(metrics, "lakelog_produced_records_total") == len(first) + len(placed)
