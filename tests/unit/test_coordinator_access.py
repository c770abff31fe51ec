"""The coordinator's route rules (``coordinator.security.access``) against its app's routes, and the
SCRAM proof an agent forwards, checked without a network."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from scramp import ScramClient, ScramMechanism
from starlette.testclient import TestClient

from coordinator.http.server import create_app
from coordinator.local import LocalCoordinator
from coordinator.security.access import (
    AGENT_ONLY,
    RULES,
    Caller,
    rule_for,
    scram_proof,
    templates,
    verify_scram,
)
from coordinator.security.model import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    PrincipalMapper,
    ResourceType,
)
from coordinator.security.settings import AccessSettings
from coordinator.security.store import SqlSecurityStore
from segments.errors import AuthenticationError, InvalidSecurityRequestError
from segments.store import open_store
from tests.coordinator_calls import answer, call, raw_post
from tests.unit.test_security_store import CHEAP


def test_every_rule_names_a_route_and_every_security_route_has_one(tmp_path: Path) -> None:
    """A rule for a route that does not exist is a typo that leaves the real route to
    agents only; a /v1/security route without a rule (a new management route) would let
    the agents' shared secret manage: both fail here."""
    with LocalCoordinator(f"sqlite:///{tmp_path}/m.db") as coord:
        store = open_store(f"file://{tmp_path}/data")
        access = AccessSettings("basic", "s" * 32, "acl", frozenset({"User:admin"}))
        app = create_app(coord, store, security=SqlSecurityStore(coord.db, CHEAP), access=access)
        routes = set(templates(app))
    assert set(RULES) <= routes, sorted(set(RULES) - routes)
    unruled = sorted(r for r in routes if r[1].startswith("/v1/security") and r not in RULES)
    assert unruled == []
    for route in routes - set(RULES):
        assert rule_for(*route) is AGENT_ONLY
    assert rule_for("GET", "/metrics").caller is Caller.ANYONE
    assert rule_for("GET", "/metrics", protect_metrics=True).caller is Caller.USER


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_a_write_lease_is_its_users_own(tmp_path: Path) -> None:
    """Alice (WRITE on a topic, as a Spark write) takes a write lease for an upload;
    Mallory (WRITE on another topic) can neither release it, renew or shorten it, move
    its key under her own lease, nor ask which keys are pending: each is 403 and the
    upload stays pending (garbage collection leaves it alone). Before, any user could
    release it, and GC could then delete an object about to be committed. Eve (a valid
    login, no ACL) may write nothing, so she may not pin keys from garbage collection
    either; the super user may release anyone's lease."""
    secret = "s" * 32
    with LocalCoordinator(f"sqlite:///{tmp_path}/m.db") as coord:
        security = SqlSecurityStore(coord.db, CHEAP)
        security.create_user("alice", "alice-password-1")
        security.create_user("mallory", "mallory-password-1")
        security.create_user("eve", "eve-password-1")
        security.create_user("admin", "admin-password-1")
        coord.create_topic("w", 1)
        security.create_acls(
            [
                AclBinding(
                    f"User:{user}",
                    "*",
                    ResourceType.TOPIC,
                    topic,
                    PatternType.LITERAL,
                    Operation.WRITE,
                    Permission.ALLOW,
                )
                for user, topic in (("alice", "w"), ("mallory", "m"))
            ]
        )
        access = AccessSettings("basic", secret, "acl", frozenset({"User:admin"}))
        app = create_app(coord, security=security, access=access)
        key = "segments/ab/01JUPLOAD.seg"
        with TestClient(app) as client:
            alice = _basic("alice", "alice-password-1")
            mallory = _basic("mallory", "mallory-password-1")
            eve = _basic("eve", "eve-password-1")
            admin = _basic("admin", "admin-password-1")
            agent = f"Bearer {secret}"

            def post(name: str, args: dict[str, Any], who: str) -> tuple[int, Any]:
                r = call(client, name, args, headers={"Authorization": who})
                return r.status_code, answer(r)

            lease = {"lease_id": "job-a", "keys": [key], "ttl_s": 600}
            assert post("keep_pending", lease, alice) == (200, [])
            refused = [
                post("release_pending", {"lease_id": "job-a"}, mallory),
                post("keep_pending", {**lease, "keys": [], "ttl_s": 0.001}, mallory),
                post("keep_pending", {**lease, "lease_id": "job-m"}, mallory),
                post("pending_object_keys", {"keys": [key]}, mallory),
            ]
            live = post("pending_object_keys", {"keys": [key]}, agent)
            # Her own lease, for her own upload, is hers to keep and release.
            own = {"lease_id": "job-m", "keys": ["segments/cd/01JMINE.seg"], "ttl_s": 60}
            mine = [
                post("keep_pending", own, mallory),
                post("release_pending", {"lease_id": "job-m"}, mallory),
            ]
            pinned = post("keep_pending", {**own, "lease_id": "job-e"}, eve)
            pinned_live = post("pending_object_keys", {"keys": own["keys"]}, agent)
            released = post("release_pending", {"lease_id": "job-a"}, admin)
            after = post("pending_object_keys", {"keys": [key]}, agent)
            again = {"lease_id": "job-b", "keys": [key], "ttl_s": 600}
            own_release = [
                post("keep_pending", again, alice),
                post("release_pending", {"lease_id": "job-b"}, alice),
            ]
    assert [status for status, _ in refused] == [403] * 4, refused
    assert all(body["error"] == "AuthorizationError" for _, body in refused)
    assert "another principal" in refused[0][1]["message"]
    assert live == (200, [key])
    assert mine == [(200, []), (200, None)]
    assert pinned[0] == 403 and pinned[1]["error"] == "AuthorizationError", pinned
    assert "WRITE" in pinned[1]["message"] and pinned_live == (200, [])
    assert released == (200, None)
    assert after == (200, [])
    assert own_release == [(200, []), (200, None)]


