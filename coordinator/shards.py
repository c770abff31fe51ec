"""Partitions sharded over several metadata databases (issue 13, "scale past one database").

One **catalog** database (``--db``) keeps what is not per partition: topics, configs,
consumer groups, producers' ids, agents, users and ACLs, schemas, janitor leases, the
list of shards (``shards``) and which shard owns each partition (``partition_shards``).
Each **shard** database (``--db-shard``, repeatable) keeps the data path of the
partitions it owns: the partition rows (log-start, high watermark), the index entries,
the objects they reference, idempotent producers' state and REST idempotency keys.
Every database gets the same migrations (``coordinator.db``); tables a role does not
use stay empty.

- **Identity.** A shard is known by an id stored in the shard database itself
  (``meta``: ``shard_id``, and ``role`` = ``shard``; the catalog has ``role`` =
  ``catalog``), never by its URL (which may carry a password). A fresh shard database
  gets a new id and is added to the catalog's ``shards``; at start every configured
  URL must lead to a shard of this cluster (its ``meta`` cluster id is the catalog's)
  that the catalog lists, and every shard the catalog lists must be configured: a
  misconfigured URL is refused, naming what it found.
- **Placement.** A new partition (topic creation, added partitions) goes to the shard
  with the highest rendezvous hash of (shard id, topic id, partition) among the shards
  attached at that moment, and that choice is stored in the catalog in the same
  transaction as the topic: attaching a shard later moves nothing (new partitions
  spread over all shards). The partition row in the shard is created right after (and
  again, lazily, if the shard was unreachable then).
- **Commits.** A segment object's chunks are split by shard and committed in each
  shard (each its own transaction and its own group commit; several shards in
  parallel). Every shard that takes chunks of an object keeps its own ``objects`` row
  for it. When some shards commit and others fail, the caller gets
  ``PartialCommitError`` with the offsets of the chunks that were committed: the agent
  answers the requests whose partitions all committed and fails the others
  (retriably). Sending the same commit again is safe, as on one database.
- **Unavailable shards.** A shard that fails with a retriable error is marked down;
  calls that need it fail at once (``CoordinatorUnavailableError``) instead of
  waiting for its pool, and a background probe marks it up again when it answers.
  Partitions of other shards are untouched: commits go on, and consumers already
  positioned keep reading them (``coordinator.groups.store`` keeps the positions on a
  down shard's partitions; ``service.v2.consumers.read_round_robin`` skips them).
  ``offsets_many`` raises rather than leave such partitions out (callers would take
  them for deleted).
- **Garbage collection** asks every shard: an object is deleted only when no shard
  has a row for it, and a shard that cannot answer stops the round before anything is
  deleted (``ShardedCatalog``). Deleted topics' rows left in a shard that was down
  when the topic was deleted are purged by the next run.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from coordinator import clock
from coordinator.api import forward
from coordinator.client import (
    ChunkCommit,
    ChunkRef,
    Coordinator,
    IndexWant,
    PartitionOffsets,
    TopicInfo,
    TopicPartition,
)
from coordinator.db import POSTGRESQL, MetadataDatabase, open_database, rows_in
from coordinator.iceberg.changes import PURGE_TABLE_FILES, TableFiles
from coordinator.janitors.catalog import Catalog, PartitionState
from coordinator.log.group_commit import GroupCommitStats
from coordinator.log.producers import ProducerPartitionState, StoredKey
from coordinator.log.store import (
    LOCK_TOPIC_PARTITIONS_PG,
    MetadataStore,
    check_chunks,
    check_topic_id,
    delete_records_target,
    format_topic_id,
    lookup_entries,
    lookup_timestamp_entry,
)
from coordinator.log.topic_configs import topic_defaults
from segments.errors import (
    CoordinatorUnavailableError,
    InternalError,
    InvalidBatchError,
    LakelogError,
    MetadataError,
    PartialCommitError,
    PartitionNotFoundError,
    TopicNotFoundError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
_P = ParamSpec("_P")

#: Seconds between probes of a shard marked down.
PROBE_INTERVAL_S = 0.5

_META_GET = "SELECT value FROM meta WHERE key = ?"
_META_PUT = "INSERT INTO meta (key, value) VALUES (?, ?)"
_SHARD_IDS = "SELECT shard_id FROM shards ORDER BY shard_id"
_ADD_SHARD = "INSERT INTO shards (shard_id, added_at) VALUES (?, ?) ON CONFLICT DO NOTHING"
_ASSIGN = "INSERT INTO partition_shards (topic_id, partition, shard_id) VALUES (?, ?, ?)"
_FORGET = "DELETE FROM partition_shards WHERE topic_id = ?"
_ASSIGNED = "SELECT partition, shard_id FROM partition_shards WHERE topic_id = ?"
_ALL_ASSIGNED = "SELECT topic_id, partition, shard_id FROM partition_shards"
_LOCAL_PARTITIONS = "SELECT COUNT(*) FROM partitions"
_TOPIC_BY_NAME = "SELECT topic_id, partition_count FROM topics WHERE name = ?"
_TOPICS_BY_NAMES = "SELECT name, topic_id FROM topics WHERE name IN ({marks})"
_TOPIC_IDS = "SELECT topic_id, name FROM topics"
_TOPIC_EXISTS = "SELECT 1 FROM topics WHERE topic_id = ?"
_CLUSTER_CONFIGS = "SELECT name, value FROM cluster_configs"
_CONFIGS = "SELECT topic_id, name, value FROM topic_configs"

# In a shard. A partition row references a topic row (a foreign key): each topic with
# partitions in a shard has a stand-in row there, named '#' + its id in hex (topic names
# never start with '#'), never read by name.
_ENSURE_TOPIC = (
    "INSERT INTO topics (topic_id, name, partition_count, created_at) VALUES (?, ?, 1, ?) "
    "ON CONFLICT (topic_id) DO NOTHING"
)
_ENSURE_PARTITION = (
    "INSERT INTO partitions (topic_id, partition, log_start_offset, high_watermark) "
    "VALUES (?, ?, 0, 0) ON CONFLICT (topic_id, partition) DO NOTHING"
)
_BOUNDS = (
    "SELECT log_start_offset, high_watermark FROM partitions WHERE topic_id = ? AND partition = ?"
)
_TOPIC_BOUNDS = (
    "SELECT partition, log_start_offset, high_watermark FROM partitions WHERE topic_id = ?"
)
_SHARD_PARTITIONS = "SELECT topic_id, partition, log_start_offset, high_watermark FROM partitions"
_SHARD_TOPIC_IDS = "SELECT topic_id FROM topics"
_PURGE_TOPIC = (
    *PURGE_TABLE_FILES,
    "DELETE FROM index_entries WHERE topic_id = ?",
    "DELETE FROM producer_state WHERE topic_id = ?",
    "DELETE FROM idempotency_keys WHERE topic_id = ?",
    "DELETE FROM open_txns WHERE topic_id = ?",
    "DELETE FROM aborted_txns WHERE topic_id = ?",
    "DELETE FROM partitions WHERE topic_id = ?",
    "DELETE FROM topics WHERE topic_id = ?",
)
_OBJECTS_IN = "SELECT object_key FROM objects WHERE deleted_at IS NULL AND object_key IN ({marks})"
_PRODUCER_STATE = (
    "SELECT epoch, batches FROM producer_state "
    "WHERE producer_id = ? AND topic_id = ? AND partition = ?"
)
_REQUEST_KEY = (
    "SELECT digest, created_ms, parts FROM idempotency_keys "
    "WHERE topic_id = ? AND request_key = ? AND expires_ms >= ?"
)


def rendezvous(shard_ids: Sequence[str], topic_id: bytes, partition: int) -> str:
    """The shard of ``shard_ids`` that a new partition goes to: highest random weight
    (rendezvous hashing). Adding a shard moves only the partitions it wins, and ids
    alone decide (not their order)."""
    if not shard_ids:
        raise ValueError("no shards to place a partition on")
    key = bytes(topic_id) + partition.to_bytes(4, "big")

    def weight(shard_id: str) -> tuple[bytes, str]:
        digest = hashlib.blake2b(key, digest_size=8, key=shard_id.encode()[:64]).digest()
        return digest, shard_id

    return max(shard_ids, key=weight)


def _meta(conn: Any, q: Callable[[str], str], key: str) -> str | None:
    row = conn.execute(q(_META_GET), (key,)).fetchone()
    return None if row is None else str(row[0])


class _Health:
    """Up or down: a shard that failed retriably is down until a probe gets an answer."""

    def __init__(self, shard: Shard) -> None:
        self._shard = shard
        self._lock = threading.Lock()
        self.cause: str | None = None
        self._probing = False
        self.closed = False

    def check(self) -> None:
        cause = self.cause
        if cause is not None:
            raise CoordinatorUnavailableError(
                f"metadata shard {self._shard.shard_id} ({self._shard.db.location}) is "
                f"unavailable: {cause}"
            )

    def failed(self, exc: Exception) -> None:
        with self._lock:
            self.cause = str(exc)
            if self._probing or self.closed:
                return
            self._probing = True
        log.warning("metadata shard %s is down: %s", self._shard.shard_id, exc)
        threading.Thread(
            target=self._probe, name=f"lakelog-shard-probe-{self._shard.shard_id}", daemon=True
        ).start()

    def _probe(self) -> None:
        try:
            while not self.closed:
                time.sleep(PROBE_INTERVAL_S)
                try:
                    with self._shard.db.read() as conn:
                        conn.execute("SELECT 1").fetchone()
                except Exception as e:  # still down
                    self.cause = str(e)
                    continue
                except BaseException:
                    return
                self.cause = None
                log.warning("metadata shard %s is up again", self._shard.shard_id)
                return
        finally:
            with self._lock:
                self._probing = False


@dataclass(eq=False)
class Shard:
    """One shard database: its id, its connection pool, its store (group commit)."""

    shard_id: str
    db: MetadataDatabase
    store: MetadataStore
    health: _Health = field(init=False)

    def __post_init__(self) -> None:
        self.health = _Health(self)

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` against this shard, failing fast while it is down."""
        self.health.check()
        try:
            return fn()
        except PartialCommitError:
            raise
        except CoordinatorUnavailableError as e:
            if is_outage(e):
                self.health.failed(e)
            raise

    def read(self, fn: Callable[[Any], T]) -> T:
        def run() -> T:
            with self.db.read() as conn:
                return fn(conn)

        return self.call(run)

    def write(self, fn: Callable[[Any], T]) -> T:
        def run() -> T:
            with self.db.write(exclusive=False) as conn:
                return fn(conn)

        return self.call(run)

    def q(self, sql: str) -> str:
        return self.db.dialect.sql(sql)

    def catalog(self) -> Catalog:
        """The janitors' SQL on this shard."""
        return Catalog(self.db)


