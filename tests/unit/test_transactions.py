"""Transactions in the coordinator (``coordinator.log.transactions``) and their markers
(``LogWriter.write_markers``), on each backend: epochs and fencing, the verification of
transactional batches in the commit, last stable offsets and aborted ranges, offsets held
until the decision, timeouts, and a topic deleted in the middle of a transaction."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from coordinator import clock
from coordinator.client import ChunkCommit, IndexWant, StableView, TopicPartition, TxnProducer
from coordinator.groups.model import CommittedOffset
from coordinator.janitors.tiering import run_tiering
from coordinator.local import LocalCoordinator
from coordinator.log.producers import ProducerBatch
from coordinator.log.transactions import STALE_DECISION_S
from index.log import LogWriter
from segments.batches import read_marker
from segments.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    InvalidTxnTimeoutError,
    ProducerConflictError,
    TransactionFencedError,
)
from segments.memory import MemoryStore
from segments.segment import SegmentBuilder, SegmentReader
from segments.types import Record
from tests.unit.janitor_helpers import Harness

TIMEOUT_MS = 60_000
Env = tuple[LocalCoordinator, LogWriter, MemoryStore]


@pytest.fixture
def env(coord: LocalCoordinator) -> Iterator[Env]:
    store = MemoryStore()
    coord.create_topic("t", 3)
    coord.create_topic("u", 1)
    yield coord, LogWriter(store, coord), store


def _data(
    c: LocalCoordinator,
    topic: str,
    partition: int,
    count: int,
    producer: tuple[int, int, int] | None = None,
    *,
    transactional: bool = True,
) -> int:
    """Commit ``count`` records (no object bytes: the coordinator never reads them);
    returns their base offset."""
    batches: tuple[ProducerBatch, ...] = ()
    if producer is not None:
        pid, epoch, seq = producer
        batches = (ProducerBatch(pid, epoch, seq, count, 0, transactional),)
    chunk = ChunkCommit(
        c.get_topic(topic).topic_id, partition, 0, 100, count, 1, 2, producer_batches=batches
    )
    return c.commit(f"segments/x/{uuid.uuid4().hex}.seg", [chunk])[0]


def _begin(
    c: LocalCoordinator, *parts: TopicPartition, timeout_ms: int = TIMEOUT_MS
) -> TxnProducer:
    """A transaction of a new ``app`` instance with ``parts`` added; its producer."""
    p = c.init_transaction("app", timeout_ms)
    c.add_txn_partitions("app", p.producer_id, p.epoch, list(parts))
    return p


def _stable(c: LocalCoordinator, topic: str, partition: int, offset: int = 0) -> StableView:
    return c.stable_offsets([IndexWant(topic, partition, offset)])[0]


def test_init_gives_ids_and_bumps_the_epoch_of_a_known_one(env: Env) -> None:
    c, _, _ = env
    first = c.init_transaction("app", TIMEOUT_MS)
    assert (first.epoch, first.pending) == (0, None)
    again = c.init_transaction("app", TIMEOUT_MS)
    assert (again.producer_id, again.epoch) == (first.producer_id, 1)
    assert c.init_transaction("other", TIMEOUT_MS).producer_id != first.producer_id
    # KIP-360: the current (id, epoch) may ask again; an older epoch is fenced.
    assert c.init_transaction("app", TIMEOUT_MS, first.producer_id, 1).epoch == 2
    with pytest.raises(TransactionFencedError):
        c.init_transaction("app", TIMEOUT_MS, first.producer_id, 1)
    with pytest.raises(InvalidProducerIdMappingError):
        c.init_transaction("app", TIMEOUT_MS, first.producer_id + 1000, 2)
    for bad in (0, -1, 900_001):
        with pytest.raises(InvalidTxnTimeoutError):
            c.init_transaction("app", bad)


def test_commit_then_markers_move_the_last_stable_offset(env: Env) -> None:
    c, writer, store = env
    p = c.init_transaction("app", TIMEOUT_MS)
    _data(c, "t", 0, 5, transactional=False)  # offsets 0-4, no transaction
    c.add_txn_partitions("app", p.producer_id, p.epoch, [TopicPartition("t", 0)])
    first = _data(c, "t", 0, 3, (p.producer_id, p.epoch, 0))
    assert first == 5
    _data(c, "t", 0, 2, transactional=False)  # 8-9: after the open transaction
    assert _stable(c, "t", 0).last_stable == 5  # read_committed stops at the open one
    assert c.offsets("t", 0).high_watermark == 10
    _data(c, "t", 0, 2, (p.producer_id, p.epoch, 3))
    assert _stable(c, "t", 0).last_stable == 5  # its first offset, not its last
    [info] = c.list_transactions()
    assert (info.state, info.partitions) == ("Ongoing", (TopicPartition("t", 0),))

    pending = c.end_transaction("app", p.producer_id, p.epoch, True)
    assert pending is not None and pending.commit
    assert c.end_transaction("app", p.producer_id, p.epoch, True) == pending  # a retry
    with pytest.raises(InvalidTxnStateError):
        c.end_transaction("app", p.producer_id, p.epoch, False)
    assert _stable(c, "t", 0).last_stable == 5  # undecided until the marker is in
    assert not c.complete_transaction("app", p.producer_id, p.epoch)

    writer.write_markers(pending)
    hw = c.offsets("t", 0).high_watermark
    assert hw == 13  # the marker took offset 12
    assert _stable(c, "t", 0).last_stable == hw
    assert _stable(c, "t", 0).aborted == ()
    assert c.list_transactions()[0].state == "CompleteCommit"
    # The marker is a control batch at its own offset, in an object like any other.
    [ref] = c.lookup("t", 0, 12)
    data = store.get(ref.object_key)
    chunk = SegmentReader(data).chunks[0]
    assert read_marker(data[chunk.position : chunk.position + chunk.length]) == (
        p.producer_id,
        p.epoch,
        True,
    )
    writer.write_markers(pending)  # written twice: harmless
    assert _stable(c, "t", 0).last_stable == c.offsets("t", 0).high_watermark == 14


def test_abort_keeps_the_aborted_range_for_readers(env: Env) -> None:
    c, writer, _ = env
    p = _begin(c, TopicPartition("t", 1), TopicPartition("u", 0))
    _data(c, "t", 1, 4, (p.producer_id, p.epoch, 0))  # 0-3; u-0 gets no record
    pending = c.end_transaction("app", p.producer_id, p.epoch, False)
    assert pending is not None and len(pending.partitions) == 2
    writer.write_markers(pending)
    assert c.offsets("t", 1).high_watermark == 5  # abort marker at 4
    assert c.offsets("u", 0).high_watermark == 1  # a marker alone
    view = _stable(c, "t", 1)
    assert (view.last_stable, view.aborted) == (5, ((p.producer_id, 0, 4),))
    assert _stable(c, "t", 1, offset=4).aborted == ((p.producer_id, 0, 4),)  # marker in range
    assert _stable(c, "t", 1, offset=5).aborted == ()
    assert _stable(c, "u", 0).aborted == ()  # no record, no aborted range
    # The next transaction of the same producer starts afresh.
    c.add_txn_partitions("app", p.producer_id, p.epoch, [TopicPartition("t", 1)])
    _data(c, "t", 1, 1, (p.producer_id, p.epoch, 4))
    assert _stable(c, "t", 1).last_stable == 5
    assert _stable(c, "t", 1).aborted == ((p.producer_id, 0, 4),)
    # DeleteRecords (and retention) past the abort marker forget the aborted range.
    c.delete_records("t", 1, 5)
    assert _stable(c, "t", 1).aborted == ()


def test_transactional_batches_need_their_partition_added_at_their_epoch(env: Env) -> None:
    c, writer, _ = env
    p = c.init_transaction("app", TIMEOUT_MS)
    with pytest.raises(InvalidTxnStateError):
        _data(c, "t", 2, 1, (p.producer_id, p.epoch, 0))  # never added
    assert c.offsets("t", 2).high_watermark == 0  # nothing stored
    c.add_txn_partitions("app", p.producer_id, p.epoch, [TopicPartition("t", 2)])
    _data(c, "t", 2, 1, (p.producer_id, p.epoch, 0))
    # A new instance takes over: the ongoing transaction is aborted at the next epoch.
    new = c.init_transaction("app", TIMEOUT_MS)
    assert new.pending is not None and not new.pending.commit
    assert new.pending.epoch == p.epoch + 1
    with pytest.raises(ConcurrentTransactionsError):
        c.add_txn_partitions("app", p.producer_id, new.pending.epoch, [TopicPartition("t", 2)])
    # The zombie is fenced at every step, and its late batch is refused by the commit.
    with pytest.raises(TransactionFencedError):
        c.add_txn_partitions("app", p.producer_id, p.epoch, [TopicPartition("t", 2)])
    with pytest.raises(TransactionFencedError):
        c.end_transaction("app", p.producer_id, p.epoch, True)
    writer.write_markers(new.pending)
    with pytest.raises((InvalidTxnStateError, ProducerConflictError)):
        _data(c, "t", 2, 1, (p.producer_id, p.epoch, 1))
    after = c.init_transaction("app", TIMEOUT_MS)
    assert (after.epoch, after.pending) == (p.epoch + 2, None)
    assert _stable(c, "t", 2).aborted == ((p.producer_id, 0, 1),)


def test_offsets_in_a_transaction_are_written_by_its_commit_only(env: Env) -> None:
    c, _, _ = env
    tp = TopicPartition("t", 0)
    for commit, expected in ((False, {}), (True, {tp: CommittedOffset(42, "m")})):
        p = c.init_transaction("app", TIMEOUT_MS)
        with pytest.raises(InvalidTxnStateError):  # AddOffsetsToTxn first
            c.txn_commit_offsets("app", p.producer_id, p.epoch, "g", {tp: (42, "m")})
        c.add_txn_group("app", p.producer_id, p.epoch, "g")
        c.txn_commit_offsets("app", p.producer_id, p.epoch, "g", {tp: (42, "m")})
        assert c.kafka_committed("g") == {}  # held until the decision
        assert c.held_offsets("g") == [tp] and c.held_offsets("other") == []
        assert c.end_transaction("app", p.producer_id, p.epoch, commit) is None  # no partition
        assert c.kafka_committed("g") == expected
        assert c.held_offsets("g") == []
        assert c.list_transactions()[0].state == ("CompleteCommit" if commit else "CompleteAbort")


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, writer, _ = env
    p = _begin(c, TopicPartition("t", 0), timeout_ms=1_000)
    _data(c, "t", 0, 2, (p.producer_id, p.epoch, 0))
    now = clock.now()
    assert c.abort_expired_transactions(int(now * 1000)) == []  # not yet
    later = now + 2
    monkeypatch.setattr(clock, "now", lambda: later)
    [pending] = c.abort_expired_transactions(int(later * 1000))
    assert (pending.commit, pending.epoch) == (False, p.epoch + 1)
    with pytest.raises(TransactionFencedError):
        c.end_transaction("app", p.producer_id, p.epoch, True)
    # Nobody wrote the markers (the sweeping agent died): handed out again once stale.
    assert c.abort_expired_transactions(int(later * 1000)) == []
    stale = later + STALE_DECISION_S + 1
    monkeypatch.setattr(clock, "now", lambda: stale)
    [again] = c.abort_expired_transactions(int(stale * 1000))
    assert again == pending
    writer.write_markers(again)
    assert _stable(c, "t", 0).last_stable == c.offsets("t", 0).high_watermark == 3
    assert _stable(c, "t", 0).aborted == ((p.producer_id, 0, 2),)


def test_end_of_a_timed_out_transaction_fences_without_the_sweep(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, _, _ = env
    p = _begin(c, TopicPartition("t", 0), timeout_ms=1_000)
    later = clock.now() + 2
    monkeypatch.setattr(clock, "now", lambda: later)
    with pytest.raises(TransactionFencedError):
        c.end_transaction("app", p.producer_id, p.epoch, True)
    # The abort it decided is kept (the producer's request failed, the decision did not).
    [info] = c.list_transactions()
    assert (info.state, info.epoch) == ("PrepareAbort", p.epoch + 1)


def test_a_topic_deleted_mid_transaction_gets_no_marker(env: Env) -> None:
    c, writer, _ = env
    p = _begin(c, TopicPartition("t", 0), TopicPartition("u", 0))
    _data(c, "t", 0, 1, (p.producer_id, p.epoch, 0))
    _data(c, "u", 0, 1, (p.producer_id, p.epoch, 0))
    pending = c.end_transaction("app", p.producer_id, p.epoch, True)
    assert pending is not None
    c.delete_topic("u")
    writer.write_markers(pending)
    assert c.list_transactions()[0].state == "CompleteCommit"
    assert _stable(c, "t", 0).last_stable == c.offsets("t", 0).high_watermark == 2
    c.create_topic("u", 1)  # a new log: nothing of the old transaction
    assert _stable(c, "u", 0).last_stable == 0


def test_the_operations_over_the_coordinators_http_api(coord: LocalCoordinator) -> None:
    """Every value crosses the wire typed: pending markers' (topic id, partition) pairs,
    held offsets keyed by TopicPartition, the errors."""
    from starlette.testclient import TestClient

    from coordinator.http.client import http_coordinator
    from coordinator.http.server import create_app

    coord.create_topic("t", 2)
    with TestClient(create_app(coord)) as client:
        c = http_coordinator("http://testserver", client=client)
        p = c.init_transaction("app", TIMEOUT_MS)
        c.add_txn_partitions("app", p.producer_id, p.epoch, [TopicPartition("t", 1)])
        c.add_txn_group("app", p.producer_id, p.epoch, "g")
        c.txn_commit_offsets("app", p.producer_id, p.epoch, "g", {TopicPartition("t", 1): (7, "")})
        with pytest.raises(TransactionFencedError):
            c.end_transaction("app", p.producer_id, p.epoch - 1, True)
        pending = c.end_transaction("app", p.producer_id, p.epoch, True)
        assert pending is not None
        assert pending.partitions == ((coord.get_topic("t").topic_id, 1),)
        assert c.kafka_committed("g") == {TopicPartition("t", 1): CommittedOffset(7, "")}
        LogWriter(MemoryStore(), c).write_markers(pending)
        [info] = c.list_transactions()
        assert (info.state, info.partitions) == ("CompleteCommit", ())
        view = c.stable_offsets([IndexWant("t", 1, 0), IndexWant("nope", 0, 0)])
        assert set(view) == {0} and view[0].last_stable == 1


def _txn_batch(
    c: LocalCoordinator, store: MemoryStore, topic: str, producer: tuple[int, int, int], n: int
) -> int:
    """``n`` records of a transactional producer in their own object, committed; returns
    their base offset."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    pid, epoch, seq = producer
    raw = DefaultRecordBatchBuilder(2, 0, 1, pid, epoch, seq, 1 << 20)
    for i in range(n):
        raw.append(i, 1000 + i, None, b"txn-%d-%d" % (pid, seq + i), [])
    topic_id = c.get_topic(topic).topic_id
    seg = SegmentBuilder()
    seg.append_batch(topic_id, 0, bytes(raw.build()), n, 1000, 1000 + n - 1)
    data, [chunk] = seg.build()
    key = f"segments/tx/{uuid.uuid4().hex}.seg"
    store.put(key, data)
    batch = ProducerBatch(pid, epoch, seq, n, 0, transactional=True)
    commit = ChunkCommit(topic_id, 0, chunk.position, chunk.length, n, 1000, 1000 + n - 1, (batch,))
    return c.commit(key, [commit])[0]


