"""The Kafka door under a real Kafka client: lakelog against Tansu on one moto server.

Starts one moto server, then ``lakelog serve --kafka-port ...`` (agent + in-process
SQLite coordinator, S3 on moto) and the Tansu 0.6 broker (``bench/produce.py`` fetches
its binary) on the same moto server. Sections (``--sections``):

- ``produce``: for 8, 100 and 1,000 partitions and each system, confluent-kafka
  produces keyed 1 KiB records (acks=all, linger 50 ms, batch.num.messages 1000, at most
  ``--inflight`` records unacknowledged) for ``--duration`` seconds: records/s, MB/s,
  p50/p99 delivery latency (``Message.latency()``), S3 PUT requests during the run (moto's
  access log) and, for lakelog, flushes (segment objects) from its ``/metrics``; then
  ``ratio`` lines (lakelog / Tansu records/s) and the PUT ratio 1,000 vs 8 partitions.
- ``consume``: lakelog only. A confluent-kafka consumer reads the 8-partition topic from
  offset 0 through a freshly started agent (cold read cache): MB/s of record values; then
  the same segment objects read with raw whole-object GETs (boto3, one thread, then four)
  as the ceiling (``ratio``); then a tailing consumer while a producer writes through the
  same agent: GETs the agent sent (``lakelog_store_gets``), expected 0 (write-through).
- ``profile``: py-spy (if installed) samples the agent for ``--duration`` seconds of the
  8-partition produce load: the top functions by own time and by total time.

Every line carries the load average and the CPU (in cores) of the broker, moto and this
process: all share the machine's cores. Run: ``.venv/bin/python bench/kafka.py``
(about 4 minutes), e.g. ``--sections produce --duration 5 --partitions 8``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import boto3  # noqa: E402
from produce import (  # noqa: E402
    TANSU_BUCKET,
    CpuMeter,
    KeyedLoad,
    emit,
    load_avg,
    log,
    metric_sum,
    moto_put_count,
    percentile,
    tansu_binary,
    wait_tcp,
)

from tests.procs import Proc, fake_aws_credentials, free_port, start_moto  # noqa: E402

RECORD_BYTES = 1024
BUCKET = "bench-lakelog-kafka"
SECTIONS = ("produce", "consume", "profile")

fake_aws_credentials()


class Lakelog:
    """``lakelog serve`` with a Kafka listener, storing in the moto bucket."""

    name = "lakelog"

    def __init__(self, tmp: Path, endpoint: str, prefix: str, profile: str | None = None) -> None:
        """``profile``: a file for the agent's cProfile stats (bench/tools/profiled_agent.py)."""
        port, self.kafka_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.bootstrap = f"127.0.0.1:{self.kafka_port}"
        self.store = f"s3://{BUCKET}/{prefix}"
        home = tmp / f"lakelog-{port}"
        home.mkdir()
        self.home = home
        command = [
            *(
                sys.executable,
                *(
                    ("-m", "service.cli")
                    if profile is None
                    else (str(ROOT / "bench" / "tools" / "profiled_agent.py"), profile)
                ),
            ),
            *("serve", "--host", "127.0.0.1"),
            *("--port", str(port), "--kafka-port", str(self.kafka_port)),
            *("--db", f"sqlite:///{tmp / (prefix + '.db')}"),
            *("--store", self.store, "--store-endpoint", endpoint, "--log-level", "warning"),
            *("--coordinator-port", "0"),
        ]
        log(f"starting lakelog serve on {self.base}, Kafka on {self.bootstrap}")
        self.proc = Proc(command, home / "agent.log", env={"PYTHONPATH": str(ROOT)}, cwd=home)
        self.proc.wait_ready(f"{self.base}/health", "lakelog", timeout=60)

    @property
    def pid(self) -> int:
        return self.proc.popen.pid

    def flushes(self) -> float:
        return metric_sum(self.base, "lakelog_flushes_total", 'result="ok"')

    def stop(self) -> None:
        self.proc.stop()