def _one(sql: str, params: Sequence[Any]) -> Callable[[Any], Any]:
    return lambda conn: conn.execute(sql, params).fetchone()


def _all(sql: str, params: Sequence[Any] = ()) -> Callable[[Any], list[Any]]:
    return lambda conn: list(conn.execute(sql, params).fetchall())


#: SQLSTATE classes of a server that is gone or refusing: connection exceptions (08),
#: operator intervention (57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot
#: connect now).
_OUTAGE_STATES = ("08", "57P")


def is_outage(exc: BaseException) -> bool:
    """Whether a retriable failure means the database is unreachable (mark the shard
    down) rather than a transaction lost a race (a deadlock or serialization victim, a
    lock or statement timeout: the shard is fine)."""
    cause = exc.__cause__
    if cause is None:
        return False
    if type(cause).__name__ == "PoolTimeout":  # no connection could be had
        return True
    sqlstate = getattr(cause, "sqlstate", None)
    if type(cause).__module__.startswith("psycopg"):
        return sqlstate is None or sqlstate.startswith(_OUTAGE_STATES)
    return False


class ShardConfigError(ValueError):
    """A shard URL that leads to no shard of this cluster, or a shard left out."""


def open_shards(
    catalog: MetadataDatabase,
    cluster_id: str,
    urls: Sequence[str],
    *,
    timeout_s: float | None = None,
) -> list[Shard]:
    """Open, migrate and identify the shard databases at ``urls`` (see the module doc).

    Raises:
        ShardConfigError: a URL given twice, the catalog itself, a database of another
            cluster or one the catalog does not list, a listed shard not given, or a
            catalog holding partitions from before sharding.
        CoordinatorUnavailableError: a database cannot be opened.
    """
    q = catalog.dialect.sql
    with catalog.write() as conn:
        role = _meta(conn, q, "role")
        if role == "shard":
            raise ShardConfigError(
                f"{catalog.location} is a shard database, not a catalog: pass it as --db-shard"
            )
        if role is None:
            if conn.execute(q(_LOCAL_PARTITIONS)).fetchone()[0]:
                raise ShardConfigError(
                    f"the catalog {catalog.location} holds partitions of its own (created "
                    "without shards); sharding an existing single-database cluster is not "
                    "supported: start a new cluster with --db-shard"
                )
            conn.execute(q(_META_PUT), ("role", "catalog"))
    shards: list[Shard] = []
    try:
        for url in urls:
            db = open_database(url, timeout_s=timeout_s)
            try:
                shards.append(_identify(catalog, db, cluster_id))
            except BaseException:
                db.close()
                raise
        ids = [s.shard_id for s in shards]
        if len(set(ids)) != len(ids):
            raise ShardConfigError(f"a shard database is given twice (shard ids {ids})")
        with catalog.read() as conn:
            listed = [str(r[0]) for r in conn.execute(q(_SHARD_IDS))]
        missing = sorted(set(listed) - set(ids))
        if missing:
            raise ShardConfigError(
                f"the catalog {catalog.location} has shards {missing} that no --db-shard "
                f"leads to (given: {sorted(ids)}); their partitions would be unreachable"
            )
    except BaseException:
        for s in shards:
            s.db.close()
        raise
    return shards


