"""The Kafka listener's memory and connection bounds, attacked as a client would, over raw
sockets and with confluent-kafka, against one ``lakelog serve`` with SASL (shared by the
module; small limits so that each is crossed quickly).

DESIGN.md invariant 11: no single request or connection can make an agent hold more than
a stated bound. Each test shows one bound through behaviour: the connection closed (frame
over the pre-authentication limit, idle, not authenticated in time, over the per-address
limit, SASL session expired), the agent no longer reading a connection whose answers are
not read (its unsent bytes stay under the bound and drop to 0 once it closes), a Fetch
answer no larger than ``kafka_fetch_max_bytes``.
"""

from __future__ import annotations

import base64
import contextlib
import re
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from confluent_kafka import Producer

from service.kafka.framing import request_class
from tests.integration.test_kafka_acl import batch
from tests.integration.test_security_processes import start_secured_serve
from tests.kafka_wire import make, read_answer, request_frame
from tests.procs import Proc

PASSWORD = "limits-user-password-1"
OTHER_PASSWORD = "limits-other-password-2"
TOPIC = "limits"
MiB = 1 << 20
UNSENT = 2 * MiB
FETCH_MAX = 1 * MiB
IDLE_MS = 5000
AUTH_TIMEOUT_MS = 3000
REAUTH_MS = 8000
PER_IP = 12
BATCH_VALUE = 400 * 1024  # three of these: 1.2 MiB in the partition
FETCHES = 60
READ_MAX = 1 * MiB  # consumer_request_max_bytes
HEADER_TIMEOUT_S = 2
#: HTTP calls of the tests: the machine is shared, an answer may be slow.
TIMEOUT = 60


@dataclass
class Served:
    rest: str
    bootstrap: str
    db: str
    proc: Proc

    def metric(self, name: str) -> float:
        """The sum of one metric's samples at ``/metrics`` (0 when absent)."""
        text = httpx.get(f"{self.rest}/metrics", headers=basic(), timeout=TIMEOUT).text
        total = 0.0
        found = False
        for line in text.splitlines():
            m = re.match(rf"{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", line)
            if m:
                total += float(m.group(1))
                found = True
        assert found, f"{name} is not exported at /metrics"
        return total

    def closed(self, reason: str) -> float:
        text = httpx.get(f"{self.rest}/metrics", headers=basic(), timeout=TIMEOUT).text
        m = re.search(rf'lakelog_kafka_connections_closed_total\{{reason="{reason}"\}} (\S+)', text)
        return float(m.group(1)) if m else 0.0


def basic(user: str = "kuser", password: str = PASSWORD) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def cluster_id(rest: str) -> str:
    r = httpx.get(f"{rest}/v3/clusters", headers=basic(), timeout=TIMEOUT)
    return str(r.json()["data"][0]["cluster_id"])


