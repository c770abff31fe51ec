"""What a Spark job may read and write: its credential, and the coordinator's ACLs.

With the ``coordinator`` option, the driver asks the coordinator
(``POST /v1/security/authorize``) to authenticate the job's ``user`` and ``password``
(a user's password, or an API key id and secret) and to decide, with the coordinator's
own ACLs and super users, each topic the job touches, as Kafka decides a consumer's or a
producer's requests:

- a read needs READ on every topic it reads; ``subscribe`` of a topic it may not READ
  fails, and ``subscribePattern`` leaves out the topics it may not DESCRIBE (a Kafka
  pattern subscription never sees them) and fails on one it may DESCRIBE but not READ;
- a write needs WRITE on every topic it writes (the ``topic`` option when the writer is
  made; every topic the tasks wrote, before the job commits anything).

A denied topic is :class:`~segments.errors.AuthorizationError` with Kafka's words
(``TOPIC_AUTHORIZATION_FAILED``), the principal, the operation and the topics. With
authorization off on the coordinator everything is allowed (a credential, if given,
must still be right). Decisions are kept ``ttl_s`` (5 s, the agents' bound): a stream
asks again at most that often, however often Spark polls it.

With ``db`` there is nothing to ask: whoever has the database has everything.

No pyspark here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from coordinator.client import Coordinator
from coordinator.security.model import Check, Operation, ResourceType
from segments.errors import AuthenticationError, AuthorizationError
from spark.options import Connection

if TYPE_CHECKING:
    # The HTTP module (FastAPI) only where the job reaches a coordinator: Spark starts a
    # planner process for every query.
    from coordinator.security.http import Authorized

__all__ = ["TopicAccess", "topic_access"]

#: How long a decision is kept (the agents' ``auth_cache_ttl_s`` default).
TTL_S = 5.0


class TopicAccess:
    """One job's principal and its rights on topics, as the coordinator decides them.

    Args:
        ask: the coordinator's ``authorize`` for this job's credential.
        user: the ``user`` option (None: the job gave no credential).
    """

    def __init__(
        self,
        ask: Callable[[Sequence[Check]], Authorized],
        user: str | None,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ask = ask
        self._user = user
        self._ttl = ttl_s
        self._clock = clock
        self._principal: str | None = None
        self._decided: dict[Check, bool] = {}
        self._asked_at = 0.0

    def principal(self) -> str:
        """Who the job is (authenticating it first if nobody has yet)."""
        self._allowed([])
        assert self._principal is not None
        return self._principal

    def _allowed(self, checks: Sequence[Check]) -> list[bool]:
        if self._clock() - self._asked_at >= self._ttl:
            self._decided, self._principal = {}, None
        missing = list(dict.fromkeys(c for c in checks if c not in self._decided))
        if missing or self._principal is None:
            # The bound runs from the oldest decision kept: asking about new checks must
            # not make older answers live longer.
            fresh = self._principal is None
            asked_at = self._clock()
            try:
                answer = self._ask(missing)
            except AuthenticationError as e:
                if self._user is None:
                    raise ValueError(
                        f"{e.message}: set the lakelog options 'user' and 'password' (a user's "
                        "password, or an API key id and secret)"
                    ) from None
                raise AuthenticationError(
                    f"the coordinator refused the credential of option 'user' "
                    f"({self._user!r}): {e.message}"
                ) from None
            self._principal = answer.principal
            if fresh:
                self._asked_at = asked_at
            self._decided.update(zip(missing, answer.allowed, strict=True))
        return [self._decided[c] for c in checks]

    def _deny(self, operation: Operation, topics: Iterable[str]) -> AuthorizationError:
        names = ", ".join(repr(t) for t in topics)
        return AuthorizationError(
            f"TOPIC_AUTHORIZATION_FAILED: {self.principal()} is not authorized to "
            f"{operation.value} topic(s) {names} (no ACL allows it, or one denies it)"
        )

    def require(self, operation: Operation, topics: Iterable[str]) -> None:
        """Raise AuthorizationError unless ``operation`` is allowed on every topic."""
        names = sorted(set(topics))
        checks = [Check(operation, ResourceType.TOPIC, t) for t in names]
        denied = [t for t, ok in zip(names, self._allowed(checks), strict=True) if not ok]
        if denied:
            raise self._deny(operation, denied)

    def readable(self, topics: Sequence[str], *, pattern: bool) -> list[str]:
        """The topics a read reads: all of them, each needing READ; or, for a pattern's
        matches, those it may DESCRIBE (the others left out), each needing READ.

        Raises:
            AuthorizationError: a topic it may not READ (and, for a pattern, may DESCRIBE).
        """
        if not pattern:
            self.require(Operation.READ, topics)
            return list(topics)
        describe = [Check(Operation.DESCRIBE, ResourceType.TOPIC, t) for t in topics]
        read = [Check(Operation.READ, ResourceType.TOPIC, t) for t in topics]
        allowed = self._allowed(describe + read)  # one question for both
        seen = [t for t, ok in zip(topics, allowed[: len(topics)], strict=True) if ok]
        self.require(Operation.READ, seen)
        return seen


def topic_access(conn: Connection, coordinator: Coordinator) -> TopicAccess | None:
    """The job's access through ``coordinator``, its credential checked; None with ``db``
    (nothing to check).

    Raises:
        ValueError: no credential where the coordinator needs one (it names the options).
        AuthenticationError: a wrong one.
    """
    if conn.coordinator is None:
        return None
    from coordinator.http.client import is_http_coordinator
    from coordinator.security.http import HttpSecurityStore

    assert is_http_coordinator(coordinator)
    security = HttpSecurityStore(coordinator)
    user, password = conn.user, conn.password
    access = TopicAccess(lambda checks: security.authorize(user, password, checks), user)
    access.principal()  # first: a missing or wrong credential says so, whatever asks next
    return access
