"""The coordinator's metadata store: topics, configs, offsets, the chunk index, agents.

Every SQL statement the coordinator runs is in this module, written once for
SQLite and PostgreSQL (``?`` placeholders, rewritten by ``Dialect.sql``).

Offsets are assigned in :meth:`MetadataStore.commit`: one write transaction
advances each touched partition's high watermark by the chunk's record count,
in (topic id, partition) order so that on PostgreSQL two commits lock rows in
the same order and cannot deadlock; on SQLite the transaction holds the
database's write lock (``BEGIN IMMEDIATE``), which serialises commits across
threads and processes. Offsets of a partition are therefore contiguous, and
their order is commit order.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, cast

from coordinator.client import ChunkCommit
from coordinator.db import POSTGRESQL, MetadataDatabase, fetch_each
from coordinator.producers import (
    ProducerPartitionState,
    RequestKey,
    StoredKey,
    Verdict,
    judge,
    remember,
)
from coordinator.topic_configs import (
    ConfigDef,
    broker_config_def,
    check_consistent,
    config_def,
    topic_defaults,
    validate_broker_configs,
    validate_configs,
    validate_topic_name,
)
from segments.errors import (
    CommitConflictError,
    CoordinatorUnavailableError,
    InvalidConfigError,
    InvalidPartitionsError,
    MetadataError,
    OffsetOutOfRangeError,
    PartitionNotFoundError,
    ProducerConflictError,
    ProducerFencedError,
    TopicExistsError,
    TopicNotFoundError,
)
from segments.types import AgentInfo, ChunkRef, PartitionOffsets, TopicInfo, TopicPartition

#: Partitions one topic may have. Kafka has no hard limit; this one keeps a typo
#: (1e9 partitions) from filling the database.
MAX_PARTITIONS = 100_000

# Rows per "IN (...)" list: well under SQLite's default limit of 32,766 parameters.
_IN_BATCH = 500

_SELECT_TOPIC = "SELECT topic_id, name, partition_count FROM topics"
_TOPIC_BY_NAME = _SELECT_TOPIC + " WHERE name = ?"
_TOPIC_BY_ID = _SELECT_TOPIC + " WHERE topic_id = ?"
_ALL_TOPICS = _SELECT_TOPIC + " ORDER BY name"
_CONFIGS_OF = "SELECT name, value FROM topic_configs WHERE topic_id = ?"
_ALL_CONFIGS = "SELECT topic_id, name, value FROM topic_configs"
_CLUSTER_CONFIGS = "SELECT name, value FROM cluster_configs ORDER BY name"
_UPSERT_CLUSTER_CONFIG = (
    "INSERT INTO cluster_configs (name, value) VALUES (?, ?) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value"
)
_DELETE_CLUSTER_CONFIG = "DELETE FROM cluster_configs WHERE name = ?"
_INSERT_TOPIC = (
    "INSERT INTO topics (topic_id, name, partition_count, created_at) VALUES (?, ?, ?, ?)"
)
_SET_PARTITION_COUNT = "UPDATE topics SET partition_count = ? WHERE topic_id = ?"
_INSERT_PARTITION = (
    "INSERT INTO partitions (topic_id, partition, log_start_offset, high_watermark) "
    "VALUES (?, ?, 0, 0)"
)
_UPSERT_CONFIG = (
    "INSERT INTO topic_configs (topic_id, name, value) VALUES (?, ?, ?) "
    "ON CONFLICT (topic_id, name) DO UPDATE SET value = excluded.value"
)
_DELETE_CONFIG = "DELETE FROM topic_configs WHERE topic_id = ? AND name = ?"
_DELETE_TOPIC = (
    # Children first: explicit rather than relying on ON DELETE CASCADE being enabled.
    "DELETE FROM index_entries WHERE topic_id = ?",
    "DELETE FROM producer_state WHERE topic_id = ?",
    "DELETE FROM topic_configs WHERE topic_id = ?",
    "DELETE FROM partitions WHERE topic_id = ?",
    "DELETE FROM topics WHERE topic_id = ?",
)
_PARTITION_STATE = (
    "SELECT t.topic_id, p.log_start_offset, p.high_watermark FROM topics t "
    "LEFT JOIN partitions p ON p.topic_id = t.topic_id AND p.partition = ? "
    "WHERE t.name = ?"
)
_TOPIC_EXISTS = "SELECT 1 FROM topics WHERE topic_id = ?"

_INSERT_OBJECT = (
    "INSERT INTO objects (object_key, size, committed_at) VALUES (?, ?, ?) "
    "ON CONFLICT (object_key) DO NOTHING RETURNING object_id"
)
_ADVANCE_HIGH_WATERMARK = (
    "UPDATE partitions SET high_watermark = high_watermark + ? "
    "WHERE topic_id = ? AND partition = ? RETURNING high_watermark"
)
_INSERT_ENTRY = (
    "INSERT INTO index_entries (topic_id, partition, base_offset, record_count, object_id, "
    "position, length, min_ts, max_ts, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'segment')"
)
# PostgreSQL only: a whole commit in ONE statement, so that it runs as one transaction in
# one round trip (psycopg prepares it after a few runs; one text for any chunk count).
# The arrays go in binary (%(...)b): psycopg's text format escapes each element, which
# cost ~30 us per chunk.
# - req: the chunks, one array per column, numbered in the order given.
# - locked: the touched partition rows, locked in (topic id, partition) order. PostgreSQL
#   locks rows as they leave the sort (LockRows sits above Sort), so every commit takes
#   its locks in one global order: no deadlocks. MATERIALIZED: evaluated once, in full,
#   before anything reads it.
# - obj: the object row, inserted only if every partition exists (else nothing at all is
#   written) and the key is new (else a retry: nothing is advanced).
# - upd: advances each partition by its record count. It joins obj, so it runs only
#   after every lock is held; it reads the latest committed high watermark of each row
#   (READ COMMITTED re-checks a row updated since the statement's snapshot).
# - ins: the index entries, one per chunk.
# Returns one row: how many partitions exist, the new object id (NULL: the key was
# committed before, or a partition is missing), and the base offsets in input order.
_COMMIT_PG = """
WITH req AS (
    SELECT * FROM unnest(
        %(topic_ids)b::bytea[], %(partitions)b::int[], %(counts)b::bigint[],
        %(positions)b::bigint[], %(lengths)b::bigint[], %(min_ts)b::bigint[],
        %(max_ts)b::bigint[]
    ) WITH ORDINALITY AS r (
        topic_id, partition, record_count, position, length, min_ts, max_ts, ord
    )
), locked AS MATERIALIZED (
    SELECT r.ord FROM partitions p
    JOIN req r ON r.topic_id = p.topic_id AND r.partition = p.partition
    ORDER BY p.topic_id, p.partition
    FOR UPDATE OF p
), obj AS (
    INSERT INTO objects (object_key, size, committed_at)
    SELECT %(object_key)s::text, %(size)s::bigint, %(now)s::double precision
    WHERE (SELECT count(*) FROM locked) = (SELECT count(*) FROM req)
    ON CONFLICT (object_key) DO NOTHING
    RETURNING object_id
), upd AS (
    UPDATE partitions p SET high_watermark = p.high_watermark + r.record_count
    FROM req r, obj o
    WHERE p.topic_id = r.topic_id AND p.partition = r.partition
    RETURNING r.ord, p.high_watermark - r.record_count AS base_offset
), ins AS (
    INSERT INTO index_entries (topic_id, partition, base_offset, record_count, object_id,
        position, length, min_ts, max_ts, kind)
    SELECT r.topic_id, r.partition, u.base_offset, r.record_count, o.object_id,
        r.position, r.length, r.min_ts, r.max_ts, 'segment'
    FROM req r JOIN upd u ON u.ord = r.ord CROSS JOIN obj o
)
SELECT (SELECT count(*) FROM locked), (SELECT object_id FROM obj),
    ARRAY(SELECT base_offset FROM upd ORDER BY ord), ARRAY(SELECT ord FROM locked)