class Tansu:
    """The Tansu 0.6 broker on ``s3://bench-tansu/`` of the same moto server."""

    name = "tansu"

    def __init__(self, tmp: Path, endpoint: str, binary: Path) -> None:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=TANSU_BUCKET)
        port = free_port()
        self.bootstrap = f"127.0.0.1:{port}"
        env = {"AWS_ENDPOINT": endpoint, "AWS_ALLOW_HTTP": "true"}
        log(f"starting tansu on {self.bootstrap}")
        self.proc = Proc(
            [
                *(str(binary), "broker", "--storage-engine", f"s3://{TANSU_BUCKET}/"),
                *("--listener-url", f"tcp://{self.bootstrap}"),
                *("--advertised-listener-url", f"tcp://{self.bootstrap}"),
            ],
            tmp / "tansu.log",
            env=env,
        )
        wait_tcp(port, self.proc)

    @property
    def pid(self) -> int:
        return self.proc.popen.pid

    def flushes(self) -> float:
        return float("nan")

    def stop(self) -> None:
        self.proc.stop()


def raw_gets(endpoint: str, prefix: str) -> tuple[int, int, dict[int, float]]:
    """(objects, bytes, {threads: MB/s}) of whole-object GETs of the case's segments."""
    s3 = boto3.client("s3", endpoint_url=endpoint)
    keys, total = [], 0
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix=f"{prefix}/segments/"
    ):
        for o in page.get("Contents", []):
            keys.append(o["Key"])
            total += o["Size"]

    def get(key: str) -> int:
        return len(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    rates = {}
    for threads in (1, 4):
        started = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            read = sum(pool.map(get, keys))
        rates[threads] = read / 1e6 / (time.monotonic() - started)
    return len(keys), total, rates


def emit_raw_gets(
    endpoint: str, prefix: str, catchup_mb_per_s: float, ratio: str, **extra: Any
) -> None:
    """A ``raw_get`` line per thread count of ``raw_gets``, with the catch-up's MB/s as a
    fraction of theirs (named ``ratio``)."""
    objects, total, rates = raw_gets(endpoint, prefix)
    for threads, rate in rates.items():
        emit(
            bench="raw_get",
            **extra,
            threads=threads,
            objects=objects,
            mb=round(total / 1e6, 1),
            mb_per_s=round(rate, 1),
            **{ratio: round(catchup_mb_per_s / rate, 2)},
            load_avg=load_avg(),
        )


def consume_until(consumer: Any, expected: int, deadline: float) -> tuple[int, int, float | None]:
    """Consumes until ``expected`` records came or ``deadline`` (``time.monotonic()``)
    passed: (records, their value bytes, when the first came: None if none did)."""
    got = value_bytes = 0
    first = None
    while got < expected and time.monotonic() < deadline:
        for m in consumer.consume(10_000, 0.5):
            if m.error() is None:
                got += 1
                value_bytes += len(m.value() or b"")
        if got and first is None:
            first = time.monotonic()
    return got, value_bytes, first


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result(120)


def kafka_producer(bootstrap: str, queued: int, **extra: Any) -> Any:
    """A confluent-kafka Producer as the benchmarks drive it (acks=all, linger 50 ms,
    batch.num.messages 1000, no compression or idempotence), room for ``queued`` records
    (at least 100,000); ``extra``: more settings."""
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 50,
            "batch.num.messages": 1000,
            "batch.size": 4 << 20,
            "compression.type": "none",
            "enable.idempotence": False,
            "partitioner": "murmur2_random",
            "queue.buffering.max.messages": max(100_000, queued),
            "queue.buffering.max.kbytes": 1 << 21,
            **extra,
        }
    )


