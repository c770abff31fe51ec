"""The coordinator's metadata store through LocalCoordinator (one process), on SQLite and
on PostgreSQL: every test that takes ``db_url`` runs once per backend.

The multi-process and many-writer tests are in
``tests/integration/test_metadata_concurrency.py``.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from coordinator.client import ChunkCommit, ChunkRef, PartitionOffsets, TopicInfo
from coordinator.db import (
    MIGRATIONS,
    POSTGRESQL,
    SQLITE,
    Database,
    Migration,
    migrate,
    parse_sqlite_url,
)
from coordinator.local import LocalCoordinator
from coordinator.log.store import MetadataStore
from coordinator.postgres import PgConnection
from segments.errors import (
    CommitConflictError,
    CoordinatorUnavailableError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicNameError,
    MetadataError,
    PartitionNotFoundError,
    TopicExistsError,
    TopicNotFoundError,
)
from tests.conftest import backend_of, new_db_url, sql_rows


def chunk(
    topic_id: bytes,
    partition: int,
    count: int,
    position: int = 0,
    length: int = 100,
    min_ts: int = 1_000,
    max_ts: int = 2_000,
) -> ChunkCommit:
    return ChunkCommit(topic_id, partition, position, length, count, min_ts, max_ts)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A SQLite file, for the SQLite-only tests."""
    return tmp_path / "meta" / "coordinator.db"


@pytest.fixture
def other_db_url(request: pytest.FixtureRequest, db_url: str, tmp_path: Path) -> str:
    """A second empty database on the same backend as ``db_url``."""
    return new_db_url(request, backend_of(db_url), tmp_path / "other")


