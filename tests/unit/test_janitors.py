"""Tiering, retention, compaction, GC and leases, in process (SQLite file, memory store)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import pytest

from coordinator.janitors.catalog import Catalog, IndexRow, NewRow
from coordinator.janitors.context import JanitorContext, JanitorReport
from coordinator.janitors.gc import run_gc
from coordinator.janitors.leases import LeaseLostError, LeaseStore
from coordinator.janitors.retention import run_retention
from coordinator.janitors.tiering import (
    Tierer,
    TierRun,
    plan_fetches,
    run_compaction,
    run_tiering,
)
from index.cache import IndexCache
from segments.errors import BatchTooLargeError, CorruptSegmentError, IndexHoleError
from segments.segment import SegmentBuilder
from segments.store import ObjectInfo, ObjectStore
from segments.types import Record
from service.read_cache import CachingLogReader, RangeCache
from tests.unit.janitor_helpers import Harness, records


def _fill(h: Harness, topic: str = "t", flushes: int = 6, per: int = 25) -> None:
    h.coordinator.create_topic(topic, 2)
    now_ms = int(h.clock() * 1000)
    for f in range(flushes):
        for p in (0, 1):
            h.produce(topic, p, records(per, now_ms + f * 1000, tag=f"{f}.{p}."))


def test_tiering_keeps_every_record_at_every_offset(h: Harness) -> None:
    """Invariant 5: each offset reads the same key, value, timestamp and headers after tiering,
    through LogReader and CachingLogReader; the index shrinks to one parquet entry."""
    _fill(h)
    before = {p: h.walk("t", p) for p in (0, 1)}
    assert len(h.catalog.rows(h.coordinator.get_topic("t").topic_id, 0)) == 6
    report = run_tiering(h.ctx(), h.config())
    assert report.rows_replaced == 12 and report.objects_written == 2 and report.aborted == 0
    topic_id = h.coordinator.get_topic("t").topic_id
    for p in (0, 1):
        rows = h.catalog.rows(topic_id, p)
        assert [(r.kind, r.base_offset, r.record_count) for r in rows] == [("parquet", 0, 150)]
        assert rows[0].object_key.startswith(f"tiered/t/partition={p}/")
        assert h.walk("t", p) == before[p]
        caching = CachingLogReader(
            h.store, h.coordinator, RangeCache(1 << 20, 64 << 20), IndexCache(100, 30.0)
        )
        try:
            assert list(caching.records("t", p, 0)) == before[p]
            assert list(caching.records("t", p, 77)) == before[p][77:]
        finally:
            caching.close()
    # Timestamps lookups go through the tier object too.
    target = before[0][40]
    assert h.reader.offset_for_timestamp("t", 0, target.timestamp_ms) == 40


def test_tiering_respects_age_and_size_thresholds(h: Harness) -> None:
    """Chunks younger than tier_age_s stay segments until the untiered bytes pass the size."""
    _fill(h, flushes=2)
    report = run_tiering(h.ctx(), h.config(tier_age_s=3600.0))
    assert report.rows_replaced == 0
    report = run_tiering(h.ctx(), h.config(tier_age_s=3600.0, tier_untiered_bytes=1))
    assert report.rows_replaced == 4


def test_crash_between_put_and_swap_leaves_reads_alone_and_gc_collects_the_object(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiering run that dies after its PUT: reads unchanged, the stray object is an orphan
    deleted by the first GC run past the grace period (and not before)."""
    _fill(h, flushes=3)
    before = h.walk("t", 0)

    def crash(*args: object, **kwargs: object) -> bool:
        raise RuntimeError("killed before the index swap")

    monkeypatch.setattr(Catalog, "swap", crash)
    with pytest.raises(RuntimeError):
        run_tiering(h.ctx(), h.config(), "t")
    monkeypatch.undo()
    stray = {k for k in h.store.key_set() if k.startswith("tiered/")}
    # Both partitions' runs are rewritten in parallel: the second may be PUT before the
    # first swap crashes, and is then a stray too.
    assert 1 <= len(stray) <= 2
    assert h.walk("t", 0) == before
    assert run_gc(h.ctx(), 60.0).orphans_deleted == 0  # within grace
    h.clock.advance(61)
    report = run_gc(h.ctx(), 60.0)
    assert report.orphans_deleted == len(stray) and not (stray & h.store.key_set())
    assert h.walk("t", 0) == before


