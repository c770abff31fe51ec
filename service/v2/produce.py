"""REST v2 produce: ``POST /topics/{t}`` and ``POST /topics/{t}/partitions/{p}``.

The hot path of the agent, so it stays lean (NOTES.md: pydantic request models halve
its throughput): the body is read with a size bound, parsed with orjson and checked
by hand, and the response is serialized by orjson. Bodies of ``offload_parse_bytes``
or more are parsed and partitioned on the ``cpu`` pool, so a 16 MiB body (or a
1 MiB key to hash) does not stall every other request on the event loop; smaller
ones are handled inline, where a thread hop would cost more than it saves.
json-format keys and values are stored as the exact text sent (``v2_json_spans``).

Everything about a request is checked before any record is buffered, so a refused
request stores nothing:

- Content-Type picks the embedded format (``service.produce.formats.v2_format``): binary,
  json, or a schema format (avro, jsonschema, protobuf: keys and values are encoded
  with the registry's schemas by ``service.registry.rest.encode_v2``, which has their
  error codes); anything else -> 415.
- Body over ``max_request_bytes`` -> 413 (Content-Length first, then while reading).
- Malformed JSON, a body that is not an object, ``records`` not an array, a record
  not an object, a wrong JSON type, bad base64 -> 400 (error_code 400).
- Missing or empty ``records``, or a record with an unknown field -> 422 42206.
- Unknown topic -> 404 40401 (unless auto-create); unknown partition in the URL, or
  a record's explicit ``partition`` outside the topic -> 404 40402 for the whole
  request. (kafka-rest would fail that one record inside a 200; refusing the request
  keeps "all or nothing" for everything the client got wrong.)
- A record over the topic's ``max.message.bytes`` -> 413 error_code 413 for the whole
  request (Karapace answers 422 with the message in ``offsets[0].error``; a request
  level 413 with the Confluent error body is the same "too large" status as the body
  limit and keeps the other records out of the log too).

Failures after buffering (the flush's PUT or commit failed, the buffer stayed full)
are per record inside a 200, as kafka-rest does: ``error_code`` 50003 when retriable,
50002 otherwise, ``partition`` and ``offset`` null.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import orjson
from fastapi import APIRouter, Request, Response

from coordinator.client import TopicInfo
from coordinator.log.topic_configs import (
    BATCH_OVERHEAD,
    check_record_size,
    compacted,
    keyless_refused,
    log_append_time,
    record_limit,
)
from segments.errors import (
    LakelogError,
    MalformedRequestError,
    PartitionNotFoundError,
    UnprocessableRequestError,
)
from segments.types import Headers, Record
from service.errors import kafka_error_code
from service.executors import Kind, run_if
from service.produce.batcher import RECORD_OVERHEAD, Grouped, PartlyCommittedError, record_size
from service.produce.formats import (
    BINARY,
    SCHEMA_FORMATS,
    V2_CONTENT_TYPE,
    binary_hint,
    check_v2_accept,
    decode_base64,
    json_object,
    read_body,
    v2_format,
    v2_json_spans,
)
from service.produce.partitioner import DEFAULT_PARTITIONER, partition_for_key
from service.produce.request_keys import (
    KeyedProduce,
    KeyHeader,
    admit,
    append_keyed,
    keyed_produce,
    placed_on,
    release,
)
from service.registry.rest import ProduceSchemas, encode_v2
from service.security.acl import rights
from service.state import AgentState, StateDep
from service.web import ShortcutRoute

router = APIRouter(tags=["v2 produce"])

_RECORD_FIELDS = frozenset({"key", "value", "partition", "headers"})
_BODY_FIELDS = frozenset(
    {"records", "key_schema", "key_schema_id", "value_schema", "value_schema_id"}
)

# A parsed record before partitioning: key, value, explicit partition, headers.
_Parsed = tuple[bytes | None, bytes | None, int | None, Headers]


@router.post("/topics/{topic}", summary="Produce records to a topic")
async def produce_to_topic(
    topic: str, request: Request, state: StateDep, idempotency_key: KeyHeader = None
) -> Response:
    """Records go to their ``partition``, else by key hash, else spread over partitions."""
    return await _produce(request, state, topic, None)


@router.post("/topics/{topic}/partitions/{partition}", summary="Produce records to a partition")
async def produce_to_partition(
    topic: str, partition: int, request: Request, state: StateDep, idempotency_key: KeyHeader = None
) -> Response:
    """Every record goes to ``partition``; a record's own ``partition`` field is ignored."""
    return await _produce(request, state, topic, partition)


