"""REST v3 produce: ``POST /v3/clusters/{c}/topics/{t}/records`` (REST-API.md section 3.6)
and ``POST .../records:batch`` (at the end of this module).

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
that does not fit -> 42205, a failed flush -> 50003/50002, an unexpected exception (a
bug) -> 500 for the records concerned while the stream goes on. An object larger than
``max_request_bytes`` ends the stream with a 413 report. JSON data is stored as the
exact text sent; record groups of ``offload_parse_bytes`` or more are parsed on the
``cpu`` pool, off the event loop. An unknown cluster id in the URL is a 404, as on
every v3 route (``service.web``; kafka-rest skips that check on produce).

Idempotent produce (issue 16): a request with an ``Idempotency-Key`` header is read
whole and produced as one request (``service.produce.request_keys``); a records:batch body may
carry an idempotent ``producer`` (id, epoch, a sequence per partition), judged by the
agent's ``ProducerGate`` and the commit as a Kafka producer's batches; ``POST
.../producers`` hands out producer ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
import orjson
from fastapi import APIRouter, Request, Response
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from coordinator.client import TopicInfo
from coordinator.log.producers import ProducerBatch, StoredKey
from coordinator.log.topic_configs import (
    check_record_key,
    check_record_size,
    log_append_time,
    record_limit,
)
from segments.errors import (
    InternalError,
    InvalidBatchError,
    LakelogError,
    MalformedRequestError,
    PartitionNotFoundError,
    ProducerConflictError,
    ProducerFencedError,
    RequestTooLargeError,
    UnprocessableRequestError,
    UnsupportedFormatError,
)
from segments.types import Headers, Record
from service.errors import error_code_for, error_message_for
from service.executors import Kind, call, run_if
from service.produce.batcher import Offsets, PartlyCommittedError, RestProducer
from service.produce.formats import (
    check_v3_content_type,
    decode_base64,
    read_body,
    v3_json_span,
)
from service.produce.idempotence import Admission
from service.produce.partitioner import DEFAULT_PARTITIONER, partition_for_key
from service.produce.request_keys import (
    HEADER,
    KeyedProduce,
    KeyHeader,
    admit,
    append_keyed,
    keyed_produce,
    placed_on,
    release,
    stored_offsets,
)
from service.registry.rest import ProduceSchemas, prepare_v3, wants_schema
from service.security.acl import Rights, rights
from service.state import AgentState, StateDep
from service.web import ShortcutRoute

log = logging.getLogger(__name__)
router = APIRouter(tags=["v3 records"])

_RECORD_FIELDS = frozenset({"partition_id", "headers", "key", "value", "timestamp"})
_DATA_FIELDS = frozenset(
    {"type", "data", "subject", "subject_name_strategy", "schema_id", "schema_version", "schema"}
)
_NULL_RAW = msgspec.Raw(b"null")
_EMPTY_BODY = "Payload error. Request body is empty. Data is required."
# Report groups waiting to be written: bounds what one stream holds beyond the batcher.
_MAX_PENDING_GROUPS = 64


# -- splitting a byte stream into JSON values ------------------------------------------

# A whole JSON string (or one cut off by the end of the data so far) or one bracket;
# and the rest of a string's body, to resume a cut-off string in the next chunk. Both
# run in C over bytes: UTF-8 continuation bytes never equal '"', '\\' or a bracket.
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)|[{}\[\]]', re.DOTALL)
_STRING_BODY = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
_QUOTE, _BACKSLASH = 0x22, 0x5C
_OPEN = frozenset(b"{[")


def _bracketed(depth: int) -> bytes:
    """A regex of one bracketed value nested at most ``depth`` deep, strings skipped
    whole: the tokenizer's rules (a string as ``_TOKENS`` reads it, any closing bracket
    closes any opening one), possessive so a failed match never backtracks."""
    # A string whose first quote is not after a backslash ends there: one run over
    # single-byte negation, 6x faster in ``re`` than a class (base64 text is most of a
    # binary record); else the escape-aware form.
    string = rb'"[^"]*+(?<!\\)"|"[^"\\]*+(?:\\.[^"\\]*+)*+"'
    flat = rb'[^"{}\[\]]++|' + string
    value = rb"[{\[](?:" + flat + rb")*+[}\]]"
    for _ in range(depth - 1):
        value = rb"[{\[](?:" + flat + rb"|" + value + rb")*+[}\]]"
    return value


#: Whitespace (as ``bytes.strip`` has it), then one complete value nested at most 8 deep:
#: a run of whole values is cut out of the data by C, one match per value, instead of a
#: Python step per string and bracket (``ObjectSplitter.feed``).
_WHOLE = re.compile(rb"[ \t\n\r\x0b\x0c]*+(" + _bracketed(8) + rb")", re.DOTALL)


class SplitError(Exception):
    """A run of the body that is not a JSON object (reported as one failed record)."""


#: What the splitter yields: a complete JSON value, a garbage run, or the end of the
#: stream because a value is too large.
Item = bytes | SplitError | RequestTooLargeError


class ObjectSplitter:
    """Cuts concatenated JSON values out of a byte stream, as the bytes arrive.

    An incremental scanner: it keeps its state (bracket depth, inside a string or
    not) between chunks and looks at every byte once, so a value sent in many small
    chunks costs the same as one sent whole (re-scanning a partial string from its
    start at every chunk made a 4 MiB value in 16 KiB chunks cost seconds of CPU on
    the event loop). Between values, each whole value in the data is cut out by one
    match of ``_WHOLE`` (C, no Python step per string or bracket: 4-5x less CPU for
    1 KiB records); where that does not match (a value cut off by the end of the
    data, garbage, nesting past 8) brackets and strings are tokenized until the value
    ends, so a byte is looked at at most twice. The values themselves are parsed once
    complete. Anything between values other than whitespace comes back as a
    :class:`SplitError` item.

    A streaming JSON parser (ijson's yajl2_c backend) was not used: it builds Python
    objects rather than handing back each value's bytes, stops at the first syntax
    error where we report a bad record and go on with the next, and has no bound on
    one value's size.

    Args:
        max_value_bytes: a value still incomplete at this size raises RequestTooLargeError.
    """

    def __init__(self, max_value_bytes: int) -> None:
        self.max_value_bytes = max_value_bytes
        self._buf = bytearray()  # unconsumed bytes: text before a value, the open value
        self._scan = 0  # bytes of _buf already scanned
        self._depth = 0
        self._in_string = False

    def feed(self, data: bytes) -> list[Item]:
        """Add bytes; return the values (and garbage runs) completed by them.

        A value over ``max_value_bytes`` (complete, or still growing) ends the list
        with a RequestTooLargeError item: the stream cannot go on after it.
        """
        buf = self._buf
        buf += data
        out: list[Item] = []
        end = len(buf)
        depth, in_string, pos = self._depth, self._in_string, self._scan
        start = 0  # where the current value (or garbage run) begins
        if in_string:  # a string cut off by the previous chunk goes on
            close = _STRING_BODY.match(buf, pos).end()  # type: ignore[union-attr]
            if close == end or buf[close] == _BACKSLASH:
                pos = end = close  # the string (or an escape) goes on in the next chunk
            else:
                in_string, pos = False, close + 1
                if depth == 0:  # a top-level string is garbage
                    _garbage(buf, start, pos, out)
                    start = pos
        while True:
            if depth == 0 and not in_string:
                # Whole values at once (the common body: one object per record, back to
                # back), one C match each; the tokens below take over at anything else (a
                # value cut off by the end of the data, garbage, deeper nesting) until
                # a value ends, then whole values again.
                whole = _WHOLE.match(buf, pos, end)
                while whole is not None:
                    at, pos = whole.span(1)
                    if at > start:  # mostly the values are back to back
                        _garbage(buf, start, at, out)
                    if pos - at > self.max_value_bytes:
                        out.append(self._too_large())
                        return out
                    out.append(bytes(memoryview(buf)[at:pos]))  # one copy
                    start = pos
                    whole = _WHOLE.match(buf, pos, end)
            value_ended = False
            for match in _TOKENS.finditer(buf, pos, end):
                at, pos = match.span()
                char = buf[at]
                if char == _QUOTE:
                    if pos == len(buf) and _cut_off(buf, at, pos):
                        # Resume inside the string next time (its start is scanned once
                        # more, then every byte only once: never from the start again).
                        in_string, pos = True, at + 1
                        break
                    if depth == 0:
                        _garbage(buf, start, pos, out)
                        start = pos
                elif char in _OPEN:
                    if depth == 0:
                        _garbage(buf, start, at, out)
                        start = at
                    depth += 1
                elif depth == 0:  # a stray closing bracket
                    _garbage(buf, start, pos, out)
                    start = pos
                else:
                    depth -= 1
                    if depth == 0:
                        if pos - start > self.max_value_bytes:
                            out.append(self._too_large())
                            return out
                        out.append(bytes(memoryview(buf)[start:pos]))  # one copy
                        start = pos
                        value_ended = True
                        break
            else:
                pos = end
            if not value_ended:
                break
        # Keep only the unconsumed tail: the open value, or text after the last one.
        if start:
            del buf[:start]
        self._scan, self._depth, self._in_string = pos - start, depth, in_string
        if len(buf) > self.max_value_bytes:
            out.append(self._too_large())
        return out

    def _too_large(self) -> RequestTooLargeError:
        self._buf, self._scan, self._depth, self._in_string = bytearray(), 0, 0, False
        return RequestTooLargeError(
            f"A record exceeds the request limit of {self.max_value_bytes} bytes."
        )

    def finish(self) -> list[Item]:
        """The body ended: whatever is left is an incomplete value or garbage."""
        rest = bytes(self._buf)
        incomplete = self._depth > 0 or self._in_string
        self._buf, self._scan, self._depth, self._in_string = bytearray(), 0, 0, False
        if incomplete or rest.strip():
            return [SplitError("Bad Request: unexpected end of JSON input.")]
        return []


def _cut_off(buf: bytearray, start: int, end: int) -> bool:
    """Whether the string token buf[start:end], which ends the data, lacks its closing quote."""
    if end - start < 2 or buf[end - 1] != _QUOTE:
        return True
    n = 0  # an odd run of backslashes before the last quote escapes it
    i = end - 2
    while i > start and buf[i] == _BACKSLASH:
        n += 1
        i -= 1
    return n % 2 == 1


def _garbage(buf: bytearray, start: int, end: int, out: list[Item]) -> None:
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


def _parse_data(doc: object, what: str, text: bytes) -> tuple[bytes | None, dict[str, Any] | None]:
    """A ProduceRequestData (key or value) -> bytes and its report ``{type, size}``.

    ``text`` is the whole record object as sent: JSON data is stored as its exact
    text there, not re-serialized from a parse (which would round big integers).
    """
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
        out = None if data is None else v3_json_span(text, what)
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


class NeedsSchema(Exception):
    """A record whose key or value names a registry schema.

    The registry's lookups are async, so ``parse_record`` (which may run on a worker
    thread) hands such a record back; the stream encodes it with ``prepare_v3`` and
    parses it again with the encoded document.
    """

    def __init__(self, text: bytes, doc: dict[str, Any]) -> None:
        super().__init__("the record names a registry schema")
        self.text = text
        self.doc = doc


def parse_record(
    text: bytes,
    topic: TopicInfo,
    limit: tuple[int, str],
    now_ms: int,
    sticky: list[int],
    doc: dict[str, Any] | None = None,
    *,
    fields: frozenset[str] = _RECORD_FIELDS,
    fast: bool = True,
) -> _Parsed:
    """Check one v3 record object (its JSON text) and pick its partition; ``fast``: try
    ``_parse_fast`` first (the common record, with the default ``fields``).

    ``sticky`` holds the keyless partition of the current group (-1 until needed);
    ``doc`` is the record's document with its schema keys/values already encoded.

    Raises:
        LakelogError: the per-record error to report (400, 40402, 413, 42202).
        NeedsSchema: ``doc`` is not given and the record names a registry schema.
    """
    if fast and doc is None and fields is _RECORD_FIELDS:
        quick = _parse_fast(text, now_ms)
        if quick is not None:
            record, parsed, key_report, value_report = quick
            return _placed(
                record, parsed.partition_id, key_report, value_report, topic, limit, sticky
            )
    if doc is None:
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise MalformedRequestError("Bad Request: malformed JSON.") from None
        if isinstance(doc, dict) and (
            wants_schema(doc.get("key")) or wants_schema(doc.get("value"))
        ):
            raise NeedsSchema(text, doc)
    if not isinstance(doc, dict):
        raise MalformedRequestError("Bad Request: a record must be a JSON object.")
    unknown = doc.keys() - fields
    if unknown:
        raise MalformedRequestError(f'Bad Request: Unrecognized field "{sorted(unknown)[0]}".')
    key, key_report = _parse_data(doc.get("key"), "key", text)
    value, value_report = _parse_data(doc.get("value"), "value", text)
    record = Record(
        key,
        value,
        _parse_timestamp(doc.get("timestamp"), now_ms),
        _parse_headers(doc.get("headers")),
    )
    explicit = doc.get("partition_id")
    return _placed(record, explicit, key_report, value_report, topic, limit, sticky)


def _placed(
    record: Record,
    explicit: object,
    key_report: dict[str, Any] | None,
    value_report: dict[str, Any] | None,
    topic: TopicInfo,
    limit: tuple[int, str],
    sticky: list[int],
) -> _Parsed:
    """A parsed record, size-checked, with its partition (both parse paths end here)."""
    check_record_size(record, *limit)
    if explicit is not None:
        if type(explicit) is not int:
            raise MalformedRequestError("Bad Request: partition_id must be an integer.")
        if not 0 <= explicit < topic.partitions:
            raise PartitionNotFoundError(f"Partition {explicit} of topic '{topic.name}' not found.")
        partition = explicit
    elif record.key is not None:
        partition = partition_for_key(record.key, topic.partitions)
    else:
        if sticky[0] < 0:
            sticky[0] = DEFAULT_PARTITIONER.sticky_partition(topic.name, topic.partitions)
        partition = sticky[0]
    check_record_key(record, topic, partition)  # a compacted topic takes keyed ones only
    return _Parsed(partition, record, key_report, value_report)


# -- the fast path: common records by one typed decode ----------------------------------
#
# The common record (BINARY, JSON or STRING keys and values, no schema) is decoded by
# msgspec in one pass: fields, types, and (the key/value types being the tags of a union,
# exact and upper case) base64, in C; JSON data is kept as the exact text sent. Where that
# decode fails (a lower-case type, a schema, anything off), ``parse_record``'s checked
# path runs every check and names the error.


class _FastBinary(msgspec.Struct, tag_field="type", tag="BINARY", forbid_unknown_fields=True):
    data: bytes | None = None  # msgspec decodes base64 (standard alphabet, padded)


class _FastJson(msgspec.Struct, tag_field="type", tag="JSON", forbid_unknown_fields=True):
    data: msgspec.Raw = _NULL_RAW


class _FastString(msgspec.Struct, tag_field="type", tag="STRING", forbid_unknown_fields=True):
    data: str | None = None


_FastData = _FastBinary | _FastJson | _FastString


class _FastRecord(msgspec.Struct, forbid_unknown_fields=True):
    key: _FastData | None = None
    value: _FastData | None = None
    partition_id: int | None = None
    timestamp: str | None = None
    headers: list[Any] | None = None


_FAST_RECORD = msgspec.json.Decoder(_FastRecord)


def _fast_data(part: _FastData | None) -> tuple[bytes | None, dict[str, Any] | None]:
    """A decoded key/value: its bytes and its report ``{type, size}``."""
    if part is None:
        return None, None
    out: bytes | None
    if type(part) is _FastBinary:
        out, kind = part.data, "BINARY"
    elif type(part) is _FastJson:
        out, kind = (None if part.data == _NULL_RAW else bytes(part.data)), "JSON"
    else:
        assert type(part) is _FastString
        out, kind = (None if part.data is None else part.data.encode("utf-8")), "STRING"
    return out, {"type": kind, "size": len(out) if out is not None else 0}


def _parse_fast(text: bytes, now_ms: int) -> tuple[Record, _FastRecord, Any, Any] | None:
    """The common record ``text``; None when it is not one.

    Where this accepts, the checked path takes the same record: both keep the last of
    duplicate members, msgspec's base64 accepts a subset of ``binascii``'s strict mode
    with the same bytes, ``int`` takes no bool, and a key/value with only ``type`` and
    ``data`` (type BINARY, JSON or STRING) names no schema (tests/unit/test_v3_records.py
    compares the paths).
    """
    try:
        doc = _FAST_RECORD.decode(text)
        key, key_report = _fast_data(doc.key)
        value, value_report = _fast_data(doc.value)
        record = Record(
            key,
            value,
            now_ms if doc.timestamp is None else _parse_timestamp(doc.timestamp, now_ms),
            () if doc.headers is None else _parse_headers(doc.headers),
        )
    except (msgspec.DecodeError, ValueError, LakelogError):  # DecodeError: ValidationError too
        return None
    return record, doc, key_report, value_report


def _format_timestamp(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def _internal_error() -> InternalError:
    return InternalError("Internal error while producing this record (see the agent's log).")


def _error_report(exc: LakelogError) -> dict[str, Any]:
    return {"error_code": error_code_for(exc, v3=True), "message": error_message_for(exc, v3=True)}


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
    cluster_id: str,
    topic_name: str,
    request: Request,
    state: StateDep,
    idempotency_key: KeyHeader = None,
) -> Response:
    """One JSON object per record, concatenated; one delivery report per record, streamed."""
    check_v3_content_type(request.headers.get("content-type"))
    topic = await state.topics.get_or_create(topic_name)
    if request.headers.get(HEADER) is not None:
        return await _produce_keyed(request, state, topic)
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
    stream = _Stream(state, topic, rights(request), splitter)
    return _DuplexStreamingResponse(
        stream.reports(first, None if ended else chunks), media_type="application/json"
    )


async def _produce_records_shortcut(request: Request) -> Response:
    """``produce_records`` as a ``service.web.ShortcutRoute`` endpoint (``SHORTCUTS``)."""
    params = request.path_params
    state: AgentState = request.app.state.agent
    return await produce_records(params["cluster_id"], params["topic_name"], request, state, None)


#: The produce route without FastAPI's per-request work, served ahead of it (which
#: describes it in the OpenAPI).
SHORTCUTS = (
    ShortcutRoute(
        "/v3/clusters/{cluster_id}/topics/{topic_name}/records", _produce_records_shortcut
    ),
)


async def _produce_keyed(request: Request, state: AgentState, topic: TopicInfo) -> Response:
    """A v3 produce with an Idempotency-Key: the body read whole, produced as one group
    (``service.produce.request_keys``), the reports answered at once in the stream's format."""
    limit = state.settings.max_request_bytes
    # The whole stream is one keyed request: its size is bounded by the limit of one record
    # times the batch entries allowed (a stream without a key has no bound at all).
    body = await read_body(request, limit * state.settings.produce_batch_max_entries)
    keyed = keyed_produce(request, body, state.settings.idempotency_key_window_s)
    splitter = ObjectSplitter(limit)
    items = [*splitter.feed(body), *splitter.finish()]
    if not items:
        raise UnprocessableRequestError(_EMPTY_BODY)
    if isinstance(items[0], RequestTooLargeError):
        raise items[0]
    state.metrics.produce_requests.labels(api="v3").inc()
    reports = await _Producer(state, topic, rights(request)).produce(items, keyed)
    return Response(
        b"\r\n".join([orjson.dumps(r) for r in reports] + [b""]), media_type="application/json"
    )


