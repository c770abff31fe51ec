"""Authentication and ACLs on every REST route, built from the app's route table.

Rows: anonymous, a bad password, a good password without any ACL, a principal allowed
everything, one denied by a DENY over an ALLOW, one allowed by a PREFIXED pattern (and
refused outside it). A route added without an authorization rule fails the allowed row
(the middleware refuses what it has no rule for) and ``test_every_route_has_a_rule``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from argon2 import PasswordHasher
from fastapi.testclient import TestClient

from coordinator.local import LocalCoordinator
from coordinator.security.model import AclBinding
from coordinator.security.store import SqlSecurityStore
from service.app import create_app
from service.security.acl import missing_rules
from service.settings import Settings
from service.web import _leaf_routes

CHEAP = PasswordHasher(time_cost=1, memory_cost=64, parallelism=1)
PASSWORD = "a-good-password"
TOPIC, GROUP = "sec-topic", "sec-group"
#: Served without credentials (probes, scrapes).
OPEN = {"/health", "/metrics"}
#: Need only an authenticated principal (Kafka shows clusters and brokers to anyone).
AUTHENTICATED_ONLY = {
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
    "/",
    "/brokers",
    "/v3/clusters",
    "/v3/clusters/{cluster_id}",
    "/v3/clusters/{cluster_id}/brokers",
    "/v3/clusters/{cluster_id}/brokers/{broker_id}",
    "/schemas/types",
}
#: Listings: answered to anyone authenticated, with only what they may describe.
LISTINGS = {
    "/topics",
    "/v3/clusters/{cluster_id}/topics",
    "/v3/clusters/{cluster_id}/consumer-groups",
}


def basic(user: str, password: str = PASSWORD) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@dataclass(frozen=True)
class Route:
    method: str
    path: str

    def url(self, cluster_id: str, topic: str = TOPIC, group: str = GROUP) -> str:
        values = {
            "cluster_id": cluster_id,
            "topic_name": topic,
            "topic": topic,
            "consumer_group_id": group,
            "group_id": group,
            "group": group,
        }
        url = re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: values.get(m.group(1), "0"), self.path)
        return url + f"?topics={topic}" if self.streams else url

    @property
    def streams(self) -> bool:
        """The v3 group stream: it names its topics in the query and, allowed, stays open."""
        return self.path.endswith("/consumer-groups/{group_id}/records")

    def body(self, topic: str = TOPIC) -> dict[str, object] | None:
        if self.method not in ("POST", "PUT", "PATCH"):
            return None
        return {"topic_name": topic, "topics": [topic], "records": [{"value": "aGk="}]}

    @property
    def names_topic(self) -> bool:
        return "{topic" in self.path or self.path == "/v3/clusters/{cluster_id}/topics"


def basic_settings(
    tmp: Path, users: Sequence[str], acls: Sequence[AclBinding] = (), **more: Any
) -> Settings:
    """An agent's settings with HTTP Basic on a new SQLite database in ``tmp`` that holds
    ``users`` (each with ``PASSWORD``) and ``acls``; ``more`` settings besides."""
    db = f"sqlite:///{tmp}/meta.db"
    with LocalCoordinator(db) as coord:
        store = SqlSecurityStore(coord.db, CHEAP)
        for name in users:
            store.create_user(name, PASSWORD)
        if acls:
            store.create_acls(acls)
    return Settings(db=db, store=f"file://{tmp}/data", kafka_port=0, authentication="basic", **more)


def all_routes(app: object) -> list[Route]:
    out = []
    for r in _leaf_routes(app.router.routes):  # type: ignore[attr-defined]
        for m in sorted(getattr(r, "methods", None) or ()):
            if m != "HEAD":
                out.append(Route(m, r.path))
    return out


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TestClient, str, list[Route]]]:
    everything = [
        AclBinding.of(p, "*", rtype, rname, "LITERAL", "ALL", "ALLOW")
        for p in ("User:alice", "User:mallory")
        for rtype, rname in (("TOPIC", "*"), ("GROUP", "*"), ("CLUSTER", "kafka-cluster"))
    ]
    denied = [
        AclBinding.of("User:mallory", "*", rtype, rname, "LITERAL", "ALL", "DENY")
        for rtype, rname in (("TOPIC", TOPIC), ("GROUP", GROUP), ("CLUSTER", "kafka-cluster"))
    ]
    prefixed = [
        AclBinding.of("User:pat", "*", rtype, "sec-", "PREFIXED", "ALL", "ALLOW")
        for rtype in ("TOPIC", "GROUP")
    ] + [AclBinding.of("User:pat", "*", "CLUSTER", "kafka-cluster", "LITERAL", "ALL", "ALLOW")]
    settings = basic_settings(
        tmp_path_factory.mktemp("rest-acl"),
        ("admin", "nobody", "alice", "mallory", "pat"),
        [*everything, *denied, *prefixed],
        authorization="acl",
        super_users="User:admin",
        auth_max_failures=1000,
    )
    app = create_app(settings)
    with TestClient(app) as client:
        cid = client.get("/v3/clusters", headers=basic("admin")).json()["data"][0]["cluster_id"]
        for t in (TOPIC, "other-topic"):
            created = client.post(
                f"/v3/clusters/{cid}/topics", json={"topic_name": t}, headers=basic("admin")
            )
            assert created.status_code == 201
        yield client, cid, all_routes(app)


def call(
    client: TestClient,
    route: Route,
    cid: str,
    headers: dict[str, str],
    topic: str = TOPIC,
    group: str = GROUP,
):  # type: ignore[no-untyped-def]
    return client.request(
        route.method, route.url(cid, topic, group), json=route.body(topic), headers=headers
    )


def test_every_route_has_a_rule(served: tuple[TestClient, str, list[Route]]) -> None:
    client, _, routes = served
    assert missing_rules(client.app) == []  # type: ignore[arg-type]
    assert len(routes) > 100


@pytest.mark.parametrize("who", ["anonymous", "bad-password", "unknown-user"])
def test_no_valid_credential_is_401_everywhere(
    served: tuple[TestClient, str, list[Route]], who: str
) -> None:
    client, cid, routes = served
    headers = {
        "anonymous": {},
        "bad-password": basic("alice", "wrong"),
        "unknown-user": basic("zed"),
    }[who]
    for route in routes:
        r = call(client, route, cid, headers)
        if route.path in OPEN:
            assert r.status_code == 200, route
            continue
        assert r.status_code == 401, route
        assert r.headers["www-authenticate"] == 'Basic realm="lakelog"'
        assert r.json()["error_code"] == 40101
        assert "wrong" not in r.text


def topics_and_records(client: TestClient, cid: str) -> tuple[list[str], list[int]]:
    names = sorted(
        t["topic_name"]
        for t in client.get(f"/v3/clusters/{cid}/topics", headers=basic("admin")).json()["data"]
    )
    ends = [
        client.get(f"/topics/{t}/partitions/0/offsets", headers=basic("admin")).json()["end_offset"]
        for t in names
    ]
    return names, ends


@pytest.mark.parametrize("who", ["nobody", "mallory"])
def test_denied_is_403_and_changes_nothing(
    served: tuple[TestClient, str, list[Route]], who: str
) -> None:
    """nobody has no ACL; mallory is allowed ALL on * but denied ALL on sec-topic,
    sec-group and the cluster: DENY wins."""
    client, cid, routes = served
    before = topics_and_records(client, cid)
    for route in routes:
        r = call(client, route, cid, basic(who))
        if route.path in OPEN or route.path in AUTHENTICATED_ONLY:
            assert r.status_code not in (401, 403), route
        elif route.path in LISTINGS and route.method == "GET":
            assert r.status_code == 200, route
            data = r.json()
            names = (
                data
                if isinstance(data, list)
                else [i.get("topic_name", i.get("consumer_group_id")) for i in data["data"]]
            )
            assert TOPIC not in names and GROUP not in names, route
            if who == "nobody":
                assert names == [], route
        else:
            assert r.status_code == 403, (route, r.status_code, r.text)
            assert r.json() == {
                "error_code": 40301,
                "message": "Not authorized to perform this operation.",
            }
    assert topics_and_records(client, cid) == before


@pytest.mark.parametrize("who", ["pat", "alice", "admin"])
def test_allowed_is_never_401_or_403(served: tuple[TestClient, str, list[Route]], who: str) -> None:
    """pat by a PREFIXED sec- ACL, alice by ALL on *, admin as a super user. Last: these
    requests may change the cluster (delete the topic); their status is whatever the
    route answers, never an authorization failure."""
    client, cid, routes = served
    for route in routes:
        # An allowed stream of an existing topic would stay open: name a missing one (404
        # after the authorization check; "sec-" for pat's prefix).
        r = call(client, route, cid, basic(who), topic="sec-absent" if route.streams else TOPIC)
        if route.path.startswith("/security") and who != "admin":
            assert r.status_code == 403, route
        else:
            assert r.status_code not in (401, 403), (route, r.status_code, r.text)


def test_prefix_does_not_reach_other_names(served: tuple[TestClient, str, list[Route]]) -> None:
    client, cid, routes = served
    for route in routes:
        if route.names_topic and route.path not in LISTINGS:
            r = call(client, route, cid, basic("pat"), topic="other-topic")
            assert r.status_code == 403, route
    listed = client.get("/topics", headers=basic("pat")).json()
    assert "other-topic" not in listed


def test_failed_logins_are_counted_and_throttled(tmp_path: Path) -> None:
    """Three failures for one name within the window: the fourth try (even with the right
    password) is 429 with Retry-After; the failures are on /metrics by reason only."""
    settings = basic_settings(tmp_path, ["carol"], auth_max_failures=3, auth_failure_window_s=60)
    with TestClient(create_app(settings)) as client:
        assert client.get("/v3/clusters", headers=basic("carol")).status_code == 200
        for _ in range(3):
            assert (
                client.get("/v3/clusters", headers=basic("carol", "nope-nope")).status_code == 401
            )
        throttled = client.get("/v3/clusters", headers=basic("carol"))
        assert throttled.status_code == 200  # cached: a verified credential is not re-checked
        other = client.get("/v3/clusters", headers=basic("carol", "another-guess"))
        assert other.status_code == 429
        assert other.json()["error_code"] == 429
        assert 1 <= int(other.headers["retry-after"]) <= 60
        assert client.get("/v3/clusters", headers={"Authorization": "Basic !!"}).status_code == 401
        metrics = client.get("/metrics").text
    assert 'lakelog_auth_failures_total{door="rest",reason="invalid"} 3.0' in metrics
    assert 'lakelog_auth_failures_total{door="rest",reason="throttled"} 1.0' in metrics
    assert 'lakelog_auth_failures_total{door="rest",reason="malformed"} 1.0' in metrics
    assert "carol" not in metrics and "nope-nope" not in metrics


def test_off_by_default(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Without settings: no credential needed, the ACL routes answer Kafka's 40002, the
    principal routes refuse, and start-up warns that anyone may do anything."""
    settings = Settings(
        db=f"sqlite:///{tmp_path}/meta.db", store=f"file://{tmp_path}/data", kafka_port=0
    )
    assert (settings.authentication, settings.authorization) == ("none", "none")
    with caplog.at_level("WARNING"), TestClient(create_app(settings)) as client:
        cid = client.get("/v3/clusters").json()["data"][0]["cluster_id"]
        acls = client.get(f"/v3/clusters/{cid}/acls")
        assert (acls.status_code, acls.json()["error_code"]) == (400, 40002)
        users = client.post("/security/users", json={"name": "x", "password": "long-enough"})
        assert (users.status_code, users.json()["error_code"]) == (400, 40002)
    assert any("authentication is OFF" in r.getMessage() for r in caplog.records)


