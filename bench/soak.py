"""Soak: REST clients as they behave in production, against two agents, for minutes.

Starts a moto server, a coordinator process and two agent processes (as the
integration tests do), then for ``--duration`` seconds runs, all at once:

- producers: v2 batches of records with unique values, each through either agent,
  every ack remembered;
- one consumer group over an 8-partition topic, every request sent to either agent:
  ``normal`` members fetch and commit at once; ``slow`` members take longer than
  their session timeout over each batch before committing (they must keep their
  partitions: the agents heartbeat them); ``abandoning`` members hang up on some of
  their long-polls before the answer (what those would have returned must come
  again); a ``double`` member sends two fetches at once every time (one instance:
  the answers must never overlap);
- admin calls: create and delete topics, list topics, read the group's lags;
- a probe thread per agent that times ``GET /`` every 50 ms (its latency is the
  agent's event-loop lag plus a millisecond or so of HTTP);
- RSS of both agents and the coordinator, sampled every 2 s (the agents' read and
  index caches are set small, so they are full within the first minute and RSS
  should be flat over the second half).

Then the producers stop and the group drains what is left. One JSON line every
``--report-s`` seconds and a final one: records produced and delivered, skipped
(acked but never delivered: must be 0), duplicates (delivered twice: allowed by
at-least-once only around rebalances; ``below_commit`` counts redeliveries of
records the group had already committed past, which must be 0), answers that
overlapped on the ``double`` member (must be 0), probe latency p50/p99/max per
agent, RSS first/last/max and its slope over the second half per process.

Run: ``.venv/bin/python bench/soak.py [--duration 240]``; progress on stderr.
Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import random
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402

from tests.integration.conftest import Cluster, start_cluster  # noqa: E402
from tests.procs import fake_aws_credentials, start_moto  # noqa: E402

fake_aws_credentials()

V2 = "application/vnd.kafka.v2+json"
BINARY = "application/vnd.kafka.binary.v2+json"
PARTITIONS = 8
SESSION_MS = 3000
AGENT_ENV = {
    "LAKELOG_CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
    "LAKELOG_CONSUMER_FETCH_LEASE_MS": "5000",
    # Small caches, full within the first minute: RSS must be flat after that.
    "LAKELOG_READ_CACHE_TAIL_BYTES": str(4 << 20),
    "LAKELOG_READ_CACHE_HISTORY_BYTES": str(4 << 20),
    "LAKELOG_INDEX_CACHE_ENTRIES": "5000",
}


def log(msg: str) -> None:
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def rss_mb(pid: int) -> float | None:
    """Resident set size of a process from /proc (Linux), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def probe(agent: str, stop: Any, out: Any) -> None:
    """In its own process (so the load generator's GIL does not count): time ``GET /``
    every 50 ms until ``stop`` is set; put the latencies (ms) on ``out``."""
    samples: list[float] = []
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                client.get(f"{agent}/")
                samples.append((time.perf_counter() - started) * 1000)
            except httpx.HTTPError:
                samples.append(10_000.0)
            stop.wait(0.05)
    out.put(samples)


