"""The chaos nemesis's faults beyond S3 and signals happen as they say
(``tests/chaos/faults.py``): a coordinator started with ``LAKELOG_CLOCK_SKEW_MS``
stamps its skewed time, a refused database refuses (and its connections die), and the
nemesis's faults touch none but the run's databases."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.chaos.faults import PgFaults, run_janitor
from tests.conftest import PG_ADMIN_URL
from tests.procs import Proc, free_port, lakelog_cmd, wait_http

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HOUR_MS = 3_600_000


def _coordinator(tmp: Path, skew_ms: int | None) -> tuple[Proc, str, Path]:
    port = free_port()
    db = tmp / f"meta-{port}.db"
    env = {"PYTHONPATH": str(ROOT), "LAKELOG_JANITORS": "none"}
    if skew_ms is not None:
        env["LAKELOG_CLOCK_SKEW_MS"] = str(skew_ms)
    proc = Proc(
        lakelog_cmd(
            "coordinator",
            *("--db", f"sqlite:///{db}", "--port", str(port)),
            *("--store", f"file://{tmp / 'store'}"),
        ),
        tmp / f"coordinator-{port}.log",
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", timeout=60, proc=proc.popen)
    except Exception:
        proc.stop()
        raise RuntimeError(f"coordinator did not start:\n{proc.output()}") from None
    return proc, url, db


def _gc_run_started(tmp: Path, skew_ms: int | None) -> float:
    """When a GC run on a coordinator started with ``skew_ms`` began, by its clock."""
    proc, url, db = _coordinator(tmp, skew_ms)
    try:
        assert run_janitor(url, "gc", {}, threading.Event()) == "ok", proc.output()[-3000:]
    finally:
        proc.stop()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT started_at, outcome FROM janitor_runs").fetchall()
    assert [o for _, o in rows] == ["ok"], rows
    return float(rows[0][0])


@pytest.mark.parametrize("skew_ms", [-HOUR_MS, HOUR_MS])
def test_a_coordinator_with_a_skewed_clock_stamps_its_skewed_time(
    tmp_path: Path, skew_ms: int
) -> None:
    """A coordinator started with ``LAKELOG_CLOCK_SKEW_MS`` (an hour, either way: no
    doubt about which side of the host clock a stamp falls) records its janitor runs at
    the host's time plus the skew; one started without it, at the host's time."""
    before = time.time()
    started = _gc_run_started(tmp_path, skew_ms)
    after = time.time()
    assert before + skew_ms / 1000 <= started <= after + skew_ms / 1000
    plain = _gc_run_started(tmp_path, None)
    assert time.time() - HOUR_MS / 2000 < plain <= time.time()


@pytest.fixture()
def database() -> Iterator[str]:
    """A throwaway database of the test's own (dropped whatever state it is left in)."""
    name = f"lakelog_chaosfault_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        pytest.fail(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {e}")
    with admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _url(name: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


def test_a_refused_database_refuses_new_connections_and_drops_its_own(database: str) -> None:
    """``pg_refuse`` / ``shard_down``: while refused, the database's open connection is
    terminated and a new one is refused by the server; once allowed, connecting works."""
    faults = PgFaults(PG_ADMIN_URL, database, [])
    with psycopg.connect(_url(database), autocommit=True) as held:
        assert faults.refuse(database) == 1
        with pytest.raises(psycopg.OperationalError):
            held.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError, match="not currently accepting connections"):
        psycopg.connect(_url(database), connect_timeout=5)
    assert faults.refused == {database}
    faults.allow_all()
    assert faults.refused == set()
    with psycopg.connect(_url(database), connect_timeout=5) as again:
        assert again.execute("SELECT 1").fetchone() == (1,)


def test_pg_kill_terminates_the_runs_backends_only(database: str) -> None:
    """``pg_kill``: every connection to the run's databases dies; the admin connection
    and other databases' are left alone, and a name not of the run is refused."""
    faults = PgFaults(PG_ADMIN_URL, database, [])
    with (
        psycopg.connect(_url(database), autocommit=True) as ours,
        psycopg.connect(PG_ADMIN_URL, autocommit=True) as other,
    ):
        assert faults.kill([database]) == 1
        with pytest.raises(psycopg.OperationalError):
            ours.execute("SELECT 1")
        assert other.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(AssertionError):
        faults.kill(["postgres"])
    with psycopg.connect(_url(database), connect_timeout=5) as again:
        assert again.execute("SELECT 1").fetchone() == (1,)
