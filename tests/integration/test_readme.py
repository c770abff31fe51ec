"""README.md's examples, run as printed against real processes (issue 27).

The fenced ``sh``, ``bash`` and ``python`` blocks are read from README.md itself, so an
example changed without the code, or the code without the example, fails here. Each
story runs as a newcomer runs it: in order, in a directory of its own, in one bash session
(``$CLUSTER`` or an ``export`` carries over to the next block, as in a terminal):

- ``main``: the quick start's ``make run``, then the REST, Kafka, Schema Registry,
  consumer-group, broker-config and Spark examples against it;
- ``security``: the Security example, from the first super user to alice's produce;
- ``coordinator``: "The coordinator as a process" and its janitor commands;
- ``storage``: "The storage API from Python" (no server).

What differs from a terminal, and why:

- ``.venv`` holds two scripts, ``bin/lakelog`` and ``bin/python``, that run this
  interpreter with this tree on ``PYTHONPATH`` (what ``make install`` gives a real venv;
  test_wheel.py installs the real thing), and ``make``'s install stamps, so ``make run``
  and ``make spark`` skip pip. ``.venv/bin`` is first on ``PATH`` (the Security example
  calls ``lakelog`` as installed).
- The machine is shared: 8082, 9092 and 8083 are free ports. The ``LAKELOG_*`` variables
  move the servers and ``LAKELOG_URL`` the CLI; ``localhost:8082`` and its kin in an
  example are rewritten to the story's port. Nothing else of a command changes.
- Servers (``make run``, ``lakelog serve``, ``lakelog coordinator``) run in the background
  until the module ends; one that the story already runs is not started twice.
  ``kcat -G`` runs until stopped: it is stopped once it has read what was produced.
- Installs (``pip install ...``) and ``make test`` (this suite) are not run, nor the
  blocks NOT_RUN lists with why; a block neither run nor listed fails the test.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.procs import free_port, wait_http

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

#: How long one command may take (a Spark job on a loaded machine) and a server to answer.
COMMAND_TIMEOUT_S = 600.0
START_TIMEOUT_S = 120.0


# -- the README's blocks --------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One fenced block: the heading it is under, its language, its text, its place."""

    section: str
    lang: str
    text: str
    number: int  # 1-based, in README order

    @property
    def key(self) -> tuple[str, str]:
        """(section, first line): how NOT_RUN names a block."""
        return self.section, self.text.splitlines()[0].strip()

    @property
    def id(self) -> str:
        return f"{self.number}-{re.sub(r'[^a-z0-9]+', '-', self.section.lower()).strip('-')}"


def readme_blocks() -> list[Block]:
    blocks: list[Block] = []
    section = ""
    lines = README.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        fence = re.match(r"^(\s*)```(\w*)\s*$", line)
        if fence:
            indent, lang = fence.groups()
            j = i + 1
            while not lines[j].strip().startswith("```"):
                j += 1
            body = "\n".join(x[len(indent) :] for x in lines[i + 1 : j])
            blocks.append(Block(section, lang, body, len(blocks) + 1))
            i = j
        i += 1
    return blocks


#: Which story each section's runnable blocks belong to.
STORIES = {
    "Quick start": "main",
    "Use it like Confluent REST Proxy": "main",
    "Idempotent produce: `Idempotency-Key`": "main",
    "Use it with Kafka clients": "main",
    "Schemas: the Schema Registry API and the avro, jsonschema, protobuf formats": "main",
    "Cluster-wide broker configs": "main",
    "Spark": "main",
    "Security": "security",
    "The coordinator as a process": "coordinator",
    "The storage API from Python": "storage",
}

