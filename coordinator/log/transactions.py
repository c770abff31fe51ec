"""Transactions: a transactional id's producer, epoch and state, and what each partition
knows of the transactions open in it.

Kafka's transaction coordinator, in the metadata database instead of a log:

- ``transactions``: one row per transactional id: its producer id, epoch, timeout and
  the state of its current (or last) transaction, with Kafka's names::

      Empty ──AddPartitions/AddOffsets──▶ Ongoing ──EndTxn──▶ PrepareCommit / PrepareAbort
        ▲                                    │ (timeout, or a new instance: epoch + 1)   │
        └──────── CompleteCommit / CompleteAbort ◀──── every marker committed ◀──────────┘

- ``txn_members``, ``txn_groups``, ``txn_offsets``: the current transaction's partitions,
  the groups it commits offsets for, and those offsets (written to the groups' committed
  offsets when it commits: the decision, ``end``, writes them).
- ``open_txns`` and ``aborted_txns`` are partition data, changed by the commit of the
  partition's chunks (``MetadataStore.commit``): AddPartitionsToTxn opens a row; the
  commit of the producer's first transactional batch sets its first offset (a batch for a
  partition the transaction did not add, or at another epoch, is refused there: KIP-890's
  verification in the commit itself); the commit of its marker closes it, and for an
  abort with records keeps [first offset, marker offset] in ``aborted_txns``. The last
  stable offset of a partition is the least first offset of its open rows, else its high
  watermark.

Consistency across crashes, in order of the steps:

1. The decision (PrepareCommit/PrepareAbort) is one database transaction, with the
   group offsets of a commit. A crash before it: the transaction is still Ongoing, and
   its timeout aborts it.
2. The markers are a segment object PUT then committed like data (``index.log.LogWriter
   .write_markers``): each marker's commit closes its partition's open row in the same
   database transaction that assigns its offset, so a marker, the records it closes and
   the last stable offset never disagree. A crash between the PUT and the commit leaves
   an orphan object (collected later) and the transaction in Prepare*.
3. Completion checks that no partition is still open. A transaction left in Prepare* by
   a writer that went away is returned by ``abort_expired`` to whoever sweeps (every
   agent does, now and then) and its markers are written again; a second marker for a
   partition closed already changes no state.

May import ``coordinator.db``, ``coordinator.client``'s values, ``coordinator.groups``'
committed-offsets statement and ``segments.errors``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from coordinator import clock
from coordinator.client import (
    ChunkCommit,
    IndexWant,
    PendingMarkers,
    StableView,
    TopicPartition,
    TransactionInfo,
    TxnProducer,
)
from coordinator.db import MetadataDatabase, fetch_each, rows_in
from coordinator.groups.store import _UPSERT_COMMITTED  # the one statement writing commits
from segments.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    InvalidTxnTimeoutError,
    PartitionNotFoundError,
    TopicNotFoundError,
    TransactionFencedError,
)

T = TypeVar("T")

EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
_PREPARED = (PREPARE_COMMIT, PREPARE_ABORT)
_IDLE = (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT)

#: Kafka's ``transaction.max.timeout.ms`` default: 15 minutes.
MAX_TIMEOUT_MS = 900_000
#: A decided transaction whose markers nobody finished writing within this long is
#: handed out again by ``abort_expired`` (its writer went away).
STALE_DECISION_S = 30.0
_MAX_EPOCH = 32767

_TXN = (
    "SELECT producer_id, epoch, state, is_commit, timeout_ms, started_at "
    "FROM transactions WHERE transactional_id = ?"
)
_INSERT_TXN = (
    "INSERT INTO transactions (transactional_id, producer_id, epoch, state, timeout_ms, "
    "updated_at) VALUES (?, ?, 0, 'Empty', ?, ?)"
)
_SET_TXN = (
    "UPDATE transactions SET producer_id = ?, epoch = ?, state = ?, is_commit = ?, "
    "timeout_ms = ?, started_at = ?, updated_at = ? WHERE transactional_id = ?"
)
_NEW_PRODUCER = "INSERT INTO producers (epoch, created_at) VALUES (0, ?) RETURNING producer_id"
_MEMBERS = "SELECT topic_id, partition FROM txn_members WHERE transactional_id = ?"
_ADD_MEMBER = (
    "INSERT INTO txn_members (transactional_id, topic_id, partition) VALUES (?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)
_FORGET_MEMBERS = "DELETE FROM txn_members WHERE transactional_id = ?"
_ADD_GROUP = (
    "INSERT INTO txn_groups (transactional_id, group_id) VALUES (?, ?) ON CONFLICT DO NOTHING"
)
_HAS_GROUP = "SELECT 1 FROM txn_groups WHERE transactional_id = ? AND group_id = ?"
_FORGET_GROUPS = "DELETE FROM txn_groups WHERE transactional_id = ?"
_HOLD_OFFSET = (
    "INSERT INTO txn_offsets (transactional_id, group_id, topic, partition, committed_offset, "
    "metadata) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (transactional_id, group_id, topic, "
    "partition) DO UPDATE SET committed_offset = excluded.committed_offset, "
    "metadata = excluded.metadata"
)
_HELD_OFFSETS = (
    "SELECT group_id, topic, partition, committed_offset, metadata FROM txn_offsets "
    "WHERE transactional_id = ?"
)
_FORGET_OFFSETS = "DELETE FROM txn_offsets WHERE transactional_id = ?"
_HELD_BY_GROUP = (
    "SELECT DISTINCT topic, partition FROM txn_offsets WHERE group_id = ? ORDER BY topic, partition"
)
_TOPIC = "SELECT topic_id, partition_count FROM topics WHERE name = ?"
_OPEN = (
    "INSERT INTO open_txns (topic_id, partition, producer_id, epoch) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (topic_id, partition, producer_id) DO UPDATE SET epoch = excluded.epoch"
)
_OPEN_ROW = (
    "SELECT epoch, first_offset FROM open_txns "
    "WHERE topic_id = ? AND partition = ? AND producer_id = ?"
)
_SET_FIRST = (
    "UPDATE open_txns SET first_offset = ? "
    "WHERE topic_id = ? AND partition = ? AND producer_id = ? AND first_offset IS NULL"
)
_CLOSE = "DELETE FROM open_txns WHERE topic_id = ? AND partition = ? AND producer_id = ?"
_ABORTED = (
    "INSERT INTO aborted_txns (topic_id, partition, last_offset, producer_id, first_offset) "
    "VALUES (?, ?, ?, ?, ?)"
)
_STILL_OPEN = (
    "SELECT partition FROM open_txns WHERE topic_id = ? AND producer_id = ? "
    "AND partition IN ({marks})"
)
_HIGH_WATERMARKS = (
    "SELECT partition, high_watermark FROM partitions WHERE topic_id = ? AND partition IN ({marks})"
)
_FIRST_OPEN = (
    "SELECT partition, MIN(first_offset) FROM open_txns WHERE topic_id = ? "
    "AND first_offset IS NOT NULL GROUP BY partition"
)
_ABORTED_FROM = (
    "SELECT partition, producer_id, first_offset, last_offset FROM aborted_txns "
    "WHERE topic_id = ? AND last_offset >= ? ORDER BY partition, first_offset"
)
_LAST_STABLE = (
    "SELECT MIN(first_offset) FROM open_txns WHERE topic_id = ? AND partition = ? "
    "AND first_offset IS NOT NULL"
)
_EXPIRED = (
    "SELECT transactional_id FROM transactions WHERE state = 'Ongoing' AND started_at IS NOT "
    "NULL AND started_at + timeout_ms / 1000.0 < ?"
)
_UNFINISHED = (
    "SELECT transactional_id FROM transactions WHERE state IN ('PrepareCommit', "
    "'PrepareAbort') AND updated_at < ?"
)
_ALL_TXNS = (
    "SELECT transactional_id, producer_id, epoch, state, timeout_ms, started_at "
    "FROM transactions ORDER BY transactional_id"
)
_ALL_MEMBERS = (
    "SELECT m.transactional_id, t.name, m.partition FROM txn_members m "
    "JOIN topics t ON t.topic_id = m.topic_id ORDER BY m.transactional_id, t.name, m.partition"
)
#: With a topic: its transactions' rows go (the topic's partitions are gone).
PURGE_TOPIC = (
    "DELETE FROM open_txns WHERE topic_id = ?",
    "DELETE FROM aborted_txns WHERE topic_id = ?",
    "DELETE FROM txn_members WHERE topic_id = ?",
)


@dataclass
class _Txn:
    """A row of ``transactions``."""

    transactional_id: str
    producer_id: int
    epoch: int
    state: str
    is_commit: bool
    timeout_ms: int
    started_at: float | None

    def expired(self, now: float) -> bool:
        return (
            self.state == ONGOING
            and self.started_at is not None
            and self.started_at + self.timeout_ms / 1000 < now
        )


class PartitionData(Protocol):
    """Where partitions' rows live: the one metadata database, or each partition's
    shard (``coordinator.shards.ShardedPartitions``). Open transactions and aborted
    ones are partition data: the commit that checks them runs there."""

    def each(
        self,
        topic_id: bytes,
        partitions: Sequence[int],
        fn: Callable[[Any, Callable[[str], str], list[int]], T],
        *,
        write: bool = False,
    ) -> list[T]:
        """``fn(connection, dialect's sql, partitions)`` once per database holding some
        of ``partitions``, each in its own read (or write) transaction."""
        ...


class OneDatabase:
    """``PartitionData`` of an unsharded coordinator: every partition in ``db``."""

    def __init__(self, db: MetadataDatabase) -> None:
        self._db = db

    def each(
        self,
        topic_id: bytes,
        partitions: Sequence[int],
        fn: Callable[[Any, Callable[[str], str], list[int]], T],
        *,
        write: bool = False,
    ) -> list[T]:
        with self._db.write(exclusive=False) if write else self._db.read() as conn:
            return [fn(conn, self._db.dialect.sql, list(partitions))]


class TransactionStore:
    """The transactional ids and their transactions (the ``TransactionCoordinator``
    protocol's docstrings say what each operation does)."""

    def __init__(
        self,
        db: MetadataDatabase,
        check_member: Callable[[str, str, int], None],
        partitions: PartitionData | None = None,
    ) -> None:
        """``db``: the one metadata database, or the catalog; ``check_member(group,
        member_id, generation)``: the Kafka groups' check of a TxnOffsetCommit's member
        (``KafkaGroupStore.check_member``); ``partitions``: where the partitions' rows are
        (None: in ``db``)."""
        self._db = db
        self._q = db.dialect.sql
        self._check_member = check_member
        self._data = partitions or OneDatabase(db)

    # -- reading and writing a transactional id's row ------------------------
    def _load(self, conn: Any, transactional_id: str) -> _Txn | None:
        row = conn.execute(self._q(_TXN), (transactional_id,)).fetchone()
        if row is None:
            return None
        pid, epoch, state, is_commit, timeout_ms, started_at = row
        return _Txn(transactional_id, pid, epoch, state, bool(is_commit), timeout_ms, started_at)

    def _save(self, conn: Any, t: _Txn, now: float) -> None:
        conn.execute(
            self._q(_SET_TXN),
            (
                t.producer_id,
                t.epoch,
                t.state,
                int(t.is_commit),
                t.timeout_ms,
                t.started_at,
                now,
                t.transactional_id,
            ),
        )

    def _owned(self, conn: Any, transactional_id: str, producer_id: int, epoch: int) -> _Txn:
        """The id's row, if ``producer_id`` at ``epoch`` is its current producer."""
        t = self._load(conn, transactional_id)
        if t is None or t.producer_id != producer_id:
            raise InvalidProducerIdMappingError(
                f"Producer {producer_id} is not that of transactional id '{transactional_id}'."
            )
        if epoch < t.epoch:
            raise TransactionFencedError(
                f"Transactional id '{transactional_id}' has a newer producer instance "
                f"(epoch {t.epoch}, not {epoch}): this one is fenced."
            )
        if epoch > t.epoch:
            raise InvalidProducerIdMappingError(
                f"Epoch {epoch} of transactional id '{transactional_id}' was never given out."
            )
        return t

    def _abort_on_timeout(self, conn: Any, t: _Txn, now: float) -> None:
        """Ongoing past its timeout: decide an abort at the next epoch (fencing the
        producer, as Kafka's coordinator does), drop the held offsets."""
        t.state, t.is_commit, t.epoch = PREPARE_ABORT, False, t.epoch + 1
        conn.execute(self._q(_FORGET_OFFSETS), (t.transactional_id,))
        conn.execute(self._q(_FORGET_GROUPS), (t.transactional_id,))
        self._save(conn, t, now)

    def _pending(self, conn: Any, t: _Txn) -> PendingMarkers:
        parts = conn.execute(self._q(_MEMBERS), (t.transactional_id,)).fetchall()
        return PendingMarkers(
            t.transactional_id,
            t.producer_id,
            t.epoch,
            t.state == PREPARE_COMMIT,
            tuple(sorted((bytes(tid), p) for tid, p in parts)),
        )

    def _begin(self, conn: Any, t: _Txn, now: float) -> Exception | None:
        """The first AddPartitions/AddOffsets of a transaction opens it. One that timed
        out is aborted here if the sweep has not done it yet: the error to raise once
        that decision is committed."""
        if t.expired(now):
            return self._time_out(conn, t, now)
        if t.state in _PREPARED:
            raise ConcurrentTransactionsError(
                f"The previous transaction of '{t.transactional_id}' is still ending: retry."
            )
        if t.state in _IDLE:
            conn.execute(self._q(_FORGET_MEMBERS), (t.transactional_id,))
            t.state, t.started_at = ONGOING, now
            self._save(conn, t, now)
        return None

    def _time_out(self, conn: Any, t: _Txn, now: float) -> Exception:
        self._abort_on_timeout(conn, t, now)
        return TransactionFencedError(
            f"The transaction of '{t.transactional_id}' passed its timeout of "
            f"{t.timeout_ms} ms and was aborted."
        )

    # -- the operations --------------------------------------------------------
    def init(
        self, transactional_id: str, timeout_ms: int, producer_id: int = -1, epoch: int = -1
    ) -> TxnProducer:
        if not 0 < timeout_ms <= MAX_TIMEOUT_MS:
            raise InvalidTxnTimeoutError(
                f"Transaction timeout {timeout_ms} ms is not in (0, {MAX_TIMEOUT_MS}]."
            )
        now = clock.now()
        with self._db.write() as conn:
            t = self._load(conn, transactional_id)
            if t is None:
                row = conn.execute(self._q(_NEW_PRODUCER), (now,)).fetchone()
                conn.execute(self._q(_INSERT_TXN), (transactional_id, row[0], timeout_ms, now))
                return TxnProducer(int(row[0]), 0)
            if producer_id >= 0:
                self._owned(conn, transactional_id, producer_id, epoch)
            if t.state in _PREPARED:
                return TxnProducer(t.producer_id, t.epoch, self._pending(conn, t))
            t.timeout_ms = timeout_ms
            if t.state == ONGOING:  # a new instance: abort what the old one left open
                self._abort_on_timeout(conn, t, now)
                return TxnProducer(t.producer_id, t.epoch, self._pending(conn, t))
            if t.epoch + 1 >= _MAX_EPOCH:  # exhausted: a new producer id, as Kafka does
                t.producer_id = conn.execute(self._q(_NEW_PRODUCER), (now,)).fetchone()[0]
                t.epoch = 0
            else:
                t.epoch += 1
            t.state, t.started_at = EMPTY, None
            conn.execute(self._q(_FORGET_MEMBERS), (transactional_id,))
            self._save(conn, t, now)
            return TxnProducer(t.producer_id, t.epoch)

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        partitions: Sequence[TopicPartition],
    ) -> None:
        now = clock.now()
        resolved: dict[bytes, set[int]] = {}
        with self._db.write() as conn:
            t = self._owned(conn, transactional_id, producer_id, epoch)
            for tp in partitions:
                row = conn.execute(self._q(_TOPIC), (tp[0],)).fetchone()
                if row is None:
                    raise TopicNotFoundError(f"Topic '{tp[0]}' not found.")
                if not 0 <= tp[1] < row[1]:
                    raise PartitionNotFoundError(f"Partition {tp[1]} of topic '{tp[0]}' not found.")
                resolved.setdefault(bytes(row[0]), set()).add(tp[1])
            error = self._begin(conn, t, now)
            if error is None:
                conn.executemany(
                    self._q(_ADD_MEMBER),
                    [(transactional_id, tid, p) for tid, ps in resolved.items() for p in ps],
                )
        if error is not None:
            raise error
        # Then the partitions' open rows (in their shards), which the commit checks. The
        # membership first: a member whose row is not written yet gets a marker that
        # closes nothing; a row without membership could never be closed.
        for topic_id, ps in sorted(resolved.items()):

            def open_rows(
                conn: Any, q: Callable[[str], str], part: list[int], topic_id: bytes = topic_id
            ) -> None:
                rows = [(topic_id, p, producer_id, epoch) for p in sorted(part)]
                conn.executemany(q(_OPEN), rows)

            self._data.each(topic_id, sorted(ps), open_rows, write=True)

    def add_group(self, transactional_id: str, producer_id: int, epoch: int, group: str) -> None:
        now = clock.now()
        with self._db.write() as conn:
            t = self._owned(conn, transactional_id, producer_id, epoch)
            error = self._begin(conn, t, now)
            if error is None:
                conn.execute(self._q(_ADD_GROUP), (transactional_id, group))
        if error is not None:
            raise error

    def hold_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        group: str,
        offsets: Mapping[TopicPartition, tuple[int, str]],
        member_id: str = "",
        generation: int = -1,
    ) -> None:
        if member_id:
            self._check_member(group, member_id, generation)
        with self._db.write() as conn:
            t = self._owned(conn, transactional_id, producer_id, epoch)
            if (
                t.state != ONGOING
                or conn.execute(self._q(_HAS_GROUP), (transactional_id, group)).fetchone() is None
            ):
                raise InvalidTxnStateError(
                    f"Group '{group}' was not added to the transaction of "
                    f"'{transactional_id}' (AddOffsetsToTxn first)."
                )
            conn.executemany(
                self._q(_HOLD_OFFSET),
                [
                    (transactional_id, group, tp[0], tp[1], o, meta or "")
                    for tp, (o, meta) in offsets.items()
                ],
            )

    def end(
        self, transactional_id: str, producer_id: int, epoch: int, commit: bool
    ) -> PendingMarkers | None:
        now = clock.now()
        error: Exception | None = None
        with self._db.write() as conn:
            t = self._owned(conn, transactional_id, producer_id, epoch)
            if t.expired(now):
                error = self._time_out(conn, t, now)
            elif t.state in _PREPARED or t.state in (COMPLETE_COMMIT, COMPLETE_ABORT):
                if t.is_commit != commit:
                    raise InvalidTxnStateError(
                        f"The transaction of '{transactional_id}' was decided the other way "
                        f"({t.state})."
                    )
                return self._pending(conn, t) if t.state in _PREPARED else None
            elif t.state != ONGOING:
                raise InvalidTxnStateError(
                    f"'{transactional_id}' has no ongoing transaction to end ({t.state})."
                )
            else:
                return self._decide(conn, t, commit, now)
        assert error is not None
        raise error

    def _decide(self, conn: Any, t: _Txn, commit: bool, now: float) -> PendingMarkers | None:
        """An ongoing transaction decided: a commit's held offsets written, the state
        Prepare* (Complete* when it holds no partition); the markers to write."""
        transactional_id = t.transactional_id
        if commit:
            held = conn.execute(self._q(_HELD_OFFSETS), (transactional_id,)).fetchall()
            conn.executemany(
                self._q(_UPSERT_COMMITTED),
                [(g, topic, p, o, meta, now) for g, topic, p, o, meta in held],
            )
        conn.execute(self._q(_FORGET_OFFSETS), (transactional_id,))
        conn.execute(self._q(_FORGET_GROUPS), (transactional_id,))
        t.state, t.is_commit = (PREPARE_COMMIT if commit else PREPARE_ABORT), commit
        pending = self._pending(conn, t)
        if not pending.partitions:
            t.state, t.started_at = (COMPLETE_COMMIT if commit else COMPLETE_ABORT), None
        self._save(conn, t, now)
        return pending if pending.partitions else None

    def complete(self, transactional_id: str, producer_id: int, epoch: int) -> bool:
        now = clock.now()
        with self._db.write() as conn:
            t = self._load(conn, transactional_id)
            if t is None or t.producer_id != producer_id or t.epoch != epoch:
                raise InvalidProducerIdMappingError(
                    f"Producer {producer_id} at epoch {epoch} is not that of "
                    f"transactional id '{transactional_id}'."
                )
            if t.state not in _PREPARED:
                return t.state in (COMPLETE_COMMIT, COMPLETE_ABORT)
            members = conn.execute(self._q(_MEMBERS), (transactional_id,)).fetchall()
            if self._any_open(producer_id, members):
                return False
            t.state = COMPLETE_COMMIT if t.is_commit else COMPLETE_ABORT
            t.started_at = None
            conn.execute(self._q(_FORGET_MEMBERS), (transactional_id,))
            self._save(conn, t, now)
            return True

    def _any_open(self, producer_id: int, members: Sequence[tuple[Any, int]]) -> bool:
        """Whether the producer still holds a transaction open in one of ``members``."""
        by_topic: dict[bytes, list[int]] = {}
        for tid, p in members:
            by_topic.setdefault(bytes(tid), []).append(p)
        for topic_id, ps in by_topic.items():

            def still_open(
                conn: Any, q: Callable[[str], str], part: list[int], topic_id: bytes = topic_id
            ) -> bool:
                found = rows_in(conn, q, _STILL_OPEN, part, (topic_id, producer_id))
                return any(True for _ in found)

            if any(self._data.each(topic_id, ps, still_open)):
                return True
        return False

    def abort_expired(self, now_ms: int) -> list[PendingMarkers]:
        now = now_ms / 1000
        with self._db.write() as conn:
            out = []
            for (tid,) in conn.execute(self._q(_EXPIRED), (now,)).fetchall():
                t = self._load(conn, tid)
                if t is not None and t.expired(now):
                    self._abort_on_timeout(conn, t, now)
                    out.append(self._pending(conn, t))
            for (tid,) in conn.execute(self._q(_UNFINISHED), (now - STALE_DECISION_S,)).fetchall():
                t = self._load(conn, tid)
                if t is not None:
                    out.append(self._pending(conn, t))
                    self._save(conn, t, now)  # the next sweep waits for this writer
            return out

    def held_offsets(self, group: str) -> list[TopicPartition]:
        with self._db.read() as conn:
            rows = conn.execute(self._q(_HELD_BY_GROUP), (group,)).fetchall()
        return [TopicPartition(t, p) for t, p in rows]

    def list_all(self) -> list[TransactionInfo]:
        with self._db.read() as conn:
            members: dict[str, list[TopicPartition]] = {}
            for tid, name, p in conn.execute(self._q(_ALL_MEMBERS)):
                members.setdefault(tid, []).append(TopicPartition(name, p))
            return [
                TransactionInfo(
                    tid,
                    pid,
                    epoch,
                    state,
                    timeout_ms,
                    -1 if started is None else int(started * 1000),
                    tuple(members.get(tid, ())),
                )
                for tid, pid, epoch, state, timeout_ms, started in conn.execute(self._q(_ALL_TXNS))
            ]

    def stable_offsets(self, wants: Sequence[IndexWant]) -> dict[int, StableView]:
        # A few statements per topic and database, whatever the partition count (a
        # read_committed Fetch of 1,000 partitions asks for all of them at once).
        by_topic: dict[str, list[int]] = {}
        for i, w in enumerate(wants):
            by_topic.setdefault(w.topic, []).append(i)
        out: dict[int, StableView] = {}
        with self._db.read() as conn:
            topics = {name: conn.execute(self._q(_TOPIC), (name,)).fetchone() for name in by_topic}
        for name, idx in by_topic.items():
            row = topics[name]
            if row is None:
                continue
            topic_id, count = bytes(row[0]), row[1]
            idx = [
                i
                for i in idx
                if 0 <= wants[i].partition < count
                and (wants[i].topic_id is None or wants[i].topic_id == topic_id)
            ]
            if idx:
                out.update(self._stable_of_topic(topic_id, [(i, wants[i]) for i in idx]))
        return out

    def _stable_of_topic(
        self, topic_id: bytes, wants: list[tuple[int, IndexWant]]
    ) -> dict[int, StableView]:
        def read(
            conn: Any, q: Callable[[str], str], part: list[int]
        ) -> tuple[dict[int, int], dict[int, int], list[tuple[int, int, int, int]]]:
            hws = dict(rows_in(conn, q, _HIGH_WATERMARKS, part, (topic_id,)))
            firsts = dict(conn.execute(q(_FIRST_OPEN), (topic_id,)).fetchall())
            lowest = min(w.offset for _, w in wants)
            aborted = conn.execute(q(_ABORTED_FROM), (topic_id, lowest)).fetchall()
            return hws, firsts, aborted

        hws: dict[int, int] = {}
        firsts: dict[int, int] = {}
        aborted: dict[int, list[tuple[int, int, int]]] = {}
        for h, f, a in self._data.each(topic_id, sorted({w.partition for _, w in wants}), read):
            hws.update(h)
            firsts.update(f)
            for p, pid, first_offset, last in a:
                aborted.setdefault(p, []).append((pid, first_offset, last))
        out = {}
        for i, w in wants:
            hw = hws.get(w.partition, 0)  # no row yet: a shard placed it while down
            first = firsts.get(w.partition)
            stable = hw if first is None else min(first, hw)
            out[i] = StableView(
                stable,
                tuple(
                    a for a in aborted.get(w.partition, ()) if a[2] >= w.offset and a[1] < stable
                ),
            )
        return out


