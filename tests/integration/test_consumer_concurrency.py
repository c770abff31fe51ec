"""REST consumers under real clients (issue 17): parallel fetches on one instance, seeks
during long-polls, clients that hang up, slow processing, topics created after the
subscription, lag views of thousands of partitions, the fetch memory budget.

A coordinator process and two agent processes over moto S3, once per metadata backend
(SQLite, PostgreSQL). The agents heartbeat consumer instances every 300 ms (instead of
3 s) so that sessions of 1.5 s keep kafka-rest's semantics at test speed; each test
names the race it exercises and the outcome it expects.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import BACKENDS, new_db_url
from tests.coordinator_calls import op_path
from tests.integration.conftest import Cluster, ClusterFactory, start_cluster
from tests.integration.test_consumer_api import (
    BINARY,
    Consumer,
    create_topic,
    metric,
    produce,
    request,
    unb64,
)
from tests.threads import run_threads

pytestmark = pytest.mark.integration

AGENT_ENV = {
    "LAKELOG_CONSUMER_HEARTBEAT_INTERVAL_MS": "300",
    "LAKELOG_CONSUMER_FETCH_LEASE_MS": "3000",
    "LAKELOG_CONSUMER_FETCH_MEMORY_BYTES": str(4 << 20),
}
SESSION_MS = 1500


@pytest.fixture(scope="module", params=BACKENDS)
def cluster(
    request: pytest.FixtureRequest,
    moto_endpoint: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp(f"concurrency-{request.param}")
    db_url = new_db_url(request, request.param, tmp)
    c = start_cluster(tmp, moto_endpoint, db_url=db_url, agent_env=AGENT_ENV)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def wait_until(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def manual_consumer(cluster: Cluster, group: str, topic: str, reset: str) -> Consumer:
    """An instance with auto-commit off, assigned partition 0 of ``topic``."""
    c = Consumer.create(
        cluster.agents, group, **{"auto.offset.reset": reset, "auto.commit.enable": "false"}
    )
    c.assign(topic, 0)
    return c


def offsets_of(records: list[dict[str, Any]]) -> list[int]:
    return [r["offset"] for r in records]


# -- one fetch at a time per instance -------------------------------------------------------


@pytest.mark.parametrize("agents", [1, 2], ids=["one-agent", "two-agents"])
def test_parallel_fetches_on_one_instance_never_return_a_record_twice(
    cluster: Cluster, group: str, unique_topic: Callable[[str], str], agents: int
) -> None:
    """Race: 4 clients fetch one instance at once, through one agent or alternating
    between both, 3 records at a time. Expected: every record is delivered exactly once
    (no two answers overlap), each answer in offset order, none skipped."""
    topic = create_topic(cluster, unique_topic("par"), 1)
    produce(cluster.agents[0], topic, [f"{i:03d}".encode() for i in range(120)], partition=0)
    c = manual_consumer(cluster, group, topic, "earliest")
    answers: list[list[int]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if sum(len(a) for a in answers) >= 120:
                    return
            r = c.fetch_raw(300, max_bytes=9, agent=i % agents)
            assert r.status_code == 200, r.text
            got = offsets_of(r.json())
            if got:
                with lock:
                    answers.append(got)

    run_threads(client, range(4), timeout=90)
    every = Counter(o for a in answers for o in a)
    assert [o for o, n in every.items() if n > 1] == []  # nothing twice
    assert sorted(every) == list(range(120))  # nothing skipped
    for a in answers:
        assert a == list(range(a[0], a[0] + len(a)))


@pytest.mark.parametrize("seek_agent", [0, 1], ids=["same-agent", "other-agent"])
def test_seek_during_a_long_poll_is_not_overwritten(
    cluster: Cluster, group: str, unique_topic: Callable[[str], str], seek_agent: int
) -> None:
    """Race: a fetch long-polls at the end of a partition (agent 0); the client seeks to
    the beginning (through the same agent or the other), then a record arrives.
    Expected: the seek wins: the records come from offset 0 on, in order, each once;
    the fetch in flight does not move the position past the seek."""
    topic = create_topic(cluster, unique_topic("seek"), 1)
    produce(cluster.agents[0], topic, [f"old-{i}".encode() for i in range(5)], partition=0)
    c = manual_consumer(cluster, group, topic, "latest")
    assert c.fetch(0, agent=0) == []
    agent0 = cluster.agents[0]
    waiting = metric(agent0, "lakelog_fetches_waiting")
    polled: list[Any] = []
    poll = threading.Thread(target=lambda: polled.append(c.fetch(15_000, agent=0)))
    poll.start()
    wait_until(
        "the fetch to long-poll", lambda: metric(agent0, "lakelog_fetches_waiting") > waiting
    )
    r = c.call(
        "POST",
        "/positions/beginning",
        {"partitions": [{"topic": topic, "partition": 0}]},
        agent=seek_agent,
    )
    assert r.status_code == 204, r.text
    produce(cluster.agents[1], topic, [b"new"], partition=0)
    poll.join(30)
    got = list(polled[0])
    deadline = time.monotonic() + 20
    while len(got) < 6 and time.monotonic() < deadline:
        got += c.fetch(1000, agent=1)
    assert offsets_of(got) == list(range(6))
    assert unb64(got[0]["value"]) == b"old-0"


# -- delivery ------------------------------------------------------------------------------


def test_a_client_that_hangs_up_mid_poll_loses_nothing(
    cluster: Cluster, group: str, unique_topic: Callable[[str], str]
) -> None:
    """A client gives up on a 10 s long-poll after 1 s; a record arrives after that.
    Expected: the agent sees the disconnect, answers nobody and moves nothing; the next
    fetch (through the other agent: the instance is not left locked) gets the record."""
    topic = create_topic(cluster, unique_topic("hangup"), 1)
    c = manual_consumer(cluster, group, topic, "latest")
    assert c.fetch(0, agent=0) == []
    agent0 = cluster.agents[0]
    finished = metric(agent0, "lakelog_fetch_seconds_count")
    with pytest.raises(httpx.ReadTimeout):
        request("GET", c.url("/records?timeout=10000", 0), accept=BINARY, timeout=1.0)
    produce(cluster.agents[1], topic, [b"kept"], partition=0)
    wait_until(
        "the abandoned fetch to end",
        lambda: metric(agent0, "lakelog_fetch_seconds_count") > finished,
    )
    records = c.fetch(5000, agent=1)
    assert [unb64(r["value"]) for r in records] == [b"kept"]
    assert metric(agent0, "lakelog_fetch_undelivered_total") >= 1


def test_member_processing_longer_than_its_session_keeps_its_partitions_and_commits(
    cluster: Cluster, group: str, unique_topic: Callable[[str], str]
) -> None:
    """The issue's scenario at test speed: "slow" fetches a batch, then processes it for
    3x its session timeout (4.5 s against 1.5 s) without a call, while "busy" keeps
    polling. Expected (kafka-rest: a background heartbeat, max.poll.interval.ms 300 s):
    no rebalance: busy never receives slow's records; slow's "commit what was
    fetched" commits its batch."""
    topic = create_topic(cluster, unique_topic("slow"), 2)
    for p in range(2):
        produce(cluster.agents[p], topic, [f"{p}-{i}".encode() for i in range(20)], partition=p)
    config = {
        "auto.offset.reset": "earliest",
        "auto.commit.enable": "false",
        "session.timeout.ms": SESSION_MS,
    }
    slow = Consumer.create(cluster.agents, group, name="a-slow", **config)
    busy = Consumer.create(cluster.agents, group, name="b-busy", **config)
    slow.subscribe(topic)
    busy.subscribe(topic)
    mine = {p["partition"] for p in slow.call("GET", "/assignments").json()["partitions"]}
    assert len(mine) == 1
    batch = slow.fetch(2000)
    assert {r["partition"] for r in batch} == mine and len(batch) == 20
    seen_by_busy: list[dict[str, Any]] = []
    processing_until = time.monotonic() + 3 * SESSION_MS / 1000
    while time.monotonic() < processing_until:
        seen_by_busy += busy.fetch(200)
    assert {r["partition"] for r in seen_by_busy} <= {1 - next(iter(mine))}
    slow.commit()  # everything fetched so far
    assert slow.committed(topic, *mine) == dict.fromkeys(mine, 20)
    assert {p["partition"] for p in slow.call("GET", "/assignments").json()["partitions"]} == mine


