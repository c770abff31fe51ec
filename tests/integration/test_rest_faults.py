"""REST under real clients when things go wrong (issue 17, produce side).

Private clusters (moto S3, a coordinator, agents: all processes) with a fault proxy
in front of the store or the coordinator:

- a storm of lagging consumers whose store GETs are slowed must not starve the
  agent's flushes or its heartbeat (they had one thread pool between them);
- an unexpected exception in a flush (here: a coordinator answer the client cannot
  read) must reach the client as non-retriable, so a retrying client stores nothing
  twice; the heartbeat task must outlive such an answer.
"""

from __future__ import annotations

import base64
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.faultproxy import FaultProxy
from tests.integration.conftest import (
    Cluster,
    ClusterFactory,
    create_topic,
    read_partition,
    start_cluster,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

V2 = "application/vnd.kafka.v2+json"
BINARY = "application/vnd.kafka.binary.v2+json"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def broker_ids(cluster: Cluster, agent: int = 0) -> set[int]:
    r = httpx.get(f"{cluster.agents[agent]}/v3/clusters/{cluster.cluster_id}/brokers", timeout=30)
    return {b["broker_id"] for b in r.json()["data"]}


def own_broker_id(cluster: Cluster, agent: int) -> int:
    broker_id: int = httpx.get(f"{cluster.agents[agent]}/health").json()["broker_id"]
    return broker_id


def metric_sum(agent: str, name: str, labels: str = "") -> float:
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*{re.escape(labels)}[^}}]*\}})? (\S+)$")
    total = 0.0
    for line in httpx.get(f"{agent}/metrics").text.splitlines():
        m = pattern.match(line)
        if m:
            total += float(m.group(2))
    return total


# -- a storm of lagging consumers on a slow store --------------------------------------------


def test_slow_consumer_storm_starves_neither_flushes_nor_the_heartbeat(
    cluster_factory: ClusterFactory, moto_endpoint: str, tmp_path: Path
) -> None:
    """Race: 40 consumers lag behind on agent B, each fetch a store GET slowed to
    3 s by the proxy (B caches nothing of history), while a producer writes through
    B and agent A watches B's heartbeat.

    Before, fetch reads, flushes and heartbeats shared asyncio's 6 default threads:
    the GET queue held flushes and the heartbeat for ~20 s, produce requests timed
    out and B dropped out of the broker list. Expected: every produce request is
    acked within the client's timeout and without error, B is listed as a broker
    throughout, and B's ``read`` pool shows the saturation (queued tasks).
    """
    proxy = FaultProxy.start(tmp_path, moto_endpoint)
    try:
        cluster = cluster_factory(
            agents=2,
            agent_store_endpoint=proxy.url,
            agent_env={
                "LAKELOG_HEARTBEAT_INTERVAL_S": "1",
                "LAKELOG_READ_CACHE_HISTORY_BYTES": "0",
                "LAKELOG_READ_AHEAD_CHUNKS": "0",
                "LAKELOG_LINGER_MS": "5",
            },
        )
        _storm(cluster, proxy)
    finally:
        proxy.stop()


