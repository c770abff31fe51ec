"""Issue 23 High 2, across real processes: a coordinator and an agent, both with
``--authentication basic --authorization acl --super-users User:admin`` (users admin,
alice, bob), and what the coordinators' shared secret may and may not do.

- the secret lets an agent do what agents do, nothing more: users, API keys and ACLs are
  managed only with a principal's own credential (a super user's; ALTER on the cluster
  for ACLs), sent by the CLI or forwarded by the agent for its client (REST Basic, Kafka
  SASL/PLAIN and SCRAM);
- a user (a Spark job) reaches the coordinator with its own credential, never the
  secret, and the coordinator checks its ACLs route by route;
- an agent refuses to start against a coordinator whose security differs, and every
  process refuses a short or example secret, and an agent sending passwords to an
  ``http://`` coordinator on another host.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from confluent_kafka.error import KafkaException

from coordinator.client import ChunkCommit
from coordinator.http.client import http_coordinator
from coordinator.security.wire import secret_headers
from segments.errors import AuthenticationError, AuthorizationError
from tests.coordinator_calls import answer, call
from tests.procs import Proc, agent_args, create_user, free_port, run_cli, start_lakelog

SECRET = secrets.token_hex(32)
PASSWORDS = {
    "admin": "admin-password-Split1",
    "alice": "alice-password-Split2",
    "bob": "bob-password-Split3",
}
SECURITY = {
    "LAKELOG_AUTHENTICATION": "basic",
    "LAKELOG_AUTHORIZATION": "acl",
    "LAKELOG_SUPER_USERS": "User:admin",
    "LAKELOG_PROTECT_METRICS": "true",
}


def basic(name: str, secret: str) -> str:
    return "Basic " + base64.b64encode(f"{name}:{secret}".encode()).decode()


@dataclass
class Split:
    coordinator: str
    agent: str
    kafka: str
    cluster_id: str
    procs: list[Proc]

    def as_agent(self) -> httpx.Client:
        """What holding only the shared secret gives."""
        return httpx.Client(base_url=self.coordinator, headers=secret_headers(SECRET))

    def as_user(self, user: str) -> httpx.Client:
        return httpx.Client(base_url=self.coordinator, auth=(user, PASSWORDS[user]))

    def logs(self) -> str:
        return "".join(p.output() for p in self.procs)


def start(
    tmp: Path, name: str, args: list[str], env: dict[str, str], url: str | None = None
) -> Proc:
    health = f"{url}/health" if url is not None else None
    return start_lakelog(tmp / f"{name}.log", [*args, "--log-level", "info"], env, health)


def coordinator_args(tmp: Path, port: int) -> list[str]:
    db = f"sqlite:///{tmp / 'meta.db'}"
    return ["coordinator", "--db", db, "--store", f"file://{tmp / 'data'}", "--port", str(port)]


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    tmp = tmp_path_factory.mktemp("split")
    db = f"sqlite:///{tmp / 'meta.db'}"
    create_user(db, "admin", PASSWORDS["admin"])
    env = {**SECURITY, "LAKELOG_COORDINATOR_SECRET": SECRET}
    cport, aport, kport = free_port(), free_port(), free_port()
    coordinator_url, agent_url = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{aport}"
    procs = [start(tmp, "coordinator", coordinator_args(tmp, cport), env, coordinator_url)]
    try:
        procs.append(
            start(
                tmp,
                "agent",
                agent_args(coordinator_url, tmp, aport, kport),
                {**env, "LAKELOG_AUTH_CACHE_TTL_S": "0.5"},
                agent_url,
            )
        )
        with httpx.Client(base_url=agent_url, auth=("admin", PASSWORDS["admin"])) as admin:
            for user in ("alice", "bob"):
                r = admin.post("/security/users", json={"name": user, "password": PASSWORDS[user]})
                assert r.status_code == 201, r.text
            cluster_id = admin.get("/v3/clusters").json()["data"][0]["cluster_id"]
            for topic in ("open", "closed"):
                r = admin.post(f"/v3/clusters/{cluster_id}/topics", json={"topic_name": topic})
                assert r.status_code == 201, r.text
            acl = {
                "principal": "User:alice",
                "host": "*",
                "resource_type": "TOPIC",
                "resource_name": "open",
                "pattern_type": "LITERAL",
                "operation": "READ",
                "permission": "ALLOW",
            }
            r = admin.post(f"/v3/clusters/{cluster_id}/acls", json=acl)
            assert r.status_code == 201, r.text
        yield Split(coordinator_url, agent_url, f"127.0.0.1:{kport}", cluster_id, procs)
    finally:
        for p in procs:
            p.stop()


def refused(r: httpx.Response, status: int = 403) -> None:
    assert r.status_code == status, r.text
    assert r.json()["error"] == ("AuthorizationError" if status == 403 else "AuthenticationError")


MANAGEMENT: list[tuple[str, str, Any]] = [
    ("POST", "/v1/security/users/create", {"name": "mallory", "password": "mallory-pass-1"}),
    ("POST", "/v1/security/users/password", {"name": "admin", "password": "owned-by-mallory"}),
    ("POST", "/v1/security/users/delete", {"name": "bob"}),
    ("GET", "/v1/security/users", None),
    ("POST", "/v1/security/api-keys/create", {"owner": "admin", "description": "x"}),
    ("POST", "/v1/security/api-keys/list", {"owner": None}),
    (
        "POST",
        "/v1/security/acls/create",
        {
            "acls": [
                {
                    "principal": "User:alice",
                    "host": "*",
                    "resource_type": "CLUSTER",
                    "resource_name": "kafka-cluster",
                    "pattern_type": "LITERAL",
                    "operation": "ALL",
                    "permission": "ALLOW",
                }
            ]
        },
    ),
    ("POST", "/v1/security/acls/delete", {"filters": [{}]}),
]


def test_the_shared_secret_manages_nothing(split: Split) -> None:
    """With only the shared secret (what a Spark job held before), or with it and a user's
    forwarded credential, every management call is refused (403) and nothing changes:
    no user made, admin's password unchanged, no ACL. The super user's own credential,
    sent directly (the CLI) or forwarded by an agent, manages."""
    with split.as_agent() as agent:
        for method, path, body in MANAGEMENT:
            refused(agent.request(method, path, json=body))
            alice = {"x-lakelog-principal": basic("alice", PASSWORDS["alice"])}
            refused(agent.request(method, path, json=body, headers=alice))
        wrong = {"x-lakelog-principal": basic("admin", "not-the-password")}
        refused(agent.post(MANAGEMENT[0][1], json=MANAGEMENT[0][2], headers=wrong), 401)
        # What agents do still works with the secret alone.
        listed = call(agent, "list_topics")
        assert listed.status_code == 200, listed.text
        assert {t["name"] for t in answer(listed)} >= {"open", "closed"}
        assert agent.post("/v1/security/acls/describe", json={"filters": [{}]}).status_code == 200
    with split.as_user("admin") as admin:
        users = admin.get("/v1/security/users")
        assert users.status_code == 200, users.text
        assert [u["name"] for u in users.json()["users"]] == ["admin", "alice", "bob"]
        acls = admin.post("/v1/security/acls/describe", json={"filters": [{}]})
        refused(acls)  # an agent's route: users get only what Spark jobs use
    with httpx.Client(base_url=split.agent, auth=("admin", PASSWORDS["admin"])) as via_agent:
        r = via_agent.post("/security/users", json={"name": "carol", "password": "carol-pass-11"})
        assert r.status_code == 201, r.text
        assert via_agent.delete("/security/users/carol").status_code == 204
    assert (
        httpx.get(f"{split.agent}/v3/clusters", auth=("admin", PASSWORDS["admin"])).status_code
        == 200
    )
    assert "mallory" not in split.logs()


def test_protected_metrics_of_a_coordinator(split: Split) -> None:
    """A coordinator's /metrics (group lag by group and topic) with protect_metrics: 401
    without a credential, 403 for a user without DESCRIBE on the cluster, served to
    agents and super users; /health stays open."""
    assert httpx.get(f"{split.coordinator}/health").status_code == 200
    refused(httpx.get(f"{split.coordinator}/metrics"), 401)
    with split.as_user("bob") as bob:
        refused(bob.get("/metrics"))
    for client in (split.as_agent(), split.as_user("admin")):
        with client:
            r = client.get("/metrics")
            assert r.status_code == 200 and "lakelog_" in r.text


def kafka_admin(split: Split, user: str, mechanism: str) -> AdminClient:
    return AdminClient(
        {
            "bootstrap.servers": split.kafka,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": PASSWORDS[user],
        }
    )


def acl_for(user: str, topic: str) -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        f"User:{user}",
        "*",
        AclOperation.DESCRIBE,
        AclPermissionType.ALLOW,
    )


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_acl_changes_carry_the_clients_own_credential(split: Split, mechanism: str) -> None:
    """kafka-acls through the agent: the agent forwards admin's PLAIN password or SCRAM
    login to the coordinator, which checks it and stores the ACL; bob's is refused
    (CLUSTER_AUTHORIZATION_FAILED) by the agent's own ACL check."""
    topic = f"kafka-{mechanism.lower()}"
    admin = kafka_admin(split, "admin", mechanism)  # held: futures die with their client
    for future in admin.create_acls([acl_for("bob", topic)]).values():
        future.result(timeout=20)
    with split.as_user("admin") as admin:
        found = admin.post(
            "/v1/security/authorize",
            json={
                "name": "bob",
                "secret": PASSWORDS["bob"],
                "checks": [
                    {"operation": "DESCRIBE", "resource_type": "TOPIC", "resource_name": topic}
                ],
            },
        )
        assert found.json()["allowed"] == [True], found.text
    bob = kafka_admin(split, "bob", mechanism)
    for future in bob.create_acls([acl_for("bob", "closed")]).values():
        with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
            future.result(timeout=20)


