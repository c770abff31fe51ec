"""Kafka ACLs on the Kafka listener, with real clients against one ``lakelog serve`` with
SASL and ``authorization=acl`` (shared by the module).

- every API the listener serves, sent raw (kio's messages) by a user without ACLs: the
  exact code Kafka gives (29/30/31/53), and nothing stored;
- the same raw requests allowed by exactly the ACL Kafka names, and a request partly
  allowed served in part;
- confluent-kafka (and aiokafka) producers and consumers: denied without ACLs, allowed
  with them, DENY over ALLOW, PREFIXED patterns, KIP-679's idempotent producer with WRITE
  on a topic;
- listings filtered: Metadata, ListGroups, OffsetFetch;
- the super user may do everything;
- CreateAcls/DescribeAcls/DeleteAcls through confluent-kafka's and kafka-python's admin
  clients, the same ACLs REST v3 ``/acls`` shows and changes.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError as AioTopicAuthorizationFailedError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KResourceType
from kafka.errors import ClusterAuthorizationFailedError

from service.kafka.framing import request_class
from service.kafka.server import HANDLERS
from tests.integration.test_security_processes import start_secured_serve
from tests.kafka_wire import make, read_answer, request_frame
from tests.procs import Proc

ADMIN_PASSWORD = "kafka-admin-password-1"
PASSWORDS = {"alice": "alice-password-Kw9", "bob": "bob-password-Rt5"}
T, G = "acl-t", "acl-g"
TOPICS = ("acl-t", "alice-t", "dw-open", "dw-secret", "pre-a", "other")


@dataclass
class Cluster:
    rest: str
    bootstrap: str
    cluster_id: str
    proc: Proc

    def acls_url(self) -> str:
        return f"{self.rest}/v3/clusters/{self.cluster_id}/acls"


def basic(user: str = "admin") -> dict[str, str]:
    password = ADMIN_PASSWORD if user == "admin" else PASSWORDS[user]
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def sasl(cluster: Cluster, user: str, password: str | None = None) -> dict[str, Any]:
    return {
        "bootstrap.servers": cluster.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": password
        or (ADMIN_PASSWORD if user == "admin" else PASSWORDS.get(user, "")),
    }


def rest_acl(cluster: Cluster, method: str, **fields: str) -> httpx.Response:
    if method == "POST":
        return httpx.post(cluster.acls_url(), json=fields, headers=basic())
    return httpx.request(method, cluster.acls_url(), params=fields, headers=basic())


def allow(
    cluster: Cluster,
    principal: str,
    resource_type: str,
    resource_name: str,
    operation: str,
    pattern_type: str = "LITERAL",
) -> None:
    """Grant ``principal`` one ALLOW binding (any host) through the REST API (201)."""
    r = rest_acl(
        cluster,
        "POST",
        principal=principal,
        host="*",
        resource_type=resource_type,
        resource_name=resource_name,
        pattern_type=pattern_type,
        operation=operation,
        permission="ALLOW",
    )
    assert r.status_code == 201, r.text


def end_offset(cluster: Cluster, topic: str) -> int:
    r = httpx.get(f"{cluster.rest}/topics/{topic}/partitions/0/offsets", headers=basic())
    return int(r.json()["end_offset"])


def produce(
    cluster: Cluster, user: str, topic: str, value: bytes, **conf: Any
) -> KafkaError | None:
    """One record through confluent-kafka as ``user``: the delivery error, None if stored."""
    p = Producer({**sasl(cluster, user), "message.timeout.ms": 10000, **conf})
    reports: list[KafkaError | None] = []
    p.produce(topic, value=value, partition=0, on_delivery=lambda e, m: reports.append(e))
    p.flush(20)
    assert len(reports) == 1
    return reports[0]


def kafka_python_admin(cluster: Cluster, user: str) -> KafkaAdminClient:
    """kafka-python's admin client, logged in as ``user`` with SASL/PLAIN."""
    return KafkaAdminClient(
        bootstrap_servers=cluster.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username=user,
        sasl_plain_password=ADMIN_PASSWORD if user == "admin" else PASSWORDS[user],
    )