def spy_samples(
    raw: Path, frame: Callable[[str], str] = str
) -> tuple[int, dict[str, int], dict[str, int]]:
    """py-spy's ``--format raw`` output as (samples, own, total): samples per frame, with
    ``frame`` naming each ``name (file:line)`` frame; frames without a file are left out."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [frame(f) for f in stack.split(";")[1:] if " (" in f]
        if not frames:
            continue
        n = int(count)
        samples += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            total[f] = total.get(f, 0) + n
    return samples, own, total


def produce_load(bootstrap: str, topic: str, duration: float, inflight: int) -> dict[str, Any]:
    """Keyed 1 KiB records for ``duration`` s, at most ``inflight`` unacknowledged."""
    producer = kafka_producer(bootstrap, 2 * inflight, **{"log.connection.close": False})
    load = KeyedLoad(producer, topic, inflight)
    errors, seconds = load.run_for(duration)
    return {"latencies": sorted(load.latencies), "errors": errors, "seconds": seconds}


def section_produce(
    systems: list[Any], moto: Proc, args: argparse.Namespace
) -> dict[tuple[str, int], dict[str, Any]]:
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for partitions in args.partitions:
        for system in systems:
            topic = f"bench-{partitions}-{uuid.uuid4().hex[:6]}"
            create_topic(system.bootstrap, topic, partitions)
            log(f"{system.name}: {partitions} partitions, {args.duration:g} s")
            bucket = BUCKET if system.name == "lakelog" else TANSU_BUCKET
            puts0 = moto_put_count(moto.log, bucket)[0]
            flushes0 = system.flushes()
            cpu = CpuMeter({"broker": system.pid, "moto": moto.popen.pid})
            cpu.start()
            result = produce_load(system.bootstrap, topic, args.duration, args.inflight)
            cores = cpu.stop()
            lat, seconds = result["latencies"], result["seconds"]
            row = {
                "bench": "kafka_produce",
                "system": system.name,
                "partitions": partitions,
                "records": len(lat),
                "errors": result["errors"],
                "seconds": round(seconds, 2),
                "records_per_s": round(len(lat) / seconds),
                "mb_per_s": round(len(lat) * RECORD_BYTES / 1e6 / seconds, 1),
                "p50_ms": percentile(lat, 0.5),
                "p99_ms": percentile(lat, 0.99),
                "s3_puts": moto_put_count(moto.log, bucket)[0] - puts0,
                "segment_objects": None
                if system.name != "lakelog"
                else int(system.flushes() - flushes0),
                "cpu_cores": cores,
                "load_avg": load_avg(),
            }
            rows[(system.name, partitions)] = row
            emit(**row)
    for partitions in args.partitions:
        ours, peer = rows.get(("lakelog", partitions)), rows.get(("tansu", partitions))
        if ours and peer and peer["records_per_s"]:
            emit(
                bench="kafka_produce_ratio",
                partitions=partitions,
                records_per_s_vs_tansu=round(ours["records_per_s"] / peer["records_per_s"], 2),
                puts_vs_tansu=round(ours["s3_puts"] / max(1, peer["s3_puts"]), 3),
            )
    lo, hi = (
        rows.get(("lakelog", min(args.partitions))),
        rows.get(("lakelog", max(args.partitions))),
    )
    if lo and hi and lo is not hi:
        emit(
            bench="kafka_produce_puts_scaling",
            puts_per_s_low=round(lo["s3_puts"] / lo["seconds"], 1),
            puts_per_s_high=round(hi["s3_puts"] / hi["seconds"], 1),
            ratio=round(
                (hi["s3_puts"] / hi["seconds"]) / max(1e-9, lo["s3_puts"] / lo["seconds"]), 2
            ),
        )
    return rows


def section_consume(tmp: Path, endpoint: str, moto: Proc, args: argparse.Namespace) -> None:
    """Catch-up MB/s against raw GETs of the same objects; tailing GETs."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    prefix = f"consume-{uuid.uuid4().hex[:6]}"
    writer = Lakelog(tmp, endpoint, prefix)
    topic = "catchup"
    partitions = 8
    try:
        create_topic(writer.bootstrap, topic, partitions)
        result = produce_load(writer.bootstrap, topic, args.duration, args.inflight)
        produced = len(result["latencies"]) + 1
    finally:
        writer.stop()
    # A fresh agent on the same database and bucket: nothing in its read cache.
    reader = Lakelog(tmp, endpoint, prefix)
    try:
        consumer = Consumer(
            {
                "bootstrap.servers": reader.bootstrap,
                "group.id": "bench",
                "enable.auto.commit": False,
                "fetch.max.bytes": 64 << 20,
                "max.partition.fetch.bytes": 8 << 20,
            }
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        gets0 = metric_sum(reader.base, "lakelog_store_gets_total")
        cpu = CpuMeter({"broker": reader.pid, "moto": moto.popen.pid})
        cpu.start()
        started = time.monotonic()
        got, value_bytes, _ = consume_until(consumer, produced, started + 300)
        seconds = time.monotonic() - started
        cores = cpu.stop()
        consumer.close()
        gets = metric_sum(reader.base, "lakelog_store_gets_total") - gets0
        mbps = value_bytes / 1e6 / seconds
        emit(
            bench="kafka_catchup",
            records=got,
            produced=produced,
            seconds=round(seconds, 2),
            mb_per_s=round(mbps, 1),
            store_gets=int(gets),
            cpu_cores=cores,
            load_avg=load_avg(),
        )

        emit_raw_gets(endpoint, prefix, mbps, "catchup_ratio")

        # Tailing: a consumer at the end while a producer writes through the same agent.
        tail = Consumer(
            {
                "bootstrap.servers": reader.bootstrap,
                "group.id": "tail",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
            }
        )
        tail.assign([TopicPartition(topic, p, -1) for p in range(partitions)])  # OFFSET_END
        for _ in range(10):
            tail.poll(0.1)
        gets0 = metric_sum(reader.base, "lakelog_store_gets_total")
        stop = threading.Event()
        tailed = 0

        def read_tail() -> None:
            nonlocal tailed
            while not stop.is_set():
                for m in tail.consume(1000, 0.2):
                    if m.error() is None:
                        tailed += 1

        t = threading.Thread(target=read_tail)
        t.start()
        producer = Producer({"bootstrap.servers": reader.bootstrap, "linger.ms": 50})
        sent = 0
        started = time.monotonic()
        while time.monotonic() - started < args.duration:
            for _ in range(500):
                producer.produce(topic, value=os.urandom(RECORD_BYTES))
            sent += 500
            producer.poll(0.05)
        producer.flush(60)
        time.sleep(1.0)
        stop.set()
        t.join()
        tail.close()
        emit(
            bench="kafka_tail",
            sent=sent,
            tailed=tailed,
            store_gets=int(metric_sum(reader.base, "lakelog_store_gets_total") - gets0),
            load_avg=load_avg(),
        )
    finally:
        reader.stop()


def section_profile(tmp: Path, endpoint: str, args: argparse.Namespace) -> None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        emit(bench="kafka_profile", skipped="py-spy not installed (pip install py-spy)")
        return
    agent = Lakelog(tmp, endpoint, f"profile-{uuid.uuid4().hex[:6]}")
    try:
        create_topic(agent.bootstrap, "profile", 8)
        out = tmp / "profile.txt"
        sampler = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(agent.pid),
                "--duration",
                str(int(args.duration) + 2),
                "--format",
                "raw",
                "--output",
                str(out),
                "--threads",
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        produce_load(agent.bootstrap, "profile", args.duration, args.inflight)
        sampler.wait(120)
        samples, own, total = spy_samples(
            out, lambda f: f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0] + ")"
        )
        top_own = sorted(own.items(), key=lambda kv: -kv[1])[:15]
        interesting = [kv for kv in total.items() if "lakelog" in kv[0] or "/work/" in kv[0]
                       or any(p in kv[0] for p in ("service/", "segments/", "index/",
                                                   "coordinator/"))]  # fmt: skip
        top_total = sorted(interesting, key=lambda kv: -kv[1])[:15]
        emit(
            bench="kafka_profile",
            samples=samples,
            top_own=[[f, round(n / samples, 3)] for f, n in top_own],
            top_total=[[f, round(n / samples, 3)] for f, n in top_total],
        )
    finally:
        agent.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument(
        "--partitions", type=lambda s: [int(x) for x in s.split(",")], default=[8, 100, 1000]
    )
    p.add_argument("--inflight", type=int, default=20_000)
    p.add_argument("--tansu-bin", default=None)
    args = p.parse_args()
    sections = set(args.sections.split(","))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        moto, endpoint = start_moto(tmp)
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
            if "produce" in sections:
                systems: list[Any] = [Lakelog(tmp, endpoint, "produce")]
                try:
                    systems.append(Tansu(tmp, endpoint, tansu_binary(args.tansu_bin)))
                except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                    emit(bench="tansu", skipped=f"no tansu: {e}")
                try:
                    section_produce(systems, moto, args)
                finally:
                    for s in systems:
                        s.stop()
            if "consume" in sections:
                section_consume(tmp, endpoint, moto, args)
            if "profile" in sections:
                section_profile(tmp, endpoint, args)
        finally:
            moto.stop()


if __name__ == "__main__":
    main()
