"""One behaviour suite for every ObjectStore: memory://, file:// and s3:// (a moto server).

Then what only S3 has: prefixes shared with other stores in one bucket, and the
translation of botocore's errors (missing bucket, nothing listening, 5xx retried).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest

from segments.errors import (
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
    StorageUnavailableError,
)
from segments.localfs import FileStore
from segments.memory import MemoryStore
from segments.s3 import S3Store
from segments.store import ObjectStore, open_store
from tests.procs import free_port

pytestmark = pytest.mark.integration

STORE_KINDS = ["memory", "file", "s3"]


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    """Each implementation, opened through ``open_store``'s scheme table."""
    if request.param == "memory":
        s = open_store("memory://")
        assert isinstance(s, MemoryStore)
    elif request.param == "file":
        s = open_store(f"file://{tmp_path / 'store'}")
        assert isinstance(s, FileStore)
    else:
        s = open_store(
            request.getfixturevalue("s3_url"),
            endpoint_url=request.getfixturevalue("moto_endpoint"),
        )
        assert isinstance(s, S3Store)
    try:
        yield s
    finally:
        s.close()


def keys(store: ObjectStore, prefix: str = "") -> list[str]:
    return [info.key for info in store.list(prefix)]


# --- the contract every store keeps ---------------------------------------------------------


def test_put_get_round_trip(store: ObjectStore) -> None:
    store.put("k", b"hello")
    assert store.get("k") == b"hello"


def test_get_missing_key_raises_not_found(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError):
        store.get("nope")
    with pytest.raises(ObjectNotFoundError):
        store.get_range("nope", 0, 10)
    with pytest.raises(ObjectNotFoundError):
        store.get_range("nope", 0, 0)


def test_get_range(store: ObjectStore) -> None:
    store.put("r", b"0123456789")
    assert store.get_range("r", 3, 4) == b"3456"  # middle
    assert store.get_range("r", 6, 4) == b"6789"  # exactly to the end
    assert store.get_range("r", 0, 10) == b"0123456789"  # the whole object
    assert store.get_range("r", 8, 100) == b"89"  # past the end: the shorter tail
    assert store.get_range("r", 10, 5) == b""  # starts at the end
    assert store.get_range("r", 50, 5) == b""  # starts past the end
    assert store.get_range("r", 4, 0) == b""
    with pytest.raises(ValueError):
        store.get_range("r", -1, 3)


def test_put_if_none_match(store: ObjectStore) -> None:
    store.put("c", b"first", if_none_match=True)  # absent: the conditional put succeeds
    with pytest.raises(PreconditionFailedError):
        store.put("c", b"second", if_none_match=True)
    assert store.get("c") == b"first"


def test_head(store: ObjectStore) -> None:
    before = time.time()
    store.put("h/obj", b"x" * 1234)
    info = store.head("h/obj")
    assert info.key == "h/obj"
    assert info.size == 1234
    # S3 keeps whole seconds; the store may sit on another clock, so allow slack.
    assert before - 5 <= info.last_modified <= time.time() + 5
    with pytest.raises(ObjectNotFoundError):
        store.head("h/missing")


def test_list_by_prefix_in_key_order(store: ObjectStore) -> None:
    # "a.c" sorts before "a/1" ('.' < '/'): a file store walking directories must agree.
    written = ["b/1", "a/2", "ab", "a/10", "a.c", "a/1", "a/sub/x"]
    for i, k in enumerate(written):
        store.put(k, b"v" * i)
    assert keys(store) == sorted(written)
    assert keys(store, "a/") == ["a/1", "a/10", "a/2", "a/sub/x"]
    assert keys(store, "a") == ["a.c", "a/1", "a/10", "a/2", "a/sub/x", "ab"]
    assert keys(store, "a/1") == ["a/1", "a/10"]
    assert keys(store, "a/s") == ["a/sub/x"]
    assert keys(store, "zzz") == []
    assert keys(store, "a/sub/x/") == []
    sizes = {info.key: info.size for info in store.list()}
    assert sizes == {k: i for i, k in enumerate(written)}


def test_delete(store: ObjectStore) -> None:
    store.put("d/1", b"one")
    store.put("d/2", b"two")
    store.delete("d/1")
    with pytest.raises(ObjectNotFoundError):
        store.get("d/1")
    with pytest.raises(ObjectNotFoundError):
        store.head("d/1")
    assert keys(store, "d/") == ["d/2"]
    store.delete("d/1")  # again: not an error
    store.delete("never/was")
    assert store.get("d/2") == b"two"