def topic_names(cluster: Cluster, user: str) -> set[str]:
    """The topics kafka-python's admin client lists for ``user`` (Metadata of all topics)."""
    admin = kafka_python_admin(cluster, user)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def consume_one(cluster: Cluster, user: str, topic: str, group: str) -> Any:
    """The first message (or error event) of partition 0 from offset 0, as ``user``."""
    c = Consumer({**sasl(cluster, user), "group.id": group, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                return m
        raise AssertionError(f"nothing from {topic} in 20 s")
    finally:
        c.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("kafka-acl")
    proc, port, kport = start_secured_serve(
        tmp,
        "admin",
        ADMIN_PASSWORD,
        {
            "LAKELOG_AUTHORIZATION": "acl",
            "LAKELOG_SUPER_USERS": "User:admin",
            "LAKELOG_AUTH_MAX_FAILURES": "1000000",
            "LAKELOG_AUTO_CREATE_TOPICS": "true",
            # Every ACL change here goes through this agent (REST or Kafka) and must drop
            # its copy at once: a long bound makes a change that did not fail the tests.
            "LAKELOG_AUTH_CACHE_TTL_S": "300",
        },
    )
    try:
        rest = f"http://127.0.0.1:{port}"
        cid = httpx.get(f"{rest}/v3/clusters", headers=basic()).json()["data"][0]["cluster_id"]
        c = Cluster(rest, f"127.0.0.1:{kport}", cid, proc)
        for name, password in PASSWORDS.items():
            r = httpx.post(
                f"{rest}/security/users",
                json={"name": name, "password": password},
                headers=basic(),
            )
            assert r.status_code == 201, r.text
        for topic in TOPICS:
            r = httpx.post(
                f"{rest}/v3/clusters/{cid}/topics",
                json={"topic_name": topic, "partitions_count": 1},
                headers=basic(),
            )
            assert r.status_code == 201, r.text
            assert produce(c, "admin", topic, b"first of " + topic.encode()) is None
        # Group G with a committed offset on T (the super user's, as a simple consumer).
        admin = Consumer({**sasl(c, "admin"), "group.id": G, "enable.auto.commit": False})
        admin.commit(offsets=[TopicPartition(T, 0, 1)], asynchronous=False)
        admin.close()
        yield c
    finally:
        proc.stop()
    out = proc.output()
    assert ADMIN_PASSWORD not in out and all(p not in out for p in PASSWORDS.values())


# -- every API, raw, as a user without ACLs ------------------------------------------------


class Raw:
    """A bare Kafka connection speaking kio's messages: SASL/PLAIN, then any request."""

    def __init__(self, bootstrap: str, user: str, password: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation = 0
        assert self.call(17, 1, mechanism="PLAIN").error_code == 0
        token = b"\0" + user.encode() + b"\0" + password.encode()
        self.auth = self.call(36, 2, auth_bytes=token)

    def close(self) -> None:
        self.sock.close()

    def call(self, api_key: int, version: int | None = None, **given: Any) -> Any:
        """Send one request (``version``: the highest served), return its decoded answer."""
        cls = request_class(api_key, HANDLERS[api_key][1] if version is None else version)
        self.correlation += 1
        self.sock.sendall(request_frame(make(cls, **given), self.correlation, "raw-acl"))
        return read_answer(self.sock, cls, self.correlation)


def batch(value: bytes) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    b.append(0, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
    return bytes(b.build())


def _parts(resp: Any, topics: str, parts: str) -> list[int]:
    return [int(p.error_code) for t in getattr(resp, topics) for p in getattr(t, parts)]


TP = {"partition_index": 0}
MATRIX: dict[int, tuple[dict[str, Any], Callable[[Any], list[int]], list[int]]] = {
    # api key: (request fields, the answer's codes, the codes Kafka gives)
    0: (
        {
            "acks": -1,
            "timeout": 10000,
            "topic_data": [
                {"name": T, "partition_data": [{"index": 0, "records": batch(b"no")}]},
                {"name": "no-such-topic", "partition_data": [{"index": 0, "records": batch(b"x")}]},
            ],
        },
        lambda r: _parts(r, "responses", "partition_responses"),
        [29, 29],  # an unknown topic too: existence is not leaked
    ),
    1: (
        {
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "topics": [
                {
                    "topic": T,
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1000}
                    ],
                }
            ],
            "rack_id": "",
        },
        lambda r: _parts(r, "responses", "partitions"),
        [29],
    ),
    2: (
        {"isolation_level": 0, "topics": [{"name": T, "partitions": [{**TP, "timestamp": -1}]}]},
        lambda r: _parts(r, "topics", "partitions"),
        [29],
    ),
    3: (
        {
            "topics": [{"name": T}, {"name": "no-such-topic"}],
            "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False,
        },
        lambda r: [int(t.error_code) for t in r.topics],
        [29, 29],  # and no-such-topic is not auto-created (bob may not CREATE)
    ),
    8: (
        {
            "group_id": G,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "topics": [
                {"name": T, "partitions": [{**TP, "committed_offset": 0, "committed_metadata": ""}]}
            ],
        },
        lambda r: _parts(r, "topics", "partitions"),
        [30],
    ),
    9: (
        {"group_id": G, "topics": [{"name": T, "partition_indexes": [0]}], "require_stable": False},
        lambda r: [int(r.error_code), len(r.topics)],
        [30, 0],
    ),
    10: (
        {"key_type": 0, "coordinator_keys": [G]},
        lambda r: [int(c.error_code) for c in r.coordinators],
        [30],
    ),
    11: (
        {
            "group_id": G,
            "session_timeout": 6000,
            "rebalance_timeout": 6000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
        },
        lambda r: [int(r.error_code)],
        [30],
    ),
    12: (
        {"group_id": G, "generation_id": 1, "member_id": "m"},
        lambda r: [int(r.error_code)],
        [30],
    ),
    13: ({"group_id": G, "members": [{"member_id": "m"}]}, lambda r: [int(r.error_code)], [30]),
    14: (
        {"group_id": G, "generation_id": 1, "member_id": "m", "assignments": []},
        lambda r: [int(r.error_code)],
        [30],
    ),
    15: ({"groups": [G]}, lambda r: [int(g.error_code) for g in r.groups], [30]),
    16: ({"states_filter": ()}, lambda r: [int(r.error_code), len(r.groups)], [0, 0]),
    18: ({}, lambda r: [int(r.error_code)], [0]),
    19: (
        {
            "topics": [{"name": "bob-new", "num_partitions": 1, "replication_factor": 1}],
            "timeout": 10000,
            "validate_only": False,
        },
        lambda r: [int(t.error_code) for t in r.topics],
        [29],
    ),
    20: (
        {"topic_names": [T], "timeout": 10000},
        lambda r: [int(t.error_code) for t in r.responses],
        [29],
    ),
    21: (
        {"topics": [{"name": T, "partitions": [{**TP, "offset": 1}]}], "timeout": 10000},
        lambda r: _parts(r, "topics", "partitions"),
        [29],
    ),
    22: (
        {"transactional_id": None, "transaction_timeout": 60000},
        lambda r: [int(r.error_code)],
        [31],
    ),
    23: (
        {
            "replica_id": -1,
            "topics": [
                {
                    "topic": T,
                    "partitions": [{"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}],
                }
            ],
        },
        lambda r: _parts(r, "topics", "partitions"),
        [29],
    ),
    # AddPartitionsToTxn as clients send it (v3, BY_NAME): WRITE on the transactional id
    # first, every partition gets 53.
    24: (
        {
            "v3_and_below_transactional_id": "tx-1",
            "v3_and_below_producer_id": 1,
            "v3_and_below_producer_epoch": 0,
            "v3_and_below_topics": [{"name": T, "partitions": [0]}],
        },
        lambda r: [
            int(p.partition_error_code)
            for t in r.results_by_topic_v3_and_below
            for p in t.results_by_partition
        ],
        [53],
    ),
    25: (
        {"transactional_id": "tx-1", "producer_id": 1, "producer_epoch": 0, "group_id": G},
        lambda r: [int(r.error_code)],
        [53],
    ),
    26: (
        {"transactional_id": "tx-1", "producer_id": 1, "producer_epoch": 0, "committed": True},
        lambda r: [int(r.error_code)],
        [53],
    ),
    28: (
        {
            "transactional_id": "tx-1",
            "group_id": G,
            "producer_id": 1,
            "producer_epoch": 0,
            "topics": [
                {"name": T, "partitions": [{**TP, "committed_offset": 5, "committed_metadata": ""}]}
            ],
        },
        lambda r: _parts(r, "topics", "partitions"),
        [53],
    ),
    29: (
        {
            "resource_type_filter": 1,
            "resource_name_filter": None,
            "pattern_type_filter": 1,
            "operation": 1,
            "permission_type": 1,
        },
        lambda r: [int(r.error_code), len(r.resources)],
        [31, 0],
    ),
    30: (
        {
            "creations": [
                {
                    "resource_type": 2,
                    "resource_name": T,
                    "resource_pattern_type": 3,
                    "principal": "User:bob",
                    "host": "*",
                    "operation": 3,
                    "permission_type": 3,
                }
            ]
        },
        lambda r: [int(c.error_code) for c in r.results],
        [31],
    ),
    31: (
        {
            "filters": [
                {
                    "resource_type_filter": 1,
                    "pattern_type_filter": 1,
                    "operation": 1,
                    "permission_type": 1,
                }
            ]
        },
        lambda r: [int(f.error_code) for f in r.filter_results],
        [31],
    ),
    32: (
        {
            "resources": [
                {"resource_type": 2, "resource_name": T},
                {"resource_type": 4, "resource_name": "0"},
            ]
        },
        lambda r: [int(x.error_code) for x in r.results],
        [29, 31],
    ),
    33: (
        {
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": T,
                    "configs": [{"name": "retention.ms", "value": "1"}],
                },
                {"resource_type": 4, "resource_name": "0", "configs": []},
            ],
            "validate_only": False,
        },
        lambda r: [int(x.error_code) for x in r.responses],
        [29, 31],
    ),
    37: (
        {"topics": [{"name": T, "count": 3}], "timeout": 10000, "validate_only": False},
        lambda r: [int(x.error_code) for x in r.results],
        [29],
    ),
    42: ({"groups_names": [G]}, lambda r: [int(x.error_code) for x in r.results], [30]),
    44: (
        {
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": T,
                    "configs": [{"name": "retention.ms", "config_operation": 0, "value": "1"}],
                }
            ],
            "validate_only": False,
        },
        lambda r: [int(x.error_code) for x in r.responses],
        [29],
    ),
    # Kafka answers DescribeCluster to any authenticated client.
    60: ({"endpoint_type": 1}, lambda r: [int(r.error_code)], [0]),
    68: (
        {
            "group_id": G,
            "member_id": "bob-member",
            "member_epoch": 0,
            "rebalance_timeout": 30000,
            "subscribed_topic_names": [T],
            "topic_partitions": [],
        },
        lambda r: [int(r.error_code)],
        [30],
    ),
    65: (
        {"transactional_ids": ["tx-1"]},
        lambda r: [int(t.error_code) for t in r.transaction_states],
        [53],
    ),
    # ListTransactions lists only the ids the principal may DESCRIBE: none.
    66: ({}, lambda r: [int(r.error_code), len(r.transaction_states)], [0, 0]),
    69: ({"group_ids": [G]}, lambda r: [int(g.error_code) for g in r.groups], [30]),
    75: (
        {"topics": [{"name": T}, {"name": "no-such-topic"}], "response_partition_limit": 100},
        lambda r: [int(t.error_code) for t in r.topics],
        [29, 29],
    ),
}

