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

A ``Cluster`` gives ``agents`` (base URLs), ``coordinator_url``, ``store_url``,
``store_endpoint``, ``bucket``, ``cluster_id`` and the ``Proc`` handles; their
logs are in ``cluster.tmp``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import httpx
import pytest

from coordinator.http_client import HttpCoordinator
from coordinator.local import LocalCoordinator
from tests.conftest import BACKENDS, new_db_url
from tests.procs import Proc, free_port, lakelog_cmd, start_coordinator, wait_http

START_TIMEOUT_S = 30.0


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
    db_url: str | None = None,
) -> Cluster:
    """Start a coordinator and ``agents`` agents over a new bucket; wait until all are healthy.

    ``db_url``: the coordinator's metadata database (default: a SQLite file in ``tmp``).
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
        ),
        tmp / f"coordinator-{cport}.log",
    )
    procs: list[Proc] = []
    try:
        # Agents start alongside the coordinator: they wait for it (app.COORDINATOR_WAIT_S).
        urls = []
        for _ in range(agents):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            procs.append(
                Proc(
                    lakelog_cmd(
                        "agent",
                        "--coordinator",
                        coordinator_url,
                        "--store",
                        store_url,
                        "--store-endpoint",
                        moto_endpoint,
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--log-level",
                        "warning",
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
    )


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

    def make(
        *,
        agents: int = 2,
        agent_args: Sequence[str] = (),
        agent_env: dict[str, str] | None = None,
        db_url: str | None = None,
    ) -> Cluster:
        c = start_cluster(
            tmp_path / f"cluster{len(started)}",
            moto_endpoint,
            agents=agents,
            agent_args=agent_args,
            agent_env=agent_env,
            db_url=db_url,
        )
        started.append(c)
        return c

    try:
        yield make
    finally:
        for c in started:
            c.stop()


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
    with HttpCoordinator(served[0]) as c:
        yield c


@pytest.fixture
def served_db(served: tuple[str, str]) -> Iterator[LocalCoordinator]:
    """A LocalCoordinator on the served process's own database: the ground truth."""
    c = LocalCoordinator(served[1])
    yield c
    c.close()