def test_a_user_at_the_coordinator_gets_only_its_acls(split: Split) -> None:
    """Alice, with her own credential and no secret (a Spark job): the topic list shows
    only what she may DESCRIBE, a lookup needs READ, a commit WRITE, and an agent's route
    (heartbeats, groups, the ACLs) is refused; a wrong password is 401."""
    headers = {"authorization": basic("alice", PASSWORDS["alice"])}
    with http_coordinator(split.coordinator, headers=headers) as alice:
        assert [t.name for t in alice.list_topics()] == ["open"]
        assert alice.lookup("open", 0, 0) == []
        with pytest.raises(AuthorizationError):
            alice.lookup("closed", 0, 0)
        with pytest.raises(AuthorizationError):
            alice.get_topic("closed")
        closed = http_coordinator(split.coordinator, headers=secret_headers(SECRET))
        with closed:
            topic_id = closed.get_topic("closed").topic_id
        chunk = ChunkCommit(topic_id, 0, 0, 10, 1, 0, 0)
        with pytest.raises(AuthorizationError):
            alice.commit("segments/x/never.seg", [chunk])
        with pytest.raises(AuthorizationError):
            alice.list_agents()
        with pytest.raises(AuthorizationError):
            alice.list_groups()
    with split.as_user("alice") as user:
        refused(user.post("/v1/security/acls/describe", json={"filters": [{}]}))
        refused(call(user, "create_consumer", {"group": "g", "name": "x", "config": {}}))
    with (
        http_coordinator(
            split.coordinator, headers={"authorization": basic("alice", "wrong-password")}
        ) as wrong,
        pytest.raises(AuthenticationError),
    ):
        wrong.list_topics()


