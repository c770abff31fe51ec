"""The cache of verified logins (``coordinator.security.logins.Logins``): how long a deleted
user's or API key's credential keeps working in a process that verified it, on the
fake clock, against the real security store (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from coordinator.local import LocalCoordinator
from coordinator.security.access import LOGIN_CACHE_TTL_S
from coordinator.security.logins import AuthMetrics, Logins
from coordinator.security.settings import AgentSecuritySettings
from coordinator.security.store import SqlSecurityStore
from segments.errors import AuthenticationError
from tests.unit.test_security_store import CHEAP

TTL = 5.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store(db_url: str) -> Iterator[SqlSecurityStore]:
    with LocalCoordinator(db_url) as coord:
        yield SqlSecurityStore(coord.db, CHEAP)


def _logins(store: SqlSecurityStore, clock: Clock) -> Logins:
    return Logins(
        store,
        cache_ttl_s=TTL,
        max_failures=100,
        failure_window_s=60.0,
        metrics=AuthMetrics(CollectorRegistry()),
        clock=clock,
    )


def test_a_deleted_principal_stops_working_once_the_ttl_passed(store: SqlSecurityStore) -> None:
    """Alice and her API key are verified (and cached); then deleted through another
    process (the store itself here). Until ``cache_ttl_s`` has passed since the
    verification the cache answers; from then on the store is asked, and refuses."""
    clock = Clock()
    logins = _logins(store, clock)
    store.create_user("alice", "alice-password-1")
    key = store.create_api_key("alice")

    async def main() -> list[object]:
        out: list[object] = []
        for name, secret in (("alice", "alice-password-1"), (key.key.key_id, key.secret)):
            out.append(await logins.authenticate(name, secret, "10.0.0.1", "rest"))
        store.delete_user("alice")  # and her API keys
        for at in (TTL - 0.001, TTL):
            clock.t = 1000.0 + at
            for name, secret in (("alice", "alice-password-1"), (key.key.key_id, key.secret)):
                try:
                    out.append(await logins.authenticate(name, secret, "10.0.0.1", "rest"))
                except AuthenticationError:
                    out.append("refused")
        return out

    assert asyncio.run(main()) == ["User:alice"] * 4 + ["refused"] * 2


def test_forget_drops_what_a_verification_in_flight_would_have_cached(
    store: SqlSecurityStore,
) -> None:
    """Race: a login of Alice is being verified when an admin deletes her through this
    process (which calls ``forget``). The verification answers what it found when it
    began, but does not cache it: her next login asks the store and is refused. Before,
    the verification put her back in the cache, trusted for another ``cache_ttl_s``."""
    store.create_user("alice", "alice-password-1")
    verifying, deleted = threading.Event(), threading.Event()

    class Slow:
        def authenticate(self, name: str, secret: str) -> str:
            principal = store.authenticate(name, secret)
            verifying.set()
            assert deleted.wait(30)
            return principal

    logins = _logins(store, Clock())
    logins.store = Slow()  # type: ignore[assignment]

    async def main() -> list[str]:
        first = asyncio.create_task(
            logins.authenticate("alice", "alice-password-1", "10.0.0.1", "rest")
        )
        await asyncio.to_thread(verifying.wait, 30)
        store.delete_user("alice")
        logins.forget()
        deleted.set()
        out = [await first]
        logins.store = store
        try:
            out.append(await logins.authenticate("alice", "alice-password-1", "10.0.0.1", "rest"))
        except AuthenticationError:
            out.append("refused")
        return out

    assert asyncio.run(main()) == ["User:alice", "refused"]


def test_the_bounds_are_explicit() -> None:
    """The agents' bound is a setting (default 5 s, at most 300 s); the coordinator's
    cache of users' logins (Spark jobs) has the same default, named."""
    field = AgentSecuritySettings.model_fields["auth_cache_ttl_s"]
    assert field.default == LOGIN_CACHE_TTL_S == 5.0
    assert "deleted" in (field.description or "")
    with pytest.raises(ValueError, match="less than or equal to 300"):
        AgentSecuritySettings(auth_cache_ttl_s=301)
