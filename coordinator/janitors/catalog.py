"""The janitors' SQL: index rows of a partition, index swaps, retention, object bookkeeping.

Every statement is plain SQL both SQLite and PostgreSQL accept (``?`` placeholders,
rewritten by ``Dialect.sql``). Each mutating method is ONE write transaction that
first checks what it replaces is still there, unchanged (a conditional DELETE whose
row count must match), so a janitor acting on a stale read aborts instead of
clobbering a concurrent change; the object it wrote is then an orphan for GC.

Objects: a row of ``objects`` whose last index entry goes gets ``unreferenced_at``
stamped in the same transaction (and ``mark_unreferenced`` catches any other way an
entry disappears, such as a deleted topic), unless its topic's table may still name it
in a retained snapshot (``coordinator.iceberg.changes``: every transaction here that
adds or drops a tier object's entry records that change for the table, and the table's
rows keep the object until snapshot expiry releases them). Only rows stamped longer ago than the
grace period are ever handed to garbage collection, and the row is deleted only if
still unreferenced (the foreign key from ``index_entries`` would refuse it anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coordinator import clock
from coordinator.client import ChunkRef
from coordinator.db import MetadataDatabase, rows_in
from coordinator.iceberg.changes import (
    MARK_UNREFERENCED,
    UNREFERENCED,
    TableFiles,
    record_changes,
)
from coordinator.log.topic_configs import topic_defaults
from coordinator.log.transactions import partition_transactions
from segments.errors import IndexHoleError

_PARTITIONS = (
    "SELECT t.topic_id, t.name, p.partition, p.log_start_offset, p.high_watermark "
    "FROM topics t JOIN partitions p ON p.topic_id = t.topic_id "
    "ORDER BY t.name, p.partition"
)
_CONFIGS = "SELECT topic_id, name, value FROM topic_configs"
_CLUSTER_CONFIGS = "SELECT name, value FROM cluster_configs"
_ROWS = (
    "SELECT e.base_offset, e.record_count, e.object_id, o.object_key, e.position, e.length, "
    "e.min_ts, e.max_ts, e.kind, o.committed_at "
    "FROM index_entries e JOIN objects o ON o.object_id = e.object_id "
    "WHERE e.topic_id = ? AND e.partition = ? ORDER BY e.base_offset"
)
_DELETE_ROW = (
    "DELETE FROM index_entries WHERE topic_id = ? AND partition = ? AND base_offset = ? "
    "AND record_count = ? AND object_id = ? AND position = ? AND length = ? AND kind = ? "
    "RETURNING base_offset"
)
_INSERT_OBJECT = (
    "INSERT INTO objects (object_key, size, committed_at) VALUES (?, ?, ?) "
    "ON CONFLICT (object_key) DO NOTHING RETURNING object_id"
)
_INSERT_ROW = (
    "INSERT INTO index_entries (topic_id, partition, base_offset, record_count, object_id, "
    "position, length, min_ts, max_ts, kind) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, 'parquet')"
)
# Neither an index entry nor a topic table's retained snapshots (``table_files``) name it.
_MARK_ALL = (
    f"UPDATE objects SET unreferenced_at = ? WHERE unreferenced_at IS NULL AND {UNREFERENCED} "
    "RETURNING object_id"
)
_DUE = (
    "SELECT object_id, object_key FROM objects WHERE unreferenced_at IS NOT NULL "
    "AND unreferenced_at <= ? AND deleted_at IS NULL ORDER BY object_id"
)
_PENDING = "SELECT COUNT(*) FROM objects WHERE unreferenced_at IS NOT NULL AND deleted_at IS NULL"
# The row stays as a tombstone: a late commit of the key conflicts with it and fails.
_FORGET = (
    "UPDATE objects SET deleted_at = ? WHERE object_id IN ({marks}) AND deleted_at IS NULL "
    f"AND {UNREFERENCED} RETURNING object_id"
)
# An orphan's tombstone, unless the key is committed meanwhile (a row without deleted_at):
# the same unique key a commit inserts, so commit and collection cannot both win. A
# tombstone already there (an earlier run died before its delete) is claimed again.
_CLAIM_ORPHAN = (
    "INSERT INTO objects (object_key, size, committed_at, unreferenced_at, deleted_at) "
    "VALUES (?, NULL, ?, ?, ?) "
    "ON CONFLICT (object_key) DO UPDATE SET deleted_at = objects.deleted_at "
    "WHERE objects.deleted_at IS NOT NULL RETURNING object_key"
)
# Only a tombstone no index entry can name (one this run just made).
_UNCLAIM = (
    "DELETE FROM objects WHERE object_key = ? AND deleted_at = ? "
    f"AND {UNREFERENCED} RETURNING object_id"
)
_DELETED_IN = (
    "SELECT object_key FROM objects WHERE deleted_at IS NOT NULL AND object_key IN ({marks})"
)
# unreferenced_at <= deleted_at on every tombstone: the condition uses its index.
_PURGE_TOMBSTONES = (
    "DELETE FROM objects WHERE unreferenced_at < ? AND deleted_at IS NOT NULL "
    "AND deleted_at < ? RETURNING object_id"
)
_EXPIRED_LEASES = "SELECT lease_id FROM write_leases WHERE expires_at < ?"
_DROP_PENDING_OF = "DELETE FROM pending_objects WHERE lease_id = ?"
_DROP_LEASE = "DELETE FROM write_leases WHERE lease_id = ? AND expires_at < ? RETURNING lease_id"
# Pending rows of a lease that no longer exists (released while a task registered).
_DROP_STRAY_PENDING = (
    "DELETE FROM pending_objects WHERE registered_at < ? AND NOT EXISTS "
    "(SELECT 1 FROM write_leases l WHERE l.lease_id = pending_objects.lease_id)"
)
_ADVANCE_LOG_START = (
    "UPDATE partitions SET log_start_offset = ? "
    "WHERE topic_id = ? AND partition = ? AND log_start_offset < ? AND ? <= high_watermark "
    "RETURNING log_start_offset"
)
_DROP_BELOW = (
    "DELETE FROM index_entries WHERE topic_id = ? AND partition = ? "
    "AND base_offset + record_count <= ? RETURNING object_id"
)
_DROP_ABORTED_BELOW = (
    "DELETE FROM aborted_txns WHERE topic_id = ? AND partition = ? AND last_offset < ?"
)
_COUNT_ROWS = "SELECT COUNT(*) FROM index_entries"


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition as the janitors see it: ids, bounds and the topic's configs (its
    overrides over the cluster-wide broker configs it inherits)."""

    topic_id: bytes
    topic: str
    partition: int
    log_start: int
    high_watermark: int
    configs: dict[str, str]


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One index entry with its object's id, key and commit time."""

    base_offset: int
    record_count: int
    object_id: int
    object_key: str
    position: int
    length: int
    min_ts: int
    max_ts: int
    kind: str
    committed_at: float

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.record_count

    def ref(self) -> ChunkRef:
        """The ChunkRef a reader gets for this entry."""
        return ChunkRef(
            self.object_key,
            self.position,
            self.length,
            self.base_offset,
            self.record_count,
            self.min_ts,
            self.max_ts,
            self.kind,
        )