def create_user(rest: str, name: str, password: str) -> None:
    r = httpx.post(
        f"{rest}/security/users",
        json={"name": name, "password": password},
        headers=basic(),
        timeout=TIMEOUT,
    )
    assert r.status_code < 300, r.text


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp: Path = tmp_path_factory.mktemp("kafka-limits")
    proc, port, kport = start_secured_serve(
        tmp,
        "kuser",
        PASSWORD,
        {
            "LAKELOG_AUTH_MAX_FAILURES": "1000000",
            "LAKELOG_SUPER_USERS": "User:kuser",
            "LAKELOG_KAFKA_MAX_UNSENT_BYTES": str(UNSENT),
            "LAKELOG_KAFKA_FETCH_MAX_BYTES": str(FETCH_MAX),
            "LAKELOG_KAFKA_CONNECTIONS_MAX_IDLE_MS": str(IDLE_MS),
            "LAKELOG_KAFKA_AUTHENTICATION_TIMEOUT_MS": str(AUTH_TIMEOUT_MS),
            "LAKELOG_KAFKA_CONNECTIONS_MAX_REAUTH_MS": str(REAUTH_MS),
            "LAKELOG_KAFKA_MAX_CONNECTIONS_PER_IP": str(PER_IP),
            "LAKELOG_CONSUMER_REQUEST_MAX_BYTES": str(READ_MAX),
            "LAKELOG_HTTP_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        },
    )
    db = f"sqlite:///{tmp / 'meta.db'}"
    try:
        rest = f"http://127.0.0.1:{port}"
        create_user(rest, "other", OTHER_PASSWORD)
        served = Served(rest, f"127.0.0.1:{kport}", db, proc)
        create_topic(served, TOPIC)
        with Conn(served) as c:
            c.login()
            for _ in range(3):
                answer = c.produce((TOPIC, batch(b"v" * BATCH_VALUE)))
                assert answer.responses[0].partition_responses[0].error_code == 0
        yield served
    finally:
        proc.stop()


class Conn:
    """A bare Kafka connection speaking kio's messages."""

    def __init__(self, served: Served, receive_buffer: int = 0) -> None:
        host, port = served.bootstrap.rsplit(":", 1)
        self.sock = socket.socket()
        if receive_buffer:  # a fixed small buffer: the kernel cannot absorb the answers
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(30)
        self.sock.connect((host, int(port)))
        self.correlation = 0
        self.sent: list[tuple[int, type]] = []

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def login(self, user: str = "kuser", password: str = PASSWORD) -> Any:
        """SaslHandshake + SaslAuthenticate v2 with PLAIN; returns the authenticate answer."""
        assert self.call(17, 1, mechanism="PLAIN").error_code == 0
        token = b"\0" + user.encode() + b"\0" + password.encode()
        return self.call(36, 2, auth_bytes=token)

    def encode(self, api_key: int, version: int, padding: int = 0, **given: Any) -> bytes:
        """One request frame; ``padding`` bytes after the body (brokers ignore them)."""
        cls = request_class(api_key, version)
        self.correlation += 1
        self.sent.append((self.correlation, cls))
        return request_frame(make(cls, **given), self.correlation, "limits", padding)

    def send(self, api_key: int, version: int, padding: int = 0, **given: Any) -> None:
        self.sock.sendall(self.encode(api_key, version, padding, **given))

    def receive(self) -> Any:
        """The answer to the oldest request not yet answered."""
        correlation, cls = self.sent.pop(0)
        return read_answer(self.sock, cls, correlation)

    def call(self, api_key: int, version: int | None = None, **given: Any) -> Any:
        self.send(api_key, version if version is not None else _HIGHEST[api_key], **given)
        return self.receive()

    def produce(self, *batches: tuple[str, bytes]) -> Any:
        """One Produce (acks=all) of each (topic, records) to its partition 0: the answer."""
        topic_data = [
            {"name": topic, "partition_data": [{"index": 0, "records": records}]}
            for topic, records in batches
        ]
        return self.call(0, acks=-1, timeout=10000, topic_data=topic_data)

    def closed_within(self, seconds: float) -> bool:
        """Whether the agent closes the connection within ``seconds`` (answers in between
        are read and dropped)."""
        self.sock.settimeout(seconds)
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                if not self.sock.recv(65536):
                    return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        return False


_HIGHEST = {0: 9, 1: 12, 3: 12, 18: 3}


def fetch_request(max_bytes: int, partition_max_bytes: int) -> dict[str, Any]:
    return {
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "topics": [
            {
                "topic": TOPIC,
                "partitions": [
                    {
                        "partition": 0,
                        "fetch_offset": 0,
                        "partition_max_bytes": partition_max_bytes,
                        "log_start_offset": -1,
                    }
                ],
            }
        ],
    }


def records_of(fetch_answer: Any) -> bytes:
    part = fetch_answer.responses[0].partitions[0]
    assert part.error_code == 0
    return bytes(part.records or b"")


# -- frames before and after authentication ----------------------------------------------


def test_a_big_frame_before_sasl_closes_the_connection_at_once(served: Served) -> None:
    """A frame announcing 100 MiB before SASL is refused from its size alone (Kafka's
    sasl.server.max.receive.size, 512 KiB): the agent closes without reading its body."""
    before = served.closed("frame_too_large")
    with Conn(served) as c:
        c.sock.sendall(struct.pack(">i", 100 * MiB) + b"\0" * 4096)
        assert c.closed_within(5)
    with Conn(served) as c:  # 600 KiB: over the pre-authentication limit too
        c.send(18, 3, padding=600 * 1024, client_software_name="x", client_software_version="1")
        assert c.closed_within(5)
    assert served.closed("frame_too_large") >= before + 2


def test_after_sasl_the_normal_request_limit_applies(served: Served) -> None:
    """Once authenticated, a 600 KiB request is read and answered."""
    with Conn(served) as c:
        c.login()
        c.send(3, 12, padding=600 * 1024, topics=[{"name": TOPIC}])
        answer = c.receive()
        assert [t.name for t in answer.topics] == [TOPIC]


# -- back-pressure ------------------------------------------------------------------------


def test_a_client_that_does_not_read_is_no_longer_read(served: Served) -> None:
    """Race: a client pipelines 60 Fetches (each answered with ~1 MiB) and reads nothing.

    Expected: the agent stops reading that connection once its unsent answers pass
    ``kafka_max_unsent_bytes`` (2 MiB here), so it holds about that plus one answer, not
    60 MiB (less what the kernel's socket buffers take); the answers are still all
    delivered, in order, once the client reads; and a connection closed with answers
    unsent leaves nothing held."""
    paused = served.metric("lakelog_kafka_reads_paused_total")
    with Conn(served, receive_buffer=64 * 1024) as c:
        c.login()
        for _ in range(FETCHES):
            c.send(1, 12, **fetch_request(2**31 - 1, 2**31 - 1))
        time.sleep(1.5)  # under the idle timeout: a client that reads nothing is idle too
        held = served.metric("lakelog_kafka_unsent_bytes")
        assert 0 < held <= UNSENT + FETCH_MAX + 64 * 1024
        assert served.metric("lakelog_kafka_reads_paused_total") > paused
        for _ in range(FETCHES):
            assert len(records_of(c.receive())) > BATCH_VALUE
    with Conn(served, receive_buffer=64 * 1024) as c:
        c.login()
        for _ in range(FETCHES):
            c.send(1, 12, **fetch_request(2**31 - 1, 2**31 - 1))
        time.sleep(1)
        assert served.metric("lakelog_kafka_unsent_bytes") > 0
    deadline = time.monotonic() + 10
    while served.metric("lakelog_kafka_unsent_bytes") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert served.metric("lakelog_kafka_unsent_bytes") == 0


# -- Fetch sizes --------------------------------------------------------------------------


def test_fetch_max_bytes_is_capped_by_the_agent(served: Served) -> None:
    """Fetch max_bytes 2^31-1 gets at most ``kafka_fetch_max_bytes`` of batches (Kafka's
    fetch.max.bytes); partition_max_bytes is honoured below it."""
    with Conn(served) as c:
        c.login()
        whole = records_of(c.call(1, 12, **fetch_request(2**31 - 1, 2**31 - 1)))
        assert BATCH_VALUE < len(whole) <= FETCH_MAX
        one = records_of(c.call(1, 12, **fetch_request(2**31 - 1, BATCH_VALUE + 1024)))
        assert BATCH_VALUE < len(one) < 2 * BATCH_VALUE


# -- idle, unauthenticated and too many connections --------------------------------------


def test_an_idle_connection_is_closed(served: Served) -> None:
    """connections.max.idle.ms (5 s here): silence closes; a request now and then keeps
    the connection."""
    before = served.closed("idle")
    with Conn(served) as c:
        c.login()
        for _ in range(4):  # 6 s of traffic (inside the 8 s session), never 5 s of silence
            time.sleep(1.5)
            c.call(18, 3, client_software_name="x", client_software_version="1")
        assert c.closed_within(IDLE_MS / 1000 + 3)
    assert served.closed("idle") >= before + 1


def test_a_connection_that_does_not_authenticate_is_closed(served: Served) -> None:
    """A client that keeps sending ApiVersions but never completes SASL is closed after
    the authentication timeout (3 s here), busy or not."""
    before = served.closed("authentication_timeout")
    with Conn(served) as c:
        c.call(18, 3, client_software_name="x", client_software_version="1")
        assert c.call(17, 1, mechanism="PLAIN").error_code == 0  # half-authenticated
        deadline = time.monotonic() + AUTH_TIMEOUT_MS / 1000 + 3
        closed = False
        while not closed and time.monotonic() < deadline:
            try:
                c.sock.settimeout(2)
                c.send(18, 3, client_software_name="x", client_software_version="1")
                c.receive()
                time.sleep(0.5)
            except (ConnectionError, TimeoutError):
                closed = True
        assert closed
    assert served.closed("authentication_timeout") >= before + 1


def test_connections_per_address_are_limited(served: Served) -> None:
    """max.connections.per.ip (12 here): the 13th connection from one address is closed
    at once; once one closes, a new one is served."""
    conns = [Conn(served) for _ in range(PER_IP)]
    try:
        for c in conns:
            c.call(18, 3, client_software_name="x", client_software_version="1")
        with Conn(served) as extra:
            assert extra.closed_within(5)
        conns.pop().sock.close()
        time.sleep(0.5)
        with Conn(served) as again:
            assert again.call(18, 3, client_software_name="x", client_software_version="1")
    finally:
        for c in conns:
            c.sock.close()
    assert served.closed("too_many_connections") >= 1


# -- KIP-368: session lifetime and re-authentication -------------------------------------


def _lifetime_ms(answer: Any) -> int:
    return round(answer.session_lifetime.total_seconds() * 1000)


def test_sessions_expire_unless_the_client_reauthenticates(served: Served) -> None:
    """SaslAuthenticate answers the session lifetime (8 s here); a client that logs in
    again in time goes on; one that does not is closed at its next request. (A request
    every 3 s keeps the connections from being idle, 5 s here.)"""

    def keep_alive(c: Conn) -> None:
        c.call(18, 3, client_software_name="x", client_software_version="1")

    with Conn(served) as c:
        first = c.login()
        assert first.error_code == 0 and 0 < _lifetime_ms(first) <= REAUTH_MS
        time.sleep(3)
        again = c.login()  # re-authentication on the same connection (KIP-368)
        assert again.error_code == 0 and _lifetime_ms(again) > 0
        time.sleep(3)
        keep_alive(c)
        time.sleep(3)  # past the first session's end, inside the second's
        assert c.call(3, 12, topics=[{"name": TOPIC}]).topics[0].error_code == 0
    before = served.closed("session_expired")
    with Conn(served) as c:
        c.login()
        for _ in range(2):
            time.sleep(3)
            keep_alive(c)
        time.sleep(REAUTH_MS / 1000 - 6 + 0.5)
        c.send(3, 12, topics=[{"name": TOPIC}])
        assert c.closed_within(5)
    assert served.closed("session_expired") >= before + 1


def test_reauthentication_as_another_user_closes_the_connection(served: Served) -> None:
    """Kafka refuses a re-authentication that changes the principal."""
    with Conn(served) as c:
        c.login()
        answer = c.login("other", OTHER_PASSWORD)
        assert answer.error_code != 0
        assert c.closed_within(5)


def test_a_deleted_user_loses_its_kafka_connection(served: Served) -> None:
    """A user deleted while connected: its re-authentication fails, so its connection
    ends within one session lifetime (8 s here) instead of living on."""
    create_user(served.rest, "leaver", "leaver-password-3")
    with Conn(served) as c:
        c.login("leaver", "leaver-password-3")
        gone = httpx.delete(
            f"{served.rest}/security/users/leaver", headers=basic(), timeout=TIMEOUT
        )
        assert gone.status_code < 300, gone.text
        time.sleep(1.5)
        assert c.login("leaver", "leaver-password-3").error_code != 0
        assert c.closed_within(5)


def test_librdkafka_reauthenticates_across_session_lifetimes(served: Served) -> None:
    """A confluent-kafka producer keeps producing over several 8 s sessions: it logs in
    again on its connection when the agent says its session ends (KIP-368)."""
    expired = served.closed("session_expired")
    errors: list[Any] = []
    p = Producer(
        {
            "bootstrap.servers": served.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "kuser",
            "sasl.password": PASSWORD,
            "error_cb": errors.append,
        }
    )
    delivered: list[Any] = []
    for i in range(7):
        p.produce(TOPIC, value=b"r%d" % i, on_delivery=lambda e, m: delivered.append(e))
        assert p.flush(30) == 0
        time.sleep(3)
    assert delivered == [None] * 7
    assert not [e for e in errors if "auth" in str(e).lower()], errors
    # It logged in again on its connections: the agent closed none of them as expired.
    assert served.closed("session_expired") == expired


# -- decompression bombs ------------------------------------------------------------------


def bomb(size: int, codec: int) -> bytes:
    """One record of ``size`` zero bytes in a batch compressed with ``codec`` (4 zstd, 3
    lz4, 1 gzip): a few KiB on the wire."""
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=size + 1024,
    )
    b.append(0, timestamp=int(time.time() * 1000), key=None, value=bytes(size), headers=[])
    return bytes(b.build())