def test_tiering_keeps_committed_records_drops_aborted_ones_and_stops_at_an_open_one(
    h: Harness,
) -> None:
    """Tier rows keep no producer id, so the tier must hold committed history only: the
    records of an aborted transaction and every marker are left out (their offsets
    become gaps, as compaction's), and nothing from an open transaction's first offset
    on is tiered until it is decided."""
    c = h.coordinator
    c.create_topic("t", 1)
    c.create_topic("u", 1)
    plain = [Record(None, b"p%d" % i, 900 + i) for i in range(3)]
    assert h.produce("t", 0, plain) == 0  # 0-2
    a = c.init_transaction("a", TIMEOUT_MS)
    c.add_txn_partitions("a", a.producer_id, a.epoch, [TopicPartition("t", 0)])
    assert _txn_batch(c, h.store, "t", (a.producer_id, a.epoch, 0), 2) == 3  # 3-4
    aborted = c.end_transaction("a", a.producer_id, a.epoch, False)
    assert aborted is not None
    h.writer.write_markers(aborted)  # 5
    h.produce("t", 0, [Record(None, b"p6", 906)])  # 6
    b = c.init_transaction("b", TIMEOUT_MS)
    c.add_txn_partitions("b", b.producer_id, b.epoch, [TopicPartition("t", 0)])
    assert _txn_batch(c, h.store, "t", (b.producer_id, b.epoch, 0), 1) == 7
    committed = c.end_transaction("b", b.producer_id, b.epoch, True)
    assert committed is not None
    h.writer.write_markers(committed)  # 8
    c.add_txn_partitions("b", b.producer_id, b.epoch, [TopicPartition("t", 0)])
    assert _txn_batch(c, h.store, "t", (b.producer_id, b.epoch, 1), 1) == 9  # open
    h.produce("t", 0, [Record(None, b"p10", 910)])  # 10
    before = [r.offset for r in h.walk("t", 0)]
    assert before == [0, 1, 2, 3, 4, 6, 7, 9, 10]  # read_uncommitted: markers never
    assert _stable(c, "t", 0).aborted == ((a.producer_id, 3, 5),)

    run_tiering(h.ctx(), h.config())
    # Kept: an agent may still serve the old segment from its index cache, whose records
    # a read_committed Kafka consumer must be told to drop (a Fetch of the tier object
    # sends the marker again instead, test below).
    assert _stable(c, "t", 0).aborted == ((a.producer_id, 3, 5),)
    topic_id = c.get_topic("t").topic_id
    rows = h.catalog.rows(topic_id, 0)
    assert [(r.kind, r.base_offset, r.end_offset) for r in rows] == [
        ("parquet", 0, 9),
        ("segment", 9, 10),
        ("segment", 10, 11),
    ]
    after = h.walk("t", 0)
    assert [r.offset for r in after] == [0, 1, 2, 6, 7, 9, 10]
    assert after[4].value == b"txn-%d-0" % b.producer_id
    assert [r.offset for r in h.reader.read("t", 0, 3)] == [6, 7, 9, 10]
    # A partition holding only a marker is left as it is (a tier object needs a row).
    u = c.init_transaction("u", TIMEOUT_MS)
    c.add_txn_partitions("u", u.producer_id, u.epoch, [TopicPartition("u", 0)])
    alone = c.end_transaction("u", u.producer_id, u.epoch, False)
    assert alone is not None
    h.writer.write_markers(alone)
    run_tiering(h.ctx(), h.config())
    [row] = h.catalog.rows(c.get_topic("u").topic_id, 0)
    assert (row.kind, h.reader.read("u", 0, 0)) == ("segment", [])


