"""Consumer-group state in the metadata database: instances, generations, assignments,
fetch positions and committed offsets. Every group SQL statement lives in this module.

Each public method is ONE write transaction (``BEGIN IMMEDIATE`` on SQLite) that
runs in three steps, so any number of coordinators and processes sharing the
database see one consistent group:

1. **Settle** the group as of ``now()``: instances idle past
   ``instance_timeout_ms`` are deleted; the caller's timers are renewed (see
   below); members no agent heartbeated for ``session_timeout_ms``, or that
   did not fetch for ``max_poll_interval_ms``, leave the assignment (they still
   exist and rejoin at their next fetch, as kafka-rest's consumer rejoins when
   it polls again); then the group is rebalanced if anything the assignment
   depends on changed, and positions are resolved. This step is committed even
   when the request then fails (a savepoint separates it).
2. **Apply** the request (inside a savepoint: a domain error undoes only this
   step), then settle again.
3. Build the answer from the settled state.

Expiry is lazy: nothing runs in the background here. A member whose session
has lapsed keeps its partitions until some call on its group observes the
lapse; since every call on the group observes it first, no two members ever
own one partition in any observed state. The agents keep members alive:
each agent heartbeats the instances it served (``heartbeat_consumers``, one
transaction for all of them), as kafka-rest's Kafka consumers heartbeat from a
background thread, so a client may process a batch for minutes and still
commit.

Timers (seconds from the injected clock; the timeouts are milliseconds):

=====================  ==================  =====================  ========================
call                   ``last_poll``       ``last_heartbeat``     ``last_seen`` (idle)
                       (max.poll.interval) (session)
=====================  ==================  =====================  ========================
create, subscribe,     yes (a member out   yes                    yes
assign, advance,       of the group
begin_fetch,           rejoins)
consumer(touch=True)
seek, commit_offsets,  no: committing is   yes                    yes
unsubscribe            not polling
heartbeat_consumers    no                  yes                    no
consumer(touch=False), no                  no                     no
describe, list,
committed_offsets,
confirm/end_fetch
=====================  ==================  =====================  ========================

Fetch leases: ``begin_fetch`` gives the instance's one fetch a token (refused
while another unexpired token is held); ``confirm_fetch`` checks the token
and the positions the fetch read from; ``end_fetch`` stores the positions the
delivered answer reached and frees the lease. A seek, assign, subscribe or
unsubscribe revokes the token, so a fetch in flight cannot overwrite them.

Topic patterns are matched outside the write transaction: the matches of a
pattern are cached with the exact list of topic names they were computed
from; a transaction that finds a pattern without matches for the current
names rolls back, the matches are computed (``coordinator.groups.patterns``, RE2)
from a read snapshot with no lock held, and the transaction runs again.

Rebalance: the group's *fingerprint* is the JSON of (assignor, the sorted names
of the live non-manual members with their resolved subscriptions, the partition
count of every subscribed topic). When it differs from the stored one the
generation is bumped and the assignment recomputed, so a join, a leave, a
session expiry, a new subscription, a deleted topic, added partitions or a new
topic matching a pattern all rebalance, and nothing else does. The group's
assignor is the one of its oldest live non-manual member (Kafka's group leader).
Members that assigned partitions by hand (``assign``) are outside the group's
assignment and generations, like Kafka's ``assign()`` consumers: their
``generation`` arguments are not checked.

Positions: after every settle, each member's positions cover exactly the
partitions it owns. A newly owned partition starts at the group's committed
offset; without one (or when it lies outside [log-start, high watermark]) the
reset policy decides: earliest -> log-start, latest -> high watermark, none ->
unresolved. A stored position outside [log-start, high watermark] (retention
moved past it, or a seek past the end) follows the reset policy too, as Kafka's
OffsetOutOfRange handling does. Partitions kept across a rebalance keep their
positions.

Deleted topics drop out lazily: of the assignment (a topic recreated under
the same name is picked up again, as is a subscribed topic created after the
subscription), manual assignments (for good), positions and the group's
committed offsets.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from coordinator import clock
from coordinator.client import TopicPartition
from coordinator.db import MetadataDatabase, fetch_each
from coordinator.groups.model import (
    ASSIGNORS,
    FORMATS,
    ISOLATION_LEVELS,
    RESET_POLICIES,
    CommittedOffset,
    ConsumerConfig,
    ConsumerHeartbeat,
    ConsumerState,
    FetchLease,
    GroupInfo,
    GroupTopicLag,
)
from coordinator.groups.patterns import compile_topic_pattern, match_topics
from coordinator.log.topic_configs import validate_topic_name
from segments.errors import (
    ConsumerExistsError,
    ConsumerNotFoundError,
    ConsumerStateError,
    CoordinatorUnavailableError,
    GroupNotFoundError,
    InvalidConsumerConfigError,
    InvalidTopicPatternError,
    LakelogError,
    NonEmptyGroupError,
    PartitionNotFoundError,
    StaleGenerationError,
    TopicNotFoundError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Touch = Literal["none", "seen", "poll"]

#: Patterns whose matches are kept (each with the topic names they were computed from).
PATTERN_CACHE_SIZE = 1024
#: A transaction retried this often because topics kept changing under its patterns
#: gives up with a retriable error.
PATTERN_ATTEMPTS = 8
#: Rows per heartbeat statement batch.
_HEARTBEAT_BATCH = 500

#: Longest group or instance name (Kafka's topic-name limit, for symmetry).
MAX_NAME_LENGTH = 249

#: A topic's partitions' (log-start, high watermark), read elsewhere (sharded metadata):
#: called with the transaction's catalog connection and the topic name.
TopicBounds = Callable[[Any, str], dict[int, tuple[int, int]]]

_TOPIC_COUNT = "SELECT partition_count FROM topics WHERE name = ?"
_ALL_TOPIC_COUNTS = "SELECT name, partition_count FROM topics ORDER BY name"
_TOPIC_BOUNDS = (
    "SELECT p.partition, p.log_start_offset, p.high_watermark FROM partitions p "
    "JOIN topics t ON t.topic_id = p.topic_id WHERE t.name = ?"
)

_GROUP_ROW = (
    "SELECT generation, assignor, assignment, fingerprint FROM consumer_groups WHERE group_id = ?"
)
_UPSERT_GROUP = (
    "INSERT INTO consumer_groups (group_id, generation, assignor, assignment, fingerprint, "
    "updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (group_id) DO UPDATE SET "
    "generation = excluded.generation, assignor = excluded.assignor, "
    "assignment = excluded.assignment, fingerprint = excluded.fingerprint, "
    "updated_at = excluded.updated_at"
)
_MEMBER_COLUMNS = (
    "name, format, auto_offset_reset, auto_commit, fetch_min_bytes, request_timeout_ms, "
    "session_timeout_ms, instance_timeout_ms, assignor, topics, pattern, manual, "
    "manual_assignment, in_group, created_at, last_seen, last_poll, last_heartbeat, "
    "max_poll_interval_ms, fetch_token, fetch_expires, max_poll_records, isolation_level, owner"
)
_MEMBERS = f"SELECT {_MEMBER_COLUMNS} FROM consumers WHERE group_id = ?"
_UPSERT_MEMBER = (
    f"INSERT INTO consumers (group_id, {_MEMBER_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (group_id, name) DO UPDATE SET "
    "topics = excluded.topics, pattern = excluded.pattern, manual = excluded.manual, "
    "manual_assignment = excluded.manual_assignment, in_group = excluded.in_group, "
    "last_seen = excluded.last_seen, last_poll = excluded.last_poll, "
    "last_heartbeat = excluded.last_heartbeat, fetch_token = excluded.fetch_token, "
    "fetch_expires = excluded.fetch_expires"
)
_HEARTBEAT = (
    "UPDATE consumers SET last_heartbeat = ? WHERE group_id = ? AND name = ? RETURNING name"
)
_RENEW_LEASE = (
    "UPDATE consumers SET fetch_expires = ? "
    "WHERE group_id = ? AND name = ? AND fetch_token = ? RETURNING name"
)
_DELETE_MEMBER = (
    "DELETE FROM consumer_positions WHERE group_id = ? AND name = ?",
    "DELETE FROM consumers WHERE group_id = ? AND name = ?",
)
_POSITIONS = "SELECT name, topic, partition, next_offset FROM consumer_positions WHERE group_id = ?"
_UPSERT_POSITION = (
    "INSERT INTO consumer_positions (group_id, name, topic, partition, next_offset) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (group_id, name, topic, partition) "
    "DO UPDATE SET next_offset = excluded.next_offset"
)
_DELETE_POSITION = (
    "DELETE FROM consumer_positions WHERE group_id = ? AND name = ? AND topic = ? AND partition = ?"
)
_DROP_DELETED_TOPIC_OFFSETS = (
    "DELETE FROM committed_offsets WHERE group_id = ? AND topic NOT IN (SELECT name FROM topics)"
)
_COMMITTED = (
    "SELECT topic, partition, committed_offset, metadata FROM committed_offsets WHERE group_id = ?"
)
_UPSERT_COMMITTED = (
    "INSERT INTO committed_offsets (group_id, topic, partition, committed_offset, metadata, "
    "committed_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (group_id, topic, partition) "
    "DO UPDATE SET committed_offset = excluded.committed_offset, "
    "metadata = excluded.metadata, committed_at = excluded.committed_at"
)
_DELETE_GROUP = (
    "DELETE FROM committed_offsets WHERE group_id = ?",
    "DELETE FROM consumer_groups WHERE group_id = ?",
)
_LAG_BY_TOPIC = (
    "SELECT c.group_id, c.topic, "
    "SUM(CASE WHEN p.high_watermark > c.committed_offset "
    "THEN p.high_watermark - c.committed_offset ELSE 0 END), "
    "MAX(CASE WHEN p.high_watermark > c.committed_offset "
    "THEN p.high_watermark - c.committed_offset ELSE 0 END), COUNT(*) "
    "FROM committed_offsets c JOIN topics t ON t.name = c.topic "
    "JOIN partitions p ON p.topic_id = t.topic_id AND p.partition = c.partition "
    "GROUP BY c.group_id, c.topic ORDER BY c.group_id, c.topic"
)
_ALL_COMMITTED = "SELECT group_id, topic, partition, committed_offset FROM committed_offsets"
_GROUP_IDS = (
    "SELECT group_id FROM consumer_groups UNION SELECT group_id FROM committed_offsets ORDER BY 1"
)


# -- validation ------------------------------------------------------------------


def validate_name(kind: str, name: object) -> str:
    """A group or instance name: a non-empty string of at most 249 characters, no '/'.

    Raises:
        InvalidConsumerConfigError.
    """
    if not isinstance(name, str) or not name:
        raise InvalidConsumerConfigError(f"The {kind} name must be a non-empty string.")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidConsumerConfigError(
            f"The {kind} name is {len(name)} characters long; at most {MAX_NAME_LENGTH} allowed."
        )
    if "/" in name:
        raise InvalidConsumerConfigError(f"The {kind} name {name!r} must not contain '/'.")
    return name


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate_consumer_config(config: ConsumerConfig) -> ConsumerConfig:
    """Check every setting of ``config``; returns it unchanged.

    Raises:
        InvalidConsumerConfigError: a format, reset policy or assignor we do not know,
            ``fetch_min_bytes`` below -1, a timeout that is not a positive integer.
    """
    if config.format not in FORMATS:
        raise InvalidConsumerConfigError(
            f"Invalid format type {config.format!r}; expected one of {', '.join(FORMATS)}."
        )
    if config.auto_offset_reset not in RESET_POLICIES:
        raise InvalidConsumerConfigError(
            f"Invalid auto.offset.reset {config.auto_offset_reset!r}; expected one of "
            f"{', '.join(RESET_POLICIES)}."
        )
    if config.assignor not in ASSIGNORS:
        raise InvalidConsumerConfigError(
            f"Invalid partition assignor {config.assignor!r}; expected one of "
            f"{', '.join(ASSIGNORS)}."
        )
    if not isinstance(config.auto_commit, bool):
        raise InvalidConsumerConfigError(
            f"auto.commit.enable must be a boolean, not {config.auto_commit!r}."
        )
    if not _is_int(config.fetch_min_bytes) or config.fetch_min_bytes < -1:
        raise InvalidConsumerConfigError(
            f"fetch.min.bytes must be an integer >= -1, not {config.fetch_min_bytes!r}."
        )
    if not _is_int(config.max_poll_records) or config.max_poll_records < 0:
        raise InvalidConsumerConfigError(
            f"max.poll.records must be an integer >= 1, not {config.max_poll_records!r}."
        )
    if config.isolation_level not in ISOLATION_LEVELS:
        raise InvalidConsumerConfigError(
            f"isolation.level must be one of {', '.join(ISOLATION_LEVELS)}, not "
            f"{config.isolation_level!r}."
        )
    for name in (
        "request_timeout_ms",
        "session_timeout_ms",
        "instance_timeout_ms",
        "max_poll_interval_ms",
    ):
        value = getattr(config, name)
        if not _is_int(value) or value <= 0:
            raise InvalidConsumerConfigError(f"{name} must be a positive integer, not {value!r}.")
    return config


def _check_offset(what: str, tp: TopicPartition, offset: object) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConsumerStateError(
            f"Invalid {what} {offset!r} for partition {tp.partition} of topic '{tp.topic}'."
        )
    return offset


# -- assignors -------------------------------------------------------------------


def assign_range(
    subscriptions: Mapping[str, Sequence[str]], partition_counts: Mapping[str, int]
) -> dict[str, list[TopicPartition]]:
    """Kafka's RangeAssignor: per topic, contiguous ranges over its subscribers by name.

    With n partitions and k subscribers, the first ``n % k`` subscribers get
    ``n // k + 1`` partitions and the rest ``n // k``; 2 members over 3 partitions
    gives c0 [0, 1] and c1 [2].

    Returns:
        Every member of ``subscriptions`` (possibly with no partition), partitions
        sorted by (topic, partition).
    """
    result: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    for topic in topics:
        subscribers = sorted(m for m, ts in subscriptions.items() if topic in ts)
        count = partition_counts[topic]
        per, extra = divmod(count, len(subscribers))
        for i, member in enumerate(subscribers):
            start = i * per + min(i, extra)
            length = per + (1 if i < extra else 0)
            result[member].extend(TopicPartition(topic, p) for p in range(start, start + length))
    return result


def assign_roundrobin(
    subscriptions: Mapping[str, Sequence[str]], partition_counts: Mapping[str, int]
) -> dict[str, list[TopicPartition]]:
    """Kafka's RoundRobinAssignor: all partitions sorted, dealt to the members in turn.

    Members are taken in name order, circularly; a partition goes to the next
    member (from where the last one went) that subscribes to its topic.
    """
    result: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
    members = sorted(subscriptions)
    subscribed = {m: set(subscriptions[m]) for m in members}
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    turn = 0
    for topic in topics:
        for p in range(partition_counts[topic]):
            while topic not in subscribed[members[turn % len(members)]]:
                turn += 1
            result[members[turn % len(members)]].append(TopicPartition(topic, p))
            turn += 1
    return result


_ASSIGNORS: dict[
    str,
    Callable[[Mapping[str, Sequence[str]], Mapping[str, int]], dict[str, list[TopicPartition]]],
] = {"range": assign_range, "roundrobin": assign_roundrobin}


# -- in-memory view of one group inside a transaction ---------------------------


@dataclass
class _Member:
    name: str
    config: ConsumerConfig
    topics: tuple[str, ...]
    pattern: str | None
    manual: bool
    manual_assignment: tuple[TopicPartition, ...]
    in_group: bool  # False once the session or the poll interval lapsed
    created_at: float
    last_seen: float
    last_poll: float
    last_heartbeat: float
    fetch_token: str | None = None
    fetch_expires: float = 0.0

    def lease_free(self, now: float) -> bool:
        return self.fetch_token is None or self.fetch_expires <= now

    def row(self, group: str) -> tuple[Any, ...]:
        c = self.config
        return (
            group,
            self.name,
            c.format,
            c.auto_offset_reset,
            int(c.auto_commit),
            c.fetch_min_bytes,
            c.request_timeout_ms,
            c.session_timeout_ms,
            c.instance_timeout_ms,
            c.assignor,
            json.dumps(list(self.topics)),
            self.pattern,
            int(self.manual),
            json.dumps([list(tp) for tp in self.manual_assignment]),
            int(self.in_group),
            self.created_at,
            self.last_seen,
            self.last_poll,
            self.last_heartbeat,
            c.max_poll_interval_ms,
            self.fetch_token,
            self.fetch_expires,
            c.max_poll_records,
            c.isolation_level,
            c.owner,
        )

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> _Member:
        config = ConsumerConfig(
            format=row[1],
            auto_offset_reset=row[2],
            auto_commit=bool(row[3]),
            fetch_min_bytes=row[4],
            request_timeout_ms=row[5],
            session_timeout_ms=row[6],
            instance_timeout_ms=row[7],
            assignor=row[8],
            max_poll_interval_ms=row[18],
            max_poll_records=row[21],
            isolation_level=row[22],
            owner=row[23],
        )
        return cls(
            name=row[0],
            config=config,
            topics=tuple(json.loads(row[9])),
            pattern=row[10],
            manual=bool(row[11]),
            manual_assignment=tuple(TopicPartition(t, p) for t, p in json.loads(row[12])),
            in_group=bool(row[13]),
            created_at=row[14],
            last_seen=row[15],
            last_poll=row[16],
            last_heartbeat=row[17],
            fetch_token=row[19],
            fetch_expires=row[20],
        )


@dataclass
class _Group:
    group_id: str
    stored: bool
    generation: int = 0
    assignor: str = "range"
    assignment: dict[str, tuple[TopicPartition, ...]] = field(default_factory=dict)
    fingerprint: str = ""
    members: dict[str, _Member] = field(default_factory=dict)
    positions: dict[str, dict[TopicPartition, int]] = field(default_factory=dict)
    dirty: bool = False  # the group row changed
    changed: set[str] = field(default_factory=set)  # members to upsert
    removed: set[str] = field(default_factory=set)  # members to delete

    def member(self, name: str) -> _Member:
        m = self.members.get(name)
        if m is None:
            raise ConsumerNotFoundError(
                f"Consumer instance '{name}' not found in group '{self.group_id}'."
            )
        return m

    def owned(self, m: _Member) -> tuple[TopicPartition, ...]:
        """The partitions ``m`` consumes: its manual ones, else its share of the group's."""
        if m.manual:
            return m.manual_assignment
        return self.assignment.get(m.name, ())


