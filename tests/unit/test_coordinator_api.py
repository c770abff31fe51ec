"""The coordinator's operations come from one definition (``coordinator.api``): every
protocol method is a route and a client method, with its types on the wire; an
operation unsafe to repeat is never sent twice; ``principal`` is the server's to set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import msgspec
import pytest
from fastapi.testclient import TestClient

from coordinator.api import (
    OPERATIONS,
    PROTOCOLS,
    RETRY_UNSAFE,
    _operation,
)
from coordinator.client import ChunkCommit, TopicPartition
from coordinator.http.client import HttpCoordinator, http_coordinator
from coordinator.http.server import create_app
from coordinator.local import LocalCoordinator
from segments.errors import CoordinatorUnavailableError, MalformedRequestError
from tests.coordinator_calls import answer, call


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[LocalCoordinator, TestClient, HttpCoordinator]]:
    local = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    with TestClient(create_app(local)) as client:
        yield local, client, http_coordinator("http://testserver", client=client)
    local.close()


def test_every_protocol_method_is_a_route_and_a_client_method(
    served: tuple[LocalCoordinator, TestClient, HttpCoordinator],
) -> None:
    _, client, remote = served
    methods = {
        name
        for protocol in PROTOCOLS
        for name, member in vars(protocol).items()
        if callable(member) and not name.startswith("_")
    }
    assert methods == set(OPERATIONS) and len(methods) > 60
    routes = {getattr(r, "path", "") for r in client.app.routes}  # type: ignore[attr-defined]
    assert {op.path for op in OPERATIONS.values()} <= routes
    for name in methods:
        assert callable(getattr(remote, name)), name


def test_typed_values_cross_the_wire_as_they_are(
    served: tuple[LocalCoordinator, TestClient, HttpCoordinator],
) -> None:
    """Bytes stay bytes, mappings keyed by TopicPartition stay so, results decode to the
    method's own types: what the client returns equals what the coordinator returns."""
    local, _, remote = served
    topic = remote.create_topic("typed", 3, {"retention.ms": "1000"})
    assert topic == local.get_topic("typed") and isinstance(topic.topic_id, bytes)
    assert remote.get_topic_by_id(topic.topic_id) == topic
    chunks = [ChunkCommit(topic.topic_id, p, p * 100, 100, 5, 1_000, 1_010) for p in range(3)]
    assert remote.commit("segments/typed-1", chunks) == [0, 0, 0]
    tps = [TopicPartition("typed", p) for p in range(3)] + [TopicPartition("nope", 0)]
    many = remote.offsets_many(tps)
    assert many == local.offsets_many(tps) and set(many) == set(tps[:3])
    assert remote.lookup("typed", 1, 0) == local.lookup("typed", 1, 0)
    assert remote.committed_object_keys(["segments/typed-1", "x"]) == {"segments/typed-1"}
    state = remote.producer_state(7, [(topic.topic_id, 0)])
    assert state == local.producer_state(7, [(topic.topic_id, 0)])


def test_an_operation_unsafe_to_repeat_is_sent_once() -> None:
    """A read timeout may have reached the coordinator: a repeatable read goes to the next
    URL, a topic deletion does not (it could delete twice: a recreated topic)."""
    seen: list[str] = []

    def transport(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.host} {request.url.path}")
        if request.url.host == "a" or request.url.path == "/v2/delete_topic":
            raise httpx.ReadTimeout("slow", request=request)
        op = OPERATIONS[request.url.path.removeprefix("/v2/")]
        return httpx.Response(200, content=op.answer(["x"] if op.name == "list_groups" else None))

    remote = http_coordinator(
        ["http://a", "http://b"], client=httpx.Client(transport=httpx.MockTransport(transport))
    )
    assert remote.list_groups() == ["x"]
    assert seen == ["a /v2/list_groups", "b /v2/list_groups"]
    seen.clear()
    assert "delete_topic" in RETRY_UNSAFE
    with pytest.raises(CoordinatorUnavailableError, match="may or may not have been applied"):
        remote.delete_topic("t")
    # Sent once, to the URL that answered last; not again to "a".
    assert seen == ["b /v2/delete_topic"]


def test_principal_is_set_by_the_server_never_sent(
    served: tuple[LocalCoordinator, TestClient, HttpCoordinator],
) -> None:
    op = OPERATIONS["keep_pending"]
    assert op.takes_principal and "principal" not in op.args.__struct_fields__
    body = op.request(("lease", ["k"], 60.0), {"principal": "User:mallory"})
    assert msgspec.msgpack.decode(body) == {"lease_id": "lease", "keys": ["k"], "ttl_s": 60.0}
    _, client, _ = served
    forged = call(client, "keep_pending", {"lease_id": "l", "keys": [], "principal": "User:x"})
    assert forged.status_code == 422 and answer(forged)["error"] == MalformedRequestError.__name__


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1not msgpack",
        msgspec.msgpack.encode({"name": 5, "partitions": 1}),
        msgspec.msgpack.encode({"partitions": 1}),
        msgspec.msgpack.encode({"name": "t", "partitions": 1, "nope": True}),
    ],
)
def test_a_malformed_request_is_422_and_stores_nothing(
    served: tuple[LocalCoordinator, TestClient, HttpCoordinator], body: bytes
) -> None:
    local, client, _ = served
    resp = call(client, "create_topic", body)
    assert resp.status_code == 422 and answer(resp)["error"] == "MalformedRequestError"
    assert local.list_topics() == []


def test_an_added_operation_is_its_definition() -> None:
    """What adding an operation takes: the method on a protocol. Its request struct,
    result type and retry safety follow from it."""

    class Views(Protocol):
        def lag(
            self, group: str, partitions: list[TopicPartition], *, principal: str | None = None
        ) -> dict[TopicPartition, int]:
            """The group's lag per partition."""
            ...

    op = _operation(Views, "lag")
    assert op.path == "/v2/lag" and op.retry_safe and op.takes_principal
    assert op.positional == ("group", "partitions") and op.keywords == ()
    body = op.request(("g", [TopicPartition("t", 0)]), {})
    target: Any = type(
        "Impl",
        (),
        {"lag": lambda self, group, partitions, principal: {partitions[0]: 3 if principal else 0}},
    )()
    result = op.call(target, body, "User:alice")
    assert op.read_answer(op.answer(result)) == {TopicPartition("t", 0): 3}