#: The matrix names topics by name: these APIs are sent at their newest version that
#: does (topics by id: ``test_topic_ids_tell_nothing_to_a_user_without_acls``); and
#: AddPartitionsToTxn at the clients' newest (v4+ is brokers': CLUSTER_ACTION, below).
BY_NAME = {0: 12, 1: 12, 8: 9, 9: 7, 20: 5, 24: 3}


def test_the_matrix_covers_every_served_api() -> None:
    assert sorted(MATRIX) == sorted(HANDLERS)


def _state(cluster: Cluster) -> dict[str, Any]:
    """What a denied request must not change."""
    admin = AdminClient(sasl(cluster, "admin"))
    topics = httpx.get(
        f"{cluster.rest}/v3/clusters/{cluster.cluster_id}/topics", headers=basic()
    ).json()["data"]
    g = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(G)])[G].result()
    configs = httpx.get(
        f"{cluster.rest}/v3/clusters/{cluster.cluster_id}/topics/{T}/configs/retention.ms",
        headers=basic(),
    ).json()["value"]
    offsets = httpx.get(f"{cluster.rest}/topics/{T}/partitions/0/offsets", headers=basic()).json()
    return {
        "topics": {t["topic_name"]: t["partitions_count"] for t in topics},
        "group": [(p.topic, p.partition, p.offset) for p in g.topic_partitions],
        "retention": configs,
        "offsets": offsets,
        "acls": httpx.get(cluster.acls_url(), headers=basic()).json()["data"],
    }


