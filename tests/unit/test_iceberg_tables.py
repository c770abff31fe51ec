"""Topic tables in process: publishing with the index swaps, snapshots and GC, expiry.

A SQLite (and PostgreSQL) coordinator, a clocked memory store, the janitors run by hand;
tables are read back with pyiceberg through ``TopicTables.iceberg`` (a pyiceberg catalog
over the same database and store).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.iceberg.schema import CHANGES_PROPERTY
from coordinator.iceberg.tables import TopicTables, changes_of, check_table
from coordinator.janitors.catalog import Catalog
from coordinator.janitors.gc import run_gc
from coordinator.janitors.runner import run_janitor
from coordinator.local import LocalCoordinator
from index.log import LogReader, LogWriter
from segments.segment import SegmentBuilder
from segments.types import ConsumedRecord
from tests.unit.janitor_helpers import ClockedStore, FakeClock, Harness, records, table_rows

DAY_MS = 86_400_000


class PgHarness(Harness):
    """The harness on any backend (``db_url``)."""

    def __init__(self, tmp: Path, db_url: str) -> None:
        self.db_url = db_url
        super().__init__(tmp)

    def __post_init__(self) -> None:
        self.coordinator = LocalCoordinator(self.db_url)
        self.store = ClockedStore(self.clock)
        self.writer = LogWriter(self.store, self.coordinator)
        self.reader = LogReader(self.store, self.coordinator)
        self.catalog = Catalog(self.coordinator.db)


@pytest.fixture
def hb(tmp_path: Path, db_url: str) -> Iterator[Harness]:
    h = PgHarness(tmp_path, db_url)
    try:
        yield h
    finally:
        h.close()


def _tables(h: Harness) -> TopicTables:
    return TopicTables(h.catalog, h.store, h.clock)


def _fill(h: Harness, topic: str, flushes: int, per: int = 20, partitions: int = 2) -> None:
    now_ms = int(h.clock() * 1000)
    for f in range(flushes):
        for p in range(partitions):
            h.produce(topic, p, records(per, now_ms + f * 1000, tag=f"{f}.{p}."))


def _log_rows(recs: list[ConsumedRecord]) -> list[tuple[object, ...]]:
    return sorted(
        ((r.partition, r.offset, r.key, r.value, r.timestamp_ms, r.headers) for r in recs),
        key=lambda t: (t[0], t[1]),
    )


def test_tiering_publishes_its_objects_as_one_snapshot_equal_to_the_log(hb: Harness) -> None:
    """The tier run's swaps record the new objects; the run ends by publishing them: the
    table's files are exactly the tier objects (no copy) and its rows the tiered records."""
    h = hb
    h.coordinator.create_topic("t", 2)
    _fill(h, "t", 3)
    report = run_janitor("tier", h.ctx(), h.config())
    assert report.snapshots_published == 1
    tables = _tables(h)
    table = tables.iceberg.load_table(("topics", "t"))
    files = {t.file.file_path for t in table.scan().plan_files()}
    topic_id = h.coordinator.get_topic("t").topic_id
    keys = {r.object_key for p in (0, 1) for r in h.catalog.rows(topic_id, p)}
    assert {k.split("/")[0] for k in keys} == {"tiered"}
    assert files == {tables.io.location(k) for k in keys}
    assert table_rows(table.scan().to_arrow()) == _log_rows(
        [r for p in (0, 1) for r in h.walk("t", p)]
    )
    snapshot = table.current_snapshot()
    assert snapshot is not None and changes_of(snapshot) == {"main": 2}
    assert check_table(tables, "t") == []
    assert CHANGES_PROPERTY in snapshot.summary.additional_properties
    # Nothing pending: publishing again commits nothing.
    assert tables.publish(topic_id, "t") is None


