"""Real lakelog clusters for integration tests: moto S3 + a coordinator process + agents.

Every process is started the way an operator would start it, through the CLI
(``python -m service.cli coordinator|agent ...``), and is ready once its
``/health`` answers 200.

Fixtures:

- ``lakelog_cluster`` (session): ONE shared cluster of a coordinator and two
  agents over a fresh bucket on the session's moto server. Cheap to use from
  any test module; tests must use their own unique topic names (see
  ``unique_topic``) and must not stop or kill its processes.
- ``cluster_factory`` (function): ``cluster_factory(agents=2, agent_env={...},
  agent_args=[...])`` starts a private cluster, stopped after the test. Use it
  to kill agents (``cluster.agent_procs[i].kill()``) or to run agents with
  other settings (e.g. ``agent_env={"LAKELOG_LINGER_MS": "500"}``).
- ``unique_topic``: a fresh topic name per call.
- ``reader`` (module): the storage API (``LogReader``) over the shared cluster, straight
  to its coordinator and bucket (no agent involved).
- ``spark`` (session): one local SparkSession for every Spark test.

A ``Cluster`` gives ``agents`` (base URLs), ``coordinator_url``, ``store_url``,
``store_endpoint``, ``bucket``, ``cluster_id`` and the ``Proc`` handles; their
logs are in ``cluster.tmp``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
import orjson
import pytest

from coordinator.http.client import HttpCoordinator, http_coordinator
from coordinator.local import LocalCoordinator
from index.log import LogReader
from segments.store import open_store
from segments.types import ConsumedRecord
from tests.conftest import BACKENDS, new_db_url
from tests.integration.topology import BINARY, b64
from tests.procs import Proc, free_port, lakelog_cmd, start_coordinator, wait_http

#: How long a process may take to answer /health: imports and migrations take a few seconds
#: on an idle machine and several times that when both cores are busy with other modules.
START_TIMEOUT_S = 60.0


@dataclass
class Cluster:
    """A running coordinator process and its agent processes."""

    coordinator_url: str
    agents: list[str]
    store_url: str
    store_endpoint: str
    bucket: str
    cluster_id: str
    coordinator_proc: Proc
    agent_procs: list[Proc]
    tmp: Path
    #: "127.0.0.1:port" of each agent's Kafka listener (empty unless started with kafka=True).
    kafka: list[str] = field(default_factory=list)
    _stopped: bool = field(default=False, repr=False)

    def stop(self) -> None:
        """Stop the agents first (they flush), then the coordinator."""
        if self._stopped:
            return
        self._stopped = True
        for p in self.agent_procs:
            p.stop()
        self.coordinator_proc.stop()

    def logs(self) -> str:
        """Every process's output, for assertion messages."""
        procs = [self.coordinator_proc, *self.agent_procs]
        return "\n".join(f"--- {p.log.name}\n{p.output()[-4000:]}" for p in procs)


def _wait_ready(url: str, proc: Proc) -> None:
    try:
        wait_http(f"{url}/health", timeout=START_TIMEOUT_S, proc=proc.popen)
    except (RuntimeError, TimeoutError) as e:
        raise RuntimeError(f"{e}\n--- {proc.log}\n{proc.output()[-4000:]}") from e


