"""``--workers``: accepted by ``lakelog agent``, checked, refused by ``lakelog serve``."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.workers import reuse_port_socket


def test_serve_refuses_workers() -> None:
    result = CliRunner().invoke(app, ["serve"], env={"LAKELOG_WORKERS": "2"})
    assert result.exit_code == 2
    assert "workers is for lakelog agent" in result.output


@pytest.mark.parametrize("value", ["0", "65", "two"])
def test_agent_refuses_a_bad_worker_count(value: str) -> None:
    result = CliRunner().invoke(
        app, ["agent", "--coordinator", "http://127.0.0.1:1", "--workers", value]
    )
    assert result.exit_code == 2


def test_workers_bind_one_port_together_but_not_a_port_held_without_reuse() -> None:
    """Two SO_REUSEPORT sockets share a port (as the workers do); a port bound by a
    process without SO_REUSEPORT is refused (the supervisor checks it before starting)."""
    first = reuse_port_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = reuse_port_socket("127.0.0.1", port)
    second.close()
    first.close()
    plain = socket.socket()
    plain.bind(("127.0.0.1", 0))
    plain.listen()
    try:
        with pytest.raises(OSError):
            reuse_port_socket("127.0.0.1", plain.getsockname()[1])
    finally:
        plain.close()
