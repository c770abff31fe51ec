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
from collections import Counter as Counter_
from typing import Any

from kio.schema.errors import ErrorCode
from prometheus_client import CollectorRegistry, Counter, Gauge

from coordinator.security.model import ANONYMOUS
from segments.errors import InvalidSecurityRequestError, LakelogError
from service.kafka import acls, admin, groups, transactions
from service.kafka import handlers as h
from service.kafka.acl import AUTHENTICATED, RULES, Access
from service.kafka.framing import (
    FrameDecoder,
    FrameError,
    FrameTooLargeError,
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
    SessionExpiredError,
    certificate_principal,
)
from service.security.acl import AclCache
from service.security.auth import Authenticator
from service.state import AgentState

log = logging.getLogger(__name__)

API_VERSIONS = 18

#: api key -> (min version, max version, handler): for each API lakelog serves, the
#: versions a Kafka 4.2 broker serves (minimums as KIP-896 set them in 4.0; maximums the
#: newest in Kafka's message schemas, which kio's classes are generated from), flexible
#: versions included. A lower maximum needs its reason in :data:`LOWER_MAXIMUM`: a unit
#: test builds this table and compares it with kio's newest schemas.
HANDLERS: dict[int, tuple[int, int, h.Handler]] = {
    0: (3, 13, h.produce),  # v13: topic ids (KIP-516)
    1: (4, 18, h.fetch),  # v13+: topic ids (KIP-516)
    2: (1, 11, h.list_offsets),
    3: (0, 13, h.metadata),  # v10+: topics by id
    8: (2, 10, groups.offset_commit),  # v9: member epochs (KIP-848); v10: topic ids
    9: (1, 10, groups.offset_fetch),  # v8: several groups (KIP-709); v9: KIP-848; v10: ids
    10: (0, 6, groups.find_coordinator),
    11: (0, 9, groups.join_group),
    12: (0, 4, groups.heartbeat),
    13: (0, 5, groups.leave_group),
    14: (0, 5, groups.sync_group),
    15: (0, 6, groups.describe_groups),
    16: (0, 5, groups.list_groups),
    42: (0, 2, groups.delete_groups),
    68: (0, 1, groups.consumer_group_heartbeat),  # KIP-848
    69: (0, 1, groups.consumer_group_describe),  # KIP-848
    API_VERSIONS: (0, 4, h.api_versions),
    19: (2, 7, admin.create_topics),
    20: (1, 6, admin.delete_topics),  # v6: by topic id
    21: (0, 2, admin.delete_records),
    22: (0, 6, h.init_producer_id),
    23: (2, 4, admin.offset_for_leader_epoch),
    # Transactions (issue 30). AddPartitionsToTxn v4+ is Kafka's broker-to-broker batched
    # form (verify_only, KIP-890); TxnOffsetCommit v5 adds the group itself (KIP-890 part 2).
    24: (0, 5, transactions.add_partitions_to_txn),
    25: (0, 4, transactions.add_offsets_to_txn),
    26: (0, 5, transactions.end_txn),
    28: (0, 5, transactions.txn_offset_commit),
    65: (0, 0, transactions.describe_transactions),
    66: (0, 2, transactions.list_transactions),  # v1: duration filter; v2: id pattern
    32: (1, 4, admin.describe_configs_api),
    33: (0, 2, admin.alter_configs),
    37: (0, 3, admin.create_partitions),
    44: (0, 1, admin.incremental_alter_configs),
    60: (0, 2, admin.describe_cluster),
    75: (0, 0, admin.describe_topic_partitions),  # KIP-966
    29: (1, 3, acls.describe_acls),
    30: (1, 3, acls.create_acls),
    31: (1, 3, acls.delete_acls),
}

#: api key -> why lakelog serves a lower maximum than Kafka's newest version of that API.
#: Empty: every API lakelog serves goes up to Kafka's newest version. (APIs not served at
#: all are listed in the README with what a client gets.)
LOWER_MAXIMUM: dict[int, str] = {}

#: api key -> (min version, max version): what ApiVersions advertises.
SUPPORTED: dict[int, tuple[int, int]] = {
    **{k: (lo, hi) for k, (lo, hi, _) in HANDLERS.items()},
    **SASL_VERSIONS,  # answered per connection (service.kafka.sasl)
}