class _PatternsNeeded(Exception):
    """A transaction met patterns without cached matches for the current topic names."""

    def __init__(self, patterns: set[str]) -> None:
        super().__init__(sorted(patterns))
        self.patterns = patterns


class _PatternMatches:
    """Pattern -> (the topic names matched against, the matches): a bounded LRU, thread-safe."""

    def __init__(self, capacity: int = PATTERN_CACHE_SIZE) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[tuple[str, ...], tuple[str, ...]]] = OrderedDict()

    def get(self, pattern: str, names: tuple[str, ...]) -> tuple[str, ...] | None:
        with self._lock:
            entry = self._entries.get(pattern)
            if entry is None or entry[0] != names:
                return None
            self._entries.move_to_end(pattern)
            return entry[1]

    def compute(self, patterns: set[str], names: tuple[str, ...]) -> None:
        """Match ``patterns`` against ``names`` (no lock of the database held)."""
        for pattern in sorted(patterns):
            try:
                matches = match_topics(pattern, names)
            except InvalidTopicPatternError as e:
                # Stored before patterns were checked: it matches nothing, and says why.
                log.warning("subscription pattern %r matches no topic: %s", pattern, e)
                matches = ()
            with self._lock:
                self._entries[pattern] = (names, matches)
                self._entries.move_to_end(pattern)
                while len(self._entries) > self._capacity:
                    self._entries.popitem(last=False)


