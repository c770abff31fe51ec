"""Kafka consumer groups in the metadata database: the classic protocol (JoinGroup/SyncGroup,
assignors in the clients) and the consumer group protocol (KIP-848: ConsumerGroupHeartbeat,
assignors here, ``coordinator.groups.assignors``).

Any agent serves any member: the whole group lives in two tables, and every call is
one write transaction that first *settles* the group (members silent past their
session timeout leave; a pending rebalance completes once every member rejoined or
its rebalance timeout passed), then applies the request. Agents long-poll JoinGroup
and SyncGroup by calling again (``poll=True``) until the round completes.

States, as Kafka's GroupCoordinator::

    Empty --join--> PreparingRebalance --all rejoined / timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup--> Stable
    Stable/CompletingRebalance --join of a new member, metadata change, leave,
                                 session expiry--> PreparingRebalance
    any --last member gone--> Empty

Assignors run in the clients (the leader's SyncGroup carries every assignment). Committed
offsets go to the one ``committed_offsets`` table REST consumer groups use, so both
doors see the same commits; a group id is used by one door at a time
(GroupProtocolConflictError, Kafka's INCONSISTENT_GROUP_PROTOCOL).

A consumer-protocol group (``group_type`` "consumer") keeps a group epoch (the
``generation`` column), bumped when a member joins or leaves, changes its subscription or
a subscribed topic changes; at a new epoch the group's assignor computes every member's
target, and each heartbeat reconciles its member towards it (``coordinator.groups.assignors``).
Its states, as Kafka's: Empty, Assigning (a new epoch not yet assigned), Reconciling
(some member not yet at its target), Stable. Members silent past their session timeout
leave; a member that does not give up revoked partitions within its rebalance timeout
is removed. A group changes protocol only while empty, as Kafka 4.x with
``group.consumer.migration.policy=disabled``: a heartbeat of the consumer protocol to a
classic group with members is GROUP_ID_NOT_FOUND ("not a consumer group"), a JoinGroup to
a consumer group with members INCONSISTENT_GROUP_PROTOCOL; committed offsets carry over.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kio.index import load_entity_schema
from kio.serial import entity_reader
from kio.static.constants import EntityType

from coordinator import clock
from coordinator.client import TopicPartition
from coordinator.db import MetadataDatabase
from coordinator.groups import assignors
from coordinator.groups.assignors import Assignment
from coordinator.groups.model import CommittedOffset, ConsumerConfig, ConsumerState, GroupInfo
from coordinator.groups.patterns import check_java_pattern, match_topics
from coordinator.groups.store import _UPSERT_COMMITTED  # the one statement writing commits
from segments.errors import (
    ConsumerNotFoundError,
    FencedMemberEpochError,
    GroupNotFoundError,
    GroupProtocolConflictError,
    NonEmptyGroupError,
    RebalanceInProgressError,
    RequestError,
    StaleGenerationError,
    StaleMemberEpochError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
)

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"
#: A consumer-protocol group's states besides Empty and Stable.
ASSIGNING = "Assigning"
RECONCILING = "Reconciling"

CLASSIC, CONSUMER = "classic", "consumer"
#: ConsumerGroupHeartbeat member epochs that mean "leave" (static members: -2, for now).
LEAVE_EPOCH, STATIC_LEAVE_EPOCH = -1, -2

_GROUP = (
    "SELECT state, generation, protocol_type, protocol, leader, rebalance_started, "
    "group_type, assignment_epoch, topology FROM kafka_groups WHERE group_id = ?"
)
_UPSERT_GROUP = (
    "INSERT INTO kafka_groups (group_id, state, generation, protocol_type, protocol, leader, "
    "rebalance_started, group_type, assignment_epoch, topology, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (group_id) DO "
    "UPDATE SET state = excluded.state, generation = excluded.generation, "
    "protocol_type = excluded.protocol_type, protocol = excluded.protocol, "
    "leader = excluded.leader, rebalance_started = excluded.rebalance_started, "
    "group_type = excluded.group_type, assignment_epoch = excluded.assignment_epoch, "
    "topology = excluded.topology, updated_at = excluded.updated_at"
)
_MEMBER_COLUMNS = (
    "member_id, instance_id, client_id, client_host, session_timeout_ms, "
    "rebalance_timeout_ms, protocols, assignment, joined, generation, joined_at, last_heartbeat, "
    "consumer"
)
_MEMBERS = f"SELECT {_MEMBER_COLUMNS} FROM kafka_members WHERE group_id = ?"
_DELETE_MEMBER = "DELETE FROM kafka_members WHERE group_id = ? AND member_id = ?"
_INSERT_MEMBER = (
    f"INSERT INTO kafka_members (group_id, {_MEMBER_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_TOPICS = "SELECT topic_id, name, partition_count FROM topics"
_DELETE_GROUP = "DELETE FROM kafka_groups WHERE group_id = ?"
_DELETE_COMMITTED = "DELETE FROM committed_offsets WHERE group_id = ?"
_FORGET_COMMITTED = (
    "DELETE FROM committed_offsets WHERE group_id = ? AND topic = ? AND partition = ?"
)
_ALL_GROUPS = "SELECT group_id FROM kafka_groups ORDER BY group_id"
_REST_MEMBERS = "SELECT 1 FROM consumers WHERE group_id = ? LIMIT 1"
_COMMITTED = (
    "SELECT topic, partition, committed_offset, metadata FROM committed_offsets WHERE group_id = ?"
)


def _assignment_to_json(a: Assignment) -> dict[str, list[int]]:
    return {bytes(t).hex(): list(ps) for t, ps in a.items()}


def _assignment_from_json(d: Mapping[str, Sequence[int]]) -> Assignment:
    return {bytes.fromhex(t): tuple(int(p) for p in ps) for t, ps in d.items()}


@dataclass
class ConsumerMember:
    """What a consumer-protocol member (KIP-848) has beyond a classic member's fields."""

    epoch: int = 0
    previous_epoch: int = -1
    state: str = assignors.STABLE
    rack_id: str | None = None
    topics: tuple[str, ...] = ()
    regex: str | None = None
    assignor: str | None = None
    assigned: Assignment = field(default_factory=dict)
    revoking: Assignment = field(default_factory=dict)
    target: Assignment = field(default_factory=dict)
    #: While revoking: when the member is removed unless it has given them up.
    deadline: float = 0.0

    def to_json(self) -> str:
        return json.dumps(
            {
                "epoch": self.epoch,
                "previous_epoch": self.previous_epoch,
                "state": self.state,
                "rack_id": self.rack_id,
                "topics": list(self.topics),
                "regex": self.regex,
                "assignor": self.assignor,
                "assigned": _assignment_to_json(self.assigned),
                "revoking": _assignment_to_json(self.revoking),
                "target": _assignment_to_json(self.target),
                "deadline": self.deadline,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> ConsumerMember | None:
        if not text:
            return None
        d = json.loads(text)
        return cls(
            d["epoch"],
            d["previous_epoch"],
            d["state"],
            d["rack_id"],
            tuple(d["topics"]),
            d["regex"],
            d["assignor"],
            _assignment_from_json(d["assigned"]),
            _assignment_from_json(d["revoking"]),
            _assignment_from_json(d["target"]),
            d["deadline"],
        )


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    joined: bool = False  # rejoined during the current rebalance
    generation: int = -1  # the generation it was last given
    joined_at: float = 0.0
    last_heartbeat: float = 0.0
    #: Set for a member of a consumer-protocol group (KIP-848).
    consumer: ConsumerMember | None = None

    def row(self, group: str) -> tuple[Any, ...]:
        protocols = json.dumps([[n, m.hex()] for n, m in self.protocols])
        return (
            group,
            self.member_id,
            self.instance_id,
            self.client_id,
            self.client_host,
            self.session_timeout_ms,
            self.rebalance_timeout_ms,
            protocols,
            self.assignment,
            int(self.joined),
            self.generation,
            self.joined_at,
            self.last_heartbeat,
            self.consumer.to_json() if self.consumer is not None else "",
        )

    @classmethod
    def from_row(cls, r: Sequence[Any]) -> Member:
        return cls(
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            [(n, bytes.fromhex(m)) for n, m in json.loads(r[6])],
            bytes(r[7]),
            bool(r[8]),
            r[9],
            r[10],
            r[11],
            ConsumerMember.from_json(r[12]),
        )


@dataclass
class KafkaGroup:
    """One group as a transaction sees it."""

    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol: str = ""
    leader: str = ""
    rebalance_started: float = 0.0
    members: dict[str, Member] = field(default_factory=dict)
    stored: bool = False
    group_type: str = CLASSIC
    #: A consumer group's: the epoch its target assignment was computed at, and over what.
    assignment_epoch: int = 0
    topology: str = ""
    #: Names of the topics (by id) in a consumer group's assignments, for describing it.
    topic_names: dict[bytes, str] = field(default_factory=dict)
    #: Each member's row as loaded: saving writes only the rows that changed.
    loaded: dict[str, tuple[Any, ...]] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class JoinResult:
    """``status``: "member_id_required", "waiting" or "done"."""

    status: str
    member_id: str
    generation: int = -1
    protocol: str = ""
    leader: str = ""
    #: For the leader only: (member id, instance id, metadata of the chosen protocol).
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """A ConsumerGroupHeartbeat's answer: the member's id and epoch, and its assignment
    when the client must learn it (None: unchanged)."""

    member_id: str
    member_epoch: int
    assignment: Assignment | None = None


class KafkaGroupStore:
    """Kafka consumer groups over one metadata database (see the module docstring).

    Args:
        now: the clock (epoch seconds) of sessions and rebalance timeouts.
    """

    def __init__(self, db: MetadataDatabase, *, now: Callable[[], float] = clock.now) -> None:
        self._db = db
        self._q = db.dialect.sql
        self._now = now

    # -- scaffolding ------------------------------------------------------------------

    def _load(self, conn: Any, group: str) -> KafkaGroup:
        row = conn.execute(self._q(_GROUP), (group,)).fetchone()
        g = KafkaGroup(group)
        if row is not None:
            g.state, g.generation, g.protocol_type, g.protocol, g.leader = row[:5]
            g.rebalance_started, g.group_type, g.assignment_epoch, g.topology = row[5:]
            g.stored = True
        for r in conn.execute(self._q(_MEMBERS), (group,)):
            m = Member.from_row(r)
            g.members[m.member_id] = m
            g.loaded[m.member_id] = m.row(group)
        return g

    def _save(self, conn: Any, g: KafkaGroup, now: float) -> None:
        q = self._q
        conn.execute(
            q(_UPSERT_GROUP),
            (
                g.group_id,
                g.state,
                g.generation,
                g.protocol_type,
                g.protocol,
                g.leader,
                g.rebalance_started,
                g.group_type,
                g.assignment_epoch,
                g.topology,
                now,
            ),
        )
        # Only the members that changed: a heartbeat in a big stable group rewrites one
        # row, not every member's assignment (bench/consumer_protocol.py).
        rows = {mid: m.row(g.group_id) for mid, m in g.members.items()}
        stale = [mid for mid in g.loaded if g.loaded[mid] != rows.get(mid)]
        conn.executemany(q(_DELETE_MEMBER), [(g.group_id, mid) for mid in stale])
        conn.executemany(
            q(_INSERT_MEMBER), [r for mid, r in rows.items() if g.loaded.get(mid) != r]
        )
        g.loaded = rows

    def _transact(self, group: str, apply: Callable[[Any, KafkaGroup, float], Any]) -> Any:
        with self._db.write() as conn:
            now = self._now()
            g = self._load(conn, group)
            self._settle(g, now)
            result = apply(conn, g, now)
            self._settle(g, now)
            if g.stored or g.members:
                self._save(conn, g, now)
                g.stored = True
        return result

    @staticmethod
    def _rebalance(g: KafkaGroup, now: float) -> None:
        if g.state in (STABLE, COMPLETING):
            g.state = PREPARING
            g.rebalance_started = now
            for m in g.members.values():
                m.joined = False

    def _settle(self, g: KafkaGroup, now: float) -> None:
        """Expire silent members, then complete a rebalance that can complete."""
        if g.group_type == CONSUMER:
            _settle_consumer(g, now)
            return
        for m in list(g.members.values()):
            waiting = g.state == PREPARING and m.joined  # a member in JoinGroup is alive
            if not waiting and now - m.last_heartbeat > m.session_timeout_ms / 1000:
                del g.members[m.member_id]
                self._rebalance(g, now)
                if g.state == PREPARING and not g.members:
                    break
        if not g.members:
            if g.state != EMPTY:
                g.state, g.leader, g.protocol = EMPTY, "", ""
                g.generation += 1
            return
        if g.state != PREPARING:
            return
        timeout = max(m.rebalance_timeout_ms for m in g.members.values()) / 1000
        if not all(m.joined for m in g.members.values()):
            if now - g.rebalance_started < timeout:
                return
            for m in [m for m in g.members.values() if not m.joined]:
                del g.members[m.member_id]  # did not rejoin in time
            if not g.members:
                g.state, g.leader, g.protocol = EMPTY, "", ""
                g.generation += 1
                return
        g.generation += 1
        g.protocol = _choose_protocol(list(g.members.values()))
        if g.leader not in g.members:
            g.leader = min(g.members.values(), key=lambda m: (m.joined_at, m.member_id)).member_id
        g.state = COMPLETING
        for m in g.members.values():
            m.joined, m.generation, m.assignment = False, g.generation, b""

    # -- the protocol -----------------------------------------------------------------

    def join(
        self,
        group: str,
        member_id: str,
        *,
        client_id: str = "",
        client_host: str = "",
        instance_id: str | None = None,
        session_timeout_ms: int = 10_000,
        rebalance_timeout_ms: int = 300_000,
        protocol_type: str = "consumer",
        protocols: Sequence[tuple[str, bytes]] = (),
        require_member_id: bool = True,
        poll: bool = False,
    ) -> JoinResult:
        """Join (or, with ``poll``, wait on) a rebalance of ``group``.

        Raises:
            GroupProtocolConflictError: REST consumers use the group, or no protocol is
                common to the members, or another protocol type.
            ConsumerNotFoundError: polled after the member was removed.
        """

        def apply(conn: Any, g: KafkaGroup, now: float) -> JoinResult:
            if poll:
                m = g.members.get(member_id)
                if m is None:
                    raise ConsumerNotFoundError(f"Member {member_id} left the group.")
                m.last_heartbeat = now
                if g.state == PREPARING:
                    return JoinResult("waiting", member_id)
                return self._joined(g, m)
            if conn.execute(self._q(_REST_MEMBERS), (group,)).fetchone() is not None:
                raise GroupProtocolConflictError(
                    f"Group '{group}' has REST consumer instances; a group is used through "
                    "one door at a time."
                )
            if g.group_type == CONSUMER:
                if g.members:
                    raise GroupProtocolConflictError(
                        f"Group '{group}' is a consumer group of the consumer protocol "
                        "(KIP-848) with members: join it with group.protocol=consumer."
                    )
                g.group_type, g.state = CLASSIC, EMPTY  # empty: it converts (offline)
            if g.members and protocol_type != g.protocol_type:
                raise GroupProtocolConflictError(
                    f"Group '{group}' uses protocol type {g.protocol_type!r}, not "
                    f"{protocol_type!r}."
                )
            mid = member_id
            if not mid:
                mid = f"{client_id or 'member'}-{uuid.uuid4()}"
                if require_member_id:
                    return JoinResult("member_id_required", mid)
            candidate = Member(
                mid,
                instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                list(protocols),
                joined_at=now,
                last_heartbeat=now,
            )
            others = [m for m in g.members.values() if m.member_id != mid]
            if others and not _choose_protocol([*others, candidate]):
                raise GroupProtocolConflictError(
                    f"No assignment protocol of member {mid} is supported by every member."
                )
            old = g.members.get(mid)
            if old is not None:
                candidate.joined_at = old.joined_at
                candidate.generation = old.generation
                candidate.assignment = old.assignment
            g.members[mid] = candidate
            g.protocol_type = protocol_type
            if g.state == EMPTY:
                g.state, g.rebalance_started = PREPARING, now
            else:
                self._rebalance(g, now)  # a (re)join in Stable/Completing opens a round
            candidate.joined = True
            self._settle(g, now)
            if g.state == PREPARING:
                return JoinResult("waiting", mid)
            return self._joined(g, g.members[mid])

        result: JoinResult = self._transact(group, apply)
        return result

    @staticmethod
    def _joined(g: KafkaGroup, m: Member) -> JoinResult:
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if m.member_id == g.leader:
            members = tuple(
                (x.member_id, x.instance_id, dict(x.protocols).get(g.protocol, b""))
                for x in sorted(g.members.values(), key=lambda x: x.joined_at)
            )
        return JoinResult("done", m.member_id, g.generation, g.protocol, g.leader, members)

    def sync(
        self,
        group: str,
        member_id: str,
        generation: int,
        assignments: Mapping[str, bytes] | None = None,
    ) -> bytes | None:
        """The member's assignment once the leader sent them; None while waiting.

        Raises:
            ConsumerNotFoundError, StaleGenerationError, RebalanceInProgressError.
        """

        def apply(conn: Any, g: KafkaGroup, now: float) -> bytes | None:
            m = _member(g, member_id, generation)
            m.last_heartbeat = now
            if g.state == PREPARING:
                raise RebalanceInProgressError(f"Group '{group}' is rebalancing: rejoin.")
            if g.state == COMPLETING and member_id == g.leader and assignments is not None:
                for mid, data in assignments.items():
                    if mid in g.members:
                        g.members[mid].assignment = bytes(data)
                g.state = STABLE
            if g.state == STABLE:
                return m.assignment
            return None

        result: bytes | None = self._transact(group, apply)
        return result

    def heartbeat(self, group: str, member_id: str, generation: int) -> None:
        """Raises ConsumerNotFoundError, StaleGenerationError, RebalanceInProgressError
        (rejoin now)."""

        def apply(conn: Any, g: KafkaGroup, now: float) -> None:
            m = _member(g, member_id, generation)
            m.last_heartbeat = now
            if g.state == PREPARING:
                raise RebalanceInProgressError(f"Group '{group}' is rebalancing: rejoin.")

        self._transact(group, apply)

    def leave(self, group: str, member_ids: Sequence[str]) -> list[str | None]:
        """Remove members (a rebalance follows); per member None or "unknown_member_id"."""

        def apply(conn: Any, g: KafkaGroup, now: float) -> list[str | None]:
            out: list[str | None] = []
            for mid in member_ids:
                if g.members.pop(mid, None) is None:
                    out.append("unknown_member_id")
                    continue
                out.append(None)
                if g.group_type == CONSUMER:
                    g.generation += 1
                elif g.state != PREPARING:
                    self._rebalance(g, now)
            return out

        result: list[str | None] = self._transact(group, apply)
        return result

    def commit_offsets(
        self,
        group: str,
        member_id: str,
        generation: int,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> None:
        """Store committed offsets (the shared table). A member commits at its group's
        generation; ``generation`` -1 with no member id is a simple consumer's commit,
        allowed while the group has no member.

        A negative offset is accepted, as Kafka accepts it, and means what it means to
        every Kafka client that fetches it: no committed offset (the row goes).

        Raises:
            ConsumerNotFoundError, StaleGenerationError; RebalanceInProgressError from a
            member of a classic group that is completing a rebalance (joined, not synced),
            as Kafka answers.
        """

        def apply(conn: Any, g: KafkaGroup, now: float) -> None:
            if generation < 0 and not member_id:
                if g.members:
                    raise StaleGenerationError(
                        f"Group '{group}' has members: commit as one of them."
                    )
            elif g.group_type == CONSUMER:
                _consumer_member(g, member_id, generation)
            else:
                m = _member(g, member_id, generation)
                if g.state == COMPLETING:
                    raise RebalanceInProgressError(
                        f"Group '{group}' is completing a rebalance: sync, then commit."
                    )
                m.last_heartbeat = now
            conn.executemany(
                self._q(_UPSERT_COMMITTED),
                [
                    (group, tp.topic, tp.partition, c.offset, c.metadata or "", now)
                    for tp, c in offsets.items()
                    if c.offset >= 0
                ],
            )
            conn.executemany(
                self._q(_FORGET_COMMITTED),
                [(group, tp.topic, tp.partition) for tp, c in offsets.items() if c.offset < 0],
            )

        self._transact(group, apply)

    def committed(
        self,
        group: str,
        partitions: Sequence[TopicPartition] | None = None,
        *,
        member_id: str = "",
        member_epoch: int = -1,
    ) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets of the group (all, or those of ``partitions``).

        ``member_id``/``member_epoch``: a consumer-protocol member asking (OffsetFetch v9+);
        in a consumer group it must be a member at that epoch. Without them (an admin, a
        classic or a simple consumer) anyone may ask.

        Raises:
            ConsumerNotFoundError, StaleMemberEpochError: a member of a consumer group
                that is not one, or not at that epoch.
        """
        with self._db.read() as conn:
            if member_id or member_epoch >= 0:
                g = self._load(conn, group)
                if g.group_type == CONSUMER:
                    _consumer_member(g, member_id, member_epoch)
            rows = conn.execute(self._q(_COMMITTED), (group,)).fetchall()
        found = {TopicPartition(t, p): CommittedOffset(o, meta) for t, p, o, meta in rows}
        if partitions is None:
            return found
        wanted = [TopicPartition(t, p) for t, p in partitions]
        return {tp: found[tp] for tp in wanted if tp in found}

    def describe(self, group: str) -> KafkaGroup | None:
        """The settled group, or None when no Kafka client ever joined it. A consumer
        group's ``topic_names`` name the topics of its assignments."""

        def apply(conn: Any, g: KafkaGroup, now: float) -> KafkaGroup | None:
            if g.group_type == CONSUMER:
                wanted = {
                    t
                    for m in g.members.values()
                    if m.consumer is not None
                    for a in (m.consumer.assigned, m.consumer.target, m.consumer.revoking)
                    for t in a
                }
                g.topic_names = {
                    bytes(tid): name
                    for tid, name, _ in conn.execute(self._q(_TOPICS))
                    if bytes(tid) in wanted
                }
            return g if g.stored or g.members else None

        result: KafkaGroup | None = self._transact(group, apply)
        return result

    # -- the consumer group protocol (KIP-848) -----------------------------------------

    def consumer_heartbeat(
        self,
        group: str,
        member_id: str,
        member_epoch: int,
        *,
        instance_id: str | None = None,
        rack_id: str | None = None,
        rebalance_timeout_ms: int = -1,
        subscribed_topic_names: Sequence[str] | None = None,
        subscribed_topic_regex: str | None = None,
        server_assignor: str | None = None,
        owned: Assignment | None = None,
        client_id: str = "",
        client_host: str = "",
        session_timeout_ms: int = 45_000,
    ) -> HeartbeatResult:
        """One ConsumerGroupHeartbeat: join (epoch 0), stay (its current epoch), or leave
        (-1; -2 for a static member, who keeps its partitions until its session ends).

        ``None`` for the subscription, the assignor or ``owned`` means "unchanged since
        the last heartbeat"; ``owned`` is what the member holds (it must be empty to join).
        An empty ``member_id`` at epoch 0 gets one here (v0's clients leave it to us).

        Raises:
            GroupNotFoundError: a classic group with members ("not a consumer group").
            GroupProtocolConflictError: REST consumer instances use the group.
            ConsumerNotFoundError: an unknown member at an epoch other than 0.
            FencedMemberEpochError: an epoch that is not the member's.
            UnreleasedInstanceIdError: a static member's instance id held by a live member.
            UnsupportedAssignorError: an assignor other than uniform or range.
            RequestError: a join without its subscription or rebalance timeout.
        """
        if server_assignor is not None and server_assignor not in assignors.ASSIGNORS:
            raise UnsupportedAssignorError(
                f"Assignor {server_assignor!r} is not supported: use one of "
                f"{', '.join(sorted(assignors.ASSIGNORS))}."
            )
        if subscribed_topic_regex is not None:
            check_java_pattern(subscribed_topic_regex)

        def apply(conn: Any, g: KafkaGroup, now: float) -> HeartbeatResult:
            if conn.execute(self._q(_REST_MEMBERS), (group,)).fetchone() is not None:
                raise GroupProtocolConflictError(
                    f"Group '{group}' has REST consumer instances; a group is used through "
                    "one door at a time."
                )
            if g.group_type != CONSUMER:
                if g.members:
                    raise GroupNotFoundError(
                        f"Group {group} is not a consumer group: its members use the classic "
                        "protocol (JoinGroup); it converts once it is empty."
                    )
                g.group_type, g.state, g.protocol, g.leader = CONSUMER, EMPTY, "", ""
            if member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                return self._consumer_leave(g, member_id, member_epoch)
            m = self._consumer_join_or_find(g, member_id, member_epoch, instance_id, owned, now)
            c = m.consumer
            assert c is not None
            changed = member_epoch == 0
            if subscribed_topic_names is not None and tuple(subscribed_topic_names) != c.topics:
                c.topics, changed = tuple(subscribed_topic_names), True
            if subscribed_topic_regex is not None and subscribed_topic_regex != (c.regex or ""):
                c.regex, changed = subscribed_topic_regex or None, True
            if server_assignor is not None and server_assignor != c.assignor:
                c.assignor, changed = server_assignor, True
            if rack_id is not None:
                c.rack_id = rack_id
            if rebalance_timeout_ms >= 0:
                m.rebalance_timeout_ms = rebalance_timeout_ms
            m.instance_id = instance_id if instance_id is not None else m.instance_id
            m.client_id, m.client_host = client_id or m.client_id, client_host or m.client_host
            m.session_timeout_ms, m.last_heartbeat = session_timeout_ms, now
            if changed:
                g.generation += 1
            topics = self._subscribed_topics(conn, g)
            topology = json.dumps(sorted((t.hex(), n) for t, (n, _) in topics.items()))
            if topology != g.topology:
                g.topology = topology
                g.generation += 1
            if g.generation > g.assignment_epoch:
                _assign(g, topics)
            before = (c.epoch, c.assigned)
            _reconcile(g, m, owned, now)
            full = (
                rebalance_timeout_ms >= 0
                and owned is not None
                and (subscribed_topic_names is not None or subscribed_topic_regex is not None)
            )
            # The assignment goes out whenever the client may not know it: on a join, a
            # full heartbeat, a change, a request at another epoch (its previous answer
            # lost) or owning other partitions than it was given.
            send = (
                full
                or (c.epoch, c.assigned) != before
                or member_epoch != c.epoch
                or (owned is not None and owned != c.assigned)
            )
            return HeartbeatResult(m.member_id, c.epoch, dict(c.assigned) if send else None)

        result: HeartbeatResult = self._transact(group, apply)
        return result

    @staticmethod
    def _consumer_leave(g: KafkaGroup, member_id: str, epoch: int) -> HeartbeatResult:
        m = g.members.get(member_id)
        if m is None or m.consumer is None:
            raise ConsumerNotFoundError(f"Member {member_id} is not in group '{g.group_id}'.")
        if epoch == STATIC_LEAVE_EPOCH and m.instance_id:
            # A static member going away for a while keeps its partitions (nobody else
            # reads them) until a member with its instance id returns or its session ends.
            m.consumer.epoch = STATIC_LEAVE_EPOCH
            return HeartbeatResult(member_id, STATIC_LEAVE_EPOCH)
        del g.members[member_id]
        g.generation += 1
        return HeartbeatResult(member_id, LEAVE_EPOCH)

    def _consumer_join_or_find(
        self,
        g: KafkaGroup,
        member_id: str,
        epoch: int,
        instance_id: str | None,
        owned: Assignment | None,
        now: float,
    ) -> Member:
        if epoch > 0:
            m = g.members.get(member_id)
            if m is None or m.consumer is None:
                raise ConsumerNotFoundError(
                    f"Member {member_id} is not in group '{g.group_id}': rejoin with epoch 0."
                )
            c = m.consumer
            if epoch != c.epoch and not (
                epoch == c.previous_epoch
                and owned is not None
                and assignors.partitions_of(owned) <= assignors.partitions_of(c.assigned)
            ):  # (the previous epoch is fine when only its answer got lost)
                raise FencedMemberEpochError(
                    f"Member {member_id} is at epoch {c.epoch}, not {epoch}: rejoin."
                )
            return m
        if epoch != 0:
            raise FencedMemberEpochError(f"Epoch {epoch} is not a member epoch: rejoin at 0.")
        if owned:
            raise RequestError("TopicPartitions must be empty when (re-)joining.")
        mid = member_id or str(uuid.uuid4())
        member = Member(
            mid, instance_id, "", "", 45_000, 300_000, [], joined_at=now, last_heartbeat=now
        )
        member.consumer = ConsumerMember()
        old = g.members.get(mid)
        if old is not None and old.consumer is not None:  # rejoining: it holds nothing now
            member.consumer.topics = old.consumer.topics
            member.consumer.regex = old.consumer.regex
            member.consumer.assignor = old.consumer.assignor
        if instance_id is not None:
            holder = next(
                (x for x in g.members.values() if x.instance_id == instance_id and x is not old),
                None,
            )
            if holder is not None:
                if holder.consumer is None or holder.consumer.epoch != STATIC_LEAVE_EPOCH:
                    raise UnreleasedInstanceIdError(
                        f"Static member {instance_id} of group '{g.group_id}' is still "
                        f"{holder.member_id}."
                    )
                # It comes back under a new member id: its partitions go with it.
                taken = holder.consumer
                member.consumer = dataclasses.replace(
                    taken, epoch=g.assignment_epoch, previous_epoch=-1, state=assignors.STABLE
                )
                del g.members[holder.member_id]
        g.members[mid] = member
        return member

    def _subscribed_topics(self, conn: Any, g: KafkaGroup) -> dict[bytes, tuple[int, str]]:
        """The existing topics some member subscribes to: topic id -> (partitions, name)."""
        names = {t for m in g.members.values() if m.consumer for t in m.consumer.topics}
        regexes = {m.consumer.regex for m in g.members.values() if m.consumer and m.consumer.regex}
        out: dict[bytes, tuple[int, str]] = {}
        rows = conn.execute(self._q(_TOPICS)).fetchall() if names or regexes else []
        all_names = [r[1] for r in rows]
        for pattern in regexes:
            names.update(match_topics(pattern, all_names))
        for tid, name, count in rows:
            if name in names:
                out[bytes(tid)] = (int(count), name)
        return out

    def list_groups(self) -> list[str]:
        with self._db.read() as conn:
            return [r[0] for r in conn.execute(self._q(_ALL_GROUPS))]

    def check_member(self, group: str, member_id: str, generation: int) -> None:
        """That ``member_id`` is in the group and, given a ``generation`` >= 0, at that
        generation (its member epoch in a consumer-protocol group): Kafka's check of a
        TxnOffsetCommit (KIP-447).

        Raises:
            ConsumerNotFoundError, StaleGenerationError.
        """
        with self._db.read() as conn:
            g = self._load(conn, group)
        m = g.members.get(member_id)
        if m is None:
            raise ConsumerNotFoundError(f"Member {member_id} is not in group '{group}'.")
        now = m.consumer.epoch if g.group_type == CONSUMER and m.consumer else g.generation
        if generation >= 0 and generation != now:
            raise StaleGenerationError(
                f"Member {member_id} of group '{group}' is at generation {now}, not {generation}."
            )

    def has_members(self, group: str) -> bool:
        g = self.describe(group)
        return g is not None and bool(g.members)

    def delete(self, group: str) -> None:
        """Delete an empty group with its committed offsets.

        Raises:
            GroupNotFoundError; NonEmptyGroupError while it has members.
        """

        def apply(conn: Any, g: KafkaGroup, now: float) -> None:
            if g.members:
                raise NonEmptyGroupError(f"Group '{group}' has members.")
            committed = conn.execute(self._q(_COMMITTED), (group,)).fetchone()
            if not g.stored and committed is None:
                raise GroupNotFoundError(f"Consumer group '{group}' not found.")
            conn.execute(self._q(_DELETE_COMMITTED), (group,))
            conn.execute(self._q(_DELETE_GROUP), (group,))
            g.stored = False

        self._transact(group, apply)


def _consumer_state(g: KafkaGroup) -> str:
    """A consumer-protocol group's state, as Kafka names it."""
    if not g.members:
        return EMPTY
    if g.generation > g.assignment_epoch:
        return ASSIGNING
    for m in g.members.values():
        c = m.consumer
        if (
            c is not None
            and c.epoch >= 0
            and (c.epoch != g.assignment_epoch or c.state != assignors.STABLE)
        ):
            return RECONCILING
    return STABLE


def _settle_consumer(g: KafkaGroup, now: float) -> None:
    """Members silent past their session timeout leave; a member still holding revoked
    partitions past its rebalance timeout is removed (Kafka fences it)."""
    for m in list(g.members.values()):
        c = m.consumer
        expired = now - m.last_heartbeat > m.session_timeout_ms / 1000
        stuck = c is not None and c.state == assignors.UNREVOKED_PARTITIONS and now > c.deadline
        if c is None or expired or stuck:
            del g.members[m.member_id]
            g.generation += 1
    g.state = _consumer_state(g)


def _assign(g: KafkaGroup, topics: Mapping[bytes, tuple[int, str]]) -> None:
    """Every member's target at the group's epoch, by the group's assignor."""
    members = [m for m in g.members.values() if m.consumer is not None]
    name = group_assignor(members)
    by_name = {n: t for t, (_, n) in topics.items()}
    subscribers = []
    for m in members:
        c = m.consumer
        assert c is not None
        wanted = {by_name[t] for t in c.topics if t in by_name}
        if c.regex:
            wanted |= {by_name[t] for t in match_topics(c.regex, list(by_name))}
        subscribers.append(assignors.Subscriber(m.member_id, frozenset(wanted), c.target))
    targets = assignors.ASSIGNORS[name](subscribers, {t: n for t, (n, _) in topics.items()})
    for m in members:
        assert m.consumer is not None
        m.consumer.target = targets.get(m.member_id, {})
    g.assignment_epoch = g.generation


def group_assignor(members: Sequence[Member]) -> str:
    """The assignor of a consumer group: the one most of its members name (the first by
    name on a tie), else uniform (Kafka's default)."""
    named = sorted(m.consumer.assignor for m in members if m.consumer and m.consumer.assignor)
    return max(sorted(set(named)), key=named.count) if named else assignors.DEFAULT_ASSIGNOR


def _reconcile(g: KafkaGroup, m: Member, owned: Assignment | None, now: float) -> None:
    """One step of ``m`` towards its target (``coordinator.groups.assignors.reconcile``)."""
    c = m.consumer
    assert c is not None
    held = {
        tp
        for x in g.members.values()
        if x is not m and x.consumer is not None
        for tp in assignors.partitions_of(assignors.union(x.consumer.assigned, x.consumer.revoking))
    }
    step = assignors.reconcile(
        epoch=c.epoch,
        state=c.state,
        assigned=c.assigned,
        revoking=c.revoking,
        target=c.target,
        target_epoch=g.assignment_epoch,
        owned=owned,
        held_elsewhere=lambda t, p: (t, p) in held,
    )
    if step.state == assignors.UNREVOKED_PARTITIONS and c.state != step.state:
        c.deadline = now + m.rebalance_timeout_ms / 1000
    if step.epoch != c.epoch:
        c.previous_epoch = c.epoch
    c.epoch, c.state, c.assigned, c.revoking = step.epoch, step.state, step.assigned, step.revoking
    g.state = _consumer_state(g)


def _consumer_member(g: KafkaGroup, member_id: str, epoch: int) -> Member:
    """The consumer-protocol member committing or fetching offsets at ``epoch``.

    Raises:
        ConsumerNotFoundError, StaleMemberEpochError.
    """
    m = g.members.get(member_id)
    if m is None or m.consumer is None:
        raise ConsumerNotFoundError(f"Member {member_id} is not in group '{g.group_id}'.")
    if epoch != m.consumer.epoch:
        raise StaleMemberEpochError(
            f"Member {member_id} is at epoch {m.consumer.epoch}, not {epoch}."
        )
    return m


def _member(g: KafkaGroup, member_id: str, generation: int) -> Member:
    if g.group_type == CONSUMER:
        raise GroupProtocolConflictError(
            f"Group '{g.group_id}' uses the consumer protocol (KIP-848), not JoinGroup/SyncGroup."
        )
    m = g.members.get(member_id)
    if m is None:
        raise ConsumerNotFoundError(f"Member {member_id} is not in group '{g.group_id}'.")
    if generation != g.generation:
        raise StaleGenerationError(
            f"Generation {generation}; group '{g.group_id}' is at {g.generation}."
        )
    return m


def _choose_protocol(members: list[Member]) -> str:
    """The first protocol (in the oldest member's order) every member supports; "" if none."""
    if not members:
        return ""
    first = min(members, key=lambda m: m.joined_at)
    common = set.intersection(*({n for n, _ in m.protocols} for m in members))
    for name, _ in first.protocols:
        if name in common:
            return name
    return ""


class KafkaGroupCoordinator(Protocol):
    """The Kafka-group side of a coordinator client (LocalCoordinator, HttpCoordinator)."""

    def kafka_join(
        self,
        group: str,
        member_id: str,
        *,
        client_id: str = "",
        client_host: str = "",
        instance_id: str | None = None,
        session_timeout_ms: int = 10_000,
        rebalance_timeout_ms: int = 300_000,
        protocol_type: str = "consumer",
        protocols: Sequence[tuple[str, bytes]] = (),
        require_member_id: bool = True,
        poll: bool = False,
    ) -> JoinResult:
        """``KafkaGroupStore.join``."""
        ...

    def kafka_sync(
        self,
        group: str,
        member_id: str,
        generation: int,
        assignments: Mapping[str, bytes] | None = None,
    ) -> bytes | None: ...

    def kafka_heartbeat(self, group: str, member_id: str, generation: int) -> None: ...

    def kafka_leave(self, group: str, member_ids: Sequence[str]) -> list[str | None]: ...

    def kafka_commit_offsets(
        self,
        group: str,
        member_id: str,
        generation: int,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> None: ...

    def kafka_committed(
        self,
        group: str,
        partitions: Sequence[TopicPartition] | None = None,
        *,
        member_id: str = "",
        member_epoch: int = -1,
    ) -> dict[TopicPartition, CommittedOffset]: ...

    def kafka_describe(self, group: str) -> KafkaGroup | None: ...

    def kafka_consumer_heartbeat(
        self,
        group: str,
        member_id: str,
        member_epoch: int,
        *,
        instance_id: str | None = None,
        rack_id: str | None = None,
        rebalance_timeout_ms: int = -1,
        subscribed_topic_names: Sequence[str] | None = None,
        subscribed_topic_regex: str | None = None,
        server_assignor: str | None = None,
        owned: Assignment | None = None,
        client_id: str = "",
        client_host: str = "",
        session_timeout_ms: int = 45_000,
    ) -> HeartbeatResult:
        """``KafkaGroupStore.consumer_heartbeat``."""
        ...

    def kafka_delete_group(self, group: str) -> None: ...


# -- the consumer protocol's embedded bytes (for the v3 views) ---------------------------


def _embedded(kind: str, data: bytes) -> Any:
    """Decode a consumer-protocol subscription or assignment (version prefix + body)."""
    if len(data) < 2:
        return None
    version = min(int.from_bytes(data[:2], "big", signed=True), 3)
    try:
        cls = load_entity_schema(kind, version, EntityType.data)
        value, _ = entity_reader(cls)(data, 2)
    except Exception:  # a client's own format: shown as nothing
        return None
    return value


def subscription_topics(metadata: bytes) -> tuple[str, ...]:
    """The topics a member's consumer-protocol metadata subscribes to."""
    value = _embedded("consumer_protocol_subscription", metadata)
    return tuple(value.topics) if value is not None else ()


def assigned_partitions(assignment: bytes) -> tuple[TopicPartition, ...]:
    """The partitions a consumer-protocol assignment gives a member."""
    value = _embedded("consumer_protocol_assignment", assignment)
    if value is None:
        return ()
    return tuple(
        sorted(
            TopicPartition(t.topic, int(p)) for t in value.assigned_partitions for p in t.partitions
        )
    )


_V3_STATES = {
    EMPTY: "EMPTY",
    PREPARING: "PREPARING_REBALANCE",
    COMPLETING: "COMPLETING_REBALANCE",
    STABLE: "STABLE",
    ASSIGNING: "ASSIGNING",
    RECONCILING: "RECONCILING",
}


def kafka_group_info(g: KafkaGroup, committed: dict[TopicPartition, CommittedOffset]) -> GroupInfo:
    """A Kafka group as the consumer-group views show every group (one group model).

    A consumer-protocol member shows its subscription, its member epoch and the
    partitions it holds now (``g.topic_names`` names their topics)."""
    members = []
    for m in sorted(g.members.values(), key=lambda m: m.member_id):
        c = m.consumer
        if c is not None:
            subscription: tuple[str, ...] = c.topics
            generation = c.epoch
            assignment = tuple(
                sorted(
                    TopicPartition(g.topic_names[t], p)
                    for t, p in assignors.partitions_of(c.assigned)
                    if t in g.topic_names
                )
            )
        else:
            subscription = subscription_topics(dict(m.protocols).get(g.protocol, b""))
            generation = m.generation
            assignment = assigned_partitions(m.assignment)
        members.append(
            ConsumerState(
                group=g.group_id,
                name=m.member_id,
                config=ConsumerConfig(session_timeout_ms=m.session_timeout_ms),
                subscription=subscription,
                pattern=c.regex if c is not None else None,
                manual=False,
                generation=generation,
                assignment=assignment,
                last_seen=m.last_heartbeat,
            )
        )
    return GroupInfo(
        group=g.group_id,
        generation=g.generation,
        state=_V3_STATES.get(g.state, g.state.upper()),
        assignor=g.protocol
        if g.group_type == CLASSIC
        else group_assignor([m for m in g.members.values() if m.consumer]),
        members=tuple(members),
        committed=dict(sorted(committed.items())),
        group_type=g.group_type.upper(),
    )
