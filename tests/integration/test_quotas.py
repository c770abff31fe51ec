"""Client quotas over real agents (issue 16): a principal over its rate is slowed, another
is not, nothing is lost."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.conftest import ClusterFactory, create_topic, read_partition

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BINARY = "application/vnd.kafka.binary.v2+json"
RATE = 100_000  # produce bytes/s per principal, cluster-wide: 50,000 per agent of two
WINDOW_S = 5.0


def _client(url: str, topic: str, who: str, size: int, pause: float, out: dict[str, Any]) -> None:
    """Produce ``size``-byte records (one per request) for WINDOW_S; count what happened."""
    value = base64.b64encode(b"x" * size).decode()
    stop = time.monotonic() + WINDOW_S
    n = 0
    with httpx.Client(timeout=30) as http:
        while time.monotonic() < stop:
            body = orjson.dumps(
                {
                    "records": [
                        {"key": base64.b64encode(f"{who}-{n}".encode()).decode(), "value": value}
                    ]
                }
            )
            r = http.post(
                f"{url}/topics/{topic}",
                content=body,
                headers={"Content-Type": BINARY, "X-Client-Id": who},
            )
            if r.status_code == 429:
                out["refused"] += 1
                out["retry_after"].add(r.headers["retry-after"])
                assert r.json()["error_code"] == 429
            else:
                assert r.status_code == 200, r.text
                assert r.json()["offsets"][0]["error_code"] is None
                out["acked"].append(f"{who}-{n}")
                out["bytes"] += len(body)
            n += 1
            time.sleep(pause)


def test_a_principal_over_its_rate_is_slowed_and_another_is_not(
    cluster_factory: ClusterFactory, unique_topic: Any
) -> None:
    """Two principals on one agent of two: "greedy" sends 20 KiB records as fast as it can,
    "polite" 2 KiB every 0.2 s (10 KB/s). Greedy gets 429 + Retry-After and is admitted
    within the stated tolerance (this agent's share, rate/2, x the window + one second
    of burst + one request); polite is never refused; every acked record is stored,
    no refused one is."""
    cluster = cluster_factory(agents=2, agent_env={"LAKELOG_QUOTA_PRODUCE_BYTES_PER_S": str(RATE)})
    topic = unique_topic("quota")
    create_topic(cluster, topic, 1)
    a = cluster.agents[0]
    # Let the agent count the live agents (its share is the rate / 2).
    httpx.post(f"{a}/topics/{topic}", content=b"{}", headers={"Content-Type": BINARY})
    time.sleep(1.0)
    results: dict[str, dict[str, Any]] = {
        w: {"refused": 0, "acked": [], "bytes": 0, "retry_after": set()}
        for w in ("greedy", "polite")
    }
    threads = [
        threading.Thread(target=_client, args=(a, topic, "greedy", 20_000, 0.0, results["greedy"])),
        threading.Thread(target=_client, args=(a, topic, "polite", 2_000, 0.2, results["polite"])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    greedy, polite = results["greedy"], results["polite"]
    share = RATE / 2
    assert greedy["refused"] > 0
    assert greedy["retry_after"] <= {"1", "2"}
    assert greedy["bytes"] <= share * WINDOW_S + share + 30_000  # the stated tolerance
    assert greedy["bytes"] >= share * WINDOW_S * 0.5  # slowed, not stopped
    assert polite["refused"] == 0
    stored = sorted((r.key or b"").decode() for r in read_partition(cluster, topic, 0))
    assert stored == sorted(greedy["acked"] + polite["acked"])  # nothing lost, nothing extra
    metrics = httpx.get(f"{a}/metrics").text
    assert 'lakelog_quota_throttled_total{kind="produce_bytes"}' in metrics


def test_kafka_produce_over_the_rate_is_answered_with_a_throttle_time(
    cluster_factory: ClusterFactory, unique_topic: Any
) -> None:
    """Kafka's door charges the same quota (client id "test") and, over it, answers
    throttle_time_ms instead of refusing: every batch is stored."""
    import datetime

    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    from tests.integration.test_kafka_clients import _batch, kafka_call

    cluster = cluster_factory(
        agents=1, kafka=True, agent_env={"LAKELOG_QUOTA_PRODUCE_BYTES_PER_S": "20000"}
    )
    topic = unique_topic("kquota")
    create_topic(cluster, topic, 1)
    throttles = []
    for _ in range(4):
        body = ProduceRequest(
            acks=-1,
            timeout=datetime.timedelta(seconds=10),
            topic_data=(
                TopicProduceData(
                    name=topic,
                    partition_data=(PartitionProduceData(index=0, records=_batch(10, 1500)),),
                ),
            ),
        )
        resp = kafka_call(cluster.kafka[0], body)
        assert resp.responses[0].partition_responses[0].error_code == 0
        throttles.append(resp.throttle_time.total_seconds() * 1000)
    assert throttles[0] == 0  # within the first second's burst
    assert throttles[-1] > 0  # 60 KB in a moment at 20 KB/s: throttled
    assert len(read_partition(cluster, topic, 0)) == 40  # nothing refused, nothing lost
