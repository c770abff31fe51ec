"""Janitors against real processes: moto S3, a coordinator, an agent, the ``lakelog`` CLI."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import httpx
import orjson
import pytest

from coordinator.janitors.catalog import Catalog
from coordinator.janitors.leases import LeaseStore
from coordinator.local import LocalCoordinator
from index.log import LogReader, LogWriter
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.types import ConsumedRecord, Record
from tests.integration.conftest import ClusterFactory
from tests.integration.test_consumer_api import BINARY, Consumer, b64, request
from tests.procs import Proc, free_port, lakelog_cmd, wait_http

pytestmark = pytest.mark.integration


def _janitor(name: str, db_url: str, store_url: str, endpoint: str, *args: str) -> dict[str, Any]:
    """``lakelog janitor <name> ...`` as an operator runs it; returns its JSON report."""
    proc = subprocess.run(
        lakelog_cmd(
            "janitor",
            name,
            "--db",
            db_url,
            "--store",
            store_url,
            "--store-endpoint",
            endpoint,
            *args,
        ),
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    report: dict[str, Any] = orjson.loads(proc.stdout.splitlines()[-1])
    return report


def _walk(reader: LogReader, topic: str) -> list[ConsumedRecord]:
    """Every record, read from each offset alone and all at once (they must agree)."""
    whole = reader.read(topic, 0, 0, max_bytes=1 << 30)
    for rec in whole:
        assert reader.read(topic, 0, rec.offset, max_bytes=1)[0] == rec
    return whole


def _consume_all(agents: list[str], group: str, topic: str, want: int) -> list[Any]:
    c = Consumer.create(agents, group, **{"auto.offset.reset": "earliest"})
    c.assign(topic, 0)
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < want and time.monotonic() < deadline:
        got.extend(c.fetch(500))
    c.delete()
    return got


def test_reads_are_identical_before_and_after_tiering_and_retention_resets_consumers(
    cluster_factory: ClusterFactory,
) -> None:
    """Invariant 5 through the REST consumer API and the storage API; then retention moves
    log-start past a group's committed offset and the group's next instance starts at
    log-start (auto.offset.reset=earliest), and GC removes the replaced objects."""
    cluster = cluster_factory(agents=1)
    agent = cluster.agents[0]
    db_url = f"sqlite:///{cluster.tmp / 'meta.db'}"
    topic = f"tier-{uuid.uuid4().hex[:8]}"
    r = httpx.post(
        f"{agent}/v3/clusters/{cluster.cluster_id}/topics",
        json={"topic_name": topic, "partitions_count": 1},
    )
    assert r.status_code == 201, r.text
    for batch in range(3):
        records = [
            {
                "key": b64(f"k{i % 4}".encode()),
                "value": b64(f"value {batch}.{i}".encode() * (i + 1)),
                "partition": 0,
            }
            for i in range(10)
        ]
        r = request("POST", f"{agent}/topics/{topic}", {"records": records}, content_type=BINARY)
        assert r.status_code == 200, r.text

    coordinator = LocalCoordinator(db_url)
    store = open_store(cluster.store_url, endpoint_url=cluster.store_endpoint)
    try:
        reader = LogReader(store, coordinator)
        before = _walk(reader, topic)
        rest_before = _consume_all(cluster.agents, "g-before", topic, 30)
        assert [r["offset"] for r in rest_before] == list(range(30))
        segments = {o.key for o in store.list("segments/")}
        assert len(segments) == 3

        report = _janitor(
            "tier", db_url, cluster.store_url, cluster.store_endpoint, "--tier-age-s", "0"
        )
        assert report["rows_replaced"] == 3 and report["objects_written"] == 1
        topic_id = coordinator.get_topic(topic).topic_id
        rows = Catalog(coordinator.db).rows(topic_id, 0)
        assert [(r.kind, r.base_offset, r.record_count) for r in rows] == [("parquet", 0, 30)]
        assert _walk(reader, topic) == before
        assert _consume_all(cluster.agents, "g-after", topic, 30) == rest_before

        # A group commits offset 5; retention then drops everything below 30.
        c = Consumer.create(cluster.agents, "g-reset", **{"auto.offset.reset": "earliest"})
        c.assign(topic, 0)
        c.commit([{"topic": topic, "partition": 0, "offset": 5}])
        c.delete()
        coordinator.alter_configs(topic, {"retention.ms": "1"})
        time.sleep(0.01)
        report = _janitor("retention", db_url, cluster.store_url, cluster.store_endpoint)
        assert report["rows_dropped"] == 1
        assert coordinator.offsets(topic, 0).log_start == 30
        r = request(
            "POST",
            f"{agent}/topics/{topic}",
            {"records": [{"value": b64(b"after retention"), "partition": 0}]},
            content_type=BINARY,
        )
        assert r.status_code == 200, r.text
        resumed = Consumer.create(cluster.agents, "g-reset", **{"auto.offset.reset": "earliest"})
        resumed.assign(topic, 0)
        got = resumed.fetch(2000)
        assert [(x["offset"], x["value"]) for x in got] == [(30, b64(b"after retention"))]

        time.sleep(2.1)  # S3 modification times are whole seconds
        report = _janitor(
            "gc", db_url, cluster.store_url, cluster.store_endpoint, "--gc-grace-s", "1"
        )
        # The three segment objects; the tier object stays while a retained snapshot of the
        # topic's table names it (table.snapshot.retention.ms, 5 days by default).
        assert report["objects_deleted"] == 3
        assert not segments & {o.key for o in store.list("segments/")}
        assert len(list(store.list("tiered/"))) == 1
        coordinator.alter_configs(topic, {"table.snapshot.retention.ms": "0"})
        report = _janitor("table", db_url, cluster.store_url, cluster.store_endpoint)
        assert report["snapshots_expired"] >= 1
        for _ in range(2):  # released: unreferenced from the first run, deleted a grace later
            _janitor("gc", db_url, cluster.store_url, cluster.store_endpoint, "--gc-grace-s", "1")
            time.sleep(2.1)
        assert list(store.list("tiered/")) == []
        assert [x.value for x in _walk(reader, topic)] == [b"after retention"]
    finally:
        store.close()
        coordinator.close()


def _start_janitor_coordinator(
    tmp: Path, db_url: str, store_url: str, endpoint: str
) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc(
        lakelog_cmd(
            "coordinator",
            "--db",
            db_url,
            "--port",
            str(port),
            "--store",
            store_url,
            "--store-endpoint",
            endpoint,
            "--janitors",
            "all",
            "--tier-age-s",
            "0",
            "--gc-grace-s",
            "30",
            "--lease-ttl-s",
            "10",
            "--log-level",
            "info",
            *itertools.chain.from_iterable(
                ("--janitor-interval", f"{j}=0") for j in ("tier", "retention", "compact", "gc")
            ),
        ),
        tmp / f"coordinator-{port}.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", proc=proc.popen)
    return proc, url


def test_two_coordinators_never_run_one_janitor_at_once(moto_endpoint: str, tmp_path: Path) -> None:
    """Race: two coordinator processes on one SQLite database, every janitor enabled with a
    zero interval, so both try to take every lease every tick while data keeps arriving.
    Expected: the recorded runs of each janitor never overlap in time, and tiering still
    happens (runs are ok, and the coordinators' /metrics count them)."""
    bucket = f"lakelog-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    store_url = f"s3://{bucket}/lakelog"
    db_url = f"sqlite:///{tmp_path / 'meta.db'}"
    setup = LocalCoordinator(db_url)
    setup.create_topic("t", 4, {"cleanup.policy": "compact,delete"})
    store = open_store(store_url, endpoint_url=moto_endpoint)
    writer = LogWriter(store, setup)
    topic_id = setup.get_topic("t").topic_id
    procs = [
        _start_janitor_coordinator(tmp_path, db_url, store_url, moto_endpoint) for _ in range(2)
    ]
    try:
        # At least 5 s of racing; then on until both holders have run and a tier run has
        # replaced rows (a loaded machine may need longer), bounded at 60 s.
        started = time.monotonic()
        i = 0
        while True:
            b = SegmentBuilder()
            for p in range(4):
                b.append(topic_id, p, [Record(f"k{i % 3}".encode(), b"v" * 500, 1000 + i, ())])
            writer.write(b)
            i += 1
            time.sleep(0.05)
            elapsed = time.monotonic() - started
            if elapsed < 5:
                continue
            runs = LeaseStore(setup.db).runs()
            done = len({r.holder for r in runs}) == 2 and any(
                r.janitor == "tier" and r.summary.get("rows_replaced") for r in runs
            )
            if done or elapsed > 60:
                break
        runs = LeaseStore(setup.db).runs()
        metrics = [httpx.get(f"{url}/metrics").text for _, url in procs]
    finally:
        for proc, _ in procs:
            proc.stop()
        store.close()
    for name in ("tier", "retention", "compact", "gc"):
        mine = sorted(
            (r.started_at, r.finished_at or float("inf"), r.holder)
            for r in runs
            if r.janitor == name
        )
        assert len(mine) >= 3, (name, mine)
        for earlier, later in itertools.pairwise(mine):
            assert earlier[1] <= later[0], f"{name} runs overlap: {earlier} and {later}"
    # A run may still be in progress when the snapshot is taken (its end counts as +inf
    # above); every finished run must have succeeded.
    finished = [r for r in runs if r.finished_at is not None]
    assert {r.outcome for r in finished} == {"ok"}, [r for r in finished if r.outcome != "ok"]
    assert len({r.holder for r in runs}) == 2  # both coordinators took turns
    assert any(r.janitor == "tier" and r.summary.get("rows_replaced") for r in runs)
    assert any('lakelog_janitor_runs_total{janitor="tier",outcome="ok"}' in m for m in metrics)
    # After the janitors: every record still reads back at its offset.
    reader = LogReader(open_store(store_url, endpoint_url=moto_endpoint), setup)
    got = reader.read("t", 0, 0, max_bytes=1 << 30)
    assert [r.offset for r in got] == sorted({r.offset for r in got})
    setup.close()
    assert sys.executable  # the processes ran this interpreter (lakelog_cmd)


def test_janitor_run_now_in_a_running_coordinator(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    """``lakelog janitor tier --coordinator URL`` (here through LAKELOG_COORDINATOR): the
    coordinator runs it now under its lease, the CLI shows each step and prints the report;
    a run while another holds the lease is refused, nothing run."""
    cluster = cluster_factory(agents=1)
    topic = f"now-{uuid.uuid4().hex[:8]}"
    r = httpx.post(
        f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics",
        json={"topic_name": topic, "partitions_count": 2},
    )
    assert r.status_code == 201, r.text
    for p in (0, 1):
        body = {"records": [{"value": b64(b"x" * 100), "partition": p}] * 20}
        r = request("POST", f"{cluster.agents[0]}/topics/{topic}", body, content_type=BINARY)
        assert r.status_code == 200, r.text
    env = {"LAKELOG_COORDINATOR": cluster.coordinator_url}
    leases = LeaseStore(LocalCoordinator(f"sqlite:///{cluster.tmp / 'meta.db'}").db, ttl_s=60)

    # Held elsewhere: refused with the coordinator's message.
    lease = leases.acquire("tier", "another-process", scheduled=False)
    assert lease is not None
    proc = subprocess.run(
        lakelog_cmd("janitor", "tier", "--tier-age-s", "0"),
        capture_output=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    assert proc.returncode == 1
    assert b"janitor tier is running in another process" in proc.stderr
    leases.release(lease, 0)
    assert [run.janitor for run in leases.runs()] == []

    proc = subprocess.run(
        lakelog_cmd("janitor", "tier", "--tier-age-s", "0", "--topic", topic),
        capture_output=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    report = orjson.loads(proc.stdout.splitlines()[-1])
    assert report["janitor"] == "tier" and report["partitions"] == 2
    assert report["rows_replaced"] >= 2 and report["objects_written"] >= 2
    steps = [line for line in proc.stderr.decode().splitlines() if line.startswith("janitor tier:")]
    assert steps and steps[-1].startswith("janitor tier: 2/2"), proc.stderr.decode()
    (run,) = leases.runs()
    assert (run.janitor, run.outcome) == ("tier", "ok")
    assert run.holder.startswith("coordinator-") and "-now-" in run.holder  # the coordinator's
    # What a reader sees is unchanged, now from Parquet.
    got = _consume_all(cluster.agents, f"g-{uuid.uuid4().hex[:6]}", topic, 20)
    assert len(got) == 20