_READ_BYTES = 256 * 1024
#: Closes that still write the answers queued so far (bounded by the idle timeout).
_ANSWER_THEN_CLOSE = frozenset({"protocol", "authentication_failed"})
_WRITE_SLICE = 1 << 20
#: What a queued answer costs at least, beyond its bytes: the objects that hold it.
ANSWER_COST = 1024


class ListenerMetrics:
    """The listener's connection figures, in the agent's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connections = Gauge(
            "lakelog_kafka_connections", "Open Kafka connections.", registry=registry
        )
        self.unsent_bytes = Gauge(
            "lakelog_kafka_unsent_bytes",
            "Bytes of answers (and produce requests not yet answered) held for Kafka "
            "connections and not yet written to them.",
            registry=registry,
        )
        self.reads_paused = Counter(
            "lakelog_kafka_reads_paused",
            "Times a Kafka connection stopped being read because its unsent answers passed "
            "kafka_max_unsent_bytes (its client does not read them).",
            registry=registry,
        )
        self.closed = Counter(
            "lakelog_kafka_connections_closed",
            "Kafka connections the agent closed, by reason: idle, authentication_timeout, "
            "authentication_failed, session_expired, frame_too_large, too_many_connections, "
            "protocol.",
            ["reason"],
            registry=registry,
        )


class _Close(Exception):
    """End this connection, counted under ``reason``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Outbox:
    """One connection's answers waiting to be written, in request order.

    Each answer costs its encoded size (a Produce still pending: its request frame,
    which its batches point into), at least :data:`ANSWER_COST`. The reader waits for
    ``room()`` before reading on: while more than ``max_bytes`` are held, the connection
    is not read (back-pressure; its client's sends block in TCP).
    """

    def __init__(self, max_bytes: int, gauge: Gauge) -> None:
        self.max_bytes = max_bytes
        self.queue: asyncio.Queue[tuple[int, Any, int] | None] = asyncio.Queue()
        self.held = 0
        #: loop.time() of the last bytes written to the client (idle is counted from it).
        self.written_at = asyncio.get_running_loop().time()
        self._gauge = gauge
        self._room = asyncio.Event()
        self._room.set()

    def put(self, correlation_id: int, body: Any, frame_size: int) -> None:
        """Queue an answer: encoded now (its bytes are what it holds), or a Deferred."""
        if isinstance(body, h.Deferred):
            cost = frame_size
        elif body is not None:
            body = encode_response(correlation_id, body)
            cost = len(body)
        else:
            return
        cost = max(cost, ANSWER_COST)
        self.queue.put_nowait((correlation_id, body, cost))
        self._add(cost)

    def done(self, cost: int) -> None:
        self._add(-cost)

    def full(self) -> bool:
        return self.held > self.max_bytes

    async def room(self) -> None:
        await self._room.wait()

    def drop(self) -> None:
        """Forget every answer not yet written (the connection is gone)."""
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if item is not None:
                self._add(-item[2])

    def _add(self, n: int) -> None:
        self.held += n
        self._gauge.inc(n)
        if self.held > self.max_bytes:
            self._room.clear()
        else:
            self._room.set()


def api_versions_table() -> str:
    """The served APIs and versions as ``kafka-broker-api-versions`` prints a broker's
    (``Name(key): min to max``), one per line in key order: the README's table."""
    from kio.schema.index import api_key_map

    def name(key: int) -> str:
        return "".join(part.capitalize() for part in api_key_map[key].split("_"))

    lines = []
    for key, (low, high) in sorted(SUPPORTED.items()):
        versions = f"{low}" if low == high else f"{low} to {high}"
        lines.append(f"{name(key)}({key}): {versions}")
    return "\n".join(lines) + "\n"