def check_unsharded(db: MetadataDatabase) -> None:
    """Refuse to use a catalog, or a shard, as a database of its own (without shards its
    partitions are nowhere; a shard's rows are a fragment).

    Raises:
        ShardConfigError: ``db`` is a catalog or a shard.
    """
    with db.read() as conn:
        role = _meta(conn, db.dialect.sql, "role")
    if role == "catalog":
        raise ShardConfigError(
            f"{db.location} is the catalog of sharded metadata: give its shards too "
            "(--db-shard, LAKELOG_DB_SHARDS)"
        )
    if role == "shard":
        raise ShardConfigError(
            f"{db.location} is a shard database, not a catalog: pass it as --db-shard "
            "and the catalog as --db"
        )


def _identify(catalog: MetadataDatabase, db: MetadataDatabase, cluster_id: str) -> Shard:
    q = db.dialect.sql
    with db.write() as conn:
        role = _meta(conn, q, "role")
        stored_cluster = _meta(conn, q, "cluster_id")
        shard_id = _meta(conn, q, "shard_id")
        if role == "catalog" or (role is None and stored_cluster is not None):
            raise ShardConfigError(
                f"{db.location} is a catalog (or single) database, not a shard; pass it as --db"
            )
        if stored_cluster is not None and stored_cluster != cluster_id:
            raise ShardConfigError(
                f"shard database {db.location} belongs to cluster {stored_cluster!r}, not "
                f"{cluster_id!r}"
            )
        fresh = shard_id is None
        if fresh:
            shard_id = f"shard-{uuid.uuid4().hex[:12]}"
            conn.execute(q(_META_PUT), ("role", "shard"))
            conn.execute(q(_META_PUT), ("shard_id", shard_id))
    assert shard_id is not None
    cq = catalog.dialect.sql
    with catalog.write() as conn:
        known = conn.execute(cq("SELECT 1 FROM shards WHERE shard_id = ?"), (shard_id,))
        if fresh:
            conn.execute(cq(_ADD_SHARD), (shard_id, clock.now()))
        elif known.fetchone() is None:
            raise ShardConfigError(
                f"shard database {db.location} is shard {shard_id}, which the catalog "
                f"{catalog.location} does not list: a shard of another catalog?"
            )
    return Shard(shard_id, db, MetadataStore(db, cluster_id=cluster_id))


class _Placement:
    """The catalog's side of placement: rendezvous over the shards this process has
    attached (at start, exactly the catalog's list), stored with the topic."""

    def __init__(self, shard_ids: Callable[[], list[str]], dialect_sql: Callable[[str], str]):
        self._shard_ids = shard_ids
        self._q = dialect_sql

    def assign(self, conn: Any, topic_id: bytes, partitions: range) -> None:
        ids = self._shard_ids()
        conn.executemany(
            self._q(_ASSIGN), [(topic_id, p, rendezvous(ids, topic_id, p)) for p in partitions]
        )

    def forget(self, conn: Any, topic_id: bytes) -> None:
        conn.execute(self._q(_FORGET), (topic_id,))


class _SummedStats:
    def __init__(self, shards: Sequence[Shard]) -> None:
        self._shards = shards

    def __call__(self) -> GroupCommitStats:
        out = GroupCommitStats()
        for s in self._shards:
            st = s.store.group_commit_stats
            out.batches += st.batches
            out.requests += st.requests
            out.chunks += st.chunks
            out.solo_reruns += st.solo_reruns
            out.largest_batch = max(out.largest_batch, st.largest_batch)
        return out


