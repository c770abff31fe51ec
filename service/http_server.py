"""How uvicorn serves the agent's HTTP listener: its protocol class and options.

uvicorn closes a keep-alive connection that sends nothing for ``timeout_keep_alive``,
but once a request's first byte has arrived it waits for the rest of its head for ever:
a client sending a header byte now and then (slowloris) holds a connection, and its
memory, as long as it likes. The protocol served here (uvicorn's httptools one, or the
h11 one that hands client certificates over, ``service.security.mtls``) closes a connection
whose request head is not complete ``http_header_timeout_s`` after the connection
opened or its previous response ended. A request being served is never cut: the
timer only closes a connection with no request in progress.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.security.mtls import uvicorn_tls
from service.settings import Settings

log = logging.getLogger(__name__)


def with_header_timeout(base: type[Any], timeout_s: float) -> type[Any]:
    """``base`` (a uvicorn HTTP protocol class) closing connections whose request head is
    not complete ``timeout_s`` after the connection opened or its last response ended."""

    class HeaderTimeoutProtocol(base):  # type: ignore[misc]
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(timeout_s, self._head_timed_out)

        def _head_timed_out(self) -> None:
            self._head_timer = None
            idle = self.cycle is None or self.cycle.response_complete
            if idle and not self.transport.is_closing():
                log.info(
                    "closing HTTP connection from %s: no request head in %ss",
                    self.client,
                    timeout_s,
                )
                self.transport.close()

    HeaderTimeoutProtocol.__name__ = f"HeaderTimeout{base.__name__}"
    return HeaderTimeoutProtocol


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's keyword arguments for the agent: TLS (``service.security.mtls``) and the protocol
    class with the header timeout."""
    options = uvicorn_tls(settings)
    base = options.get("http", HttpToolsProtocol)
    options["http"] = with_header_timeout(base, settings.http_header_timeout_s)
    return options
