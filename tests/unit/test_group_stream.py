"""The group stream's cursor, and the OpenAPI at /docs documenting issue 16's routes and
the Idempotency-Key header."""

from __future__ import annotations

from pathlib import Path

import pytest

from segments.errors import MalformedRequestError
from segments.types import TopicPartition
from service.app import create_app
from service.settings import Settings
from service.v3.group_stream import NDJSON, SSE, decode_cursor, encode_cursor


def test_a_cursor_round_trips_and_a_foreign_one_is_refused() -> None:
    positions = {TopicPartition("a:b", 3): 17, TopicPartition("t", 0): 0}
    assert decode_cursor(encode_cursor(positions)) == positions
    for bad in ("not-a-cursor", encode_cursor({}) + "x", "eyJhIjogLTF9"):
        with pytest.raises(MalformedRequestError):
            decode_cursor(bad)


def test_the_openapi_documents_the_consume_routes(tmp_path: Path) -> None:
    app = create_app(
        Settings(store="memory://docs", db=f"sqlite:///{tmp_path / 'm.db'}", janitors="none")
    )
    paths = app.openapi()["paths"]
    stream = paths["/v3/clusters/{cluster_id}/consumer-groups/{group_id}/records"]["get"]
    assert set(stream["responses"]["200"]["content"]) == {SSE, NDJSON}
    assert {p["name"] for p in stream["parameters"]} >= {"topics", "cursor", "last-event-id"}
    read = paths["/v3/clusters/{cluster_id}/topics/{topic_name}/partitions/{partition_id}/records"]
    assert {p["name"] for p in read["get"]["parameters"]} >= {"offset", "max_bytes", "timeout_ms"}
    assert "post" in paths["/v3/clusters/{cluster_id}/producers"]
    for path in (
        "/topics/{topic}",
        "/topics/{topic}/partitions/{partition}",
        "/v3/clusters/{cluster_id}/topics/{topic_name}/records",
        "/v3/clusters/{cluster_id}/topics/{topic_name}/records:batch",
    ):
        names = {p["name"] for p in paths[path]["post"]["parameters"]}
        assert "Idempotency-Key" in names, path
