"""Wake-ups for long-polling consumer fetches, without polling the coordinator per request.

A fetch that finds nothing registers a ``Waiter`` for the partitions it reads,
with the position it waits beyond, and sleeps on it. Two things wake it:

- a commit made by *this* agent: ``Notifier.on_write`` is a ``LogWriter``
  listener (it runs in the flushing thread) and hands the touched partitions to
  the event loop with ``call_soon_threadsafe``; waiters wake at once;
- data committed through *other* agents: ONE background task per agent checks
  the high watermarks of the partitions someone waits on (one coordinator call
  for all of them), every ``interval_s``, and only while someone waits; it
  wakes a waiter as soon as a high watermark passes its position.

Partitions are keyed by (topic id, partition): the write path knows topic ids,
not names, and a topic re-created under the same name is another topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence

from coordinator.client import PartitionOffsets, TopicPartition
from index.log import WriteResult
from segments.errors import LakelogError
from service.consume.metrics import ConsumeMetrics

log = logging.getLogger(__name__)

#: (topic id, partition)
PartitionKey = tuple[bytes, int]
#: The coordinator's ``offsets_many``: offsets of many partitions in one call.
OffsetsFn = Callable[[Sequence[TopicPartition]], dict[TopicPartition, PartitionOffsets]]


class Waiter:
    """One waiting fetch: what it watches, where it stands, and its event."""

    def __init__(self, watches: dict[PartitionKey, tuple[str, int]]) -> None:
        #: (topic id, partition) -> (topic name, next offset wanted)
        self.watches = watches
        self.event = asyncio.Event()

    def update(self, key: PartitionKey, position: int) -> None:
        name, _ = self.watches[key]
        self.watches[key] = (name, position)


class Notifier:
    """Wakes waiting fetches on local commits and on high-watermark changes elsewhere.

    Args:
        offsets: the coordinator's ``offsets_many(partitions)`` (run in a thread).
        interval_s: how often the background poller checks high watermarks.
    """

    def __init__(
        self, offsets: OffsetsFn, interval_s: float, metrics: ConsumeMetrics | None = None
    ) -> None:
        self._offsets = offsets
        self.interval_s = interval_s
        self.metrics = metrics
        self._waiters: dict[PartitionKey, set[Waiter]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.Task[None] | None = None
        self._closed = False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the agent's event loop (call from the lifespan)."""
        self._loop = loop

    # -- local commits ----------------------------------------------------------------
    def on_write(self, result: WriteResult, data: bytes) -> None:
        """``LogWriter`` listener (any thread): wake the waiters of the written partitions."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        keys = {(c.topic_id, c.partition) for c in result.chunks}
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self.wake, keys)

    def wake(self, keys: set[PartitionKey]) -> None:
        """Wake every waiter of any of ``keys`` (event-loop thread)."""
        for key in keys:
            for waiter in self._waiters.get(key, ()):
                waiter.event.set()

    # -- waiting -----------------------------------------------------------------------
    @contextlib.contextmanager
    def watch(self, watches: dict[PartitionKey, tuple[str, int]]) -> Iterator[Waiter]:
        """Register a waiter for the duration of a fetch (event-loop thread).

        Register before reading, then read, then wait: a commit that lands between
        the read and the wait has already set the event, so no wake-up is lost.
        """
        waiter = Waiter(dict(watches))
        for key in waiter.watches:
            self._waiters.setdefault(key, set()).add(waiter)
        if waiter.watches:
            self._ensure_poller()
        try:
            yield waiter
        finally:
            for key in waiter.watches:
                group = self._waiters.get(key)
                if group is not None:
                    group.discard(waiter)
                    if not group:
                        del self._waiters[key]

    async def wait(self, waiter: Waiter, timeout_s: float) -> bool:
        """Sleep until woken or ``timeout_s`` passed; True when woken. Clears the event."""
        started = time.monotonic()
        woken = True
        if not waiter.event.is_set():
            try:
                await asyncio.wait_for(waiter.event.wait(), timeout_s)
            except TimeoutError:
                woken = False
        waiter.event.clear()
        if self.metrics is not None:
            self.metrics.poll_waits.labels(woken=str(woken).lower()).inc()
            self.metrics.poll_wait_seconds.observe(time.monotonic() - started)
        return woken

    # -- the one poller ----------------------------------------------------------------
    def _ensure_poller(self) -> None:
        if self._closed or (self._poller is not None and not self._poller.done()):
            return
        self._poller = asyncio.get_running_loop().create_task(
            self._poll(), name="lakelog-hw-poller"
        )

    def _wanted(self) -> dict[tuple[str, int], PartitionKey]:
        """(name, partition) -> key of every partition someone waits on."""
        out: dict[tuple[str, int], PartitionKey] = {}
        for key, waiters in self._waiters.items():
            for w in waiters:
                out[(w.watches[key][0], key[1])] = key
                break
        return out

    def _high_watermarks(self, wanted: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """High watermarks of ``wanted`` in one coordinator call (in a worker thread);
        partitions deleted meanwhile are left out, a failure is logged and skipped."""
        try:
            found = self._offsets([TopicPartition(name, p) for name, p in wanted])
        except LakelogError as e:
            log.debug("high watermarks of %d partitions: %s", len(wanted), e)
            return {}
        if self.metrics is not None:
            self.metrics.hw_polls.inc(len(wanted))
        return {(tp.topic, tp.partition): o.high_watermark for tp, o in found.items()}

    async def _poll(self) -> None:
        """Check high watermarks while anyone waits; exits when nobody does."""
        while self._waiters and not self._closed:
            await asyncio.sleep(self.interval_s)
            wanted = self._wanted()
            if not wanted:
                break
            hws = await asyncio.to_thread(self._high_watermarks, list(wanted))
            for (name, partition), hw in hws.items():
                key = wanted[(name, partition)]
                for waiter in self._waiters.get(key, ()):
                    if hw > waiter.watches[key][1]:
                        waiter.event.set()

    async def close(self) -> None:
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
