"""lakelog's version: the installed distribution's, else the checkout's ``pyproject.toml``."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version
from pathlib import Path


@cache
def lakelog_version() -> str:
    """``pyproject.toml``'s ``version`` as installed (``lakelog --version``, OpenAPI)."""
    try:
        return distribution_version("lakelog")
    except PackageNotFoundError:
        pass
    # Not installed: run from a checkout (PYTHONPATH), whose pyproject.toml is beside us.
    try:
        with (Path(__file__).resolve().parents[1] / "pyproject.toml").open("rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
