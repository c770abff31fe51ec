"""``lakelog serve``'s coordinator API: what ``lakelog coordinator`` answers, on its own port.

``lakelog serve`` keeps its coordinator in-process, but Spark jobs
(``option("coordinator", "http://127.0.0.1:8083")``), ``lakelog janitor --coordinator``
and more agents (``lakelog agent --coordinator``) reach a coordinator over HTTP. So serve
also answers ``coordinator.http.server.create_process_app`` over that same in-process
coordinator, on ``coordinator_port`` of the agent's host, in the agent's event loop: the
same routes with the same access rules (``coordinator.security.access``: users by their credentials
and ACLs, other agents by ``coordinator_secret``) as a coordinator process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import socket
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import uvicorn

from coordinator.client import StoreLocation
from segments.store import ObjectStore, absolute_store_url

if TYPE_CHECKING:
    from coordinator.janitors.context import JanitorConfig
    from coordinator.local import LocalCoordinator
    from service.settings import Settings

log = logging.getLogger(__name__)

#: How long start-up waits for the coordinator API to be serving (a loaded machine).
START_TIMEOUT_S = 30.0


class _InnerServer(uvicorn.Server):
    """A uvicorn server inside another one's event loop: the outer one owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port).

    Raises:
        OSError: the port is taken (the message says which, and how to change it).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
    except OSError as e:
        sock.close()
        raise OSError(
            e.errno,
            f"cannot answer the coordinator API on {host}:{port}: {e.strerror} "
            "(--coordinator-port chooses another port, 0 turns it off)",
        ) from None
    return sock


async def start_coordinator_api(
    stack: AsyncExitStack,
    settings: Settings,
    coordinator: LocalCoordinator,
    store: ObjectStore,
    janitors: JanitorConfig | None,
) -> str | None:
    """Serve the coordinator API until ``stack`` closes; its base URL, or None when off.

    Off when ``coordinator_port`` is 0. With authentication on it applies serve's own
    access rules (``coordinator.security.access``): users (Spark jobs) by their credentials and
    ACLs, management by a principal's own credential, and other agents by
    ``coordinator_secret`` when it is set; without it, no other agent can join (the
    route rules are given a random secret nobody else knows).
    """
    from coordinator.http.server import create_process_app

    port = settings.coordinator_port
    if not port:
        return None
    access = settings.access()
    if access.authentication != "none" and not access.secret:
        access = dataclasses.replace(access, secret=secrets.token_urlsafe(32))
    app = create_process_app(
        coordinator,
        store,
        janitors,
        StoreLocation(
            absolute_store_url(settings.store), settings.store_endpoint, settings.store_region
        ),
        access,
        settings.coordinator_max_request_bytes,
    )
    sock = _listen(settings.host, port)
    config = uvicorn.Config(
        app,
        lifespan="off",
        # The outer server configured logging: a config or level here would reset its own.
        log_config=None,
        log_level=None,
        access_log=False,
        ssl_certfile=settings.tls_cert_file,
        ssl_keyfile=settings.tls_key_file,
    )
    server = _InnerServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="lakelog-coordinator-api")

    async def stop() -> None:
        server.should_exit = True
        try:
            await task
        finally:
            sock.close()

    stack.push_async_callback(stop)
    for _ in range(int(START_TIMEOUT_S / 0.01)):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if not server.started:
        raise RuntimeError("the coordinator API did not start") from (
            task.exception() if task.done() else None
        )
    scheme = "https" if settings.tls_cert_file else "http"
    url = f"{scheme}://{settings.host}:{port}"
    log.info("coordinator API on %s (Spark: option('coordinator', '%s'))", url, url)
    return url
