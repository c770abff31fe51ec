"""The read cache: two LRU budgets, coalesced fetches, the index cache, the caching reader."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coordinator.client import ChunkRef, IndexWant
from coordinator.janitors.catalog import Catalog
from coordinator.janitors.context import JanitorConfig, JanitorContext
from coordinator.janitors.tiering import run_tiering
from coordinator.local import LocalCoordinator
from index.cache import IndexCache
from index.log import LogWriter, PartitionWant, WriteResult
from segments.errors import CorruptSegmentError, StorageUnavailableError, TopicNotFoundError
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.types import ChunkInfo, Record
from service.consume.metrics import ConsumeMetrics
from service.read_cache import CachingLogReader, RangeCache, plan_spans


def key(i: int) -> tuple[str, int, int]:
    return (f"obj-{i}", 0, 10)


def fail() -> bytes:
    raise AssertionError("must be served from the cache")


# -- budgets ------------------------------------------------------------------------


def test_history_budget_evicts_least_recently_used() -> None:
    cache = RangeCache(tail_bytes=0, history_bytes=100, entry_overhead=0)
    for i in range(3):
        cache.get_or_fetch(key(i), functools.partial(bytes, [i] * 40))
    assert cache.get(key(0)) is None  # 120 > 100: the oldest went
    assert cache.get(key(1)) == b"\x01" * 40
    assert cache.sizes() == (0, 80)


def test_use_refreshes_an_entry() -> None:
    cache = RangeCache(tail_bytes=0, history_bytes=100, entry_overhead=0)
    cache.get_or_fetch(key(0), lambda: b"a" * 40)
    cache.get_or_fetch(key(1), lambda: b"b" * 40)
    assert cache.get(key(0)) is not None  # now most recent
    cache.get_or_fetch(key(2), lambda: b"c" * 40)
    assert cache.get(key(1)) is None
    assert cache.get(key(0)) == b"a" * 40


def test_a_range_larger_than_the_budget_is_not_kept() -> None:
    cache = RangeCache(tail_bytes=10, history_bytes=10, entry_overhead=0)
    cache.put_tail(key(0), b"x" * 11)
    cache.get_or_fetch(key(1), lambda: b"y" * 11)
    assert cache.sizes() == (0, 0)


def test_lagging_reader_does_not_evict_the_tail() -> None:
    """History churn 10x its budget leaves every tail range in place (separate budgets)."""
    cache = RangeCache(tail_bytes=100, history_bytes=100, entry_overhead=0)
    for i in range(5):
        cache.put_tail(key(i), b"t" * 20)
    for i in range(100, 150):
        cache.get_or_fetch(key(i), lambda: b"h" * 20)
    for i in range(5):
        assert cache.get_or_fetch(key(i), fail) == b"t" * 20
    assert cache.stats.tail_hits == 5
    assert cache.sizes() == (100, 100)


def test_tiny_ranges_are_bounded_by_what_they_really_cost() -> None:
    """100,000 ranges of 10 bytes under a 1 MiB budget: each is counted with its
    bookkeeping (~256 B), so about 4,000 stay, not 100,000 (25 MB of real memory)."""
    cache = RangeCache(tail_bytes=1 << 20, history_bytes=0)
    for i in range(100_000):
        cache.put_tail(("segments/x.seg", i * 10, 10), b"x" * 10)
    assert cache.sizes()[0] <= 1 << 20
    assert len(cache._tail.entries) == (1 << 20) // (10 + 256)


def test_on_write_caches_every_chunk_of_the_object() -> None:
    cache = RangeCache(tail_bytes=1000, history_bytes=0, entry_overhead=0)
    data = b"AAAABBBBBBfooter"
    chunks = [
        ChunkInfo(b"t" * 16, 0, 0, 4, 1, 0, 0),
        ChunkInfo(b"t" * 16, 1, 4, 6, 1, 0, 0),
    ]
    cache.on_write(WriteResult("segments/x.seg", len(data), chunks, [0, 0]), data)
    assert cache.get_or_fetch(("segments/x.seg", 0, 4), fail) == b"AAAA"
    assert cache.get_or_fetch(("segments/x.seg", 4, 6), fail) == b"BBBBBB"
    assert cache.sizes() == (10, 0)


# -- coalescing ---------------------------------------------------------------------------


def test_concurrent_fetches_of_one_range_send_one_get_threads() -> None:
    """Race: 8 threads miss the same range at once. Expected: one fetch, 7 coalesced
    waiters, all 8 get the same bytes."""
    metrics = ConsumeMetrics()
    cache = RangeCache(tail_bytes=0, history_bytes=1000, metrics=metrics)
    calls = 0
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def slow_get() -> bytes:
        nonlocal calls
        with lock:
            calls += 1
        time.sleep(0.2)
        return b"payload"

    results: list[bytes] = []

    def reader() -> None:
        barrier.wait()
        results.append(cache.get_or_fetch(key(0), slow_get))

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert calls == 1
    assert results == [b"payload"] * 8
    assert cache.stats.misses == 1
    assert cache.stats.coalesced == 7
    assert metrics.cache_coalesced._value.get() == 7


def test_concurrent_fetches_of_one_range_send_one_get_tasks() -> None:
    """Race: 4 asyncio tasks read the same range through worker threads. Expected:
    one fetch, and a different range fetched meanwhile is not held up by it (the two
    fetches meet inside: were one waiting for the other, the barrier would break)."""
    cache = RangeCache(tail_bytes=0, history_bytes=1000)
    calls: list[str] = []
    both_in_flight = threading.Barrier(2, timeout=10)

    def slow(name: str) -> bytes:
        calls.append(name)
        both_in_flight.wait()
        return name.encode()

    async def main() -> list[bytes]:
        same = [asyncio.to_thread(cache.get_or_fetch, key(0), lambda: slow("a")) for _ in range(4)]
        other = asyncio.to_thread(cache.get_or_fetch, key(1), lambda: slow("b"))
        return list(await asyncio.gather(*same, other))

    assert asyncio.run(main()) == [b"a"] * 4 + [b"b"]
    assert sorted(calls) == ["a", "b"]  # each range fetched once


def test_a_failed_fetch_fails_its_waiters_and_is_not_cached() -> None:
    """Race: waiters coalesced on a GET that fails. Expected: each sees the error; the
    next read fetches again."""
    cache = RangeCache(tail_bytes=0, history_bytes=1000)
    started = threading.Event()

    def broken() -> bytes:
        started.set()
        time.sleep(0.1)
        raise StorageUnavailableError("store down")

    errors: list[Exception] = []

    def waiter() -> None:
        started.wait()
        try:
            cache.get_or_fetch(key(0), fail)
        except StorageUnavailableError as e:
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    with pytest.raises(StorageUnavailableError):
        cache.get_or_fetch(key(0), broken)
    t.join(5)
    assert len(errors) == 1
    assert cache.get_or_fetch(key(0), lambda: b"ok") == b"ok"


# -- index cache --------------------------------------------------------------------------


def ref(base: int, count: int = 10, obj: str = "o") -> ChunkRef:
    return ChunkRef(f"{obj}-{base}", 0, 100, base, count, 0, 0)


def test_index_cache_returns_the_contiguous_chain_from_an_offset() -> None:
    index = IndexCache(max_entries=100, ttl_s=60)
    index.put(b"t", 0, [ref(0), ref(10), ref(20)])
    assert index.get(b"t", 0, 15) == [ref(10), ref(20)]
    assert index.get(b"t", 0, 0, max_chunks=2) == [ref(0), ref(10)]
    assert index.get(b"t", 0, 30) == []  # past what is known: ask the coordinator
    assert index.get(b"t", 1, 0) == []
    index.put(b"t", 0, [ref(40)])  # a hole at 30..39: the chain stops before it
    assert index.get(b"t", 0, 25) == [ref(20)]
    assert index.get(b"t", 0, 45) == [ref(40)]


def test_index_cache_never_caches_nothing_and_expires() -> None:
    index = IndexCache(max_entries=100, ttl_s=0.1)
    index.put(b"t", 0, [])
    assert len(index) == 0
    index.put(b"t", 0, [ref(0)])
    assert index.get(b"t", 0, 5) == [ref(0)]
    time.sleep(0.15)
    assert index.get(b"t", 0, 5) == []
    assert len(index) == 0


def test_index_cache_is_bounded() -> None:
    index = IndexCache(max_entries=5, ttl_s=60)
    index.put(b"a", 0, [ref(0), ref(10), ref(20)])
    index.put(b"b", 0, [ref(0), ref(10)])
    index.get(b"a", 0, 0)  # a is now the most recently used
    index.put(b"c", 0, [ref(0)])
    assert len(index) <= 5
    assert index.get(b"b", 0, 0) == []
    assert index.get(b"a", 0, 0) == [ref(0), ref(10), ref(20)]


# -- the caching reader over a real coordinator and store ------------------------------------


@pytest.fixture
def log_parts(tmp_path: Path) -> tuple[LogWriter, LocalCoordinator, object]:
    coordinator = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    store = open_store(f"file://{tmp_path / 'data'}")
    return LogWriter(store, coordinator), coordinator, store


def _write(writer: LogWriter, topic_id: bytes, n: int, start: int) -> None:
    builder = SegmentBuilder()
    builder.append(
        topic_id, 0, [Record(None, f"v{start + i}".encode(), 1_000 + start + i) for i in range(n)]
    )
    writer.write(builder)


def test_tailing_on_the_writing_agent_costs_no_gets(
    log_parts: tuple[LogWriter, LocalCoordinator, object],
) -> None:
    writer, coordinator, store = log_parts
    info = coordinator.create_topic("tail", 1)
    metrics = ConsumeMetrics()
    cache = RangeCache(1 << 20, 1 << 20, metrics)
    reader = CachingLogReader(
        store,  # type: ignore[arg-type]
        coordinator,
        cache,
        IndexCache(1000, 60),
        metrics=metrics,
    )
    writer.listeners.append(cache.on_write)
    for i in range(5):
        _write(writer, info.topic_id, 10, 10 * i)
    got = [r.value for r in reader.records("tail", 0, 0)]
    assert got == [f"v{i}".encode() for i in range(50)]
    assert metrics.gets._value.get() == 0
    assert cache.stats.tail_hits == 5

    # A cold agent GETs each chunk once; a second pass costs nothing, and uses the
    # index cache instead of the coordinator.
    cold = CachingLogReader(
        store,  # type: ignore[arg-type]
        coordinator,
        RangeCache(0, 1 << 20),
        IndexCache(1000, 60),
        metrics=(m2 := ConsumeMetrics()),
        read_ahead=4,
    )
    assert [r.offset for r in cold.records("tail", 0, 0, read_ahead_bytes=1 << 20)] == list(
        range(50)
    )
    assert m2.gets._value.get() == 5
    misses = m2.index_misses._value.get()
    assert [r.offset for r in cold.records("tail", 0, 25)] == list(range(25, 50))
    assert m2.gets._value.get() == 5
    # No lookup at all: the read ends at the high watermark it started from.
    assert m2.index_misses._value.get() == misses
    assert cold.read("tail", 0, 48) == reader.read("tail", 0, 48)
    cold.close()
    reader.close()


class _GatedStore:
    """A store whose ranged GETs wait for ``gate``: read-ahead piles up behind them."""

    def __init__(self, store: object) -> None:
        self.store = store
        self.gate = threading.Event()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        assert self.gate.wait(30)
        data: bytes = self.store.get_range(key, start, length)  # type: ignore[attr-defined]
        return data


def test_read_ahead_queue_is_bounded(
    log_parts: tuple[LogWriter, LocalCoordinator, object],
) -> None:
    """40 readers each ask for read-ahead of the next chunks while the store is stuck:
    at most 4 x read_ahead chunks are queued or in flight, each once; the readers'
    own reads still get every record once the store answers."""
    writer, coordinator, store = log_parts
    info = coordinator.create_topic("ra", 1)
    for i in range(40):
        _write(writer, info.topic_id, 1, i)
    gated = _GatedStore(store)
    reader = CachingLogReader(
        gated,  # type: ignore[arg-type]
        coordinator,
        RangeCache(0, 1 << 20),
        IndexCache(1000, 60),
        read_ahead=2,
    )
    refs = coordinator.lookup("ra", 0, 0, max_chunks=40)
    assert len(refs) == 40
    for start in range(40):
        reader.prefetch(refs[start:], 1 << 30)
        assert reader.pending_read_ahead() <= reader.max_pending == 8
    gated.gate.set()
    assert [r.value for r in reader.records("ra", 0, 0)] == [f"v{i}".encode() for i in range(40)]
    reader.close()


def _caching(store: object, coordinator: LocalCoordinator) -> CachingLogReader:
    return CachingLogReader(
        store,  # type: ignore[arg-type]
        coordinator,
        RangeCache(1 << 20, 1 << 20),
        IndexCache(1000, 60),
    )


def test_a_recreated_topic_is_a_new_log_whatever_the_index_cache_holds(
    log_parts: tuple[LogWriter, LocalCoordinator, object],
) -> None:
    """Issue 22 defect 2: read t (its entries are cached), delete t, create t, write one
    record: a read from 0 gets that record only, never the deleted topic's. A read that
    started on the old topic (its bounds) gets the old log's records or, once the agent
    must ask, TopicNotFoundError: never the new log's."""
    writer, coordinator, store = log_parts
    old = coordinator.create_topic("t", 1)
    _write(writer, old.topic_id, 5, 0)
    reader = _caching(store, coordinator)
    old_bounds = coordinator.offsets("t", 0)
    assert old_bounds.topic_id == old.topic_id
    assert [r.value for r in reader.records("t", 0, 0)] == [b"v%d" % i for i in range(5)]
    coordinator.delete_topic("t")
    new = coordinator.create_topic("t", 1)
    _write(writer, new.topic_id, 1, 100)
    assert [(r.offset, r.value) for r in reader.records("t", 0, 0)] == [(0, b"v100")]
    assert [r.offset for r in reader.records("t", 0, 3)] == []  # past the new end: nothing
    in_flight = [r.value for r in reader.records("t", 0, 1, bounds=old_bounds)]
    assert in_flight == [b"v%d" % i for i in range(1, 5)]
    with pytest.raises(TopicNotFoundError):
        list(_caching(store, coordinator).records("t", 0, 1, bounds=old_bounds))
    reader.close()


