"""The web layer's error mapping: codes, the one table, and the rendered bodies."""

from __future__ import annotations

import asyncio
from http import HTTPStatus

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from segments import errors as e
from service.errors import (
    CONSUMER_INSTANCE_NOT_FOUND,
    ERROR_TABLE,
    ErrorCode,
    error_code_for,
    error_message_for,
    install_error_handlers,
    kafka_error_code,
    spec_for,
    status_for,
)

V2 = "application/vnd.kafka.v2+json"
V3 = "application/json"
NOT_HOSTED = "This server does not host this topic-partition. topic 'no-topic' does not exist"


# -- codes ------------------------------------------------------------------------


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_status_is_the_first_three_digits(code: ErrorCode) -> None:
    expected = 422 if code == 40001 else int(str(int(code))[:3])
    assert status_for(code) == expected
    HTTPStatus(status_for(code))  # a real HTTP status


def test_40001_is_the_documented_exception() -> None:
    assert status_for(ErrorCode.INVALID_CONSUMER_CONFIG_CONSTRAINTS) == 422
    assert int(ErrorCode.INVALID_CONSUMER_CONFIG_CONSTRAINTS) == 40001


def test_40403_means_consumer_instance_too() -> None:
    assert CONSUMER_INSTANCE_NOT_FOUND is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert int(CONSUMER_INSTANCE_NOT_FOUND) == 40403


# -- the table ----------------------------------------------------------------------


def test_the_table_by_name_holds_every_class_of_the_tree() -> None:
    """The coordinator's client re-raises errors by name: a class missing from the table
    came back as a bare LakelogError (BatchTooLargeError did, until the table was taken
    from the tree)."""
    defined = {
        name: cls
        for name, cls in vars(e).items()
        if isinstance(cls, type) and issubclass(cls, e.LakelogError)
    }
    assert defined == e.ERRORS_BY_NAME
    assert e.ERRORS_BY_NAME["BatchTooLargeError"] is e.BatchTooLargeError


def test_every_error_class_has_an_entry() -> None:
    missing = [n for n, cls in e.ERRORS_BY_NAME.items() if cls not in ERROR_TABLE]
    assert missing == []
    # ...and the table names nothing that is not part of the tree.
    assert set(ERROR_TABLE) == set(e.ERRORS_BY_NAME.values())


def test_retriable_errors_get_the_retriable_code() -> None:
    for cls in e.ERRORS_BY_NAME.values():
        code = error_code_for(cls("x"))
        if cls.retriable:
            assert code == ErrorCode.KAFKA_RETRIABLE_ERROR, cls
        else:
            assert code != ErrorCode.KAFKA_RETRIABLE_ERROR, cls


def test_unlisted_subclass_falls_back_to_its_nearest_ancestor() -> None:
    class SpecialTopicNotFound(e.TopicNotFoundError):
        pass

    class NewError(e.LakelogError):
        pass

    assert spec_for(SpecialTopicNotFound("x")) == ERROR_TABLE[e.TopicNotFoundError]
    assert error_code_for(SpecialTopicNotFound("x"), v3=True) == 40403
    assert error_code_for(NewError("boom")) == ErrorCode.KAFKA_ERROR
    assert error_message_for(NewError("boom")) == "boom"


def test_v2_and_v3_differ_only_where_documented() -> None:
    for cls in e.ERRORS_BY_NAME.values():
        v2, v3 = error_code_for(cls("x")), error_code_for(cls("x"), v3=True)
        if cls is e.TopicNotFoundError:
            assert (v2, v3) == (40401, 40403)
        else:
            assert v2 == v3, cls


def test_kafka_error_code_for_v2_record_entries() -> None:
    assert kafka_error_code(e.StorageUnavailableError("slow")) == 50003
    assert kafka_error_code(e.BufferFullError("full")) == 50003
    assert kafka_error_code(e.CorruptSegmentError("bad")) == 50002
    assert kafka_error_code(e.CommitConflictError("dup")) == 50002


# -- the handler --------------------------------------------------------------------


class Body(BaseModel):
    topic_name: str
    partitions_count: int = 1


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/topics/{name}")
    async def v2_raise(name: str) -> None:
        raise RAISE[name]

    @app.get("/v3/clusters/c/topics/{name}")
    async def v3_raise(name: str) -> None:
        raise RAISE[name]

    @app.get("/v3/partitions/{p}")
    async def typed_path(p: int) -> dict[str, int]:
        return {"p": p}

    @app.post("/v3/clusters/c/topics")
    async def create(body: Body) -> dict[str, str]:
        return {"ok": body.topic_name}

    @app.get("/v3/crash")
    async def crash() -> None:
        raise RuntimeError("secret internals")

    return app


