"""The agent's process-level settings for speed (issue 29), in-process on SQLite and a
file store: what startup built is out of the garbage collector's sight while the agent
runs (a full collection walking it cost 45% of the event loop under REST produce)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings


def test_startup_objects_are_frozen_while_the_agent_runs(tmp_path: Path) -> None:
    settings = Settings(db=f"sqlite:///{tmp_path}/meta.db", store=f"file://{tmp_path}/data")
    app = create_app(settings)
    gc.unfreeze()  # whatever an earlier test left
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        frozen = gc.get_freeze_count()
        # The app, its clients and the coordinator's engine: many thousands of objects.
        assert frozen > 10_000, frozen
        # A produce still works with them frozen (the frozen ones are never collected,
        # the request's own objects are).
        cid = client.get("/v3/clusters").json()["data"][0]["cluster_id"]
        r = client.post(
            f"/v3/clusters/{cid}/topics", json={"topic_name": "t", "partitions_count": 1}
        )
        assert r.status_code == 201, r.text
        r = client.post(
            "/topics/t",
            json={"records": [{"value": "eA=="}]},
            headers={"Content-Type": "application/vnd.kafka.binary.v2+json"},
        )
        assert r.json()["offsets"][0]["offset"] == 0, r.text
    assert gc.get_freeze_count() == 0  # unfrozen at shutdown


def test_produce_routes_are_matched_first(tmp_path: Path) -> None:
    """FastAPI tries the routes in order: produce, the hot path, comes before the other
    API routes (it came after ~65 of them), and GET on its paths still finds metadata."""
    settings = Settings(db=f"sqlite:///{tmp_path}/meta.db", store=f"file://{tmp_path}/data")
    app = create_app(settings)

    def walk(routes: list[Any]) -> Iterator[str]:  # included routers hold their routes
        for route in routes:
            if hasattr(route, "original_router"):
                yield from walk(route.original_router.routes)
            else:
                yield getattr(route, "path", "")

    paths = list(walk(app.routes))
    api = [p for p in paths if p.startswith(("/topics", "/v3/"))]
    # The produce shortcuts (service.web.ShortcutRoute), then their FastAPI routes.
    assert api[:3] == [
        "/topics/{topic}",
        "/topics/{topic}/partitions/{partition:int}",
        "/v3/clusters/{cluster_id}/topics/{topic_name}/records",
    ]
    assert api[3:5] == ["/topics/{topic}", "/topics/{topic}/partitions/{partition}"]
    assert api[5] == "/v3/clusters/{cluster_id}/topics/{topic_name}/records"