def test_a_forwarded_scram_login_is_checked_against_the_users_verifier(tmp_path: Path) -> None:
    """The coordinator replays the server's side of a SCRAM login an agent forwards: the
    real login passes; another user's verifier, a changed password or a tampered message
    fail."""
    with LocalCoordinator(f"sqlite:///{tmp_path}/m.db") as coord:
        security = SqlSecurityStore(coord.db, CHEAP)
        security.create_user("alice", "alice-password-1")
        mechanism = "SCRAM-SHA-256"
        client = ScramClient([mechanism], "alice", "alice-password-1")
        client_first = client.get_client_first()
        cred = security.scram_credential("alice", mechanism)
        server = ScramMechanism(mechanism).make_server(
            lambda u: (cred.salt, cred.stored_key, cred.server_key, cred.iterations)
        )
        server.set_client_first(client_first)
        server_first = server.get_server_first()
        client.set_server_first(server_first)
        client_final = client.get_client_final()
        proof = scram_proof(mechanism, client_first, server_first, client_final)
        value = proof.split(" ", 1)[1]
        assert verify_scram(security, mechanism, value) == "User:alice"
        security.set_password("alice", "another-password-2")
        with pytest.raises(AuthenticationError):
            verify_scram(security, mechanism, value)
        with pytest.raises(AuthenticationError):
            verify_scram(security, mechanism, value[:-8] + "AAAAAAA=")


@pytest.mark.parametrize(
    ("rules", "dn", "name"),
    [
        (
            r"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT",
            "CN=kafka1,OU=ServiceUsers,O=X",
            "kafka1",
        ),
        (r"RULE:^CN=(.*?),OU=(.*?),O=.*$/$1@$2/L", "CN=Bob,OU=Eng,O=X", "bob@eng"),
        (r"RULE:^CN=(.*?),O=.*$/$1/U", "CN=bob,O=X", "BOB"),
        (r"RULE:^CN=(.*?)\/x$/$1/", "CN=a/x", "a"),  # an escaped slash in the pattern
        (r"RULE:^CN=admin$/root/", "CN=bob", None),  # no rule applies: no principal
        ("DEFAULT", "CN=bob,O=X", "CN=bob,O=X"),
    ],
)
def test_kafka_principal_mapping_rules(rules: str, dn: str, name: str | None) -> None:
    assert PrincipalMapper(rules).name(dn) == name


@pytest.mark.parametrize("rules", ["RULE:^CN=(.*)$/$1", "RULE:(/x/", "NOPE", ""])
def test_bad_principal_mapping_rules_are_refused(rules: str) -> None:
    with pytest.raises(InvalidSecurityRequestError):
        PrincipalMapper(rules)