async def _produce_shortcut(request: Request) -> Response:
    """Both routes above as ``service.web.ShortcutRoute`` endpoints (``SHORTCUTS``)."""
    params = request.path_params
    state: AgentState = request.app.state.agent
    return await _produce(request, state, params["topic"], params.get("partition"))


#: The produce routes without FastAPI's per-request work, served ahead of those above
#: (which describe them in the OpenAPI, and answer a partition that is not digits).
SHORTCUTS = (
    ShortcutRoute("/topics/{topic}", _produce_shortcut),
    ShortcutRoute("/topics/{topic}/partitions/{partition:int}", _produce_shortcut),
)


async def _produce(
    request: Request, state: AgentState, topic_name: str, url_partition: int | None
) -> Response:
    headers = request.headers
    fmt = v2_format(headers.get("content-type"))
    check_v2_accept(headers.get("accept"))
    body = await read_body(request, state.settings.max_request_bytes)
    keyed = keyed_produce(request, body, state.settings.idempotency_key_window_s)
    offload = len(body) >= state.settings.offload_parse_bytes
    parsed = await run_if(offload, Kind.CPU, _parse_body, body, fmt, headers.get("content-type"))

    topic = await state.topics.get_or_create(topic_name)
    key_schema_id = value_schema_id = None
    if fmt in SCHEMA_FORMATS:
        schemas = ProduceSchemas(state.registry, rights(request))
        parsed, key_schema_id, value_schema_id = await encode_v2(
            schemas, topic_name, fmt, body, parsed
        )
    if url_partition is not None and not 0 <= url_partition < topic.partitions:
        raise PartitionNotFoundError(
            f"Partition {url_partition} of topic '{topic_name}' not found."
        )
    ticket, stored = (None, None) if keyed is None else await admit(state, topic.topic_id, keyed)
    topic = placed_on(topic, stored)  # a retry: over the partitions its records first were
    try:
        grouped = await run_if(offload, Kind.CPU, _place, parsed, topic, url_partition, keyed)
        parts = grouped.partitions
        state.metrics.produce_requests.labels(api="v2").inc()
        try:
            if keyed is None:
                assigned: list[int] = await state.batcher.append_grouped(
                    topic.topic_id, grouped, log_append_time=log_append_time(topic)
                )
            else:
                # A retry of a stored request: its first offsets (and the partitions it
                # did not store yet, if it was partly committed over metadata shards).
                assigned = await append_keyed(
                    state,
                    topic.topic_id,
                    _entries(grouped),
                    keyed,
                    stored,
                    partitions=topic.partitions,
                    log_append_time=log_append_time(topic),
                )
        except PartlyCommittedError as exc:  # some partitions' shard failed: say which
            offsets = [
                _failed(error)
                if error is not None
                else {"partition": p, "offset": off, "error_code": None, "error": None}
                for p, off, error in zip(parts, exc.offsets, exc.errors, strict=True)
            ]
            answer = _answer(offsets, key_schema_id, value_schema_id)
        except LakelogError as exc:
            state.topics.forget_if_gone(topic, exc)
            answer = _answer([_failed(exc)] * len(parts), key_schema_id, value_schema_id)
        else:
            answer = await run_if(
                offload, Kind.CPU, _acked, parts, assigned, key_schema_id, value_schema_id
            )
    finally:
        release(state, ticket)
    return Response(answer, media_type=V2_CONTENT_TYPE)


def _failed(exc: LakelogError) -> dict[str, Any]:
    """A record's entry when it was not stored (kafka-rest's shape)."""
    return {
        "partition": None,
        "offset": None,
        "error_code": kafka_error_code(exc),
        "error": exc.message,
    }


def _acked(
    parts: list[int],
    assigned: list[int],
    key_schema_id: int | None,
    value_schema_id: int | None,
) -> bytes:
    offsets = [
        {"partition": p, "offset": off, "error_code": None, "error": None}
        for p, off in zip(parts, assigned, strict=True)
    ]
    return _answer(offsets, key_schema_id, value_schema_id)