def test_delete_many_crosses_the_batch_limit(store: ObjectStore) -> None:
    """1,001 keys (S3's DeleteObjects takes 1,000 a request), most of them missing (no
    error): those that exist, in both requests, are gone; the key beside them stays."""
    every = [f"m/{i:05d}" for i in range(1_001)]
    written = [every[0], every[499], every[999], every[1_000]]
    for k in written:
        store.put(k, b"x")
    store.put("m-keep", b"kept")
    sizes: list[int] = []  # S3: keys per DeleteObjects request (moto takes more than S3)
    if isinstance(store, S3Store):
        store._client.meta.events.register(
            "before-parameter-build.s3.DeleteObjects",
            lambda params, **_: sizes.append(len(params["Delete"]["Objects"])),
        )
    store.delete_many(every)
    assert sizes == ([1_000, 1] if isinstance(store, S3Store) else [])
    assert keys(store, "m/") == []
    assert store.get("m-keep") == b"kept"
    store.delete_many([])


def test_overwrite_without_condition(store: ObjectStore) -> None:
    store.put("o", b"old value, longer")
    store.put("o", b"new")
    assert store.get("o") == b"new"
    assert store.head("o").size == 3


def test_empty_object(store: ObjectStore) -> None:
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.get_range("empty", 0, 10) == b""
    assert store.head("empty").size == 0
    assert [(i.key, i.size) for i in store.list()] == [("empty", 0)]


def test_binary_data_with_every_byte_value(store: ObjectStore) -> None:
    data = bytes(range(256)) * 64 + b"\r\n\x00"
    store.put("bin", data)
    assert store.get("bin") == data
    assert store.get_range("bin", 250, 12) == data[250:262]


def test_keys_with_slashes(store: ObjectStore) -> None:
    seg = "segments/3f/01J9ZXA4V6N2Q8R5T7W0Y1B3C5.seg"
    tier = "tiered/orders/partition=0/0-999.parquet"
    store.put(seg, b"segment")
    store.put(tier, b"parquet")
    assert store.get(seg) == b"segment"
    assert store.get(tier) == b"parquet"
    assert keys(store, "segments/") == [seg]
    assert keys(store, "tiered/orders/partition=0/") == [tier]


@pytest.mark.parametrize("bad", ["", "../x", "a/../../b", "/abs", "a//b", "a/", ".", "a\0b"])
def test_invalid_keys_rejected(store: ObjectStore, bad: str) -> None:
    """Keys that could escape a root or have no file-system form fail the same everywhere."""
    with pytest.raises(ValueError):
        store.put(bad, b"x")
    with pytest.raises(ValueError):
        store.get(bad)
    assert keys(store) == []


# --- S3 only ---------------------------------------------------------------------------------


def test_s3_keys_are_relative_to_the_store_prefix(moto_endpoint: str, s3_bucket: str) -> None:
    """Two prefixes in one bucket are two stores; callers never see the prefix."""
    one = S3Store(s3_bucket, "one", endpoint_url=moto_endpoint)
    two = S3Store(s3_bucket, "/two/deeper/", endpoint_url=moto_endpoint)
    root = S3Store(s3_bucket, endpoint_url=moto_endpoint)
    try:
        one.put("k", b"1")
        two.put("k", b"2")
        assert one.get("k") == b"1"
        assert two.get("k") == b"2"
        assert keys(one) == ["k"]
        assert keys(two) == ["k"]
        assert keys(root) == ["one/k", "two/deeper/k"]
        raw = boto3.client("s3", endpoint_url=moto_endpoint)
        assert raw.get_object(Bucket=s3_bucket, Key="two/deeper/k")["Body"].read() == b"2"
        assert two.url == f"s3://{s3_bucket}/two/deeper"
    finally:
        for s in (one, two, root):
            s.close()


def test_s3_missing_bucket_raises_storage_error(moto_endpoint: str) -> None:
    store = S3Store("lakelog-no-such-bucket", endpoint_url=moto_endpoint, max_attempts=1)
    try:
        for op in (
            lambda: store.put("k", b"x"),
            lambda: store.get("k"),
            lambda: store.get_range("k", 0, 4),
            lambda: list(store.list()),
            lambda: store.delete("k"),
        ):
            with pytest.raises(StorageError) as info:
                op()
            # Exactly StorageError: neither "not found" (the key) nor retriable.
            assert type(info.value) is StorageError
            assert "lakelog-no-such-bucket" in str(info.value)
            assert not info.value.retriable
    finally:
        store.close()