def test_gc_deletes_replaced_objects_only_after_grace(h: Harness) -> None:
    """Objects replaced by tiering stay for the grace period (readers in flight), then go;
    the tier objects the index references are never deleted."""
    _fill(h, flushes=3)
    segments_before = {k for k in h.store.key_set() if k.startswith("segments/")}
    refs = h.coordinator.lookup("t", 0, 0)  # a reader in flight, holding old entries
    run_tiering(h.ctx(), h.config())
    h.clock.advance(59)
    assert run_gc(h.ctx(), 60.0).objects_deleted == 0
    assert h.reader.fetch_chunk(refs[0])  # the in-flight reader still gets its bytes
    h.clock.advance(2)
    report = run_gc(h.ctx(), 60.0)
    assert report.objects_deleted == len(segments_before) and report.orphans_deleted == 0
    assert not (segments_before & h.store.key_set())
    assert len([k for k in h.store.key_set() if k.startswith("tiered/")]) == 2
    assert len(h.walk("t", 0)) == 75 and len(h.walk("t", 1)) == 75


def test_swap_aborts_when_entries_changed(h: Harness) -> None:
    """Tiering racing retention: the entries tiering read are gone, so its swap changes nothing
    and its object is left for GC."""
    _fill(h, flushes=2)
    topic_id = h.coordinator.get_topic("t").topic_id
    rows = h.catalog.rows(topic_id, 0)
    assert h.catalog.advance_log_start(topic_id, 0, rows[0].end_offset, h.clock()) == 25

    new = NewRow("tiered/x", 10, 0, 50, 0, 0)
    assert not h.catalog.swap(topic_id, 0, rows, [new], h.clock())
    assert [r.base_offset for r in h.catalog.rows(topic_id, 0)] == [25]


def test_retention_ms_drops_exactly_the_expired_entries(h: Harness) -> None:
    """retention.ms: entries whose newest record is older than now - retention.ms go, the
    oldest first, stopping at the first live one; log-start moves to their end."""
    h.coordinator.create_topic("r", 1, {"retention.ms": "10000"})
    now_ms = int(h.clock() * 1000)
    for age_s in (30, 20, 11, 5, 25, 1):  # the 25 s one is behind a live entry: stays
        h.produce("r", 0, records(10, now_ms - age_s * 1000 - 10))
    report = run_retention(h.ctx())
    assert h.coordinator.offsets("r", 0).log_start == 30
    assert report.rows_dropped == 3
    recs = h.walk("r", 0)
    assert [r.offset for r in recs] == list(range(30, 60))
    assert h.coordinator.lookup("r", 0, 0)[0].base_offset == 30


def test_retention_follows_the_cluster_wide_broker_config(h: Harness) -> None:
    """log.retention.ms set cluster-wide applies to a topic without an override (source
    DYNAMIC_DEFAULT_BROKER_CONFIG); a topic's own retention.ms still wins."""
    h.coordinator.create_topic("inherits", 1)
    h.coordinator.create_topic("keeps", 1, {"retention.ms": "-1"})
    now_ms = int(h.clock() * 1000)
    for topic in ("inherits", "keeps"):
        h.produce(topic, 0, records(10, now_ms - 60_000))
        h.produce(topic, 0, records(10, now_ms - 1_000))
    run_retention(h.ctx())
    assert h.coordinator.offsets("inherits", 0).log_start == 0  # Kafka's 7 days: all live
    h.coordinator.alter_broker_configs({"log.retention.ms": "10000"})
    run_retention(h.ctx())
    assert h.coordinator.offsets("inherits", 0).log_start == 10
    assert h.coordinator.offsets("keeps", 0).log_start == 0