def start_cluster(
    tmp: Path,
    moto_endpoint: str,
    *,
    agents: int = 2,
    agent_args: Sequence[str] = (),
    agent_env: dict[str, str] | None = None,
    agent_store_endpoint: str | None = None,
    agent_coordinator: Callable[[str], str] | None = None,
    kafka: bool = False,
    db_url: str | None = None,
    coordinator_args: Sequence[str] = (),
) -> Cluster:
    """Start a coordinator and ``agents`` agents over a new bucket; wait until all are healthy.

    ``agent_store_endpoint`` (e.g. a fault proxy in front of moto) is the S3 endpoint
    the agents use instead of ``moto_endpoint``; ``agent_coordinator`` maps the
    coordinator's URL to the one the agents are given (e.g. a fault proxy's); ``kafka``
    gives every agent a Kafka listener on a free port (else it has none); ``db_url``:
    the coordinator's metadata database (default: a SQLite file in ``tmp``);
    ``coordinator_args``: more flags of ``lakelog coordinator`` (``--db-shard URL``).
    """
    tmp.mkdir(parents=True, exist_ok=True)
    bucket = f"lakelog-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    store_url = f"s3://{bucket}/lakelog"

    cport = free_port()
    coordinator_url = f"http://127.0.0.1:{cport}"
    coordinator = Proc(
        lakelog_cmd(
            "coordinator",
            "--db",
            db_url or f"sqlite:///{tmp / 'meta.db'}",
            "--host",
            "127.0.0.1",
            "--port",
            str(cport),
            "--store",
            store_url,
            "--store-endpoint",
            moto_endpoint,
            "--log-level",
            "warning",
            *coordinator_args,
        ),
        tmp / f"coordinator-{cport}.log",
    )
    procs: list[Proc] = []
    try:
        agents_coordinator = agent_coordinator(coordinator_url) if agent_coordinator else None
        # Agents start alongside the coordinator: they wait for it (app.COORDINATOR_WAIT_S).
        urls = []
        kafka_addrs = []
        for _ in range(agents):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            kafka_port = free_port() if kafka else 0
            if kafka:
                kafka_addrs.append(f"127.0.0.1:{kafka_port}")
            procs.append(
                Proc(
                    lakelog_cmd(
                        "agent",
                        "--coordinator",
                        agents_coordinator or coordinator_url,
                        "--store",
                        store_url,
                        "--store-endpoint",
                        agent_store_endpoint or moto_endpoint,
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--log-level",
                        "warning",
                        "--kafka-port",
                        str(kafka_port),
                        *agent_args,
                    ),
                    tmp / f"agent-{port}.log",
                    env=agent_env,
                )
            )
        _wait_ready(coordinator_url, coordinator)
        for url, proc in zip(urls, procs, strict=True):
            _wait_ready(url, proc)
        cluster_id = httpx.get(f"{urls[0]}/v3/clusters").json()["data"][0]["cluster_id"]
    except BaseException:
        for p in procs:
            p.stop()
        coordinator.stop()
        raise
    return Cluster(
        coordinator_url=coordinator_url,
        agents=urls,
        store_url=store_url,
        store_endpoint=moto_endpoint,
        bucket=bucket,
        cluster_id=cluster_id,
        coordinator_proc=coordinator,
        agent_procs=procs,
        tmp=tmp,
        kafka=kafka_addrs,
    )