class _Producer:
    """Checks and produces groups of v3 record objects to one topic, with their reports."""

    def __init__(
        self,
        state: AgentState,
        topic: TopicInfo,
        access: Rights,
        fields: frozenset[str] = _RECORD_FIELDS,
    ) -> None:
        self.state = state
        self.topic = topic
        self.schemas = ProduceSchemas(state.registry, access)
        self.limit = record_limit(topic)
        self.fields = fields  # what a record object may hold (records:batch adds "id")

    def _parse_group(
        self, items: list[Item], now_ms: int, sticky: list[int]
    ) -> list[_Parsed | LakelogError | NeedsSchema]:
        results: list[_Parsed | LakelogError | NeedsSchema] = []
        for item in items:
            try:
                if isinstance(item, RequestTooLargeError):
                    raise item
                if isinstance(item, SplitError):
                    raise MalformedRequestError(str(item))
                results.append(
                    parse_record(item, self.topic, self.limit, now_ms, sticky, fields=self.fields)
                )
            except NeedsSchema as pending:
                results.append(pending)
            except LakelogError as exc:
                results.append(exc)
            except Exception:
                log.exception("a v3 record to %s failed unexpectedly", self.topic.name)
                results.append(_internal_error())
        return results

    async def _with_schema(
        self, pending: NeedsSchema, now_ms: int, sticky: list[int]
    ) -> _Parsed | LakelogError:
        """A record naming a registry schema: its key/value encoded, then checked."""
        try:
            doc, reports = await prepare_v3(self.schemas, self.topic.name, pending.doc)
            assert isinstance(doc, dict)
            record = parse_record(
                pending.text, self.topic, self.limit, now_ms, sticky, doc, fields=self.fields
            )
        except LakelogError as exc:
            return exc
        except Exception:
            log.exception("a v3 record to %s failed unexpectedly", self.topic.name)
            return _internal_error()
        record.key_report = reports.get("key", record.key_report)
        record.value_report = reports.get("value", record.value_report)
        return record

    async def produce(
        self,
        items: list[Item],
        keyed: KeyedProduce | None = None,
        idempotent: RestProducer | None = None,
        *,
        atomic: bool = False,
    ) -> list[dict[str, Any]]:
        """Produce a group of records with one batcher call: each one's delivery report
        (``error_code`` 200 with its offset, or its error), in order. With ``keyed``,
        the group is one idempotent request (``service.produce.request_keys``). With
        ``atomic``, one record that fails its checks fails them all."""
        now_ms, sticky = int(time.time() * 1000), [-1]
        ticket = stored = None
        if keyed is not None:
            ticket, stored = await admit(self.state, self.topic.topic_id, keyed)
            # A retry: placed over the partitions its records first were.
            self.topic = placed_on(self.topic, stored)
            now_ms = keyed.now_ms if stored is None else stored.created_ms
            sticky[0] = keyed.sticky_partition(self.topic.partitions)
        try:
            return await self._produce_group(
                items, now_ms, sticky, keyed, stored, idempotent, atomic
            )
        finally:
            release(self.state, ticket)

    async def _produce_group(
        self,
        items: list[Item],
        now_ms: int,
        sticky: list[int],
        keyed: KeyedProduce | None,
        stored: StoredKey | None,
        idempotent: RestProducer | None = None,
        atomic: bool = False,
    ) -> list[dict[str, Any]]:
        size = sum(len(i) for i in items if isinstance(i, bytes))
        offload = size >= self.state.settings.offload_parse_bytes
        parsed = await run_if(offload, Kind.CPU, self._parse_group, items, now_ms, sticky)
        results = [
            await self._with_schema(r, now_ms, sticky) if isinstance(r, NeedsSchema) else r
            for r in parsed
        ]
        good = [r for r in results if isinstance(r, _Parsed)]
        if atomic and len(good) < len(results):
            bad = next(i for i, r in enumerate(results) if not isinstance(r, _Parsed))
            refused = InvalidBatchError(
                f"Not stored: entries[{bad}] failed and the batch is atomic (nothing of it "
                "was stored)."
            )
            return [_error_report(r if isinstance(r, LakelogError) else refused) for r in results]
        offsets: Sequence[int | None] = []
        errors: Sequence[LakelogError | None] = []
        failure: LakelogError | None = None
        if good:
            try:
                if idempotent is not None and stored is not None:
                    offsets = stored_offsets(stored, [r.partition for r in good])
                elif idempotent is not None:
                    offsets = await self._append_idempotent(good, idempotent)
                else:  # a retry of a stored request: its first offsets (append_keyed)
                    offsets = await append_keyed(
                        self.state,
                        self.topic.topic_id,
                        [(r.partition, r.record) for r in good],
                        keyed,
                        stored,
                        partitions=self.topic.partitions,
                        log_append_time=log_append_time(self.topic),
                    )
            except PartlyCommittedError as exc:  # some partitions' shard failed
                if idempotent is None and not atomic:
                    offsets, errors = exc.offsets, exc.errors
                else:
                    failure = exc
            except LakelogError as exc:
                self.state.topics.forget_if_gone(self.topic, exc)
                failure = exc
        # LogAppendTime topics: the records carry the flush's time, and so does the answer
        # (not known for a retry answered from what was stored: the request's time).
        stamp = getattr(offsets, "append_time_ms", -1) if log_append_time(self.topic) else -1
        out: list[dict[str, Any]] = []
        next_offset = iter(offsets)
        next_error = iter(errors or [None] * len(offsets))
        cluster = self.state.cluster_id
        stamps: dict[int, str] = {}  # a group's records mostly share one timestamp
        for r in results:
            if isinstance(r, LakelogError):
                out.append(_error_report(r))
            elif failure is not None:
                out.append(_error_report(failure))
            elif (error := next(next_error)) is not None:
                next(next_offset)
                out.append(_error_report(error))
            else:
                ms = stamp if stamp >= 0 else r.record.timestamp_ms
                report: dict[str, Any] = {
                    "error_code": 200,
                    "cluster_id": cluster,
                    "topic_name": self.topic.name,
                    "partition_id": r.partition,
                    "offset": next(next_offset),
                    "timestamp": stamps.get(ms) or stamps.setdefault(ms, _format_timestamp(ms)),
                }
                if r.key_report is not None:
                    report["key"] = r.key_report
                if r.value_report is not None:
                    report["value"] = r.value_report
                out.append(report)
        return out

    async def _append_idempotent(self, good: list[_Parsed], producer: RestProducer) -> list[int]:
        """An idempotent producer's records, through the agent's ProducerGate as a Kafka
        producer's batches: partitions already stored are answered with their first
        offsets, the others appended with their sequences (checked again at commit).

        Raises:
            InvalidBatchError: a partition with records and no sequence (422 42208).
            ProducerFencedError: an epoch older than the producer's latest (400 40002).
            UnprocessableRequestError: a sequence that does not follow (422 42206).
            ProducerConflictError: the same records are being written here (retriable).
        """
        pid, epoch, sequences = producer
        counts = Counter(r.partition for r in good)
        missing = sorted(set(counts) - set(sequences))
        if missing:
            raise InvalidBatchError(f"No sequence for partition {missing[0]} in producer.")
        order = sorted(counts)
        tid = self.topic.topic_id
        decisions = await self.state.gate.admit(
            [(tid, p, [ProducerBatch(pid, epoch, sequences[p], counts[p])]) for p in order]
        )
        tickets = [d.ticket for d in decisions if d.ticket is not None]
        try:
            kinds = {d.admission for d in decisions}
            if Admission.FENCED in kinds:
                raise ProducerFencedError(f"Producer {pid} at epoch {epoch} is fenced.")
            if Admission.OUT_OF_ORDER in kinds:
                raise UnprocessableRequestError(
                    f"Payload error. Out of order sequence for producer {pid}: nothing stored."
                )
            if Admission.IN_FLIGHT in kinds:
                raise ProducerConflictError("The same records are being written: retry.")
            first = {
                p: d.offset
                for p, d in zip(order, decisions, strict=True)
                if d.admission is Admission.DUPLICATE
            }
            fresh = [r for r in good if r.partition not in first]
            offsets = await self.state.batcher.append(
                tid,
                [(r.partition, r.record) for r in fresh],
                producer=producer,
                log_append_time=log_append_time(self.topic),
            )
            appended = iter(offsets)
        finally:
            for t in tickets:
                self.state.gate.release(t)
        out = []
        for r in good:
            if r.partition in first:
                out.append(first[r.partition])
                first[r.partition] += 1
            else:
                out.append(next(appended))
        # The flush's append time holds for every record only when none was a duplicate.
        return Offsets.of(out, -1 if first else offsets.append_time_ms)