# -- for the janitors --------------------------------------------------------------------

_ABORTED_ALL = (
    "SELECT producer_id, first_offset, last_offset FROM aborted_txns "
    "WHERE topic_id = ? AND partition = ? ORDER BY first_offset"
)


def partition_transactions(
    conn: Any, q: Any, topic_id: bytes, partition: int
) -> tuple[int | None, list[tuple[int, int, int]]]:
    """A partition's first offset of a transaction still open (None: none is; nothing
    from there on may be tiered, its fate unknown) and its aborted transactions
    (producer id, first offset, abort marker's offset)."""
    first = conn.execute(q(_LAST_STABLE), (topic_id, partition)).fetchone()[0]
    aborted = conn.execute(q(_ABORTED_ALL), (topic_id, partition)).fetchall()
    return first, [(pid, f, last) for pid, f, last in aborted]


# -- inside a commit (MetadataStore._commit_batch_steps) --------------------------------


def open_rows(
    conn: Any, q: Any, chunks: Sequence[ChunkCommit]
) -> dict[tuple[bytes, int, int], tuple[int, int | None] | None]:
    """The open-transaction rows (epoch, first offset) the chunks' transactional batches
    and markers touch, keyed by (topic id, partition, producer id)."""
    keys = sorted(
        {
            (bytes(c.topic_id), c.partition, b.producer_id)
            for c in chunks
            for b in c.producer_batches
            if b.transactional
        }
        | {(bytes(c.topic_id), c.partition, c.marker.producer_id) for c in chunks if c.marker}
    )
    rows = fetch_each(conn, q(_OPEN_ROW), keys) if keys else []
    return {k: None if r is None else (r[0], r[1]) for k, r in zip(keys, rows, strict=True)}


