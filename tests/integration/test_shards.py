"""Partitions sharded over several PostgreSQL databases (``coordinator.shards``).

Every shard is a database of its own on the machine's PostgreSQL (created here with a
unique name, dropped at the end), so that one can be made unavailable
(``ALTER DATABASE ... ALLOW_CONNECTIONS false`` and its backends terminated) while the
server and the other databases keep running.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import httpx
import orjson
import psycopg
import pytest
from confluent_kafka import Producer as KafkaProducer

from coordinator.client import ChunkCommit, IndexWant, TopicInfo, TopicPartition
from coordinator.groups.model import ConsumerConfig
from coordinator.janitors.context import JanitorContext
from coordinator.janitors.gc import run_gc
from coordinator.janitors.retention import run_retention
from coordinator.local import LocalCoordinator
from coordinator.shards import ShardConfigError, ShardedStore
from segments.errors import (
    CoordinatorUnavailableError,
    ObjectDeletedError,
    PartialCommitError,
    PartitionNotFoundError,
    TopicNotFoundError,
)
from segments.store import open_store
from tests.conftest import PG_ADMIN_URL, sql_rows
from tests.integration.conftest import Cluster, ClusterFactory
from tests.integration.test_consumer_api import (
    BINARY,
    Consumer,
    b64,
    create_topic,
    request,
    unb64,
)
from tests.integration.test_group_commit import (
    COMMITS_PER_WRITER,
    PROCESSES,
    THREADS_PER_PROCESS,
    _metric,
    run_http_writers,
)
from tests.integration.test_kafka_clients import produce_and_read_back
from tests.integration.test_metadata_concurrency import PARTITIONS, TOPICS
from tests.procs import start_coordinator
from tests.threads import run_threads

pytestmark = pytest.mark.integration

NewDb = Callable[[], str]


def _url(dbname: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(PG_ADMIN_URL)
    host, port = info.get("host", "127.0.0.1"), info.get("port", "5432")
    return f"postgresql://{info.get('user', 'postgres')}@{host}:{port}/{dbname}"


def _dbname(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?")[0]


@pytest.fixture
def new_db() -> Iterator[NewDb]:
    """Creates empty databases ``lakelog_shard_<random>``; drops them all afterwards."""
    made: list[str] = []

    def make() -> str:
        name = f"lakelog_shard_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        made.append(name)
        return _url(name)

    yield make
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        for name in made:
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def unavailable(url: str) -> Iterator[None]:
    """The database refuses connections and loses the ones it had, until the block ends."""
    name = _dbname(url)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
    try:
        yield
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")


def chunk(topic_id: bytes, partition: int, count: int = 1, ts: int = 1000) -> ChunkCommit:
    return ChunkCommit(topic_id, partition, 0, 10 * count, count, ts, ts + count - 1)


def sharded(coord: LocalCoordinator) -> ShardedStore:
    assert coord.sharded is not None
    return coord.sharded


def partitions_by_shard(coord: LocalCoordinator, topic_id: bytes, n: int) -> list[list[int]]:
    """The topic's partitions (of its first ``n``) that each shard holds, in shard order."""
    s = sharded(coord)
    where = {p: s.shard_of(topic_id, p).shard_id for p in range(n)}
    return [[p for p in range(n) if where[p] == shard.shard_id] for shard in s.shards]


def shard_urls_of(coord: LocalCoordinator, urls: list[str]) -> dict[str, str]:
    """Shard id -> URL (read from each database's meta row)."""
    out = {}
    for url in urls:
        ((shard_id,),) = sql_rows(url, "SELECT value FROM meta WHERE key = 'shard_id'")
        out[shard_id] = url
    return out


# -- configuration --------------------------------------------------------------------


def test_shards_get_ids_in_their_own_database_and_the_catalog_lists_no_urls(
    new_db: NewDb,
) -> None:
    catalog, urls = new_db(), [new_db(), new_db()]
    with LocalCoordinator(catalog, shards=urls) as coord:
        ids = [s.shard_id for s in sharded(coord).shards]
        cluster = coord.cluster_id()
    listed = sql_rows(catalog, "SELECT shard_id FROM shards ORDER BY shard_id")
    assert [r[0] for r in listed] == sorted(ids)
    assert all("postgresql" not in r[0] for r in listed)
    for url, shard_id in zip(urls, ids, strict=True):
        meta = dict(sql_rows(url, "SELECT key, value FROM meta"))
        assert meta == {"cluster_id": cluster, "role": "shard", "shard_id": shard_id}
    # Again, in another order: the same shards, by id.
    with LocalCoordinator(catalog, shards=urls[::-1]) as coord:
        assert sorted(s.shard_id for s in sharded(coord).shards) == sorted(ids)


def test_misconfigured_shards_are_refused(new_db: NewDb) -> None:
    catalog, a, b = new_db(), new_db(), new_db()
    with LocalCoordinator(catalog, shards=[a, b]):
        pass
    with pytest.raises(ShardConfigError, match="no --db-shard leads to"):
        LocalCoordinator(catalog, shards=[a])
    with pytest.raises(ShardConfigError, match="given twice"):
        LocalCoordinator(catalog, shards=[a, b, a])
    with pytest.raises(ShardConfigError, match="is a catalog"):
        LocalCoordinator(catalog, shards=[a, b, catalog])
    with pytest.raises(ShardConfigError, match="is a shard database, not a catalog"):
        LocalCoordinator(a, shards=[b])
    with pytest.raises(ShardConfigError, match="is a shard database, not a catalog"):
        LocalCoordinator(a)
    with pytest.raises(ShardConfigError, match="give its shards too"):
        LocalCoordinator(catalog)
    other = new_db()
    with LocalCoordinator(other, shards=[new_db()]) as coord:
        foreign_url = _url(_dbname(sharded(coord).shards[0].db.location))
    with pytest.raises(ShardConfigError, match="belongs to cluster"):
        LocalCoordinator(catalog, shards=[a, b, foreign_url])
    # A single-database cluster with partitions cannot become a catalog in place.
    single = new_db()
    with LocalCoordinator(single) as coord:
        coord.create_topic("t", 2)
    with pytest.raises(ShardConfigError, match="holds partitions of its own"):
        LocalCoordinator(single, shards=[new_db()])