@pytest.mark.parametrize("api_key", sorted(MATRIX))
def test_every_api_without_acls_gets_kafkas_code_and_changes_nothing(
    cluster: Cluster, api_key: int
) -> None:
    before = _state(cluster)
    raw = Raw(cluster.bootstrap, "bob", PASSWORDS["bob"])
    try:
        assert raw.auth.error_code == 0
        fields, codes, expected = MATRIX[api_key]
        assert codes(raw.call(api_key, BY_NAME.get(api_key), **fields)) == expected
    finally:
        raw.close()
    assert _state(cluster) == before


def test_topic_ids_tell_nothing_to_a_user_without_acls(cluster: Cluster) -> None:
    """Topic-id versions (Produce v13, Fetch v13+, Metadata, OffsetCommit/OffsetFetch v10,
    DeleteTopics v6) name a topic by id: bob, without ACLs, gets 29 for an existing
    topic's id (its name withheld) and stores, reads or deletes nothing; an id no topic
    has is UNKNOWN_TOPIC_ID (100), as Kafka answers it (ids are not guessable)."""
    import uuid as uuid_

    admin_raw = Raw(cluster.bootstrap, "admin", ADMIN_PASSWORD)
    try:
        md = admin_raw.call(3, topics=[{"name": T}], allow_auto_topic_creation=False)
        tid = md.topics[0].topic_id
    finally:
        admin_raw.close()
    before = _state(cluster)
    unknown = uuid_.uuid4()
    raw = Raw(cluster.bootstrap, "bob", PASSWORDS["bob"])
    try:
        produced = raw.call(
            0,
            acks=-1,
            timeout=10000,
            topic_data=[
                {"topic_id": tid, "partition_data": [{"index": 0, "records": batch(b"no")}]},
                {"topic_id": unknown, "partition_data": [{"index": 0, "records": batch(b"x")}]},
            ],
        )
        assert _parts(produced, "responses", "partition_responses") == [29, 100]
        fetched = raw.call(
            1,
            max_wait=0,
            min_bytes=1,
            max_bytes=1 << 20,
            topics=[
                {
                    "topic_id": tid,
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1000}
                    ],
                }
            ],
        )
        assert _parts(fetched, "responses", "partitions") == [29]
        assert fetched.responses[0].partitions[0].records in (None, b"")
        named = raw.call(3, topics=[{"topic_id": tid, "name": None}])
        assert [(t.error_code, t.name) for t in named.topics] == [(29, None)]
        gone = raw.call(20, topics=[{"topic_id": tid, "name": None}], timeout=10000)
        assert [(t.error_code, t.name) for t in gone.responses] == [(29, None)]
    finally:
        raw.close()
    assert _state(cluster) == before


def test_find_coordinator_and_init_producer_id_of_a_transactional_id(cluster: Cluster) -> None:
    raw = Raw(cluster.bootstrap, "bob", PASSWORDS["bob"])
    try:
        assert raw.call(22, transactional_id="tx-1", transaction_timeout=60000).error_code == 53
        found = raw.call(10, key_type=1, coordinator_keys=["tx-1"])
        assert [c.error_code for c in found.coordinators] == [53]
        # AddPartitionsToTxn v4+, the brokers' batched form, needs CLUSTER_ACTION.
        batched = raw.call(24, transactions=[{"transactional_id": "tx-1", "topics": []}])
        assert (batched.error_code, batched.results_by_transaction) == (31, ())
        assert raw.call(10, 3, key_type=0, key=G).error_code == 30  # before KIP-699 too
    finally:
        raw.close()