class _Topics:
    """Topic partition counts and offsets, read on demand and cached for one transaction."""

    def __init__(
        self,
        conn: Any,
        q: Callable[[str], str],
        patterns: _PatternMatches,
        bounds_of: TopicBounds | None = None,
    ) -> None:
        self._conn = conn
        self._q = q
        self._patterns = patterns
        self._bounds_of = bounds_of
        self._counts: dict[str, int | None] = {}
        self._all: tuple[str, ...] | None = None
        self._bounds: dict[str, dict[int, tuple[int, int]]] = {}

    def count(self, topic: str) -> int | None:
        """Partitions of ``topic``, None when it does not exist."""
        if topic not in self._counts:
            row = self._conn.execute(self._q(_TOPIC_COUNT), (topic,)).fetchone()
            self._counts[topic] = None if row is None else int(row[0])
        return self._counts[topic]

    def names(self) -> tuple[str, ...]:
        if self._all is None:
            rows = self._conn.execute(self._q(_ALL_TOPIC_COUNTS)).fetchall()
            self._counts.update((name, int(count)) for name, count in rows)
            self._all = tuple(name for name, _ in rows)
        return self._all

    def check(self, tp: TopicPartition) -> None:
        """Raises TopicNotFoundError, PartitionNotFoundError."""
        count = self.count(tp.topic)
        if count is None:
            raise TopicNotFoundError(f"Topic '{tp.topic}' not found.")
        if not 0 <= tp.partition < count:
            raise PartitionNotFoundError(
                f"Partition {tp.partition} of topic '{tp.topic}' not found."
            )

    def exists(self, tp: TopicPartition) -> bool:
        count = self.count(tp.topic)
        return count is not None and 0 <= tp.partition < count

    def bounds(self, tp: TopicPartition) -> tuple[int, int]:
        """(log-start offset, high watermark) of an existing partition."""
        if tp.topic not in self._bounds:
            if self._bounds_of is not None:  # partitions in shard databases
                self._bounds[tp.topic] = self._bounds_of(self._conn, tp.topic)
            else:
                rows = self._conn.execute(self._q(_TOPIC_BOUNDS), (tp.topic,)).fetchall()
                self._bounds[tp.topic] = {p: (ls, hw) for p, ls, hw in rows}
        found = self._bounds[tp.topic].get(tp.partition)
        if found is None:  # its shard is down (sharded metadata)
            raise CoordinatorUnavailableError(
                f"The offsets of partition {tp.partition} of topic '{tp.topic}' are "
                "unavailable; try again."
            )
        return found

    def require_patterns(self, patterns: set[str]) -> None:
        """Raises _PatternsNeeded unless every pattern has matches for the current names."""
        if not patterns:
            return
        names = self.names()
        missing = {p for p in patterns if self._patterns.get(p, names) is None}
        if missing:
            raise _PatternsNeeded(missing)

    def resolve(self, member: _Member) -> tuple[str, ...]:
        """The existing topics ``member`` subscribes to (a pattern's current matches)."""
        if member.pattern is not None:
            matches = self._patterns.get(member.pattern, self.names())
            if matches is None:
                raise _PatternsNeeded({member.pattern})
            return matches
        return tuple(t for t in member.topics if self.count(t) is not None)

    def subscribed(self, member: _Member) -> tuple[str, ...]:
        """What ``member`` subscribed to: its topics as given, or its pattern's matches."""
        return self.resolve(member) if member.pattern is not None else member.topics


