"""Kafka transactions against idempotent produce, read_committed against read_uncommitted
(issue 30), with confluent-kafka.

Starts one moto server and one ``lakelog serve --kafka-port ...`` (agent + in-process
SQLite coordinator, S3 on moto; ``bench/kafka.py``'s ``Lakelog``). Sections
(``--sections``):

- ``produce``: keyed 1 KiB records to an 8-partition topic for ``--duration`` seconds
  (acks=all, linger 50 ms, batch.num.messages 1000, at most ``--inflight`` records
  unacknowledged), with an idempotent producer and with a transactional one for each of
  ``--commit-ms`` (a commit every 100 ms and every 1 s by default: the next commit starts
  that long after the last one ended), ``--rounds`` times, the order reversed every other
  round (the machine's load drifts): records/s and
  MB/s of records delivered (and committed), p50/p99 delivery latency
  (``Message.latency()``), p50/p99 of ``commit_ms`` (what the application waits in a
  commit: ``flush()`` of what is unsent, then ``commit_transaction()``) and of ``end_txn_ms``
  (``commit_transaction()`` alone, after the flush: the EndTxn round trip, whose markers
  are one PUT and one commit), S3 PUTs (moto's access log), segment objects of records
  (the agent's flushes), transactions and their mean period; then ``txn_produce_ratio``
  lines (mean transactional / mean idempotent records/s; the issue's target is >= 0.5 at
  100 ms).
- ``catchup``: ``--records`` records produced transactionally (a commit every 100 ms),
  then read by fresh consumers (assign every partition at offset 0) with
  ``isolation.level`` read_committed and read_uncommitted, alternately (``--read-rounds``
  each; ``bench/kafka_catchup.py``'s ``catch_up``): ``warm`` through the writing agent
  (its write-through cache holds every chunk), then ``cold`` through a freshly started
  agent per read (every chunk from the store); then ``txn_catchup_ratio`` lines
  (read_committed / read_uncommitted MB/s, best of each; target >= 0.8).
- ``e2e``: a consume-transform-produce loop: a producer writes ``--e2e-rate`` records/s
  to topic A; the loop consumes A read_committed and produces each record to topic B
  (same partition, its original timestamp) in a transaction committed every
  ``--e2e-commit-ms`` with ``send_offsets_to_transaction``; a read_committed consumer of
  B measures the time from the record's produce timestamp (CreateTime, set by the
  client) to its arrival: p50/p99/max (records produced after a 1 s warm-up); the
  parts: the agent's ack of A's records (``source_ack_*``, ``Message.latency()``), their
  arrival in the loop (``to_loop_*``), and the loop's commit latency
  (``send_offsets_to_transaction`` + ``commit_transaction``).

Measured lines carry the load average before and after; produce and catch-up lines the
CPU (cores) of the agent, moto and this process. ``--quick`` is a short run (under a minute). Run:
``.venv/bin/python bench/transactions.py`` (about 3 minutes). Progress goes to stderr,
JSON lines to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import boto3  # noqa: E402
import kafka  # noqa: E402
import produce  # noqa: E402
from kafka import BUCKET, RECORD_BYTES, Lakelog, create_topic  # noqa: E402
from kafka_catchup import catch_up, wait_alone  # noqa: E402
from produce import CpuMeter, emit, load_avg, log, moto_put_count, percentile  # noqa: E402

from tests.procs import Proc, fake_aws_credentials, start_moto  # noqa: E402

SECTIONS = ("produce", "catchup", "e2e")
PARTITIONS = 8

fake_aws_credentials()


def ms(seconds: list[float], q: float) -> float | None:
    return percentile(sorted(seconds), q)


def pct_ms(values_ms: list[float], q: float) -> float | None:
    """The q-quantile of values already in ms."""
    if not values_ms:
        return None
    ordered = sorted(values_ms)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 1)


def produce_load(
    bootstrap: str,
    topic: str,
    *,
    inflight: int,
    commit_every: float | None,
    duration: float = float("inf"),
    count: int | None = None,
) -> dict[str, Any]:
    """Keyed 1 KiB records for ``duration`` s (or exactly ``count`` records), at most
    ``inflight`` unacknowledged, by an idempotent producer (``commit_every`` None) or a
    transactional one committing every ``commit_every`` s (and at the end)."""
    extra: dict[str, Any] = {"enable.idempotence": True, "log.connection.close": False}
    if commit_every is not None:
        extra["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    producer = kafka.kafka_producer(bootstrap, 2 * inflight, **extra)
    load = produce.KeyedLoad(producer, topic, inflight)
    commits: list[float] = []
    end_txns: list[float] = []

    def commit() -> None:
        t0 = time.monotonic()
        producer.flush(120)
        t1 = time.monotonic()
        producer.commit_transaction(120)
        t2 = time.monotonic()
        commits.append(t2 - t0)
        end_txns.append(t2 - t1)

    # The producer id (and a first transaction) before the clock too.
    if commit_every is not None:
        producer.init_transactions(60)
        producer.begin_transaction()
    load.warm_up()
    if commit_every is not None:
        producer.commit_transaction(60)
        producer.begin_transaction()
    limit = count if count is not None else 1 << 62
    started = txn_started = time.monotonic()
    deadline = started + duration
    while load.produced < limit and time.monotonic() < deadline:
        if commit_every is not None and time.monotonic() - txn_started >= commit_every:
            commit()
            producer.begin_transaction()
            txn_started = time.monotonic()
        load.step(limit - load.produced)
    if commit_every is not None:
        commit()
    errors = load.finish()
    seconds = time.monotonic() - started
    return {
        "records": len(load.latencies),
        "errors": errors,
        "seconds": seconds,
        "latencies": load.latencies,
        "commits": commits,
        "end_txns": end_txns,
    }


def section_produce(agent: Lakelog, moto: Proc, args: argparse.Namespace) -> None:
    """Each mode ``--rounds`` times, the order reversed every other round (the machine's
    load drifts); the ratio of the mean records/s of each mode."""
    rates: dict[str, list[int]] = {}
    modes: list[tuple[str, float | None]] = [("idempotent", None)]
    modes += [(f"transactional_{c}ms", c / 1000) for c in args.commit_ms]
    for i in range(args.rounds):
        for name, every in modes if i % 2 == 0 else modes[::-1]:
            topic = f"produce-{name}-{uuid.uuid4().hex[:6]}"
            create_topic(agent.bootstrap, topic, PARTITIONS)
            log(f"produce: {name}, {args.duration:g} s (round {i + 1})")
            puts0 = moto_put_count(moto.log, BUCKET)[0]
            flushes0 = agent.flushes()
            before = load_avg()
            cpu = CpuMeter({"agent": agent.pid, "moto": moto.popen.pid})
            cpu.start()
            r = produce_load(
                agent.bootstrap, topic, inflight=args.inflight, commit_every=every,
                duration=args.duration,
            )  # fmt: skip
            cores = cpu.stop()
            commits = r["commits"]
            row = {
                "bench": "txn_produce",
                "mode": name,
                "round": i + 1,
                "partitions": PARTITIONS,
                "records": r["records"],
                "errors": r["errors"],
                "seconds": round(r["seconds"], 2),
                "records_per_s": round(r["records"] / r["seconds"]),
                "mb_per_s": round(r["records"] * RECORD_BYTES / 1e6 / r["seconds"], 1),
                "p50_ms": ms(r["latencies"], 0.5),
                "p99_ms": ms(r["latencies"], 0.99),
                "transactions": len(commits),
                "txn_period_ms": round(r["seconds"] * 1e3 / len(commits), 1) if commits else None,
                "commit_p50_ms": ms(commits, 0.5),
                "commit_p99_ms": ms(commits, 0.99),
                "end_txn_p50_ms": ms(r["end_txns"], 0.5),
                "end_txn_p99_ms": ms(r["end_txns"], 0.99),
                "s3_puts": moto_put_count(moto.log, BUCKET)[0] - puts0,
                "segment_objects": int(agent.flushes() - flushes0),
                "cpu_cores": cores,
                "load_avg_before": before,
                "load_avg": load_avg(),
            }
            rates.setdefault(name, []).append(row["records_per_s"])
            emit(**row)
    base = sum(rates["idempotent"]) / len(rates["idempotent"])
    for name, got in rates.items():
        if name != "idempotent" and base:
            emit(
                bench="txn_produce_ratio",
                mode=name,
                records_per_s=round(sum(got) / len(got)),
                idempotent_records_per_s=round(base),
                vs_idempotent=round(sum(got) / len(got) / base, 2),
                target=0.5 if name == "transactional_100ms" else None,
            )


def section_catchup(tmp: Path, endpoint: str, agent: Lakelog, args: argparse.Namespace) -> Lakelog:
    """Returns the agent then running (the writer is replaced by fresh ones)."""
    topic = f"catchup-{uuid.uuid4().hex[:6]}"
    create_topic(agent.bootstrap, topic, PARTITIONS)
    log(f"catchup: producing {args.records} records, a commit every 100 ms")
    # The warm-up's record is one of them: a multiple of 10,000 is read by whole
    # consume(10_000) calls, none left waiting for its timeout.
    r = produce_load(agent.bootstrap, topic, inflight=args.inflight, commit_every=0.1,
                     count=args.records - 1)  # fmt: skip
    if r["errors"] or r["records"] != args.records - 1:
        raise RuntimeError(f"catchup produce: {r['records']} delivered, {r['errors']} errors")
    expected = args.records
    emit(
        bench="txn_catchup_produce",
        records=expected,
        transactions=len(r["commits"]) + 1,
        seconds=round(r["seconds"], 2),
        load_avg=load_avg(),
    )
    best: dict[tuple[str, str], float] = {}

    def read(case: str, through: Lakelog, isolation: str) -> None:
        before = load_avg()
        row = catch_up(through, topic, PARTITIONS, expected, isolation=isolation)
        if row["records"] != expected:
            raise RuntimeError(f"{case} {isolation}: read {row['records']} of {expected}")
        emit(bench="txn_catchup", case=case, isolation=isolation, load_avg_before=before, **row)
        key = (case, isolation)
        best[key] = max(best.get(key, 0.0), row["mb_per_s"])

    isolations = ("read_committed", "read_uncommitted")
    for i in range(args.read_rounds):
        for isolation in isolations if i % 2 == 0 else isolations[::-1]:
            log(f"catchup: warm, {isolation}")
            read("warm", agent, isolation)
    for i in range(args.read_rounds):
        for isolation in isolations if i % 2 == 0 else isolations[::-1]:
            agent.stop()
            agent = Lakelog(tmp, endpoint, "bench")
            wait_alone(agent)
            log(f"catchup: cold (a fresh agent), {isolation}")
            read("cold", agent, isolation)
    for case in ("warm", "cold"):
        committed = best[(case, "read_committed")]
        uncommitted = best[(case, "read_uncommitted")]
        emit(
            bench="txn_catchup_ratio",
            case=case,
            read_committed_mb_per_s=committed,
            read_uncommitted_mb_per_s=uncommitted,
            ratio=round(committed / uncommitted, 2) if uncommitted else None,
            target=0.8,
        )
    return agent


def section_e2e(agent: Lakelog, args: argparse.Namespace) -> None:
    """Consume A read_committed, produce to B in transactions with the consumed offsets,
    read B read_committed: produce-to-arrival latency."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    run = uuid.uuid4().hex[:6]
    source, sink, group = f"e2e-a-{run}", f"e2e-b-{run}", f"e2e-{run}"
    create_topic(agent.bootstrap, source, PARTITIONS)
    create_topic(agent.bootstrap, sink, PARTITIONS)

    def consumer(group_id: str, topic: str) -> Any:
        c = Consumer(
            {
                "bootstrap.servers": agent.bootstrap,
                "group.id": group_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": args.fetch_wait_ms,
            }
        )
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        return c

    stop = threading.Event()
    sent = transformed = arrived = 0
    commits: list[float] = []
    latencies: list[float] = []  # ms, of records produced after the warm-up
    consumed: list[float] = []  # ms from produce to the loop's consume, the same records
    measure_from_ms = 0.0
    failures: list[BaseException] = []

    def transform() -> None:
        nonlocal transformed
        try:
            c = consumer(group, source)
            p = Producer(
                {
                    "bootstrap.servers": agent.bootstrap,
                    "transactional.id": f"e2e-{run}",
                    "linger.ms": 5,
                }
            )
            p.init_transactions(60)
            meta = c.consumer_group_metadata()
            open_since: float | None = None
            every = args.e2e_commit_ms / 1000
            while not stop.is_set():
                # consume() returns when it has its 1,000 records or at its timeout: a short
                # one, so a record is taken (and its transaction begun) as it arrives.
                wait = 0.005 if open_since is None else open_since + every - time.monotonic()
                for m in c.consume(1000, min(0.005, max(0.0, wait))):
                    if m.error() is not None:
                        continue
                    if m.timestamp()[1] >= measure_from_ms:
                        consumed.append(time.time() * 1000 - m.timestamp()[1])
                    if open_since is None:
                        p.begin_transaction()
                        open_since = time.monotonic()
                    p.produce(
                        sink, value=m.value(), key=m.key(), partition=m.partition(),
                        timestamp=m.timestamp()[1],
                    )  # fmt: skip
                    transformed += 1
                p.poll(0)
                if open_since is not None and time.monotonic() - open_since >= every:
                    offsets = [tp for tp in c.position(c.assignment()) if tp.offset >= 0]
                    t0 = time.monotonic()
                    p.send_offsets_to_transaction(offsets, meta, 60)
                    p.commit_transaction(60)
                    commits.append(time.monotonic() - t0)
                    open_since = None
            if open_since is not None:
                p.commit_transaction(60)
            c.close()
        except BaseException as e:
            failures.append(e)
            stop.set()

    def read_sink() -> None:
        nonlocal arrived
        try:
            c = consumer(f"sink-{run}", sink)
            while not stop.is_set():
                for m in c.consume(1000, 0.1):
                    if m.error() is not None:
                        continue
                    now = time.time() * 1000
                    arrived += 1
                    ts = m.timestamp()[1]
                    if ts >= measure_from_ms:
                        latencies.append(now - ts)
            c.close()
        except BaseException as e:
            failures.append(e)
            stop.set()

    threads = [threading.Thread(target=transform), threading.Thread(target=read_sink)]
    for t in threads:
        t.start()
    producer = Producer(
        {"bootstrap.servers": agent.bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
    acked: list[float] = []  # s from produce() to the agent's ack, of A's records

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            acked.append(msg.latency() or 0.0)

    value = os.urandom(RECORD_BYTES)
    log(f"e2e: {args.e2e_rate} records/s for {args.duration:g} s (+1 s warm-up)")
    before = load_avg()
    started = time.monotonic()
    measure_from_ms = time.time() * 1000 + 1000
    tick, ticks = 0.01, 0
    while time.monotonic() - started < args.duration + 1 and not failures:
        ticks += 1
        while sent < int(ticks * tick * args.e2e_rate):
            producer.produce(
                source, value=value, key=sent.to_bytes(8, "big"), on_delivery=on_delivery
            )
            sent += 1
        producer.poll(0)
        time.sleep(max(0.0, started + ticks * tick - time.monotonic()))
    producer.flush(60)
    deadline = time.monotonic() + 60
    while (transformed < sent or arrived < sent) and time.monotonic() < deadline:
        if failures:
            break
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(120)
    if failures:
        raise failures[0]
    emit(
        bench="txn_e2e",
        rate=args.e2e_rate,
        commit_every_ms=args.e2e_commit_ms,
        fetch_wait_max_ms=args.fetch_wait_ms,
        sent=sent,
        transformed=transformed,
        arrived=arrived,
        measured=len(latencies),
        p50_ms=pct_ms(latencies, 0.5),
        p99_ms=pct_ms(latencies, 0.99),
        max_ms=pct_ms(latencies, 1.0),
        source_ack_p50_ms=ms(acked, 0.5),
        source_ack_p99_ms=ms(acked, 0.99),
        to_loop_p50_ms=pct_ms(consumed, 0.5),
        to_loop_p99_ms=pct_ms(consumed, 0.99),
        transactions=len(commits),
        commit_p50_ms=ms(commits, 0.5),
        commit_p99_ms=ms(commits, 0.99),
        load_avg_before=before,
        load_avg=load_avg(),
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--quick", action="store_true", help="short runs: under a minute in all")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument(
        "--commit-ms", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1000]
    )
    p.add_argument("--inflight", type=int, default=20_000)
    p.add_argument("--records", type=int, default=40_000)
    p.add_argument("--rounds", type=int, default=2, help="of each produce mode")
    p.add_argument("--read-rounds", type=int, default=3, help="of each catch-up read")
    p.add_argument("--e2e-rate", type=int, default=2000)
    p.add_argument("--e2e-commit-ms", type=int, default=100)
    p.add_argument("--fetch-wait-ms", type=int, default=100)
    args = p.parse_args()
    if args.quick:
        args.duration, args.records, args.rounds, args.read_rounds = 2.0, 10_000, 1, 1
    sections = set(args.sections.split(","))
    emit(bench="txn_start", args=vars(args), load_avg=load_avg())
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        moto, endpoint = start_moto(tmp)
        agent: Lakelog | None = None
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
            agent = Lakelog(tmp, endpoint, "bench")
            if "produce" in sections:
                section_produce(agent, moto, args)
            if "e2e" in sections:
                section_e2e(agent, args)
            if "catchup" in sections:
                agent = section_catchup(tmp, endpoint, agent, args)
        finally:
            if agent is not None:
                agent.stop()
            moto.stop()
    emit(bench="txn_end", load_avg=load_avg())


if __name__ == "__main__":
    main()