def test_a_transactional_producer_with_the_acls_kafka_names(cluster: Cluster) -> None:
    """tina may WRITE tina-t and tina-tx (the transactional id) and READ tina-g: her
    transactional producer commits records and the group's offsets. Without WRITE on the
    transactional id, init_transactions() fails with TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    and a Produce of transactional batches is refused whole."""
    r = httpx.post(
        f"{cluster.rest}/security/users",
        json={"name": "tina", "password": "tina-password-Zq4"},
        headers=basic(),
    )
    assert r.status_code == 201
    r = httpx.post(
        f"{cluster.rest}/v3/clusters/{cluster.cluster_id}/topics",
        json={"topic_name": "tina-t", "partitions_count": 1},
        headers=basic(),
    )
    assert r.status_code == 201, r.text
    for rtype, name, op in (
        ("TOPIC", "tina-t", "WRITE"),
        ("TRANSACTIONAL_ID", "tina-tx", "WRITE"),
        ("GROUP", "tina-g", "READ"),
        ("TOPIC", T, "READ"),  # the offsets it commits are T's
    ):
        allow(cluster, "User:tina", rtype, name, op)
    tina = sasl(cluster, "tina", "tina-password-Zq4")
    p = Producer({**tina, "transactional.id": "tina-tx"})
    p.init_transactions(20)
    p.begin_transaction()
    p.produce("tina-t", value=b"in a transaction", partition=0)
    group = Consumer({**tina, "group.id": "tina-g", "enable.auto.commit": False})
    p.send_offsets_to_transaction([TopicPartition(T, 0, 1)], group.consumer_group_metadata(), 20)
    group.close()
    p.commit_transaction(20)
    assert consume_one(cluster, "admin", "tina-t", "tina-reader").value() == b"in a transaction"
    admin = AdminClient(sasl(cluster, "admin"))
    got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("tina-g")])
    assert [(t.topic, t.offset) for t in got["tina-g"].result().topic_partitions] == [(T, 1)]

    denied = Producer({**tina, "transactional.id": "not-tinas"})
    with pytest.raises(KafkaException) as failed:
        denied.init_transactions(20)
    assert failed.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    before = end_offset(cluster, "tina-t")
    raw = Raw(cluster.bootstrap, "tina", "tina-password-Zq4")
    try:
        b = DefaultRecordBatchBuilder(2, 0, 1, 5, 0, 0, 1 << 20)  # transactional, producer 5
        b.append(0, timestamp=int(time.time() * 1000), key=None, value=b"x", headers=[])
        produced = raw.call(
            0,
            BY_NAME[0],
            transactional_id="not-tinas",
            acks=-1,
            timeout=10000,
            topic_data=[
                {"name": "tina-t", "partition_data": [{"index": 0, "records": bytes(b.build())}]}
            ],
        )
        assert _parts(produced, "responses", "partition_responses") == [53]
    finally:
        raw.close()
    assert end_offset(cluster, "tina-t") == before


def test_bad_password_and_no_sasl_store_nothing(cluster: Cluster) -> None:
    before = end_offset(cluster, T)
    raw = Raw(cluster.bootstrap, "bob", "wrong-password")
    assert raw.auth.error_code == 58  # SASL_AUTHENTICATION_FAILED
    raw.close()
    err = produce(cluster, "bob", T, b"no", **{"sasl.password": "wrong-password"})
    assert err is not None
    err = produce(cluster, "bob", T, b"no", **{"security.protocol": "PLAINTEXT"})
    assert err is not None
    assert end_offset(cluster, T) == before


# -- real clients ----------------------------------------------------------------------------


def test_confluent_kafka_without_acls_is_denied(cluster: Cluster) -> None:
    before = end_offset(cluster, T)
    err = produce(cluster, "bob", T, b"denied")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert end_offset(cluster, T) == before
    # confluent-kafka's consumer asks for its group's coordinator first: refused.
    codes: set[int] = set()
    c = Consumer(
        {
            **sasl(cluster, "bob"),
            "group.id": "bob-g",
            "enable.auto.commit": False,
            "error_cb": lambda e: codes.add(e.code()),
        }
    )
    c.assign([TopicPartition(T, 0, 0)])
    try:
        deadline = time.monotonic() + 20
        while not codes and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is not None, m.value()
                codes.add(m.error().code())
    finally:
        c.close()
    assert codes == {KafkaError.GROUP_AUTHORIZATION_FAILED}

    # aiokafka's producer learns from Metadata that the topic is not authorized.
    async def send() -> None:
        p = AIOKafkaProducer(
            bootstrap_servers=cluster.bootstrap,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username="bob",
            sasl_plain_password=PASSWORDS["bob"],
            request_timeout_ms=10000,
        )
        await p.start()
        try:
            await p.send_and_wait(T, b"denied", partition=0)
        finally:
            await p.stop()

    with pytest.raises(AioTopicAuthorizationFailedError):
        asyncio.run(send())
    assert end_offset(cluster, T) == before


