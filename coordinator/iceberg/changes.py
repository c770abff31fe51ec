"""Which tier objects each topic's table gains and loses, recorded with the index swap.

Every transaction that inserts or deletes a tier object's index entry (tiering and
compaction swaps, retention, DeleteRecords: ``coordinator.janitors.catalog``) calls
:func:`record_changes` in that same transaction. It takes the topic's next change
number from ``table_log`` (an upsert that locks the topic's row until commit, so the
changes of one topic commit in number order, on PostgreSQL too) and marks the objects
in ``table_files``: added by change n, removed by change m.

The table's publisher (``coordinator.iceberg.tables``) reads, per database (the one
database, or each shard), everything after the change its current snapshot records
(``lakelog.changes`` in the snapshot summary) up to the last one, and commits it as one
snapshot. Objects added and removed between two snapshots never reach the table.

A ``table_files`` row keeps its object from garbage collection
(``coordinator.janitors.catalog``'s unreferenced test asks for it) until
:meth:`TableFiles.release` drops it: once the oldest retained snapshot was published
after its removal, no retained snapshot can name it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.db import MetadataDatabase, rows_in

_NEXT_CHANGE = (
    "INSERT INTO table_log (topic_id, last_change) VALUES (?, 1) "
    "ON CONFLICT (topic_id) DO UPDATE SET last_change = table_log.last_change + 1 "
    "RETURNING last_change"
)
_ADD = "INSERT INTO table_files (object_id, topic_id, partition, added_change) VALUES (?, ?, ?, ?)"
_HELD = "SELECT object_id FROM table_files WHERE object_id IN ({marks}) AND removed_change IS NULL"
_REMOVE = "UPDATE table_files SET removed_change = ? WHERE object_id = ?"
_LAST_CHANGE = "SELECT last_change FROM table_log WHERE topic_id = ?"
_ADDED = (
    "SELECT f.partition, o.object_key, o.size FROM table_files f "
    "JOIN objects o ON o.object_id = f.object_id "
    "WHERE f.topic_id = ? AND f.added_change > ? AND f.removed_change IS NULL "
    "ORDER BY f.partition, f.object_id"
)
_REMOVED = (
    "SELECT f.partition, o.object_key, o.size FROM table_files f "
    "JOIN objects o ON o.object_id = f.object_id "
    "WHERE f.topic_id = ? AND f.removed_change > ? AND f.added_change <= ? "
    "ORDER BY f.partition, f.object_id"
)
_HELD_KEYS = (
    "SELECT f.partition, o.object_key, o.size FROM table_files f "
    "JOIN objects o ON o.object_id = f.object_id "
    "WHERE f.topic_id = ? AND f.removed_change IS NULL ORDER BY f.partition, f.object_id"
)
_RELEASE = (
    "DELETE FROM table_files WHERE topic_id = ? AND removed_change IS NOT NULL "
    "AND removed_change <= ? RETURNING object_id"
)

#: The SQL condition, on ``objects``, that no table file row holds the object.
NOT_HELD = "NOT EXISTS (SELECT 1 FROM table_files f WHERE f.object_id = objects.object_id)"
#: ... and that nothing references it: no index entry, no table file row.
UNREFERENCED = (
    "NOT EXISTS (SELECT 1 FROM index_entries e WHERE e.object_id = objects.object_id) "
    f"AND {NOT_HELD}"
)
#: An object released (its last reference gone) stamped with the time: GC's grace starts.
MARK_UNREFERENCED = (
    "UPDATE objects SET unreferenced_at = ? "
    f"WHERE object_id = ? AND unreferenced_at IS NULL AND {UNREFERENCED}"
)
#: The statements that drop a deleted topic's rows (one parameter: the topic id).
PURGE_TABLE_FILES = (
    "DELETE FROM table_files WHERE topic_id = ?",
    "DELETE FROM table_log WHERE topic_id = ?",
)


def record_changes(
    conn: Any,
    q: Callable[[str], str],
    topic_id: bytes,
    partition: int,
    added: Sequence[int],
    removed: Iterable[int],
) -> int | None:
    """Record, in the caller's transaction, tier objects added to and removed from the
    topic's table (``removed`` may name any objects: those the table does not hold are
    left out). Returns the change number taken, or None when nothing changed."""
    held = [int(r[0]) for r in rows_in(conn, q, _HELD, sorted(set(removed)))]
    if not added and not held:
        return None
    change = int(conn.execute(q(_NEXT_CHANGE), (topic_id,)).fetchone()[0])
    conn.executemany(q(_ADD), [(oid, topic_id, partition, change) for oid in added])
    conn.executemany(q(_REMOVE), [(change, oid) for oid in held])
    return change


@dataclass(frozen=True, slots=True)
class TableFile:
    """A tier object as a table file: its partition, object key and size."""

    partition: int
    object_key: str
    size: int


@dataclass(frozen=True, slots=True)
class Pending:
    """A database's changes to a topic's table after change ``since``, up to ``through``."""

    since: int
    through: int
    added: tuple[TableFile, ...]
    removed: tuple[TableFile, ...]


class TableFiles:
    """The ``table_files`` of one database (the one database, or one shard)."""

    def __init__(self, db: MetadataDatabase) -> None:
        self._db = db
        self._q = db.dialect.sql

    def pending(self, topic_id: bytes, since: int) -> Pending:
        """Changes after ``since``, read in one snapshot with the last change number."""
        q = self._q
        with self._db.read() as conn:
            row = conn.execute(q(_LAST_CHANGE), (topic_id,)).fetchone()
            through = 0 if row is None else int(row[0])
            if through <= since:
                return Pending(since, max(since, through), (), ())
            added = conn.execute(q(_ADDED), (topic_id, since)).fetchall()
            removed = conn.execute(q(_REMOVED), (topic_id, since, since)).fetchall()
        return Pending(
            since,
            through,
            tuple(TableFile(int(p), str(k), int(s)) for p, k, s in added),
            tuple(TableFile(int(p), str(k), int(s)) for p, k, s in removed),
        )

    def held(self, topic_id: bytes) -> tuple[int, list[TableFile]]:
        """The last change number and the files the table holds after it (for checks)."""
        q = self._q
        with self._db.read() as conn:
            row = conn.execute(q(_LAST_CHANGE), (topic_id,)).fetchone()
            rows = conn.execute(q(_HELD_KEYS), (topic_id,)).fetchall()
        return (0 if row is None else int(row[0])), [
            TableFile(int(p), str(k), int(s)) for p, k, s in rows
        ]

    def release(self, topic_id: bytes, through: int, now: float) -> int:
        """Drop the rows of objects removed by change ``through`` or earlier (no retained
        snapshot names them); garbage collection may then take the objects, a grace
        period after ``now`` (their ``unreferenced_at``, unless an index entry still
        names them). Returns how many rows went."""
        with self._db.write() as conn:
            released = sorted(
                {int(r[0]) for r in conn.execute(self._q(_RELEASE), (topic_id, through))}
            )
            conn.executemany(self._q(MARK_UNREFERENCED), [(now, oid) for oid in released])
        return len(released)