def test_retention_removes_files_in_a_new_snapshot_and_old_snapshots_keep_them_from_gc(
    hb: Harness,
) -> None:
    """Retention drops a tier object from the index; the table's next snapshot no longer
    has it, the previous one still reads it, and GC leaves the object alone until expiry
    releases it (then a grace period later it goes; the old snapshot is gone too)."""
    h = hb
    h.coordinator.create_topic("r", 1, {"retention.ms": str(DAY_MS)})
    old_ms = int(h.clock() * 1000) - 2 * DAY_MS
    h.produce("r", 0, records(30, old_ms, tag="old."))
    run_janitor("tier", h.ctx(), h.config())
    tables = _tables(h)
    first = tables.iceberg.load_table("topics.r").current_snapshot()
    assert first is not None
    h.clock.advance(10)
    h.produce("r", 0, records(30, int(h.clock() * 1000), tag="new."))
    run_janitor("tier", h.ctx(), h.config())
    h.clock.advance(10)
    report = run_janitor("retention", h.ctx(), h.config())
    assert report.rows_dropped == 1 and report.snapshots_published == 1
    table = tables.iceberg.load_table("topics.r")
    now_rows = table_rows(table.scan().to_arrow())
    assert [r[1] for r in now_rows] == list(range(30, 60))
    then = table_rows(table.scan(snapshot_id=first.snapshot_id).to_arrow())
    assert [r[1] for r in then] == list(range(30))
    old_key = tables.io.key(
        next(iter(t.file.file_path for t in table.scan(snapshot_id=first.snapshot_id).plan_files()))
    )
    # GC long after its grace: the object is held by the retained snapshots.
    h.clock.advance(3600)
    run_gc(h.ctx(), 60.0)
    assert old_key in h.store.key_set()
    # Snapshots expire after table.snapshot.retention.ms (5 days by default).
    h.clock.advance(6 * 86_400)
    report = run_janitor("table", h.ctx(), h.config())
    assert report.snapshots_expired >= 1
    table = tables.iceberg.load_table("topics.r")
    assert table.snapshot_by_id(first.snapshot_id) is None
    assert table_rows(table.scan().to_arrow()) == now_rows
    run_gc(h.ctx(), 60.0)  # released now: unreferenced, not yet past its grace
    assert old_key in h.store.key_set()
    h.clock.advance(61)
    run_gc(h.ctx(), 60.0)
    assert old_key not in h.store.key_set()
    # Every retained snapshot's files exist; the current one holds exactly the tier objects.
    assert check_table(tables, "r") == []
    # A checker sees a missing file and unpublished changes.
    h.store.delete(tables.io.key(next(iter(table.scan().plan_files())).file.file_path))
    h.produce("r", 0, records(5, int(h.clock() * 1000), tag="more."))
    from coordinator.janitors.tiering import run_tiering

    run_tiering(h.ctx(), h.config())
    problems = check_table(tables, "r")
    assert any("names missing" in p for p in problems), problems
    assert any("unpublished" in p for p in problems), problems


def test_compaction_replaces_files_in_one_overwrite(h: Harness) -> None:
    """Compaction swaps tier objects for compacted ones; the snapshot removes the old and adds
    the new, and its rows are the compacted log."""
    h.coordinator.create_topic("c", 1, {"cleanup.policy": "compact"})
    now_ms = int(h.clock() * 1000)
    h.produce("c", 0, records(40, now_ms, key_mod=5))
    run_janitor("tier", h.ctx(), h.config())
    tables = _tables(h)
    before = tables.iceberg.load_table("topics.c")
    assert before.scan().to_arrow().num_rows == 40
    report = run_janitor("compact", h.ctx(), h.config())
    assert report.records_dropped == 35 and report.snapshots_published == 1
    table = tables.iceberg.load_table("topics.c")
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary.operation.value == "overwrite"
    assert table_rows(table.scan().to_arrow()) == _log_rows(h.walk("c", 0))
    assert len(table_rows(table.scan().to_arrow())) == 5


def test_a_file_added_and_removed_between_snapshots_never_reaches_the_table(h: Harness) -> None:
    """Tiering then compaction with no publish between: one snapshot, with only the
    compacted object; the intermediate one is released at once (GC may take it)."""
    h.coordinator.create_topic("x", 1, {"cleanup.policy": "compact"})
    h.produce("x", 0, records(20, int(h.clock() * 1000), key_mod=2))
    from coordinator.janitors.tiering import run_compaction, run_tiering

    run_tiering(h.ctx(), h.config())
    run_compaction(h.ctx(), h.config())
    tables = _tables(h)
    topic_id = h.coordinator.get_topic("x").topic_id
    tables.publish(topic_id, "x")
    table = tables.iceberg.load_table("topics.x")
    assert len(table.snapshots()) == 1
    [entry] = h.catalog.rows(topic_id, 0)
    assert [t.file.file_path for t in table.scan().plan_files()] == [
        tables.io.location(entry.object_key)
    ]
    intermediate = {
        k for k in h.store.key_set() if k.startswith("tiered/") and k != entry.object_key
    }
    assert len(intermediate) == 1
    tables.expire(topic_id, "x", 60.0)  # releases it: no snapshot ever named it
    run_gc(h.ctx(), 60.0)  # unreferenced from now on
    h.clock.advance(120)
    run_gc(h.ctx(), 60.0)
    assert not intermediate & h.store.key_set()
    assert entry.object_key in h.store.key_set()


