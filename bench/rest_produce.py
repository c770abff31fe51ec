"""REST produce at the Kafka door's cost (issue 29): agent CPU per record, side by side.

Starts one moto server and one ``lakelog serve --kafka-port ...`` (agent + in-process SQLite
coordinator, S3 on moto), creates one topic of ``--partitions`` partitions, then for each
case in ``--cases`` produces keyed 1 KiB records for ``--duration`` seconds:

- ``kafka``: confluent-kafka (acks=all, linger 50 ms, batch 1,000, murmur2), the Kafka door;
- ``v2_binary`` / ``v2_json``: REST v2 ``POST /topics/{t}``, 100 records per request
  (base64 values, or ~1 KiB JSON objects as values and JSON strings as keys);
- ``v3_binary`` / ``v3_json``: REST v3 ``POST .../records``, 100 concatenated record
  objects per request (``type`` BINARY or JSON), reading the streamed delivery reports.

The REST load comes from ``--clients`` closed-loop raw HTTP/1.1 connections
(``bench/produce.py``'s ``RawConn``: well under 1 ms of client CPU per request, so the
client does not starve the agent it measures); every body is encoded before the clock
starts. Each line: records/s, MB/s of values, p50/p99 request latency, the agent's CPU in
cores and **per record** (``agent_us_per_record``: the agent process's user + system CPU,
flush PUTs and commits included, divided by the records acknowledged), moto's and this
client's CPU, the agent's peak resident set during the case, the load average. Then one
``rest_vs_kafka`` line per REST case (records/s and CPU per record against the Kafka
door's, the issue's targets: <= 10 us binary, <= 15 us JSON, >= 0.5x the Kafka door's
records/s).

``--profile FILE`` runs the agent under cProfile (bench/tools/profiled_agent.py: its main
thread, the event loop that serves requests, while the measured cases run, all of them
together: give it one case) into FILE, and prints the top functions by own and by
cumulative time (``profile`` lines) and the garbage collector's passes (``profile_gc``).
cProfile slows what it measures: use the shares, not the us/record, of a profiled run.

Run: ``.venv/bin/python bench/rest_produce.py`` (about 1 minute), e.g.
``--cases v2_binary,kafka --duration 5 --partitions 1000``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import pstats
import signal
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
import httpx  # noqa: E402
import orjson  # noqa: E402
from kafka import BUCKET, Lakelog, create_topic, produce_load  # noqa: E402
from produce import (  # noqa: E402
    CLK_TCK,
    CpuMeter,
    PeakRss,
    RawConn,
    emit,
    load_avg,
    log,
    percentile,
)

from tests.procs import fake_aws_credentials, start_moto  # noqa: E402

RECORD_BYTES = 1024
RECORDS = 100  # per request
CASES = ("kafka", "v2_binary", "v2_json", "v3_binary", "v3_json")
V2_TYPES = {
    "binary": "application/vnd.kafka.binary.v2+json",
    "json": "application/vnd.kafka.json.v2+json",
}

fake_aws_credentials()


def json_value(i: int) -> dict[str, Any]:
    """A JSON object of about 1 KiB as encoded: a few fields and a text."""
    doc: dict[str, Any] = {"id": i, "ok": True, "score": 12.5, "tags": ["a", "b", "c"]}
    text = (os.urandom(RECORD_BYTES).hex())[: RECORD_BYTES - len(orjson.dumps(doc)) - 10]
    doc["text"] = text
    return doc


def bodies(case: str, n: int) -> list[bytes]:
    """``n`` pre-encoded request bodies of ``RECORDS`` keyed records each."""
    api, fmt = case.split("_")
    binary_value = base64.b64encode(os.urandom(RECORD_BYTES)).decode()
    out = []
    for b in range(n):
        records: list[dict[str, Any]] = []
        for i in range(RECORDS):
            raw_key = os.urandom(8)
            if fmt == "binary":
                key: Any = base64.b64encode(raw_key).decode()
                value: Any = binary_value
            else:
                key, value = raw_key.hex(), json_value(b * RECORDS + i)
            if api == "v2":
                records.append({"key": key, "value": value})
            else:
                kind = fmt.upper()
                records.append(
                    {"key": {"type": kind, "data": key}, "value": {"type": kind, "data": value}}
                )
        if api == "v2":
            out.append(orjson.dumps({"records": records}))
        else:
            out.append(b"".join(orjson.dumps(r) for r in records))
    return out


def ok(api: str, status: int, body: bytes) -> bool:
    if status != 200:
        return False
    if api == "v2":
        return all(o["error_code"] is None for o in orjson.loads(body)["offsets"])
    return body.count(b'"error_code":200') == RECORDS


async def rest_load(
    base: str, path: str, case: str, duration: float, clients: int
) -> dict[str, Any]:
    api, fmt = case.split("_")
    content_type = V2_TYPES[fmt] if api == "v2" else "application/json"
    prepared = bodies(case, 16)
    host = base.removeprefix("http://")
    conns = [await RawConn.open(base) for _ in range(clients)]
    latencies: list[float] = []
    errors = 0
    first_error: list[str] = []

    async def client(conn: RawConn, i: int, deadline: float) -> None:
        nonlocal errors
        n = i
        while time.monotonic() < deadline:
            started = time.perf_counter()
            status, body = await conn.post(host, path, prepared[n % len(prepared)], content_type)
            latencies.append(time.perf_counter() - started)
            if not ok(api, status, body):
                errors += 1
                if not first_error:
                    first_error.append(f"{status} {body[:300]!r}")
            n += clients

    # One request per connection first: connections, topic lookups, imports warm.
    await asyncio.gather(
        *(c.post(host, path, prepared[0], content_type) for c in conns[: min(4, clients)])
    )
    started = time.monotonic()
    await asyncio.gather(*(client(c, i, started + duration) for i, c in enumerate(conns)))
    seconds = time.monotonic() - started
    for c in conns:
        c.close()
    if first_error:
        log(f"{case}: first error {first_error[0]}")
    return {
        "latencies": sorted(latencies),
        "records": (len(latencies) - errors) * RECORDS,
        "errors": errors,
        "seconds": seconds,
    }


def report_profile(path: Path, top: int = 30) -> None:
    """The agent's cProfile (its main thread: the event loop, where requests are served):
    top functions by own time and by cumulative time, as shares of the total."""
    stats = pstats.Stats(str(path))
    rows = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for _, _, tt, _, _ in rows.values()) or 1.0

    def name(fn: tuple[str, int, str]) -> str:
        file, line, func = fn
        return f"{func} ({Path(file).name}:{line})" if line else func

    for kind, col in (("own", 2), ("total", 3)):
        ranked = sorted(rows.items(), key=lambda kv: -kv[1][col])[:top]
        for fn, row in ranked:
            emit(
                bench="profile",
                kind=kind,
                share=round(row[col] / total, 3),
                calls=row[1],
                function=name(fn),
            )


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid`` ("tid name"), from /proc."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rpartition(")")[2].split()
        out[f"{task.name} {name}"] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def load(agent: Lakelog, topic: str, case: str, duration: float, args: Any) -> dict[str, Any]:
    """Run ``case`` for ``duration`` s: latencies, records, errors, seconds."""
    if case == "kafka":
        result = produce_load(agent.bootstrap, topic, duration, args.inflight)
        result["records"] = len(result["latencies"])
        return result
    path = (
        f"/topics/{topic}"
        if case.startswith("v2")
        else f"/v3/clusters/{agent.cluster_id}/topics/{topic}/records"
    )
    return asyncio.run(rest_load(agent.base, path, case, duration, args.clients))


def run_case(agent: Lakelog, moto_pid: int, topic: str, case: str, args: Any) -> dict[str, Any]:
    # A second of the same load first, unmeasured: the first request of a route builds
    # FastAPI's route tables and dependants (~0.3 s of CPU), imports run, buffers warm.
    load(agent, topic, case, 1.0, args)
    cpu = CpuMeter({"agent": agent.pid, "moto": moto_pid})
    if args.profile is not None:
        os.kill(agent.pid, signal.SIGUSR1)
    flushes = agent.flushes()
    threads = thread_cpu(agent.pid)
    peak = PeakRss(agent.pid)
    peak.start()
    cpu.start()
    result = load(agent, topic, case, args.duration, args)
    lat, seconds = result["latencies"], result["seconds"]
    records, errors = result["records"], result["errors"]
    cores = cpu.stop()
    flushes = agent.flushes() - flushes
    used = {t: c - threads.get(t, 0.0) for t, c in thread_cpu(agent.pid).items()}
    main = str(agent.pid)
    top = sorted(used.items(), key=lambda kv: -kv[1])[:4]
    if args.profile is not None:
        os.kill(agent.pid, signal.SIGUSR2)
    row = {
        "bench": "rest_produce",
        "case": case,
        "partitions": args.partitions,
        "records": records,
        "errors": errors,
        "seconds": round(seconds, 2),
        "records_per_s": round(records / seconds),
        "mb_per_s": round(records * RECORD_BYTES / 1e6 / seconds, 1),
        "p50_ms": percentile(lat, 0.5),
        "p99_ms": percentile(lat, 0.99),
        "agent_us_per_record": round(cores["agent"] * seconds * 1e6 / max(1, records), 1),
        "records_per_flush": round(records / max(1, flushes)),
        # Where the agent's CPU went: its main thread (the event loop: HTTP, parsing,
        # buffering) and its busiest other threads (flush encoding, PUTs, commits).
        "agent_threads_us_per_record": {
            ("main" if t.split()[0] == main else t): round(c * 1e6 / max(1, records), 1)
            for t, c in top
        },
        "cpu_cores": cores,
        "agent_peak_rss_mib": peak.stop(),
        "load_avg": load_avg(),
    }
    emit(**row)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--records", type=int, default=100, help="records per REST request")
    p.add_argument("--inflight", type=int, default=20_000)
    p.add_argument(
        "--profile",
        default=None,
        help="run the agent under cProfile, keep its stats in this file, print the top",
    )
    args = p.parse_args()
    globals()["RECORDS"] = args.records
    cases = args.cases.split(",")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        moto, endpoint = start_moto(tmp)
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
            agent = Lakelog(tmp, endpoint, "rest", args.profile)
            try:
                log(f"agent pid {agent.pid}")
                agent.cluster_id = httpx.get(f"{agent.base}/v3/clusters").json()["data"][0][
                    "cluster_id"
                ]
                topic = f"bench-{args.partitions}-{uuid.uuid4().hex[:6]}"
                create_topic(agent.bootstrap, topic, args.partitions)
                rows = {}
                for case in cases:
                    log(f"{case}: {args.partitions} partitions, {args.duration:g} s")
                    rows[case] = run_case(agent, moto.popen.pid, topic, case, args)
            finally:
                agent.stop()
        finally:
            moto.stop()
    if args.profile is not None:
        report_profile(Path(args.profile))
        gc_file = Path(args.profile + ".gc.json")
        if gc_file.exists():
            emit(bench="profile_gc", **orjson.loads(gc_file.read_bytes()))
    kafka = rows.get("kafka")
    for case, row in rows.items():
        if case == "kafka" or kafka is None:
            continue
        target = 10.0 if case.endswith("binary") else 15.0
        emit(
            bench="rest_vs_kafka",
            case=case,
            records_per_s_vs_kafka=round(row["records_per_s"] / max(1, kafka["records_per_s"]), 2),
            agent_us_per_record=row["agent_us_per_record"],
            kafka_agent_us_per_record=kafka["agent_us_per_record"],
            target_us_per_record=target,
        )


if __name__ == "__main__":
    main()
