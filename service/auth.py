"""Authentication of the agent's REST clients: HTTP Basic with a user or an API key.

With ``authentication = basic`` every request but ``/health`` and ``/metrics`` needs
``Authorization: Basic base64(name:secret)`` where name:secret is a user and its
password or an API key id and its secret (as Confluent REST Proxy's basic auth). The
coordinator verifies (argon2id, ``coordinator.security_store``); this agent then
trusts the credential for ``auth_cache_ttl_s`` (keyed by an HMAC of the credential
under a per-process random key, so the cache never holds a password).

Answers: 401 ``{"error_code": 40101, ...}`` with ``WWW-Authenticate: Basic
realm="lakelog"`` for a missing, malformed or wrong credential; 429 with
``Retry-After`` once a name at a client address, or a client address, failed
``auth_max_failures`` times within ``auth_failure_window_s`` (:class:`LoginThrottle`).
The address is the client's own: a proxy's ``X-Forwarded-For`` counts only from the
proxies in ``forwarded_allow_ips``. Nobody can lock a name out everywhere: failures
for ``admin`` from one address throttle ``admin`` at that address only. Failures are
counted on ``/metrics`` by reason, never with the name or the secret.

The authenticated principal is ``request.state.principal`` (``User:<name>``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator.security import ANONYMOUS
from coordinator.security_store import SecurityStore
from segments.errors import AuthenticationError, LoginThrottledError
from service.errors import ErrorCode
from service.executors import call
from service.web import send_error

if TYPE_CHECKING:
    from service.oauth import BearerVerifier

log = logging.getLogger(__name__)

REALM = "lakelog"
#: Paths served without credentials: probes and scrapes (they show no data).
OPEN_PATHS = frozenset({"/health", "/metrics"})
#: Paths that authenticate and authorize their own callers, in their own error shape:
#: the Iceberg REST catalog of ``lakelog serve`` (``coordinator.iceberg.rest``).
SELF_GUARDED = ("/iceberg/",)
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
            "Successful authentications, by door and whether the agent's cache answered.",
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


class Authenticator:
    """Verifies credentials through the coordinator, caches successes, throttles failures."""

    def __init__(
        self,
        store: SecurityStore,
        *,
        cache_ttl_s: float,
        max_failures: int,
        failure_window_s: float,
        metrics: AuthMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self._ttl = cache_ttl_s
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()
        #: Verifications in flight by credential: the same credential sent many times at
        #: once (a client's burst on a cold cache) is verified once.
        self._pending: dict[bytes, asyncio.Future[str]] = {}
        self.throttle = LoginThrottle(max_failures, failure_window_s, clock)
        #: Checks OAuth bearer tokens when a JWKS is configured (``service.oauth``).
        self.bearer: BearerVerifier | None = None

    def _digest(self, name: str, secret: str) -> bytes:
        return hmac.new(self._key, f"{name}\0{secret}".encode(), hashlib.sha256).digest()

    def forget(self) -> None:
        """Drop every cached credential (after a password change through this agent)."""
        with self._lock:
            self._cache.clear()

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
        keys = login_keys(name, address)
        try:
            await self.throttle.admit(keys)
        except LoginThrottledError:
            self.metrics.failures.labels(door, "throttled").inc()
            raise
        verdict: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._pending[digest] = verdict
        failed = False
        try:
            principal = await call(self.store.authenticate, name, secret)
        except BaseException as e:
            failed = isinstance(e, AuthenticationError)
            verdict.set_exception(e)
            verdict.exception()  # retrieved: the waiters (if any) raise it themselves
            if failed:
                self.metrics.failures.labels(door, "invalid").inc()
            raise
        finally:
            del self._pending[digest]
            await self.throttle.done(keys, failed=failed)
        verdict.set_result(principal)
        with self._lock:
            self._cache[digest] = (principal, self._clock() + self._ttl)
            self._cache.move_to_end(digest)
            while len(self._cache) > MAX_ENTRIES:
                self._cache.popitem(last=False)
        self.metrics.successes.labels(door, "false").inc()
        return principal

    async def authenticate_bearer(self, token: str, address: str, door: str) -> str:
        """The principal of an OAuth bearer JWT. Raises AuthenticationError (also when
        no JWKS is configured), LoginThrottledError."""
        if self.bearer is None:
            self.metrics.failures.labels(door, "malformed").inc()
            raise AuthenticationError("Bearer tokens are not accepted here.")
        keys = login_keys(None, address)
        try:
            await self.throttle.admit(keys)
        except LoginThrottledError:
            self.metrics.failures.labels(door, "throttled").inc()
            raise
        failed = False
        try:
            principal = await call(self.bearer.principal, token)
        except AuthenticationError:
            failed = True
            self.metrics.failures.labels(door, "invalid").inc()
            raise
        finally:
            await self.throttle.done(keys, failed=failed)
        self.metrics.successes.labels(door, "false").inc()
        return principal


def parse_bearer(header: bytes) -> str | None:
    """The token of an ``Authorization: Bearer ...`` value; None if it is not one."""
    scheme, _, value = header.partition(b" ")
    if scheme.lower() != b"bearer" or not value.strip():
        return None
    try:
        return value.strip().decode("ascii")
    except UnicodeDecodeError:
        return None


def parse_basic(header: bytes) -> tuple[str, str] | None:
    """(name, secret) of an ``Authorization: Basic ...`` value; None if it is not one."""
    scheme, _, value = header.partition(b" ")
    if scheme.lower() != b"basic" or not value.strip():
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    name, sep, secret = decoded.partition(":")
    if not sep or not name:
        return None
    return name, secret


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


_CHALLENGE = [(b"www-authenticate", f'Basic realm="{REALM}"'.encode())]


class BasicAuthMiddleware:
    """Puts the authenticated principal in ``scope["state"]["principal"]`` or answers 401
    (see the module doc). Added only when authentication is on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in OPEN_PATHS or path.startswith(SELF_GUARDED):
            await self.app(scope, receive, send)
            return
        authenticator: Authenticator | None = getattr(scope["app"].state, "authenticator", None)
        if authenticator is None:  # still starting: serve nothing unauthenticated
            await send_error(scope, send, 503, 503, "The agent is starting.")
            return
        header = dict(scope.get("headers") or ()).get(b"authorization")
        address = client_address(scope)
        if header is None and (certified := certificate_principal_of(scope)) is not None:
            scope.setdefault("state", {})["principal"] = certified  # mTLS (service.mtls)
            await self.app(scope, receive, send)
            return
        token = parse_bearer(header) if header is not None else None
        if token is not None and authenticator.bearer is not None:
            await self._bearer(authenticator, token, address, scope, receive, send)
            return
        credential = parse_basic(header) if header is not None else None
        if credential is None:
            reason = "missing" if header is None else "malformed"
            authenticator.metrics.failures.labels("rest", reason).inc()
            await send_error(
                scope,
                send,
                401,
                int(ErrorCode.KAFKA_AUTHENTICATION),
                "Authentication is required: HTTP Basic with a user and password or an "
                "API key and secret.",
                _CHALLENGE,
            )
            return
        try:
            principal = await authenticator.authenticate(*credential, address, "rest")
        except LoginThrottledError as e:
            wait = authenticator.throttle.retry_after(*login_keys(credential[0], address))
            await send_error(
                scope,
                send,
                429,
                int(ErrorCode.TOO_MANY_REQUESTS),
                e.message,
                [(b"retry-after", b"%d" % max(1, round(wait)))],
            )
            return
        except AuthenticationError as e:
            await send_error(
                scope, send, 401, int(ErrorCode.KAFKA_AUTHENTICATION), e.message, _CHALLENGE
            )
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    async def _bearer(
        self,
        authenticator: Authenticator,
        token: str,
        address: str,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        try:
            principal = await authenticator.authenticate_bearer(token, address, "rest")
        except LoginThrottledError as e:
            await send_error(scope, send, 429, int(ErrorCode.TOO_MANY_REQUESTS), e.message)
            return
        except AuthenticationError as e:
            challenge = f'Bearer realm="{REALM}", error="invalid_token"'.encode()
            await send_error(
                scope,
                send,
                401,
                int(ErrorCode.KAFKA_AUTHENTICATION),
                e.message,
                [(b"www-authenticate", challenge)],
            )
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


#: Where service.mtls puts a verified client certificate's principal: our key in
#: ``scope["extensions"]["tls"]``, beside the ASGI TLS extension's own.
CERT_PRINCIPAL_KEY = "lakelog.client_cert_principal"


def certificate_principal_of(scope: Scope) -> str | None:
    """The principal of the connection's verified client certificate, if it has one."""
    tls = (scope.get("extensions") or {}).get("tls") or {}
    principal = tls.get(CERT_PRINCIPAL_KEY)
    return str(principal) if principal else None


def principal_of(scope: Scope) -> str:
    """The request's principal; ANONYMOUS when authentication is off."""
    state = scope.get("state") or {}
    return str(state.get("principal", ANONYMOUS))