def _entries(grouped: Grouped) -> list[tuple[int, Record]]:
    """A grouped request's ``(partition, record)`` pairs, in request order (keyed
    requests: ``append_keyed`` splits them by what a retry finds stored)."""
    following = dict.fromkeys(grouped.groups, 0)
    out = []
    for p in grouped.partitions:
        out.append((p, grouped.groups[p][following[p]]))
        following[p] += 1
    return out


def _answer(
    offsets: list[dict[str, Any]], key_schema_id: int | None, value_schema_id: int | None
) -> bytes:
    return orjson.dumps(
        {"offsets": offsets, "key_schema_id": key_schema_id, "value_schema_id": value_schema_id}
    )


def _place(
    parsed: list[_Parsed],
    topic: TopicInfo,
    url_partition: int | None,
    keyed: KeyedProduce | None = None,
) -> Grouped:
    """Records with their partitions, grouped for the batcher in this one pass: the
    URL's partition, the record's own, by key, else sticky (for a request with an
    Idempotency-Key: the partition of that key, at its time).

    Raises (for the first record in error, in request order):
        PartitionNotFoundError: a record's explicit partition is outside the topic.
        RecordTooLargeError: a record over the topic's ``max.message.bytes`` (or
            ``lakelog.max.decompressed.bytes``, when lower).
        InvalidRecordError: a record without a key for a compacted topic.
    """
    partitions = topic.partitions
    limit, limit_name = record_limit(topic)
    # check_record_size's count for a record without headers, as one comparison.
    plain_limit = limit - BATCH_OVERHEAD
    keyless_refused_here = compacted(topic)
    now_ms = int(time.time() * 1000) if keyed is None else keyed.now_ms
    sticky = -1 if keyed is None else keyed.sticky_partition(partitions)
    groups: dict[int, list[Record]] = {}
    parts: list[int] = []
    size = 0
    for key, value, explicit, rec_headers in parsed:
        record = Record(key, value, now_ms, rec_headers)
        if rec_headers:
            check_record_size(record, limit, limit_name)
            size += record_size(record)
        else:
            n = (0 if key is None else len(key)) + (0 if value is None else len(value))
            if n > plain_limit:
                check_record_size(record, limit, limit_name)  # raises, with its message
            size += n + RECORD_OVERHEAD
        if url_partition is not None:
            partition = url_partition
        elif explicit is not None:
            if explicit >= partitions:
                raise PartitionNotFoundError(
                    f"Partition {explicit} of topic '{topic.name}' not found."
                )
            partition = explicit
        elif key is not None:
            partition = partition_for_key(key, partitions)
        else:
            if sticky < 0:
                sticky = DEFAULT_PARTITIONER.sticky_partition(topic.name, partitions)
            partition = sticky
        if key is None and keyless_refused_here:  # a compacted topic takes keyed ones only
            raise keyless_refused(topic, partition)
        group = groups.get(partition)
        if group is None:
            group = groups[partition] = []
        group.append(record)
        parts.append(partition)
    return Grouped(groups, parts, size)


class _BinaryRecord(msgspec.Struct, forbid_unknown_fields=True):
    key: bytes | None = None  # msgspec decodes base64 (standard alphabet, padded)
    value: bytes | None = None
    partition: int | None = None
    headers: list[Any] | None = None  # checked by _parse_headers


class _BinaryBody(msgspec.Struct, forbid_unknown_fields=True):
    records: list[_BinaryRecord] | None = None
    # Allowed and ignored in the binary format (skipped unparsed):
    key_schema: msgspec.Raw = msgspec.Raw(b"null")
    key_schema_id: msgspec.Raw = msgspec.Raw(b"null")
    value_schema: msgspec.Raw = msgspec.Raw(b"null")
    value_schema_id: msgspec.Raw = msgspec.Raw(b"null")


_BINARY_BODY = msgspec.json.Decoder(_BinaryBody)


