"""REST produce (v2 and v3) against real processes: moto S3, a coordinator, two agents.

Every acked record is read back through the storage API (``LogReader`` over the
coordinator's HTTP API and the S3 bucket), never through the agent that acked it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import httpx
import orjson
import pytest

from coordinator.log.topic_configs import BATCH_OVERHEAD
from index.log import LogReader
from segments.types import ConsumedRecord
from service.produce.partitioner import partition_for_key
from tests.integration.conftest import Cluster, delivery_reports

pytestmark = pytest.mark.integration

BINARY = "application/vnd.kafka.binary.v2+json"
JSON_V2 = "application/vnd.kafka.json.v2+json"
V2 = "application/vnd.kafka.v2+json"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def cluster(lakelog_cluster: Cluster) -> Cluster:
    return lakelog_cluster


@pytest.fixture
def create_topic(cluster: Cluster, unique_topic: Callable[[str], str]) -> Callable[..., str]:
    def create(partitions: int = 1, configs: dict[str, str] | None = None) -> str:
        name = unique_topic("produce")
        body: dict[str, Any] = {"topic_name": name, "partitions_count": partitions}
        if configs:
            body["configs"] = [{"name": k, "value": v} for k, v in configs.items()]
        r = httpx.post(f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics", json=body)
        assert r.status_code == 201, r.text
        return name

    return create


def read_all(reader: LogReader, topic: str, partition: int) -> list[ConsumedRecord]:
    out: list[ConsumedRecord] = []
    while True:
        batch = reader.read(topic, partition, len(out), max_bytes=1 << 20)
        if not batch:
            return out
        out.extend(batch)


def post_v2(
    url: str, body: object, content_type: str = BINARY, accept: str | None = None
) -> httpx.Response:
    headers = {"Content-Type": content_type}
    if accept is not None:
        headers["Accept"] = accept
    return httpx.post(url, content=orjson.dumps(body), headers=headers, timeout=30)


def assert_error(r: httpx.Response, status: int, error_code: int, message: str) -> None:
    """``r`` is an error answer: ``status``, and exactly this body."""
    assert (r.status_code, r.json()) == (status, {"error_code": error_code, "message": message})


def segment_objects(cluster: Cluster) -> int:
    s3 = boto3.client("s3", endpoint_url=cluster.store_endpoint)
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=cluster.bucket, Prefix="lakelog/segments/"
    )
    return sum(len(p.get("Contents", [])) for p in pages)


def flushes(cluster: Cluster) -> float:
    total = 0.0
    for agent in cluster.agents:
        for line in httpx.get(f"{agent}/metrics").text.splitlines():
            if line.startswith('lakelog_flushes_total{result="ok"}'):
                total += float(line.split()[-1])
    return total


# -- v2 happy paths ------------------------------------------------------------------


def test_v2_binary_produce_reads_back_at_acked_offsets(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(partitions=4)
    records: list[dict[str, Any]] = [
        {"key": b64(f"key-{i}".encode()), "value": b64(f"value-{i}".encode())} for i in range(20)
    ]
    records.append({"value": b64(b"explicit"), "partition": 3})
    records.append({"key": None, "value": None, "partition": 0})  # a null/null record
    r = post_v2(f"{cluster.agents[0]}/topics/{topic}", {"records": records})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == V2
    body = r.json()
    assert body["key_schema_id"] is None and body["value_schema_id"] is None
    offsets = body["offsets"]
    assert len(offsets) == 22
    for i, entry in enumerate(offsets[:20]):
        # The Java client's partition for this key: toPositive(murmur2(key)) % 4.
        assert entry["partition"] == partition_for_key(f"key-{i}".encode(), 4)
        assert entry["error_code"] is None and entry["error"] is None
        got = reader.read(topic, entry["partition"], entry["offset"], max_bytes=1)[0]
        assert (got.key, got.value) == (f"key-{i}".encode(), f"value-{i}".encode())
    assert offsets[20]["partition"] == 3
    got = reader.read(topic, 3, offsets[20]["offset"], max_bytes=1)[0]
    assert got.value == b"explicit"
    assert offsets[21]["partition"] == 0
    got = reader.read(topic, 0, offsets[21]["offset"], max_bytes=1)[0]
    assert (got.key, got.value) == (None, None)


def test_v2_json_produce_and_partition_url(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(partitions=2)
    r = post_v2(
        f"{cluster.agents[1]}/topics/{topic}/partitions/1",
        {"records": [{"key": {"id": 1}, "value": {"a": [1, 2, {"b": None}]}}, {"value": "text"}]},
        JSON_V2,
    )
    assert r.status_code == 200, r.text
    assert [(o["partition"], o["offset"]) for o in r.json()["offsets"]] == [(1, 0), (1, 1)]
    got = read_all(reader, topic, 1)
    assert [(g.key, g.value) for g in got] == [
        (b'{"id":1}', b'{"a":[1,2,{"b":null}]}'),
        (None, b'"text"'),
    ]


@pytest.mark.parametrize("content_type", ["application/json", "application/octet-stream", V2, None])
def test_v2_lenient_content_types_mean_binary(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str], content_type: str | None
) -> None:
    topic = create_topic()
    headers = {"Content-Type": content_type} if content_type else {}
    r = httpx.post(
        f"{cluster.agents[0]}/topics/{topic}",
        content=orjson.dumps({"records": [{"value": b64(b"\x00\xffraw")}]}),
        headers=headers,
    )
    assert r.status_code == 200, r.text
    assert read_all(reader, topic, 0)[0].value == b"\x00\xffraw"


def test_v2_keyless_records_spread_over_partitions(
    cluster: Cluster, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(partitions=100)
    seen: set[int] = set()
    for _ in range(4):
        r = post_v2(f"{cluster.agents[0]}/topics/{topic}", {"records": [{"value": b64(b"x")}] * 5})
        assert r.status_code == 200
        seen.update(o["partition"] for o in r.json()["offsets"])
    assert len(seen) >= 2


def test_one_segment_object_per_flush_whatever_the_partition_count(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    """300 partitions in one request become ONE new object in the bucket (one flush)."""
    topic = create_topic(partitions=300)
    objects_before, flushes_before = segment_objects(cluster), flushes(cluster)
    records = [{"value": b64(b"v"), "partition": p} for p in range(300)]
    r = post_v2(f"{cluster.agents[0]}/topics/{topic}", {"records": records})
    assert r.status_code == 200
    assert all(o["offset"] == 0 for o in r.json()["offsets"])
    assert segment_objects(cluster) - objects_before == 1
    assert flushes(cluster) - flushes_before == 1
    assert reader.read(topic, 299, 0)[0].value == b"v"


# -- v2 errors: exact statuses and bodies ----------------------------------------------


def test_v2_unknown_topic_and_partition(cluster: Cluster, create_topic: Callable[..., str]) -> None:
    agent = cluster.agents[0]
    body = {"records": [{"value": b64(b"x")}]}
    for url in (f"{agent}/topics/no-such-topic", f"{agent}/topics/no-such-topic/partitions/0"):
        r = post_v2(url, body)
        assert_error(r, 404, 40401, "Topic 'no-such-topic' not found.")
        assert r.headers["content-type"] == V2
    topic = create_topic(partitions=2)
    r = post_v2(f"{agent}/topics/{topic}/partitions/2", body)
    assert_error(r, 404, 40402, f"Partition 2 of topic '{topic}' not found.")
    r = post_v2(f"{agent}/topics/{topic}", {"records": [{"value": b64(b"x"), "partition": 5}]})
    assert_error(r, 404, 40402, f"Partition 5 of topic '{topic}' not found.")


@pytest.mark.parametrize(
    ("raw", "status", "code", "message"),
    [
        (b'{"records": [', 400, 400, "Bad Request: malformed JSON."),
        (b"[]", 400, 400, "Bad Request: the body must be a JSON object."),
        (b'{"records": {"value": "eA=="}}', 400, 400, "Bad Request: records must be an array."),
        (b'{"records": [1]}', 400, 400, "Bad Request: records[0] must be an object."),
        (
            b'{"records": [{"value": "not base64!"}]}',
            400,
            400,
            "Bad Request: records[0].value=not base64! is not a base64 string.",
        ),
        (
            b'{"records": [{"value": 12}]}',
            400,
            400,
            "Bad Request: records[0].value must be a base64 string or null.",
        ),
        (b'{"records": []}', 422, 42206, "Payload error. The request has no records."),
        (b"{}", 422, 42206, "Payload error. The request has no records."),
        (
            b'{"records": [{"valur": "eA=="}]}',
            422,
            42206,
            "Unrecognized field: valur in records[0]",
        ),
    ],
)
def test_v2_bad_bodies(
    cluster: Cluster,
    reader: LogReader,
    create_topic: Callable[..., str],
    raw: bytes,
    status: int,
    code: int,
    message: str,
) -> None:
    topic = create_topic()
    r = httpx.post(
        f"{cluster.agents[0]}/topics/{topic}", content=raw, headers={"Content-Type": BINARY}
    )
    assert_error(r, status, code, message)
    assert reader.read(topic, 0, 0) == []  # nothing of a refused request is stored


@pytest.mark.parametrize(
    ("content_type", "assumed"),
    [
        ("application/json", "Content-Type application/json"),
        ("application/vnd.kafka.v2+json", "Content-Type application/vnd.kafka.v2+json"),
        (None, "No Content-Type"),
    ],
)
def test_v2_json_values_sent_as_binary_name_the_assumed_type_and_the_others(
    cluster: Cluster,
    reader: LogReader,
    create_topic: Callable[..., str],
    content_type: str | None,
    assumed: str,
) -> None:
    """A newcomer posts JSON values with a type that means binary (Karapace's leniency):
    the 400 says which type it took, that binary wants base64, and which types exist."""
    topic = create_topic()
    headers = {} if content_type is None else {"Content-Type": content_type}
    r = httpx.post(
        f"{cluster.agents[0]}/topics/{topic}",
        content=b'{"records":[{"value":{"n":1}}]}',
        headers=headers,
    )
    assert_error(
        r,
        400,
        400,
        "Bad Request: records[0].value must be a base64 string or null. "
        f"{assumed} means binary: keys and values are base64 strings. For JSON keys and "
        "values send application/vnd.kafka.json.v2+json; the v2 produce types are "
        "application/vnd.kafka.{binary,json,avro,jsonschema,protobuf}.v2+json.",
    )
    assert reader.read(topic, 0, 0) == []


def test_v2_a_bad_record_refuses_the_whole_request(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    topic = create_topic()
    r = post_v2(
        f"{cluster.agents[0]}/topics/{topic}",
        {"records": [{"value": b64(b"good")}, {"value": "%%%"}]},
    )
    assert r.status_code == 400
    assert reader.read(topic, 0, 0) == []


@pytest.mark.parametrize(
    ("content_type", "status", "code"),
    [
        ("text/plain", 415, 415),
        ("application/vnd.kafka.v3+json", 415, 415),
        ("bar/baz", 415, 415),
        ("application/vnd.kafka.avro.v2+json", 422, 42202),
        ("application/vnd.kafka.protobuf.v2+json", 422, 42202),
        ("application/vnd.kafka.jsonschema.v2+json", 422, 42202),
    ],
)
def test_v2_content_types_refused(
    cluster: Cluster, create_topic: Callable[..., str], content_type: str, status: int, code: int
) -> None:
    topic = create_topic()
    r = post_v2(
        f"{cluster.agents[0]}/topics/{topic}", {"records": [{"value": "eA=="}]}, content_type
    )
    assert r.status_code == status
    assert r.json()["error_code"] == code
    if status == 415:
        assert r.json() == {"error_code": 415, "message": "HTTP 415 Unsupported Media Type"}


def test_v2_accept_header(cluster: Cluster, create_topic: Callable[..., str]) -> None:
    topic = create_topic()
    url = f"{cluster.agents[0]}/topics/{topic}"
    body = {"records": [{"value": "eA=="}]}
    assert post_v2(url, body, accept=f"{V2}, */*;q=0.1").status_code == 200
    r = post_v2(url, body, accept="application/octet-stream")
    assert_error(r, 406, 406, "HTTP 406 Not Acceptable")


def test_v2_record_over_max_message_bytes(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    """A record over the topic's max.message.bytes: 413 for the request, nothing stored."""
    topic = create_topic(configs={"max.message.bytes": "2000"})
    url = f"{cluster.agents[0]}/topics/{topic}"
    assert post_v2(url, {"records": [{"value": b64(b"x" * 1500)}]}).status_code == 200
    r = post_v2(url, {"records": [{"value": b64(b"y" * 10)}, {"value": b64(b"x" * 2500)}]})
    assert r.status_code == 413
    body = r.json()
    assert body["error_code"] == 413
    assert "larger than the topic's max.message.bytes (2000)" in body["message"]
    assert [g.value for g in read_all(reader, topic, 0)] == [b"x" * 1500]


def test_v2_request_over_max_request_bytes_by_content_length(
    cluster: Cluster, create_topic: Callable[..., str]
) -> None:
    """Content-Length over the limit is refused before the body is read: the answer
    comes back although the client never sends the body."""
    topic = create_topic()
    host, port = cluster.agents[0].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            f"POST /topics/{topic} HTTP/1.1\r\nHost: x\r\nContent-Type: {BINARY}\r\n"
            f"Content-Length: {64 << 20}\r\n\r\n".encode()
        )
        response = b""
        while b"\r\n\r\n" not in response or not response.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            response += chunk
    head, _, payload = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(payload) == {
        "error_code": 413,
        "message": f"Request body of {64 << 20} bytes exceeds the limit of {16 << 20} bytes.",
    }


