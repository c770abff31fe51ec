"""Issue 23, tried as an attacker with one low-privilege account: one ``lakelog serve
--authentication basic --authorization acl`` (users admin, alice, bob, carol) shared by the
module, real HTTP requests and Kafka clients.

- REST consumer instances: usable only by the principal that made them; READ on each
  assigned topic checked on every fetch (a revoked READ stops an existing instance); a
  ``topic_pattern`` matched against each topic's own ACLs.
- group offset routes: ``offsets:reset`` needs READ on each topic; instance offsets and the
  v3 lag views show only topics the caller may DESCRIBE.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.test_security_processes import start_secured_serve
from tests.procs import Proc

PASSWORDS = {
    "admin": "admin-password-Attack1",
    "alice": "alice-password-Attack2",
    "bob": "bob-password-Attack3",
    "carol": "carol-password-Attack4",
}
V2 = "application/vnd.kafka.v2+json"
BINARY = "application/vnd.kafka.binary.v2+json"
DENIED = 40301


def auth(user: str) -> httpx.BasicAuth:
    return httpx.BasicAuth(user, PASSWORDS[user])


@dataclass
class Serve:
    rest: str
    kafka: str
    cluster_id: str
    proc: Proc
    tmp: Path

    def client(self, user: str) -> httpx.Client:
        return httpx.Client(base_url=self.rest, auth=auth(user), timeout=30.0)

    def v3(self, path: str) -> str:
        return f"/v3/clusters/{self.cluster_id}{path}"

    def acl(self, method: str, user: str, **fields: str) -> None:
        """Create or delete one ACL for ``user`` as admin."""
        acl = {
            "principal": f"User:{user}",
            "host": "*",
            "pattern_type": "LITERAL",
            "permission": "ALLOW",
            **fields,
        }
        with self.client("admin") as admin:
            if method == "POST":
                r = admin.post(self.v3("/acls"), json=acl)
                assert r.status_code == 201, r.text
            else:
                r = admin.request("DELETE", self.v3("/acls"), params=acl)
                assert r.status_code == 200 and r.json()["data"], r.text


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    tmp = tmp_path_factory.mktemp("attacks")
    proc, port, kport = start_secured_serve(
        tmp,
        "admin",
        PASSWORDS["admin"],
        {
            "LAKELOG_AUTHORIZATION": "acl",
            "LAKELOG_SUPER_USERS": "User:admin",
            "LAKELOG_AUTH_CACHE_TTL_S": "0.5",
            "LAKELOG_PROTECT_METRICS": "true",
        },
    )
    rest = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=rest, auth=auth("admin"), timeout=30.0) as admin:
            for user in ("alice", "bob", "carol"):
                r = admin.post("/security/users", json={"name": user, "password": PASSWORDS[user]})
                assert r.status_code == 201, r.text
            cluster_id = admin.get("/v3/clusters").json()["data"][0]["cluster_id"]
        yield Serve(rest, f"127.0.0.1:{kport}", cluster_id, proc, tmp)
    finally:
        proc.stop()


def make_topic(serve: Serve, name: str, records: int = 3, partitions: int = 1) -> None:
    with serve.client("admin") as admin:
        r = admin.post(
            serve.v3("/topics"), json={"topic_name": name, "partitions_count": partitions}
        )
        assert r.status_code == 201, r.text
        if not records:
            return
        values = [
            {"value": base64.b64encode(f"{name}-{i}".encode()).decode()} for i in range(records)
        ]
        r = admin.post(
            f"/topics/{name}", json={"records": values}, headers={"Content-Type": BINARY}
        )
        assert r.status_code == 200, r.text


def new_instance(client: httpx.Client, group: str, name: str) -> str:
    r = client.post(
        f"/consumers/{group}",
        json={"name": name, "format": "binary", "auto.offset.reset": "earliest"},
        headers={"Content-Type": V2},
    )
    assert r.status_code == 200, r.text
    return f"/consumers/{group}/instances/{name}"


def fetch(client: httpx.Client, instance: str, timeout_ms: int = 1000) -> httpx.Response:
    return client.get(
        f"{instance}/records", params={"timeout": timeout_ms}, headers={"Accept": BINARY}
    )


def values(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return sorted(base64.b64decode(rec["value"]).decode() for rec in r.json())


def fetch_until(client: httpx.Client, instance: str, want: int) -> list[str]:
    """Values fetched until ``want`` arrived (a subscription gets its partitions at once,
    but the records may take more than one fetch)."""
    got: list[str] = []
    deadline = time.monotonic() + 20
    while len(got) < want and time.monotonic() < deadline:
        got += values(fetch(client, instance))
    return sorted(got)


def denied(r: httpx.Response) -> None:
    assert r.status_code == 403, r.text
    assert r.json()["error_code"] == DENIED


# -- High 1: REST consumer instances ------------------------------------------------------


def test_an_instance_is_usable_only_by_its_creator(serve: Serve) -> None:
    """Bob, with READ on group g1 but not on topic secret1, finds Alice's instance through
    the v3 group view; every call on it is refused (403 40301), and nothing moved: Alice
    then reads every record herself."""
    make_topic(serve, "secret1")
    serve.acl("POST", "alice", resource_type="GROUP", resource_name="g1", operation="READ")
    serve.acl("POST", "alice", resource_type="TOPIC", resource_name="secret1", operation="READ")
    serve.acl("POST", "bob", resource_type="GROUP", resource_name="g1", operation="READ")
    with serve.client("alice") as alice, serve.client("bob") as bob:
        inst = new_instance(alice, "g1", "alicec")
        r = alice.post(
            f"{inst}/subscription", json={"topics": ["secret1"]}, headers={"Content-Type": V2}
        )
        assert r.status_code == 204, r.text
        listed = bob.get(serve.v3("/consumer-groups/g1/consumers"))
        assert [c["consumer_id"] for c in listed.json()["data"]] == ["alicec"]

        denied(fetch(bob, inst))
        denied(bob.post(f"{inst}/offsets", headers={"Content-Type": V2}))
        denied(
            bob.request(
                "GET",
                f"{inst}/offsets",
                json={"partitions": [{"topic": "secret1", "partition": 0}]},
                headers={"Content-Type": V2},
            )
        )
        denied(
            bob.post(
                f"{inst}/positions/beginning",
                json={"partitions": [{"topic": "secret1", "partition": 0}]},
                headers={"Content-Type": V2},
            )
        )
        denied(
            bob.post(
                f"{inst}/positions",
                json={"offsets": [{"topic": "secret1", "partition": 0, "offset": 2}]},
                headers={"Content-Type": V2},
            )
        )
        denied(
            bob.post(
                f"{inst}/subscription", json={"topics": ["secret1"]}, headers={"Content-Type": V2}
            )
        )
        denied(bob.get(f"{inst}/subscription"))
        denied(bob.delete(f"{inst}/subscription"))
        denied(bob.get(f"{inst}/assignments"))
        denied(bob.delete(inst))

        assert fetch_until(alice, inst, 3) == ["secret1-0", "secret1-1", "secret1-2"]
        assert alice.delete(inst).status_code == 204


def test_a_revoked_read_stops_an_existing_instance(serve: Serve) -> None:
    """Alice's instance reads secret2; once her READ on it is deleted, her next fetch
    (within the agents' staleness bound) is refused and moves nothing."""
    make_topic(serve, "secret2")
    serve.acl("POST", "alice", resource_type="GROUP", resource_name="g2", operation="READ")
    serve.acl("POST", "alice", resource_type="TOPIC", resource_name="secret2", operation="READ")
    with serve.client("alice") as alice:
        inst = new_instance(alice, "g2", "alicec")
        r = alice.post(
            f"{inst}/assignments",
            json={"partitions": [{"topic": "secret2", "partition": 0}]},
            headers={"Content-Type": V2},
        )
        assert r.status_code == 204, r.text
        first = fetch_until(alice, inst, 3)
        assert first == ["secret2-0", "secret2-1", "secret2-2"]
        make_topic_records(serve, "secret2", ["late"])
        serve.acl(
            "DELETE", "alice", resource_type="TOPIC", resource_name="secret2", operation="READ"
        )
        time.sleep(0.6)  # the agents' ACL copy is at most auth_cache_ttl_s (0.5 s) old
        r = fetch(alice, inst)
        denied(r)
        assert "secret2" in r.json()["message"]


def make_topic_records(serve: Serve, topic: str, vals: list[str]) -> None:
    with serve.client("admin") as admin:
        body = {"records": [{"value": base64.b64encode(v.encode()).decode()} for v in vals]}
        r = admin.post(f"/topics/{topic}", json=body, headers={"Content-Type": BINARY})
        assert r.status_code == 200, r.text


def test_a_pattern_is_matched_against_each_topics_acls(serve: Serve) -> None:
    """Carol may READ every topic (LITERAL ``*``) but is denied READ on pat-secret: her
    ``topic_pattern`` subscription is allowed (READ on the group), and her fetch is
    refused naming pat-secret, as a Kafka consumer's (TOPIC_AUTHORIZATION_FAILED) rather
    than answering its records. With ALL denied on it (so not even DESCRIBE), the pattern
    never sees pat-secret, as a Kafka pattern subscription never does, and she reads the
    other topic."""
    make_topic(serve, "pat-open")
    make_topic(serve, "pat-secret")
    serve.acl("POST", "carol", resource_type="GROUP", resource_name="g3", operation="READ")
    serve.acl("POST", "carol", resource_type="TOPIC", resource_name="*", operation="READ")
    serve.acl(
        "POST",
        "carol",
        resource_type="TOPIC",
        resource_name="pat-secret",
        operation="READ",
        permission="DENY",
    )
    with serve.client("carol") as carol:
        inst = new_instance(carol, "g3", "carolc")
        r = carol.post(
            f"{inst}/subscription", json={"topic_pattern": "pat-.*"}, headers={"Content-Type": V2}
        )
        assert r.status_code == 204, r.text
        r = fetch(carol, inst)
        denied(r)
        assert "pat-secret" in r.json()["message"]
        serve.acl(
            "DELETE",
            "carol",
            resource_type="TOPIC",
            resource_name="pat-secret",
            operation="READ",
            permission="DENY",
        )
        serve.acl(
            "POST",
            "carol",
            resource_type="TOPIC",
            resource_name="pat-secret",
            operation="ALL",
            permission="DENY",
        )
        assert fetch_until(carol, inst, 3) == ["pat-open-0", "pat-open-1", "pat-open-2"]
        assert values(fetch(carol, inst, timeout_ms=200)) == []


def test_a_revoked_read_ends_an_open_group_stream(serve: Serve) -> None:
    """Alice streams group gs's records of topic stream-t; once her READ on the topic is
    deleted, the open stream ends (within the staleness bound) with an error line
    instead of sending the records produced after."""
    make_topic(serve, "stream-t")
    serve.acl("POST", "alice", resource_type="GROUP", resource_name="gs", operation="READ")
    serve.acl("POST", "alice", resource_type="TOPIC", resource_name="stream-t", operation="READ")
    path = serve.v3("/consumer-groups/gs/records")
    params = {"topics": "stream-t", "keepalive_ms": "200"}
    lines: list[dict[str, Any]] = []
    with serve.client("alice") as alice, alice.stream("GET", path, params=params) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            doc = orjson.loads(line)
            lines.append(doc)
            if doc.get("offset") == 2:
                serve.acl(
                    "DELETE",
                    "alice",
                    resource_type="TOPIC",
                    resource_name="stream-t",
                    operation="READ",
                )
                make_topic_records(serve, "stream-t", ["after-revoke"])
            if len(lines) > 50:
                break
    values_sent = [base64.b64decode(d["value"]).decode() for d in lines if "value" in d]
    assert values_sent == ["stream-t-0", "stream-t-1", "stream-t-2"]
    assert lines[-1]["error_code"] == DENIED
    assert "stream-t" in lines[-1]["message"]


# -- Medium 8: group offset routes ---------------------------------------------------------


def reset(client: httpx.Client, serve: Serve, group: str, **body: Any) -> httpx.Response:
    return client.post(serve.v3(f"/consumer-groups/{group}/offsets:reset"), json=body)


def test_offsets_reset_needs_read_on_each_topic(serve: Serve) -> None:
    """Bob may READ group gr but not topic reset-secret: a reset of its offsets by name is
    refused, in a dry run too, and moves nothing. ``all_topics`` leaves out the topics he
    may not DESCRIBE (Kafka lists what the principal may describe) and refuses those he
    may DESCRIBE but not READ; with READ on reset-open it resets that one only."""
    make_topic(serve, "reset-open")
    make_topic(serve, "reset-secret")
    serve.acl("POST", "bob", resource_type="GROUP", resource_name="gr", operation="READ")
    with serve.client("admin") as admin:
        parts = [{"topic_name": "reset-open"}, {"topic_name": "reset-secret"}]
        r = reset(admin, serve, "gr", partitions=parts, strategy="LATEST", validate_only=False)
        assert r.status_code == 200, r.text
    secret = {"partitions": [{"topic_name": "reset-secret"}]}
    with serve.client("bob") as bob:
        for dry in (True, False):
            denied(reset(bob, serve, "gr", strategy="EARLIEST", validate_only=dry, **secret))
        r = reset(bob, serve, "gr", all_topics=True, strategy="EARLIEST", validate_only=False)
        assert r.status_code == 200 and r.json()["data"] == [], r.text
        serve.acl(
            "POST", "bob", resource_type="TOPIC", resource_name="reset-open", operation="READ"
        )
        describe = {"resource_type": "TOPIC", "resource_name": "reset-secret"}
        serve.acl("POST", "bob", operation="DESCRIBE", **describe)
        r = reset(bob, serve, "gr", all_topics=True, strategy="EARLIEST", validate_only=False)
        denied(r)
        assert "reset-secret" in r.json()["message"]
        serve.acl("DELETE", "bob", operation="DESCRIBE", **describe)
        r = reset(bob, serve, "gr", all_topics=True, strategy="EARLIEST", validate_only=False)
        assert r.status_code == 200, r.text
        assert [p["topic_name"] for p in r.json()["data"]] == ["reset-open"]
    with serve.client("admin") as admin:
        lags = admin.get(serve.v3("/consumer-groups/gr/lags")).json()["data"]
        current = {lag["topic_name"]: lag["current_offset"] for lag in lags}
        assert current == {"reset-open": 0, "reset-secret": 3}


def test_lags_and_offsets_show_only_topics_the_caller_may_describe(serve: Serve) -> None:
    """Group gl has committed offsets on lag-open and lag-secret; bob may DESCRIBE the group
    and lag-open only: the lag views, the lag summary and his own instance's committed
    offsets leave lag-secret out; asking for its lag by name is refused."""
    make_topic(serve, "lag-open")
    make_topic(serve, "lag-secret")
    with serve.client("admin") as admin:
        parts = [{"topic_name": "lag-open"}, {"topic_name": "lag-secret"}]
        r = reset(admin, serve, "gl", partitions=parts, strategy="EARLIEST", validate_only=False)
        assert r.status_code == 200, r.text
    serve.acl("POST", "bob", resource_type="GROUP", resource_name="gl", operation="READ")
    serve.acl("POST", "bob", resource_type="TOPIC", resource_name="lag-open", operation="DESCRIBE")
    with serve.client("bob") as bob:
        lags = bob.get(serve.v3("/consumer-groups/gl/lags"))
        assert [lag["topic_name"] for lag in lags.json()["data"]] == ["lag-open"]
        summary = bob.get(serve.v3("/consumer-groups/gl/lag-summary")).json()
        assert summary["max_lag_topic_name"] == "lag-open" and summary["total_lag"] == 3
        denied(bob.get(serve.v3("/consumer-groups/gl/lags/lag-secret/partitions/0")))
        inst = new_instance(bob, "gl", "bobc")
        both = [{"topic": "lag-open", "partition": 0}, {"topic": "lag-secret", "partition": 0}]
        r = bob.request(
            "GET", f"{inst}/offsets", json={"partitions": both}, headers={"Content-Type": V2}
        )
        assert r.status_code == 200, r.text
        assert [o["topic"] for o in r.json()["offsets"]] == ["lag-open"]
        bob.delete(inst)


# -- Medium 5: schema registry writes through produce --------------------------------------

S1 = '{"type":"record","name":"Payment","fields":[{"name":"a","type":"string"}]}'
S2 = (
    '{"type":"record","name":"Payment","fields":[{"name":"a","type":"string"},'
    '{"name":"b","type":["null","string"],"default":null}]}'
)
AVRO_V2 = "application/vnd.kafka.avro.v2+json"
REGISTRY = "application/vnd.schemaregistry.v1+json"


def v3_produce(client: httpx.Client, serve: Serve, topic: str, value: dict[str, Any]) -> Any:
    """One v3 record; its delivery report."""
    r = client.post(serve.v3(f"/topics/{topic}/records"), json={"value": value})
    assert r.status_code == 200, r.text
    return orjson.loads(r.content.split(b"\r\n")[0])


def versions(serve: Serve, subject: str) -> list[int]:
    with serve.client("admin") as admin:
        r = admin.get(f"/subjects/{subject}/versions")
        assert r.status_code == 200, r.text
        return list(r.json())


def test_registering_through_produce_needs_the_right_to_register(serve: Serve) -> None:
    """Bob may write topic bob-t and nothing on the registry: a v3 produce naming subject
    pay-value with a new schema is refused and registers nothing (a direct POST
    /subjects/pay-value/versions is 403 too); his answers for a subject that exists and one
    that does not are the same, so he cannot probe subjects. Carol, who may read the
    registry (DESCRIBE on the cluster) but not change it (ALTER), produces with a schema
    already registered, by text or version, but a new one is refused, as a serializer
    with auto.register.schemas=false finds it missing. v2 avro produce auto-registers under
    the topic's subject only with the right to register."""
    with serve.client("admin") as admin:
        r = admin.post(
            "/subjects/pay-value/versions", json={"schema": S1}, headers={"Content-Type": REGISTRY}
        )
        assert r.status_code == 200, r.text
    make_topic(serve, "bob-t", records=0)
    make_topic(serve, "carol-t", records=0)
    serve.acl("POST", "bob", resource_type="TOPIC", resource_name="bob-t", operation="WRITE")
    serve.acl("POST", "carol", resource_type="TOPIC", resource_name="carol-t", operation="WRITE")
    cluster = {"resource_type": "CLUSTER", "resource_name": "kafka-cluster"}
    serve.acl("POST", "carol", operation="DESCRIBE", **cluster)
    new = {"type": "AVRO", "subject": "pay-value", "schema": S2, "data": {"a": "x", "b": None}}
    with serve.client("bob") as bob:
        denied(
            bob.post(
                "/subjects/pay-value/versions",
                json={"schema": S2},
                headers={"Content-Type": REGISTRY},
            )
        )
        report = v3_produce(bob, serve, "bob-t", new)
        assert report["error_code"] == DENIED, report
        probes = [
            v3_produce(
                bob,
                serve,
                "bob-t",
                {"type": "AVRO", "subject": s, "schema_version": 1, "data": {"a": "x"}},
            )
            for s in ("pay-value", "nope-value")
        ]
        assert probes[0]["error_code"] == probes[1]["error_code"] == DENIED, probes
        assert probes[0]["message"] == probes[1]["message"].replace("nope-value", "pay-value")
        v2 = bob.post(
            "/topics/bob-t",
            json={"value_schema": S1, "records": [{"value": {"a": "x"}}]},
            headers={"Content-Type": AVRO_V2},
        )
        denied(v2)
    assert versions(serve, "pay-value") == [1]
    with serve.client("carol") as carol:
        old = {"type": "AVRO", "subject": "pay-value", "schema": S1, "data": {"a": "x"}}
        assert v3_produce(carol, serve, "carol-t", old)["error_code"] == 200
        by_version = {
            "type": "AVRO",
            "subject": "pay-value",
            "schema_version": 1,
            "data": {"a": "y"},
        }
        assert v3_produce(carol, serve, "carol-t", by_version)["error_code"] == 200
        report = v3_produce(carol, serve, "carol-t", new)
        assert report["error_code"] == DENIED, report
        assert "ALTER" in report["message"]
    assert versions(serve, "pay-value") == [1]


# -- Medium 6: login throttling --------------------------------------------------------------


def from_address(address: str) -> dict[str, str]:
    """The client address a trusted proxy (this test, from 127.0.0.1: the agents'
    default ``forwarded_allow_ips``) reports."""
    return {"X-Forwarded-For": address}


def kafka_admin_can_list(serve: Serve, user: str) -> bool:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(
        {
            "bootstrap.servers": serve.kafka,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": PASSWORDS[user],
        }
    )
    try:
        admin.list_topics(timeout=10)
    except Exception:
        return False
    return True


def test_bad_passwords_from_one_address_lock_out_only_that_address(serve: Serve) -> None:
    """Twelve bad passwords for admin from 10.66.0.1 throttle that address (429), but admin
    still logs in from 10.1.0.1 and over Kafka from 127.0.0.1: nobody can lock the admin
    out everywhere."""
    codes = []
    for i in range(12):
        r = httpx.get(
            f"{serve.rest}/v3/clusters",
            auth=httpx.BasicAuth("admin", f"guess-{i}-guess"),
            headers=from_address("10.66.0.1"),
        )
        codes.append(r.status_code)
    assert codes[:10] == [401] * 10 and codes[10:] == [429, 429], codes
    throttled = httpx.get(
        f"{serve.rest}/v3/clusters", auth=auth("admin"), headers=from_address("10.66.0.1")
    )
    assert throttled.status_code == 429
    assert int(throttled.headers["retry-after"]) >= 1
    ok = httpx.get(
        f"{serve.rest}/v3/clusters", auth=auth("admin"), headers=from_address("10.1.0.1")
    )
    assert ok.status_code == 200, ok.text
    assert kafka_admin_can_list(serve, "admin")


def test_concurrent_guesses_are_throttled_before_they_are_checked(serve: Serve) -> None:
    """The race: 300 guesses of carol's password sent at once from one address, while the
    limit is 10 failures a minute. At most 10 of them are checked (401); every other one is
    refused (429) without a check."""

    async def guess_all() -> list[int]:
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(base_url=serve.rest, limits=limits, timeout=60) as c:

            async def guess(i: int) -> int:
                r = await c.get(
                    "/v3/clusters",
                    auth=httpx.BasicAuth("carol", f"wrong-{i}-password"),
                    headers=from_address("10.77.0.1"),
                )
                return r.status_code

            return await asyncio.gather(*(guess(i) for i in range(300)))

    codes = asyncio.run(guess_all())
    assert set(codes) <= {401, 429}
    assert 1 <= codes.count(401) <= 10, codes.count(401)


# -- Low: what a SCRAM exchange tells about users --------------------------------------------


def scram_server_first(serve: Serve, user: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, str]:
    """The attributes of the agent's server-first message to a SCRAM client-first for
    ``user`` (raw Kafka: SaslHandshake, then SaslAuthenticate)."""
    from tests.integration.test_kafka_acl import Raw

    raw = Raw.__new__(Raw)  # its framing, without its PLAIN login
    host, port = serve.kafka.rsplit(":", 1)
    raw.sock = socket.create_connection((host, int(port)), timeout=30)
    raw.correlation = 0
    try:
        assert raw.call(17, 1, mechanism=mechanism).error_code == 0
        first = f"n,,n={user},r=fyko+d2lbbFgONRv9qkxdawL".encode()
        answer = raw.call(36, 2, auth_bytes=first)
        assert answer.error_code == 0, answer
        return dict(p.split("=", 1) for p in answer.auth_bytes.decode().split(","))
    finally:
        raw.close()


def test_scram_does_not_tell_which_users_exist(serve: Serve) -> None:
    """The server-first message of an unknown user has the same form as a real user's, and
    the same salt every time (a random one each time would tell them apart)."""
    nobody = [scram_server_first(serve, "nobody-here") for _ in range(2)]
    alice = [scram_server_first(serve, "alice") for _ in range(2)]
    assert nobody[0]["s"] == nobody[1]["s"]
    assert alice[0]["s"] == alice[1]["s"]
    assert nobody[0]["s"] != alice[0]["s"]
    assert nobody[0]["i"] == alice[0]["i"]
    assert sorted(nobody[0]) == sorted(alice[0]) == ["i", "r", "s"]
    assert len(base64.b64decode(nobody[0]["s"])) == len(base64.b64decode(alice[0]["s"]))


def test_protected_metrics_need_describe_on_the_cluster(serve: Serve) -> None:
    """/metrics names every group and topic: with protect_metrics it needs a credential
    (401 without) and DESCRIBE on the cluster (403 for bob); /health stays open."""
    assert httpx.get(f"{serve.rest}/health").status_code == 200
    r = httpx.get(f"{serve.rest}/metrics")
    assert r.status_code == 401, r.text[:200]
    with serve.client("bob") as bob:
        denied(bob.get("/metrics"))
    with serve.client("admin") as admin:
        r = admin.get("/metrics")
        assert r.status_code == 200 and "lakelog_" in r.text


# -- Low: files on disk ------------------------------------------------------------------------


def test_the_database_and_the_data_are_readable_by_their_owner_only(serve: Serve) -> None:
    """The metadata database (password hashes, SCRAM verifiers) with its WAL, and the
    file:// store's directories and objects (every record), carry no group or other
    permission."""
    make_topic(serve, "on-disk")  # at least one object written
    db = serve.tmp / "meta.db"
    files = [db, db.with_name("meta.db-wal")]
    data = serve.tmp / "data"
    objects = [p for p in data.rglob("*") if p.is_file()]
    assert objects, "nothing written to the store"
    dirs = [data, *(p for p in data.rglob("*") if p.is_dir())]
    for path in [*files, *objects, *dirs]:
        mode = path.stat().st_mode & 0o777
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"


# -- every door by Kafka's rules ---------------------------------------------------------------


def test_creating_a_topic_takes_create_on_the_cluster_or_on_the_topic(serve: Serve) -> None:
    """Kafka's CreateTopics: CREATE on the cluster, or on the topic, at the REST door too
    (carol has the first, bob the second for made-by-bob only)."""
    serve.acl(
        "POST", "carol", resource_type="CLUSTER", resource_name="kafka-cluster", operation="CREATE"
    )
    serve.acl("POST", "bob", resource_type="TOPIC", resource_name="made-by-bob", operation="CREATE")
    with serve.client("carol") as carol, serve.client("bob") as bob:
        r = carol.post(serve.v3("/topics"), json={"topic_name": "made-by-carol"})
        assert r.status_code == 201, r.text
        r = bob.post(serve.v3("/topics"), json={"topic_name": "made-by-bob"})
        assert r.status_code == 201, r.text
        denied(bob.post(serve.v3("/topics"), json={"topic_name": "not-bobs"}))
