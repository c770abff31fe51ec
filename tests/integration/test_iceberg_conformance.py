"""The Iceberg REST catalog against Apache Iceberg's OpenAPI spec, with schemathesis.

A real ``lakelog serve`` with authentication on (a super user's bearer token from the
catalog's own ``/v1/oauth/tokens`` is what schemathesis sends; its auth checks send
none or a wrong one) is checked with ``schemathesis run --checks all`` over the
examples, coverage and fuzzing phases, deterministically, for every operation of the
spec but server-side scan planning, functions, request signing and the deprecated
token endpoint (lakelog serves none of them: the config's ``endpoints`` says which it
serves). Any failure fails the test, except the pairs recorded in ``DEVIATIONS`` with
their reason.

The spec is read from where the team keeps it, never copied into the project:
``LAKELOG_ICEBERG_SPEC``, else ``shared/reference/iceberg-rest-catalog-open-api.yaml``
beside the repository (or one of its parents, for git worktrees), else the file
``open-api/rest-catalog-open-api.yaml`` of the apache/iceberg repository as the team's tool
library fetched it (``.mirror/apache+iceberg/repo`` beside the repository), at the commit
and digest pinned below. Missing, the test is skipped with the reason: the spec is not in
the project (never copied) and a clean CI machine reaches no GitHub, so it runs where the
team's reference folder or tool library holds it. The catalog itself is exercised by real
clients in every run (test_iceberg_catalog.py: pyiceberg, Spark).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_iceberg_catalog import ADMIN_PW
from tests.integration.test_security_processes import run_cli, start_secured_serve

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SPEC_NAME = "iceberg-rest-catalog-open-api.yaml"

#: (failure type, operation): why it is accepted.
DEVIATIONS: dict[tuple[str, str], str] = {
    ("JsonSchemaError", "GET /v1/{prefix}/namespaces/{namespace}/views/{view}"): (
        "the spec's 404 of loadView names ErrorModel (no 'error' wrapper) while its own "
        "example, every other operation and the clients use IcebergErrorResponse: we answer "
        "the wrapped form"
    ),
}


#: The spec as fetched from apache/iceberg: the commit it is read at and its SHA-256.
SPEC_COMMIT = "7f879b1136"
SPEC_SHA256 = "9a160d49"


def _spec_from_mirror(into: Path) -> Path | None:
    """The spec read out of a fetched apache/iceberg repository beside ours, if one is."""
    for d in ROOT.parents:
        repo = d / ".mirror" / "apache+iceberg" / "repo"
        if not repo.is_dir():
            continue
        shown = subprocess.run(
            ["git", "-C", str(repo), "show", f"{SPEC_COMMIT}:open-api/rest-catalog-open-api.yaml"],
            capture_output=True,
            check=False,
        )
        if shown.returncode == 0 and hashlib.sha256(shown.stdout).hexdigest().startswith(
            SPEC_SHA256
        ):
            into.write_bytes(shown.stdout)
            return into
    return None


def spec_path(tmp_path: Path) -> Path:
    given = os.environ.get("LAKELOG_ICEBERG_SPEC")
    beside = [d / "shared" / "reference" / SPEC_NAME for d in ROOT.parents]
    path = Path(given) if given else next((p for p in beside if p.is_file()), beside[0])
    if not given and not path.is_file():
        path = _spec_from_mirror(tmp_path / SPEC_NAME) or path
    if not path.is_file():
        why = (
            f"the Iceberg REST catalog spec is not at {path} (set LAKELOG_ICEBERG_SPEC, keep "
            "shared/ beside the repository, or fetch apache/iceberg into .mirror/)"
        )
        pytest.skip(why)
    return path


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_catalog_conforms_to_the_iceberg_rest_spec(tmp_path: Path) -> None:
    spec = spec_path(tmp_path)
    proc, port, _ = start_secured_serve(
        tmp_path, "admin", ADMIN_PW, {"LAKELOG_JANITORS": "none", "LAKELOG_KAFKA_PORT": "0"}
    )
    base = f"http://127.0.0.1:{port}"
    try:
        made = run_cli(
            "topics", "create", "orders", "--partitions", "1", "--url", base,
            env={"LAKELOG_USER": "admin", "LAKELOG_PASSWORD": ADMIN_PW},
        )  # fmt: skip
        assert made.returncode == 0, made.stderr + made.stdout
        token = httpx.post(
            f"{base}/iceberg/v1/oauth/tokens",
            data={
                "grant_type": "client_credentials",
                "client_id": "admin",
                "client_secret": ADMIN_PW,
            },
        ).json()["access_token"]
        config = tmp_path / "schemathesis.toml"
        config.write_text(
            '[parameters]\n"path.prefix" = "lakelog"\n"path.namespace" = "topics"\n'
            '"path.table" = "orders"\n'
        )
        report = tmp_path / "st.json"
        args = [
            sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
            str(spec), "--url", f"{base}/iceberg", "--checks", "all",
            "--phases", "examples,coverage,fuzzing", "--max-examples", "5",
            "--generation-deterministic", "--workers", "1",
            "--header", f"Authorization: Bearer {token}",
            "--exclude-path-regex", "/plan|/tasks|/functions|/sign|/oauth",
            "--report", "json", "--report-json-path", str(report), "--no-color",
        ]  # fmt: skip
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=900, check=False, cwd=tmp_path
        )
        assert report.is_file(), f"no schemathesis report:\n{done.stdout[-3000:]}{done.stderr}"
        result: dict[str, Any] = json.loads(report.read_text())
    finally:
        proc.stop()
    assert not result["errors"], result["errors"]
    assert result["operations"]["tested"] == result["operations"]["selected"] >= 25
    found = {(f["type"], op) for f in result["failures"] for op in f["operations"]}
    new = sorted(found - DEVIATIONS.keys())
    assert not new, (
        "deviations from the Iceberg REST spec:\n"
        + "\n".join(f"  {t}: {op}" for t, op in new)
        + done.stdout[-6000:]
    )
