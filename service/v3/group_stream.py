"""A consumer group's records as a stream (lakelog's, issue 16): NDJSON or Server-Sent Events.

``GET /v3/clusters/{c}/consumer-groups/{g}/records?topics=a,b`` stays open and delivers
the records of every partition of ``topics`` as they are committed, in offset order per
partition, in the v2 consumer's shape (``format`` as for the v3 read by offset):

- ``Accept: text/event-stream``: one SSE event per record, ``event: record``, ``id:``
  the cursor after it, ``data:`` the record's JSON; a ``: keepalive`` comment every
  ``keepalive_ms`` while nothing comes.
- ``Accept: application/x-ndjson`` (the default): one JSON object per line, the record's
  fields plus ``"cursor"``; an ``{"keepalive": true}`` line while nothing comes.

Where it starts, per partition: the cursor the client echoes back (SSE's
``Last-Event-ID`` header, or the ``cursor`` query parameter: the last cursor it
received), else the group's committed offset, else ``auto_offset_reset`` (earliest or
latest); a cursor or committed offset outside [log-start, high watermark] (its records
deleted, or written for a topic since deleted and created again) is reset by
``auto_offset_reset`` too, as Kafka's consumer does. Partitions added to the topics while
it runs join it (as the agent's topic metadata shows them, within ``metadata_ttl_s``)
from their committed offset or ``auto_offset_reset``. A cursor is the positions of the
stream (next offset per partition) as URL-safe base64 of JSON: a client that resumes
with the last cursor it processed gets every following record exactly once, through any
agent.

While it runs, the stream stores the positions it has *delivered* as the group's
committed offsets (at most every ``commit_interval_ms``, and when it ends), as an
operator's offset reset does (``alter_group_offsets``): a client that reconnects
without a cursor resumes there (records delivered but not processed before a crash come
again: at least once). Delivered is what ``service.delivery.DeliveryStream`` says: a
round of records whose bytes got out while the client was still connected, as for the
v2 consumer's fetch; a round cut short by a hang-up is not committed. The group must
have no REST or Kafka members (those own its offsets); the stream then only reads. A
stream is not a member: two streams of one group both read everything (a group stream
is one reader that can resume, not a balanced group).

Each round reads up to 4 MiB of keys and values, granted from the agent's fetch memory
(``consumer_fetch_memory_bytes``, shared with the v2 and v3 fetches) until its chunk is
handed on; while none is left, the stream sends keepalives.

With authorization on, READ on the group and on each topic is checked when the stream
opens (``service.security.acl``) and again before every round it sends, with the agent's ACL
copy: a READ revoked while the stream is open ends it within the agents' staleness bound.

An error once the stream has begun (a topic deleted while streaming, a damaged index, a
READ revoked) ends it with one last event in the REST door's shape,
``{"error_code", "message"}``: an ``event: error`` under SSE, a line under NDJSON.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Header, Query, Request, Response
from starlette.responses import StreamingResponse

from coordinator.client import PartitionOffsets, TopicPartition
from coordinator.groups.model import CommittedOffset
from coordinator.security.model import Operation, ResourceType
from segments.errors import (
    LakelogError,
    MalformedRequestError,
    NonEmptyGroupError,
    TopicNotFoundError,
)
from segments.types import ConsumedRecord
from service.consume.notify import Waiter
from service.delivery import DeliveryStream, DisconnectWatch
from service.errors import error_code_for, error_message_for
from service.executors import Kind, call, run
from service.security.acl import Rights, rights
from service.state import AgentState, StateDep
from service.v2.consumers import (
    FETCH_MIN_GRANT,
    JSON_ENCODER,
    BinaryRecord,
    binary_records,
    read_round_robin,
)
from service.v3.consume import check_format, render

log = logging.getLogger(__name__)
router = APIRouter(tags=["v3 consume (lakelog)"])

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
#: Key + value bytes read per round at most (one round is rendered and sent at once), as
#: the agent's fetch memory budget grants them.
ROUND_BYTES = 4 << 20


_SSE_EXAMPLE = (
    'id: eyIwOnQiOjF9\nevent: record\ndata: {"topic":"t","key":null,"value":"aGk=",'
    '"partition":0,"offset":0,"timestamp":1700000000000,"headers":[]}\n\n'
)
_NDJSON_EXAMPLE = (
    '{"topic":"t","key":null,"value":"aGk=","partition":0,"offset":0,'
    '"timestamp":1700000000000,"headers":[],"cursor":"eyIwOnQiOjF9"}\n'
)


def cursor_key(tp: TopicPartition) -> str:
    return f"{tp.partition}:{tp.topic}"


def encode_cursor(positions: dict[TopicPartition, int]) -> str:
    return _encode_doc({cursor_key(tp): off for tp, off in sorted(positions.items())})


def _encode_doc(doc: dict[str, int]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict[TopicPartition, int]:
    """Raises MalformedRequestError (400) for a cursor this stream did not write."""
    try:
        doc = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        out = {}
        for k, off in doc.items():
            partition, topic = k.split(":", 1)
            if type(off) is not int or off < 0:
                raise ValueError(k)
            out[TopicPartition(topic, int(partition))] = off
        return out
    except (ValueError, AttributeError, binascii.Error, orjson.JSONDecodeError):
        raise MalformedRequestError("Bad Request: the cursor is not one this API wrote.") from None


def _wants_sse(accept: str | None) -> bool:
    return accept is not None and SSE in accept


@router.get(
    "/v3/clusters/{cluster_id}/consumer-groups/{group_id}/records",
    summary="Stream a consumer group's records as NDJSON or Server-Sent Events (lakelog)",
    response_description="text/event-stream or application/x-ndjson, open until closed",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {
                SSE: {"schema": {"type": "string"}, "example": _SSE_EXAMPLE},
                NDJSON: {"schema": {"type": "string"}, "example": _NDJSON_EXAMPLE},
            }
        }
    },
)
async def stream_group_records(
    cluster_id: str,
    group_id: str,
    request: Request,
    state: StateDep,
    topics: str = Query(description="Comma-separated topic names."),
    cursor: str | None = Query(default=None, description="The last cursor received."),
    auto_offset_reset: str = Query(default="earliest", pattern="^(earliest|latest)$"),
    format: str = Query(default="binary", description="binary, json, avro, jsonschema, protobuf"),
    keepalive_ms: int = Query(default=15000, ge=100, le=300000),
    commit_interval_ms: int = Query(default=1000, ge=0),
    isolation_level: str = Query(
        default="read_uncommitted", pattern="^(read_uncommitted|read_committed)$"
    ),
    last_event_id: str | None = Header(default=None),
) -> Response:
    """See the module docstring."""
    check_format(format)
    names = [t for t in (n.strip() for n in topics.split(",")) if t]
    if not names:
        raise MalformedRequestError("Bad Request: topics names at least one topic.")
    partitions = []
    for name in names:
        info = await state.topics.get(name)
        partitions += [TopicPartition(name, p) for p in range(info.partitions)]
    echoed = last_event_id or cursor
    resumed = decode_cursor(echoed) if echoed else {}
    stream = _GroupStream(
        state, group_id, names, auto_offset_reset, format, _wants_sse(request.headers.get("accept"))
    )
    stream.rights = rights(request)
    stream.read_committed = isolation_level == "read_committed"
    await stream.add(partitions, resumed)
    stream.keepalive_s = keepalive_ms / 1000
    stream.commit_interval_s = commit_interval_ms / 1000
    watch = DisconnectWatch(request.receive)
    watch.start()
    return DeliveryStream(
        stream.events(watch),
        SSE if stream.sse else NDJSON,
        watch,
        stream.delivered,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


class _GroupStream:
    """One open stream: its positions, what it has committed, how it frames records."""

    def __init__(
        self,
        state: AgentState,
        group: str,
        topics: list[str],
        auto_offset_reset: str,
        fmt: str,
        sse: bool,
    ) -> None:
        self.state = state
        self.group = group
        self.topics = topics
        self.auto_offset_reset = auto_offset_reset
        self.fmt = fmt
        self.sse = sse
        self.keepalive_s = 15.0
        self.commit_interval_s = 1.0
        #: Where the next round reads from (past what was sent, delivered or not).
        self.positions: dict[TopicPartition, int] = {}
        #: The topic id of each partition when the stream took it: the log it reads.
        self.ids: dict[TopicPartition, bytes] = {}
        #: Positions after what got out to the client (``DeliveryStream``): committed.
        self._delivered: dict[TopicPartition, int] = {}
        #: Positions after the chunk being sent, delivered once it got out.
        self._pending: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._can_commit = True
        self._ended = False
        self.rights = Rights(None, "", "")
        self.read_committed = False

    async def add(
        self, partitions: list[TopicPartition], resumed: dict[TopicPartition, int]
    ) -> None:
        """Start reading ``partitions``: at the cursor's position, else the committed
        offset, else (or when outside [log-start, high watermark]) by auto_offset_reset.

        Raises:
            TopicNotFoundError: a topic deleted meanwhile.
        """
        state = self.state
        committed = await call(state.groups.committed_offsets, self.group, partitions)
        bounds = await call(state.coordinator.offsets_many, partitions)
        for tp in partitions:
            o = bounds.get(tp)
            if o is None:  # deleted since its metadata was read
                raise TopicNotFoundError(f"Topic '{tp.topic}' not found.")
            pos = resumed.get(tp, committed[tp].offset if tp in committed else None)
            if pos is None or not o.log_start <= pos <= o.high_watermark:
                # None, or not of this log (deleted records, a topic created again):
                # Kafka's auto.offset.reset.
                pos = o.log_start if self.auto_offset_reset == "earliest" else o.high_watermark
            self.positions[tp] = self._delivered[tp] = self._committed[tp] = pos
            self.ids[tp] = o.topic_id

    async def _added_partitions(self) -> list[TopicPartition]:
        """Take the partitions added to the topics since the stream began (as the topic
        cache sees them), from their committed offsets or auto_offset_reset."""
        new = []
        for name in self.topics:
            count = (await self.state.topics.get(name)).partitions
            new += [tp for p in range(count) if (tp := TopicPartition(name, p)) not in self.ids]
        if new:
            await self.add(new, {})
        return new

    def delivered(self) -> None:
        """``DeliveryStream``: the last chunk got out to the client."""
        self._delivered.update(self._pending)
        self._pending = {}

    def _bounds(self) -> dict[TopicPartition, PartitionOffsets]:
        """The partitions' offsets now (worker thread).

        Raises:
            TopicNotFoundError: a topic was deleted (or deleted and created again: another
                log, which this stream's positions do not belong to).
        """
        bounds = self.state.coordinator.offsets_many(list(self.positions))
        for tp, topic_id in self.ids.items():
            o = bounds.get(tp)
            if o is None or (o.topic_id and o.topic_id != topic_id):
                raise TopicNotFoundError(
                    f"Topic '{tp.topic}' was deleted while streaming; reconnect to read "
                    "the topic of that name now."
                )
        return bounds

    def _round(self, max_bytes: int) -> tuple[list[ConsumedRecord], dict[TopicPartition, int]]:
        """One round of records from the positions (worker thread)."""
        records, new, _ = read_round_robin(
            self.state.reader,
            self.positions,
            max_bytes,
            bounds=self._bounds(),
            read_committed=self.read_committed,
        )
        return records, new

    async def events(self, watch: DisconnectWatch) -> AsyncIterator[bytes]:
        """The stream's chunks until the client goes or an error ends it (its last chunk);
        commits what was delivered when it ends."""
        cursor = {cursor_key(tp): off for tp, off in sorted(self.positions.items())}
        try:
            while not watch.disconnected and not self._ended:
                # Registered again whenever partitions are added, so that they wake it too.
                watches = {
                    (self.ids[tp], tp.partition): (tp.topic, off)
                    for tp, off in self.positions.items()
                }
                with self.state.notifier.watch(watches) as waiter:
                    watch.callbacks.append(waiter.event.set)
                    try:
                        async with contextlib.aclosing(
                            self._serve(waiter, watch, cursor)
                        ) as chunks:
                            async for chunk in chunks:
                                yield chunk
                    finally:
                        watch.callbacks.remove(waiter.event.set)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._commit())

    async def _serve(
        self, waiter: Waiter, watch: DisconnectWatch, cursor: dict[str, int]
    ) -> AsyncGenerator[bytes, None]:
        """Rounds of records (or keepalives) until the client goes, an error (the last
        chunk, and ``_ended``), or partitions were added (taken, with their cursors)."""
        state = self.state
        budget = state.consumers.budget
        keepalive = b": keepalive\n\n" if self.sse else b'{"keepalive":true}\n'
        last_commit = last_check = time.monotonic()
        while not watch.disconnected:
            # A round's records count against the agent's fetch memory (shared with the v2
            # and v3 fetches) from its read until its chunk is handed on.
            grant = await budget.acquire(ROUND_BYTES, FETCH_MIN_GRANT, self.keepalive_s)
            if not grant:
                yield keepalive
                continue
            try:
                try:
                    await self._authorized()
                    records, new = await run(Kind.READ, self._round, grant)
                    rendered: Sequence[dict[str, Any] | BinaryRecord] = (
                        binary_records(records)
                        if self.fmt == "binary"
                        else await render(state, records, self.fmt)
                        if records
                        else []
                    )
                except LakelogError as e:
                    yield self._end(e)
                    return
                idle = not records
                if records:
                    out = []
                    for rec, doc in zip(records, rendered, strict=True):
                        # The cursor after each record: one dict updated in place.
                        tp = TopicPartition(rec.topic, rec.partition)
                        cursor[cursor_key(tp)] = rec.offset + 1
                        out.append(self._frame(doc, _encode_doc(cursor)))
                    self.positions.update(new)
                    for tp, off in new.items():
                        waiter.update((self.ids[tp], tp.partition), off)
                    state.consume_metrics.consumed_records.inc(len(records))
                    self._pending = dict(new)
                    del records, rendered
                    yield b"".join(out)
            finally:
                await budget.release(grant)
            if idle and not await state.notifier.wait(waiter, self.keepalive_s):
                yield keepalive
            if time.monotonic() - last_commit >= self.commit_interval_s:
                await self._commit()
                last_commit = time.monotonic()
            if time.monotonic() - last_check >= state.settings.metadata_ttl_s:
                last_check = time.monotonic()
                try:
                    added = await self._added_partitions()
                except LakelogError as e:
                    yield self._end(e)
                    return
                if added:
                    for tp in added:
                        cursor[cursor_key(tp)] = self.positions[tp]
                    return

    async def _authorized(self) -> None:
        """Raises AuthorizationError unless READ is still allowed on the group and topics."""
        await self.rights.require(Operation.READ, ResourceType.GROUP, [self.group])
        topics = {tp.topic for tp in self.positions}
        await self.rights.require(Operation.READ, ResourceType.TOPIC, topics)

    def _end(self, exc: LakelogError) -> bytes:
        """The error that ends the stream, as its last chunk (the 200 is sent already)."""
        log.warning("stream of group %s ends: %s", self.group, exc)
        self._ended = True
        return self._error(exc)

    def _frame(self, doc: dict[str, Any] | BinaryRecord, cursor: str) -> bytes:
        data = JSON_ENCODER.encode(doc) if isinstance(doc, BinaryRecord) else orjson.dumps(doc)
        if self.sse:
            return b"id: %s\nevent: record\ndata: %s\n\n" % (cursor.encode(), data)
        # The record's fields, then its cursor (URL-safe base64: nothing to escape).
        return b'%s,"cursor":"%s"}\n' % (data[:-1], cursor.encode())

    def _error(self, exc: LakelogError) -> bytes:
        """The error in the REST door's shape, as the stream's last event."""
        body = orjson.dumps(
            {"error_code": error_code_for(exc, v3=True), "message": error_message_for(exc, v3=True)}
        )
        if self.sse:
            return b"event: error\ndata: %s\n\n" % body
        return body + b"\n"

    async def _commit(self) -> None:
        """The positions delivered so far as the group's committed offsets (see the module
        docstring); a group with members keeps its own offsets."""
        moved = {tp: off for tp, off in self._delivered.items() if self._committed.get(tp) != off}
        if not moved or not self._can_commit:
            return
        try:
            await call(
                self.state.groups.alter_group_offsets,
                self.group,
                {tp: CommittedOffset(off) for tp, off in moved.items()},
            )
        except NonEmptyGroupError:
            log.info("group %s has members: its stream does not commit offsets", self.group)
            self._can_commit = False
            return
        except LakelogError as e:
            log.warning("committing the stream of group %s: %s", self.group, e)
            return
        self._committed.update(moved)
