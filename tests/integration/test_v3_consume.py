"""v3 consume by offset (issue 16): equal to the storage API, long-polls, refuses bad offsets."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.conftest import Cluster, create_topic, read_partition

pytestmark = [pytest.mark.integration]

BINARY = "application/vnd.kafka.binary.v2+json"


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _produce(url: str, topic: str, records: list[dict[str, Any]]) -> None:
    r = httpx.post(
        f"{url}/topics/{topic}",
        content=orjson.dumps({"records": records}),
        headers={"Content-Type": BINARY},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert all(o["error_code"] is None for o in r.json()["offsets"])


def test_reads_by_offset_equal_the_storage_api(lakelog_cluster: Cluster, unique_topic: Any) -> None:
    """Records read page by page through v3 (pages bigger than one chunk, the chunks of
    twelve produce requests) equal what LogReader returns: offsets, keys, values,
    headers, timestamps; a page stops at max_bytes; out-of-range offsets are 400 40002."""
    c = lakelog_cluster
    topic = unique_topic("v3read")
    create_topic(c, topic, 2)
    a, b = c.agents
    for i in range(12):  # one chunk per request and partition
        _produce(
            a,
            topic,
            [
                {
                    "partition": 1,
                    "key": _b64(b"k%d" % j) if j % 3 else None,
                    "value": _b64(b"v" * 900 + b"%d-%d" % (i, j)),
                    "headers": [
                        {"key": "h", "value": _b64(b"%d" % j)},
                        {"key": "n", "value": None},
                    ],
                }
                for j in range(20)
            ],
        )
    expected = read_partition(c, topic, 1)
    assert len(expected) == 240
    base = f"{b}/v3/clusters/{c.cluster_id}/topics/{topic}/partitions/1/records"
    got: list[dict[str, Any]] = []
    offset = 0
    pages = 0
    while offset < len(expected):
        r = httpx.get(base, params={"offset": offset, "max_bytes": 64 * 1024})
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["high_watermark"] == 240 and page["log_start_offset"] == 0
        assert sum(len(base64.b64decode(x["value"])) for x in page["records"]) <= 64 * 1024
        got += page["records"]
        offset = page["next_offset"]
        pages += 1
    assert pages > 1  # several pages, each over several 20-record chunks
    assert len(page["records"]) > 20 or pages > 10
    assert [
        (
            g["offset"],
            g["key"],
            g["value"],
            g["timestamp"],
            [(h["key"], h["value"]) for h in g["headers"]],
        )
        for g in got
    ] == [
        (
            e.offset,
            _b64(e.key),
            _b64(e.value),
            e.timestamp_ms,
            [(k, _b64(v)) for k, v in e.headers],
        )
        for e in expected
    ]
    assert {g["partition"] for g in got} == {1} and {g["topic"] for g in got} == {topic}
    # Default: from the log start; one record at least even over max_bytes.
    first = httpx.get(base, params={"max_bytes": 1}).json()
    assert [x["offset"] for x in first["records"]] == [0]
    for bad in (241, -1):
        r = httpx.get(base, params={"offset": bad})
        assert r.status_code == 400
        assert r.json()["error_code"] == 40002
        assert "out of range" in r.json()["message"]
        assert "high watermark 240" in r.json()["message"]
    r = httpx.get(base.replace("/partitions/1/", "/partitions/7/"))
    assert (r.status_code, r.json()["error_code"]) == (404, 40402)
    r = httpx.get(base, params={"format": "xml"})
    assert (r.status_code, r.json()["error_code"]) == (400, 400)


def test_a_read_at_the_high_watermark_waits_for_a_commit(
    lakelog_cluster: Cluster, unique_topic: Any
) -> None:
    """A read at the high watermark long-polls and is answered as soon as a record is
    committed through the other agent (not at its timeout); json values are embedded."""
    c = lakelog_cluster
    topic = unique_topic("v3poll")
    create_topic(c, topic, 1)
    a, b = c.agents
    url = f"{a}/v3/clusters/{c.cluster_id}/topics/{topic}/partitions/0/records"
    empty = httpx.get(url, params={"offset": 0}).json()
    assert empty == {"records": [], "next_offset": 0, "log_start_offset": 0, "high_watermark": 0}

    def later() -> None:
        time.sleep(1.0)
        r = httpx.post(
            f"{b}/topics/{topic}",
            content=orjson.dumps({"records": [{"value": {"n": 1}}]}),
            headers={"Content-Type": "application/vnd.kafka.json.v2+json"},
        )
        assert r.status_code == 200

    t = threading.Thread(target=later)
    t.start()
    started = time.monotonic()
    r = httpx.get(url, params={"offset": 0, "timeout_ms": 20000, "format": "json"}, timeout=30)
    waited = time.monotonic() - started
    t.join()
    assert r.status_code == 200
    assert [(x["offset"], x["value"]) for x in r.json()["records"]] == [(0, {"n": 1})]
    assert waited < 15  # woken by the commit, not by the timeout
