"""The chaos run's targeted probes catch the deliberately broken builds, and the normal
build passes them.

One cluster for the module (SQLite, one coordinator, two agents behind the load
balancer, moto without faults: the probes are deterministic); each test restarts the
agents and the coordinator with its build (``LAKELOG_CHAOS_BREAK``), runs the probes of
``tests.chaos.run`` into a history of its own and checks it with the chaos checker:

- ``reincarnate``: topic ``reborn`` written and read through one agent, deleted, created
  again, written and read at offset 0 through the same agent within its index cache's
  lifetime. ``stale_cache`` (the index cache keyed by topic name) serves the old
  incarnation's records: ``wrong_incarnation``.
- ``idempotent_round`` with each probe: a batch resent as it was (``resend``), a zombie
  of an older epoch writing after the next epoch wrote (``zombie``), a batch whose
  sequence skips ahead (``gap``). ``no_fencing`` (epoch and sequence checks skipped)
  stores the resend again (``retry_answer_differs``, ``duplicate``) and accepts the
  others (``zombie_write``, ``out_of_sequence_write``).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.checker import Report, check
from tests.chaos.history import History, read_history
from tests.chaos.run import AGENT_ENV, IdempotentState, Params, Run
from tests.integration.topology import Topology, moto_topology

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 3
PROBED = ("stable", "reborn")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    with moto_topology(
        tmp_path_factory.mktemp("chaos-probes"),
        agents=2,
        coordinators=1,
        # Agents' metadata cached longer than the run's 1 s: an agent still answers a
        # recreated topic's last id for a while after the create (what the workload
        # must not record as the new incarnation's).
        agent_env={**AGENT_ENV, "LAKELOG_METADATA_TTL_S": "3"},
        faults=False,
    ) as topo:
        yield topo


def with_build(topo: Topology, broken: str | None, always: bool = True) -> None:
    """Restart the coordinator and the agents as build ``broken`` (None: the normal one);
    not ``always``: only those of another build."""
    for s in [*topo.coordinators, *topo.agents]:
        if not always and s.environment.get("LAKELOG_CHAOS_BREAK") == broken:
            continue
        s.environment.pop("LAKELOG_CHAOS_BREAK", None)
        if broken is not None:
            s.environment["LAKELOG_CHAOS_BREAK"] = broken
        s.restart()


def probe(topo: Topology, tmp: Path, broken: str | None) -> tuple[Report, list[dict]]:
    """Every probe, several times, on fresh topics; the checked history."""
    with_build(topo, broken)
    path = tmp / "history.jsonl"
    hist = History(path)
    run = Run(topo, hist, Params(SEED, 0, "sqlite", tmp))
    for topic in PROBED:  # what an earlier test left is no part of this history
        old = run.topic_id(topic)  # the agents restarted: no stale metadata yet
        run.topic_ids[topic] = {old} if old else set()
        run.delete_topic("setup", topic)
        assert run.create_topic("setup", topic), topic
    rng = random.Random(SEED)
    n = itertools.count(1)
    for _ in range(3):
        run.reincarnate("reborn-1", rng, n)
    state = IdempotentState()
    with run.client() as c:
        for kind in ["none", "resend", "none", "zombie", "none", "gap", "resend", "zombie"]:
            run.idempotent_round(c, "idem-1", rng, state, probe=kind)
    run.final_reads(PROBED, groups=())
    hist.close()
    events = list(read_history(path))
    assert run.errors == [], run.errors
    return check(events), events


def outcomes(events: list[dict], **match: object) -> list[str]:
    """The outcomes of the operations whose invoke has the fields ``match``."""
    ids = {
        e["id"]
        for e in events
        if e["type"] == "invoke" and all(e.get(k) == v for k, v in match.items())
    }
    return [e["type"] for e in events if e["id"] in ids and e["type"] != "invoke"]


def test_the_normal_build_passes_every_probe(cluster: Topology, tmp_path: Path) -> None:
    report, events = probe(cluster, tmp_path, None)
    assert report.anomalies == [], report.anomalies
    # The probes ran: reborn created again three times and read at offset 0 after each,
    # resends answered with the first offsets, zombies and gaps refused outright.
    assert outcomes(events, op="create_topic", topic="reborn").count("ok") == 4
    # Each incarnation recorded with its own id (never the last one's, which an agent's
    # metadata cache may still answer), the last one the final read's.
    ids = [e["topic_id"] for e in events if e["op"] == "create_topic" and e["type"] == "ok"]
    assert len(ids) == len(set(ids)) == 5, ids
    final = [
        e
        for e in events
        if e["op"] == "final_read" and e.get("topic_id") and e["topic"] == "reborn"
    ]
    assert final[0]["topic_id"] == ids[-1], (final, ids)
    reads = [e for e in events if e["op"] == "read" and e["type"] == "ok"]
    assert len(reads) == 6 and all(r["records"] for r in reads), reads
    resends = [e for e in events if e["op"] == "resend"]
    assert [e["same"] for e in resends] == [True, True], resends
    assert outcomes(events, op="produce", probe="zombie") == ["fail", "fail"]
    assert outcomes(events, op="produce", probe="gap") == ["fail"]
    assert report.records["acked_found"] > 20, report.records


def test_a_recreated_topic_is_recorded_with_its_new_id(
    cluster: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by ``make chaos PROFILE=sqlite SEED=302`` (``wrong_incarnation`` on the normal
    build): the workload took a recreated topic's id from an agent's metadata, which for
    ``LAKELOG_METADATA_TTL_S`` after the create may still be the deleted incarnation's
    (the agent that served the delete and create forgets it, the other does not), and
    gave the new incarnation's records to the old one. Here the Kafka door answers the
    deleted incarnation's id twice after the create: ``create_topic`` must wait for the
    new one."""
    with_build(cluster, None, always=False)
    hist = History(tmp_path / "history.jsonl")
    run = Run(cluster, hist, Params(SEED, 0, "sqlite", tmp_path))
    run.delete_topic("setup", "churn")
    assert run.create_topic("setup", "churn")
    (old,) = run.topic_ids["churn"]
    real = run.topic_id
    stale = iter([old, old])
    monkeypatch.setattr(run, "topic_id", lambda topic: next(stale, None) or real(topic))
    assert run.delete_topic("admin", "churn")
    assert run.create_topic("admin", "churn")
    new = real("churn")
    assert new != old and run.topic_ids["churn"] == {old, new}, (old, new, run.topic_ids)
    # A create answered "already exists" (the delete before it failed): the incarnation
    # living on, recorded with its id once the metadata has had time to change.
    assert run.create_topic("admin", "churn")
    hist.close()
    created = [e for e in read_history(hist.path) if e["op"] == "create_topic" and "topic_id" in e]
    assert [(e["topic_id"], e["existed"]) for e in created] == [
        (old, False),
        (new, False),
        (new, True),
    ], created


def test_a_stale_index_cache_is_caught(cluster: Topology, tmp_path: Path) -> None:
    report, _ = probe(cluster, tmp_path, "stale_cache")
    assert "wrong_incarnation" in report.counts, report.summary()
    # A read of reborn's new incarnation at offset 0 through the agent served the old one's.
    wrong = [a for a in report.anomalies if a["kind"] == "wrong_incarnation"]
    assert any(a["where"].startswith("read op") and a["topic"] == "reborn" for a in wrong), (
        report.anomalies
    )


def test_skipped_fencing_is_caught(cluster: Topology, tmp_path: Path) -> None:
    report, _ = probe(cluster, tmp_path, "no_fencing")
    expected = {"zombie_write", "out_of_sequence_write", "retry_answer_differs", "duplicate"}
    assert expected <= set(report.counts), report.summary()
    # A resend stored again is also away from the offsets it was acknowledged at.
    assert set(report.counts) - expected <= {"wrong_offset"}, report.anomalies