def test_retention_bytes_keeps_at_least_the_limit(h: Harness) -> None:
    """retention.bytes: the oldest entries go while what stays is >= the limit (Kafka's rule)."""
    h.coordinator.create_topic("b", 1, {"retention.bytes": "0", "retention.ms": "-1"})
    h.coordinator.alter_configs("b", {"retention.bytes": "1"})
    for _ in range(5):
        h.produce("b", 0, records(10, 1000))
    topic_id = h.coordinator.get_topic("b").topic_id
    lengths = [r.length for r in h.catalog.rows(topic_id, 0)]
    limit = sum(lengths[-2:])  # exactly the two newest entries fit
    h.coordinator.alter_configs("b", {"retention.bytes": str(limit)})
    run_retention(h.ctx())
    assert h.coordinator.offsets("b", 0).log_start == 30
    h.coordinator.alter_configs("b", {"retention.bytes": str(limit + 1)})
    run_retention(h.ctx())  # one byte more than two entries hold: nothing more goes
    assert h.coordinator.offsets("b", 0).log_start == 30
    h.coordinator.alter_configs("b", {"retention.bytes": str(limit - 1)})
    run_retention(h.ctx())  # dropping one more would leave less than the limit
    assert h.coordinator.offsets("b", 0).log_start == 30
    h.coordinator.alter_configs("b", {"retention.bytes": str(lengths[-1])})
    run_retention(h.ctx())
    assert h.coordinator.offsets("b", 0).log_start == 40
    assert [r.offset for r in h.walk("b", 0)] == list(range(40, 50))


def test_compact_only_topics_keep_everything_under_retention(h: Harness) -> None:
    """cleanup.policy=compact: retention.ms does not apply (Kafka)."""
    h.coordinator.create_topic("c", 1, {"cleanup.policy": "compact", "retention.ms": "1"})
    h.produce("c", 0, records(5, 1000, key_mod=2))
    run_retention(h.ctx())
    assert h.coordinator.offsets("c", 0).log_start == 0


def test_readers_skip_records_below_log_start_in_a_straddling_entry(h: Harness) -> None:
    """An entry straddling log-start stays, but no reader returns its records below it."""
    h.coordinator.create_topic("s", 1)
    h.produce("s", 0, records(10, 1000))
    h.produce("s", 0, records(10, 2000))
    topic_id = h.coordinator.get_topic("s").topic_id
    h.catalog.advance_log_start(topic_id, 0, 15, h.clock())
    assert [r.base_offset for r in h.catalog.rows(topic_id, 0)] == [10]
    assert [r.offset for r in h.reader.read("s", 0, 0)] == list(range(15, 20))
    caching = CachingLogReader(
        h.store, h.coordinator, RangeCache(1 << 20, 1 << 20), IndexCache(100, 30.0)
    )
    try:
        assert [r.offset for r in caching.records("s", 0, 3)] == list(range(15, 20))
    finally:
        caching.close()


def test_compaction_keeps_the_latest_record_per_key_and_honours_tombstones(h: Harness) -> None:
    """After tiering and compaction: per key only the highest offset survives, at its offset;
    keyless records stay; a latest tombstone stays until delete.retention.ms has passed."""
    h.coordinator.create_topic("c", 1, {"cleanup.policy": "compact", "delete.retention.ms": "5000"})
    now_ms = int(h.clock() * 1000)
    sent: list[Record] = []
    for f in range(4):
        batch = [
            Record(f"k{(i * 7 + f) % 6}".encode(), f"{f}.{i}".encode(), now_ms, ())
            for i in range(9)
        ]
        batch.append(Record(None, b"keyless", now_ms, ()))
        if f == 3:
            batch.append(Record(b"k0", None, now_ms, ()))  # tombstone: latest for k0
        sent.extend(batch)
        h.produce("c", 0, batch)
    run_tiering(h.ctx(), h.config())
    run_compaction(h.ctx(), h.config())
    latest: dict[bytes | None, int] = {}
    for off, r in enumerate(sent):
        latest[r.key] = off
    expected = [off for off, r in enumerate(sent) if r.key is None or latest[r.key] == off]
    got = h.walk("c", 0)
    assert [r.offset for r in got] == expected
    assert all(got_r.value == sent[got_r.offset].value for got_r in got)
    assert any(r.key == b"k0" and r.value is None for r in got)  # tombstone still young
    assert h.coordinator.offsets("c", 0).high_watermark == len(sent)
    h.clock.advance(6)
    report = run_compaction(h.ctx(), h.config())
    assert report.records_dropped == 1
    got = h.walk("c", 0)
    assert [r.offset for r in got] == [o for o in expected if sent[o].key != b"k0"]
    # Nothing more to drop: a third run rewrites nothing.
    assert run_compaction(h.ctx(), h.config()).objects_written == 0