@dataclass(frozen=True, slots=True)
class NewRow:
    """A tier object written by a janitor, to be swapped in: offsets [base, base + span)."""

    object_key: str
    size: int
    base_offset: int
    record_count: int  # the offset span, not the rows (see ChunkRef)
    min_ts: int
    max_ts: int


def _spans(rows: Sequence[IndexRow] | Sequence[NewRow]) -> list[tuple[int, int]]:
    """The offset ranges [first, end) that ``rows`` cover, adjacent ones merged."""
    out: list[tuple[int, int]] = []
    for base, end in sorted((r.base_offset, r.base_offset + r.record_count) for r in rows):
        if out and out[-1][1] == base:
            out[-1] = (out[-1][0], end)
        else:
            out.append((base, end))
    return out


class SwapAborted(Exception):
    """The rows to replace changed since they were read (internal: rolls the swap back)."""


class Catalog:
    """The janitors' view of the metadata database. Thread-safe; each method one transaction."""

    def __init__(self, db: MetadataDatabase) -> None:
        self._db = db
        self._q = db.dialect.sql

    @property
    def catalog_db(self) -> MetadataDatabase:
        """The database of topics, configs and table pointers."""
        return self._db

    def table_files(self) -> dict[str, TableFiles]:
        """The databases holding topic tables' files, by their key in snapshot summaries."""
        return {"main": TableFiles(self._db)}

    def partitions(self, topic: str | None = None) -> list[PartitionState]:
        """Every partition (of ``topic`` only, if given), by topic name and partition."""
        with self._db.read() as conn:
            defaults = topic_defaults(dict(conn.execute(self._q(_CLUSTER_CONFIGS)).fetchall()))
            configs: dict[bytes, dict[str, str]] = {}
            for topic_id, key, value in conn.execute(self._q(_CONFIGS)):
                configs.setdefault(bytes(topic_id), {})[key] = value
            rows = conn.execute(self._q(_PARTITIONS)).fetchall()
        return [
            PartitionState(bytes(tid), name, p, ls, hw, defaults | configs.get(bytes(tid), {}))
            for tid, name, p, ls, hw in rows
            if topic is None or name == topic
        ]

    def rows(self, topic_id: bytes, partition: int) -> list[IndexRow]:
        """The partition's index entries in offset order."""
        with self._db.read() as conn:
            found = conn.execute(self._q(_ROWS), (topic_id, partition)).fetchall()
        return [IndexRow(*r) for r in found]

    def transactions(
        self, topic_id: bytes, partition: int
    ) -> tuple[int | None, list[tuple[int, int, int]]]:
        """The partition's first open-transaction offset and its aborted transactions
        (``coordinator.log.transactions.partition_transactions``)."""
        with self._db.read() as conn:
            return partition_transactions(conn, self._q, topic_id, partition)

    def index_row_count(self) -> int:
        """Index entries in the whole database (for benchmarks and reports)."""
        with self._db.read() as conn:
            return int(conn.execute(self._q(_COUNT_ROWS)).fetchone()[0])

    def swap(
        self,
        topic_id: bytes,
        partition: int,
        old: Sequence[IndexRow],
        new: Sequence[NewRow],
        now: float,
    ) -> bool:
        """Replace the entries ``old`` by ``new`` tier objects in ONE transaction.

        Returns False, changing nothing, when any of ``old`` is gone or changed (a
        concurrent tiering, compaction or retention got there first) or a new key is
        already an object.

        Raises:
            IndexHoleError: ``new`` does not cover exactly the offsets ``old`` covers
                (a janitor's bug: the index must stay contiguous).
        """
        if _spans(old) != _spans(new):
            raise IndexHoleError(
                f"A swap in partition {partition} would replace offsets {_spans(old)} "
                f"with {_spans(new)}: the index must stay contiguous."
            )
        q = self._q
        try:
            with self._db.write() as conn:
                for r in old:
                    gone = conn.execute(
                        q(_DELETE_ROW),
                        (
                            topic_id,
                            partition,
                            r.base_offset,
                            r.record_count,
                            r.object_id,
                            r.position,
                            r.length,
                            r.kind,
                        ),
                    ).fetchone()
                    if gone is None:
                        raise SwapAborted(f"entry at {r.base_offset} changed")
                added: list[int] = []
                for n in new:
                    found = conn.execute(q(_INSERT_OBJECT), (n.object_key, n.size, now)).fetchone()
                    if found is None:
                        raise SwapAborted(f"object {n.object_key} already exists")
                    added.append(int(found[0]))
                    conn.execute(
                        q(_INSERT_ROW),
                        (
                            topic_id,
                            partition,
                            n.base_offset,
                            n.record_count,
                            found[0],
                            n.size,
                            n.min_ts,
                            n.max_ts,
                        ),
                    )
                record_changes(conn, q, topic_id, partition, added, (r.object_id for r in old))
                self._mark(conn, {r.object_id for r in old}, now)
        except SwapAborted:
            return False
        return True

    def _mark(self, conn: Any, object_ids: set[int], now: float) -> None:
        conn.executemany(self._q(MARK_UNREFERENCED), [(now, oid) for oid in sorted(object_ids)])

    def advance_log_start(
        self, topic_id: bytes, partition: int, log_start: int, now: float
    ) -> int | None:
        """Move log-start up to ``log_start`` and drop the entries wholly below it.

        Entries straddling the new log-start stay (readers skip their records below
        it). Returns the new log-start, or None when it was already there or beyond
        (or beyond the high watermark): then nothing changes.
        """
        q = self._q
        with self._db.write() as conn:
            moved = conn.execute(
                q(_ADVANCE_LOG_START), (log_start, topic_id, partition, log_start, log_start)
            ).fetchone()
            if moved is None:
                return None
            dropped = conn.execute(q(_DROP_BELOW), (topic_id, partition, log_start)).fetchall()
            # Aborted transactions wholly below it: no reader can meet their records now.
            conn.execute(q(_DROP_ABORTED_BELOW), (topic_id, partition, log_start))
            record_changes(conn, q, topic_id, partition, (), (r[0] for r in dropped))
            self._mark(conn, {r[0] for r in dropped}, now)
        return int(moved[0])

    def purge_deleted_topics(self) -> int:
        """Nothing to do on one database (a deleted topic's rows go with it); see
        ``coordinator.shards.ShardedCatalog``."""
        return 0

    def mark_unreferenced(self, now: float) -> int:
        """Stamp every object that has no index entry and no stamp yet; returns how many."""
        with self._db.write() as conn:
            return len(conn.execute(self._q(_MARK_ALL), (now,)).fetchall())

    def due_for_deletion(self, unreferenced_before: float) -> list[tuple[int, str]]:
        """(object id, key) of objects unreferenced since at or before the given time."""
        with self._db.read() as conn:
            rows = conn.execute(self._q(_DUE), (unreferenced_before,)).fetchall()
        return [(int(i), str(k)) for i, k in rows]

    def pending_deletion(self) -> int:
        """Objects unreferenced and not deleted yet."""
        with self._db.read() as conn:
            return int(conn.execute(self._q(_PENDING)).fetchone()[0])

    def forget_objects(self, object_ids: Sequence[int]) -> set[int]:
        """Make objects' rows tombstones before the objects are deleted, in one
        transaction; returns the ids that became one (not those referenced again, or
        tombstones already). A commit of their keys fails from now on."""
        with self._db.write() as conn:
            return {int(r[0]) for r in rows_in(conn, self._q, _FORGET, object_ids, (clock.now(),))}

    def claim_orphans(self, keys: Sequence[str], now: float) -> set[str]:
        """Write orphans' tombstones before deleting them, in one transaction; returns
        the keys claimed (not those committed: they are no orphans, leave them).
        Decided by the unique object key, in the same way a commit is: of a commit and
        this claim, exactly one wins."""
        sql = self._q(_CLAIM_ORPHAN)
        with self._db.write(exclusive=False) as conn:
            return {
                key
                for key in dict.fromkeys(keys)
                if conn.execute(sql, (key, now, now, now)).fetchone() is not None
            }

    def unclaim_orphans(self, keys: Sequence[str], now: float) -> None:
        """Undo ``claim_orphans(keys, now)`` (another shard refused their claim)."""
        sql = self._q(_UNCLAIM)
        with self._db.write(exclusive=False) as conn:
            for key in keys:
                conn.execute(sql, (key, now))

    def deleted_keys(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` have a tombstone (garbage collection took them)."""
        wanted = list(dict.fromkeys(keys))
        with self._db.read() as conn:
            return {str(k) for (k,) in rows_in(conn, self._q, _DELETED_IN, wanted)}

    def purge_tombstones(self, deleted_before: float) -> int:
        """Drop tombstones older than ``deleted_before``; returns how many."""
        with self._db.write(exclusive=False) as conn:
            rows = conn.execute(
                self._q(_PURGE_TOMBSTONES), (deleted_before, deleted_before)
            ).fetchall()
        return len(rows)

    def purge_leases(self, now: float, stray_before: float) -> int:
        """Drop write leases expired before ``now`` with their pending keys (their
        uploads are orphans now), and pending keys of leases that are gone, registered
        before ``stray_before``. Returns how many leases."""
        q = self._q
        with self._db.write(exclusive=False) as conn:
            expired = [str(r[0]) for r in conn.execute(q(_EXPIRED_LEASES), (now,)).fetchall()]
            for lease_id in expired:
                # Lease first (row locked): one renewed meanwhile keeps its keys.
                if conn.execute(q(_DROP_LEASE), (lease_id, now)).fetchone() is not None:
                    conn.execute(q(_DROP_PENDING_OF), (lease_id,))
            conn.execute(q(_DROP_STRAY_PENDING), (stray_before,))
        return len(expired)
