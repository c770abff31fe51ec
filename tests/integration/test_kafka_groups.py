"""Kafka consumer groups across two agents: rebalances, commits, one group model with REST."""

from __future__ import annotations

import datetime
import io
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.join_group.v5.response import JoinGroupResponse
from kio.schema.request_header.v1.header import RequestHeader
from kio.serial import entity_reader, entity_writer

from tests.integration.conftest import Cluster
from tests.integration.test_consumer_api import Consumer as RestConsumer
from tests.integration.test_groups_cli import wait_left
from tests.integration.test_kafka_clients import _read_frame, create_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 300}


def _member(bootstrap: str, group: str, topic: str) -> Consumer:
    """A member of ``group`` subscribed to ``topic`` (it joins on its first polls)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **FAST,
        }
    )
    c.subscribe([topic])
    return c


def _until(cond: Callable[[], bool], consumers: list[Consumer], timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.05)
        if cond():
            return
    raise AssertionError("condition not reached")


def _assigned(c: Consumer) -> int:
    return len(c.assignment())


def _produce(cluster: Cluster, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": cluster.kafka[0], "linger.ms": 5})
    for i in range(n):
        p.produce(topic, key=b"%d" % i, value=b"v%d" % i)
    assert p.flush(30) == 0


MEMBER = """
import sys, time
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
              "enable.auto.commit": False})
c.subscribe([sys.argv[3]])
while True:
    c.poll(0.1)
    if c.assignment():
        print("assigned", flush=True)
"""


def test_rebalance_on_join_leave_and_death(kafka_cluster: Cluster, unique_topic: Any) -> None:
    """Members on different agents share the partitions; a member that joins, one that
    leaves and one that dies (SIGKILL, so only its session timeout tells) each
    rebalance the group; the v3 view lists the members."""
    topic = unique_topic("grp")
    group = unique_topic("g")
    create_topic(kafka_cluster, topic, 6)
    _produce(kafka_cluster, topic, 60)
    c1 = _member(kafka_cluster.kafka[0], group, topic)
    _until(lambda: _assigned(c1) == 6, [c1])

    # A member in another process, through the other agent: joins, then is killed.
    proc = subprocess.Popen(
        [sys.executable, "-c", MEMBER, kafka_cluster.kafka[1], group, topic],
        stdout=subprocess.DEVNULL,
    )
    try:
        _until(lambda: _assigned(c1) == 3, [c1])
        view = httpx.get(
            f"{kafka_cluster.agents[1]}/v3/clusters/{kafka_cluster.cluster_id}"
            f"/consumer-groups/{group}/consumers"
        ).json()
        assert len(view["data"]) == 2
        assert sum(len(c["assignments"]["related"]) > 0 for c in view["data"]) == 2
    finally:
        proc.kill()
        proc.wait(10)
    _until(lambda: _assigned(c1) == 6, [c1])  # death: after its session timeout

    c3 = _member(kafka_cluster.kafka[1], group, topic)
    _until(lambda: _assigned(c1) == 3 and _assigned(c3) == 3, [c1, c3])
    c3.close()  # leave: no session timeout to wait for
    started = time.monotonic()
    _until(lambda: _assigned(c1) == 6, [c1])
    assert time.monotonic() - started < 5.5
    c1.close()


def _join(addr: str, group: str) -> Any:
    """A JoinGroup v5 over a plain socket; returns the decoded response."""
    host, port = addr.split(":")
    out = io.BytesIO()
    entity_writer(RequestHeader)(
        out,
        RequestHeader(request_api_key=11, request_api_version=5, correlation_id=3, client_id="t"),
    )
    entity_writer(JoinGroupRequest)(
        out,
        JoinGroupRequest(
            group_id=group,
            session_timeout=datetime.timedelta(seconds=10),
            rebalance_timeout=datetime.timedelta(seconds=10),
            member_id="m-1",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b"\0\0\0\0\0\0"),),
        ),
    )
    payload = out.getvalue()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(struct.pack(">i", len(payload)) + payload)
        frame = _read_frame(s)
    resp, _ = entity_reader(JoinGroupResponse)(frame, 4)
    return resp


def test_commits_survive_restarts_and_are_one_model_with_rest(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """Kafka commits are the group's committed offsets for everyone: a restarted Kafka
    consumer and then a REST consumer resume there; a group cannot be used through both
    doors at once (409 on REST, INCONSISTENT_GROUP_PROTOCOL on the wire)."""
    topic = unique_topic("cm")
    group = unique_topic("g")
    create_topic(kafka_cluster, topic, 1)
    _produce(kafka_cluster, topic, 100)
    c = _member(kafka_cluster.kafka[0], group, topic)
    seen: list[Any] = []
    deadline = time.monotonic() + 30
    while len(seen) < 40 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            seen.append(m)
    c.commit(offsets=[TopicPartition(topic, 0, 40)], asynchronous=False)
    r = httpx.post(
        f"{kafka_cluster.agents[1]}/consumers/{group}",
        json={"name": "rest"},
        headers={"content-type": "application/vnd.kafka.v2+json"},
    )
    assert r.status_code == 409 and r.json()["error_code"] == 40903, r.text
    lag = httpx.get(
        f"{kafka_cluster.agents[1]}/v3/clusters/{kafka_cluster.cluster_id}"
        f"/consumer-groups/{group}/lags/{topic}/partitions/0"
    )
    assert lag.status_code == 200 and lag.json()["current_offset"] == 40, lag.text
    c.close()

    again = _member(kafka_cluster.kafka[1], group, topic)  # another agent, a new process's view
    first = None
    deadline = time.monotonic() + 30
    while first is None and time.monotonic() < deadline:
        m = again.poll(0.2)
        if m is not None and m.error() is None:
            first = m.offset()
    assert first == 40
    again.commit(offsets=[TopicPartition(topic, 0, 70)], asynchronous=False)
    again.close()
    wait_left(kafka_cluster, group)  # close() does not wait for LeaveGroup's answer

    rest = RestConsumer.create(kafka_cluster.agents, group)
    rest.subscribe(topic)
    records: list[Any] = []
    deadline = time.monotonic() + 20
    while not records and time.monotonic() < deadline:
        records.extend(rest.fetch(500))
    assert records and records[0]["offset"] == 70
    resp = _join(kafka_cluster.kafka[0], group)
    assert resp.error_code == ErrorCode.inconsistent_group_protocol
    rest.delete()
