"""Security across real processes: a coordinator that serves only agents with its shared
secret, an agent with HTTP Basic and ACLs, and ``lakelog users|api-keys|acls`` against
the database (``--db``) and over the agent's API (``--url``) as a super user."""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from coordinator.db import open_database
from coordinator.http.client import http_coordinator
from coordinator.security.store import SqlSecurityStore
from segments.errors import AuthenticationError
from tests.coordinator_calls import call
from tests.procs import (
    ROOT,
    Proc,
    agent_args,
    create_user,
    free_port,
    lakelog_cmd,
    local_args,
    run_cli,
    start_lakelog,
    wait_http,
)

SECRET = "coordinator-shared-secret-7Qx-0123456789abcdef"
ADMIN_PASSWORD = "admin-password-Zp4"
ALICE_PASSWORD = "alice-password-Kw9"
V2 = "application/vnd.kafka.v2+json"
BINARY = "application/vnd.kafka.binary.v2+json"


def start_secured_serve(
    tmp: Path, user: str, password: str, env: dict[str, str]
) -> tuple[Proc, int, int]:
    """``lakelog serve`` with HTTP Basic (and SASL on its Kafka listener) on ``tmp``'s
    database, where ``user`` is created first; ``env`` adds settings. Returns the process,
    its HTTP port and its Kafka port, once it answers."""
    db = f"sqlite:///{tmp / 'meta.db'}"
    create_user(db, user, password)
    port, kport = free_port(), free_port()
    proc = start_lakelog(
        tmp / "serve.log",
        [
            "serve",
            "--db",
            db,
            *local_args(tmp, port, kport),
            "--authentication",
            "basic",
            "--log-level",
            "info",
        ],
        env,
        f"http://127.0.0.1:{port}/health",
    )
    return proc, port, kport


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@dataclass
class Secured:
    coordinator_url: str
    agent_url: str
    db: str
    procs: list[Proc]
    cluster_id: str

    def logs(self) -> str:
        return "".join(p.output() for p in self.procs)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    tmp = tmp_path_factory.mktemp("secured")
    db = f"sqlite:///{tmp / 'meta.db'}"
    create_user(db, "admin", ADMIN_PASSWORD)  # the first super user
    env = {
        "PYTHONPATH": str(ROOT),
        "LAKELOG_COORDINATOR_SECRET": SECRET,
        "LAKELOG_AUTHENTICATION": "basic",
        # The same on both: an agent refuses coordinators whose security differs.
        "LAKELOG_AUTHORIZATION": "acl",
        "LAKELOG_SUPER_USERS": "User:admin",
    }
    cport, aport = free_port(), free_port()
    coordinator_url, agent_url = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{aport}"
    coordinator = Proc(
        lakelog_cmd("coordinator", "--db", db, "--port", str(cport), "--log-level", "info"),
        tmp / "coordinator.log",
        env=env,
    )
    agent = Proc(
        lakelog_cmd(*agent_args(coordinator_url, tmp, aport), "--log-level", "info"),
        tmp / "agent.log",
        env={**env, "LAKELOG_AUTH_CACHE_TTL_S": "0.5"},
    )
    procs = [coordinator, agent]
    try:
        wait_http(f"{coordinator_url}/health", timeout=90, proc=coordinator.popen)
        wait_http(f"{agent_url}/health", timeout=90, proc=agent.popen)
        clusters = httpx.get(f"{agent_url}/v3/clusters", headers=basic("admin", ADMIN_PASSWORD))
        assert clusters.status_code == 200, clusters.text
        yield Secured(
            coordinator_url, agent_url, db, procs, clusters.json()["data"][0]["cluster_id"]
        )
    finally:
        for p in procs:
            p.stop()


