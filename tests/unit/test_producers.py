"""Idempotent producers: the sequence rules, and their check inside the commit transaction
(SQLite and PostgreSQL, in-process and over the coordinator's HTTP API)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from starlette.testclient import TestClient

from coordinator.client import ChunkCommit
from coordinator.http.client import http_coordinator
from coordinator.http.server import create_app
from coordinator.local import LocalCoordinator
from coordinator.log.producers import (
    ProducerBatch,
    ProducerPartitionState,
    RequestKey,
    StoredKey,
    Verdict,
    judge,
    judge_key,
    remember,
)
from segments.errors import ProducerConflictError, ProducerFencedError


def test_judge_follows_kafkas_rules() -> None:
    b = ProducerBatch
    assert judge(None, b(1, 0, 0, 5))[0] is Verdict.APPEND
    # No state for the producer (a topic created again): any sequence, as Kafka.
    assert judge(None, b(1, 0, 3, 5))[0] is Verdict.APPEND
    state = remember(None, b(1, 0, 0, 5), 100)
    assert judge(state, b(1, 0, 5, 2))[0] is Verdict.APPEND
    assert judge(state, b(1, 0, 0, 5)) == (Verdict.DUPLICATE, 100)
    assert judge(state, b(1, 0, 6, 1))[0] is Verdict.OUT_OF_ORDER
    assert judge(state, b(1, 1, 0, 1))[0] is Verdict.APPEND  # a new epoch starts at 0
    assert judge(state, b(1, 1, 4, 1))[0] is Verdict.OUT_OF_ORDER
    for i in range(1, 7):
        state = remember(state, b(1, 0, 5 * i, 5), 100 + 5 * i)
    assert len(state.batches) == 5  # Kafka keeps the last five
    assert judge(state, b(1, 0, 5, 5))[0] is Verdict.OUT_OF_ORDER  # forgotten
    assert judge(state, b(1, 0, 15, 5)) == (Verdict.DUPLICATE, 115)
    fenced = ProducerPartitionState(3, [(0, 0, 0)])
    assert judge(fenced, b(1, 2, 1, 1))[0] is Verdict.FENCED
    wrap = remember(None, b(1, 0, 0, 1), 0)
    wrap.batches[-1] = (2**31 - 2, 2**31 - 1, 7)
    assert judge(wrap, b(1, 0, 0, 1))[0] is Verdict.APPEND  # sequences wrap at 2**31


@pytest.fixture(params=["local", "http"])
def coordinator(request: pytest.FixtureRequest, db_url: str) -> Iterator[object]:
    local = LocalCoordinator(db_url)
    if request.param == "local":
        yield local
    else:
        with TestClient(create_app(local)) as client:
            yield http_coordinator("http://testserver", client=client)
    local.close()


def _chunk(topic_id: bytes, count: int, *batches: ProducerBatch) -> ChunkCommit:
    return ChunkCommit(topic_id, 0, 0, 100, count, 1, 2, batches)


def test_a_retried_batch_is_committed_once(coordinator: LocalCoordinator) -> None:
    """Race: the same batch reaches two agents, whose flushes commit one after the other.
    The first commit stores it; the second is refused whole (nothing of it stored)."""
    topic = coordinator.create_topic("t", 1)
    pid, epoch = coordinator.init_producer_id()
    assert epoch == 0
    batch = ProducerBatch(pid, 0, 0, 3, relative_offset=2)
    assert coordinator.commit("k1", [_chunk(topic.topic_id, 5, batch)]) == [0]
    state = coordinator.producer_state(pid, [(topic.topic_id, 0)])
    assert state[(topic.topic_id, 0)].batches == [(0, 2, 2)]  # base 0 + relative 2
    with pytest.raises(ProducerConflictError):
        coordinator.commit("k2", [_chunk(topic.topic_id, 3, batch)])
    assert coordinator.offsets("t", 0).high_watermark == 5
    with pytest.raises(ProducerConflictError):  # a gap
        coordinator.commit("k3", [_chunk(topic.topic_id, 1, ProducerBatch(pid, 0, 9, 1))])
    nxt = ProducerBatch(pid, 0, 3, 1)
    assert coordinator.commit("k4", [_chunk(topic.topic_id, 1, nxt)]) == [5]
    assert coordinator.commit("k4", [_chunk(topic.topic_id, 1, nxt)]) == [5]  # same key


def test_epochs_bump_and_fence(coordinator: LocalCoordinator) -> None:
    pid, _ = coordinator.init_producer_id()
    assert coordinator.init_producer_id(pid, 0) == (pid, 1)
    with pytest.raises(ProducerFencedError):
        coordinator.init_producer_id(pid, 0)
    other, _ = coordinator.init_producer_id()
    assert other != pid


def test_concurrent_commits_of_one_sequence_store_it_once(db_url: str) -> None:
    """Race: eight threads commit the same producer batch under eight object keys at
    once; exactly one wins, the others get ProducerConflictError, offsets stay contiguous."""
    with LocalCoordinator(db_url) as c:
        topic = c.create_topic("race", 1)
        pid, _ = c.init_producer_id()
        batch = ProducerBatch(pid, 0, 0, 4)
        outcomes = _race(c, lambda: [_chunk(topic.topic_id, 4, batch)])
        assert sorted(outcomes) == ["conflict"] * 7 + ["ok"]
        assert c.offsets("race", 0).high_watermark == 4


def _race(c: LocalCoordinator, chunks: Callable[[], list[ChunkCommit]]) -> list[str]:
    """Eight threads commit ``chunks()`` under eight object keys at once: each outcome."""
    outcomes: list[str] = []

    def commit(i: int) -> None:
        try:
            c.commit(f"obj-{i}", chunks())
            outcomes.append("ok")
        except ProducerConflictError:
            outcomes.append("conflict")

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


# -- REST idempotency keys: the same commit-time check ---------------------------------


def _keyed(topic_id: bytes, partition: int, count: int, *keys: RequestKey) -> ChunkCommit:
    return ChunkCommit(topic_id, partition, 0, 100, count, 1, 2, (), keys)


def test_judge_key() -> None:
    stored = StoredKey("d1", 5, ((0, 10, 2),))
    assert judge_key(None, "d1") is Verdict.APPEND
    assert judge_key(stored, "d1") is Verdict.DUPLICATE
    assert judge_key(stored, "d2") is Verdict.MISMATCH


def test_a_request_key_is_stored_with_its_offsets_by_the_commit(
    coordinator: LocalCoordinator,
) -> None:
    """A key spanning two chunks (partitions) is stored with each part's first offset;
    a second commit carrying the live key is refused whole (nothing stored), and an
    expired key is free again."""
    t = int(time.time() * 1000)  # expired keys are purged by real time
    topic = coordinator.create_topic("keys", 2)
    tid = topic.topic_id
    coordinator.commit("pre", [_keyed(tid, 1, 7)])  # partition 1 starts at 7
    key = RequestKey("order-1", "digest-a", 3, 2, t, t + 5000)
    bases = coordinator.commit(
        "o1",
        [
            _keyed(tid, 0, 5, RequestKey("order-1", "digest-a", 0, 5, t, t + 5000)),
            _keyed(tid, 1, 4, key),
        ],
    )
    assert bases == [0, 7]
    stored = coordinator.request_key(tid, "order-1", t + 4000)
    assert stored == StoredKey("digest-a", t, ((0, 0, 5), (1, 10, 2)))
    assert coordinator.request_key(tid, "order-1", t + 5001) is None  # expired
    assert coordinator.request_key(tid, "other", t + 4000) is None
    with pytest.raises(ProducerConflictError):
        coordinator.commit(
            "o2", [_keyed(tid, 0, 1, RequestKey("order-1", "x", 0, 1, t + 2000, t + 9000))]
        )
    assert coordinator.offsets("keys", 0).high_watermark == 5  # nothing of o2 stored
    # The same object key again (a commit retried after a lost answer): its first offsets.
    assert coordinator.commit(
        "o1",
        [
            _keyed(tid, 0, 5, RequestKey("order-1", "digest-a", 0, 5, t, t + 5000)),
            _keyed(tid, 1, 4, key),
        ],
    ) == [0, 7]
    # Expired: the key is taken by the next request that uses it.
    renewed = RequestKey("order-1", "digest-b", 0, 1, t + 6000, t + 9000)
    assert coordinator.commit("o3", [_keyed(tid, 0, 1, renewed)]) == [5]
    assert coordinator.request_key(tid, "order-1", t + 6000) == StoredKey(
        "digest-b", t + 6000, ((0, 5, 1),)
    )


def test_a_request_key_keeps_the_partition_count_its_records_were_placed_with(
    coordinator: LocalCoordinator,
) -> None:
    """The count the agent placed a keyed request with goes through the commit (and the
    coordinator's HTTP API) to the stored key, so a retry after partitions were added
    can be placed the same way (``service.produce.request_keys.placed_on``)."""
    t = int(time.time() * 1000)
    tid = coordinator.create_topic("placed", 3).topic_id
    key = RequestKey("order-1", "digest-a", 0, 2, t, t + 5000, 3)
    coordinator.commit("p1", [_keyed(tid, 2, 2, key)])
    assert coordinator.request_key(tid, "order-1", t) == StoredKey("digest-a", t, ((2, 0, 2),), 3)


def test_a_stored_key_reads_the_rows_of_older_coordinators() -> None:
    """Keys stored before the partition count was kept (a bare list of parts) read with
    count 0 (not known: a retry is placed over the topic's partitions, as before)."""
    new = StoredKey("d", 1, ((0, 5, 2), (3, 0, 1)), 4)
    assert StoredKey.from_row("d", 1, new.to_json()) == new
    assert StoredKey.from_row("d", 1, "[[0, 5, 2]]") == StoredKey("d", 1, ((0, 5, 2),), 0)


def test_concurrent_commits_of_one_request_key_store_it_once(db_url: str) -> None:
    """Race: eight threads commit chunks carrying the same idempotency key under eight
    object keys at once (the same request through eight agents); exactly one wins, the
    others get ProducerConflictError and store nothing."""
    with LocalCoordinator(db_url) as c:
        topic = c.create_topic("keyrace", 1)
        key = RequestKey("k", "d", 0, 3, 1, 10**13)
        outcomes = _race(c, lambda: [_keyed(topic.topic_id, 0, 3, key)])
        assert sorted(outcomes) == ["conflict"] * 7 + ["ok"]
        assert c.offsets("keyrace", 0).high_watermark == 3
        assert c.request_key(topic.topic_id, "k", 2) == StoredKey("d", 1, ((0, 0, 3),))