#: Blocks not run here, by (section, first line), and why.
NOT_RUN = {
    (
        "A group's records as a stream: NDJSON or Server-Sent Events",
        "curl -N -H 'Accept: text/event-stream' \\",
    ): "a stream that never ends, on a placeholder cluster id: test_group_stream.py runs it",
    ("Use it with Kafka clients", "Produce(0): 3 to 13"): "kafka-broker-api-versions' "
    "output, not a command: test_kafka_versions.py checks it against the listener's table",
    (
        "Sharding the metadata over several PostgreSQL databases",
        "lakelog coordinator --db postgresql://u@pg0/catalog \\",
    ): "needs PostgreSQL servers pg0..pg2: test_shards.py runs shards on this machine's",
    (
        "Consumer groups: `lakelog groups` (kafka-consumer-groups)",
        ".venv/bin/lakelog groups list [--state]",
    ): "a synopsis ([--state] marks options): test_groups_cli.py runs each command",
    (
        "Run a cluster",
        "cp .env.example .env          # set the passwords and the secret (openssl rand -hex 32); "
        "every variable is listed there",
    ): "needs a Docker engine: test_deploy.py validates the files "
    "and runs the same topology as processes",
    ("Security", "security.protocol=SASL_PLAINTEXT"): "client properties, not a command: "
    "test_kafka_sasl.py connects with them",
    ("History as tables: Iceberg (issue 31)", "from pyiceberg.catalog import load_catalog"):
    "a placeholder password, on tiered data: test_iceberg_catalog.py loads tables with pyiceberg",
    ("History as tables: Iceberg (issue 31)",
     "spark.sql.extensions=org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"):
    "Spark catalog properties: the Iceberg runtime jars cannot be installed here",
    ("History as tables: Iceberg (issue 31)", "connector.name=iceberg"): "a Trino catalog file",
    ("Spark", "yesterday = ("):
    "a fragment (spark, url): test_iceberg_catalog.py reads asOfTimestamp and latestByKey",
    ("Spark", "("): "a fragment (url, a stream): test_spark_stream_write.py runs streams",
    ("Spark", "from spark.avro_values import with_avro_values"): "a fragment (df): "
    "test_spark_schemas.py decodes Avro values",
    ("Configuration", 'store = "s3://lakelog/data"'): "a config file: test_settings.py loads it",
}  # fmt: skip

BLOCKS = readme_blocks()
RUN = [b for b in BLOCKS if b.key not in NOT_RUN and b.lang in ("sh", "bash", "python")]


def test_every_example_is_run_or_says_why() -> None:
    """A new block is run (its section has a story) or listed in NOT_RUN with a reason; a
    NOT_RUN entry that matches no block any more is stale."""
    keys = {b.key for b in BLOCKS}
    assert sorted(k for k in NOT_RUN if k not in keys) == []
    homeless = [(b.section, b.key[1]) for b in RUN if b.section not in STORIES]
    assert homeless == [], "README blocks that no story runs: add them to STORIES or NOT_RUN"
    assert [b.lang for b in BLOCKS if b.key not in NOT_RUN and b not in RUN] == []


# -- commands ---------------------------------------------------------------------------------


def commands(block: Block) -> list[str]:
    """A shell block's commands: continuation lines joined, heredocs kept whole, comments
    and blank lines left out. A Python block is one command: that Python, run."""
    if block.lang == "python":
        return [f".venv/bin/python - <<'README_PY'\n{block.text}\nREADME_PY"]
    out: list[str] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        command = line
        # A trailing backslash, or a quote still open (a JSON body over two lines).
        while i < len(lines) and (command.endswith("\\") or not complete(command)):
            command += "\n" + lines[i]
            i += 1
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", command)
        if heredoc and "<<<" not in command:
            end = heredoc.group(1)
            while i < len(lines):
                command += "\n" + lines[i]
                i += 1
                if lines[i - 1] == end:
                    break
        out.append(command)
    return out


def complete(command: str) -> bool:
    """Whether the shell would see the command's quotes closed."""
    try:
        shlex.split(command.split("<<", 1)[0], comments=True)
    except ValueError:
        return False
    return True


SERVER = re.compile(
    r"^(?:\w+=\S+\s+(?:\\\n\s*)?)*(?:make run|(?:\S*/)?lakelog (?:serve|coordinator))\b"
)
#: Installs the sandbox does not do (test_wheel.py installs the wheel for real), and this suite.
SKIPPED = re.compile(r"\bpip install\b|^make test\b")


def without_comment(command: str) -> str:
    """A command run in the background without its trailing ``# ...`` and ``&`` (servers
    and kcat: no ``#`` in their quotes)."""
    return re.sub(r"\s*&?\s*(#.*)?$", "", command.split(" #", 1)[0]).strip()


# -- a story: a directory, a bash session, its servers --------------------------------------------


