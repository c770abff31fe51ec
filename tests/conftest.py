"""Fixtures shared by the whole suite: real processes live in ``tests/procs.py``."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest

from coordinator.db import POSTGRESQL
from tests.procs import fake_aws_credentials, start_moto

# boto3 inside tests and in child processes: fake credentials, never a real account.
fake_aws_credentials()
# Agents started by tests (and their children) keep off the shared machine's ports 9092
# and 8083 (lakelog serve's coordinator API); tests of those pass --kafka-port or
# --coordinator-port explicitly.
os.environ.setdefault("LAKELOG_KAFKA_PORT", "0")
os.environ.setdefault("LAKELOG_COORDINATOR_PORT", "0")


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Endpoint URL of one moto S3 server process shared by the run."""
    proc, endpoint = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        yield endpoint
    finally:
        proc.stop()


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> str:
    """A fresh bucket on the moto server; returns its name."""
    name = f"lakelog-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_url(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/lakelog"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


# -- metadata databases: every coordinator test runs on SQLite and on PostgreSQL ---------

#: The metadata backends the coordinator suite runs on (``db_url`` is parametrized on them).
BACKENDS = ("sqlite", "postgresql")

#: A maintenance connection to the PostgreSQL server (the machine's, trust auth).
PG_ADMIN_URL = os.environ.get(
    "LAKELOG_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


class PgTestServer:
    """One throwaway database for the test run; each test takes a fresh schema in it."""

    def __init__(self, admin_url: str, dbname: str) -> None:
        self.admin_url = admin_url
        self.dbname = dbname
        info = psycopg.conninfo.conninfo_to_dict(admin_url)
        info["dbname"] = dbname
        self.base_url = psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]
        host, port = info.get("host", "127.0.0.1"), info.get("port", "5432")
        self._url_prefix = f"postgresql://{info.get('user', 'postgres')}@{host}:{port}/{dbname}"

    def new_schema_url(self) -> str:
        """A ``postgresql://`` URL whose connections work in a new, empty schema."""
        schema = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.base_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        # libpq passes ``options`` to the server: every connection's search_path is the schema.
        return f"{self._url_prefix}?options=-csearch_path%3D{schema}"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgTestServer]:
    """A database ``lakelog_test_<random>`` for this run, dropped at the end.

    PostgreSQL unreachable: fails the run under CI (``CI=true``), else skips the
    PostgreSQL cases with the reason (shown by ``-ra``).
    """
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        reason = f"PostgreSQL not reachable at {PG_ADMIN_URL}: {e}".strip()
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs PostgreSQL: {reason}")
        pytest.skip(reason)
    dbname = f"lakelog_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f"CREATE DATABASE {dbname}")
    try:
        yield PgTestServer(PG_ADMIN_URL, dbname)
    finally:
        # A new connection: a test may have restarted the server. FORCE: a coordinator
        # process a failed test left behind must not keep the database alive.
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")


def new_db_url(request: pytest.FixtureRequest, backend: str, directory: Path) -> str:
    """A URL of an empty metadata database on ``backend`` (a file under ``directory``)."""
    if backend == "sqlite":
        return f"sqlite:///{directory / 'meta.db'}"
    if backend == "postgresql":
        server: PgTestServer = request.getfixturevalue("pg_server")
        return server.new_schema_url()
    raise ValueError(f"unknown backend {backend!r}")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty metadata database, once per backend: ``sqlite:///...`` or ``postgresql://...``."""
    return new_db_url(request, request.param, tmp_path)


def backend_of(db_url: str) -> str:
    """``sqlite`` or ``postgresql``."""
    return "sqlite" if db_url.startswith("sqlite:") else "postgresql"


def sql_rows(db_url: str, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
    """Run one statement (``?`` placeholders) behind the coordinator's back; its rows.

    Writes are committed.
    """
    if backend_of(db_url) == "sqlite":
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        try:
            with conn:
                cur = conn.execute(sql, tuple(params))
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()
    with psycopg.connect(db_url, autocommit=True) as pg:
        pg_cur = pg.execute(POSTGRESQL.sql(sql), tuple(params))
        return pg_cur.fetchall() if pg_cur.description else []
