"""The packages' layers, as their docstrings say: ``segments`` at the bottom, then
``coordinator``, then ``index``, then the two that use them all, ``service`` (the agent)
and ``spark``, which never import each other. Every import counts, lazy ones and
type-checking ones too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What each package may import of the others.
ALLOWED = {
    "segments": set(),
    "coordinator": {"segments"},
    "index": {"segments", "coordinator"},
    "service": {"segments", "coordinator", "index"},
    "spark": {"segments", "coordinator", "index"},
}


def imported(package: str) -> dict[str, set[str]]:
    """Each other package ``package`` imports, with the files that do."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in ALLOWED and top != package:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_each_package_imports_only_the_layers_below_it() -> None:
    wrong = {
        f"{package} imports {other}": files
        for package, allowed in ALLOWED.items()
        for other, files in imported(package).items()
        if other not in allowed
    }
    assert wrong == {}
    # The check sees imports at all: the agent does import the layers below it.
    assert set(imported("service")) == ALLOWED["service"]
