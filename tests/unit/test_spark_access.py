"""The Spark job's view of its rights (``spark.access``): what it asks the coordinator,
how long it keeps an answer, and the errors it raises. The coordinator's side and real
Spark jobs are in ``tests/integration/test_spark_security.py``."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from coordinator.security.http import Authorized
from coordinator.security.model import Check, Operation
from segments.errors import AuthenticationError, AuthorizationError
from spark.access import TopicAccess

#: What the fake coordinator lets User:alice do: (operation, topic).
ALLOWED = {("DESCRIBE", "a"), ("READ", "a"), ("DESCRIBE", "b"), ("WRITE", "w")}


class Coordinator:
    def __init__(self) -> None:
        self.asked: list[list[Check]] = []
        self.refuse = False

    def authorize(self, checks: Sequence[Check]) -> Authorized:
        if self.refuse:
            raise AuthenticationError(
                "Authentication failed: invalid user name, API key or secret."
            )
        self.asked.append(list(checks))
        allowed = tuple((c.operation.value, c.name) in ALLOWED for c in checks)
        return Authorized("User:alice", "acl", allowed)


def test_a_pattern_leaves_out_what_it_may_not_describe_in_one_question() -> None:
    coordinator = Coordinator()
    access = TopicAccess(coordinator.authorize, "alice")
    assert access.readable(["a", "hidden"], pattern=True) == ["a"]
    assert len(coordinator.asked) == 1
    # b: DESCRIBE but not READ: the read fails, as a Kafka consumer's fetch would.
    with pytest.raises(
        AuthorizationError, match=r"^TOPIC_AUTHORIZATION_FAILED: User:alice .* READ .*'b'"
    ):
        access.readable(["a", "b"], pattern=True)
    with pytest.raises(AuthorizationError, match=r"READ topic\(s\) 'b', 'hidden'"):
        access.readable(["hidden", "a", "b"], pattern=False)
    access.require(Operation.WRITE, ["w", "w"])
    with pytest.raises(AuthorizationError, match=r"WRITE topic\(s\) 'a'"):
        access.require(Operation.WRITE, ["w", "a"])


def test_answers_are_kept_for_the_ttl_and_no_longer() -> None:
    """A stream asks at every trigger; the coordinator hears of it once per ttl_s."""
    coordinator = Coordinator()
    now = [0.0]
    access = TopicAccess(coordinator.authorize, "alice", ttl_s=5.0, clock=lambda: now[0])
    for _ in range(100):
        access.readable(["a"], pattern=False)
        now[0] += 0.04
    assert len(coordinator.asked) == 1
    now[0] = 5.0
    access.readable(["a"], pattern=False)
    assert len(coordinator.asked) == 2
    # A new question does not extend the life of older answers: READ "a" (asked at 5.0)
    # is asked again at 10.0 although WRITE "w" was first asked at 9.0.
    now[0] = 9.0
    access.require(Operation.WRITE, ["w"])
    now[0] = 10.0
    access.readable(["a"], pattern=False)
    assert [(c.operation, c.name) for c in coordinator.asked[-1]] == [(Operation.READ, "a")]
    # An empty read still authenticates (once per ttl_s).
    fresh = Coordinator()
    assert TopicAccess(fresh.authorize, "alice").readable([], pattern=True) == []
    assert fresh.asked == [[]]


def test_a_refused_credential_says_which_option() -> None:
    coordinator = Coordinator()
    coordinator.refuse = True
    with pytest.raises(AuthenticationError, match=r"option 'user' \('alice'\)"):
        TopicAccess(coordinator.authorize, "alice").principal()
    with pytest.raises(ValueError, match="set the lakelog options 'user' and 'password'"):
        TopicAccess(coordinator.authorize, None).principal()