def test_a_read_ends_at_the_high_watermark_it_started_from(
    log_parts: tuple[LogWriter, LocalCoordinator, object],
) -> None:
    """Records committed after the bounds a read started from are not served by it, segment
    chunks and a tier object spanning past that high watermark alike."""
    writer, coordinator, store = log_parts
    info = coordinator.create_topic("hw", 1)
    _write(writer, info.topic_id, 5, 0)
    bounds = coordinator.offsets("hw", 0)
    _write(writer, info.topic_id, 5, 5)
    reader = _caching(store, coordinator)
    assert [r.offset for r in reader.records("hw", 0, 0, bounds=bounds)] == list(range(5))
    # Tiering rewrites both chunks as one tier object [0, 10): still cut at 5.
    catalog = Catalog(coordinator.db)
    ctx = JanitorContext(catalog, coordinator.store, store, time.time)  # type: ignore[arg-type]
    run_tiering(ctx, JanitorConfig(tier_age_s=0.0, gc_grace_s=60.0))
    assert [r.kind for r in catalog.rows(info.topic_id, 0)] == ["parquet"]
    assert [r.offset for r in _caching(store, coordinator).records("hw", 0, 2, bounds=bounds)] == [
        2,
        3,
        4,
    ]
    assert [r.offset for r in reader.records("hw", 0, 0)] == list(range(10))
    reader.close()


