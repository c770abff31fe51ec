"""The production topology as real processes on 127.0.0.1, and checkers for fault tests.

``start_topology`` starts what ``docker-compose.yml`` runs, with the same lakelog
commands and ``LAKELOG_*``/AWS variables (``Topology.commands()`` returns them in the
compose file's shape so a test can compare):

- S3: the run's moto server behind a fault proxy (``tests/faultproxy.py``); the
  lakelog processes talk to the proxy, checkers read moto directly.
- a metadata database (PostgreSQL in the fault tests; any ``LAKELOG_DB`` URL works);
- ``coordinator-1`` and ``coordinator-2`` (the second started once the first is
  healthy, as compose orders them, so migrations do not race);
- ``agent-1..3``, each given both coordinator URLs;
- ``lb``: a least-connections TCP load balancer (``python -m
  tests.integration.topology lb``) standing in for compose's nginx: a new
  connection goes to the agent with the fewest open connections, and to the next
  one when connecting fails (nginx's ``proxy_next_upstream error``); an
  established connection whose agent dies is reset, as nginx fails a POST that
  already reached an agent.

Security is on as in compose: HTTP Basic and ACLs on the agents (the topology's clients
act as the super user ``admin``, made as compose's ``create-admin`` makes it, with
``ADMIN``), the coordinators' shared secret (``COORDINATOR_SECRET``).

Differences from compose, all forced by sharing one machine: every process listens
on 127.0.0.1 on its own free port (``LAKELOG_HOST``/``LAKELOG_PORT`` on agents and
coordinators), the bucket is a moto bucket, the advertised URL is the LB's.

Helpers for fault tests: ``ProduceLoad`` (threads producing records whose values are
unique ids, remembering every ack) and ``check_log`` (reads every partition through
the storage API straight from moto and checks every acked id against it).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
import orjson

from tests.faultproxy import FaultProxy
from tests.procs import Proc, free_port, lakelog_cmd, start_moto, wait_http

ROOT = Path(__file__).resolve().parents[2]
#: A process's start or restart, to its health answer: a Python process importing the
#: service takes 40 s and more when chaos runs and tests share two cores.
START_TIMEOUT_S = 90.0
BINARY = "application/vnd.kafka.binary.v2+json"
V2 = "application/vnd.kafka.v2+json"

# Fake credentials for moto, set as compose sets the MinIO ones (x-s3-env).
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# Compose's x-security-env, and the super user its create-admin makes.
COORDINATOR_SECRET = "topology-coordinator-secret-0123456789abcdef"
SECURITY_ENV = {
    "LAKELOG_AUTHENTICATION": "basic",
    "LAKELOG_AUTHORIZATION": "acl",
    "LAKELOG_SUPER_USERS": "User:admin",
    "LAKELOG_COORDINATOR_SECRET": COORDINATOR_SECRET,
}
ADMIN_PASSWORD = "topology-admin-password"
ADMIN = httpx.BasicAuth("admin", ADMIN_PASSWORD)

# -- processes ----------------------------------------------------------------------


@dataclass
class Service:
    """One process of the topology, restartable with the same command and environment.

    ``command`` is what compose's ``command:`` holds (the lakelog subcommand and its
    flags); ``environment`` what its ``environment:`` holds.
    """

    name: str
    command: list[str]
    environment: dict[str, str]
    url: str
    log: Path
    argv: list[str] = field(default_factory=list)  # None of compose's business: how to run
    proc: Proc | None = None
    starts: int = 0

    def start(self) -> None:
        """Start the process; each start logs to its own file (``name.log``, ``name.2.log``)."""
        self.starts += 1
        if self.starts > 1:
            self.log = self.log.with_name(f"{self.name}.{self.starts}.log")
        argv = self.argv or lakelog_cmd(*self.command)
        env = {**self.environment, "PYTHONPATH": str(ROOT)}
        self.proc = Proc(argv, self.log, env=env, cwd=self.log.parent)

    def wait_ready(self, path: str = "/health", timeout: float = START_TIMEOUT_S) -> None:
        assert self.proc is not None
        try:
            wait_http(f"{self.url}{path}", timeout=timeout, proc=self.proc.popen)
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(f"{self.name}: {e}\n{self.output()[-4000:]}") from e

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.popen.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.popen.pid

    def kill(self) -> None:
        """SIGKILL, no goodbye: the crash the fault tests survive."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.stop()  # closes the log file

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def restart(self, path: str = "/health") -> None:
        """Kill if running, start again on the same port, wait until ready."""
        if self.alive:
            self.kill()
        self.start()
        self.wait_ready(path)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Topology:
    """A running topology; see the module docstring."""

    tmp: Path
    moto_endpoint: str  # direct: for checkers, never faulty
    proxy: FaultProxy | None  # what the lakelog processes use as S3 endpoint (None: moto)
    bucket: str
    store_url: str
    db_url: str
    coordinators: list[Service]
    agents: list[Service]
    lb: Service
    cluster_id: str = ""
    _stopped: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        """The load balancer: where clients go."""
        return self.lb.url

    @property
    def coordinator_urls(self) -> list[str]:
        return [c.url for c in self.coordinators]

    @property
    def agent_urls(self) -> list[str]:
        return [a.url for a in self.agents]

    def services(self) -> list[Service]:
        return [*self.coordinators, *self.agents, self.lb]

    def commands(self) -> dict[str, dict[str, Any]]:
        """Service name -> {"command": [...], "environment": {...}}, as in docker-compose.yml."""
        return {
            s.name: {"command": list(s.command), "environment": dict(s.environment)}
            for s in [*self.coordinators, *self.agents]
        }

    def ensure_running(self) -> None:
        """Restart whatever a previous test killed (coordinators first, then agents)."""
        for s in [*self.coordinators, *self.agents]:
            if not s.alive:
                s.restart()
        if not self.lb.alive:
            self.lb.start()
            _wait_tcp(self.lb.url, self.lb)

    def stop(self) -> None:
        """Agents first (they flush), then the LB, the coordinators, the proxy."""
        if self._stopped:
            return
        self._stopped = True
        for s in [*self.agents, self.lb, *self.coordinators]:
            s.stop()
        if self.proxy is not None:
            self.proxy.stop()

    def logs(self, tail: int = 3000) -> str:
        """Every process's last output, for assertion messages."""
        return "\n".join(f"--- {s.name}\n{s.output()[-tail:]}" for s in self.services())

    def create_topic(self, name: str, partitions: int) -> None:
        r = httpx.post(
            f"{self.url}/v3/clusters/{self.cluster_id}/topics",
            json={"topic_name": name, "partitions_count": partitions},
            timeout=30,
            auth=ADMIN,
        )
        assert r.status_code == 201, r.text


