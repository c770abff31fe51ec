"""The coordinator's HTTP API: exact statuses and bodies (TestClient over a real
LocalCoordinator), and every Protocol method through HttpCoordinator against a real
coordinator process, compared with LocalCoordinator on the same database. Everything
runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator.client import ChunkCommit, Coordinator
from coordinator.http.client import HttpCoordinator, topic_path
from coordinator.http.server import create_app, status_for
from coordinator.local import LocalCoordinator
from segments.errors import (
    ERRORS_BY_NAME,
    CommitConflictError,
    CoordinatorUnavailableError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicNameError,
    LakelogError,
    PartitionNotFoundError,
    TopicExistsError,
    TopicNotFoundError,
)
from segments.store import open_store
from segments.types import StoreLocation
from tests.procs import start_coordinator
from tests.unit.test_schema_store import SCENARIOS as SCHEMA_SCENARIOS

with warnings.catch_warnings():
    # Starlette 1.x warns at import that it prefers httpx2 to httpx; the client works the same.
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

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


def _expect(call: Callable[[], object]) -> LakelogError:
    with pytest.raises(LakelogError) as info:
        call()
    return info.value


def test_topic_routes_statuses_and_bodies(api: TestClient, local: LocalCoordinator) -> None:
    r = api.post("/v1/topics", json={"name": "orders", "partitions": 3, "validate_only": True})
    assert r.status_code == 200
    assert r.json()["name"] == "orders"
    assert api.get("/v1/topics").json() == {"topics": []}  # validate_only created nothing

    r = api.post("/v1/topics", json={"name": "orders", "partitions": 3, "configs": {}})
    assert r.status_code == 201
    t = local.get_topic("orders")
    body = {
        "name": "orders",
        "topic_id": t.topic_id.hex(),
        "partitions": 3,
        "configs": {},
        "defaults": {},
    }
    assert r.json() == body
    assert api.get("/v1/topics/orders").json() == body
    assert api.get(f"/v1/topic-ids/{t.topic_id.hex()}").json() == body
    assert api.get("/v1/topics").json() == {"topics": [body]}

    r = api.post("/v1/topics/orders/partitions", json={"partitions": 5})
    assert (r.status_code, r.json()["partitions"]) == (200, 5)

    r = api.delete("/v1/topics/orders")
    assert (r.status_code, r.content) == (204, b"")
    assert api.get("/v1/topics").json() == {"topics": []}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "call"),
    [
        ("GET", "/v1/topics/nope", None, 404, lambda c: c.get_topic("nope")),
        ("DELETE", "/v1/topics/nope", None, 404, lambda c: c.delete_topic("nope")),
        (
            "GET",
            "/v1/topics/nope/partitions/0/offsets",
            None,
            404,
            lambda c: c.offsets("nope", 0),
        ),
        (
            "POST",
            "/v1/topics",
            {"name": "a b", "partitions": 1},
            400,
            lambda c: c.create_topic("a b", 1),
        ),
        (
            "POST",
            "/v1/topics",
            {"name": "ok", "partitions": 0},
            400,
            lambda c: c.create_topic("ok", 0),
        ),
        (
            "POST",
            "/v1/topics",
            {"name": "ok", "partitions": 1, "configs": {"no.such.config": "1"}},
            400,
            lambda c: c.create_topic("ok", 1, {"no.such.config": "1"}),
        ),
        (
            "GET",
            "/v1/topic-ids/" + "00" * 16,
            None,
            404,
            lambda c: c.get_topic_by_id(bytes(16)),
        ),
    ],
)
def test_errors_have_exact_status_and_body(
    api: TestClient,
    local: LocalCoordinator,
    method: str,
    path: str,
    body: Any,
    status: int,
    call: Callable[[Coordinator], object],
) -> None:
    expected = _expect(lambda: call(local))
    r = api.request(method, path, json=body)
    assert r.status_code == status
    assert r.json() == _err(expected)


def test_commit_route_statuses_and_bodies(api: TestClient, local: LocalCoordinator) -> None:
    t = local.create_topic("log", 2)
    chunks = [
        {
            "topic_id": t.topic_id.hex(),
            "partition": 1,
            "position": 0,
            "length": 10,
            "record_count": 4,
            "min_timestamp_ms": 5,
            "max_timestamp_ms": 9,
        }
    ]
    r = api.post("/v1/commit", json={"object_key": "segments/aa/1.seg", "chunks": chunks})
    assert (r.status_code, r.json()) == (200, {"base_offsets": [0]})
    # The same key and chunks again: the same offsets, nothing assigned twice.
    r = api.post("/v1/commit", json={"object_key": "segments/aa/1.seg", "chunks": chunks})
    assert (r.status_code, r.json()) == (200, {"base_offsets": [0]})
    assert api.get("/v1/topics/log/partitions/1/offsets").json() == {
        "log_start": 0,
        "high_watermark": 4,
        "topic_id": t.topic_id.hex(),
    }

    other = [{**chunks[0], "record_count": 5}]
    r = api.post("/v1/commit", json={"object_key": "segments/aa/1.seg", "chunks": other})
    assert r.status_code == 409
    assert r.json()["error"] == "CommitConflictError"

    bad_partition = [{**chunks[0], "partition": 7}]
    r = api.post("/v1/commit", json={"object_key": "segments/aa/2.seg", "chunks": bad_partition})
    assert r.status_code == 404
    assert r.json()["error"] == "PartitionNotFoundError"

    for bad in (b"{not json", b'{"object_key": "k"}', b'{"object_key": 3, "chunks": []}'):
        r = api.post("/v1/commit", content=bad)
        assert r.status_code == 422
        assert r.json()["error"] == "MalformedRequestError"
        assert r.json()["retriable"] is False
    r = api.post(
        "/v1/commit", json={"object_key": "k", "chunks": [{**chunks[0], "partition": "1"}]}
    )
    assert (r.status_code, r.json()["error"]) == (422, "MalformedRequestError")
    # None of the rejected commits moved the high watermark.
    assert local.offsets("log", 1).high_watermark == 4


def test_lookup_routes(api: TestClient, local: LocalCoordinator) -> None:
    t = local.create_topic("lk", 1)
    local.commit("segments/aa/1.seg", [_chunk(t.topic_id, 0, 3, ts=100)])
    local.commit("segments/aa/2.seg", [_chunk(t.topic_id, 0, 2, ts=200)])
    r = api.get("/v1/topics/lk/partitions/0/lookup", params={"offset": 3, "max_chunks": 5})
    assert r.status_code == 200
    assert r.json() == {
        "chunks": [
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
    }
    r = api.get("/v1/topics/lk/partitions/0/lookup-timestamp", params={"ts": 10_000})
    assert (r.status_code, r.json()) == (200, {"chunk": None})
    r = api.get("/v1/topics/lk/partitions/0/lookup")  # offset is required
    assert (r.status_code, r.json()["error"]) == (422, "MalformedRequestError")


def test_health_and_metrics(api: TestClient, local: LocalCoordinator) -> None:
    assert (api.get("/health").status_code, api.get("/health").json()) == (200, {"status": "ok"})
    t = local.create_topic("m", 1)
    for i in range(3):
        payload = {
            "object_key": f"segments/m/{i}.seg",
            "chunks": [
                {
                    "topic_id": t.topic_id.hex(),
                    "partition": 0,
                    "position": 0,
                    "length": 1,
                    "record_count": 2,
                    "min_timestamp_ms": 0,
                    "max_timestamp_ms": 0,
                }
            ],
        }
        assert api.post("/v1/commit", json=payload).status_code == 200
    text = api.get("/metrics").text
    assert 'lakelog_coordinator_commits_total{outcome="ok"} 3.0' in text
    assert "lakelog_coordinator_committed_chunks_total 3.0" in text
    assert "lakelog_coordinator_committed_records_total 6.0" in text
    assert "lakelog_coordinator_commit_seconds_count 3.0" in text


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
    assert httpx.get(f"{served[0]}/v1/cluster").json() == {"cluster_id": cluster}

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
    call: Callable[[Coordinator], object],
) -> Callable[[Coordinator], Callable[[Coordinator], object]]:
    return lambda _c: call


@pytest.mark.parametrize(
    ("setup", "cls"),
    [
        (_fixed(lambda c: c.get_topic("no-such-topic")), TopicNotFoundError),
        (_fixed(lambda c: c.get_topic("a/b")), None),
        (_fixed(lambda c: c.get_topic("..")), None),
        (_fixed(lambda c: c.delete_topic("no-such-topic")), TopicNotFoundError),
        (_fixed(lambda c: c.get_topic_by_id(b"\x01" * 16)), TopicNotFoundError),
        (_fixed(lambda c: c.offsets("no-such-topic", 0)), TopicNotFoundError),
        (_fixed(lambda c: c.lookup("no-such-topic", 0, 0)), TopicNotFoundError),
        (_fixed(lambda c: c.create_topic("bad name!", 1)), InvalidTopicNameError),
        (_fixed(lambda c: c.create_topic("..", 1)), InvalidTopicNameError),
        (_fixed(lambda c: c.create_topic("a/b", 1)), InvalidTopicNameError),
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
    cls: type[LakelogError] | None,
) -> None:
    """The error raised through HTTP is the one LocalCoordinator raises, unchanged.

    ``cls`` None: whatever LocalCoordinator raises for a name that cannot be a
    path segment ("a/b", ".."), HTTP must raise the same.
    """
    call = setup(remote)
    expected = _expect(lambda: call(served_db))
    got = _expect(lambda: call(remote))
    if cls is not None:
        assert type(expected) is cls
    assert type(got) is type(expected)
    assert (got.message, got.retriable) == (expected.message, expected.retriable)


def test_store_route_tells_readers_where_the_objects_are(
    local: LocalCoordinator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET /v1/store: URL, endpoint and region for Spark jobs, nulls without a store, and
    a relative file:// store made absolute (a Spark executor runs elsewhere)."""
    with TestClient(create_app(local)) as client:
        assert client.get("/v1/store").json() == {"url": None, "endpoint": None, "region": None}
        assert HttpCoordinator("http://testserver", client=client).store_location() is None
    told = StoreLocation("s3://bucket/lakelog", "http://127.0.0.1:9000", "eu-west-1")
    with TestClient(create_app(local, None, told)) as client:
        r = client.get("/v1/store")
        assert r.status_code == 200
        assert r.json() == {
            "url": "s3://bucket/lakelog",
            "endpoint": "http://127.0.0.1:9000",
            "region": "eu-west-1",
        }
        assert HttpCoordinator("http://testserver", client=client).store_location() == told
    monkeypatch.chdir(tmp_path)
    store = open_store("file://./data")
    with TestClient(create_app(local, store)) as client:
        assert client.get("/v1/store").json()["url"] == f"file://{tmp_path}/data"