RAISE: dict[str, Exception] = {
    "no-topic": e.TopicNotFoundError("topic 'no-topic' does not exist"),
    "no-partition": e.PartitionNotFoundError("partition 9 of t"),
    "bad-config": e.InvalidConfigError("Invalid value abc for configuration retention.ms"),
    "exists": e.TopicExistsError("Topic 'exists' already exists."),
    "bad-name": e.InvalidTopicNameError("Topic name 'a b' is illegal"),
    "cluster": e.ClusterNotFoundError("Cluster x cannot be found."),
    "coordinator": e.CoordinatorUnavailableError("no coordinator answered"),
    "media": e.UnsupportedMediaTypeError("HTTP 415 Unsupported Media Type"),
    "large": e.RequestTooLargeError("Request body is larger than 16777216 bytes."),
    "consumer": e.ConsumerNotFoundError("no instance i of group g"),
    "full": e.BufferFullError("write buffer full for 5000 ms"),
}


APP = make_app()


def request(method: str, path: str, **kwargs: object) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=APP, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return await c.request(method, path, **kwargs)  # type: ignore[arg-type]

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("name", "status", "v2_body", "v3_body"),
    [
        ("no-topic", 404, (40401, "topic 'no-topic' does not exist"), (40403, NOT_HOSTED)),
        ("no-partition", 404, (40402, "partition 9 of t"), None),
        ("bad-config", 400, (40002, "Invalid value abc for configuration retention.ms"), None),
        ("exists", 400, (40002, "Topic 'exists' already exists."), None),
        ("bad-name", 422, (42206, "Invalid topic name."), None),
        ("cluster", 404, (404, "Cluster x cannot be found."), None),
        ("coordinator", 500, (50003, "no coordinator answered"), None),
        ("media", 415, (415, "HTTP 415 Unsupported Media Type"), None),
        ("large", 413, (413, "Request body is larger than 16777216 bytes."), None),
        ("consumer", 404, (40403, "Consumer instance not found."), None),
        ("full", 500, (50003, "write buffer full for 5000 ms"), None),
    ],
)  # fmt: skip
def test_domain_errors_render_exact_bodies(
    name: str, status: int, v2_body: tuple[int, str], v3_body: tuple[int, str] | None
) -> None:
    r = request("GET", f"/topics/{name}")
    assert (r.status_code, r.headers["content-type"]) == (status, V2)
    assert r.json() == {"error_code": v2_body[0], "message": v2_body[1]}
    code, message = v3_body or v2_body
    r = request("GET", f"/v3/clusters/c/topics/{name}")
    assert (r.status_code, r.headers["content-type"]) == (status, V3)
    assert r.json() == {"error_code": code, "message": message}


def test_unknown_route_and_wrong_method() -> None:
    r = request("GET", "/nowhere")
    assert (r.status_code, r.json()) == (404, {"error_code": 404, "message": "HTTP 404 Not Found"})
    r = request("DELETE", "/v3/clusters/c/topics")
    assert r.status_code == 405
    assert r.json() == {"error_code": 405, "message": "HTTP 405 Method Not Allowed"}


def test_non_integer_path_parameter_is_a_missing_route() -> None:
    r = request("GET", "/v3/partitions/abc")
    assert (r.status_code, r.json()) == (404, {"error_code": 404, "message": "HTTP 404 Not Found"})
    assert request("GET", "/v3/partitions/3").json() == {"p": 3}


def test_malformed_json_is_400() -> None:
    r = request("POST", "/v3/clusters/c/topics", content=b"{oops", headers={"content-type": V3})
    assert (r.status_code, r.json()) == (
        400,
        {"error_code": 400, "message": "Bad Request: malformed JSON."},
    )


def test_empty_body_is_422_42206() -> None:
    r = request("POST", "/v3/clusters/c/topics", headers={"content-type": V3})
    assert r.status_code == 422
    assert r.json() == {
        "error_code": 42206,
        "message": "Payload error. Request body is empty. Data is required.",
    }


def test_wrong_json_type_is_400_naming_the_field() -> None:
    r = request("POST", "/v3/clusters/c/topics", json={"topic_name": "t", "partitions_count": "x"})
    assert r.status_code == 400
    assert r.json() == {
        "error_code": 400,
        "message": "Bad Request: partitions_count: "
        "Input should be a valid integer, unable to parse string as an integer",
    }


def test_unexpected_exception_is_500_without_internals() -> None:
    r = request("GET", "/v3/crash")
    assert (r.status_code, r.json()) == (
        500,
        {"error_code": 500, "message": "Internal Server Error"},
    )