def test_acl_bad_input_and_delete_needs_its_filter(
    served: tuple[TestClient, str, list[Route]],
) -> None:
    client, cid, _ = served
    acls = f"/v3/clusters/{cid}/acls"
    good = {
        "resource_type": "TOPIC",
        "resource_name": "t-",
        "pattern_type": "PREFIXED",
        "principal": "User:zoe",
        "host": "*",
        "operation": "READ",
        "permission": "ALLOW",
    }
    bad_cluster = {**good, "resource_type": "CLUSTER", "resource_name": "other"}
    r = client.post(acls, json=bad_cluster, headers=basic("admin"))
    assert (r.status_code, r.json()["error_code"]) == (400, 40002)
    r = client.post(
        acls + ":batch", json={"data": [good, {**good, "operation": "FLY"}]}, headers=basic("admin")
    )
    assert r.status_code == 400  # all or none: the good one is not stored
    assert (
        client.get(acls, params={"principal": "User:zoe"}, headers=basic("admin")).json()["data"]
        == []
    )
    assert (
        client.post(acls + ":batch", json={"data": [good]}, headers=basic("admin")).status_code
        == 201
    )
    listed = client.get(acls, params={"principal": "User:zoe"}, headers=basic("admin")).json()
    assert listed["kind"] == "KafkaAclList"
    assert [{k: a[k] for k in good} for a in listed["data"]] == [good]
    r = client.delete(acls, params={"principal": "User:zoe"}, headers=basic("admin"))
    assert (r.status_code, r.json()["message"]) == (
        400,
        "resource_type cannot be unspecified or UNKNOWN",
    )
    query = {
        "resource_type": "TOPIC",
        "pattern_type": "ANY",
        "operation": "ANY",
        "permission": "ANY",
        "principal": "User:zoe",
    }
    r = client.delete(acls, params=query, headers=basic("admin"))
    assert [a["resource_name"] for a in r.json()["data"]] == ["t-"]


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        ({"authorization": "acl", "kafka_port": 0}, "authorization acl needs authentication"),
        (
            {"authentication": "basic", "kafka_port": 0, "coordinator": "http://c:8083"},
            "needs coordinator_secret",
        ),
    ],
)
def test_settings_that_do_not_go_together_refuse_to_start(
    tmp_path: Path, flags: dict[str, object], problem: str
) -> None:
    settings = Settings(db=f"sqlite:///{tmp_path}/m.db", **flags)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=problem):
        create_app(settings)


