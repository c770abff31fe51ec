"""What one agent keeps about the consumer instances it serves (nothing that must survive it).

The coordinator holds every instance's state; an agent only keeps, per
instance it served:

- a local lock, so two fetches of one instance reaching this agent queue here
  instead of asking the coordinator for the instance's fetch lease in a loop
  (fetches through other agents are kept out by that lease);
- the lease token of its fetch in flight, renewed by the heartbeat below, and
  the fetch's wake-up, so a seek or assign made through this agent wakes it;
- when it was last served, so the agent heartbeats it in the background
  (``heartbeat_loop``: one coordinator call every ``consumer_heartbeat_interval_ms``
  for all of them) until the instance is gone or idle past its instance
  timeout. This is what keeps a member in its group while its client takes
  minutes over a batch, as kafka-rest's consumers heartbeat from a background
  thread; an agent that dies stops heartbeating, and its instances leave their
  groups after their session timeout unless another agent serves them.

``FetchBudget`` bounds the key+value bytes that all fetches in flight may hold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from coordinator.groups.model import ConsumerHeartbeat, GroupCoordinator
from segments.errors import LakelogError
from service.consume.metrics import ConsumeMetrics

log = logging.getLogger(__name__)

#: The heartbeat names at most this many instances per coordinator call.
HEARTBEAT_BATCH = 1000


@dataclass
class ServedInstance:
    """One consumer instance as this agent knows it."""

    group: str
    name: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_served: float = field(default_factory=time.monotonic)
    idle_timeout_s: float = 300.0
    request_timeout_ms: int | None = None  # the instance's default fetch wait, once known
    held_until: float = 0.0  # when the lock's holder is presumed lost
    #: The fetch in flight through this agent: its lease token and how to wake it.
    token: str | None = None
    wake: Callable[[], None] | None = None
    #: Set by a seek, assign or subscribe through this agent while a fetch is in flight.
    moved: bool = False
    #: The instance's owner, once a fetch through this agent checked it (or None).
    owner: str | None = None

    async def acquire(self, timeout_s: float, hold_s: float) -> asyncio.Lock | None:
        """This agent's lock on the instance within ``timeout_s`` (however short, a free
        lock is taken), for at most ``hold_s``; None if another fetch kept it.

        A holder past its ``hold_s`` is presumed lost (an answer that was never sent):
        the lock is replaced rather than blocking the instance on this agent for good.
        Release the lock returned, not ``self.lock``.
        """
        lock = self.lock
        if lock.locked() and time.monotonic() > self.held_until:
            log.warning("fetch lock of %s/%s held too long; replaced", self.group, self.name)
            lock = self.lock = asyncio.Lock()
        try:
            # wait_for(..., 0) would cancel even an uncontended acquire before it runs.
            await asyncio.wait_for(lock.acquire(), max(timeout_s, 0.05))
        except TimeoutError:
            return None
        self.held_until = time.monotonic() + hold_s
        return lock

    def changed(self) -> None:
        """The instance's positions or assignment changed: a fetch in flight reads again."""
        self.moved = True
        if self.wake is not None:
            self.wake()


class ConsumerSessions:
    """The instances this agent serves, their background heartbeat and the fetch budget."""

    def __init__(
        self,
        groups: GroupCoordinator,
        *,
        heartbeat_interval_ms: int,
        lease_ms: int,
        fetch_memory_bytes: int,
        run: Callable[..., Awaitable[Any]],
        metrics: ConsumeMetrics | None = None,
    ) -> None:
        """``run(fn, *args)``: how coordinator calls are taken off the event loop."""
        self.groups = groups
        self.run = run
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000
        self.lease_ms = lease_ms
        self.metrics = metrics
        self.budget = FetchBudget(fetch_memory_bytes, metrics)
        self._instances: dict[tuple[str, str], ServedInstance] = {}

    def served(
        self, group: str, name: str, *, idle_timeout_ms: int | None = None
    ) -> ServedInstance:
        """Note a call on the instance (it is heartbeated from now on); its entry."""
        key = (group, name)
        inst = self._instances.get(key)
        if inst is None:
            inst = self._instances[key] = ServedInstance(group, name)
        inst.last_served = time.monotonic()
        if idle_timeout_ms is not None:
            inst.idle_timeout_s = idle_timeout_ms / 1000
        return inst

    def owner_of(self, group: str, name: str) -> str | None:
        """The owner a fetch through this agent found the instance to have, if any."""
        inst = self._instances.get((group, name))
        return None if inst is None else inst.owner

    def changed(self, group: str, name: str) -> None:
        """A seek, assign or subscribe went through: wake this agent's fetch of the instance."""
        inst = self._instances.get((group, name))
        if inst is not None:
            inst.changed()

    def forget(self, group: str, name: str) -> None:
        inst = self._instances.get((group, name))
        if inst is not None and not inst.lock.locked():
            del self._instances[(group, name)]

    def __len__(self) -> int:
        return len(self._instances)

    # -- the background heartbeat --------------------------------------------------

    def _due(self) -> list[ConsumerHeartbeat]:
        """Instances to heartbeat; those idle past their timeout are dropped (the
        coordinator deletes them, unless another agent keeps serving them)."""
        now = time.monotonic()
        out = []
        for key, inst in list(self._instances.items()):
            if now - inst.last_served > inst.idle_timeout_s and not inst.lock.locked():
                del self._instances[key]
                continue
            out.append(ConsumerHeartbeat(inst.group, inst.name, inst.token))
        return out

    async def heartbeat_once(self) -> None:
        """One heartbeat of every served instance (and renewal of every lease held)."""
        due = self._due()
        for i in range(0, len(due), HEARTBEAT_BATCH):
            batch = due[i : i + HEARTBEAT_BATCH]
            gone = await self.run(self.groups.heartbeat_consumers, batch, self.lease_ms)
            for group, name in gone:
                self.forget(group, name)
            if self.metrics is not None:
                self.metrics.consumer_heartbeats.inc(len(batch))

    async def heartbeat_loop(self) -> None:
        """Heartbeat every interval until cancelled; a failure is logged and retried."""
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                await self.heartbeat_once()
            except LakelogError as e:
                log.warning("consumer heartbeat failed: %s", e)
            except Exception:  # never let the loop die: members would drop out
                log.exception("consumer heartbeat failed unexpectedly")


class FetchBudget:
    """Key+value bytes granted to fetches in flight, at most ``total`` at once.

    A fetch asks for its ``max_bytes`` and gets what is left, waiting while less
    than its minimum is; it gives the grant back once its answer is sent.
    """

    def __init__(self, total: int, metrics: ConsumeMetrics | None = None) -> None:
        self.total = total
        self.in_use = 0
        self.metrics = metrics
        self._cond = asyncio.Condition()

    async def acquire(self, want: int, minimum: int, timeout_s: float) -> int:
        """Grant up to ``want`` bytes, at least ``min(minimum, want, total)``; 0 on timeout."""
        floor = max(min(minimum, want, self.total), 1)
        async with self._cond:
            if self.total - self.in_use < floor:
                try:
                    await asyncio.wait_for(
                        self._cond.wait_for(lambda: self.total - self.in_use >= floor),
                        max(timeout_s, 0.0),
                    )
                except TimeoutError:
                    return 0
            grant = min(want, self.total - self.in_use)
            self.in_use += grant
            self._gauge()
            return grant

    async def release(self, grant: int) -> None:
        if grant <= 0:
            return
        async with self._cond:
            self.in_use -= grant
            self._gauge()
            self._cond.notify_all()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.fetch_budget_in_use.set(self.in_use)
