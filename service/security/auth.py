"""Authentication of the agent's REST clients: HTTP Basic with a user or an API key.

With ``authentication = basic`` every request but ``/health`` and ``/metrics`` (unless
``protect_metrics``) needs
``Authorization: Basic base64(name:secret)`` where name:secret is a user and its
password or an API key id and its secret (as Confluent REST Proxy's basic auth). The
coordinator verifies (argon2id, ``coordinator.security.store``); this agent then
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

import logging
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator.security.logins import Logins, login_keys
from coordinator.security.model import ANONYMOUS, basic
from coordinator.security.model import parse_basic as basic_credential
from coordinator.security.store import SecurityStore
from segments.errors import AuthenticationError, LakelogError, LoginThrottledError
from service.errors import ErrorCode, error_code_for, error_message_for, is_v3, status_for
from service.executors import call
from service.web import send_error

if TYPE_CHECKING:
    from service.security.oauth import BearerVerifier

log = logging.getLogger(__name__)

REALM = "lakelog"
#: Paths served without credentials (nor ACLs): probes and scrapes. /metrics names
#: groups and topics: ``protect_metrics`` closes it (:func:`open_paths`).
OPEN_PATHS = frozenset({"/health", "/metrics"})
#: Paths that authenticate and authorize their own callers, in their own error shape:
#: the Iceberg REST catalog of ``lakelog serve`` (``coordinator.iceberg.rest``).
SELF_GUARDED = ("/iceberg/",)


def open_paths(protect_metrics: bool) -> frozenset[str]:
    return OPEN_PATHS - {"/metrics"} if protect_metrics else OPEN_PATHS


class Authenticator(Logins):
    """:class:`~coordinator.security.logins.Logins` through the coordinator, and OAuth
    bearer tokens."""

    def __init__(self, store: SecurityStore, **kwargs: Any) -> None:
        super().__init__(store, run=call, **kwargs)
        #: Checks OAuth bearer tokens when a JWKS is configured (``service.security.oauth``).
        self.bearer: BearerVerifier | None = None

    async def authenticate_bearer(self, token: str, address: str, door: str) -> str:
        """The principal of an OAuth bearer JWT. Raises AuthenticationError (also when
        no JWKS is configured), LoginThrottledError."""
        if self.bearer is None:
            self.metrics.failures.labels(door, "malformed").inc()
            raise AuthenticationError("Bearer tokens are not accepted here.")
        async with self.verifying(login_keys(None, address), door):
            principal = await call(self.bearer.principal, token)
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
    return basic_credential(header.decode("latin-1"))


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
        open_paths = scope["app"].state.open_paths
        if scope["type"] != "http" or path in open_paths or path.startswith(SELF_GUARDED):
            await self.app(scope, receive, send)
            return
        authenticator: Authenticator | None = getattr(scope["app"].state, "authenticator", None)
        if authenticator is None:  # still starting: serve nothing unauthenticated
            await send_error(scope, send, 503, 503, "The agent is starting.")
            return
        header = dict(scope.get("headers") or ()).get(b"authorization")
        address = client_address(scope)
        if header is None and (certified := certificate_principal_of(scope)) is not None:
            scope.setdefault("state", {})["principal"] = certified  # mTLS (service.security.mtls)
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
        except LakelogError as e:  # the coordinator could not check it: retry later
            await _send_lakelog_error(scope, send, e)
            return
        state = scope.setdefault("state", {})
        state["principal"] = principal
        state["credential"] = basic(*credential)  # what management calls forward
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
        except LakelogError as e:
            await _send_lakelog_error(scope, send, e)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


#: Where service.security.mtls puts a verified client certificate's principal: our key in
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


async def _send_lakelog_error(scope: Scope, send: Send, exc: LakelogError) -> None:
    """A credential that could not be checked (the coordinator unreachable): the error
    table's answer, as a route would give, not an unhandled 500."""
    log.warning("%s: authentication failed: %s: %s", scope["path"], type(exc).__name__, exc)
    v3 = is_v3(scope["path"])
    code = error_code_for(exc, v3=v3)
    await send_error(scope, send, status_for(code), code, error_message_for(exc, v3=v3))