def test_a_read_over_many_lookup_pages_ends_at_its_high_watermark(
    log_parts: tuple[LogWriter, LocalCoordinator, object],
) -> None:
    """40 entries (more than two pages of 16 lookups) and more committed after the bounds:
    the read crosses the pages and stops exactly at the bounds' high watermark."""
    writer, coordinator, store = log_parts
    info = coordinator.create_topic("pages", 1)
    for i in range(40):
        _write(writer, info.topic_id, 1, i)
    bounds = coordinator.offsets("pages", 0)
    for i in range(40, 45):
        _write(writer, info.topic_id, 1, i)
    reader = _caching(store, coordinator)
    got = [r.offset for r in reader.records("pages", 0, 3, bounds=bounds)]
    assert got == list(range(3, 40))
    reader.close()


# -- runs of chunks read with one GET (issue 29) ---------------------------------------


def test_plan_spans_merges_nearby_ranges_of_one_object_within_the_limits() -> None:
    """Ranges of one object at most ``merge_gap`` apart go in one GET of at most
    ``max_span`` bytes; a range longer than that goes alone; other objects never mix."""
    keys = [
        ("a", 100, 10),
        ("b", 0, 10),
        ("a", 0, 10),
        ("a", 15, 10),  # 5 bytes after the first: merged
        ("a", 40, 10),  # 15 bytes after: a gap over merge_gap starts a new run
        ("a", 50, 30),  # adjacent, but the run would read 40 > max_span=35 bytes
        ("a", 200, 100),  # longer than max_span: alone
    ]
    spans = plan_spans(keys, merge_gap=10, max_span=35)
    assert spans == [
        [("a", 0, 10), ("a", 15, 10)],
        [("a", 40, 10)],
        [("a", 50, 30)],
        [("a", 100, 10)],
        [("a", 200, 100)],
        [("b", 0, 10)],
    ]
    assert plan_spans([("a", 0, 10), ("a", 10, 10)]) == [[("a", 0, 10), ("a", 10, 10)]]


