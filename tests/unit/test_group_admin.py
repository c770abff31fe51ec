"""Operators' group calls (``lakelog groups reset-offsets`` / ``delete``) in the coordinator.

``alter_group_offsets`` and ``delete_group`` on SQLite and PostgreSQL: they act only on a
group without instances, exactly on what they are given, all or nothing.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from coordinator.client import ChunkCommit, PartitionOffsets
from coordinator.client import TopicPartition as TP
from coordinator.groups.model import CommittedOffset, ConsumerConfig
from coordinator.local import LocalCoordinator
from segments.errors import (
    ConsumerStateError,
    GroupNotFoundError,
    NonEmptyGroupError,
    PartitionNotFoundError,
    TopicNotFoundError,
)
from service.app import create_app
from service.settings import Settings
from tests.unit.conftest import Clock


@pytest.fixture
def c(c: LocalCoordinator) -> LocalCoordinator:
    """The conftest's coordinator (on its clock) with topic "t": 3 partitions of 10, 11
    and 12 records."""
    c.create_topic("t", 3)
    for p in range(3):
        topic_id = c.get_topic("t").topic_id
        c.commit(f"obj-{uuid.uuid4().hex}", [ChunkCommit(topic_id, p, 0, 10, 10 + p, 1, 2)])
    return c


def committed(c: LocalCoordinator, group: str) -> dict[TP, int]:
    return {tp: o.offset for tp, o in c.describe_group(group).committed.items()}


def test_alter_sets_exactly_the_partitions_given(c: LocalCoordinator) -> None:
    """A new group gets offsets; a later call moves only the partitions it names."""
    c.alter_group_offsets("g", {TP("t", 0): CommittedOffset(5), TP("t", 1): CommittedOffset(6)})
    assert committed(c, "g") == {TP("t", 0): 5, TP("t", 1): 6}
    assert c.describe_group("g").state == "EMPTY"
    c.alter_group_offsets("g", {TP("t", 1): CommittedOffset(0, "reset")})
    assert committed(c, "g") == {TP("t", 0): 5, TP("t", 1): 0}
    assert c.describe_group("g").committed[TP("t", 1)].metadata == "reset"


def test_alter_refuses_while_the_group_has_instances(c: LocalCoordinator, clock: Clock) -> None:
    """Kafka's tool message; nothing stored. Once the instance expires, the reset goes."""
    config = ConsumerConfig(instance_timeout_ms=60_000, session_timeout_ms=10_000)
    c.create_consumer("g", "c1", config)
    c.assign("g", "c1", [TP("t", 0)])
    c.commit_offsets("g", "c1", {TP("t", 0): CommittedOffset(3)})
    with pytest.raises(NonEmptyGroupError) as err:
        c.alter_group_offsets("g", {TP("t", 0): CommittedOffset(0)})
    assert err.value.message == (
        "Assignments can only be reset if the group 'g' is inactive, but the current state "
        "is Stable."
    )
    assert committed(c, "g") == {TP("t", 0): 3}
    clock.t += 61  # past the instance timeout: the instance is gone
    c.alter_group_offsets("g", {TP("t", 0): CommittedOffset(0)})
    assert committed(c, "g") == {TP("t", 0): 0}


def test_alter_is_all_or_nothing(c: LocalCoordinator) -> None:
    c.alter_group_offsets("g", {TP("t", 0): CommittedOffset(1)})
    for bad, error in (
        (TP("t", 3), PartitionNotFoundError),
        (TP("nope", 0), TopicNotFoundError),
    ):
        with pytest.raises(error):
            c.alter_group_offsets("g", {TP("t", 0): CommittedOffset(7), bad: CommittedOffset(0)})
    with pytest.raises(ConsumerStateError):
        c.alter_group_offsets("g", {TP("t", 0): CommittedOffset(-1)})
    assert committed(c, "g") == {TP("t", 0): 1}


def test_delete_group(c: LocalCoordinator, clock: Clock) -> None:
    """Refused with an instance; then the group and its offsets go; a second delete is 404."""
    c.create_consumer("g", "c1", ConsumerConfig(instance_timeout_ms=60_000))
    c.assign("g", "c1", [TP("t", 2)])
    c.commit_offsets("g", "c1", {TP("t", 2): CommittedOffset(4)})
    with pytest.raises(NonEmptyGroupError, match="the group is not empty"):
        c.delete_group("g")
    c.delete_consumer("g", "c1")
    assert "g" in c.list_groups()
    c.delete_group("g")
    assert "g" not in c.list_groups()
    with pytest.raises(GroupNotFoundError):
        c.describe_group("g")
    with pytest.raises(GroupNotFoundError):
        c.delete_group("g")
    # Offsets committed again later start from nothing.
    c.alter_group_offsets("g", {TP("t", 0): CommittedOffset(2)})
    assert committed(c, "g") == {TP("t", 0): 2}


def test_offsets_many_reads_every_partition_at_once(c: LocalCoordinator) -> None:
    """Unknown topics and partitions past the count are left out."""
    got = c.offsets_many([TP("t", 0), TP("t", 2), TP("t", 9), TP("nope", 0)])
    assert got == {TP("t", 0): PartitionOffsets(0, 10), TP("t", 2): PartitionOffsets(0, 12)}


# -- the agent's routes: a group over thousands of partitions in few coordinator calls ----


class Counting:
    """Counts the calls made through it, by method name (not the agent's background
    heartbeat, which may fall in a slow test)."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            if name != "heartbeat_agent":
                self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)

        return counted


def test_thousands_of_partitions_in_bounded_coordinator_calls(tmp_path: Path) -> None:
    """A group with offsets on 3,000 partitions: its lags and a reset of every partition
    each cost a fixed handful of coordinator calls (one per partition before)."""
    partitions = 3000
    settings = Settings(db=f"sqlite:///{tmp_path / 'meta.db'}", store="memory://")
    app = create_app(settings)
    with TestClient(app) as client:
        state = app.state.agent
        coordinator = state.coordinator
        coordinator.create_topic("big", partitions)
        cid = coordinator.cluster_id()
        topic_id = coordinator.get_topic("big").topic_id
        coordinator.commit(
            "obj", [ChunkCommit(topic_id, p, 0, 1, 5, 1, 2) for p in range(partitions)]
        )
        coordinator.alter_group_offsets(
            "g", {TP("big", p): CommittedOffset(p % 5) for p in range(partitions)}
        )
        counting = Counting(coordinator)
        state.coordinator = state.groups = counting

        r = client.get(f"/v3/clusters/{cid}/consumer-groups/g/lags")
        assert r.status_code == 200, r.text
        assert sum(lag["lag"] for lag in r.json()["data"]) == sum(5 - p % 5 for p in range(3000))
        assert counting.calls == {"describe_group": 1, "offsets_many": 1}

        counting.calls.clear()
        body = {"partitions": [{"topic_name": "big"}], "strategy": "LATEST"}
        r = client.post(
            f"/v3/clusters/{cid}/consumer-groups/g/offsets:reset",
            json={**body, "validate_only": False},
        )
        assert r.status_code == 200, r.text
        assert len(r.json()["data"]) == partitions
        assert counting.calls == {
            "describe_group": 1,
            "get_topic": 1,
            "offsets_many": 1,
            "alter_group_offsets": 1,
        }
        committed = coordinator.describe_group("g").committed
        assert {c.offset for c in committed.values()} == {5} and len(committed) == partitions