def _wait_tcp(url: str, service: Service, timeout: float = 10.0) -> None:
    import socket

    host, port = url.removeprefix("http://").split(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.proc is not None and service.proc.popen.poll() is not None:
            raise RuntimeError(f"{service.name} exited:\n{service.output()}")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{service.name} did not listen on {url}")


def start_topology(
    tmp: Path,
    moto_endpoint: str,
    db_url: str,
    *,
    agents: int = 3,
    coordinators: int = 2,
    agent_env: dict[str, str] | None = None,
    coordinator_env: dict[str, str] | None = None,
    seed: int = 1,
    faults: bool = True,
) -> Topology:
    """Start the topology over a new bucket of ``moto_endpoint`` and the database ``db_url``.

    Args:
        agent_env: extra ``LAKELOG_*`` variables for every agent (e.g. a shorter linger).
        coordinator_env: extra ``LAKELOG_*`` variables for every coordinator (e.g.
            janitor schedules).
        seed: the fault proxy's dice.
        faults: put the fault proxy in front of moto (False: lakelog talks to moto
            directly, as benchmarks want).
    """
    tmp.mkdir(parents=True, exist_ok=True)
    bucket = f"lakelog-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    store_url = f"s3://{bucket}/data"
    proxy = FaultProxy.start(tmp, moto_endpoint, seed=seed) if faults else None
    s3_endpoint = proxy.url if proxy is not None else moto_endpoint
    started: list[Service] = []

    def lakelog(command: str, i: int, environment: dict[str, str]) -> Service:
        """The ``i``-th ``lakelog <command>`` of compose, on a port of its own, with what
        every one of them is given (moto's credentials, the security settings, the
        store) and ``environment``."""
        port = free_port()
        return Service(
            name=f"{command}-{i}",
            command=[command],
            environment={
                **S3_ENV,
                **SECURITY_ENV,
                "HEALTHCHECK_URL": f"http://127.0.0.1:{port}/health",
                "LAKELOG_HOST": "127.0.0.1",
                "LAKELOG_PORT": str(port),
                "LAKELOG_STORE": store_url,
                "LAKELOG_STORE_ENDPOINT": s3_endpoint,
                **environment,
            },
            url=f"http://127.0.0.1:{port}",
            log=tmp / f"{command}-{i}.log",
        )

    try:
        coords = [
            lakelog(
                "coordinator",
                i,
                {"LAKELOG_DB": db_url, "LAKELOG_JANITORS": "all", **(coordinator_env or {})},
            )
            for i in range(1, coordinators + 1)
        ]
        lb_port = free_port()
        lb_url = f"http://127.0.0.1:{lb_port}"
        agent_list = []
        for i in range(1, agents + 1):
            kafka_port = free_port()
            agent_list.append(
                lakelog(
                    "agent",
                    i,
                    {
                        "LAKELOG_COORDINATOR": ",".join(c.url for c in coords),
                        "LAKELOG_ALLOW_PLAINTEXT_COORDINATOR": "true",
                        "LAKELOG_ADVERTISED_URL": lb_url,
                        "LAKELOG_FORWARDED_ALLOW_IPS": "127.0.0.1",  # the test's nginx
                        "LAKELOG_AUTO_CREATE_TOPICS": "false",
                        "LAKELOG_DEFAULT_PARTITIONS": "3",
                        "LAKELOG_LINGER_MS": "50",
                        "LAKELOG_COMPRESSION": "zstd",
                        "LAKELOG_AGENT_ID": f"agent-{i}",
                        "LAKELOG_KAFKA_PORT": str(kafka_port),
                        "LAKELOG_KAFKA_ADVERTISED": f"127.0.0.1:{kafka_port}",
                        **(agent_env or {}),
                    },
                )
            )
        lb = Service(
            name="lb",
            command=[],
            environment={},
            url=lb_url,
            log=tmp / "lb.log",
            argv=[
                *(sys.executable, "-m", "tests.integration.topology", "lb"),
                *("--port", str(lb_port)),
                *(arg for a in agent_list for arg in ("--backend", a.url)),
            ],
        )
        # Compose's order: coordinator-1, then coordinator-2 once it is healthy (and
        # create-admin once coordinator-1 has migrated the database), then the agents
        # together, then the LB.
        for c in coords:
            c.start()
            started.append(c)
            c.wait_ready()
            if c is coords[0]:
                create_admin(db_url)
        for a in agent_list:
            a.start()
            started.append(a)
        for a in agent_list:
            a.wait_ready()
        lb.start()
        started.append(lb)
        _wait_tcp(lb_url, lb)
        topo = Topology(
            tmp=tmp,
            moto_endpoint=moto_endpoint,
            proxy=proxy,
            bucket=bucket,
            store_url=store_url,
            db_url=db_url,
            coordinators=coords,
            agents=agent_list,
            lb=lb,
        )
        topo.cluster_id = httpx.get(f"{lb_url}/v3/clusters", timeout=10, auth=ADMIN).json()["data"][
            0
        ]["cluster_id"]
        return topo
    except BaseException:
        for s in reversed(started):
            s.stop()
        if proxy is not None:
            proxy.stop()
        raise


@contextlib.contextmanager
def moto_topology(tmp: Path, **kwargs: Any) -> Iterator[Topology]:
    """``start_topology`` (``kwargs``: its keyword arguments) on a moto server of its own
    and a SQLite database in ``tmp``; both stopped afterwards."""
    for k, v in S3_ENV.items():  # moto's fake credentials, for this process's boto3
        os.environ.setdefault(k, v)
    moto, endpoint = start_moto(tmp)
    try:
        topo = start_topology(tmp / "topo", endpoint, f"sqlite:///{tmp / 'meta.db'}", **kwargs)
        try:
            yield topo
        finally:
            topo.stop()
    finally:
        moto.stop()


#: Compose's create-admin, after its shell's pipe: the lakelog command it runs.
CREATE_ADMIN = ["users", "create", "admin", "--password-stdin", "--exist-ok", "--db"]


def create_admin(db_url: str) -> None:
    """What compose's create-admin does: the super user, left as it is if it exists."""
    import os
    import subprocess

    done = subprocess.run(
        lakelog_cmd(*CREATE_ADMIN, db_url),
        input=ADMIN_PASSWORD + "\n",
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- the load balancer ------------------------------------------------------------------


class LeastConnBalancer:
    """TCP load balancer: least connections, next backend when connecting fails."""

    def __init__(self, backends: Sequence[str]) -> None:
        self.backends = [
            (h, int(p)) for h, p in (b.removeprefix("http://").split(":") for b in backends)
        ]
        self.active = [0] * len(self.backends)
        self.down_until = [0.0] * len(self.backends)
        self._turn = 0

    def _order(self) -> list[int]:
        now = time.monotonic()
        n = len(self.backends)
        self._turn += 1
        # Least connections; ties go round-robin; backends that just refused go last.
        return sorted(
            range(n),
            key=lambda i: (self.down_until[i] > now, self.active[i], (i - self._turn) % n),
        )

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i in self._order():
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.backends[i]), 2.0
                )
            except (OSError, TimeoutError):
                self.down_until[i] = time.monotonic() + 2.0
                continue
            break
        else:
            writer.transport.abort()
            return
        self.active[i] += 1
        try:
            await _pipe_both(reader, writer, up_reader, up_writer)
        finally:
            self.active[i] -= 1


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    while data := await src.read(1 << 16):
        dst.write(data)
        await dst.drain()


