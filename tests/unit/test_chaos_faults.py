"""The chaos nemesis's fault kinds per profile and their undoing at quiescence
(``tests/chaos/faults.py``), without processes: a coordinator is a stand-in that
records its restarts."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.chaos.faults import SKEW, Faults, db_names
from tests.chaos.history import History


@dataclass
class FakeService:
    name: str
    environment: dict[str, str]
    restarts: list[dict[str, str]] = field(default_factory=list)
    alive: bool = True

    def restart(self) -> None:
        self.restarts.append(dict(self.environment))


def topo(*envs: dict[str, str]) -> Any:
    return SimpleNamespace(
        coordinators=[FakeService(f"coordinator-{i}", dict(e)) for i, e in enumerate(envs, 1)]
    )


PG = "postgresql://postgres@127.0.0.1:5432/"


def test_db_names_are_the_catalog_and_the_shards() -> None:
    t = topo({"LAKELOG_DB": PG + "cat", "LAKELOG_DB_SHARDS": f"{PG}s1,{PG}s2?sslmode=disable"})
    assert db_names(t) == ("cat", ["s1", "s2"])
    assert db_names(topo({"LAKELOG_DB": PG + "only"})) == ("only", [])


def test_each_profile_has_the_faults_it_can_take(tmp_path: Path) -> None:
    """SQLite: no database faults; PostgreSQL: killed and refused connections; sharded:
    also a shard down. Clock skew and janitors run now everywhere."""
    hist = History(tmp_path / "h.jsonl")
    stop = threading.Event()
    sqlite = Faults(topo({"LAKELOG_DB": "sqlite:///x.db"}), hist, stop, "sqlite")
    assert sqlite.kinds() == ["clock_skew", "janitor_now"]
    pg = Faults(topo({"LAKELOG_DB": PG + "a"}), hist, stop, "postgres")
    assert pg.kinds() == ["clock_skew", "janitor_now", "pg_kill", "pg_refuse"]
    sharded = Faults(
        topo({"LAKELOG_DB": PG + "a", "LAKELOG_DB_SHARDS": f"{PG}b,{PG}c"}), hist, stop, "sharded"
    )
    assert sharded.kinds()[-1] == "shard_down"
    assert sharded.pg is not None and sharded.pg.names == ["a", "b", "c"]
    hist.close()


def test_quiescence_restarts_skewed_coordinators_at_zero(tmp_path: Path) -> None:
    """``undo``: a coordinator left skewed (the run stopped mid-fault) is restarted with
    its clock back at the host's; one never skewed, or back at 0, is left running."""
    hist = History(tmp_path / "h.jsonl")
    t = topo(
        {"LAKELOG_DB": "sqlite:///x.db", SKEW: "-2500"},
        {"LAKELOG_DB": "sqlite:///x.db"},
        {"LAKELOG_DB": "sqlite:///x.db", SKEW: "0"},
    )
    Faults(t, hist, threading.Event(), "sqlite").undo()
    skewed, plain, zero = t.coordinators
    assert skewed.restarts == [{"LAKELOG_DB": "sqlite:///x.db", SKEW: "0"}]
    assert plain.restarts == [] and zero.restarts == []
    hist.close()
