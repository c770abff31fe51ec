"""What the JSON Schema and Protobuf compatibility diffs share: changes named at a path."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import ClassVar, TypeVar

Change = tuple[str, str]  # (type, path)
K = TypeVar("K")
V = TypeVar("V")


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

    def matched(
        self,
        old: Mapping[K, V],
        new: Mapping[K, V],
        removed: str,
        added: str,
        keys: Iterable[K] | None = None,
    ) -> Iterator[tuple[K, V, V]]:
        """Each key of ``old`` and ``new`` (in ``keys``' order; by default old's, then
        new's): ``removed`` at a key only ``old`` has, ``added`` at one only ``new`` has;
        a key both have, with its two values, to compare."""
        for key in dict.fromkeys([*old, *new]) if keys is None else keys:
            if key not in new:
                self.add(removed, str(key))
            elif key not in old:
                self.add(added, str(key))
            else:
                yield key, old[key], new[key]

    def compatible(self) -> bool:
        return all(kind in self.compatible_kinds for kind, _ in self.diffs)