def _mixed_log(h: Harness) -> tuple[int, int]:
    """Partition t-0: plain 0, aborted 1-3 with plain 4 among them, abort marker 5,
    committed 6-7, commit marker 8, open 9, plain 10. Returns the two producer ids."""
    c = h.coordinator
    c.create_topic("t", 1)
    h.produce("t", 0, [Record(None, b"p0", 900)])  # 0
    a = c.init_transaction("a", TIMEOUT_MS)
    c.add_txn_partitions("a", a.producer_id, a.epoch, [TopicPartition("t", 0)])
    _txn_batch(c, h.store, "t", (a.producer_id, a.epoch, 0), 3)  # 1-3
    h.produce("t", 0, [Record(None, b"p4", 904)])  # 4: between the aborted records
    pending = c.end_transaction("a", a.producer_id, a.epoch, False)
    assert pending is not None
    h.writer.write_markers(pending)  # 5
    b = c.init_transaction("b", TIMEOUT_MS)
    c.add_txn_partitions("b", b.producer_id, b.epoch, [TopicPartition("t", 0)])
    _txn_batch(c, h.store, "t", (b.producer_id, b.epoch, 0), 2)  # 6-7
    pending = c.end_transaction("b", b.producer_id, b.epoch, True)
    assert pending is not None
    h.writer.write_markers(pending)  # 8
    c.add_txn_partitions("b", b.producer_id, b.epoch, [TopicPartition("t", 0)])
    _txn_batch(c, h.store, "t", (b.producer_id, b.epoch, 2), 1)  # 9: open
    h.produce("t", 0, [Record(None, b"p10", 910)])  # 10
    return a.producer_id, b.producer_id


