"""Fixtures shared by unit tests: a coordinator on each backend (test_metadata,
test_schema_store, test_gc_commit_race), consumer groups (test_groups, test_group_fetch,
test_consumer_protocol, test_group_admin), the janitors' harness (test_janitors,
test_index_growth)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.local import LocalCoordinator
from tests.conftest import BACKENDS, new_db_url
from tests.unit.janitor_helpers import Harness


class Clock:
    """A settable clock in epoch seconds."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def coord(db_url: str) -> Iterator[LocalCoordinator]:
    """A LocalCoordinator on an empty database of each backend, on the real clock."""
    with LocalCoordinator(db_url) as coord:
        yield coord


@pytest.fixture
def c(db_url: str, clock: Clock) -> Iterator[LocalCoordinator]:
    """A LocalCoordinator on an empty database of each backend, on the fake clock."""
    coord = LocalCoordinator(db_url, now=clock)
    yield coord
    coord.close()


@pytest.fixture(scope="module", params=BACKENDS)
def shared(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalCoordinator, Clock]]:
    """One coordinator per backend and module, on its own fake clock (tests that share it
    use their own group and topic names)."""
    clock = Clock()
    db_url = new_db_url(request, request.param, tmp_path_factory.mktemp("groups"))
    with LocalCoordinator(db_url, now=clock) as coord:
        yield coord, clock


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    """The janitors' harness: a SQLite coordinator, a clocked memory store, writer, reader."""
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()
