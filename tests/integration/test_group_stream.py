"""A consumer group's records as SSE / NDJSON (issue 16), across a disconnect and an agent
restart, fed by concurrent producers."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.conftest import ClusterFactory, _wait_ready, create_topic
from tests.procs import Proc

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BINARY = "application/vnd.kafka.binary.v2+json"
PRODUCERS = 3
EACH = 150


def _produce_all(urls: list[str], topic: str, who: int) -> None:
    """Five records a request; a request that fails (its agent was killed) is retried
    through the other agent under the same Idempotency-Key: stored once."""
    for i in range(0, EACH, 5):
        records = [
            {
                "key": base64.b64encode(b"%d-%d" % (who, i + j)).decode(),
                "value": base64.b64encode(b"p%d-%d" % (who, i + j)).decode(),
            }
            for j in range(5)
        ]
        body = orjson.dumps({"records": records})
        headers = {"Content-Type": BINARY, "Idempotency-Key": f"{who}-{i}"}
        for attempt in range(20):
            url = urls[(who + i + attempt) % len(urls)]
            try:
                r = httpx.post(f"{url}/topics/{topic}", content=body, headers=headers, timeout=30)
            except httpx.HTTPError:
                continue
            if r.status_code == 200 and all(o["error_code"] is None for o in r.json()["offsets"]):
                break
        else:
            raise AssertionError(f"request {who}-{i} never stored")
        time.sleep(0.02)


def _sse_events(r: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, data) of each record event; keepalive comments skipped."""
    event_id, data = "", b""
    for line in r.iter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data = line[6:].encode()
        elif line == "" and data:
            yield event_id, orjson.loads(data)
            data = b""


def test_a_stream_delivers_every_record_once_in_order_across_disconnect_and_restart(
    cluster_factory: ClusterFactory, unique_topic: Any
) -> None:
    """Race: three producers write while a client streams the group over SSE; it
    disconnects, resumes through the other agent with Last-Event-ID, that agent is
    SIGKILLed and restarted, and the client resumes there (NDJSON, cursor parameter).
    Every record is delivered exactly once, in offset order per partition; the group's
    committed offsets follow what was sent."""
    cluster = cluster_factory(agents=2, agent_env={"LAKELOG_LINGER_MS": "20"})
    topic = unique_topic("stream")
    create_topic(cluster, topic, 3)
    a, b = cluster.agents
    cid = cluster.cluster_id
    path = f"/v3/clusters/{cid}/consumer-groups/g-stream/records"
    producers = [
        threading.Thread(target=_produce_all, args=(cluster.agents, topic, w))
        for w in range(PRODUCERS)
    ]
    for t in producers:
        t.start()
    got: list[dict[str, Any]] = []
    cursor = ""
    params = {"topics": topic, "keepalive_ms": 500}
    # 1. SSE from agent a; the client goes away after 100 records.
    with httpx.stream(
        "GET", a + path, params=params, headers={"Accept": "text/event-stream"}, timeout=60
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for event_id, rec in _sse_events(r):
            got.append(rec)
            cursor = event_id
            if len(got) == 100:
                break
    # 2. Resume through agent b with Last-Event-ID; b is killed under the stream.
    victim = cluster.agent_procs[1]
    with httpx.stream(
        "GET",
        b + path,
        params=params,
        headers={"Accept": "text/event-stream", "Last-Event-ID": cursor},
        timeout=60,
    ) as r:
        for event_id, rec in _sse_events(r):
            got.append(rec)
            cursor = event_id
            if len(got) == 250:
                victim.kill()
                break
    victim.stop()
    for t in producers:
        t.join()
    new = Proc(victim.args, victim.log)
    cluster.agent_procs[1] = new
    _wait_ready(b, new)
    # 3. NDJSON from the restarted agent, from the cursor: the rest, then keepalives.
    with httpx.stream(
        "GET",
        b + path,
        params={**params, "cursor": cursor},
        headers={"Accept": "application/x-ndjson"},
        timeout=60,
    ) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        deadline = time.monotonic() + 60
        for line in r.iter_lines():
            assert time.monotonic() < deadline, f"{len(got)} records after 60 s"
            doc = orjson.loads(line)
            if doc.get("keepalive"):
                if len(got) >= PRODUCERS * EACH:
                    break
                continue
            cursor = doc.pop("cursor")
            got.append(doc)
    values = [base64.b64decode(g["value"]) for g in got]
    assert len(values) == len(set(values)) == PRODUCERS * EACH  # each once, none lost
    for p in range(3):
        offsets = [g["offset"] for g in got if g["partition"] == p]
        assert offsets == list(range(len(offsets)))  # in order, no gap, per partition
    # The stream committed what it sent (at its end, at the latest).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lags = httpx.get(f"{a}/v3/clusters/{cid}/consumer-groups/g-stream/lags").json()["data"]
        if sum(x["current_offset"] for x in lags) == PRODUCERS * EACH:
            break
        time.sleep(0.2)
    assert sum(x["current_offset"] for x in lags) == PRODUCERS * EACH
    # Without a cursor, a new stream starts at the group's committed offsets: nothing.
    with httpx.stream("GET", a + path, params=params, timeout=30) as r:
        first = orjson.loads(next(r.iter_lines()))
    assert first == {"keepalive": True}
    bad = httpx.get(a + path, params={**params, "cursor": "not-a-cursor"})
    assert (bad.status_code, bad.json()["error_code"]) == (400, 400)