def test_lease_excludes_a_second_holder_until_expiry_or_release(h: Harness) -> None:
    """Two holders on one database: only one gets the lease; the other gets it once it expires
    (and the first then fails to renew and fails its check) or once it is released."""
    clock = h.clock
    a = LeaseStore(h.coordinator.db, ttl_s=10.0, now=clock)
    b = LeaseStore(h.coordinator.db, ttl_s=10.0, now=clock)
    la = a.acquire("tier", "A")
    assert la is not None and la.token == 1
    assert b.acquire("tier", "B") is None
    assert b.acquire("gc", "B") is not None  # leases are per janitor
    clock.advance(5)
    assert la.renew()
    clock.advance(9)
    assert b.acquire("tier", "B") is None  # renewed: still A's
    clock.advance(2)
    lb = b.acquire("tier", "B")
    assert lb is not None and lb.token == 2
    assert not la.renew()
    with pytest.raises(LeaseLostError):
        la.check()
    b.release(lb, next_due_at=clock() + 30)
    assert a.acquire("tier", "A") is None  # free, but not due yet
    assert a.acquire("tier", "A", scheduled=False) is not None  # on demand: runs now


def test_janitor_runs_are_recorded(h: Harness) -> None:
    """The runner records each run with holder and times, and releases with the next due time."""
    from coordinator.janitors.runner import JanitorRunner

    _fill(h, flushes=1)
    runner = JanitorRunner(h.coordinator, h.store, h.config(enabled=frozenset({"tier"})))
    report = runner.tick("tier")
    assert report is not None and report.rows_replaced == 2
    assert runner.tick("tier") is None  # not due for another interval
    runs = runner.leases.runs()
    assert [(r.janitor, r.outcome, r.holder) for r in runs] == [("tier", "ok", runner.holder)]
    assert runs[0].finished_at is not None and runs[0].finished_at >= runs[0].started_at
    assert runs[0].summary["rows_replaced"] == 2
    lease = runner.leases.leases()[0]
    assert lease.next_due_at >= time.time() + 50