@router.post("/v3/clusters/{cluster_id}/producers", summary="Get an idempotent producer id")
async def init_producer(cluster_id: str, request: Request, state: StateDep) -> Response:
    """lakelog's: a new producer id at epoch 0 (an empty body), or ``{"producer_id",
    "producer_epoch"}`` at its current epoch for the next epoch (fencing older ones), as
    Kafka's InitProducerId. Use them in records:batch's ``producer``."""
    body = await read_body(request, state.settings.max_body_bytes)
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError:
        raise MalformedRequestError("Bad Request: malformed JSON.") from None
    pid, epoch = (doc.get("producer_id", -1), doc.get("producer_epoch", -1)) if doc else (-1, -1)
    if type(pid) is not int or type(epoch) is not int:
        raise MalformedRequestError("Bad Request: producer_id and producer_epoch are integers.")
    pid, epoch = await call(state.coordinator.init_producer_id, pid, epoch)
    return Response(
        orjson.dumps({"producer_id": pid, "producer_epoch": epoch}), media_type="application/json"
    )


class _Stream(_Producer):
    """One v3 produce stream: reads groups of records, produces them, reports in order."""

    def __init__(
        self, state: AgentState, topic: TopicInfo, access: Rights, splitter: ObjectSplitter
    ) -> None:
        super().__init__(state, topic, access)
        self.splitter = splitter
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
        """Produce one group of records with one batcher call; their reports, in order.

        Never raises: the response has already started with 200, so whatever goes
        wrong becomes a failed report for the records concerned (an unexpected
        exception is a non-retriable 500, logged with its traceback).
        """
        try:
            return await self._stream_group(items)
        except Exception:
            log.exception("v3 produce to %s failed unexpectedly", self.topic.name)
            failed = orjson.dumps(_error_report(_internal_error()))
            return b"\r\n".join([failed] * len(items) + [b""])

    async def _stream_group(self, items: list[Item]) -> bytes:
        reports = await self.produce(items)
        return b"\r\n".join([orjson.dumps(r) for r in reports] + [b""])


