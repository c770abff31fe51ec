"""REST v2 consumers and v3 consumer-group views against real processes.

One shared cluster (moto S3 + coordinator + two agents). Instances are created
through one agent and used through the other wherever it matters: their state
lives in the coordinator. Error bodies are asserted exactly.
"""

from __future__ import annotations

import base64
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.conftest import Cluster
from tests.procs import lakelog_cmd

pytestmark = pytest.mark.integration

V2 = "application/vnd.kafka.v2+json"
BINARY = "application/vnd.kafka.binary.v2+json"
JSON_V2 = "application/vnd.kafka.json.v2+json"
NOT_FOUND = {"error_code": 40403, "message": "Consumer instance not found."}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(data: str | None) -> bytes | None:
    return None if data is None else base64.b64decode(data)


def request(
    method: str,
    url: str,
    body: Any = None,
    *,
    content_type: str = V2,
    accept: str | None = None,
    timeout: float = 30,
) -> httpx.Response:
    headers = {"Content-Type": content_type}
    if accept is not None:
        headers["Accept"] = accept
    content = None if body is None else orjson.dumps(body)
    return httpx.request(method, url, content=content, headers=headers, timeout=timeout)


class Consumer:
    """A v2 consumer instance, its requests sent to whichever agent ``agent`` says."""

    def __init__(self, agents: list[str], group: str, name: str) -> None:
        self.agents = agents
        self.group = group
        self.name = name
        self.turn = 0

    @classmethod
    def create(cls, agents: list[str], group: str, name: Any = None, **config: Any) -> Consumer:
        """Create an instance through the first agent (``config``: the create body)."""
        name = name or f"c-{uuid.uuid4().hex[:8]}"
        r = request("POST", f"{agents[0]}/consumers/{group}", {"name": name, **config})
        assert r.status_code == 200, r.text
        return cls(agents, group, name)

    def url(self, suffix: str = "", agent: int | None = None) -> str:
        if agent is None:  # alternate between the agents
            agent = self.turn % len(self.agents)
            self.turn += 1
        return f"{self.agents[agent]}/consumers/{self.group}/instances/{self.name}{suffix}"

    def call(
        self, method: str, suffix: str, body: Any = None, *, agent: int | None = None
    ) -> httpx.Response:
        return request(method, self.url(suffix, agent), body)

    def subscribe(self, *topics: str) -> None:
        r = self.call("POST", "/subscription", {"topics": list(topics)})
        assert r.status_code == 204, r.text

    def assign(self, topic: str, *partitions: int) -> None:
        parts = [{"topic": topic, "partition": p} for p in partitions]
        r = self.call("POST", "/assignments", {"partitions": parts})
        assert r.status_code == 204, r.text

    def fetch_raw(
        self,
        timeout_ms: int | None = 0,
        max_bytes: int | None = None,
        *,
        accept: str = BINARY,
        agent: int | None = None,
    ) -> httpx.Response:
        params = []
        if timeout_ms is not None:
            params.append(f"timeout={timeout_ms}")
        if max_bytes is not None:
            params.append(f"max_bytes={max_bytes}")
        query = "?" + "&".join(params) if params else ""
        return request("GET", self.url("/records" + query, agent), accept=accept)

    def fetch(
        self, timeout_ms: int | None = 0, max_bytes: int | None = None, **kw: Any
    ) -> list[Any]:
        r = self.fetch_raw(timeout_ms, max_bytes, **kw)
        assert r.status_code == 200, r.text
        body: list[Any] = r.json()
        return body

    def commit(self, offsets: list[dict[str, Any]] | None = None) -> None:
        body = None if offsets is None else {"offsets": offsets}
        r = self.call("POST", "/offsets", body)
        assert r.status_code == 200, r.text
        assert r.json() == []

    def committed(self, topic: str, *partitions: int) -> dict[int, int]:
        parts = [{"topic": topic, "partition": p} for p in partitions]
        r = self.call("GET", "/offsets", {"partitions": parts})
        assert r.status_code == 200, r.text
        return {o["partition"]: o["offset"] for o in r.json()["offsets"]}

    def delete(self) -> None:
        r = self.call("DELETE", "")
        assert r.status_code == 204, r.text


