"""Kafka consumer groups (the classic JoinGroup/SyncGroup protocol) in the metadata database.

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
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kio.index import load_entity_schema
from kio.serial import entity_reader
from kio.static.constants import EntityType

from coordinator.db import MetadataDatabase
from coordinator.groups import CommittedOffset, ConsumerConfig, ConsumerState, GroupInfo
from coordinator.groups_store import _UPSERT_COMMITTED  # the one statement writing commits
from segments.errors import (
    ConsumerNotFoundError,
    GroupNotFoundError,
    GroupProtocolConflictError,
    NonEmptyGroupError,
    RebalanceInProgressError,
    StaleGenerationError,
)
from segments.types import TopicPartition

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"

_GROUP = (
    "SELECT state, generation, protocol_type, protocol, leader, rebalance_started "
    "FROM kafka_groups WHERE group_id = ?"
)
_UPSERT_GROUP = (
    "INSERT INTO kafka_groups (group_id, state, generation, protocol_type, protocol, leader, "
    "rebalance_started, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (group_id) DO "
    "UPDATE SET state = excluded.state, generation = excluded.generation, "
    "protocol_type = excluded.protocol_type, protocol = excluded.protocol, "
    "leader = excluded.leader, rebalance_started = excluded.rebalance_started, "
    "updated_at = excluded.updated_at"
)
_MEMBER_COLUMNS = (
    "member_id, instance_id, client_id, client_host, session_timeout_ms, "
    "rebalance_timeout_ms, protocols, assignment, joined, generation, joined_at, last_heartbeat"
)
_MEMBERS = f"SELECT {_MEMBER_COLUMNS} FROM kafka_members WHERE group_id = ?"
_DELETE_MEMBERS = "DELETE FROM kafka_members WHERE group_id = ?"
_INSERT_MEMBER = (
    f"INSERT INTO kafka_members (group_id, {_MEMBER_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_DELETE_GROUP = "DELETE FROM kafka_groups WHERE group_id = ?"
_DELETE_COMMITTED = "DELETE FROM committed_offsets WHERE group_id = ?"
_ALL_GROUPS = "SELECT group_id FROM kafka_groups ORDER BY group_id"
_REST_MEMBERS = "SELECT 1 FROM consumers WHERE group_id = ? LIMIT 1"
_COMMITTED = (
    "SELECT topic, partition, committed_offset, metadata FROM committed_offsets WHERE group_id = ?"
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


class KafkaGroupStore:
    """Kafka consumer groups over one metadata database (see the module docstring).

    Args:
        now: the clock (epoch seconds) of sessions and rebalance timeouts.
    """

    def __init__(self, db: MetadataDatabase, *, now: Callable[[], float] = time.time) -> None:
        self._db = db
        self._q = db.dialect.sql
        self._now = now

    # -- scaffolding ------------------------------------------------------------------

    def _load(self, conn: Any, group: str) -> KafkaGroup:
        row = conn.execute(self._q(_GROUP), (group,)).fetchone()
        g = KafkaGroup(group)
        if row is not None:
            g.state, g.generation, g.protocol_type, g.protocol, g.leader, g.rebalance_started = row
            g.stored = True
        for r in conn.execute(self._q(_MEMBERS), (group,)):
            m = Member.from_row(r)
            g.members[m.member_id] = m
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
                now,
            ),
        )
        conn.execute(q(_DELETE_MEMBERS), (g.group_id,))
        conn.executemany(q(_INSERT_MEMBER), [m.row(g.group_id) for m in g.members.values()])

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
                if g.state != PREPARING:
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

        Raises:
            ConsumerNotFoundError, StaleGenerationError, RebalanceInProgressError.
        """

        def apply(conn: Any, g: KafkaGroup, now: float) -> None:
            if generation < 0 and not member_id:
                if g.members:
                    raise StaleGenerationError(
                        f"Group '{group}' has members: commit as one of them."
                    )
            else:
                m = _member(g, member_id, generation)
                m.last_heartbeat = now
            conn.executemany(
                self._q(_UPSERT_COMMITTED),
                [
                    (group, tp.topic, tp.partition, c.offset, c.metadata or "", now)
                    for tp, c in offsets.items()
                ],
            )

        self._transact(group, apply)

    def committed(
        self, group: str, partitions: Sequence[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets of the group (all, or those of ``partitions``)."""
        with self._db.read() as conn:
            rows = conn.execute(self._q(_COMMITTED), (group,)).fetchall()
        found = {TopicPartition(t, p): CommittedOffset(o, meta) for t, p, o, meta in rows}
        if partitions is None:
            return found
        wanted = [TopicPartition(t, p) for t, p in partitions]
        return {tp: found[tp] for tp in wanted if tp in found}

    def describe(self, group: str) -> KafkaGroup | None:
        """The settled group, or None when no Kafka client ever joined it."""

        def apply(conn: Any, g: KafkaGroup, now: float) -> KafkaGroup | None:
            return g if g.stored or g.members else None

        result: KafkaGroup | None = self._transact(group, apply)
        return result

    def list_groups(self) -> list[str]:
        with self._db.read() as conn:
            return [r[0] for r in conn.execute(self._q(_ALL_GROUPS))]

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


def _member(g: KafkaGroup, member_id: str, generation: int) -> Member:
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

    def kafka_join(self, group: str, member_id: str, **options: Any) -> JoinResult:
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
        self, group: str, partitions: Sequence[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset]: ...

    def kafka_describe(self, group: str) -> KafkaGroup | None: ...

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
}


def kafka_group_info(g: KafkaGroup, committed: dict[TopicPartition, CommittedOffset]) -> GroupInfo:
    """A Kafka group as the consumer-group views show every group (one group model)."""
    members = tuple(
        ConsumerState(
            group=g.group_id,
            name=m.member_id,
            config=ConsumerConfig(session_timeout_ms=m.session_timeout_ms),
            subscription=subscription_topics(dict(m.protocols).get(g.protocol, b"")),
            pattern=None,
            manual=False,
            generation=m.generation,
            assignment=assigned_partitions(m.assignment),
            last_seen=m.last_heartbeat,
        )
        for m in sorted(g.members.values(), key=lambda m: m.member_id)
    )
    return GroupInfo(
        group=g.group_id,
        generation=g.generation,
        state=_V3_STATES.get(g.state, g.state.upper()),
        assignor=g.protocol,
        members=members,
        committed=dict(sorted(committed.items())),
    )