def test_acls_made_by_kafka_create_acls_allow_and_show_on_rest(cluster: Cluster) -> None:
    admin = AdminClient(sasl(cluster, "admin"))

    def binding(rtype: ResourceType, name: str, op: AclOperation) -> AclBinding:
        return AclBinding(
            rtype, name, ResourcePatternType.LITERAL, "User:alice", "*", op, AclPermissionType.ALLOW
        )

    wanted = [
        binding(ResourceType.TOPIC, "alice-t", AclOperation.WRITE),
        binding(ResourceType.TOPIC, "alice-t", AclOperation.READ),
        binding(ResourceType.GROUP, "alice-g", AclOperation.READ),
    ]
    for f in admin.create_acls(wanted).values():
        assert f.result() is None
    listed = rest_acl(cluster, "GET", principal="User:alice", resource_name="alice-t").json()
    assert sorted(a["operation"] for a in listed["data"]) == ["READ", "WRITE"]
    # An idempotent producer: InitProducerId allowed by WRITE on a topic (KIP-679).
    assert (
        produce(cluster, "alice", "alice-t", b"from alice", **{"enable.idempotence": True}) is None
    )
    c = Consumer({**sasl(cluster, "alice"), "group.id": "alice-g", "auto.offset.reset": "earliest"})
    c.subscribe(["alice-t"])
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m.value())
        assert got == [b"first of alice-t", b"from alice"]
        c.commit(asynchronous=False)  # OffsetCommit: READ on the group and the topic
    finally:
        c.close()
    # ...and a topic it has nothing on stays closed, whatever the group.
    assert produce(cluster, "alice", T, b"no").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_deny_wins_and_prefixed_patterns_allow_made_on_rest(cluster: Cluster) -> None:
    made = [
        dict(resource_type="TOPIC", resource_name="dw-", pattern_type="PREFIXED", operation="READ"),
        dict(
            resource_type="TOPIC",
            resource_name="dw-secret",
            pattern_type="LITERAL",
            operation="READ",
            permission="DENY",
        ),
        dict(
            resource_type="TOPIC", resource_name="pre-", pattern_type="PREFIXED", operation="WRITE"
        ),
    ]
    for m in made:
        r = rest_acl(
            cluster, "POST", **{"principal": "User:alice", "host": "*", "permission": "ALLOW", **m}
        )
        assert r.status_code == 201, r.text
    ok = consume_one(cluster, "alice", "dw-open", "alice-g")
    assert ok.error() is None and ok.value() == b"first of dw-open"
    denied = consume_one(cluster, "alice", "dw-secret", "alice-g")
    assert denied.error().code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    before = end_offset(cluster, "other")
    assert produce(cluster, "alice", "pre-a", b"prefixed") is None
    assert produce(cluster, "alice", "other", b"no").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert end_offset(cluster, "other") == before
    # Auto-creation through Metadata needs CREATE: alice may WRITE pre-* but not create.
    assert produce(cluster, "alice", "pre-new", b"no").code() in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError._MSG_TIMED_OUT,
    )
    assert "pre-new" not in topic_names(cluster, "admin")


