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
latest). A cursor is the positions of the stream (next offset per partition) as
URL-safe base64 of JSON: a client that resumes with the last cursor it processed gets
every following record exactly once, through any agent.

While it runs, the stream stores the positions it has *sent* as the group's committed
offsets (at most every ``commit_interval_ms``, and when it ends), as an operator's
offset reset does (``alter_group_offsets``): a client that reconnects without a cursor
resumes there (records sent but not processed before a crash come again: at least
once). The group must have no REST or Kafka members (those own its offsets); the stream
then only reads. A stream is not a member: two streams of one group both read
everything (a group stream is one reader that can resume, not a balanced group).

With authorization on, READ on the group and on each topic is checked when the stream
opens (``service.acl``) and again before every round it sends, with the agent's ACL
copy: a READ revoked while the stream is open ends it within the agents' staleness
bound, with an error event (SSE ``event: error``) or line, ``{"error_code": 40301,
"message"}``, as its last.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Header, Query, Request
from starlette.responses import StreamingResponse

from coordinator.groups import CommittedOffset
from coordinator.security import Operation, ResourceType
from segments.errors import (
    AuthorizationError,
    LakelogError,
    MalformedRequestError,
    NonEmptyGroupError,
)
from segments.types import TopicPartition
from service.acl import Rights, rights
from service.errors import ErrorCode
from service.executors import Kind, call, run
from service.state import AgentState, get_state
from service.v2.consumers import read_round_robin
from service.v3.consume import check_format, render

log = logging.getLogger(__name__)
router = APIRouter(tags=["v3 consume (lakelog)"])

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
#: Key + value bytes read per round (one round is rendered and sent at once).
ROUND_BYTES = 1 << 20


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
    topics: str = Query(description="Comma-separated topic names."),
    cursor: str | None = Query(default=None, description="The last cursor received."),
    auto_offset_reset: str = Query(default="earliest", pattern="^(earliest|latest)$"),
    format: str = Query(default="binary", description="binary, json, avro, jsonschema, protobuf"),
    keepalive_ms: int = Query(default=15000, ge=100, le=300000),
    commit_interval_ms: int = Query(default=1000, ge=0),
    last_event_id: str | None = Header(default=None),
    state: AgentState = Depends(get_state),
) -> StreamingResponse:
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
    committed = await call(state.groups.committed_offsets, group_id, partitions)
    missing = [tp for tp in partitions if tp not in resumed and tp not in committed]
    edges = await call(state.coordinator.offsets_many, missing) if missing else {}
    positions: dict[TopicPartition, int] = {}
    for tp in partitions:
        if tp in resumed:
            positions[tp] = resumed[tp]
        elif tp in committed:
            positions[tp] = committed[tp].offset
        else:
            o = edges[tp]
            positions[tp] = o.log_start if auto_offset_reset == "earliest" else o.high_watermark
    stream = _GroupStream(
        state, group_id, positions, format, _wants_sse(request.headers.get("accept"))
    )
    stream.rights = rights(request)
    stream.keepalive_s = keepalive_ms / 1000
    stream.commit_interval_s = commit_interval_ms / 1000
    return StreamingResponse(
        stream.events(request),
        media_type=SSE if stream.sse else NDJSON,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


class _GroupStream:
    """One open stream: its positions, what it has committed, how it frames records."""

    def __init__(
        self,
        state: AgentState,
        group: str,
        positions: dict[TopicPartition, int],
        fmt: str,
        sse: bool,
    ) -> None:
        self.state = state
        self.group = group
        self.positions = positions
        self.fmt = fmt
        self.sse = sse
        self.keepalive_s = 15.0
        self.commit_interval_s = 1.0
        self._committed = dict(positions)
        self._can_commit = True
        self.rights = Rights(None, "", "")

    async def events(self, request: Request) -> AsyncIterator[bytes]:
        state = self.state
        ids = {}
        for tp in self.positions:
            ids[tp] = ((await state.topics.get(tp.topic)).topic_id, tp.partition)
        last_commit = time.monotonic()
        ordered = sorted(self.positions)
        keys = {(tp.topic, tp.partition): cursor_key(tp) for tp in ordered}
        cursor = {cursor_key(tp): self.positions[tp] for tp in ordered}
        watches = {ids[tp]: (tp.topic, off) for tp, off in self.positions.items()}
        try:
            with state.notifier.watch(watches) as waiter:
                while not await request.is_disconnected():
                    try:
                        await self._authorized()
                    except AuthorizationError as e:
                        yield self._error(int(ErrorCode.KAFKA_AUTHORIZATION), e.message)
                        return
                    records, new, _ = await run(
                        Kind.READ, read_round_robin, state.reader, self.positions, ROUND_BYTES
                    )
                    if records:
                        rendered = await render(state, records, self.fmt)
                        out = []
                        for rec, doc in zip(records, rendered, strict=True):
                            # The cursor after each record: one dict updated in place.
                            cursor[keys[(rec.topic, rec.partition)]] = rec.offset + 1
                            out.append(self._frame(doc, _encode_doc(cursor)))
                        self.positions.update(new)
                        for tp, off in new.items():
                            waiter.update(ids[tp], off)
                        state.consume_metrics.consumed_records.inc(len(records))
                        yield b"".join(out)
                    elif not await state.notifier.wait(waiter, self.keepalive_s):
                        yield b": keepalive\n\n" if self.sse else b'{"keepalive":true}\n'
                    if time.monotonic() - last_commit >= self.commit_interval_s:
                        await self._commit()
                        last_commit = time.monotonic()
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._commit())

    async def _authorized(self) -> None:
        """Raises AuthorizationError unless READ is still allowed on the group and topics."""
        await self.rights.require(Operation.READ, ResourceType.GROUP, [self.group])
        topics = {tp.topic for tp in self.positions}
        await self.rights.require(Operation.READ, ResourceType.TOPIC, topics)

    def _error(self, code: int, message: str) -> bytes:
        """The stream's last event: an error in the door's shape."""
        doc = orjson.dumps({"error_code": code, "message": message})
        if self.sse:
            return b"event: error\ndata: %s\n\n" % doc
        return doc + b"\n"

    def _frame(self, doc: dict[str, Any], cursor: str) -> bytes:
        if self.sse:
            return b"id: %s\nevent: record\ndata: %s\n\n" % (cursor.encode(), orjson.dumps(doc))
        return orjson.dumps({**doc, "cursor": cursor}) + b"\n"

    async def _commit(self) -> None:
        """The positions sent so far as the group's committed offsets (see the module
        docstring); a group with members keeps its own offsets."""
        moved = {tp: off for tp, off in self.positions.items() if self._committed.get(tp) != off}
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
