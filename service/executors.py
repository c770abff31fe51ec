"""Bounded thread pools, one per kind of blocking work, so one kind cannot starve another.

The agent's blocking calls (boto3, the coordinator client, SQLite) run in threads.
Sharing asyncio's one default pool (``min(32, cpus + 4)`` threads: 6 on 2 cores)
let a few consumers lagging on slow store GETs hold every thread while flushes, the
agent heartbeat and coordinator calls queued behind them, until the agent was
declared dead. Each kind now has its own pool:

==============  =================================================================
``flush``       PUT + commit of a segment object (the batcher runs one at a time)
``heartbeat``   the agent's liveness heartbeat to the coordinator
``coordinator`` coordinator calls made by requests (metadata, groups, commits)
``read``        store GETs and index lookups of consumer fetches
``cpu``         parsing and partitioning of big produce bodies (off the event loop)
==============  =================================================================

Each pool counts what it holds (busy threads, queued tasks, tasks run, time spent
queued), exported at ``/metrics`` as ``lakelog_executor_*{pool="..."}``: a queue
that grows, or wait seconds that climb, says which kind of work is saturated.

``call(fn, *args)`` (re-exported by ``service.v3.common``) runs on the coordinator
pool of the running agent, or on asyncio's default pool outside an agent (tools,
unit tests).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from enum import StrEnum
from typing import Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

T = TypeVar("T")


class Kind(StrEnum):
    """The kinds of blocking work, each with a pool of its own."""

    FLUSH = "flush"
    HEARTBEAT = "heartbeat"
    COORDINATOR = "coordinator"
    READ = "read"
    CPU = "cpu"


#: Threads per pool unless the settings say otherwise. Flushes run one at a time (a
#: second thread lets the next start while a stuck one times out); the heartbeat is one
#: call every few seconds; reads block on the store, so they get the most.
DEFAULT_THREADS: Mapping[Kind, int] = {
    Kind.FLUSH: 2,
    Kind.HEARTBEAT: 1,
    Kind.COORDINATOR: 8,
    Kind.READ: 8,
    Kind.CPU: 2,
}


class Pool:
    """A ThreadPoolExecutor of ``threads`` threads that counts its load."""

    def __init__(self, kind: Kind, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"pool {kind} needs at least one thread, got {threads}")
        self.kind = kind
        self.threads = threads
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix=f"lakelog-{kind}")
        self._lock = threading.Lock()
        self.busy = 0
        self.queued = 0
        self.completed = 0
        self.wait_seconds = 0.0

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` in this pool; await its result.

        The caller's context variables go along, as with ``asyncio.to_thread``. A
        cancelled caller stops waiting; a task that has not started yet never runs.
        """
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        submitted = time.monotonic()

        def job() -> T:
            started = time.monotonic()
            with self._lock:
                self.queued -= 1
                self.busy += 1
                self.wait_seconds += started - submitted
            try:
                return call()
            finally:
                with self._lock:
                    self.busy -= 1
                    self.completed += 1

        with self._lock:
            self.queued += 1
        future = self._executor.submit(job)
        future.add_done_callback(self._dequeue_if_cancelled)
        return await asyncio.wrap_future(future)

    def _dequeue_if_cancelled(self, future: Future[Any]) -> None:
        if future.cancelled():  # cancelled before it started: job() never ran
            with self._lock:
                self.queued -= 1

    def snapshot(self) -> tuple[int, int, int, int, float]:
        """threads, busy, queued, completed, wait seconds: one consistent reading."""
        with self._lock:
            return self.threads, self.busy, self.queued, self.completed, self.wait_seconds

    def shutdown(self) -> None:
        """Stop taking work; queued tasks are dropped, running ones finish."""
        self._executor.shutdown(wait=False, cancel_futures=True)


class Executors:
    """The agent's pools, one per :class:`Kind`.

    Args:
        threads: pool sizes by kind; missing kinds get :data:`DEFAULT_THREADS`.
    """

    def __init__(self, threads: Mapping[Kind, int] | None = None) -> None:
        sizes = {**DEFAULT_THREADS, **(threads or {})}
        self.pools = {kind: Pool(kind, sizes[kind]) for kind in Kind}

    def __getitem__(self, kind: Kind) -> Pool:
        return self.pools[kind]

    async def run(self, kind: Kind, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the pool of ``kind``."""
        return await self.pools[kind].run(fn, *args, **kwargs)

    def shutdown(self) -> None:
        for pool in self.pools.values():
            pool.shutdown()


class ExecutorCollector(Collector):
    """Prometheus view of an :class:`Executors`, read at scrape time."""

    def __init__(self, executors: Executors) -> None:
        self.executors = executors

    #: (family class, name, help) of each figure, in ``Pool.snapshot`` order.
    FIGURES = (
        (GaugeMetricFamily, "lakelog_executor_threads", "Threads of each pool."),
        (GaugeMetricFamily, "lakelog_executor_busy_threads", "Threads running a task."),
        (GaugeMetricFamily, "lakelog_executor_queued_tasks", "Tasks waiting for a thread."),
        (CounterMetricFamily, "lakelog_executor_tasks", "Tasks run."),
        (
            CounterMetricFamily,
            "lakelog_executor_wait_seconds",
            "Seconds tasks spent queued before a thread took them.",
        ),
    )

    def collect(self) -> Iterator[Metric]:
        families = [cls(name, help_, labels=["pool"]) for cls, name, help_ in self.FIGURES]
        for kind, pool in self.executors.pools.items():
            for family, value in zip(families, pool.snapshot(), strict=True):
                family.add_metric([kind.value], value)
        yield from families


# -- the running agent's pools ------------------------------------------------------

_installed: Executors | None = None


def install(executors: Executors | None) -> None:
    """Make ``executors`` the pools ``call`` uses (the app's lifespan; None to remove)."""
    global _installed
    _installed = executors


async def run(kind: Kind, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn`` on the installed pool of ``kind`` (asyncio's default pool if none)."""
    executors = _installed
    if executors is None:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return await executors.run(kind, fn, *args, **kwargs)


async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a (synchronous, thread-safe) coordinator call off the event loop."""
    return await run(Kind.COORDINATOR, fn, *args, **kwargs)


async def run_if(offload: bool, kind: Kind, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the pool of ``kind`` if ``offload``, else inline on the event loop.

    For CPU work that is worth a thread hop only when it is big (the GIL is released
    every few milliseconds, so the event loop keeps serving other requests).
    """
    if offload:
        return await run(kind, fn, *args)
    return fn(*args)
