"""The group stream's cursor, and the OpenAPI at /docs documenting issue 16's routes and
the Idempotency-Key header."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from coordinator.client import TopicPartition
from segments.errors import MalformedRequestError
from segments.segment import SegmentBuilder
from segments.types import Record
from service.app import create_app
from service.settings import Settings
from service.v3 import group_stream
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


class _Client:
    """ASGI receive/send of one streaming GET, as uvicorn serves it, that hangs up once
    ``hang_up(bodies)``."""

    def __init__(self, hang_up: Callable[[list[bytes]], bool]) -> None:
        self.hang_up = hang_up
        self.bodies: list[bytes] = []
        self.gone = asyncio.Event()
        self.answered = asyncio.Event()  # a first body came
        self._first = True

    async def receive(self) -> dict[str, Any]:
        if self._first:
            self._first = False
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.gone.is_set():
            return  # as uvicorn: what is sent after a hang-up goes nowhere, silently
        if message["type"] == "http.response.start":  # a stream has no length
            assert b"content-length" not in dict(message["headers"]), message
        if message["type"] == "http.response.body":
            self.bodies.append(message.get("body", b""))
            self.answered.set()
            if self.hang_up(self.bodies):
                self.gone.set()
        await asyncio.sleep(0)


def _stream_scope(path: str, query: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [(b"host", b"test"), (b"accept", NDJSON.encode())],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
        "root_path": "",
    }


def test_a_round_cut_short_by_a_hang_up_is_not_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22 defect 9. Race: the client hangs up while the stream sends a round of
    ~1,000 records (after its first MiB). Expected: the group's committed offset does not
    move (nothing was delivered), and a client reconnecting without a cursor gets that
    round again from offset 0. A client that hangs up in its second round: the first
    round, delivered, is what the group commits. (Rounds of 1 MiB here, for three of them
    in 3,000 records of 1 KiB.)"""
    monkeypatch.setattr(group_stream, "ROUND_BYTES", 1 << 20)
    db = f"sqlite:///{tmp_path / 'm.db'}"
    app = create_app(Settings(store="memory://stream", db=db, janitors="none"))
    tp = TopicPartition("s", 0)

    async def stream(path: str, client: _Client) -> list[bytes]:
        scope = _stream_scope(path, "topics=s&commit_interval_ms=0")
        await asyncio.wait_for(app(scope, client.receive, client.send), 30)
        return client.bodies

    async def main() -> None:
        async with app.router.lifespan_context(app):
            state = app.state.agent
            info = state.coordinator.create_topic("s", 1)
            b = SegmentBuilder()
            b.append(info.topic_id, 0, [Record(None, b"x" * 1024, 1000) for _ in range(3000)])
            state.writer.write(b)
            path = f"/v3/clusters/{state.cluster_id}/consumer-groups/g/records"

            cut = b"".join(await stream(path, _Client(lambda bodies: len(bodies) == 1)))
            await asyncio.sleep(0.5)  # a commit left running in the background lands
            assert state.groups.committed_offsets("g", [tp]) == {}
            assert 0 < cut.count(b"\n") < 1000  # the client got the first MiB of the round

            # Hangs up once a line of the second round arrived: the first round, whose
            # held-back last byte went out with no hang-up after it, is delivered.
            bodies = await stream(
                path, _Client(lambda bodies: b"".join(bodies).count(b"\n") > 1100)
            )
            lines = b"".join(bodies).splitlines()
            assert orjson.loads(lines[0])["offset"] == 0  # the cut round came again
            end_of_first = next(i for i, body in enumerate(bodies) if len(body) == 1)
            first_round = b"".join(bodies[: end_of_first + 1]).splitlines()
            last = orjson.loads(first_round[-1])["offset"]
            assert last == len(first_round) - 1 < len(lines) - 1
            assert state.groups.committed_offsets("g", [tp])[tp].offset == last + 1

    asyncio.run(main())


def test_partitions_added_while_streaming_join_the_stream(tmp_path: Path) -> None:
    """The seam pass: a stream of a one-partition topic; partitions are added and a record
    written to the new one. Expected: the stream delivers it (from the new partition's
    beginning, auto_offset_reset earliest) without a reconnect."""
    db = f"sqlite:///{tmp_path / 'm.db'}"
    settings = Settings(store="memory://grow", db=db, janitors="none", metadata_ttl_s=0.05)
    app = create_app(settings)

    async def main() -> list[dict[str, Any]]:
        async with app.router.lifespan_context(app):
            state = app.state.agent
            info = state.coordinator.create_topic("g", 1)

            def write(partition: int, value: bytes) -> None:
                b = SegmentBuilder()
                b.append(info.topic_id, partition, [Record(None, value, 1000)])
                state.writer.write(b)

            write(0, b"first")

            def seen(bodies: list[bytes]) -> bool:
                return b'"partition":1' in b"".join(bodies)

            client = _Client(seen)

            async def grow() -> None:
                await client.answered.wait()
                state.coordinator.add_partitions("g", 2)
                state.topics.invalidate("g")
                write(1, b"second")

            path = f"/v3/clusters/{state.cluster_id}/consumer-groups/grow/records"
            scope = _stream_scope(path, "topics=g&keepalive_ms=100")
            await asyncio.wait_for(
                asyncio.gather(app(scope, client.receive, client.send), grow()), 30
            )
            lines = b"".join(client.bodies).splitlines()
            return [orjson.loads(x) for x in lines if b'"offset"' in x]

    got = asyncio.run(main())
    assert [(r["partition"], r["offset"]) for r in got] == [(0, 0), (1, 0)]