def produce(
    agent: str, topic: str, values: list[bytes], partition: int | None = None, **extra: Any
) -> list[tuple[int, int]]:
    """Produce through ``agent``; returns (partition, offset) of each record."""
    path = f"/topics/{topic}" + ("" if partition is None else f"/partitions/{partition}")
    records = [{"value": b64(v), **extra} for v in values]
    r = request("POST", agent + path, {"records": records}, content_type=BINARY)
    assert r.status_code == 200, r.text
    return [(o["partition"], o["offset"]) for o in r.json()["offsets"]]


def create_topic(cluster: Cluster, name: str, partitions: int = 1) -> str:
    r = httpx.post(
        f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics",
        json={"topic_name": name, "partitions_count": partitions},
    )
    assert r.status_code == 201, r.text
    return name


def metric(agent: str, name: str) -> float:
    """One unlabelled counter of an agent's /metrics."""
    for line in httpx.get(f"{agent}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in {agent}/metrics")


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(lakelog_cluster: Cluster) -> Cluster:
    return lakelog_cluster


@pytest.fixture
def topic(cluster: Cluster, unique_topic: Callable[[str], str]) -> str:
    return create_topic(cluster, unique_topic("consume"), 2)


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


# -- instances -----------------------------------------------------------------------------


@pytest.mark.parametrize("slash", ["", "/"])
def test_create_and_delete_instance(cluster: Cluster, group: str, slash: str) -> None:
    a, b = cluster.agents
    r = request(
        "POST",
        f"{a}/consumers/{group}{slash}",
        {
            "name": "my_consumer",
            "format": "BINARY",
            "auto.offset.reset": "earliest",
            "auto.commit.enable": "false",
            "topic.metadata.refresh.interval.ms": 100,  # unknown keys are ignored
        },
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == V2
    assert r.json() == {
        "instance_id": "my_consumer",
        "base_uri": f"{a}/consumers/{group}/instances/my_consumer",
    }
    dup = request("POST", f"{b}/consumers/{group}{slash}", {"name": "my_consumer"})
    assert dup.status_code == 409
    assert dup.json() == {
        "error_code": 40902,
        "message": "Consumer with specified consumer ID already exists in the specified "
        "consumer group.",
    }
    # Deleted through the other agent: nothing is pinned to the creating one.
    gone = request("DELETE", f"{b}/consumers/{group}/instances/my_consumer{slash}")
    assert gone.status_code == 204 and gone.content == b""
    again = request("DELETE", f"{a}/consumers/{group}/instances/my_consumer{slash}")
    assert again.status_code == 404
    assert again.json() == NOT_FOUND


def test_create_without_a_name_and_without_a_body(cluster: Cluster, group: str) -> None:
    r = httpx.post(f"{cluster.agents[1]}/consumers/{group}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["instance_id"].startswith("rest-consumer-")
    assert (
        body["base_uri"] == f"{cluster.agents[1]}/consumers/{group}/instances/{body['instance_id']}"
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"format": "xml"}, "Invalid format type."),
        ({"fetch.min.bytes": -10}, None),
        ({"responseMinBytes": "lots"}, None),
        ({"auto.offset.reset": "middle"}, None),
        ({"auto.commit.enable": "maybe"}, None),
        ({"consumer.request.timeout.ms": -1}, None),
    ],
)
def test_invalid_settings_are_422(
    cluster: Cluster, group: str, config: dict[str, Any], message: str | None
) -> None:
    r = request("POST", f"{cluster.agents[0]}/consumers/{group}", {"name": "x", **config})
    assert r.status_code == 422, r.text
    assert r.json()["error_code"] == 42204
    if message is not None:
        assert r.json()["message"] == message
    # Nothing was created.
    assert (
        request("DELETE", f"{cluster.agents[0]}/consumers/{group}/instances/x").json() == NOT_FOUND
    )


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("DELETE", "", None),
        ("GET", "/subscription", None),
        ("POST", "/subscription", {"topics": ["t"]}),
        ("DELETE", "/subscription", None),
        ("GET", "/assignments", None),
        ("POST", "/assignments", {"partitions": [{"topic": "t", "partition": 0}]}),
        ("POST", "/positions", {"offsets": [{"topic": "t", "partition": 0, "offset": 1}]}),
        ("POST", "/positions/beginning", {"partitions": [{"topic": "t", "partition": 0}]}),
        ("POST", "/positions/end", {"partitions": [{"topic": "t", "partition": 0}]}),
        ("GET", "/records", None),
        ("POST", "/offsets", None),
        ("GET", "/offsets", {"partitions": [{"topic": "t", "partition": 0}]}),
    ],
)
def test_unknown_instance_is_40403_everywhere(
    cluster: Cluster, group: str, method: str, suffix: str, body: Any
) -> None:
    r = request(method, f"{cluster.agents[0]}/consumers/{group}/instances/nobody{suffix}", body)
    assert r.status_code == 404
    assert r.json() == NOT_FOUND


