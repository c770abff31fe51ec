"""The coordinator's metadata store: topics, configs, offsets, the chunk index, agents.

Every SQL statement the coordinator runs is in this module, written once for
SQLite and PostgreSQL (``?`` placeholders, rewritten by ``Dialect.sql``).

Offsets are assigned in :meth:`MetadataStore.commit`: one write transaction
advances each touched partition's high watermark by the chunks' record counts,
locking the rows in (topic id, partition) order so that on PostgreSQL two
transactions lock rows in the same order and cannot deadlock; on SQLite the
transaction holds the database's write lock (``BEGIN IMMEDIATE``), which
serialises commits across threads and processes. Offsets of a partition are
therefore contiguous, and their order is commit order.

Concurrent commits in one process share that transaction (group commit,
``coordinator.log.group_commit``): within it they are applied in arrival order, each
with its own object row, offsets and outcome. The statements are set-based: a
transaction costs a fixed number of statements whatever its chunk count
(PostgreSQL: one, ``_COMMIT_BATCH_PG``; SQLite: one read per topic, then one
``executemany`` each for the high watermarks and the index entries).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, cast

from coordinator import clock
from coordinator.client import (
    AgentInfo,
    ChunkCommit,
    ChunkRef,
    IndexWant,
    PartitionOffsets,
    TopicInfo,
    TopicPartition,
)
from coordinator.db import POSTGRESQL, MetadataDatabase, fetch_each, rows_in
from coordinator.iceberg.changes import PURGE_TABLE_FILES
from coordinator.log import transactions
from coordinator.log.group_commit import GroupCommitStats, GroupCommitter, PendingCommit
from coordinator.log.producers import (
    ProducerPartitionState,
    RequestKey,
    StoredKey,
    Verdict,
    judge,
    remember,
)
from coordinator.log.topic_configs import (
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
    AuthorizationError,
    CommitConflictError,
    CoordinatorUnavailableError,
    IndexHoleError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTxnStateError,
    LakelogError,
    MetadataError,
    ObjectDeletedError,
    OffsetOutOfRangeError,
    PartitionNotFoundError,
    ProducerConflictError,
    ProducerFencedError,
    TopicExistsError,
    TopicNotFoundError,
)

#: Partitions one topic may have. Kafka has no hard limit; this one keeps a typo
#: (1e9 partitions) from filling the database.
MAX_PARTITIONS = 100_000

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
    # Consumer groups keep offsets and positions by topic name: they go with the topic (as
    # in Kafka), or a topic created again under the name would start from them.
    "DELETE FROM committed_offsets WHERE topic = (SELECT name FROM topics WHERE topic_id = ?)",
    "DELETE FROM consumer_positions WHERE topic = (SELECT name FROM topics WHERE topic_id = ?)",
    # Children first: explicit rather than relying on ON DELETE CASCADE being enabled.
    # Its table goes too: the objects it held become garbage (coordinator.iceberg).
    "DELETE FROM iceberg_tables WHERE topic_id = ?",
    *PURGE_TABLE_FILES,
    "DELETE FROM index_entries WHERE topic_id = ?",
    "DELETE FROM producer_state WHERE topic_id = ?",
    *transactions.PURGE_TOPIC,
    "DELETE FROM topic_configs WHERE topic_id = ?",
    "DELETE FROM partitions WHERE topic_id = ?",
    "DELETE FROM topics WHERE topic_id = ?",
)
# PostgreSQL: a topic's partition rows locked in commit order (partition order within a
# topic id) before anything of the topic is deleted. A commit that holds them has then
# committed, and its index entries are visible to the deletes that follow (each statement
# of a READ COMMITTED transaction reads anew); a commit that comes later waits, then finds
# no partition and writes nothing. Without it a commit slipping in between the delete of
# the entries and that of the partitions left entries behind (no foreign keys: migration
# 11). SQLite's write transaction is exclusive: nothing to lock.
LOCK_TOPIC_PARTITIONS_PG = (
    "SELECT partition FROM partitions WHERE topic_id = %s ORDER BY partition FOR UPDATE"
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
_INSERT_ENTRY = (
    "INSERT INTO index_entries (topic_id, partition, base_offset, record_count, object_id, "
    "position, length, min_ts, max_ts, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'segment')"
)
_DELETE_OBJECT = "DELETE FROM objects WHERE object_id = ?"
#: Batches of up to this many chunks run the prepared plan of ``_COMMIT_BATCH_PG``.
_PREPARED_CHUNKS = 64
_SET_HIGH_WATERMARK = (
    "UPDATE partitions SET high_watermark = ? WHERE topic_id = ? AND partition = ?"
)
# The high watermarks of some partitions of one topic (those that exist). The partitions
# go as one parameter: a JSON array on SQLite, an array on PostgreSQL.
_HIGH_WATERMARKS_SQLITE = (
    "SELECT partition, high_watermark FROM partitions "
    "WHERE topic_id = ? AND partition IN (SELECT value FROM json_each(?))"
)
_HIGH_WATERMARKS_PG = (
    "SELECT partition, high_watermark FROM partitions "
    "WHERE topic_id = %s AND partition = ANY(%s) ORDER BY partition"
)
# PostgreSQL only: a whole batch of commits (one or many objects) in ONE statement, so
# that it runs as one transaction in one round trip (one text for any size). The arrays
# go in binary (%(...)b): psycopg's text format escapes each element, which cost ~30 us
# per chunk.
# - k: the objects, numbered 1.. in batch order; c: every chunk, with its object's number.
# - locked: the touched partition rows, locked in (topic id, partition) order. PostgreSQL
#   locks rows as they leave the sort (LockRows sits above Sort), so every commit takes
#   its locks in one global order: no deadlocks. MATERIALIZED: evaluated once, in full,
#   before anything reads it.
# - complete: the objects whose every partition exists (the others write nothing).
# - obj: their object rows, inserted unless the key is committed already (a retry).
# - rel: each chunk of a new object, with the records of the batch's earlier objects in
#   its partition before it (batch order is offset order within a partition).
# - upd: advances each partition once by all its records of the batch. It reads the
#   latest committed high watermark of each row (READ COMMITTED re-checks a row updated
#   since the statement's snapshot; the row is locked) and returns the one before: the
#   base of the batch there, which ins and the answer add to each chunk's rel.
# - ins: the index entries, one per chunk.
# Returns one row: the numbers of the complete objects, of the new ones, and the base
# offsets of the new objects' chunks in batch order.
_COMMIT_BATCH_PG = """
WITH k AS (
    SELECT * FROM unnest(%(keys)b::text[], %(sizes)b::bigint[])
        WITH ORDINALITY AS k (object_key, size, req)
), c AS (
    SELECT * FROM unnest(
        %(reqs)b::bigint[], %(topic_ids)b::bytea[], %(partitions)b::int[], %(counts)b::bigint[],
        %(positions)b::bigint[], %(lengths)b::bigint[], %(min_ts)b::bigint[],
        %(max_ts)b::bigint[]
    ) WITH ORDINALITY AS c (
        req, topic_id, partition, record_count, position, length, min_ts, max_ts, ord
    )
), locked AS MATERIALIZED (
    SELECT p.topic_id, p.partition FROM partitions p
    WHERE (p.topic_id, p.partition) IN (SELECT topic_id, partition FROM c)
    ORDER BY p.topic_id, p.partition
    FOR UPDATE OF p
), complete AS (
    SELECT k.req, k.object_key, k.size FROM k
    WHERE NOT EXISTS (
        SELECT 1 FROM c LEFT JOIN locked l
            ON l.topic_id = c.topic_id AND l.partition = c.partition
        WHERE c.req = k.req AND l.partition IS NULL
    )
), obj AS (
    INSERT INTO objects (object_key, size, committed_at)
    SELECT object_key, NULLIF(size, -1), %(now)s::double precision FROM complete ORDER BY req
    ON CONFLICT (object_key) DO NOTHING
    RETURNING object_id, object_key
), rel AS (
    SELECT c.*, k.object_id,
        sum(c.record_count) OVER (
            PARTITION BY c.topic_id, c.partition ORDER BY c.req
        ) - c.record_count AS before
    FROM c JOIN (SELECT k.req, obj.object_id FROM obj JOIN k USING (object_key)) k
        ON k.req = c.req
), upd AS (
    UPDATE partitions p SET high_watermark = p.high_watermark + s.total
    FROM (
        SELECT topic_id, partition, sum(record_count) AS total FROM rel
        GROUP BY topic_id, partition
    ) s
    WHERE p.topic_id = s.topic_id AND p.partition = s.partition
    RETURNING p.topic_id, p.partition, p.high_watermark - s.total AS base
), ins AS (
    INSERT INTO index_entries (topic_id, partition, base_offset, record_count, object_id,
        position, length, min_ts, max_ts, kind)
    SELECT r.topic_id, r.partition, u.base + r.before, r.record_count, r.object_id,
        r.position, r.length, r.min_ts, r.max_ts, 'segment'
    FROM rel r JOIN upd u ON u.topic_id = r.topic_id AND u.partition = r.partition
)
SELECT ARRAY(SELECT req FROM complete ORDER BY req),
    ARRAY(SELECT DISTINCT req FROM rel ORDER BY req),
    ARRAY(
        SELECT u.base + r.before FROM rel r
        JOIN upd u ON u.topic_id = r.topic_id AND u.partition = r.partition
        ORDER BY r.ord
    )