def test_rest_consumers_read_committed_records_and_move_past_markers(h: Harness) -> None:
    """REST consumers (v2 instances, v3 reads, the group stream all read through
    ``read_round_robin``): read_committed stops at the last stable offset and leaves
    out aborted records; a partition read to its end moves past its markers, under
    either isolation level."""
    from service.v2.consumers import read_round_robin

    _mixed_log(h)
    tp = TopicPartition("t", 0)
    records, new, _ = read_round_robin(h.reader, {tp: 0}, 1 << 20, read_committed=True)  # type: ignore[arg-type]
    assert ([r.offset for r in records], new[tp]) == ([0, 4, 6, 7], 9)
    records, new, _ = read_round_robin(h.reader, {tp: 5}, 1 << 20, read_committed=True)  # type: ignore[arg-type]
    assert ([r.offset for r in records], new[tp]) == ([6, 7], 9)
    records, new, _ = read_round_robin(h.reader, {tp: 0}, 1 << 20)  # type: ignore[arg-type]
    assert ([r.offset for r in records], new[tp]) == ([0, 1, 2, 3, 4, 6, 7, 9, 10], 11)
    # One record at a time: positions never pass a record not returned.
    records, new, _ = read_round_robin(h.reader, {tp: 0}, 1, max_records=1, read_committed=True)  # type: ignore[arg-type]
    assert ([r.offset for r in records], new[tp]) == ([0], 1)
    records, new, _ = read_round_robin(h.reader, {tp: 1}, 1, max_records=1, read_committed=True)  # type: ignore[arg-type]
    assert ([r.offset for r in records], new[tp]) == ([4], 5)