# -- subscription and assignment --------------------------------------------------------------


def test_subscription_lifecycle_and_conflicts(
    cluster: Cluster, group: str, topic: str, unique_topic: Callable[[str], str]
) -> None:
    c = Consumer.create(cluster.agents, group)
    assert c.call("GET", "/subscription").json() == {"topics": []}
    c.subscribe(topic)
    assert c.call("GET", "/subscription").json() == {"topics": [topic]}
    r = c.call("POST", "/subscription", {"topics": [topic], "topic_pattern": "x.*"})
    assert r.status_code == 409
    assert r.json() == {
        "error_code": 40903,
        "message": "Subscription to topics, partitions and pattern are mutually exclusive.",
    }
    r = c.call("POST", "/assignments", {"partitions": [{"topic": topic, "partition": 0}]})
    assert r.status_code == 409
    assert r.json()["error_code"] == 40903
    # As kafka-rest: a topic that does not exist yet is subscribed (assigned once created).
    missing = unique_topic("missing")
    assert c.call("POST", "/subscription", {"topics": [missing]}).status_code == 204
    assert c.call("GET", "/subscription").json() == {"topics": [missing]}
    assert c.call("GET", "/assignments").json() == {"partitions": []}
    c.subscribe(topic)
    r = c.call("POST", "/subscription", {"topics": ["no spaces allowed"]})
    assert r.status_code == 422
    assert r.json() == {"error_code": 42206, "message": "Invalid topic name."}
    # Java regex constructs RE2 cannot run are refused, not misread.
    r = c.call("POST", "/subscription", {"topic_pattern": "(?=x).*"})
    assert r.status_code == 422
    assert r.json()["error_code"] == 42206
    assert "lookahead is not supported" in r.json()["message"]
    assert c.call("POST", "/subscription", {"topics": "nope"}).status_code == 422
    assert c.call("POST", "/subscription", {"topic_pattern": 5}).status_code == 422
    # Subscribed: the group assigned both partitions to the only member.
    parts = c.call("GET", "/assignments").json()["partitions"]
    assert sorted(p["partition"] for p in parts) == [0, 1]
    assert c.call("DELETE", "/subscription/").status_code == 204
    assert c.call("GET", "/subscription").json() == {"topics": []}
    # A pattern subscription lists the topics it matches.
    prefix = topic.rsplit("-", 1)[0]
    other = create_topic(cluster, f"{prefix}-{uuid.uuid4().hex[:10]}")
    r = c.call("POST", "/subscription", {"topic_pattern": f"{prefix}-.*"})
    assert r.status_code == 204, r.text
    topics = c.call("GET", "/subscription").json()["topics"]
    assert topic in topics and other in topics