class _SlowStore:
    """Ranged GETs over a dict of objects, each waiting for ``gate``; counts them."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.gate = threading.Event()
        self.gets: list[tuple[str, int, int]] = []

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.gets.append((key, start, length))
        assert self.gate.wait(30)
        return self.objects[key][start : start + length]


def test_a_reader_of_a_chunk_being_fetched_in_a_run_waits_for_that_get() -> None:
    """``fetch_many`` claims its chunks: a reader asking for one of them meanwhile sends no
    GET of its own and gets the run's bytes; a chunk that ``fetch_many`` found cached is
    not read again."""
    data = bytes(range(256)) * 4
    store = _SlowStore({"o1": data, "o2": data})
    cache = RangeCache(0, 1 << 20)
    reader = CachingLogReader(store, None, cache, IndexCache(10, 60), read_ahead=2)  # type: ignore[arg-type]
    cache.put_history(("o2", 0, 8), data[:8])

    def ref(obj: str, pos: int, length: int) -> ChunkRef:
        return ChunkRef(obj, pos, length, 0, 1, 0, 0)

    refs = [ref("o1", 0, 100), ref("o1", 100, 100), ref("o2", 0, 8), ref("o2", 512, 16)]
    done = threading.Event()
    sent: list[int] = []

    def run() -> None:
        sent.append(reader.fetch_many(refs))
        done.set()

    threading.Thread(target=run).start()
    got: list[bytes] = []
    waiter = threading.Thread(target=lambda: got.append(reader.fetch_chunk(refs[1])))
    deadline = time.monotonic() + 10
    while len(store.gets) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    waiter.start()
    time.sleep(0.1)
    assert not got  # waiting for the run's GET, not sending its own
    store.gate.set()
    assert done.wait(10)
    waiter.join(10)
    assert got == [data[100:200]]
    assert sorted(store.gets) == [("o1", 0, 200), ("o2", 512, 16)]
    assert sent == [2]
    assert cache.get(("o1", 0, 100)) == data[:100]
    assert cache.get(("o2", 512, 16)) == data[512:528]
    reader.close()


def test_a_short_run_caches_only_the_chunks_it_holds() -> None:
    """An object shorter than the index says: the chunk it holds whole is cached; the one
    it does not is not, and reading it fails with CorruptSegmentError (as ``fetch_chunk``
    of that chunk alone does)."""
    store = _SlowStore({"o": b"x" * 150})
    store.gate.set()
    cache = RangeCache(0, 1 << 20)
    reader = CachingLogReader(store, None, cache, IndexCache(10, 60))  # type: ignore[arg-type]
    refs = [ChunkRef("o", 0, 100, 0, 1, 0, 0), ChunkRef("o", 100, 100, 1, 1, 0, 0)]
    assert reader.fetch_many(refs) == 1
    assert ("o", 0, 100) in cache and ("o", 100, 100) not in cache
    with pytest.raises(CorruptSegmentError):
        reader.fetch_chunk(refs[1])
    reader.close()


def test_read_ahead_by_runs_is_bounded_per_agent() -> None:
    """Read-ahead runs (``fetch_many`` not waited for) in flight stay within
    ``max_ahead_bytes`` however many are asked for while the store is stuck; the chunks
    left out are not claimed (a reader fetches them itself), and once the store answers
    the runs' chunks are cached."""
    store = _SlowStore({f"o{i}": bytes(1000) for i in range(10)})
    cache = RangeCache(0, 8000)  # read-ahead at most a quarter: 2,000 bytes
    reader = CachingLogReader(store, None, cache, IndexCache(10, 60), read_ahead=4)  # type: ignore[arg-type]
    assert reader.max_ahead_bytes == 2000
    refs = [ChunkRef(f"o{i}", 0, 600, 0, 1, 0, 0) for i in range(10)]
    assert reader.fetch_many(refs[:5], wait_for=False) == 3
    assert reader.fetch_many(refs[5:], wait_for=False) == 0
    assert reader._ahead_bytes == 1800
    assert ("o3", 0, 600) not in cache._in_flight
    store.gate.set()
    assert reader.wait_read_ahead(10)
    assert [(f"o{i}", 0, 600) in cache for i in range(5)] == [True] * 3 + [False] * 2
    assert reader.fetch_many(refs[5:], wait_for=False) == 3
    assert reader.wait_read_ahead(10)
    reader.close()


