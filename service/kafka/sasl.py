"""SASL on the Kafka listener: SaslHandshake (v1) then SaslAuthenticate, per connection.

Mechanisms, as Kafka configures them: PLAIN (``authzid NUL user NUL password``; a user
and password or an API key id and secret, checked as REST's Basic credentials are, with
the same cache, throttle and metrics: ``service.security.auth.Authenticator``), OAUTHBEARER (RFC
7628; a JWT checked as REST's bearer tokens, ``service.security.oauth``), SCRAM-SHA-256 and
SCRAM-SHA-512 (RFC 5802 through ``scramp``, against the verifiers the coordinator keeps
per user; a user made before SCRAM was kept needs its password set again).

With authentication on, a connection may send only ApiVersions, SaslHandshake and
SaslAuthenticate until it has authenticated; anything else closes it (Kafka's
IllegalSaslStateException). A failed authentication is answered with
SASL_AUTHENTICATION_FAILED, then the connection closes (as Kafka's does); one that could
not be checked (the coordinator unreachable) gets the error table's retriable code, then
the connection closes and the client reconnects. A login lasts
``kafka_connections_max_reauth_ms`` (KIP-368): see :class:`SaslSession`. Handshake v0
(raw tokens outside Kafka's framing) is not offered, so every client speaks
SaslAuthenticate.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i64Timedelta
from scramp import ScramException, ScramMechanism

from coordinator.security.access import scram_proof
from coordinator.security.logins import login_keys
from coordinator.security.model import (
    PrincipalMapper,
    basic,
    check_name,
    distinguished_name,
    user_principal,
)
from coordinator.security.store import SCRAM_MECHANISMS, SecurityStore
from segments.errors import (
    AuthenticationError,
    InvalidSecurityRequestError,
    LakelogError,
    LoginThrottledError,
)
from service.executors import call
from service.kafka.errors import code_for
from service.security.auth import Authenticator

log = logging.getLogger(__name__)

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
#: What ApiVersions advertises for them.
SASL_VERSIONS = {SASL_HANDSHAKE: (1, 1), SASL_AUTHENTICATE: (0, 2)}
MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS, "OAUTHBEARER")
_FAILED = "Authentication failed: invalid user name, API key or password."


class SaslStateError(Exception):
    """A request out of SASL's order: the connection closes."""


class SessionExpiredError(Exception):
    """A request after the SASL session's lifetime without re-authentication (KIP-368):
    the connection closes, as Kafka closes it."""