def test_manual_assignment(cluster: Cluster, group: str, topic: str) -> None:
    c = Consumer.create(cluster.agents, group)
    assert c.call("GET", "/assignments").json() == {"partitions": []}
    c.assign(topic, 1)
    assert c.call("GET", "/assignments").json() == {
        "partitions": [{"topic": topic, "partition": 1}]
    }
    r = c.call("POST", "/subscription", {"topics": [topic]})
    assert r.status_code == 409
    assert r.json()["error_code"] == 40903
    r = c.call("POST", "/assignments", {"partitions": [{"topic": topic, "partition": 9}]})
    assert r.status_code == 404
    assert r.json()["error_code"] == 40402


# -- fetch -----------------------------------------------------------------------------------


def test_first_fetch_after_subscribing_returns_data_with_timestamp_and_headers(
    cluster: Cluster, group: str, topic: str
) -> None:
    a = cluster.agents[0]
    before = int(time.time() * 1000)
    r = request(
        "POST",
        f"{a}/topics/{topic}/partitions/0",
        {"records": [{"key": b64(b"k"), "value": b64(b"v0")}, {"value": b64(b"v1")}]},
        content_type=BINARY,
    )
    assert r.status_code == 200, r.text
    c = Consumer.create(cluster.agents, group, **{"auto.offset.reset": "earliest"})
    c.subscribe(topic)
    r = c.fetch_raw(timeout_ms=5000, agent=1)
    assert r.status_code == 200
    assert r.headers["content-type"] == BINARY
    records = r.json()
    assert [(rec["partition"], rec["offset"]) for rec in records] == [(0, 0), (0, 1)]
    first = records[0]
    assert first["topic"] == topic
    assert (unb64(first["key"]), unb64(first["value"])) == (b"k", b"v0")
    assert records[1]["key"] is None
    assert first["timestamp"] >= before - 1000
    assert first["headers"] == []
    assert c.fetch(agent=0) == []  # positions moved: nothing new


def test_headers_are_returned(
    cluster: Cluster, group: str, unique_topic: Callable[[str], str]
) -> None:
    topic = create_topic(cluster, unique_topic("hdr"))
    r = request(
        "POST",
        f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics/{topic}/records",
        {
            "value": {"type": "BINARY", "data": b64(b"x")},
            "headers": [{"name": "h1", "value": b64(b"one")}, {"name": "h2", "value": None}],
        },
        content_type="application/json",
    )
    assert r.status_code == 200, r.text
    c = Consumer.create(cluster.agents, group, **{"auto.offset.reset": "earliest"})
    c.assign(topic, 0)
    [rec] = c.fetch(2000)
    assert rec["headers"] == [{"key": "h1", "value": b64(b"one")}, {"key": "h2", "value": None}]


def test_json_consumer_embeds_json_and_refuses_non_json(
    cluster: Cluster, group: str, topic: str
) -> None:
    r = request(
        "POST",
        f"{cluster.agents[0]}/topics/{topic}/partitions/0",
        {"records": [{"key": {"id": 1}, "value": {"a": [1, 2, None]}}]},
        content_type=JSON_V2,
    )
    assert r.status_code == 200, r.text
    c = Consumer.create(cluster.agents, group, format="json", **{"auto.offset.reset": "earliest"})
    c.assign(topic, 0)
    r = c.fetch_raw(2000, accept=BINARY)
    assert r.status_code == 406
    assert r.json()["error_code"] == 40601
    r = c.fetch_raw(2000, accept=JSON_V2)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == JSON_V2
    [rec] = r.json()
    assert (rec["key"], rec["value"], rec["offset"]) == ({"id": 1}, {"a": [1, 2, None]}, 0)
    produce(cluster.agents[1], topic, [b"not json {"], partition=0)
    r = c.fetch_raw(2000, accept=JSON_V2)
    assert r.status_code == 422
    assert r.json() == {
        "error_code": 42206,
        "message": "value deserialization error for format json",
    }
    # The undecodable record was not skipped: the position did not move past it.
    r = c.fetch_raw(0, accept=JSON_V2)
    assert r.status_code == 422


