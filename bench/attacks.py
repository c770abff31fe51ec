"""The memory attacks of issue 23 against a real agent, and the agent's peak RSS under each.

Each attack gets a fresh ``lakelog serve`` (SASL/PLAIN and HTTP Basic on, SQLite,
``file://`` store, this tree's code: run the script from another checkout to measure
that one) and prints one JSON line::

    {"bench": "attacks", "attack": ..., "baseline_rss_mib": ..., "peak_rss_mib": ...,
     "after_rss_mib": ..., ...what the attacker saw}

``baseline_rss_mib`` is the agent's resident set before the attack (after what it needs
was written: 128 MiB for the two read attacks, which fill the agent's read caches),
``peak_rss_mib`` the most it reached while the attack ran (sampled every 20 ms),
``after_rss_mib`` its size once the attacker closed its connections. The attacks:

- ``frames_before_sasl``: 8 connections each announce a 100 MiB frame and send it,
  without authenticating;
- ``apiversions_unread``: one connection pipelines up to 1,000,000 ApiVersions (until
  the agent stops reading for ``ATTACK_STALL_S``, 15 s) and reads none of the answers,
  then closes;
- ``fetch_unread``: with 128 MiB in a partition, one authenticated connection sends 10
  Fetches with max_bytes 2^31-1 and reads nothing, then closes;
- ``idle_connections``: 1,500 connections, half of them idle, half stopped after
  SaslHandshake; how many are still open 35 s later;
- ``zstd_bomb``: a 16 KiB zstd batch holding 500 MiB, produced; whether it was stored;
- ``v3_read_huge``: a v3 read of that 128 MiB partition with max_bytes=10^12; the body's
  size.

Run: ``.venv/bin/python bench/attacks.py [attack ...]`` (about four minutes for all).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from aiokafka.record.default_records import DefaultRecordBatchBuilder

# This tree's tests/ (its Kafka framing); the agents run the current directory's code.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kafka_wire import read_answer, request_frame

ROOT = Path.cwd()
USER, PASSWORD = "bench", "bench-password-1"
MiB = 1 << 20


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Agent:
    """A ``lakelog serve`` of the current directory's code, with a user and a topic."""

    def __init__(self, tmp: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LAKELOG_AUTH_MAX_FAILURES": "1000000"}
        db = f"sqlite:///{tmp / 'meta.db'}"
        cli = [sys.executable, "-m", "service.cli"]
        subprocess.run(
            [*cli, "users", "create", USER, "--password-stdin", "--db", db],
            input=PASSWORD + "\n",
            text=True,
            env=env,
            check=True,
            capture_output=True,
        )
        self.port, self.kport = free_port(), free_port()
        self.log = (tmp / "serve.log").open("wb")
        self.proc = subprocess.Popen(
            [
                *cli, "serve", "--db", db, "--store", f"file://{tmp / 'data'}",
                "--host", "127.0.0.1", "--port", str(self.port),
                "--kafka-port", str(self.kport), "--authentication", "basic",
                "--log-level", "error",
            ],
            env={**env, "LAKELOG_SUPER_USERS": f"User:{USER}"},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.rest = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.rest}/health", timeout=1).status_code < 500:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        self.auth = {
            "Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        }
        self.cluster = httpx.get(f"{self.rest}/v3/clusters", headers=self.auth).json()["data"][0][
            "cluster_id"
        ]

    def create_topic(self, name: str) -> None:
        r = httpx.post(
            f"{self.rest}/v3/clusters/{self.cluster}/topics",
            json={"topic_name": name, "partitions_count": 1},
            headers=self.auth,
        )
        assert r.status_code == 201, r.text

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Watch:
    """Samples the agent's RSS every 20 ms while an attack runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
            except OSError:
                return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


class Conn:
    def __init__(self, agent: Agent, receive_buffer: int = 0) -> None:
        self.sock = socket.socket()
        if receive_buffer:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(60)
        self.sock.connect(("127.0.0.1", agent.kport))
        self.correlation = 0

    def send(self, body: Any) -> None:
        self.correlation += 1
        self.sock.sendall(request_frame(body, self.correlation, "bench"))

    def call(self, body: Any) -> Any:
        self.send(body)
        return read_answer(self.sock, type(body), self.correlation)

    def login(self) -> None:
        from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
        from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

        assert self.call(SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        token = b"\0" + USER.encode() + b"\0" + PASSWORD.encode()
        assert self.call(SaslAuthenticateRequest(auth_bytes=token)).error_code == 0

    def close(self) -> None:
        self.sock.close()


def produce(conn: Conn, topic: str, batch: bytes) -> int:
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    body = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=_ms(30000),
        topic_data=(
            TopicProduceData(
                name=topic, partition_data=(PartitionProduceData(index=0, records=batch),)
            ),
        ),
    )
    answer = conn.call(body)
    return int(answer.responses[0].partition_responses[0].error_code)


def _ms(n: int) -> Any:
    import datetime

    from kio.static.primitive import i32Timedelta

    return i32Timedelta.parse(datetime.timedelta(milliseconds=n))


def batch_of(value: bytes, codec: int = 0) -> bytes:
    b = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, len(value) + 4096)
    b.append(0, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
    return bytes(b.build())


def fill(agent: Agent, topic: str, size: int) -> None:
    agent.create_topic(topic)
    conn = Conn(agent)
    conn.login()
    chunk = os.urandom(MiB - 1024)
    for _ in range(size // MiB):
        assert produce(conn, topic, batch_of(chunk)) == 0
    conn.close()


def fetch_request(topic: str, max_bytes: int) -> Any:
    from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic

    return FetchRequest(
        replica_id=-1,
        max_wait=_ms(0),
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic=topic,
                partitions=(
                    FetchPartition(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=0,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=max_bytes,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )


def api_versions() -> Any:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    return ApiVersionsRequest(client_software_name="bench", client_software_version="1")


# -- the attacks ----------------------------------------------------------------------------


def frames_before_sasl(agent: Agent) -> dict[str, Any]:
    closed = 0
    payload = bytes(MiB)

    def one() -> None:
        nonlocal closed
        s = socket.create_connection(("127.0.0.1", agent.kport), timeout=60)
        try:
            s.sendall(struct.pack(">i", 100 * MiB))
            for _ in range(100):
                s.sendall(payload)
        except OSError:
            closed += 1
        finally:
            time.sleep(1)
            s.close()

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"connections_closed_early": closed}


def apiversions_unread(agent: Agent) -> dict[str, Any]:
    conn = Conn(agent, receive_buffer=64 * 1024)
    req = request_frame(api_versions(), 1, "bench")
    n, sent = 1_000_000, 0
    # The agent read nothing for this long: it stopped reading (on a loaded machine an
    # agent that reads everything can be slower than that: give it more).
    conn.sock.settimeout(float(os.environ.get("ATTACK_STALL_S", "15")))
    block = req * 1000
    try:
        for _ in range(n // 1000):
            conn.sock.sendall(block)
            sent += 1000
    except OSError:
        pass  # the agent stopped reading: sendall timed out
    time.sleep(3)
    conn.close()
    return {"requests_sent": sent}


def fetch_unread(agent: Agent) -> dict[str, Any]:
    conn = Conn(agent, receive_buffer=64 * 1024)
    conn.login()
    conn.sock.settimeout(20)
    sent = 0
    try:
        for _ in range(10):
            conn.send(fetch_request("fill", 2**31 - 1))
            sent += 1
    except OSError:
        pass
    time.sleep(8)
    conn.close()
    return {"fetches_sent": sent}


def idle_connections(agent: Agent) -> dict[str, Any]:
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    conns = []
    for i in range(1500):
        try:
            c = Conn(agent)
            if i % 2:
                c.call(SaslHandshakeRequest(mechanism="PLAIN"))
            conns.append(c)
        except OSError:
            pass
    time.sleep(35)
    open_ = 0
    for c in conns:
        c.sock.setblocking(False)
        try:
            open_ += c.sock.recv(1) != b""
        except BlockingIOError:
            open_ += 1
        except OSError:
            pass
        c.close()
    return {"opened": len(conns), "open_after_35s": open_}


def zstd_bomb(agent: Agent) -> dict[str, Any]:
    agent.create_topic("bomb")
    bomb = batch_of(bytes(500 * MiB), codec=4)
    conn = Conn(agent)
    conn.login()
    code = produce(conn, "bomb", bomb)
    conn.close()
    end = httpx.get(f"{agent.rest}/topics/bomb/partitions/0/offsets", headers=agent.auth).json()
    return {"batch_bytes": len(bomb), "error_code": code, "stored": end["end_offset"]}


def v3_read_huge(agent: Agent) -> dict[str, Any]:
    r = httpx.get(
        f"{agent.rest}/v3/clusters/{agent.cluster}/topics/fill/partitions/0/records",
        params={"offset": 0, "max_bytes": 10**12},
        headers=agent.auth,
        timeout=300,
    )
    return {"status": r.status_code, "body_mib": round(len(r.content) / MiB, 1)}


def fill_128mib(agent: Agent) -> None:
    fill(agent, "fill", 128 * MiB)


#: What an attack needs in place before the agent's baseline RSS is taken.
PREPARE: dict[str, Callable[[Agent], None]] = {
    "fetch_unread": fill_128mib,
    "v3_read_huge": fill_128mib,
}

ATTACKS: dict[str, Callable[[Agent], dict[str, Any]]] = {
    "frames_before_sasl": frames_before_sasl,
    "apiversions_unread": apiversions_unread,
    "fetch_unread": fetch_unread,
    "idle_connections": idle_connections,
    "zstd_bomb": zstd_bomb,
    "v3_read_huge": v3_read_huge,
}


@contextmanager
def agent() -> Iterator[Agent]:
    with tempfile.TemporaryDirectory() as tmp:
        a = Agent(Path(tmp))
        try:
            yield a
        finally:
            a.stop()


def main(names: list[str]) -> None:
    for name in names or list(ATTACKS):
        with agent() as a:
            if name in PREPARE:
                PREPARE[name](a)
            time.sleep(1)
            baseline = rss_mib(a.proc.pid)
            watch = Watch(a.proc.pid)
            started = time.monotonic()
            try:
                seen: dict[str, Any] = ATTACKS[name](a)
            except Exception as e:  # the attack's failure is a figure too
                seen = {"attack_error": repr(e)[:200]}
            peak = watch.stop()
            alive = a.proc.poll() is None
            after = rss_mib(a.proc.pid) if alive else 0.0
            emit(
                bench="attacks",
                attack=name,
                tree=str(ROOT),
                baseline_rss_mib=round(baseline, 1),
                peak_rss_mib=round(peak, 1),
                after_rss_mib=round(after, 1),
                agent_alive=alive,
                seconds=round(time.monotonic() - started, 1),
                **seen,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
