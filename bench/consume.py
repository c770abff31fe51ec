"""Consume throughput of lakelog against a moto S3 server: tailing and catching up.

Starts one moto server and ``lakelog serve --store s3://... --store-endpoint ...``
(agent + in-process SQLite coordinator) as processes, then:

- ``tail``: for ``--duration`` seconds, 4 closed-loop producers post REST v2
  batches (100 x 1 KiB records) to an 8-partition topic while ONE consumer
  instance, subscribed to it on the same (writing) agent, fetches continuously:
  records/s and MB/s consumed during the window, end-to-end catch-up after the
  producers stop, and the agent's store GETs per MB consumed (``lakelog_store_gets``
  of ``/metrics``; the target is ~0: the read cache is filled write-through).
- ``catchup``: the agent is restarted (cold cache, same database and bucket) and a new
  group reads the whole history from the earliest offsets (``max_bytes`` 8 MiB per
  fetch): MB/s of record values, with the GETs it cost.
- ``raw``: the same chunks of the same objects (from the coordinator's index, read
  through the agent's process-independent storage API) fetched by ranged boto3
  GETs with 4 threads from the same moto server: MB/s; then a ``ratio`` line
  (catch-up / raw; the issue's target is >= 0.5).

Each line has the load average and CPU cores used by the agent, moto and this
process. Run: ``.venv/bin/python bench/consume.py [--duration 8]``; progress on stderr.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import boto3  # noqa: E402
import httpx  # noqa: E402
import orjson  # noqa: E402
from produce import CpuMeter, emit, load_avg, log, metric_sum  # noqa: E402

from tests.procs import Proc, fake_aws_credentials, free_port, start_moto  # noqa: E402

RECORD_BYTES = 1024
RECORDS_PER_REQUEST = 100
PRODUCERS = 4
PARTITIONS = 8
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BINARY = "application/vnd.kafka.binary.v2+json"

fake_aws_credentials()


class Agent:
    """``lakelog serve`` on 127.0.0.1 against the moto bucket; restartable on the same db."""

    def __init__(self, home: Path, endpoint: str, bucket: str) -> None:
        self.home = home
        self.store = f"s3://{bucket}/lakelog"
        self.endpoint = endpoint
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: Proc | None = None
        self.start()
        self.cluster_id: str = httpx.get(f"{self.base}/v3/clusters").json()["data"][0]["cluster_id"]

    def start(self) -> None:
        log(f"starting lakelog serve on {self.base}")
        command = [
            *(sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1"),
            *("--port", str(self.port), "--db", f"sqlite:///{self.home / 'meta.db'}"),
            *("--store", self.store, "--store-endpoint", self.endpoint),
            *("--linger-ms", "20", "--log-level", "warning", "--coordinator-port", "0"),
        ]
        self.proc = Proc(
            command, self.home / "agent.log", env={"PYTHONPATH": str(ROOT)}, cwd=self.home
        )
        self.proc.wait_ready(f"{self.base}/health", "lakelog serve")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.popen.pid

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


class Consumer:
    """One v2 consumer instance subscribed to a topic."""

    def __init__(self, base: str, topic: str, reset: str) -> None:
        self.http = httpx.Client(base_url=base, timeout=60)
        group = f"bench-{uuid.uuid4().hex[:6]}"
        r = self.http.post(
            f"/consumers/{group}",
            json={"auto.offset.reset": reset, "auto.commit.enable": "true"},
            headers=V2,
        )
        r.raise_for_status()
        self.path = f"/consumers/{group}/instances/{r.json()['instance_id']}"
        self.http.post(self.path + "/subscription", json={"topics": [topic]}, headers=V2)

    def fetch(self, timeout_ms: int, max_bytes: int) -> tuple[int, int]:
        """(records, value bytes) of one fetch."""
        r = self.http.get(
            f"{self.path}/records?timeout={timeout_ms}&max_bytes={max_bytes}",
            headers={"Accept": BINARY},
        )
        r.raise_for_status()
        records = orjson.loads(r.content)
        return len(records), sum(len(rec["value"]) * 3 // 4 for rec in records)

    def fetch_all(self, wanted: int) -> tuple[int, int]:
        """Fetches of up to 8 MiB (1 s each at most) until ``wanted`` records came or
        one came back empty; (records, value bytes) read."""
        records = size = 0
        while records < wanted:
            n, b = self.fetch(1000, 8 << 20)
            if n == 0:
                break
            records += n
            size += b
        return records, size


def producer(base: str, topic: str, stop: threading.Event, counts: list[int]) -> None:
    value = base64.b64encode(os.urandom(RECORD_BYTES)).decode()
    body = orjson.dumps({"records": [{"value": value}] * RECORDS_PER_REQUEST})
    headers = {"Content-Type": BINARY}
    with httpx.Client(timeout=60) as http:
        while not stop.is_set():
            r = http.post(f"{base}/topics/{topic}", content=body, headers=headers)
            r.raise_for_status()
            counts.append(RECORDS_PER_REQUEST)


def bench_tail(agent: Agent, moto_pid: int, topic: str, duration: float) -> int:
    """Produce and consume at once on the writing agent; returns records produced."""
    consumer = Consumer(agent.base, topic, "earliest")
    consumer.fetch(0, 1 << 20)  # joined, nothing there yet
    gets0 = metric_sum(agent.base, "lakelog_store_gets_total")
    stop = threading.Event()
    produced: list[int] = []
    threads = [
        threading.Thread(target=producer, args=(agent.base, topic, stop, produced))
        for _ in range(PRODUCERS)
    ]
    cpu = CpuMeter({"agent": agent.pid, "moto": moto_pid})
    cpu.start()
    started = time.monotonic()
    for t in threads:
        t.start()
    records = size = 0
    while time.monotonic() - started < duration:
        n, b = consumer.fetch(500, 8 << 20)
        records += n
        size += b
    window = time.monotonic() - started
    stop.set()
    for t in threads:
        t.join()
    cores = cpu.stop()
    total = sum(produced)
    drain_started = time.monotonic()
    n, b = consumer.fetch_all(total - records)
    records, size = records + n, size + b
    gets = metric_sum(agent.base, "lakelog_store_gets_total") - gets0
    mb = size / 1e6
    emit(
        bench="consume_tail",
        partitions=PARTITIONS,
        seconds=round(window, 2),
        produced_records=total,
        consumed_records=records,
        records_per_s=round(records / (window + time.monotonic() - drain_started)),
        mb_per_s=round(mb / (window + time.monotonic() - drain_started), 1),
        drain_s=round(time.monotonic() - drain_started, 2),
        store_gets=int(gets),
        gets_per_mb=round(gets / mb, 3) if mb else None,
        load=load_avg(),
        cpu_cores=cores,
    )
    return total


def bench_catchup(agent: Agent, moto_pid: int, topic: str, expected: int) -> float:
    """Restart the agent (cold caches) and read the whole history; returns MB/s."""
    agent.stop()
    agent.start()
    gets0 = metric_sum(agent.base, "lakelog_store_gets_total")
    get_bytes0 = metric_sum(agent.base, "lakelog_store_get_bytes_total")
    consumer = Consumer(agent.base, topic, "earliest")
    cpu = CpuMeter({"agent": agent.pid, "moto": moto_pid})
    cpu.start()
    started = time.monotonic()
    records, size = consumer.fetch_all(expected)
    elapsed = time.monotonic() - started
    mbps = size / 1e6 / elapsed
    emit(
        bench="consume_catchup",
        records=records,
        mb=round(size / 1e6, 1),
        seconds=round(elapsed, 2),
        records_per_s=round(records / elapsed),
        mb_per_s=round(mbps, 1),
        store_gets=int(metric_sum(agent.base, "lakelog_store_gets_total") - gets0),
        store_get_mb=round(
            (metric_sum(agent.base, "lakelog_store_get_bytes_total") - get_bytes0) / 1e6, 1
        ),
        load=load_avg(),
        cpu_cores=cpu.stop(),
    )
    return mbps


def bench_raw(agent: Agent, endpoint: str, bucket: str, topic: str) -> float:
    """Ranged GETs of the topic's chunks with 4 boto3 threads; returns MB/s."""
    from coordinator.local import LocalCoordinator

    coordinator = LocalCoordinator(f"sqlite:///{agent.home / 'meta.db'}")
    refs = []
    for p in range(PARTITIONS):
        offset = 0
        while True:
            batch = coordinator.lookup(topic, p, offset, max_chunks=1000)
            if not batch:
                break
            refs += batch
            offset = batch[-1].end_offset
    coordinator.close()
    s3 = boto3.client("s3", endpoint_url=endpoint)

    def get(ref: Any) -> int:
        r = s3.get_object(
            Bucket=bucket,
            Key=f"lakelog/{ref.object_key}",
            Range=f"bytes={ref.position}-{ref.position + ref.length - 1}",
        )
        return len(r["Body"].read())

    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        size = sum(pool.map(get, refs))
    elapsed = time.monotonic() - started
    mbps = size / 1e6 / elapsed
    emit(
        bench="raw_ranged_get",
        threads=4,
        gets=len(refs),
        mb=round(size / 1e6, 1),
        seconds=round(elapsed, 2),
        mb_per_s=round(mbps, 1),
    )
    return mbps