@pytest.mark.parametrize(
    ("accept", "status"),
    [
        (BINARY, 200),
        (V2, 200),
        ("*/*", 200),
        ("text/plain, */*;q=0.1", 200),
        ("application/json", 200),  # Karapace accepts plain JSON
        (JSON_V2, 406),
        ("application/vnd.kafka.avro.v2+json", 406),
        ("text/html", 406),
    ],
)
def test_binary_consumer_accept_header(
    cluster: Cluster, group: str, accept: str, status: int
) -> None:
    c = Consumer.create(cluster.agents, group)
    r = c.fetch_raw(0, accept=accept)
    assert r.status_code == status, r.text
    if accept == "application/json":
        assert r.headers["content-type"] == "application/json"
    if status == 406:
        assert r.json() == {
            "error_code": 40601,
            "message": "The requested embedded data format does not match the deserializer "
            "for this consumer instance (binary).",
        }


def test_max_bytes_never_skips_a_record(cluster: Cluster, group: str, topic: str) -> None:
    """10 records of 1000 bytes in one partition, read with small max_bytes: at least
    one record per fetch, never more than max_bytes beyond the first, none lost."""
    produce(cluster.agents[0], topic, [bytes([i]) * 1000 for i in range(10)], partition=0)
    c = Consumer.create(cluster.agents, group, **{"auto.offset.reset": "earliest"})
    c.assign(topic, 0)
    one = c.fetch(2000, max_bytes=10)
    assert [r["offset"] for r in one] == [0]
    two = c.fetch(2000, max_bytes=2500)
    assert [r["offset"] for r in two] == [1, 2]
    rest: list[Any] = []
    while len(rest) < 7:
        batch = c.fetch(2000, max_bytes=3000)
        assert 1 <= len(batch) <= 3
        rest += batch
    assert [r["offset"] for r in rest] == list(range(3, 10))
    assert [unb64(r["value"]) for r in rest] == [bytes([i]) * 1000 for i in range(3, 10)]


def test_round_robin_serves_every_partition(cluster: Cluster, group: str, topic: str) -> None:
    """Both partitions have plenty; a small fetch still returns records of both."""
    produce(cluster.agents[0], topic, [b"a" * 100] * 50, partition=0)
    produce(cluster.agents[0], topic, [b"b" * 100] * 50, partition=1)
    c = Consumer.create(cluster.agents, group, **{"auto.offset.reset": "earliest"})
    c.subscribe(topic)
    batch = c.fetch(2000, max_bytes=1000)
    assert len(batch) == 10
    assert {r["partition"] for r in batch} == {0, 1}
    for p in (0, 1):
        offsets = [r["offset"] for r in batch if r["partition"] == p]
        assert offsets == list(range(len(offsets)))


# -- positions and reset policies --------------------------------------------------------------


def test_seek_offset_beginning_end_and_timestamp(cluster: Cluster, group: str, topic: str) -> None:
    produce(cluster.agents[0], topic, [f"old-{i}".encode() for i in range(5)], partition=0)
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    produce(cluster.agents[1], topic, [f"new-{i}".encode() for i in range(5)], partition=0)
    c = Consumer.create(cluster.agents, group, **{"auto.offset.reset": "latest"})
    c.assign(topic, 0)
    assert c.fetch(0) == []  # latest: nothing old
    tp = [{"topic": topic, "partition": 0}]

    def seek(suffix: str, body: Any) -> None:
        r = c.call("POST", "/positions" + suffix, body)
        assert r.status_code == 204, r.text

    seek("/beginning", {"partitions": tp})
    assert [r["offset"] for r in c.fetch(2000)] == list(range(10))
    seek("", {"offsets": [{"topic": topic, "partition": 0, "offset": 7}]})
    assert [r["offset"] for r in c.fetch(2000)] == [7, 8, 9]
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(middle / 1000))
    iso += f".{middle % 1000:03d}Z"
    seek("", {"timestamps": [{"topic": topic, "partition": 0, "timestamp": iso, "metadata": None}]})
    assert [unb64(r["value"]) for r in c.fetch(2000)] == [f"new-{i}".encode() for i in range(5)]
    seek("/end", {"partitions": tp})
    assert c.fetch(0) == []
    produce(cluster.agents[0], topic, [b"after"], partition=0)
    assert [r["offset"] for r in c.fetch(2000)] == [10]
    # A partition the instance does not own: 409 40903.
    r = c.call("POST", "/positions", {"offsets": [{"topic": topic, "partition": 1, "offset": 0}]})
    assert r.status_code == 409
    assert r.json() == {
        "error_code": 40903,
        "message": f"No current assignment for partition {topic}-1.",
    }
    r = c.call("POST", "/positions/beginning", {"partitions": [{"topic": topic, "partition": 1}]})
    assert r.status_code == 409
    assert r.json()["error_code"] == 40903


