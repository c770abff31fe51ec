"""The built wheel serves from a clean venv with only its runtime dependencies (issue 27).

``make run`` installs lakelog without the dev tools, and ``pip install lakelog`` gives
users only ``[project] dependencies``: nothing at run time may import a dev or Spark
package, and the wheel must carry every module and file ``lakelog serve`` needs.

The test builds the wheel (``pip wheel``, as a release does), makes a fresh venv and
installs the wheel into it with pip. The runtime dependencies are not downloaded again:
the closure of the wheel's ``Requires-Dist`` (markers evaluated, no extras) is resolved
against this test's environment and exactly those distributions are linked into the new
venv (a ``.pth`` directory of symlinks), so a dev-only import fails there as it would for
a user. From an empty directory, the venv's own ``lakelog`` then serves, produces and
consumes. (The download itself, size and time, is measured by hand: see the issue note.)

Also: the Makefile's editable install is one Spark's lookup of ``pyspark_*`` modules
finds (``pkgutil.iter_modules``, as ``pyspark/sql/worker/lookup_data_sources.py``), which
pip's default editable install is not.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from collections.abc import Iterator
from email.parser import Parser
from importlib import metadata
from pathlib import Path
from zipfile import ZipFile

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.procs import Proc, free_port, wait_http

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
#: Packages of the dev and spark extras a user of the wheel does not have.
NOT_INSTALLED = ("pyspark", "moto", "pytest", "confluent_kafka", "kafka", "schemathesis", "mypy")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([*PIP, "wheel", "--no-deps", "-w", str(out), str(REPO)], check=True)
    (built,) = out.glob("lakelog-*.whl")
    return built


def requirements_of(requires: list[str] | None, extras: frozenset[str]) -> Iterator[str]:
    """Names of the distributions ``requires`` asks for here, with ``extras`` active."""
    for text in requires or []:
        req = Requirement(text)
        markers = [{**default_environment(), "extra": e} for e in (extras or {""})]
        if req.marker is None or any(req.marker.evaluate(m) for m in markers):
            yield canonicalize_name(req.name)
            for extra in req.extras:
                yield f"{canonicalize_name(req.name)}[{extra}]"


def runtime_closure(wheel: Path) -> set[metadata.Distribution]:
    """The installed distributions the wheel's Requires-Dist needs, transitively."""
    with ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(zf.read(name).decode())
    pending = [
        (n, frozenset[str]()) for n in requirements_of(meta.get_all("Requires-Dist"), frozenset())
    ]
    seen: dict[str, metadata.Distribution] = {}
    done: set[tuple[str, frozenset[str]]] = set()
    while pending:
        item, extras = pending.pop()
        dist_name, _, extra = item.partition("[")
        extras = extras | ({extra.rstrip("]")} if extra else set())
        if (dist_name, extras) in done:
            continue
        done.add((dist_name, extras))
        dist = metadata.distribution(dist_name)
        seen[dist_name] = dist
        pending += [(n, frozenset[str]()) for n in requirements_of(dist.requires, extras)]
    return set(seen.values())


def top_level_entries(dist: metadata.Distribution) -> set[str]:
    """The first path component of every file the distribution installed (in site-packages)."""
    return {
        Path(str(f)).parts[0]
        for f in dist.files or ()
        if not str(f).startswith("..") and Path(str(f)).parts[0] != "__pycache__"
    }


@pytest.fixture(scope="module")
def clean_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv holding the wheel (installed by pip) and its runtime closure, nothing else."""
    home = tmp_path_factory.mktemp("venv")
    env_dir = home / "venv"
    venv.create(env_dir, with_pip=False, symlinks=True)
    python = env_dir / "bin" / "python"
    # clean_env: with this checkout on PYTHONPATH, pip would take its lakelog.egg-info for
    # lakelog installed already.
    subprocess.run(
        [*PIP, "--python", str(python), "install", "--no-deps", str(wheel)],
        check=True,
        env=clean_env(),
    )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    linked = home / "runtime-deps"
    linked.mkdir()
    for dist in runtime_closure(wheel):
        source = Path(str(dist.locate_file("")))
        for entry in top_level_entries(dist):
            if not (linked / entry).exists() and (source / entry).exists():
                (linked / entry).symlink_to(source / entry)
    (site / "runtime-deps.pth").write_text(f"{linked}\n")
    return env_dir


def clean_env() -> dict[str, str]:
    """The environment of a user's shell: none of this suite's PYTHONPATH or LAKELOG_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LAKELOG_"))}
    return {**env, "LAKELOG_KAFKA_PORT": "0", "LAKELOG_COORDINATOR_PORT": "0"}


