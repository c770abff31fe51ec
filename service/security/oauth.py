"""OAuth 2 / OIDC bearer tokens: JWTs checked against a JWKS (``joserfc``).

With ``oauth_jwks`` set (a file path or an http(s) URL of a JSON Web Key Set), REST
accepts ``Authorization: Bearer <jwt>`` and the Kafka listener SASL/OAUTHBEARER. A
token is accepted when its signature verifies with a key of the set (asymmetric
algorithms only: a shared-secret HS256 token cannot be forged from the public set),
``exp`` is in the future, ``nbf`` (if any) in the past, and ``iss`` / ``aud`` equal
``oauth_issuer`` / ``oauth_audience`` when those are set. The principal is
``User:<claim>``, the claim named by ``oauth_principal_claim`` (``sub``). A JWKS URL
is fetched again at most every ``JWKS_TTL_S`` and when a token names an unknown key id.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from coordinator.security.model import check_name, user_principal
from segments.errors import AuthenticationError, InvalidSecurityRequestError

#: Asymmetric JWS algorithms only.
ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
JWKS_TTL_S = 300.0
_INVALID = "Authentication failed: invalid bearer token."


class BearerVerifier:
    """Checks bearer JWTs; thread-safe (the JWKS is loaded in the caller's thread)."""

    def __init__(
        self,
        jwks: str,
        *,
        issuer: str | None = None,
        audience: str | None = None,
        principal_claim: str = "sub",
    ) -> None:
        self.jwks = jwks
        self.principal_claim = principal_claim
        claims: dict[str, Any] = {"exp": {"essential": True}}
        if issuer:
            claims["iss"] = {"essential": True, "value": issuer}
        if audience:
            claims["aud"] = {"essential": True, "value": audience}
        self._registry = jwt.JWTClaimsRegistry(**claims)
        self._keys: KeySet | None = None
        self._loaded_at = 0.0
        self._lock = threading.Lock()

    def _load(self) -> KeySet:
        if self.jwks.startswith(("http://", "https://")):
            resp = httpx.get(self.jwks, timeout=10.0)
            resp.raise_for_status()
            data = resp.json()
        else:
            data = orjson.loads(Path(self.jwks).read_bytes())
        return KeySet.import_key_set(data)

    def _keyset(self, refresh: bool = False) -> KeySet:
        with self._lock:
            age = time.monotonic() - self._loaded_at
            # A refresh asked by a failing token: at most every 30 s (no reload storms).
            if self._keys is None or age > JWKS_TTL_S or (refresh and age > 30.0):
                self._keys = self._load()
                self._loaded_at = time.monotonic()
            return self._keys

    def principal(self, token: str) -> str:
        """``User:<claim>`` of a valid token. Raises AuthenticationError (the same
        message for every failure; the reason is not the client's to learn)."""
        try:
            try:
                decoded = jwt.decode(token, self._keyset(), algorithms=ALGORITHMS)
            except JoseError:
                # A key rotated in since the set was loaded: load it again, once.
                decoded = jwt.decode(token, self._keyset(refresh=True), algorithms=ALGORITHMS)
            self._registry.validate(decoded.claims)
            name = decoded.claims.get(self.principal_claim)
            return user_principal(check_name(name, "principal claim"))
        except (JoseError, ValueError, InvalidSecurityRequestError, httpx.HTTPError, OSError):
            raise AuthenticationError(_INVALID) from None