class Probes:
    """One probe process per agent."""

    def __init__(self, agents: list[str]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self.queues = [ctx.Queue() for _ in agents]
        self.procs = [
            ctx.Process(target=probe, args=(a, self.stop, q), daemon=True)
            for a, q in zip(agents, self.queues, strict=True)
        ]
        for proc in self.procs:
            proc.start()

    def finish(self) -> list[list[float]]:
        self.stop.set()
        samples = [q.get(timeout=30) for q in self.queues]
        for proc in self.procs:
            proc.join(10)
        return samples


async def first_byte(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float, *, hang_up: bool
) -> bytes:
    """The answer's first byte if it arrives within ``timeout_s``, else b"" (and, with
    ``hang_up``, the socket is shut down in the same instant it was found empty).

    In a busy loop a timer can fire in the same turn the bytes arrive, before the reader
    sees them, and asyncio closes a socket one turn after ``close()``: so the socket
    itself is peeked, and shut down at once, rather than trusting either.
    """
    try:
        return await asyncio.wait_for(reader.read(1), timeout_s)
    except TimeoutError:
        pass
    # asyncio's socket wrapper has no recv(): peek through a duplicate of its descriptor.
    fd = writer.get_extra_info("socket").fileno()
    with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            pending = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, OSError):
            pending = b""
        # StreamReader has no public "bytes buffered?" probe; its buffer is read directly.
        if pending or len(reader._buffer) > 0:
            return await reader.read(1)
        if hang_up:
            sock.shutdown(socket.SHUT_RDWR)
    return b""


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Ledger:
    """What the clients saw: acks, deliveries, commits."""

    produced: set[str] = field(default_factory=set)
    placed: dict[str, int] = field(default_factory=dict)  # value -> partition
    offsets: dict[str, int] = field(default_factory=dict)  # value -> offset
    deliveries: Counter[str] = field(default_factory=Counter)
    delivered_to: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    committed_floor: dict[int, int] = field(default_factory=dict)  # partition -> offset
    below_commit: int = 0
    overlaps: int = 0
    abandoned: int = 0
    late: int = 0
    fetches: int = 0
    commits_refused: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    admin_calls: int = 0

    def deliver(self, member: str, records: list[dict[str, Any]]) -> None:
        for r in records:
            value = base64.b64decode(r["value"]).decode()
            if r["offset"] < self.committed_floor.get(r["partition"], 0):
                self.below_commit += 1
            self.deliveries[value] += 1
            self.delivered_to[value].add(member)

    def committed(self, seen: dict[int, int]) -> None:
        for p, off in seen.items():
            self.committed_floor[p] = max(self.committed_floor.get(p, 0), off)


