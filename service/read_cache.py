"""The agent's read cache: object byte ranges, and a reader over them and the index cache.

- ``RangeCache``: a bounded LRU of object byte ranges with two budgets, each
  entry counted with its bookkeeping (``ENTRY_OVERHEAD``: key, dict slot, bytes
  header), so a budget bounds memory even when chunks are a few bytes. The *tail*
  budget is filled write-through by this agent's own flushes (a ``LogWriter``
  listener), so consumers tailing a partition on the writing agent cost no GETs;
  the *history* budget holds ranges fetched from the store. A lagging reader
  churns only the history budget, never the hot tail. Concurrent fetches of one
  range are coalesced: one GET, the other readers wait for it.
- ``index.cache.IndexCache`` (there, beside the walk over the index that every reader
  shares): ChunkRef lists keyed by topic id. Every read starts from the partition's
  offsets as the coordinator says now (its topic id, log-start and high watermark,
  ``LogReader.entries``): a hit serves only entries of that topic, below that high
  watermark.
- ``CachingLogReader``: a ``LogReader`` over both, with read-ahead of the next
  chunks in parallel when catching up on history. Read-ahead is best effort and
  bounded: at most ``4 x read_ahead`` chunks queued or in flight per agent (each
  at most once); more is skipped, and the reader fetches those chunks itself.
  A tier object (a ``"parquet"`` index entry) is fetched whole, once, and kept in
  the history budget like any range; its records are decoded one row group at a
  time from the wanted offset.

Everything here is synchronous and thread-safe: the agent calls it from worker
threads (``asyncio.to_thread``), so coalescing works across tasks and threads alike.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from coordinator.client import ChunkRef, Coordinator, IndexWant
from index.cache import IndexCache
from index.log import LogReader, PartitionWant, WriteResult
from index.walk import walk
from segments.errors import CorruptSegmentError, LakelogError, StorageUnavailableError
from segments.store import ObjectStore
from service.consume.metrics import ConsumeMetrics

log = logging.getLogger(__name__)

#: (object key, position, length): one byte range of one object.
RangeKey = tuple[str, int, int]

TAIL = "tail"
HISTORY = "history"

#: Chunks of one object at most this far apart are read with one ranged GET (the bytes
#: between them are read and dropped): a GET costs about as much as reading 1-2 MiB more.
MERGE_GAP_BYTES = 1 << 20
#: One ranged GET of several chunks reads at most this many bytes (a single chunk larger
#: than this is still read whole, as by itself).
MAX_SPAN_BYTES = 8 << 20

#: What one cached range costs beyond its bytes (measured ~200 B on CPython 3.11: the
#: key tuple, the ordered-dict slot, the bytes object's header), rounded up.
ENTRY_OVERHEAD = 256


class _Lru:
    """One budget: an LRU of byte ranges costing at most ``capacity`` bytes, each range
    counted as its length plus ``overhead`` (not thread-safe)."""

    def __init__(self, capacity: int, overhead: int = ENTRY_OVERHEAD) -> None:
        self.capacity = capacity
        self.overhead = overhead
        self.size = 0
        self.entries: OrderedDict[RangeKey, bytes] = OrderedDict()
        self.evictions = 0

    def get(self, key: RangeKey) -> bytes | None:
        data = self.entries.get(key)
        if data is not None:
            self.entries.move_to_end(key)
        return data

    def put(self, key: RangeKey, data: bytes) -> None:
        cost = len(data) + self.overhead
        if cost > self.capacity:
            return  # would evict everything and still not fit
        old = self.entries.pop(key, None)
        if old is not None:
            self.size -= len(old) + self.overhead
        self.entries[key] = data
        self.size += cost
        while self.size > self.capacity:
            _, evicted = self.entries.popitem(last=False)
            self.size -= len(evicted) + self.overhead
            self.evictions += 1


class _InFlight:
    """A GET that other readers of the same range wait for.

    A lock held until the GET ends, not an Event: a Fetch at 1,000 partitions claims
    thousands of ranges at once, and an Event (a Condition and two locks) costs about
    ten times as much to make.
    """

    __slots__ = ("_done", "data", "error")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self.data: bytes | None = None
        self.error: BaseException | None = None

    def set(self) -> None:
        """The GET ended (``data`` or ``error`` is set): wake the waiters."""
        self._done.release()

    def wait(self) -> None:
        self._done.acquire()
        self._done.release()  # the next waiter


@dataclass
class CacheStats:
    """Plain counters (the Prometheus ones live in ConsumeMetrics)."""

    tail_hits: int = 0
    history_hits: int = 0
    misses: int = 0
    coalesced: int = 0
    fetches: int = 0


class RangeCache:
    """Byte ranges of objects in two LRU budgets, with coalesced fetches.

    Args:
        tail_bytes: budget for this agent's own flushed chunks (write-through).
        history_bytes: budget for ranges fetched from the store.
        metrics: Prometheus counters to update, if any.
        entry_overhead: bytes each range costs beyond its length.
    """

    def __init__(
        self,
        tail_bytes: int,
        history_bytes: int,
        metrics: ConsumeMetrics | None = None,
        *,
        entry_overhead: int = ENTRY_OVERHEAD,
    ) -> None:
        self._lock = threading.Lock()
        self._tail = _Lru(tail_bytes, entry_overhead)
        self._history = _Lru(history_bytes, entry_overhead)
        self._in_flight: dict[RangeKey, _InFlight] = {}
        self.metrics = metrics
        self.stats = CacheStats()

    # -- filling --------------------------------------------------------------
    def put_tail(self, key: RangeKey, data: bytes) -> None:
        """Remember a range this agent just wrote (and committed)."""
        with self._lock:
            self._tail.put(key, data)

    def put_history(self, key: RangeKey, data: bytes) -> None:
        with self._lock:
            if key not in self._tail.entries:
                self._history.put(key, data)

    def on_write(self, result: WriteResult, data: bytes) -> None:
        """``LogWriter`` listener: every committed chunk goes into the tail budget."""
        for chunk in result.chunks:
            self.put_tail(
                (result.object_key, chunk.position, chunk.length),
                data[chunk.position : chunk.position + chunk.length],
            )

    # -- reading --------------------------------------------------------------
    def _lookup(self, key: RangeKey) -> bytes | None:
        """A cached range, counting the hit (call with the lock held)."""
        data = self._tail.get(key)
        if data is not None:
            self.stats.tail_hits += 1
            budget = TAIL
        else:
            data = self._history.get(key)
            if data is None:
                return None
            self.stats.history_hits += 1
            budget = HISTORY
        if self.metrics is not None:
            self.metrics.cache_hits.labels(budget=budget).inc()
            self.metrics.cache_hit_bytes.inc(len(data))
        return data

    def get(self, key: RangeKey) -> bytes | None:
        """The cached range, or None (counts a hit, never a miss)."""
        with self._lock:
            return self._lookup(key)

    def __contains__(self, key: RangeKey) -> bool:
        with self._lock:
            return key in self._tail.entries or key in self._history.entries

    def get_or_fetch(self, key: RangeKey, fetch: Callable[[], bytes]) -> bytes:
        """The cached range, else ``fetch()`` it once however many threads ask at once.

        The first reader of an uncached range runs ``fetch``; readers of the same
        range arriving meanwhile wait for its result (or its error) instead of
        sending their own GET. The result goes into the history budget.
        """
        with self._lock:
            data = self._lookup(key)
            if data is not None:
                return data
            flight = self._in_flight.get(key)
            owner = flight is None
            if flight is None:
                flight = self._in_flight[key] = _InFlight()
                self.stats.misses += 1
                self.stats.fetches += 1
                if self.metrics is not None:
                    self.metrics.cache_misses.inc()
            else:
                self.stats.coalesced += 1
                if self.metrics is not None:
                    self.metrics.cache_coalesced.inc()
        if not owner:
            flight.wait()
            if flight.error is not None:
                raise flight.error
            assert flight.data is not None
            return flight.data
        try:
            data = fetch()
            flight.data = data
            self.put_history(key, data)
            return data
        except BaseException as e:
            flight.error = e
            raise
        finally:
            with self._lock:
                self._in_flight.pop(key, None)
            flight.set()

    def claim(self, keys: Iterable[RangeKey]) -> dict[RangeKey, _InFlight]:
        """Mark those of ``keys`` neither cached nor being fetched as fetched by the caller.

        Readers of a claimed range wait for it as for any fetch in flight (``get_or_fetch``);
        the caller must ``settle`` every claim, with its bytes or an error.
        """
        claims: dict[RangeKey, _InFlight] = {}
        with self._lock:
            for key in keys:
                if (
                    key in claims
                    or key in self._in_flight
                    or key in self._tail.entries
                    or key in self._history.entries
                ):
                    continue
                claims[key] = self._in_flight[key] = _InFlight()
                self.stats.misses += 1
                if self.metrics is not None:
                    self.metrics.cache_misses.inc()
        return claims

    def settle(
        self,
        claims: dict[RangeKey, _InFlight],
        data: dict[RangeKey, bytes],
        error: BaseException | None = None,
    ) -> None:
        """End claimed fetches: those in ``data`` go into the history budget, the others
        fail with ``error`` (their readers raise it, as a reader of a failed GET does)."""
        for key, flight in claims.items():
            got = data.get(key)
            if got is not None:
                flight.data = got
                self.put_history(key, got)
            else:
                flight.error = error or StorageUnavailableError(f"{key[0]}: range not fetched")
        with self._lock:
            for key in claims:
                self._in_flight.pop(key, None)
        for flight in claims.values():
            flight.set()

    def count_fetch(self) -> None:
        with self._lock:
            self.stats.fetches += 1

    @property
    def history_capacity(self) -> int:
        return self._history.capacity

    def sizes(self) -> tuple[int, int]:
        """Bytes accounted in (tail, history): lengths plus the per-entry overhead."""
        with self._lock:
            return self._tail.size, self._history.size


def plan_spans(
    keys: Iterable[RangeKey], merge_gap: int = MERGE_GAP_BYTES, max_span: int = MAX_SPAN_BYTES
) -> list[list[RangeKey]]:
    """Ranges grouped into the ranged GETs that read them: ranges of one object, in
    position order, whose gaps are at most ``merge_gap`` and whose GET reads at most
    ``max_span`` bytes (a range longer than that alone), objects in order of first mention."""
    by_object: dict[str, list[RangeKey]] = {}
    for key in keys:
        by_object.setdefault(key[0], []).append(key)
    spans: list[list[RangeKey]] = []
    for ranges in by_object.values():
        ranges.sort(key=lambda k: k[1])
        span = [ranges[0]]
        start, end = ranges[0][1], ranges[0][1] + ranges[0][2]
        for key in ranges[1:]:
            key_end = key[1] + key[2]
            if key[1] - end > merge_gap or max(end, key_end) - start > max_span:
                spans.append(span)
                span, start, end = [key], key[1], key_end
            else:
                span.append(key)
                end = max(end, key_end)
        spans.append(span)
    return spans


def span_bytes(span: list[RangeKey]) -> int:
    """What the GET of a run reads."""
    return max(p + n for _, p, n in span) - span[0][1]


#: A deliberately broken build for the chaos checker to catch (tests/chaos):
#: ``LAKELOG_CHAOS_BREAK=stale_cache`` keys the agent's index cache by topic name, not id,
#: so a topic deleted and created again is served its old incarnation's chunks. Read
#: once, from the environment only: no setting, never for production.
_BROKEN_STALE_CACHE = "stale_cache" in os.environ.get("LAKELOG_CHAOS_BREAK", "").split(",")


class CachingLogReader(LogReader):
    """``LogReader`` whose chunk reads go through a RangeCache and lookups through an IndexCache.

    ``records`` yields lazily (a chunk is fetched only when its first record is
    wanted) and reads ahead: the next ``read_ahead`` chunks of a lookup are fetched
    in parallel, within the byte budget the caller still has.
    """

    def __init__(
        self,
        store: ObjectStore,
        coordinator: Coordinator,
        cache: RangeCache,
        index: IndexCache,
        *,
        metrics: ConsumeMetrics | None = None,
        read_ahead: int = 8,
        merge_gap: int = MERGE_GAP_BYTES,
        max_span: int = MAX_SPAN_BYTES,
    ) -> None:
        super().__init__(store, coordinator)
        self.cache = cache
        self.index = index
        self.metrics = metrics
        self.read_ahead = read_ahead
        self._pool = (
            ThreadPoolExecutor(read_ahead, thread_name_prefix="lakelog-readahead")
            if read_ahead > 0
            else None
        )
        # Ranges queued for read-ahead or being fetched by it: the queue's bound.
        self._pending: set[RangeKey] = set()
        self._pending_lock = threading.Lock()
        self.max_pending = 4 * read_ahead
        # The GETs of ``fetch_many``: a pool of their own, whose tasks wait for nothing
        # (read-ahead tasks may wait for the ranges these fetch). At most ``read_ahead``
        # GETs of at most ``max_span`` bytes each are in flight per agent.
        self.merge_gap = merge_gap
        self.max_span = max_span
        #: Read-ahead runs (``prefetch_partitions``) in flight, in bytes, and their bound.
        self._ahead_bytes = 0
        self.max_ahead_bytes = cache.history_capacity // 4
        self._span_pool = (
            ThreadPoolExecutor(read_ahead, thread_name_prefix="lakelog-spans")
            if read_ahead > 0
            else None
        )

    def close(self) -> None:
        for pool in (self._pool, self._span_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def _get(self, ref: ChunkRef) -> bytes:
        started = time.perf_counter()
        data = super().fetch_chunk(ref)
        if self.metrics is not None:
            self.metrics.gets.inc()
            self.metrics.get_bytes.inc(len(data))
            self.metrics.get_seconds.observe(time.perf_counter() - started)
        return data

    def fetch_chunk(self, ref: ChunkRef) -> bytes:
        """The chunk's bytes: from the cache, else one (coalesced) ranged GET."""
        return self.cache.get_or_fetch(
            (ref.object_key, ref.position, ref.length), lambda: self._get(ref)
        )

    def lookup(self, topic: str, partition: int, offset: int, topic_id: bytes) -> list[ChunkRef]:
        """Index entries from ``offset`` on: the agent's cache (by topic id), else the
        coordinator (for that topic id only)."""
        # The broken build caches by name: a deleted incarnation's entries serve the next.
        cache_key = topic.encode() if _BROKEN_STALE_CACHE else topic_id
        refs = self.index.get(cache_key, partition, offset) if topic_id else []
        if refs:
            if self.metrics is not None:
                self.metrics.index_hits.inc()
            return refs
        if self.metrics is not None:
            self.metrics.index_misses.inc()
        refs = super().lookup(topic, partition, offset, topic_id)
        if topic_id:
            self.index.put(cache_key, partition, refs)
        return refs

    def forget(self, topic_id: bytes, partition: int) -> None:
        self.index.invalidate(topic_id, partition)

    def prefetch(self, refs: list[ChunkRef], budget: int) -> None:
        if self._pool is None or budget <= 0:
            return
        for ref in refs[: self.read_ahead]:
            key = (ref.object_key, ref.position, ref.length)
            if key not in self.cache:
                with self._pending_lock:
                    if len(self._pending) >= self.max_pending:
                        return  # the queue is full: the reader fetches it when it gets there
                    queued = key not in self._pending
                    self._pending.add(key)
                if queued:
                    self._pool.submit(self._prefetch_one, ref, key)
            budget -= ref.length
            if budget <= 0:
                return

    def _prefetch_one(self, ref: ChunkRef, key: RangeKey) -> None:
        try:
            self.fetch_chunk(ref)
        except Exception as e:  # the reader will fetch it again and see the error
            log.debug("read-ahead of %s failed: %s", ref.object_key, e)
        finally:
            with self._pending_lock:
                self._pending.discard(key)

    def prefetch_partitions(self, wants: Sequence[PartitionWant], max_bytes: int) -> None:
        """Fetch the chunks the reads of ``wants`` will use, whole objects' runs of chunks
        at once (``fetch_many``), before the reads start; and start fetching the chunks
        the next Fetch of the same partitions will want.

        Each partition's index entries from its offset (the index cache keeps them for
        its read), up to its budget or its high watermark, at most ``max_bytes`` and half
        the history budget in all (more would evict what this fetch is about to use);
        then the first entry of each partition left (the read opens it to see whether
        its first batch fits), within 3/4 of the history budget. Then, not
        waited for, as many bytes again per partition (read-ahead, as ``entries`` reads
        ahead twice the budget of one partition's read) while all of it stays within half
        the history budget, and the read-ahead in flight within ``max_ahead_bytes`` per
        agent. A partition whose lookup fails is left to its read, which meets the error
        and reports it.
        """
        self._lookup_uncached(wants)
        history = self.cache.history_capacity
        limit = min(max_bytes, history // 2)  # the entries the reads use
        first_cap = history * 3 // 4  # with the first entries the reads open
        ahead_cap = history // 2  # with the read-ahead
        now: list[ChunkRef] = []
        ahead: list[ChunkRef] = []
        planned = 0  # bytes of `now` within each partition's budget
        total = 0  # bytes of `now` and `ahead`
        for want in wants:
            if total >= first_cap:
                break
            bounds = want.bounds
            at = max(want.offset, bounds.log_start)
            budget = min(want.budget, limit - planned)
            mine = 0
            more = budget  # read-ahead: as much again
            # Page after page of index entries (the read looks them up the same way, from
            # the index cache then), until the partition's budgets or its high watermark.
            # A lookup that fails, or a hole, ends the planning: the read meets the same
            # and reports it.
            with contextlib.suppress(LakelogError):
                for ref, _, _ in walk(
                    functools.partial(
                        self.lookup, want.topic, want.partition, topic_id=bounds.topic_id
                    ),
                    at,
                    bounds.high_watermark,
                    follow_log_start=True,
                    where=f"partition {want.partition} of topic '{want.topic}'",
                ):
                    if mine < max(budget, 1):  # the first entry always: the read opens it
                        if total >= first_cap:
                            break
                        now.append(ref)
                        mine += ref.length
                        total += ref.length
                    elif more > 0 and total < ahead_cap:
                        ahead.append(ref)
                        more -= ref.length
                        total += ref.length
                    else:
                        break
            planned += max(0, min(mine, budget))
        self.fetch_many(now)
        if ahead:
            self.fetch_many(ahead, wait_for=False)

    def _lookup_uncached(self, wants: Sequence[PartitionWant]) -> None:
        """Look up, in one call to the coordinator, the first page of index entries of
        every want the index cache does not hold, and cache them: the reads (and the
        planning above) then find them there, instead of one lookup each. Wants the
        coordinator leaves out (an error, nothing to read) are left to their reads."""
        if self.index.ttl_s <= 0 or self.index.max_entries <= 0:
            return
        missing: list[tuple[bytes, IndexWant]] = []
        for want in wants:
            bounds = want.bounds
            at = max(want.offset, bounds.log_start)
            wanted = bounds.topic_id and at < bounds.high_watermark
            if wanted and not self.index.get(bounds.topic_id, want.partition, at, max_chunks=1):
                index_want = IndexWant(want.topic, want.partition, at, bounds.topic_id)
                missing.append((bounds.topic_id, index_want))
        if len(missing) < 2:
            return  # one lookup either way
        try:
            found = self.coordinator.lookup_many([w for _, w in missing])
        except LakelogError:
            return  # each read looks its partition up itself and meets the error
        if self.metrics is not None:
            self.metrics.index_misses.inc(len(missing))
        for i, refs in found.items():
            topic_id, index_want = missing[i]
            self.index.put(topic_id, index_want.partition, refs)

    def fetch_many(self, refs: Sequence[ChunkRef], *, wait_for: bool = True) -> int:
        """Put the chunks of ``refs`` in the cache with as few ranged GETs as will do.

        Chunks cached or being fetched are left alone; the others are claimed (their
        readers wait for this fetch) and read in runs (``plan_spans``): one GET per run of
        nearby chunks of one object, the runs in parallel. A run that fails fails its
        chunks' readers with its error, as a failed GET of one chunk does. Returns the
        GETs sent (started, with ``wait_for`` False: read-ahead, only of the chunks that
        keep the agent's read-ahead in flight within ``max_ahead_bytes``, not counting the
        gaps between chunks of one run).
        """
        if not wait_for:
            if self._span_pool is None:
                return 0
            with self._pending_lock:
                room = self.max_ahead_bytes - self._ahead_bytes
            taken = 0
            within: list[ChunkRef] = []
            for ref in refs:
                taken += ref.length
                if taken > room:
                    break
                within.append(ref)
            refs = within
        claims = self.cache.claim((r.object_key, r.position, r.length) for r in refs)
        if not claims:
            return 0
        spans = plan_spans(claims, self.merge_gap, self.max_span)
        if self._span_pool is None or (wait_for and len(spans) == 1):
            for span in spans:
                self._fetch_span(span, claims)
            return len(spans)
        futures: list[Future[None]] = []
        for span in spans:
            ahead = 0 if wait_for else span_bytes(span)
            if ahead:
                with self._pending_lock:
                    self._ahead_bytes += ahead
            try:
                future = self._span_pool.submit(self._fetch_span, span, claims, ahead)
            except RuntimeError:  # the pool is shut down: the agent is stopping
                self._fetch_span(span, claims, ahead)
                continue
            future.add_done_callback(functools.partial(self._span_done, span, claims, ahead))
            futures.append(future)
        if wait_for:
            wait(futures)
        return len(spans)

    def _span_done(
        self,
        span: list[RangeKey],
        claims: dict[RangeKey, _InFlight],
        ahead: int,
        future: Future[None],
    ) -> None:
        """A run's GET that never ran (the pool was shut down): its readers fail."""
        if future.cancelled():
            if ahead:
                with self._pending_lock:
                    self._ahead_bytes -= ahead
            self.cache.settle(
                {k: claims[k] for k in span},
                {},
                StorageUnavailableError(f"{span[0][0]}: read cancelled (agent stopping)"),
            )

    def _fetch_span(
        self, span: list[RangeKey], claims: dict[RangeKey, _InFlight], ahead: int = 0
    ) -> None:
        """One ranged GET of a run of chunks of one object; settles their claims.
        ``ahead``: the bytes it counts in the agent's read-ahead in flight."""
        key = span[0][0]
        start = span[0][1]
        end = max(p + n for _, p, n in span)
        got: dict[RangeKey, bytes] = {}
        error: BaseException | None = None
        try:
            started = time.perf_counter()
            self.cache.count_fetch()
            data = self.store.get_range(key, start, end - start)
            if self.metrics is not None:
                self.metrics.gets.inc()
                self.metrics.get_bytes.inc(len(data))
                self.metrics.get_seconds.observe(time.perf_counter() - started)
            for k in span:
                piece = data[k[1] - start : k[1] - start + k[2]]
                if len(piece) == k[2]:
                    got[k] = piece
            if len(got) < len(span):
                error = CorruptSegmentError(
                    f"{key}: {len(data)} bytes at {start}, the index says {end - start}"
                )
        except Exception as e:
            error = e
            log.debug("GET of %s at %d (%d bytes) failed: %s", key, start, end - start, e)
        finally:
            if ahead:
                with self._pending_lock:
                    self._ahead_bytes -= ahead
            self.cache.settle({k: claims[k] for k in span}, got, error)

    def wait_read_ahead(self, timeout: float) -> bool:
        """Until no read-ahead run is in flight (tests); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._pending_lock:
                if self._ahead_bytes == 0:
                    return True
            time.sleep(0.005)
        return False

    def pending_read_ahead(self) -> int:
        """Chunks queued for read-ahead or being fetched by it."""
        with self._pending_lock:
            return len(self._pending)
