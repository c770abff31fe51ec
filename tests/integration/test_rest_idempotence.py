"""Idempotent REST produce (issue 16): the Idempotency-Key header across agents and a crash.

Real processes: a coordinator (SQLite or PostgreSQL behind it, so the key is stored
over the coordinator's HTTP API on both), three agents under uvicorn, moto over HTTP.
"""

from __future__ import annotations

import base64
import threading
import time
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.conftest import ClusterFactory, create_topic, read_partition

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BINARY = "application/vnd.kafka.binary.v2+json"
PARTITIONS = 3


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _request(i: int, cluster_id: str, topic: str) -> tuple[str, bytes, str]:
    """Request i: (path, body, content type); even ones v2, odd ones v3. Records are
    keyed and keyless mixed, so they spread over partitions; values are unique."""
    names = [f"req{i}-rec{j}" for j in range(5)]
    if i % 2 == 0:
        records = [
            {"value": _b64(n), **({"key": _b64(f"k{j}")} if j % 2 else {})}
            for j, n in enumerate(names)
        ]
        return f"/topics/{topic}", orjson.dumps({"records": records}), BINARY
    body = b"".join(
        orjson.dumps(
            {
                "value": {"type": "STRING", "data": n},
                **({"key": {"type": "STRING", "data": f"k{j}"}} if j % 2 else {}),
            }
        )
        for j, n in enumerate(names)
    )
    return f"/v3/clusters/{cluster_id}/topics/{topic}/records", body, "application/json"


def _offsets(path: str, r: httpx.Response) -> list[tuple[int, int]] | None:
    """(partition, offset) of each record of a successful answer; None if any failed."""
    if r.status_code != 200:
        return None
    if path.startswith("/topics/"):
        got = r.json()["offsets"]
        if any(o["error_code"] is not None for o in got):
            return None
        return [(o["partition"], o["offset"]) for o in got]
    reports = [orjson.loads(line) for line in r.content.split(b"\r\n") if line.strip()]
    if any(rep["error_code"] != 200 for rep in reports):
        return None
    return [(rep["partition_id"], rep["offset"]) for rep in reports]


def _send(url: str, i: int, cluster_id: str, topic: str) -> list[tuple[int, int]] | None:
    path, body, ctype = _request(i, cluster_id, topic)
    try:
        r = httpx.post(
            url + path,
            content=body,
            headers={"Content-Type": ctype, "Idempotency-Key": f"key-{i}"},
            timeout=30,
        )
    except httpx.HTTPError:
        return None  # the agent died under the request
    return _offsets(path, r)


def test_every_request_sent_twice_is_stored_once(
    db_url: str, cluster_factory: ClusterFactory, unique_topic: Any
) -> None:
    """Race: every request is sent twice, to two different agents, and agent 0 is
    SIGKILLed while requests to it are in flight (some committed, never answered).
    Every key is stored once, at the offsets of the first answer; the second answer
    equals the first; the same key with another body is refused with 422 42209."""
    cluster = cluster_factory(agents=3, db_url=db_url, agent_env={"LAKELOG_LINGER_MS": "20"})
    topic = unique_topic("idem")
    create_topic(cluster, topic, PARTITIONS)
    cid = cluster.cluster_id
    agents = list(cluster.agents)
    first: dict[int, list[tuple[int, int]]] = {}
    total = 40
    # Requests in flight to agent 0 when it is killed: their answers may never come.
    doomed = list(range(total, total + 8))
    threads = [
        threading.Thread(target=_send, args=(agents[0], i, cid, topic), daemon=True) for i in doomed
    ]
    for i in range(total):
        live = agents if i < total // 2 else agents[1:]
        if i == total // 2:
            for t in threads:
                t.start()
            time.sleep(0.03)
            cluster.agent_procs[0].kill()
        a, b = live[i % len(live)], live[(i + 1) % len(live)]
        answer = None
        deadline = time.monotonic() + 60
        while answer is None and time.monotonic() < deadline:
            answer = _send(a, i, cid, topic)
            a, b = b, a
        assert answer is not None, f"request {i} never succeeded"
        first[i] = answer
        assert _send(b, i, cid, topic) == answer, f"the retry of {i} got other offsets"
    for i in doomed:  # the client retries what it never got an answer for
        answer = None
        deadline = time.monotonic() + 60
        while answer is None and time.monotonic() < deadline:
            answer = _send(agents[1 + i % 2], i, cid, topic)
        assert answer is not None
        first[i] = answer
        assert _send(agents[2 - i % 2], i, cid, topic) == answer

    stored = {
        (p, r.offset): r.value.decode()
        for p in range(PARTITIONS)
        for r in read_partition(cluster, topic, p)
        if r.value is not None
    }
    values = Counter(stored.values())
    assert [v for v, n in values.items() if n > 1] == []  # nothing stored twice
    expected = {
        at: f"req{i}-rec{j}" for i, offsets in first.items() for j, at in enumerate(offsets)
    }
    assert stored == expected  # every record once, at the offsets the first answer gave

    # The same key with another body (or path): 422 42209 in the Confluent shape.
    path, _, ctype = _request(0, cid, topic)
    other = orjson.dumps({"records": [{"value": _b64("something else")}]})
    r = httpx.post(
        agents[1] + path,
        content=other,
        headers={"Content-Type": ctype, "Idempotency-Key": "key-0"},
    )
    assert r.status_code == 422
    assert r.json()["error_code"] == 42209
    assert "Idempotency-Key 'key-0'" in r.json()["message"]
    path, body, ctype = _request(1, cid, topic)
    r = httpx.post(
        agents[2] + path,
        content=body + b" ",
        headers={"Content-Type": ctype, "Idempotency-Key": "key-1"},
    )
    assert (r.status_code, r.json()["error_code"]) == (422, 42209)
    assert sum(len(read_partition(cluster, topic, p)) for p in range(PARTITIONS)) == len(stored)