class SaslSession:
    """One connection's SASL state; ``principal`` once authenticated.

    Args:
        authenticator: checks credentials.
        address: the client's (login throttling counts per address).
        lifetime_ms: how long a login lasts (Kafka's ``connections.max.reauth.ms``; 0:
            for ever). SaslAuthenticate answers it as ``session_lifetime_ms`` (KIP-368);
            the client logs in again on the same connection (SaslHandshake, then
            SaslAuthenticate, same mechanism and principal) before it ends, else its next
            request closes the connection. So a deleted user, or one whose password
            changed, keeps no connection past one lifetime.
    """

    def __init__(self, authenticator: Authenticator, address: str, lifetime_ms: int = 0) -> None:
        self.authenticator = authenticator
        self.address = address
        self.lifetime_ms = lifetime_ms
        self.mechanism: str | None = None
        self.principal: str | None = None
        self.expires_at: float | None = None  # time.monotonic() the login ends at
        self.failed = False  # an authentication failed: close after its answer
        #: The client's own credential, for the coordinator to check when this connection
        #: changes ACLs through an agent of coordinator processes (``coordinator.security.access``):
        #: a PLAIN password, or the messages of a SCRAM login. Never logged.
        self.credential: str | None = None
        self._done = False  # SASL succeeded
        self._reauth = False  # a re-authentication under way
        self._scram: Any = None  # scramp's server of an exchange under way
        self._scram_user = ""
        self._scram_messages: tuple[str, str] = ("", "")  # client-first, server-first

    def check_expiry(self) -> None:
        """Raises SessionExpiredError past the login's lifetime (the connection closes)."""
        if self.expires_at is not None and time.monotonic() >= self.expires_at:
            raise SessionExpiredError(
                f"SASL session of {self.principal} ended (connections.max.reauth.ms "
                f"{self.lifetime_ms}) without re-authentication"
            )

    @property
    def store(self) -> SecurityStore:
        return self.authenticator.store

    def handshake(self, response_cls: type, mechanism: str) -> Any:
        # A client certificate's principal (mTLS) gives way to SASL's, as on Kafka's SASL_SSL.
        if self._done:  # KIP-368: a re-authentication, with the same mechanism
            if not self.lifetime_ms or self._reauth or self.expires_at is None:
                raise SaslStateError("SaslHandshake after authentication")
            if mechanism != self.mechanism:
                raise SaslStateError("re-authentication must keep the mechanism")
            self._reauth, self._done = True, False
            return response_cls(error_code=ErrorCode.none, mechanisms=MECHANISMS)
        if self.mechanism is not None:
            raise SaslStateError("SaslHandshake after the handshake")
        if mechanism not in MECHANISMS:
            return response_cls(
                error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=MECHANISMS
            )
        self.mechanism = mechanism
        return response_cls(error_code=ErrorCode.none, mechanisms=MECHANISMS)

    async def authenticate(self, response_cls: type, auth_bytes: bytes) -> Any:
        if self.mechanism is None or self._done:
            raise SaslStateError("SaslAuthenticate without a handshake, or after success")
        before = self.principal if self._reauth else None
        try:
            if self.mechanism == "PLAIN":
                out = await self._plain(auth_bytes)
            elif self.mechanism == "OAUTHBEARER":
                out = await self._oauthbearer(auth_bytes)
            else:
                out = await self._scram_step(auth_bytes)
            if before is not None and self._done and self.principal != before:
                raise AuthenticationError(
                    f"Re-authentication may not change the principal ({before})."
                )
        except (AuthenticationError, LoginThrottledError) as e:
            self.principal = None  # not even a certificate's
            self.failed = True  # the listener answers, then closes (as Kafka does)
            return _answer(response_cls, ErrorCode.sasl_authentication_failed, e.message)
        except LakelogError as e:
            # The credential could not be checked (the coordinator unreachable): the error
            # table's code (retriable: REQUEST_TIMED_OUT for an unreachable coordinator),
            # then the connection closes; the client reconnects and authenticates again.
            log.warning("SASL authentication could not be checked: %s: %s", type(e).__name__, e)
            self.principal = None
            self.failed = True
            return _answer(
                response_cls, code_for(e), f"Authentication could not be checked: {e.message}"
            )
        lifetime = 0
        if self._done:
            self._reauth = False
            if self.lifetime_ms:
                lifetime = self.lifetime_ms
                self.expires_at = time.monotonic() + lifetime / 1000
        return _answer(response_cls, ErrorCode.none, None, out, lifetime)

    async def _plain(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3 or not parts[1]:
            self.authenticator.metrics.failures.labels("kafka", "malformed").inc()
            raise AuthenticationError(_FAILED)
        try:
            name, password = parts[1].decode(), parts[2].decode()
        except UnicodeDecodeError:
            raise AuthenticationError(_FAILED) from None
        self.principal = await self.authenticator.authenticate(
            name, password, self.address, "kafka"
        )
        self.credential = basic(name, password)
        self._done = True
        return b""

    async def _oauthbearer(self, message: bytes) -> bytes:
        """RFC 7628's client message: ``n,,\x01auth=Bearer <jwt>\x01...\x01\x01``."""
        token = None
        for part in message.split(b"\x01"):
            if part.lower().startswith(b"auth=bearer "):
                token = part[len(b"auth=bearer ") :].strip().decode("ascii", "replace")
        if not token:
            self.authenticator.metrics.failures.labels("kafka", "malformed").inc()
            raise AuthenticationError(_FAILED)
        self.principal = await self.authenticator.authenticate_bearer(token, self.address, "kafka")
        self._done = True
        return b""

    async def _scram_step(self, token: bytes) -> bytes:
        assert self.mechanism is not None
        metrics, throttle = self.authenticator.metrics, self.authenticator.throttle
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise AuthenticationError(_FAILED) from None
        if self._scram is None:  # client-first
            mechanism = self.mechanism
            store = self.store

            def lookup(user: str) -> tuple[bytes, bytes, bytes, int]:
                self._scram_user = user
                # An unknown user gets the store's decoy: the same salt every time, and
                # an exchange that fails at the same step as a wrong password's.
                cred = store.scram_credential(user, mechanism)
                return cred.salt, cred.stored_key, cred.server_key, cred.iterations

            server = ScramMechanism(mechanism).make_server(lookup)
            try:
                await call(server.set_client_first, text)
            except ScramException:
                metrics.failures.labels("kafka", "malformed").inc()
                raise AuthenticationError(_FAILED) from None
            if throttle.retry_after(*login_keys(self._scram_user, self.address)) > 0:
                metrics.failures.labels("kafka", "throttled").inc()
                raise LoginThrottledError("Too many failed logins; try again later.")
            self._scram = server
            server_first = str(server.get_server_first())
            self._scram_messages = (text, server_first)
            return server_first.encode()
        server, self._scram = self._scram, None  # client-final
        keys = login_keys(self._scram_user, self.address)
        # Checked again, then verified and counted with no await in between: concurrent
        # exchanges cannot all be verified before the first failure is counted.
        if throttle.retry_after(*keys) > 0:
            metrics.failures.labels("kafka", "throttled").inc()
            raise LoginThrottledError("Too many failed logins; try again later.")
        try:
            server.set_client_final(text)
        except ScramException:
            throttle.failed(*keys)
            metrics.failures.labels("kafka", "invalid").inc()
            raise AuthenticationError(_FAILED) from None
        self.principal = user_principal(self._scram_user)
        self.credential = scram_proof(self.mechanism, *self._scram_messages, text)
        self._done = True
        metrics.successes.labels("kafka", "false").inc()
        return str(server.get_server_final()).encode()


def certificate_principal(
    peercert: dict[str, Any] | None, mapper: PrincipalMapper | None = None
) -> str | None:
    """The principal of a verified client certificate (mTLS), or None without one:
    ``User:<CN>``, or with ``mapper`` (``tls_principal_mapping_rules``, Kafka's
    ``ssl.principal.mapping.rules``) ``User:<what the rules make of its subject's DN>``.

    Raises:
        InvalidSecurityRequestError: the name is not a user name, or no rule applies.
    """
    subject = (peercert or {}).get("subject", ())
    if not subject:
        return None
    if mapper is not None:
        dn = distinguished_name(subject)
        name = mapper.name(dn)
        if name is None:
            raise InvalidSecurityRequestError(f"no principal mapping rule applies to {dn!r}")
        return user_principal(check_name(name, "mapped certificate name"))
    for rdn in subject:
        for key, value in rdn:
            if key == "commonName":
                return user_principal(check_name(value, "certificate common name"))
    return None


def _answer(
    cls: type, code: ErrorCode, message: str | None, auth_bytes: bytes = b"", lifetime_ms: int = 0
) -> Any:
    fields: dict[str, Any] = {"error_code": code, "auth_bytes": auth_bytes}
    names = getattr(cls, "__dataclass_fields__", {})
    if "error_message" in names:
        fields["error_message"] = message
    if "session_lifetime" in names:
        fields["session_lifetime"] = i64Timedelta.parse(
            datetime.timedelta(milliseconds=lifetime_ms)
        )
    return cls(**fields)
