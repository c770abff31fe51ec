"""deploy/grafana/lakelog.json queries only metrics lakelog exports.

The exported names come from the real registries: an agent app (``lakelog serve``'s,
in-process coordinator included) through its lifespan, and the app ``lakelog
coordinator`` serves (``create_process_app``, with a store so the janitors' metrics are
there). Families are read from the registries, not scraped, so labelled metrics that
have no sample yet count too; each family gives the sample names Prometheus sees.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from coordinator.http.server import create_process_app
from coordinator.local import LocalCoordinator
from segments.memory import MemoryStore
from service.app import create_app
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "lakelog.json"
METRIC = re.compile(r"\blakelog_[a-z0-9_]+\b")

#: What the issue asks the dashboard to show, by the metric each panel rests on.
REQUIRED = {
    "lakelog_produced_records_total": "produce rate",
    "lakelog_consumed_records_total": "fetch rate",
    "lakelog_flush_bytes_bucket": "flush size",
    "lakelog_flush_seconds_bucket": "flush latency",
    "lakelog_put_seconds_count": "PUT count",
    "lakelog_store_gets_total": "GET count",
    "lakelog_commit_seconds_bucket": "commit latency (agent)",
    "lakelog_coordinator_commit_seconds_bucket": "commit latency (coordinator)",
    "lakelog_consumer_group_lag": "group lag",
    "lakelog_janitor_lag_seconds": "janitor lag",
}

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def sample_names(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def exported(tmp_path: Path) -> set[str]:
    settings = Settings(db=f"sqlite:///{tmp_path / 'agent.db'}", store="memory://")
    app = create_app(settings)
    with TestClient(app):
        names = sample_names(app.state.agent.metrics.registry)
    coordinator = LocalCoordinator(f"sqlite:///{tmp_path / 'coordinator.db'}")
    try:
        served = create_process_app(coordinator, MemoryStore("dashboard"), None)
        names |= sample_names(served.state.metrics.registry)
    finally:
        coordinator.close()
    return names


def walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def test_every_query_names_metrics_we_export(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [d["expr"] for d in walk(dashboard) if "expr" in d]
    assert exprs, "no queries?"
    have = exported(tmp_path)
    used: set[str] = set()
    for expr in exprs:
        names = set(METRIC.findall(expr))
        assert names, f"a query on no lakelog metric: {expr}"
        assert names <= have, f"{expr}: not exported: {sorted(names - have)}"
        assert expr.count("(") == expr.count(")"), expr
        used |= names
    missing = {name: what for name, what in REQUIRED.items() if name not in used}
    assert not missing, f"the dashboard shows no {missing}"


def test_dashboard_is_well_formed() -> None:
    """Unique panel ids, a grid position each, refIds unique per panel, one datasource
    variable that every query uses."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    (variable,) = dashboard["templating"]["list"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    for p in panels:
        assert {"h", "w", "x", "y"} <= p["gridPos"].keys()
        targets = p.get("targets", [])
        assert len({t["refId"] for t in targets}) == len(targets)
        for t in targets:
            assert t["datasource"]["uid"] == "${" + variable["name"] + "}"