@dataclass
class Story:
    name: str
    home: Path
    ports: dict[int, int]  # README port -> this story's
    env: dict[str, str]
    shell: subprocess.Popen[str] = field(init=False)
    lines: queue.Queue[str] = field(init=False, default_factory=queue.Queue)
    servers: list[str] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        make_venv(self.home)
        # A process group of its own: the story's servers end with it.
        self.shell = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.home,
            env=self.env,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self._send("set -o pipefail")

    def _read(self) -> None:
        assert self.shell.stdout is not None
        try:
            for line in self.shell.stdout:
                self.lines.put(line)
        except ValueError:  # the story's end closed the pipe while a line was awaited
            return

    def _send(self, text: str) -> None:
        assert self.shell.stdin is not None
        self.shell.stdin.write(text + "\n")
        self.shell.stdin.flush()

    def localize(self, command: str) -> str:
        """The README's well-known ports as this story's."""
        for readme_port, port in self.ports.items():
            command = re.sub(rf"\b(localhost|127\.0\.0\.1):{readme_port}\b", rf"\1:{port}", command)
        return command

    def run(self, command: str) -> tuple[int, str]:
        """Run one command in the session; (exit status, output)."""
        marker = f"__README_DONE_{time.monotonic_ns()}__"
        self._send(self.localize(command))
        self._send(f'printf "\\n{marker} %s\\n" "$?"')
        out: list[str] = []
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"still running after {COMMAND_TIMEOUT_S} s: {command}\n"
                                     f"{''.join(out)[-4000:]}") from None  # fmt: skip
            if line.startswith(marker):
                return int(line.split()[1]), "".join(out)
            out.append(line)

    def start_server(self, command: str, health: str) -> None:
        """A server command in the background (its output in a log); back once it answers.
        A server the story runs already is not started again: ``make run`` runs
        ``.venv/bin/lakelog serve``, which a later block shows as how it was started."""
        plain = without_comment(command)
        which = "lakelog serve" if plain == "make run" else plain[plain.index("lakelog ") :]
        if which in self.servers:
            return
        log = self.home / f"server-{len(self.servers)}.log"
        self.logs.append(log)
        status, out = self.run(f"{plain} > {shlex.quote(str(log))} 2>&1 &")
        assert status == 0, out
        try:
            wait_http(health, timeout=START_TIMEOUT_S)
        except TimeoutError as e:
            raise AssertionError(f"{plain}: {e}\n{log.read_text()[-4000:]}") from None
        self.servers.append(which)

    def run_until(self, command: str, ready: Callable[[str], bool]) -> str:
        """A command that runs until stopped: in the background, stopped (SIGTERM) once its
        output is ``ready``; its whole output."""
        out_file = self.home / f"until-{time.monotonic_ns()}.out"
        plain = without_comment(command)
        status, out = self.run(f"{plain} > {shlex.quote(str(out_file))} 2>&1 & echo $!")
        assert status == 0, out
        pid = int(out.split()[-1])

        def output() -> str:  # the background shell may not have opened the file yet
            return out_file.read_text() if out_file.exists() else ""

        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while not ready(output()):
            assert time.monotonic() < deadline, output()[-4000:]
            time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        self.run(f"wait {pid}")
        return out_file.read_text()

    def close(self) -> None:
        """Stop everything the story started (its process group), servers first politely."""
        try:
            os.killpg(self.shell.pid, signal.SIGTERM)
            self.shell.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.shell.pid, signal.SIGKILL)
            self.shell.wait(10)
        except ProcessLookupError:
            pass
        for stream in (self.shell.stdin, self.shell.stdout):
            if stream is not None:
                stream.close()


def make_venv(home: Path) -> None:
    """``.venv`` as ``make install`` leaves it, standing in for this checkout's install."""
    home.mkdir(parents=True, exist_ok=True)
    for name in ("Makefile", "pyproject.toml"):
        (home / name).symlink_to(REPO / name)
    bin_ = home / ".venv" / "bin"
    bin_.mkdir(parents=True)
    path = f'PYTHONPATH="{REPO}"'
    scripts = {
        "python": f'{path} exec "{sys.executable}" "$@"',
        "lakelog": f'{path} exec "{sys.executable}" -m service.cli "$@"',
    }
    for name, line in scripts.items():
        script = bin_ / name
        script.write_text(f"#!/bin/sh\n{line}\n")
        script.chmod(0o755)
    for stamp in (".run", ".spark"):  # newer than pyproject.toml: nothing to install
        (home / ".venv" / stamp).touch()