# -- the data path -----------------------------------------------------------------------


def test_partitions_spread_over_shards_and_commits_split_by_shard(new_db: NewDb) -> None:
    catalog, urls = new_db(), [new_db(), new_db(), new_db()]
    N = 48  # all three shards used but with probability ~1e-8
    with LocalCoordinator(catalog, shards=urls) as coord:
        topic = coord.create_topic("spread", N)
        by_id = shard_urls_of(coord, urls)
        placed = dict(
            (
                (p, s)
                for p, s in sql_rows(
                    catalog,
                    "SELECT partition, shard_id FROM partition_shards WHERE topic_id = ?",
                    (topic.topic_id,),
                )
            )
        )
        assert sorted(placed) == list(range(N))
        assert len(set(placed.values())) == 3  # 48 partitions, 3 shards: all used
        # Each partition row is in its shard, and only there; the catalog has none.
        for shard_id, url in by_id.items():
            rows = sql_rows(
                url, "SELECT partition FROM partitions WHERE topic_id = ?", (topic.topic_id,)
            )
            assert sorted(r[0] for r in rows) == sorted(
                p for p, s in placed.items() if s == shard_id
            )
        assert sql_rows(catalog, "SELECT COUNT(*) FROM partitions") == [(0,)]

        # One object with a chunk in every partition: every shard commits its part.
        chunks = [chunk(topic.topic_id, p, count=p + 1) for p in range(N)]
        assert coord.commit("segments/a/1.seg", chunks) == [0] * N
        assert coord.commit("segments/a/2.seg", chunks) == [p + 1 for p in range(N)]
        # A retry answers with the first offsets, shard by shard.
        assert coord.commit("segments/a/2.seg", chunks) == [p + 1 for p in range(N)]
        for shard_id, url in by_id.items():
            keys = sql_rows(url, "SELECT object_key FROM objects ORDER BY object_key")
            assert [k[0] for k in keys] == ["segments/a/1.seg", "segments/a/2.seg"], shard_id
        for p in range(N):
            offsets = coord.offsets("spread", p)
            assert (offsets.log_start, offsets.high_watermark) == (0, 2 * (p + 1))
            refs = coord.lookup("spread", p, 0)
            assert [r.object_key for r in refs] == ["segments/a/1.seg", "segments/a/2.seg"]
            assert [r.base_offset for r in refs] == [0, p + 1]
        # Many partitions' lookups in one call, each shard's from its own database.
        wants = [IndexWant("spread", p, 1) for p in range(N)] + [IndexWant("spread", N, 0)]
        assert coord.lookup_many(wants) == {p: coord.lookup("spread", p, 1) for p in range(N)}
        many = coord.offsets_many([TopicPartition("spread", p) for p in range(N + 1)])
        assert {tp.partition: o.high_watermark for tp, o in many.items()} == {
            p: 2 * (p + 1) for p in range(N)
        }
        ts = coord.lookup_timestamp("spread", 5, 1003)
        assert ts is not None and ts.object_key == "segments/a/1.seg"
        assert coord.committed_object_keys(["segments/a/1.seg", "nope"]) == {"segments/a/1.seg"}
        assert coord.delete_records("spread", 3, 4) == 4
        assert coord.offsets("spread", 3).log_start == 4
        # Unknown partitions and topics fail as on one database, committing nothing.
        with pytest.raises(PartitionNotFoundError):
            coord.commit("segments/a/3.seg", [chunk(topic.topic_id, N)])
        with pytest.raises(TopicNotFoundError):
            coord.commit("segments/a/3.seg", [chunk(uuid.uuid4().bytes, 0)])
        with pytest.raises(PartitionNotFoundError):
            coord.offsets("spread", N)
        assert coord.committed_object_keys(["segments/a/3.seg"]) == set()


def test_concurrent_writers_get_contiguous_offsets_on_every_shard(new_db: NewDb) -> None:
    catalog, urls = new_db(), [new_db(), new_db()]
    writers, commits = 8, 40
    with LocalCoordinator(catalog, shards=urls) as coord:
        topic = coord.create_topic("busy", 6)
        got: list[tuple[int, int, int]] = []  # (partition, base, count)
        lock = threading.Lock()

        def write(w: int) -> None:
            for n in range(commits):
                chunks = [chunk(topic.topic_id, p, count=1 + (w + n + p) % 3) for p in range(6)]
                bases = coord.commit(f"segments/w{w}/{n}.seg", chunks)
                with lock:
                    got.extend(
                        (c.partition, b, c.record_count) for c, b in zip(chunks, bases, strict=True)
                    )

        run_threads(write, range(writers))
        for p in range(6):
            runs = sorted((b, n) for q, b, n in got if q == p)
            end = 0
            for base, n in runs:
                assert base == end  # no gap, no overlap
                end = base + n
            assert coord.offsets("busy", p).high_watermark == end