def _parse_binary(body: bytes) -> list[_Parsed] | None:
    """The fast path of a binary-format body: one typed msgspec decode (JSON, fields,
    types and base64, in C) instead of orjson objects and a base64 call per key and value
    (7 us a 1 KiB record -> under 2). None when anything is off: the caller then parses
    with ``_parse_body``'s checks, which accept it or name the first error as always.

    Where msgspec accepts, the slow path accepts the same records: both keep the last of
    duplicate members, msgspec's base64 accepts a subset of ``binascii``'s strict mode
    (not excess padding) with the same bytes, and ``int`` takes neither bools nor floats
    (tests/unit/test_v2_produce_parse.py compares the two paths).
    """
    try:
        doc = _BINARY_BODY.decode(body)
    except msgspec.DecodeError:  # ValidationError included
        return None
    records = doc.records
    if not records:
        return None
    out: list[_Parsed] = []
    append = out.append
    for i, rec in enumerate(records):
        partition, raw_headers = rec.partition, rec.headers
        if partition is not None and partition < 0:
            return None
        headers: Headers = ()
        if raw_headers:
            try:
                headers = _parse_headers(raw_headers, i)
            except MalformedRequestError:
                return None
        append((rec.key, rec.value, partition, headers))
    return out


def _parse_body(body: bytes, fmt: str, content_type: str | None = None) -> list[_Parsed]:
    """Check and decode a v2 produce body; nothing is buffered before this returns.
    ``content_type`` (the header) is named in the error of a key or value not in base64.

    Raises:
        MalformedRequestError: malformed JSON, wrong JSON types, bad base64 (400).
        UnprocessableRequestError: missing/empty ``records``, unknown fields (422).
    """
    if fmt == BINARY:
        fast = _parse_binary(body)
        if fast is not None:
            return fast
    return _parse_checked(body, fmt, content_type)


def _parse_checked(body: bytes, fmt: str, content_type: str | None = None) -> list[_Parsed]:
    """``_parse_body`` without the binary fast path: every check, in order, each error
    with its message."""
    doc = json_object(body)
    unknown = doc.keys() - _BODY_FIELDS
    if unknown:
        raise UnprocessableRequestError(f"Unrecognized field: {sorted(unknown)[0]}")
    records = doc.get("records")
    if records is None:
        raise UnprocessableRequestError("Payload error. The request has no records.")
    if not isinstance(records, list):
        raise MalformedRequestError("Bad Request: records must be an array.")
    if not records:
        raise UnprocessableRequestError("Payload error. The request has no records.")
    # json and the schema formats: the exact text of each key and value (orjson would
    # round big integers to floats); binary: base64 decoded below.
    spans = None if fmt == BINARY else v2_json_spans(body)
    out: list[_Parsed] = []
    append = out.append
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise MalformedRequestError(f"Bad Request: records[{i}] must be an object.")
        if not rec.keys() <= _RECORD_FIELDS:
            bad = sorted(rec.keys() - _RECORD_FIELDS)[0]
            raise UnprocessableRequestError(f"Unrecognized field: {bad} in records[{i}]")
        partition = rec.get("partition")
        if partition is not None and (type(partition) is not int or partition < 0):
            if type(partition) is int:
                raise PartitionNotFoundError(
                    f"Partition {partition} not found: records[{i}].partition is below 0."
                )
            raise MalformedRequestError(f"Bad Request: records[{i}].partition must be an integer.")
        raw_headers = rec.get("headers")
        if spans is None:
            try:
                key = decode_base64(rec.get("key"), f"records[{i}].key")
                value = decode_base64(rec.get("value"), f"records[{i}].value")
            except MalformedRequestError as e:
                hint = binary_hint(content_type)
                raise MalformedRequestError(f"{e.message} {hint}".rstrip()) from None
        else:
            key, value = spans[i]
        append((key, value, partition, _parse_headers(raw_headers, i) if raw_headers else ()))
    return out


def _parse_headers(raw: object, i: int) -> Headers:
    """Karapace's v2 header extension: ``[{"key": str, "value": base64 | null}]``."""
    if not isinstance(raw, list):
        raise MalformedRequestError(f"Bad Request: records[{i}].headers must be an array.")
    out: list[tuple[str, bytes | None]] = []
    for h in raw:
        if not isinstance(h, dict) or not isinstance(h.get("key"), str):
            raise MalformedRequestError(
                f'Bad Request: records[{i}].headers entries must be {{"key": str, "value": ...}}.'
            )
        out.append((h["key"], decode_base64(h.get("value"), "header value")))
    return tuple(out)