class KafkaServer:
    """The Kafka listener of one agent.

    Args:
        state: the agent's core (shared with the REST routes).
        host, port: where to listen (port 0: any free port; see ``port`` after start).
        authenticator: require SASL (``service.kafka.sasl``) and check credentials with it.
        tls: serve TLS (Kafka's SSL, or SASL_SSL with an authenticator).
        acl: check every request against these ACLs (``service.kafka.acl``); None: off.
        reuse_port: bind with SO_REUSEPORT (``agent --workers``: every worker listens).

    Every connection is bounded (DESIGN.md invariant 11; the limits are the agent's
    ``kafka_*`` settings): frames by ``kafka_max_unauthenticated_bytes`` until SASL
    succeeds, ``kafka_max_request_bytes`` after; answers held for it by
    ``kafka_max_unsent_bytes`` (then it is not read until its client reads); its life
    by ``kafka_connections_max_idle_ms`` of silence, ``kafka_authentication_timeout_ms``
    to complete SASL and ``kafka_connections_max_reauth_ms`` per SASL session (KIP-368);
    and an address holds at most ``kafka_max_connections_per_ip`` of them.
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
        self.mapper = state.settings.principal_mapper()  # of client certificates (mTLS)
        self.ctx: h.KafkaContext | None = None
        self.metrics = ListenerMetrics(state.metrics.registry)
        self.per_connection = False
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._per_address: Counter_[str] = Counter_()

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

    def advertise(self, address: tuple[str, int], *, per_connection: bool = False) -> None:
        """The (host, port) Metadata gives clients for this agent; ``per_connection``:
        give each connection the address it reached instead (host and port)."""
        assert self.ctx is not None
        self.ctx.host, self.ctx.port = address
        self.per_connection = per_connection

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
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        limit = self.state.settings.kafka_max_connections_per_ip
        if self._per_address[address] >= limit:
            self.metrics.closed.labels("too_many_connections").inc()
            log.warning("closing Kafka connection from %s: over %d from that address", peer, limit)
            writer.transport.abort()
            return
        self._per_address[address] += 1
        self._connections.add(task)
        self.metrics.connections.inc()
        try:
            await self._serve(reader, writer, address)
        except asyncio.CancelledError:
            pass  # shutting down: asyncio's stream callback must not see the cancellation
        finally:
            self.metrics.connections.dec()
            self._connections.discard(task)
            self._per_address[address] -= 1
            if not self._per_address[address]:
                del self._per_address[address]

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str
    ) -> None:
        assert self.ctx is not None
        settings = self.state.settings
        peer = writer.get_extra_info("peername")
        session = (
            SaslSession(self.authenticator, address, settings.kafka_connections_max_reauth_ms)
            if self.authenticator is not None
            else None
        )
        if session is not None and self.tls is not None:
            try:  # mTLS: a verified client certificate names the principal, no SASL needed
                peercert = writer.get_extra_info("peercert")
                session.principal = certificate_principal(peercert, self.mapper)
            except InvalidSecurityRequestError as e:
                log.warning("closing Kafka connection from %s: %s", peer, e.message)
                writer.close()
                return
        authenticated = session is None or session.principal is not None
        decoder = FrameDecoder(
            settings.kafka_max_request_bytes
            if authenticated
            else min(settings.kafka_max_unauthenticated_bytes, settings.kafka_max_request_bytes)
        )
        loop = asyncio.get_running_loop()
        idle_s = settings.kafka_connections_max_idle_ms / 1000
        auth_deadline = loop.time() + settings.kafka_authentication_timeout_ms / 1000
        outbox = _Outbox(settings.kafka_max_unsent_bytes, self.metrics.unsent_bytes)
        ctx = self.ctx
        if self.per_connection:
            local = writer.get_extra_info("sockname")
            if local:
                ctx = ctx.at(_unmapped(str(local[0])), int(local[1]))
        sender = asyncio.create_task(_send(writer, outbox), name=f"kafka-send-{peer}")
        ended = "protocol"
        try:
            received_at = loop.time()

            def timeout() -> float:
                """Seconds until the connection is idle (or its login overdue)."""
                now = loop.time()
                left = max(received_at, outbox.written_at) + idle_s - now
                if left <= 0:
                    raise _Close("idle", "idle for connections.max.idle.ms")
                if authenticated:
                    return left
                if auth_deadline <= now:
                    raise _Close("authentication_timeout", "SASL not completed in time")
                return min(left, auth_deadline - now)

            while not sender.done():
                try:
                    data = await asyncio.wait_for(reader.read(_READ_BYTES), timeout())
                except TimeoutError:
                    continue  # timeout() says which limit passed, or waits on
                if not data:
                    ended = "eof"
                    break
                received_at = loop.time()
                for frame in decoder.feed(data):
                    if outbox.full():
                        self.metrics.reads_paused.inc()
                        while outbox.full():  # the client reads nothing: neither does the agent
                            with contextlib.suppress(TimeoutError):
                                await asyncio.wait_for(outbox.room(), timeout())
                    answer = await self._handle(frame, session, address, ctx)
                    if answer is not None:
                        outbox.put(*answer, len(frame))
                    if session is not None and session.failed:
                        raise _Close("authentication_failed", "SASL authentication failed")
                    if not authenticated and session is not None and session.principal:
                        authenticated = True
                        decoder.max_frame_bytes = settings.kafka_max_request_bytes
        except _Close as e:
            ended = e.reason
            log.warning("closing Kafka connection from %s: %s", peer, e)
        except FrameTooLargeError as e:
            ended = "frame_too_large"
            log.warning("closing Kafka connection from %s: %s", peer, e)
        except SessionExpiredError as e:
            ended = "session_expired"
            log.info("closing Kafka connection from %s: %s", peer, e)
        except FrameError as e:
            log.warning("closing Kafka connection from %s: %s", peer, e)
        except (ConnectionError, asyncio.IncompleteReadError):
            ended = "eof"
        except Exception:
            log.exception("Kafka connection from %s failed", peer)
        finally:
            if ended != "eof":
                self.metrics.closed.labels(ended).inc()
            if ended in _ANSWER_THEN_CLOSE and not sender.done():
                # Kafka writes the answers of the requests before the bad one (or the
                # failed authentication's), then closes.
                outbox.queue.put_nowait(None)
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(sender), idle_s)
            sender.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await sender
            outbox.drop()
            writer.transport.abort()  # nothing unsent is kept for a connection that ended

    async def _handle(
        self,
        frame: bytes,
        session: SaslSession | None = None,
        address: str = "",
        ctx: h.KafkaContext | None = None,
    ) -> tuple[int, Any] | None:
        """Decode and run one request: (correlation id, body or Deferred), or None.

        ``session``: the connection's SASL state when authentication is on; ``address``:
        the client's (the host ACLs are checked against); ``ctx``: the connection's
        context (default: the listener's).

        Raises:
            FrameError: the connection must close (after the answers queued so far).
            SessionExpiredError: its SASL session ended without re-authentication.
        """
        ctx = ctx or self.ctx
        assert ctx is not None
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
        if session is not None:
            if session.principal is None and api_key != API_VERSIONS:
                raise FrameError(f"api key {api_key} before SASL authentication")
            session.check_expiry()
        handler = HANDLERS[api_key][2]
        principal = session.principal if session is not None else None
        credential = session.credential if session is not None else None
        access = await self._access(api_key, principal, address)
        access.credential = credential
        body = await handler(ctx, req, access)
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


def _unmapped(host: str) -> str:
    """An IPv4 address as clients write it: ``::ffff:10.0.0.5`` (a dual-stack socket's
    view of an IPv4 client) is ``10.0.0.5``."""
    return host.removeprefix("::ffff:") if host.startswith("::ffff:") and "." in host else host


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


async def _send(writer: asyncio.StreamWriter, outbox: _Outbox) -> None:
    """Write answers in request order; a Deferred is awaited in its turn."""
    loop = asyncio.get_running_loop()
    while True:
        item = await outbox.queue.get()
        if item is None:
            return
        correlation_id, body, cost = item
        try:
            if isinstance(body, h.Deferred):
                body = await body.task
                if body is None:  # acks=0
                    continue
                body = encode_response(correlation_id, body)
            # In slices, so that a slow reader of a big answer still counts as active.
            for piece in body.parts:
                for at in range(0, len(piece), _WRITE_SLICE):
                    writer.write(piece[at : at + _WRITE_SLICE])
                    await writer.drain()
                    outbox.written_at = loop.time()
            del body
        finally:
            outbox.done(cost)