def test_delete_records_is_published_by_the_table_janitor(h: Harness) -> None:
    """DeleteRecords past a tier object drops it from the index outside any janitor; the
    table janitor's next run publishes the removal."""
    h.coordinator.create_topic("d", 1)
    now_ms = int(h.clock() * 1000)
    h.produce("d", 0, records(10, now_ms))
    run_janitor("tier", h.ctx(), h.config())
    h.produce("d", 0, records(10, now_ms + 100))
    run_janitor("tier", h.ctx(), h.config())
    h.coordinator.delete_records("d", 0, 10)
    report = run_janitor("table", h.ctx(), h.config())
    assert report.snapshots_published == 1
    table = _tables(h).iceberg.load_table("topics.d")
    assert [r[1] for r in table_rows(table.scan().to_arrow())] == list(range(10, 20))


def test_deleting_a_topic_drops_its_table_and_lets_gc_take_everything(h: Harness) -> None:
    """A deleted topic's table pointer goes with it; its objects become garbage and its
    table files go with the table janitor after the grace period. A new topic of the same
    name is a new, empty table."""
    h.coordinator.create_topic("g", 1)
    h.produce("g", 0, records(10, int(h.clock() * 1000)))
    run_janitor("tier", h.ctx(), h.config())
    old_id = h.coordinator.get_topic("g").topic_id
    prefix = f"iceberg/{old_id.hex()}/"
    assert any(k.startswith(prefix) for k in h.store.key_set())
    h.coordinator.delete_topic("g")
    h.coordinator.create_topic("g", 1)
    tables = _tables(h)
    h.clock.advance(120)
    run_janitor("table", h.ctx(), h.config())
    run_gc(h.ctx(), 60.0)
    h.clock.advance(120)
    run_gc(h.ctx(), 60.0)
    left = h.store.key_set()
    assert not any(k.startswith(prefix) or k.startswith("tiered/") for k in left), left
    table = tables.iceberg.load_table("topics.g")
    assert table.scan().to_arrow().num_rows == 0


def test_two_publishers_of_one_table_commit_each_change_once(h: Harness) -> None:
    """Race: two TopicTables publish the same pending changes; the metadata pointer's
    compare-and-set lets one win, the other starts over, finds nothing pending, and the
    table holds each file once."""
    h.coordinator.create_topic("p", 2)
    _fill(h, "p", 2)
    from coordinator.janitors.tiering import run_tiering

    run_tiering(h.ctx(), h.config())
    a, b = _tables(h), _tables(h)
    topic_id = h.coordinator.get_topic("p").topic_id
    a.ensure(topic_id, "p")
    stale = b.table(topic_id, "p")
    assert stale is not None
    assert a.publish(topic_id, "p") is not None
    # b's view of the table is the older version: its commit loses, it retries, nothing left.
    assert b.publish(topic_id, "p") is None
    table = a.iceberg.load_table("topics.p")
    paths = [t.file.file_path for t in table.scan().plan_files()]
    assert len(paths) == len(set(paths)) == 2


def test_the_table_is_read_only_through_the_catalog(h: Harness) -> None:
    """The pyiceberg catalog refuses everything but loading and listing."""
    h.coordinator.create_topic("ro", 1)
    run_janitor("table", h.ctx(), h.config())
    tables = _tables(h)
    assert tables.iceberg.list_tables("topics") == [("topics", "ro")]
    with pytest.raises(NotImplementedError):
        tables.iceberg.drop_table("topics.ro")
    with pytest.raises(NotImplementedError):
        tables.iceberg.create_namespace("other")


