"""Group commit: concurrent callers' commits taken together into one transaction.

Leader/follower, no timer: a caller queues its request; if no batch is running
it becomes the leader, takes the queued requests (first come first served, up to
``max_chunks`` chunks and never two with one object key) and runs them as ONE
batch; the others wait. When the batch ends, every request in it has its own
outcome and the leadership passes to a waiting caller, which takes whatever
queued up meanwhile. A lone caller therefore waits for nothing (a batch of one),
and under load each transaction, and each WAL flush, carries the commits that
arrived while the previous one ran.

The batch function decides every request's outcome itself (its offsets or its
own error); if it raises instead, the requests of that batch are run again one
by one, so a failure fails only the request that caused it. A retriable error
(the database unreachable, a deadlock or serialization victim) is caused by no
request: every request of the batch gets it at once, and its caller retries;
unless the error says it is one request's doing (``request_specific``, as a
``ProducerConflictError``): then the batch is run one by one as for any other.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coordinator.client import ChunkCommit


@dataclass(eq=False, slots=True)
class PendingCommit:
    """One caller's commit on its way through a batch, and its outcome."""

    object_key: str
    chunks: Sequence[ChunkCommit]
    size: int | None = None
    bases: list[int] | None = None
    error: BaseException | None = None
    #: Filled in by the batch function: scratch space it may use per request.
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.bases is not None or self.error is not None

    def outcome(self) -> list[int]:
        """The base offsets, or the request's error raised."""
        if self.error is not None:
            raise self.error
        if self.bases is None:
            raise RuntimeError(f"commit of {self.object_key!r} has no outcome")
        return self.bases


@dataclass(slots=True)
class GroupCommitStats:
    """Counters for /metrics: batches run, requests in them, solo re-runs after a failure."""

    batches: int = 0
    requests: int = 0
    chunks: int = 0
    solo_reruns: int = 0
    largest_batch: int = 0


class GroupCommitter:
    """Runs concurrent commits in shared batches (see the module docstring). Thread-safe."""

    def __init__(
        self,
        run_batch: Callable[[list[PendingCommit]], None],
        *,
        max_chunks: int = 200_000,
        max_requests: int = 256,
    ) -> None:
        """Args:
        run_batch: runs the requests in ONE transaction and sets each one's
            ``bases`` or ``error``; raises only when the transaction as a whole failed.
        max_chunks, max_requests: the most one batch takes (a request bigger than
            ``max_chunks`` still runs, alone).
        """
        if max_chunks < 1 or max_requests < 1:
            raise ValueError("max_chunks and max_requests must be >= 1")
        self._run_batch = run_batch
        self._max_chunks = max_chunks
        self._max_requests = max_requests
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[PendingCommit] = deque()
        self._leading = False
        self.stats = GroupCommitStats()

    def commit(self, request: PendingCommit) -> list[int]:
        """Run ``request`` in some batch; its base offsets, or its own error raised."""
        with self._cond:
            self._queue.append(request)
            while self._leading and not request.done:
                self._cond.wait()
            if request.done:
                return request.outcome()
            self._leading = True
        try:
            # Lead until the own request is done (it may not fit in the first batch).
            while not request.done:
                with self._cond:
                    batch = self._take()
                self._run(batch)
                with self._cond:
                    self._cond.notify_all()  # wake the followers whose requests are done
        finally:
            with self._cond:
                self._leading = False
                self._cond.notify_all()
        return request.outcome()

    def _take(self) -> list[PendingCommit]:
        """The next batch from the queue's head (called with the lock held)."""
        batch: list[PendingCommit] = []
        keys: set[str] = set()
        chunks = 0
        skipped: list[PendingCommit] = []
        while self._queue and len(batch) < self._max_requests:
            nxt = self._queue[0]
            if batch and chunks + len(nxt.chunks) > self._max_chunks:
                break
            self._queue.popleft()
            if nxt.object_key in keys:  # the same key twice: the second waits its turn
                skipped.append(nxt)
                continue
            keys.add(nxt.object_key)
            batch.append(nxt)
            chunks += len(nxt.chunks)
        self._queue.extendleft(reversed(skipped))
        return batch

    def _run(self, batch: list[PendingCommit]) -> None:
        try:
            self._run_batch(batch)
        except BaseException as e:
            # Retriable and no request's doing (the database unreachable): all at once.
            # A retriable error that one request caused (``request_specific``: an
            # idempotency key stored by another transaction) is found by a solo re-run.
            if len(batch) == 1 or (
                getattr(e, "retriable", False) and not getattr(e, "request_specific", False)
            ):
                for request in batch:
                    request.bases, request.error = None, e
            else:
                # Which request broke the shared transaction is unknown: run each alone.
                self.stats.solo_reruns += 1
                for request in batch:
                    request.bases = request.error = None
                    try:
                        self._run_batch([request])
                    except BaseException as solo:
                        request.error = solo
        for request in batch:
            if not request.done:  # a batch function that forgot one: never hang a caller
                request.error = RuntimeError(f"commit of {request.object_key!r} got no outcome")
        self.stats.batches += 1
        self.stats.requests += len(batch)
        self.stats.chunks += sum(len(r.chunks) for r in batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))


class GroupCommitCollector(Collector):
    """Prometheus counters over a committer's ``GroupCommitStats``, read at scrape time."""

    def __init__(self, stats: GroupCommitStats | Callable[[], GroupCommitStats]) -> None:
        """``stats``: the counters, or a function summing several (sharded metadata)."""
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats if isinstance(self._stats, GroupCommitStats) else self._stats()
        for name, help_, value in (
            ("batches", "Transactions that group commits ran.", s.batches),
            ("requests", "Commits run in those transactions.", s.requests),
            ("chunks", "Chunks of those commits.", s.chunks),
            (
                "solo_reruns",
                "Batches that failed as a whole and were run again one commit at a time.",
                s.solo_reruns,
            ),
        ):
            yield CounterMetricFamily(f"lakelog_coordinator_group_commit_{name}", help_, value)
        yield GaugeMetricFamily(
            "lakelog_coordinator_group_commit_largest_batch",
            "The most commits one transaction carried so far.",
            s.largest_batch,
        )
