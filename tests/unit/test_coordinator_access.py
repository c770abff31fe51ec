"""The coordinator's route rules (``coordinator.access``) against its app's routes, and the
SCRAM proof an agent forwards, checked without a network."""

from __future__ import annotations

from pathlib import Path

import pytest
from scramp import ScramClient, ScramMechanism

from coordinator.access import (
    AGENT_ONLY,
    RULES,
    Caller,
    rule_for,
    scram_proof,
    templates,
    verify_scram,
)
from coordinator.local import LocalCoordinator
from coordinator.security import PrincipalMapper
from coordinator.security_settings import AccessSettings
from coordinator.security_store import SqlSecurityStore
from coordinator.server import create_app
from segments.errors import AuthenticationError, InvalidSecurityRequestError
from segments.store import open_store
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