def test_keyed_records_batch_and_bad_keys(
    cluster_factory: ClusterFactory, unique_topic: Any
) -> None:
    """records:batch under a key: the retry answers the first successes; a key that is
    not 1-255 visible ASCII characters is a 400; a key's metrics are counted."""
    cluster = cluster_factory(agents=2)
    topic = unique_topic("batch")
    create_topic(cluster, topic, 2)
    a, b = cluster.agents
    url = f"/v3/clusters/{cluster.cluster_id}/topics/{topic}/records:batch"
    body = {
        "entries": [{"id": str(n), "value": {"type": "STRING", "data": f"v{n}"}} for n in range(4)]
    }
    headers = {"Idempotency-Key": "batch-1"}
    one = httpx.post(a + url, json=body, headers=headers)
    two = httpx.post(b + url, json=body, headers=headers)
    assert one.status_code == two.status_code == 207
    assert one.json() == two.json()
    assert len(one.json()["successes"]) == 4
    assert sum(len(read_partition(cluster, topic, p)) for p in range(2)) == 4
    bad = httpx.post(a + url, json=body, headers={"Idempotency-Key": "x" * 256})
    assert (bad.status_code, bad.json()["error_code"]) == (400, 400)
    metrics = httpx.get(b + "/metrics").text
    assert 'lakelog_rest_idempotent_requests_total{outcome="duplicate"} 1.0' in metrics


def test_an_idempotent_producer_in_records_batch(
    cluster_factory: ClusterFactory, unique_topic: Any
) -> None:
    """A producer id and per-partition sequences in records:batch: a retry through the
    other agent is answered with the first offsets and stores nothing; the next
    sequences append; a gap fails every entry with 42206, an epoch older than the latest
    with 40002 (nothing stored)."""
    cluster = cluster_factory(agents=2)
    topic = unique_topic("pid")
    create_topic(cluster, topic, 2)
    a, b = cluster.agents
    cid = cluster.cluster_id
    url = f"/v3/clusters/{cid}/topics/{topic}/records:batch"
    got = httpx.post(f"{a}/v3/clusters/{cid}/producers").json()
    pid, epoch = got["producer_id"], got["producer_epoch"]
    assert epoch == 0

    def batch(seq0: int, seq1: int, tag: str, ep: int = 0) -> dict[str, Any]:
        entries = [
            {
                "id": f"{tag}{n}",
                "partition_id": n % 2,
                "value": {"type": "STRING", "data": f"{tag}{n}"},
            }
            for n in range(5)
        ]
        sequences = [{"partition_id": 0, "sequence": seq0}, {"partition_id": 1, "sequence": seq1}]
        producer = {"producer_id": pid, "producer_epoch": ep, "sequences": sequences}
        return {"entries": entries, "producer": producer}

    one = httpx.post(a + url, json=batch(0, 0, "a"))
    assert one.status_code == 207, one.text
    assert [(s["partition_id"], s["offset"]) for s in one.json()["successes"]] == [
        (0, 0),
        (1, 0),
        (0, 1),
        (1, 1),
        (0, 2),
    ]
    retry = httpx.post(b + url, json=batch(0, 0, "a")).json()  # through the other agent
    assert [(x["id"], x["partition_id"], x["offset"]) for x in retry["successes"]] == [
        (x["id"], x["partition_id"], x["offset"]) for x in one.json()["successes"]
    ]
    two = httpx.post(b + url, json=batch(3, 2, "b")).json()
    assert [(s["partition_id"], s["offset"]) for s in two["successes"]] == [
        (0, 3),
        (1, 2),
        (0, 4),
        (1, 3),
        (0, 5),
    ]
    gap = httpx.post(a + url, json=batch(9, 4, "c"))
    assert gap.status_code == 207 and gap.json()["successes"] == []
    assert {f["error_code"] for f in gap.json()["failures"]} == {42206}
    bumped = httpx.post(
        f"{b}/v3/clusters/{cid}/producers", json={"producer_id": pid, "producer_epoch": 0}
    ).json()
    assert bumped == {"producer_id": pid, "producer_epoch": 1}
    assert httpx.post(a + url, json=batch(0, 0, "e", ep=1)).status_code == 207
    stale = httpx.post(a + url, json=batch(6, 4, "d"))
    assert stale.status_code == 207 and stale.json()["successes"] == []
    assert {f["error_code"] for f in stale.json()["failures"]} == {40002}
    values = sorted(r.value.decode() for p in range(2) for r in read_partition(cluster, topic, p))
    assert values == sorted(
        [f"a{n}" for n in range(5)] + [f"b{n}" for n in range(5)] + [f"e{n}" for n in range(5)]
    )
