"""v3 records:batch (exact bodies, its limits), OPTIONS and Allow, on real processes."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.integration.conftest import Cluster, create_topic

pytestmark = pytest.mark.integration


def batch_url(cluster: Cluster, topic: str) -> str:
    return f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics/{topic}/records:batch"


def test_records_batch_exact_bodies(
    lakelog_cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    """Successes and failures by id, in input order; one flush for the batch's records."""
    cluster = lakelog_cluster
    topic = unique_topic("batch")
    create_topic(cluster, topic, 2)
    body = {
        "entries": [
            {"id": "1", "partition_id": 1, "value": {"type": "STRING", "data": "My first message"},
             "timestamp": "2021-02-05T19:14:42Z"},
            {"id": "2", "partition_id": 0, "key": {"type": "BINARY", "data": "not base64!"}},
            {"id": "3", "partition_id": 1,
             "key": {"type": "JSON", "data": {"k": 12345678901234567890}},
             "value": {"type": "BINARY", "data": base64.b64encode(b"raw").decode()},
             "timestamp": "2021-02-05T19:14:43.5Z"},
            {"id": "4", "partition_id": 7, "value": {"type": "STRING", "data": "nowhere"}},
        ]
    }  # fmt: skip
    r = httpx.post(batch_url(cluster, topic), json=body)
    assert r.status_code == 207, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "successes": [
            {"id": "1", "cluster_id": cluster.cluster_id, "topic_name": topic, "partition_id": 1,
             "offset": 0, "timestamp": "2021-02-05T19:14:42.000Z",
             "value": {"type": "STRING", "size": 16}},
            {"id": "3", "cluster_id": cluster.cluster_id, "topic_name": topic, "partition_id": 1,
             "offset": 1, "timestamp": "2021-02-05T19:14:43.500Z",
             "key": {"type": "JSON", "size": 26}, "value": {"type": "BINARY", "size": 3}},
        ],
        "failures": [
            {"id": "2", "error_code": 400,
             "message": "Bad Request: data=not base64! is not a base64 string."},
            {"id": "4", "error_code": 40402,
             "message": f"Partition 7 of topic '{topic}' not found."},
        ],
    }  # fmt: skip
    offsets = httpx.get(
        f"{cluster.agents[1]}/v3/clusters/{cluster.cluster_id}/topics/{topic}/partitions/1/offset"
    ).json()
    assert offsets["latest_offset"] == 2