def test_reset_policies(cluster: Cluster, group: str, topic: str) -> None:
    produce(cluster.agents[0], topic, [b"x0", b"x1"], partition=0)
    early = Consumer.create(cluster.agents, f"{group}-e", **{"auto.offset.reset": "earliest"})
    late = Consumer.create(cluster.agents, f"{group}-l", **{"auto.offset.reset": "latest"})
    never = Consumer.create(cluster.agents, f"{group}-n", **{"auto.offset.reset": "none"})
    for c in (early, late, never):
        c.assign(topic, 0)
    assert [r["offset"] for r in early.fetch(2000)] == [0, 1]
    assert late.fetch(0) == []
    r = never.fetch_raw(0)
    assert r.status_code == 409
    assert r.json()["error_code"] == 40903
    produce(cluster.agents[1], topic, [b"x2"], partition=0)
    assert [r["offset"] for r in late.fetch(2000)] == [2]
    # A committed offset wins over the policy.
    never.commit([{"topic": topic, "partition": 0, "offset": 0}])
    assert [r["offset"] for r in never.fetch(2000)] == [1, 2]


# -- offsets ---------------------------------------------------------------------------------


def test_commit_stores_offset_plus_one_and_empty_body_commits_fetched(
    cluster: Cluster, group: str, topic: str
) -> None:
    produce(cluster.agents[0], topic, [b"a", b"b", b"c"], partition=1)
    c = Consumer.create(
        cluster.agents,
        group,
        **{"auto.offset.reset": "earliest", "auto.commit.enable": "false"},
    )
    c.commit()  # nothing fetched yet: must not fail
    c.assign(topic, 1)
    c.commit([{"topic": topic, "partition": 1, "offset": 0, "metadata": "m"}])
    assert c.committed(topic, 0, 1) == {1: 1}
    r = c.call("GET", "/offsets", {"partitions": [{"topic": topic, "partition": 1}]})
    assert r.json() == {"offsets": [{"topic": topic, "partition": 1, "offset": 1, "metadata": "m"}]}
    c.commit([{"topic": topic, "partition": 1, "offset": 1}])
    assert c.committed(topic, 1) == {1: 2}
    # Positions follow the commit (no auto-commit): fetch from 2.
    c.call("POST", "/positions/beginning", {"partitions": [{"topic": topic, "partition": 1}]})
    assert len(c.fetch(2000)) == 3
    assert c.committed(topic, 1) == {1: 2}  # auto-commit is off
    c.commit()  # everything fetched so far
    assert c.committed(topic, 1) == {1: 3}
    r = c.call("GET", "/offsets")
    assert r.status_code == 404
    assert r.json() == {"error_code": 40402, "message": "Partition not found."}


def test_auto_commit_commits_what_earlier_fetches_returned(
    cluster: Cluster, group: str, topic: str
) -> None:
    """At-least-once, as Kafka's auto-commit: a fetch commits what the previous ones returned,
    so records a client never got back (a crash mid-response) are fetched again."""
    produce(cluster.agents[0], topic, [b"a", b"b"], partition=0)
    c = Consumer.create(cluster.agents, group, **{"auto.offset.reset": "earliest"})
    c.assign(topic, 0)
    assert len(c.fetch(2000)) == 2
    assert c.committed(topic, 0) == {0: 0}  # not yet past them: the client may not have them
    assert c.fetch(200) == []
    assert c.committed(topic, 0) == {0: 2}