def create_topic(served: Served, topic: str, configs: dict[str, str] | None = None) -> str:
    """A one-partition topic with ``configs``, made by the super user; returns the cluster id."""
    cid = cluster_id(served.rest)
    body: dict[str, Any] = {"topic_name": topic, "partitions_count": 1}
    if configs:
        body["configs"] = [{"name": k, "value": v} for k, v in configs.items()]
    r = httpx.post(
        f"{served.rest}/v3/clusters/{cid}/topics", json=body, headers=basic(), timeout=TIMEOUT
    )
    assert r.status_code == 201, r.text
    return cid


def end_offset(served: Served, topic: str = TOPIC) -> int:
    r = httpx.get(
        f"{served.rest}/topics/{topic}/partitions/0/offsets", headers=basic(), timeout=TIMEOUT
    )
    assert r.status_code == 200, r.text
    return int(r.json()["end_offset"])


@pytest.mark.parametrize("codec", [4, 3, 1], ids=["zstd", "lz4", "gzip"])
def test_a_decompression_bomb_is_refused_and_nothing_stored(served: Served, codec: int) -> None:
    """A few-KiB batch whose one record is 40 MiB of zeros (over the default
    lakelog.max.decompressed.bytes, 32 MiB, though far under max.message.bytes as stored)
    is refused with MESSAGE_TOO_LARGE; a good batch in the same request is stored; the
    agent goes on serving."""
    payload = bomb(40 * MiB, codec)
    assert len(payload) < 256 * 1024
    before = end_offset(served)
    with Conn(served) as c:
        c.login()
        answer = c.produce((TOPIC, payload), ("bomb-neighbour", payload))
        parts = {t.name: t.partition_responses[0] for t in answer.responses}
        assert parts[TOPIC].error_code == 10  # MESSAGE_TOO_LARGE
        assert "lakelog.max.decompressed.bytes" in (parts[TOPIC].error_message or "")
    assert end_offset(served) == before