def test_many_files_and_partitions_in_one_publish(tmp_path: Path) -> None:
    """Size: 64 partitions x 3 tier objects each (192 files) published in one snapshot,
    footers fetched in parallel; scans prune by partition."""
    clock = FakeClock()
    h = Harness(tmp_path, clock)
    try:
        h.coordinator.create_topic("big", 64)
        now_ms = int(clock() * 1000)
        from coordinator.janitors.tiering import run_tiering

        for f in range(3):
            b = SegmentBuilder()
            topic_id = h.coordinator.get_topic("big").topic_id
            for p in range(64):
                b.append(topic_id, p, records(5, now_ms + f * 100, tag=f"{f}."))
            h.writer.write(b)
            run_tiering(h.ctx(), h.config())
        tables = _tables(h)
        topic_id = h.coordinator.get_topic("big").topic_id
        tables.publish(topic_id, "big")
        table = tables.iceberg.load_table("topics.big")
        assert len(list(table.scan().plan_files())) == 192
        assert table.scan().to_arrow().num_rows == 64 * 15
        assert len(list(table.scan(row_filter="partition = 7").plan_files())) == 3
    finally:
        h.close()


def test_a_publish_that_dies_before_the_pointer_moves_leaves_only_garbage(h: Harness) -> None:
    """Fault: the publisher is killed after writing the manifests and the new metadata file
    but before the pointer's compare-and-set. Nothing reads those files; the next publish
    commits the same changes once; expiry deletes the orphans after the grace period."""
    h.coordinator.create_topic("k", 1)
    h.produce("k", 0, records(10, int(h.clock() * 1000)))
    from coordinator.janitors.tiering import run_tiering

    run_tiering(h.ctx(), h.config())
    tables = _tables(h)
    topic_id = h.coordinator.get_topic("k").topic_id
    tables.ensure(topic_id, "k")
    before = set(h.store.key_set())

    def killed(*args: object) -> bool:
        raise SystemExit("killed")

    swap = tables._swap_pointer
    tables._swap_pointer = killed  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        tables.publish(topic_id, "k")
    tables._swap_pointer = swap  # type: ignore[method-assign]
    orphans = {k for k in h.store.key_set() - before if k.startswith("iceberg/")}
    assert orphans  # the dead publish's manifest, manifest list and metadata file
    assert tables.iceberg.load_table("topics.k").current_snapshot() is None
    assert tables.publish(topic_id, "k") is not None
    table = tables.iceberg.load_table("topics.k")
    assert len(list(table.scan().plan_files())) == 1
    assert table.scan().to_arrow().num_rows == 10
    tables.expire(topic_id, "k", 60.0)
    assert orphans <= h.store.key_set()  # younger than the grace period: kept
    h.clock.advance(120)
    report = tables.expire(topic_id, "k", 60.0)
    assert report.metadata_deleted >= len(orphans)
    assert not orphans & h.store.key_set()
    assert check_table(tables, "k") == []


def test_history_plan_cuts_a_tier_object_bigger_than_a_task(h: Harness) -> None:
    """Size: a snapshot's tier object of many row groups, bigger than a task, is read by
    several tasks (pieces of whole row groups) whose rows together are the table's."""
    import os as _os

    from coordinator.client import StoreLocation
    from index.plan import Bounds
    from segments.types import Record
    from spark.history import plan_history
    from spark.options import parse_options
    from spark.scan import read_task

    h.coordinator.create_topic("big", 1)
    now = int(h.clock() * 1000)
    noise = _os.urandom(1 << 20)
    recs = [Record(b"k%d" % i, noise[i * 200 : i * 200 + 200], now + i, ()) for i in range(3000)]
    h.produce("big", 0, recs)
    from coordinator.janitors.tiering import run_tiering

    run_tiering(h.ctx(), h.config(tier_row_group_bytes=20_000))
    tables = _tables(h)
    topic_id = h.coordinator.get_topic("big").topic_id
    tables.publish(topic_id, "big")
    [data_file] = [t.file for t in tables.iceberg.load_table("topics.big").scan().plan_files()]
    assert data_file.file_size_in_bytes > 512 << 10 and len(data_file.split_offsets) > 10
    opts = parse_options(
        {
            "db": "sqlite:///unused",
            "store": h.store.url,
            "subscribe": "big",
            "asOfTimestamp": str(int(h.clock() * 1000) + 1000),
            "maxBytesPerTask": str(128 << 10),
        }
    )
    import spark.connect

    location = StoreLocation(h.store.url)
    spark.connect._stores[location] = h.store
    try:
        tasks = plan_history(opts, tables.iceberg, location, Bounds())
        assert len(tasks) > 1
        offsets = []
        for task in tasks:
            for batch in read_task(h.store, task, ["offset"]):
                offsets += batch.column("offset").to_pylist()
    finally:
        del spark.connect._stores[location]
    assert sorted(offsets) == list(range(3000))