def test_a_cursor_outside_the_log_is_reset_by_auto_offset_reset(tmp_path: Path) -> None:
    """Issue 22 defect 9: a cursor past the high watermark (written for a topic since
    deleted and created again) or below log-start starts where auto_offset_reset says,
    never past the end of the log (where the stream would skip records to come)."""
    db = f"sqlite:///{tmp_path / 'm.db'}"
    app = create_app(Settings(store="memory://cursor", db=db, janitors="none"))

    async def first_line(path: str, query: str) -> dict[str, Any]:
        client = _Client(lambda bodies: bool(bodies))
        await asyncio.wait_for(app(_stream_scope(path, query), client.receive, client.send), 30)
        line: dict[str, Any] = orjson.loads(b"".join(client.bodies).splitlines()[0])
        return line

    async def main() -> None:
        async with app.router.lifespan_context(app):
            state = app.state.agent
            info = state.coordinator.create_topic("c", 1)
            b = SegmentBuilder()
            b.append(info.topic_id, 0, [Record(None, b"v%d" % i, 1000) for i in range(5)])
            state.writer.write(b)
            state.coordinator.delete_records("c", 0, 2)
            path = f"/v3/clusters/{state.cluster_id}/consumer-groups/cg/records"
            past = encode_cursor({TopicPartition("c", 0): 50})
            got = await first_line(path, f"topics=c&cursor={past}")
            assert got["offset"] == 2  # earliest: log-start
            below = encode_cursor({TopicPartition("c", 0): 1})
            got = await first_line(
                path, f"topics=c&cursor={below}&auto_offset_reset=latest&keepalive_ms=100"
            )
            assert got == {"keepalive": True}  # latest: the end, nothing to send yet
            inside = encode_cursor({TopicPartition("c", 0): 3})
            assert (await first_line(path, f"topics=c&cursor={inside}"))["offset"] == 3

    asyncio.run(main())


def test_a_stream_reads_across_rounds_of_its_full_size(tmp_path: Path) -> None:
    """More records than one round holds (``ROUND_BYTES``, 4 MiB) in batches of 1,000
    over two partitions, so rounds end inside batches: every record comes once, in offset
    order per partition, and the group commits the round it delivered whole."""
    db = f"sqlite:///{tmp_path / 'm.db'}"
    app = create_app(Settings(store="memory://rounds", db=db, janitors="none"))
    per_partition = group_stream.ROUND_BYTES // 1024 * 3 // 4  # 1.5 rounds in all

    async def main() -> None:
        async with app.router.lifespan_context(app):
            state = app.state.agent
            info = state.coordinator.create_topic("s", 2)
            for p in (0, 1):
                for first in range(0, per_partition, 1000):
                    b = SegmentBuilder()
                    count = min(1000, per_partition - first)
                    b.append(info.topic_id, p, [Record(None, b"x" * 1024, 1) for _ in range(count)])
                    state.writer.write(b)
            path = f"/v3/clusters/{state.cluster_id}/consumer-groups/g/records"
            client = _Client(lambda bodies: b"".join(bodies).count(b"\n") >= 2 * per_partition)
            scope = _stream_scope(path, "topics=s&commit_interval_ms=0")
            await asyncio.wait_for(app(scope, client.receive, client.send), 60)
            docs = [orjson.loads(line) for line in b"".join(client.bodies).splitlines()]
            assert len(client.bodies) > 2  # more than one round's chunk
            for p in (0, 1):
                assert [d["offset"] for d in docs if d["partition"] == p] == list(
                    range(per_partition)
                )
            committed = state.groups.committed_offsets(
                "g", [TopicPartition("s", 0), TopicPartition("s", 1)]
            )
            # The first round is delivered; the client hung up in the second's last chunk.
            first_round = group_stream.ROUND_BYTES // 1024
            assert sum(c.offset for c in committed.values()) == first_round
            assert all(0 < c.offset < per_partition for c in committed.values())

    asyncio.run(main())


def test_a_streams_rounds_are_held_against_the_agents_fetch_memory(tmp_path: Path) -> None:
    """With the agent's fetch memory at 2 MiB (``consumer_fetch_memory_bytes``, shared with
    the v2 and v3 fetches), a stream's rounds are granted from it: no round holds more,
    the grant is in use while a round is sent, given back after, and every record comes."""
    db = f"sqlite:///{tmp_path / 'm.db'}"
    settings = Settings(
        store="memory://budget", db=db, janitors="none", consumer_fetch_memory_bytes=2 << 20
    )
    app = create_app(settings)
    total = 5000

    async def main() -> None:
        async with app.router.lifespan_context(app):
            state = app.state.agent
            budget = state.consumers.budget
            info = state.coordinator.create_topic("s", 1)
            for _ in range(total // 1000):
                b = SegmentBuilder()
                b.append(info.topic_id, 0, [Record(None, b"x" * 1024, 1) for _ in range(1000)])
                state.writer.write(b)
            in_use: list[int] = []

            def seen(bodies: list[bytes]) -> bool:
                in_use.append(budget.in_use)
                return b"".join(bodies).count(b"\n") >= total

            client = _Client(seen)
            path = f"/v3/clusters/{state.cluster_id}/consumer-groups/g/records"
            scope = _stream_scope(path, "topics=s&commit_interval_ms=0")
            await asyncio.wait_for(app(scope, client.receive, client.send), 60)
            offsets = [
                orjson.loads(line)["offset"] for line in b"".join(client.bodies).splitlines()
            ]
            assert offsets == list(range(total))
            assert max(body.count(b"\n") for body in client.bodies) <= 2048  # 2 MiB a round
            assert 0 < max(in_use) <= 2 << 20
            assert budget.in_use == 0

    asyncio.run(main())
