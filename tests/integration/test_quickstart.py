"""A newcomer's first minutes: ``lakelog serve`` in an empty directory, then curl-like calls.

The server is started as the README's quick start runs it (``lakelog serve``, here
``python -m service.cli serve`` so the test does not depend on the console script
being installed), with nothing but a port: SQLite and ``file://./data`` in the
current directory, which is a fresh empty one.
"""

from __future__ import annotations

import ast
import base64
import ipaddress
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from tests.coordinator_calls import answer, call
from tests.procs import Proc, free_port, lakelog_cmd, run_cli, wait_http

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0


def serve(
    tmp_path: Path, cwd: Path, *flags: str, env: dict[str, str] | None = None
) -> tuple[Proc, str]:
    """``lakelog serve`` on a free port in ``cwd`` (made if missing); (process, base URL)
    once it answers. Its default host, unless ``flags`` name one."""
    cwd.mkdir(exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "service.cli", "serve", "--port", str(port)]
    proc = Proc(
        [*command, *flags],
        tmp_path / f"serve-{port}.log",
        env={"PYTHONPATH": str(REPO), **(env or {})},  # stands in for `pip install lakelog`
        cwd=cwd,
    )
    try:
        # A readiness wait, not a speed check: a loaded machine takes its time to import.
        wait_http(f"{base}/health", timeout=START_TIMEOUT_S, proc=proc.popen)
    except BaseException:
        proc.stop()
        raise
    return proc, base


def test_serve_create_topic_and_produce_round_trip(tmp_path: Path) -> None:
    cwd = tmp_path / "newcomer"
    proc, base = serve(tmp_path, cwd)
    try:
        cluster_id = httpx.get(f"{base}/v3/clusters").json()["data"][0]["cluster_id"]
        r = httpx.post(
            f"{base}/v3/clusters/{cluster_id}/topics",
            json={"topic_name": "hello", "partitions_count": 2},
        )
        assert r.status_code == 201, r.text
        # curl -X POST -H "Content-Type: application/vnd.kafka.json.v2+json" \
        #      --data '{"records":[{"value":{"greeting":"hi"}}]}' localhost:8082/topics/hello
        r = httpx.post(
            f"{base}/topics/hello",
            content=b'{"records":[{"value":{"greeting":"hi"}},{"key":"k","value":"v"}]}',
            headers={"Content-Type": "application/vnd.kafka.json.v2+json"},
        )
        assert r.status_code == 200, r.text
        offsets = r.json()["offsets"]
        assert [o["error_code"] for o in offsets] == [None, None]
        r = httpx.post(
            f"{base}/topics/hello/partitions/1",
            json={"records": [{"value": base64.b64encode(b"raw bytes").decode()}]},
        )
        assert r.status_code == 200, r.text
        assert r.json()["offsets"][0]["partition"] == 1
        r = httpx.post(
            f"{base}/v3/clusters/{cluster_id}/topics/hello/records",
            json={"partition_id": 0, "value": {"type": "STRING", "data": "from v3"}},
        )
        assert r.status_code == 200
        report = r.json()
        assert (report["error_code"], report["partition_id"]) == (200, 0)
        # The data lives where the newcomer started the server, and the partition's
        # end offset counts every record produced to it.
        assert (cwd / "data").is_dir()
        assert any((cwd / "data").rglob("*.seg"))
        r = httpx.get(f"{base}/topics/hello/partitions/0/offsets")
        assert r.status_code == 200
        produced_to_0 = 1 + sum(1 for o in offsets if o["partition"] == 0)
        assert r.json()["end_offset"] == produced_to_0
    finally:
        proc.stop()
    assert "Traceback" not in proc.output()


