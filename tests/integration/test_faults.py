"""Faults on the production topology: crashed agents and coordinators, a PostgreSQL
restart, a misbehaving S3.

One topology for the module (``tests/integration/topology.py``: moto behind the
fault proxy, PostgreSQL, 2 coordinators, 3 agents, a load balancer), as real
processes on 127.0.0.1. Each test breaks something while producers post records
whose values are unique ids, then ``check_log`` reads every partition straight
from moto through the storage API and checks every acked id: at its acked offset,
offsets contiguous, nothing twice, every index row's object in the bucket. What a
test kills is restarted before the next one.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import PgTestServer
from tests.faultproxy import FaultProxy
from tests.integration.topology import (
    ADMIN,
    GroupReader,
    ProduceLoad,
    Topology,
    check_log,
    current_coordinator,
    metric,
    start_topology,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4


@pytest.fixture(scope="module")
def topology_module(
    moto_endpoint: str, pg_server: PgTestServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Topology]:
    """The topology on a fresh PostgreSQL schema of this run's throwaway database."""
    topo = start_topology(
        tmp_path_factory.mktemp("topology"), moto_endpoint, pg_server.new_schema_url()
    )
    try:
        yield topo
    finally:
        topo.stop()


@pytest.fixture
def topo(topology_module: Topology) -> Iterator[Topology]:
    """The module's topology with every process running and no fault rule set."""
    proxy = topology_module.proxy
    assert proxy is not None
    topology_module.ensure_running()
    proxy.clear()
    yield topology_module
    proxy.clear()


def proxy(topo: Topology) -> FaultProxy:
    assert topo.proxy is not None
    return topo.proxy


