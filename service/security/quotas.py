"""Client quotas (issue 16): produce bytes/s, fetch bytes/s and requests/s per principal.

Configured like Kafka's default client quotas (``producer_byte_rate``,
``consumer_byte_rate``, ``request_percentage``'s REST cousin, a request rate), as agent
settings: ``quota_produce_bytes_per_s``, ``quota_fetch_bytes_per_s``,
``quota_requests_per_s`` (0: no quota) for every principal, and ``quota_overrides`` for
some (Kafka's per-user and per-client-id quotas). On REST the principal is the
authenticated user (``User:<name>``) when authentication is on, else the
``X-Client-Id`` request header (Kafka's client.id), else the client's address.

Each is a token bucket per principal, refilled at the rate divided by the number of live
agents (a load balancer spreads a client over them, so the cluster admits about the
configured rate), holding at most one second of it. A request is admitted while its
principal's buckets are not in debt, and then charged: the request counts one, its body
bytes (produce) and its answer's bytes (fetch) as they pass, so a large request may
take a bucket into debt, which the next requests wait out. A request that finds a
bucket in debt is answered 429 with ``Retry-After`` (seconds until the debt is repaid)
and ``{"error_code": 429, ...}`` before anything is read or stored: nothing admitted is
lost, nothing refused is stored.

Tolerance, per agent: over any window of t seconds a principal is admitted at most
rate x t + one second of rate (the burst) + one request's bytes; across n agents the
same with rate/n each, so the cluster bound is the rate when the client's requests are
spread evenly, and lower (rate/n per agent used) when it sticks to some agents.

The Kafka door (``service.kafka``) charges the same buckets (the SASL or mTLS principal
when authentication is on, else the client id) and answers
``throttle_time_ms`` instead of refusing (KIP-219: the client waits it out).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.security.model import ANONYMOUS
from service.errors import ErrorCode
from service.executors import call
from service.settings import parse_quota_overrides
from service.web import send_error

if TYPE_CHECKING:
    from service.metrics import Metrics
    from service.settings import Settings
    from service.state import AgentState

PRODUCE = "produce_bytes"
FETCH = "fetch_bytes"
REQUESTS = "requests"
#: Seconds between refreshes of the live agent count.
AGENTS_REFRESH_S = 10.0

_PRODUCE_PATH = re.compile(r"^/topics/[^/]+(/partitions/[^/]+)?/?$|^/v3/.+/records(:batch)?/?$")
_FETCH_PATH = re.compile(r"/records/?$")
_REFRESHES: set[asyncio.Task[None]] = set()


@dataclass
class _Bucket:
    tokens: float
    at: float


class Quotas:
    """The token buckets of one agent (see the module docstring)."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.rates = {
            PRODUCE: float(settings.quota_produce_bytes_per_s),
            FETCH: float(settings.quota_fetch_bytes_per_s),
            REQUESTS: float(settings.quota_requests_per_s),
        }
        self.overrides = parse_quota_overrides(settings.quota_overrides)
        self.enabled = any(self.rates.values()) or any(
            any(r.values()) for r in self.overrides.values()
        )
        self.agents = 1
        self.metrics = metrics
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._refreshed = 0.0

    def configured(self, principal: str, kind: str) -> float:
        """The principal's cluster-wide rate of ``kind``: its override, else the default."""
        return self.overrides.get(principal, {}).get(kind, self.rates[kind])

    def _rate(self, principal: str, kind: str) -> float:
        return self.configured(principal, kind) / max(self.agents, 1)

    def _bucket(self, principal: str, kind: str, now: float) -> _Bucket:
        rate = self._rate(principal, kind)
        b = self._buckets.get((principal, kind))
        if b is None:
            b = self._buckets[(principal, kind)] = _Bucket(rate, now)
        b.tokens = min(rate, b.tokens + (now - b.at) * rate)  # burst: one second
        b.at = now
        return b

    def delay(self, principal: str, kinds: tuple[str, ...], now: float | None = None) -> float:
        """Seconds until every bucket of ``kinds`` is out of debt (0: admit now)."""
        now = time.monotonic() if now is None else now
        wait = 0.0
        for kind in kinds:
            if self.configured(principal, kind) > 0:
                b = self._bucket(principal, kind, now)
                if b.tokens < 0:
                    wait = max(wait, -b.tokens / self._rate(principal, kind))
        return wait

    def charge(self, principal: str, kind: str, amount: float, now: float | None = None) -> None:
        if amount and self.configured(principal, kind) > 0:
            b = self._bucket(principal, kind, time.monotonic() if now is None else now)
            b.tokens -= amount
            if self.metrics is not None:
                self.metrics.quota_charged.labels(kind=kind).inc(amount)

    def throttled(self, kind: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.quota_throttled.labels(kind=kind).inc()
            self.metrics.quota_throttle_seconds.labels(kind=kind).inc(seconds)

    def kafka_throttle_ms(
        self, client_id: str | None, kind: str, amount: int, user: str = ANONYMOUS
    ) -> int:
        """Charge a Kafka request (one request, ``amount`` bytes of ``kind``) to its
        authenticated principal ``user`` (SASL or mTLS), else to its client id; the
        throttle time to answer (KIP-219: the client waits it out)."""
        if not self.enabled:
            return 0
        principal = user if user != ANONYMOUS else f"client:{client_id or ''}"
        self.charge(principal, REQUESTS, 1)
        self.charge(principal, kind, amount)
        wait = self.delay(principal, (REQUESTS, kind))
        if wait > 0:
            self.throttled(kind, wait)
        return math.ceil(wait * 1000)

    def due_refresh(self) -> bool:
        now = time.monotonic()
        if now - self._refreshed < AGENTS_REFRESH_S:
            return False
        self._refreshed = now
        return True


def principal_of(scope: Scope) -> str:
    user = (scope.get("state") or {}).get("principal")
    if user is not None and user != ANONYMOUS:  # authenticated (service.security.auth runs first)
        return str(user)
    for name, value in scope.get("headers", ()):
        if name == b"x-client-id" and value:
            return f"client:{value.decode('latin-1')}"
    client = scope.get("client")
    return "address:" + (str(client[0]) if client else "unknown")


def kinds_of(method: str, path: str) -> tuple[str, ...]:
    if method == "POST" and _PRODUCE_PATH.search(path):
        return (REQUESTS, PRODUCE)
    if method == "GET" and _FETCH_PATH.search(path):
        return (REQUESTS, FETCH)
    return (REQUESTS,)


class QuotaMiddleware:
    """Refuses requests of principals in debt (429 + Retry-After); charges the others."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        agent: AgentState | None = (
            getattr(scope["app"].state, "agent", None) if scope["type"] == "http" else None
        )
        quotas = None if agent is None else agent.quotas
        if quotas is None or not quotas.enabled or scope["path"] in ("/health", "/metrics"):
            await self.app(scope, receive, send)
            return
        if quotas.due_refresh():
            assert agent is not None
            task = asyncio.get_running_loop().create_task(_refresh_agents(agent, quotas))
            _REFRESHES.add(task)  # keep a reference until it ends
            task.add_done_callback(_REFRESHES.discard)
        principal = principal_of(scope)
        kinds = kinds_of(scope["method"], scope["path"])
        wait = quotas.delay(principal, kinds)
        if wait > 0:
            quotas.throttled(kinds[-1], wait)
            await send_error(
                scope,
                send,
                429,
                int(ErrorCode.TOO_MANY_REQUESTS),
                f"Quota exceeded for {principal}: retry in {wait:.2f} s.",
                [(b"retry-after", str(max(1, math.ceil(wait))).encode())],
            )
            return
        quotas.charge(principal, REQUESTS, 1)

        async def counting_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request" and PRODUCE in kinds:
                quotas.charge(principal, PRODUCE, len(message.get("body", b"")))
            return message

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.body" and FETCH in kinds:
                quotas.charge(principal, FETCH, len(message.get("body", b"")))
            await send(message)

        await self.app(scope, counting_receive, counting_send)


async def _refresh_agents(agent: AgentState, quotas: Quotas) -> None:
    # Live agents as the v3 brokers list counts them (service.v3.common.broker_max_age_s).
    max_age = max(10.0, 3 * agent.settings.heartbeat_interval_s)
    try:
        found = await call(agent.coordinator.list_agents, max_age)
    except Exception:  # the count stays as it was; the next refresh tries again
        return
    quotas.agents = max(1, len(found))