# -- long-poll -------------------------------------------------------------------------------


def test_empty_fetch_waits_the_full_timeout(cluster: Cluster, group: str, topic: str) -> None:
    c = Consumer.create(cluster.agents, group)
    c.subscribe(topic)
    started = time.monotonic()
    assert c.fetch(1500) == []
    assert 1.4 <= time.monotonic() - started < 3.0


def test_instance_request_timeout_is_the_default_wait(
    cluster: Cluster, group: str, topic: str
) -> None:
    c = Consumer.create(cluster.agents, group, **{"consumer.request.timeout.ms": 1200})
    c.subscribe(topic)
    started = time.monotonic()
    assert c.fetch(None) == []
    assert 1.1 <= time.monotonic() - started < 3.0


@pytest.mark.parametrize("producer", [0, 1], ids=["same-agent", "other-agent"])
def test_fetch_returns_early_when_data_arrives(
    cluster: Cluster, group: str, topic: str, producer: int
) -> None:
    """A fetch waiting 10 s returns soon after a record is committed, whether through
    its own agent (woken by the write listener) or the other (high-watermark poller)."""
    c = Consumer.create(cluster.agents, group)
    c.assign(topic, 0)

    def later() -> None:
        time.sleep(0.5)
        produce(cluster.agents[producer], topic, [b"wake"], partition=0)

    t = threading.Thread(target=later)
    started = time.monotonic()
    t.start()
    records = c.fetch(10_000, agent=0)
    elapsed = time.monotonic() - started
    t.join()
    assert [unb64(r["value"]) for r in records] == [b"wake"]
    assert elapsed < 2.5


def test_fetch_min_bytes_waits_for_more(cluster: Cluster, group: str, topic: str) -> None:
    c = Consumer.create(cluster.agents, group, **{"fetch.min.bytes": 2000})
    c.assign(topic, 0)
    produce(cluster.agents[0], topic, [b"x" * 1000], partition=0)
    started = time.monotonic()
    assert len(c.fetch(1000)) == 1  # not enough bytes: waits the full timeout
    assert time.monotonic() - started >= 0.9
    produce(cluster.agents[0], topic, [b"y" * 1000, b"z" * 1000], partition=0)
    started = time.monotonic()
    assert len(c.fetch(5000)) == 2  # enough: at once
    assert time.monotonic() - started < 1.5


# -- expiry ----------------------------------------------------------------------------------


def test_idle_instance_expires(cluster: Cluster, group: str, topic: str) -> None:
    c = Consumer.create(cluster.agents, group, **{"consumer.instance.timeout.ms": 1000})
    c.subscribe(topic)
    time.sleep(0.6)
    assert c.call("GET", "/subscription").status_code == 200  # renews it
    time.sleep(0.6)
    assert c.call("GET", "/subscription").status_code == 200
    time.sleep(1.5)
    r = c.call("GET", "/subscription")
    assert r.status_code == 404
    assert r.json() == NOT_FOUND


# -- the read cache ---------------------------------------------------------------------------


def test_tailing_on_the_writing_agent_costs_no_gets(
    cluster: Cluster, group: str, topic: str
) -> None:
    a = cluster.agents[0]
    c = Consumer.create(cluster.agents, group)
    c.assign(topic, 0)
    c.fetch(0, agent=0)
    gets = metric(a, "lakelog_store_gets_total")
    hits = sum(
        float(line.split()[-1])
        for line in httpx.get(f"{a}/metrics").text.splitlines()
        if line.startswith('lakelog_read_cache_hits_total{budget="tail"}')
    )
    got = 0
    for i in range(5):
        produce(a, topic, [f"r{i}-{j}".encode() * 50 for j in range(20)], partition=0)
        got += len(c.fetch(2000, agent=0))
    assert got == 100
    assert metric(a, "lakelog_store_gets_total") == gets
    hits_after = sum(
        float(line.split()[-1])
        for line in httpx.get(f"{a}/metrics").text.splitlines()
        if line.startswith('lakelog_read_cache_hits_total{budget="tail"}')
    )
    assert hits_after >= hits + 5