# -- v3 ------------------------------------------------------------------------------


def v3_url(cluster: Cluster, topic: str, agent: int = 0, cluster_id: str | None = None) -> str:
    cid = cluster_id or cluster.cluster_id
    return f"{cluster.agents[agent]}/v3/clusters/{cid}/topics/{topic}/records"


def test_v3_single_record_with_everything(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(partitions=3)
    record = {
        "partition_id": 2,
        "headers": [
            {"name": "Header-1", "value": b64(b"Header-1")},
            {"name": "nil", "value": None},
        ],
        "key": {"type": "BINARY", "data": b64(b"foobar\x00")},
        "value": {"type": "JSON", "data": {"foo": "bar"}},
        "timestamp": "2021-02-05T19:14:42Z",
    }
    # Another cluster's id is a 404 on produce too (kafka-rest skips that check; issue 14).
    r = httpx.post(v3_url(cluster, topic, cluster_id="any-cluster"), json=record)
    assert (r.status_code, r.json()["error_code"]) == (404, 404)
    r = httpx.post(v3_url(cluster, topic), json=record)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert delivery_reports(r.text) == [
        {
            "error_code": 200,
            "cluster_id": cluster.cluster_id,
            "topic_name": topic,
            "partition_id": 2,
            "offset": 0,
            "timestamp": "2021-02-05T19:14:42.000Z",
            "key": {"type": "BINARY", "size": 7},
            "value": {"type": "JSON", "size": 13},
        }
    ]
    (got,) = read_all(reader, topic, 2)
    assert got.key == b"foobar\x00"
    assert got.value == b'{"foo":"bar"}'
    assert got.timestamp_ms == 1612552482000
    assert got.headers == (("Header-1", b"Header-1"), ("nil", None))


def test_v3_concatenated_records_in_order_with_per_record_errors(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(partitions=2)
    parts = [
        b'{"value": {"type": "STRING", "data": "first"}, "partition_id": 0}',
        b'{"partition_id": 7}',  # no such partition
        b"\n[1, 2]\n",  # not an object
        b'{"value": {"type": "BINARY", "data": "!!"}}',  # bad base64
        b'{"value": {"data": "no type"}}',  # no type and no schema named
        b'{"value": {"type": "AVRO", "data": 1}}',  # the subject has no schema
        b'{"records": []}',  # the v2 shape posted to v3
        b'{"value": {"type": "STRING", "data": "caf\xc3\xa9 {[\\"]}"}, "partition_id": 0}',
        b'{"key": {"type": "STRING", "data": "k"}}',  # value omitted: null value
        b'{"value": {"type": "STRING", "data": "unterminated"}',
    ]
    r = httpx.post(
        v3_url(cluster, topic, agent=1),
        content=b" ".join(parts),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 200
    got = delivery_reports(r.text)
    assert len(got) == 10
    assert got[0]["error_code"] == 200 and got[0]["offset"] == 0
    assert got[1] == {"error_code": 40402, "message": f"Partition 7 of topic '{topic}' not found."}
    assert got[2] == {"error_code": 400, "message": "Bad Request: a record must be a JSON object."}
    assert got[3] == {"error_code": 400, "message": "Bad Request: data=!! is not a base64 string."}
    assert got[4]["error_code"] == 42202
    assert got[5]["error_code"] == 42205
    assert got[6] == {"error_code": 400, "message": 'Bad Request: Unrecognized field "records".'}
    assert got[7]["error_code"] == 200 and got[7]["offset"] == 1
    assert got[8]["error_code"] == 200 and "value" not in got[8]
    assert got[8]["key"] == {"type": "STRING", "size": 1}
    assert got[9] == {"error_code": 400, "message": "Bad Request: unexpected end of JSON input."}
    values = [g.value for g in read_all(reader, topic, 0)]
    assert values[:2] == [b"first", 'café {["]}'.encode()]
    keyed = read_all(reader, topic, partition_for_key(b"k", 2))
    assert any(g.key == b"k" and g.value is None for g in keyed)


def test_v3_chunked_body_split_anywhere(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    """A chunked upload cut at every few bytes (inside strings, escapes, numbers)."""
    topic = create_topic()
    body = b"".join(
        orjson.dumps(
            {
                "value": {"type": "JSON", "data": {"i": i, "s": 'a"b\\c}{' * (i % 3)}},
                "headers": [{"name": f"h{i}", "value": b64(bytes([i]))}],
            }
        )
        + b"\r\n"
        for i in range(60)
    )

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 7):
            yield body[start : start + 7]

    r = httpx.post(
        v3_url(cluster, topic), content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200
    got = delivery_reports(r.text)
    assert [g["error_code"] for g in got] == [200] * 60
    assert [g["offset"] for g in got] == list(range(60))
    stored = read_all(reader, topic, 0)
    assert [orjson.loads(s.value or b"")["i"] for s in stored] == list(range(60))
    assert [s.headers for s in stored] == [((f"h{i}", bytes([i])),) for i in range(60)]


def test_v3_streaming_reports_arrive_while_the_request_is_still_open(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    """Full duplex: each record's report is read before the next record is sent."""
    topic = create_topic()
    host, port = cluster.agents[0].removeprefix("http://").split(":")

    async def talk() -> list[dict[str, Any]]:
        r, w = await asyncio.open_connection(host, int(port))
        w.write(
            f"POST /v3/clusters/{cluster.cluster_id}/topics/{topic}/records HTTP/1.1\r\n"
            "Host: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        got: list[dict[str, Any]] = []
        buffer = b""
        for i in range(3):
            record = orjson.dumps({"value": {"type": "STRING", "data": f"r{i}"}})
            w.write(b"%x\r\n%s\r\n" % (len(record), record))
            await w.drain()
            # Wait for this record's report before sending the next one.
            while True:
                line = await asyncio.wait_for(r.readline(), 10)
                buffer += line
                if b'"error_code"' in line:
                    start = line.index(b"{")
                    got.append(json.loads(line[start:].strip()))
                    break
        w.write(b"0\r\n\r\n")
        await w.drain()
        w.close()
        return got

    got = asyncio.run(talk())
    assert [(g["error_code"], g["offset"]) for g in got] == [(200, 0), (200, 1), (200, 2)]
    assert [g.value for g in read_all(reader, topic, 0)] == [b"r0", b"r1", b"r2"]


def test_v3_request_level_errors(cluster: Cluster, create_topic: Callable[..., str]) -> None:
    topic = create_topic()
    r = httpx.post(v3_url(cluster, "no-such-topic"), json={})
    assert_error(
        r,
        404,
        40403,
        "This server does not host this topic-partition. Topic 'no-such-topic' not found.",
    )
    r = httpx.post(v3_url(cluster, topic), content=b"{}", headers={"Content-Type": "text/plain"})
    assert_error(r, 415, 415, "HTTP 415 Unsupported Media Type")
    r = httpx.post(
        v3_url(cluster, topic), content=b" \n ", headers={"Content-Type": "application/json"}
    )
    assert_error(r, 422, 42206, "Payload error. Request body is empty. Data is required.")


def test_v3_record_over_max_message_bytes_is_a_per_record_413(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(configs={"max.message.bytes": "1000"})
    body = orjson.dumps({"value": {"type": "STRING", "data": "x" * 2000}}) + orjson.dumps(
        {"value": {"type": "STRING", "data": "small"}}
    )
    r = httpx.post(
        v3_url(cluster, topic), content=body, headers={"Content-Type": "application/json"}
    )
    got = delivery_reports(r.text)
    assert got[0]["error_code"] == 413
    assert "max.message.bytes (1000)" in got[0]["message"]
    assert got[1]["error_code"] == 200
    assert [g.value for g in read_all(reader, topic, 0)] == [b"small"]


def test_binary_records_at_the_size_limit_and_one_byte_over(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    """The msgspec fast paths (v2 and v3 binary) keep the checked path's limits: a record
    whose one-record batch is exactly max.message.bytes is stored, one byte more is a
    413 in the Confluent shape (the v2 request refused whole, the v3 record alone)."""
    topic = create_topic(configs={"max.message.bytes": "1000"})
    fits = b"k" * 8, b"v" * (1000 - BATCH_OVERHEAD - 8)
    over = fits[0], fits[1] + b"v"
    url = f"{cluster.agents[0]}/topics/{topic}"
    record = {"key": b64(fits[0]), "value": b64(fits[1]), "partition": 0}
    assert post_v2(url, {"records": [record]}).json()["offsets"][0]["offset"] == 0
    r = post_v2(url, {"records": [record, {**record, "value": b64(over[1])}]})
    assert r.status_code == 413
    assert r.json()["error_code"] == 413
    assert "larger than the topic's max.message.bytes (1000)" in r.json()["message"]

    def v3(key: bytes, value: bytes) -> bytes:
        return orjson.dumps(
            {
                "partition_id": 0,
                "key": {"type": "BINARY", "data": b64(key)},
                "value": {"type": "BINARY", "data": b64(value)},
            }
        )

    r = httpx.post(
        v3_url(cluster, topic),
        content=v3(*fits) + v3(*over) + b"%%",
        headers={"Content-Type": "application/json"},
    )
    got = delivery_reports(r.text)
    assert [g["error_code"] for g in got] == [200, 413, 400]
    assert "max.message.bytes (1000)" in got[1]["message"]
    assert [g.value for g in read_all(reader, topic, 0)] == [fits[1], fits[1]]


# -- concurrency -----------------------------------------------------------------------


def test_16_concurrent_producers_over_two_agents(
    cluster: Cluster, reader: LogReader, create_topic: Callable[..., str]
) -> None:
    """Race: 16 producers post keyed batches concurrently, alternating between the two
    agents, so both agents' batchers commit flushes of the same partitions at once.

    Expected: every acked record is readable at its acked offset with its own value;
    each partition's offsets run 0..n-1 with no gap or duplicate; and the log holds
    exactly the acked records (no request failed, so nothing unacked was written).
    """
    topic = create_topic(partitions=6)
    acked: dict[tuple[int, int], bytes] = {}

    def producer(worker: int) -> list[tuple[int, int, bytes]]:
        out = []
        with httpx.Client(timeout=30) as client:
            for n in range(12):
                values = [f"w{worker}-n{n}-r{i}".encode() for i in range(10)]
                body = {"records": [{"key": b64(v[:6]), "value": b64(v)} for v in values]}
                agent = cluster.agents[(worker + n) % 2]
                r = client.post(
                    f"{agent}/topics/{topic}",
                    content=orjson.dumps(body),
                    headers={"Content-Type": BINARY},
                )
                assert r.status_code == 200, r.text
                for v, o in zip(values, r.json()["offsets"], strict=True):
                    assert o["error_code"] is None, o
                    out.append((o["partition"], o["offset"], v))
        return out

    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        for result in pool.map(producer, range(16)):
            for partition, offset, value in result:
                assert (partition, offset) not in acked, "two records acked at one offset"
                acked[(partition, offset)] = value
    assert len(acked) == 16 * 12 * 10
    assert time.monotonic() - started < 60
    total = 0
    for partition in range(6):
        stored = read_all(reader, topic, partition)
        assert [s.offset for s in stored] == list(range(len(stored)))
        for s in stored:
            assert acked[(partition, s.offset)] == s.value
        total += len(stored)
    assert total == len(acked)