def test_atomic_records_batch_stores_all_entries_or_none(
    lakelog_cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    """``"atomic": true``: one bad entry (a partition the topic lacks) and nothing of the
    batch is stored, on any partition; without a bad entry, every entry across three
    partitions is stored by one commit."""
    cluster = lakelog_cluster
    topic = unique_topic("atomic")
    create_topic(cluster, topic, 3)

    def entries(partitions: list[int]) -> list[dict[str, Any]]:
        return [
            {"id": str(i), "partition_id": p, "value": {"type": "STRING", "data": f"v{i}"}}
            for i, p in enumerate(partitions)
        ]

    def latest(p: int) -> int:
        url = f"{cluster.agents[1]}/v3/clusters/{cluster.cluster_id}/topics/{topic}/partitions"
        return int(httpx.get(f"{url}/{p}/offset").json()["latest_offset"])

    bad = httpx.post(
        batch_url(cluster, topic), json={"atomic": True, "entries": entries([0, 1, 7, 2])}
    )
    assert bad.status_code == 207, bad.text
    answer = bad.json()
    assert answer["successes"] == []
    failures = {f["id"]: f for f in answer["failures"]}
    assert failures["2"]["error_code"] == 40402
    for i in ("0", "1", "3"):
        assert failures[i]["error_code"] == 42208
        assert "entries[2]" in failures[i]["message"]
    assert [latest(p) for p in range(3)] == [0, 0, 0]
    # The same batch without "atomic" stores the good entries.
    plain = httpx.post(batch_url(cluster, topic), json={"entries": entries([0, 1, 7, 2])})
    assert len(plain.json()["successes"]) == 3
    assert [latest(p) for p in range(3)] == [1, 1, 1]
    good = httpx.post(
        batch_url(cluster, topic), json={"atomic": True, "entries": entries([0, 1, 2, 0])}
    )
    assert [s["id"] for s in good.json()["successes"]] == ["0", "1", "2", "3"]
    assert [latest(p) for p in range(3)] == [3, 2, 2]


def test_records_batch_limits_and_request_errors(
    lakelog_cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    cluster = lakelog_cluster
    topic = unique_topic("batchlim")
    create_topic(cluster, topic, 1)
    url = batch_url(cluster, topic)

    def entries(n: int) -> dict[str, Any]:
        return {
            "entries": [{"id": str(i), "value": {"type": "STRING", "data": "v"}} for i in range(n)]
        }

    r = httpx.post(url, json=entries(10))  # kafka-rest's default maximum: exactly at it
    assert r.status_code == 207 and len(r.json()["successes"]) == 10, r.text
    for payload, message in (
        (entries(11), "Too many entries in batch: 11; at most 10 allowed."),
        (entries(0), "Empty batch."),
        ({"entries": [{"id": "a"}, {"id": "a"}]}, "Batch entry IDs are not distinct."),
        ({"entries": [{"id": "x" * 81}]}, "Batch entry IDs must be strings of 1 to 80 characters: "
         f"entries[0].id is {'x' * 81!r}."),
        ({"entries": [{"value": {"type": "STRING", "data": "no id"}}]},
         "Batch entry IDs must be strings of 1 to 80 characters: entries[0].id is None."),
    ):  # fmt: skip
        r = httpx.post(url, json=payload)
        assert (r.status_code, r.json()) == (422, {"error_code": 42208, "message": message})
    r = httpx.post(url, content=b"[1, 2]", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error_code"] == 400
    r = httpx.post(url, content=b"", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error_code"] == 42206
    r = httpx.post(url, content=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    r = httpx.post(batch_url(cluster, unique_topic("none")), json=entries(1))
    assert (r.status_code, r.json()["error_code"]) == (404, 40403)
    r = httpx.get(
        f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics/{topic}/partitions/0/offset"
    )
    assert r.json()["latest_offset"] == 10  # nothing of the refused batches was stored


def test_records_batch_at_the_body_limit(tmp_path: Path) -> None:
    """A batch body of exactly ``max_request_bytes`` is produced; one byte more is 413."""
    limit = 64 * 1024
    settings = Settings(
        db=f"sqlite:///{tmp_path / 'meta.db'}", store="memory://", max_request_bytes=limit
    )
    app = create_app(settings)
    with TestClient(app) as client:
        cid = client.get("/v3/clusters").json()["data"][0]["cluster_id"]
        client.post(f"/v3/clusters/{cid}/topics", json={"topic_name": "t"})

        def body(size: int) -> bytes:
            shell = orjson.dumps(
                {"entries": [{"id": "1", "value": {"type": "STRING", "data": ""}}]}
            )
            return shell.replace(b'"data":""', b'"data":"' + b"x" * (size - len(shell)) + b'"')

        url = f"/v3/clusters/{cid}/topics/t/records:batch"
        headers = {"Content-Type": "application/json"}
        r = client.post(url, content=body(limit), headers=headers)
        assert r.status_code == 207 and r.json()["successes"][0]["offset"] == 0, r.text
        r = client.post(url, content=body(limit + 1), headers=headers)
        assert r.status_code == 413 and r.json()["error_code"] == 413


def test_options_and_allow(lakelog_cluster: Cluster) -> None:
    """OPTIONS answers the path's methods; a 405 lists all of them (routes of one path
    are several functions)."""
    cluster = lakelog_cluster
    v3 = f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}"
    for path, allow in (
        ("/topics/t/configs/retention.ms", "DELETE, GET, PUT, OPTIONS"),
        ("/consumer-groups/g", "DELETE, GET, OPTIONS"),
        ("/topics", "GET, POST, OPTIONS"),
        ("/broker-configs:alter", "POST, OPTIONS"),
    ):
        r = httpx.options(v3 + path)
        assert (r.status_code, r.headers["allow"]) == (204, allow), path
    r = httpx.post(v3 + "/topics/t/configs/retention.ms", json={})
    assert r.status_code == 405
    assert r.headers["allow"] == "DELETE, GET, PUT, OPTIONS"
    assert r.json() == {"error_code": 405, "message": "HTTP 405 Method Not Allowed"}
    assert httpx.options(f"{cluster.agents[0]}/no/such/path").status_code == 404
