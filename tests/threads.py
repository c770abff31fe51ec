"""Races run on threads, for the tests that name one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def run_threads(
    target: Callable[[T], object], args: Iterable[T], timeout: float | None = None
) -> None:
    """``target(a)`` for each of ``args``, each on a thread of its own, all started
    before any is joined (each join waits ``timeout`` at the most). Then the first
    exception a thread raised, if any, is raised here, on the test's thread."""
    errors: list[BaseException] = []

    def run(a: T) -> None:
        try:
            target(a)
        except BaseException as e:  # raised below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