def test_coordinator_with_authentication_needs_its_secret() -> None:
    from coordinator.settings import CoordinatorSettings

    bare = CoordinatorSettings(db="sqlite:///x.db", authentication="basic")
    assert "coordinator_secret" in bare.security_problems()[0]
    secret = "s" * 32
    ok = CoordinatorSettings(db="sqlite:///x.db", authentication="basic", coordinator_secret=secret)  # type: ignore[arg-type]
    assert ok.security_problems() == []
    assert secret not in repr(ok.coordinator_secret)


def test_quotas_charge_the_authenticated_user(tmp_path: Path) -> None:
    """With authentication on, the quota principal is the user: two users behind one
    address and one X-Client-Id have a bucket each, and an unauthenticated request is
    refused (401) before it is charged to anyone."""
    settings = basic_settings(
        tmp_path,
        ("quick", "patient", "vip"),
        quota_requests_per_s=2,
        quota_overrides="User:vip=requests:0",  # 0: no quota for vip
    )
    same = {"X-Client-Id": "shared-client"}
    with TestClient(create_app(settings)) as client:
        assert client.get("/v3/clusters", headers=same).status_code == 401
        answers = [
            client.get("/v3/clusters", headers={**same, **basic("quick")}).status_code
            for _ in range(6)
        ]
        assert answers[:2] == [200, 200] and 429 in answers  # quick's bucket ran dry
        assert client.get("/v3/clusters", headers={**same, **basic("patient")}).status_code == 200
        vip = [client.get("/v3/clusters", headers=basic("vip")).status_code for _ in range(6)]
        assert vip == [200] * 6