def story_env(home: Path, ports: dict[int, int], extra: dict[str, str]) -> dict[str, str]:
    # Nothing of this test process's own setup: its PYTHONPATH, a Spark fixture's
    # PYSPARK_PYTHON, the suite's LAKELOG_* (the story sets its own).
    unset = ("LAKELOG_", "PYTHON", "PYSPARK_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(unset)}
    env.update(
        PATH=f"{home / '.venv' / 'bin'}:{os.environ['PATH']}",
        LAKELOG_URL=f"http://localhost:{ports[8082]}",
        LAKELOG_PORT=str(ports[8082]),
        LAKELOG_KAFKA_PORT=str(ports[9092]),
        LAKELOG_COORDINATOR_PORT=str(ports[8083]),
        **extra,
    )
    return env


@pytest.fixture(scope="module")
def stories(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Story]]:
    """One story (directory, bash session, servers) per name, made when first needed."""
    made: dict[str, Story] = {}

    class Stories(dict[str, Story]):
        def __missing__(self, name: str) -> Story:
            home = tmp_path_factory.mktemp(f"readme-{name}")
            ports = {8082: free_port(), 9092: free_port(), 8083: free_port()}
            extra = {"ADMIN_PASSWORD": "admin-password", "ALICE_PASSWORD": "alice-password"}
            if name == "coordinator":  # `lakelog coordinator` listens on LAKELOG_PORT
                ports[8083] = ports[8082]
            story = made[name] = Story(name, home, ports, story_env(home, ports, extra))
            self[name] = story
            return story

    try:
        yield Stories()
    finally:
        for story in made.values():
            story.close()
        problems = {
            log.name: log.read_text()[-3000:]
            for story in made.values()
            for log in story.logs
            if "Traceback" in log.read_text()
        }
        assert problems == {}


# -- what each example must show ------------------------------------------------------------------

#: An error body of the REST API (v3 produce reports carry "error_code": 200).
REST_ERROR = re.compile(r'"error_code":\s*[45]\d\d')

#: Output an example must print, by a piece of its command.
EXPECTED = {
    "lakelog consume --topic events --group demo": ["k1\thello", "k2\tworld"],
    '-d \'{"records":[{"key":"k","value":{"n":1}}]}\'': ['"offsets":[{"partition":'],
    "records:batch": ['"successes":[{', '"failures":[]'],
    "Idempotency-Key: order-42": ['"offsets":[{"partition":'],
    "subjects/orders-value/versions/latest": ['"subject":"orders-value"', '"version":1'],
    "configs/retention.ms": ['"value":"86400000"', '"source":"DYNAMIC_DEFAULT_BROKER_CONFIG"'],
    "spark.read.format": ["|partition|offset|", "hello"],
    "--sum amount": ["|alice|2      |4.0       |", "|bob  |1      |5.0       |"],
    "lakelog janitor tier --coordinator": ['"janitor":"tier"'],
    "lakelog users create admin": ["using lakelog serve's database sqlite:///./data/lakelog.db"],
    "http://localhost:8082/topics/orders-eu": ['"offsets":[{"partition":0,"offset":0'],
    "print(result.base_offsets)": ["[0, 0, 0, 0]", "0 b'k' b'hello'"],
}


def kcat_read_everything(output: str) -> bool:
    """kcat -G has reached the end of each partition of ``events`` (3 of them)."""
    return output.count("% Reached end of topic events") >= 3


@pytest.mark.timeout(COMMAND_TIMEOUT_S * 2)  # a Spark block: two jobs on a loaded machine
@pytest.mark.parametrize("block", RUN, ids=lambda b: b.id)
def test_example(block: Block, stories: dict[str, Story]) -> None:
    """Run the block's commands in its story's session: each exits 0, prints no error
    body or traceback, and prints what EXPECTED says it must."""
    story = stories[STORIES[block.section]]
    health = f"http://127.0.0.1:{story.ports[8082]}/health"
    for command in commands(block):
        if SKIPPED.search(command):
            continue
        if SERVER.match(command):
            story.start_server(command, health)
            continue
        if command.startswith("kcat") and shutil.which("kcat") is None:
            pytest.fail("kcat is not installed: .ci/run installs it (Debian's kcat)")
        if re.search(r"\bkcat\b.*\s-G\s", command):
            output = story.run_until(command, kcat_read_everything)
            assert "hello" in output.splitlines(), output
            continue
        status, output = story.run(command)
        assert status == 0, f"{command}\n-> exit {status}\n{output[-4000:]}"
        assert not REST_ERROR.search(output), f"{command}\n{output[-4000:]}"
        assert "Traceback" not in output, f"{command}\n{output[-4000:]}"
        assert "replaced a statically registered data source" not in output, command
        for piece, expected in EXPECTED.items():
            if piece in command:
                for text in expected:
                    assert text in output, f"{command}\n-> lacks {text!r}:\n{output[-4000:]}"
