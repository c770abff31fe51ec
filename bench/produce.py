"""Produce throughput and latency of one agent against a moto S3 server.

Starts a moto server and ``lakelog serve --store s3://... --store-endpoint ...``
(agent + in-process SQLite coordinator) as processes, then for 1, 100 and 1,000
partitions runs, each for ``--duration`` seconds:

- ``produce_v2``: REST v2 binary, 100 keyed records x 1 KiB per request, 16
  concurrent clients;
- ``produce_v3``: REST v3 streamed, 16 concurrent clients each posting chunked
  bodies of 100 concatenated records (10 per chunk) and reading the delivery reports;

and prints one JSON line each: records/s, MB/s (record values), p50/p99 ack latency
(request sent -> response complete), S3 PUTs (= flushes, read from the agent's
``/metrics``) per second and per MB, mean object size. Then ``raw_put``: boto3 PUT
bandwidth of objects of the mean flush size to the same moto server (4 threads),
and ``ratio`` lines: produce MB/s / raw PUT MB/s, PUTs for 1,000 partitions / PUTs
for 1 partition (per MB).

Run: ``.venv/bin/python bench/produce.py [--duration 6] [--partitions 1,100,1000]``
(about 2 minutes with the defaults); progress on stderr. The Tansu peer is not run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
import httpx  # noqa: E402
import orjson  # noqa: E402

from tests.procs import Proc, free_port, start_moto, wait_http  # noqa: E402

RECORD_BYTES = 1024
RECORDS_PER_REQUEST = 100
CLIENTS = 16

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def metric_sum(base: str, name: str, label: str = "") -> float:
    """Sum of a metric's samples on the agent's /metrics (with an optional label filter)."""
    total = 0.0
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(name) and label in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def v2_bodies(n: int) -> list[bytes]:
    """Pre-encoded v2 binary bodies (encoding is the client's cost, not the agent's)."""
    value = base64.b64encode(os.urandom(RECORD_BYTES)).decode()
    out = []
    for _ in range(n):
        records = [
            {"key": base64.b64encode(os.urandom(8)).decode(), "value": value}
            for _ in range(RECORDS_PER_REQUEST)
        ]
        out.append(orjson.dumps({"records": records}))
    return out


def v3_chunks(n: int) -> list[list[bytes]]:
    """Pre-encoded v3 bodies: 100 concatenated records in chunks of 10."""
    value = base64.b64encode(os.urandom(RECORD_BYTES)).decode()
    out = []
    for _ in range(n):
        records = [
            orjson.dumps(
                {
                    "key": {"type": "BINARY", "data": base64.b64encode(os.urandom(8)).decode()},
                    "value": {"type": "BINARY", "data": value},
                }
            )
            for _ in range(RECORDS_PER_REQUEST)
        ]
        chunks = [b"".join(records[i : i + 10]) for i in range(0, len(records), 10)]
        out.append(chunks)
    return out


async def run_load(
    base: str, topic: str, api: str, cluster_id: str, duration: float
) -> dict[str, Any]:
    """CLIENTS concurrent clients for ``duration`` seconds; returns latencies and counts."""
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + duration
    bodies2 = v2_bodies(8) if api == "v2" else []
    bodies3 = v3_chunks(8) if api == "v3" else []

    async def client(i: int) -> None:
        nonlocal errors
        async with httpx.AsyncClient(timeout=60) as c:
            n = i
            while time.monotonic() < deadline:
                started = time.perf_counter()
                if api == "v2":
                    r = await c.post(
                        f"{base}/topics/{topic}",
                        content=bodies2[n % len(bodies2)],
                        headers={"Content-Type": "application/vnd.kafka.binary.v2+json"},
                    )
                    ok = r.status_code == 200 and all(
                        o["error_code"] is None for o in r.json()["offsets"]
                    )
                else:
                    parts = bodies3[n % len(bodies3)]

                    async def gen(parts: list[bytes] = parts) -> AsyncIterator[bytes]:
                        for part in parts:
                            yield part

                    r = await c.post(
                        f"{base}/v3/clusters/{cluster_id}/topics/{topic}/records",
                        content=gen(),
                        headers={"Content-Type": "application/json"},
                    )
                    ok = r.status_code == 200 and r.text.count('"error_code":200') == (
                        RECORDS_PER_REQUEST
                    )
                latencies.append(time.perf_counter() - started)
                if not ok:
                    errors += 1
                n += CLIENTS

    started = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    return {"latencies": latencies, "errors": errors, "seconds": time.monotonic() - started}


def raw_put(
    endpoint: str, bucket: str, size: int, duration: float, threads: int = 4
) -> dict[str, Any]:
    s3 = boto3.client("s3", endpoint_url=endpoint)
    data = os.urandom(max(size, 1))
    count = 0
    lock = threading.Lock()
    deadline = time.monotonic() + duration

    def worker() -> None:
        nonlocal count
        while time.monotonic() < deadline:
            s3.put_object(Bucket=bucket, Key=f"raw/{uuid.uuid4().hex}", Body=data)
            with lock:
                count += 1

    started = time.monotonic()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    seconds = time.monotonic() - started
    return {
        "object_bytes": len(data),
        "threads": threads,
        "puts": count,
        "puts_per_s": round(count / seconds, 1),
        "mb_per_s": round(count * len(data) / seconds / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per case")
    parser.add_argument("--partitions", default="1,100,1000")
    parser.add_argument("--apis", default="v2,v3")
    parser.add_argument("--linger-ms", type=int, default=50)
    args = parser.parse_args()
    partition_counts = [int(p) for p in args.partitions.split(",")]
    apis = args.apis.split(",")

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        log("starting moto")
        moto, endpoint = start_moto(tmp)
        bucket = "bench-produce"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        (tmp / "agent").mkdir()
        log(f"starting lakelog serve on {base}")
        command = [
            *(sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1"),
            *("--port", str(port), "--db", f"sqlite:///{tmp / 'agent' / 'meta.db'}"),
            *("--store", f"s3://{bucket}/lakelog", "--store-endpoint", endpoint),
            *("--linger-ms", str(args.linger_ms), "--log-level", "warning"),
        ]
        agent = Proc(
            command,
            tmp / "agent.log",
            env={"PYTHONPATH": str(ROOT)},
            cwd=tmp / "agent",
        )
        try:
            wait_http(f"{base}/health", proc=agent.popen)
            cluster_id = httpx.get(f"{base}/v3/clusters").json()["data"][0]["cluster_id"]
            results: dict[tuple[str, int], dict[str, Any]] = {}
            object_sizes: list[float] = []
            for partitions in partition_counts:
                for api in apis:
                    topic = f"bench-{api}-{partitions}-{uuid.uuid4().hex[:6]}"
                    r = httpx.post(
                        f"{base}/v3/clusters/{cluster_id}/topics",
                        json={"topic_name": topic, "partitions_count": partitions},
                        timeout=60,
                    )
                    r.raise_for_status()
                    log(f"{api}, {partitions} partitions, {args.duration:g} s")
                    flushes0 = metric_sum(base, "lakelog_flushes_total", 'result="ok"')
                    bytes0 = metric_sum(base, "lakelog_flush_bytes_sum")
                    put0 = metric_sum(base, "lakelog_put_seconds_sum")
                    commit0 = metric_sum(base, "lakelog_commit_seconds_sum")
                    load = asyncio.run(run_load(base, topic, api, cluster_id, args.duration))
                    flushes = metric_sum(base, "lakelog_flushes_total", 'result="ok"') - flushes0
                    flushed = metric_sum(base, "lakelog_flush_bytes_sum") - bytes0
                    put_s = metric_sum(base, "lakelog_put_seconds_sum") - put0
                    commit_s = metric_sum(base, "lakelog_commit_seconds_sum") - commit0
                    lat = sorted(load["latencies"])
                    records = len(lat) * RECORDS_PER_REQUEST
                    seconds = load["seconds"]
                    mb = records * RECORD_BYTES / 1e6
                    row = {
                        "bench": f"produce_{api}",
                        "partitions": partitions,
                        "clients": CLIENTS,
                        "records_per_request": RECORDS_PER_REQUEST,
                        "record_bytes": RECORD_BYTES,
                        "linger_ms": args.linger_ms,
                        "seconds": round(seconds, 2),
                        "requests": len(lat),
                        "errors": load["errors"],
                        "records_per_s": round(records / seconds),
                        "mb_per_s": round(mb / seconds, 2),
                        "p50_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
                        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 1) if lat else None,
                        "puts": int(flushes),
                        "puts_per_s": round(flushes / seconds, 1),
                        "puts_per_mb": round(flushes / mb, 3) if mb else None,
                        "mean_object_bytes": round(flushed / flushes) if flushes else None,
                        "mean_put_ms": round(put_s / flushes * 1000, 1) if flushes else None,
                        "mean_commit_ms": round(commit_s / flushes * 1000, 1) if flushes else None,
                    }
                    results[(api, partitions)] = row
                    if flushes:
                        object_sizes.append(flushed / flushes)
                    emit(**row)
            size = int(statistics.mean(object_sizes)) if object_sizes else 1 << 20
            log(f"raw boto3 PUTs of {size} bytes")
            raw = raw_put(endpoint, bucket, size, min(args.duration, 5.0))
            emit(bench="raw_put", **raw)
            for (api, partitions), row in results.items():
                emit(
                    bench="ratio",
                    api=api,
                    partitions=partitions,
                    produce_over_raw_put_mb=round(row["mb_per_s"] / raw["mb_per_s"], 2),
                    puts_per_mb_over_1_partition=(
                        round(row["puts_per_mb"] / results[(api, 1)]["puts_per_mb"], 2)
                        if (api, 1) in results and results[(api, 1)]["puts_per_mb"]
                        else None
                    ),
                )
        finally:
            agent.stop()
            moto.stop()
            log("done")


if __name__ == "__main__":
    main()
