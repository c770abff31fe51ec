"""REST v2 produce with schema formats against v2 binary, in the same run on the same agent.

Starts ``lakelog serve`` (agent + in-process SQLite coordinator, ``file://`` store, so the
figures show the format's cost rather than S3's) as a process, then for each format
(binary, avro, jsonschema, protobuf), for ``--duration`` seconds, ``--clients``
closed-loop clients post requests of 100 records to a 4-partition topic (``--linger-ms``
5 by default, so the agent rather than the linger bounds the rate):

- ``binary``: base64 values of ~200 bytes;
- ``avro`` / ``jsonschema`` / ``protobuf``: the same record (id, name, email, score,
  tags, payload) in the format's JSON form, with ``value_schema`` on every request, as
  a REST client that does not keep schema ids sends it (the agent's cache has to
  absorb the lookup).

Each line: records/s, requests/s, p50/p99 latency, the agent's CPU in cores and in
microseconds per record (the format's cost even when the load generator, which shares
the two cores, bounds the rate), and
``store_calls_first`` / ``store_calls_per_request``: calls from the agent's schema
registry to the coordinator's schema store (``lakelog_schema_store_calls_total`` in
``/metrics``) for the first request and then per request (the target is 0). A
``ratio`` line gives each schema format's records/s over binary's.

Run: ``.venv/bin/python bench/schemas.py [--duration 6 --clients 8]``; progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402

from tests.procs import Proc, free_port, lakelog_cmd, wait_http  # noqa: E402

RECORDS_PER_REQUEST = 100
PARTITIONS = 4
CLK_TCK = os.sysconf("SC_CLK_TCK")

AVRO = json.dumps(
    {
        "type": "record",
        "name": "User",
        "namespace": "bench",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": "string"},
            {"name": "email", "type": "string"},
            {"name": "score", "type": "double"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "payload", "type": "string"},
        ],
    }
)
JSON_SCHEMA = json.dumps(
    {
        "type": "object",
        "title": "User",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "email": {"type": "string"},
            "score": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "payload": {"type": "string"},
        },
        "required": ["id", "name", "email"],
    }
)
PROTO = (
    'syntax = "proto3";\npackage bench;\nmessage User { int64 id = 1; string name = 2; '
    "string email = 3; double score = 4; repeated string tags = 5; string payload = 6; }\n"
)
SCHEMAS = {"avro": AVRO, "jsonschema": JSON_SCHEMA, "protobuf": PROTO}


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def user(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "name": f"user {i}",
        "email": f"user{i}@example.com",
        "score": i / 7,
        "tags": ["a", "bb", "ccc"],
        "payload": "x" * 100,
    }


def body(fmt: str, n: int) -> bytes:
    if fmt == "binary":
        values = [base64.b64encode(orjson.dumps(user(i))).decode() for i in range(n)]
        return orjson.dumps({"records": [{"value": v} for v in values]})
    records = [user(i) for i in range(n)]
    if fmt == "protobuf":
        for r in records:
            r["id"] = str(r["id"])  # proto3 JSON: int64 as a string
    return orjson.dumps({"value_schema": SCHEMAS[fmt], "records": [{"value": r} for r in records]})


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def store_calls(base: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    found = re.findall(r"^lakelog_schema_store_calls_total\{[^}]*\} (\S+)$", text, re.M)
    return sum(float(v) for v in found)


async def run(base: str, topic: str, fmt: str, duration: float, clients: int) -> dict[str, Any]:
    payload = body(fmt, RECORDS_PER_REQUEST)
    headers = {"content-type": f"application/vnd.kafka.{fmt}.v2+json"}
    url = f"{base}/topics/{topic}"
    latencies: list[float] = []
    errors = 0

    async def client(http: httpx.AsyncClient, deadline: float) -> None:
        nonlocal errors
        while time.monotonic() < deadline:
            start = time.perf_counter()
            r = await http.post(url, content=payload, headers=headers)
            latencies.append(time.perf_counter() - start)
            if r.status_code != 200 or r.json()["offsets"][0]["error_code"] is not None:
                errors += 1

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=clients)) as h:
        # The first request registers the schema: measure its store calls on their own.
        before = store_calls(base)
        r = await h.post(url, content=payload, headers=headers)
        assert r.status_code == 200, r.text
        first = store_calls(base) - before
        steady = store_calls(base)
        started = time.monotonic()
        await asyncio.gather(*(client(h, started + duration) for _ in range(clients)))
        elapsed = time.monotonic() - started
    latencies.sort()
    requests = len(latencies)
    return {
        "records_per_s": round(requests * RECORDS_PER_REQUEST / elapsed),
        "requests_per_s": round(requests / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p99_ms": round(latencies[int(0.99 * (requests - 1))] * 1000, 1),
        "errors": errors,
        "store_calls_first": first,
        "store_calls_per_request": round((store_calls(base) - steady) / requests, 4),
        "request_bytes": len(payload),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--formats", default="binary,avro,jsonschema,protobuf")
    p.add_argument("--linger-ms", type=int, default=5)
    args = p.parse_args()
    formats = args.formats.split(",")
    with tempfile.TemporaryDirectory(prefix="lakelog-bench-schemas-") as tmp:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        agent = Proc(
            lakelog_cmd(
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--store",
                f"file://{tmp}/data",
                "--db",
                f"sqlite:///{tmp}/meta.db",
                "--linger-ms",
                str(args.linger_ms),
                "--log-level",
                "warning",
                "--coordinator-port",
                "0",
            ),
            Path(tmp) / "agent.log",
        )
        try:
            wait_http(f"{base}/health", timeout=30, proc=agent.popen)
            results: dict[str, dict[str, Any]] = {}
            for fmt in formats:
                topic = f"bench-{fmt}-{uuid.uuid4().hex[:6]}"
                r = httpx.post(
                    f"{base}/v3/clusters/{cluster_id(base)}/topics",
                    json={"topic_name": topic, "partitions_count": PARTITIONS},
                )
                assert r.status_code == 201, r.text
                log(f"{fmt}: {args.clients} clients for {args.duration}s")
                cpu0, t0 = proc_cpu(agent.popen.pid), time.monotonic()
                res = asyncio.run(run(base, topic, fmt, args.duration, args.clients))
                cpu = proc_cpu(agent.popen.pid) - cpu0
                res["agent_cores"] = round(cpu / (time.monotonic() - t0), 2)
                # Agent CPU per record: the format's cost whatever limits the rate.
                res["agent_us_per_record"] = round(
                    cpu / (res["records_per_s"] * args.duration) * 1e6, 1
                )
                results[fmt] = res
                emit(bench="schemas", format=fmt, clients=args.clients, **res)
            if "binary" in results:
                for fmt, res in results.items():
                    if fmt != "binary":
                        emit(
                            bench="schemas",
                            ratio=f"{fmt}/binary",
                            records_per_s=round(
                                res["records_per_s"] / results["binary"]["records_per_s"], 3
                            ),
                        )
        finally:
            agent.stop()


def cluster_id(base: str) -> str:
    return str(httpx.get(f"{base}/v3/clusters").json()["data"][0]["cluster_id"])


if __name__ == "__main__":
    main()
