"""The coordinator's HTTP API: exact statuses and bodies of its operations (``POST
/v2/<name>``, MessagePack; TestClient over a real LocalCoordinator), and every Protocol
method through the HTTP client against a real coordinator process, compared with
LocalCoordinator on the same database. Everything runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from fastapi.testclient import TestClient

from coordinator.api import MEDIA_TYPE, OPERATIONS
from coordinator.client import ChunkCommit, Coordinator, StoreLocation
from coordinator.http.client import HttpCoordinator, http_coordinator
from coordinator.http.server import create_app, status_for
from coordinator.local import LocalCoordinator
from coordinator.log.producers import ProducerBatch, RequestKey
from coordinator.settings import COORDINATOR_MAX_REQUEST_BYTES
from segments.errors import (
    ERRORS_BY_NAME,
    CommitConflictError,
    CoordinatorUnavailableError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicNameError,
    LakelogError,
    PartitionNotFoundError,
    RequestTooLargeError,
    TopicExistsError,
    TopicNotFoundError,
)
from segments.store import open_store
from tests.coordinator_calls import answer, call, raw_post
from tests.procs import start_coordinator
from tests.unit.test_schema_store import SCENARIOS as SCHEMA_SCENARIOS

pytestmark = pytest.mark.integration


def _name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _chunk(
    topic_id: bytes, partition: int, count: int, ts: int = 1_000, pos: int = 0
) -> ChunkCommit:
    return ChunkCommit(topic_id, partition, pos, 100, count, ts, ts + 10)


# -- fixtures ------------------------------------------------------------------


@pytest.fixture
def local(db_url: str) -> Iterator[LocalCoordinator]:
    c = LocalCoordinator(db_url)
    yield c
    c.close()


@pytest.fixture
def api(local: LocalCoordinator) -> Iterator[TestClient]:
    with TestClient(create_app(local)) as client:
        yield client


# -- raw API: exact statuses and bodies -----------------------------------------


def _err(exc: LakelogError) -> dict[str, Any]:
    return {"error": type(exc).__name__, "message": exc.message, "retriable": exc.retriable}


def _expect(attempt: Callable[[], object]) -> LakelogError:
    with pytest.raises(LakelogError) as info:
        attempt()
    return info.value


def _ok(resp: httpx.Response) -> Any:
    """The decoded result of a successful call: every success is a 200 in MessagePack."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == MEDIA_TYPE
    return answer(resp)


