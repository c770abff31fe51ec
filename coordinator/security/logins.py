"""Verifying logins, for agents and coordinators alike: a cache of verified credentials,
and the throttle of failed ones.

A login names a user (or an API key id) and its secret; the security store verifies it
(argon2id, ``coordinator.security.store``). :class:`Logins` keeps each success for a
while, verifies a burst of one credential once, and counts failures per name at an
address and per address (:class:`LoginThrottle`): a name is never locked out everywhere
by failures from one address. Agents (``service.security.auth``, the Kafka listener's SASL) and
coordinators (``coordinator.security.access``) use the same class.

No HTTP here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from coordinator.security.store import SecurityStore
from segments.errors import AuthenticationError, LoginThrottledError

#: Entries kept per cache, so a flood of distinct credentials cannot grow memory.
MAX_ENTRIES = 10_000
#: How long a login waits for a verification slot (while others of its keys are being
#: verified) before it is refused with 429.
ADMIT_WAIT_S = 5.0
_THROTTLED = "Too many failed logins; try again later."


def login_keys(name: str | None, address: str) -> tuple[str, ...]:
    """What a login is throttled by: its name at its address (when it names one), and its
    address."""
    addr = f"addr:{address}"
    return (addr,) if name is None else (f"user:{name}@{address}", addr)


class AuthMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter(
            "lakelog_auth_failures",
            "Failed authentications, by door and reason (missing, malformed, invalid, throttled).",
            ["door", "reason"],
            registry=registry,
        )
        self.successes = Counter(
            "lakelog_auth_successes",
            "Successful authentications, by door and whether the process's cache answered.",
            ["door", "cached"],
            registry=registry,
        )


class LoginThrottle:
    """Failed logins per key (a name at an address, an address) within a window, and the
    logins being verified now.

    A login is admitted (:meth:`admit`) only while, for each of its keys, the failures
    within the window plus the verifications in flight stay below ``max_failures``. The
    check and the reservation are one step on the event loop, so concurrent guesses are
    counted before any is verified: at most ``max_failures`` of any number sent at once
    are checked. A login waits up to ``ADMIT_WAIT_S`` for a slot while others of its keys
    are in flight; once the failures alone reach the limit it is refused at once. Each
    agent process keeps its own counts.
    """

    def __init__(
        self, max_failures: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._in_flight: dict[str, int] = {}
        self._freed = asyncio.Condition()

    def _recent(self, key: str, now: float) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def retry_after(self, *keys: str) -> float:
        """Seconds until every key's failures are below the limit (0: they are now)."""
        now = self._clock()
        wait = 0.0
        for key in keys:
            times = self._recent(key, now)
            if times is not None and len(times) >= self.max_failures:
                wait = max(wait, times[0] + self.window_s - now)
        return wait

    def _room(self, keys: Sequence[str]) -> bool:
        now = self._clock()
        return all(
            len(self._recent(k, now) or ()) + self._in_flight.get(k, 0) < self.max_failures
            for k in keys
        )

    async def admit(self, keys: Sequence[str]) -> None:
        """Reserve a verification for each key; :meth:`done` gives it back.

        Raises:
            LoginThrottledError: too many failures lately, or no slot within
                ``ADMIT_WAIT_S``.
        """
        if self.retry_after(*keys) > 0:
            raise LoginThrottledError(_THROTTLED)
        if not self._room(keys):
            async with self._freed:
                try:
                    await asyncio.wait_for(
                        self._freed.wait_for(
                            lambda: self._room(keys) or self.retry_after(*keys) > 0
                        ),
                        ADMIT_WAIT_S,
                    )
                except TimeoutError:
                    raise LoginThrottledError(_THROTTLED) from None
            if self.retry_after(*keys) > 0:
                raise LoginThrottledError(_THROTTLED)
        for key in keys:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1

    async def done(self, keys: Sequence[str], *, failed: bool) -> None:
        """The verification :meth:`admit` reserved ended (``failed``: a wrong credential)."""
        for key in keys:
            left = self._in_flight.get(key, 0) - 1
            if left > 0:
                self._in_flight[key] = left
            else:
                self._in_flight.pop(key, None)
        if failed:
            self.failed(*keys)
        async with self._freed:
            self._freed.notify_all()

    def failed(self, *keys: str) -> None:
        now = self._clock()
        for key in keys:
            times = self._recent(key, now)
            if times is None:
                times = self._failures[key] = deque(maxlen=self.max_failures)
            times.append(now)
            self._failures.move_to_end(key)
        while len(self._failures) > MAX_ENTRIES:
            self._failures.popitem(last=False)


