"""REST v2 consumers: instances, subscriptions, assignments, seeks, fetch and offsets.

Shapes and codes as kafka-rest (REST-API.md §2.5), with its pain points fixed
(§6): an instance's state lives in the coordinator (``GroupCoordinator``), so any
agent serves any instance and ``base_uri`` may point at a load balancer
(``advertised_url``); the first fetch after subscribing returns data when there
is data; records carry ``timestamp`` and ``headers``.

Every path also answers with a trailing slash. An unknown instance is 404 40403
"Consumer instance not found." on every call.

Fetch (``GET .../records``): renew the instance and read its state from the
coordinator; read each assigned partition from its position through the
agent's caching reader, round-robin record by record so no partition starves
the others; stop before the record that would pass ``max_bytes`` (but return
at least one) and never move a position past a record not returned; long-poll
up to ``timeout`` for a wake-up (``service.notify``) when there is nothing, or
less than ``fetch.min.bytes``; then record the new positions with
``advance(generation)``. A rebalance in between (StaleGenerationError) drops the
records and answers ``[]``: the next fetch has the new assignment and its
positions. With auto-commit, the new positions are committed right after.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import re
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import orjson
from fastapi import APIRouter, Depends, Query, Request, Response

from coordinator.groups import ASSIGNORS, FORMATS, RESET_POLICIES, CommittedOffset, ConsumerConfig
from segments.errors import (
    ConsumerFormatMismatchError,
    ConsumerStateError,
    InvalidConsumerConfigError,
    LakelogError,
    MalformedRequestError,
    NoOffsetError,
    PartitionNotFoundError,
    StaleGenerationError,
    TopicNotFoundError,
    UnprocessableRequestError,
    UnsupportedMediaTypeError,
)
from segments.types import ConsumedRecord, TopicPartition
from service.errors import V2_CONTENT_TYPE
from service.notify import PartitionKey
from service.read_cache import CachingLogReader
from service.registry.rest import SCHEMA_TYPE_OF_FORMAT
from service.registry.rest import render_records as render_schema_records
from service.state import AgentState, get_state
from service.v3.common import base_url, call

log = logging.getLogger(__name__)

router = APIRouter(tags=["v2 consumers"])

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

INSTANCE = "/consumers/{group}/instances/{instance}"

_CONTROL_TYPE = re.compile(
    r"application/vnd\.kafka(?:\.(?:binary|json|avro|jsonschema|protobuf))?(?:\.v[12])?\+json"
    r"|application/json|application/octet-stream"
)
_ACCEPT_ANY = frozenset({"*/*", "application/*"})
_RESET_ALIASES = {"smallest": "earliest", "largest": "latest"}
_ASSIGNOR_ALIASES = {
    "org.apache.kafka.clients.consumer.rangeassignor": "range",
    "org.apache.kafka.clients.consumer.roundrobinassignor": "roundrobin",
}


def route(method: str, path: str, **kwargs: Any) -> Callable[[F], F]:
    """Register a handler at ``path`` and at ``path/`` (clients send both)."""

    def register(fn: F) -> F:
        router.add_api_route(path, fn, methods=[method], **kwargs)
        router.add_api_route(path + "/", fn, methods=[method], include_in_schema=False, **kwargs)
        return fn

    return register


def v2_json(payload: Any, status_code: int = 200, media_type: str = V2_CONTENT_TYPE) -> Response:
    return Response(orjson.dumps(payload), status_code=status_code, media_type=media_type)


def no_content() -> Response:
    return Response(status_code=204)


# -- request bodies ---------------------------------------------------------------------


def _media_type(header: str) -> str:
    return header.split(";", 1)[0].strip().lower()


def check_content_type(request: Request) -> None:
    """Control calls take the v2 types, the embedded-format types and plain JSON (lenient).

    Raises:
        UnsupportedMediaTypeError: any other Content-Type.
    """
    header = request.headers.get("content-type")
    if header and not _CONTROL_TYPE.fullmatch(_media_type(header)):
        raise UnsupportedMediaTypeError("HTTP 415 Unsupported Media Type")


async def json_body(request: Request) -> dict[str, Any] | None:
    """The request's JSON object, or None for an empty body.

    Raises:
        MalformedRequestError: malformed JSON, or JSON that is not an object.
    """
    check_content_type(request)
    raw = await request.body()
    if not raw.strip():
        return None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise MalformedRequestError("Bad Request: malformed JSON.") from None
    if not isinstance(doc, dict):
        raise MalformedRequestError("Bad Request: the body must be a JSON object.")
    return doc


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _require(doc: dict[str, Any] | None, name: str) -> list[Any]:
    """``doc[name]``, which must be an array.

    Raises:
        UnprocessableRequestError: no body or no such field (422).
        MalformedRequestError: the field is not an array (400).
    """
    if doc is None or doc.get(name) is None:
        raise UnprocessableRequestError(f"Payload error. {name} is required.")
    value = doc[name]
    if not isinstance(value, list):
        raise MalformedRequestError(f"Bad Request: {name} must be an array.")
    return value


def parse_partitions(items: list[Any], what: str = "partitions") -> list[TopicPartition]:
    """``[{"topic": str, "partition": int}, ...]`` as TopicPartitions.

    Raises:
        MalformedRequestError: an entry of the wrong shape or types.
    """
    out = []
    for i, item in enumerate(items):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("topic"), str)
            or not _is_int(item.get("partition"))
        ):
            raise MalformedRequestError(
                f'Bad Request: {what}[{i}] must be {{"topic": string, "partition": integer}}.'
            )
        out.append(TopicPartition(item["topic"], item["partition"]))
    return out


def parse_timestamp(value: object, i: int) -> int:
    """An ISO-8601 date-time (``2021-02-05T19:14:42Z``) or epoch milliseconds, as epoch ms.

    Raises:
        MalformedRequestError: neither.
    """
    if _is_int(value):
        assert isinstance(value, int)
        return value
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if parsed.tzinfo is None:
                raise MalformedRequestError(
                    f"Bad Request: timestamps[{i}].timestamp needs a time zone, e.g. 'Z'."
                )
            return int(parsed.timestamp() * 1000)
    raise MalformedRequestError(
        f"Bad Request: timestamps[{i}].timestamp must be an ISO-8601 date-time or epoch ms."
    )


# -- instance creation ----------------------------------------------------------------------


def _setting(doc: dict[str, Any], *names: str) -> Any:
    for name in names:
        if doc.get(name) is not None:
            return doc[name]
    return None


def _int_setting(doc: dict[str, Any], names: Sequence[str], default: int, minimum: int) -> int:
    value = _setting(doc, *names)
    if value is None:
        return default
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        value = int(value)
    if not _is_int(value) or value < minimum:
        raise InvalidConsumerConfigError(
            f"Invalid consumer configuration. {names[0]} must be an integer >= {minimum}, "
            f"got {value!r}."
        )
    assert isinstance(value, int)
    return value


def _bool_setting(doc: dict[str, Any], name: str, default: bool) -> bool:
    value = doc.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidConsumerConfigError(
        f'Invalid consumer configuration. {name} must be "true" or "false", got {value!r}.'
    )


def consumer_config(doc: dict[str, Any], state: AgentState) -> ConsumerConfig:
    """The instance's settings from a create request; unknown keys are ignored.

    Raises:
        InvalidConsumerConfigError: an unknown format (422 42204, "Invalid format
            type.") or a bad value for a known setting.
    """
    default = ConsumerConfig()
    fmt = doc.get("format", default.format)
    if not isinstance(fmt, str) or fmt.lower() not in FORMATS:
        raise InvalidConsumerConfigError("Invalid format type.")
    reset = doc.get("auto.offset.reset", default.auto_offset_reset)
    reset = _RESET_ALIASES.get(str(reset).lower(), str(reset).lower())
    if reset not in RESET_POLICIES:
        raise InvalidConsumerConfigError(
            "Invalid consumer configuration. auto.offset.reset must be earliest, latest or "
            f"none, got {doc.get('auto.offset.reset')!r}."
        )
    assignor = str(doc.get("partition.assignment.strategy", default.assignor)).lower()
    assignor = _ASSIGNOR_ALIASES.get(assignor, assignor)
    if assignor not in ASSIGNORS:
        raise InvalidConsumerConfigError(
            "Invalid consumer configuration. partition.assignment.strategy must be range or "
            f"roundrobin, got {doc.get('partition.assignment.strategy')!r}."
        )
    s = state.settings
    return ConsumerConfig(
        format=fmt.lower(),
        auto_offset_reset=reset,
        auto_commit=_bool_setting(doc, "auto.commit.enable", default.auto_commit),
        fetch_min_bytes=_int_setting(
            doc, ("fetch.min.bytes", "responseMinBytes"), default.fetch_min_bytes, -1
        ),
        request_timeout_ms=_int_setting(
            doc, ("consumer.request.timeout.ms", "requestWaitMs"), default.request_timeout_ms, 0
        ),
        session_timeout_ms=_int_setting(
            doc, ("session.timeout.ms",), s.consumer_session_timeout_ms, 1
        ),
        instance_timeout_ms=_int_setting(
            doc, ("consumer.instance.timeout.ms",), s.consumer_instance_timeout_ms, 1
        ),
        assignor=assignor,
    )


@route("POST", "/consumers/{group}", summary="Create a consumer instance in a group")
async def create_consumer(
    group: str, request: Request, state: AgentState = Depends(get_state)
) -> Response:
    """200 ``{"instance_id", "base_uri"}``; 409 40902 for a name already in the group."""
    doc = await json_body(request) or {}
    name = _setting(doc, "name", "id")
    if name is None:
        name = f"rest-consumer-{state.settings.agent_id[:8]}-{uuid.uuid4()}"
    if not isinstance(name, str) or not name or "/" in name:
        raise InvalidConsumerConfigError(
            "Invalid consumer configuration. name must be a non-empty string without '/'."
        )
    config = consumer_config(doc, state)
    await call(state.groups.create_consumer, group, name, config)
    base = base_url(request, state)
    uri = f"{base}/consumers/{quote(group, safe='')}/instances/{quote(name, safe='')}"
    return v2_json({"instance_id": name, "base_uri": uri})


@route("DELETE", INSTANCE, summary="Delete a consumer instance")
async def delete_consumer(
    group: str, instance: str, state: AgentState = Depends(get_state)
) -> Response:
    await call(state.groups.delete_consumer, group, instance)
    return no_content()


# -- subscription and assignment -----------------------------------------------------------


@route("POST", INSTANCE + "/subscription", summary="Subscribe to topics or a pattern")
async def subscribe(
    group: str, instance: str, request: Request, state: AgentState = Depends(get_state)
) -> Response:
    """204. Topics and a pattern together, or a subscription while partitions are
    assigned by hand: 409 40903. Unknown topic: 404 40401."""
    doc = await json_body(request) or {}
    topics = doc.get("topics")
    pattern = doc.get("topic_pattern")
    if topics is not None and pattern is not None:
        raise ConsumerStateError(
            "Subscription to topics, partitions and pattern are mutually exclusive."
        )
    if topics is not None:
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise UnprocessableRequestError("Payload error. topics must be an array of strings.")
        if not topics:  # Kafka: subscribing to nothing is unsubscribing
            await call(state.groups.consumer, group, instance)
            await call(state.groups.unsubscribe, group, instance)
            return no_content()
        await call(state.groups.subscribe, group, instance, list(topics), None)
        return no_content()
    if pattern is not None:
        if not isinstance(pattern, str):
            raise UnprocessableRequestError("Payload error. topic_pattern must be a string.")
        try:
            re.compile(pattern)
        except re.error as e:
            raise UnprocessableRequestError(f"Payload error. Invalid topic_pattern: {e}.") from None
        await call(state.groups.subscribe, group, instance, (), pattern)
        return no_content()
    raise UnprocessableRequestError("Payload error. topics or topic_pattern is required.")


@route("GET", INSTANCE + "/subscription", summary="The subscribed topics")
async def get_subscription(
    group: str, instance: str, state: AgentState = Depends(get_state)
) -> Response:
    st = await call(state.groups.consumer, group, instance)
    return v2_json({"topics": list(st.subscription)})


@route("DELETE", INSTANCE + "/subscription", summary="Unsubscribe")
async def delete_subscription(
    group: str, instance: str, state: AgentState = Depends(get_state)
) -> Response:
    await call(state.groups.consumer, group, instance)
    await call(state.groups.unsubscribe, group, instance)
    return no_content()


@route("POST", INSTANCE + "/assignments", summary="Assign partitions by hand")
async def assign(
    group: str, instance: str, request: Request, state: AgentState = Depends(get_state)
) -> Response:
    """204; while subscribed 409 40903; unknown topic 40401, unknown partition 40402."""
    tps = parse_partitions(_require(await json_body(request), "partitions"))
    await call(state.groups.assign, group, instance, tps)
    return no_content()


@route("GET", INSTANCE + "/assignments", summary="The assigned partitions")
async def get_assignments(
    group: str, instance: str, state: AgentState = Depends(get_state)
) -> Response:
    st = await call(state.groups.consumer, group, instance)
    return v2_json(
        {"partitions": [{"topic": tp.topic, "partition": tp.partition} for tp in st.assignment]}
    )


# -- positions -----------------------------------------------------------------------------


async def _check_assigned(
    state: AgentState, group: str, instance: str, tps: Sequence[TopicPartition]
) -> None:
    """Raises ConsumerStateError (409 40903) for a partition the instance does not own."""
    st = await call(state.groups.consumer, group, instance)
    owned = set(st.assignment)
    for tp in tps:
        if tp not in owned:
            raise ConsumerStateError(
                f"No current assignment for partition {tp.topic}-{tp.partition}."
            )


@route("POST", INSTANCE + "/positions", summary="Seek to offsets or timestamps")
async def seek(
    group: str, instance: str, request: Request, state: AgentState = Depends(get_state)
) -> Response:
    """``{"offsets": [...]}`` and/or ``{"timestamps": [...]}`` -> 204.

    A timestamp seeks to the first record at or after it, or to the end when
    there is none (Kafka's offsetsForTimes + seekToEnd).
    """
    doc = await json_body(request)
    if doc is None or (doc.get("offsets") is None and doc.get("timestamps") is None):
        raise UnprocessableRequestError("Payload error. offsets or timestamps is required.")
    targets: dict[TopicPartition, int] = {}
    offsets = doc.get("offsets") or []
    timestamps = doc.get("timestamps") or []
    if not isinstance(offsets, list) or not isinstance(timestamps, list):
        raise MalformedRequestError("Bad Request: offsets and timestamps must be arrays.")
    for i, (tp, item) in enumerate(zip(parse_partitions(offsets, "offsets"), offsets, strict=True)):
        if not _is_int(item.get("offset")) or item["offset"] < 0:
            raise MalformedRequestError(
                f"Bad Request: offsets[{i}].offset must be an integer >= 0."
            )
        targets[tp] = item["offset"]
    by_time = list(zip(parse_partitions(timestamps, "timestamps"), timestamps, strict=True))
    await _check_assigned(state, group, instance, [*targets, *(tp for tp, _ in by_time)])
    for i, (tp, item) in enumerate(by_time):
        ts = parse_timestamp(item.get("timestamp"), i)
        off = await call(state.reader.offset_for_timestamp, tp.topic, tp.partition, ts)
        if off is None:
            off = (await call(state.coordinator.offsets, tp.topic, tp.partition)).high_watermark
        targets[tp] = off
    await call(state.groups.seek, group, instance, targets)
    return no_content()


async def _seek_edge(
    group: str, instance: str, request: Request, state: AgentState, end: bool
) -> Response:
    tps = parse_partitions(_require(await json_body(request), "partitions"))
    await _check_assigned(state, group, instance, tps)
    targets = {}
    for tp in tps:
        offsets = await call(state.coordinator.offsets, tp.topic, tp.partition)
        targets[tp] = offsets.high_watermark if end else offsets.log_start
    await call(state.groups.seek, group, instance, targets)
    return no_content()


@route("POST", INSTANCE + "/positions/beginning", summary="Seek to the log-start offset")
async def seek_beginning(
    group: str, instance: str, request: Request, state: AgentState = Depends(get_state)
) -> Response:
    return await _seek_edge(group, instance, request, state, end=False)


@route("POST", INSTANCE + "/positions/end", summary="Seek to the high watermark")
async def seek_end(
    group: str, instance: str, request: Request, state: AgentState = Depends(get_state)
) -> Response:
    return await _seek_edge(group, instance, request, state, end=True)


# -- offsets -------------------------------------------------------------------------------


@route("POST", INSTANCE + "/offsets", summary="Commit offsets")
async def commit_offsets(
    group: str, instance: str, request: Request, state: AgentState = Depends(get_state)
) -> Response:
    """Explicit offsets store ``offset + 1`` (the body names the last consumed record);
    an empty body commits everything fetched so far. 200 ``[]``, as kafka-rest."""
    doc = await json_body(request)
    st = await call(state.groups.consumer, group, instance)
    items = None if doc is None else doc.get("offsets")
    commits: dict[TopicPartition, CommittedOffset] = {}
    if items is None:
        commits = {tp: CommittedOffset(off) for tp, off in st.positions.items()}
    else:
        if not isinstance(items, list):
            raise MalformedRequestError("Bad Request: offsets must be an array.")
        for i, (tp, item) in enumerate(zip(parse_partitions(items, "offsets"), items, strict=True)):
            if not _is_int(item.get("offset")) or item["offset"] < -1:
                raise MalformedRequestError(f"Bad Request: offsets[{i}].offset must be an integer.")
            metadata = item.get("metadata") or ""
            if not isinstance(metadata, str):
                raise MalformedRequestError(f"Bad Request: offsets[{i}].metadata must be a string.")
            commits[tp] = CommittedOffset(item["offset"] + 1, metadata)
    if commits:
        await call(state.groups.commit_offsets, group, instance, commits, st.generation)
    return v2_json([])


@route("GET", INSTANCE + "/offsets", summary="Committed offsets (GET with a JSON body)")
async def get_offsets(
    group: str, instance: str, request: Request, state: AgentState = Depends(get_state)
) -> Response:
    """``{"offsets": [{"topic", "partition", "offset", "metadata"}]}`` for the partitions
    named in the body; partitions with no committed offset are left out. No body:
    404 40402, as kafka-rest."""
    doc = await json_body(request)
    await call(state.groups.consumer, group, instance)
    if doc is None or doc.get("partitions") is None:
        raise PartitionNotFoundError("Partition not found.")
    tps = parse_partitions(_require(doc, "partitions"))
    committed = await call(state.groups.committed_offsets, group, tps)
    return v2_json(
        {
            "offsets": [
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "offset": committed[tp].offset,
                    "metadata": committed[tp].metadata,
                }
                for tp in tps
                if tp in committed
            ]
        }
    )


# -- fetch ---------------------------------------------------------------------------------


def check_records_accept(accept: str | None, fmt: str) -> str:
    """The response Content-Type for a consumer of format ``fmt``, if Accept allows it.

    ``application/vnd.kafka.{fmt}.v2+json`` always; a binary consumer also takes
    ``application/vnd.kafka.v2+json``; ``*/*`` (or no Accept) takes anything.

    Raises:
        ConsumerFormatMismatchError: 406 40601.
    """
    answer = f"application/vnd.kafka.{fmt}.v2+json"
    if not accept:
        return answer
    allowed = {answer, f"application/vnd.kafka.{fmt}+json", f"application/vnd.kafka.{fmt}.v1+json"}
    if fmt == "binary":
        allowed |= {V2_CONTENT_TYPE, "application/vnd.kafka+json"}
    for part in accept.split(","):
        media = _media_type(part)
        if media in allowed or media in _ACCEPT_ANY:
            return answer
    raise ConsumerFormatMismatchError(
        f"The requested embedded data format does not match the deserializer for this "
        f"consumer instance ({fmt})."
    )


def record_size(rec: ConsumedRecord) -> int:
    """What counts against ``max_bytes``: the unencoded key and value."""
    return len(rec.key or b"") + len(rec.value or b"")


def read_round_robin(
    reader: CachingLogReader,
    positions: dict[TopicPartition, int],
    max_bytes: int,
    *,
    at_least_one: bool = True,
    start: int = 0,
) -> tuple[list[ConsumedRecord], dict[TopicPartition, int], int]:
    """Read ``positions`` record by record in turn, until ``max_bytes`` or nothing is left.

    A record that would take the total past ``max_bytes`` is not returned (unless
    it is the first and ``at_least_one``), and no position moves past a record
    that is not returned.

    Returns:
        (records, next positions, their size in key+value bytes)
    """
    order = list(positions)
    if order:
        k = start % len(order)
        order = order[k:] + order[:k]
    share = max(max_bytes // max(len(order), 1), 1)
    streams = {
        tp: reader.records(tp.topic, tp.partition, positions[tp], read_ahead_bytes=share)
        for tp in order
    }
    out: list[ConsumedRecord] = []
    new = dict(positions)
    size = 0
    active = deque(order)
    while active:
        tp = active.popleft()
        rec = next(streams[tp], None)
        if rec is None:
            continue
        n = record_size(rec)
        if size + n > max_bytes and (out or not at_least_one):
            break
        out.append(rec)
        size += n
        new[tp] = rec.offset + 1
        if size >= max_bytes:
            break
        active.append(tp)
    return out, new, size


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _json_value(data: bytes | None, what: str) -> Any:
    if data is None:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UnprocessableRequestError(f"{what} deserialization error for format json") from None


def render_records(records: list[ConsumedRecord], fmt: str) -> list[dict[str, Any]]:
    """Records as v2 JSON: binary keys/values base64, json ones embedded.

    Raises:
        UnprocessableRequestError: a json consumer met a key or value that is not JSON.
    """
    out = []
    for r in records:
        if fmt == "json":
            key, value = _json_value(r.key, "key"), _json_value(r.value, "value")
        else:
            key, value = _b64(r.key), _b64(r.value)
        out.append(
            {
                "topic": r.topic,
                "key": key,
                "value": value,
                "partition": r.partition,
                "offset": r.offset,
                "timestamp": r.timestamp_ms,
                "headers": [{"key": k, "value": _b64(v)} for k, v in r.headers],
            }
        )
    return out


@route("GET", INSTANCE + "/records", summary="Fetch records (long-polls up to timeout)")
async def fetch_records(
    group: str,
    instance: str,
    request: Request,
    wait: int | None = Query(None, alias="timeout", description="Long-poll at most this many ms."),
    max_bytes: int | None = Query(None, description="Key+value bytes to return at most."),
    state: AgentState = Depends(get_state),
) -> Response:
    """An array of records in the instance's format, possibly ``[]`` after ``timeout`` ms."""
    started = time.monotonic()
    st = await call(state.groups.consumer, group, instance)
    media_type = check_records_accept(request.headers.get("accept"), st.config.format)
    if st.unresolved:
        tp = st.unresolved[0]
        raise NoOffsetError(
            f"No committed offset for partition {tp.topic}-{tp.partition} and "
            "auto.offset.reset is none: seek first."
        )
    if st.config.auto_commit and st.positions:
        # Kafka's auto-commit: a poll commits what the previous polls returned (the client
        # has had them), never what this poll is about to return. At-least-once.
        try:
            await call(
                state.groups.commit_offsets,
                group,
                instance,
                {tp: CommittedOffset(off) for tp, off in st.positions.items()},
                st.generation,
            )
        except LakelogError as e:
            log.info("auto-commit of %s/%s failed: %s", group, instance, e)
    settings = state.settings
    wait_ms = wait if wait is not None and wait >= 0 else st.config.request_timeout_ms
    deadline = started + min(wait_ms, settings.consumer_max_wait_ms) / 1000
    limit = (
        max_bytes
        if max_bytes is not None and max_bytes > 0
        else settings.consumer_request_max_bytes
    )
    min_bytes = st.config.fetch_min_bytes

    # Topic ids key the wake-ups; a topic deleted meanwhile is skipped.
    positions: dict[TopicPartition, int] = {}
    ids: dict[TopicPartition, PartitionKey] = {}
    for tp, off in st.positions.items():
        try:
            info = await state.topics.get(tp.topic)
        except TopicNotFoundError:
            continue
        positions[tp] = off
        ids[tp] = (info.topic_id, tp.partition)
    watches = {ids[tp]: (tp.topic, off) for tp, off in positions.items()}

    records: list[ConsumedRecord] = []
    size = 0
    start = random.randrange(1 << 30)
    with state.notifier.watch(watches) as waiter:
        while True:
            batch, positions, got = await asyncio.to_thread(
                read_round_robin,
                state.reader,
                positions,
                limit - size,
                at_least_one=not records,
                start=start,
            )
            records += batch
            size += got
            for tp, off in positions.items():
                waiter.update(ids[tp], off)
            if size >= limit or (records and size >= min_bytes):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await state.notifier.wait(waiter, remaining)

    # A 422 here moves no position.
    if st.config.format in SCHEMA_TYPE_OF_FORMAT:
        body = await render_schema_records(state.registry, records, st.config.format)
    else:
        body = render_records(records, st.config.format)
    if records:
        moved = {tp: off for tp, off in positions.items() if off != st.positions.get(tp)}
        try:
            await call(state.groups.advance, group, instance, st.generation, moved)
        except StaleGenerationError:
            return v2_json([], media_type=media_type)
    state.consume_metrics.consumed_records.inc(len(records))
    state.consume_metrics.consumed_bytes.inc(size)
    state.consume_metrics.fetch_seconds.observe(time.monotonic() - started)
    return v2_json(body, media_type=media_type)
