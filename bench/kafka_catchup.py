"""Kafka catch-up at 8 and at 1,000 partitions over the same amount of data (issue 29).

Starts one moto server. For each partition count in ``--partitions`` (default 8 and
1,000): ``lakelog serve --kafka-port ...`` (agent + in-process SQLite coordinator, S3 on
moto; ``bench/kafka.py``'s ``Lakelog``) creates a topic and confluent-kafka produces exactly
``--records`` keyed 1 KiB records (acks=all, linger 50 ms, batch.num.messages 1000). Then a
fresh confluent-kafka consumer (assign every partition at offset 0) reads everything:

- ``warm``: through the agent that wrote the records (its write-through tail cache
  holds every chunk: no GET);
- ``cold``: through a freshly started agent on the same database and bucket (nothing
  cached: every chunk is fetched from the store).

Each line: MB/s of record values, Fetch requests the client sent, store GETs the agent sent
(``lakelog_store_gets_total``), CPU (cores) of the agent, moto and this process, the
agent's peak resident set during the catch-up, load average. Then ``raw_get`` lines: the
same segment objects read whole with boto3 (1 thread, then 4) and the ratio of the cold
catch-up to them, and a ``catchup_scaling`` line: the rate at the largest partition count
over the rate at the smallest (issue 29's target >= 0.5).

``--profile DIR``: py-spy (``PY_SPY``, else on the PATH or next to this interpreter)
samples every thread of the agent during each catch-up; the top functions by own time and
lakelog's by total time go to stderr, the raw samples to DIR/<case>.txt.

Run: ``.venv/bin/python bench/kafka_catchup.py`` (about 2 minutes), e.g.
``--partitions 1000 --records 20000``. Progress goes to stderr, JSON lines to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import boto3  # noqa: E402
import kafka  # noqa: E402
from kafka import BUCKET, RECORD_BYTES, Lakelog, create_topic  # noqa: E402
from produce import CpuMeter, PeakRss, emit, load_avg, log, metric_sum  # noqa: E402

from tests.procs import fake_aws_credentials, start_moto  # noqa: E402

fake_aws_credentials()


def produce_exactly(bootstrap: str, topic: str, count: int) -> float:
    """``count`` keyed 1 KiB records, all acknowledged; returns seconds taken."""
    producer = kafka.kafka_producer(bootstrap, count)
    errors = 0

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal errors
        if err is not None:
            errors += 1

    value = os.urandom(RECORD_BYTES)
    started = time.monotonic()
    for i in range(count):
        while True:
            try:
                producer.produce(
                    topic, value=value, key=i.to_bytes(8, "big"), on_delivery=on_delivery
                )
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if errors or left:
        raise RuntimeError(f"produce: {errors} errors, {left} not delivered")
    return time.monotonic() - started


def wait_alone(agent: Lakelog, timeout: float = 60.0) -> None:
    """Until the agent's Metadata lists it alone: the stopped writer's heartbeat is old
    enough (otherwise the client is sent to a dead broker for half the partitions)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": agent.bootstrap})
    deadline = time.monotonic() + timeout
    while len(admin.list_topics(timeout=10).brokers) > 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the stopped writer is still listed as a broker")
        time.sleep(0.5)


def catch_up(
    agent: Lakelog,
    topic: str,
    partitions: int,
    expected: int,
    isolation: str = "read_committed",
    moto_pid: int | None = None,
) -> dict[str, Any]:
    """A fresh consumer reads every partition from offset 0 through ``agent``, with
    ``isolation.level`` = ``isolation`` (librdkafka's default is read_committed); the CPU
    of moto's process too when its pid is given."""
    from confluent_kafka import Consumer, TopicPartition

    stats: list[str] = []
    consumer = Consumer(
        {
            "bootstrap.servers": agent.bootstrap,
            "group.id": f"catchup-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 8 << 20,
            # librdkafka fetches ahead only while its queue holds less than this (64 MiB by
            # default: one answer of fetch.max.bytes fills it, and the next Fetch waits
            # for the application to drain it); a catch-up wants the next answer on its way.
            "queued.max.messages.kbytes": 256 << 10,
            "statistics.interval.ms": 500,
            "stats_cb": stats.append,
            "isolation.level": isolation,
        }
    )
    # The topic's metadata first, outside the timing: after assign(), librdkafka asks for
    # it at once or after its own 1 s timer (seen in half the runs at 1,000 partitions, its
    # debug log idle for that second), which is the client's, not the catch-up's.
    consumer.list_topics(topic, timeout=30)
    gets0 = metric_sum(agent.base, "lakelog_store_gets_total")
    cpu = CpuMeter({"agent": agent.pid} | ({} if moto_pid is None else {"moto": moto_pid}))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    peak = PeakRss(agent.pid)
    peak.start()
    cpu.start()
    started = time.monotonic()
    deadline = started + 300
    got, value_bytes, first = kafka.consume_until(consumer, expected, deadline)
    seconds = time.monotonic() - started
    cores = cpu.stop()
    stats.clear()
    while not stats and time.monotonic() < deadline:
        consumer.poll(0.1)  # the client's statistics: Fetch requests sent
    consumer.close()
    fetches = sum(
        b.get("req", {}).get("Fetch", 0) for b in json.loads(stats[-1])["brokers"].values()
    )
    return {
        "records": got,
        "expected": expected,
        "seconds": round(seconds, 2),
        "mb_per_s": round(value_bytes / 1e6 / seconds, 1),
        "first_record_s": None if first is None else round(first - started, 2),
        "fetch_requests": fetches,
        "store_gets": int(metric_sum(agent.base, "lakelog_store_gets_total") - gets0),
        "cpu_cores": cores,
        "agent_peak_rss_mib": peak.stop(),
        "load_avg": load_avg(),
    }


