"""The consumer-group interface: REST consumer instances whose state lives in the coordinator.

Any agent serves any instance because everything an instance is — its config,
subscription or manual assignment, the group's generation and assignment, its
fetch positions and the group's committed offsets — is stored here, never in
an agent. ``LocalCoordinator`` and ``HttpCoordinator`` implement
``GroupCoordinator`` beside ``Coordinator``.

Rebalancing is eager and happens inside the coordinator's transaction: every
change of membership or subscription (create, delete, subscribe, unsubscribe,
session expiry, a subscribed topic's partition count) bumps the group's
generation and recomputes the assignment over the live subscribed members
(range by default, round-robin optional), so every partition of the union of
subscriptions is owned by exactly one live member. There is no join/sync round
trip: the first fetch after subscribing already has partitions.

Liveness, as kafka-rest's Kafka consumers have it: the agents that serve an
instance heartbeat it in the background (``heartbeat_consumers``), so a member
stays in the group while its client processes a batch; it leaves the
assignment when no agent heartbeats it for ``session_timeout_ms`` (its agents
died) or when its client has not fetched for ``max_poll_interval_ms``, and
rejoins at its next fetch. An instance idle (no call at all) for
``instance_timeout_ms`` is deleted.

Fetches: one at a time per instance, whichever agents they reach. A fetch
takes the instance's *fetch lease* (``begin_fetch``), checks before answering
that nothing moved its positions meanwhile (``confirm_fetch``: a seek, a
rebalance) and stores the new positions only once its answer was written to the
client (``end_fetch``); an answer that never reached its client moves nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from coordinator.client import TopicPartition

FORMATS = ("binary", "json", "avro", "jsonschema", "protobuf")
RESET_POLICIES = ("earliest", "latest", "none")
ASSIGNORS = ("range", "roundrobin")


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """What a client sets at ``POST /consumers/{group}`` (kafka-rest names in comments)."""

    format: str = "binary"  # format
    auto_offset_reset: str = "latest"  # auto.offset.reset (Kafka's default)
    auto_commit: bool = True  # auto.commit.enable
    fetch_min_bytes: int = -1  # fetch.min.bytes; -1 = return as soon as anything is there
    request_timeout_ms: int = 1000  # consumer.request.timeout.ms: default fetch wait
    session_timeout_ms: int = 30_000  # no agent heartbeat this long -> out of the assignment
    instance_timeout_ms: int = 300_000  # consumer.instance.timeout.ms: idle -> deleted
    assignor: str = "range"  # partition.assignment.strategy: range | roundrobin
    max_poll_interval_ms: int = 300_000  # max.poll.interval.ms: no fetch this long -> out
    max_poll_records: int = 0  # max.poll.records: most records a fetch answers; 0 = no limit
    #: isolation.level: read_uncommitted | read_committed (only records of committed
    #: transactions, up to the last stable offset; ``read_round_robin``).
    isolation_level: str = "read_uncommitted"
    #: The principal that made the instance (set by the agent, never by the client): only
    #: it may use the instance. Empty for instances made before owners were kept.
    owner: str = ""


ISOLATION_LEVELS = ("read_uncommitted", "read_committed")


@dataclass(frozen=True, slots=True)
class ConsumerState:
    """One consumer instance as the coordinator sees it after expiry and rebalance.

    ``positions`` holds the next offset to fetch for every partition in
    ``assignment``, already resolved (committed offset, else the reset policy;
    a position below log-start follows the reset policy too). A partition
    whose policy is ``none`` and that has no committed offset is missing from
    ``positions`` and listed in ``unresolved``.
    """

    group: str
    name: str
    config: ConsumerConfig
    subscription: tuple[str, ...]  # topics as subscribed (a pattern's current matches)
    pattern: str | None
    manual: bool  # True when partitions were assigned by hand (assign)
    generation: int
    assignment: tuple[TopicPartition, ...]
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    unresolved: tuple[TopicPartition, ...] = ()
    last_seen: float = 0.0


@dataclass(frozen=True, slots=True)
class FetchLease:
    """What ``begin_fetch`` and ``confirm_fetch`` answer.

    ``token`` is the lease the fetch holds, None when another fetch holds the
    instance (for up to ``busy_for_s`` more seconds unless released) or, from
    ``confirm_fetch``, when the fetch lost its lease (a seek revoked it). From
    ``confirm_fetch``, ``ok`` False means: do not answer what was read; read again
    from ``state.positions`` (after taking a lease again if ``token`` is None).
    """

    state: ConsumerState
    token: str | None
    ok: bool = True
    busy_for_s: float = 0.0


class ConsumerHeartbeat(NamedTuple):
    """One instance an agent serves, and the fetch lease it holds on it (if any)."""

    group: str
    name: str
    token: str | None = None


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A group's view for v3 consumer-groups: members, assignment, committed offsets."""

    group: str
    generation: int
    state: str  # STABLE | EMPTY (no member)
    assignor: str
    members: tuple[ConsumerState, ...]
    committed: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    #: CLASSIC (REST instances, Kafka's JoinGroup) or CONSUMER (KIP-848's protocol).
    group_type: str = "CLASSIC"