def test_serve_runs_the_janitors_old_data_goes_and_its_objects_are_collected(
    tmp_path: Path,
) -> None:
    """``lakelog serve`` runs retention and garbage collection on its own (the default
    ``--janitors all``; the same flags as ``lakelog coordinator`` shorten their schedules):
    with ``retention.ms=1000`` the records produced go, log-start reaches the end, and
    the segment objects that held them are deleted from ./data; nothing else is asked."""
    cwd = tmp_path / "retention"
    intervals = ["--janitor-interval", "retention=0.5", "--janitor-interval", "gc=0.5"]
    proc, base = serve(tmp_path, cwd, "--gc-grace-s", "1", *intervals)
    try:
        cluster_id = httpx.get(f"{base}/v3/clusters").json()["data"][0]["cluster_id"]
        r = httpx.post(
            f"{base}/v3/clusters/{cluster_id}/topics",
            json={
                "topic_name": "short",
                "partitions_count": 1,
                "configs": [{"name": "retention.ms", "value": "1000"}],
            },
        )
        assert r.status_code == 201, r.text
        for i in range(3):
            r = httpx.post(
                f"{base}/topics/short",
                json={"records": [{"value": base64.b64encode(b"old %d" % i).decode()}]},
            )
            assert r.status_code == 200, r.text
        segments = set((cwd / "data").rglob("*.seg"))
        assert len(segments) == 3

        def offsets() -> dict[str, int]:
            r = httpx.get(f"{base}/topics/short/partitions/0/offsets")
            assert r.status_code == 200, r.text
            body: dict[str, int] = r.json()
            return body

        deadline = time.monotonic() + 60
        while offsets()["beginning_offset"] < 3 or segments & set((cwd / "data").rglob("*.seg")):
            assert time.monotonic() < deadline, (offsets(), proc.output()[-3000:])
            time.sleep(0.2)
        assert offsets() == {"beginning_offset": 3, "end_offset": 3}
        metrics = httpx.get(f"{base}/metrics").text
        assert 'lakelog_janitor_runs_total{janitor="retention",outcome="ok"}' in metrics
        assert 'lakelog_janitor_runs_total{janitor="gc",outcome="ok"}' in metrics
    finally:
        proc.stop()
    assert "Traceback" not in proc.output()
    # Dozens of runs went by (every 0.5 s), nearly all idle: only those that did something
    # are logged at INFO, so the retention that dropped the records and the GC that
    # deleted their objects are there, and no all-zero report is.
    runs = janitor_runs_logged(proc.output())
    assert runs, proc.output()[-3000:]
    for name, outcome, report in runs:
        assert outcome == "ok" and did_something(report), (name, report)
    assert sum(r["records_dropped"] for n, _, r in runs if n == "retention") == 3, runs
    assert sum(r["objects_deleted"] for n, _, r in runs if n == "gc") == 3, runs


#: ``... INFO coordinator.janitors.runner janitor gc: ok {'janitor': 'gc', ...}``
JANITOR_LINE = re.compile(r" INFO coordinator\.janitors\.runner janitor (\w+): (\w+) (\{.*\})$")


