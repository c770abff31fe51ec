"""Users, API keys and ACLs in the metadata database (SQLite or PostgreSQL).

Every security SQL statement lives here. Passwords and API key secrets are hashed
with argon2id (``argon2-cffi``: a random salt and the cost parameters travel in the
PHC string each row keeps); the secrets themselves are never stored, and an API
key's secret is shown once, by the call that creates or rotates it.

:class:`SecurityStore` is the interface every door uses; :class:`SqlSecurityStore`
implements it over a database (``lakelog serve``, ``lakelog coordinator``, ``lakelog
users --db``) and ``coordinator.security.http.HttpSecurityStore`` over the
coordinator's HTTP API (agents).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from coordinator import clock
from coordinator.db import MetadataDatabase
from coordinator.security.model import (
    AclBinding,
    AclFilter,
    check_name,
    check_password,
    select,
    user_principal,
)
from segments.errors import (
    AuthenticationError,
    InvalidSecurityRequestError,
    PrincipalExistsError,
    PrincipalNotFoundError,
)

#: API key ids: this prefix and 16 characters of base32 (letters and digits, as
#: Confluent's 16-character keys), so an id is never taken for a user name by eye.
API_KEY_PREFIX = "LK"
_KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_BAD_CREDENTIALS = "Authentication failed: invalid user name, API key or secret."


@dataclass(frozen=True, slots=True)
class UserInfo:
    name: str
    created_at: float


@dataclass(frozen=True, slots=True)
class ApiKeyInfo:
    key_id: str
    owner: str
    description: str
    created_at: float


@dataclass(frozen=True, slots=True)
class ApiKeySecret:
    """An API key with its secret: only the call that made the secret returns it."""

    key: ApiKeyInfo
    secret: str

    def __repr__(self) -> str:  # never the secret, whatever logs it
        return f"ApiKeySecret(key={self.key!r}, secret=***)"


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """RFC 5802's server-side verifier of one user and mechanism."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:
        return f"ScramCredential(iterations={self.iterations}, ...)"


#: The SCRAM mechanisms kept for every user (Kafka's), and the iterations (Kafka's minimum).
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_ITERATIONS = 4096


def scram_credentials(password: str) -> dict[str, ScramCredential]:
    """The SCRAM verifiers of ``password`` (a random salt each), by mechanism (scramp)."""
    from scramp import ScramMechanism

    out = {}
    for mechanism in SCRAM_MECHANISMS:
        salt, stored, server, iterations = ScramMechanism(mechanism).make_auth_info(
            password, iteration_count=SCRAM_ITERATIONS
        )
        out[mechanism] = ScramCredential(salt, stored, server, iterations)
    return out


class SecurityStore(Protocol):
    """Principals and ACLs, kept by the coordinator."""

    def create_user(self, name: str, password: str) -> UserInfo:
        """Raises PrincipalExistsError, InvalidSecurityRequestError."""
        ...

    def set_password(self, name: str, password: str) -> None:
        """Raises PrincipalNotFoundError, InvalidSecurityRequestError."""
        ...

    def delete_user(self, name: str) -> None:
        """Deletes the user's API keys too. Raises PrincipalNotFoundError."""
        ...

    def list_users(self) -> list[UserInfo]: ...

    def create_api_key(self, owner: str, description: str = "") -> ApiKeySecret:
        """A new key of user ``owner``, which authenticates as that user.
        Raises PrincipalNotFoundError."""
        ...

    def list_api_keys(self, owner: str | None = None) -> list[ApiKeyInfo]: ...

    def rotate_api_key(self, key_id: str) -> ApiKeySecret:
        """A new secret for the key; the old one stops working. Raises PrincipalNotFoundError."""
        ...

    def delete_api_key(self, key_id: str) -> None:
        """Raises PrincipalNotFoundError."""
        ...

    def authenticate(self, name: str, secret: str) -> str:
        """The principal (``User:<name>``) of a user name and password, or of an API key
        id and secret. Raises AuthenticationError, the same for every kind of failure."""
        ...

    def scram_credential(self, name: str, mechanism: str) -> ScramCredential:
        """The user's SCRAM verifier for ``mechanism`` (SCRAM-SHA-256 or -512). A name
        without one (unknown, or made before SCRAM was kept: set its password again) gets a
        decoy no password matches, the same at every call, so the salt a client is sent
        does not tell whether the user exists (as Kafka's broker does)."""
        ...

    def create_acls(self, bindings: Sequence[AclBinding]) -> None:
        """Add the bindings (those already there stay, once)."""
        ...

    def describe_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        """The bindings any filter matches, sorted."""
        ...

    def delete_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        """Delete the bindings any filter matches; returns them."""
        ...


def password_hasher() -> PasswordHasher:
    """argon2id with OWASP's recommended minimum (19 MiB, 2 passes, 1 lane): a login the
    agents' cache misses costs the coordinator one such verify (``bench/auth.py``), and
    argon2-cffi's defaults (64 MiB, 3 passes, 4 lanes) cost about four times that."""
    return PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)