def test_an_acl_granted_at_a_coordinator_is_answered_there_at_once(tmp_path: Path) -> None:
    """Alice lists the topics she may see (none), the admin grants her READ on one through
    the same coordinator, and her next listing shows it: the coordinator's ACL snapshot
    (kept ``ACL_TTL_S``) is dropped on every ACL change it serves. Before, the grant was
    invisible there for up to a second, and a fast client was answered without it."""
    from coordinator.security.wire import acl_to_json

    with LocalCoordinator(f"sqlite:///{tmp_path}/m.db") as coord:
        security = SqlSecurityStore(coord.db, CHEAP)
        security.create_user("admin", "admin-password-1")
        security.create_user("alice", "alice-password-1")
        for name in ("open", "closed"):
            coord.create_topic(name, 1)
        grant = AclBinding(
            "User:alice",
            "*",
            ResourceType.TOPIC,
            "open",
            PatternType.LITERAL,
            Operation.READ,
            Permission.ALLOW,
        )
        access = AccessSettings("basic", "s" * 32, "acl", frozenset({"User:admin"}))
        app = create_app(coord, security=security, access=access)
        with TestClient(app) as client:
            alice = {"Authorization": _basic("alice", "alice-password-1")}
            admin = {"Authorization": _basic("admin", "admin-password-1")}

            def listed() -> list[str]:
                r = call(client, "list_topics", {}, headers=alice)
                assert r.status_code == 200, r.text
                return [t["name"] for t in answer(r)]

            before = listed()
            r = client.post(
                "/v1/security/acls/create", json={"acls": [acl_to_json(grant)]}, headers=admin
            )
            assert r.status_code == 204, r.text
            after = listed()
    assert (before, after) == ([], ["open"])


def test_a_user_deleted_at_a_coordinator_is_refused_there_at_once(tmp_path: Path) -> None:
    """Alice's login is cached (``LOGIN_CACHE_TTL_S``); the admin deletes her through the
    same coordinator, and her next call is 401, as it is after a password change: the
    coordinator drops its cached logins on every user or API key change it serves.
    Before, she went on for up to five seconds there."""
    with LocalCoordinator(f"sqlite:///{tmp_path}/m.db") as coord:
        security = SqlSecurityStore(coord.db, CHEAP)
        security.create_user("admin", "admin-password-1")
        for user in ("alice", "bob"):
            security.create_user(user, f"{user}-password-1")
        access = AccessSettings("basic", "s" * 32, "none", frozenset({"User:admin"}))
        app = create_app(coord, security=security, access=access)
        with TestClient(app) as client:
            admin = {"Authorization": _basic("admin", "admin-password-1")}

            def status(user: str, password: str) -> int:
                who = {"Authorization": _basic(user, password)}
                return call(client, "cluster_id", {}, headers=who).status_code

            before = [status("alice", "alice-password-1"), status("bob", "bob-password-1")]
            changes = [
                client.post("/v1/security/users/delete", json={"name": "alice"}, headers=admin),
                client.post(
                    "/v1/security/users/password",
                    json={"name": "bob", "password": "bob-password-2"},
                    headers=admin,
                ),
            ]
            after = [status("alice", "alice-password-1"), status("bob", "bob-password-1")]
            new_password = status("bob", "bob-password-2")
    assert [r.status_code for r in changes] == [204, 204], [r.text for r in changes]
    assert (before, after, new_password) == ([200, 200], [401, 401], 200)


def test_the_body_limit_bounds_what_the_access_checks_read(tmp_path: Path) -> None:
    """With ACLs on, a user's commit is read ahead of the route to see which topics it
    names: the body limit bounds that read too (413 at the limit, not the whole body).
    Authentication comes first: a caller without a credential is 401 before anything is
    read; a Content-Length over the limit is 413 before either."""
    limit = 1 << 20
    piece = b"\0" * 65536
    pieces = [piece] * 64  # 4 MiB, chunked
    media = [(b"content-type", b"application/vnd.msgpack")]
    with LocalCoordinator(f"sqlite:///{tmp_path}/m.db") as coord:
        security = SqlSecurityStore(coord.db, CHEAP)
        security.create_user("alice", "alice-password-1")
        coord.create_topic("w", 1)
        security.create_acls(
            [
                AclBinding(
                    "User:alice",
                    "*",
                    ResourceType.TOPIC,
                    "w",
                    PatternType.LITERAL,
                    Operation.WRITE,
                    Permission.ALLOW,
                )
            ]
        )
        access = AccessSettings("basic", "s" * 32, "acl", frozenset())
        app = create_app(coord, security=security, access=access, max_request_bytes=limit)
        alice = [(b"authorization", _basic("alice", "alice-password-1").encode())]
        user = raw_post(app, "/v2/commit", pieces, [*media, *alice])
        anonymous = raw_post(app, "/v2/commit", pieces, media)
        declared = [*media, (b"content-length", b"%d" % (4 << 20))]
        declared_anonymous = raw_post(app, "/v2/commit", pieces, declared)
        hw = coord.offsets("w", 0).high_watermark
    assert (user[0], user[1]["error"], user[2]) == (413, "RequestTooLargeError", 17)
    assert (anonymous[0], anonymous[1]["error"], anonymous[2]) == (401, "AuthenticationError", 0)
    assert (declared_anonymous[0], declared_anonymous[2]) == (413, 0)
    assert hw == 0