"""
_OBJECT_EXISTS = "SELECT 1 FROM objects WHERE object_key = ?"
_ENTRIES_OF_OBJECT = (
    "SELECT e.topic_id, e.partition, e.position, e.length, e.record_count, e.base_offset "
    "FROM index_entries e JOIN objects o ON o.object_id = e.object_id WHERE o.object_key = ?"
)
# Entries from the one holding offset ? (the last whose base is <= it) onwards. Falls back
# to the offset itself when no entry starts at or below it.
_ENTRIES_FROM = (
    "SELECT o.object_key, e.position, e.length, e.base_offset, e.record_count, "
    "e.min_ts, e.max_ts, e.kind "
    "FROM index_entries e JOIN objects o ON o.object_id = e.object_id "
    "WHERE e.topic_id = ? AND e.partition = ? AND e.base_offset >= COALESCE("
    "(SELECT MAX(base_offset) FROM index_entries "
    "WHERE topic_id = ? AND partition = ? AND base_offset <= ?), ?)"
)
_LOOKUP = _ENTRIES_FROM + " ORDER BY e.base_offset LIMIT ?"
_LOOKUP_TIMESTAMP = _ENTRIES_FROM + " AND e.max_ts >= ? ORDER BY e.base_offset LIMIT 1"
_OBJECTS_IN = "SELECT object_key FROM objects WHERE object_key IN ({marks})"
_OFFSETS_OF_TOPICS = (
    "SELECT t.name, p.partition, p.log_start_offset, p.high_watermark FROM topics t "
    "JOIN partitions p ON p.topic_id = t.topic_id WHERE t.name IN ({marks})"
)

_PRODUCER_STATE = (
    "SELECT epoch, batches FROM producer_state "
    "WHERE producer_id = ? AND topic_id = ? AND partition = ?"
)
_UPSERT_PRODUCER_STATE = (
    "INSERT INTO producer_state (producer_id, topic_id, partition, epoch, batches, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (producer_id, topic_id, partition) DO UPDATE SET "
    "epoch = excluded.epoch, batches = excluded.batches, updated_at = excluded.updated_at"
)
_PRODUCER_EPOCH = "SELECT epoch FROM producers WHERE producer_id = ?"
_BUMP_EPOCH = "UPDATE producers SET epoch = ? WHERE producer_id = ?"
_NEW_PRODUCER = "INSERT INTO producers (epoch, created_at) VALUES (0, ?) RETURNING producer_id"
_REQUEST_KEY = (
    "SELECT digest, created_ms, parts FROM idempotency_keys "
    "WHERE topic_id = ? AND request_key = ? AND expires_ms >= ?"
)
# A key is taken unless it is stored and still live: an expired row is overwritten.
_STORE_REQUEST_KEY = (
    "INSERT INTO idempotency_keys "
    "(topic_id, request_key, digest, created_ms, expires_ms, parts) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (topic_id, request_key) DO UPDATE SET digest = excluded.digest, "
    "created_ms = excluded.created_ms, expires_ms = excluded.expires_ms, parts = excluded.parts "
    "WHERE idempotency_keys.expires_ms < excluded.created_ms RETURNING request_key"
)
_PURGE_REQUEST_KEYS = "DELETE FROM idempotency_keys WHERE expires_ms < ?"
#: Seconds between purges of expired idempotency keys (after a keyed commit).
REQUEST_KEY_PURGE_S = 60.0
#: Producer epochs are Kafka int16s.
_MAX_EPOCH = 32767

_META_GET = "SELECT value FROM meta WHERE key = ?"
_META_PUT = "INSERT INTO meta (key, value) VALUES (?, ?)"

_TOUCH_AGENT = (
    "UPDATE agents SET host = ?, port = ?, last_seen = ?, kafka_host = ?, kafka_port = ? "
    "WHERE agent_id = ? RETURNING broker_id"
)
_INSERT_AGENT = (
    "INSERT INTO agents (broker_id, agent_id, host, port, last_seen, kafka_host, kafka_port) "
    "SELECT COALESCE(MAX(broker_id) + 1, 0), ?, ?, ?, ?, ?, ? FROM agents RETURNING broker_id"
)
_LIVE_AGENTS = (
    "SELECT broker_id, agent_id, host, port, last_seen, kafka_host, kafka_port FROM agents "
    "WHERE last_seen >= ? ORDER BY broker_id"
)


class _AutocommitDatabase(Protocol):
    """A database that can run a statement as its own transaction (PostgreSQL)."""

    def autocommit(self) -> AbstractContextManager[Any]: ...


def new_cluster_id() -> str:
    """A cluster id as Kafka makes them: a random UUID in URL-safe base64, unpadded."""
    return _b64(uuid.uuid4().bytes)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def format_topic_id(topic_id: bytes) -> str:
    """A topic id as Kafka prints it (22 characters of URL-safe base64)."""
    return _b64(topic_id)


def _check_partition_count(partitions: object) -> int:
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise InvalidPartitionsError(
            f"Number of partitions must be an integer, not {partitions!r}."
        )
    if partitions < 1:
        raise InvalidPartitionsError(
            f"Number of partitions must be larger than 0, not {partitions}."
        )
    if partitions > MAX_PARTITIONS:
        raise InvalidPartitionsError(
            f"Number of partitions must be at most {MAX_PARTITIONS}, not {partitions}."
        )
    return partitions


def _split_alter(
    set_configs: Mapping[str, str] | None,
    delete_configs: Sequence[str],
    definition: Callable[[object], ConfigDef],
) -> tuple[dict[str, str], set[str]]:
    """An alter's (values to set, checked and trimmed; names to reset), for topic or
    broker configs (``definition`` looks a name up).

    Raises:
        InvalidConfigError: an unknown name, a bad value, a name both set and reset.
    """
    sets = {key: definition(key).validate(value) for key, value in (set_configs or {}).items()}
    if isinstance(delete_configs, str):
        raise InvalidConfigError("delete_configs must be a sequence of names, not a string")
    deletes = {definition(key).name for key in delete_configs}
    both = sorted(deletes & sets.keys())
    if both:
        raise InvalidConfigError(f"Config {both[0]} is both set and reset in one request.")
    return sets, deletes


def check_chunks(object_key: str, chunks: Sequence[ChunkCommit]) -> None:
    """Reject a malformed commit before touching the database.

    Raises:
        ValueError: empty key or chunk list, a record count below 1, a negative
            position or length, or two chunks for one partition.
    """
    if not isinstance(object_key, str) or not object_key:
        raise ValueError("object_key must be a non-empty string")
    if not chunks:
        raise ValueError(f"commit of {object_key!r} has no chunks")
    seen: set[tuple[bytes, int]] = set()
    for c in chunks:
        if c.record_count < 1:
            raise ValueError(f"chunk {c} has record_count {c.record_count}; must be >= 1")
        if c.position < 0 or c.length < 0:
            raise ValueError(f"chunk {c} has a negative position or length")
        if c.partition < 0:
            raise ValueError(f"chunk {c} has a negative partition")
        tp = (c.topic_id, c.partition)
        if tp in seen:
            raise ValueError(
                f"commit of {object_key!r} has two chunks for partition {c.partition} of "
                f"topic id {format_topic_id(c.topic_id)}; one object holds one chunk each"
            )
        seen.add(tp)


class MetadataStore:
    """Topics, configs, offsets, the chunk index and agents over one metadata database.

    Thread-safe; each method is one transaction. Implements the
    ``coordinator.client.Coordinator`` protocol.
    """

    def __init__(self, db: MetadataDatabase, *, cluster_id: str | None = None) -> None:
        """Bind to ``db``, storing a cluster id on first use.

        Args:
            cluster_id: the id a fresh database takes (else a random one); for an
                existing database it must equal the stored one.

        Raises:
            ValueError: ``cluster_id`` differs from the one the database has.
        """
        self._db = db
        self._q = db.dialect.sql
        self._cluster_id = self._init_cluster_id(cluster_id)
        self._next_key_purge = 0.0

    def _init_cluster_id(self, wanted: str | None) -> str:
        if wanted is not None and (not isinstance(wanted, str) or not wanted.strip()):
            raise ValueError(f"cluster_id must be a non-empty string, not {wanted!r}")
        with self._db.write() as conn:
            row = conn.execute(self._q(_META_GET), ("cluster_id",)).fetchone()
            if row is None:
                stored = wanted if wanted is not None else new_cluster_id()
                conn.execute(self._q(_META_PUT), ("cluster_id", stored))
                return stored
        stored = str(row[0])
        if wanted is not None and wanted != stored:
            raise ValueError(
                f"cluster id mismatch: the metadata database {self._db.location} belongs to "
                f"cluster {stored!r}, not {wanted!r}"
            )
        return stored

    def cluster_id(self) -> str:
        """The cluster's stable id: 22 characters of URL-safe base64, as Kafka's."""
        return self._cluster_id

    # -- topics ---------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        """Create a topic with ``partitions`` empty partitions and config overrides.

        With ``validate_only`` everything is checked, including that the name is
        free, and nothing is written; the returned id is not stored.

        Raises:
            InvalidTopicNameError, InvalidPartitionsError, InvalidConfigError,
            TopicExistsError.
        """
        validate_topic_name(name)
        _check_partition_count(partitions)
        overrides = validate_configs(configs)
        with self._db.read() if validate_only else self._db.write() as conn:
            defaults = self._defaults(conn)
            check_consistent(overrides, defaults)
            info = TopicInfo(name, uuid.uuid4().bytes, partitions, overrides, defaults)
            if conn.execute(self._q(_TOPIC_BY_NAME), (name,)).fetchone() is not None:
                raise TopicExistsError(f"Topic '{name}' already exists.")
            if validate_only:
                return info
            conn.execute(self._q(_INSERT_TOPIC), (info.topic_id, name, partitions, time.time()))
            conn.executemany(
                self._q(_INSERT_PARTITION), [(info.topic_id, p) for p in range(partitions)]
            )
            conn.executemany(
                self._q(_UPSERT_CONFIG), [(info.topic_id, k, v) for k, v in overrides.items()]
            )
        return info

    def get_topic(self, name: str) -> TopicInfo:
        """Raises TopicNotFoundError."""
        with self._db.read() as conn:
            return self._topic(conn, name)

    def get_topic_by_id(self, topic_id: bytes) -> TopicInfo:
        """Raises TopicNotFoundError."""
        with self._db.read() as conn:
            row = conn.execute(self._q(_TOPIC_BY_ID), (bytes(topic_id),)).fetchone()
            if row is None:
                raise TopicNotFoundError(f"Topic with id {format_topic_id(topic_id)} not found.")
            return self._topic_info(conn, row)

    def list_topics(self) -> list[TopicInfo]:
        """Every topic, by name, with its config overrides."""
        with self._db.read() as conn:
            topics = conn.execute(self._q(_ALL_TOPICS)).fetchall()
            configs: dict[bytes, dict[str, str]] = {}
            for topic_id, key, value in conn.execute(self._q(_ALL_CONFIGS)):
                configs.setdefault(topic_id, {})[key] = value
            defaults = self._defaults(conn)
        return [
            TopicInfo(name, topic_id, count, configs.get(topic_id, {}), dict(defaults))
            for topic_id, name, count in topics
        ]

    def delete_topic(self, name: str) -> None:
        """Drop a topic with its partitions, configs and index entries.

        Its objects stay in ``objects`` until garbage collection; the name can be
        reused at once (with a new topic id).

        Raises:
            TopicNotFoundError.
        """
        with self._db.write() as conn:
            topic_id = self._topic(conn, name, with_configs=False).topic_id
            for statement in _DELETE_TOPIC:
                conn.execute(self._q(statement), (topic_id,))

    def add_partitions(self, name: str, partitions: int) -> TopicInfo:
        """Grow a topic to ``partitions`` in total; new partitions start empty.

        Raises:
            TopicNotFoundError; InvalidPartitionsError unless the count grows.
        """
        _check_partition_count(partitions)
        with self._db.write() as conn:
            topic = self._topic(conn, name)
            if partitions <= topic.partitions:
                raise InvalidPartitionsError(f"Topic already has {topic.partitions} partitions.")
            conn.executemany(
                self._q(_INSERT_PARTITION),
                [(topic.topic_id, p) for p in range(topic.partitions, partitions)],
            )
            conn.execute(self._q(_SET_PARTITION_COUNT), (partitions, topic.topic_id))
        return TopicInfo(topic.name, topic.topic_id, partitions, topic.configs, topic.defaults)

    def alter_configs(
        self,
        name: str,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Sequence[str] = (),
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        """Set and reset config overrides in one step (reset = back to Kafka's default).

        Raises:
            TopicNotFoundError; InvalidConfigError for an unknown name, a bad value, a
            name both set and reset, or a result that breaks a cross-config rule.
        """
        sets, deletes = _split_alter(set_configs, delete_configs, config_def)
        with self._db.read() if validate_only else self._db.write() as conn:
            topic = self._topic(conn, name)
            overrides = {k: v for k, v in topic.configs.items() if k not in deletes}
            overrides.update(sets)
            check_consistent(overrides, topic.defaults)
            if not validate_only:
                conn.executemany(
                    self._q(_DELETE_CONFIG), [(topic.topic_id, key) for key in sorted(deletes)]
                )
                conn.executemany(
                    self._q(_UPSERT_CONFIG),
                    [(topic.topic_id, k, v) for k, v in sets.items()],
                )
        return TopicInfo(
            topic.name,
            topic.topic_id,
            topic.partitions,
            dict(sorted(overrides.items())),
            topic.defaults,
        )

    def _topic(self, conn: Any, name: str, *, with_configs: bool = True) -> TopicInfo:
        row = conn.execute(self._q(_TOPIC_BY_NAME), (name,)).fetchone()
        if row is None:
            raise TopicNotFoundError(f"Topic '{name}' not found.")
        if not with_configs:
            return TopicInfo(row[1], row[0], row[2])
        return self._topic_info(conn, row)

    def _topic_info(self, conn: Any, row: tuple[bytes, str, int]) -> TopicInfo:
        topic_id, name, count = row
        configs = dict(sorted(conn.execute(self._q(_CONFIGS_OF), (topic_id,)).fetchall()))
        return TopicInfo(name, topic_id, count, configs, self._defaults(conn))

    def _defaults(self, conn: Any) -> dict[str, str]:
        """The cluster-wide broker configs, keyed by the topic configs they set."""
        return topic_defaults(dict(conn.execute(self._q(_CLUSTER_CONFIGS)).fetchall()))

    # -- cluster-wide broker configs -------------------------------------------
    def broker_configs(self) -> dict[str, str]:
        """The dynamic cluster-wide broker configs set, by (Kafka's broker config) name."""
        with self._db.read() as conn:
            return dict(conn.execute(self._q(_CLUSTER_CONFIGS)).fetchall())

    def alter_broker_configs(
        self,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Sequence[str] = (),
        *,
        validate_only: bool = False,
    ) -> dict[str, str]:
        """Set and reset cluster-wide broker configs in one step; returns them all after.

        Every topic without an override of the matching topic config inherits the value.

        Raises:
            InvalidConfigError: an unknown name, a bad value, a name both set and reset,
                a result that breaks a cross-config rule for some topic.
        """
        sets, deletes = _split_alter(set_configs, delete_configs, broker_config_def)
        with self._db.read() if validate_only else self._db.write() as conn:
            current = dict(conn.execute(self._q(_CLUSTER_CONFIGS)).fetchall())
            after = {k: v for k, v in current.items() if k not in deletes} | sets
            validate_broker_configs(after)
            defaults = topic_defaults(after)
            overrides: dict[bytes, dict[str, str]] = {}
            for topic_id, key, value in conn.execute(self._q(_ALL_CONFIGS)):
                overrides.setdefault(bytes(topic_id), {})[key] = value
            for topic_overrides in overrides.values():
                check_consistent(topic_overrides, defaults)
            if not validate_only:
                conn.executemany(self._q(_DELETE_CLUSTER_CONFIG), [(k,) for k in sorted(deletes)])
                conn.executemany(self._q(_UPSERT_CLUSTER_CONFIG), sorted(sets.items()))
        return dict(sorted(after.items()))

    # -- the log --------------------------------------------------------------
    def commit(
        self, object_key: str, chunks: Sequence[ChunkCommit], *, size: int | None = None
    ) -> list[int]:
        """Assign base offsets to every chunk of one object in ONE transaction.

        Args:
            object_key: the committed object; unique across commits.
            chunks: at most one chunk per partition.
            size: the object's size in bytes, if known (for garbage collection stats).

        Returns:
            The base offset of each chunk, in the order given. A retry with the same
            key and chunks returns the offsets of the first commit and assigns none.

        Raises:
            ValueError: malformed chunks (see :func:`check_chunks`).
            TopicNotFoundError, PartitionNotFoundError: nothing is committed.
            CommitConflictError: the key is committed with other chunks.
        """
        check_chunks(object_key, chunks)
        idempotent = any(c.producer_batches or c.request_keys for c in chunks)
        if self._db.dialect.name == POSTGRESQL.name and not idempotent:
            return self._commit_one_statement(object_key, chunks, size)
        q = self._q
        # Fixed lock order (see the module docstring); bytes sort like the stored BLOBs.
        order = sorted(range(len(chunks)), key=lambda i: (chunks[i].topic_id, chunks[i].partition))
        bases = [0] * len(chunks)
        # Not exclusive: the UPDATEs below lock each touched partition row, in order.
        with self._db.write(exclusive=False) as conn:
            row = conn.execute(q(_INSERT_OBJECT), (object_key, size, time.time())).fetchone()
            if row is None:
                return self._retried_commit(conn, object_key, chunks)
            object_id = row[0]
            advanced = fetch_each(
                conn,
                q(_ADVANCE_HIGH_WATERMARK),
                [(chunks[i].record_count, chunks[i].topic_id, chunks[i].partition) for i in order],
            )
            for i, hw in zip(order, advanced, strict=True):
                c = chunks[i]
                if hw is None:
                    raise self._missing_partition(conn, c.topic_id, c.partition)
                bases[i] = hw[0] - c.record_count
            if idempotent:  # the partition rows are locked: their producer state too
                self._check_producers(conn, chunks, order, bases)
                self._store_request_keys(conn, chunks, bases)
            conn.executemany(
                q(_INSERT_ENTRY),
                [
                    (
                        c.topic_id,
                        c.partition,
                        base,
                        c.record_count,
                        object_id,
                        c.position,
                        c.length,
                        c.min_timestamp_ms,
                        c.max_timestamp_ms,
                    )
                    for c, base in zip(chunks, bases, strict=True)
                ],
            )
        if any(c.request_keys for c in chunks):
            self._purge_request_keys()
        return bases

    def _store_request_keys(
        self, conn: Any, chunks: Sequence[ChunkCommit], bases: list[int]
    ) -> None:
        """Store each REST idempotency key with the offsets its records got here.

        Raises:
            ProducerConflictError: a key is stored (and live) already: another agent
                committed the same request meanwhile (or another request under the
                key); the whole commit rolls back and the agent's retry answers it.
        """
        keys: dict[tuple[bytes, str], tuple[RequestKey, list[tuple[int, int, int]]]] = {}
        for c, base in zip(chunks, bases, strict=True):
            for k in c.request_keys:
                part = (c.partition, base + k.relative_offset, k.record_count)
                keys.setdefault((c.topic_id, k.key), (k, []))[1].append(part)
        for (topic_id, name), (k, parts) in sorted(keys.items()):
            stored = StoredKey(k.digest, k.created_ms, tuple(sorted(parts)))
            row = conn.execute(
                self._q(_STORE_REQUEST_KEY),
                (topic_id, name, k.digest, k.created_ms, k.expires_ms, stored.to_json()),
            ).fetchone()
            if row is None:
                raise ProducerConflictError(
                    f"Idempotency key {name!r} of topic id {format_topic_id(topic_id)} was "
                    "stored by another commit meanwhile; nothing was stored, retry."
                )

    def _purge_request_keys(self) -> None:
        """Delete expired idempotency keys, at most every REQUEST_KEY_PURGE_S seconds
        (in its own transaction: never holding a commit's locks longer)."""
        now = time.time()
        if now < self._next_key_purge:
            return
        self._next_key_purge = now + REQUEST_KEY_PURGE_S
        with self._db.write(exclusive=False) as conn:
            conn.execute(self._q(_PURGE_REQUEST_KEYS), (int(now * 1000),))

    def request_key(self, topic_id: bytes, key: str, now_ms: int) -> StoredKey | None:
        """A live REST idempotency key of a topic (see ``Coordinator.request_key``)."""
        with self._db.read() as conn:
            row = conn.execute(self._q(_REQUEST_KEY), (bytes(topic_id), key, now_ms)).fetchone()
        return None if row is None else StoredKey.from_row(*row)

    def _check_producers(
        self, conn: Any, chunks: Sequence[ChunkCommit], order: list[int], bases: list[int]
    ) -> None:
        """Judge every idempotent batch against its producer's state; store the new state.

        Raises:
            ProducerConflictError: a batch is not the next of its producer (a duplicate,
                out of order, or fenced by what another commit stored since the agent
                looked); the whole commit rolls back.
        """
        q = self._q
        states: dict[tuple[int, bytes, int], ProducerPartitionState | None] = {}
        for i in order:
            c = chunks[i]
            for b in c.producer_batches:
                key = (b.producer_id, c.topic_id, c.partition)
                if key not in states:
                    row = conn.execute(q(_PRODUCER_STATE), key).fetchone()
                    states[key] = None if row is None else ProducerPartitionState.from_row(*row)
                verdict, _ = judge(states[key], b)
                if verdict is not Verdict.APPEND:
                    raise ProducerConflictError(
                        f"Producer {b.producer_id} batch at sequence {b.base_sequence} for "
                        f"partition {c.partition} of topic id {format_topic_id(c.topic_id)} "
                        f"is {verdict.value} at commit; nothing was stored, retry."
                    )
                states[key] = remember(states[key], b, bases[i] + b.relative_offset)
        now = time.time()
        conn.executemany(
            q(_UPSERT_PRODUCER_STATE),
            [
                (pid, topic_id, partition, st.epoch, st.to_json(), now)
                for (pid, topic_id, partition), st in states.items()
                if st is not None
            ],
        )

    def _commit_one_statement(
        self, object_key: str, chunks: Sequence[ChunkCommit], size: int | None
    ) -> list[int]:
        """``commit`` on PostgreSQL: one statement (``_COMMIT_PG``), its own transaction."""
        db = cast("_AutocommitDatabase", self._db)
        params = {
            "topic_ids": [bytes(c.topic_id) for c in chunks],
            "partitions": [c.partition for c in chunks],
            "counts": [c.record_count for c in chunks],
            "positions": [c.position for c in chunks],
            "lengths": [c.length for c in chunks],
            "min_ts": [c.min_timestamp_ms for c in chunks],
            "max_ts": [c.max_timestamp_ms for c in chunks],
            "object_key": object_key,
            "size": size,
            "now": time.time(),
        }
        # A second pass only when the key's object vanished between the statement and
        # the read below (garbage collection): then the key is free again, as on SQLite.
        for _ in range(2):
            with db.autocommit() as conn:
                found, object_id, bases, found_ords = conn.execute(_COMMIT_PG, params).fetchone()
            if object_id is not None:
                if len(bases) != len(chunks):  # impossible while the rows are locked
                    raise MetadataError(
                        f"commit of {object_key!r} advanced {len(bases)} of {len(chunks)} "
                        "partitions"
                    )
                return [int(b) for b in bases]
            # Nothing was written: the key was committed before (a retry) or a partition
            # is missing. The key is checked first, as on SQLite.
            with self._db.read() as conn:
                if conn.execute(self._q(_OBJECT_EXISTS), (object_key,)).fetchone() is not None:
                    return self._retried_commit(conn, object_key, chunks)
                if found < len(chunks):
                    present = {n - 1 for n in found_ords}  # WITH ORDINALITY counts from 1
                    first = min(
                        (i for i in range(len(chunks)) if i not in present),
                        key=lambda i: (chunks[i].topic_id, chunks[i].partition),
                    )
                    c = chunks[first]
                    raise self._missing_partition(conn, c.topic_id, c.partition)
        raise CoordinatorUnavailableError(
            f"commit of {object_key!r}: its object row keeps vanishing; try again"
        )

    def _retried_commit(
        self, conn: Any, object_key: str, chunks: Sequence[ChunkCommit]
    ) -> list[int]:
        stored = {
            (topic_id, partition): (position, length, count, base)
            for topic_id, partition, position, length, count, base in conn.execute(
                self._q(_ENTRIES_OF_OBJECT), (object_key,)
            )
        }
        bases = []
        for c in chunks:
            entry = stored.get((c.topic_id, c.partition))
            if entry is None or entry[:3] != (c.position, c.length, c.record_count):
                break
            bases.append(entry[3])
        if len(bases) != len(chunks) or len(stored) != len(chunks):
            raise CommitConflictError(
                f"Object {object_key!r} is already committed with other chunks "
                f"({len(stored)} index entries; this commit has {len(chunks)} chunks)."
            )
        return bases

    def _missing_partition(self, conn: Any, topic_id: bytes, partition: int) -> Exception:
        if conn.execute(self._q(_TOPIC_EXISTS), (topic_id,)).fetchone() is None:
            return TopicNotFoundError(f"Topic with id {format_topic_id(topic_id)} not found.")
        return PartitionNotFoundError(
            f"Partition {partition} of topic id {format_topic_id(topic_id)} not found."
        )

    def _partition_state(self, conn: Any, topic: str, partition: int) -> tuple[bytes, int, int]:
        row = conn.execute(self._q(_PARTITION_STATE), (partition, topic)).fetchone()
        if row is None:
            raise TopicNotFoundError(f"Topic '{topic}' not found.")
        if row[1] is None:
            raise PartitionNotFoundError(f"Partition {partition} of topic '{topic}' not found.")
        return row[0], row[1], row[2]

    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        """Log-start offset and high watermark. Raises Topic/PartitionNotFoundError."""
        with self._db.read() as conn:
            _, log_start, high_watermark = self._partition_state(conn, topic, partition)
        return PartitionOffsets(log_start, high_watermark)

    def offsets_many(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, PartitionOffsets]:
        """Log-start offset and high watermark of many partitions from one read snapshot;
        partitions of unknown topics, or past a topic's count, are left out."""
        wanted = {TopicPartition(tp[0], tp[1]) for tp in partitions}
        names = sorted({tp.topic for tp in wanted})
        out: dict[TopicPartition, PartitionOffsets] = {}
        with self._db.read() as conn:
            for i in range(0, len(names), _IN_BATCH):
                batch = names[i : i + _IN_BATCH]
                sql = self._q(_OFFSETS_OF_TOPICS.format(marks=", ".join("?" * len(batch))))
                for name, partition, log_start, high_watermark in conn.execute(sql, batch):
                    tp = TopicPartition(name, partition)
                    if tp in wanted:
                        out[tp] = PartitionOffsets(log_start, high_watermark)
        return out

    def lookup(
        self, topic: str, partition: int, offset: int, max_chunks: int = 16
    ) -> list[ChunkRef]:
        """Index entries from the one holding ``offset`` on, in offset order.

        At most ``max_chunks``; empty when ``offset`` >= high watermark; an offset
        below log-start reads from log-start.

        Raises:
            TopicNotFoundError, PartitionNotFoundError; ValueError if ``max_chunks`` < 1.
        """
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, not {max_chunks}")
        with self._db.read() as conn:
            topic_id, log_start, high_watermark = self._partition_state(conn, topic, partition)
            if offset >= high_watermark:
                return []
            start = max(offset, log_start)
            rows = conn.execute(
                self._q(_LOOKUP),
                (topic_id, partition, topic_id, partition, start, start, max_chunks),
            ).fetchall()
        return [ChunkRef(*row) for row in rows]

    def lookup_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> ChunkRef | None:
        """The first entry (by offset, from log-start) whose max timestamp is >= ``timestamp_ms``.

        Timestamps need not grow with offsets (CreateTime), so this scans the
        partition's entries in offset order; SQLite does that at millions of rows
        per second.

        Raises:
            TopicNotFoundError, PartitionNotFoundError.
        """
        with self._db.read() as conn:
            topic_id, log_start, high_watermark = self._partition_state(conn, topic, partition)
            if log_start >= high_watermark:
                return None
            row = conn.execute(
                self._q(_LOOKUP_TIMESTAMP),
                (topic_id, partition, topic_id, partition, log_start, log_start, timestamp_ms),
            ).fetchone()
        return None if row is None else ChunkRef(*row)

    def committed_object_keys(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are committed objects (for orphan detection)."""
        wanted = list(dict.fromkeys(keys))
        found: set[str] = set()
        with self._db.read() as conn:
            for i in range(0, len(wanted), _IN_BATCH):
                batch = wanted[i : i + _IN_BATCH]
                sql = self._q(_OBJECTS_IN.format(marks=", ".join("?" * len(batch))))
                found.update(key for (key,) in conn.execute(sql, batch))
        return found

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Kafka's DeleteRecords: move log-start up to ``offset`` (-1: the high watermark).

        Index entries wholly below the new log-start go (their objects become garbage,
        as with retention); an entry straddling it stays and readers skip its records
        below it. An offset at or below log-start changes nothing.

        Returns:
            The partition's log-start afterwards.

        Raises:
            TopicNotFoundError, PartitionNotFoundError; OffsetOutOfRangeError for an
            offset past the high watermark or below -1.
        """
        from coordinator.janitors.catalog import Catalog  # the one home of that SQL

        with self._db.read() as conn:
            topic_id, log_start, high_watermark = self._partition_state(conn, topic, partition)
        target = high_watermark if offset == -1 else offset
        if target < 0 or target > high_watermark:
            raise OffsetOutOfRangeError(
                f"Offset {offset} is outside partition {partition} of topic '{topic}' "
                f"[{log_start}, {high_watermark}]."
            )
        if target <= log_start:
            return log_start
        moved = Catalog(self._db).advance_log_start(topic_id, partition, target, time.time())
        if moved is None:  # someone moved it further meanwhile
            return self.offsets(topic, partition).log_start
        return moved

    # -- idempotent producers -------------------------------------------------
    def init_producer_id(self, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
        """A new producer id at epoch 0; or, for ``producer_id`` at its current ``epoch``,
        the same id at epoch + 1 (a new id once the epoch would overflow).

        Raises:
            ProducerFencedError: an unknown id, or an epoch other than its current one.
        """
        with self._db.write() as conn:
            if producer_id >= 0:
                row = conn.execute(self._q(_PRODUCER_EPOCH), (producer_id,)).fetchone()
                if row is None or row[0] != epoch:
                    raise ProducerFencedError(
                        f"Producer {producer_id} at epoch {epoch} is not the current one."
                    )
                if epoch + 1 < _MAX_EPOCH:
                    conn.execute(self._q(_BUMP_EPOCH), (epoch + 1, producer_id))
                    return producer_id, epoch + 1
            row = conn.execute(self._q(_NEW_PRODUCER), (time.time(),)).fetchone()
        return int(row[0]), 0

    def producer_state(
        self, producer_id: int, partitions: Sequence[tuple[bytes, int]]
    ) -> dict[tuple[bytes, int], ProducerPartitionState]:
        """What each partition (topic id, partition) remembers of ``producer_id``."""
        out = {}
        with self._db.read() as conn:
            for topic_id, partition in dict.fromkeys(partitions):
                row = conn.execute(
                    self._q(_PRODUCER_STATE), (producer_id, bytes(topic_id), partition)
                ).fetchone()
                if row is not None:
                    out[(bytes(topic_id), partition)] = ProducerPartitionState.from_row(*row)
        return out

    # -- agents ---------------------------------------------------------------
    def heartbeat_agent(
        self, agent_id: str, host: str, port: int, kafka_host: str = "", kafka_port: int = 0
    ) -> int:
        """Register or refresh an agent; returns its broker id (0, 1, ... in order of first
        heartbeat, kept for good). ``kafka_host``/``kafka_port``: its Kafka listener."""
        if not isinstance(agent_id, str) or not agent_id:
            raise ValueError("agent_id must be a non-empty string")
        now = time.time()
        with self._db.write() as conn:
            row = conn.execute(
                self._q(_TOUCH_AGENT), (host, port, now, kafka_host, kafka_port, agent_id)
            ).fetchone()
            if row is None:
                row = conn.execute(
                    self._q(_INSERT_AGENT), (agent_id, host, port, now, kafka_host, kafka_port)
                ).fetchone()
        return int(row[0])

    def list_agents(self, max_age_s: float = 30.0) -> list[AgentInfo]:
        """Agents heard from within ``max_age_s``, by broker id."""
        with self._db.read() as conn:
            rows = conn.execute(self._q(_LIVE_AGENTS), (time.time() - max_age_s,)).fetchall()
        return [AgentInfo(*row) for row in rows]
