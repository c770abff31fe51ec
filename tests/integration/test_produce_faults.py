"""Produce when things go wrong: a killed agent, a vanished bucket, oversized uploads.

Each test runs its own cluster (moto S3 + coordinator + agents as processes) so it
can break it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import orjson
import pytest

from tests.integration.conftest import (
    AckLog,
    Cluster,
    ClusterFactory,
    create_topic,
    delivery_reports,
    read_partition,
    start_cluster,
)
from tests.integration.topology import BINARY, b64

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LIMIT = 65536


def test_sigkill_an_agent_during_produce_loses_no_acked_record(
    cluster_factory: ClusterFactory,
) -> None:
    """Race: 16 producers (8 per agent) post keyed batches while one agent is SIGKILLed.

    Expected: requests in flight on the killed agent fail on the client with a
    connection error (never a 200 without offsets); every acked record, from either
    agent, is readable at its acked offset; offsets stay contiguous per partition;
    the log holds nothing that was not sent, and no acked record twice. Records of
    requests that failed may or may not be there (the kill may fall between commit
    and answer): at-least-once, never lost once acked.
    """
    cluster = cluster_factory(agents=2, agent_env={"LAKELOG_LINGER_MS": "100"})
    topic = "killed"
    create_topic(cluster, topic, 4)
    survivor, victim = cluster.agents
    stop = threading.Event()
    acks = AckLog()
    errors: dict[str, list[str]] = {survivor: [], victim: []}

    def producer(worker: int) -> None:
        agent = survivor if worker % 2 == 0 else victim
        with httpx.Client(timeout=20) as client:
            n = 0
            while not stop.is_set():
                values = [f"w{worker}-n{n}-r{i}".encode() for i in range(20)]
                n += 1
                try:
                    acks.post(client, agent, topic, values, keyed=True)
                except httpx.TransportError as e:
                    with acks.lock:
                        errors[agent].append(type(e).__name__)
                    if agent == victim:
                        return

    threads = [threading.Thread(target=producer, args=(w,)) for w in range(16)]
    for t in threads:
        t.start()
    try:
        # Kill once acks flow (a loaded machine may need more than a second), within 30 s.
        acked_before_kill = acks.wait(100)
        cluster.agent_procs[1].kill()
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert acked_before_kill > 0
    assert errors[survivor] == []
    assert errors[victim], "the killed agent's in-flight requests must fail on the client"
    acks.check(cluster, topic, 4)


@pytest.fixture(scope="module")
def small_cluster(
    moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One agent with a 64 KiB request limit, over its own bucket."""
    cluster = start_cluster(
        tmp_path_factory.mktemp("small"),
        moto_endpoint,
        agents=1,
        agent_env={"LAKELOG_MAX_REQUEST_BYTES": str(LIMIT), "LAKELOG_LINGER_MS": "10"},
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def test_chunked_v2_body_over_the_limit_is_cut_off_while_reading(small_cluster: Cluster) -> None:
    """No Content-Length: the agent counts the chunks and answers 413 at the limit."""
    create_topic(small_cluster, "big-v2", 1)
    record = orjson.dumps({"value": b64(b"x" * 3000)})
    count = 40  # ~160 KB of JSON in total

    def body() -> Iterator[bytes]:
        yield b'{"records": ['
        for i in range(count):
            yield record + (b"," if i < count - 1 else b"")
        yield b"]}"

    r = httpx.post(
        f"{small_cluster.agents[0]}/topics/big-v2", content=body(), headers={"Content-Type": BINARY}
    )
    assert (r.status_code, r.json()) == (
        413,
        {"error_code": 413, "message": f"Request body exceeds the limit of {LIMIT} bytes."},
    )
    assert read_partition(small_cluster, "big-v2", 0) == []


def test_v3_object_over_the_limit(small_cluster: Cluster) -> None:
    """A first object over the limit is a plain 413; a later one ends the stream with a
    413 report after the earlier records' reports."""
    create_topic(small_cluster, "big-v3", 1)
    url = f"{small_cluster.agents[0]}/v3/clusters/{small_cluster.cluster_id}/topics/big-v3/records"
    huge = orjson.dumps({"value": {"type": "STRING", "data": "x" * (LIMIT + 10)}})
    small = orjson.dumps({"value": {"type": "STRING", "data": "small"}})

    def chunked(*parts: bytes) -> Iterator[bytes]:
        for part in parts:
            for i in range(0, len(part), 8192):
                yield part[i : i + 8192]

    r = httpx.post(url, content=chunked(huge), headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["error_code"]) == (413, 413)
    r = httpx.post(url, content=chunked(small, huge), headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    got = delivery_reports(r.text)
    assert [g["error_code"] for g in got] == [200, 413]
    assert got[1]["message"] == f"A record exceeds the request limit of {LIMIT} bytes."
    assert [s.value for s in read_partition(small_cluster, "big-v3", 0)] == [b"small"]


def test_failed_flush_answers_a_retriable_error_and_commits_nothing(
    small_cluster: Cluster, tmp_path: Path
) -> None:
    """The bucket disappears under a running agent: every PUT fails.

    Expected: v2 records get per-record 50003 (retriable) inside a 200 with null
    partition/offset, v3 records get 50003 reports; nothing is committed, so once
    the bucket is back the next record is offset 0.
    """
    cluster = small_cluster
    create_topic(cluster, "no-bucket", 1)
    s3 = boto3.client("s3", endpoint_url=cluster.store_endpoint)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=cluster.bucket):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=cluster.bucket, Key=obj["Key"])
    s3.delete_bucket(Bucket=cluster.bucket)
    try:
        r = httpx.post(
            f"{cluster.agents[0]}/topics/no-bucket",
            content=orjson.dumps({"records": [{"value": b64(b"a")}, {"value": b64(b"b")}]}),
            headers={"Content-Type": BINARY},
            timeout=30,
        )
        assert r.status_code == 200
        offsets = r.json()["offsets"]
        assert len(offsets) == 2
        for o in offsets:
            assert (o["partition"], o["offset"], o["error_code"]) == (None, None, 50003)
            assert "does not exist" in o["error"]
        r = httpx.post(
            f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics/no-bucket/records",
            content=orjson.dumps({"value": {"type": "STRING", "data": "c"}}),
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        (report,) = delivery_reports(r.text)
        assert report["error_code"] == 50003
        assert report["message"].startswith("Flush failed: ")
    finally:
        s3.create_bucket(Bucket=cluster.bucket)
    r = httpx.post(
        f"{cluster.agents[0]}/topics/no-bucket",
        content=orjson.dumps({"records": [{"value": b64(b"after")}]}),
        headers={"Content-Type": BINARY},
        timeout=30,
    )
    assert r.json()["offsets"] == [{"partition": 0, "offset": 0, "error_code": None, "error": None}]
    assert [s.value for s in read_partition(cluster, "no-bucket", 0)] == [b"after"]
