"""REST v3 produce: ``POST /v3/clusters/{c}/topics/{t}/records`` (REST-API.md section 3.6).

The body is one JSON object per record: a single object, or many concatenated
objects, possibly sent with ``Transfer-Encoding: chunked`` while the client reads the
delivery reports. The body is split into objects *as it arrives*
(:class:`ObjectSplitter`), each arriving group of records goes to the batcher at once
(so a stream of records shares flushes instead of waiting one linger per record), and
the response streams one report per record, in input order, each followed by CRLF as
kafka-rest writes them.

Request-level failures are plain HTTP errors, decided before the stream starts:
Content-Type other than ``application/json`` -> 415, unknown topic -> 404 40403, an
empty body -> 422 42206. Once streaming, the status stays 200 and failures are
reported per record: bad JSON or fields -> 400, partition outside the topic -> 40402,
a record over ``max.message.bytes`` -> 413, a key/value without a ``type`` or schema
fields -> 42202, a schema key/value (``type`` AVRO/JSONSCHEMA/PROTOBUF, ``schema_id``,
``schema_version``, ``subject``, ``schema``: ``service.registry.rest.prepare_v3``)
that does not fit -> 42205, a failed flush -> 50003/50002. An object
larger than ``max_request_bytes`` ends the stream with a 413 report. The cluster id in
the URL is not checked: kafka-rest does not validate it on produce.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request, Response
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from segments.errors import (
    LakelogError,
    MalformedRequestError,
    PartitionNotFoundError,
    RequestTooLargeError,
    UnprocessableRequestError,
    UnsupportedFormatError,
)
from segments.types import Headers, Record, TopicInfo
from service.errors import error_code_for, error_message_for
from service.formats import (
    check_record_size,
    check_v3_content_type,
    decode_base64,
    encode_json,
    max_message_bytes,
)
from service.partitioner import DEFAULT_PARTITIONER, partition_for_key
from service.registry.rest import prepare_v3
from service.state import AgentState, get_state

router = APIRouter(tags=["v3 records"])

_RECORD_FIELDS = frozenset({"partition_id", "headers", "key", "value", "timestamp"})
_DATA_FIELDS = frozenset(
    {"type", "data", "subject", "subject_name_strategy", "schema_id", "schema_version", "schema"}
)
_EMPTY_BODY = "Payload error. Request body is empty. Data is required."
# Report groups waiting to be written: bounds what one stream holds beyond the batcher.
_MAX_PENDING_GROUPS = 64


# -- splitting a byte stream into JSON values ------------------------------------------

# A JSON string (possibly cut off by the end of the data so far) or one bracket. Strings
# are matched whole so brackets inside them are skipped; UTF-8 continuation bytes never
# equal '"', '\\' or a bracket, so scanning bytes is safe.
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)|[{}\[\]]', re.DOTALL)
_OPEN = frozenset(b"{[")


class SplitError(Exception):
    """A run of the body that is not a JSON object (reported as one failed record)."""


#: What the splitter yields: a complete JSON value, a garbage run, or the end of the
#: stream because a value is too large.
Item = bytes | SplitError | RequestTooLargeError


class ObjectSplitter:
    """Cuts concatenated JSON values out of a byte stream, as the bytes arrive.

    Only brackets and strings are tokenized (by one C-level regex); the values
    themselves are parsed by orjson once complete. Anything between values other
    than whitespace comes back as a :class:`SplitError` item.

    Args:
        max_value_bytes: a value still incomplete at this size raises RequestTooLargeError.
    """

    def __init__(self, max_value_bytes: int) -> None:
        self.max_value_bytes = max_value_bytes
        self._buf = b""
        self._scan = 0  # where tokenizing resumes
        self._depth = 0

    def feed(self, data: bytes) -> list[Item]:
        """Add bytes; return the values (and garbage runs) completed by them.

        A value over ``max_value_bytes`` (complete, or still growing) ends the list
        with a RequestTooLargeError item: the stream cannot go on after it.
        """
        buf = self._buf + data if self._buf else data
        out: list[Item] = []
        depth, start, pos = self._depth, 0, self._scan
        for match in _TOKENS.finditer(buf, pos):
            token_start, token_end = match.span()
            first = buf[token_start]
            if first == 0x22:  # '"'
                if token_end == len(buf) and _cut_off(buf, token_start, token_end):
                    pos = token_start  # cut off: rescan the whole string with more data
                    break
                if depth == 0:
                    _garbage(buf, start, token_end, out)
                    start = token_end
                pos = token_end
                continue
            if first in _OPEN:
                if depth == 0:
                    _garbage(buf, start, token_start, out)
                    start = token_start
                depth += 1
            elif depth == 0:
                _garbage(buf, start, token_end, out)  # a stray closing bracket
                start = token_end
            else:
                depth -= 1
                if depth == 0:
                    if token_end - start > self.max_value_bytes:
                        out.append(self._too_large())
                        return out
                    out.append(buf[start:token_end])
                    start = token_end
            pos = token_end
        else:
            pos = len(buf)
        # Keep only the unconsumed tail: the open value, or text after the last one.
        self._buf, self._scan, self._depth = buf[start:], pos - start, depth
        if len(self._buf) > self.max_value_bytes:
            out.append(self._too_large())
        return out

    def _too_large(self) -> RequestTooLargeError:
        self._buf, self._scan, self._depth = b"", 0, 0
        return RequestTooLargeError(
            f"A record exceeds the request limit of {self.max_value_bytes} bytes."
        )

    def finish(self) -> list[Item]:
        """The body ended: whatever is left is an incomplete value or garbage."""
        rest, self._buf = self._buf, b""
        if self._depth > 0 or rest.strip():
            self._depth = 0
            return [SplitError("Bad Request: unexpected end of JSON input.")]
        return []


def _cut_off(buf: bytes, start: int, end: int) -> bool:
    """Whether the string token buf[start:end], which ends the data, lacks its closing quote."""
    if end - start < 2 or buf[end - 1] != 0x22:
        return True
    n = 0  # an odd run of backslashes before the last quote escapes it
    i = end - 2
    while i > start and buf[i] == 0x5C:
        n += 1
        i -= 1
    return n % 2 == 1


def _garbage(buf: bytes, start: int, end: int, out: list[Item]) -> None:
    if buf[start:end].strip():
        out.append(SplitError("Bad Request: the body must be JSON objects, one per record."))


# -- one record -------------------------------------------------------------------------


class _Parsed:
    """A checked record and the parts of its delivery report known before the flush."""

    __slots__ = ("key_report", "partition", "record", "value_report")

    def __init__(
        self,
        partition: int,
        record: Record,
        key_report: dict[str, Any] | None,
        value_report: dict[str, Any] | None,
    ) -> None:
        self.partition = partition
        self.record = record
        self.key_report = key_report
        self.value_report = value_report


def _parse_data(doc: object, what: str) -> tuple[bytes | None, dict[str, Any] | None]:
    """A ProduceRequestData (key or value) -> bytes and its report ``{type, size}``."""
    if doc is None:
        return None, None
    if not isinstance(doc, dict):
        raise MalformedRequestError(f"Bad Request: {what} must be an object.")
    unknown = doc.keys() - _DATA_FIELDS
    if unknown:
        raise MalformedRequestError(f'Bad Request: Unrecognized field "{sorted(unknown)[0]}".')
    kind = doc.get("type")
    if kind is None:
        raise UnsupportedFormatError(
            f"{what} has no type and names no schema; set type (BINARY, JSON, STRING, AVRO, "
            "JSONSCHEMA, PROTOBUF) or schema_id, schema_version or schema."
        )
    if not isinstance(kind, str):
        raise MalformedRequestError(f"Bad Request: {what}.type must be a string.")
    kind = kind.upper()
    data = doc.get("data")
    out: bytes | None
    if kind == "BINARY":
        out = decode_base64(data, "data")
    elif kind == "JSON":
        out = None if data is None else encode_json(data)
    elif kind == "STRING":
        if data is not None and not isinstance(data, str):
            raise MalformedRequestError(f"Bad Request: {what}.data must be a string for STRING.")
        out = None if data is None else data.encode("utf-8")
    else:
        raise MalformedRequestError(f"Bad Request: unknown {what}.type {kind}.")
    return out, {"type": kind, "size": len(out) if out is not None else 0}


def _parse_headers(raw: object) -> Headers:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MalformedRequestError("Bad Request: headers must be an array.")
    out: list[tuple[str, bytes | None]] = []
    for h in raw:
        if not isinstance(h, dict) or not isinstance(h.get("name"), str):
            raise MalformedRequestError(
                'Bad Request: each header must be {"name": string, "value": base64 or null}.'
            )
        out.append((h["name"], decode_base64(h.get("value"), "header value")))
    return tuple(out)


def _parse_timestamp(raw: object, now_ms: int) -> int:
    if raw is None:
        return now_ms
    if not isinstance(raw, str):
        raise MalformedRequestError("Bad Request: timestamp must be an ISO-8601 date-time string.")
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise MalformedRequestError(
            f"Bad Request: timestamp {raw[:40]} is not an ISO-8601 date-time."
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise MalformedRequestError("Bad Request: timestamp before 1970 is not supported.")
    return ms


def parse_record(
    doc: object, topic: TopicInfo, limit: int, now_ms: int, sticky: list[int]
) -> _Parsed:
    """Check one v3 record object and pick its partition.

    ``sticky`` holds the keyless partition of the current group (-1 until needed).

    Raises:
        LakelogError: the per-record error to report (400, 40402, 413, 42202).
    """
    if not isinstance(doc, dict):
        raise MalformedRequestError("Bad Request: a record must be a JSON object.")
    unknown = doc.keys() - _RECORD_FIELDS
    if unknown:
        raise MalformedRequestError(f'Bad Request: Unrecognized field "{sorted(unknown)[0]}".')
    key, key_report = _parse_data(doc.get("key"), "key")
    value, value_report = _parse_data(doc.get("value"), "value")
    record = Record(
        key,
        value,
        _parse_timestamp(doc.get("timestamp"), now_ms),
        _parse_headers(doc.get("headers")),
    )
    check_record_size(record, limit)
    explicit = doc.get("partition_id")
    if explicit is not None:
        if type(explicit) is not int:
            raise MalformedRequestError("Bad Request: partition_id must be an integer.")
        if not 0 <= explicit < topic.partitions:
            raise PartitionNotFoundError("Partition not found.")
        partition = explicit
    elif key is not None:
        partition = partition_for_key(key, topic.partitions)
    else:
        if sticky[0] < 0:
            sticky[0] = DEFAULT_PARTITIONER.sticky_partition(topic.name, topic.partitions)
        partition = sticky[0]
    return _Parsed(partition, record, key_report, value_report)


def _format_timestamp(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def _error_report(exc: LakelogError) -> bytes:
    return orjson.dumps(
        {"error_code": error_code_for(exc, v3=True), "message": error_message_for(exc, v3=True)}
    )


# -- the route --------------------------------------------------------------------------


class _DuplexStreamingResponse(StreamingResponse):
    """A StreamingResponse that does not listen for disconnects on ``receive``.

    Starlette's version (for ASGI spec < 2.4, which uvicorn reports) reads
    ``receive()`` concurrently to notice a disconnect, which would steal the request
    body we are still reading. Our body reader notices the disconnect itself.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.stream_response(send)
        except OSError:
            raise ClientDisconnect() from None