def test_topic_path_keeps_odd_names_in_one_segment() -> None:
    assert topic_path("orders") == "/v1/topics/orders"
    assert topic_path("a/b") == "/v1/topics/a%2Fb"
    assert topic_path("..") == "/v1/topics/%2E%2E"


def test_a_killed_server_raises_unavailable(tmp_path: Path, db_url: str) -> None:
    """After the process is gone, a call raises CoordinatorUnavailableError, not httpx errors."""
    proc, url = start_coordinator(tmp_path, db_url)
    try:
        with HttpCoordinator(url, timeout=2.0) as c:
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


def test_schema_routes_statuses(api: TestClient) -> None:
    r = api.post("/v1/schemas/versions", json={"subject": "nope"})
    assert r.status_code == 404
    assert r.json() == {
        "error": "SubjectNotFoundError",
        "message": "Subject 'nope' not found.",
        "retriable": False,
    }
    r = api.post("/v1/schemas/register", json={"subject": "s", "schema_type": "AVRO"})
    assert (r.status_code, r.json()["error"]) == (422, "MalformedRequestError")
    r = api.post(
        "/v1/schemas/register",
        json={"subject": "s", "schema_type": "AVRO", "schema": '"int"', "references": []},
    )
    assert r.status_code == 200
    assert r.json()["schema"] == {
        "schema_id": 1,
        "schema_type": "AVRO",
        "schema": '"int"',
        "references": [],
    }
    r = api.post("/v1/schemas/config/set", json={"subject": "s", "level": "nah"})
    assert (r.status_code, r.json()["error"]) == (422, "InvalidCompatibilityLevelError")