def test_spark_reads_committed_records_by_default(h: Harness) -> None:
    """A Spark batch read (planned and scanned without Spark) of a partition holding plain
    records, an aborted and a committed transaction and an open one: by default
    (read_committed) it ends at the last stable offset and leaves out the aborted
    records and every marker; ``kafka.isolation.level=read_uncommitted`` reads every
    record up to the high watermark. A stream's offsets stop at the same place."""
    from spark.options import parse_options
    from spark.plan import plan_read
    from spark.scan import read_task
    from spark.stream import current_offsets

    c = h.coordinator
    _mixed_log(h)

    def read(**extra: str) -> tuple[list[int], tuple[int, int]]:
        opts = parse_options({"subscribe": "t", "db": "sqlite:///x", "store": "memory://", **extra})
        plan = plan_read(opts, c, h.store)
        offsets = [
            o
            for task in plan.tasks
            for batch in read_task(h.store, task, ("offset",))
            for o in batch.column(0).to_pylist()
        ]
        return sorted(offsets), plan.snapshot[("t", 0)]

    assert read() == ([0, 4, 6, 7], (0, 9))
    assert read(**{"kafka.isolation.level": "read_uncommitted"}) == (
        [0, 1, 2, 3, 4, 6, 7, 9, 10],
        (0, 11),
    )
    with pytest.raises(ValueError, match=r"kafka\.isolation\.level"):
        read(**{"kafka.isolation.level": "committed"})
    stream = parse_options(
        {"subscribe": "t", "db": "sqlite:///x", "store": "memory://"}, streaming=True
    )
    assert current_offsets(stream, c)[("t", 0)].high_watermark == 9
    # Tiered, the same read gives the same records.
    run_tiering(h.ctx(), h.config())
    assert read() == ([0, 4, 6, 7], (0, 9))