# -- subscriptions ----------------------------------------------------------------------------


def test_subscribe_then_create(
    cluster: Cluster, group: str, unique_topic: Callable[[str], str]
) -> None:
    """kafka-rest subscribes to topics (and patterns) that do not exist yet; once the
    topic is created, the next fetches get its records."""
    name = unique_topic("later")
    by_name = Consumer.create(cluster.agents, group, **{"auto.offset.reset": "earliest"})
    by_name.subscribe(name)
    by_pattern = Consumer.create(cluster.agents, f"{group}-p", **{"auto.offset.reset": "earliest"})
    r = by_pattern.call("POST", "/subscription", {"topic_pattern": name.replace("-", "[-]")})
    assert r.status_code == 204, r.text
    assert by_name.fetch(0) == [] and by_pattern.fetch(0) == []
    create_topic(cluster, name, 2)
    produce(cluster.agents[1], name, [b"x", b"y"], partition=1)
    for c in (by_name, by_pattern):
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            got += c.fetch(1000)
        assert [unb64(r["value"]) for r in got] == [b"x", b"y"]
    assert by_pattern.call("GET", "/subscription").json() == {"topics": [name]}


# -- lag views -----------------------------------------------------------------------------


def coordinator_requests(cluster: Cluster) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in httpx.get(f"{cluster.coordinator_url}/metrics").text.splitlines():
        if line.startswith("lakelog_coordinator_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            route = labels.split('route="', 1)[1].split('"', 1)[0]
            counts[route] += int(float(value))
    return counts


def test_lag_of_thousands_of_partitions_costs_a_few_coordinator_calls(
    cluster: Cluster, group: str, unique_topic: Callable[[str], str]
) -> None:
    """3,000 partitions with committed offsets: the lags list and the lag summary each
    read every high watermark in ONE coordinator call (not one per partition)."""
    n = 3000
    topic = create_topic(cluster, unique_topic("lag"), n)
    produce(cluster.agents[0], topic, [b"a"] * 5, partition=n - 1)
    c = Consumer.create(cluster.agents, group, **{"auto.commit.enable": "false"})
    c.assign(topic, 0)  # a manual member may commit any partition, as Kafka's simple consumers
    c.commit([{"topic": topic, "partition": p, "offset": 0} for p in range(n)])
    base = f"{cluster.agents[1]}/v3/clusters/{cluster.cluster_id}/consumer-groups/{group}"
    before = coordinator_requests(cluster)
    lags = httpx.get(f"{base}/lags", timeout=60).json()["data"]
    summary = httpx.get(f"{base}/lag-summary", timeout=60).json()
    calls = coordinator_requests(cluster) - before
    assert len(lags) == n
    assert (summary["total_lag"], summary["max_lag"]) == (4, 4)
    assert summary["max_lag_partition_id"] == n - 1
    assert calls[op_path("offsets")] == 0
    assert 2 <= calls[op_path("offsets_many")] <= 4  # one per view (and the fetch poller)
    assert calls[op_path("describe_group")] == 2


# -- memory bounds -------------------------------------------------------------------------


def test_fetch_budget_caps_what_one_fetch_holds(
    cluster: Cluster, group: str, unique_topic: Callable[[str], str]
) -> None:
    """6 MiB waiting, a fetch with the default max_bytes (64 MiB) on an agent whose fetch
    budget is 4 MiB: the answer stops at the budget (one record may pass it); the next
    fetches bring the rest, nothing skipped (these answers are rendered off the loop)."""
    topic = create_topic(cluster, unique_topic("budget"), 1)
    value = b"v" * (100 << 10)
    for _ in range(3):
        produce(cluster.agents[0], topic, [value] * 20, partition=0)
    c = manual_consumer(cluster, group, topic, "earliest")
    first = c.fetch(5000, agent=0)
    assert 0 < len(first) * len(value) <= (4 << 20) + len(value)
    got = list(first)
    deadline = time.monotonic() + 30
    while len(got) < 60 and time.monotonic() < deadline:
        got += c.fetch(2000, agent=0)
    assert offsets_of(got) == list(range(60))
    assert all(unb64(r["value"]) == value for r in got)


# -- an agent that dies ------------------------------------------------------------------------


def test_instances_of_a_dead_agent_leave_their_group_after_the_session_timeout(
    cluster_factory: ClusterFactory, unique_topic: Callable[[str], str]
) -> None:
    """Session expiry still works for instances nobody heartbeats any more: "gone" is
    served only by agent 0, which is killed; "alive" (agent 1) then owns both partitions."""
    cluster = cluster_factory(agents=2, agent_env=AGENT_ENV)
    topic = create_topic(cluster, unique_topic("dead"), 2)
    config = {"session.timeout.ms": SESSION_MS}
    gone = Consumer([cluster.agents[0]], "g-dead", "gone")
    alive = Consumer([cluster.agents[1]], "g-dead", "alive")
    for c in (gone, alive):
        r = request("POST", f"{c.agents[0]}/consumers/g-dead", {"name": c.name, **config})
        assert r.status_code == 200, r.text
        c.subscribe(topic)
    assert len(alive.call("GET", "/assignments").json()["partitions"]) == 1
    time.sleep(3 * SESSION_MS / 1000)  # heartbeats keep "gone" in while its agent lives
    assert len(alive.call("GET", "/assignments").json()["partitions"]) == 1
    cluster.agent_procs[0].kill()
    wait_until(
        "the dead agent's instance to leave the assignment",
        lambda: len(alive.call("GET", "/assignments").json()["partitions"]) == 2,
    )
