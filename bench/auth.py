"""What authentication and authorization cost an agent, in-process.

Prints one JSON line per measure:

    {"bench": "argon2", "op": "hash"|"verify", "ms": ...}     argon2id as the store hashes
    {"bench": "scram", "op": "make_auth_info", "ms": ...}      both SCRAM verifiers of a password
    {"bench": "authenticate", "cached": false|true, "per_s": ..., "us": ...}
                                                               Authenticator on a SQLite store
    {"bench": "authorize", "acls": N, "per_s": ..., "us": ...} one decision over N ACLs
    {"bench": "rest", "security": "off"|"basic+acl", "requests_per_s": ..., "ms": ...}
                                                               GET /topics through the app
                                                               (TestClient, one thread)
    {"bench": "kafka", "security": "off"|"sasl+acl", "requests_per_s": ..., "ms": ...}
                                                               Metadata of one topic over one
                                                               connection (a user with DESCRIBE)

Run: ``.venv/bin/python bench/auth.py``; about half a minute.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import struct
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient
from kio.index import load_response_from_request
from kio.serial import entity_reader, entity_writer
from prometheus_client import CollectorRegistry

from coordinator.local import LocalCoordinator
from coordinator.security.logins import AuthMetrics
from coordinator.security.model import AclBinding, Authorizer, Operation, ResourceType
from coordinator.security.store import SqlSecurityStore, password_hasher, scram_credentials
from service.app import create_app
from service.kafka.framing import build, nested, request_class
from service.security.auth import Authenticator
from service.settings import Settings


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def timed(n: int, fn: object) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - start) / n


class KafkaCall:
    """One Kafka connection sending kio requests (SASL/PLAIN first when ``user`` is given)."""

    def __init__(self, port: int, user: str | None = None, password: str = "") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.correlation = 0
        if user is not None:
            self.call(request_class(17, 1), mechanism="PLAIN")
            token = b"\0" + user.encode() + b"\0" + password.encode()
            assert self.call(request_class(36, 2), auth_bytes=token).error_code == 0

    def call(self, cls: type, **fields: object) -> object:
        self.correlation += 1
        out = io.BytesIO()
        header_cls = cls.__header_schema__  # type: ignore[attr-defined]
        entity_writer(header_cls)(
            out,
            header_cls(
                request_api_key=cls.__api_key__,  # type: ignore[attr-defined]
                request_api_version=cls.__version__,  # type: ignore[attr-defined]
                correlation_id=self.correlation,
                client_id="bench",
            ),
        )
        entity_writer(cls)(out, build(cls, **fields))
        self.sock.sendall(struct.pack(">i", out.tell()) + out.getvalue())
        size = struct.unpack(">i", self._read(4))[0]
        frame = self._read(size)
        resp = load_response_from_request(cls)
        _, used = entity_reader(resp.__header_schema__)(frame, 0)
        return entity_reader(resp)(frame, used)[0]

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            data += self.sock.recv(n - len(data))
        return data


def kafka_metadata(tmp: str, db: str) -> None:
    """Metadata requests/s through an agent's Kafka listener, security off and on."""
    meta = request_class(3, 12)
    topic = nested(meta, "MetadataRequestTopic")
    with LocalCoordinator(db) as coord:
        coord.create_topic("bench-t", 1, {})
        store = SqlSecurityStore(coord.db)
        store.create_acls(
            [AclBinding.of("User:alice", "*", "TOPIC", "bench-", "PREFIXED", "DESCRIBE", "ALLOW")]
        )
    for label, extra, user in (
        ("off", {}, None),
        ("sasl+acl", {"authentication": "basic", "authorization": "acl"}, "alice"),
    ):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        settings = Settings(db=db, store=f"file://{tmp}/data", kafka_port=port, **extra)  # type: ignore[arg-type]
        with TestClient(create_app(settings)):
            conn = KafkaCall(port, user, "a-good-password")
            fields = dict(
                topics=(build(topic, topic_id=None, name="bench-t"),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
            answer = conn.call(meta, **fields)
            assert [t.error_code for t in answer.topics] == [0]  # type: ignore[attr-defined]
            for _ in range(50):
                conn.call(meta, **fields)
            n = 2000
            start = time.perf_counter()
            for _ in range(n):
                conn.call(meta, **fields)
            per = (time.perf_counter() - start) / n
            conn.sock.close()
        emit(bench="kafka", security=label, requests_per_s=round(1 / per), ms=round(per * 1e3, 3))


def main() -> None:
    hasher = password_hasher()
    digest = hasher.hash("a-good-password")
    emit(bench="argon2", op="hash", ms=round(timed(5, lambda: hasher.hash("x" * 12)) * 1e3, 2))
    emit(
        bench="argon2",
        op="verify",
        ms=round(timed(5, lambda: hasher.verify(digest, "a-good-password")) * 1e3, 2),
    )
    emit(
        bench="scram",
        op="make_auth_info",
        ms=round(timed(5, lambda: scram_credentials("a-good-password")) * 1e3, 2),
    )
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'meta.db'}"
        with LocalCoordinator(db) as coord:
            store = SqlSecurityStore(coord.db)
            store.create_user("alice", "a-good-password")
            store.create_user("admin", "a-good-password")
            for ttl, n in ((0.0, 10), (60.0, 20000)):
                auth = Authenticator(
                    store,
                    cache_ttl_s=ttl,
                    max_failures=10**9,
                    failure_window_s=60,
                    metrics=AuthMetrics(CollectorRegistry()),
                )

                async def many(a: Authenticator = auth, count: int = n) -> float:
                    start = time.perf_counter()
                    for _ in range(count):
                        await a.authenticate("alice", "a-good-password", "127.0.0.1", "rest")
                    return (time.perf_counter() - start) / count

                per = asyncio.run(many())
                emit(
                    bench="authenticate",
                    cached=ttl > 0,
                    per_s=round(1 / per),
                    us=round(per * 1e6, 1),
                )
            for count in (100, 1000, 10000):
                acls = [
                    AclBinding.of(f"User:u{i}", "*", "TOPIC", f"t{i}-", "PREFIXED", "READ", "ALLOW")
                    for i in range(count)
                ]
                authz = Authorizer(acls, frozenset())
                per = timed(
                    2000,
                    lambda a=authz, c=count: a.authorize(
                        f"User:u{c // 2}", "h", Operation.READ, ResourceType.TOPIC, f"t{c // 2}-x"
                    ),
                )
                emit(bench="authorize", acls=count, per_s=round(1 / per), us=round(per * 1e6, 1))
        headers = {"Authorization": "Basic " + base64.b64encode(b"admin:a-good-password").decode()}
        for label, extra in (
            ("off", {}),
            (
                "basic+acl",
                {"authentication": "basic", "authorization": "acl", "super_users": "User:admin"},
            ),
        ):
            settings = Settings(db=db, store=f"file://{tmp}/data", kafka_port=0, **extra)  # type: ignore[arg-type]
            with TestClient(create_app(settings)) as client:
                for _ in range(50):
                    client.get("/topics", headers=headers)
                n = 1000
                start = time.perf_counter()
                for _ in range(n):
                    client.get("/topics", headers=headers)
                per = (time.perf_counter() - start) / n
            emit(
                bench="rest", security=label, requests_per_s=round(1 / per), ms=round(per * 1e3, 3)
            )
        kafka_metadata(tmp, db)


if __name__ == "__main__":
    main()