def test_commit_atomic_commits_every_object_or_none(coord: LocalCoordinator) -> None:
    """Several objects in one transaction (a Spark micro-batch): one object naming a
    partition the topic lacks and none is committed; the same objects again answer the
    same offsets; objects of which only some were committed before are refused."""
    from segments.errors import CommitConflictError, PartitionNotFoundError

    coord.create_topic("a", 2)
    tid = coord.get_topic("a").topic_id

    def obj(partition: int, n: int = 2) -> tuple[str, list[ChunkCommit]]:
        return (
            f"segments/at/{uuid.uuid4().hex}.seg",
            [ChunkCommit(tid, partition, 0, 10, n, 1, 2)],
        )

    good, bad = obj(0), obj(5)
    with pytest.raises(PartitionNotFoundError):
        coord.commit_atomic([good, bad])
    assert coord.offsets("a", 0).high_watermark == 0  # the good one is not in either
    second = obj(1, 3)
    assert coord.commit_atomic([good, second]) == [[0], [0]]
    assert coord.commit_atomic([good, second]) == [[0], [0]]  # a retry
    third = obj(0)
    coord.commit(*third)
    with pytest.raises(CommitConflictError):
        coord.commit_atomic([third, obj(1)])
    assert coord.offsets("a", 1).high_watermark == 3
    with pytest.raises(ValueError):
        coord.commit_atomic([good, good])