class ShardedStore:
    """The ``Coordinator`` protocol over a catalog and shard databases (module doc).

    Thread-safe. Catalog calls go to a ``MetadataStore`` on the catalog; calls on a
    partition go to its shard; calls on objects ask every shard.
    """

    def __init__(
        self, catalog: MetadataDatabase, shards: Sequence[Shard], *, cluster_id: str | None
    ) -> None:
        self._db = catalog
        self._q = catalog.dialect.sql
        self.shards = list(shards)
        self._by_id = {s.shard_id: s for s in self.shards}
        self._placement = _Placement(lambda: list(self._by_id), self._q)
        self._catalog = MetadataStore(catalog, cluster_id=cluster_id, placement=self._placement)
        self._where: dict[tuple[bytes, int], str] = {}
        self._where_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=max(4, 8 * len(self.shards)), thread_name_prefix="lakelog-shard"
        )
        self.group_commit_stats = _SummedStats(self.shards)

    @property
    def catalog(self) -> MetadataStore:
        return self._catalog

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for s in self.shards:
            s.health.closed = True
            s.db.close()

    # Operations the catalog alone serves are forwarded to it (``coordinator.api.forward``);
    # those of partitions are routed to the partitions' shards below.
    cluster_id = forward("_catalog", MetadataStore.cluster_id)

    # -- routing ----------------------------------------------------------------
    def shard_of(self, topic_id: bytes, partition: int, conn: Any = None) -> Shard:
        """The shard owning a partition (by id); ``conn``: a catalog connection to read
        with (else one of its own, when the placement is not cached yet).

        Raises:
            TopicNotFoundError, PartitionNotFoundError.
        """
        key = (bytes(topic_id), partition)
        shard_id = self._where.get(key)
        if shard_id is None:
            if conn is None:
                with self._db.read() as own:
                    return self.shard_of(topic_id, partition, own)
            rows = conn.execute(self._q(_ASSIGNED), (key[0],)).fetchall()
            if not rows or key[1] not in {p for p, _ in rows}:
                if conn.execute(self._q(_TOPIC_EXISTS), (key[0],)).fetchone() is None:
                    raise TopicNotFoundError(f"Topic with id {format_topic_id(key[0])} not found.")
                raise PartitionNotFoundError(
                    f"Partition {partition} of topic id {format_topic_id(key[0])} not found."
                )
            with self._where_lock:
                self._where.update(((key[0], p), str(s)) for p, s in rows)
            shard_id = self._where[key]
        shard = self._by_id.get(shard_id)
        if shard is None:  # a shard attached by another coordinator since this one started
            raise CoordinatorUnavailableError(
                f"partition {partition} of topic id {format_topic_id(bytes(topic_id))} is on "
                f"shard {shard_id}, which this coordinator was not started with: restart it "
                "with every shard's --db-shard"
            )
        return shard

    def _resolve(self, topic: str, partition: int) -> tuple[bytes, Shard]:
        with self._db.read() as conn:
            row = conn.execute(self._q(_TOPIC_BY_NAME), (topic,)).fetchone()
        if row is None:
            raise TopicNotFoundError(f"Topic '{topic}' not found.")
        topic_id, count = bytes(row[0]), int(row[1])
        if not 0 <= partition < count:
            raise PartitionNotFoundError(f"Partition {partition} of topic '{topic}' not found.")
        return topic_id, self.shard_of(topic_id, partition)

    def _ensure(self, shard: Shard, parts: Sequence[tuple[bytes, int]]) -> None:
        """Create partition rows in ``shard`` (idempotent), with their topics' stand-ins."""

        def ensure(conn: Any) -> None:
            now = clock.now()
            topics = sorted({t for t, _ in parts})
            conn.executemany(shard.q(_ENSURE_TOPIC), [(t, f"#{t.hex()}", now) for t in topics])
            conn.executemany(shard.q(_ENSURE_PARTITION), sorted(parts))

        shard.write(ensure)

    def _recheck(self, shard: Shard, parts: Sequence[tuple[bytes, int]]) -> None:
        """Partitions a shard does not have: forget their cached placement, ask the
        catalog again, and create their rows if they are still this shard's.

        Raises:
            TopicNotFoundError, PartitionNotFoundError: the catalog has them no more.
        """
        with self._where_lock:
            for key in {t for t, _ in parts}:
                for cached in [k for k in self._where if k[0] == key]:
                    del self._where[cached]
        mine = [(t, p) for t, p in parts if self.shard_of(t, p) is shard]
        if len(mine) != len(parts):  # impossible: placements never change
            raise MetadataError("a partition's shard changed")
        self._ensure(shard, mine)

    def _place(self, topic_id: bytes, partitions: range) -> None:
        """After the catalog placed new partitions: their rows in their shards (best
        effort: a shard that is down gets them lazily)."""
        by_shard: dict[str, list[tuple[bytes, int]]] = {}
        for p in partitions:
            by_shard.setdefault(self.shard_of(topic_id, p).shard_id, []).append((topic_id, p))
        for shard_id, parts in by_shard.items():
            try:
                self._ensure(self._by_id[shard_id], parts)
            except CoordinatorUnavailableError as e:
                log.warning("partition rows on shard %s postponed: %s", shard_id, e)

    def _bounds(self, topic_id: bytes, partition: int, shard: Shard) -> tuple[int, int]:
        def read(conn: Any) -> Any:
            return conn.execute(shard.q(_BOUNDS), (topic_id, partition)).fetchone()

        row = shard.read(read)
        if row is None:  # placed while the shard was down
            self._ensure(shard, [(topic_id, partition)])
            return 0, 0
        return int(row[0]), int(row[1])

    # -- topics (the catalog) ---------------------------------------------------
    def create_topic(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        info = self._catalog.create_topic(name, partitions, configs, validate_only=validate_only)
        if not validate_only:
            self._place(info.topic_id, range(info.partitions))
        return info

    get_topic = forward("_catalog", MetadataStore.get_topic)

    get_topic_by_id = forward("_catalog", MetadataStore.get_topic_by_id)

    list_topics = forward("_catalog", MetadataStore.list_topics)

    def delete_topic(self, name: str, *, topic_id: bytes | None = None) -> None:
        if topic_id is None:
            topic_id = self._catalog.get_topic(name).topic_id
        self._catalog.delete_topic(name, topic_id=topic_id)
        with self._where_lock:
            for key in [k for k in self._where if k[0] == topic_id]:
                del self._where[key]
        for shard in self.shards:
            try:
                purge_topic(shard, topic_id)
            except CoordinatorUnavailableError as e:  # the next gc run purges it
                log.warning("topic rows on shard %s left for gc: %s", shard.shard_id, e)

    def add_partitions(self, name: str, partitions: int) -> TopicInfo:
        before = self._catalog.get_topic(name).partitions
        info = self._catalog.add_partitions(name, partitions)
        self._place(info.topic_id, range(before, info.partitions))
        return info

    alter_configs = forward("_catalog", MetadataStore.alter_configs)

    broker_configs = forward("_catalog", MetadataStore.broker_configs)

    alter_broker_configs = forward("_catalog", MetadataStore.alter_broker_configs)

    # -- the log ----------------------------------------------------------------
    def commit(
        self, object_key: str, chunks: Sequence[ChunkCommit], *, size: int | None = None
    ) -> list[int]:
        """``MetadataStore.commit`` per shard (module doc).

        Raises:
            What ``MetadataStore.commit`` raises when every shard involved failed alike
            or a partition is unknown (nothing committed); PartialCommitError when some
            shards committed and others did not.
        """
        check_chunks(object_key, chunks)
        groups: dict[str, list[int]] = {}
        where, attached = self._where, self._by_id
        for i, c in enumerate(chunks):
            shard_id = where.get((c.topic_id, c.partition))  # placements once cached
            if shard_id is None or shard_id not in attached:
                shard_id = self.shard_of(c.topic_id, c.partition).shard_id
            groups.setdefault(shard_id, []).append(i)
        bases: list[int | None] = [None] * len(chunks)
        failures: list[LakelogError | None] = [None] * len(chunks)

        def run(shard_id: str, idx: list[int]) -> list[int]:
            shard = self._by_id[shard_id]
            part = [chunks[i] for i in idx]
            try:
                return shard.call(lambda: shard.store.commit_checked(object_key, part, size=size))
            except (TopicNotFoundError, PartitionNotFoundError):
                # Placed while the shard was down (its rows now, then once more), or the
                # topic was deleted since its placement was cached (raises).
                self._recheck(shard, [(bytes(c.topic_id), c.partition) for c in part])
                return shard.call(lambda: shard.store.commit_checked(object_key, part, size=size))

        items = list(groups.items())
        futures: list[Future[list[int]]] = [
            self._pool.submit(run, sid, idx) for sid, idx in items[1:]
        ]
        outcomes: list[list[int] | LakelogError] = []
        for n, (sid, idx) in enumerate(items):
            try:
                outcomes.append(run(sid, idx) if n == 0 else futures[n - 1].result())
            except LakelogError as e:
                outcomes.append(e)
            except Exception as e:  # a bug, not an outage: still wait for the other shards
                log.exception("commit of %r on shard %s failed", object_key, sid)
                outcomes.append(InternalError(f"shard {sid}: {type(e).__name__}"))
        errors = [o for o in outcomes if isinstance(o, LakelogError)]
        if errors and len(errors) == len(outcomes):
            raise errors[0]
        for (_, idx), outcome in zip(items, outcomes, strict=True):
            for k, i in enumerate(idx):
                if isinstance(outcome, LakelogError):
                    failures[i] = outcome
                else:
                    bases[i] = outcome[k]
        if errors:
            raise PartialCommitError(
                f"commit of {object_key!r}: {len(errors)} of {len(outcomes)} metadata shards "
                f"failed ({errors[0].message})",
                bases,
                failures,
            )
        return [b for b in bases if b is not None]

    def commit_atomic(
        self, objects: Sequence[tuple[str, Sequence[ChunkCommit]]]
    ) -> list[list[int]]:
        """``MetadataStore.commit_atomic`` in the one shard that holds every partition of
        the objects; InvalidBatchError when they lie in several (one transaction cannot
        span databases)."""
        shards = {
            self.shard_of(c.topic_id, c.partition).shard_id for _, chunks in objects for c in chunks
        }
        if len(shards) > 1:
            raise InvalidBatchError(
                f"An atomic commit of partitions in {len(shards)} metadata shards: one "
                "transaction cannot span them."
            )
        if not shards:
            return [[] for _ in objects]
        shard = self._by_id[shards.pop()]
        return shard.call(lambda: shard.store.commit_atomic(objects))

    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        topic_id, shard = self._resolve(topic, partition)
        return PartitionOffsets(*self._bounds(topic_id, partition, shard), topic_id)

    def offsets_many(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, PartitionOffsets]:
        """As ``MetadataStore.offsets_many``: one read per shard involved.

        Raises:
            CoordinatorUnavailableError: a shard holding some of them is down (callers
                that can do without those partitions ask for them one by one).
        """
        wanted = {TopicPartition(tp[0], tp[1]) for tp in partitions}
        ids = self._topic_ids(sorted({tp.topic for tp in wanted}))
        by_shard: dict[str, list[tuple[bytes, TopicPartition]]] = {}
        for tp in wanted:
            topic_id = ids.get(tp.topic)
            if topic_id is None:
                continue
            try:
                shard = self.shard_of(topic_id, tp.partition)
            except (TopicNotFoundError, PartitionNotFoundError):
                continue
            by_shard.setdefault(shard.shard_id, []).append((topic_id, tp))
        out: dict[TopicPartition, PartitionOffsets] = {}
        for shard_id, items in by_shard.items():
            shard = self._by_id[shard_id]
            topic_ids = sorted({t for t, _ in items})

            def read(conn: Any, shard: Shard = shard, topic_ids: list[bytes] = topic_ids) -> Any:
                return {
                    (topic_id, int(p)): (int(ls), int(hw))
                    for topic_id in topic_ids
                    for p, ls, hw in conn.execute(shard.q(_TOPIC_BOUNDS), (topic_id,))
                }

            found = shard.read(read)
            absent = []
            for topic_id, tp in items:
                bounds = found.get((topic_id, tp.partition))
                if bounds is None:  # placed while the shard was down: empty
                    absent.append((topic_id, tp.partition))
                    bounds = (0, 0)
                out[tp] = PartitionOffsets(bounds[0], bounds[1], topic_id)
            if absent:
                self._ensure(shard, absent)
        return out

    def _topic_ids(self, names: Sequence[str]) -> dict[str, bytes]:
        with self._db.read() as conn:
            return {str(n): bytes(t) for n, t in rows_in(conn, self._q, _TOPICS_BY_NAMES, names)}

    def topic_bounds(self, conn: Any, topic: str) -> dict[int, tuple[int, int]]:
        """(log-start, high watermark) of each partition of ``topic``, for the consumer
        groups' transactions: ``conn`` is theirs on the catalog (so no second catalog
        connection is needed while they hold one). Partitions of a shard that is down
        are left out; those placed while their shard was down (no row yet) get their row
        now and are empty."""
        row = conn.execute(self._q(_TOPIC_BY_NAME), (topic,)).fetchone()
        if row is None:
            return {}
        topic_id, count = bytes(row[0]), int(row[1])
        by_shard: dict[str, set[int]] = {}
        for p in range(count):
            by_shard.setdefault(self.shard_of(topic_id, p, conn).shard_id, set()).add(p)
        out: dict[int, tuple[int, int]] = {}
        for shard_id, mine in by_shard.items():
            shard = self._by_id[shard_id]
            try:
                rows = shard.read(_all(shard.q(_TOPIC_BOUNDS), (topic_id,)))
            except CoordinatorUnavailableError:
                continue
            out.update((int(p), (int(ls), int(hw))) for p, ls, hw in rows if int(p) in mine)
            unmade = sorted(p for p in mine if p not in out)
            if unmade:
                self._ensure(shard, [(topic_id, p) for p in unmade])
                out.update((p, (0, 0)) for p in unmade)
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
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, not {max_chunks}")
        wanted = topic_id
        topic_id, shard = self._resolve(topic, partition)
        check_topic_id(topic, wanted, topic_id)

        def read(conn: Any) -> list[ChunkRef] | None:  # one snapshot, one transaction
            bounds = conn.execute(shard.q(_BOUNDS), (topic_id, partition)).fetchone()
            if bounds is None:
                return None
            where = (topic_id, partition, int(bounds[0]), int(bounds[1]))
            return lookup_entries(conn, shard.q, where, offset, max_chunks)

        refs = shard.read(read)
        if refs is None:  # placed while the shard was down: empty
            self._ensure(shard, [(topic_id, partition)])
            return []
        return refs

    def lookup_many(
        self, wants: Sequence[IndexWant], max_chunks: int = 16
    ) -> dict[int, list[ChunkRef]]:
        """``lookup`` of each want, each in its shard's snapshot (one read per want: a
        shard that is down leaves its wants out, for their own lookups to report)."""
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, not {max_chunks}")
        out: dict[int, list[ChunkRef]] = {}
        for i, w in enumerate(wants):
            try:
                refs = self.lookup(w.topic, w.partition, w.offset, max_chunks, topic_id=w.topic_id)
            except LakelogError:
                continue
            if refs:
                out[i] = refs
        return out

    def lookup_timestamp(
        self, topic: str, partition: int, timestamp_ms: int, from_offset: int = 0
    ) -> ChunkRef | None:
        topic_id, shard = self._resolve(topic, partition)
        where = (topic_id, partition, *self._bounds(topic_id, partition, shard))
        return shard.read(
            lambda conn: lookup_timestamp_entry(conn, shard.q, where, timestamp_ms, from_offset)
        )

    def committed_object_keys(self, keys: Sequence[str]) -> set[str]:
        """Keys some shard has committed. Asks every shard.

        Raises:
            CoordinatorUnavailableError: a shard did not answer (so no key may be called
                uncommitted).
        """
        wanted = list(dict.fromkeys(keys))
        found: set[str] = set()
        for shard in self.shards:

            def read(conn: Any, shard: Shard = shard) -> set[str]:
                return {str(k) for (k,) in rows_in(conn, shard.q, _OBJECTS_IN, wanted)}

            found |= shard.read(read)
        return found

    def keep_pending(
        self, lease_id: str, keys: Sequence[str], ttl_s: float, *, principal: str | None = None
    ) -> set[str]:
        """Leases and pending keys live in the catalog (``MetadataStore.keep_pending``);
        a key some shard holds a tombstone of is answered as deleted."""
        self._catalog.keep_pending(lease_id, keys, ttl_s, principal=principal)
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return set()
        deleted: set[str] = set()
        for shard in self.shards:
            try:
                deleted |= shard.call(functools.partial(Catalog(shard.db).deleted_keys, wanted))
            except CoordinatorUnavailableError:  # the lease is renewed: that is what counts
                log.warning("keep_pending: shard %s did not say what was deleted", shard.shard_id)
        return deleted

    release_pending = forward("_catalog", MetadataStore.release_pending)

    pending_object_keys = forward("_catalog", MetadataStore.pending_object_keys)

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        topic_id, shard = self._resolve(topic, partition)
        log_start, high_watermark = self._bounds(topic_id, partition, shard)
        target = delete_records_target(topic, partition, offset, log_start, high_watermark)
        if target is None:
            return log_start
        moved = shard.call(
            lambda: Catalog(shard.db).advance_log_start(topic_id, partition, target, clock.now())
        )
        if moved is None:
            return self._bounds(topic_id, partition, shard)[0]
        return moved

    # -- idempotent producers ---------------------------------------------------
    init_producer_id = forward("_catalog", MetadataStore.init_producer_id)

    def producer_state(
        self, producer_id: int, partitions: Sequence[tuple[bytes, int]]
    ) -> dict[tuple[bytes, int], ProducerPartitionState]:
        by_shard: dict[str, list[tuple[bytes, int]]] = {}
        for topic_id, p in dict.fromkeys((bytes(t), p) for t, p in partitions):
            try:
                shard = self.shard_of(topic_id, p)
            except (TopicNotFoundError, PartitionNotFoundError):
                continue
            by_shard.setdefault(shard.shard_id, []).append((topic_id, p))
        out: dict[tuple[bytes, int], ProducerPartitionState] = {}
        for shard_id, parts in by_shard.items():
            shard = self._by_id[shard_id]

            def read(conn: Any, shard: Shard = shard, parts: list[Any] = parts) -> None:
                for topic_id, p in parts:
                    row = conn.execute(
                        shard.q(_PRODUCER_STATE), (producer_id, topic_id, p)
                    ).fetchone()
                    if row is not None:
                        out[(topic_id, p)] = ProducerPartitionState.from_row(*row)

            shard.read(read)
        return out

    def request_key(self, topic_id: bytes, key: str, now_ms: int) -> StoredKey | None:
        """A live REST idempotency key: the parts every shard stored for it (a keyed
        request spread over shards stored a row in each).

        A shard that is down is left out, so keyed requests go on while it is: what it
        stored cannot be stored twice anyway (a commit refuses a key live in its shard),
        and the parts it holds are found by a retry once it is back (a partly stored
        request is completed then: ``service.produce.request_keys.append_keyed``).
        """
        found: list[StoredKey] = []
        for shard in self.shards:
            try:
                row = shard.read(_one(shard.q(_REQUEST_KEY), (bytes(topic_id), key, now_ms)))
            except CoordinatorUnavailableError as e:
                log.warning("request key %r: shard %s left out: %s", key, shard.shard_id, e)
                continue
            if row is not None:
                found.append(StoredKey.from_row(*row))
        if not found:
            return None
        parts = tuple(sorted(p for k in found for p in k.parts))
        partitions = max(k.partitions for k in found)  # the same in every shard
        return StoredKey(found[0].digest, min(k.created_ms for k in found), parts, partitions)

    # -- agents (the catalog) ---------------------------------------------------
    heartbeat_agent = forward("_catalog", MetadataStore.heartbeat_agent)

    list_agents = forward("_catalog", MetadataStore.list_agents)

    def assignments(self) -> dict[tuple[bytes, int], str]:
        """Every partition's shard id, from the catalog."""
        with self._db.read() as conn:
            rows = conn.execute(self._q(_ALL_ASSIGNED)).fetchall()
        return {(bytes(t), int(p)): str(s) for t, p, s in rows}


class ShardedPartitions:
    """``coordinator.log.transactions.PartitionData`` over shards: each partition's
    transaction rows in its shard, beside the commit that checks them."""

    def __init__(self, store: ShardedStore) -> None:
        self._store = store

    def each(
        self,
        topic_id: bytes,
        partitions: Sequence[int],
        fn: Callable[[Any, Callable[[str], str], list[int]], T],
        *,
        write: bool = False,
    ) -> list[T]:
        groups: dict[Shard, list[int]] = {}
        for p in partitions:
            groups.setdefault(self._store.shard_of(topic_id, p), []).append(p)
        out = []
        for shard, part in groups.items():

            def run(conn: Any, shard: Shard = shard, part: list[int] = part) -> T:
                return fn(conn, shard.q, part)

            out.append(shard.write(run) if write else shard.read(run))
        return out


def purge_topic(shard: Shard, topic_id: bytes) -> None:
    """Drop a deleted topic's rows from a shard (its objects become unreferenced)."""

    def purge(conn: Any) -> None:
        if shard.db.dialect.name == POSTGRESQL.name:  # in commit order, as delete_topic
            conn.execute(LOCK_TOPIC_PARTITIONS_PG, (topic_id,)).fetchall()
        for statement in _PURGE_TOPIC:
            conn.execute(shard.q(statement), (topic_id,))

    shard.write(purge)


def _in_shard(
    method: Callable[Concatenate[Catalog, bytes, int, _P], T],
) -> Callable[Concatenate[ShardedCatalog, bytes, int, _P], T]:
    """``Catalog``'s ``method`` of one partition, run on the shard that owns it."""

    def call(
        self: ShardedCatalog,
        topic_id: bytes,
        partition: int,
        /,
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> T:
        shard = self._store.shard_of(topic_id, partition)
        return shard.call(lambda: method(Catalog(shard.db), topic_id, partition, *args, **kwargs))

    call.__name__ = call.__qualname__ = method.__name__
    call.__doc__ = method.__doc__
    return call


class ShardedCatalog:
    """The janitors' ``Catalog`` over a catalog and its shards: per partition in its
    shard; objects in every shard (see ``forget_objects``)."""

    def __init__(self, store: ShardedStore) -> None:
        self._store = store
        self._db = store._db
        self._q = self._db.dialect.sql

    @property
    def catalog_db(self) -> MetadataDatabase:
        """The catalog database: topics, configs, table pointers."""
        return self._db

    def table_files(self) -> dict[str, TableFiles]:
        """Each shard's topic table files, by shard id (a shard that is down raises
        CoordinatorUnavailableError when asked)."""
        return {s.shard_id: TableFiles(s.db) for s in self._store.shards}

    def partitions(self, topic: str | None = None) -> list[PartitionState]:
        """Partitions by topic name and partition; those of shards that are down are left
        out of this run (logged)."""
        with self._db.read() as conn:
            defaults = topic_defaults(dict(conn.execute(self._q(_CLUSTER_CONFIGS)).fetchall()))
            configs: dict[bytes, dict[str, str]] = {}
            for topic_id, key, value in conn.execute(self._q(_CONFIGS)):
                configs.setdefault(bytes(topic_id), {})[key] = value
            names = {bytes(t): str(n) for t, n in conn.execute(self._q(_TOPIC_IDS))}
        where = self._store.assignments()
        out: list[PartitionState] = []
        for shard in self._store.shards:
            try:
                rows = shard.read(_all(shard.q(_SHARD_PARTITIONS)))
            except CoordinatorUnavailableError as e:
                log.warning("janitors skip the partitions of shard %s: %s", shard.shard_id, e)
                continue
            for tid, p, ls, hw in rows:
                tid = bytes(tid)
                name = names.get(tid)
                if name is None or where.get((tid, int(p))) != shard.shard_id:
                    continue
                if topic is not None and name != topic:
                    continue
                merged = defaults | configs.get(tid, {})
                out.append(PartitionState(tid, name, int(p), int(ls), int(hw), merged))
        out.sort(key=lambda s: (s.topic, s.partition))
        return out

    rows = _in_shard(Catalog.rows)
    transactions = _in_shard(Catalog.transactions)
    swap = _in_shard(Catalog.swap)
    advance_log_start = _in_shard(Catalog.advance_log_start)

    def index_row_count(self) -> int:
        return sum(s.call(s.catalog().index_row_count) for s in self._store.shards)

    def purge_deleted_topics(self) -> int:
        """Drop rows of deleted topics from every shard (left where a shard was down when
        the topic was deleted); returns how many topics. Raises if a shard is down.

        The shards' topic ids are read BEFORE the catalog's live ones: a topic's catalog
        row is written before its shard rows and ids are never reused, so a topic created
        meanwhile is either not yet in a shard's list or already in the live set (read the
        other way round, it would be purged with its acked records).
        """
        in_shards = [
            (shard, [bytes(t) for (t,) in shard.read(_all(shard.q(_SHARD_TOPIC_IDS)))])
            for shard in self._store.shards
        ]
        with self._db.read() as conn:
            live = {bytes(t) for t, _ in conn.execute(self._q(_TOPIC_IDS))}
        purged = 0
        for shard, ids in in_shards:
            for topic_id in ids:
                if topic_id not in live:
                    purge_topic(shard, topic_id)
                    purged += 1
        return purged

    def mark_unreferenced(self, now: float) -> int:
        return sum(
            s.call(functools.partial(s.catalog().mark_unreferenced, now))
            for s in self._store.shards
        )

    def due_for_deletion(self, unreferenced_before: float) -> list[tuple[Any, str]]:
        """(token, key) of objects some shard has had unreferenced since the given time.
        Asks every shard (raises if one does not answer: nothing is deleted then)."""
        out: list[tuple[Any, str]] = []
        for s in self._store.shards:
            due = s.call(functools.partial(s.catalog().due_for_deletion, unreferenced_before))
            out += [((s.shard_id, oid, key), key) for oid, key in due]
        return out

    def pending_deletion(self) -> int:
        return sum(s.call(s.catalog().pending_deletion) for s in self._store.shards)

    def forget_objects(self, tokens: Sequence[Any]) -> set[Any]:
        """Make each object's row in its shard a tombstone; returns the tokens whose
        objects may be deleted now: every shard has a tombstone for the key and none a
        committed row (no shard can commit it any more). Asks every shard.

        Raises:
            CoordinatorUnavailableError: a shard did not answer (the objects stay; if
                their last rows went, the orphan listing finds them once all shards
                answer).
        """
        by_shard: dict[str, list[Any]] = {}
        for token in tokens:
            by_shard.setdefault(token[0], []).append(token)
        gone: set[Any] = set()
        now = clock.now()
        for shard_id, mine in by_shard.items():
            shard = self._store._by_id[shard_id]
            catalog = Catalog(shard.db)
            ids = [object_id for _, object_id, _ in mine]
            forgotten = shard.call(functools.partial(catalog.forget_objects, ids))
            keys = [key for _, object_id, key in mine if object_id in forgotten]
            others = [s for s in self._store.shards if s.shard_id != shard_id]
            claimed = self._claim_all(others, keys, now)
            gone.update(t for t in mine if t[2] in claimed and t[1] in forgotten)
        return gone

    def claim_orphans(self, keys: Sequence[str], now: float) -> set[str]:
        """``Catalog.claim_orphans`` in every shard: the keys every shard took a
        tombstone for (any shard may be asked to commit a key)."""
        return self._claim_all(self._store.shards, keys, now)

    @staticmethod
    def _claim_all(shards: Sequence[Shard], keys: Sequence[str], now: float) -> set[str]:
        left = set(keys)
        claimed: list[Shard] = []
        for s in shards:
            if not left:
                break
            took = s.call(functools.partial(Catalog(s.db).claim_orphans, sorted(left), now))
            refused = sorted(left - took)
            for c in claimed if refused else ():  # committed there: no orphans; undo
                c.call(functools.partial(Catalog(c.db).unclaim_orphans, refused, now))
            left &= took
            claimed.append(s)
        return left

    def purge_tombstones(self, deleted_before: float) -> int:
        return sum(
            s.call(functools.partial(s.catalog().purge_tombstones, deleted_before))
            for s in self._store.shards
        )

    def purge_leases(self, now: float, stray_before: float) -> int:
        return Catalog(self._db).purge_leases(now, stray_before)


def _conforms(s: ShardedStore) -> Coordinator:
    # mypy checks here that ShardedStore implements the protocol exactly.
    return s