def test_the_clean_venv_has_the_runtime_dependencies_only(clean_venv: Path) -> None:
    """pip finds every requirement met; lakelog comes from the wheel, not this checkout;
    the dev and Spark packages are not there."""
    python = str(clean_venv / "bin" / "python")
    out = subprocess.run(
        [*PIP, "--python", python, "check"], capture_output=True, text=True, env=clean_env()
    )
    assert out.returncode == 0, out.stdout + out.stderr
    probe = (  # pyspark_lakelog imports pyspark: it is there, for the spark extra
        "import importlib.util, service, spark; "
        "assert importlib.util.find_spec('pyspark_lakelog'); "
        "print(service.__file__); "
        f"print([m for m in {NOT_INSTALLED!r} if importlib.util.find_spec(m)])"
    )
    out = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, env=clean_env(), cwd=clean_venv
    )
    assert out.returncode == 0, out.stderr
    where, missing = out.stdout.splitlines()
    assert Path(where).is_relative_to(clean_venv), where
    assert missing == "[]"


def test_the_wheel_serves_produces_and_consumes_from_a_clean_venv(
    clean_venv: Path, tmp_path: Path
) -> None:
    """``lakelog serve`` of the clean venv, in an empty directory: the venv's CLI creates a
    topic, produces and consumes through it, and the server logs no error."""
    lakelog = str(clean_venv / "bin" / "lakelog")
    env = clean_env()
    out = subprocess.run([lakelog, "--version"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and re.fullmatch(r"lakelog \d+\.\d+\.\d+\S*\n", out.stdout)

    home = tmp_path / "empty"
    home.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = Proc([lakelog, "serve", "--port", str(port)], tmp_path / "serve.log", env=env, cwd=home)
    try:
        wait_http(f"{url}/health", timeout=120, proc=proc.popen)

        def run(*args: str, stdin: str | None = None) -> str:
            done = subprocess.run(
                [lakelog, *args, "--url", url],
                input=stdin,
                capture_output=True,
                text=True,
                env=env,
                cwd=home,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert run("topics", "create", "wheel", "--partitions", "2") == "Created topic wheel.\n"
        lines = "".join(f"k{i}:v{i}\n" for i in range(20))
        produced = run("produce", "--topic", "wheel", "--key-separator", ":", stdin=lines)
        assert len(produced.splitlines()) == 20
        consumed = run("consume", "--topic", "wheel", "--from-beginning", "--max-messages", "20")
        assert sorted(consumed.splitlines()) == sorted(f"k{i}\tv{i}" for i in range(20))
        assert any((home / "data").rglob("*.seg"))
    finally:
        proc.stop()
    log = proc.output()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


def makefile_install_flags() -> list[str]:
    """The pip options of the Makefile's editable install (its INSTALL variable)."""
    text = (REPO / "Makefile").read_text()
    (line,) = re.findall(r"^INSTALL := \$\(BIN\)/pip install (.*)$", text, re.M)
    return [f for f in line.split() if f not in ("-q", "-qq")]


@pytest.mark.parametrize("how", ["make", "pip -e"])
def test_spark_finds_the_editable_install_of_make_not_pips_default(
    how: str, tmp_path: Path
) -> None:
    """The Makefile's editable install puts pyspark_lakelog where Spark's lookup lists
    modules; pip's default editable install (an import hook) does not."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False, symlinks=True)
    python = str(env_dir / "bin" / "python")
    flags = makefile_install_flags() if how == "make" else ["--editable"]
    subprocess.run(
        [*PIP, "--python", python, "install", "--no-deps", *flags, str(REPO)],
        check=True,
        env=clean_env(),
    )
    lookup = (
        "import pkgutil; "
        "print([m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_')])"
    )
    out = subprocess.run(
        [python, "-c", lookup], capture_output=True, text=True, env=clean_env(), cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("['pyspark_lakelog']" if how == "make" else "[]")