class Profiled:
    """py-spy samples of an agent (all its threads) during one catch-up."""

    def __init__(self, spy: str | None, out_dir: Path | None, case: str) -> None:
        self.spy = spy
        self.out = None if out_dir is None else out_dir / f"{case}.txt"
        self.sampler: subprocess.Popen[bytes] | None = None

    def start(self, agent: Lakelog) -> None:
        if self.spy is None or self.out is None:
            return
        self.sampler = subprocess.Popen(
            [
                *(self.spy, "record", "--pid", str(agent.pid), "--format", "raw"),
                *("--output", str(self.out), "--threads", "--nonblocking", "--rate", "200"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attaches

    def stop(self) -> None:
        if self.sampler is None or self.out is None:
            return
        self.sampler.send_signal(signal.SIGINT)  # py-spy writes what it has and ends
        self.sampler.wait(60)
        samples, own, total = kafka.spy_samples(self.out)
        if not samples:
            return
        ours = [kv for kv in total.items() if any(
            p in kv[0] for p in ("service/", "segments/", "index/", "coordinator/"))]  # fmt: skip
        lines = [f"py-spy {self.out.name}: {samples} samples (all threads); own time:"]
        lines += [
            f"  {n / samples:6.1%}  {f}" for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:20]
        ]
        lines += ["total time (lakelog frames):"]
        lines += [f"  {n / samples:6.1%}  {f}" for f, n in sorted(ours, key=lambda kv: -kv[1])[:25]]
        log("\n".join(lines))


def py_spy() -> str:
    found = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if not found:
        found = str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("--profile needs py-spy (pip install py-spy, or PY_SPY=/path/to/py-spy)")
    return found


def run_case(
    tmp: Path, endpoint: str, moto_pid: int, partitions: int, args: argparse.Namespace
) -> dict[str, Any]:
    prefix = f"catchup{partitions}-{uuid.uuid4().hex[:6]}"
    topic = "catchup"
    profile_dir = Path(args.profile).resolve() if args.profile else None
    spy = py_spy() if profile_dir else None
    rows: dict[str, Any] = {}

    def timed(case: str, agent: Lakelog) -> None:
        """One catch-up through ``agent`` (sampled with py-spy under --profile)."""
        p = Profiled(spy, profile_dir, f"{case}-{partitions}")
        p.start(agent)
        rows[case] = catch_up(agent, topic, partitions, args.records, moto_pid=moto_pid)
        p.stop()
        emit(bench="kafka_catchup", case=case, partitions=partitions, **rows[case])

    writer = Lakelog(tmp, endpoint, prefix)
    try:
        create_topic(writer.bootstrap, topic, partitions)
        log(f"{partitions} partitions: producing {args.records} records")
        seconds = produce_exactly(writer.bootstrap, topic, args.records)
        emit(
            bench="catchup_produce",
            partitions=partitions,
            records=args.records,
            seconds=round(seconds, 2),
            segment_objects=int(writer.flushes()),
            load_avg=load_avg(),
        )
        log(f"{partitions} partitions: warm catch-up through the writing agent")
        timed("warm", writer)
    finally:
        writer.stop()
    reader = Lakelog(tmp, endpoint, prefix)
    try:
        wait_alone(reader)
        log(f"{partitions} partitions: cold catch-up through a fresh agent")
        timed("cold", reader)
    finally:
        reader.stop()
    cold = rows["cold"]["mb_per_s"]
    kafka.emit_raw_gets(endpoint, prefix, cold, "cold_catchup_ratio", partitions=partitions)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--partitions", type=lambda s: [int(x) for x in s.split(",")], default=[8, 1000])
    p.add_argument("--records", type=int, default=40_000)
    p.add_argument("--profile", default=None, help="a directory for py-spy samples")
    args = p.parse_args()
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    results: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        moto, endpoint = start_moto(tmp)
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
            for partitions in args.partitions:
                results[partitions] = run_case(tmp, endpoint, moto.popen.pid, partitions, args)
        finally:
            moto.stop()
    lo, hi = min(results), max(results)
    if lo != hi:
        for case in ("warm", "cold"):
            emit(
                bench="catchup_scaling",
                case=case,
                partitions=[lo, hi],
                ratio=round(results[hi][case]["mb_per_s"] / results[lo][case]["mb_per_s"], 2),
            )


if __name__ == "__main__":
    main()
