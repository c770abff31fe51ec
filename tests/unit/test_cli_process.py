"""What a ``lakelog`` command's process loads: not Hypothesis, which kio would use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st


def test_a_command_process_hides_hypothesis_from_kio(tmp_path: Path) -> None:
    """kio registers a Hypothesis strategy per type at import whenever Hypothesis can be
    imported (it can here: the tests use it). In a server started in a new directory that
    cost about 1 s and a 325 MiB peak, and left a .hypothesis/ folder there. A command's
    process (the CLI module imported first) hides Hypothesis from kio."""
    probe = (
        "import sys, service.cli, kio.static._phantom as phantom; "
        "print(phantom.hypothesis is None, sys.modules['hypothesis'] is None)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "True"]
    assert not (tmp_path / ".hypothesis").exists()


@settings(max_examples=5)
@given(st.integers(0, 3))
def test_a_process_that_has_hypothesis_keeps_it(n: int) -> None:
    """pytest's process imported Hypothesis before the CLI: it still works after."""
    import service.cli  # noqa: F401

    assert sys.modules["hypothesis"] is not None
    assert n in range(4)
