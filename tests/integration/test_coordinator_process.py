"""The coordinator as its own process: concurrent commits over HTTP (through several
coordinator processes on one database), SIGKILL and restart, failover, health and
metrics, and a flush that crashed before its commit. Everything runs on SQLite and on
PostgreSQL."""

from __future__ import annotations

import multiprocessing
import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from coordinator.client import ChunkCommit, ChunkRef
from coordinator.http.client import HttpCoordinator, http_coordinator
from coordinator.janitors.orphans import find_orphans
from segments.errors import CoordinatorUnavailableError, MalformedRequestError, TopicExistsError
from segments.store import open_store
from tests.conftest import BACKENDS, new_db_url
from tests.coordinator_calls import answer, call, op_path
from tests.procs import Proc, free_port, start_coordinator

pytestmark = pytest.mark.integration


@pytest.fixture
def coord(tmp_path: Path, db_url: str) -> Iterator[tuple[Proc, str, str]]:
    """A coordinator process on a fresh database: (proc, base_url, db_url)."""
    proc, url = start_coordinator(tmp_path, db_url)
    yield proc, url, db_url
    proc.stop()


@pytest.fixture(scope="module", params=BACKENDS)
def shared(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One coordinator process per backend for the light tests of this module; returns its
    URL. Tests on it use their own topic names and look at deltas, not totals."""
    tmp = tmp_path_factory.mktemp("shared")
    proc, url = start_coordinator(tmp, new_db_url(request, request.param, tmp))
    yield url
    proc.stop()


def _all_refs(c: HttpCoordinator, topic: str, partition: int) -> list[ChunkRef]:
    """Every index entry of a partition, by paging through lookup."""
    refs: list[ChunkRef] = []
    offset, hw = 0, c.offsets(topic, partition).high_watermark
    while offset < hw:
        page = c.lookup(topic, partition, offset, max_chunks=500)
        assert page, f"lookup({topic}, {partition}, {offset}) empty below hw {hw}"
        refs.extend(page)
        offset = page[-1].end_offset
    return refs


# -- (1) concurrency --------------------------------------------------------------

PARTITIONS = 50
WRITERS_EACH_KIND = 4
COMMITS_PER_WRITER = 1250  # 8 writers -> 10,000 commits

#: One writer's log: (object_key, [(partition, record_count)], base_offsets), in commit order.
WriterLog = list[tuple[str, list[tuple[int, int]], list[int]]]


def _writer(url: str, topic_id_hex: str, writer: str, n: int, seed: int) -> WriterLog:
    """Commit ``n`` objects of 1-3 chunks on random partitions; module level for spawn."""
    rng = random.Random(seed)
    topic_id = bytes.fromhex(topic_id_hex)
    out: WriterLog = []
    with http_coordinator(url, timeout=30.0) as c:
        for i in range(n):
            parts = rng.sample(range(PARTITIONS), rng.randint(1, 3))
            plan = [(p, rng.randint(1, 4)) for p in parts]
            chunks = [
                ChunkCommit(topic_id, p, j * 100, 100, count, i, i)
                for j, (p, count) in enumerate(plan)
            ]
            key = f"segments/{writer}/{i:05d}.seg"
            out.append((key, plan, c.commit(key, chunks)))
    return out


@pytest.mark.slow
def test_concurrent_commits_over_http_keep_offsets_contiguous(
    coord: tuple[Proc, str, str], tmp_path: Path
) -> None:
    """Race: 4 threads and 4 processes, each with its own HttpCoordinator, commit
    10,000 objects into 50 partitions of one topic at once through THREE coordinator
    processes on one database (writers spread over them). Expected: every partition's
    offsets are contiguous from 0 to its high watermark (no gap, no duplicate), each
    commit's offsets are what the index holds for its object, and each writer's offsets
    grow in its commit order."""
    _, url, db_url = coord
    more = [start_coordinator(tmp_path, db_url) for _ in range(2)]
    urls = [url] + [u for _, u in more]
    with http_coordinator(url) as c:
        topic = c.create_topic("race", PARTITIONS)
    tid = topic.topic_id.hex()
    spawn = multiprocessing.get_context("spawn")
    try:
        with (
            ProcessPoolExecutor(WRITERS_EACH_KIND, mp_context=spawn) as procs,
            ThreadPoolExecutor(WRITERS_EACH_KIND) as threads,
        ):
            futures = [
                procs.submit(_writer, urls[i % 3], tid, f"p{i}", COMMITS_PER_WRITER, i)
                for i in range(WRITERS_EACH_KIND)
            ] + [
                threads.submit(
                    _writer, urls[(i + 1) % 3], tid, f"t{i}", COMMITS_PER_WRITER, 100 + i
                )
                for i in range(WRITERS_EACH_KIND)
            ]
            logs = [f.result(timeout=120) for f in futures]
    finally:
        for proc, _ in more:
            proc.stop()

    assert sum(len(log) for log in logs) == 10_000
    # What the writers were told, per (object_key, partition) -> (base, count).
    told: dict[tuple[str, int], tuple[int, int]] = {}
    for log in logs:
        last_base: dict[int, int] = {}
        for key, plan, bases in log:
            assert len(bases) == len(plan)
            for (p, count), base in zip(plan, bases, strict=True):
                told[(key, p)] = (base, count)
                # Commit order == offset order, per writer and partition.
                assert base > last_base.get(p, -1)
                last_base[p] = base

    with http_coordinator(url) as c:
        seen = 0
        for p in range(PARTITIONS):
            refs = _all_refs(c, "race", p)
            expected = 0
            for ref in refs:
                assert ref.base_offset == expected, f"gap or overlap in partition {p}"
                assert told[(ref.object_key, p)] == (ref.base_offset, ref.record_count)
                expected = ref.end_offset
            assert c.offsets("race", p).high_watermark == expected
            seen += len(refs)
        assert seen == len(told)


# -- (2) restart --------------------------------------------------------------------


def test_sigkill_and_restart_keeps_all_state(tmp_path: Path, db_url: str) -> None:
    """SIGKILL the coordinator mid-life; a new process on the same db file serves
    the same topics, configs, offsets, index and cluster id, and new commits carry
    on from the old high watermark."""
    port = free_port()
    proc, url = start_coordinator(tmp_path, db_url, port=port)
    with http_coordinator(url, timeout=5.0) as c:
        cluster = c.cluster_id()
        a = c.create_topic("alpha", 3, {"retention.ms": "3600000"})
        b = c.create_topic("beta", 1)
        c.alter_configs("beta", {"cleanup.policy": "compact"})
        offsets_a = [
            c.commit(f"segments/x/{i}.seg", [ChunkCommit(a.topic_id, i % 3, 0, 10, 5, i, i)])
            for i in range(9)
        ]
        c.commit("segments/x/b.seg", [ChunkCommit(b.topic_id, 0, 0, 10, 7, 50, 60)])
        broker = c.heartbeat_agent("agent-1", "h", 8082)
        before_topics = c.list_topics()
        before_refs = {p: _all_refs(c, "alpha", p) for p in range(3)}
    assert offsets_a[-1] == [10]  # partition 2 got commits 2, 5, 8 of 5 records each
    proc.kill()
    proc.stop()

    proc2, url2 = start_coordinator(tmp_path, db_url, port=port)
    try:
        with http_coordinator(url2, timeout=5.0) as c:
            assert c.cluster_id() == cluster
            assert c.list_topics() == before_topics
            assert c.get_topic("alpha").configs == {"retention.ms": "3600000"}
            assert c.get_topic("beta").configs == {"cleanup.policy": "compact"}
            assert {p: _all_refs(c, "alpha", p) for p in range(3)} == before_refs
            assert [c.offsets("alpha", p).high_watermark for p in range(3)] == [15, 15, 15]
            assert c.offsets("beta", 0).high_watermark == 7
            hit = c.lookup_timestamp("beta", 0, 55)
            assert hit is not None
            assert hit.object_key == "segments/x/b.seg"
            assert c.heartbeat_agent("agent-1", "h", 8082) == broker
            # A retry of a commit from before the crash is still recognised...
            assert c.commit("segments/x/0.seg", [ChunkCommit(a.topic_id, 0, 0, 10, 5, 0, 0)]) == [0]
            # ...and new commits continue contiguously.
            assert c.commit("segments/y/1.seg", [ChunkCommit(a.topic_id, 0, 0, 10, 2, 0, 0)]) == [
                15
            ]
            assert c.offsets("alpha", 0).high_watermark == 17
            with pytest.raises(TopicExistsError):
                c.create_topic("alpha", 1)
    finally:
        proc2.stop()


# -- (3) unavailable and failover ----------------------------------------------------


def test_dead_url_raises_unavailable() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with http_coordinator(dead, timeout=2.0) as c:
        with pytest.raises(CoordinatorUnavailableError) as info:
            c.list_topics()
        assert info.value.retriable is True
        started = time.monotonic()
        with pytest.raises(CoordinatorUnavailableError):
            c.commit("segments/a/1.seg", [])
        # Commits are retried with backoff before giving up, but not forever.
        assert 0.5 < time.monotonic() - started < 10


def test_fails_over_to_the_next_url(shared: str) -> None:
    url = shared
    dead = f"http://127.0.0.1:{free_port()}"
    with http_coordinator([dead, url], timeout=2.0) as c:
        t = c.create_topic("fo", 1)
        assert c.commit("segments/f/1.seg", [ChunkCommit(t.topic_id, 0, 0, 1, 3, 0, 0)]) == [0]
        assert c.offsets("fo", 0).high_watermark == 3


class _DropFirstCommitReply(httpx.HTTPTransport):
    """Delivers every request; loses the reply to the first commit and every topic creation."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        path = request.url.path
        with self._lock:
            drop = request.method == "POST" and (
                (path == op_path("commit") and self.dropped == 0) or path == op_path("create_topic")
            )
            if drop:
                self.dropped += 1
        if drop:
            response.read()
            response.close()
            raise httpx.ReadTimeout("reply lost", request=request)
        return response


def test_commit_whose_reply_was_lost_is_retried_without_double_assigning(shared: str) -> None:
    """The server applied the commit but the client never heard back: the client
    re-sends it, and idempotency by object key gives the same offsets once. A topic
    creation whose reply was lost is NOT re-sent: it surfaces as unavailable."""
    url = shared
    with http_coordinator(url) as plain:
        t = plain.create_topic("lost", 1)
    transport = _DropFirstCommitReply()
    with httpx.Client(transport=transport) as raw, http_coordinator(url, client=raw) as c:
        chunk = ChunkCommit(t.topic_id, 0, 0, 10, 4, 0, 0)
        assert c.commit("segments/l/1.seg", [chunk]) == [0]
        assert transport.dropped == 1
        assert c.commit("segments/l/2.seg", [chunk]) == [4]
        assert c.offsets("lost", 0).high_watermark == 8
        with pytest.raises(CoordinatorUnavailableError):
            c.create_topic("lost-2", 1)
        assert transport.dropped == 2  # sent once, not retried
        assert c.get_topic("lost-2").partitions == 1  # it was in fact applied


# -- (4) health and metrics ----------------------------------------------------------


def _metric(text: str, name: str, missing: float | None = None) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    if m is None and missing is not None:
        return missing
    assert m, f"{name} not in metrics"
    return float(m.group(1))


def test_health_and_metrics_answer(shared: str) -> None:
    url = shared
    r = httpx.get(f"{url}/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    before = httpx.get(f"{url}/metrics").text
    ok = 'lakelog_coordinator_commits_total{outcome="ok"}'
    n0 = _metric(before, ok, missing=0.0)
    s0 = _metric(before, "lakelog_coordinator_commit_seconds_count")
    c0 = _metric(before, "lakelog_coordinator_committed_chunks_total")
    with http_coordinator(url) as c:
        t = c.create_topic("met", 2)
        for i in range(5):
            c.commit(f"segments/m/{i}.seg", [ChunkCommit(t.topic_id, i % 2, 0, 1, 10, 0, 0)])
        c.commit("segments/m/0.seg", [ChunkCommit(t.topic_id, 0, 0, 1, 10, 0, 0)])  # a retry
    r = httpx.get(f"{url}/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert _metric(r.text, ok) - n0 == 6
    assert _metric(r.text, "lakelog_coordinator_commit_seconds_count") - s0 == 6
    assert _metric(r.text, "lakelog_coordinator_committed_chunks_total") - c0 == 6


# -- invariant 3: a flush that crashed between PUT and commit ---------------------------


def test_crash_between_put_and_commit_leaves_no_record_and_an_orphan(
    tmp_path: Path, db_url: str, s3_url: str, moto_endpoint: str
) -> None:
    """An object PUT whose commit never came (the agent died) is invisible to
    readers, moves no offset, and is reported as an orphan once past the grace
    period, while the committed object next to it is not."""
    proc, url = start_coordinator(tmp_path, db_url, store_url=s3_url, store_endpoint=moto_endpoint)
    store = open_store(s3_url, endpoint_url=moto_endpoint)
    try:
        with http_coordinator(url) as c:
            t = c.create_topic("inv3", 1)
            committed_key = f"segments/a1/{uuid.uuid4().hex}.seg"
            crashed_key = f"segments/b2/{uuid.uuid4().hex}.seg"
            store.put(committed_key, b"committed-segment-bytes")
            assert c.commit(committed_key, [ChunkCommit(t.topic_id, 0, 0, 23, 3, 10, 20)]) == [0]
            before = c.offsets("inv3", 0)
            store.put(crashed_key, b"crashed-segment-bytes")  # PUT done; the commit never is

            assert c.offsets("inv3", 0) == before
            refs = c.lookup("inv3", 0, 0, max_chunks=100)
            assert [r.object_key for r in refs] == [committed_key]
            assert c.lookup("inv3", 0, before.high_watermark) == []
            assert c.committed_object_keys([crashed_key, committed_key]) == {committed_key}

            time.sleep(0.05)  # S3 keeps whole seconds; grace 0 still needs age >= 0
            assert [o.key for o in c.find_orphans(grace_s=0)] == [crashed_key]
            assert [o.key for o in find_orphans(store, c, grace_s=0)] == [crashed_key]
            assert c.find_orphans(grace_s=3600) == []
            assert find_orphans(store, c, grace_s=3600) == []
            r = call(httpx, "find_orphans", {"grace_s": 0}, base=url)
            assert r.status_code == 200, r.text
            assert [o["key"] for o in answer(r)] == [crashed_key]
            assert answer(r)[0]["size"] == len(b"crashed-segment-bytes")
    finally:
        store.close()
        proc.stop()


def test_find_orphans_is_refused_without_a_store(shared: str) -> None:
    r = call(httpx, "find_orphans", {"grace_s": 0}, base=shared)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "MalformedRequestError"
    assert "no object store" in r.json()["message"]
    with http_coordinator(shared) as c, pytest.raises(MalformedRequestError):
        c.find_orphans(grace_s=0)