class Soak:
    def __init__(self, cluster: Cluster, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.args = args
        self.agents = cluster.agents
        self.topic = f"soak-{uuid.uuid4().hex[:8]}"
        self.group = f"soak-{uuid.uuid4().hex[:8]}"
        self.ledger = Ledger()
        self.stop_producing = asyncio.Event()
        self.stop_all = asyncio.Event()
        self.http = httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64))

    def agent(self) -> str:
        return random.choice(self.agents)

    async def req(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        content_type: str = V2,
        accept: str | None = None,
        timeout_s: float = 30,
    ) -> httpx.Response:
        headers = {"Content-Type": content_type}
        if accept:
            headers["Accept"] = accept
        content = None if body is None else orjson.dumps(body)
        return await self.http.request(
            method, url, content=content, headers=headers, timeout=timeout_s
        )

    # -- producers -------------------------------------------------------------------------
    async def producer(self, pid: int) -> None:
        seq = 0
        while not self.stop_producing.is_set():
            values = [f"p{pid}-{seq + i}" for i in range(20)]
            seq += 20
            # 1,000 distinct keys (as real keys repeat), unique values.
            body = {
                "records": [
                    {
                        "key": base64.b64encode(f"k{hash(v) % 1000}".encode()).decode(),
                        "value": base64.b64encode(v.encode()).decode(),
                    }
                    for v in values
                ]
            }
            try:
                r = await self.req(
                    "POST", f"{self.agent()}/topics/{self.topic}", body, content_type=BINARY
                )
                offsets = r.json().get("offsets", []) if r.status_code == 200 else []
                for v, o in zip(values, offsets, strict=False):
                    if o.get("error_code") is None:
                        self.ledger.produced.add(v)
                        self.ledger.placed[v] = o["partition"]
                        self.ledger.offsets[v] = o["offset"]
                if r.status_code != 200:
                    self.ledger.errors[f"produce {r.status_code}"] += 1
            except httpx.HTTPError as e:
                self.ledger.errors[f"produce {type(e).__name__}"] += 1
            await asyncio.sleep(self.args.produce_pause_s)

    # -- consumers -------------------------------------------------------------------------
    async def create_member(self, name: str) -> None:
        r = await self.req(
            "POST",
            f"{self.agents[0]}/consumers/{self.group}",
            {
                "name": name,
                "auto.offset.reset": "earliest",
                "auto.commit.enable": "false",
                "session.timeout.ms": SESSION_MS,
            },
        )
        assert r.status_code == 200, r.text
        r = await self.req(
            "POST",
            f"{self.agent()}/consumers/{self.group}/instances/{name}/subscription",
            {"topics": [self.topic]},
        )
        assert r.status_code == 204, r.text

    def url(self, name: str, suffix: str) -> str:
        return f"{self.agent()}/consumers/{self.group}/instances/{name}{suffix}"

    async def fetch(self, name: str, *, hang_up: bool = False) -> list[dict[str, Any]] | None:
        self.ledger.fetches += 1
        url = self.url(name, "/records?timeout=1000&max_bytes=65536")
        if hang_up:
            return await self.fetch_or_hang_up(url)
        r = await self.req("GET", url, accept=BINARY)
        if r.status_code != 200:
            self.ledger.errors[f"fetch {r.status_code}"] += 1
            return None
        records: list[dict[str, Any]] = r.json()
        return records

    async def fetch_or_hang_up(self, url: str) -> list[dict[str, Any]] | None:
        """A client that gives up on a fetch not answered within 0.2 s, lingering 50 ms
        (an answer arriving meanwhile is read: ``late``), then hangs up. On its own
        socket, so the bench knows exactly which answers it never took: an answer the
        server writes after the hang-up must come again.

        What no HTTP server can tell apart remains: an answer written in the same instant
        as the hang-up (between the client's last look and its close) is lost to the
        client, as HTTP has no acknowledgement. The client makes that instant as short as
        it can: it looks at the socket itself, then shuts it down at once.
        """
        parts = httpx.URL(url)
        reader, writer = await asyncio.open_connection(parts.host, parts.port)
        try:
            target = parts.raw_path.decode()
            writer.write(
                f"GET {target} HTTP/1.1\r\nHost: {parts.host}\r\nAccept: {BINARY}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            await writer.drain()
            first = await first_byte(reader, writer, 0.2, hang_up=False)
            if not first:
                first = await first_byte(reader, writer, 0.05, hang_up=True)
                if first:
                    self.ledger.late += 1
            if not first:
                self.ledger.abandoned += 1
                return None
            raw = first + await reader.read()
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            self.ledger.errors[f"fetch {head[9:12].decode()}"] += 1
            return None
        records: list[dict[str, Any]] = orjson.loads(body)
        return records

    async def commit(self, name: str, seen: dict[int, int]) -> None:
        r = await self.req("POST", self.url(name, "/offsets"))
        if r.status_code == 200:
            self.ledger.committed(seen)
        elif r.status_code == 409:
            self.ledger.commits_refused += 1
        else:
            self.ledger.errors[f"commit {r.status_code}"] += 1

    async def member(self, name: str, kind: str) -> None:
        await self.create_member(name)
        while not self.stop_all.is_set():
            try:
                await self.member_turn(name, kind)
            except Exception as e:  # counted, never silent: a dead member skips records
                self.ledger.errors[f"member {type(e).__name__}: {e}"[:120]] += 1
                await asyncio.sleep(0.1)

    async def member_turn(self, name: str, kind: str) -> None:
        """One fetch, then (slowly, for ``slow`` members) the commit of what it got."""
        hang_up = kind == "abandoning" and random.random() < 0.3
        if kind == "double":
            answers = await asyncio.gather(self.fetch(name), self.fetch(name))
            got = [a or [] for a in answers]
            mine = [{(r["partition"], r["offset"]) for r in a} for a in got]
            if mine[0] & mine[1]:
                self.ledger.overlaps += 1
            records = got[0] + got[1]
        else:
            records = await self.fetch(name, hang_up=hang_up) or []
        if not records:
            return
        self.ledger.deliver(name, records)
        seen: dict[int, int] = {}
        for r in records:
            seen[r["partition"]] = max(seen.get(r["partition"], 0), r["offset"] + 1)
        if kind == "slow":
            await asyncio.sleep(random.uniform(1.5, 2.5) * SESSION_MS / 1000)
        await self.commit(name, seen)

    # -- admin -----------------------------------------------------------------------------
    async def admin(self) -> None:
        cid = self.cluster.cluster_id
        while not self.stop_all.is_set():
            base = f"{self.agent()}/v3/clusters/{cid}"
            name = f"soak-admin-{uuid.uuid4().hex[:6]}"
            calls = [
                ("POST", f"{base}/topics", {"topic_name": name, "partitions_count": 3}),
                ("GET", f"{base}/topics", None),
                ("GET", f"{self.agent()}/topics", None),
                ("GET", f"{base}/consumer-groups/{self.group}/lags", None),
                ("GET", f"{base}/consumer-groups/{self.group}/lag-summary", None),
                ("DELETE", f"{base}/topics/{name}", None),
            ]
            for method, url, body in calls:
                try:
                    r = await self.req(method, url, body, content_type="application/json")
                    if r.status_code >= 500:
                        self.ledger.errors[f"admin {r.status_code}"] += 1
                except httpx.HTTPError as e:
                    self.ledger.errors[f"admin {type(e).__name__}"] += 1
                self.ledger.admin_calls += 1
            await asyncio.sleep(1.0)

    async def run(self) -> dict[str, Any]:
        cid = self.cluster.cluster_id
        r = await self.req(
            "POST",
            f"{self.agents[0]}/v3/clusters/{cid}/topics",
            {"topic_name": self.topic, "partitions_count": PARTITIONS},
            content_type="application/json",
        )
        assert r.status_code == 201, r.text
        pids = {
            "agent0": self.cluster.agent_procs[0].popen.pid,
            "agent1": self.cluster.agent_procs[1].popen.pid,
            "coordinator": self.cluster.coordinator_proc.popen.pid,
        }
        idle = Probes(self.agents)
        await asyncio.sleep(5)
        baseline = dict(zip(self.agents, idle.finish(), strict=True))
        probes = Probes(self.agents)
        kinds = ["normal"] * 2 + ["slow"] * 2 + ["abandoning"] * 2 + ["double"]
        tasks = [asyncio.create_task(self.producer(i)) for i in range(self.args.producers)]
        tasks += [asyncio.create_task(self.member(f"{k}-{i}", k)) for i, k in enumerate(kinds)]
        tasks.append(asyncio.create_task(self.admin()))
        rss: dict[str, list[tuple[float, float]]] = {n: [] for n in pids}
        started = time.monotonic()
        next_report = started + self.args.report_s
        while time.monotonic() - started < self.args.duration:
            await asyncio.sleep(2)
            now = time.monotonic()
            for n, pid in pids.items():
                value = rss_mb(pid)
                if value is not None:
                    rss[n].append((now - started, value))
            if now >= next_report:
                next_report += self.args.report_s
                emit(
                    phase="progress",
                    t_s=round(now - started),
                    produced=len(self.ledger.produced),
                    delivered=len(self.ledger.deliveries),
                    fetches=self.ledger.fetches,
                    abandoned=self.ledger.abandoned,
                    rss_mb={n: round(v[-1][1], 1) for n, v in rss.items() if v},
                    errors=dict(self.ledger.errors),
                )
        log("producers stop; draining")
        self.stop_producing.set()
        drain_deadline = time.monotonic() + self.args.drain_s
        while time.monotonic() < drain_deadline:
            if self.ledger.produced <= set(self.ledger.deliveries):
                break
            await asyncio.sleep(1)
        owners = await self.owners()
        self.stop_all.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        loaded = dict(zip(self.agents, probes.finish(), strict=True))
        await self.http.aclose()
        return self.summary(baseline, loaded, rss, owners)

    async def owners(self) -> dict[int, str]:
        """Partition -> the kind of member that owns it now (v3 assignments)."""
        base = f"{self.agents[0]}/v3/clusters/{self.cluster.cluster_id}"
        url = f"{base}/consumer-groups/{self.group}/consumers"
        out: dict[int, str] = {}
        for m in (await self.http.get(url)).json()["data"]:
            assigned = (await self.http.get(m["assignments"]["related"])).json()["data"]
            for a in assigned:
                out[a["partition_id"]] = m["consumer_id"].split("-")[0]
        return out

    def summary(
        self,
        baseline: dict[str, list[float]],
        probes: dict[str, list[float]],
        rss: dict[str, list[tuple[float, float]]],
        owners: dict[int, str],
    ) -> dict[str, Any]:
        led = self.ledger
        skipped = led.produced - set(led.deliveries)
        # Whose partitions the skipped records are in: a record "skipped" in a partition of
        # an abandoning member was written to a client that hung up as it arrived.
        skipped_by_kind = Counter(owners.get(led.placed[v], "none") for v in skipped)
        duplicates = {v: n for v, n in led.deliveries.items() if n > 1}
        same_member = sum(1 for v in duplicates if len(led.delivered_to[v]) == 1)

        def slope(points: list[tuple[float, float]]) -> float:
            half = points[len(points) // 2 :]
            if len(half) < 2:
                return 0.0
            xs, ys = [p[0] for p in half], [p[1] for p in half]
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            var = sum((x - mx) ** 2 for x in xs)
            cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
            return 0.0 if var == 0 else cov / var * 60

        return {
            "phase": "summary",
            "duration_s": self.args.duration,
            "produced": len(led.produced),
            "delivered_distinct": len(led.deliveries),
            "skipped": len(skipped),
            "skipped_by_owner_kind": dict(skipped_by_kind),
            "skipped_sample": sorted((led.placed[v], led.offsets[v]) for v in skipped)[:12],
            "duplicates": len(duplicates),
            "duplicates_same_member": same_member,
            "below_commit": led.below_commit,
            "double_fetch_overlaps": led.overlaps,
            "fetches": led.fetches,
            "abandoned_fetches": led.abandoned,
            "answers_read_while_hanging_up": led.late,
            "commits_refused_409": led.commits_refused,
            "admin_calls": led.admin_calls,
            "errors": dict(led.errors),
            "probe_ms": {
                f"agent{i}": {
                    "idle_p50": round(pct(baseline[a], 0.5), 2),
                    "p50": round(pct(probes[a], 0.5), 2),
                    "p99": round(pct(probes[a], 0.99), 2),
                    "max": round(max(probes[a], default=0.0), 1),
                    "samples": len(probes[a]),
                }
                for i, a in enumerate(self.agents)
            },
            "rss_mb": {
                n: {
                    "first": round(v[0][1], 1),
                    "last": round(v[-1][1], 1),
                    "max": round(max(p[1] for p in v), 1),
                    "slope_mb_per_min_2nd_half": round(slope(v), 2),
                }
                for n, v in rss.items()
                if v
            },
        }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=240.0, help="seconds of load")
    p.add_argument("--producers", type=int, default=3)
    p.add_argument("--produce-pause-s", type=float, default=0.05)
    p.add_argument("--drain-s", type=float, default=60.0)
    p.add_argument("--report-s", type=float, default=30.0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lakelog-soak-") as tmp:
        moto, endpoint = start_moto(Path(tmp))
        try:
            log("starting a coordinator and two agents")
            cluster = start_cluster(Path(tmp) / "cluster", endpoint, agent_env=AGENT_ENV)
            try:
                emit(**asyncio.run(Soak(cluster, args).run()))
            finally:
                cluster.stop()
        finally:
            moto.stop()


if __name__ == "__main__":
    main()