async def _pipe_both(
    cr: asyncio.StreamReader,
    cw: asyncio.StreamWriter,
    ur: asyncio.StreamReader,
    uw: asyncio.StreamWriter,
) -> None:
    tasks = [asyncio.create_task(_pipe(cr, uw)), asyncio.create_task(_pipe(ur, cw))]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    failed = any(t.exception() is not None for t in done)
    for t in pending:
        t.cancel()
    for w in (cw, uw):
        if failed:
            w.transport.abort()  # a reset on one side is a reset on the other
        else:
            w.close()


async def _serve_lb(port: int, backends: list[str]) -> None:
    balancer = LeastConnBalancer(backends)
    server = await asyncio.start_server(balancer.handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.integration.topology lb --port P --backend URL ...``."""
    parser = argparse.ArgumentParser(description="The topology's load balancer.")
    parser.add_argument("role", choices=["lb"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", action="append", required=True)
    args = parser.parse_args(argv)
    try:
        import uvloop

        use_uvloop = True
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        use_uvloop = False
    with contextlib.suppress(KeyboardInterrupt):
        if use_uvloop:
            uvloop.run(_serve_lb(args.port, args.backend))
        else:
            asyncio.run(_serve_lb(args.port, args.backend))


# -- load and checkers --------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass
class ProduceLoad:
    """Threads producing batches of unique ids through ``url`` until stopped.

    Each thread holds one keep-alive connection (so the LB spreads threads over
    agents) and opens a new one after a transport error. Nothing is ever resent: an
    id whose request failed is "unacked" (it may or may not be in the log), so any
    id found twice in the log was written twice by lakelog.

    ``responses`` counts outcomes: ``acked`` requests, ``record_error:<code>`` for
    per-record errors inside a 200, ``http:<status>:<code>`` for error answers,
    ``transport:<exception>`` for failed connections; ``unclean`` lists answers that
    are none of these (an ack without offsets, a body that is not Confluent's shape).
    """

    url: str
    topic: str
    threads: int = 6
    batch: int = 20
    timeout: float = 30.0
    pause_s: float = 0.0
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    by_offset: dict[tuple[int, int], bytes] = field(default_factory=dict)
    unacked: set[bytes] = field(default_factory=set)
    responses: dict[str, int] = field(default_factory=dict)
    unclean: list[str] = field(default_factory=list)
    duplicate_offsets: list[tuple[int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> ProduceLoad:
        self._workers = [
            threading.Thread(target=self._worker, args=(w,), daemon=True)
            for w in range(self.threads)
        ]
        for t in self._workers:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(self.timeout + 10)
            assert not t.is_alive(), "a producer thread hung"

    def count(self, what: str) -> int:
        with self._lock:
            return sum(n for k, n in self.responses.items() if k.startswith(what))

    def _note(self, what: str) -> None:
        self.responses[what] = self.responses.get(what, 0) + 1

    def _client(self) -> httpx.Client:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        return httpx.Client(timeout=self.timeout, limits=limits, auth=ADMIN)

    def _worker(self, w: int) -> None:
        client = self._client()
        n = 0
        try:
            while not self._stop.is_set():
                ids = [f"{self.run}:{w}:{n}:{i}".encode() for i in range(self.batch)]
                n += 1
                body = {"records": [{"key": b64(v), "value": b64(v)} for v in ids]}
                try:
                    r = client.post(
                        f"{self.url}/topics/{self.topic}",
                        content=orjson.dumps(body),
                        headers={"Content-Type": BINARY},
                    )
                except httpx.TransportError as e:
                    with self._lock:
                        self.unacked.update(ids)
                        self._note(f"transport:{type(e).__name__}")
                    client.close()
                    client = self._client()
                    continue
                self._record(ids, r)
                if self.pause_s:
                    time.sleep(self.pause_s)
        finally:
            client.close()

    def _record(self, ids: list[bytes], r: httpx.Response) -> None:
        try:
            data = r.json()
        except ValueError:
            data = None
        with self._lock:
            if r.status_code != 200:
                self.unacked.update(ids)
                if isinstance(data, dict) and isinstance(data.get("error_code"), int):
                    self._note(f"http:{r.status_code}:{data['error_code']}")
                else:
                    self.unclean.append(f"{r.status_code} {r.text[:200]}")
                return
            offsets = data.get("offsets") if isinstance(data, dict) else None
            if not isinstance(offsets, list) or len(offsets) != len(ids):
                self.unacked.update(ids)
                self.unclean.append(f"200 {r.text[:200]}")
                return
            all_ok = True
            for value, o in zip(ids, offsets, strict=True):
                if o.get("error_code") is None and isinstance(o.get("offset"), int):
                    key = (o["partition"], o["offset"])
                    if key in self.by_offset:
                        self.duplicate_offsets.append(key)
                    self.by_offset[key] = value
                    self.acked[value] = key
                elif isinstance(o.get("error_code"), int) and o.get("offset") is None:
                    all_ok = False
                    self.unacked.add(value)
                    self._note(f"record_error:{o['error_code']}")
                else:
                    all_ok = False
                    self.unacked.add(value)
                    self.unclean.append(f"200 record {o}")
            if all_ok:
                self._note("acked")


@dataclass
class LogCheck:
    """What ``check_log`` found: records per partition, index rows, objects."""

    records: dict[int, list[tuple[int, bytes]]]
    index_rows: int
    objects: set[str]

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.records.values())


def check_log(topo: Topology, topic: str, partitions: int, load: ProduceLoad) -> LogCheck:
    """Read the whole topic through the storage API, straight from moto, and check it.

    Asserts: every committed index row's object exists in the bucket and holds the
    chunk; offsets of each partition are contiguous from 0 (no gap, no duplicate);
    every acked id is at its acked (partition, offset); no id is in the log twice;
    nothing is in the log that was not sent; no two acks share an offset.
    """
    from coordinator.http.client import http_coordinator
    from coordinator.security.wire import secret_headers
    from index.log import LogReader
    from segments.store import open_store

    assert load.duplicate_offsets == [], f"two acks for one offset: {load.duplicate_offsets[:5]}"
    coordinator = http_coordinator(
        topo.coordinator_urls, headers=secret_headers(COORDINATOR_SECRET)
    )
    store = open_store(topo.store_url, endpoint_url=topo.moto_endpoint)
    try:
        reader = LogReader(store, coordinator)
        records: dict[int, list[tuple[int, bytes]]] = {}
        objects: set[str] = set()
        rows = 0
        for p in range(partitions):
            hw = coordinator.offsets(topic, p).high_watermark
            # Every index row, walked by offset: its object must exist and be long enough.
            offset = 0
            while offset < hw:
                refs = coordinator.lookup(topic, p, offset)
                assert refs, f"no index row at {topic}/{p}@{offset} below the high watermark {hw}"
                for ref in refs:
                    assert ref.base_offset == offset, f"index gap at {topic}/{p}@{offset}: {ref}"
                    info = store.head(ref.object_key)  # ObjectNotFoundError: a lost object
                    assert ref.position + ref.length <= info.size, (ref, info)
                    objects.add(ref.object_key)
                    rows += 1
                    offset = ref.end_offset
            got: list[tuple[int, bytes]] = []
            while batch := reader.read(topic, p, len(got)):
                got.extend((r.offset, r.value or b"") for r in batch)
            assert [o for o, _ in got] == list(range(hw)), f"{topic}/{p}: offsets not contiguous"
            records[p] = got
    finally:
        coordinator.close()
        store.close()
    stored = {v: (p, o) for p, recs in records.items() for o, v in recs}
    total = sum(len(v) for v in records.values())
    assert len(stored) == total, "an id is in the log twice"
    sent = set(load.acked) | load.unacked
    assert set(stored) <= sent, f"records nobody sent: {list(set(stored) - sent)[:5]}"
    lost = {v: k for v, k in load.acked.items() if stored.get(v) != k}
    assert not lost, f"{len(lost)} acked ids not at their acked offset, e.g. {list(lost)[:5]}"
    return LogCheck(records, rows, objects)


@dataclass
class Restart:
    """A consumer restart: where each partition's first record was, what was committed."""

    first: dict[int, int]  # partition -> offset of the first record fetched after it
    confirmed: dict[int, int]  # partition -> committed offset the client saw acknowledged
    attempted: dict[int, int]  # partition -> last committed offset it sent (maybe applied)


@dataclass
class GroupReader:
    """A v2 consumer in a thread, committing explicitly after every fetch.

    Starts on ``first_url`` (a client whose keep-alive connection sits on one agent)
    and, after any failure, behaves like a restarted consumer application: a new
    instance in the same group through ``fallback_url``, assigned the same
    partitions, so it starts from the group's committed offsets. ``restarts`` records
    where each partition resumed, for the test to compare with the commits.
    """

    first_url: str
    fallback_url: str
    group: str
    topic: str
    partitions: int
    consumed: list[tuple[int, int, bytes]] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    confirmed: dict[int, int] = field(default_factory=dict)
    attempted: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    _targets: dict[int, int] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _done: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> GroupReader:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def finish(self, high_watermarks: dict[int, int], timeout: float = 30.0) -> None:
        """Read on until every partition is consumed up to ``high_watermarks``, then stop."""
        self._targets = dict(high_watermarks)
        self._done.wait(timeout)
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout)
        assert self._done.is_set(), (
            f"consumer did not catch up: at {self.positions()}, want {high_watermarks}; "
            f"failures {self.failures[-5:]}"
        )

    def positions(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for p, o, _ in self.consumed:
            out[p] = max(out.get(p, 0), o + 1)
        return out

    def _caught_up(self) -> bool:
        if self._targets is None:
            return False
        have = self.positions()
        return all(have.get(p, 0) >= hw for p, hw in self._targets.items())

    def _run(self) -> None:
        url = self.first_url
        while not self._stop.is_set():
            with httpx.Client(timeout=30, auth=ADMIN) as client:
                try:
                    self._consume(client, url)
                    return
                except (httpx.HTTPError, _ConsumerFailed) as e:
                    self.failures.append(f"{type(e).__name__}: {e}")
            url = self.fallback_url
            self.restarts.append(Restart({}, dict(self.confirmed), dict(self.attempted)))
            time.sleep(0.1)

    def _consume(self, client: httpx.Client, url: str) -> None:
        name = f"c-{uuid.uuid4().hex[:8]}"
        config = {"name": name, "auto.offset.reset": "earliest", "auto.commit.enable": "false"}
        _expect(client.post(f"{url}/consumers/{self.group}", json=config, headers=_V2H), 200)
        base = f"{url}/consumers/{self.group}/instances/{name}"
        parts = [{"topic": self.topic, "partition": p} for p in range(self.partitions)]
        _expect(client.post(f"{base}/assignments", json={"partitions": parts}, headers=_V2H), 204)
        while not self._stop.is_set():
            if self._caught_up():
                self._done.set()
                return
            r = client.get(
                f"{base}/records?timeout=300&max_bytes=20000", headers={"Accept": BINARY}
            )
            _expect(r, 200)
            last: dict[int, int] = {}
            for rec in r.json():
                p, o = rec["partition"], rec["offset"]
                if self.restarts and p not in self.restarts[-1].first:
                    self.restarts[-1].first[p] = o
                self.consumed.append((p, o, base64.b64decode(rec["value"])))
                last[p] = o
            if not last:
                continue
            offsets = [{"topic": self.topic, "partition": p, "offset": o} for p, o in last.items()]
            for p, o in last.items():
                self.attempted[p] = o + 1
            _expect(client.post(f"{base}/offsets", json={"offsets": offsets}, headers=_V2H), 200)
            for p, o in last.items():
                self.confirmed[p] = o + 1


_V2H = {"Content-Type": V2}


class _ConsumerFailed(Exception):
    """An answer a healthy consumer would not get."""


def _expect(r: httpx.Response, status: int) -> None:
    if r.status_code != status:
        raise _ConsumerFailed(f"{r.request.method} {r.request.url}: {r.status_code} {r.text}")


def current_coordinator(topo: Topology, agent: Service) -> str:
    """The coordinator URL ``agent`` uses now: the first one, unless it failed over
    (HttpCoordinator logs ``coordinator failover: now using <url>`` and stays there)."""
    url = topo.coordinator_urls[0]
    marker = "coordinator failover: now using "
    for line in agent.output().splitlines():
        if marker in line:
            url = line.split(marker, 1)[1].strip()
    return url


def metric(url: str, name: str, label: str = "") -> float:
    """Sum of a Prometheus metric's samples at ``url``/metrics (optional label filter)."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10, auth=ADMIN).text.splitlines():
        if line.startswith(name) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


if __name__ == "__main__":
    main()