def test_txn_offsets_of_a_group_member_need_it_in_the_group_at_its_generation(
    env: Env,
) -> None:
    """KIP-447: TxnOffsetCommit names the consumer whose records the transaction
    transformed; a member that left (or a zombie of an older generation) cannot commit
    its old partitions' offsets. Without a member id nothing is checked."""
    from segments.errors import ConsumerNotFoundError, StaleGenerationError

    c, _, _ = env
    tp = TopicPartition("t", 0)
    joined = c.kafka_join("g", "m-1", protocols=[("range", b"")], require_member_id=False)
    assert joined.status == "done"
    p = c.init_transaction("app", TIMEOUT_MS)
    c.add_txn_group("app", p.producer_id, p.epoch, "g")
    c.txn_commit_offsets(
        "app", p.producer_id, p.epoch, "g", {tp: (3, "")}, "m-1", joined.generation
    )
    with pytest.raises(StaleGenerationError):
        c.txn_commit_offsets(
            "app", p.producer_id, p.epoch, "g", {tp: (4, "")}, "m-1", joined.generation - 1
        )
    with pytest.raises(ConsumerNotFoundError):
        c.txn_commit_offsets("app", p.producer_id, p.epoch, "g", {tp: (4, "")}, "gone", 1)
    c.txn_commit_offsets("app", p.producer_id, p.epoch, "g", {tp: (5, "")})  # no member named
    assert c.end_transaction("app", p.producer_id, p.epoch, True) is None
    assert c.kafka_committed("g") == {tp: CommittedOffset(5, "")}


def test_a_read_committed_fetch_of_a_tier_object_sends_its_abort_markers_again(
    h: Harness,
) -> None:
    """Tiering leaves aborted records and markers out; a read_committed Kafka consumer is
    still told of the aborted transaction (an agent may serve the old segment from its
    cache), and would wait for its marker, dropping that producer's later batches. So a
    Fetch of the tier object sends the abort marker at its offset, among the rows."""
    import struct

    from index.cache import IndexCache
    from segments.batches import iter_batches
    from service.kafka.handlers import _read_partitions
    from service.read_cache import CachingLogReader, RangeCache

    a_pid, _ = _mixed_log(h)
    run_tiering(h.ctx(), h.config())
    reader = CachingLogReader(
        h.store, h.coordinator, RangeCache(1 << 20, 1 << 20), IndexCache(100, 60.0)
    )
    state = SimpleNamespace(coordinator=h.coordinator, reader=reader, txns=h.coordinator)
    try:
        (read,) = _read_partitions(state, [("t", 0, 0, 1 << 20, None)], 1 << 20, True)  # type: ignore[arg-type]
    finally:
        reader.close()
    data = bytes(read.records)
    batches = []
    for pos, end, _, count in iter_batches(data):
        base = struct.unpack_from(">q", data, pos)[0]
        batches.append((base, count, read_marker(data[pos:end])))
    assert batches == [(0, 2, None), (5, 1, (a_pid, 0, False)), (6, 2, None)]  # rows 0, 4 | 6, 7
    assert (read.last_stable, read.aborted) == (9, ((a_pid, 1, 5),))
