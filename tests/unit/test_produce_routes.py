"""The produce routes are served by their shortcuts (``service.web.ShortcutRoute``):
plain Starlette routes ahead of the FastAPI ones, answering as those did."""

from __future__ import annotations

from pathlib import Path

import orjson
from fastapi import Request
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from service.state import AgentState, get_state

BINARY = {"Content-Type": "application/vnd.kafka.binary.v2+json"}


async def _no_state(request: Request) -> AgentState:
    raise RuntimeError("FastAPI's dependencies ran")


def test_produce_routes_skip_fastapi_dependencies_and_answer_as_before(tmp_path: Path) -> None:
    """With FastAPI's ``get_state`` dependency broken, v2 and v3 produce still answer
    (their shortcuts read the agent's state themselves) while a route served by FastAPI
    fails; a partition that is not digits is still answered by the FastAPI route (404)."""
    settings = Settings(db=f"sqlite:///{tmp_path}/meta.db", store=f"file://{tmp_path}/data")
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        cid = client.get("/v3/clusters").json()["data"][0]["cluster_id"]
        topics = f"/v3/clusters/{cid}/topics"
        created = client.post(topics, json={"topic_name": "t", "partitions_count": 2})
        assert created.status_code == 201
        bad_partition = client.post("/topics/t/partitions/x", json={"records": []}, headers=BINARY)
        app.dependency_overrides[get_state] = _no_state
        try:
            keyed = client.post("/topics/t", json={"records": [{"value": "aGk="}]}, headers=BINARY)
            placed = client.post(
                "/topics/t/partitions/1", json={"records": [{"value": "aGk="}]}, headers=BINARY
            )
            v3 = client.post(
                f"{topics}/t/records",
                content=orjson.dumps({"partition_id": 0, "value": {"type": "STRING", "data": "a"}}),
                headers={"Content-Type": "application/json"},
            )
            assert client.get("/topics/t").status_code == 500  # FastAPI's route: broken
        finally:
            app.dependency_overrides.clear()
        assert client.post(
            "/topics/t/partitions/x", json={"records": []}, headers=BINARY
        ).json() == (bad_partition.json())
    assert keyed.status_code == 200
    assert keyed.json()["offsets"][0]["error_code"] is None
    assert placed.status_code == 200
    assert placed.json()["offsets"][0]["partition"] == 1
    assert v3.status_code == 200
    assert orjson.loads(v3.content.splitlines()[0])["error_code"] == 200
    assert bad_partition.status_code == 404
