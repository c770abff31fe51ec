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
import ssl
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.security import ANONYMOUS
from segments.errors import InvalidSecurityRequestError, LakelogError
from service.acl import AclCache
from service.auth import Authenticator
from service.kafka import acls, admin, groups
from service.kafka import handlers as h
from service.kafka.acl import AUTHENTICATED, RULES, Access
from service.kafka.framing import (
    FrameDecoder,
    FrameError,
    Request,
    UnsupportedRequestError,
    decode_request,
    encode_response,
    request_class,
)
from service.kafka.sasl import (
    SASL_HANDSHAKE,
    SASL_VERSIONS,
    SaslSession,
    SaslStateError,
    certificate_principal,
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
    29: (1, 3, acls.describe_acls),
    30: (1, 3, acls.create_acls),
    31: (1, 3, acls.delete_acls),
}

#: api key -> (min version, max version): what ApiVersions advertises.
SUPPORTED: dict[int, tuple[int, int]] = {
    **{k: (lo, hi) for k, (lo, hi, _) in HANDLERS.items()},
    **SASL_VERSIONS,  # answered per connection (service.kafka.sasl)
}

_READ_BYTES = 256 * 1024


class KafkaServer:
    """The Kafka listener of one agent.

    Args:
        state: the agent's core (shared with the REST routes).
        host, port: where to listen (port 0: any free port; see ``port`` after start).
        authenticator: require SASL (``service.kafka.sasl``) and check credentials with it.
        tls: serve TLS (Kafka's SSL, or SASL_SSL with an authenticator).
        acl: check every request against these ACLs (``service.kafka.acl``); None: off.
        reuse_port: bind with SO_REUSEPORT (``agent --workers``: every worker listens).
    """

    def __init__(
        self,
        state: AgentState,
        host: str,
        port: int,
        authenticator: Authenticator | None = None,
        tls: ssl.SSLContext | None = None,
        acl: AclCache | None = None,
        *,
        reuse_port: bool = False,
    ) -> None:
        self.state = state
        self.tls = tls
        self.acl = acl
        #: With an authenticator, every connection authenticates with SASL first.
        self.authenticator = authenticator
        self.host = host
        self.port = port
        self.reuse_port = reuse_port
        self.ctx: h.KafkaContext | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept,
            self.host,
            self.port,
            limit=_READ_BYTES,
            ssl=self.tls,
            reuse_port=self.reuse_port,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.ctx = h.KafkaContext(self.state, self.host, self.port, acl=self.acl)
        protocol = ("SASL_" if self.authenticator else "") + ("SSL" if self.tls else "PLAINTEXT")
        log.info("Kafka listener on %s:%d (%s)", self.host, self.port, protocol)

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
        address = str(peer[0]) if peer else ""
        session = (
            SaslSession(self.authenticator, address) if self.authenticator is not None else None
        )
        if session is not None and self.tls is not None:
            try:  # mTLS: a verified client certificate names the principal, no SASL needed
                session.principal = certificate_principal(writer.get_extra_info("peercert"))
            except InvalidSecurityRequestError as e:
                log.warning("closing Kafka connection from %s: %s", peer, e.message)
                writer.close()
                return
        sender = asyncio.create_task(_send(writer, answers), name=f"kafka-send-{peer}")
        try:
            while not sender.done():
                data = await reader.read(_READ_BYTES)
                if not data:
                    break
                for frame in decoder.feed(data):
                    answer = await self._handle(frame, session, address)
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

    async def _handle(
        self, frame: bytes, session: SaslSession | None = None, address: str = ""
    ) -> tuple[int, Any] | None:
        """Decode and run one request: (correlation id, body or Deferred), or None.

        ``session``: the connection's SASL state when authentication is on; ``address``:
        the client's (the host ACLs are checked against).

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
        api_key = req.header.api_key
        if api_key in SASL_VERSIONS:
            return req.header.correlation_id, await _sasl(session, req)
        if session is not None and session.principal is None and api_key != API_VERSIONS:
            raise FrameError(f"api key {api_key} before SASL authentication")
        handler = HANDLERS[api_key][2]
        principal = session.principal if session is not None else None
        body = await handler(self.ctx, req, await self._access(api_key, principal, address))
        return req.header.correlation_id, body

    async def _access(self, api_key: int, principal: str | None, address: str) -> Access:
        """The request's Access: its API's rule over the agent's ACL snapshot.

        Raises:
            FrameError: the ACLs cannot be loaded within their staleness bound (the
                connection closes; the client reconnects and retries, as after a broker
                restart: never an answer from ACLs older than the bound).
        """
        rule = RULES[api_key]
        if self.acl is None or rule == AUTHENTICATED:  # nothing to ask the ACLs
            return Access(rule, None, principal or ANONYMOUS, address)
        try:
            authorizer = await self.acl.authorizer()
        except LakelogError as e:
            raise FrameError(f"ACLs unavailable: {e.message}") from None
        return Access(rule, authorizer, principal or ANONYMOUS, address)


async def _sasl(session: SaslSession | None, req: Request) -> Any:
    """Answer SaslHandshake or SaslAuthenticate. Raises FrameError (close) when SASL is off
    or out of order, as Kafka closes such connections."""
    if session is None:
        raise FrameError("SASL request on a listener without authentication")
    response = h.response_cls(type(req.body))
    try:
        if req.header.api_key == SASL_HANDSHAKE:
            return session.handshake(response, req.body.mechanism)
        return await session.authenticate(response, req.body.auth_bytes)
    except SaslStateError as e:
        raise FrameError(str(e)) from None


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
