"""The Kafka door's authorization table: every served API has a rule, and Access asks
the REST door's Authorizer (KIP-679's "WRITE on any topic" included)."""

from __future__ import annotations

import pytest

from coordinator.security.model import AclBinding, Authorizer, Operation, ResourceType
from service.kafka.acl import RULES, Access, Rule
from service.kafka.sasl import SASL_VERSIONS
from service.kafka.server import HANDLERS, SUPPORTED


def acl(name: str, op: str, perm: str = "ALLOW", pattern: str = "LITERAL", **kw: str) -> AclBinding:
    return AclBinding.of(
        kw.get("principal", "User:alice"),
        kw.get("host", "*"),
        kw.get("rtype", "TOPIC"),
        name,
        pattern,
        op,
        perm,
    )


def test_every_served_api_key_has_a_rule_and_every_rule_a_served_api() -> None:
    """Built from the dispatcher's tables: a new API without a rule fails here."""
    served = set(HANDLERS) | set(SASL_VERSIONS)
    assert served == set(SUPPORTED)
    assert sorted(served - set(RULES)) == []
    assert sorted(set(RULES) - served) == []


def test_acl_apis_are_advertised() -> None:
    assert {29, 30, 31} <= set(SUPPORTED)


def test_access_uses_the_rules_operation_per_resource_type() -> None:
    auth = Authorizer(
        [acl("t", "WRITE"), acl("g", "READ", rtype="GROUP"), acl("t2", "READ")], frozenset()
    )
    produce = Access(RULES[0], auth, "User:alice", "10.0.0.1")
    assert produce.topic("t") and not produce.topic("t2")  # WRITE, not READ
    commit = Access(RULES[8], auth, "User:alice", "10.0.0.1")
    assert commit.group("g") and commit.topic("t2") and not commit.topic("t")
    with pytest.raises(LookupError):  # Produce's rule names no group: a handler bug
        produce.group("g")
    assert not Access(RULES[0], auth, "User:bob", "10.0.0.1").topic("t")


def test_authorization_off_allows_everything() -> None:
    off = Access(Rule(topic=Operation.WRITE, cluster=Operation.ALTER))
    assert off.topic("x") and off.cluster() and off.any_topic() and off.may_create("x")


def test_create_needs_create_on_the_cluster_or_on_the_topic() -> None:
    auth = Authorizer([acl("new-", "CREATE", pattern="PREFIXED")], frozenset())
    a = Access(RULES[19], auth, "User:alice", "h")
    assert a.may_create("new-1") and not a.may_create("old-1")
    everyone = Authorizer([acl("kafka-cluster", "CREATE", rtype="CLUSTER")], frozenset())
    assert Access(RULES[19], everyone, "User:alice", "h").may_create("old-1")


@pytest.mark.parametrize(
    ("bindings", "allowed"),
    [
        ([], False),
        ([acl("t", "WRITE")], True),
        ([acl("t", "ALL")], True),
        ([acl("t", "READ")], False),  # READ does not imply WRITE
        ([acl("t", "WRITE", host="10.9.9.9")], False),  # another host's
        ([acl("t", "WRITE", principal="User:*")], True),
        ([acl("t", "WRITE"), acl("t", "WRITE", "DENY")], False),
        ([acl("t", "WRITE"), acl("*", "WRITE", "DENY")], False),
        (
            [acl("pre-", "WRITE", pattern="PREFIXED"), acl("pre", "WRITE", "DENY", "PREFIXED")],
            False,
        ),
        ([acl("t", "WRITE"), acl("u", "WRITE"), acl("t", "WRITE", "DENY")], True),  # u is left
        ([acl("t", "WRITE"), acl("t-", "WRITE", "DENY", "PREFIXED")], True),  # t is not t-*
    ],
)
def test_write_on_any_topic_as_kafkas_authorize_by_resource_type(
    bindings: list[AclBinding], allowed: bool
) -> None:
    """KIP-679: InitProducerId is allowed with WRITE on some topic no DENY covers."""
    auth = Authorizer(bindings, frozenset())
    assert auth.authorize_any("User:alice", "10.0.0.1", Operation.WRITE, ResourceType.TOPIC) is (
        allowed
    )
    assert Access(RULES[22], auth, "User:alice", "10.0.0.1").any_topic() is allowed


def test_super_users_may_write_somewhere_without_acls() -> None:
    auth = Authorizer([], frozenset({"User:admin"}))
    assert auth.authorize_any("User:admin", "h", Operation.WRITE, ResourceType.TOPIC)
