"""Start and stop real processes for integration tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

#: The repo root, on the children's path so that they import this tree whatever their cwd.
ROOT = Path(__file__).resolve().parents[1]

#: The ports handed to the processes tests start lie below the kernel's ephemeral range
#: (32768-60999 by default), where no outgoing connection takes one, in a range of their
#: own per pytest-xdist worker. The port the kernel gives for port 0 is free only until
#: its socket closes: the other worker's next server could be given it too and bind it
#: first, and then answer /health in our server's place (an agent of one test once met
#: another test's coordinator that way, and was refused with 401).
_PORTS_PER_RANGE = 4_000
_FIRST_PORT = 12_000


def _port_range() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    n = int(worker[2:]) if worker[:2] == "gw" and worker[2:].isdigit() else -1
    index = n if 0 <= n < 4 else 4  # gw0-gw3, then one range for everything else
    start = _FIRST_PORT + index * _PORTS_PER_RANGE
    return range(start, start + _PORTS_PER_RANGE)


def fake_aws_credentials() -> None:
    """Fake AWS credentials (and region) for boto3 here and in child processes, unless
    some are set: moto takes any, and no test or benchmark may reach a real account."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


_ports = _port_range()
_next_port = [_ports.start + (os.getpid() * 7919) % len(_ports)]  # processes start apart


def free_port() -> int:
    """A port nothing listens on now, from this worker's range (see ``_port_range``)."""
    for _ in range(len(_ports)):
        port = _next_port[0]
        _next_port[0] = port + 1 if port + 1 < _ports.stop else _ports.start
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_ports}")


def wait_http(url: str, timeout: float = 20.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url`` until it answers below 500; fail early if ``proc`` died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError as e:
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout}s: {last}")


class Proc:
    """A child process whose output goes to a log file, killed on stop()."""

    def __init__(
        self,
        args: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.args = list(args)
        self.log = log
        self._log_f = log.open("ab")
        self.popen = subprocess.Popen(
            self.args,
            stdout=self._log_f,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )

    def kill(self) -> None:
        """SIGKILL: the crash a test wants to survive."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._log_f.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, url: str, what: str, timeout: float = 20.0) -> None:
        """``wait_http(url)``; if it fails, stops the process and raises a RuntimeError
        saying ``what`` did not start, with the process's output."""
        try:
            wait_http(url, timeout=timeout, proc=self.popen)
        except Exception:
            self.stop()
            raise RuntimeError(f"{what} did not start:\n{self.output()}") from None


def lakelog_cmd(*args: str) -> list[str]:
    """The ``lakelog`` CLI of this interpreter, whatever the PATH."""
    return [sys.executable, "-m", "service.cli", *args]


def run_cli(
    *args: str,
    stdin: str | None = "",
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``lakelog ARGS`` run to its exit (output captured as text), importing this tree.

    ``stdin`` is its input (``None``: it inherits this process's); ``env`` adds to ours.
    """
    return subprocess.run(
        lakelog_cmd(*args),
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        check=False,
    )


def create_user(db: str, user: str, password: str) -> None:
    """``lakelog users create`` straight into the database ``db`` (before anything serves)."""
    made = run_cli("users", "create", user, "--password-stdin", "--db", db, stdin=password + "\n")
    assert made.returncode == 0, made.stderr


def local_args(tmp: Path, port: int, kport: int = 0) -> list[str]:
    """A server's arguments for a file store in ``tmp / "data"`` and HTTP on
    127.0.0.1:``port`` (Kafka on ``kport``; 0: no Kafka listener)."""
    return [
        "--store",
        f"file://{tmp / 'data'}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--kafka-port",
        str(kport),
    ]


def agent_args(coordinator: str, tmp: Path, port: int, kport: int = 0) -> list[str]:
    """``lakelog agent`` arguments: the coordinator at ``coordinator``, then ``local_args``."""
    return ["agent", "--coordinator", coordinator, *local_args(tmp, port, kport)]


def start_lakelog(
    log: Path, args: Sequence[str], env: dict[str, str], health_url: str | None = None
) -> Proc:
    """``lakelog ARGS`` as a process importing this tree (``env`` adds to our environment),
    its output in ``log``; returned once ``health_url`` answers, if given (else stopped)."""
    proc = Proc(lakelog_cmd(*args), log, env={"PYTHONPATH": str(ROOT), **env})
    if health_url is not None:
        try:
            wait_http(health_url, timeout=90, proc=proc.popen)
        except BaseException:
            proc.stop()
            raise
    return proc


def start_spark(conf: dict[str, str]) -> Any:
    """A local[2] SparkSession (its UI off, only errors logged) with this tree's lakelog
    source registered (an editable install is not listed); ``conf``: its other settings."""
    from pyspark.sql import SparkSession

    import spark as lakelog_spark

    quiet = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    session = SparkSession.builder.master("local[2]").config(map={**quiet, **conf}).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    lakelog_spark.register(session)
    return session


def start_moto(tmp: Path) -> tuple[Proc, str]:
    """A moto S3 server process on a free port; returns (proc, endpoint_url)."""
    port = free_port()
    proc = Proc(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        tmp / f"moto-{port}.log",
    )
    endpoint = f"http://127.0.0.1:{port}"
    wait_http(f"{endpoint}/moto-api/", proc=proc.popen)
    return proc, endpoint


def start_coordinator(
    tmp: Path,
    db_url: str,
    *,
    port: int | None = None,
    store_url: str | None = None,
    store_endpoint: str | None = None,
    args: Sequence[str] = (),
) -> tuple[Proc, str]:
    """A coordinator HTTP process on ``db_url``; returns (proc, base_url) once /health answers.

    Started as an operator would: ``lakelog coordinator --db ... --port ...`` (and
    ``args``, such as ``--db-shard URL``).
    """
    port = port or free_port()
    cmd = lakelog_cmd("coordinator", "--db", db_url, "--port", str(port), *args)
    if store_url:
        cmd += ["--store", store_url]
    if store_endpoint:
        cmd += ["--store-endpoint", store_endpoint]
    proc = Proc(cmd, tmp / f"coordinator-{port}.log", env={"PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    proc.wait_ready(f"{url}/health", "coordinator")
    return proc, url