# -- records:batch ----------------------------------------------------------------------

_BATCH_FIELDS = _RECORD_FIELDS | {"id"}
_MAX_ID_LENGTH = 80


class _Sequence(msgspec.Struct):
    partition_id: int
    sequence: int


class _BatchProducer(msgspec.Struct):
    """An idempotent producer's id, epoch and, per partition, the sequence of its first
    record in this batch (lakelog's; Kafka's rules, ``coordinator.log.producers``)."""

    producer_id: int
    producer_epoch: int
    sequences: list[_Sequence]


class _BatchBody(msgspec.Struct):
    """A records:batch body; each entry kept as its exact text (JSON data is stored as
    sent, see ``v3_json_span``)."""

    entries: list[msgspec.Raw]
    producer: _BatchProducer | None = None
    #: lakelog's: all entries stored or none (see ``produce_records_batch``).
    atomic: bool = False


def _batch_ids(entries: list[msgspec.Raw], max_entries: int) -> list[str]:
    """Each entry's id, checked.

    Raises:
        InvalidBatchError: no entry, more than ``max_entries``, an id that is not a
            string of 1 to 80 characters, ids that are not distinct (422 42208).
        MalformedRequestError: an entry that is not a JSON object.
    """
    if not entries:
        raise InvalidBatchError("Empty batch.")
    if len(entries) > max_entries:
        raise InvalidBatchError(
            f"Too many entries in batch: {len(entries)}; at most {max_entries} allowed."
        )
    ids = []
    for i, raw in enumerate(entries):
        entry = orjson.loads(bytes(raw))  # msgspec already checked it is JSON
        if not isinstance(entry, dict):
            raise MalformedRequestError(f"Bad Request: entries[{i}] must be an object.")
        entry_id = entry.get("id")
        if not isinstance(entry_id, str) or not 1 <= len(entry_id) <= _MAX_ID_LENGTH:
            raise InvalidBatchError(
                f"Batch entry IDs must be strings of 1 to {_MAX_ID_LENGTH} characters: "
                f"entries[{i}].id is {entry_id!r}."
            )
        ids.append(entry_id)
    if len(set(ids)) != len(ids):
        raise InvalidBatchError("Batch entry IDs are not distinct.")
    return ids