@pytest.mark.parametrize(
    "coordinator_env, said",
    [
        ({}, ("security settings differ", "authentication")),
        (
            {**SECURITY, "LAKELOG_COORDINATOR_SECRET": SECRET, "LAKELOG_SUPER_USERS": "User:ops"},
            ("super_users", "User:ops"),
        ),
    ],
    ids=["authentication-off", "other-super-users"],
)
def test_an_agent_refuses_a_coordinator_with_other_security(
    tmp_path: Path, coordinator_env: dict[str, str], said: tuple[str, str]
) -> None:
    """A coordinator with authentication off (where an unauthenticated caller could make
    a super user), or with other authorization or super users: an agent with
    authentication and ACLs on refuses to start, saying which settings differ."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    coordinator = start(
        tmp_path, "coordinator", coordinator_args(tmp_path, port), coordinator_env, url
    )
    try:
        env = {**SECURITY, "LAKELOG_COORDINATOR_SECRET": SECRET}
        result = run_cli(*agent_args(url, tmp_path, free_port()), env=env)
        assert result.returncode != 0
        out = result.stdout + result.stderr
        assert said[0] in out and said[1] in out, out
    finally:
        coordinator.stop()


@pytest.mark.parametrize(
    "secret, why",
    [("x" * 31, "at least 32 bytes"), ("change-me-to-a-long-random-string", "example value")],
)
def test_short_or_example_secrets_are_refused_at_start(
    tmp_path: Path, secret: str, why: str
) -> None:
    env = {**SECURITY, "LAKELOG_COORDINATOR_SECRET": secret}
    for args in (
        coordinator_args(tmp_path, free_port()),
        agent_args("http://127.0.0.1:9", tmp_path, free_port()),
    ):
        result = run_cli(*args, env=env)
        assert result.returncode == 2, result.stderr
        assert why in result.stderr
        assert secret not in result.stderr


def test_an_agent_refuses_to_send_passwords_to_a_plaintext_remote_coordinator(
    tmp_path: Path,
) -> None:
    env = {**SECURITY, "LAKELOG_COORDINATOR_SECRET": SECRET}
    result = run_cli(*agent_args("http://10.255.0.1:8083", tmp_path, free_port()), env=env)
    assert result.returncode == 2
    assert "http:// to another host" in result.stderr


@pytest.mark.parametrize(
    "oauth, why",
    [
        (
            {
                "LAKELOG_OAUTH_JWKS": "http://10.255.0.1/jwks.json",
                "LAKELOG_OAUTH_ISSUER": "https://idp",
                "LAKELOG_OAUTH_AUDIENCE": "lakelog",
            },
            "oauth_jwks is http://",
        ),
        ({"LAKELOG_OAUTH_JWKS": "https://idp/jwks.json"}, "needs oauth_issuer and oauth_audience"),
    ],
)
def test_bearer_tokens_need_https_keys_and_their_issuer_and_audience(
    tmp_path: Path, oauth: dict[str, str], why: str
) -> None:
    """JWKS fetched in clear could be swapped on the way, and a token the same keys signed
    for another service must not be accepted here: refused at start unless relaxed."""
    args = ["serve", "--db", f"sqlite:///{tmp_path}/m.db", "--store", f"file://{tmp_path}/d"]
    result = run_cli(
        *args, "--port", str(free_port()), env={"LAKELOG_AUTHENTICATION": "basic", **oauth}
    )
    assert result.returncode == 2, result.stderr
    assert why in result.stderr