class GroupTopicLag(NamedTuple):
    """A group's lag on one topic, from its committed offsets (for metrics)."""

    group: str
    topic: str
    lag: int  # summed over the topic's partitions with a committed offset
    max_lag: int  # of one partition
    partitions: int


class GroupCoordinator(Protocol):
    def create_consumer(self, group: str, name: str, config: ConsumerConfig) -> ConsumerState:
        """Raises ConsumerExistsError, InvalidConsumerConfigError."""
        ...

    def delete_consumer(self, group: str, name: str) -> None:
        """Leave the group (rebalances). Raises ConsumerNotFoundError."""
        ...

    def consumer(self, group: str, name: str, *, touch: bool = True) -> ConsumerState:
        """The instance's current state; ``touch`` renews its session and idle timers.

        Expires members past their session timeout (rebalance) and instances past
        their instance timeout first. Raises ConsumerNotFoundError.
        """
        ...

    def subscribe(
        self, group: str, name: str, topics: Sequence[str] = (), pattern: str | None = None
    ) -> ConsumerState:
        """Replace the subscription (rebalances). Topics that do not exist yet are subscribed
        too: they are assigned once created. Raises ConsumerStateError when partitions
        are assigned by hand or both/neither of topics and pattern are given;
        InvalidTopicNameError, InvalidTopicPatternError."""
        ...

    def unsubscribe(self, group: str, name: str) -> None: ...

    def assign(self, group: str, name: str, partitions: Sequence[TopicPartition]) -> ConsumerState:
        """Manual assignment. Raises ConsumerStateError when subscribed;
        TopicNotFoundError / PartitionNotFoundError."""
        ...

    def seek(self, group: str, name: str, positions: Mapping[TopicPartition, int]) -> None:
        """Set next-fetch offsets. Raises ConsumerStateError for an unassigned partition."""
        ...

    def advance(
        self, group: str, name: str, generation: int, positions: Mapping[TopicPartition, int]
    ) -> ConsumerState:
        """Record fetch progress (next offsets). Raises StaleGenerationError when the group
        has rebalanced since ``generation`` (the fetch's records must then not be returned),
        ConsumerNotFoundError."""
        ...

    def begin_fetch(self, group: str, name: str, token: str, lease_ms: int) -> FetchLease:
        """Give the instance's fetch lease to ``token`` (the caller's) for ``lease_ms``
        (renewed by heartbeats), unless another unexpired one is held (the answer's
        ``token`` is then None). Counts as a poll; with auto-commit, commits the positions
        (what earlier fetches delivered). Raises ConsumerNotFoundError."""
        ...

    def confirm_fetch(
        self, group: str, name: str, token: str, start: Mapping[TopicPartition, int], lease_ms: int
    ) -> FetchLease:
        """Before answering a fetch that read from ``start``: ``ok`` when ``token`` still holds
        the lease and every partition of ``start`` is still owned at that position (the
        lease is then extended by ``lease_ms``); ``token`` None when the lease was lost.
        Raises ConsumerNotFoundError."""
        ...

    def end_fetch(
        self, group: str, name: str, token: str, positions: Mapping[TopicPartition, int] | None
    ) -> None:
        """Release the lease; with ``positions`` (the answer was delivered), store them for the
        partitions still owned. A revoked or lapsed ``token`` changes nothing."""
        ...

    def heartbeat_consumers(
        self, members: Sequence[ConsumerHeartbeat], lease_ms: int
    ) -> list[tuple[str, str]]:
        """Keep ``members`` in their groups (and renew the fetch leases named); returns the
        (group, name) of those that no longer exist."""
        ...

    def commit_offsets(
        self,
        group: str,
        name: str,
        offsets: Mapping[TopicPartition, CommittedOffset],
        generation: int | None = None,
    ) -> None:
        """Store committed offsets (already +1: the next offset to consume). With a
        ``generation`` older than the group's, raises StaleGenerationError; commits of
        partitions the member does not own (subscribed mode) raise it too."""
        ...

    def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets of the group for those partitions (missing ones absent)."""
        ...

    def list_groups(self) -> list[str]: ...

    def describe_group(self, group: str) -> GroupInfo:
        """Raises GroupNotFoundError for a group with no member and no committed offset."""
        ...

    def alter_group_offsets(
        self, group: str, offsets: Mapping[TopicPartition, CommittedOffset]
    ) -> None:
        """Set committed offsets of a group with no member, as an operator does (Kafka's
        ``alterConsumerGroupOffsets``; ``lakelog groups reset-offsets``). A group that does
        not exist yet gets them. Raises NonEmptyGroupError while the group has members,
        TopicNotFoundError / PartitionNotFoundError, ConsumerStateError for a negative
        offset; nothing is stored then."""
        ...

    def delete_group(self, group: str) -> None:
        """Delete a group with no member and its committed offsets (Kafka's DeleteGroups).
        Raises GroupNotFoundError, NonEmptyGroupError."""
        ...
