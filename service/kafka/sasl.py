"""SASL on the Kafka listener: SaslHandshake (v1) then SaslAuthenticate, per connection.

Mechanisms, as Kafka configures them: PLAIN (``authzid NUL user NUL password``; a user
and password or an API key id and secret, checked as REST's Basic credentials are, with
the same cache, throttle and metrics: ``service.auth.Authenticator``), OAUTHBEARER (RFC
7628; a JWT checked as REST's bearer tokens, ``service.oauth``), SCRAM-SHA-256 and
SCRAM-SHA-512 (RFC 5802 through ``scramp``, against the verifiers the coordinator keeps
per user; a user made before SCRAM was kept needs its password set again).

With authentication on, a connection may send only ApiVersions, SaslHandshake and
SaslAuthenticate until it has authenticated; anything else closes it (Kafka's
IllegalSaslStateException). A failed authentication is answered with
SASL_AUTHENTICATION_FAILED (the client then closes). Handshake v0 (raw tokens outside
Kafka's framing) is not offered, so every client speaks SaslAuthenticate.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i64Timedelta
from scramp import ScramException, ScramMechanism

from coordinator.security import check_name, user_principal
from coordinator.security_store import SCRAM_MECHANISMS, ScramCredential, SecurityStore
from segments.errors import AuthenticationError, LoginThrottledError
from service.auth import Authenticator
from service.executors import call

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
#: What ApiVersions advertises for them.
SASL_VERSIONS = {SASL_HANDSHAKE: (1, 1), SASL_AUTHENTICATE: (0, 2)}
MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS, "OAUTHBEARER")
_FAILED = "Authentication failed: invalid user name, API key or password."


class SaslStateError(Exception):
    """A request out of SASL's order: the connection closes."""


def _decoy(mechanism: str) -> ScramCredential:
    """A verifier no password matches, for unknown users: their exchange fails at the
    same step, with the same answer, as a wrong password's."""
    salt, stored, server, iterations = ScramMechanism(mechanism).make_auth_info(
        os.urandom(16).hex(), iteration_count=4096
    )
    return ScramCredential(salt, stored, server, iterations)


class SaslSession:
    """One connection's SASL state; ``principal`` once authenticated."""

    def __init__(self, authenticator: Authenticator, address: str) -> None:
        self.authenticator = authenticator
        self.address = address
        self.mechanism: str | None = None
        self.principal: str | None = None
        self._done = False  # SASL succeeded
        self._scram: Any = None  # scramp's server of an exchange under way
        self._scram_user = ""

    @property
    def store(self) -> SecurityStore:
        return self.authenticator.store

    def handshake(self, response_cls: type, mechanism: str) -> Any:
        # A client certificate's principal (mTLS) gives way to SASL's, as on Kafka's SASL_SSL.
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
        try:
            if self.mechanism == "PLAIN":
                out = await self._plain(auth_bytes)
            elif self.mechanism == "OAUTHBEARER":
                out = await self._oauthbearer(auth_bytes)
            else:
                out = await self._scram_step(auth_bytes)
        except (AuthenticationError, LoginThrottledError) as e:
            self.principal = None  # not even a certificate's: the client must close
            return _answer(response_cls, ErrorCode.sasl_authentication_failed, e.message)
        return _answer(response_cls, ErrorCode.none, None, out)

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
                cred = store.scram_credential(user, mechanism) or _decoy(mechanism)
                return cred.salt, cred.stored_key, cred.server_key, cred.iterations

            server = ScramMechanism(mechanism).make_server(lookup)
            try:
                await call(server.set_client_first, text)
            except ScramException:
                metrics.failures.labels("kafka", "malformed").inc()
                raise AuthenticationError(_FAILED) from None
            keys = (f"name:{self._scram_user}", f"addr:{self.address}")
            if throttle.retry_after(*keys) > 0:
                metrics.failures.labels("kafka", "throttled").inc()
                raise LoginThrottledError("Too many failed logins; try again later.")
            self._scram = server
            return str(server.get_server_first()).encode()
        server, self._scram = self._scram, None  # client-final
        try:
            server.set_client_final(text)
        except ScramException:
            throttle.failed(f"name:{self._scram_user}", f"addr:{self.address}")
            metrics.failures.labels("kafka", "invalid").inc()
            raise AuthenticationError(_FAILED) from None
        self.principal = user_principal(self._scram_user)
        self._done = True
        metrics.successes.labels("kafka", "false").inc()
        return str(server.get_server_final()).encode()


def certificate_principal(peercert: dict[str, Any] | None) -> str | None:
    """``User:<CN>`` of a verified client certificate (mTLS), or None without one."""
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return user_principal(check_name(value, "certificate common name"))
    return None


def _answer(cls: type, code: ErrorCode, message: str | None, auth_bytes: bytes = b"") -> Any:
    fields: dict[str, Any] = {"error_code": code, "auth_bytes": auth_bytes}
    names = getattr(cls, "__dataclass_fields__", {})
    if "error_message" in names:
        fields["error_message"] = message
    if "session_lifetime" in names:
        fields["session_lifetime"] = i64Timedelta.parse(datetime.timedelta(0))
    return cls(**fields)