def janitor_runs_logged(output: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(janitor, outcome, report) of every run logged at INFO."""
    runs = []
    for line in output.splitlines():
        m = JANITOR_LINE.search(line)
        if m:
            runs.append((m.group(1), m.group(2), ast.literal_eval(m.group(3))))
    return runs


def did_something(report: dict[str, Any]) -> bool:
    return any(v for k, v in report.items() if k not in ("janitor", "partitions", "seconds"))


# -- the first hour (issue 27): what a newcomer meets after the quick start ----------------


def lakelog(
    cwd: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``lakelog ARGS`` run in ``cwd``, as a newcomer types it."""
    return run_cli(*args, stdin=stdin, env=env, cwd=cwd)


def test_version_is_the_projects(tmp_path: Path) -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    out = lakelog(tmp_path, "--version")
    assert (out.returncode, out.stdout, out.stderr) == (0, f"lakelog {version}\n", "")


def test_the_first_admin_made_before_the_first_start_is_the_one_serve_knows(
    tmp_path: Path,
) -> None:
    """``lakelog users create admin --password-stdin`` with no ``--db`` and no server
    answering goes into the database ``lakelog serve`` then opens in that directory, and
    says so; the server started after it there knows admin. With the server up, the same
    command goes to it; ``--url`` given is never swapped for a database."""
    cwd = tmp_path / "secure"
    cwd.mkdir()
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = lakelog(
        cwd,
        *("users", "create", "admin", "--password-stdin"),
        stdin="admin-password\n",
        env={"LAKELOG_URL": nobody},
    )
    assert (out.returncode, out.stdout) == (0, "Created user admin (principal User:admin).\n")
    assert out.stderr == (
        f"No server answers at {nobody}: using lakelog serve's database "
        "sqlite:///./data/lakelog.db.\n"
    )
    acl = ("--authentication", "basic", "--authorization", "acl", "--super-users", "User:admin")
    proc, base = serve(tmp_path, cwd, *acl)
    try:
        assert httpx.get(f"{base}/v3/clusters").status_code == 401
        assert httpx.get(f"{base}/v3/clusters", auth=("admin", "admin-password")).status_code == 200
        admin = {"LAKELOG_URL": base, "LAKELOG_USER": "admin", "LAKELOG_PASSWORD": "admin-password"}
        out = lakelog(
            cwd, "users", "create", "alice", "--password-stdin", stdin="alice-password\n", env=admin
        )
        assert (out.returncode, out.stderr) == (0, ""), out.stderr
        assert httpx.get(f"{base}/topics", auth=("alice", "alice-password")).json() == []
        out = lakelog(cwd, "users", "list", "--url", nobody, env=admin)
        assert out.returncode == 1 and out.stderr.startswith(f"Error: cannot reach {nobody}")
    finally:
        proc.stop()
    assert "Traceback" not in proc.output()


def non_loopback_address() -> str:
    """This machine's address on its default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))
        address = str(s.getsockname()[0])
    assert not ipaddress.ip_address(address).is_loopback, address
    return address


def connects(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        return False
    return True


def test_serve_listens_on_loopback_and_beyond_only_when_told(tmp_path: Path) -> None:
    """The embedded default is a development default: REST, Kafka and the coordinator API
    listen on 127.0.0.1 only. Listening on every interface with authentication off takes
    --allow-unauthenticated (serve, agent and coordinator alike), and then the warning
    that anyone may read and write is still logged."""
    cwd = tmp_path / "bind"
    kafka, coordinator = free_port(), free_port()
    ports = ("--kafka-port", str(kafka), "--coordinator-port", str(coordinator))
    address = non_loopback_address()
    proc, base = serve(tmp_path, cwd, *ports)
    try:
        for port in (int(base.rsplit(":", 1)[1]), kafka, coordinator):
            assert connects("127.0.0.1", port), port
            assert not connects(address, port), port
    finally:
        proc.stop()

    refusals = {
        "serve": ("serve", "--port", str(free_port()), *ports),
        "agent": ("agent", "--coordinator", "http://127.0.0.1:1", "--port", str(free_port())),
        "coordinator": ("coordinator", "--db", f"sqlite:///{tmp_path / 'c.db'}"),
    }
    for name, command in refusals.items():
        out = lakelog(cwd, *command, "--host", "0.0.0.0")
        assert out.returncode == 2, (name, out.stderr)
        assert out.stderr.startswith(
            "Error: invalid settings: host 0.0.0.0 listens beyond this machine with "
            "authentication none"
        ), (name, out.stderr)
        assert "--allow-unauthenticated" in out.stderr, name

    proc, base = serve(tmp_path, cwd, "--host", "0.0.0.0", "--allow-unauthenticated", *ports)
    try:
        for port in (int(base.rsplit(":", 1)[1]), kafka, coordinator):
            assert connects(address, port), port
    finally:
        proc.stop()
    assert "authentication is OFF: anyone who reaches this agent" in proc.output()


def test_serve_answers_the_coordinator_api_spark_and_other_processes_use(tmp_path: Path) -> None:
    """``lakelog serve`` answers the coordinator API on --coordinator-port: Spark's planner
    learns the store there (the absolute URL of ./data); a second agent joins it with
    ``lakelog agent --coordinator`` (a record produced through it is read through serve);
    ``lakelog janitor tier --coordinator`` runs there; --coordinator-port 0 turns it off."""
    cwd = tmp_path / "coordinated"
    port = free_port()
    coordinator = f"http://127.0.0.1:{port}"
    proc, base = serve(tmp_path, cwd, "--coordinator-port", str(port))
    agent: Proc | None = None
    try:
        store = answer(call(httpx, "store_location", base=coordinator))
        assert store == {"url": f"file://{cwd / 'data'}", "endpoint": None, "region": None}
        agent_port = free_port()
        agent = Proc(
            lakelog_cmd(
                *("agent", "--coordinator", coordinator, "--store", store["url"]),
                *("--port", str(agent_port)),
            ),
            tmp_path / "agent.log",
            env={"PYTHONPATH": str(REPO)},
        )
        other = f"http://127.0.0.1:{agent_port}"
        wait_http(f"{other}/health", timeout=START_TIMEOUT_S, proc=agent.popen)
        cluster_id = httpx.get(f"{base}/v3/clusters").json()["data"][0]["cluster_id"]
        assert httpx.get(f"{other}/v3/clusters").json()["data"][0]["cluster_id"] == cluster_id
        r = httpx.post(f"{other}/v3/clusters/{cluster_id}/topics", json={"topic_name": "t"})
        assert r.status_code == 201, r.text
        r = httpx.post(f"{other}/topics/t", json={"records": [{"value": "aGk="}]})
        assert r.status_code == 200, r.text
        r = httpx.get(f"{base}/v3/clusters/{cluster_id}/topics/t/partitions/0/records")
        assert r.status_code == 200, r.text
        assert [rec["value"] for rec in r.json()["records"]] == ["aGk="]

        out = lakelog(cwd, "janitor", "tier", "--coordinator", coordinator, "--tier-age-s", "0")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert (report["janitor"], report["rows_replaced"], report["objects_written"]) == (
            "tier",
            1,
            1,
        )
        assert any((cwd / "data" / "tiered" / "t").rglob("*.parquet"))
    finally:
        if agent is not None:
            agent.stop()
        proc.stop()
    assert "Traceback" not in proc.output()

    proc, base = serve(tmp_path, cwd, "--coordinator-port", "0")
    try:
        assert not connects("127.0.0.1", port)
    finally:
        proc.stop()


SECRET = "a-coordinator-secret-of-forty-characters"


def test_serve_coordinator_api_keeps_the_coordinators_security(tmp_path: Path) -> None:
    """With authentication on, serve's coordinator API is what a coordinator process with
    the same settings is: users by their credentials and ACLs (bob, with no ACL, may not
    look a topic up; the admin may), no anonymous caller, and other agents only with
    coordinator_secret (without it none can join: no bearer is accepted)."""
    cwd = tmp_path / "guarded"
    cwd.mkdir()
    for user, password in (("admin", "admin-password"), ("bob", "bob-password")):
        out = lakelog(
            cwd,
            *("users", "create", user, "--password-stdin", "--db", "sqlite:///./data/lakelog.db"),
            stdin=f"{password}\n",
        )
        assert out.returncode == 0, out.stderr
    port = free_port()
    coordinator = f"http://127.0.0.1:{port}"
    acl = ("--authentication", "basic", "--authorization", "acl", "--super-users", "User:admin")
    proc, _ = serve(tmp_path, cwd, *acl, "--coordinator-port", str(port))
    try:
        assert call(httpx, "store_location", base=coordinator).status_code == 401
        with httpx.Client(base_url=coordinator, auth=("admin", "admin-password")) as admin:
            assert call(admin, "store_location").status_code == 200
        lookup = {"topic": "orders", "partition": 0, "offset": 0}
        with httpx.Client(base_url=coordinator, auth=("bob", "bob-password")) as bob:
            assert call(bob, "lookup", lookup).status_code == 403
        for bearer in (SECRET, "x" * 43):
            headers = {"Authorization": f"Bearer {bearer}"}
            r = call(httpx, "store_location", base=coordinator, headers=headers)
            assert r.status_code == 401
    finally:
        proc.stop()

    secret = {"LAKELOG_COORDINATOR_SECRET": SECRET}
    proc, _ = serve(tmp_path, cwd, *acl, "--coordinator-port", str(port), env=secret)
    try:
        assert call(httpx, "store_location", base=coordinator).status_code == 401
        bearer = {"Authorization": f"Bearer {SECRET}"}
        r = call(httpx, "store_location", base=coordinator, headers=bearer)
        assert r.status_code == 200, r.text
        check = {"operation": "READ", "resource_type": "TOPIC", "resource_name": "orders"}
        for user, password, allowed in (
            ("bob", "bob-password", False),
            ("admin", "admin-password", True),
        ):
            r = httpx.post(
                f"{coordinator}/v1/security/authorize",
                json={"name": user, "secret": password, "checks": [check]},
                headers=bearer,
            )
            assert r.status_code == 200, r.text
            assert r.json()["allowed"] == [allowed], user
    finally:
        proc.stop()
    assert "Traceback" not in proc.output()


class Lines:
    """A child's output, a line at a time, with a deadline (a thread reads the pipe)."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.put(line)

    def next(self, timeout: float = 60.0) -> str:
        return self.lines.get(timeout=timeout)


def test_console_consumer_says_a_topic_is_missing_and_leaves_its_group_on_sigterm(
    tmp_path: Path,
) -> None:
    """``lakelog consume --topic nosuch`` says the topic does not exist and that it waits
    for it; created, its records come. Stopped by SIGTERM (docker stop, systemd, timeout),
    it leaves its group as on Ctrl-C: the group can be deleted at once, instead of
    keeping a member for max.poll.interval.ms (300 s)."""
    proc, base = serve(tmp_path, tmp_path / "consume")
    command = lakelog_cmd(
        *("consume", "--topic", "nosuch", "--group", "g1", "--from-beginning", "--url", base)
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    pipe = subprocess.PIPE
    try:
        with subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True, env=env) as consumer:
            try:
                assert consumer.stdout is not None and consumer.stderr is not None
                stdout, stderr = Lines(consumer.stdout), Lines(consumer.stderr)
                assert stderr.next() == (
                    "Topic 'nosuch' does not exist: waiting for it to be created "
                    "(Ctrl-C to stop).\n"
                )
                cluster_id = httpx.get(f"{base}/v3/clusters").json()["data"][0]["cluster_id"]
                topics = f"{base}/v3/clusters/{cluster_id}/topics"
                r = httpx.post(topics, json={"topic_name": "nosuch"})
                assert r.status_code == 201, r.text
                r = httpx.post(f"{base}/topics/nosuch", json={"records": [{"value": "bGF0ZQ=="}]})
                assert r.status_code == 200, r.text
                assert stdout.next() == "null\tlate\n"
                members = f"{base}/v3/clusters/{cluster_id}/consumer-groups/g1/consumers"
                assert len(httpx.get(members).json()["data"]) == 1

                consumer.send_signal(signal.SIGTERM)
                assert consumer.wait(60) == 0
                assert stderr.next() == "Processed a total of 1 messages\n"
            finally:
                if consumer.poll() is None:
                    consumer.kill()
        assert httpx.get(members).json()["data"] == []
        out = lakelog(tmp_path, "groups", "delete", "g1", "--url", base)
        assert (out.returncode, out.stdout) == (
            0,
            "Deletion of requested consumer groups ('g1') was successful.\n",
        ), out.stderr
    finally:
        proc.stop()
    assert "Traceback" not in proc.output()