def test_a_shard_added_later_moves_nothing(new_db: NewDb) -> None:
    catalog, a, b, c = new_db(), new_db(), new_db(), new_db()
    with LocalCoordinator(catalog, shards=[a, b]) as coord:
        old = coord.create_topic("old", 30)
        coord.commit("segments/o/1.seg", [chunk(old.topic_id, p) for p in range(30)])
        before = sql_rows(catalog, "SELECT partition, shard_id FROM partition_shards")
    with LocalCoordinator(catalog, shards=[a, b, c]) as coord:
        new_id = next(
            s.shard_id for s in sharded(coord).shards if s.db.location.endswith(_dbname(c))
        )
        assert sorted(before) == sorted(
            sql_rows(
                catalog,
                "SELECT partition, shard_id FROM partition_shards WHERE topic_id = ?",
                (old.topic_id,),
            )
        )
        assert all(coord.offsets("old", p).high_watermark == 1 for p in range(30))
        new = coord.create_topic("new", 30)
        placed = sql_rows(
            catalog, "SELECT shard_id FROM partition_shards WHERE topic_id = ?", (new.topic_id,)
        )
        assert new_id in {r[0] for r in placed}
        # add_partitions places the new ones over all three, keeping the old ones.
        coord.add_partitions("old", 60)
        grown = dict(
            sql_rows(
                catalog,
                "SELECT partition, shard_id FROM partition_shards WHERE topic_id = ?",
                (old.topic_id,),
            )
        )
        assert {p: s for p, s in grown.items() if p < 30} == dict(before)
        assert new_id in {s for p, s in grown.items() if p >= 30}
        assert coord.commit("segments/o/2.seg", [chunk(old.topic_id, p) for p in range(60)]) == (
            [1] * 30 + [0] * 30
        )


def test_delete_topic_clears_every_shard_and_groups_see_shard_offsets(new_db: NewDb) -> None:
    catalog, urls = new_db(), [new_db(), new_db()]
    with LocalCoordinator(catalog, shards=urls) as coord:
        t = coord.create_topic("gone", 4)
        coord.commit("segments/g/1.seg", [chunk(t.topic_id, p, count=5) for p in range(4)])
        # Committed offsets (catalog) against high watermarks (shards): the lag.
        from coordinator.groups.model import CommittedOffset

        coord.alter_group_offsets(
            "g1", {TopicPartition("gone", p): CommittedOffset(p, "") for p in range(4)}
        )
        lag = coord.group_lag()
        assert [(x.group, x.topic, x.lag, x.max_lag, x.partitions) for x in lag] == [
            ("g1", "gone", 5 + 4 + 3 + 2, 5, 4)
        ]
        # Another coordinator has the placements cached when the topic goes.
        with LocalCoordinator(catalog, shards=urls) as other:
            other.commit("segments/g/0.seg", [chunk(t.topic_id, p) for p in range(4)])
            coord.delete_topic("gone")
            for url in urls:
                assert sql_rows(url, "SELECT COUNT(*) FROM partitions") == [(0,)]
                assert sql_rows(url, "SELECT COUNT(*) FROM index_entries") == [(0,)]
            assert sql_rows(catalog, "SELECT COUNT(*) FROM partition_shards") == [(0,)]
            for c in (coord, other):
                with pytest.raises(TopicNotFoundError):
                    c.commit("segments/g/2.seg", [chunk(t.topic_id, p) for p in range(4)])
            for url in urls:  # and nothing was brought back
                assert sql_rows(url, "SELECT COUNT(*) FROM partitions") == [(0,)]


def test_a_partition_placed_while_its_shard_was_down_serves_consumers_once_it_is_back(
    new_db: NewDb,
) -> None:
    """A topic created during a shard's outage: its partitions there get their rows
    lazily. Once the shard answers, a consumer assigned them starts at 0 (before, the
    groups saw no row and answered "unavailable, try again" until someone produced)."""
    catalog, urls = new_db(), [new_db(), new_db()]
    with LocalCoordinator(catalog, shards=urls, timeout_s=2.0) as coord:
        s = sharded(coord)
        by_id = shard_urls_of(coord, urls)
        victim = s.shards[0]
        with unavailable(by_id[victim.shard_id]):
            t = coord.create_topic("late", 6)
        late = [p for p in range(6) if s.shard_of(t.topic_id, p) is victim]
        assert late
        deadline = time.monotonic() + 30
        while victim.health.cause is not None:  # its probe finds it back
            assert time.monotonic() < deadline, victim.health.cause
            time.sleep(0.1)
        tps = [TopicPartition("late", p) for p in late]
        coord.create_consumer("g", "c1", ConsumerConfig(auto_offset_reset="earliest"))
        state = coord.assign("g", "c1", tps)
        assert {tp: state.positions[tp] for tp in tps} == dict.fromkeys(tps, 0)
        assert coord.offsets("late", late[0]).high_watermark == 0


# -- garbage collection ----------------------------------------------------------------