def _malformed(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 422, resp.content
    body: dict[str, Any] = resp.json()
    assert (body["error"], body["retriable"]) == ("MalformedRequestError", False)
    return body


def test_topic_operations_statuses_and_answers(api: TestClient, local: LocalCoordinator) -> None:
    args = {"name": "orders", "partitions": 3, "validate_only": True}
    assert _ok(call(api, "create_topic", args))["name"] == "orders"
    assert _ok(call(api, "list_topics")) == []  # validate_only created nothing

    created = _ok(call(api, "create_topic", {"name": "orders", "partitions": 3, "configs": {}}))
    t = local.get_topic("orders")
    body = {
        "name": "orders",
        "topic_id": t.topic_id,  # bytes as bytes, not hex
        "partitions": 3,
        "configs": {},
        "defaults": {},
    }
    assert created == body
    assert _ok(call(api, "get_topic", {"name": "orders"})) == body
    assert _ok(call(api, "get_topic_by_id", {"topic_id": t.topic_id})) == body
    assert _ok(call(api, "list_topics")) == [body]

    grown = _ok(call(api, "add_partitions", {"name": "orders", "partitions": 5}))
    assert grown["partitions"] == 5
    assert local.get_topic("orders").partitions == 5

    assert _ok(call(api, "delete_topic", {"name": "orders"})) is None
    assert _ok(call(api, "list_topics")) == []
    assert local.list_topics() == []


@pytest.mark.parametrize(
    ("name", "args", "status", "call_local"),
    [
        ("get_topic", {"name": "nope"}, 404, lambda c: c.get_topic("nope")),
        ("delete_topic", {"name": "nope"}, 404, lambda c: c.delete_topic("nope")),
        ("offsets", {"topic": "nope", "partition": 0}, 404, lambda c: c.offsets("nope", 0)),
        (
            "create_topic",
            {"name": "a b", "partitions": 1},
            400,
            lambda c: c.create_topic("a b", 1),
        ),
        ("create_topic", {"name": "ok", "partitions": 0}, 400, lambda c: c.create_topic("ok", 0)),
        (
            "create_topic",
            {"name": "ok", "partitions": 1, "configs": {"no.such.config": "1"}},
            400,
            lambda c: c.create_topic("ok", 1, {"no.such.config": "1"}),
        ),
        (
            "get_topic_by_id",
            {"topic_id": bytes(16)},
            404,
            lambda c: c.get_topic_by_id(bytes(16)),
        ),
        # Names that were path segments once reach the coordinator as they are (no
        # URL decoding, no path normalisation) and get its error for that very name.
        ("get_topic", {"name": "a/b"}, 404, lambda c: c.get_topic("a/b")),
        ("get_topic", {"name": ".."}, 404, lambda c: c.get_topic("..")),
        ("get_topic", {"name": "."}, 404, lambda c: c.get_topic(".")),
        ("get_topic", {"name": "a%2Fb"}, 404, lambda c: c.get_topic("a%2Fb")),
        ("delete_topic", {"name": "../x"}, 404, lambda c: c.delete_topic("../x")),
        ("create_topic", {"name": "a/b", "partitions": 1}, 400, lambda c: c.create_topic("a/b", 1)),
        ("create_topic", {"name": "..", "partitions": 1}, 400, lambda c: c.create_topic("..", 1)),
        ("create_topic", {"name": ".", "partitions": 1}, 400, lambda c: c.create_topic(".", 1)),
    ],
)
def test_errors_have_exact_status_and_body(
    api: TestClient,
    local: LocalCoordinator,
    name: str,
    args: dict[str, Any],
    status: int,
    call_local: Callable[[Coordinator], object],
) -> None:
    expected = _expect(lambda: call_local(local))
    r = call(api, name, args)
    assert r.status_code == status
    assert r.json() == _err(expected)
    assert local.list_topics() == []  # nothing was created on the way


def test_odd_topic_names_round_trip(api: TestClient, local: LocalCoordinator) -> None:
    """Names that are legal topics but odd in a URL path ("...", dots, dashes, the
    longest name) are sent in the body: each is created, found by name and by id, read
    and deleted as itself, raw and through the client (replaces the old check that the
    client's path helper kept such names in one path segment)."""
    names = ["...", "a..b", ".a", "-_.", "v2", "a" * 249]
    client = http_coordinator("http://testserver", client=api)
    for n in names:
        created = _ok(call(api, "create_topic", {"name": n, "partitions": 1}))
        assert created["name"] == n
        assert local.get_topic(n).topic_id == created["topic_id"]
        assert _ok(call(api, "get_topic", {"name": n})) == created
        assert _ok(call(api, "get_topic_by_id", {"topic_id": created["topic_id"]}))["name"] == n
        assert _ok(call(api, "offsets", {"topic": n, "partition": 0}))["high_watermark"] == 0
        assert client.get_topic(n) == local.get_topic(n)
    assert sorted(t["name"] for t in _ok(call(api, "list_topics"))) == sorted(names)
    for n in names:
        assert _ok(call(api, "delete_topic", {"name": n})) is None
        with pytest.raises(TopicNotFoundError) as gone:
            local.get_topic(n)
        r = call(api, "get_topic", {"name": n})
        assert (r.status_code, r.json()) == (404, _err(gone.value))


def _wire_chunk(topic_id: bytes | str, **changes: Any) -> dict[str, Any]:
    chunk = {
        "topic_id": topic_id,
        "partition": 1,
        "position": 0,
        "length": 10,
        "record_count": 4,
        "min_timestamp_ms": 5,
        "max_timestamp_ms": 9,
    }
    return {**chunk, **changes}


def test_commit_statuses_and_answers(api: TestClient, local: LocalCoordinator) -> None:
    t = local.create_topic("log", 2)
    chunks = [_wire_chunk(t.topic_id)]
    args = {"object_key": "segments/aa/1.seg", "chunks": chunks}
    assert _ok(call(api, "commit", args)) == [0]
    # The same key and chunks again: the same offsets, nothing assigned twice.
    assert _ok(call(api, "commit", args)) == [0]
    assert _ok(call(api, "offsets", {"topic": "log", "partition": 1})) == {
        "log_start": 0,
        "high_watermark": 4,
        "topic_id": t.topic_id,
    }

    other = [_wire_chunk(t.topic_id, record_count=5)]
    r = call(api, "commit", {"object_key": "segments/aa/1.seg", "chunks": other})
    assert (r.status_code, r.json()["error"]) == (409, "CommitConflictError")

    bad_partition = [_wire_chunk(t.topic_id, partition=7)]
    r = call(api, "commit", {"object_key": "segments/aa/2.seg", "chunks": bad_partition})
    assert (r.status_code, r.json()["error"]) == (404, "PartitionNotFoundError")

    key = "segments/aa/3.seg"
    # What a /v1 client sent: the arguments as JSON (topic id in hex), not MessagePack.
    v1_body = json.dumps({"object_key": key, "chunks": [_wire_chunk(t.topic_id.hex())]})
    malformed: list[dict[str, Any] | bytes] = [
        b"{not json",
        v1_body.encode(),
        b"",
        b"\xc1",  # never a MessagePack byte
        {"object_key": key},  # chunks missing
        {"object_key": 3, "chunks": chunks},
        {"object_key": "", "chunks": chunks},
        {"object_key": key, "chunks": []},
        {"object_key": key, "chunks": [_wire_chunk(t.topic_id, record_count=-1)]},
        {"object_key": key, "chunks": chunks, "extra": 1},
        {"object_key": key, "chunks": [_wire_chunk(t.topic_id, partition="1")]},
        {"object_key": key, "chunks": [_wire_chunk(t.topic_id, partition=True)]},
        {"object_key": key, "chunks": [_wire_chunk(t.topic_id.hex())]},  # hex is not bytes
        {"object_key": key, "chunks": [{k: v for k, v in chunks[0].items() if k != "length"}]},
        msgspec.msgpack.encode([key, chunks]),  # positional: not a map of the arguments
    ]
    for bad in malformed:
        _malformed(call(api, "commit", bad))
    # None of the rejected commits stored anything or moved the high watermark.
    assert local.offsets("log", 1).high_watermark == 4
    assert local.committed_object_keys([key, "segments/aa/2.seg"]) == set()


def test_lookup_operations(api: TestClient, local: LocalCoordinator) -> None:
    t = local.create_topic("lk", 1)
    local.commit("segments/aa/1.seg", [_chunk(t.topic_id, 0, 3, ts=100)])
    local.commit("segments/aa/2.seg", [_chunk(t.topic_id, 0, 2, ts=200)])
    args = {"topic": "lk", "partition": 0, "offset": 3, "max_chunks": 5}
    assert _ok(call(api, "lookup", args)) == [
        {
            "object_key": "segments/aa/2.seg",
            "position": 0,
            "length": 100,
            "base_offset": 3,
            "record_count": 2,
            "min_timestamp_ms": 200,
            "max_timestamp_ms": 210,
            "kind": "segment",
        }
    ]
    args = {"topic": "lk", "partition": 0, "timestamp_ms": 150}
    assert _ok(call(api, "lookup_timestamp", args))["object_key"] == "segments/aa/2.seg"
    args = {"topic": "lk", "partition": 0, "timestamp_ms": 10_000}
    assert _ok(call(api, "lookup_timestamp", args)) is None
    _malformed(call(api, "lookup", {"topic": "lk", "partition": 0}))  # offset is required


def test_health_and_metrics(api: TestClient, local: LocalCoordinator) -> None:
    assert (api.get("/health").status_code, api.get("/health").json()) == (200, {"status": "ok"})
    t = local.create_topic("m", 1)
    for i in range(3):
        args = {
            "object_key": f"segments/m/{i}.seg",
            "chunks": [_wire_chunk(t.topic_id, partition=0, length=1, record_count=2)],
        }
        _ok(call(api, "commit", args))
    _malformed(call(api, "commit", {"object_key": "segments/m/x.seg"}))
    text = api.get("/metrics").text
    assert 'lakelog_coordinator_commits_total{outcome="ok"} 3.0' in text
    assert 'lakelog_coordinator_commits_total{outcome="MalformedRequestError"} 1.0' in text
    assert "lakelog_coordinator_committed_chunks_total 3.0" in text
    assert "lakelog_coordinator_committed_records_total 6.0" in text
    assert "lakelog_coordinator_commit_seconds_count 4.0" in text
    assert 'lakelog_coordinator_requests_total{method="POST",route="/v2/commit"} 4.0' in text


def test_two_apps_have_separate_registries(local: LocalCoordinator) -> None:
    """Building a second app must not collide in prometheus' global registry."""
    create_app(local)
    create_app(local)


def test_every_error_class_has_a_status() -> None:
    for name, cls in ERRORS_BY_NAME.items():
        status = status_for(cls("x"))
        assert 400 <= status < 600, name
        if cls.retriable:
            assert status == 503, name
    assert status_for(TopicNotFoundError("x")) == 404
    assert status_for(TopicExistsError("x")) == 409
    assert status_for(CommitConflictError("x")) == 409
    assert status_for(InvalidConfigError("x")) == 400


# -- HttpCoordinator against a real process --------------------------------------


def test_every_protocol_method_round_trips(
    remote: HttpCoordinator, served_db: LocalCoordinator, served: tuple[str, str]
) -> None:
    name = _name()
    cluster = remote.cluster_id()
    assert cluster == served_db.cluster_id()
    assert len(cluster) == 22
    with httpx.Client(base_url=served[0]) as h:
        assert _ok(call(h, "cluster_id")) == cluster

    planned = remote.create_topic(name, 2, {"retention.ms": "60000"}, validate_only=True)
    assert (planned.name, planned.partitions) == (name, 2)
    with pytest.raises(TopicNotFoundError):
        remote.get_topic(name)

    t = remote.create_topic(name, 2, {"retention.ms": "60000"})
    assert t == served_db.get_topic(name)
    assert t.configs == {"retention.ms": "60000"}
    assert remote.get_topic(name) == t
    assert remote.get_topic_by_id(t.topic_id) == t
    assert t in remote.list_topics()
    assert remote.list_topics() == served_db.list_topics()

    grown = remote.add_partitions(name, 4)
    assert grown.partitions == 4
    assert grown == served_db.get_topic(name)
    altered = remote.alter_configs(name, {"cleanup.policy": "compact"}, ["retention.ms"])
    assert altered.configs == {"cleanup.policy": "compact"}
    assert altered == served_db.get_topic(name)
    checked = remote.alter_configs(name, {"retention.ms": "1"}, validate_only=True)
    assert checked.configs.get("retention.ms") == "1"
    assert remote.get_topic(name).configs == {"cleanup.policy": "compact"}

    key1, key2 = f"segments/{name}/1.seg", f"segments/{name}/2.seg"
    chunks1 = [_chunk(t.topic_id, 0, 5, ts=100), _chunk(t.topic_id, 3, 2, ts=100, pos=100)]
    assert remote.commit(key1, chunks1) == [0, 0]
    assert remote.commit(key1, chunks1) == [0, 0]  # idempotent by object key
    assert remote.commit(key2, [_chunk(t.topic_id, 0, 4, ts=300)]) == [5]
    assert remote.offsets(name, 0) == served_db.offsets(name, 0)
    assert remote.offsets(name, 0).high_watermark == 9
    assert remote.offsets(name, 3).high_watermark == 2

    refs = remote.lookup(name, 0, 0)
    assert refs == served_db.lookup(name, 0, 0)
    assert [(r.object_key, r.base_offset, r.record_count) for r in refs] == [
        (key1, 0, 5),
        (key2, 5, 4),
    ]
    assert remote.lookup(name, 0, 6, max_chunks=1) == served_db.lookup(name, 0, 6, max_chunks=1)
    assert remote.lookup(name, 0, 9) == []
    hit = remote.lookup_timestamp(name, 0, 200)
    assert hit == served_db.lookup_timestamp(name, 0, 200)
    assert hit is not None
    assert hit.object_key == key2
    assert remote.lookup_timestamp(name, 0, 10**12) is None

    assert remote.committed_object_keys([key1, key2, "segments/x/none.seg"]) == {key1, key2}
    assert remote.committed_object_keys([]) == set()

    agent = f"agent-{name}"
    broker = remote.heartbeat_agent(agent, "10.0.0.1", 8082)
    assert remote.heartbeat_agent(agent, "10.0.0.1", 8082) == broker
    agents = {a.agent_id: a for a in remote.list_agents()}
    assert (agents[agent].broker_id, agents[agent].host, agents[agent].port) == (
        broker,
        "10.0.0.1",
        8082,
    )
    assert remote.list_agents() == served_db.list_agents()

    remote.delete_topic(name)
    with pytest.raises(TopicNotFoundError):
        served_db.get_topic(name)


def _conflict_setup(c: Coordinator) -> Callable[[Coordinator], object]:
    t = c.create_topic(_name(), 1)
    key = f"segments/{t.name}/c.seg"
    c.commit(key, [_chunk(t.topic_id, 0, 3)])
    return lambda x: x.commit(key, [_chunk(t.topic_id, 0, 4)])


def _missing_partition_setup(c: Coordinator) -> Callable[[Coordinator], object]:
    t = c.create_topic(_name(), 1)
    return lambda x: x.commit(f"segments/{t.name}/p.seg", [_chunk(t.topic_id, 5, 1)])


def _exists_setup(c: Coordinator) -> Callable[[Coordinator], object]:
    t = c.create_topic(_name(), 1)
    return lambda x: x.create_topic(t.name, 1)


def _shrink_setup(c: Coordinator) -> Callable[[Coordinator], object]:
    t = c.create_topic(_name(), 3)
    return lambda x: x.add_partitions(t.name, 2)


def _bad_config_setup(c: Coordinator) -> Callable[[Coordinator], object]:
    t = c.create_topic(_name(), 1)
    return lambda x: x.alter_configs(t.name, {"retention.ms": "not-a-number"})


def _fixed(
    act: Callable[[Coordinator], object],
) -> Callable[[Coordinator], Callable[[Coordinator], object]]:
    return lambda _c: act


@pytest.mark.parametrize(
    ("setup", "cls"),
    [
        (_fixed(lambda c: c.get_topic("no-such-topic")), TopicNotFoundError),
        (_fixed(lambda c: c.get_topic("a/b")), TopicNotFoundError),
        (_fixed(lambda c: c.get_topic("..")), TopicNotFoundError),
        (_fixed(lambda c: c.get_topic("a%2Fb")), TopicNotFoundError),
        (_fixed(lambda c: c.delete_topic("../x")), TopicNotFoundError),
        (_fixed(lambda c: c.delete_topic("no-such-topic")), TopicNotFoundError),
        (_fixed(lambda c: c.get_topic_by_id(b"\x01" * 16)), TopicNotFoundError),
        (_fixed(lambda c: c.offsets("no-such-topic", 0)), TopicNotFoundError),
        (_fixed(lambda c: c.lookup("no-such-topic", 0, 0)), TopicNotFoundError),
        (_fixed(lambda c: c.create_topic("bad name!", 1)), InvalidTopicNameError),
        (_fixed(lambda c: c.create_topic("..", 1)), InvalidTopicNameError),
        (_fixed(lambda c: c.create_topic("a/b", 1)), InvalidTopicNameError),
        (_fixed(lambda c: c.create_topic(".", 1)), InvalidTopicNameError),
        (_fixed(lambda c: c.create_topic(_name(), 0)), InvalidPartitionsError),
        (_fixed(lambda c: c.create_topic(_name(), 1, {"no.such": "x"})), InvalidConfigError),
        (_exists_setup, TopicExistsError),
        (_shrink_setup, InvalidPartitionsError),
        (_bad_config_setup, InvalidConfigError),
        (_conflict_setup, CommitConflictError),
        (_missing_partition_setup, PartitionNotFoundError),
    ],
)
def test_errors_map_back_to_the_same_class_and_message(
    remote: HttpCoordinator,
    served_db: LocalCoordinator,
    setup: Callable[[Coordinator], Callable[[Coordinator], object]],
    cls: type[LakelogError],
) -> None:
    """The error raised through HTTP is the one LocalCoordinator raises, unchanged,
    also for names that cannot be URL path segments ("a/b", "..", "a%2Fb"): they reach
    the coordinator as they are and its message names them as they are."""
    act = setup(remote)
    expected = _expect(lambda: act(served_db))
    got = _expect(lambda: act(remote))
    assert type(expected) is cls
    assert type(got) is type(expected)
    assert (got.message, got.retriable) == (expected.message, expected.retriable)


def test_store_route_tells_readers_where_the_objects_are(
    local: LocalCoordinator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """store_location: URL, endpoint and region for Spark jobs, None without a store, and
    a relative file:// store made absolute (a Spark executor runs elsewhere); without a
    store, find_orphans is refused."""
    with TestClient(create_app(local)) as client:
        assert _ok(call(client, "store_location")) is None
        assert http_coordinator("http://testserver", client=client).store_location() is None
        body = _malformed(call(client, "find_orphans", {"grace_s": 0.0}))
        assert body["message"] == "this coordinator has no object store"
    told = StoreLocation("s3://bucket/lakelog", "http://127.0.0.1:9000", "eu-west-1")
    with TestClient(create_app(local, None, told)) as client:
        assert _ok(call(client, "store_location")) == {
            "url": "s3://bucket/lakelog",
            "endpoint": "http://127.0.0.1:9000",
            "region": "eu-west-1",
        }
        assert http_coordinator("http://testserver", client=client).store_location() == told
    monkeypatch.chdir(tmp_path)
    store = open_store("file://./data")
    try:
        with TestClient(create_app(local, store)) as client:
            assert _ok(call(client, "store_location"))["url"] == f"file://{tmp_path}/data"
            assert _ok(call(client, "find_orphans", {"grace_s": 0.0})) == []
    finally:
        store.close()


def test_a_killed_server_raises_unavailable(tmp_path: Path, db_url: str) -> None:
    """After the process is gone, a call raises CoordinatorUnavailableError, not httpx errors."""
    proc, url = start_coordinator(tmp_path, db_url)
    try:
        with http_coordinator(url, timeout=2.0) as c:
            assert c.list_topics() == []
            proc.kill()
            with pytest.raises(CoordinatorUnavailableError) as info:
                c.list_topics()
            assert info.value.retriable is True
    finally:
        proc.stop()


# -- the schema registry's store over HTTP -----------------------------------------


@pytest.mark.parametrize("scenario", SCHEMA_SCENARIOS, ids=lambda f: f.__name__)
def test_schema_store_over_http(remote: HttpCoordinator, scenario: object) -> None:
    """The store scenarios of tests/unit/test_schema_store.py, through a coordinator process:
    every method round-trips and every error comes back as its own class and message."""
    assert callable(scenario)
    scenario(remote)


def test_schema_operations_statuses(api: TestClient, local: LocalCoordinator) -> None:
    r = call(api, "subject_versions", {"subject": "nope"})
    assert r.status_code == 404
    assert r.json() == {
        "error": "SubjectNotFoundError",
        "message": "Subject 'nope' not found.",
        "retriable": False,
    }
    _malformed(call(api, "register_schema", {"subject": "s", "schema_type": "AVRO"}))
    assert local.list_subjects() == []  # the malformed registration stored nothing
    args = {"subject": "s", "schema_type": "AVRO", "schema": '"int"', "references": []}
    assert _ok(call(api, "register_schema", args)) == {
        "subject": "s",
        "version": 1,
        "schema": {"schema_id": 1, "schema_type": "AVRO", "schema": '"int"', "references": []},
        "deleted": False,
    }
    r = call(api, "set_compatibility", {"subject": "s", "level": "nah"})
    assert (r.status_code, r.json()["error"]) == (422, "InvalidCompatibilityLevelError")
    assert local.get_compatibility("s") is None


# -- the body limit ------------------------------------------------------------------

#: A piece of a chunked body. The bodies sent are a few times the limit, not gigabytes,
#: so that without the limit these tests fail instead of taking the machine's memory.
_PIECE = b"\0" * 65536


def _too_large(limit: int) -> dict[str, Any]:
    return {
        "error": "RequestTooLargeError",
        "message": f"request body over the coordinator's limit of {limit} bytes "
        "(coordinator_max_request_bytes)",
        "retriable": False,
    }


def _commit_of(topic_id: bytes, partitions: int, key: str) -> dict[str, Any]:
    """A commit of one chunk per partition, as the wire carries it."""
    return {
        "object_key": key,
        "chunks": [_wire_chunk(topic_id, partition=p) for p in range(partitions)],
    }


def test_a_commit_over_the_limit_is_413_and_stores_nothing(local: LocalCoordinator) -> None:
    """A commit body one byte over the limit (Content-Length says so) is 413
    RequestTooLargeError and moves no high watermark; the same body at exactly the limit
    is committed."""
    t = local.create_topic("capped", 200)
    args = _commit_of(t.topic_id, 200, "segments/aa/1.seg")
    size = len(msgspec.msgpack.encode(args))
    with TestClient(create_app(local, max_request_bytes=size - 1)) as capped:
        r = call(capped, "commit", args)
    assert (r.status_code, r.json()) == (413, _too_large(size - 1))
    assert [local.offsets("capped", p).high_watermark for p in (0, 199)] == [0, 0]
    assert local.committed_object_keys(["segments/aa/1.seg"]) == set()
    with TestClient(create_app(local, max_request_bytes=size)) as exact:
        assert _ok(call(exact, "commit", args)) == [0] * 200
    assert [local.offsets("capped", p).high_watermark for p in (0, 199)] == [4, 4]


def test_a_declared_length_over_the_limit_is_refused_unread(local: LocalCoordinator) -> None:
    """A Content-Length over the limit is answered 413 before one byte of the body is read."""
    app = create_app(local, max_request_bytes=1 << 20)
    pieces = [_PIECE] * 32  # 2 MiB
    headers = [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", b"%d" % (2 << 20))]
    status, body, pulled = raw_post(app, "/v2/commit", pieces, headers)
    assert (status, body, pulled) == (413, _too_large(1 << 20), 0)


@pytest.mark.parametrize(
    ("path", "content_type"),
    [("/v2/commit", MEDIA_TYPE), ("/v1/janitors/tier/run", "application/json")],
)
def test_a_chunked_body_is_cut_off_at_the_limit(
    local: LocalCoordinator, path: str, content_type: str
) -> None:
    """A body without Content-Length (16 MiB, chunked) is counted as it is read and
    answered 413 once it passes the limit: on an operation's route (MessagePack) and on a
    JSON management route, where FastAPI would have made the cut-off a 400."""
    limit = 1 << 20
    app = create_app(local, open_store("memory://"), max_request_bytes=limit)
    pieces = [_PIECE] * 256
    status, body, pulled = raw_post(app, path, pieces, [(b"content-type", content_type.encode())])
    assert (status, body) == (413, _too_large(limit))
    assert pulled == limit // len(_PIECE) + 1  # read up to the limit, not one piece more
    counted = app.state.metrics.registry.get_sample_value(
        "lakelog_coordinator_errors_total", {"error": "RequestTooLargeError"}
    )
    assert counted == 1


def test_the_client_raises_request_too_large_once(local: LocalCoordinator) -> None:
    """Through the HTTP client a commit over the limit raises RequestTooLargeError (not
    retriable) after one request: the commit's retries are for failures that may pass."""
    t = local.create_topic("capped", 100)
    chunks = [_chunk(t.topic_id, p, 3) for p in range(100)]
    app = create_app(local, max_request_bytes=1024)
    with TestClient(app) as client:
        remote = http_coordinator("http://testserver", client=client)
        with pytest.raises(RequestTooLargeError) as info:
            remote.commit("segments/aa/1.seg", chunks)
    assert info.value.retriable is False
    assert "limit of 1024 bytes" in info.value.message
    requests = app.state.metrics.registry.get_sample_value(
        "lakelog_coordinator_errors_total", {"error": "RequestTooLargeError"}
    )
    assert requests == 1
    assert local.offsets("capped", 0).high_watermark == 0


def test_a_commit_of_10000_partitions_goes_through_under_the_default(
    local: LocalCoordinator,
) -> None:
    """A flush to 10,000 partitions (a size users have), each chunk with an idempotent
    producer's batch and a REST request key, commits under the default limit; its body is
    ~4 MB, and one with 10 batches and 10 keys of the longest (255 characters) a chunk
    stays under it too."""
    t = local.create_topic("wide", 10_000)
    producer, epoch = local.init_producer_id()
    now = int(time.time() * 1000)
    chunks = [
        ChunkCommit(
            t.topic_id,
            p,
            p * 100,
            100,
            5,
            now,
            now + 10,
            (ProducerBatch(producer, epoch, 0, 5, 0),),
            (RequestKey(f"key-{p}", f"{p:064x}", 0, 5, now, now + 86_400_000, 10_000),),
        )
        for p in range(10_000)
    ]
    commit = OPERATIONS["commit"]
    assert len(commit.request(("segments/aa/1.seg", chunks), {})) < COORDINATOR_MAX_REQUEST_BYTES
    with TestClient(create_app(local)) as client:
        remote = http_coordinator("http://testserver", client=client)
        assert remote.commit("segments/aa/1.seg", chunks) == [0] * 10_000
    assert local.offsets("wide", 9_999).high_watermark == 5

    heavy = [
        replace(
            c,
            producer_batches=tuple(
                ProducerBatch(producer + b, epoch, 0, 5, 5 * b) for b in range(10)
            ),
            request_keys=tuple(
                RequestKey("k" * 255, f"{b:064x}", 5 * b, 5, now, now + 1, 10_000)
                for b in range(10)
            ),
        )
        for c in chunks
    ]
    assert len(commit.request(("segments/aa/2.seg", heavy), {})) < COORDINATOR_MAX_REQUEST_BYTES


def test_a_coordinator_process_takes_its_limit_from_the_setting(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LAKELOG_COORDINATOR_MAX_REQUEST_BYTES`` reaches ``lakelog coordinator``: under
    uvicorn a chunked body over it is 413 and the connection serves the next request; a
    commit over it (Content-Length, answered before the body is read) raises
    RequestTooLargeError in the client after one request and commits nothing."""
    monkeypatch.setenv("LAKELOG_COORDINATOR_MAX_REQUEST_BYTES", "65536")
    proc, url = start_coordinator(tmp_path, db_url)
    try:
        with http_coordinator(url) as remote:
            t = remote.create_topic("capped", 1000)
            chunks = [_chunk(t.topic_id, p, 3) for p in range(1000)]  # ~170 KB
            with pytest.raises(RequestTooLargeError):
                remote.commit("segments/aa/1.seg", chunks)
            assert remote.offsets("capped", 0).high_watermark == 0
        metrics = httpx.get(f"{url}/metrics").text
        assert 'lakelog_coordinator_errors_total{error="RequestTooLargeError"} 1.0' in metrics
        with httpx.Client(timeout=30) as client:
            pieces = itertools.repeat(_PIECE, 64)  # 4 MiB, chunked
            r = client.post(
                f"{url}/v2/commit", content=pieces, headers={"content-type": MEDIA_TYPE}
            )
            assert (r.status_code, r.json()) == (413, _too_large(65536))
            assert client.get(f"{url}/health").status_code == 200
    finally:
        proc.stop()