class CountingStore(ObjectStore):
    """Wraps a store and records every read and write call as (method, key)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.calls: list[tuple[str, str]] = []

    def get(self, key: str) -> bytes:
        self.calls.append(("get", key))
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.calls.append(("get_range", key))
        return self.inner.get_range(key, start, length)

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> None:
        self.calls.append(("put", key))
        self.inner.put(key, data, if_none_match=if_none_match)

    def head(self, key: str) -> ObjectInfo:
        self.calls.append(("head", key))
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self.calls.append(("list", prefix))
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.calls.append(("delete", key))
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        self.calls.append(("delete_many", str(len(keys))))
        self.inner.delete_many(keys)


def test_gc_deletes_in_batches_of_objects_and_orphans(h: Harness) -> None:
    """1,100 unreferenced objects (a deleted topic's) and 600 orphans, more than one batch
    (``gc.BATCH``) of each: every one goes, in one store request per batch and no single
    deletes."""
    h.coordinator.create_topic("many", 1)
    for i in range(1_100):
        h.produce("many", 0, records(1, int(h.clock() * 1000), tag=f"{i}."))
    committed = {k for k in h.store.key_set() if k.startswith("segments/")}
    h.coordinator.delete_topic("many")
    orphans = {f"segments/orphan/{i:04d}.seg" for i in range(600)}
    for key in orphans:
        h.store.put(key, b"x")
    first = run_gc(h.ctx(), 60.0)  # stamps the topic's objects unreferenced: grace starts
    assert first.objects_deleted == first.orphans_deleted == 0
    h.clock.advance(61)
    counting = CountingStore(h.store)
    ctx = JanitorContext(h.catalog, h.coordinator.store, counting, h.clock)
    report = run_gc(ctx, 60.0)
    assert report.objects_deleted == 1_100 and report.orphans_deleted == 600
    assert not ((committed | orphans) & h.store.key_set())
    deletes = [(op, n) for op, n in counting.calls if op.startswith("delete")]
    assert deletes == [("delete_many", n) for n in ("500", "500", "100", "500", "100")]


def test_tiering_reads_each_source_object_with_one_get(h: Harness) -> None:
    """Tiering is planned per source object: 5 segment objects holding 4 partitions' chunks
    each (20 index entries) cost exactly 5 GETs (one per object, not one per chunk), then one
    PUT per partition; every record still reads the same at its offset."""
    h.coordinator.create_topic("m", 4)
    topic_id = h.coordinator.get_topic("m").topic_id
    now_ms = int(h.clock() * 1000)
    for f in range(5):
        b = SegmentBuilder()
        for p in range(4):
            b.append(topic_id, p, records(10 + p, now_ms + f * 100, tag=f"{f}.{p}."))
        h.writer.write(b)
    sources = {k for k in h.store.key_set() if k.startswith("segments/")}
    assert len(sources) == 5
    before = {p: h.walk("m", p) for p in range(4)}
    counting = CountingStore(h.store)
    ctx = JanitorContext(h.catalog, h.coordinator.store, counting, h.clock)
    report = run_tiering(ctx, h.config())
    assert report.rows_replaced == 20 and report.objects_written == 4 and report.aborted == 0
    reads = Counter(key for op, key in counting.calls if op in ("get", "get_range"))
    assert reads == dict.fromkeys(sources, 1)
    puts = [key for op, key in counting.calls if op == "put"]
    assert sorted(k.split("/")[2] for k in puts) == [f"partition={p}" for p in range(4)]
    assert len(counting.calls) == len(sources) + 4  # nothing else: no HEAD, LIST or DELETE
    for p in range(4):
        assert h.walk("m", p) == before[p]


def test_fetch_plan_merges_chunks_of_one_object_unless_far_apart() -> None:
    """Chunks of one object become one ranged GET covering them all, unless the gap between
    two exceeds the merge gap; each range lists exactly the chunks it covers."""

    def row(key: str, position: int, length: int) -> IndexRow:
        return IndexRow(0, 1, 1, key, position, length, 0, 0, "segment", 0.0)

    near = [row("a", 100, 50), row("a", 0, 100), row("b", 10, 5), row("a", 160, 40)]
    plan = plan_fetches(near, merge_gap=10)
    assert [(f.object_key, f.start, f.length, len(f.rows)) for f in plan] == [
        ("a", 0, 200, 3),
        ("b", 10, 5, 1),
    ]
    far = plan_fetches([row("a", 0, 10), row("a", 30, 10)], merge_gap=10)
    assert [(f.start, f.length) for f in far] == [(0, 10), (30, 10)]
    data = bytes(range(40))
    assert bytes(far[1].chunk(data[30:], far[1].rows[0])) == data[30:40]
    with pytest.raises(CorruptSegmentError):
        far[1].chunk(data[30:35], far[1].rows[0])  # the object ended early


def test_a_stored_batch_over_the_decompressed_bound_fails_its_run_only(h: Harness) -> None:
    """A zstd batch of 3 MiB stored under a 4 MiB lakelog.max.decompressed.bytes, whose
    bound is then lowered to 2 MiB (a decompression bomb stored before the bound existed):
    tiering does not inflate it, names the config, and tiers the other topic; nothing of
    the bomb's partition changes, and once the bound is raised again it is tiered."""
    h.coordinator.create_topic("bomb", 1, {"lakelog.max.decompressed.bytes": str(4 << 20)})
    _fill(h, "other", flushes=2)
    info = h.coordinator.get_topic("bomb")
    now_ms = int(h.clock() * 1000)
    b = SegmentBuilder(compression="zstd", max_batch_bytes=8 << 20)
    b.append(info.topic_id, 0, [Record(None, bytes(3 << 20), now_ms, ())])
    h.writer.write(b)
    h.produce("bomb", 0, records(5, now_ms + 1))
    h.coordinator.alter_configs("bomb", {"lakelog.max.decompressed.bytes": str(2 << 20)})
    before = h.catalog.rows(info.topic_id, 0)
    with pytest.raises(BatchTooLargeError, match=r"lakelog\.max\.decompressed\.bytes"):
        run_tiering(h.ctx(), h.config())
    assert h.catalog.rows(info.topic_id, 0) == before
    other = h.coordinator.get_topic("other").topic_id
    assert all(r.kind == "parquet" for p in (0, 1) for r in h.catalog.rows(other, p))
    h.reader.decompressed_limit = lambda topic: 2 << 20  # as the agent's topic cache says
    with pytest.raises(BatchTooLargeError):  # readers do not inflate it either
        h.reader.read("bomb", 0, 0)
    h.reader.decompressed_limit = lambda topic: 4 << 20
    assert len(h.reader.read("bomb", 0, 0, max_bytes=1 << 30)) == 6
    h.coordinator.alter_configs("bomb", {"lakelog.max.decompressed.bytes": str(4 << 20)})
    run_tiering(h.ctx(), h.config())
    assert [r.kind for r in h.catalog.rows(info.topic_id, 0)] == ["parquet"]


# -- issue 22: compaction never leaves a hole; readers never spin on one ------------------------


def _within(seconds: float, read: Callable[[], object]) -> object:
    """``read()`` in a thread; fails if it has not returned (or raised) after ``seconds``:
    a reader spinning on a hole never does."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(read())
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the read spins"
    return out[0]


def _caching_reader(h: Harness) -> CachingLogReader:
    return CachingLogReader(
        h.store, h.coordinator, RangeCache(1 << 20, 1 << 20), IndexCache(100, 30.0)
    )


def test_compaction_leaves_no_hole_with_an_untiered_chunk_before_the_last_tier_run(
    h: Harness,
) -> None:
    """Issue 22 defect 4. Precondition: tier entries, an untiered chunk, more tier entries
    (an aborted tier swap, or coordinators whose clocks disagree); every key ends in a
    tombstone. Compaction keeps the index contiguous up to
    the high watermark (reads end, no reader spins), never lets an older value in the
    untiered chunk outlive its key's tombstone, and once the gap is tiered, drops all but
    one record."""
    h.coordinator.create_topic("c", 1, {"cleanup.policy": "compact", "delete.retention.ms": "1"})
    old = 1000  # event times long past
    h.produce("c", 0, [Record(b"k0", b"a0", old, ()), Record(b"k1", b"a1", old, ())])
    h.produce("c", 0, [Record(b"k0", b"b0", old, ()), Record(b"k1", b"b1", old, ())])
    h.produce("c", 0, [Record(b"k0", None, old, ()), Record(b"k1", None, old, ())])
    (part,) = h.catalog.partitions("c")
    rows = h.catalog.rows(part.topic_id, 0)
    tierer = Tierer(h.ctx(), h.config())
    tierer.tier_runs([TierRun(part, (rows[0],)), TierRun(part, (rows[2],))], JanitorReport("t"))
    kinds = [r.kind for r in h.catalog.rows(part.topic_id, 0)]
    assert kinds == ["parquet", "segment", "parquet"]

    run_compaction(h.ctx(), h.config())
    hw = h.coordinator.offsets("c", 0).high_watermark
    assert hw == 6
    for reader in (h.reader, _caching_reader(h)):
        got = _within(10, lambda reader=reader: reader.read("c", 0, 0, max_bytes=1 << 20))
        assert isinstance(got, list), got
        # Nothing dropped yet: the older values in the untiered chunk keep their tombstones.
        assert [(r.offset, r.value) for r in got] == [
            (0, b"a0"),
            (1, b"a1"),
            (2, b"b0"),
            (3, b"b1"),
            (4, None),
            (5, None),
        ]

    run_tiering(h.ctx(), h.config())  # the gap is tiered: the head is the whole log
    run_compaction(h.ctx(), h.config())  # sees the tombstones: their horizon starts now
    h.clock.advance(1)
    run_compaction(h.ctx(), h.config())
    got = _within(10, lambda: h.walk("c", 0))
    assert isinstance(got, list), got
    # Every key deleted: one record stays (the last), so the index still reaches 6.
    assert [(r.offset, r.key, r.value) for r in got] == [(5, b"k1", None)]
    assert _within(10, lambda: h.reader.read("c", 0, 2)) == got


def test_a_swap_that_would_leave_a_hole_is_refused(h: Harness) -> None:
    """The catalog owns the rule: a swap whose new entries do not cover the replaced
    offsets exactly raises IndexHoleError and changes nothing."""
    h.coordinator.create_topic("s", 1)
    h.produce("s", 0, records(10, 1000))
    h.produce("s", 0, records(10, 2000))
    (part,) = h.catalog.partitions("s")
    rows = h.catalog.rows(part.topic_id, 0)
    short = NewRow("tiered/x.parquet", 10, 0, 15, 1000, 2000)
    with pytest.raises(IndexHoleError):
        h.catalog.swap(part.topic_id, 0, rows, [short], h.clock())
    assert h.catalog.rows(part.topic_id, 0) == rows


def _delete_entry(h: Harness, topic_id: bytes, base_offset: int) -> None:
    with h.coordinator.db.write() as conn:
        conn.execute(
            h.coordinator.db.dialect.sql(
                "DELETE FROM index_entries WHERE topic_id = ? AND partition = 0 AND base_offset = ?"
            ),
            (topic_id, base_offset),
        )


@pytest.mark.parametrize("where", ["middle", "end", "start", "page"])
def test_readers_fail_on_a_hole_in_the_index_instead_of_spinning(h: Harness, where: str) -> None:
    """A hole injected into the index (an entry deleted behind the coordinator's back) below
    the high watermark: every read that reaches it raises IndexHoleError within seconds,
    through LogReader and CachingLogReader alike; also right past a full page of lookups
    (``page``: 40 one-record entries, the 17th deleted)."""
    info = h.coordinator.create_topic("holes", 1)
    if where == "page":
        for i in range(40):
            h.produce("holes", 0, records(1, 1000 + i))
        _delete_entry(h, info.topic_id, 16)
    else:
        for i in range(3):
            h.produce("holes", 0, records(10, 1000 * (i + 1)))
        _delete_entry(h, info.topic_id, {"start": 0, "middle": 10, "end": 20}[where])
    for reader in (h.reader, _caching_reader(h)):
        got = _within(10, lambda reader=reader: reader.read("holes", 0, 0, max_bytes=1 << 20))
        assert isinstance(got, IndexHoleError), got
        if where != "start":
            got = _within(10, lambda reader=reader: list(reader.records("holes", 0, 12)))
            assert isinstance(got, IndexHoleError), got


def test_a_tombstone_lives_delete_retention_ms_from_its_first_compaction_not_its_timestamp(
    h: Harness,
) -> None:
    """Issue 22 suspicion (a), proven: a tombstone whose record timestamp is a day old
    (event time) survives the first compaction that sees it, and every compaction for
    delete.retention.ms after that one (Kafka's delete horizon, KIP-534), so a lagging
    consumer still sees the delete; then it goes. A tombstone kept through a rewrite
    keeps the horizon its first compaction gave it."""
    h.coordinator.create_topic(
        "t", 1, {"cleanup.policy": "compact", "delete.retention.ms": "60000"}
    )
    day_ago = int(h.clock() * 1000) - 86_400_000
    h.produce("t", 0, [Record(b"a", b"1", day_ago, ()), Record(b"b", b"1", day_ago, ())])
    h.produce("t", 0, [Record(b"a", None, day_ago, ()), Record(b"c", b"1", day_ago, ())])
    run_tiering(h.ctx(), h.config())
    run_compaction(h.ctx(), h.config())
    assert [(r.offset, r.key, r.value) for r in h.walk("t", 0)] == [
        (1, b"b", b"1"),
        (2, b"a", None),
        (3, b"c", b"1"),
    ]
    h.clock.advance(30)
    h.produce("t", 0, [Record(b"b", b"2", day_ago, ())])  # forces a rewrite of the head
    run_tiering(h.ctx(), h.config())
    run_compaction(h.ctx(), h.config())
    assert [(r.offset, r.key) for r in h.walk("t", 0)] == [(2, b"a"), (3, b"c"), (4, b"b")]
    h.clock.advance(31)  # 61 s after the first compaction saw the tombstone
    run_compaction(h.ctx(), h.config())
    assert [(r.offset, r.key) for r in h.walk("t", 0)] == [(3, b"c"), (4, b"b")]