def test_each_api_is_allowed_by_the_operation_kafka_names(cluster: Cluster) -> None:
    """erin gets exactly the ACLs Kafka's table names, on her own resources: each API then
    succeeds (the ones the super user and alice do not use elsewhere)."""
    acls = [
        ("TOPIC", "erin-t", "LITERAL", "ALTER_CONFIGS"),  # (Incremental)AlterConfigs + Describe
        ("TOPIC", "erin-t", "LITERAL", "ALTER"),  # CreatePartitions
        ("TOPIC", "erin-t", "LITERAL", "DELETE"),  # DeleteRecords, DeleteTopics
        ("TOPIC", "erin-", "PREFIXED", "CREATE"),  # CreateTopics, auto-creation...
        ("TOPIC", "erin-auto", "LITERAL", "DESCRIBE"),  # ...which Metadata needs first
        ("GROUP", "erin-g", "LITERAL", "DELETE"),  # DeleteGroups (+ DESCRIBE: DescribeGroups)
        ("CLUSTER", "kafka-cluster", "LITERAL", "IDEMPOTENT_WRITE"),  # InitProducerId
        ("CLUSTER", "kafka-cluster", "LITERAL", "ALTER"),  # Create/DeleteAcls (+ DescribeAcls)
    ]
    for rtype, name, pattern, op in acls:
        allow(cluster, "User:erin", rtype, name, op, pattern)
    r = httpx.post(
        f"{cluster.rest}/security/users",
        json={"name": "erin", "password": "erin-password-Hj2"},
        headers=basic(),
    )
    assert r.status_code == 201
    admin = Consumer({**sasl(cluster, "admin"), "group.id": "erin-g", "enable.auto.commit": False})
    admin.commit(offsets=[TopicPartition(T, 0, 1)], asynchronous=False)
    admin.close()
    raw = Raw(cluster.bootstrap, "erin", "erin-password-Hj2")
    try:
        made = raw.call(
            19,
            topics=[{"name": "erin-t", "num_partitions": 1, "replication_factor": 1}],
            timeout=10000,
            validate_only=False,
        )
        assert [t.error_code for t in made.topics] == [0]
        auto = raw.call(3, topics=[{"name": "erin-auto"}], allow_auto_topic_creation=True)
        assert [(t.error_code, len(t.partitions)) for t in auto.topics] == [(0, 1)]
        configs = raw.call(32, resources=[{"resource_type": 2, "resource_name": "erin-t"}])
        assert [x.error_code for x in configs.results] == [0]
        altered = raw.call(
            44,
            resources=[
                {
                    "resource_type": 2,
                    "resource_name": "erin-t",
                    "configs": [{"name": "retention.ms", "config_operation": 0, "value": "9000"}],
                }
            ],
            validate_only=False,
        )
        assert [x.error_code for x in altered.responses] == [0]
        grown = raw.call(37, topics=[{"name": "erin-t", "count": 2}], timeout=10000)
        assert [x.error_code for x in grown.results] == [0]
        trimmed = raw.call(
            21, topics=[{"name": "erin-t", "partitions": [{**TP, "offset": 0}]}], timeout=10000
        )
        assert _parts(trimmed, "topics", "partitions") == [0]
        pid = raw.call(22, transactional_id=None, transaction_timeout=60000)
        assert pid.error_code == 0 and pid.producer_id >= 0
        described = raw.call(15, groups=["erin-g"])
        assert [g.error_code for g in described.groups] == [0]
        assert [g.error_code for g in raw.call(42, groups_names=["erin-g"]).results] == [0]
        created = raw.call(
            30,
            creations=[
                {
                    "resource_type": 3,
                    "resource_name": "erin-x",
                    "resource_pattern_type": 3,
                    "principal": "User:erin",
                    "host": "*",
                    "operation": 3,
                    "permission_type": 3,
                }
            ],
        )
        assert [c.error_code for c in created.results] == [0]
        found = raw.call(
            29,
            resource_type_filter=3,
            resource_name_filter="erin-x",
            pattern_type_filter=1,
            operation=1,
            permission_type=1,
        )
        assert found.error_code == 0 and [r.resource_name for r in found.resources] == ["erin-x"]
        deleted = raw.call(
            31,
            filters=[
                {
                    "resource_type_filter": 3,
                    "resource_name_filter": "erin-x",
                    "pattern_type_filter": 3,
                    "operation": 1,
                    "permission_type": 1,
                }
            ],
        )
        assert [len(f.matching_acls) for f in deleted.filter_results] == [1]
        gone = raw.call(20, topics=[{"name": "erin-t"}], timeout=10000)
        assert [t.error_code for t in gone.responses] == [0]
    finally:
        raw.close()
    assert "erin-auto" in topic_names(cluster, "admin")
    assert "erin-t" not in topic_names(cluster, "admin")


def test_a_request_partly_allowed_serves_the_allowed_part(cluster: Cluster) -> None:
    """One request naming an allowed and a denied topic: the denied one gets 29 and stores
    nothing, the other is served (alice: WRITE, READ on alice-t, READ on alice-g, from the
    tests before)."""
    before = {t: end_offset(cluster, t) for t in ("alice-t", T)}
    raw = Raw(cluster.bootstrap, "alice", PASSWORDS["alice"])
    try:
        produced = raw.call(
            0,
            BY_NAME[0],
            acks=-1,
            timeout=10000,
            topic_data=[
                {"name": "alice-t", "partition_data": [{"index": 0, "records": batch(b"mixed")}]},
                {"name": T, "partition_data": [{"index": 0, "records": batch(b"mixed")}]},
            ],
        )
        assert _parts(produced, "responses", "partition_responses") == [0, 29]
        committed = raw.call(
            8,
            BY_NAME[8],
            group_id="alice-g",
            generation_id_or_member_epoch=-1,
            member_id="",
            topics=[
                {"name": n, "partitions": [{**TP, "committed_offset": 1, "committed_metadata": ""}]}
                for n in ("alice-t", T)
            ],
        )
        assert _parts(committed, "topics", "partitions") == [0, 29]
        fetched = raw.call(
            9,
            BY_NAME[9],
            group_id="alice-g",
            topics=[{"name": n, "partition_indexes": [0]} for n in ("alice-t", T)],
            require_stable=False,
        )
        assert [
            (t.name, p.error_code, p.committed_offset) for t in fetched.topics for p in t.partitions
        ] == [("alice-t", 0, 1), (T, 29, -1)]
    finally:
        raw.close()
    assert end_offset(cluster, "alice-t") == before["alice-t"] + 1
    assert end_offset(cluster, T) == before[T]
    admin = AdminClient(sasl(cluster, "admin"))
    got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("alice-g")])
    assert T not in {p.topic for p in got["alice-g"].result().topic_partitions}