def _storm(cluster: Cluster, proxy: FaultProxy) -> None:
    agent_a, agent_b = cluster.agents
    topic, partitions = "history", 8
    create_topic(cluster, topic, partitions)
    # History written through A: B has none of it cached, so its readers GET it.
    for n in range(40):
        body = {
            "records": [
                {"value": b64(b"h%d-%d" % (n, i)), "partition": i % partitions}
                for i in range(partitions * 4)
            ]
        }
        r = httpx.post(
            f"{agent_a}/topics/{topic}",
            content=orjson.dumps(body),
            headers={"Content-Type": BINARY},
        )
        assert r.status_code == 200, r.text
    b_id = own_broker_id(cluster, 1)
    assert b_id in broker_ids(cluster)

    stop = threading.Event()
    fetched = [0]
    lock = threading.Lock()

    def lagging_consumer(i: int) -> None:
        group = f"lag-{i}"
        with httpx.Client(timeout=60, headers={"Content-Type": V2}) as client:
            r = client.post(
                f"{agent_b}/consumers/{group}", json={"name": "c", "auto.offset.reset": "earliest"}
            )
            assert r.status_code == 200, r.text
            base = r.json()["base_uri"]
            part = [{"topic": topic, "partition": i % partitions}]
            assert client.post(f"{base}/assignments", json={"partitions": part}).status_code == 204
            while not stop.is_set():
                r = client.get(f"{base}/records?timeout=0&max_bytes=1", headers={"Accept": BINARY})
                assert r.status_code == 200, r.text
                with lock:
                    fetched[0] += len(r.json())

    proxy.set_rules({"action": "delay", "method": "GET", "path": "/lakelog/", "delay_s": 3.0})
    consumers = [threading.Thread(target=lagging_consumer, args=(i,)) for i in range(40)]
    for t in consumers:
        t.start()
    produced: list[dict[str, Any]] = []
    timeouts = 0
    missing_heartbeat: list[float] = []
    saturated = 0.0
    try:
        with httpx.Client(timeout=8) as producer:  # a client's timeout: the bound asserted
            deadline = time.monotonic() + 22
            while time.monotonic() < deadline:
                body = {"records": [{"value": b64(b"storm-%d" % len(produced))}]}
                try:
                    r = producer.post(
                        f"{agent_b}/topics/{topic}",
                        content=orjson.dumps(body),
                        headers={"Content-Type": BINARY},
                    )
                except httpx.TimeoutException:
                    timeouts += 1
                    continue
                assert r.status_code == 200, r.text
                produced.extend(r.json()["offsets"])
                if b_id not in broker_ids(cluster):
                    missing_heartbeat.append(time.monotonic())
                saturated = max(
                    saturated, metric_sum(agent_b, "lakelog_executor_queued_tasks", 'pool="read"')
                )
                time.sleep(0.3)
    finally:
        stop.set()
        delayed = proxy.stats()["rules"][0]["fired"]
        proxy.clear()
        for t in consumers:
            t.join(60)
    assert fetched[0] > 0
    assert delayed >= 20  # the storm happened
    assert timeouts == 0, f"{timeouts} produce requests timed out (flushes starved)"
    assert len(produced) >= 5
    assert all(o["error_code"] is None for o in produced), produced
    assert not missing_heartbeat, f"agent B was declared dead {len(missing_heartbeat)} times"
    assert saturated > 0  # reads queued on their own pool, not on the flushes'


# -- a coordinator answer the agent cannot read ---------------------------------------------


@pytest.fixture(scope="module")
def proxied(
    moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, FaultProxy]]:
    """Two agents reaching the coordinator through a fault proxy (one, shared)."""
    tmp = tmp_path_factory.mktemp("proxied")
    proxies: list[FaultProxy] = []

    def through_proxy(url: str) -> str:
        proxies.append(FaultProxy.start(tmp, url))
        return proxies[0].url

    cluster = start_cluster(
        tmp,
        moto_endpoint,
        agents=2,
        agent_coordinator=through_proxy,
        agent_env={
            "LAKELOG_HEARTBEAT_INTERVAL_S": "1",
            # No peer is trusted to forward: X-Forwarded-* must be ignored.
            "LAKELOG_FORWARDED_ALLOW_IPS": "192.0.2.1",
        },
    )
    try:
        yield cluster, proxies[0]
    finally:
        cluster.stop()
        for p in proxies:
            p.stop()


#: A 200 whose body is not the coordinator's MessagePack (a misbehaving proxy or LB): the
#: coordinator client fails on it with a msgspec ValidationError or DecodeError, an
#: exception that is not ours.
GARBAGE_200 = {"action": "status", "status": 200, "code": "NotJson"}


def produce_with_retries(url: str, body: bytes, content_type: str) -> list[httpx.Response]:
    """A client that retries while (and only while) the answer says retriable."""
    answers = []
    for _ in range(4):
        r = httpx.post(url, content=body, headers={"Content-Type": content_type}, timeout=30)
        answers.append(r)
        codes = (
            [o["error_code"] for o in r.json()["offsets"]]
            if content_type == BINARY
            else [orjson.loads(line)["error_code"] for line in r.content.splitlines() if line]
        )
        if 50003 not in codes:
            break
    return answers


