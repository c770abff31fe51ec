"""Fixtures of the unit tests of consumer groups (test_groups, test_group_fetch)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coordinator.local import LocalCoordinator


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
def c(db_url: str, clock: Clock) -> Iterator[LocalCoordinator]:
    """A LocalCoordinator on an empty database of each backend, on the fake clock."""
    coord = LocalCoordinator(db_url, now=clock)
    yield coord
    coord.close()
