"""What operators' group calls cost as a group grows: the v3 lags view (what ``lakelog
groups describe`` reads), a reset-offsets dry run and execute over every partition, and
the consumer-group lag collector one /metrics scrape runs.

In-process agent (``lakelog serve``'s app, SQLite, a memory store), one group with a
committed offset on every partition of one topic, and 100 such groups for the collector.
Prints one JSON line per size:

    {"bench": "groups", "partitions": 10000, "lags_ms": ..., "reset_dry_run_ms": ...,
     "reset_execute_ms": ..., "coordinator_calls_per_reset": 4,
     "lag_scrape_ms_100_groups": ...}

Run: ``.venv/bin/python bench/groups.py`` (under a minute); progress on stderr.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from coordinator.client import ChunkCommit, TopicPartition
from coordinator.groups.model import CommittedOffset
from service.app import create_app
from service.settings import Settings

SIZES = (1_000, 10_000)
GROUPS_FOR_SCRAPE = 100


class Counting:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name == "heartbeat_agent":
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return attr(*args, **kwargs)

        return counted


def timed_ms(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return round((time.perf_counter() - start) * 1000, 1), out


def bench(partitions: int, tmp: Path) -> dict[str, Any]:
    settings = Settings(db=f"sqlite:///{tmp / f'meta-{partitions}.db'}", store="memory://")
    app = create_app(settings)
    with TestClient(app) as client:
        state = app.state.agent
        coordinator = state.coordinator
        coordinator.create_topic("t", partitions)
        topic_id = coordinator.get_topic("t").topic_id
        coordinator.commit(
            "obj", [ChunkCommit(topic_id, p, 0, 1, 9, 1, 2) for p in range(partitions)]
        )
        offsets = {TopicPartition("t", p): CommittedOffset(p % 9) for p in range(partitions)}
        for g in range(GROUPS_FOR_SCRAPE):
            coordinator.alter_group_offsets(f"g{g}", offsets)
        cid = coordinator.cluster_id()
        base = f"/v3/clusters/{cid}/consumer-groups/g0"

        lags_ms, r = timed_ms(lambda: client.get(f"{base}/lags"))
        assert r.status_code == 200 and len(r.json()["data"]) == partitions
        body = {"partitions": [{"topic_name": "t"}], "strategy": "EARLIEST"}
        dry_ms, r = timed_ms(lambda: client.post(f"{base}/offsets:reset", json=body))
        assert r.status_code == 200
        counting = Counting(coordinator)
        state.coordinator = state.groups = counting
        execute_ms, r = timed_ms(
            lambda: client.post(f"{base}/offsets:reset", json={**body, "validate_only": False})
        )
        assert r.status_code == 200
        state.coordinator = state.groups = coordinator
        scrape_ms, rows = timed_ms(coordinator.group_lag)
        assert len(rows) == GROUPS_FOR_SCRAPE
    return {
        "bench": "groups",
        "partitions": partitions,
        "lags_ms": lags_ms,
        "reset_dry_run_ms": dry_ms,
        "reset_execute_ms": execute_ms,
        "coordinator_calls_per_reset": counting.calls,
        "lag_scrape_ms_100_groups": scrape_ms,
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for partitions in SIZES:
            print(f"groups: {partitions} partitions ...", file=sys.stderr)
            print(json.dumps(bench(partitions, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