def new_topic(topo: Topology, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    topo.create_topic(name, PARTITIONS)
    return name


def high_watermarks(topo: Topology, topic: str) -> dict[int, int]:
    out = {}
    for p in range(PARTITIONS):
        r = httpx.get(
            f"{topo.url}/v3/clusters/{topo.cluster_id}/topics/{topic}/partitions/{p}/offset",
            timeout=10,
            auth=ADMIN,
        )
        assert r.status_code == 200, r.text
        out[p] = r.json()["latest_offset"]
    return out


def wait_until(what: str, check: object, timeout: float) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_sigkill_an_agent_during_produce_and_consume(topo: Topology) -> None:
    """Race: 6 producers through the LB and a consumer pinned to agent-1 (committing
    after every fetch) run while agent-1 is SIGKILLed, then restarted.

    Expected: requests in flight on agent-1 fail on the client (transport errors,
    never an ack without offsets); producers reconnect through the LB and carry on;
    0 acked records lost, 0 duplicate offsets; the consumer, restarted as a new
    instance of its group through the LB, resumes every partition exactly at the
    group's committed offset (the last commit it saw acknowledged, or the one in
    flight when the agent died) and ends up having read every acked record.
    """
    topic = new_topic(topo, "agent-kill")
    victim = topo.agents[0]
    load = ProduceLoad(topo.url, topic, threads=6).start()
    reader = GroupReader(victim.url, topo.url, f"g-{uuid.uuid4().hex[:6]}", topic, PARTITIONS)
    try:
        wait_until("records acked", lambda: len(load.acked) >= 300, 15)
        reader.start()
        wait_until("records consumed", lambda: len(reader.consumed) >= 100, 15)
        acked_at_kill = len(load.acked)
        victim.kill()
        time.sleep(1.5)
        acked_while_down = len(load.acked) - acked_at_kill
        victim.restart()
        time.sleep(0.5)
    finally:
        load.stop()
    hws = high_watermarks(topo, topic)
    reader.finish(hws)

    assert load.unclean == [], load.unclean[:5]
    assert load.count("transport:") > 0, "the kill must fail the requests in flight on agent-1"
    assert acked_while_down > 0, "producers must carry on through the other agents"
    check = check_log(topo, topic, PARTITIONS, load)
    assert check.total == sum(hws.values())

    # The consumer: restarted once at least, and from the committed offsets.
    assert reader.restarts, f"the consumer never noticed the kill: {reader.failures}"
    for restart in reader.restarts:
        for p, first in restart.first.items():
            allowed = {restart.confirmed.get(p, 0), restart.attempted.get(p, 0)}
            assert first in allowed, (p, first, allowed)
    log = {(p, o): v for p, recs in check.records.items() for o, v in recs}
    consumed = {}
    for p, o, v in reader.consumed:
        assert log[(p, o)] == v, f"consumed {v!r} at {p}@{o}, the log has {log[(p, o)]!r}"
        consumed[(p, o)] = v
    assert set(consumed) == set(log), "the consumer missed records"
    assert set(load.acked) <= set(consumed.values())


def test_sigkill_a_coordinator_during_commits(topo: Topology) -> None:
    """Race: 6 producers through the LB while coordinator-1, the one every agent
    talks to first, is SIGKILLed in the middle of their commits.

    Expected: agents fail over to coordinator-2 (a commit that may have reached
    coordinator-1 is re-sent there; the database answers a repeated object key with
    the same offsets): not one produce request fails, offsets stay contiguous,
    nothing acked is lost, and coordinator-2 answered commits after the kill.
    """
    topic = new_topic(topo, "coordinator-kill")
    # Agents stay on the coordinator that last answered them: line them up on one.
    if len({current_coordinator(topo, a) for a in topo.agents}) > 1:
        for a in topo.agents:
            if current_coordinator(topo, a) != topo.coordinator_urls[0]:
                a.restart()
    in_use = current_coordinator(topo, topo.agents[0])
    victim = next(c for c in topo.coordinators if c.url == in_use)
    survivor = next(c for c in topo.coordinators if c is not victim)
    commits_before = metric(survivor.url, "lakelog_coordinator_commits_total", 'outcome="ok"')
    load = ProduceLoad(topo.url, topic, threads=6).start()
    try:
        wait_until("records acked", lambda: len(load.acked) >= 300, 15)
        acked_at_kill = len(load.acked)
        victim.kill()
        time.sleep(1.5)
        acked_after_kill = len(load.acked) - acked_at_kill
    finally:
        load.stop()

    assert load.unclean == [], load.unclean[:5]
    assert load.responses.keys() == {"acked"}, load.responses
    assert acked_after_kill > 0
    commits_after = metric(survivor.url, "lakelog_coordinator_commits_total", 'outcome="ok"')
    assert commits_after > commits_before
    assert {current_coordinator(topo, a) for a in topo.agents} == {survivor.url}, topo.logs()
    check = check_log(topo, topic, PARTITIONS, load)
    assert check.total == len(load.acked)  # nothing failed, so the log is exactly the acks


def test_s3_faults_are_retried_or_fail_cleanly(topo: Topology) -> None:
    """Race: producers and a consumer run while the fault proxy in front of moto
    answers segment PUTs and GETs with 503s, 500s after the write, connection resets
    before and after the write, and slow responses.

    Expected: every produce answer is an ack with offsets or a clean Confluent error
    (per-record ``error_code`` in a 200, or an error body), never an ack without a
    committed object: every acked id is readable at its offset through the storage
    API, every committed index row's object exists. The consumer, reading through
    agents that did not write the data (GETs), returns exactly the log.
    """
    topic = new_topic(topo, "s3-faults")
    seg = r"/segments/"
    # Each fault a few times, early (first match decides, so rates stack up): the
    # retries back off for seconds, and the test must stay short.
    put = {"method": "PUT", "path": seg, "rate": 0.3, "times": 3}
    get = {"method": "GET", "path": seg, "rate": 0.4, "times": 3}
    proxy(topo).set_rules(
        {**put, "action": "status", "status": 503, "code": "SlowDown"},
        {**put, "action": "reset"},
        {**put, "action": "reset", "when": "after"},
        {**put, "action": "status", "when": "after", "status": 500, "code": "InternalError"},
        {**put, "action": "delay", "delay_s": 0.3},
        {**get, "action": "status", "status": 503, "code": "SlowDown"},
        {**get, "action": "reset"},
        {**get, "action": "delay", "delay_s": 0.2},
    )
    load = ProduceLoad(topo.url, topic, threads=6).start()
    try:
        wait_until("every PUT fault", lambda: _all_fired(topo, "PUT"), 20)
    finally:
        load.stop()
    hws = high_watermarks(topo, topic)
    # Read while the GET faults are still on: one consumer per agent, so each agent
    # fetches what the other two wrote (GETs; its own flushes are in its cache).
    readers = [
        GroupReader(a.url, topo.url, f"g-{uuid.uuid4().hex[:6]}", topic, PARTITIONS).start()
        for a in topo.agents
    ]
    for reader in readers:
        reader.finish(hws, timeout=60)
    stats = proxy(topo).stats()
    proxy(topo).clear()

    fired = [r["fired"] for r in stats["rules"]]
    assert all(n > 0 for n in fired), f"a fault never fired: {stats['rules']}"
    assert load.unclean == [], load.unclean[:5]
    assert len(load.acked) > 0
    failures = {k for k in load.responses if k != "acked"}
    # The one error a produce may get here: 50003, the flush failed (retriable).
    assert failures <= {"record_error:50003"}, load.responses
    check = check_log(topo, topic, PARTITIONS, load)
    log = {(p, o): v for p, recs in check.records.items() for o, v in recs}
    for reader in readers:
        assert {(p, o): v for p, o, v in reader.consumed} == log


def _all_fired(topo: Topology, method: str) -> bool:
    return all(r["fired"] > 0 for r in proxy(topo).stats()["rules"] if r["method"] == method)


@pytest.mark.slow
@pytest.mark.serial
def test_postgresql_restart_recovers_without_manual_steps(topo: Topology) -> None:
    """Race: producers and consumer-group calls run while the machine's PostgreSQL
    server restarts (a few seconds of outage).

    Expected: during the outage produce requests fail cleanly (a Confluent error,
    never an ack) or wait and succeed; afterwards, with no manual step, both
    coordinators are healthy again, produce succeeds, a new consumer instance works
    and commits; nothing acked is lost and offsets stay contiguous.
    """
    topic = new_topic(topo, "pg-restart")
    load = ProduceLoad(topo.url, topic, threads=4, pause_s=0.02).start()
    try:
        wait_until("records acked", lambda: len(load.acked) >= 200, 15)
        version = next(p.name for p in Path("/etc/postgresql").iterdir())
        started = time.monotonic()
        subprocess.run(
            [
                *("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"),
            ],
            check=True,
            timeout=60,
        )
        restarted_in = time.monotonic() - started
        acked_at_restart = len(load.acked)
        wait_until("acks after the restart", lambda: len(load.acked) > acked_at_restart + 100, 20)
    finally:
        load.stop()
    for c in topo.coordinators:
        wait_until(f"{c.name} healthy", lambda c=c: _healthy(c.url), 10)
    assert restarted_in < 30
    assert load.unclean == [], load.unclean[:5]
    check = check_log(topo, topic, PARTITIONS, load)
    hws = high_watermarks(topo, topic)
    assert check.total == sum(hws.values())
    # Consumer groups work again: a new instance reads everything and commits.
    reader = GroupReader(topo.url, topo.url, f"g-{uuid.uuid4().hex[:6]}", topic, PARTITIONS)
    reader.start().finish(hws)
    assert reader.failures == []
    assert reader.confirmed == {p: hw for p, hw in hws.items() if hw}


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_fault_proxy_does_what_its_rules_say(
    moto_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    """The proxy itself, through boto3 without retries: a 503 before the write writes
    nothing, a reset after the write leaves the object in moto while the client sees
    a connection error, a delay delays, and no rule means a plain forward."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    fp = FaultProxy.start(tmp_path, moto_endpoint)
    try:
        config = Config(retries={"total_max_attempts": 1}, s3={"addressing_style": "path"})
        s3 = boto3.client("s3", endpoint_url=fp.url, config=config)
        direct = boto3.client("s3", endpoint_url=moto_endpoint)

        def exists(key: str) -> bool:
            return direct.list_objects_v2(Bucket=s3_bucket, Prefix=key)["KeyCount"] == 1

        s3.put_object(Bucket=s3_bucket, Key="plain", Body=b"x")
        assert exists("plain")
        assert s3.get_object(Bucket=s3_bucket, Key="plain")["Body"].read() == b"x"

        fp.set_rules({"action": "status", "method": "PUT", "path": "/before", "status": 503})
        with pytest.raises(ClientError) as err:
            s3.put_object(Bucket=s3_bucket, Key="before", Body=b"x")
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert not exists("before")

        fp.set_rules({"action": "reset", "method": "PUT", "path": "/after", "when": "after"})
        with pytest.raises((BotoConnectionError, HTTPClientError)):  # reset by peer
            s3.put_object(Bucket=s3_bucket, Key="after", Body=b"x")
        assert exists("after")

        fp.set_rules({"action": "delay", "method": "GET", "delay_s": 0.5, "times": 1})
        started = time.monotonic()
        s3.get_object(Bucket=s3_bucket, Key="plain")
        assert time.monotonic() - started >= 0.5
        stats = fp.stats()
        assert [r["fired"] for r in stats["rules"]] == [1]
        assert stats["requests"]["PUT"] == 3
    finally:
        fp.stop()