def test_s3_nothing_listening_raises_unavailable_quickly() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    store = S3Store(
        "bucket", endpoint_url=endpoint, max_attempts=2, connect_timeout=0.5, read_timeout=0.5
    )
    try:
        started = time.monotonic()
        with pytest.raises(StorageUnavailableError) as info:
            store.get("k")
        assert info.value.retriable
        with pytest.raises(StorageUnavailableError):
            store.put("k", b"x")
        with pytest.raises(StorageUnavailableError):
            list(store.list())
        assert time.monotonic() - started < 10
    finally:
        store.close()


class _FakeS3(ThreadingHTTPServer):
    """Answers the first ``fail`` requests with ``status`` (an S3 error body), then 200 b"ok"."""

    daemon_threads = True

    def __init__(self, status: int, code: str, fail: int) -> None:
        super().__init__(("127.0.0.1", 0), _FakeS3Handler)
        self.status, self.code, self.fail = status, code, fail
        self.requests = 0
        self.lock = threading.Lock()


class _FakeS3Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _FakeS3

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with self.server.lock:
            self.server.requests += 1
            failing = self.server.requests <= self.server.fail
        if failing:
            body = (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{self.server.code}</Code>"
                "<Message>injected</Message></Error>"
            ).encode()
            self.send_response(self.server.status)
            self.send_header("Content-Type", "application/xml")
        else:
            body = b"ok"
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_DELETE = _answer

    def do_POST(self) -> None:
        """DeleteObjects: 200 with every key refused (what S3 answers for keys a
        policy denies)."""
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.requests += 1
        body = (
            b"<?xml version='1.0' encoding='UTF-8'?><DeleteResult>"
            b"<Error><Key>a</Key><Code>AccessDenied</Code><Message>no</Message></Error>"
            b"</DeleteResult>"
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake_s3(request: pytest.FixtureRequest) -> Iterator[_FakeS3]:
    status, code, fail = request.param
    server = _FakeS3(status, code, fail)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def _fake_store(server: _FakeS3, max_attempts: int) -> Iterator[S3Store]:
    """An S3Store of ``server``'s, closed afterwards."""
    host, port = server.server_address[:2]
    store = S3Store(
        "bucket",
        endpoint_url=f"http://{host!s}:{port}",
        max_attempts=max_attempts,
        connect_timeout=1,
        read_timeout=1,
    )
    try:
        yield store
    finally:
        store.close()


@pytest.mark.parametrize("fake_s3", [(503, "SlowDown", 1000)], indirect=True)
def test_s3_5xx_is_retried_then_unavailable(fake_s3: _FakeS3) -> None:
    """Every answer is 503: botocore tries max_attempts times, then StorageUnavailableError."""
    with _fake_store(fake_s3, max_attempts=3) as store:
        with pytest.raises(StorageUnavailableError) as info:
            store.get("k")
        assert fake_s3.requests == 3
        assert "SlowDown" in str(info.value)


@pytest.mark.parametrize("fake_s3", [(500, "InternalError", 2)], indirect=True)
def test_s3_5xx_retried_until_success(fake_s3: _FakeS3) -> None:
    """Two 500s then 200: the caller sees only the object."""
    with _fake_store(fake_s3, max_attempts=3) as store:
        assert store.get("k") == b"ok"
        assert fake_s3.requests == 3


@pytest.mark.parametrize("fake_s3", [(403, "AccessDenied", 1000)], indirect=True)
def test_s3_access_denied_is_not_retried(fake_s3: _FakeS3) -> None:
    """A 403 is final: one request, a plain StorageError naming the code."""
    with _fake_store(fake_s3, max_attempts=3) as store:
        with pytest.raises(StorageError) as info:
            store.put("k", b"x")
        assert type(info.value) is StorageError
        assert "AccessDenied" in str(info.value)
        assert fake_s3.requests == 1


@pytest.mark.parametrize("fake_s3", [(500, "InternalError", 0)], indirect=True)
def test_s3_delete_many_raises_for_keys_s3_refused(fake_s3: _FakeS3) -> None:
    """DeleteObjects answers 200 with per-key errors: StorageError names the first key and
    the count, so garbage collection keeps its record of objects still there."""
    with _fake_store(fake_s3, max_attempts=1) as store:
        with pytest.raises(StorageError) as info:
            store.delete_many(["a", "b"])
        assert "AccessDenied" in str(info.value) and "1 of 2 keys failed" in str(info.value)