# -- many partitions' lookups in one call (issue 29) ------------------------------------


class _CountingCoordinator:
    """A coordinator whose lookups are counted (the rest passes through)."""

    def __init__(self, inner: LocalCoordinator) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def lookup(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("lookup")
        return self.inner.lookup(*args, **kwargs)

    def lookup_many(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("lookup_many")
        return self.inner.lookup_many(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_fetch_of_many_partitions_looks_them_up_in_one_call(
    log_parts: tuple[LogWriter, LocalCoordinator, object],
) -> None:
    """A Fetch of 300 partitions about to read (``prefetch_partitions``) asks the
    coordinator once for all their index entries, not once per partition; the reads then
    find them in the index cache and return every record. A partition of a recreated
    topic (its reader holds the old id) is left out of the answer, and its own read
    still ends with TopicNotFoundError. Before, 301 lookups: one HTTP call each."""
    writer, local, store = log_parts
    info = local.create_topic("wide", 300)
    builder = SegmentBuilder()
    for p in range(300):
        builder.append(info.topic_id, p, [Record(None, f"v{p}".encode(), 1_000)])
    writer.write(builder)
    old = local.create_topic("gone", 1)
    _write(writer, old.topic_id, 2, 0)
    gone_bounds = local.offsets("gone", 0)
    local.delete_topic("gone")
    local.create_topic("gone", 1)
    coordinator = _CountingCoordinator(local)
    reader = CachingLogReader(
        store,  # type: ignore[arg-type]
        coordinator,  # type: ignore[arg-type]
        RangeCache(1 << 24, 1 << 24),
        IndexCache(10_000, 60),
    )
    wants = [PartitionWant("wide", p, 0, local.offsets("wide", p), 1 << 16) for p in range(300)] + [
        PartitionWant("gone", 0, 0, gone_bounds, 1 << 16)
    ]
    reader.prefetch_partitions(wants, 1 << 24)
    # One call for all; then one lookup of its own for the partition left out (the
    # planning meets its error there and leaves it to the read).
    assert coordinator.calls == ["lookup_many", "lookup"]
    values = [
        [r.value for r in reader.records("wide", w.partition, 0, bounds=w.bounds)]
        for w in wants[:300]
    ]
    assert values == [[f"v{p}".encode()] for p in range(300)]
    assert coordinator.calls == ["lookup_many", "lookup"]  # the reads found them cached
    with pytest.raises(TopicNotFoundError):
        list(reader.records("gone", 0, 0, bounds=gone_bounds))
    reader.close()


def test_lookup_many_answers_each_want_as_lookup_does(
    log_parts: tuple[LogWriter, LocalCoordinator, object],
) -> None:
    writer, coordinator, _ = log_parts
    info = coordinator.create_topic("many", 2)
    for i in range(20):
        _write(writer, info.topic_id, 1, i)
    wants = [
        IndexWant("many", 0, 3, info.topic_id),
        IndexWant("many", 1, 0),  # nothing written: left out
        IndexWant("many", 0, 0, b"\x00" * 16),  # another topic's id: left out
        IndexWant("nope", 0, 0),  # unknown: left out
        IndexWant("many", 7, 0),  # no such partition: left out
        IndexWant("many", 0, 18),
    ]
    found = coordinator.lookup_many(wants, max_chunks=4)
    assert found == {
        0: coordinator.lookup("many", 0, 3, 4),
        5: coordinator.lookup("many", 0, 18, 4),
    }
    assert [r.base_offset for r in found[0]] == [3, 4, 5, 6]
    with pytest.raises(ValueError, match="max_chunks"):
        coordinator.lookup_many(wants, max_chunks=0)