def rows(db_url: str, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Read (or change) the database behind the coordinator's back."""
    return sql_rows(db_url, sql, params)


def entries(db_url: str, topic_id: bytes, partition: int) -> list[tuple[int, int]]:
    """(base_offset, record_count) of a partition's index rows, in offset order."""
    return [
        (int(b), int(n))  # type: ignore[call-overload]
        for b, n in rows(
            db_url,
            "SELECT base_offset, record_count FROM index_entries "
            "WHERE topic_id = ? AND partition = ? ORDER BY base_offset",
            (topic_id, partition),
        )
    ]


def snapshot(db_url: str) -> tuple[list[tuple[object, ...]], ...]:
    """Every row that a failed request must leave alone."""
    return tuple(
        rows(db_url, f"SELECT * FROM {table} ORDER BY 1, 2")
        for table in ("topics", "topic_configs", "partitions", "objects", "index_entries")
    )


# -- cluster id, URLs, migrations ---------------------------------------------


def test_cluster_id_is_generated_once_and_kept(db_url: str) -> None:
    with LocalCoordinator(db_url) as c:
        cid = c.cluster_id()
    assert len(cid) == 22
    assert all(ch.isalnum() or ch in "-_" for ch in cid)
    with LocalCoordinator(db_url) as c:
        assert c.cluster_id() == cid
    with LocalCoordinator(db_url, cluster_id=cid) as c:
        assert c.cluster_id() == cid
    with pytest.raises(ValueError, match="cluster id mismatch"):
        LocalCoordinator(db_url, cluster_id="someOtherClusterId0000")


def test_explicit_cluster_id_on_a_fresh_database(db_url: str, other_db_url: str) -> None:
    with LocalCoordinator(db_url, cluster_id="lkc-test-cluster") as c:
        assert c.cluster_id() == "lkc-test-cluster"
    with LocalCoordinator(other_db_url) as c:
        assert c.cluster_id() != "lkc-test-cluster"


def test_database_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite only: ``sqlite:///`` URL parsing and relative paths (PostgreSQL URLs go to libpq)."""
    assert parse_sqlite_url("sqlite:///data/x.db") == Path("data/x.db")
    assert parse_sqlite_url("sqlite:////abs/x.db") == Path("/abs/x.db")
    for bad in ("mysql://localhost/db", "sqlite://", "sqlite:///", "x.db"):
        with pytest.raises(ValueError, match="unsupported database URL"):
            LocalCoordinator(bad)
    monkeypatch.chdir(tmp_path)
    with LocalCoordinator("sqlite:///deep/er/rel.db") as c:
        c.create_topic("t", 1)
    assert (tmp_path / "deep" / "er" / "rel.db").is_file()


def test_schema_version(coord: LocalCoordinator, db_url: str) -> None:
    assert [r[0] for r in rows(db_url, "SELECT version FROM schema_version ORDER BY 1")] == [
        m.version for m in MIGRATIONS
    ]


def test_wal_mode(db_path: Path) -> None:
    """SQLite only: the file is in WAL mode (PostgreSQL has no journal modes)."""
    with LocalCoordinator(f"sqlite:///{db_path}"):
        assert rows(f"sqlite:///{db_path}", "PRAGMA journal_mode") == [("wal",)]


def test_migrations_apply_only_what_is_missing(db_url: str) -> None:
    extra = Migration(
        MIGRATIONS[-1].version + 1, "test column", ("ALTER TABLE agents ADD COLUMN rack TEXT",)
    )
    conn: Any
    if backend_of(db_url) == "sqlite":
        conn = sqlite3.connect(parse_sqlite_url(db_url), isolation_level=None)
        dialect, close = SQLITE, conn.close
    else:
        pg = psycopg.connect(db_url, autocommit=True)
        conn, dialect, close = PgConnection(pg), POSTGRESQL, pg.close

    def run(migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
        return migrate(conn, dialect, migrations)

    try:
        assert run() == [m.version for m in MIGRATIONS]
        assert run() == []
        assert run((*MIGRATIONS, extra)) == [extra.version]
        assert run((*MIGRATIONS, extra)) == []
        assert rows(db_url, "SELECT rack FROM agents") == []  # the column exists
        # Code older than the database refuses it rather than corrupting it.
        with pytest.raises(MetadataError, match="newer than this lakelog"):
            run()
        # A failing migration leaves nothing half-applied.
        broken = Migration(extra.version + 1, "broken", ("CREATE TABLE t1 (a TEXT)", "NOT SQL"))
        with pytest.raises((sqlite3.OperationalError, psycopg.errors.SyntaxError)):
            run((*MIGRATIONS, extra, broken))
        assert rows(db_url, "SELECT MAX(version) FROM schema_version") == [(extra.version,)]
        with pytest.raises((sqlite3.OperationalError, psycopg.errors.UndefinedTable)):
            rows(db_url, "SELECT * FROM t1")
    finally:
        close()


def test_closed_coordinator_refuses_calls(db_url: str) -> None:
    c = LocalCoordinator(db_url)
    c.close()
    c.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        c.list_topics()


def test_locked_database_is_reported_retriable(db_path: Path) -> None:
    """SQLite only (busy timeout of the file lock): another process holding the write lock
    past the busy timeout -> a retriable error. PostgreSQL's retriable failures are in
    ``test_postgres_lost_connections_are_retriable_then_replaced``."""
    db = Database(db_path, busy_timeout_s=0.2)
    store = MetadataStore(db)
    topic = store.create_topic("t", 1)
    other = sqlite3.connect(db_path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(CoordinatorUnavailableError) as info:
            store.commit("k", [chunk(topic.topic_id, 0, 1)])
        assert info.value.retriable
        # Readers are not blocked by the writer (WAL).
        assert store.offsets("t", 0) == PartitionOffsets(0, 0)
        other.execute("ROLLBACK")
        assert store.commit("k", [chunk(topic.topic_id, 0, 1)]) == [0]
    finally:
        other.close()
        db.close()


# -- topics ---------------------------------------------------------------------


def test_create_get_list_topics(coord: LocalCoordinator) -> None:
    a = coord.create_topic("orders", 3, {"retention.ms": " 1000 ", "cleanup.policy": "compact"})
    b = coord.create_topic("clicks", 1)
    assert isinstance(a, TopicInfo)
    assert len(a.topic_id) == 16 and a.topic_id != b.topic_id
    assert a.configs == {"retention.ms": "1000", "cleanup.policy": "compact"}
    assert coord.get_topic("orders") == TopicInfo(
        "orders", a.topic_id, 3, {"cleanup.policy": "compact", "retention.ms": "1000"}
    )
    assert coord.get_topic_by_id(b.topic_id) == TopicInfo("clicks", b.topic_id, 1, {})
    assert [t.name for t in coord.list_topics()] == ["clicks", "orders"]
    assert coord.list_topics()[1].configs == a.configs
    for p in range(3):
        assert coord.offsets("orders", p) == PartitionOffsets(0, 0)
    with pytest.raises(TopicNotFoundError):
        coord.get_topic("nope")
    with pytest.raises(TopicNotFoundError):
        coord.get_topic_by_id(b"\x00" * 16)


@pytest.mark.parametrize("name", ["", "x" * 250, ".", "..", "a b", "a/b"])
def test_bad_topic_names_change_nothing(coord: LocalCoordinator, db_url: str, name: str) -> None:
    before = snapshot(db_url)
    with pytest.raises(InvalidTopicNameError):
        coord.create_topic(name, 1)
    with pytest.raises(InvalidTopicNameError):
        coord.create_topic(name, 1, validate_only=True)
    assert snapshot(db_url) == before


@pytest.mark.parametrize("partitions", [0, -1, True, "3", 100_001])
def test_bad_partition_counts_change_nothing(
    coord: LocalCoordinator, db_url: str, partitions: object
) -> None:
    before = snapshot(db_url)
    with pytest.raises(InvalidPartitionsError):
        coord.create_topic("t", partitions)  # type: ignore[arg-type]
    assert snapshot(db_url) == before


@pytest.mark.parametrize(
    ("configs", "fragment"),
    [
        ({"foo.bar": "1"}, "Unknown topic config name: foo.bar"),
        ({"retention.ms": "abc"}, "retention.ms"),
        ({"cleanup.policy": "foo"}, "cleanup.policy"),
        ({"min.cleanable.dirty.ratio": "2"}, "min.cleanable.dirty.ratio"),
        ({"retention.ms": "1000", "compression.type": "brotli"}, "brotli"),
        ({"min.compaction.lag.ms": "9", "max.compaction.lag.ms": "8"}, "min.compaction.lag.ms"),
    ],
)
def test_bad_configs_change_nothing(
    coord: LocalCoordinator, db_url: str, configs: dict[str, str], fragment: str
) -> None:
    coord.create_topic("existing", 1, {"retention.ms": "5"})
    before = snapshot(db_url)
    with pytest.raises(InvalidConfigError, match=fragment):
        coord.create_topic("t", 1, configs)
    with pytest.raises(InvalidConfigError, match=fragment):
        coord.alter_configs("existing", configs)
    assert snapshot(db_url) == before
    assert coord.get_topic("existing").configs == {"retention.ms": "5"}


def test_duplicate_topic(coord: LocalCoordinator, db_url: str) -> None:
    first = coord.create_topic("t", 2, {"retention.ms": "5"})
    before = snapshot(db_url)
    with pytest.raises(TopicExistsError, match=r"^Topic 't' already exists\.$"):
        coord.create_topic("t", 4)
    with pytest.raises(TopicExistsError):
        coord.create_topic("t", 4, validate_only=True)
    assert snapshot(db_url) == before
    assert coord.get_topic("t") == first


def test_validate_only_create_changes_nothing(coord: LocalCoordinator, db_url: str) -> None:
    before = snapshot(db_url)
    info = coord.create_topic("t", 3, {"cleanup.policy": "compact"}, validate_only=True)
    assert (info.name, info.partitions, info.configs) == ("t", 3, {"cleanup.policy": "compact"})
    assert snapshot(db_url) == before
    with pytest.raises(TopicNotFoundError):
        coord.get_topic("t")


def test_add_partitions(coord: LocalCoordinator) -> None:
    t = coord.create_topic("t", 2, {"retention.ms": "7"})
    coord.commit("k0", [chunk(t.topic_id, 1, 5)])
    grown = coord.add_partitions("t", 5)
    assert grown == TopicInfo("t", t.topic_id, 5, {"retention.ms": "7"})
    assert coord.get_topic("t").partitions == 5
    assert coord.offsets("t", 1) == PartitionOffsets(0, 5)
    assert coord.offsets("t", 4) == PartitionOffsets(0, 0)
    assert coord.commit("k1", [chunk(t.topic_id, 4, 3)]) == [0]
    for n in (5, 3):
        with pytest.raises(InvalidPartitionsError, match=r"^Topic already has 5 partitions\.$"):
            coord.add_partitions("t", n)
    with pytest.raises(InvalidPartitionsError):
        coord.add_partitions("t", 0)
    assert coord.get_topic("t").partitions == 5
    with pytest.raises(PartitionNotFoundError):
        coord.offsets("t", 5)
    with pytest.raises(TopicNotFoundError):
        coord.add_partitions("nope", 9)


def test_alter_configs(coord: LocalCoordinator, db_url: str) -> None:
    coord.create_topic("t", 1, {"retention.ms": "1000", "cleanup.policy": "compact"})
    info = coord.alter_configs("t", {"compression.type": "zstd"}, ["cleanup.policy"])
    assert info.configs == {"compression.type": "zstd", "retention.ms": "1000"}
    assert coord.get_topic("t").configs == info.configs
    # Resetting a config that has no override is a no-op, not an error.
    assert coord.alter_configs("t", None, ["segment.ms"]).configs == info.configs
    before = snapshot(db_url)
    dry = coord.alter_configs("t", {"retention.ms": "-1"}, ["compression.type"], validate_only=True)
    assert dry.configs == {"retention.ms": "-1"}
    assert snapshot(db_url) == before
    with pytest.raises(InvalidConfigError, match="both set and reset"):
        coord.alter_configs("t", {"retention.ms": "1"}, ["retention.ms"])
    with pytest.raises(InvalidConfigError, match="Unknown topic config name"):
        coord.alter_configs("t", None, ["nope"])
    # The cross-config rule applies to the result: stored overrides plus this change.
    coord.alter_configs("t", {"max.compaction.lag.ms": "100"})
    with pytest.raises(InvalidConfigError, match=r"min\.compaction\.lag\.ms \(200\)"):
        coord.alter_configs("t", {"min.compaction.lag.ms": "200"})
    assert snapshot(db_url) != before
    with pytest.raises(TopicNotFoundError):
        coord.alter_configs("nope", {"retention.ms": "1"})


def test_delete_and_recreate_topic(coord: LocalCoordinator, db_url: str) -> None:
    old = coord.create_topic("t", 2, {"retention.ms": "5"})
    coord.commit("obj-1", [chunk(old.topic_id, 0, 10), chunk(old.topic_id, 1, 4)])
    other = coord.create_topic("other", 1)
    coord.commit("obj-2", [chunk(other.topic_id, 0, 3)])
    coord.delete_topic("t")
    with pytest.raises(TopicNotFoundError):
        coord.get_topic("t")
    with pytest.raises(TopicNotFoundError):
        coord.get_topic_by_id(old.topic_id)
    with pytest.raises(TopicNotFoundError):
        coord.delete_topic("t")
    assert rows(db_url, "SELECT COUNT(*) FROM index_entries WHERE topic_id = ?", (old.topic_id,))
    assert rows(
        db_url, "SELECT COUNT(*) FROM index_entries WHERE topic_id = ?", (old.topic_id,)
    ) == [(0,)]
    assert rows(db_url, "SELECT COUNT(*) FROM partitions WHERE topic_id = ?", (old.topic_id,)) == [
        (0,)
    ]
    assert rows(
        db_url, "SELECT COUNT(*) FROM topic_configs WHERE topic_id = ?", (old.topic_id,)
    ) == [(0,)]
    # The object stays committed until garbage collection; the other topic is untouched.
    assert coord.committed_object_keys(["obj-1", "obj-2"]) == {"obj-1", "obj-2"}
    assert coord.offsets("other", 0) == PartitionOffsets(0, 3)
    # Commits naming the old id now fail; the name is free again, with a new id and offset 0.
    with pytest.raises(TopicNotFoundError):
        coord.commit("obj-3", [chunk(old.topic_id, 0, 1)])
    new = coord.create_topic("t", 1)
    assert new.topic_id != old.topic_id and new.configs == {}
    assert coord.offsets("t", 0) == PartitionOffsets(0, 0)
    assert coord.commit("obj-4", [chunk(new.topic_id, 0, 2)]) == [0]
    assert coord.lookup("t", 0, 0)[0].object_key == "obj-4"


# -- commits --------------------------------------------------------------------


def test_commit_assigns_contiguous_offsets_in_input_order(
    coord: LocalCoordinator, db_url: str
) -> None:
    a = coord.create_topic("a", 2)
    b = coord.create_topic("b", 1)
    # Input order deliberately not (topic id, partition) order.
    first = [chunk(b.topic_id, 0, 7), chunk(a.topic_id, 1, 3), chunk(a.topic_id, 0, 5)]
    assert coord.commit("o1", first) == [0, 0, 0]
    second = [chunk(a.topic_id, 0, 2), chunk(b.topic_id, 0, 1)]
    assert coord.commit("o2", second) == [5, 7]
    assert coord.offsets("a", 0) == PartitionOffsets(0, 7)
    assert coord.offsets("a", 1) == PartitionOffsets(0, 3)
    assert coord.offsets("b", 0) == PartitionOffsets(0, 8)
    assert entries(db_url, a.topic_id, 0) == [(0, 5), (5, 2)]
    assert entries(db_url, b.topic_id, 0) == [(0, 7), (7, 1)]
    assert coord.committed_object_keys(["o1", "o2", "o3"]) == {"o1", "o2"}


def test_idempotent_retry_returns_the_same_offsets(coord: LocalCoordinator, db_url: str) -> None:
    t = coord.create_topic("t", 3)
    chunks = [chunk(t.topic_id, 2, 4, 0, 50), chunk(t.topic_id, 0, 6, 50, 70)]
    coord.commit("before", [chunk(t.topic_id, 0, 10)])
    offsets = coord.commit("obj", chunks)
    assert offsets == [0, 10]
    before = snapshot(db_url)
    assert coord.commit("obj", chunks) == offsets
    # The same chunks in another order: offsets follow the order given.
    assert coord.commit("obj", chunks[::-1]) == offsets[::-1]
    assert snapshot(db_url) == before
    assert coord.offsets("t", 0) == PartitionOffsets(0, 16)


@pytest.mark.parametrize(
    "retry",
    [
        "other_length",
        "other_count",
        "other_position",
        "fewer_chunks",
        "more_chunks",
        "other_partition",
    ],
)
def test_conflicting_retry_raises(coord: LocalCoordinator, db_url: str, retry: str) -> None:
    t = coord.create_topic("t", 3)
    tid = t.topic_id
    coord.commit("obj", [chunk(tid, 0, 4, 0, 50), chunk(tid, 1, 6, 50, 70)])
    variants = {
        "other_length": [chunk(tid, 0, 4, 0, 51), chunk(tid, 1, 6, 50, 70)],
        "other_count": [chunk(tid, 0, 5, 0, 50), chunk(tid, 1, 6, 50, 70)],
        "other_position": [chunk(tid, 0, 4, 1, 50), chunk(tid, 1, 6, 50, 70)],
        "fewer_chunks": [chunk(tid, 0, 4, 0, 50)],
        "more_chunks": [
            chunk(tid, 0, 4, 0, 50),
            chunk(tid, 1, 6, 50, 70),
            chunk(tid, 2, 1, 120, 10),
        ],
        "other_partition": [chunk(tid, 2, 4, 0, 50), chunk(tid, 1, 6, 50, 70)],
    }
    before = snapshot(db_url)
    with pytest.raises(CommitConflictError, match="obj"):
        coord.commit("obj", variants[retry])
    assert snapshot(db_url) == before


@pytest.mark.parametrize("missing", ["topic", "partition"])
def test_unknown_topic_or_partition_commits_nothing(
    coord: LocalCoordinator, db_url: str, missing: str
) -> None:
    a = coord.create_topic("a", 2)
    b = coord.create_topic("b", 2)
    coord.commit("seed", [chunk(a.topic_id, 0, 3), chunk(b.topic_id, 1, 2)])
    bad = chunk(b"\xff" * 16, 0, 1) if missing == "topic" else chunk(b.topic_id, 2, 1)
    # The bad chunk sorts last, so the good chunks were already advanced when it fails.
    chunks = [chunk(a.topic_id, 0, 5), bad, chunk(a.topic_id, 1, 5), chunk(b.topic_id, 0, 5)]
    before = snapshot(db_url)
    error = TopicNotFoundError if missing == "topic" else PartitionNotFoundError
    with pytest.raises(error):
        coord.commit("obj", chunks)
    assert snapshot(db_url) == before
    assert coord.offsets("a", 0) == PartitionOffsets(0, 3)
    assert coord.committed_object_keys(["obj"]) == set()
    # The key was not burnt: a correct commit under it succeeds.
    assert coord.commit("obj", [chunks[0]]) == [3]


def test_topic_id_of_wrong_length_is_an_unknown_topic(coord: LocalCoordinator) -> None:
    coord.create_topic("t", 1)
    with pytest.raises(TopicNotFoundError):
        coord.commit("obj", [chunk(b"short", 0, 1)])


@pytest.mark.parametrize(
    "problem", ["zero_count", "negative_count", "negative_position", "duplicate", "empty", "key"]
)
def test_malformed_commits_are_rejected(coord: LocalCoordinator, db_url: str, problem: str) -> None:
    t = coord.create_topic("t", 2)
    tid = t.topic_id
    key = "obj"
    chunks = {
        "zero_count": [chunk(tid, 0, 1), chunk(tid, 1, 0)],
        "negative_count": [chunk(tid, 0, -3)],
        "negative_position": [chunk(tid, 0, 1, position=-1)],
        "duplicate": [chunk(tid, 0, 1), chunk(tid, 1, 1), chunk(tid, 0, 2, position=100)],
        "empty": [],
        "key": [chunk(tid, 0, 1)],
    }[problem]
    if problem == "key":
        key = ""
    before = snapshot(db_url)
    with pytest.raises(ValueError):
        coord.commit(key, chunks)
    assert snapshot(db_url) == before


# -- reads ----------------------------------------------------------------------


def test_offsets_errors(coord: LocalCoordinator) -> None:
    coord.create_topic("t", 2)
    with pytest.raises(TopicNotFoundError):
        coord.offsets("nope", 0)
    with pytest.raises(PartitionNotFoundError):
        coord.offsets("t", 2)
    with pytest.raises(PartitionNotFoundError):
        coord.offsets("t", -1)
    with pytest.raises(TopicNotFoundError):
        coord.lookup("nope", 0, 0)
    with pytest.raises(PartitionNotFoundError):
        coord.lookup_timestamp("t", 9, 0)


def _five_chunks(coord: LocalCoordinator) -> bytes:
    """Partition 0 of "t" gets chunks [0,10) [10,15) [15,35) [35,36) [36,50)."""
    t = coord.create_topic("t", 2)
    stamps = [(100, 200), (300, 400), (150, 180), (500, 500), (450, 600)]
    for i, (count, (lo, hi)) in enumerate(zip([10, 5, 20, 1, 14], stamps, strict=True)):
        coord.commit(f"o{i}", [chunk(t.topic_id, 0, count, i * 10, 10, lo, hi)])
    return t.topic_id


def test_lookup(coord: LocalCoordinator) -> None:
    _five_chunks(coord)
    first = coord.lookup("t", 0, 0)
    assert [(c.base_offset, c.record_count) for c in first] == [
        (0, 10),
        (10, 5),
        (15, 20),
        (35, 1),
        (36, 14),
    ]
    assert first[2] == ChunkRef("o2", 20, 10, 15, 20, 150, 180, "segment")
    # An offset inside a chunk returns that chunk first.
    assert [c.base_offset for c in coord.lookup("t", 0, 20)] == [15, 35, 36]
    assert [c.base_offset for c in coord.lookup("t", 0, 14)] == [10, 15, 35, 36]
    assert [c.base_offset for c in coord.lookup("t", 0, 35)] == [35, 36]
    assert [c.base_offset for c in coord.lookup("t", 0, 49)] == [36]
    assert [c.base_offset for c in coord.lookup("t", 0, 12, max_chunks=2)] == [10, 15]
    # At or past the high watermark: nothing.
    assert coord.lookup("t", 0, 50) == []
    assert coord.lookup("t", 0, 10_000) == []
    # An empty partition: nothing.
    assert coord.lookup("t", 1, 0) == []
    with pytest.raises(ValueError):
        coord.lookup("t", 0, 0, max_chunks=0)


def test_lookup_below_log_start_reads_from_log_start(coord: LocalCoordinator, db_url: str) -> None:
    tid = _five_chunks(coord)
    # What retention will do: advance log-start into the third chunk, drop older entries.
    rows(
        db_url,
        "UPDATE partitions SET log_start_offset = 20 WHERE topic_id = ? AND partition = 0",
        (tid,),
    )
    rows(db_url, "DELETE FROM index_entries WHERE topic_id = ? AND base_offset < 15", (tid,))
    assert coord.offsets("t", 0) == PartitionOffsets(20, 50)
    assert [c.base_offset for c in coord.lookup("t", 0, 0)] == [15, 35, 36]
    assert [c.base_offset for c in coord.lookup("t", 0, 19)] == [15, 35, 36]
    assert [c.base_offset for c in coord.lookup("t", 0, 36)] == [36]
    # lookup_timestamp starts at log-start too: the dropped chunks never match.
    hit = coord.lookup_timestamp("t", 0, 0)
    assert hit is not None and hit.base_offset == 15


def test_lookup_timestamp(coord: LocalCoordinator) -> None:
    _five_chunks(coord)
    # max timestamps by chunk: 200, 400, 180, 500, 600 (not monotonic: CreateTime).

    def base(ts: int) -> int | None:
        hit = coord.lookup_timestamp("t", 0, ts)
        return None if hit is None else hit.base_offset

    assert base(0) == 0
    assert base(200) == 0
    assert base(201) == 10
    assert base(400) == 10
    assert base(401) == 35
    assert base(501) == 36
    assert base(600) == 36
    assert base(601) is None
    assert coord.lookup_timestamp("t", 1, 0) is None


def test_committed_object_keys(coord: LocalCoordinator) -> None:
    t = coord.create_topic("t", 1)
    committed = [f"segments/x/{i:05d}.seg" for i in range(1200)]
    for key in committed:
        coord.commit(key, [chunk(t.topic_id, 0, 1)])
    asked = committed[::2] + [f"orphan/{i}" for i in range(700)] + committed[:3]
    assert coord.committed_object_keys(asked) == set(committed[::2]) | set(committed[:3])
    assert coord.committed_object_keys([]) == set()


# -- agents ---------------------------------------------------------------------


def test_agents_get_stable_broker_ids(coord: LocalCoordinator, db_url: str) -> None:
    assert coord.heartbeat_agent("agent-a", "10.0.0.1", 8082) == 0
    assert coord.heartbeat_agent("agent-b", "10.0.0.2", 8082) == 1
    assert coord.heartbeat_agent("agent-a", "10.0.0.9", 9092) == 0
    live = coord.list_agents()
    assert [(a.broker_id, a.agent_id, a.host, a.port) for a in live] == [
        (0, "agent-a", "10.0.0.9", 9092),
        (1, "agent-b", "10.0.0.2", 8082),
    ]
    # An agent not heard from within max_age_s is not listed, but keeps its id.
    rows(db_url, "UPDATE agents SET last_seen = last_seen - 60 WHERE agent_id = 'agent-b'")
    assert [a.agent_id for a in coord.list_agents(30.0)] == ["agent-a"]
    assert [a.agent_id for a in coord.list_agents(120.0)] == ["agent-a", "agent-b"]
    assert coord.heartbeat_agent("agent-b", "10.0.0.2", 8082) == 1
    assert coord.heartbeat_agent("agent-c", "h", 1) == 2


def test_concurrent_first_heartbeats_get_distinct_ids(coord: LocalCoordinator) -> None:
    """Race: 16 agents heartbeat for the first time at once -> ids 0..15, each once."""
    barrier = threading.Barrier(16)
    ids: dict[str, int] = {}

    def beat(i: int) -> None:
        barrier.wait()
        ids[f"agent-{i}"] = coord.heartbeat_agent(f"agent-{i}", "h", 8000 + i)

    threads = [threading.Thread(target=beat, args=(i,)) for i in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(ids.values()) == list(range(16))


# -- restart --------------------------------------------------------------------


def test_restart_keeps_everything(db_url: str) -> None:
    url = db_url
    with LocalCoordinator(url) as c:
        cid = c.cluster_id()
        t = c.create_topic("t", 3, {"cleanup.policy": "compact", "retention.ms": "-1"})
        c.create_topic("u", 1)
        c.commit("o1", [chunk(t.topic_id, 0, 5, 0, 10, 10, 20), chunk(t.topic_id, 2, 2, 10, 5)])
        c.commit("o2", [chunk(t.topic_id, 0, 3, 0, 7, 30, 40)])
        c.heartbeat_agent("agent-a", "h", 1)
        c.heartbeat_agent("agent-b", "h", 2)
        topics = c.list_topics()
        index = c.lookup("t", 0, 0)
    with LocalCoordinator(url) as c:
        assert c.cluster_id() == cid
        assert c.list_topics() == topics
        assert c.get_topic_by_id(t.topic_id).configs == {
            "cleanup.policy": "compact",
            "retention.ms": "-1",
        }
        assert c.offsets("t", 0) == PartitionOffsets(0, 8)
        assert c.offsets("t", 2) == PartitionOffsets(0, 2)
        assert c.lookup("t", 0, 0) == index
        assert c.committed_object_keys(["o1", "o2"]) == {"o1", "o2"}
        # Offsets carry on; retries still recognise the old commit; broker ids carry on.
        assert c.commit("o3", [chunk(t.topic_id, 0, 1)]) == [8]
        assert c.commit("o1", [chunk(t.topic_id, 2, 2, 10, 5), chunk(t.topic_id, 0, 5, 0, 10)]) == [
            0,
            0,
        ]
        assert c.heartbeat_agent("agent-c", "h", 3) == 2


@pytest.mark.parametrize(
    ("backend", "write_mode"), [("sqlite", "lock"), ("sqlite", "pool"), ("postgresql", "lock")]
)
def test_threads_commit_contiguously_in_both_write_modes(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str, write_mode: str
) -> None:
    """Race: 8 threads commit 100 times each to the same 2 partitions through one
    LocalCoordinator: on SQLite with one shared write connection ("lock") or one per
    thread ("pool"); on PostgreSQL through the pool, where the partition row locks
    order the commits. Expected: every partition's offsets are contiguous and each
    thread's offsets grow."""
    db_url = new_db_url(request, backend, tmp_path)
    with LocalCoordinator(db_url, write_mode=write_mode) as c:  # type: ignore[arg-type]
        t = c.create_topic("t", 2)
        told: dict[int, list[tuple[int, int, int]]] = {0: [], 1: []}
        lock = threading.Lock()

        def write(w: int) -> None:
            for i in range(100):
                chunks = [chunk(t.topic_id, 0, 1 + (i + w) % 3), chunk(t.topic_id, 1, 1 + w)]
                bases = c.commit(f"{w}/{i}", chunks)
                with lock:
                    for ch, base in zip(chunks, bases, strict=True):
                        told[ch.partition].append((w, base, ch.record_count))

        threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for p in (0, 1):
            spans = sorted((base, count) for _, base, count in told[p])
            assert len(spans) == 800
            assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(spans))
            assert spans[0][0] == 0
            assert c.offsets("t", p).high_watermark == spans[-1][0] + spans[-1][1]
            assert entries(db_url, t.topic_id, p) == spans
            for w in range(8):
                mine = [base for who, base, _ in told[p] if who == w]
                assert mine == sorted(mine)


def test_postgres_lost_connections_are_retriable_then_replaced(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """PostgreSQL only (SQLite has no server connections): the server ends every pooled
    connection (as at a restart or a failover). Expected: the next call fails with the
    retriable CoordinatorUnavailableError, nothing is half-committed, and the call after
    it succeeds on new connections with no manual step; offsets stay contiguous."""
    db_url = new_db_url(request, "postgresql", tmp_path)
    with LocalCoordinator(db_url) as c:
        t = c.create_topic("t", 1)
        assert c.commit("a", [chunk(t.topic_id, 0, 5)]) == [0]
        killed = rows(
            db_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        assert killed and all(ok for (ok,) in killed)
        failures = 0
        for _ in range(3):
            try:
                assert c.commit("b", [chunk(t.topic_id, 0, 3)]) == [5]
                break
            except CoordinatorUnavailableError as e:
                assert e.retriable
                failures += 1
        else:
            pytest.fail("commits kept failing after the connections were replaced")
        assert failures == 1
        assert c.commit("c", [chunk(t.topic_id, 0, 1)]) == [8]
        assert entries(db_url, t.topic_id, 0) == [(0, 5), (5, 3), (8, 1)]
