"""What the JSON Schema and Protobuf compatibility diffs share: changes named at a path."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

Change = tuple[str, str]  # (type, path)


class PathDiffs:
    """Changes found under ``path`` (``#/a/b``); a subclass names its ``compatible_kinds``
    and sets ``path`` and ``diffs``."""

    compatible_kinds: ClassVar[frozenset[str]]
    path: list[str]
    diffs: list[Change]

    def add(self, kind: str, attribute: str | None = None) -> None:
        parts = [*self.path, attribute] if attribute else self.path
        self.diffs.append((kind, "#/" + "/".join(parts)))

    @contextmanager
    def at(self, part: str) -> Iterator[None]:
        self.path.append(part)
        try:
            yield
        finally:
            self.path.pop()

    def compatible(self) -> bool:
        return all(kind in self.compatible_kinds for kind, _ in self.diffs)