def test_listings_show_only_what_the_principal_may_describe(cluster: Cluster) -> None:
    allow(cluster, "User:alice", "GROUP", "alice-lg", "READ")
    admin = AdminClient(sasl(cluster, "admin"))
    c = Consumer({**sasl(cluster, "admin"), "group.id": "alice-lg", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(T, 0, 1), TopicPartition("dw-open", 0, 1)], asynchronous=False)
    c.close()
    alice = AdminClient(sasl(cluster, "alice"))
    # Metadata of all topics, through kafka-python, confluent-kafka and a raw request
    seen = topic_names(cluster, "alice")
    assert set(alice.list_topics(timeout=30).topics) == seen
    assert T not in seen and "other" not in seen
    assert {"dw-open", "pre-a"} <= seen
    assert set(TOPICS) <= topic_names(cluster, "admin")
    raw = Raw(cluster.bootstrap, "alice", PASSWORDS["alice"])
    try:
        assert {t.name for t in raw.call(3, topics=None).topics} == seen
    finally:
        raw.close()
    # ListGroups
    groups = {g.group_id for g in alice.list_consumer_groups().result().valid}
    assert "alice-lg" in groups and G not in groups
    assert {G, "alice-lg"} <= {g.group_id for g in admin.list_consumer_groups().result().valid}
    # OffsetFetch of all the group's topics
    got = alice.list_consumer_group_offsets([ConsumerGroupTopicPartitions("alice-lg")])
    assert [(p.topic, p.offset) for p in got["alice-lg"].result().topic_partitions] == [
        ("dw-open", 1)
    ]


def test_the_super_user_may_do_everything(cluster: Cluster) -> None:
    from confluent_kafka.admin import NewTopic

    admin = AdminClient(sasl(cluster, "admin"))
    assert admin.create_topics([NewTopic("admin-new", 1)])["admin-new"].result() is None
    assert produce(cluster, "admin", "admin-new", b"root") is None
    m = consume_one(cluster, "admin", "admin-new", "admin-g")
    assert m.error() is None and m.value() == b"root"
    assert admin.describe_acls(
        AclBindingFilter(
            ResourceType.ANY,
            None,
            ResourcePatternType.ANY,
            None,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
    ).result()
    assert admin.delete_topics(["admin-new"])["admin-new"].result() is None


def test_acl_apis_with_kafka_python_and_rest_see_the_same_acls(cluster: Cluster) -> None:
    mine = ACLFilter(
        principal="User:carol",
        host=None,
        operation=ACLOperation.ANY,
        permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(KResourceType.ANY, None, ACLResourcePatternType.ANY),
    )
    admin = kafka_python_admin(cluster, "admin")
    try:
        made = ACL(
            principal="User:carol",
            host="*",
            operation=ACLOperation.READ,
            permission_type=ACLPermissionType.ALLOW,
            resource_pattern=ResourcePattern(
                KResourceType.TOPIC, "carol-", ACLResourcePatternType.PREFIXED
            ),
        )
        assert admin.create_acls([made])["failed"] == []
        r = rest_acl(cluster, "GET", principal="User:carol")
        assert [(a["resource_name"], a["pattern_type"]) for a in r.json()["data"]] == [
            ("carol-", "PREFIXED")
        ]
        allow(cluster, "User:carol", "GROUP", "carol-g", "READ")
        found, _ = admin.describe_acls(mine)
        assert sorted(a.resource_pattern.resource_name for a in found) == ["carol-", "carol-g"]
        # MATCH: the bindings that apply to one name (here the prefix of carol-x)
        match = ACLFilter(
            principal=None,
            host=None,
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(
                KResourceType.TOPIC, "carol-x", ACLResourcePatternType.MATCH
            ),
        )
        found, _ = admin.describe_acls(match)
        assert [a.resource_pattern.resource_name for a in found] == ["carol-"]
        ((_, deleted, error),) = admin.delete_acls([mine])
        assert error.errno == 0
        assert sorted(a.resource_pattern.resource_name for a in deleted) == ["carol-", "carol-g"]
        assert rest_acl(cluster, "GET", principal="User:carol").json()["data"] == []
    finally:
        admin.close()
    alice = kafka_python_admin(cluster, "alice")
    try:
        failed = alice.create_acls([made])["failed"]
        assert failed == [ClusterAuthorizationFailedError]
        with pytest.raises(ClusterAuthorizationFailedError):
            alice.describe_acls(mine)
    finally:
        alice.close()
    assert rest_acl(cluster, "GET", principal="User:carol").json()["data"] == []


def test_confluent_kafka_acl_apis_and_delete_by_filter(cluster: Cluster) -> None:
    admin = AdminClient(sasl(cluster, "admin"))
    b = AclBinding(
        ResourceType.TOPIC,
        "dave-t",
        ResourcePatternType.LITERAL,
        "User:dave",
        "*",
        AclOperation.WRITE,
        AclPermissionType.DENY,
    )
    assert admin.create_acls([b])[b].result() is None
    dave = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        "User:dave",
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    assert admin.describe_acls(dave).result() == [b]
    assert admin.delete_acls([dave])[dave].result() == [b]
    assert admin.describe_acls(dave).result() == []
    assert rest_acl(cluster, "GET", principal="User:dave").json()["data"] == []
