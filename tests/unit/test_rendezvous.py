"""Metadata shards without a database: rendezvous placement of partitions, and which
failures mark a shard down (``coordinator.shards``)."""

from __future__ import annotations

import uuid
from collections import Counter

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from coordinator.shards import is_outage, rendezvous
from segments.errors import CoordinatorUnavailableError

TOPICS = [uuid.UUID(int=n * 7919 + 1).bytes for n in range(60)]
PARTITIONS = [(t, p) for t in TOPICS for p in range(50)]  # 3,000 partitions


def placement(shards: list[str]) -> dict[tuple[bytes, int], str]:
    return {(t, p): rendezvous(shards, t, p) for t, p in PARTITIONS}


@pytest.mark.parametrize("count", [2, 3, 5])
def test_partitions_spread_evenly(count: int) -> None:
    shards = [f"shard-{n:02d}" for n in range(count)]
    per_shard = Counter(placement(shards).values())
    assert set(per_shard) == set(shards)
    fair = len(PARTITIONS) / count
    # 3,000 draws: a fair share within 10% (binomial sd ~ 1.4-2.5% of the share).
    for shard, n in per_shard.items():
        assert abs(n - fair) <= 0.1 * fair, (shard, n, fair)


def test_a_new_shard_takes_only_its_share() -> None:
    """Adding a shard moves a partition only to the new shard, about 1/n of them (placement
    is stored at creation anyway; this is why new partitions still spread evenly)."""
    before = placement(["a", "b", "c"])
    after = placement(["a", "b", "c", "d"])
    moved = {tp for tp in PARTITIONS if before[tp] != after[tp]}
    assert all(after[tp] == "d" for tp in moved)
    assert abs(len(moved) - len(PARTITIONS) / 4) <= 0.1 * len(PARTITIONS) / 4


def test_a_removed_shard_moves_only_its_own() -> None:
    before = placement(["a", "b", "c"])
    after = placement(["a", "c"])
    assert all(after[tp] == before[tp] for tp in PARTITIONS if before[tp] != "b")


def test_order_of_ids_does_not_matter_and_one_shard_takes_all() -> None:
    assert placement(["x", "y", "z"]) == placement(["z", "x", "y"])
    assert set(placement(["only"]).values()) == {"only"}
    with pytest.raises(ValueError):
        rendezvous([], TOPICS[0], 0)


def _wrapped(cause: BaseException) -> CoordinatorUnavailableError:
    try:
        raise CoordinatorUnavailableError("metadata database failed") from cause
    except CoordinatorUnavailableError as e:
        return e


def test_only_an_unreachable_database_marks_a_shard_down() -> None:
    """A lost connection, a refused one, a server shutting down or an empty pool mark the
    shard down (its calls then fail fast); a deadlock or serialization victim, or a
    statement timeout, is one transaction's bad luck: the shard stays up."""
    down = [
        psycopg.OperationalError("connection failed: database is not accepting connections"),
        psycopg.InterfaceError("the connection is closed"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.CannotConnectNow("the database system is starting up"),
        PoolTimeout("couldn't get a connection after 5.00 sec"),
    ]
    up = [
        psycopg.errors.SerializationFailure("could not serialize access"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.LockNotAvailable("could not obtain lock"),
    ]
    assert [is_outage(_wrapped(c)) for c in down] == [True] * len(down)
    assert [is_outage(_wrapped(c)) for c in up] == [False] * len(up)
    assert not is_outage(CoordinatorUnavailableError("no cause"))
