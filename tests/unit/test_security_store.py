"""Users, API keys and ACLs in the metadata database, the same tests on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from argon2 import PasswordHasher

from coordinator.local import LocalCoordinator
from coordinator.security.model import AclBinding, AclFilter
from coordinator.security.settings import AccessSettings
from coordinator.security.store import SqlSecurityStore
from segments.errors import (
    AuthenticationError,
    InvalidSecurityRequestError,
    PrincipalExistsError,
    PrincipalNotFoundError,
)
from tests.conftest import sql_rows

#: argon2id at its cheapest: these tests check the store, not the hash's cost.
CHEAP = PasswordHasher(time_cost=1, memory_cost=64, parallelism=1)


@pytest.fixture
def store(db_url: str) -> Iterator[SqlSecurityStore]:
    with LocalCoordinator(db_url) as coord:
        yield SqlSecurityStore(coord.db, CHEAP)


def test_users_create_list_password_delete(store: SqlSecurityStore, db_url: str) -> None:
    store.create_user("alice", "correct horse")
    store.create_user("bob", "battery staple")
    assert [u.name for u in store.list_users()] == ["alice", "bob"]
    with pytest.raises(PrincipalExistsError):
        store.create_user("alice", "another one")
    assert store.authenticate("alice", "correct horse") == "User:alice"
    # Never the password itself: an argon2id PHC string with its own salt.
    hashes = [h for (h,) in sql_rows(db_url, "SELECT password_hash FROM users")]
    assert all(h.startswith("$argon2id$") for h in hashes)
    assert not any("correct horse" in h for h in hashes)
    store.set_password("alice", "new password!")
    with pytest.raises(AuthenticationError):
        store.authenticate("alice", "correct horse")
    assert store.authenticate("alice", "new password!") == "User:alice"
    store.delete_user("alice")
    with pytest.raises(AuthenticationError):
        store.authenticate("alice", "new password!")
    with pytest.raises(PrincipalNotFoundError):
        store.delete_user("alice")
    with pytest.raises(PrincipalNotFoundError):
        store.set_password("alice", "whatever12")


@pytest.mark.parametrize(
    ("name", "password"),
    [("", "long enough"), ("a b", "long enough"), ("x" * 129, "long enough"), ("ok", "short")],
)
def test_bad_user_or_password_refused(store: SqlSecurityStore, name: str, password: str) -> None:
    with pytest.raises(InvalidSecurityRequestError) as exc:
        store.create_user(name, password)
    assert password not in str(exc.value) or password == "long enough"
    assert store.list_users() == []


def test_failures_look_alike(store: SqlSecurityStore) -> None:
    """Unknown user, wrong password and unknown key give the same error and message."""
    store.create_user("alice", "correct horse")
    messages = set()
    for name, secret in [("alice", "wrong"), ("nobody", "whatever"), ("LKNOSUCHKEY", "x")]:
        with pytest.raises(AuthenticationError) as exc:
            store.authenticate(name, secret)
        messages.add(exc.value.message)
    assert len(messages) == 1


def test_api_keys_shown_once_rotated_deleted(store: SqlSecurityStore, db_url: str) -> None:
    store.create_user("svc", "service pass")
    made = store.create_api_key("svc", "ingest job")
    assert made.key.key_id.startswith("LK") and len(made.key.key_id) == 18
    assert "secret" not in repr(made).replace("secret=***", "")
    assert made.secret not in repr(made)
    assert store.authenticate(made.key.key_id, made.secret) == "User:svc"
    stored = sql_rows(db_url, "SELECT secret_hash FROM api_keys")
    assert made.secret not in str(stored)
    assert [k.key_id for k in store.list_api_keys()] == [made.key.key_id]
    assert store.list_api_keys("other") == []
    rotated = store.rotate_api_key(made.key.key_id)
    assert rotated.key.key_id == made.key.key_id and rotated.secret != made.secret
    with pytest.raises(AuthenticationError):
        store.authenticate(made.key.key_id, made.secret)
    assert store.authenticate(made.key.key_id, rotated.secret) == "User:svc"
    with pytest.raises(PrincipalNotFoundError):
        store.create_api_key("nobody")
    with pytest.raises(PrincipalNotFoundError):
        store.rotate_api_key("LKNOSUCHKEY")
    # Deleting the owner revokes its keys.
    other = store.create_api_key("svc")
    store.delete_api_key(made.key.key_id)
    with pytest.raises(PrincipalNotFoundError):
        store.delete_api_key(made.key.key_id)
    store.delete_user("svc")
    assert store.list_api_keys() == []
    with pytest.raises(AuthenticationError):
        store.authenticate(other.key.key_id, other.secret)


def _acl(
    principal: str, name: str, op: str, perm: str = "ALLOW", pattern: str = "LITERAL"
) -> AclBinding:
    return AclBinding.of(principal, "*", "TOPIC", name, pattern, op, perm)


def test_acls_create_describe_delete(store: SqlSecurityStore) -> None:
    a = _acl("User:alice", "orders", "READ")
    b = _acl("User:alice", "orders-", "WRITE", pattern="PREFIXED")
    c = _acl("User:bob", "*", "DESCRIBE", "DENY")
    store.create_acls([a, b, c, a])  # the repeat is kept once
    assert store.describe_acls([AclFilter()]) == sorted([a, b, c])
    assert store.describe_acls([AclFilter.of(principal="User:alice")]) == sorted([a, b])
    # MATCH: what applies to the topic orders-eu: the prefix and the wildcard.
    match = AclFilter.of(resource_type="TOPIC", resource_name="orders-eu", pattern_type="MATCH")
    assert store.describe_acls([match]) == sorted([b, c])
    assert store.delete_acls([AclFilter.of(permission="DENY")]) == [c]
    assert store.describe_acls([AclFilter()]) == sorted([a, b])
    assert store.delete_acls([AclFilter.of(operation="ALTER")]) == []
    assert store.delete_acls([AclFilter()]) == sorted([a, b])
    assert store.describe_acls([AclFilter()]) == []


def test_agent_acl_copy_is_never_older_than_its_bound(store: SqlSecurityStore) -> None:
    """The agent's copy of the ACLs: a change made elsewhere is seen once ttl_s has passed
    (never later), and at once after invalidate() (a change through this agent)."""
    import asyncio

    from coordinator.security.model import Operation, ResourceType
    from service.security.acl import AclCache

    now = [100.0]
    cache = AclCache(store, frozenset(), ttl_s=5.0, clock=lambda: now[0])

    async def may_read() -> bool:
        auth = await cache.authorizer()
        return auth.authorize("User:a", "h", Operation.READ, ResourceType.TOPIC, "t")

    assert not asyncio.run(may_read())
    store.create_acls([_acl("User:a", "t", "READ")])
    now[0] += 4.9
    assert not asyncio.run(may_read())  # within the bound the old copy may answer
    now[0] += 0.2
    assert asyncio.run(may_read())  # past it, never
    store.delete_acls([AclFilter()])
    cache.invalidate()
    assert not asyncio.run(may_read())


@pytest.mark.parametrize("authorization", ["none", "acl"])
def test_the_authorize_route_decides_as_the_coordinator_is_configured(
    db_url: str, authorization: str
) -> None:
    """``POST /v1/security/authorize`` through the real client: the coordinator's own
    ACLs, super users and mode decide; the caller's address is the ACL host; a bad
    credential is refused in either mode, a missing one only with ACLs on."""
    from starlette.testclient import TestClient

    from coordinator.http.client import http_coordinator
    from coordinator.http.server import create_app
    from coordinator.security.http import HttpSecurityStore
    from coordinator.security.model import ANONYMOUS, Check, Operation, ResourceType

    def read(topic: str) -> Check:
        return Check(Operation.READ, ResourceType.TOPIC, topic)

    checks = [read("orders"), read("orders-eu"), read("payments"), read("elsewhere")]
    with LocalCoordinator(db_url) as coord:
        store = SqlSecurityStore(coord.db, CHEAP)
        store.create_user("alice", "alice-password")
        store.create_user("root", "root-password")
        store.create_acls(
            [
                _acl("User:alice", "orders", "READ", pattern="PREFIXED"),
                _acl("User:alice", "orders-eu", "READ", "DENY"),
                # Only from another address than the caller's: does not apply.
                AclBinding.of("User:alice", "10.1.2.3", "TOPIC", "*", "LITERAL", "READ", "ALLOW"),
            ]
        )
        access = AccessSettings(authorization=authorization, super_users=frozenset({"User:root"}))
        app = create_app(coord, security=store, access=access)
        with TestClient(app) as client, http_coordinator("http://testserver", client=client) as c:
            security = HttpSecurityStore(c)
            alice = security.authorize("alice", "alice-password", checks)
            root = security.authorize("root", "root-password", checks)
            assert (alice.principal, root.principal) == ("User:alice", "User:root")
            assert alice.authorization == root.authorization == authorization
            with pytest.raises(AuthenticationError):
                security.authorize("alice", "wrong-password", checks)
            assert root.allowed == (True, True, True, True)
            if authorization == "none":
                assert alice.allowed == (True, True, True, True)
                anonymous = security.authorize(None, None, checks)
                assert anonymous.principal == ANONYMOUS and all(anonymous.allowed)
            else:
                assert alice.allowed == (True, False, False, False)
                with pytest.raises(AuthenticationError, match="authorization acl"):
                    security.authorize(None, None, checks)
            assert security.authorize("alice", "alice-password", []).allowed == ()