@dataclass
class _Ctx:
    conn: Any
    group: _Group
    topics: _Topics
    now: float


def _committed_rows(
    ctx: _Ctx, offsets: Mapping[TopicPartition, CommittedOffset]
) -> list[tuple[Any, ...]]:
    """``committed_offsets`` rows for ``offsets``, checked.

    Raises:
        TopicNotFoundError, PartitionNotFoundError; ConsumerStateError for a negative offset.
    """
    rows = []
    for key, committed in offsets.items():
        tp = TopicPartition(key[0], key[1])
        ctx.topics.check(tp)
        offset = _check_offset("committed offset", tp, committed.offset)
        metadata = str(committed.metadata or "")
        rows.append((ctx.group.group_id, tp.topic, tp.partition, offset, metadata, ctx.now))
    return rows


# -- the store -------------------------------------------------------------------


class GroupStore:
    """Consumer groups over one metadata database; implements ``GroupCoordinator``.

    Thread-safe; each method is one write transaction (see the module docstring).

    Args:
        now: the clock (epoch seconds) for session and instance expiry; tests
            pass a fake one instead of sleeping.
    """

    def __init__(
        self,
        db: MetadataDatabase,
        *,
        now: Callable[[], float] = clock.now,
        bounds_of: TopicBounds | None = None,
    ) -> None:
        """``bounds_of``: where partitions' offsets are when not in ``db`` (sharded
        metadata: ``coordinator.shards``)."""
        self._db = db
        self._q = db.dialect.sql
        self._now = now
        self._bounds_of = bounds_of
        self._patterns = _PatternMatches()

    def _compute_patterns(self, patterns: set[str]) -> None:
        """Match ``patterns`` against the topic names of a read snapshot (no write lock)."""
        with self._db.read() as conn:
            names = tuple(name for name, _ in conn.execute(self._q(_ALL_TOPIC_COUNTS)))
        self._patterns.compute(patterns, names)

    def _with_patterns(self, run: Callable[[], T], patterns: set[str] | None = None) -> T:
        """``run()`` (one write transaction), again after computing the pattern matches it
        lacked: no pattern is ever evaluated while the transaction holds its locks.

        Raises:
            CoordinatorUnavailableError: topics kept changing under the patterns.
        """
        if patterns:
            self._compute_patterns(patterns)
        for _ in range(PATTERN_ATTEMPTS):
            try:
                return run()
            except _PatternsNeeded as e:
                self._compute_patterns(e.patterns)
        raise CoordinatorUnavailableError(
            "topics changed too often while matching subscription patterns; retry"
        )

    # -- transaction scaffolding --------------------------------------------------

    def _transact(
        self,
        group: str,
        apply: Callable[[_Ctx], T],
        *,
        caller: str | None = None,
        touch: Touch = "none",
        patterns: set[str] | None = None,
    ) -> T:
        """Settle ``group``, then ``apply`` the request and settle again, in ONE transaction.

        A ``LakelogError`` from ``apply`` undoes only what ``apply`` and the second
        settle wrote (a savepoint); the first settle (expiry, the caller's touch)
        is committed before the error is raised. ``patterns``: subscription patterns
        the request brings (matched before the transaction starts).
        """
        return self._with_patterns(
            lambda: self._transact_once(group, apply, caller=caller, touch=touch), patterns
        )

    def _transact_once(
        self, group: str, apply: Callable[[_Ctx], T], *, caller: str | None, touch: Touch
    ) -> T:
        error: LakelogError | None = None
        result: T | None = None
        with self._db.write() as conn:
            topics = _Topics(conn, self._q, self._patterns, self._bounds_of)
            ctx = _Ctx(conn, self._load(conn, group), topics, self._now())
            topics.require_patterns(
                {m.pattern for m in ctx.group.members.values() if m.pattern is not None}
            )
            self._expire_instances(ctx)
            if caller is not None and touch != "none":
                self._touch(ctx, caller, touch)
            self._expire_sessions(ctx)
            self._settle(ctx)
            self._save(ctx)
            conn.execute("SAVEPOINT group_request")
            try:
                result = apply(ctx)
                self._settle(ctx)
                self._save(ctx)
            except LakelogError as e:
                conn.execute("ROLLBACK TO SAVEPOINT group_request")
                error = e
            conn.execute("RELEASE SAVEPOINT group_request")
        if error is not None:
            raise error
        return result  # type: ignore[return-value]

    def _load(self, conn: Any, group: str) -> _Group:
        q = self._q
        row = conn.execute(q(_GROUP_ROW), (group,)).fetchone()
        g = _Group(group, stored=row is not None)
        if row is not None:
            g.generation, g.assignor, assignment, g.fingerprint = row
            g.assignment = {
                name: tuple(TopicPartition(t, p) for t, p in tps)
                for name, tps in json.loads(assignment).items()
            }
        for r in conn.execute(q(_MEMBERS), (group,)):
            m = _Member.from_row(r)
            g.members[m.name] = m
        for name, topic, partition, offset in conn.execute(q(_POSITIONS), (group,)):
            g.positions.setdefault(name, {})[TopicPartition(topic, partition)] = offset
        return g

    def _save(self, ctx: _Ctx) -> None:
        g, conn, q = ctx.group, ctx.conn, self._q
        if g.dirty:
            assignment = {name: [list(tp) for tp in tps] for name, tps in g.assignment.items()}
            conn.execute(
                q(_UPSERT_GROUP),
                (
                    g.group_id,
                    g.generation,
                    g.assignor,
                    json.dumps(assignment),
                    g.fingerprint,
                    ctx.now,
                ),
            )
            g.stored, g.dirty = True, False
        for name in sorted(g.removed):
            for statement in _DELETE_MEMBER:
                conn.execute(q(statement), (g.group_id, name))
        conn.executemany(
            q(_UPSERT_MEMBER), [g.members[name].row(g.group_id) for name in sorted(g.changed)]
        )
        g.removed.clear()
        g.changed.clear()

    # -- settling -----------------------------------------------------------------

    def _expire_instances(self, ctx: _Ctx) -> None:
        g = ctx.group
        for m in list(g.members.values()):
            if ctx.now - m.last_seen > m.config.instance_timeout_ms / 1000:
                self._remove(g, m.name)

    @staticmethod
    def _remove(g: _Group, name: str) -> None:
        del g.members[name]
        g.positions.pop(name, None)
        g.changed.discard(name)
        g.removed.add(name)

    def _touch(self, ctx: _Ctx, name: str, touch: Touch) -> None:
        m = ctx.group.members.get(name)
        if m is None:
            return  # the request itself reports the missing instance
        m.last_seen = m.last_heartbeat = ctx.now
        if touch == "poll":
            m.last_poll = ctx.now
            m.in_group = True  # a member out of the group rejoins when it polls
        ctx.group.changed.add(name)

    def _expire_sessions(self, ctx: _Ctx) -> None:
        for m in ctx.group.members.values():
            if not m.in_group or m.manual:
                continue
            if (
                ctx.now - m.last_heartbeat > m.config.session_timeout_ms / 1000
                or ctx.now - m.last_poll > m.config.max_poll_interval_ms / 1000
            ):
                m.in_group = False
                ctx.group.changed.add(m.name)

    def _settle(self, ctx: _Ctx) -> None:
        """Rebalance if the fingerprint moved, then make positions match ownership."""
        g, topics = ctx.group, ctx.topics
        if not g.stored and not g.members:
            return  # no such group: nothing to write
        for m in g.members.values():
            if m.manual:
                kept = tuple(tp for tp in m.manual_assignment if topics.exists(tp))
                if kept != m.manual_assignment:
                    m.manual_assignment = kept
                    g.changed.add(m.name)
        active = sorted(
            (m for m in g.members.values() if m.in_group and not m.manual), key=lambda m: m.name
        )
        subscriptions = {m.name: topics.resolve(m) for m in active}
        leader = min(active, key=lambda m: (m.created_at, m.name), default=None)
        assignor = leader.config.assignor if leader is not None else g.assignor
        counts: dict[str, int] = {}
        for subscribed in subscriptions.values():
            for t in subscribed:
                count = topics.count(t)
                assert count is not None  # resolve() keeps existing topics only
                counts[t] = count
        fingerprint = json.dumps(
            [
                assignor,
                [[name, list(ts)] for name, ts in subscriptions.items()],
                sorted(counts.items()),
            ]
        )
        if fingerprint != g.fingerprint:
            assigned = _ASSIGNORS[assignor](subscriptions, counts)
            g.generation += 1
            g.assignor = assignor
            g.assignment = {name: tuple(tps) for name, tps in assigned.items() if tps}
            g.fingerprint = fingerprint
            g.dirty = True
        self._settle_positions(ctx)

    def _settle_positions(self, ctx: _Ctx) -> None:
        g, topics, conn, q = ctx.group, ctx.topics, ctx.conn, self._q
        conn.execute(q(_DROP_DELETED_TOPIC_OFFSETS), (g.group_id,))
        committed: dict[TopicPartition, int] | None = None
        for m in g.members.values():
            have = g.positions.setdefault(m.name, {})
            owned = g.owned(m)
            for tp in [tp for tp in have if tp not in set(owned)]:
                del have[tp]
                conn.execute(q(_DELETE_POSITION), (g.group_id, m.name, tp.topic, tp.partition))
            for tp in owned:
                try:
                    log_start, high_watermark = topics.bounds(tp)
                except CoordinatorUnavailableError:
                    if tp in have:  # its metadata shard is down: keep the position,
                        continue  # checked again once the shard answers
                    raise
                pos = have.get(tp)
                if pos is not None and log_start <= pos <= high_watermark:
                    continue
                start: int | None = None
                if pos is None:
                    if committed is None:
                        committed = {
                            TopicPartition(t, p): o
                            for t, p, o, _ in conn.execute(q(_COMMITTED), (g.group_id,))
                        }
                    c = committed.get(tp)
                    if c is not None and log_start <= c <= high_watermark:
                        start = c
                if start is None:
                    policy = m.config.auto_offset_reset
                    if policy == "earliest":
                        start = log_start
                    elif policy == "latest":
                        start = high_watermark
                if start is None:
                    if pos is not None:
                        del have[tp]
                        conn.execute(
                            q(_DELETE_POSITION), (g.group_id, m.name, tp.topic, tp.partition)
                        )
                    continue
                have[tp] = start
                conn.execute(
                    q(_UPSERT_POSITION), (g.group_id, m.name, tp.topic, tp.partition, start)
                )

    def _state(self, ctx: _Ctx, m: _Member) -> ConsumerState:
        g = ctx.group
        owned = g.owned(m)
        have = g.positions.get(m.name, {})
        subscription = () if m.manual else ctx.topics.subscribed(m)
        return ConsumerState(
            group=g.group_id,
            name=m.name,
            config=m.config,
            subscription=subscription,
            pattern=m.pattern,
            manual=m.manual,
            generation=g.generation,
            assignment=owned,
            positions={tp: have[tp] for tp in owned if tp in have},
            unresolved=tuple(tp for tp in owned if tp not in have),
            last_seen=m.last_seen,
        )

    def _committed(self, ctx: _Ctx) -> dict[TopicPartition, CommittedOffset]:
        return {
            TopicPartition(t, p): CommittedOffset(o, meta)
            for t, p, o, meta in ctx.conn.execute(self._q(_COMMITTED), (ctx.group.group_id,))
        }

    # -- GroupCoordinator ---------------------------------------------------------

    def create_consumer(self, group: str, name: str, config: ConsumerConfig) -> ConsumerState:
        """Add an instance (joins the group: a new generation). It starts unsubscribed.

        Raises:
            InvalidConsumerConfigError: a bad name or setting.
            ConsumerExistsError.
        """
        validate_name("consumer group", group)
        validate_name("consumer instance", name)
        validate_consumer_config(config)

        def apply(ctx: _Ctx) -> ConsumerState:
            g = ctx.group
            if name in g.members:
                raise ConsumerExistsError(
                    f"Consumer with specified consumer ID '{name}' already exists in group "
                    f"'{group}'."
                )
            if not g.stored:
                g.assignor = config.assignor
                g.dirty = True
            g.members[name] = _Member(
                name, config, (), None, False, (), True, ctx.now, ctx.now, ctx.now, ctx.now
            )
            g.removed.discard(name)
            g.changed.add(name)
            return self._after(ctx, name)

        return self._transact(group, apply)

    def _after(self, ctx: _Ctx, name: str) -> ConsumerState:
        # Settle before answering so the state includes the rebalance the request caused.
        self._settle(ctx)
        return self._state(ctx, ctx.group.member(name))

    def delete_consumer(self, group: str, name: str) -> None:
        """Remove an instance (leaves the group: rebalances). Raises ConsumerNotFoundError."""

        def apply(ctx: _Ctx) -> None:
            ctx.group.member(name)
            self._remove(ctx.group, name)

        self._transact(group, apply)

    def consumer(self, group: str, name: str, *, touch: bool = True) -> ConsumerState:
        """The instance after expiry and rebalance; ``touch`` renews both timers (and
        brings a member whose session lapsed back into the group).

        Raises:
            ConsumerNotFoundError: no such instance, or it was idle past its instance timeout.
        """
        return self._transact(
            group,
            lambda ctx: self._state(ctx, ctx.group.member(name)),
            caller=name,
            touch="poll" if touch else "none",
        )

    def subscribe(
        self, group: str, name: str, topics: Sequence[str] = (), pattern: str | None = None
    ) -> ConsumerState:
        """Replace the subscription with ``topics`` or ``pattern`` (Java regex syntax, matched
        against whole names; see ``coordinator.groups.patterns``).

        Topics need not exist yet, as in Kafka: a topic created later (or a new match of
        the pattern) is assigned at the first group call after its creation.

        Raises:
            ConsumerNotFoundError.
            ConsumerStateError: partitions are assigned by hand, or both or neither of
                ``topics`` and ``pattern`` are given.
            InvalidTopicNameError: a name no topic can have.
            InvalidTopicPatternError: ``pattern`` is not a regex we run.
        """
        wanted = tuple(dict.fromkeys(topics))
        if bool(wanted) == (pattern is not None):
            raise ConsumerStateError(
                "Subscription to topics, partitions and pattern are mutually exclusive: "
                "give exactly one of a non-empty topic list and a topic pattern."
            )
        for t in wanted:
            validate_topic_name(t)
        if pattern is not None:
            compile_topic_pattern(pattern)  # refuse it before taking any lock

        def apply(ctx: _Ctx) -> ConsumerState:
            m = ctx.group.member(name)
            if m.manual:
                raise ConsumerStateError(
                    "Subscription to topics, partitions and pattern are mutually exclusive: "
                    "this consumer has partitions assigned by hand."
                )
            m.topics, m.pattern = wanted, pattern
            self._revoke_fetch(ctx, m)
            return self._after(ctx, name)

        return self._transact(
            group,
            apply,
            caller=name,
            touch="poll",
            patterns=None if pattern is None else {pattern},
        )

    def unsubscribe(self, group: str, name: str) -> None:
        """Drop the subscription and any manual assignment (rebalances if it was
        subscribed). Raises ConsumerNotFoundError."""

        def apply(ctx: _Ctx) -> None:
            m = ctx.group.member(name)
            m.topics, m.pattern, m.manual, m.manual_assignment = (), None, False, ()
            self._revoke_fetch(ctx, m)

        self._transact(group, apply, caller=name, touch="seen")

    def assign(self, group: str, name: str, partitions: Sequence[TopicPartition]) -> ConsumerState:
        """Assign partitions by hand, replacing earlier manual ones; the member leaves the
        group's assignment. An empty list is the same as ``unsubscribe``.

        Raises:
            ConsumerNotFoundError; ConsumerStateError when subscribed;
            TopicNotFoundError, PartitionNotFoundError.
        """
        wanted = sorted({TopicPartition(tp[0], tp[1]) for tp in partitions})

        def apply(ctx: _Ctx) -> ConsumerState:
            m = ctx.group.member(name)
            if m.topics or m.pattern is not None:
                raise ConsumerStateError(
                    "Subscription to topics, partitions and pattern are mutually exclusive: "
                    "this consumer is subscribed."
                )
            for tp in wanted:
                ctx.topics.check(tp)
            m.manual, m.manual_assignment = bool(wanted), tuple(wanted)
            self._revoke_fetch(ctx, m)
            return self._after(ctx, name)

        return self._transact(group, apply, caller=name, touch="poll")

    def seek(self, group: str, name: str, positions: Mapping[TopicPartition, int]) -> None:
        """Set next-fetch offsets. An offset outside [log-start, high watermark] follows the
        reset policy at the next settle (Kafka's out-of-range handling). A fetch in flight
        loses its lease: it cannot store positions over these.

        Raises:
            ConsumerNotFoundError; ConsumerStateError for an unassigned partition or a
            negative offset.
        """

        def apply(ctx: _Ctx) -> None:
            m = self._store_positions(ctx, name, positions, "seek")
            self._revoke_fetch(ctx, m)

        self._transact(group, apply, caller=name, touch="seen")

    @staticmethod
    def _revoke_fetch(ctx: _Ctx, m: _Member) -> None:
        m.fetch_token, m.fetch_expires = None, 0.0
        ctx.group.changed.add(m.name)

    # -- fetches ------------------------------------------------------------------

    def _take_lease(self, ctx: _Ctx, m: _Member, token: str, lease_ms: int) -> str | None:
        """Give ``m``'s fetch lease to ``token`` unless another unexpired token holds it (the
        same token again is a retry: it keeps the lease)."""
        if m.fetch_token != token and not m.lease_free(ctx.now):
            return None
        m.fetch_token = token
        m.fetch_expires = ctx.now + lease_ms / 1000
        ctx.group.changed.add(m.name)
        return token

    def _lease(self, ctx: _Ctx, m: _Member, token: str | None, ok: bool = True) -> FetchLease:
        busy = 0.0 if token is not None else max(m.fetch_expires - ctx.now, 0.0)
        return FetchLease(self._state(ctx, m), token, ok, busy)

    def _auto_commit(self, ctx: _Ctx, m: _Member) -> None:
        """Commit the member's positions (what its delivered fetches reached), if they moved."""
        g = ctx.group
        have = g.positions.get(m.name, {})
        committed = self._committed(ctx)
        rows = [
            (g.group_id, tp.topic, tp.partition, off, committed[tp].metadata, ctx.now)
            if tp in committed
            else (g.group_id, tp.topic, tp.partition, off, "", ctx.now)
            for tp, off in have.items()
            if tp not in committed or committed[tp].offset != off
        ]
        if rows:
            ctx.conn.executemany(self._q(_UPSERT_COMMITTED), rows)

    def begin_fetch(self, group: str, name: str, token: str, lease_ms: int) -> FetchLease:
        """Give the instance's fetch lease to ``token`` (chosen by the caller, so a retried
        call is harmless) for ``lease_ms`` milliseconds, unless another fetch holds an
        unexpired one (the answer's ``token`` is then None). A poll: renews every timer
        and brings a member out of the group back in. With auto-commit, commits the
        positions first (Kafka's auto-commit: what earlier fetches delivered).

        Raises:
            ConsumerNotFoundError.
        """

        def apply(ctx: _Ctx) -> FetchLease:
            m = ctx.group.member(name)
            held = self._take_lease(ctx, m, token, lease_ms)
            if held is not None and m.config.auto_commit:
                self._auto_commit(ctx, m)
            return self._lease(ctx, m, held)

        return self._transact(group, apply, caller=name, touch="poll")

    def confirm_fetch(
        self, group: str, name: str, token: str, start: Mapping[TopicPartition, int], lease_ms: int
    ) -> FetchLease:
        """Check, before a fetch answers, that ``token`` still holds the lease and that each
        partition of ``start`` (those it read records from) is still owned at that
        position; the lease is then extended by ``lease_ms``. Otherwise ``ok`` is False:
        with the same token when the positions moved (a rebalance: read again from the
        answer's positions), with None when the lease was revoked (a seek) or taken over
        (begin again).

        Raises:
            ConsumerNotFoundError.
        """

        def apply(ctx: _Ctx) -> FetchLease:
            g = ctx.group
            m = g.member(name)
            if m.fetch_token != token:
                return self._lease(ctx, m, None, ok=False)
            owned = set(g.owned(m))
            have = g.positions.get(name, {})
            ok = all(
                TopicPartition(tp[0], tp[1]) in owned
                and have.get(TopicPartition(tp[0], tp[1])) == offset
                for tp, offset in start.items()
            )
            m.fetch_expires = ctx.now + lease_ms / 1000
            g.changed.add(name)
            return self._lease(ctx, m, token, ok)

        return self._transact(group, apply)

    def end_fetch(
        self, group: str, name: str, token: str, positions: Mapping[TopicPartition, int] | None
    ) -> None:
        """Free the lease ``token`` holds. ``positions``: the answer was delivered; store these
        next offsets for the partitions still owned. A token revoked (seek, assign,
        subscribe) or taken over since changes nothing.

        Raises:
            ConsumerNotFoundError; ConsumerStateError for a negative offset.
        """

        def apply(ctx: _Ctx) -> None:
            g = ctx.group
            m = g.member(name)
            if m.fetch_token != token:
                return
            if positions:
                owned = set(g.owned(m))
                kept = {
                    TopicPartition(tp[0], tp[1]): off
                    for tp, off in positions.items()
                    if TopicPartition(tp[0], tp[1]) in owned
                }
                self._store_positions(ctx, name, kept, "deliver")
            self._revoke_fetch(ctx, m)

        self._transact(group, apply)

    def heartbeat_consumers(
        self, members: Sequence[ConsumerHeartbeat], lease_ms: int
    ) -> list[tuple[str, str]]:
        """An agent's background heartbeat for the instances it serves, in one transaction:
        renews their session timers (not the poll or idle ones) and extends the fetch
        leases named. Nothing is settled here; the next call on each group does that.

        Returns:
            (group, name) of the instances that do not exist (any more).
        """
        now = self._now()
        gone: list[tuple[str, str]] = []
        with self._db.write() as conn:
            for i in range(0, len(members), _HEARTBEAT_BATCH):
                batch = members[i : i + _HEARTBEAT_BATCH]
                found = fetch_each(
                    conn, self._q(_HEARTBEAT), [(now, hb.group, hb.name) for hb in batch]
                )
                gone += [
                    (hb.group, hb.name) for hb, row in zip(batch, found, strict=True) if row is None
                ]
                leases = [
                    (now + lease_ms / 1000, hb.group, hb.name, hb.token)
                    for hb in batch
                    if hb.token is not None
                ]
                if leases:
                    fetch_each(conn, self._q(_RENEW_LEASE), leases)
        return gone

    def _store_positions(
        self, ctx: _Ctx, name: str, positions: Mapping[TopicPartition, int], what: str
    ) -> _Member:
        g = ctx.group
        m = g.member(name)
        owned = set(g.owned(m))
        checked = []
        for key, offset in positions.items():
            tp = TopicPartition(key[0], key[1])
            if tp not in owned:
                if what == "advance" and m.manual:
                    raise StaleGenerationError(
                        f"Partition {tp.partition} of topic '{tp.topic}' is no longer assigned "
                        f"to consumer '{name}'."
                    )
                raise ConsumerStateError(
                    f"No current assignment for partition {tp.partition} of topic '{tp.topic}' "
                    f"in consumer '{name}'."
                )
            checked.append((tp, _check_offset("offset", tp, offset)))
        have = g.positions.setdefault(name, {})
        for tp, offset in checked:
            have[tp] = offset
            ctx.conn.execute(
                self._q(_UPSERT_POSITION), (g.group_id, name, tp.topic, tp.partition, offset)
            )
        return m

    def advance(
        self, group: str, name: str, generation: int, positions: Mapping[TopicPartition, int]
    ) -> ConsumerState:
        """Record fetch progress (next offsets) made under ``generation``.

        Raises:
            ConsumerNotFoundError.
            StaleGenerationError: the group rebalanced since ``generation`` (subscribed
                members), or a partition is no longer assigned (manual members); nothing
                is stored and the fetch's records must not be returned.
            ConsumerStateError: a subscribed member at the current generation names a
                partition it does not own, or a negative offset.
        """

        def apply(ctx: _Ctx) -> ConsumerState:
            g = ctx.group
            m = g.member(name)
            if not m.manual and generation != g.generation:
                raise StaleGenerationError(
                    f"Consumer '{name}' fetched in generation {generation}; group '{group}' "
                    f"is at generation {g.generation}."
                )
            self._store_positions(ctx, name, positions, "advance")
            return self._after(ctx, name)

        return self._transact(group, apply, caller=name, touch="poll")

    def commit_offsets(
        self,
        group: str,
        name: str,
        offsets: Mapping[TopicPartition, CommittedOffset],
        generation: int | None = None,
    ) -> None:
        """Store committed offsets (the next offset to consume) for the group.

        Subscribed members may commit only partitions they own, and only at the
        current generation when one is given; manual members may commit any partition
        of an existing topic (Kafka lets simple consumers commit freely).

        Raises:
            ConsumerNotFoundError; TopicNotFoundError, PartitionNotFoundError;
            StaleGenerationError (nothing is stored); ConsumerStateError for a
            negative offset.
        """

        def apply(ctx: _Ctx) -> None:
            g = ctx.group
            m = g.member(name)
            rows = _committed_rows(ctx, offsets)
            if not m.manual and rows:
                if generation is not None and generation != g.generation:
                    raise StaleGenerationError(
                        f"Commit from generation {generation}; group '{group}' is at "
                        f"generation {g.generation}."
                    )
                owned = set(g.owned(m))
                for _, topic, partition, *_ in rows:
                    if TopicPartition(topic, partition) not in owned:
                        raise StaleGenerationError(
                            f"Consumer '{name}' does not own partition {partition} of topic "
                            f"'{topic}' in generation {g.generation}; the group rebalanced."
                        )
            ctx.conn.executemany(self._q(_UPSERT_COMMITTED), rows)

        self._transact(group, apply, caller=name, touch="seen")

    def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed offsets for ``partitions`` (missing ones absent)."""
        wanted = {TopicPartition(tp[0], tp[1]) for tp in partitions}

        def apply(ctx: _Ctx) -> dict[TopicPartition, CommittedOffset]:
            return {tp: c for tp, c in self._committed(ctx).items() if tp in wanted}

        return self._transact(group, apply)

    def list_groups(self) -> list[str]:
        """Groups with at least one instance or committed offset (after expiry), by id."""
        return self._with_patterns(self._list_groups_once)

    def _list_groups_once(self) -> list[str]:
        result = []
        with self._db.write() as conn:
            ids = [gid for (gid,) in conn.execute(self._q(_GROUP_IDS))]
            topics = _Topics(conn, self._q, self._patterns, self._bounds_of)
            now = self._now()
            for gid in ids:
                ctx = _Ctx(conn, self._load(conn, gid), topics, now)
                topics.require_patterns(
                    {m.pattern for m in ctx.group.members.values() if m.pattern is not None}
                )
                self._expire_instances(ctx)
                self._expire_sessions(ctx)
                self._settle(ctx)
                self._save(ctx)
                if ctx.group.members or self._committed(ctx):
                    result.append(gid)
        return result

    def describe_group(self, group: str) -> GroupInfo:
        """Members (by name), assignment and committed offsets; STABLE with members,
        EMPTY with only committed offsets.

        Raises:
            GroupNotFoundError: no instance and no committed offset.
        """

        def apply(ctx: _Ctx) -> GroupInfo:
            g = ctx.group
            committed = self._committed(ctx)
            if not g.members and not committed:
                raise GroupNotFoundError(f"Consumer group '{group}' not found.")
            return GroupInfo(
                group=group,
                generation=g.generation,
                state="STABLE" if g.members else "EMPTY",
                assignor=g.assignor,
                members=tuple(self._state(ctx, g.members[n]) for n in sorted(g.members)),
                committed=dict(sorted(committed.items())),
            )

        return self._transact(group, apply)

    # -- operators' calls (lakelog groups) ------------------------------------------

    def alter_group_offsets(
        self, group: str, offsets: Mapping[TopicPartition, CommittedOffset]
    ) -> None:
        """Set committed offsets of a group without instances (after expiry), in one
        transaction; a group that does not exist yet gets them.

        Raises:
            NonEmptyGroupError: the group has instances (Kafka's tool message).
            TopicNotFoundError, PartitionNotFoundError; ConsumerStateError for a
            negative offset. Nothing is stored then.
        """
        validate_name("consumer group", group)

        def apply(ctx: _Ctx) -> None:
            if ctx.group.members:  # kafka-consumer-groups' words
                raise NonEmptyGroupError(
                    f"Assignments can only be reset if the group '{group}' is inactive, but "
                    "the current state is Stable."
                )
            ctx.conn.executemany(self._q(_UPSERT_COMMITTED), _committed_rows(ctx, offsets))

        self._transact(group, apply)

    def delete_group(self, group: str) -> None:
        """Delete a group without instances: its row and its committed offsets.

        Raises:
            GroupNotFoundError: no such group (no instance, no committed offset).
            NonEmptyGroupError: it has instances.
        """

        def apply(ctx: _Ctx) -> None:
            if not ctx.group.stored and not ctx.group.members and not self._committed(ctx):
                raise GroupNotFoundError(f"Consumer group '{group}' not found.")
            if ctx.group.members:  # Kafka's GroupNotEmptyException
                raise NonEmptyGroupError(
                    f"Group '{group}' could not be deleted: the group is not empty."
                )
            for statement in _DELETE_GROUP:
                ctx.conn.execute(self._q(statement), (group,))
            ctx.group.stored = False

        self._transact(group, apply)

    def lag_by_topic(self) -> list[GroupTopicLag]:
        """Every group's lag per topic from its committed offsets (any door's), in one
        read: the records between each committed offset and its partition's high
        watermark, summed and the largest. For /metrics; no settling, nothing written."""
        if self._bounds_of is not None:
            return self._lag_by_topic_sharded(self._bounds_of)
        with self._db.read() as conn:
            rows = conn.execute(self._q(_LAG_BY_TOPIC)).fetchall()
        return [GroupTopicLag(g, t, int(total), int(top), int(n)) for g, t, total, top, n in rows]

    def _lag_by_topic_sharded(self, bounds_of: TopicBounds) -> list[GroupTopicLag]:
        """``lag_by_topic`` with the high watermarks from the shards (one read each per
        topic; partitions of a shard that is down are left out)."""
        bounds: dict[str, dict[int, tuple[int, int]]] = {}
        with self._db.read() as conn:
            rows = conn.execute(self._q(_ALL_COMMITTED)).fetchall()
            for topic in sorted({r[1] for r in rows}):
                bounds[topic] = bounds_of(conn, topic)
        lag: dict[tuple[str, str], list[int]] = {}
        for group_id, topic, partition, offset in rows:
            edge = bounds[topic].get(int(partition))
            if edge is None:
                continue
            behind = max(0, edge[1] - int(offset))
            total = lag.setdefault((group_id, topic), [0, 0, 0])
            total[0] += behind
            total[1] = max(total[1], behind)
            total[2] += 1
        return [GroupTopicLag(g, t, *v) for (g, t), v in sorted(lag.items())]
