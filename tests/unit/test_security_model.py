"""Kafka's ACL rule: patterns, implied operations, DENY over ALLOW, super users."""

from __future__ import annotations

import pytest

from coordinator.security.model import (
    AclBinding,
    AclFilter,
    Authorizer,
    Operation,
    ResourceType,
    parse_super_users,
)
from segments.errors import InvalidSecurityRequestError

TOPIC = ResourceType.TOPIC


def acl(principal: str, name: str, op: str, perm: str = "ALLOW", **kw: str) -> AclBinding:
    return AclBinding.of(
        principal,
        kw.get("host", "*"),
        kw.get("rtype", "TOPIC"),
        name,
        kw.get("pattern", "LITERAL"),
        op,
        perm,
    )


def test_default_deny_and_super_users() -> None:
    auth = Authorizer([], parse_super_users("User:admin; User:ops"))
    assert not auth.authorize("User:alice", "1.2.3.4", Operation.READ, TOPIC, "t")
    assert auth.authorize("User:admin", "1.2.3.4", Operation.DELETE, TOPIC, "t")
    assert auth.authorize("User:ops", "1.2.3.4", Operation.ALTER, ResourceType.CLUSTER, "c")


@pytest.mark.parametrize(
    ("granted", "asked", "allowed"),
    [
        ("READ", "DESCRIBE", True),
        ("WRITE", "DESCRIBE", True),
        ("DELETE", "DESCRIBE", True),
        ("ALTER", "DESCRIBE", True),
        ("ALTER_CONFIGS", "DESCRIBE_CONFIGS", True),
        ("ALL", "WRITE", True),
        ("DESCRIBE", "READ", False),
        ("READ", "WRITE", False),
        ("DESCRIBE_CONFIGS", "ALTER_CONFIGS", False),
        ("CREATE", "DESCRIBE", False),
    ],
)
def test_implied_operations(granted: str, asked: str, allowed: bool) -> None:
    auth = Authorizer([acl("User:a", "t", granted)], frozenset())
    assert auth.authorize("User:a", "h", Operation(asked), TOPIC, "t") is allowed


def test_deny_wins_and_deny_is_not_implied() -> None:
    rules = [acl("User:a", "*", "ALL"), acl("User:a", "secret", "READ", "DENY")]
    auth = Authorizer(rules, frozenset())
    assert not auth.authorize("User:a", "h", Operation.READ, TOPIC, "secret")
    # A DENY of READ does not deny DESCRIBE (Kafka implies only on ALLOW).
    assert auth.authorize("User:a", "h", Operation.DESCRIBE, TOPIC, "secret")
    assert auth.authorize("User:a", "h", Operation.READ, TOPIC, "public")
    deny_all = Authorizer([*rules, acl("User:*", "secret", "ALL", "DENY")], frozenset())
    assert not deny_all.authorize("User:a", "h", Operation.DESCRIBE, TOPIC, "secret")


def test_patterns_principals_hosts() -> None:
    rules = [
        acl("User:a", "logs-", "READ", pattern="PREFIXED"),
        acl("User:*", "shared", "WRITE"),
        acl("User:b", "t", "READ", host="10.0.0.1"),
    ]
    auth = Authorizer(rules, frozenset())
    assert auth.authorize("User:a", "h", Operation.READ, TOPIC, "logs-eu")
    assert not auth.authorize("User:a", "h", Operation.READ, TOPIC, "log")
    assert auth.authorize("User:zed", "h", Operation.WRITE, TOPIC, "shared")
    assert auth.authorize("User:b", "10.0.0.1", Operation.READ, TOPIC, "t")
    assert not auth.authorize("User:b", "10.0.0.2", Operation.READ, TOPIC, "t")
    # Resource types never mix: a topic ACL says nothing of a group of the same name.
    assert not auth.authorize("User:a", "h", Operation.READ, ResourceType.GROUP, "logs-eu")


@pytest.mark.parametrize(
    "bad",
    [
        ("alice", "*", "TOPIC", "t", "LITERAL", "READ", "ALLOW"),  # no User: prefix
        ("User:a", "*", "BROKER", "t", "LITERAL", "READ", "ALLOW"),
        ("User:a", "*", "TOPIC", "", "LITERAL", "READ", "ALLOW"),
        ("User:a", "*", "TOPIC", "*", "PREFIXED", "READ", "ALLOW"),
        ("User:a", "*", "TOPIC", "t", "LITERAL", "FLY", "ALLOW"),
        ("User:a", "*", "TOPIC", "t", "LITERAL", "READ", "MAYBE"),
        ("User:a", "*", "CLUSTER", "c", "LITERAL", "ALTER", "ALLOW"),
    ],
)
def test_bad_bindings_refused(bad: tuple[str, ...]) -> None:
    with pytest.raises(InvalidSecurityRequestError):
        AclBinding.of(*bad)


def test_filter_any_and_match() -> None:
    b = acl("User:a", "t-", "READ", pattern="PREFIXED")
    assert AclFilter.of("ANY", "ANY", "ANY", None, "ANY", "ANY", "ANY").matches(b)
    assert AclFilter.of(resource_name="t-1", pattern_type="MATCH").matches(b)
    assert not AclFilter.of(resource_name="t-1", pattern_type="PREFIXED").matches(b)
    assert AclFilter.of(resource_name="t-", pattern_type="PREFIXED").matches(b)
