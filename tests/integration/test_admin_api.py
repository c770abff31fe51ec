"""The admin API over real processes: a coordinator and two agents on a moto S3 server.

Every write goes to one agent and is read back through the other: agents keep
no state of their own, so both must answer the same. Bodies and status codes
are compared exactly (REST-API.md §2 and §3, the v3 OpenAPI shapes).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from coordinator.http.client import http_coordinator
from coordinator.log.topic_configs import CONFIG_DEFS, effective_configs
from index.log import LogWriter
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.types import Record
from tests.integration.conftest import Cluster
from tests.procs import lakelog_cmd

pytestmark = pytest.mark.integration

V2 = "application/vnd.kafka.v2+json"
JSON = dict[str, Any]


def not_hosted(topic: str) -> JSON:
    """v3's answer for an unknown topic: kafka-rest's code and text, then which topic."""
    return {
        "error_code": 40403,
        "message": f"This server does not host this topic-partition. Topic '{topic}' not found.",
    }


@pytest.fixture(scope="module")
def cluster(lakelog_cluster: Cluster) -> Cluster:
    return lakelog_cluster


@pytest.fixture(scope="module")
def a(cluster: Cluster) -> Iterator[httpx.Client]:
    """A client of agent A."""
    with httpx.Client(base_url=cluster.agents[0], timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def b(cluster: Cluster) -> Iterator[httpx.Client]:
    """A client of agent B."""
    with httpx.Client(base_url=cluster.agents[1], timeout=10) as c:
        yield c


def v3(cluster: Cluster, suffix: str = "") -> str:
    return f"/v3/clusters/{cluster.cluster_id}{suffix}"


def create(client: httpx.Client, cluster: Cluster, name: str, **fields: Any) -> httpx.Response:
    r = client.post(v3(cluster, "/topics"), json={"topic_name": name, **fields})
    assert r.status_code in (200, 201), r.text
    return r


def topic_body(base: str, cid: str, name: str, partitions: int) -> JSON:
    t = f"{base}/v3/clusters/{cid}/topics/{name}"
    return {
        "kind": "KafkaTopic",
        "metadata": {"self": t, "resource_name": f"crn:///kafka={cid}/topic={name}"},
        "cluster_id": cid,
        "topic_name": name,
        "is_internal": False,
        "replication_factor": 1,
        "partitions_count": partitions,
        "partitions": {"related": f"{t}/partitions"},
        "configs": {"related": f"{t}/configs"},
        "partition_reassignments": {"related": f"{t}/partitions/-/reassignment"},
    }


def config_body(base: str, cid: str, topic: str, name: str, value: str, override: bool) -> JSON:
    source = "DYNAMIC_TOPIC_CONFIG" if override else "DEFAULT_CONFIG"
    synonyms = [{"name": name, "value": value, "source": source}]
    if override:
        synonyms.append(
            {"name": name, "value": CONFIG_DEFS[name].default, "source": "DEFAULT_CONFIG"}
        )
    return {
        "kind": "KafkaTopicConfig",
        "metadata": {
            "self": f"{base}/v3/clusters/{cid}/topics/{topic}/configs/{name}",
            "resource_name": f"crn:///kafka={cid}/topic={topic}/config={name}",
        },
        "cluster_id": cid,
        "topic_name": topic,
        "name": name,
        "value": value,
        "is_default": not override,
        "is_read_only": False,
        "is_sensitive": False,
        "source": source,
        "synonyms": synonyms,
    }


def write_records(cluster: Cluster, topic: str, partition: int, count: int) -> list[int]:
    """Commit ``count`` records straight through the storage API (not the produce routes)."""
    coordinator = http_coordinator(cluster.coordinator_url)
    store = open_store(cluster.store_url, endpoint_url=cluster.store_endpoint)
    try:
        info = coordinator.get_topic(topic)
        builder = SegmentBuilder()
        now = int(time.time() * 1000)
        builder.append(
            info.topic_id, partition, [Record(None, b"v%d" % i, now) for i in range(count)]
        )
        return LogWriter(store, coordinator).write(builder).base_offsets
    finally:
        store.close()
        coordinator.close()


# -- clusters and brokers ------------------------------------------------------------


def test_clusters_list_and_get(cluster: Cluster, a: httpx.Client, b: httpx.Client) -> None:
    cid = cluster.cluster_id
    assert len(cid) == 22
    for client, base in ((a, cluster.agents[0]), (b, cluster.agents[1])):
        c = f"{base}/v3/clusters/{cid}"
        broker_ids = client.get("/brokers").json()["brokers"]
        expected = {
            "kind": "KafkaCluster",
            "metadata": {"self": c, "resource_name": f"crn:///kafka={cid}"},
            "cluster_id": cid,
            "controller": {"related": f"{c}/brokers/{min(broker_ids)}"},
            "acls": {"related": f"{c}/acls"},
            "brokers": {"related": f"{c}/brokers"},
            "broker_configs": {"related": f"{c}/broker-configs"},
            "consumer_groups": {"related": f"{c}/consumer-groups"},
            "topics": {"related": f"{c}/topics"},
            "partition_reassignments": {"related": f"{c}/topics/-/partitions/-/reassignment"},
        }
        r = client.get("/v3/clusters")
        assert (r.status_code, r.headers["content-type"]) == (200, "application/json")
        assert r.json() == {
            "kind": "KafkaClusterList",
            "metadata": {"self": f"{base}/v3/clusters", "next": None},
            "data": [expected],
        }
        assert client.get(f"/v3/clusters/{cid}").json() == expected


def test_brokers_are_the_live_agents(cluster: Cluster, a: httpx.Client, b: httpx.Client) -> None:
    cid = cluster.cluster_id
    r = a.get("/brokers")
    assert (r.status_code, r.headers["content-type"]) == (200, V2)
    ids = r.json()["brokers"]
    assert len(ids) == 2 and ids == sorted(ids)
    assert b.get("/brokers").json() == {"brokers": ids}

    data = b.get(v3(cluster, "/brokers")).json()
    base = f"{cluster.agents[1]}/v3/clusters/{cid}"
    assert data["kind"] == "KafkaBrokerList"
    assert data["metadata"] == {"self": f"{base}/brokers", "next": None}
    assert [d["broker_id"] for d in data["data"]] == ids
    ports = sorted(int(u.rsplit(":", 1)[1]) for u in cluster.agents)
    assert sorted(d["port"] for d in data["data"]) == ports
    first = data["data"][0]
    assert first == {
        "kind": "KafkaBroker",
        "metadata": {
            "self": f"{base}/brokers/{ids[0]}",
            "resource_name": f"crn:///kafka={cid}/broker={ids[0]}",
        },
        "cluster_id": cid,
        "broker_id": ids[0],
        "host": "127.0.0.1",
        "port": first["port"],
        "rack": None,
        "configs": {"related": f"{base}/brokers/{ids[0]}/configs"},
        "partition_replicas": {"related": f"{base}/brokers/{ids[0]}/partition-replicas"},
    }
    assert b.get(v3(cluster, f"/brokers/{ids[0]}")).json() == first
    r = a.get(v3(cluster, "/brokers/999"))
    assert (r.status_code, r.json()) == (
        404,
        {"error_code": 404, "message": "Broker 999 cannot be found."},
    )


# -- topics --------------------------------------------------------------------------


def test_topic_lifecycle_across_agents(
    cluster: Cluster, a: httpx.Client, b: httpx.Client, unique_topic: Callable[[str], str]
) -> None:
    cid, base_a, base_b = cluster.cluster_id, cluster.agents[0], cluster.agents[1]
    name = unique_topic("life")
    r = a.post(
        v3(cluster, "/topics"),
        json={
            "topic_name": name,
            "partitions_count": 3,
            "replication_factor": 3,
            "configs": [{"name": "cleanup.policy", "value": "compact"}],
        },
    )
    assert r.status_code == 201
    assert r.headers["location"] == f"{base_a}/v3/clusters/{cid}/topics/{name}"
    # The replication factor in force (1: the store keeps the copies), as every GET says.
    assert r.json() == topic_body(base_a, cid, name, 3)

    # Agent B sees it at once, without having cached anything.
    r = b.get(v3(cluster, f"/topics/{name}"))
    assert (r.status_code, r.json()) == (200, topic_body(base_b, cid, name, 3))
    listed = b.get(v3(cluster, "/topics")).json()
    assert listed["kind"] == "KafkaTopicList"
    assert listed["metadata"] == {"self": f"{base_b}/v3/clusters/{cid}/topics", "next": None}
    assert topic_body(base_b, cid, name, 3) in listed["data"]
    assert name in b.get("/topics").json()

    # Grow on B, read on A.
    r = b.patch(v3(cluster, f"/topics/{name}"), json={"partitions_count": 5})
    assert (r.status_code, r.json()) == (200, topic_body(base_b, cid, name, 5))
    assert a.get(v3(cluster, f"/topics/{name}")).json()["partitions_count"] == 5
    assert len(a.get(f"/topics/{name}/partitions").json()) == 5
    for count in (5, 2):
        r = a.patch(v3(cluster, f"/topics/{name}"), json={"partitions_count": count})
        assert (r.status_code, r.json()) == (
            400,
            {"error_code": 40002, "message": "Topic already has 5 partitions."},
        )

    # Delete on A; gone on B, in v3 and v2 alike.
    r = a.delete(v3(cluster, f"/topics/{name}"))
    assert (r.status_code, r.content) == (204, b"")
    r = b.get(v3(cluster, f"/topics/{name}"))
    assert (r.status_code, r.json()) == (404, not_hosted(name))
    r = b.get(f"/topics/{name}")
    assert (r.status_code, r.headers["content-type"]) == (404, V2)
    assert r.json() == {"error_code": 40401, "message": f"Topic '{name}' not found."}
    assert name not in b.get("/topics").json()
    r = b.delete(v3(cluster, f"/topics/{name}"))
    assert (r.status_code, r.json()) == (404, not_hosted(name))


def test_create_defaults_to_one_partition(
    cluster: Cluster, a: httpx.Client, unique_topic: Callable[[str], str]
) -> None:
    name = unique_topic("dflt")
    r = create(a, cluster, name)
    assert r.json() == topic_body(cluster.agents[0], cluster.cluster_id, name, 1)


def test_validate_only_creates_nothing(
    cluster: Cluster, a: httpx.Client, b: httpx.Client, unique_topic: Callable[[str], str]
) -> None:
    name = unique_topic("dry")
    r = a.post(
        v3(cluster, "/topics"),
        json={"topic_name": name, "partitions_count": 4, "validate_only": True},
    )
    assert r.status_code == 200
    assert "location" not in r.headers
    assert r.json() == topic_body(cluster.agents[0], cluster.cluster_id, name, 4)
    r = b.get(v3(cluster, f"/topics/{name}"))
    assert (r.status_code, r.json()) == (404, not_hosted(name))
    assert name not in b.get("/topics").json()
    # A dry run still validates.
    r = a.post(
        v3(cluster, "/topics"),
        json={"topic_name": name, "partitions_count": 0, "validate_only": True},
    )
    assert r.status_code == 400 and r.json()["error_code"] == 40002


def test_create_errors(
    cluster: Cluster, a: httpx.Client, b: httpx.Client, unique_topic: Callable[[str], str]
) -> None:
    topics = v3(cluster, "/topics")
    name = unique_topic("dup")
    create(a, cluster, name)
    r = b.post(topics, json={"topic_name": name})
    assert (r.status_code, r.json()) == (
        400,
        {"error_code": 40002, "message": f"Topic '{name}' already exists."},
    )
    for bad in ("a b", "", "..", "x" * 250, "ü"):
        r = a.post(topics, json={"topic_name": bad})
        assert (r.status_code, r.json()) == (
            422,
            {"error_code": 42206, "message": "Invalid topic name."},
        ), bad

    other = unique_topic("badcfg")
    r = a.post(
        topics,
        json={"topic_name": other, "configs": [{"name": "retention.ms", "value": "soon"}]},
    )
    assert (r.status_code, r.json()) == (
        400,
        {
            "error_code": 40002,
            "message": "Invalid value soon for configuration retention.ms: "
            "Not a number of type LONG",
        },
    )
    r = a.post(topics, json={"topic_name": other, "configs": [{"name": "no.such", "value": "1"}]})
    assert (r.status_code, r.json()) == (
        400,
        {"error_code": 40002, "message": "Unknown topic config name: no.such"},
    )
    assert b.get(v3(cluster, f"/topics/{other}")).status_code == 404  # nothing created

    r = a.post(topics, json={"topic_name": other, "replication_factor": 0})
    assert (r.status_code, r.json()) == (
        400,
        {"error_code": 40002, "message": "Replication factor must be larger than 0."},
    )
    r = a.post(topics, content=b'{"topic_name": ', headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (
        400,
        {"error_code": 400, "message": "Bad Request: malformed JSON."},
    )
    empty = {
        "error_code": 42206,
        "message": "Payload error. Request body is empty. Data is required.",
    }
    r = a.post(topics, headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (422, empty)
    r = a.patch(v3(cluster, f"/topics/{name}"), headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (422, empty)


def test_unknown_cluster_id_is_404_everywhere(
    cluster: Cluster, a: httpx.Client, unique_topic: Callable[[str], str]
) -> None:
    name = unique_topic("cl")
    create(a, cluster, name)
    body = {"error_code": 404, "message": "Cluster nope cannot be found."}
    calls: list[tuple[str, str, JSON | str | None]] = [
        ("GET", "", None),
        ("GET", "/brokers", None),
        ("GET", "/topics", None),
        ("POST", "/topics", {"topic_name": unique_topic("never")}),
        ("GET", f"/topics/{name}", None),
        ("PATCH", f"/topics/{name}", {"partitions_count": 9}),
        ("DELETE", f"/topics/{name}", None),
        ("GET", f"/topics/{name}/configs", None),
        ("GET", "/topics/-/configs", None),
        ("PUT", f"/topics/{name}/configs/retention.ms", {"value": "1"}),
        ("POST", f"/topics/{name}/configs:alter", {"data": []}),
        ("GET", f"/topics/{name}/partitions", None),
        ("GET", f"/topics/{name}/partitions/0/offset", None),
        # Produce too (kafka-rest skips the check there; the issue asks for it).
        ("POST", f"/topics/{name}/records", {"value": {"type": "STRING", "data": "x"}}),
        ("POST", f"/topics/{name}/records:batch", {"entries": [{"id": "1"}]}),
        ("GET", "/broker-configs", None),
        ("PUT", "/broker-configs/log.retention.ms", {"value": "1"}),
        ("GET", "/brokers/-/configs", None),
        ("GET", "/consumer-groups", None),
        ("DELETE", "/consumer-groups/g", None),
        ("GET", "/acls", None),
        # Before the body is read or the method checked: garbage, a method no route has.
        ("POST", f"/topics/{name}/configs:alter", "{not json"),
        ("DELETE", "/brokers", None),
        ("OPTIONS", "/topics", None),
        ("GET", "/no/such/route", None),
    ]
    for method, suffix, payload in calls:
        url = f"/v3/clusters/nope{suffix}"
        if isinstance(payload, str):
            r = a.request(method, url, content=payload)
        else:
            r = a.request(method, url, json=payload)
        assert (r.status_code, r.json()) == (404, body), (method, suffix)
    assert a.get(v3(cluster, f"/topics/{name}/partitions/0/offset")).json()["latest_offset"] == 0
    # Nothing above changed the topic.
    assert a.get(v3(cluster, f"/topics/{name}")).json()["partitions_count"] == 1


# -- configs -------------------------------------------------------------------------


def test_configs_list_get_set_reset(
    cluster: Cluster, a: httpx.Client, b: httpx.Client, unique_topic: Callable[[str], str]
) -> None:
    cid, base_a, base_b = cluster.cluster_id, cluster.agents[0], cluster.agents[1]
    name = unique_topic("cfg")
    create(a, cluster, name, configs=[{"name": "cleanup.policy", "value": "compact"}])
    configs = f"/topics/{name}/configs"

    listed = b.get(v3(cluster, configs)).json()
    assert listed["kind"] == "KafkaTopicConfigList"
    assert listed["metadata"] == {"self": f"{base_b}/v3/clusters/{cid}{configs}", "next": None}
    assert [c["name"] for c in listed["data"]] == sorted(CONFIG_DEFS)
    by_name = {c["name"]: c for c in listed["data"]}
    assert by_name["cleanup.policy"] == config_body(
        base_b, cid, name, "cleanup.policy", "compact", override=True
    )
    assert by_name["retention.ms"] == config_body(
        base_b, cid, name, "retention.ms", "604800000", override=False
    )

    # PUT on A, read on B.
    r = a.put(v3(cluster, f"{configs}/retention.ms"), json={"value": "3600000"})
    assert (r.status_code, r.content) == (204, b"")
    r = b.get(v3(cluster, f"{configs}/retention.ms"))
    assert r.json() == config_body(base_b, cid, name, "retention.ms", "3600000", override=True)

    # Reset on B, read on A.
    r = b.delete(v3(cluster, f"{configs}/retention.ms"))
    assert (r.status_code, r.content) == (204, b"")
    r = a.get(v3(cluster, f"{configs}/retention.ms"))
    assert r.json() == config_body(base_a, cid, name, "retention.ms", "604800000", override=False)

    # A bad value changes nothing.
    r = a.put(v3(cluster, f"{configs}/retention.ms"), json={"value": "-5"})
    assert (r.status_code, r.json()) == (
        400,
        {
            "error_code": 40002,
            "message": "Invalid value -5 for configuration retention.ms: Value must be at least -1",
        },
    )
    assert b.get(v3(cluster, f"{configs}/retention.ms")).json()["is_default"] is True

    r = a.get(v3(cluster, f"{configs}/no.such.config"))
    assert (r.status_code, r.json()) == (
        404,
        {
            "error_code": 404,
            "message": f"Config no.such.config cannot be found for topic {name} in cluster {cid}.",
        },
    )
    r = a.put(v3(cluster, f"{configs}/no.such.config"), json={"value": "1"})
    assert r.status_code == 404 and r.json()["error_code"] == 404
    r = a.get(v3(cluster, "/topics/missing-topic-x/configs"))
    assert (r.status_code, r.json()) == (404, not_hosted("missing-topic-x"))


def test_configs_alter_batch(
    cluster: Cluster, a: httpx.Client, b: httpx.Client, unique_topic: Callable[[str], str]
) -> None:
    cid, base_b = cluster.cluster_id, cluster.agents[1]
    name = unique_topic("alter")
    create(a, cluster, name, configs=[{"name": "cleanup.policy", "value": "compact"}])
    alter = v3(cluster, f"/topics/{name}/configs:alter")

    def overrides() -> dict[str, str]:
        data = b.get(v3(cluster, f"/topics/{name}/configs")).json()["data"]
        return {c["name"]: c["value"] for c in data if not c["is_default"]}

    batch = {
        "data": [
            {"name": "cleanup.policy", "operation": "DELETE"},
            {"name": "compression.type", "value": "gzip"},
            {"name": "retention.bytes", "value": "1048576", "operation": "SET"},
        ]
    }
    r = a.post(alter, json={**batch, "validate_only": True})
    assert (r.status_code, r.content) == (204, b"")
    assert overrides() == {"cleanup.policy": "compact"}  # a dry run changes nothing

    r = a.post(alter, json=batch)
    assert (r.status_code, r.content) == (204, b"")
    assert overrides() == {"compression.type": "gzip", "retention.bytes": "1048576"}
    r = b.get(v3(cluster, f"/topics/{name}/configs/compression.type"))
    assert r.json() == config_body(base_b, cid, name, "compression.type", "gzip", override=True)

    # One bad entry fails the whole batch.
    r = a.post(
        alter,
        json={
            "data": [
                {"name": "retention.ms", "value": "1000"},
                {"name": "compression.type", "value": "brotli"},
            ]
        },
    )
    assert (r.status_code, r.json()["error_code"]) == (400, 40002)
    assert overrides() == {"compression.type": "gzip", "retention.bytes": "1048576"}

    # All topics' configs in one list include this topic's, with the overrides.
    every = b.get(v3(cluster, "/topics/-/configs")).json()
    assert every["metadata"]["self"] == f"{base_b}/v3/clusters/{cid}/topics/-/configs"
    mine = {c["name"]: c for c in every["data"] if c["topic_name"] == name}
    assert len(mine) == len(CONFIG_DEFS)
    assert mine["compression.type"]["value"] == "gzip"
    assert mine["compression.type"]["source"] == "DYNAMIC_TOPIC_CONFIG"


# -- partitions and offsets ----------------------------------------------------------


def test_partitions_and_offsets(
    cluster: Cluster, a: httpx.Client, b: httpx.Client, unique_topic: Callable[[str], str]
) -> None:
    cid, base_b = cluster.cluster_id, cluster.agents[1]
    name = unique_topic("parts")
    create(a, cluster, name, partitions_count=3)
    assert write_records(cluster, name, 1, 5) == [0]
    assert write_records(cluster, name, 1, 2) == [5]

    ids = b.get("/brokers").json()["brokers"]
    t = f"{base_b}/v3/clusters/{cid}/topics/{name}"
    listed = b.get(v3(cluster, f"/topics/{name}/partitions")).json()
    assert listed["kind"] == "KafkaPartitionList"
    assert listed["metadata"] == {"self": f"{t}/partitions", "next": None}
    assert [p["partition_id"] for p in listed["data"]] == [0, 1, 2]
    leader = ids[1 % len(ids)]
    expected = {
        "kind": "KafkaPartition",
        "metadata": {
            "self": f"{t}/partitions/1",
            "resource_name": f"crn:///kafka={cid}/topic={name}/partition=1",
        },
        "cluster_id": cid,
        "topic_name": name,
        "partition_id": 1,
        "leader": {"related": f"{t}/partitions/1/replicas/{leader}"},
        "replicas": {"related": f"{t}/partitions/1/replicas"},
        "reassignment": {"related": f"{t}/partitions/1/reassignment"},
    }
    assert listed["data"][1] == expected
    assert b.get(v3(cluster, f"/topics/{name}/partitions/1")).json() == expected

    r = b.get(v3(cluster, f"/topics/{name}/partitions/1/offset"))
    assert (r.status_code, r.json()) == (
        200,
        {
            "kind": "KafkaPartitionWithOffsets",
            "metadata": {
                "self": f"{t}/partitions/1/offset",
                "resource_name": f"crn:///kafka={cid}/topic={name}/partition=1/offset",
            },
            "cluster_id": cid,
            "topic_name": name,
            "partition_id": 1,
            "earliest_offset": 0,
            "latest_offset": 7,
        },
    )
    r = a.get(v3(cluster, f"/topics/{name}/partitions/0/offset?offset_type=earliest_and_latest"))
    assert (r.json()["earliest_offset"], r.json()["latest_offset"]) == (0, 0)
    r = a.get(v3(cluster, f"/topics/{name}/partitions/1/offset?offset_type=latest"))
    assert (r.status_code, r.json()) == (
        400,
        {
            "error_code": 400,
            "message": "Bad Request: offset_type must be earliest_and_latest, got 'latest'.",
        },
    )

    def not_found(partition: int) -> JSON:
        message = f"Partition {partition} of topic '{name}' not found."
        return {"error_code": 40402, "message": message}

    for suffix, p in (("/partitions/3", 3), ("/partitions/3/offset", 3), ("/partitions/-1", -1)):
        r = a.get(v3(cluster, f"/topics/{name}{suffix}"))
        assert (r.status_code, r.json()) == (404, not_found(p)), suffix
    r = a.get(v3(cluster, f"/topics/{name}/partitions/one"))
    assert (r.status_code, r.json()) == (404, {"error_code": 404, "message": "HTTP 404 Not Found"})
    r = a.get(v3(cluster, "/topics/missing-topic-y/partitions/0/offset"))
    assert (r.status_code, r.json()) == (404, not_hosted("missing-topic-y"))

    # v2 views of the same partitions, on the other agent.
    r = a.get(f"/topics/{name}/partitions/1/offsets")
    assert (r.status_code, r.headers["content-type"]) == (200, V2)
    assert r.json() == {"beginning_offset": 0, "end_offset": 7}
    assert a.get(f"/topics/{name}/partitions/2/offsets").json() == {
        "beginning_offset": 0,
        "end_offset": 0,
    }
    replica = {
        "partition": 1,
        "leader": leader,
        "replicas": [{"broker": leader, "leader": True, "in_sync": True}],
    }
    assert a.get(f"/topics/{name}/partitions/1").json() == replica
    assert a.get(f"/topics/{name}/partitions").json()[1] == replica
    for path in (f"/topics/{name}/partitions/3", f"/topics/{name}/partitions/3/offsets"):
        r = a.get(path)
        assert (r.status_code, r.headers["content-type"]) == (404, V2)
        assert r.json() == not_found(3)
    for path in (f"/topics/{name}/partitions/x", f"/topics/{name}/partitions/x/offsets"):
        r = a.get(path)
        assert (r.status_code, r.json()) == (
            404,
            {"error_code": 404, "message": "HTTP 404 Not Found"},
        )
    missing = {"error_code": 40401, "message": "Topic 'missing-z' not found."}
    for path in ("/topics/missing-z/partitions", "/topics/missing-z/partitions/0/offsets"):
        assert (a.get(path).status_code, a.get(path).json()) == (404, missing)


def test_v2_metadata_shapes(
    cluster: Cluster, a: httpx.Client, b: httpx.Client, unique_topic: Callable[[str], str]
) -> None:
    for r in (a.get("/"), a.post("/")):
        assert (r.status_code, r.headers["content-type"], r.json()) == (200, V2, {})
    name = unique_topic("v2")
    create(
        a, cluster, name, partitions_count=2, configs=[{"name": "retention.ms", "value": "1000"}]
    )
    r = b.get("/topics")
    assert (r.status_code, r.headers["content-type"]) == (200, V2)
    names = r.json()
    assert name in names and names == sorted(names)
    ids = b.get("/brokers").json()["brokers"]
    r = b.get(f"/topics/{name}")
    assert (r.status_code, r.headers["content-type"]) == (200, V2)
    assert r.json() == {
        "name": name,
        "configs": effective_configs({"retention.ms": "1000"}),
        "partitions": [
            {
                "partition": p,
                "leader": ids[p % len(ids)],
                "replicas": [{"broker": ids[p % len(ids)], "leader": True, "in_sync": True}],
            }
            for p in range(2)
        ],
    }
    assert r.json()["configs"]["retention.ms"] == "1000"
    assert r.json()["configs"]["cleanup.policy"] == "delete"


def test_health_metrics_and_docs(a: httpx.Client) -> None:
    r = a.get("/health")
    assert r.status_code == 200
    assert r.json()["status"] == "ok" and r.json()["brokers"] == 2
    r = a.get("/metrics")
    assert r.status_code == 200 and "lakelog_" in r.text
    assert a.get("/docs").status_code == 200
    paths = a.get("/openapi.json").json()["paths"]
    assert "/v3/clusters/{cluster_id}/topics/{topic_name}/configs:alter" in paths


# -- the CLI -------------------------------------------------------------------------


def lakelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lakelog_cmd(*args), capture_output=True, text=True, timeout=30)


def test_cli_topics_round_trip(
    cluster: Cluster, b: httpx.Client, unique_topic: Callable[[str], str]
) -> None:
    url = cluster.agents[0]
    name = unique_topic("cli")
    out = lakelog("topics", "create", name, "-p", "2", "-c", "cleanup.policy=compact", "--url", url)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"Created topic {name}.\n", "")
    assert b.get(v3(cluster, f"/topics/{name}")).json()["partitions_count"] == 2

    out = lakelog("topics", "list", "--url", url)
    assert out.returncode == 0 and name in out.stdout.splitlines()

    out = lakelog(
        "topics", "alter-config", name, "--set", "retention.ms=1000",
        "--delete", "cleanup.policy", "--url", url,
    )  # fmt: skip
    assert (out.returncode, out.stdout) == (0, f"Completed updating config for topic {name}.\n")

    # kafka-configs' words: a comma-separated list, a bracketed value kept whole.
    out = lakelog(
        "topics", "alter-config", name,
        "--add-config", "cleanup.policy=[compact,delete],max.message.bytes=2000",
        "--url", url,
    )  # fmt: skip
    assert (out.returncode, out.stderr) == (0, ""), out.stderr
    configs = {c["name"]: c for c in b.get(v3(cluster, f"/topics/{name}/configs")).json()["data"]}
    assert configs["cleanup.policy"]["value"] == "compact,delete"
    assert configs["max.message.bytes"]["value"] == "2000"
    out = lakelog(
        "topics", "alter-config", name, "--delete-config", "cleanup.policy,max.message.bytes",
        "--url", url,
    )  # fmt: skip
    assert (out.returncode, out.stdout) == (0, f"Completed updating config for topic {name}.\n")

    ids = b.get("/brokers").json()["brokers"]
    out = lakelog("topics", "describe", name, "--url", url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"Topic: {name}\tPartitionCount: 2\tReplicationFactor: 1\tConfigs: retention.ms=1000",
        *(
            f"\tTopic: {name}\tPartition: {p}\tLeader: {ids[p % len(ids)]}\t"
            f"Replicas: {ids[p % len(ids)]}\tIsr: {ids[p % len(ids)]}\t"
            "LogStartOffset: 0\tHighWatermark: 0"
            for p in range(2)
        ),
    ]

    out = lakelog("topics", "create", name, "--url", url)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == f"Error: Topic '{name}' already exists.\n"

    out = lakelog("topics", "delete", name, "--url", url)
    assert (out.returncode, out.stdout) == (0, f"Deleted topic {name}.\n")
    assert b.get(v3(cluster, f"/topics/{name}")).status_code == 404
    out = lakelog("topics", "describe", name, "--url", url)
    assert out.returncode == 1
    assert out.stderr == (
        f"Error: This server does not host this topic-partition. Topic '{name}' not found.\n"
    )


# -- the produce path's topic cache ----------------------------------------------------


def test_topic_cache_get_or_create(cluster: Cluster, unique_topic: Callable[[str], str]) -> None:
    """Race: 8 concurrent first produces auto-create one topic; all get the same topic back.

    The losers of the create race see TopicExistsError and must fall back to reading
    the winner's topic (same id, default partition count), never fail.
    """
    import asyncio

    from segments.errors import TopicNotFoundError
    from service.produce.topic_cache import TopicCache

    coordinator = http_coordinator(cluster.coordinator_url)
    try:
        off = TopicCache(coordinator, ttl_s=60, auto_create=False)
        on = TopicCache(coordinator, ttl_s=60, auto_create=True, default_partitions=3)
        name = unique_topic("auto")

        async def scenario() -> None:
            with pytest.raises(TopicNotFoundError):
                await off.get_or_create(name)
            with pytest.raises(TopicNotFoundError):
                await off.get(name)  # a miss is not cached: the create below is seen at once
            infos = await asyncio.gather(*(on.get_or_create(name) for _ in range(8)))
            assert {(i.topic_id, i.partitions) for i in infos} == {(infos[0].topic_id, 3)}
            assert (await off.get(name)).topic_id == infos[0].topic_id

            # Hits are cached for ttl_s: a deleted topic stays visible until invalidated.
            coordinator.delete_topic(name)
            assert (await off.get(name)).topic_id == infos[0].topic_id
            off.invalidate(name)
            with pytest.raises(TopicNotFoundError):
                await off.get(name)

        asyncio.run(scenario())
    finally:
        coordinator.close()


# -- failure modes ---------------------------------------------------------------------


def test_health_is_503_and_admin_is_retriable_while_the_coordinator_is_down(
    cluster_factory: Callable[..., Cluster],
) -> None:
    private = cluster_factory(agents=1)
    url = private.agents[0]
    assert httpx.get(f"{url}/health").status_code == 200
    private.coordinator_proc.stop()
    r = httpx.get(f"{url}/health")
    assert r.status_code == 503
    assert r.json()["status"] == "unavailable"
    r = httpx.get(f"{url}/v3/clusters/{private.cluster_id}/topics")
    assert r.status_code == 500 and r.json()["error_code"] == 50003  # retriable
    r = httpx.get(f"{url}/topics")
    assert (r.status_code, r.headers["content-type"]) == (500, V2)
    assert r.json()["error_code"] == 50003


def test_bad_settings_fail_at_start_up_with_a_clear_message() -> None:
    out = lakelog("agent", "--coordinator", "http://127.0.0.1:1", "--port", "70000")
    assert out.returncode == 2
    assert out.stderr == (
        "Error: invalid settings: port: Input should be less than or equal to 65535\n"
    )
    out = lakelog("agent", "--store", "memory://")
    assert out.returncode == 1
    assert "needs --coordinator" in out.stderr