@router.post("/v3/clusters/{cluster_id}/topics/{topic_name}/records", summary="Produce records")
async def produce_records(
    cluster_id: str, topic_name: str, request: Request, state: AgentState = Depends(get_state)
) -> Response:
    """One JSON object per record, concatenated; one delivery report per record, streamed."""
    check_v3_content_type(request.headers.get("content-type"))
    topic = await state.topics.get_or_create(topic_name)
    splitter = ObjectSplitter(state.settings.max_request_bytes)
    chunks = request.stream().__aiter__()
    # Read until the first value (or the end) so an empty body is a plain 422, not a stream.
    first: list[Item] = []
    ended = False
    while not first and not ended:
        try:
            first = splitter.feed(await chunks.__anext__())
        except StopAsyncIteration:
            ended = True
            first = splitter.finish()
    if not first:
        raise UnprocessableRequestError(_EMPTY_BODY)
    if isinstance(first[0], RequestTooLargeError):
        raise first[0]  # nothing streamed yet: a plain 413
    state.metrics.produce_requests.labels(api="v3").inc()
    stream = _Stream(state, topic, splitter)
    return _DuplexStreamingResponse(
        stream.reports(first, None if ended else chunks), media_type="application/json"
    )


class _Stream:
    """One v3 produce stream: reads groups of records, produces them, reports in order."""

    def __init__(self, state: AgentState, topic: TopicInfo, splitter: ObjectSplitter) -> None:
        self.state = state
        self.topic = topic
        self.splitter = splitter
        self.limit = max_message_bytes(topic)
        self.queue: asyncio.Queue[asyncio.Future[bytes] | None] = asyncio.Queue(_MAX_PENDING_GROUPS)

    async def reports(
        self, first: list[Item], rest: AsyncIterator[bytes] | None
    ) -> AsyncIterator[bytes]:
        reader = asyncio.create_task(self._read(first, rest))
        try:
            while True:
                group = await self.queue.get()
                if group is None:
                    break
                yield await group
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(self, first: list[Item], rest: AsyncIterator[bytes] | None) -> None:
        try:
            if await self._submit(first) and rest is not None:
                async for chunk in rest:
                    if not await self._submit(self.splitter.feed(chunk)):
                        break
                else:
                    await self._submit(self.splitter.finish())
        except ClientDisconnect:
            pass
        finally:
            await self.queue.put(None)

    async def _submit(self, items: list[Item]) -> bool:
        """Queue one group for producing; False once a too-large value ended the stream."""
        if items:
            await self.queue.put(asyncio.ensure_future(self._produce(items)))
        return not (items and isinstance(items[-1], RequestTooLargeError))

    async def _produce(self, items: list[Item]) -> bytes:
        """Produce one group of records with one batcher call; their reports, in order."""
        now_ms = int(time.time() * 1000)
        sticky = [-1]
        results: list[_Parsed | LakelogError] = []
        for item in items:
            try:
                if isinstance(item, RequestTooLargeError):
                    raise item
                if isinstance(item, SplitError):
                    raise MalformedRequestError(str(item))
                try:
                    doc = orjson.loads(item)
                except orjson.JSONDecodeError:
                    raise MalformedRequestError("Bad Request: malformed JSON.") from None
                doc, schema_reports = await prepare_v3(self.state.registry, self.topic.name, doc)
                record = parse_record(doc, self.topic, self.limit, now_ms, sticky)
                record.key_report = schema_reports.get("key", record.key_report)
                record.value_report = schema_reports.get("value", record.value_report)
                results.append(record)
            except LakelogError as exc:
                results.append(exc)
        good = [r for r in results if isinstance(r, _Parsed)]
        offsets: list[int] = []
        failure: LakelogError | None = None
        if good:
            try:
                offsets = await self.state.batcher.append(
                    self.topic.topic_id, [(r.partition, r.record) for r in good]
                )
            except LakelogError as exc:
                failure = exc
        out: list[bytes] = []
        next_offset = iter(offsets)
        cluster = self.state.cluster_id
        for r in results:
            if isinstance(r, LakelogError):
                out.append(_error_report(r))
            elif failure is not None:
                out.append(_error_report(failure))
            else:
                report: dict[str, Any] = {
                    "error_code": 200,
                    "cluster_id": cluster,
                    "topic_name": self.topic.name,
                    "partition_id": r.partition,
                    "offset": next(next_offset),
                    "timestamp": _format_timestamp(r.record.timestamp_ms),
                }
                if r.key_report is not None:
                    report["key"] = r.key_report
                if r.value_report is not None:
                    report["value"] = r.value_report
                out.append(orjson.dumps(report))
        out.append(b"")
        return b"\r\n".join(out)