@contextlib.contextmanager
def served(prefix: str, bucket: str) -> Iterator[tuple[Agent, Proc, str]]:
    """A moto server and ``lakelog serve`` on a new bucket: (agent, moto, endpoint)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp_name:
        tmp = Path(tmp_name)
        moto, endpoint = start_moto(tmp)
        agent: Agent | None = None
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
            home = tmp / "agent"
            home.mkdir()
            agent = Agent(home, endpoint, bucket)
            yield agent, moto, endpoint
        finally:
            if agent is not None:
                agent.stop()
            moto.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=8.0, help="Tail window, seconds.")
    args = parser.parse_args()
    bucket = "bench-consume"
    with served("lakelog-bench-consume-", bucket) as (agent, moto, endpoint):
        topic = "tail"
        r = httpx.post(
            f"{agent.base}/v3/clusters/{agent.cluster_id}/topics",
            json={"topic_name": topic, "partitions_count": PARTITIONS},
        )
        r.raise_for_status()
        log(f"tail: producing and consuming for {args.duration} s")
        total = bench_tail(agent, moto.popen.pid, topic, args.duration)
        log(f"catch-up: cold agent reads {total} records")
        catchup = bench_catchup(agent, moto.popen.pid, topic, total)
        log("raw: ranged GETs of the same chunks")
        raw = bench_raw(agent, endpoint, bucket, topic)
        emit(
            bench="ratio",
            catchup_vs_raw=round(catchup / raw, 3),
            target=0.5,
        )


if __name__ == "__main__":
    main()