def test_a_poisoned_flush_is_not_retriable_and_stores_nothing_twice(
    proxied: tuple[Cluster, FaultProxy],
) -> None:
    """The commit is applied but its answer is unreadable (a msgspec ValidationError in
    the agent, not a LakelogError).

    Before, the flush answered 50003 (retriable): the client retried and the records
    were stored twice. Expected: v2 answers 50002 and v3 a 500 report (not retriable)
    for those records, the agent logs the traceback, the client does not retry, and
    each record is stored once.
    """
    cluster, proxy = proxied
    topic = f"poison-{uuid.uuid4().hex[:8]}"
    create_topic(cluster, topic, 1)
    agent = cluster.agents[0]

    proxy.set_rules(
        {**GARBAGE_200, "method": "POST", "path": "^/v2/commit$", "when": "after", "times": 1}
    )
    v2 = orjson.dumps({"records": [{"value": b64(b"v2-once")}]})
    answers = produce_with_retries(f"{agent}/topics/{topic}", v2, BINARY)
    assert len(answers) == 1
    entry = answers[0].json()["offsets"][0]
    assert (entry["error_code"], entry["offset"]) == (50002, None), entry

    proxy.set_rules(
        {**GARBAGE_200, "method": "POST", "path": "^/v2/commit$", "when": "after", "times": 1}
    )
    v3 = orjson.dumps({"value": {"type": "STRING", "data": "v3-once"}})
    url = f"{agent}/v3/clusters/{cluster.cluster_id}/topics/{topic}/records"
    answers = produce_with_retries(url, v3, "application/json")
    assert len(answers) == 1 and answers[0].status_code == 200
    report = orjson.loads(answers[0].content)
    assert report["error_code"] == 500, report
    proxy.clear()

    values = [r.value for r in read_partition(cluster, topic, 0)]
    assert values == [b"v2-once", b"v3-once"]  # committed before the garbage answer, once
    logs = cluster.logs()
    assert "flush of 1 records failed unexpectedly" in logs
    assert "Traceback" in logs and "msgspec.ValidationError" in logs


def test_the_heartbeat_outlives_an_answer_it_cannot_read(
    proxied: tuple[Cluster, FaultProxy],
) -> None:
    """Two heartbeat answers are unreadable (a msgspec DecodeError in a heartbeat task).

    Before, the task died silently on the first and the agents dropped out of the
    broker list ~10 s later. Expected: the failures are counted and logged, and both
    agents stay listed for well past the liveness window.
    """
    cluster, proxy = proxied
    ids = {own_broker_id(cluster, i) for i in range(2)}
    rule = {**GARBAGE_200, "method": "POST", "path": "^/v2/heartbeat_agent$", "times": 2}
    proxy.set_rules(rule)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proxy.stats()["rules"][0]["fired"] < 2:
        time.sleep(0.2)
    proxy.clear()
    # Liveness is judged on heartbeats younger than 10 s: watch for longer than that.
    watch_until = time.monotonic() + 13
    while time.monotonic() < watch_until:
        assert broker_ids(cluster, 1) == ids
        time.sleep(0.5)
    failures = sum(metric_sum(a, "lakelog_heartbeat_failures_total") for a in cluster.agents)
    assert failures >= 2
    assert "heartbeat failed unexpectedly" in cluster.logs()


def test_forwarded_headers_of_an_untrusted_peer_are_ignored(
    proxied: tuple[Cluster, FaultProxy],
) -> None:
    """These agents trust no peer (192.0.2.1 only): X-Forwarded-* change nothing."""
    cluster, _ = proxied
    agent = cluster.agents[0]
    r = httpx.get(
        f"{agent}/v3/clusters",
        headers={"X-Forwarded-Proto": "https", "X-Forwarded-Host": "evil.example"},
    )
    assert r.json()["metadata"]["self"] == f"{agent}/v3/clusters"
