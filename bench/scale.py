"""Scale-out: produce throughput with 1, 2 and 3 agents, and commits/s on PostgreSQL vs SQLite.

Runs the multi-process topology of ``tests/integration/topology.py`` (moto S3,
PostgreSQL, 2 coordinators, 3 agents, the LB), without the fault proxy. Sections
(``--sections``):

- ``produce``: one topic of 12 partitions; for k = 1, 2, 3, closed-loop REST v2
  clients (``bench/produce.py``'s ``RawConn`` load, 100 records x 1 KiB per request,
  ``--clients`` per agent) post straight to the first k agents for ``--duration``
  seconds (clients spreading requests; the idle agents keep running). One
  ``scale_produce`` line per k: records/s, per-agent records/s, p50/p99, the ratio
  to k x the one-agent rate (target >= 0.8), and the CPU (cores) of every process:
  each agent, each coordinator, moto, PostgreSQL (all its processes) and the load
  generator, plus their sum against the machine's cores. Then one ``scale_lb`` line:
  3 agents through the topology's TCP load balancer, with its CPU.
- ``shards`` (not run by default): chunk rows/s of ONE in-process coordinator whose
  partitions are sharded over 1, 2 and 3 databases of the machine's PostgreSQL
  (``--db-shard``; a catalog database besides), and once on one database without
  shards (``shards: 0``, the baseline), ``--shard-writers`` (8) writer threads
  committing 1,000-chunk objects over a topic of ``--shard-partitions`` (8,000) for
  ``--shard-seconds``: one ``scale_shards`` line per shard count (chunks/s, ratio to k
  times the one-shard rate, cores of PostgreSQL and of this process, the machine's busy
  cores, load average) and a ``scale_shards_summary`` line.
- ``commit``: ``bench/commit.py``'s ``bench_commits`` over HTTP against the two
  coordinator processes (writer threads alternate between them, as agents spread
  over coordinators), once with both on one SQLite file and once on PostgreSQL;
  ``scale_commit`` lines and a ``scale_commit_ratio`` line (target: PostgreSQL
  within 2x of SQLite).

A ``scale_summary`` line closes the produce section: the ratio to linear per agent
count, the cores our processes used and the machine's busy cores (other load
included), naming the first agent count at which the machine was >= 85% busy (there
scaling stops: every process, the load generator included, shares the same cores).

Run: ``.venv/bin/python bench/scale.py`` (about 1.5 minutes); progress on stderr.
Needs PostgreSQL at ``--pg-url`` (default the machine's, trust auth): a throwaway
database is created and dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psycopg  # noqa: E402

from coordinator.client import ChunkCommit, TopicInfo  # noqa: E402
from coordinator.http.client import HttpCoordinator, http_coordinator  # noqa: E402
from tests.integration.topology import Topology, start_topology  # noqa: E402
from tests.procs import Proc, fake_aws_credentials, start_coordinator, start_moto  # noqa: E402

fake_aws_credentials()

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PARTITIONS = 12


def _load(name: str) -> ModuleType:
    """A sibling benchmark as a module (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


produce = _load("produce")  # RawConn load generator, CPU accounting, percentiles
commit = _load("commit")  # bench_commits


def log(msg: str) -> None:
    print(f"[scale] {msg}", file=sys.stderr, flush=True)


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


# -- CPU of every process ------------------------------------------------------------


def postgres_pids() -> list[int]:
    """Every process of the PostgreSQL server (postmaster, backends, WAL writer, ...)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "postgres":
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (all processes, ours or not)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return float((sum(fields[:8]) - idle) / produce.CLK_TCK)


class Cpu:
    """Cores used per named process group between start() and stop()."""

    def __init__(self, groups: Mapping[str, Sequence[int]]) -> None:
        self.groups: dict[str, Sequence[int]] = dict(groups)
        self._t0 = 0.0
        self._c0: dict[int, float] = {}
        self._client0 = 0.0

    def _sample(self) -> dict[int, float]:
        return {p: produce.proc_cpu(p) for pids in self.groups.values() for p in pids}

    def start(self) -> None:
        self.groups["postgres"] = postgres_pids()
        self._t0, self._c0 = time.monotonic(), self._sample()
        self._client0 = time.process_time()
        self._busy0 = machine_busy_s()

    def stop(self) -> dict[str, float]:
        """Cores per group; a process that exits meanwhile (a PostgreSQL backend) drops out."""
        wall = time.monotonic() - self._t0
        now = self._sample()
        cores = {
            name: round(
                sum(now[p] - self._c0[p] for p in pids if now[p] >= self._c0[p] > 0) / wall, 2
            )
            for name, pids in self.groups.items()
        }
        cores["bench_client"] = round((time.process_time() - self._client0) / wall, 2)
        cores["total"] = round(sum(cores.values()), 2)
        # Everything else running on the machine shares the same cores.
        cores["machine_busy"] = round((machine_busy_s() - self._busy0) / wall, 2)
        return cores


def process_groups(topo: Topology, moto_pid: int, *, lb: bool = False) -> dict[str, list[int]]:
    groups = {s.name: [s.pid] for s in [*topo.agents, *topo.coordinators]}
    groups["moto"] = [moto_pid]
    if lb:
        groups["lb"] = [topo.lb.pid]
    return groups


# -- produce ---------------------------------------------------------------------------


async def _spread(bases: list[str], topic: str, duration: float, clients: int) -> dict[str, Any]:
    """``clients`` RawConn clients per base URL, all at once; per-base results."""
    results = await asyncio.gather(
        *(produce.run_v2_raw(b, topic, duration, clients) for b in bases)
    )
    return dict(zip(bases, results, strict=True))


def _row(results: dict[str, Any], cores: dict[str, float]) -> dict[str, Any]:
    latencies = sorted(x for r in results.values() for x in r["latencies"])
    seconds = max(r["seconds"] for r in results.values())
    per_request = produce.RECORDS_PER_REQUEST
    records = len(latencies) * per_request
    return {
        "records_per_s": round(records / seconds),
        "per_agent_records_per_s": [
            round(len(r["latencies"]) * per_request / r["seconds"]) for r in results.values()
        ],
        "mb_per_s": round(records * produce.RECORD_BYTES / seconds / 1e6, 1),
        "errors": sum(r["errors"] for r in results.values()),
        "p50_ms": produce.percentile(latencies, 0.5),
        "p99_ms": produce.percentile(latencies, 0.99),
        "seconds": round(seconds, 2),
        "cpu_cores": cores,
        "machine_cores": os.cpu_count(),
        "load_avg": produce.load_avg(),
    }


def section_produce(topo: Topology, moto_pid: int, args: argparse.Namespace) -> None:
    topic = f"scale-{uuid.uuid4().hex[:6]}"
    topo.create_topic(topic, PARTITIONS)
    # Warm-up: connections, topic caches, the first flushes of every agent.
    asyncio.run(_spread(topo.agent_urls, topic, 1.0, 2))
    base_rate = 0
    summary: dict[int, dict[str, Any]] = {}
    for k in (1, 2, 3):
        bases = topo.agent_urls[:k]
        log(f"produce: {k} agent(s), {args.clients} clients each, {args.duration:g} s")
        cpu = Cpu(process_groups(topo, moto_pid))
        cpu.start()
        results = asyncio.run(_spread(bases, topic, args.duration, args.clients))
        row = _row(results, cpu.stop())
        if k == 1:
            base_rate = row["records_per_s"]
        vs_linear = round(row["records_per_s"] / (k * base_rate), 2) if base_rate else None
        emit(
            bench="scale_produce",
            agents=k,
            clients=k * args.clients,
            partitions=PARTITIONS,
            linger_ms=50,
            **row,
            vs_linear=vs_linear,
        )
        summary[k] = {
            "vs_linear": vs_linear,
            "cores_used": row["cpu_cores"]["total"],
            "machine_busy": row["cpu_cores"]["machine_busy"],
            "agent_cores": sum(v for n, v in row["cpu_cores"].items() if n.startswith("agent")),
        }
    cores = os.cpu_count() or 1
    # Where scaling stops: the first k whose processes used (nearly) every core.
    saturated = [k for k, v in summary.items() if v["machine_busy"] >= 0.85 * cores]
    emit(
        bench="scale_summary",
        machine_cores=cores,
        target_vs_linear=0.8,
        per_agents=summary,
        cores_saturated_from_agents=saturated[0] if saturated else None,
        load_avg=produce.load_avg(),
    )
    log(f"produce: 3 agents through the LB, {3 * args.clients} clients")
    cpu = Cpu(process_groups(topo, moto_pid, lb=True))
    cpu.start()
    results = asyncio.run(_spread([topo.url], topic, args.duration, 3 * args.clients))
    emit(bench="scale_lb", agents=3, clients=3 * args.clients, **_row(results, cpu.stop()))


# -- commits -----------------------------------------------------------------------------


class Spread:
    """A Coordinator that sends each writer thread's commits to one of several clients."""

    def __init__(self, clients: list[HttpCoordinator]) -> None:
        self.clients = clients
        self._slots: dict[int, int] = {}
        self._lock = threading.Lock()

    def _mine(self) -> HttpCoordinator:
        ident = threading.get_ident()
        with self._lock:
            slot = self._slots.setdefault(ident, len(self._slots))
        return self.clients[slot % len(self.clients)]

    def create_topic(self, name: str, partitions: int) -> TopicInfo:
        return self.clients[0].create_topic(name, partitions)

    def delete_topic(self, name: str) -> None:
        self.clients[0].delete_topic(name)

    def commit(self, object_key: str, chunks: Sequence[ChunkCommit]) -> list[int]:
        return self._mine().commit(object_key, chunks)


def section_commit(tmp: Path, pg_url: str, args: argparse.Namespace) -> None:
    rates: dict[tuple[str, int], float] = {}
    for backend, db_url in (("sqlite", f"sqlite:///{tmp / 'commit.db'}"), ("postgresql", pg_url)):
        procs: list[Proc] = []
        try:
            urls = []
            for _ in range(2):  # one after the other: the first one migrates
                proc, url = start_coordinator(tmp, db_url)
                procs.append(proc)
                urls.append(url)
            # Each client prefers a different coordinator (and fails over to the other).
            clients = [http_coordinator([urls[i], urls[1 - i]], timeout=30) for i in range(2)]
            spread = Spread(clients)
            for writers in (1, 8):
                log(f"commit: {backend}, 2 coordinators, {writers} writers, {args.commits}")
                commit.bench_commits(spread, 10, max(args.commits // 20, writers), writers)
                result = commit.bench_commits(spread, 10, args.commits, writers)
                rates[(backend, writers)] = result["commits_per_s"]
                emit(bench="scale_commit", backend=backend, coordinators=2, **result)
            for c in clients:
                c.close()
        finally:
            for p in procs:
                p.stop()
    for writers in (1, 8):
        sqlite, pg = rates[("sqlite", writers)], rates[("postgresql", writers)]
        emit(
            bench="scale_commit_ratio",
            writers=writers,
            chunks_per_commit=10,
            sqlite_commits_per_s=sqlite,
            postgresql_commits_per_s=pg,
            sqlite_over_postgresql=round(sqlite / pg, 2),
            target_met=sqlite / pg <= 2.0,
        )


# -- shards ------------------------------------------------------------------------------


def section_shards(args: argparse.Namespace) -> None:
    """Chunk rows/s of one in-process coordinator over 1, 2, 3 shard databases."""
    from coordinator.local import LocalCoordinator

    rates: dict[int, float] = {}
    for k in (0, 1, 2, 3):  # 0: one database, not sharded (the baseline)
        made = [new_pg_database(args.pg_url) for _ in range(k + 1)]
        try:
            catalog, shards = made[0][1], [url for _, url in made[1:]]
            with LocalCoordinator(catalog, shards=shards) as coord:
                log(f"shards: {k}, {args.shard_writers} writers, 1,000-chunk commits")
                partitions = args.shard_partitions
                commit.bench_commits(
                    coord, 1000, 2 * args.shard_writers, args.shard_writers, partitions=partitions
                )  # warm-up
                cpu = Cpu({})
                cpu.start()
                result = commit.bench_commits(
                    coord,
                    1000,
                    100_000,
                    args.shard_writers,
                    partitions=partitions,
                    max_seconds=args.shard_seconds,
                )
                cores = cpu.stop()
            rates[k] = result["chunks_per_s"]
            emit(
                bench="scale_shards",
                shards=k,
                partitions=partitions,
                per_shard_chunks_per_s=round(result["chunks_per_s"] / max(k, 1)),
                ratio_to_linear=round(result["chunks_per_s"] / (max(k, 1) * rates[min(k, 1)]), 2),
                cores=cores,
                loadavg=[round(x, 2) for x in os.getloadavg()],
                **result,
            )
        finally:
            for name, _ in made:
                drop_database(args.pg_url, name)
    emit(
        bench="scale_shards_summary",
        chunks_per_s={str(k): v for k, v in rates.items()},
        one_shard_vs_unsharded=round(rates[1] / rates[0], 2),
        added_shard_gain=[round(rates[k + 1] / rates[k], 2) for k in (1, 2)],
        per_added_database_vs_linear=[round(rates[k] / (k * rates[1]), 2) for k in (2, 3)],
        cores=os.cpu_count(),
        loadavg=[round(x, 2) for x in os.getloadavg()],
    )


# -- main --------------------------------------------------------------------------------


def new_pg_database(admin_url: str) -> tuple[str, str]:
    """Create a throwaway database; returns (name, URL)."""
    name = f"lakelog_scale_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    info = psycopg.conninfo.conninfo_to_dict(admin_url)
    host, port = info.get("host", "127.0.0.1"), info.get("port", "5432")
    return name, f"postgresql://{info.get('user', 'postgres')}@{host}:{port}/{name}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sections", default="produce,commit")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per produce case")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients per agent")
    parser.add_argument("--commits", type=int, default=1500, help="commits per commit case")
    parser.add_argument("--pg-url", default=PG_ADMIN_URL, help="maintenance database URL")
    parser.add_argument("--shard-writers", type=int, default=8, help="writers per shard case")
    parser.add_argument("--shard-seconds", type=float, default=10.0, help="seconds per case")
    parser.add_argument(
        "--shard-partitions", type=int, default=8000, help="partitions of the shard cases' topic"
    )
    args = parser.parse_args(argv)
    sections = set(args.sections.split(","))
    if "shards" in sections:
        section_shards(args)
        if not sections & {"produce", "commit"}:
            return
    dbname, pg_url = new_pg_database(args.pg_url)
    try:
        with tempfile.TemporaryDirectory(prefix="lakelog-scale-") as d:
            tmp = Path(d)
            moto, endpoint = start_moto(tmp)
            try:
                if "produce" in sections:
                    log("starting the topology (2 coordinators on PostgreSQL, 3 agents, LB)")
                    topo = start_topology(tmp / "topology", endpoint, pg_url, faults=False)
                    try:
                        httpx.get(f"{topo.url}/health", timeout=10).raise_for_status()
                        section_produce(topo, moto.popen.pid, args)
                    finally:
                        topo.stop()
                if "commit" in sections:
                    _, commit_url = new_pg_database(args.pg_url)
                    try:
                        section_commit(tmp, commit_url, args)
                    finally:
                        drop_database(args.pg_url, commit_url.rsplit("/", 1)[1])
            finally:
                moto.stop()
    finally:
        drop_database(args.pg_url, dbname)


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