_ACL_COLUMNS = "principal, host, resource_type, resource_name, pattern_type, operation, permission"


class SqlSecurityStore:
    """:class:`SecurityStore` over a metadata database; thread-safe."""

    def __init__(self, db: MetadataDatabase, hasher: PasswordHasher | None = None) -> None:
        self._db = db
        self._sql = db.dialect.sql
        self._hasher = hasher or password_hasher()

    @cached_property
    def _dummy_hash(self) -> str:
        """Verified against when the name is unknown, so a miss costs what a hit costs."""
        return self._hasher.hash(secrets.token_urlsafe(16))

    # -- users ----------------------------------------------------------------

    def create_user(self, name: str, password: str) -> UserInfo:
        check_name(name)
        digest = self._hasher.hash(check_password(password))
        scram = scram_credentials(password)
        now = clock.now()
        with self._db.write() as conn:
            row = conn.execute(
                self._sql(
                    "INSERT INTO users (name, password_hash, created_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (name) DO NOTHING RETURNING name"
                ),
                (name, digest, now),
            ).fetchone()
            if row is None:
                raise PrincipalExistsError(f"User {name} already exists.")
            self._put_scram(conn, name, scram)
        return UserInfo(name, now)

    def _put_scram(self, conn: Any, name: str, scram: dict[str, ScramCredential]) -> None:
        conn.execute(self._sql("DELETE FROM scram_credentials WHERE name = ?"), (name,))
        conn.executemany(
            self._sql(
                "INSERT INTO scram_credentials (name, mechanism, salt, stored_key, server_key, "
                "iterations) VALUES (?, ?, ?, ?, ?, ?)"
            ),
            [(name, m, c.salt, c.stored_key, c.server_key, c.iterations) for m, c in scram.items()],
        )

    def scram_credential(self, name: str, mechanism: str) -> ScramCredential:
        if mechanism not in SCRAM_MECHANISMS:
            raise InvalidSecurityRequestError(f"unknown SCRAM mechanism {mechanism!r}")
        with self._db.read() as conn:
            row = conn.execute(
                self._sql(
                    "SELECT salt, stored_key, server_key, iterations FROM scram_credentials "
                    "WHERE name = ? AND mechanism = ?"
                ),
                (name, mechanism),
            ).fetchone()
        if row is None:
            return self._decoy(name, mechanism)
        return ScramCredential(bytes(row[0]), bytes(row[1]), bytes(row[2]), int(row[3]))

    @cached_property
    def _key(self) -> bytes:
        """The database's own random key (made once, kept in ``security_keys``)."""
        with self._db.write() as conn:
            conn.execute(
                self._sql(
                    "INSERT INTO security_keys (name, value) VALUES (?, ?) "
                    "ON CONFLICT (name) DO NOTHING"
                ),
                ("decoy", secrets.token_bytes(32)),
            )
            row = conn.execute(
                self._sql("SELECT value FROM security_keys WHERE name = ?"), ("decoy",)
            ).fetchone()
        return bytes(row[0])

    def _decoy(self, name: str, mechanism: str) -> ScramCredential:
        """A verifier of ``name`` no password matches, the same at every call and on every
        coordinator of the database: its salt and keys are HMACs of the name under the
        database's key (keys no password derives), its salt's length (32 bytes, scramp's)
        and iterations a real user's."""
        digest = hashlib.sha512 if mechanism.endswith("512") else hashlib.sha256

        def part(label: str) -> bytes:
            return hmac.new(self._key, f"{label}\0{mechanism}\0{name}".encode(), digest).digest()

        return ScramCredential(part("salt")[:32], part("stored"), part("server"), SCRAM_ITERATIONS)

    def set_password(self, name: str, password: str) -> None:
        digest = self._hasher.hash(check_password(password))
        scram = scram_credentials(password)
        with self._db.write() as conn:
            row = conn.execute(
                self._sql("UPDATE users SET password_hash = ? WHERE name = ? RETURNING name"),
                (digest, name),
            ).fetchone()
            if row is None:
                raise PrincipalNotFoundError(f"User {name} does not exist.")
            self._put_scram(conn, name, scram)

    def delete_user(self, name: str) -> None:
        with self._db.write() as conn:
            conn.execute(self._sql("DELETE FROM api_keys WHERE owner = ?"), (name,))
            conn.execute(self._sql("DELETE FROM scram_credentials WHERE name = ?"), (name,))
            row = conn.execute(
                self._sql("DELETE FROM users WHERE name = ? RETURNING name"), (name,)
            ).fetchone()
        if row is None:
            raise PrincipalNotFoundError(f"User {name} does not exist.")

    def list_users(self) -> list[UserInfo]:
        with self._db.read() as conn:
            rows = conn.execute("SELECT name, created_at FROM users ORDER BY name").fetchall()
        return [UserInfo(str(n), float(c)) for n, c in rows]

    # -- API keys -------------------------------------------------------------

    def create_api_key(self, owner: str, description: str = "") -> ApiKeySecret:
        if not isinstance(description, str) or len(description) > 256:
            raise InvalidSecurityRequestError("a description is at most 256 characters")
        key_id = API_KEY_PREFIX + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(16))
        secret = secrets.token_urlsafe(32)
        digest = self._hasher.hash(secret)
        now = clock.now()
        with self._db.write() as conn:
            if conn.execute(self._sql("SELECT 1 FROM users WHERE name = ?"), (owner,)).fetchone():
                conn.execute(
                    self._sql(
                        "INSERT INTO api_keys (key_id, owner, secret_hash, description, "
                        "created_at) VALUES (?, ?, ?, ?, ?)"
                    ),
                    (key_id, owner, digest, description, now),
                )
            else:
                raise PrincipalNotFoundError(f"User {owner} does not exist.")
        return ApiKeySecret(ApiKeyInfo(key_id, owner, description, now), secret)

    def list_api_keys(self, owner: str | None = None) -> list[ApiKeyInfo]:
        sql = "SELECT key_id, owner, description, created_at FROM api_keys"
        params: tuple[str, ...] = ()
        if owner is not None:
            sql, params = sql + " WHERE owner = ?", (owner,)
        with self._db.read() as conn:
            rows = conn.execute(self._sql(sql + " ORDER BY key_id"), params).fetchall()
        return [ApiKeyInfo(str(k), str(o), str(d), float(c)) for k, o, d, c in rows]

    def rotate_api_key(self, key_id: str) -> ApiKeySecret:
        secret = secrets.token_urlsafe(32)
        digest = self._hasher.hash(secret)
        with self._db.write() as conn:
            row = conn.execute(
                self._sql(
                    "UPDATE api_keys SET secret_hash = ? WHERE key_id = ? "
                    "RETURNING key_id, owner, description, created_at"
                ),
                (digest, key_id),
            ).fetchone()
        if row is None:
            raise PrincipalNotFoundError(f"API key {key_id} does not exist.")
        return ApiKeySecret(
            ApiKeyInfo(str(row[0]), str(row[1]), str(row[2]), float(row[3])), secret
        )

    def delete_api_key(self, key_id: str) -> None:
        with self._db.write() as conn:
            row = conn.execute(
                self._sql("DELETE FROM api_keys WHERE key_id = ? RETURNING key_id"), (key_id,)
            ).fetchone()
        if row is None:
            raise PrincipalNotFoundError(f"API key {key_id} does not exist.")

    # -- authentication -------------------------------------------------------

    def authenticate(self, name: str, secret: str) -> str:
        if not isinstance(name, str) or not isinstance(secret, str):
            raise AuthenticationError(_BAD_CREDENTIALS)
        with self._db.read() as conn:
            key = conn.execute(
                self._sql("SELECT secret_hash, owner FROM api_keys WHERE key_id = ?"), (name,)
            ).fetchone()
            user = (
                None
                if key is not None
                else conn.execute(
                    self._sql("SELECT password_hash FROM users WHERE name = ?"), (name,)
                ).fetchone()
            )
        if key is not None:
            digest, principal = str(key[0]), user_principal(str(key[1]))
        elif user is not None:
            digest, principal = str(user[0]), user_principal(name)
        else:
            digest, principal = self._dummy_hash, ""
        try:
            # argon2's verify compares the derived hashes in constant time.
            self._hasher.verify(digest, secret[:4096])
        except (VerificationError, InvalidHashError):
            raise AuthenticationError(_BAD_CREDENTIALS) from None
        if not principal:
            raise AuthenticationError(_BAD_CREDENTIALS)
        return principal

    # -- ACLs -------------------------------------------------------------------

    def create_acls(self, bindings: Sequence[AclBinding]) -> None:
        rows = [b.row() for b in bindings]
        if not rows:
            return
        with self._db.write() as conn:
            conn.executemany(
                self._sql(
                    f"INSERT INTO acls ({_ACL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT DO NOTHING"
                ),
                rows,
            )

    @staticmethod
    def _all_acls(conn: Any) -> list[AclBinding]:
        rows = conn.execute(f"SELECT {_ACL_COLUMNS} FROM acls").fetchall()
        return [AclBinding.of(*row) for row in rows]

    def describe_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        with self._db.read() as conn:
            return select(self._all_acls(conn), filters)

    def delete_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        with self._db.write() as conn:
            doomed = select(self._all_acls(conn), filters)
            conn.executemany(
                self._sql(
                    "DELETE FROM acls WHERE principal = ? AND host = ? AND resource_type = ? "
                    "AND resource_name = ? AND pattern_type = ? AND operation = ? "
                    "AND permission = ?"
                ),
                [b.row() for b in doomed],
            )
        return doomed
