"""Spark against coordinators with authentication on: writes and reads with the
``coordinator.secret`` option; without it the coordinator refuses the job at planning."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.http_client import HttpCoordinator
from coordinator.security_http import secret_headers
from spark.options import parse_options
from tests.procs import Proc, free_port, lakelog_cmd, wait_http

ROOT = Path(__file__).resolve().parents[2]
SECRET = "spark-shared-secret-3"


@pytest.fixture(scope="module")
def secured_coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("spark-sec")
    (tmp / "data").mkdir()
    port = free_port()
    proc = Proc(
        lakelog_cmd(
            "coordinator",
            "--db",
            f"sqlite:///{tmp / 'meta.db'}",
            "--port",
            str(port),
            "--store",
            f"file://{tmp / 'data'}",
        ),
        tmp / "coordinator.log",
        env={
            "PYTHONPATH": str(ROOT),
            "LAKELOG_AUTHENTICATION": "basic",
            "LAKELOG_COORDINATOR_SECRET": SECRET,
        },
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", timeout=90, proc=proc.popen)
        yield url
    finally:
        proc.stop()
    assert SECRET not in proc.output()


def test_spark_writes_and_reads_with_the_secret(spark: Any, secured_coordinator: str) -> None:
    with HttpCoordinator(secured_coordinator, headers=secret_headers(SECRET)) as c:
        c.create_topic("spark-secure", 2)
    df = spark.createDataFrame([(b"v%03d" % i,) for i in range(200)], "value binary")
    (
        df.write.format("lakelog")
        .option("coordinator", secured_coordinator)
        .option("coordinator.secret", SECRET)
        .option("topic", "spark-secure")
        .mode("append")
        .save()
    )
    rows = (
        spark.read.format("lakelog")
        .option("coordinator", secured_coordinator)
        .option("coordinator.secret", SECRET)
        .option("subscribe", "spark-secure")
        .load()
        .collect()
    )
    assert sorted(bytes(r["value"]) for r in rows) == [b"v%03d" % i for i in range(200)]
    with pytest.raises(Exception, match=r"AuthenticationError|shared secret"):
        (
            spark.read.format("lakelog")
            .option("coordinator", secured_coordinator)
            .option("subscribe", "spark-secure")
            .load()
            .collect()
        )


def test_the_secret_is_never_printed() -> None:
    opts = parse_options(
        {"coordinator": "http://c:8083", "coordinator.secret": SECRET, "subscribe": "t"}
    )
    assert opts.connection.coordinator_secret == SECRET
    assert SECRET not in repr(opts)