def test_a_stored_bomb_fails_its_reads_clearly(served: Served) -> None:
    """A batch stored under a higher bound (as a bomb stored before the bound existed),
    read after the topic's bound is lowered: REST reads of it fail with an error naming the
    config instead of inflating it; Kafka Fetch still serves it as stored (Kafka never
    decompresses); raising the bound again reads it."""
    topic = "stored-bomb"
    cid = create_topic(served, topic, {"lakelog.max.decompressed.bytes": str(64 * MiB)})
    with Conn(served) as c:
        c.login()
        answer = c.produce((topic, bomb(40 * MiB, 4)))
        assert answer.responses[0].partition_responses[0].error_code == 0
    config = (
        f"{served.rest}/v3/clusters/{cid}/topics/{topic}/configs/lakelog.max.decompressed.bytes"
    )
    assert (
        httpx.put(
            config, json={"value": str(8 * MiB)}, headers=basic(), timeout=TIMEOUT
        ).status_code
        == 204
    )
    time.sleep(2.5)  # the agent's topic metadata cache (metadata_ttl_s 2 s)
    read = f"{served.rest}/v3/clusters/{cid}/topics/{topic}/partitions/0/records"
    r = httpx.get(read, params={"offset": 0}, headers=basic(), timeout=TIMEOUT)
    assert r.status_code == 500, r.text
    assert r.json()["error_code"] == 50002
    assert "lakelog.max.decompressed.bytes" in r.json()["message"]
    with Conn(served) as c:  # Kafka Fetch serves the batch as stored
        c.login()
        fetched = c.call(1, 12, **{**fetch_request(FETCH_MAX, FETCH_MAX), "topics": [
            {"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": FETCH_MAX,
                 "log_start_offset": -1}]}]})  # fmt: skip
        assert 0 < len(records_of(fetched)) < 256 * 1024
    assert (
        httpx.put(
            config, json={"value": str(64 * MiB)}, headers=basic(), timeout=TIMEOUT
        ).status_code
        == 204
    )
    time.sleep(2.5)
    r = httpx.get(read, params={"offset": 0, "max_bytes": 1}, headers=basic(), timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["records"][0]["offset"] == 0


def test_rest_records_over_a_lowered_bound_are_refused(served: Served) -> None:
    """REST writes uncompressed batches of its own: a record over the topic's
    lakelog.max.decompressed.bytes (set below max.message.bytes) gets 413, nothing stored."""
    topic = "rest-bound"
    create_topic(
        served,
        topic,
        {"max.message.bytes": str(8 * MiB), "lakelog.max.decompressed.bytes": str(2 * MiB)},
    )
    value = base64.b64encode(bytes(3 * MiB)).decode()
    r = httpx.post(
        f"{served.rest}/topics/{topic}",
        json={"records": [{"value": value}]},
        headers={**basic(), "Content-Type": "application/vnd.kafka.binary.v2+json"},
        timeout=TIMEOUT,
    )
    assert r.status_code == 413, r.text
    assert r.json()["error_code"] == 413
    assert "lakelog.max.decompressed.bytes (2097152)" in r.json()["message"]
    assert end_offset(served, topic) == 0


# -- REST read sizes ----------------------------------------------------------------------


def _value_bytes(records: list[dict[str, Any]]) -> int:
    return sum(len(base64.b64decode(r["value"] or "")) for r in records)


def test_rest_reads_are_capped_whatever_max_bytes_asks(served: Served) -> None:
    """v3 read and v2 consumer fetch with max_bytes=10^12 return at most
    consumer_request_max_bytes (1 MiB here) of keys and values, as kafka-rest caps a
    client's max_bytes; a smaller max_bytes still lowers it."""
    cid = cluster_id(served.rest)
    read = f"{served.rest}/v3/clusters/{cid}/topics/{TOPIC}/partitions/0/records"
    r = httpx.get(read, params={"offset": 0, "max_bytes": 10**12}, headers=basic(), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert 0 < _value_bytes(r.json()["records"]) <= READ_MAX
    r = httpx.get(read, params={"offset": 0, "max_bytes": 1}, headers=basic(), timeout=TIMEOUT)
    assert len(r.json()["records"]) == 1

    v2 = {**basic(), "Content-Type": "application/vnd.kafka.v2+json"}
    base = f"{served.rest}/consumers/cap-group"
    r = httpx.post(base, json={"name": "c1", "format": "binary"}, headers=v2, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    inst = f"{base}/instances/c1"
    try:
        r = httpx.post(
            f"{inst}/assignments",
            json={"partitions": [{"topic": TOPIC, "partition": 0}]},
            headers=v2,
            timeout=TIMEOUT,
        )
        assert r.status_code == 204, r.text
        r = httpx.post(
            f"{inst}/positions",
            json={"offsets": [{"topic": TOPIC, "partition": 0, "offset": 0}]},
            headers=v2,
            timeout=TIMEOUT,
        )
        assert r.status_code == 204, r.text
        got = httpx.get(
            f"{inst}/records",
            params={"max_bytes": 10**12, "timeout": 3000},
            headers={**basic(), "Accept": "application/vnd.kafka.binary.v2+json"},
            timeout=30,
        )
        assert got.status_code == 200, got.text
        assert 0 < _value_bytes(got.json()) <= READ_MAX
    finally:
        httpx.delete(inst, headers=v2, timeout=TIMEOUT)


# -- group timeouts -----------------------------------------------------------------------


def _join(c: Conn, group: str, session_ms: int, rebalance_ms: int) -> Any:
    return c.call(
        11,
        5,
        group_id=group,
        session_timeout=session_ms,
        rebalance_timeout=rebalance_ms,
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[{"name": "range", "metadata": b""}],
    )


def test_join_group_session_timeouts_are_bounded(served: Served) -> None:
    """Kafka's group.min/max.session.timeout.ms (6 s, 30 min): a JoinGroup outside them
    gets INVALID_SESSION_TIMEOUT (26); a rebalance timeout of 2^31-1 ms is cut, not
    refused, and the join completes."""
    with Conn(served) as c:
        c.login()
        assert _join(c, "bounded", 1000, 1000).error_code == 26
        assert _join(c, "bounded", 2**31 - 1, 10_000).error_code == 26
        first = _join(c, "bounded", 10_000, 2**31 - 1)
        if first.error_code == 79:  # MEMBER_ID_REQUIRED (v4+): join again with the id
            first = c.call(
                11,
                5,
                group_id="bounded",
                session_timeout=10_000,
                rebalance_timeout=2**31 - 1,
                member_id=first.member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocols=[{"name": "range", "metadata": b""}],
            )
        assert first.error_code == 0, first


def test_rest_consumer_session_timeout_is_bounded(served: Served) -> None:
    """A REST consumer instance asking for a session timeout over
    group.max.session.timeout.ms is refused (422)."""
    v2 = {**basic(), "Content-Type": "application/vnd.kafka.v2+json"}
    r = httpx.post(
        f"{served.rest}/consumers/long-session",
        json={"name": "c", "format": "binary", "session.timeout.ms": str(2**31 - 1)},
        headers=v2,
        timeout=TIMEOUT,
    )
    assert r.status_code == 422, r.text
    assert "group.max.session.timeout.ms" in r.json()["message"]


# -- slow HTTP clients --------------------------------------------------------------------


def test_a_slow_http_request_head_is_cut_off(served: Served) -> None:
    """A client that sends its request head a byte at a time (slowloris) is closed
    http_header_timeout_s (2 s here) after it connected; a request that is being served
    (a long-poll longer than that) is not cut."""
    host, port = served.rest.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /v3/clusters HTTP/1.1\r\nHost: x\r\n")
        closed = False
        deadline = time.monotonic() + HEADER_TIMEOUT_S + 4
        while not closed and time.monotonic() < deadline:
            try:
                sock.sendall(b"X")
                time.sleep(0.5)
            except OSError:
                closed = True
                break
            sock.settimeout(0.01)
            with contextlib.suppress(TimeoutError):
                closed = sock.recv(1024) == b""
        assert closed
    cid = cluster_id(served.rest)
    read = f"{served.rest}/v3/clusters/{cid}/topics/{TOPIC}/partitions/0/records"
    end = end_offset(served)
    started = time.monotonic()
    r = httpx.get(
        read, params={"offset": end, "timeout_ms": 3500}, headers=basic(), timeout=TIMEOUT
    )
    assert r.status_code == 200, r.text
    assert r.json()["records"] == [] and time.monotonic() - started >= 3