"""
# deleted_at: NULL for a committed object, else a tombstone (garbage collection took it).
_OBJECT_EXISTS = "SELECT deleted_at FROM objects WHERE object_key = ?"
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
_OBJECTS_IN = "SELECT object_key FROM objects WHERE deleted_at IS NULL AND object_key IN ({marks})"
# Pending uploads (see ``MetadataStore.keep_pending``). Each statement's first parameter
# is 1 for a trusted caller (an agent, or a coordinator without authentication), which
# may touch every lease; a user touches only the leases it took, and the keys under them.
_UPSERT_LEASE = (
    "INSERT INTO write_leases (lease_id, expires_at, principal) VALUES (?, ?, ?) "
    "ON CONFLICT (lease_id) DO UPDATE SET expires_at = excluded.expires_at "
    "WHERE ? = 1 OR write_leases.principal = excluded.principal RETURNING lease_id"
)
_ADD_PENDING = (
    "INSERT INTO pending_objects (object_key, lease_id, registered_at) VALUES (?, ?, ?) "
    "ON CONFLICT (object_key) DO UPDATE SET lease_id = excluded.lease_id "
    "WHERE ? = 1 OR pending_objects.lease_id = excluded.lease_id OR EXISTS (SELECT 1 "
    "FROM write_leases l WHERE l.lease_id = pending_objects.lease_id AND l.principal = ?) "
    "RETURNING object_key"
)
_LEASE_PRINCIPAL = "SELECT principal FROM write_leases WHERE lease_id = ?"
_RELEASE_PENDING = "DELETE FROM pending_objects WHERE lease_id = ?"
_RELEASE_LEASE = "DELETE FROM write_leases WHERE lease_id = ?"
_PENDING_IN = (
    "SELECT p.object_key FROM pending_objects p JOIN write_leases l ON l.lease_id = p.lease_id "
    "WHERE l.expires_at >= ? AND p.object_key IN ({marks})"
)
_DELETED_IN = (
    "SELECT object_key FROM objects WHERE deleted_at IS NOT NULL AND object_key IN ({marks})"
)
#: The longest a write lease may be asked for at once (a typo must not pin garbage).
MAX_LEASE_S = 24 * 3600.0
#: The longest write lease id (a Spark job names its lease; the old /v1 API bounded it too).
MAX_LEASE_ID = 200
_OFFSETS_OF_TOPICS = (
    "SELECT t.name, p.partition, p.log_start_offset, p.high_watermark, t.topic_id "
    "FROM topics t JOIN partitions p ON p.topic_id = t.topic_id WHERE t.name IN ({marks})"
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


class Placement(Protocol):
    """Where a catalog's partitions live when they live in shard databases
    (``coordinator.shards``): called inside the catalog's write transaction instead of
    inserting the partition rows there."""

    def assign(self, conn: Any, topic_id: bytes, partitions: range) -> None: ...

    def forget(self, conn: Any, topic_id: bytes) -> None: ...


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


class _NotAll(Exception):
    """An atomic commit that could not commit every object: rolled back (``error``: the
    first refusal, if one was refused; else some wrote nothing, see _resolve_unwritten)."""

    def __init__(self, error: BaseException | None) -> None:
        super().__init__("atomic commit rolled back")
        self.error = error


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


def lookup_entries(
    conn: Any,
    q: Callable[[str], str],
    where: tuple[bytes, int, int, int],
    offset: int,
    max_chunks: int,
) -> list[ChunkRef]:
    """A partition's index entries from the one holding ``offset`` on (``where``: topic
    id, partition, log-start, high watermark), in ``conn``'s snapshot; see ``lookup``.

    Raises:
        IndexHoleError: the entries do not cover the offsets from ``max(offset,
            log-start)`` on without a gap (up to the high watermark, or to the last of
            ``max_chunks`` entries): readers would otherwise wait for records that
            cannot come.
    """
    topic_id, partition, log_start, high_watermark = where
    start = max(offset, log_start)
    if start >= high_watermark:
        return []
    rows = conn.execute(
        q(_LOOKUP), (topic_id, partition, topic_id, partition, start, start, max_chunks)
    ).fetchall()
    refs = [ChunkRef(*row) for row in rows]
    where_text = f"partition {partition} of topic id {format_topic_id(topic_id)}"
    check_contiguous(refs, start, high_watermark, max_chunks, where_text)
    return refs


def check_contiguous(
    refs: Sequence[ChunkRef], start: int, high_watermark: int, max_chunks: int, where: str
) -> None:
    """Raise IndexHoleError unless ``refs`` (a page of at most ``max_chunks`` entries)
    hold ``start`` and follow each other without a gap, up to the high watermark when
    the page is not full (DESIGN.md: the index is contiguous from log-start to the high
    watermark)."""
    at = start
    for ref in refs:
        if not ref.base_offset <= at < ref.end_offset:
            raise IndexHoleError(
                f"The index of {where} holds no entry at offset {at} (the next starts at "
                f"{ref.base_offset}, high watermark {high_watermark})."
            )
        at = ref.end_offset
    if at < high_watermark and len(refs) < max_chunks:
        raise IndexHoleError(
            f"The index of {where} ends at offset {at}, before its high watermark {high_watermark}."
        )


def check_topic_id(topic: str, wanted: bytes | None, found: bytes) -> None:
    """Raises TopicNotFoundError when the caller reads topic id ``wanted`` (not None) and
    the name ``topic`` now belongs to another topic (deleted and created again)."""
    if wanted is not None and wanted != found:
        raise TopicNotFoundError(
            f"Topic '{topic}' with id {format_topic_id(wanted)} not found: the name now "
            f"belongs to topic id {format_topic_id(found)}."
        )


def lookup_timestamp_entry(
    conn: Any,
    q: Callable[[str], str],
    where: tuple[bytes, int, int, int],
    timestamp_ms: int,
    from_offset: int = 0,
) -> ChunkRef | None:
    """The first entry from the one holding ``max(from_offset, log-start)`` on whose max
    timestamp is >= ``timestamp_ms``; see ``lookup_timestamp``."""
    topic_id, partition, log_start, high_watermark = where
    start = max(from_offset, log_start)
    if start >= high_watermark:
        return None
    row = conn.execute(
        q(_LOOKUP_TIMESTAMP),
        (topic_id, partition, topic_id, partition, start, start, timestamp_ms),
    ).fetchone()
    return None if row is None else ChunkRef(*row)


def delete_records_target(
    topic: str, partition: int, offset: int, log_start: int, high_watermark: int
) -> int | None:
    """The log-start DeleteRecords asks for (``offset``; -1: the high watermark), or None
    when it is at or below the current one (nothing to do).

    Raises:
        OffsetOutOfRangeError: past the high watermark, or below -1.
    """
    target = high_watermark if offset == -1 else offset
    if target < 0 or target > high_watermark:
        raise OffsetOutOfRangeError(
            f"Offset {offset} is outside partition {partition} of topic '{topic}' "
            f"[{log_start}, {high_watermark}]."
        )
    return None if target <= log_start else target


class MetadataStore:
    """Topics, configs, offsets, the chunk index and agents over one metadata database.

    Thread-safe; each method is one transaction. Implements the
    ``coordinator.client.Coordinator`` protocol.
    """

    def __init__(
        self,
        db: MetadataDatabase,
        *,
        cluster_id: str | None = None,
        placement: Placement | None = None,
    ) -> None:
        """Bind to ``db``, storing a cluster id on first use.

        Args:
            cluster_id: the id a fresh database takes (else a random one); for an
                existing database it must equal the stored one.
            placement: partitions live elsewhere (a sharded catalog): new partitions
                are handed to it instead of getting rows here.

        Raises:
            ValueError: ``cluster_id`` differs from the one the database has.
        """
        self._db = db
        self._q = db.dialect.sql
        self._placement = placement
        self._cluster_id = self._init_cluster_id(cluster_id)
        self._next_key_purge = 0.0
        self._group = GroupCommitter(self.commit_batch)

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
            conn.execute(self._q(_INSERT_TOPIC), (info.topic_id, name, partitions, clock.now()))
            self._new_partitions(conn, info.topic_id, range(partitions))
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

    def delete_topic(self, name: str, *, topic_id: bytes | None = None) -> None:
        """Drop a topic with its partitions, configs and index entries.

        Its objects stay in ``objects`` until garbage collection; the name can be
        reused at once (with a new topic id).

        Raises:
            TopicNotFoundError: no such topic, or (``topic_id`` given) its id is another.
        """
        with self._db.write() as conn:
            found = self._topic(conn, name, with_configs=False).topic_id
            if topic_id is not None and bytes(topic_id) != found:
                raise TopicNotFoundError(
                    f"Topic with id {format_topic_id(topic_id)} not found "
                    f"('{name}' has another id)."
                )
            topic_id = found
            if self._db.dialect.name == POSTGRESQL.name:
                conn.execute(LOCK_TOPIC_PARTITIONS_PG, (topic_id,)).fetchall()
            for statement in _DELETE_TOPIC:
                conn.execute(self._q(statement), (topic_id,))
            if self._placement is not None:
                self._placement.forget(conn, topic_id)

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
            self._new_partitions(conn, topic.topic_id, range(topic.partitions, partitions))
            conn.execute(self._q(_SET_PARTITION_COUNT), (partitions, topic.topic_id))
        return TopicInfo(topic.name, topic.topic_id, partitions, topic.configs, topic.defaults)

    def _new_partitions(self, conn: Any, topic_id: bytes, partitions: range) -> None:
        if self._placement is not None:
            self._placement.assign(conn, topic_id, partitions)
        else:
            conn.executemany(self._q(_INSERT_PARTITION), [(topic_id, p) for p in partitions])

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

        Concurrent calls share transactions (group commit, ``coordinator.log.group_commit``):
        each still gets exactly its own offsets, or its own error.

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
            ProducerConflictError: an idempotent batch is not its producer's next one.
        """
        check_chunks(object_key, chunks)
        return self._group.commit(PendingCommit(object_key, chunks, size))

    def commit_checked(
        self, object_key: str, chunks: Sequence[ChunkCommit], *, size: int | None = None
    ) -> list[int]:
        """``commit`` of chunks that ``check_chunks`` passed already (a sharded store
        checks a whole object once, then commits its part in each shard)."""
        return self._group.commit(PendingCommit(object_key, chunks, size))

    def commit_atomic(
        self, objects: Sequence[tuple[str, Sequence[ChunkCommit]]]
    ) -> list[list[int]]:
        """Several objects' chunks in ONE transaction: all of them or none.

        Not through the group committer: its batches isolate each request's failure,
        this one fails them together. A repeat of objects committed before answers
        their offsets, as ``commit`` does.

        Raises:
            ValueError: malformed chunks, or an object key given twice.
            CommitConflictError: some of the objects (not all) were committed before.
            What ``commit`` raises, for the whole call.
        """
        pending = [PendingCommit(key, chunks) for key, chunks in objects]
        if len({r.object_key for r in pending}) != len(pending):
            raise ValueError("an atomic commit names an object twice")
        for r in pending:
            check_chunks(r.object_key, r.chunks)
        if not pending:
            return []
        try:
            unwritten = self._commit_batch_steps(pending, atomic=True)
        except _NotAll as e:
            if e.error is not None:
                raise e.error from None
            for r in pending:
                r.bases = r.error = None
            again = self._resolve_unwritten(pending)
            for r in pending:
                if r.error is not None:
                    raise r.error from None
            if again:  # some committed before, some not: not one atomic commit
                raise CommitConflictError(
                    f"{len(pending) - len(again)} of {len(pending)} objects were committed "
                    "before, on their own: this cannot be one atomic commit."
                ) from None
        else:
            assert not unwritten
        return [r.outcome() for r in pending]

    @property
    def group_commit_stats(self) -> GroupCommitStats:
        """How commits were grouped so far (for /metrics)."""
        return self._group.stats

    def commit_batch(self, batch: list[PendingCommit]) -> None:
        """Run ``batch`` (distinct object keys, chunks checked) as one transaction where it
        can, setting each request's offsets or its own error.

        A request whose partition is missing, whose key is committed already (a retry)
        or whose idempotent batch is refused writes nothing and does not disturb the
        others. Raises only when the transaction as a whole failed.
        """
        pending = batch
        for _ in range(2):
            if self._db.dialect.name == POSTGRESQL.name and not any(
                c.producer_batches or c.request_keys or c.marker for r in pending for c in r.chunks
            ):
                unwritten = self._commit_batch_one_statement(pending)
            else:
                unwritten = self._commit_batch_steps(pending)
            if not unwritten:
                break
            # A second pass only for keys whose object vanished between the write and
            # the read below (garbage collection): the key is free again.
            pending = self._resolve_unwritten(unwritten)
            if not pending:
                break
        else:
            for r in pending:
                r.error = CoordinatorUnavailableError(
                    f"commit of {r.object_key!r}: its object row keeps vanishing; try again"
                )
        if any(c.request_keys for r in batch for c in r.chunks):
            self._purge_request_keys()

    def _high_watermarks(
        self, conn: Any, chunks: Sequence[ChunkCommit], *, lock: bool
    ) -> dict[tuple[bytes, int], int]:
        """The high watermark of each existing partition the chunks touch; one statement
        per topic. ``lock`` (in a write transaction): on PostgreSQL lock the rows, in
        (topic id, partition) order."""
        wanted: dict[bytes, set[int]] = {}
        for c in chunks:
            wanted.setdefault(bytes(c.topic_id), set()).add(c.partition)
        out: dict[tuple[bytes, int], int] = {}
        pg = self._db.dialect.name == POSTGRESQL.name
        for topic_id in sorted(wanted):
            partitions = sorted(wanted[topic_id])
            if pg:
                sql = _HIGH_WATERMARKS_PG + (" FOR UPDATE" if lock else "")
                rows = conn.execute(sql, (topic_id, partitions))
            else:
                rows = conn.execute(_HIGH_WATERMARKS_SQLITE, (topic_id, json.dumps(partitions)))
            out.update(((topic_id, p), hw) for p, hw in rows)
        return out

    def _commit_batch_steps(
        self, batch: list[PendingCommit], *, atomic: bool = False
    ) -> list[PendingCommit]:
        """``commit_batch`` as a few set-based statements in one write transaction: read
        (and on PostgreSQL lock) the touched partitions, insert the object rows, judge
        idempotent batches, then one ``executemany`` each for the high watermarks and
        the index entries.

        Returns:
            The requests that wrote nothing for want of a partition or because their
            key was committed before: ``_resolve_unwritten`` answers them.
        """
        q = self._q
        now = clock.now()
        unwritten: list[PendingCommit] = []
        answers: list[tuple[PendingCommit, list[int]]] = []
        entries: list[tuple[Any, ...]] = []
        # Not exclusive: the partition rows are locked (PostgreSQL), in a fixed order.
        with self._db.write(exclusive=False) as conn:
            hw = self._high_watermarks(conn, [c for r in batch for c in r.chunks], lock=True)
            producers = self._producer_states(conn, batch)
            txns = transactions.open_rows(conn, q, [c for r in batch for c in r.chunks])
            txn_steps: list[tuple[str, tuple[Any, ...]]] = []
            claimed: dict[tuple[bytes, str], tuple[RequestKey, list[tuple[int, int, int]]]] = {}
            changed: set[tuple[int, bytes, int]] = set()
            refused: list[int] = []
            for r in batch:
                if any((c.topic_id, c.partition) not in hw for c in r.chunks):
                    unwritten.append(r)
                    continue
                row = conn.execute(q(_INSERT_OBJECT), (r.object_key, r.size, now)).fetchone()
                if row is None:  # committed before: a retry
                    unwritten.append(r)
                    continue
                bases = [hw[(c.topic_id, c.partition)] for c in r.chunks]
                try:
                    judged = self._judge_producers(r.chunks, bases, producers)
                    steps, opened = transactions.judge_transactional(r.chunks, bases, txns)
                    claimed.update(self._claim_request_keys(conn, r, bases, claimed))
                except (ProducerConflictError, InvalidTxnStateError) as e:
                    r.error = e
                    refused.append(row[0])
                    continue
                producers.update(judged)
                txns.update(opened)
                txn_steps.extend(steps)
                changed.update(judged)
                for c, base in zip(r.chunks, bases, strict=True):
                    hw[(c.topic_id, c.partition)] = base + c.record_count
                    entries.append(
                        (
                            c.topic_id,
                            c.partition,
                            base,
                            c.record_count,
                            row[0],
                            c.position,
                            c.length,
                            c.min_timestamp_ms,
                            c.max_timestamp_ms,
                        )
                    )
                answers.append((r, bases))
            if refused:
                conn.executemany(q(_DELETE_OBJECT), [(oid,) for oid in refused])
            advanced = sorted({(e[0], e[1]) for e in entries})
            conn.executemany(q(_SET_HIGH_WATERMARK), [(hw[tp], tp[0], tp[1]) for tp in advanced])
            entries.sort(key=lambda e: (e[0], e[1], e[2]))  # B-tree order: fewer page splits
            conn.executemany(q(_INSERT_ENTRY), entries)
            if claimed:
                self._store_request_keys(conn, claimed)
            for sql, params in txn_steps:
                conn.execute(q(sql), params)
            if atomic and (unwritten or any(r.error is not None for r in batch)):
                # Roll the whole transaction back: none of them, as one of them failed.
                raise _NotAll(next((r.error for r in batch if r.error is not None), None))
            if changed:
                conn.executemany(
                    q(_UPSERT_PRODUCER_STATE),
                    [
                        (pid, topic_id, partition, st.epoch, st.to_json(), now)
                        for (pid, topic_id, partition) in sorted(changed)
                        if (st := producers[(pid, topic_id, partition)]) is not None
                    ],
                )
        for r, bases in answers:
            r.bases = bases
        return unwritten

    def _producer_states(
        self, conn: Any, batch: list[PendingCommit]
    ) -> dict[tuple[int, bytes, int], ProducerPartitionState | None]:
        """The stored state of every (producer, partition) the batch's idempotent
        batches touch (the partition rows are locked: their producer state too)."""
        keys = sorted(
            {
                (b.producer_id, bytes(c.topic_id), c.partition)
                for r in batch
                for c in r.chunks
                for b in c.producer_batches
            }
        )
        rows = fetch_each(conn, self._q(_PRODUCER_STATE), keys) if keys else []
        return {
            key: None if row is None else ProducerPartitionState.from_row(*row)
            for key, row in zip(keys, rows, strict=True)
        }

    def _purge_request_keys(self) -> None:
        """Delete expired idempotency keys, at most every REQUEST_KEY_PURGE_S seconds
        (in its own transaction: never holding a commit's locks longer)."""
        now = clock.now()
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

    def _claim_request_keys(
        self,
        conn: Any,
        r: PendingCommit,
        bases: list[int],
        claimed: dict[tuple[bytes, str], tuple[RequestKey, list[tuple[int, int, int]]]],
    ) -> dict[tuple[bytes, str], tuple[RequestKey, list[tuple[int, int, int]]]]:
        """The REST idempotency keys of one commit with the offsets its records get.

        Raises:
            ProducerConflictError: a key is live in the store, or claimed by another
                commit of this batch: the same request committed meanwhile through
                another agent (or another request under the key); this commit writes
                nothing and the agent's retry answers it.
        """
        keys: dict[tuple[bytes, str], tuple[RequestKey, list[tuple[int, int, int]]]] = {}
        for c, base in zip(r.chunks, bases, strict=True):
            for k in c.request_keys:
                part = (c.partition, base + k.relative_offset, k.record_count)
                keys.setdefault((bytes(c.topic_id), k.key), (k, []))[1].append(part)
        for (topic_id, name), (k, _) in sorted(keys.items()):
            # Live as the store judges it: not expired when this request was made.
            live = conn.execute(self._q(_REQUEST_KEY), (topic_id, name, k.created_ms)).fetchone()
            if live is not None or (topic_id, name) in claimed:
                raise ProducerConflictError(
                    f"Idempotency key {name!r} of topic id {format_topic_id(topic_id)} was "
                    "stored by another commit meanwhile; nothing was stored, retry."
                )
        return keys

    def _store_request_keys(
        self,
        conn: Any,
        claimed: dict[tuple[bytes, str], tuple[RequestKey, list[tuple[int, int, int]]]],
    ) -> None:
        """Store the batch's claimed keys with their offsets.

        Raises:
            ProducerConflictError: another transaction stored one of them since
                ``_claim_request_keys`` looked; the whole batch rolls back (and the
                group committer runs its commits one by one).
        """
        rows = fetch_each(
            conn,
            self._q(_STORE_REQUEST_KEY),
            [
                (
                    topic_id,
                    name,
                    k.digest,
                    k.created_ms,
                    k.expires_ms,
                    StoredKey(k.digest, k.created_ms, tuple(sorted(parts)), k.partitions).to_json(),
                )
                for (topic_id, name), (k, parts) in sorted(claimed.items())
            ],
        )
        if any(row is None for row in rows):
            raise ProducerConflictError(
                "An idempotency key was stored by another commit meanwhile; nothing was "
                "stored, retry."
            )

    @staticmethod
    def _judge_producers(
        chunks: Sequence[ChunkCommit],
        bases: list[int],
        states: Mapping[tuple[int, bytes, int], ProducerPartitionState | None],
    ) -> dict[tuple[int, bytes, int], ProducerPartitionState]:
        """Judge one commit's idempotent batches against ``states`` (left unchanged).

        Returns:
            The new state of every (producer, partition) the commit touches.

        Raises:
            ProducerConflictError: a batch is not the next of its producer (a duplicate,
                out of order, or fenced by what another commit stored since the agent
                looked); the commit writes nothing.
        """
        out: dict[tuple[int, bytes, int], ProducerPartitionState] = {}
        for c, base in zip(chunks, bases, strict=True):
            for b in c.producer_batches:
                key = (b.producer_id, bytes(c.topic_id), c.partition)
                state = out.get(key)
                if state is None and (stored := states.get(key)) is not None:
                    state = ProducerPartitionState(stored.epoch, list(stored.batches))
                verdict, _ = judge(state, b)
                if verdict is not Verdict.APPEND:
                    raise ProducerConflictError(
                        f"Producer {b.producer_id} batch at sequence {b.base_sequence} for "
                        f"partition {c.partition} of topic id {format_topic_id(c.topic_id)} "
                        f"is {verdict.value} at commit; nothing was stored, retry."
                    )
                out[key] = remember(state, b, base + b.relative_offset)
        return out

    def _commit_batch_one_statement(self, batch: list[PendingCommit]) -> list[PendingCommit]:
        """``commit_batch`` on PostgreSQL: one statement (``_COMMIT_BATCH_PG``), its own
        transaction. Returns the requests that wrote nothing (see ``_commit_batch_steps``)."""
        db = cast("_AutocommitDatabase", self._db)
        chunks = [(n, c) for n, r in enumerate(batch, 1) for c in r.chunks]
        params = {
            "keys": [r.object_key for r in batch],
            "sizes": [-1 if r.size is None else r.size for r in batch],
            "reqs": [n for n, _ in chunks],
            "topic_ids": [bytes(c.topic_id) for _, c in chunks],
            "partitions": [c.partition for _, c in chunks],
            "counts": [c.record_count for _, c in chunks],
            "positions": [c.position for _, c in chunks],
            "lengths": [c.length for _, c in chunks],
            "min_ts": [c.min_timestamp_ms for _, c in chunks],
            "max_ts": [c.max_timestamp_ms for _, c in chunks],
            "now": clock.now(),
        }
        with db.autocommit() as conn:
            # Big batches are planned at each run: a prepared (generic) plan cannot see the
            # array sizes and joins them in nested loops, quadratic in the chunks
            # (measured: 1,000 chunks 470 ms instead of 60 ms). Small ones reuse the
            # prepared plan: planning costs about a millisecond, more than they do.
            prepare = None if len(chunks) <= _PREPARED_CHUNKS else False
            _complete, written, bases = conn.execute(
                _COMMIT_BATCH_PG, params, prepare=prepare
            ).fetchone()
        new = set(written)
        unwritten = []
        offsets = iter(bases)
        for n, r in enumerate(batch, 1):
            if n in new:
                r.bases = [int(next(offsets)) for _ in r.chunks]
            else:
                unwritten.append(r)
        if next(offsets, None) is not None:  # impossible while the rows are locked
            raise MetadataError("a batch commit returned more offsets than its chunks")
        return unwritten

    def _resolve_unwritten(self, unwritten: list[PendingCommit]) -> list[PendingCommit]:
        """Answer the requests that wrote nothing: a retry gets the first commit's
        offsets (or CommitConflictError), a missing partition its not-found error.

        Returns:
            The requests to run again: their key is free and their partitions exist
            (the object was collected, or the partition created, meanwhile).
        """
        again = []
        with self._db.read() as conn:
            for r in unwritten:
                if r.done:
                    continue
                found = conn.execute(self._q(_OBJECT_EXISTS), (r.object_key,)).fetchone()
                if found is not None and found[0] is not None:
                    r.error = ObjectDeletedError(
                        f"Object {r.object_key!r} was deleted by garbage collection (its "
                        "upload outlived the grace period without a live write lease); "
                        "nothing was committed: upload the records again."
                    )
                    continue
                if found is not None:
                    try:
                        r.bases = self._retried_commit(conn, r.object_key, r.chunks)
                    except CommitConflictError as e:
                        r.error = e
                    continue
                present = self._high_watermarks(conn, r.chunks, lock=False)
                missing = sorted(
                    (bytes(c.topic_id), c.partition)
                    for c in r.chunks
                    if (c.topic_id, c.partition) not in present
                )
                if missing:
                    r.error = self._missing_partition(conn, *missing[0])
                else:
                    again.append(r)
        return again

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
        """Log-start offset and high watermark (and the topic's id). Raises
        Topic/PartitionNotFoundError."""
        with self._db.read() as conn:
            topic_id, log_start, high_watermark = self._partition_state(conn, topic, partition)
        return PartitionOffsets(log_start, high_watermark, bytes(topic_id))

    def offsets_many(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, PartitionOffsets]:
        """Log-start offset and high watermark of many partitions from one read snapshot;
        partitions of unknown topics, or past a topic's count, are left out."""
        wanted = {TopicPartition(tp[0], tp[1]) for tp in partitions}
        names = sorted({tp.topic for tp in wanted})
        out: dict[TopicPartition, PartitionOffsets] = {}
        with self._db.read() as conn:
            rows = rows_in(conn, self._q, _OFFSETS_OF_TOPICS, names)
            for name, partition, log_start, high_watermark, topic_id in rows:
                tp = TopicPartition(name, partition)
                if tp in wanted:
                    out[tp] = PartitionOffsets(log_start, high_watermark, bytes(topic_id))
        return out

    def lookup(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_chunks: int = 16,
        *,
        topic_id: bytes | None = None,
    ) -> list[ChunkRef]:
        """Index entries from the one holding ``offset`` on, in offset order.

        At most ``max_chunks``; empty when ``offset`` >= high watermark; an offset
        below log-start reads from log-start. With ``topic_id``, only of that topic:
        a name that now belongs to another (deleted and created again) is not found.

        Raises:
            TopicNotFoundError, PartitionNotFoundError; IndexHoleError (see
            ``lookup_entries``); ValueError if ``max_chunks`` < 1.
        """
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, not {max_chunks}")
        with self._db.read() as conn:
            found, log_start, high_watermark = self._partition_state(conn, topic, partition)
            check_topic_id(topic, topic_id, bytes(found))
            where = (found, partition, log_start, high_watermark)
            return lookup_entries(conn, self._q, where, offset, max_chunks)

    def lookup_many(
        self, wants: Sequence[IndexWant], max_chunks: int = 16
    ) -> dict[int, list[ChunkRef]]:
        """``lookup`` of each want, in one snapshot; those that fail or find nothing are
        left out (``Coordinator.lookup_many``)."""
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, not {max_chunks}")
        out: dict[int, list[ChunkRef]] = {}
        with self._db.read() as conn:
            for i, want in enumerate(wants):
                try:
                    found, log_start, high_watermark = self._partition_state(
                        conn, want.topic, want.partition
                    )
                    check_topic_id(want.topic, want.topic_id, bytes(found))
                    where = (found, want.partition, log_start, high_watermark)
                    refs = lookup_entries(conn, self._q, where, want.offset, max_chunks)
                except LakelogError:
                    continue
                if refs:
                    out[i] = refs
        return out

    def lookup_timestamp(
        self, topic: str, partition: int, timestamp_ms: int, from_offset: int = 0
    ) -> ChunkRef | None:
        """The first entry (by offset, from the one holding ``max(from_offset, log-start)``)
        whose max timestamp is >= ``timestamp_ms``.

        Timestamps need not grow with offsets (CreateTime), so this scans the
        partition's entries in offset order; SQLite does that at millions of rows
        per second.

        Raises:
            TopicNotFoundError, PartitionNotFoundError.
        """
        with self._db.read() as conn:
            topic_id, log_start, high_watermark = self._partition_state(conn, topic, partition)
            where = (topic_id, partition, log_start, high_watermark)
            return lookup_timestamp_entry(conn, self._q, where, timestamp_ms, from_offset)

    def committed_object_keys(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are committed objects (for orphan detection)."""
        with self._db.read() as conn:
            return self._keys_in(conn, _OBJECTS_IN, list(dict.fromkeys(keys)), ())

    # -- pending uploads ------------------------------------------------------
    def keep_pending(
        self, lease_id: str, keys: Sequence[str], ttl_s: float, *, principal: str | None = None
    ) -> set[str]:
        """Register uploads (``keys``, before their PUT) under a writer's lease and extend
        the lease to ``ttl_s`` from now; with no keys, only extend it. Garbage collection
        leaves a key alone while its lease lives (``pending_object_keys``).

        Args:
            principal: the user calling (a Spark job's credential): a new lease is its
                own, and it may touch only its own leases and the keys under them. None:
                a trusted caller (an agent, or no authentication), which may touch all.

        Returns:
            The lease's keys (of ``keys``) that garbage collection deleted already:
            their commit would fail (``ObjectDeletedError``), so the writer may stop early.

        Raises:
            ValueError: a lease id empty or longer than MAX_LEASE_ID, or ``ttl_s`` not in
                (0, MAX_LEASE_S].
            AuthorizationError: the lease, or a key's current lease, is another
                principal's (nothing is changed).
        """
        if not isinstance(lease_id, str) or not 0 < len(lease_id) <= MAX_LEASE_ID:
            raise ValueError(f"lease_id must be a string of 1 to {MAX_LEASE_ID} characters")
        if not 0 < ttl_s <= MAX_LEASE_S:
            raise ValueError(f"ttl_s must be in (0, {MAX_LEASE_S:.0f}], not {ttl_s}")
        now = clock.now()
        wanted = list(dict.fromkeys(keys))
        trusted = int(principal is None)
        owner = principal or ""
        with self._db.write(exclusive=False) as conn:
            taken = conn.execute(
                self._q(_UPSERT_LEASE), (lease_id, now + ttl_s, owner, trusted)
            ).fetchone()
            if taken is None:
                raise AuthorizationError(
                    f"{principal} may not use write lease {lease_id!r}: another principal took it"
                )
            added = fetch_each(
                conn,
                self._q(_ADD_PENDING),
                [(k, lease_id, now, trusted, owner) for k in wanted],
            )
            refused = [k for k, row in zip(wanted, added, strict=True) if row is None]
            if refused:
                raise AuthorizationError(
                    f"{principal} may not register {refused[0]!r}: it is pending under "
                    "another principal's write lease"
                )
            return self._keys_in(conn, _DELETED_IN, wanted, ())

    def release_pending(self, lease_id: str, *, principal: str | None = None) -> None:
        """Drop a writer's lease and its pending keys (its job committed or gave up):
        uncommitted keys become ordinary orphans for garbage collection.

        Raises:
            AuthorizationError: ``principal`` (a user; None: a trusted caller, see
                ``keep_pending``) did not take the lease (nothing is changed).
        """
        with self._db.write(exclusive=False) as conn:
            row = conn.execute(self._q(_LEASE_PRINCIPAL), (lease_id,)).fetchone()
            if principal is not None and row is not None and row[0] != principal:
                raise AuthorizationError(
                    f"{principal} may not release write lease {lease_id!r}: another "
                    "principal took it"
                )
            conn.execute(self._q(_RELEASE_PENDING), (lease_id,))
            conn.execute(self._q(_RELEASE_LEASE), (lease_id,))

    def pending_object_keys(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are uploads under a live write lease (not orphans)."""
        with self._db.read() as conn:
            return self._keys_in(conn, _PENDING_IN, list(dict.fromkeys(keys)), (clock.now(),))

    def _keys_in(
        self, conn: Any, template: str, keys: list[str], before: tuple[Any, ...]
    ) -> set[str]:
        return {str(k) for (k,) in rows_in(conn, self._q, template, keys, before)}

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
        target = delete_records_target(topic, partition, offset, log_start, high_watermark)
        if target is None:
            return log_start
        moved = Catalog(self._db).advance_log_start(topic_id, partition, target, clock.now())
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
            row = conn.execute(self._q(_NEW_PRODUCER), (clock.now(),)).fetchone()
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
        now = clock.now()
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
            rows = conn.execute(self._q(_LIVE_AGENTS), (clock.now() - max_age_s,)).fetchall()
        return [AgentInfo(*row) for row in rows]