@pytest.fixture(scope="session")
def kafka_cluster(
    moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A coordinator + two agents with Kafka listeners, shared by the Kafka door's tests."""
    cluster = start_cluster(tmp_path_factory.mktemp("kafka-cluster"), moto_endpoint, kafka=True)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def lakelog_cluster(
    moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One coordinator + two agents shared by the whole run (do not stop or kill them)."""
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"), moto_endpoint)
    try:
        yield cluster
    finally:
        cluster.stop()


ClusterFactory = Callable[..., Cluster]


@pytest.fixture
def cluster_factory(moto_endpoint: str, tmp_path: Path) -> Iterator[ClusterFactory]:
    """Start private clusters (``start_cluster`` keyword arguments); all stopped afterwards."""
    started: list[Cluster] = []

    def make(**kwargs: Any) -> Cluster:
        c = start_cluster(tmp_path / f"cluster{len(started)}", moto_endpoint, **kwargs)
        started.append(c)
        return c

    try:
        yield make
    finally:
        for c in started:
            c.stop()


# -- helpers on a Cluster ---------------------------------------------------------------


def create_topic(
    cluster: Cluster, name: str, partitions: int, configs: dict[str, str] | None = None
) -> None:
    """Create a topic through the first agent's v3 API (201 expected)."""
    body: dict[str, Any] = {"topic_name": name, "partitions_count": partitions}
    if configs:
        body["configs"] = [{"name": k, "value": v} for k, v in configs.items()]
    r = httpx.post(f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics", json=body)
    assert r.status_code == 201, r.text


@contextlib.contextmanager
def storage_reader(cluster: Cluster) -> Iterator[LogReader]:
    """The storage API, straight to the coordinator and the bucket (no agent involved)."""
    coordinator = http_coordinator(cluster.coordinator_url)
    store = open_store(cluster.store_url, endpoint_url=cluster.store_endpoint)
    try:
        yield LogReader(store, coordinator)
    finally:
        coordinator.close()
        store.close()


@pytest.fixture(scope="module")
def reader(lakelog_cluster: Cluster) -> Iterator[LogReader]:
    """``storage_reader`` of the shared cluster."""
    with storage_reader(lakelog_cluster) as reader:
        yield reader


def read_partition(
    cluster: Cluster, topic: str, partition: int, max_bytes: int = 1 << 20
) -> list[ConsumedRecord]:
    """Every record of a partition, straight from the coordinator and the bucket."""
    with storage_reader(cluster) as reader:
        out: list[ConsumedRecord] = []
        while batch := reader.read(topic, partition, len(out), max_bytes=max_bytes):
            out.extend(batch)
        return out


def note_acked(
    acked: dict[tuple[int, int], bytes], values: list[bytes], offsets: list[dict[str, Any]]
) -> None:
    """Record each value at the (partition, offset) a v2 produce answer acked it at."""
    for v, o in zip(values, offsets, strict=True):
        assert o["error_code"] is None, o
        assert (o["partition"], o["offset"]) not in acked
        acked[(o["partition"], o["offset"])] = v


def assert_acked_stored(
    cluster: Cluster,
    topic: str,
    partitions: int,
    acked: dict[tuple[int, int], bytes],
    unacked: set[bytes],
) -> None:
    """Every acked record is readable at its acked offset; offsets are contiguous; the
    log holds nothing that was not sent (acked or not), and nothing twice."""
    sent = set(acked.values()) | unacked
    stored_values: list[bytes] = []
    for partition in range(partitions):
        stored = read_partition(cluster, topic, partition)
        assert [s.offset for s in stored] == list(range(len(stored)))
        for s in stored:
            assert s.value in sent
            if (partition, s.offset) in acked:
                assert acked[(partition, s.offset)] == s.value
            stored_values.append(s.value or b"")
        for (p, offset), value in acked.items():
            if p == partition:
                assert offset < len(stored) and stored[offset].value == value
    assert len(stored_values) == len(set(stored_values)), "a record was stored twice"


def delivery_reports(text: str) -> list[dict[str, Any]]:
    """A v3 produce answer's concatenated JSON delivery reports, as a list."""
    decoder, pos = json.JSONDecoder(), 0
    out: list[dict[str, Any]] = []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return out
        obj, pos = decoder.raw_decode(text, pos)
        out.append(obj)


@dataclass
class AckLog:
    """What producer threads were answered: each record acked at its (partition, offset),
    or unacked (its request failed); ``check`` holds the log to it."""

    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)
    unacked: set[bytes] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def post(
        self, client: httpx.Client, agent: str, topic: str, values: list[bytes], keyed: bool
    ) -> None:
        """Produce ``values`` as one v2 binary batch (keyed by their first 5 bytes if
        ``keyed``), a 200 expected. On ``httpx.TransportError`` they are noted unacked and
        it is raised again."""
        records = [
            {"key": b64(v[:5]), "value": b64(v)} if keyed else {"value": b64(v)} for v in values
        ]
        try:
            r = client.post(
                f"{agent}/topics/{topic}",
                content=orjson.dumps({"records": records}),
                headers={"Content-Type": BINARY},
            )
        except httpx.TransportError:
            with self.lock:
                self.unacked.update(values)
            raise
        assert r.status_code == 200, r.text
        with self.lock:
            note_acked(self.acked, values, r.json()["offsets"])

    def wait(self, at_least: int, timeout: float = 30.0) -> int:
        """How many records are acked, once ``at_least`` are or ``timeout`` has passed."""
        deadline = time.monotonic() + timeout
        while True:
            time.sleep(0.25)
            with self.lock:
                n = len(self.acked)
            if n >= at_least or time.monotonic() >= deadline:
                return n

    def check(self, cluster: Cluster, topic: str, partitions: int) -> None:
        """``assert_acked_stored`` of what was answered."""
        assert_acked_stored(cluster, topic, partitions, self.acked, self.unacked)


def _unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def unique_topic() -> Callable[[str], str]:
    """``unique_topic("orders")`` -> ``"orders-<random>"``: no clashes on a shared cluster."""
    return _unique


# -- one coordinator process per backend, for the coordinator API modules -----------------


@pytest.fixture(scope="module", params=BACKENDS)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """One coordinator process per backend (SQLite, PostgreSQL) for the module:
    (base_url, db_url)."""
    tmp = tmp_path_factory.mktemp("coord")
    db_url = new_db_url(request, request.param, tmp)
    proc, url = start_coordinator(tmp, db_url)
    yield url, db_url
    proc.stop()


@pytest.fixture
def remote(served: tuple[str, str]) -> Iterator[HttpCoordinator]:
    """An HttpCoordinator on the served process."""
    with http_coordinator(served[0]) as c:
        yield c


@pytest.fixture
def served_db(served: tuple[str, str]) -> Iterator[LocalCoordinator]:
    """A LocalCoordinator on the served process's own database: the ground truth."""
    c = LocalCoordinator(served[1])
    yield c
    c.close()


# -- one SparkSession for the run ---------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession shared by every Spark test (a session takes ~7 s to start).

    ``local[2,2]``: two cores, and a failed task is tried once more (local mode's
    default is no retry), as on a cluster; the killed-write-task test needs it. The
    source is registered by hand: this venv's editable install is not a module on
    ``sys.path`` that Spark's lookup can list (a real install is; see
    ``test_spark_stream_write.py::test_a_fresh_session_needs_no_registration``).
    Filter pushdown is on, as the README tells users to set it.
    """
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import spark as lakelog_spark

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("lakelog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    lakelog_spark.register(session)
    try:
        yield session
    finally:
        session.stop()
