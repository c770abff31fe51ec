"""v3 broker configs over real processes (a private cluster: these configs are cluster-wide).

Cluster-wide dynamic broker configs are kept by the coordinator and inherited by every
topic without an override; bodies are compared exactly.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from coordinator.log.topic_configs import BROKER_CONFIG_DEFS
from tests.integration.conftest import Cluster, ClusterFactory, create_topic

pytestmark = pytest.mark.integration

JSON = dict[str, Any]
DYNAMIC = "DYNAMIC_DEFAULT_BROKER_CONFIG"


@pytest.fixture
def cluster(cluster_factory: ClusterFactory) -> Cluster:
    return cluster_factory(agents=1)


@pytest.fixture
def a(cluster: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.agents[0], timeout=10) as c:
        yield c


def cluster_config(base: str, cid: str, name: str, value: str, default: str) -> JSON:
    url = f"{base}/v3/clusters/{cid}/broker-configs/{name}"
    return {
        "kind": "KafkaClusterConfig",
        "metadata": {"self": url, "resource_name": f"crn:///kafka={cid}/broker-config={name}"},
        "cluster_id": cid,
        "config_type": "BROKER",
        "name": name,
        "value": value,
        "is_default": False,
        "is_read_only": False,
        "is_sensitive": False,
        "source": "DYNAMIC_DEFAULT_BROKER_CONFIG",
        "synonyms": [
            {"name": name, "value": value, "source": "DYNAMIC_DEFAULT_BROKER_CONFIG"},
            {"name": name, "value": default, "source": "DEFAULT_CONFIG"},
        ],
    }


def test_cluster_wide_configs_and_what_topics_inherit(
    cluster: Cluster, a: httpx.Client, unique_topic: Callable[[str], str]
) -> None:
    cid, base = cluster.cluster_id, cluster.agents[0]
    v3 = f"/v3/clusters/{cid}"
    empty = a.get(f"{v3}/broker-configs")
    assert empty.status_code == 200
    assert empty.json() == {
        "kind": "KafkaClusterConfigList",
        "metadata": {"self": f"{base}{v3}/broker-configs", "next": None},
        "data": [],
    }
    assert a.get(f"{v3}/broker-configs/log.retention.ms").status_code == 404

    r = a.put(f"{v3}/broker-configs/log.retention.ms", json={"value": " 3600000 "})
    assert r.status_code == 204, r.text
    retention = cluster_config(base, cid, "log.retention.ms", "3600000", "604800000")
    assert a.get(f"{v3}/broker-configs").json()["data"] == [retention]
    assert a.get(f"{v3}/broker-configs/log.retention.ms").json() == retention

    # A topic without an override inherits it; one with an override keeps its own.
    plain, own = unique_topic("inherits"), unique_topic("own")
    create_topic(cluster, plain, 1)
    create_topic(cluster, own, 1, {"retention.ms": "1000"})
    inherited = a.get(f"{v3}/topics/{plain}/configs/retention.ms").json()
    assert {k: inherited[k] for k in ("value", "is_default", "source", "synonyms")} == {
        "value": "3600000",
        "is_default": False,
        "source": "DYNAMIC_DEFAULT_BROKER_CONFIG",
        "synonyms": [
            {"name": "log.retention.ms", "value": "3600000", "source": DYNAMIC},
            {"name": "retention.ms", "value": "604800000", "source": "DEFAULT_CONFIG"},
        ],
    }  # fmt: skip
    overridden = a.get(f"{v3}/topics/{own}/configs/retention.ms").json()
    assert [s["source"] for s in overridden["synonyms"]] == [
        "DYNAMIC_TOPIC_CONFIG",
        "DYNAMIC_DEFAULT_BROKER_CONFIG",
        "DEFAULT_CONFIG",
    ]
    assert overridden["value"] == "1000"
    assert a.get(f"/topics/{plain}").json()["configs"]["retention.ms"] == "3600000"  # v2

    # :alter, first as a dry run: nothing changes.
    batch = {
        "data": [
            {"name": "message.max.bytes", "value": "2000"},
            {"name": "log.retention.ms", "operation": "DELETE"},
        ]
    }
    r = a.post(f"{v3}/broker-configs:alter", json={**batch, "validate_only": True})
    assert r.status_code == 204, r.text
    assert [c["name"] for c in a.get(f"{v3}/broker-configs").json()["data"]] == ["log.retention.ms"]
    r = a.post(f"{v3}/broker-configs:alter", json=batch)
    assert r.status_code == 204, r.text
    assert a.get(f"{v3}/broker-configs").json()["data"] == [
        cluster_config(base, cid, "message.max.bytes", "2000", "1048588")
    ]
    # The agent applies the inherited limit at once: a 3,000-byte record is refused.
    value = base64.b64encode(b"x" * 3000).decode()
    r = a.post(
        f"{v3}/topics/{plain}/records",
        json={"value": {"type": "BINARY", "data": value}},
    )
    assert r.status_code == 200 and r.json()["error_code"] == 413, r.text

    # Bad names and values: 400 40002, nothing stored.
    r = a.put(f"{v3}/broker-configs/log.retention.ms", json={"value": "soon"})
    assert (r.status_code, r.json()) == (
        400,
        {
            "error_code": 40002,
            "message": "Invalid value soon for configuration log.retention.ms: "
            "Not a number of type LONG",
        },
    )
    r = a.post(
        f"{v3}/broker-configs:alter", json={"data": [{"name": "retention.ms", "value": "1"}]}
    )
    assert r.status_code == 400 and r.json()["error_code"] == 40002
    assert r.json()["message"].startswith("Unknown broker config name: retention.ms.")

    r = a.delete(f"{v3}/broker-configs/message.max.bytes")
    assert r.status_code == 204
    assert a.get(f"{v3}/broker-configs").json()["data"] == []


def test_broker_configs_apply_per_broker_and_refuse_per_broker_overrides(
    cluster: Cluster, a: httpx.Client
) -> None:
    cid, base = cluster.cluster_id, cluster.agents[0]
    v3 = f"/v3/clusters/{cid}"
    broker = a.get(f"{v3}/brokers").json()["data"][0]["broker_id"]
    assert (
        a.put(f"{v3}/broker-configs/log.cleanup.policy", json={"value": "compact"}).status_code
        == 204
    )
    listed = a.get(f"{v3}/brokers/{broker}/configs").json()
    assert listed["kind"] == "KafkaBrokerConfigList"
    assert [c["name"] for c in listed["data"]] == sorted(BROKER_CONFIG_DEFS)
    one = a.get(f"{v3}/brokers/{broker}/configs/log.cleanup.policy").json()
    url = f"{base}{v3}/brokers/{broker}/configs/log.cleanup.policy"
    assert one == {
        "kind": "KafkaBrokerConfig",
        "metadata": {
            "self": url,
            "resource_name": f"crn:///kafka={cid}/broker={broker}/config=log.cleanup.policy",
        },
        "cluster_id": cid,
        "broker_id": broker,
        "name": "log.cleanup.policy",
        "value": "compact",
        "is_default": False,
        "is_read_only": False,
        "is_sensitive": False,
        "source": "DYNAMIC_DEFAULT_BROKER_CONFIG",
        "synonyms": [
            {"name": "log.cleanup.policy", "value": "compact", "source": DYNAMIC},
            {"name": "log.cleanup.policy", "value": "delete", "source": "DEFAULT_CONFIG"},
        ],
    }  # fmt: skip
    assert one in listed["data"]
    unset = a.get(f"{v3}/brokers/{broker}/configs/log.roll.ms").json()
    assert (unset["value"], unset["source"], unset["is_default"]) == (
        "604800000",
        "DEFAULT_CONFIG",
        True,
    )
    everything = a.get(f"{v3}/brokers/-/configs").json()
    assert everything["data"] == listed["data"]
    assert a.get(f"{v3}/brokers/{broker}/configs/retention.ms").status_code == 404
    assert a.get(f"{v3}/brokers/{broker + 100}/configs").status_code == 404

    refused = {
        "error_code": 40002,
        "message": "Per-broker config overrides are not supported: every agent serves every "
        "partition, so broker configs are cluster-wide. Set them with /broker-configs.",
    }
    for r in (
        a.put(f"{v3}/brokers/{broker}/configs/log.roll.ms", json={"value": "1000"}),
        a.delete(f"{v3}/brokers/{broker}/configs/log.roll.ms"),
        a.post(f"{v3}/brokers/{broker}/configs:alter", json={"data": []}),
    ):
        assert (r.status_code, r.json()) == (400, refused)
    assert a.delete(f"{v3}/broker-configs/log.cleanup.policy").status_code == 204