@router.post(
    "/v3/clusters/{cluster_id}/topics/{topic_name}/records:batch",
    status_code=207,
    summary="Produce a batch of records",
)
async def produce_records_batch(
    cluster_id: str,
    topic_name: str,
    request: Request,
    state: StateDep,
    idempotency_key: KeyHeader = None,
) -> Response:
    """``{"entries": [{"id": ..., <a record>}, ...]}`` -> 207 with ``successes`` and
    ``failures`` (each by id, in input order). All entries go to the batcher in one call.

    ``"atomic": true`` (lakelog's): all entries are stored or none. An entry that fails
    its checks (a bad partition, bad base64, a schema it does not fit) fails every entry,
    the others with 42208 naming it. The checked entries land in one flush, so in one
    segment object, whose chunks one database transaction commits: across partitions,
    all or nothing. (With sharded metadata each shard commits its partitions on its own,
    so atomicity holds only across the partitions of one shard; a shard failing between
    them is answered as a failure of every entry, though the other shards' records stay.)

    Request-level errors: 415 (not JSON), 404 40403 (unknown topic), 413 (body over
    ``max_request_bytes``), 400 (not a batch object), 422 42208 (empty, more than
    ``produce_batch_max_entries``, bad or repeated ids).
    """
    check_v3_content_type(request.headers.get("content-type"))
    topic = await state.topics.get_or_create(topic_name)
    body = await read_body(request, state.settings.max_request_bytes)
    if not body.strip():
        raise UnprocessableRequestError(_EMPTY_BODY)
    try:
        batch = msgspec.json.decode(body, type=_BatchBody)
    except msgspec.DecodeError as e:
        raise MalformedRequestError(f"Bad Request: {e}") from None
    ids = _batch_ids(batch.entries, state.settings.produce_batch_max_entries)
    state.metrics.produce_requests.labels(api="v3").inc()
    producer = _Producer(state, topic, rights(request), _BATCH_FIELDS)
    keyed = keyed_produce(request, body, state.settings.idempotency_key_window_s)
    idempotent: RestProducer | None = None
    if batch.producer is not None:
        if keyed is not None:
            raise UnprocessableRequestError(
                "Payload error. Use an Idempotency-Key or a producer, not both."
            )
        p = batch.producer
        idempotent = (
            p.producer_id,
            p.producer_epoch,
            {s.partition_id: s.sequence for s in p.sequences},
        )
    reports = await producer.produce(
        [bytes(raw) for raw in batch.entries], keyed, idempotent, atomic=batch.atomic
    )
    successes, failures = [], []
    for entry_id, report in zip(ids, reports, strict=True):
        if report["error_code"] == 200:
            del report["error_code"]
            successes.append({"id": entry_id, **report})
        else:
            failures.append({"id": entry_id, **report})
    return Response(
        orjson.dumps({"successes": successes, "failures": failures}),
        status_code=207,
        media_type="application/json",
    )