def test_purging_deleted_topics_keeps_a_topic_created_meanwhile(
    new_db: NewDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GC drops deleted topics' rows from the shards by comparing the shards' topic ids
    with the catalog's live ones. A topic created and written between those two reads
    must keep its records: the shards are read first."""
    catalog, urls = new_db(), [new_db()]
    with LocalCoordinator(catalog, shards=urls) as coord:
        janitors = coord.janitor_catalog()
        real_db = janitors._db  # type: ignore[attr-defined]
        born: list[TopicInfo] = []

        @contextmanager
        def read_then_create() -> Iterator[Any]:
            with real_db.read() as conn:
                yield conn
            if not born:  # right after the catalog's read
                born.append(coord.create_topic("born-during-gc", 1))
                coord.commit("segments/born.seg", [chunk(born[0].topic_id, 0, count=3)])

        monkeypatch.setattr(
            janitors, "_db", SimpleNamespace(read=read_then_create, dialect=real_db.dialect)
        )
        assert janitors.purge_deleted_topics() == 0
        assert born and coord.offsets("born-during-gc", 0).high_watermark == 3
        assert [r.object_key for r in coord.lookup("born-during-gc", 0, 0)] == ["segments/born.seg"]


def test_gc_keeps_an_object_any_shard_references(new_db: NewDb, tmp_path: Path) -> None:
    catalog, urls = new_db(), [new_db(), new_db()]
    store = open_store(f"file://{tmp_path}/store")
    with LocalCoordinator(catalog, shards=urls) as coord:
        t = coord.create_topic("gc", 8)
        first, second = partitions_by_shard(coord, t.topic_id, 8)
        assert first and second
        key = "segments/gc/1.seg"
        store.put(key, b"x" * 100)
        coord.commit(key, [chunk(t.topic_id, p) for p in range(8)])
        clock = [time.time() + 10_000]
        ctx = JanitorContext(coord.janitor_catalog(), coord.store, store, lambda: clock[0])

        # Shard 0 drops its references; shard 1 still has them: the object stays.
        for p in first:
            coord.delete_records("gc", p, -1)
        report = run_gc(ctx, grace_s=1.0)
        clock[0] += 10
        report = run_gc(ctx, grace_s=1.0)
        assert report.objects_deleted == 0 and report.orphans_deleted == 0
        assert store.exists(key) if hasattr(store, "exists") else store.get(key)

        # A shard that does not answer: nothing is deleted in that round.
        for p in second:
            coord.delete_records("gc", p, -1)
        orphan = "segments/gc/orphan.seg"
        store.put(orphan, b"y")
        with unavailable(urls[1]):
            clock[0] += 10
            with pytest.raises(CoordinatorUnavailableError):
                run_gc(ctx, grace_s=1.0)
        assert store.get(key) and store.get(orphan)
        # Back: the object and the orphan go.
        deadline = time.monotonic() + 30
        while True:
            clock[0] += 10
            try:
                report = run_gc(ctx, grace_s=1.0)
                break
            except CoordinatorUnavailableError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        report = run_gc(ctx, grace_s=1.0) if report.objects_deleted == 0 else report
        assert {o.key for o in store.list("segments/")} == set()


def test_gc_and_commits_agree_in_every_shard(new_db: NewDb, tmp_path: Path) -> None:
    """Issue 22 defect 1, sharded. An orphan is collected only once every shard holds its
    tombstone, so a late commit fails whichever shard its partitions live in; a
    committed object collected after retention cannot be committed again (a retry whose
    answer was lost); a pending upload under a live lease (in the catalog) stays; a key
    committed in one shard is no orphan, and the tombstones claimed meanwhile in the
    others are taken back."""
    catalog, urls = new_db(), [new_db(), new_db()]
    store = open_store(f"file://{tmp_path}/store")
    with LocalCoordinator(catalog, shards=urls) as coord:
        t = coord.create_topic("gc-agree", 8)
        first, second = (min(ps) for ps in partitions_by_shard(coord, t.topic_id, 8))
        committed, orphan, pending = "segments/a/c.seg", "segments/a/o.seg", "segments/a/p.seg"
        for key in (committed, orphan, pending):
            store.put(key, b"x")
        coord.commit(committed, [chunk(t.topic_id, first), chunk(t.topic_id, second)])
        coord.keep_pending("job", [pending], 20_000)  # past the pinned clock
        for p in (first, second):
            coord.delete_records("gc-agree", p, -1)
        clock = [time.time() + 10_000]
        ctx = JanitorContext(coord.janitor_catalog(), coord.store, store, lambda: clock[0])
        run_gc(ctx, grace_s=1.0)
        clock[0] += 10
        run_gc(ctx, grace_s=1.0)
        assert {o.key for o in store.list("segments/")} == {pending}
        for key in (orphan, committed):
            for p in (first, second):
                with pytest.raises(ObjectDeletedError):
                    coord.commit(key, [chunk(t.topic_id, p)])
        assert coord.offsets("gc-agree", first).high_watermark == 1

        janitors = coord.janitor_catalog()
        late = "segments/a/late.seg"
        coord.commit(late, [chunk(t.topic_id, second)])
        assert janitors.claim_orphans([late], time.time()) == set()
        url0 = shard_urls_of(coord, urls)[sharded(coord).shards[0].shard_id]
        assert sql_rows(url0, "SELECT object_key FROM objects WHERE object_key = ?", (late,)) == []
        assert coord.commit(late, [chunk(t.topic_id, first)]) == [1]


def test_retention_runs_in_every_shard_and_skips_one_that_is_down(
    new_db: NewDb, tmp_path: Path
) -> None:
    catalog, urls = new_db(), [new_db(), new_db()]
    store = open_store(f"file://{tmp_path}/store")
    with LocalCoordinator(catalog, shards=urls, timeout_s=2.0) as coord:
        t = coord.create_topic("ret", 8, {"retention.bytes": "0"})
        for n in range(3):
            coord.commit(f"segments/r/{n}.seg", [chunk(t.topic_id, p) for p in range(8)])
        s = sharded(coord)
        by_id = shard_urls_of(coord, urls)
        victim = s.shards[0]
        down = {p for p in range(8) if s.shard_of(t.topic_id, p) is victim}
        assert down and len(down) < 8
        ctx = JanitorContext(coord.janitor_catalog(), coord.store, store)
        with unavailable(by_id[victim.shard_id]):
            report = run_retention(ctx)
            assert report.partitions == 8 - len(down)
            assert report.records_dropped == 3 * (8 - len(down))
        for p in range(8):
            if p not in down:
                assert coord.offsets("ret", p).log_start == 3
        deadline = time.monotonic() + 30
        while True:
            try:
                coord.offsets_many([TopicPartition("ret", p) for p in down])
                break
            except CoordinatorUnavailableError:
                assert time.monotonic() < deadline, "the shard never came back"
                time.sleep(0.2)
        report = run_retention(ctx)
        assert report.partitions == 8 and report.records_dropped == 3 * len(down)
        assert all(coord.offsets("ret", p).log_start == 3 for p in range(8))


# -- one shard down ----------------------------------------------------------------------


def test_an_unexpected_error_on_one_shard_fails_only_its_chunks(
    new_db: NewDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not an outage but a bug (any exception) on one shard: the other shards' commits
    are still waited for and reported as committed (PartialCommitError), never left
    visible behind an answer that says the whole commit failed."""
    catalog, urls = new_db(), [new_db(), new_db()]
    with LocalCoordinator(catalog, shards=urls) as coord:
        t = coord.create_topic("bug", 8)
        s = sharded(coord)
        victim = s.shards[0]
        lost = [p for p in range(8) if s.shard_of(t.topic_id, p) is victim]
        assert lost and len(lost) < 8

        def broken(*args: object, **kwargs: object) -> list[int]:
            raise RuntimeError("a bug")

        monkeypatch.setattr(victim.store, "commit_checked", broken)
        with pytest.raises(PartialCommitError) as info:
            coord.commit("segments/bug/0.seg", [chunk(t.topic_id, p) for p in range(8)])
        assert [b is None for b in info.value.base_offsets] == [p in lost for p in range(8)]
        assert all(info.value.base_offsets[p] == 0 for p in range(8) if p not in lost)
        assert "RuntimeError" in str(info.value.failures[lost[0]])
        monkeypatch.undo()
        assert coord.offsets("bug", next(p for p in range(8) if p not in lost)).high_watermark == 1


def test_one_shard_down_pauses_only_its_partitions(new_db: NewDb) -> None:
    catalog, urls = new_db(), [new_db(), new_db(), new_db()]
    with LocalCoordinator(catalog, shards=urls, timeout_s=2.0) as coord:
        t = coord.create_topic("down", 9)
        s = sharded(coord)
        by_id = shard_urls_of(coord, urls)
        victim = s.shards[1]
        lost = sorted(p for p in range(9) if s.shard_of(t.topic_id, p) is victim)
        kept = sorted(p for p in range(9) if p not in lost)
        assert lost and kept
        every = [chunk(t.topic_id, p) for p in range(9)]
        coord.commit("segments/d/0.seg", every)
        with unavailable(by_id[victim.shard_id]):
            with pytest.raises(PartialCommitError) as info:
                coord.commit("segments/d/1.seg", every)
            e = info.value
            assert e.retriable
            assert [b is None for b in e.base_offsets] == [p in lost for p in range(9)]
            assert all(e.base_offsets[p] == 1 for p in kept)
            assert all(isinstance(e.failures[p], CoordinatorUnavailableError) for p in lost)
            # The others keep committing, fast (the down shard is not waited for).
            started = time.monotonic()
            for n in range(2, 12):
                bases = coord.commit(f"segments/d/{n}.seg", [chunk(t.topic_id, p) for p in kept])
                assert bases == [n] * len(kept)
            assert time.monotonic() - started < 10
            with pytest.raises(CoordinatorUnavailableError):
                coord.commit("segments/d/x.seg", [chunk(t.topic_id, lost[0])])
            with pytest.raises(CoordinatorUnavailableError):
                coord.lookup("down", lost[0], 0)
            # The down shard's partitions are left out, for their own lookups to report.
            found = coord.lookup_many([IndexWant("down", p, 0) for p in range(9)])
            assert sorted(found) == kept
            assert coord.offsets("down", kept[0]).high_watermark == 12
            with pytest.raises(CoordinatorUnavailableError):  # never "not there"
                coord.offsets_many([TopicPartition("down", p) for p in range(9)])
            many = coord.offsets_many([TopicPartition("down", p) for p in kept])
            assert sorted(tp.partition for tp in many) == kept
        # Restored: the retry of the partly committed object completes it with the same
        # offsets where it was committed, and the lost partitions resume contiguously.
        deadline = time.monotonic() + 30
        while True:
            try:
                bases = coord.commit("segments/d/1.seg", every)
                break
            except CoordinatorUnavailableError:
                assert time.monotonic() < deadline, "the shard never came back"
                time.sleep(0.2)
        assert bases == [1] * 9
        assert coord.commit("segments/d/12.seg", every) == [
            12 if p in kept else 2 for p in range(9)
        ]
        for p in range(9):
            refs = coord.lookup("down", p, 0, max_chunks=100)
            offsets = [(r.base_offset, r.record_count) for r in refs]
            assert [b for b, _ in offsets] == list(range(len(offsets)))


# -- a cluster: coordinator process, agents, REST ------------------------------------------


def run_janitor(cluster: Cluster, name: str, **body: Any) -> dict[str, Any]:
    """Run a janitor in the coordinator now; its report."""
    r = httpx.post(f"{cluster.coordinator_url}/v1/janitors/{name}/run", json=body, timeout=120)
    assert r.status_code == 200, r.text
    last = orjson.loads(r.text.strip().splitlines()[-1])
    assert "report" in last, last
    report: dict[str, Any] = last["report"]
    return report


def consume_all(cluster: Cluster, topic: str, expected: int) -> list[dict[str, Any]]:
    """Every record of ``topic`` through a new group's one member (alternating agents)."""
    c = Consumer.create(
        cluster.agents, f"g-{uuid.uuid4().hex[:8]}", **{"auto.offset.reset": "earliest"}
    )
    c.subscribe(topic)
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(got) < expected and time.monotonic() < deadline:
        got += c.fetch(200)
    c.commit()
    assert len(got) == expected
    return got


@pytest.mark.slow
def test_a_keyed_request_partly_committed_over_shards_is_completed_by_its_retry(
    cluster_factory: ClusterFactory, new_db: NewDb
) -> None:
    """Issue 22 defect 5. While one shard is down, keyed requests to the other shards
    work (on main every keyed request failed: the key was looked up in every shard), and
    a keyed request over both kinds of partition commits where it can (the others fail
    retriably). Its retry once the shard is back stores what is missing and answers
    every offset, the first ones unchanged (on main: 50002 for the key's whole window,
    the missing record never stored); a further retry stores nothing."""
    catalog, urls = new_db(), [new_db(), new_db()]
    cluster = cluster_factory(
        db_url=catalog, coordinator_args=[a for u in urls for a in ("--db-shard", u)]
    )
    topic = create_topic(cluster, "keyed-across", 8)
    ((topic_id,),) = sql_rows(catalog, "SELECT topic_id FROM topics WHERE name = ?", (topic,))
    placed = dict(
        sql_rows(
            catalog,
            "SELECT partition, shard_id FROM partition_shards WHERE topic_id = ?",
            (topic_id,),
        )
    )
    shard_url = {
        sql_rows(u, "SELECT value FROM meta WHERE key = 'shard_id'")[0][0]: u for u in urls
    }
    victim = placed[0]
    lost = min(p for p, s in placed.items() if s == victim)
    kept = min(p for p, s in placed.items() if s != victim)

    def send(key: str, records: list[tuple[int, bytes]]) -> list[dict[str, Any]]:
        body = {"records": [{"value": b64(v), "partition": p} for p, v in records]}
        r = httpx.post(
            f"{cluster.agents[0]}/topics/{topic}",
            content=orjson.dumps(body),
            headers={"Content-Type": BINARY, "Idempotency-Key": key},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        answers: list[dict[str, Any]] = r.json()["offsets"]
        return answers

    both = [(kept, b"kept"), (lost, b"lost")]
    with unavailable(shard_url[victim]):
        alone = send("only-kept", [(kept, b"alone")])
        assert alone[0]["error_code"] is None, alone
        first = send("both", both)
        assert first[0]["error_code"] is None and first[1]["error_code"] == 50003, first
    deadline = time.monotonic() + 60
    while True:
        again = send("both", both)
        if all(a["error_code"] is None for a in again):
            break
        assert time.monotonic() < deadline, again
        time.sleep(0.5)
    assert again[0]["offset"] == first[0]["offset"] and again[1]["partition"] == lost
    assert send("both", both) == again  # answered from what is stored now
    records = consume_all(cluster, topic, 3)
    assert sorted((r["partition"], r["offset"], unb64(r["value"])) for r in records) == sorted(
        [
            (kept, alone[0]["offset"], b"alone"),
            (kept, first[0]["offset"], b"kept"),
            (lost, again[1]["offset"], b"lost"),
        ]
    )


def test_rest_cluster_across_shards_with_one_shard_down(
    cluster_factory: ClusterFactory, new_db: NewDb, spark: Any
) -> None:
    """Produce, consume, groups, janitors and Spark through real processes over three
    shards; one shard's database unavailable mid-run: only its partitions pause, and once
    it is back they resume with contiguous offsets and every acked record is there."""
    catalog, urls = new_db(), [new_db(), new_db(), new_db()]
    cluster = cluster_factory(
        db_url=catalog, coordinator_args=[a for u in urls for a in ("--db-shard", u)], kafka=True
    )
    topic = create_topic(cluster, "across", 9)
    ((topic_id,),) = sql_rows(catalog, "SELECT topic_id FROM topics WHERE name = 'across'")
    placed = dict(
        sql_rows(
            catalog,
            "SELECT partition, shard_id FROM partition_shards WHERE topic_id = ?",
            (topic_id,),
        )
    )
    assert len(set(placed.values())) >= 2
    shard_url = {
        sql_rows(u, "SELECT value FROM meta WHERE key = 'shard_id'")[0][0]: u for u in urls
    }
    victim = placed[0]
    lost = sorted(p for p, s in placed.items() if s == victim)
    kept = sorted(p for p, s in placed.items() if s != victim)
    assert kept

    acked: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(9)}

    def send(round_: int, partition: int) -> list[int | None]:
        """Five records to one partition; the error code of each (None: acked)."""
        values = [f"{round_}-{partition}-{i}".encode() for i in range(5)]
        path = f"/topics/{topic}/partitions/{partition}"
        body = {"records": [{"value": b64(v)} for v in values]}
        r = request("POST", cluster.agents[round_ % 2] + path, body, content_type=BINARY)
        assert r.status_code == 200, r.text  # v2: per-record errors
        answers = r.json()["offsets"]
        for a, v in zip(answers, values, strict=True):
            if a.get("error_code") is None:
                acked[partition].append((a["offset"], v))
        return [a.get("error_code") for a in answers]

    ok = [None] * 5
    for round_ in range(3):
        for p in range(9):
            assert send(round_, p) == ok
    # A consumer positioned on every partition before the outage.
    reader = Consumer.create(
        cluster.agents, f"g-{uuid.uuid4().hex[:8]}", **{"auto.offset.reset": "earliest"}
    )
    reader.assign(topic, *range(9))
    first = reader.fetch(200, max_bytes=1)
    assert len(first) == 1
    with unavailable(shard_url[victim]):
        # It keeps reading the partitions of the shards that are up.
        read: list[dict[str, Any]] = [rec for rec in first if rec["partition"] in kept]
        want = sum(len(acked[p]) for p in kept)
        deadline = time.monotonic() + 30
        while len(read) < want and time.monotonic() < deadline:
            r = reader.fetch_raw(200)
            assert r.status_code == 200, r.text
            read += [rec for rec in r.json() if rec["partition"] in kept]
        assert sorted((rec["partition"], rec["offset"]) for rec in read) == sorted(
            (p, o) for p in kept for o, _ in acked[p]
        )
        for round_ in range(3, 6):
            for p in kept:  # the other shards keep taking records
                assert send(round_, p) == ok
            assert send(round_, lost[0]) == [50003] * 5  # retriable: the shard is down
        # All partitions at once: flushes holding chunks of every shard are committed
        # where they can be; each request learns its own partition's fate.
        with ThreadPoolExecutor(9) as pool:
            for round_ in range(6, 9):
                answers = list(pool.map(lambda p, r=round_: send(r, p), range(9)))
                for p in range(9):
                    assert answers[p] == ([50003] * 5 if p in lost else ok), (p, answers[p])
        # One request over both kinds of partition: its records on the shards that are
        # up are stored (and say where), the others fail retriably, in one answer.
        mixed = [(kept[0], b"mixed-kept"), (lost[0], b"mixed-lost"), (kept[0], b"mixed-2")]
        body = {"records": [{"value": b64(v), "partition": p} for p, v in mixed]}
        r = request("POST", cluster.agents[0] + f"/topics/{topic}", body, content_type=BINARY)
        assert r.status_code == 200, r.text
        answers = r.json()["offsets"]
        assert [a["error_code"] for a in answers] == [None, 50003, None], answers
        for (p, v), a in zip(mixed, answers, strict=True):
            if a["error_code"] is None:
                assert a["partition"] == p
                acked[p].append((a["offset"], v))
    partial = sum(
        float(line.split()[-1])
        for agent in cluster.agents
        for line in httpx.get(f"{agent}/metrics").text.splitlines()
        if line.startswith('lakelog_flushes_total{result="partial"}')
    )
    assert partial >= 1  # some flush was committed in part
    # Back: the paused partitions take records again (once the coordinator's probe and
    # the agents' retries have seen it).
    deadline = time.monotonic() + 60
    for p in lost:
        while send(9, p) != ok:
            assert time.monotonic() < deadline, "the shard's partitions never resumed"
            time.sleep(0.2)
    for p in kept:
        assert send(9, p) == ok

    total = sum(len(v) for v in acked.values())
    records = consume_all(cluster, topic, total)
    by_partition: dict[int, list[tuple[int, bytes]]] = {}
    for rec in records:
        value = unb64(rec["value"])
        assert value is not None
        by_partition.setdefault(rec["partition"], []).append((rec["offset"], value))
    for p in range(9):
        got = by_partition.get(p, [])
        assert [o for o, _ in got] == list(range(len(got)))  # contiguous from 0
        assert sorted(acked[p]) == got  # every acked record, and nothing else

    # Kafka clients too: an idempotent librdkafka producer (its sequence state lives in
    # each partition's shard), read back whole by a Kafka consumer.
    kafka_topic = create_topic(cluster, "kafka-across", 6)
    producer = KafkaProducer(
        {
            "bootstrap.servers": cluster.kafka[0],
            "enable.idempotence": True,
            "linger.ms": 20,
            "partitioner": "murmur2_random",
        }
    )
    sent = [{"key": b"key-%d" % (i % 23), "value": b"v-%d" % i} for i in range(300)]
    got_kafka = produce_and_read_back(producer, cluster.kafka[1], kafka_topic, 6, sent)

    # Janitors across shards: tier everything, then gc asks every shard.
    report = run_janitor(cluster, "tier", tier_age_s=0)
    assert report["partitions"] == 15 and report["objects_written"] >= 15
    time.sleep(1.1)  # S3 keeps modification times in whole seconds
    report = run_janitor(cluster, "gc", gc_grace_s=0.5)
    assert report["objects_deleted"] > 0
    s3 = boto3.client("s3", endpoint_url=cluster.store_endpoint)
    left = s3.list_objects_v2(Bucket=cluster.bucket, Prefix="lakelog/segments/")
    assert left.get("KeyCount", 0) == 0
    # The same records, now from the tier objects of every shard's partitions.
    again = consume_all(cluster, topic, total)
    assert sorted((r["partition"], r["offset"], r["value"]) for r in again) == sorted(
        (r["partition"], r["offset"], r["value"]) for r in records
    )
    # And through Spark, planned by the coordinator (lookups in every shard).
    df = (
        spark.read.format("lakelog")
        .options(coordinator=cluster.coordinator_url, subscribe=f"{topic},{kafka_topic}")
        .load()
    )
    rows = sorted((r.topic, r.partition, r.offset, bytes(r.value)) for r in df.collect())
    assert rows == sorted(
        [(topic, p, o, v) for p, got in acked.items() for o, v in got]
        + [(kafka_topic, m.partition(), m.offset(), m.value()) for m in got_kafka]
    )


@pytest.mark.slow
def test_sixteen_writers_in_four_processes_over_shards(new_db: NewDb, tmp_path: Path) -> None:
    """The group-commit race of ``test_group_commit`` against a coordinator process over
    three shards: 16 writers (4 processes x 4 threads, HTTP) commit 1-5 chunks each, a
    poisoned writer commits to a partition past the count. Every poisoned commit fails
    alone, every other one succeeds; offsets run contiguously in every partition of
    every shard and each writer was told exactly what the index holds for its object;
    each shard grouped commits into fewer transactions."""
    catalog, urls = new_db(), [new_db(), new_db(), new_db()]
    with LocalCoordinator(catalog, shards=urls) as local:
        topic_ids = [local.create_topic(f"topic-{i}", PARTITIONS).topic_id for i in range(TOPICS)]
    proc, url = start_coordinator(
        tmp_path, catalog, args=[a for u in urls for a in ("--db-shard", u)]
    )
    try:
        records, poison_failures = run_http_writers(url, topic_ids)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    finally:
        proc.stop()
    assert poison_failures == []
    assert len(records) == PROCESSES * THREADS_PER_PROCESS * COMMITS_PER_WRITER
    told: dict[tuple[bytes, int], dict[int, tuple[int, str]]] = {}
    for _, _, key, chunks in records:
        for t, p, base, count in chunks:
            told.setdefault((bytes(t), p), {})[base] = (count, key)
    with LocalCoordinator(catalog, shards=urls) as local:
        s = sharded(local)
        used = {s.shard_of(t, p).shard_id for t in topic_ids for p in range(PARTITIONS)}
        assert len(used) == 3
        for t in topic_ids:
            name = local.get_topic_by_id(t).name
            for p in range(PARTITIONS):
                refs = local.lookup(name, p, 0, max_chunks=100_000)
                expected = 0
                for r in refs:
                    assert r.base_offset == expected  # contiguous: no gap, no overlap
                    assert told[(t, p)][r.base_offset] == (r.record_count, r.object_key)
                    expected += r.record_count
                assert len(refs) == len(told.get((t, p), {}))
                assert local.offsets(name, p).high_watermark == expected
    requests = _metric(metrics, "lakelog_coordinator_group_commit_requests_total")
    batches = _metric(metrics, "lakelog_coordinator_group_commit_batches_total")
    assert requests >= len(records) and batches < requests


# -- transactions ----------------------------------------------------------------------


def test_transactions_span_shards(new_db: NewDb) -> None:
    """Transaction state in the catalog, each partition's open and aborted transactions
    in its shard beside the commit that checks them: a transaction over partitions of
    both shards holds back the last stable offset of each until its markers (one object,
    committed per shard) close them; an abort leaves its range in each shard; a batch for
    a partition the transaction did not add is refused by that partition's shard."""
    from coordinator.log.producers import ProducerBatch
    from index.log import LogWriter
    from segments.errors import InvalidTxnStateError
    from segments.memory import MemoryStore

    with LocalCoordinator(new_db(), shards=[new_db(), new_db()]) as coord:
        info = coord.create_topic("tx", 8)
        by_shard = partitions_by_shard(coord, info.topic_id, 8)
        assert all(by_shard), by_shard  # both shards hold some
        parts = [by_shard[0][0], by_shard[1][0]]
        writer = LogWriter(MemoryStore(), coord)

        def txn_data(pid: int, epoch: int, p: int, seq: int, n: int = 2) -> int:
            batch = ProducerBatch(pid, epoch, seq, n, 0, transactional=True)
            c = ChunkCommit(info.topic_id, p, 0, 10, n, 1, 2, producer_batches=(batch,))
            return coord.commit(f"segments/tx/{uuid.uuid4().hex}.seg", [c])[0]

        def stable(p: int) -> Any:
            return coord.stable_offsets([IndexWant("tx", p, 0)])[0]

        for commit in (True, False):
            t = coord.init_transaction("app", 60_000)
            coord.add_txn_partitions(
                "app", t.producer_id, t.epoch, [TopicPartition("tx", p) for p in parts]
            )
            firsts = {p: txn_data(t.producer_id, t.epoch, p, 0) for p in parts}
            for p in parts:
                coord.commit(f"segments/tx/{uuid.uuid4().hex}.seg", [chunk(info.topic_id, p)])
                assert stable(p).last_stable == firsts[p]  # held back in both shards
            pending = coord.end_transaction("app", t.producer_id, t.epoch, commit)
            assert pending is not None and len(pending.partitions) == 2
            assert not coord.complete_transaction("app", t.producer_id, t.epoch)
            writer.write_markers(pending)
            for p in parts:
                view = stable(p)
                assert view.last_stable == coord.offsets("tx", p).high_watermark
                expected = () if commit else ((t.producer_id, firsts[p], firsts[p] + 3),)
                assert view.aborted == expected
        assert coord.list_transactions()[0].state == "CompleteAbort"
        with pytest.raises(InvalidTxnStateError):
            txn_data(t.producer_id, t.epoch, parts[1], 2)  # not added this time
