"""The asyncio Kafka listener: moves bytes between sockets and the sans-io layers.

Per connection: received bytes go through a ``FrameDecoder``; each frame is decoded
(``decode_request``) and handed to its handler, one request at a time and in order;
answers are written in request order by one writer task. A Produce handler returns a
``Deferred`` (its flush is pending) so the next request is read meanwhile, and its
answer still leaves in order. A frame that cannot be served (too large, undecodable,
an API or version not in :data:`SUPPORTED`) closes that connection only, as Kafka
does; an unsupported ApiVersions version is answered first (v0 body,
UNSUPPORTED_VERSION) so clients can downgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from service.kafka import admin, groups
from service.kafka import handlers as h
from service.kafka.framing import (
    FrameDecoder,
    FrameError,
    UnsupportedRequestError,
    decode_request,
    encode_response,
    request_class,
)
from service.state import AgentState

log = logging.getLogger(__name__)

API_VERSIONS = 18

#: api key -> (min version, max version, handler). Versions are those kio decodes
#: whose fields we fill; newer ones (topic ids in Produce/Fetch, KIP-848/890) are not
#: offered and clients negotiate down.
HANDLERS: dict[int, tuple[int, int, h.Handler]] = {
    0: (3, 11, h.produce),
    1: (4, 12, h.fetch),
    2: (1, 8, h.list_offsets),
    3: (0, 12, h.metadata),
    22: (0, 4, h.init_producer_id),
    8: (2, 8, groups.offset_commit),
    9: (1, 7, groups.offset_fetch),
    10: (0, 4, groups.find_coordinator),
    11: (0, 9, groups.join_group),
    12: (0, 4, groups.heartbeat),
    13: (0, 5, groups.leave_group),
    14: (0, 5, groups.sync_group),
    15: (0, 5, groups.describe_groups),
    16: (0, 4, groups.list_groups),
    42: (0, 2, groups.delete_groups),
    API_VERSIONS: (0, 3, h.api_versions),
    19: (2, 7, admin.create_topics),
    20: (1, 5, admin.delete_topics),
    21: (0, 2, admin.delete_records),
    23: (2, 4, admin.offset_for_leader_epoch),
    32: (1, 4, admin.describe_configs_api),
    33: (0, 2, admin.alter_configs),
    37: (0, 3, admin.create_partitions),
    44: (0, 1, admin.incremental_alter_configs),
    60: (0, 1, admin.describe_cluster),
}

#: api key -> (min version, max version): what ApiVersions advertises.
SUPPORTED: dict[int, tuple[int, int]] = {k: (lo, hi) for k, (lo, hi, _) in HANDLERS.items()}

_READ_BYTES = 256 * 1024


class KafkaServer:
    """The Kafka listener of one agent.

    Args:
        state: the agent's core (shared with the REST routes).
        host, port: where to listen (port 0: any free port; see ``port`` after start).
        reuse_port: bind with SO_REUSEPORT (``agent --workers``: every worker listens).
    """

    def __init__(
        self, state: AgentState, host: str, port: int, *, reuse_port: bool = False
    ) -> None:
        self.state = state
        self.host = host
        self.port = port
        self.reuse_port = reuse_port
        self.ctx: h.KafkaContext | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, limit=_READ_BYTES, reuse_port=self.reuse_port
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.ctx = h.KafkaContext(self.state, self.host, self.port)
        log.info("Kafka listener on %s:%d", self.host, self.port)

    def advertise(self, address: tuple[str, int]) -> None:
        """The (host, port) Metadata gives clients for this agent."""
        assert self.ctx is not None
        self.ctx.host, self.ctx.port = address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass  # shutting down: asyncio's stream callback must not see the cancellation
        finally:
            self._connections.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.ctx is not None
        peer = writer.get_extra_info("peername")
        decoder = FrameDecoder(self.state.settings.kafka_max_request_bytes)
        answers: asyncio.Queue[tuple[int, Any] | None] = asyncio.Queue()
        sender = asyncio.create_task(_send(writer, answers), name=f"kafka-send-{peer}")
        try:
            while not sender.done():
                data = await reader.read(_READ_BYTES)
                if not data:
                    break
                for frame in decoder.feed(data):
                    answer = await self._handle(frame)
                    if answer is not None:
                        answers.put_nowait(answer)
        except FrameError as e:
            log.warning("closing Kafka connection from %s: %s", peer, e)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("Kafka connection from %s failed", peer)
        finally:
            answers.put_nowait(None)  # the sender writes what is queued, then stops
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await sender
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, frame: bytes) -> tuple[int, Any] | None:
        """Decode and run one request: (correlation id, body or Deferred), or None.

        Raises:
            FrameError: the connection must close (after the answers queued so far).
        """
        assert self.ctx is not None
        try:
            req = decode_request(frame, SUPPORTED)
        except UnsupportedRequestError as e:
            if e.api_key != API_VERSIONS:
                raise
            # KIP-511: answer with the v0 body so the client learns our versions.
            body = h.api_versions_response(
                request_class(API_VERSIONS, 0), ErrorCode.unsupported_version
            )
            return e.correlation_id, body
        handler = HANDLERS[req.header.api_key][2]
        body = await handler(self.ctx, req)
        return req.header.correlation_id, body


async def _send(
    writer: asyncio.StreamWriter, answers: asyncio.Queue[tuple[int, Any] | None]
) -> None:
    """Write answers in request order; a Deferred is awaited in its turn."""
    while True:
        item = await answers.get()
        if item is None:
            return
        correlation_id, body = item
        if isinstance(body, h.Deferred):
            body = await body.task
        if body is None:  # acks=0
            continue
        writer.write(encode_response(correlation_id, body))
        await writer.drain()