# -- v3 views --------------------------------------------------------------------------------


def test_v3_consumer_group_views(cluster: Cluster, group: str, topic: str) -> None:
    produce(cluster.agents[0], topic, [b"a"] * 4, partition=0)
    produce(cluster.agents[0], topic, [b"b"] * 6, partition=1)
    c = Consumer.create(
        cluster.agents,
        group,
        name="viewer",
        **{"auto.offset.reset": "earliest", "auto.commit.enable": "false"},
    )
    c.subscribe(topic)
    c.commit(
        [
            {"topic": topic, "partition": 0, "offset": 0},
            {"topic": topic, "partition": 1, "offset": 1},
        ]
    )
    base = f"{cluster.agents[1]}/v3/clusters/{cluster.cluster_id}/consumer-groups"
    groups = httpx.get(base).json()
    assert groups["kind"] == "KafkaConsumerGroupList"
    assert group in [g["consumer_group_id"] for g in groups["data"]]
    g = httpx.get(f"{base}/{group}").json()
    assert g["kind"] == "KafkaConsumerGroup"
    assert g["state"] == "STABLE"
    assert g["is_simple"] is False
    assert g["partition_assignor"] == "range"
    assert g["consumers"] == {"related": f"{base}/{group}/consumers"}
    consumers = httpx.get(f"{base}/{group}/consumers").json()["data"]
    assert [(m["consumer_id"], m["instance_id"], m["client_id"]) for m in consumers] == [
        ("viewer", "viewer", "viewer")
    ]
    one = httpx.get(f"{base}/{group}/consumers/viewer").json()
    assert one["kind"] == "KafkaConsumer"
    assigned = httpx.get(f"{base}/{group}/consumers/viewer/assignments").json()["data"]
    assert sorted(a["partition_id"] for a in assigned) == [0, 1]
    lags = httpx.get(f"{base}/{group}/lags").json()["data"]
    assert [
        (lag["partition_id"], lag["current_offset"], lag["log_end_offset"], lag["lag"])
        for lag in lags
    ] == [
        (0, 1, 4, 3),
        (1, 2, 6, 4),
    ]
    lag1 = httpx.get(f"{base}/{group}/lags/{topic}/partitions/1").json()
    assert (lag1["kind"], lag1["lag"], lag1["consumer_id"]) == ("KafkaConsumerLag", 4, "viewer")
    summary = httpx.get(f"{base}/{group}/lag-summary").json()
    assert summary["kind"] == "KafkaConsumerGroupLagSummary"
    assert (summary["max_lag"], summary["total_lag"]) == (4, 7)
    assert (summary["max_lag_topic_name"], summary["max_lag_partition_id"]) == (topic, 1)
    assert summary["max_lag_consumer_id"] == "viewer"
    r = httpx.get(f"{base}/no-such-group-{uuid.uuid4().hex[:6]}")
    assert r.status_code == 404
    assert r.json()["error_code"] == 404  # kafka-rest v3: a plain NotFoundException


# -- CLI -------------------------------------------------------------------------------------


def test_console_consumer_prints_and_commits(cluster: Cluster, group: str, topic: str) -> None:
    """``lakelog consume`` prints key<TAB>value and commits what it printed: a second
    run in the same group continues after it."""
    r = request(
        "POST",
        f"{cluster.agents[0]}/topics/{topic}/partitions/0",
        {"records": [{"key": b64(b"k"), "value": b64(f"line-{i}".encode())} for i in range(5)]},
        content_type=BINARY,
    )
    assert r.status_code == 200, r.text

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = lakelog_cmd("consume", "--url", cluster.agents[1], "--topic", topic, *args)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)

    first = run("--group", group, "--from-beginning", "--max-messages", "3")
    assert first.stdout.splitlines() == ["k\tline-0", "k\tline-1", "k\tline-2"]
    assert "Processed a total of 3 messages" in first.stderr
    second = run("--group", group, "--timeout-ms", "1500", "--no-print-key")
    assert second.stdout.splitlines() == ["line-3", "line-4"]