def judge_transactional(
    chunks: Sequence[ChunkCommit],
    bases: Sequence[int],
    rows: Mapping[tuple[bytes, int, int], tuple[int, int | None] | None],
) -> tuple[list[tuple[str, tuple[Any, ...]]], dict[tuple[bytes, int, int], Any]]:
    """One commit's transactional batches and markers against the open rows (``rows``,
    left unchanged; later commits of the same database transaction see ``changed``).

    Returns:
        The statements to run, in order, and the rows they change.

    Raises:
        InvalidTxnStateError: a transactional batch for a partition its transaction did
            not add (or at another epoch): the commit writes nothing.
    """
    steps: list[tuple[str, tuple[Any, ...]]] = []
    changed: dict[tuple[bytes, int, int], tuple[int, int | None] | None] = {}

    def row_of(key: tuple[bytes, int, int]) -> tuple[int, int | None] | None:
        return changed[key] if key in changed else rows.get(key)

    for c, base in zip(chunks, bases, strict=True):
        topic_id = bytes(c.topic_id)
        for b in c.producer_batches:
            if not b.transactional:
                continue
            key = (topic_id, c.partition, b.producer_id)
            row = row_of(key)
            if row is None or row[0] != b.epoch:
                raise InvalidTxnStateError(
                    f"Producer {b.producer_id} at epoch {b.epoch} has no transaction open in "
                    f"partition {c.partition}: AddPartitionsToTxn first (nothing was stored)."
                )
            if row[1] is None:
                changed[key] = (row[0], base + b.relative_offset)
                steps.append((_SET_FIRST, (base + b.relative_offset, *key)))
        if c.marker is not None:
            key = (topic_id, c.partition, c.marker.producer_id)
            row = row_of(key)
            if row is None or row[0] > c.marker.epoch:
                continue  # closed already (a marker written twice), or not ours
            changed[key] = None
            steps.append((_CLOSE, key))
            if not c.marker.commit and row[1] is not None:
                steps.append(
                    (_ABORTED, (topic_id, c.partition, base, c.marker.producer_id, row[1]))
                )
    return steps, changed