def test_coordinator_refuses_callers_without_the_secret(secured: Secured) -> None:
    with httpx.Client(base_url=secured.coordinator_url) as client:
        r = call(client, "list_topics")
        wrong = call(client, "list_topics", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    assert r.json()["error"] == "AuthenticationError"
    assert r.headers["www-authenticate"].startswith("Basic")  # users may, with their own
    assert wrong.status_code == 401
    # Probes and scrapes stay open; they show no data.
    assert httpx.get(f"{secured.coordinator_url}/health").status_code == 200
    with http_coordinator(secured.coordinator_url) as no_secret, pytest.raises(AuthenticationError):
        no_secret.list_topics()
    with http_coordinator(
        secured.coordinator_url, headers={"authorization": f"Bearer {SECRET}"}
    ) as ok:
        assert isinstance(ok.list_topics(), list)


def test_agent_without_the_secret_is_refused_at_start(tmp_path: Path, secured: Secured) -> None:
    result = run_cli(
        "agent",
        "--coordinator",
        secured.coordinator_url,
        "--authentication",
        "basic",
        "--store",
        f"file://{tmp_path}/data",
    )
    assert result.returncode == 2
    assert "coordinator_secret" in result.stderr


def test_cli_over_the_api_as_super_user(secured: Secured) -> None:
    """users, api-keys and acls over --url as admin; the ACL then decides what alice may do."""
    admin = {"LAKELOG_USER": "admin", "LAKELOG_PASSWORD": ADMIN_PASSWORD}
    url = ["--url", secured.agent_url]
    made = run_cli(
        "users", "create", "alice", "--password-stdin", *url, stdin=ALICE_PASSWORD + "\n", env=admin
    )
    assert made.returncode == 0, made.stderr
    listed = run_cli("users", "list", *url, env=admin)
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["admin", "alice"]
    # Not a super user: refused, whatever the command.
    refused = run_cli(
        "users", "list", *url, env={"LAKELOG_USER": "alice", "LAKELOG_PASSWORD": ALICE_PASSWORD}
    )
    # The CLI prints the server's sentence, not its code.
    assert (refused.returncode, refused.stderr) == (
        1,
        "Error: Not authorized to perform this operation.\n",
    )
    anonymous = run_cli("users", "list", *url)
    assert anonymous.returncode == 1
    assert anonymous.stderr.startswith("Error: Authentication is required: HTTP Basic")

    key = run_cli("api-keys", "create", "--owner", "alice", "--description", "ci", *url, env=admin)
    assert key.returncode == 0, key.stderr
    fields = dict(line.split(":", 1) for line in key.stdout.splitlines())
    key_id, key_secret = fields["API key"].strip(), fields["Secret"].strip()
    assert key_secret not in run_cli("api-keys", "list", *url, env=admin).stdout

    topics = f"{secured.agent_url}/v3/clusters/{secured.cluster_id}/topics"
    for name in ("orders-eu", "payroll"):
        r = httpx.post(topics, json={"topic_name": name}, headers=basic("admin", ADMIN_PASSWORD))
        assert r.status_code == 201, r.text
    acl = run_cli(
        "acls",
        "create",
        "--allow-principal",
        "User:alice",
        "--operation",
        "WRITE",
        "--topic",
        "orders-",
        "--resource-pattern-type",
        "prefixed",
        *url,
        env=admin,
    )
    assert acl.returncode == 0, acl.stderr
    assert (
        "User:alice"
        in run_cli(
            "acls",
            "list",
            "--topic",
            "orders-eu",
            "--resource-pattern-type",
            "match",
            *url,
            env=admin,
        ).stdout
    )

    record = {"records": [{"value": "aGk="}]}
    for who in (basic("alice", ALICE_PASSWORD), basic(key_id, key_secret)):
        ok = httpx.post(
            f"{secured.agent_url}/topics/orders-eu",
            json=record,
            headers={**who, "Content-Type": BINARY},
        )
        assert ok.status_code == 200, ok.text
        denied = httpx.post(
            f"{secured.agent_url}/topics/payroll",
            json=record,
            headers={**who, "Content-Type": BINARY},
        )
        assert denied.status_code == 403
        assert denied.json() == {
            "error_code": 40301,
            "message": "Not authorized to perform this operation.",
        }
        # Listing shows what alice may describe (WRITE implies DESCRIBE), not payroll.
        assert httpx.get(f"{secured.agent_url}/topics", headers=who).json() == ["orders-eu"]

    rotated = run_cli("api-keys", "rotate", key_id, *url, env=admin)
    assert rotated.returncode == 0
    gone = run_cli(
        "acls",
        "delete",
        "--topic",
        "orders-",
        "--resource-pattern-type",
        "prefixed",
        *url,
        env=admin,
    )
    assert "Deleted ACL" in gone.stdout
    assert run_cli("users", "delete", "alice", *url, env=admin).returncode == 0
    # Within the cache bound (0.5 s here) alice's credential stops working.
    wait_http_status(f"{secured.agent_url}/topics", basic("alice", ALICE_PASSWORD), 401)

    # No password, API key secret or shared secret in any process's log.
    logs = secured.logs()
    for secret in (ADMIN_PASSWORD, ALICE_PASSWORD, key_secret, SECRET):
        assert secret not in logs
    assert "authentication basic, authorization acl" in logs


def wait_http_status(url: str, headers: dict[str, str], status: int, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while True:
        got = httpx.get(url, headers=headers).status_code
        if got == status or time.monotonic() > deadline:
            assert got == status
            return
        time.sleep(0.1)


def test_password_stdin_is_required(tmp_path: Path) -> None:
    result = run_cli("users", "create", "bob", "--db", f"sqlite:///{tmp_path}/m.db")
    assert result.returncode == 2 and "--password-stdin" in result.stderr
    empty = run_cli(
        "users", "create", "bob", "--password-stdin", "--db", f"sqlite:///{tmp_path}/m.db"
    )
    assert empty.returncode == 2


def test_cli_on_the_database(tmp_path: Path) -> None:
    db = ["--db", f"sqlite:///{tmp_path}/m.db"]
    assert (
        run_cli(
            "users", "create", "ops", "--password-stdin", *db, stdin="ops-password\n"
        ).returncode
        == 0
    )
    dup = run_cli("users", "create", "ops", "--password-stdin", *db, stdin="ops-password\n")
    assert dup.returncode == 1 and "already exists" in dup.stderr
    # Start-up scripts (compose's create-admin) run it on every start: no error, no change.
    again = run_cli(
        "users", "create", "ops", "--password-stdin", "--exist-ok", *db, stdin="other-password\n"
    )
    assert again.returncode == 0 and "exists" in again.stdout
    database = open_database(db[1])
    try:
        assert SqlSecurityStore(database).authenticate("ops", "ops-password") == "User:ops"
    finally:
        database.close()
    short = run_cli("users", "create", "x", "--password-stdin", *db, stdin="short\n")
    assert short.returncode == 1 and "short" not in short.stderr.replace("--password-stdin", "")
    assert (
        run_cli(
            "users", "set-password", "ops", "--password-stdin", *db, stdin="new-password\n"
        ).returncode
        == 0
    )
    made = run_cli(
        "acls",
        "create",
        "--allow-principal",
        "User:ops",
        "--deny-principal",
        "User:bad",
        "--operation",
        "READ",
        "--operation",
        "DESCRIBE",
        "--group",
        "g1",
        "--cluster",
        *db,
    )
    assert made.returncode == 0, made.stderr
    assert len(made.stdout.splitlines()) == 8  # 2 principals x 2 operations x 2 resources
    listed = run_cli("acls", "list", "--principal", "User:bad", *db)
    assert len(listed.stdout.splitlines()) == 4
    bad = run_cli(
        "acls", "create", "--allow-principal", "ops", "--operation", "READ", "--topic", "t", *db
    )
    assert bad.returncode == 1 and "User:NAME" in bad.stderr
    gone = run_cli("acls", "delete", "--group", "g1", "--operation", "READ", *db)
    assert len([x for x in gone.stdout.splitlines() if x.startswith("Deleted")]) == 2
    assert run_cli("users", "delete", "ops", *db).returncode == 0
    assert run_cli("users", "list", *db).stdout == ""
    assert sys.executable  # the CLI ran under this interpreter