class Logins:
    """Verifies credentials through a security store, caches successes for ``cache_ttl_s``
    (keyed by an HMAC of the credential under a per-process random key, so the cache
    never holds a password), throttles failures (:class:`LoginThrottle`).

    ``cache_ttl_s`` bounds how long a credential keeps working here after its user or
    API key was deleted (or its password changed, or its key rotated) elsewhere: a
    success is answered from the cache for at most that long after its verification
    ended, then verified again. A change made through this process drops the cache at
    once (:meth:`forget`), verifications in flight included.

    ``run(fn, *args)`` takes the store's (blocking) calls off the event loop.
    """

    def __init__(
        self,
        store: SecurityStore,
        *,
        cache_ttl_s: float,
        max_failures: int,
        failure_window_s: float,
        metrics: AuthMetrics,
        run: Callable[..., Awaitable[Any]] = asyncio.to_thread,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self._run = run
        self._ttl = cache_ttl_s
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()
        #: Verifications in flight by credential: the same credential sent many times at
        #: once (a client's burst on a cold cache) is verified once.
        self._pending: dict[bytes, asyncio.Future[str]] = {}
        #: Bumped by :meth:`forget`: a verification that began before is not cached.
        self._generation = 0
        self.throttle = LoginThrottle(max_failures, failure_window_s, clock)

    @property
    def cache_ttl_s(self) -> float:
        """How long a verified credential is trusted without asking the store again."""
        return self._ttl

    def _digest(self, name: str, secret: str) -> bytes:
        return hmac.new(self._key, f"{name}\0{secret}".encode(), hashlib.sha256).digest()

    def forget(self) -> None:
        """Drop every cached credential (after a password change, a user's or an API key's
        deletion through this process), and keep the verifications in flight from
        caching what they verified before the change."""
        with self._lock:
            self._cache.clear()
            self._generation += 1

    @contextlib.asynccontextmanager
    async def verifying(self, keys: Sequence[str], door: str) -> AsyncIterator[None]:
        """One verification of a login throttled by ``keys`` (``login_keys``): admitted by
        the throttle first, its slot given back after; a refusal and a wrong credential
        (AuthenticationError) are counted on ``/metrics``.

        Raises:
            LoginThrottledError: not admitted (nothing is verified).
        """
        try:
            await self.throttle.admit(keys)
        except LoginThrottledError:
            self.metrics.failures.labels(door, "throttled").inc()
            raise
        failed = False
        try:
            yield
        except AuthenticationError:
            failed = True
            self.metrics.failures.labels(door, "invalid").inc()
            raise
        finally:
            await self.throttle.done(keys, failed=failed)

    async def authenticate(self, name: str, secret: str, address: str, door: str) -> str:
        """The principal of ``name``/``secret``.

        Raises:
            AuthenticationError: wrong credential. LoginThrottledError: too many failures
                lately for this name at this address, or for this address
                (``throttle.retry_after(*login_keys(name, address))`` says how long).
        """
        digest = self._digest(name, secret)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None and hit[1] > now:
                self.metrics.successes.labels(door, "true").inc()
                return hit[0]
        pending = self._pending.get(digest)
        if pending is not None:  # the same credential, being verified now
            try:
                return await asyncio.shield(pending)
            except AuthenticationError:
                self.metrics.failures.labels(door, "invalid").inc()
                raise
        async with self.verifying(login_keys(name, address), door):
            verdict: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self._pending[digest] = verdict
            generation = self._generation
            try:
                principal: str = await self._run(self.store.authenticate, name, secret)
            except BaseException as e:
                verdict.set_exception(e)
                verdict.exception()  # retrieved: the waiters (if any) raise it themselves
                raise
            finally:
                del self._pending[digest]
        verdict.set_result(principal)
        with self._lock:
            if generation != self._generation:  # forgotten meanwhile: verify it again
                self.metrics.successes.labels(door, "false").inc()
                return principal
            self._cache[digest] = (principal, self._clock() + self._ttl)
            self._cache.move_to_end(digest)
            while len(self._cache) > MAX_ENTRIES:
                self._cache.popitem(last=False)
        self.metrics.successes.labels(door, "false").inc()
        return principal
