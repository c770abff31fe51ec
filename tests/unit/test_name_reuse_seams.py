"""The seam pass of issue 22: names reused and topics changed under a request, through
an in-process agent (the other agent modelled by calls on the coordinator)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import httpx
import orjson

from service.app import create_app
from service.settings import Settings

V2 = "application/vnd.kafka.binary.v2+json"


def _with_agent(tmp_path: Path, body: Any) -> Any:
    settings = Settings(
        store="memory://seams",
        db=f"sqlite:///{tmp_path / 'm.db'}",
        janitors="none",
        metadata_ttl_s=60,
    )
    app = create_app(settings)

    async def main() -> Any:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://agent") as c:
                return await body(app.state.agent, c)

    return asyncio.run(main())


def test_a_topic_made_again_elsewhere_is_produced_to_after_one_failure(tmp_path: Path) -> None:
    """A topic this agent has cached is deleted and created again through another agent.
    The first produce here fails (its flush names the old topic id; Kafka answers
    UNKNOWN_TOPIC_OR_PARTITION there too), the next ones go to the new topic at once,
    not only after metadata_ttl_s (60 s here). Before: every produce failed for the TTL."""

    async def body(st: Any, c: httpx.AsyncClient) -> list[Any]:
        st.coordinator.create_topic("again", 1)
        v3 = f"/v3/clusters/{st.cluster_id}/topics/again/records"
        one = {"value": {"type": "BINARY", "data": base64.b64encode(b"x").decode()}}
        v2 = {"records": [{"value": base64.b64encode(b"y").decode()}]}
        assert (await c.post(v3, json=one)).json()["error_code"] == 200
        out = []
        for send in (
            lambda: c.post(v3, json=one),
            lambda: c.post("/topics/again", json=v2, headers={"Content-Type": V2}),
        ):
            st.coordinator.delete_topic("again")
            st.coordinator.create_topic("again", 1)
            out.append([(await send()).json() for _ in range(2)])
        out.append(st.coordinator.offsets("again", 0).high_watermark)
        return out

    v3, v2, high_watermark = _with_agent(tmp_path, body)
    assert v3[0]["error_code"] == 40403, v3
    assert v3[1]["error_code"] == 200 and v3[1]["offset"] == 0, v3
    assert v2[0]["offsets"][0]["error_code"] is not None, v2
    assert v2[1]["offsets"][0] == {
        "partition": 0,
        "offset": 0,
        "error_code": None,
        "error": None,
    }, v2
    assert high_watermark == 1


def test_a_keyed_request_retried_after_partitions_were_added_gets_its_offsets(
    tmp_path: Path,
) -> None:
    """A v3 and a v2 request under an Idempotency-Key (keyed and keyless records), then
    partitions added to the topic, then each request retried: the retries are answered
    with the first answers and store nothing. Before: a retry hashed the records' keys
    over the new count, did not match what was stored and was answered 500."""

    def b64(s: str) -> str:
        return base64.b64encode(s.encode()).decode()

    v3_body = b"".join(
        orjson.dumps(
            {
                "value": {"type": "BINARY", "data": b64(f"v{j}")},
                **({"key": {"type": "BINARY", "data": b64(f"key-{j}")}} if j % 3 else {}),
            }
        )
        for j in range(6)
    )
    v2_body = {
        "records": [
            {"value": b64(f"w{j}"), **({"key": b64(f"key-{j}")} if j % 3 else {})} for j in range(6)
        ]
    }

    async def body(st: Any, c: httpx.AsyncClient) -> list[Any]:
        st.coordinator.create_topic("grown", 2)
        v3 = f"/v3/clusters/{st.cluster_id}/topics/grown/records"

        async def send() -> list[Any]:
            a = await c.post(
                v3,
                content=v3_body,
                headers={"Content-Type": "application/json", "Idempotency-Key": "k-3"},
            )
            b = await c.post(
                "/topics/grown",
                json=v2_body,
                headers={"Content-Type": V2, "Idempotency-Key": "k-2"},
            )
            return [[orjson.loads(line) for line in a.text.splitlines()], b.json()]

        first = await send()
        st.coordinator.add_partitions("grown", 16)
        st.topics.invalidate("grown")
        again = await send()
        stored = sum(st.coordinator.offsets("grown", p).high_watermark for p in range(16))
        return [first, again, stored]

    first, again, stored = _with_agent(tmp_path, body)
    assert stored == 12  # each request once
    assert [r["error_code"] for r in first[0]] == [200] * 6, first
    assert [o["error_code"] for o in first[1]["offsets"]] == [None] * 6, first
    assert again == first


def test_a_v3_read_during_which_its_topic_is_made_again_is_refused(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A v3 read by offset whose topic is deleted and created again while it reads (the
    chaos run's ``past_hw``, seed 41): the records came from the first topic, the offsets
    asked after them from the second; the answer was both (records at 0-2, high watermark
    0). Now it is 404 40403, and the next read serves the new, empty topic."""
    import service.v3.consume as consume

    real = consume.read_round_robin
    recreated: list[bool] = []

    def read_then_recreate(reader: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(reader, *args, **kwargs)
        if not recreated:
            recreated.append(True)
            reader.coordinator.delete_topic("mid")
            reader.coordinator.create_topic("mid", 1)
        return out

    monkeypatch.setattr(consume, "read_round_robin", read_then_recreate)

    async def body(st: Any, c: httpx.AsyncClient) -> list[Any]:
        st.coordinator.create_topic("mid", 1)
        v2 = {"records": [{"value": base64.b64encode(b"r%d" % i).decode()} for i in range(3)]}
        r = await c.post("/topics/mid", json=v2, headers={"Content-Type": V2})
        assert r.status_code == 200, r.text
        url = f"/v3/clusters/{st.cluster_id}/topics/mid/partitions/0/records"
        return [(await c.get(url)).json() for _ in range(2)]

    during, after = _with_agent(tmp_path, body)
    assert during["error_code"] == 40403, during
    assert "deleted while it was read" in during["message"]
    assert (after["records"], after["high_watermark"]) == ([], 0)
