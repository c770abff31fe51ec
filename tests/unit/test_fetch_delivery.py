"""The agent's fetch plumbing without a server: the fetch memory budget, the response
that reports whether its body reached a connected client, the served-instance lock."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from segments.errors import CoordinatorUnavailableError
from service.consume.sessions import ConsumerSessions, FetchBudget
from service.delivery import SLICE_BYTES, DeliveryResponse, DisconnectWatch
from service.v2.consumers import END_FETCH_BACKOFF_S, _Fetch


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_budget_grants_what_is_left_and_waits_for_its_minimum() -> None:
    async def main() -> None:
        budget = FetchBudget(10)
        assert await budget.acquire(8, 4, 0) == 8  # free: granted at once, even with no time
        assert await budget.acquire(8, 1, 0) == 2  # what is left
        assert await budget.acquire(8, 1, 0.05) == 0  # nothing left until the timeout
        waiter = asyncio.create_task(budget.acquire(8, 5, 5))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await budget.release(8)
        assert await waiter == 8
        assert budget.in_use == 10
        await budget.release(10)
        assert await budget.acquire(100, 50, 0) == 10  # never more than the total

    run(main())


class _Client:
    """ASGI receive/send of one request: ``hang_up()`` makes receive report a disconnect."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self._gone = asyncio.Event()
        self._first = True
        self.hang_up_after_bodies: int | None = None
        self.hang_up_after_bytes: int | None = None

    def hang_up(self) -> None:
        self._gone.set()

    async def receive(self) -> dict[str, Any]:
        if self._first:
            self._first = False
            return {"type": "http.request", "body": b"", "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        bodies = [m for m in self.sent if m["type"] == "http.response.body"]
        if self.hang_up_after_bodies is not None and len(bodies) >= self.hang_up_after_bodies:
            self.hang_up()
        got = sum(len(m["body"]) for m in bodies)
        if self.hang_up_after_bytes is not None and got >= self.hang_up_after_bytes:
            self.hang_up()
        await asyncio.sleep(0)


def _deliver(client: _Client, body: bytes, *, gone_before: bool = False) -> list[bool]:
    outcome: list[bool] = []

    async def main() -> None:
        watch = DisconnectWatch(client.receive)
        watch.start()
        if gone_before:
            client.hang_up()
            await asyncio.sleep(0.01)

        async def done(delivered: bool) -> None:
            outcome.append(delivered)

        await DeliveryResponse(body, "application/json", watch, done)(
            {}, client.receive, client.send
        )

    run(main())
    return outcome


def test_a_body_sent_to_a_connected_client_is_delivered() -> None:
    client = _Client()
    body = b"x" * (SLICE_BYTES * 2 + 5)
    assert _deliver(client, body) == [True]
    assert b"".join(m.get("body", b"") for m in client.sent) == body
    # The last byte goes last, after the check: before it, no client has the whole answer.
    assert client.sent[-1] == {"type": "http.response.body", "body": b"x", "more_body": False}


def test_a_client_that_closes_once_it_has_the_answer_still_got_it() -> None:
    """One-shot clients (curl, httpx.request) close as soon as the body is complete: that
    close must not turn a delivered answer into an undelivered one (a duplicate)."""
    client = _Client()
    body = b"z" * (SLICE_BYTES + 10)
    client.hang_up_after_bytes = len(body)  # closes the moment it has the whole body
    assert _deliver(client, body) == [True]


def test_a_client_gone_before_the_answer_gets_nothing_and_it_is_not_delivered() -> None:
    client = _Client()
    assert _deliver(client, b"[1]", gone_before=True) == [False]
    assert client.sent == []


def test_a_client_gone_mid_body_is_not_delivered() -> None:
    client = _Client()
    client.hang_up_after_bodies = 1
    assert _deliver(client, b"y" * (SLICE_BYTES * 3)) == [False]
    assert not any(m.get("more_body") is False for m in client.sent)  # never completed


def _sessions(run: Any) -> ConsumerSessions:
    groups = SimpleNamespace(heartbeat_consumers=None)  # ``run`` answers for it
    return ConsumerSessions(
        groups,  # type: ignore[arg-type]
        heartbeat_interval_ms=1000,
        lease_ms=3000,
        fetch_memory_bytes=1,
        run=run,
    )


def test_served_instance_lock_is_taken_at_once_when_free_and_replaced_when_lost() -> None:
    async def noop(*args: Any) -> Any:
        return []

    async def main() -> None:
        sessions = _sessions(noop)
        inst = sessions.served("g", "i")
        lock = await inst.acquire(0, 60)  # a zero timeout still takes a free lock
        assert lock is not None
        assert await inst.acquire(0.05, 60) is None
        lock.release()
        assert sessions.served("g", "i") is inst
        assert len(sessions) == 1
        lost = await inst.acquire(0, 0)  # a holder that never releases (an answer never sent)
        assert lost is not None
        await asyncio.sleep(0.01)
        again = await inst.acquire(0, 60)  # ... is presumed lost after its hold time
        assert again is not None and again is not lost
        again.release()

    run(main())


@pytest.mark.parametrize("gone", ["g", "other"])
def test_heartbeat_forgets_instances_the_coordinator_no_longer_has(gone: str) -> None:
    calls: list[Any] = []

    async def call(fn: Any, *args: Any) -> Any:
        calls.append(args)
        return [("g", "i")] if gone == "g" else []

    async def main() -> None:
        sessions = _sessions(call)
        sessions.served("g", "i").token = "t"
        sessions.served("g", "j")
        await sessions.heartbeat_once()
        assert [hb.token for hb in calls[0][0]] == ["t", None]
        assert calls[0][1] == 3000
        assert len(sessions) == (1 if gone == "g" else 2)

    run(main())


class _FlakyGroups:
    """A coordinator whose metadata database drops the first ``failures`` calls of
    ``end_fetch`` (a killed connection, a restart), as PostgreSQL did under the chaos
    checker's pg_kill."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.stored: list[dict[Any, int] | None] = []

    def end_fetch(self, group: str, name: str, token: str, positions: Any) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise CoordinatorUnavailableError("metadata database failed: AdminShutdown")
        self.stored.append(positions)


def _releasing_fetch(groups: _FlakyGroups) -> _Fetch:
    """A ``_Fetch`` that holds a lease, as it is when its answer has gone out."""
    fetch = object.__new__(_Fetch)
    fetch.state = SimpleNamespace(  # type: ignore[assignment]
        groups=groups, consumers=SimpleNamespace(budget=FetchBudget(1 << 20))
    )
    fetch.group, fetch.instance, fetch.token, fetch.grant = "g", "x", "lease", 0
    fetch.served = SimpleNamespace(token="lease", wake=None)  # type: ignore[assignment]
    fetch.lock = None
    return fetch


def test_a_delivered_fetch_stores_its_positions_through_a_short_coordinator_outage() -> None:
    """Fault: the metadata database drops the connection as the agent stores a delivered
    fetch's positions (the chaos checker's poll_nonmonotonic: PostgreSQL, pg_kill, the
    instance's next fetch delivered the same records again once the lease lapsed).
    Expected: the agent stores them once the database answers again; after a longer
    outage it gives up, and the lease lapsing is what is left."""
    positions = {("t", 0): 5}
    groups = _FlakyGroups(failures=len(END_FETCH_BACKOFF_S))
    run(_releasing_fetch(groups).release(positions))  # type: ignore[arg-type]
    assert groups.stored == [positions]
    assert groups.calls == len(END_FETCH_BACKOFF_S) + 1

    down = _FlakyGroups(failures=len(END_FETCH_BACKOFF_S) + 1)
    fetch = _releasing_fetch(down)
    run(fetch.release(positions))  # type: ignore[arg-type]  # logged, not raised
    assert down.stored == [] and fetch.token is None and fetch.served.token is None
