"""REST v2 consumers: instances, subscriptions, assignments, seeks, fetch and offsets.

Shapes and codes as kafka-rest (REST-API.md §2.5), with its pain points fixed
(§6): an instance's state lives in the coordinator (``GroupCoordinator``), so any
agent serves any instance and ``base_uri`` may point at a load balancer
(``advertised_url``); the first fetch after subscribing returns data when there
is data; records carry ``timestamp`` and ``headers``.

Every path also answers with a trailing slash. An unknown instance is 404 40403
"Consumer instance not found." on every call.

An instance belongs to the principal that made it (its ``owner``, kept with it in the
coordinator): any other principal's call on it is refused with 403 40301, whatever
its ACLs. With authorization on, every fetch checks READ on each topic it reads
(Kafka's Fetch), with the agent's ACL copy, when it starts and again before it
answers: a READ revoked while an instance exists stops its fetches within the
agents' staleness bound. A ``topic_pattern`` subscription is matched against each
topic's own ACLs, as a Kafka pattern subscription is: a topic the principal may not
DESCRIBE is never read (as if the pattern did not match it), one it may DESCRIBE but
not READ fails the fetch (TOPIC_AUTHORIZATION_FAILED's 403 40301).

Fetch (``GET .../records``, see ``_Fetch``): one fetch of an instance at a time,
whichever agents the requests reach (kafka-rest serialises every call on an
instance): a local lock per instance on each agent, and the instance's fetch
lease in the coordinator across agents. Each assigned partition is read from its
position through the agent's caching reader, round-robin record by record so no
partition starves the others; the fetch stops before the record that would
pass ``max_bytes`` (but returns at least one) and never moves a position past a
record not returned; it long-polls up to ``timeout`` for a wake-up
(``service.consume.notify``) when there is nothing, or less than ``fetch.min.bytes``.
Before answering it confirms that no seek or rebalance moved the positions it
read from (else it reads again from the new ones); the new positions are stored
only once the answer was written to a client still connected
(``service.delivery``), so an answer its client never got is fetched again (and
stored again through a short coordinator outage, which would otherwise deliver the
answer a second time once the lease lapsed).
With auto-commit, a fetch first commits the positions: what earlier fetches
delivered (Kafka's at-least-once auto-commit).

Each agent heartbeats the instances it served (``service.consume.sessions``),
so a client may take minutes over a batch and still commit; a member leaves
its group when its client has not fetched for ``max.poll.interval.ms`` (300 s)
or when no agent heartbeated it for ``session.timeout.ms``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import random
import re
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar, cast
from urllib.parse import quote

import msgspec
import orjson
from fastapi import APIRouter, Query, Request, Response

from coordinator.client import (
    IndexWant,
    PartitionOffsets,
    TopicPartition,
    TransactionCoordinator,
)
from coordinator.groups.model import (
    ASSIGNORS,
    FORMATS,
    ISOLATION_LEVELS,
    RESET_POLICIES,
    CommittedOffset,
    ConsumerConfig,
    ConsumerState,
    FetchLease,
)
from coordinator.security.model import Operation, ResourceType
from segments.errors import (
    AuthorizationError,
    ConsumerFormatMismatchError,
    ConsumerStateError,
    CoordinatorUnavailableError,
    InvalidConsumerConfigError,
    LakelogError,
    MalformedRequestError,
    NoOffsetError,
    PartitionNotFoundError,
    TopicNotFoundError,
    UnprocessableRequestError,
    UnsupportedMediaTypeError,
)
from segments.types import ConsumedRecord
from service.consume.notify import PartitionKey
from service.delivery import DeliveryResponse, DisconnectWatch
from service.errors import V2_CONTENT_TYPE
from service.executors import Kind, run
from service.produce.formats import json_fragment, json_object
from service.read_cache import CachingLogReader
from service.registry.rest import SCHEMA_TYPE_OF_FORMAT
from service.registry.rest import render_records as render_schema_records
from service.security.acl import Rights, rights
from service.security.auth import principal_of
from service.state import AgentState, StateDep
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
#: Plain JSON (Karapace accepts it): answered as ``application/json``.
_ACCEPT_JSON = frozenset({"application/json", "*/json"})
#: A fetch waits for at least this much of the agent's fetch budget (or its max_bytes).
FETCH_MIN_GRANT = 1 << 20
#: Answers with fewer key+value bytes are rendered on the event loop; bigger ones in a
#: thread (base64 and JSON of 64 MiB take ~0.2 s of CPU).
RENDER_INLINE_BYTES = 256 << 10
#: Waits before storing a delivered fetch's positions again while the metadata database
#: cannot be reached (a killed connection, a restart): positions not stored are
#: delivered again once the lease lapses, so a transient failure is worth riding out.
END_FETCH_BACKOFF_S = (0.05, 0.25, 1.0)
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
    return json_object(raw) if raw.strip() else None


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


# -- who may use an instance ----------------------------------------------------------------


def check_owner(st: ConsumerState, principal: str) -> None:
    """Raises AuthorizationError (403 40301) unless ``principal`` made the instance (an
    instance without an owner, made before owners were kept, is anyone's)."""
    if st.config.owner and st.config.owner != principal:
        raise AuthorizationError(
            f"Not authorized to use consumer instance {st.name} of group {st.group}: it "
            "belongs to another principal."
        )


async def owned(
    state: AgentState, request: Request, group: str, instance: str, *, touch: bool = True
) -> ConsumerState:
    """The instance's state, once its owner is the request's principal.

    Raises:
        ConsumerNotFoundError (404 40403), AuthorizationError (403 40301).
    """
    st = await call(state.groups.consumer, group, instance, touch=touch)
    check_owner(st, principal_of(request.scope))
    return st


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


#: The Kafka consumer settings an instance honours (kafka-rest's names and Kafka's). Any
#: other dotted key is a Kafka setting we would silently ignore: refused with 42204.
HONOURED = frozenset(
    {
        "auto.offset.reset",
        "auto.commit.enable",
        "enable.auto.commit",
        "fetch.min.bytes",
        "fetch.max.wait.ms",
        "consumer.request.timeout.ms",
        "session.timeout.ms",
        "consumer.instance.timeout.ms",
        "max.poll.interval.ms",
        "max.poll.records",
        "isolation.level",
        "partition.assignment.strategy",
    }
)


#: Kafka settings that mean nothing here (metadata is never stale, there are no racks)
#: and that clients send (Karapace's own tests send the first): accepted, ignored.
IGNORED = frozenset(
    {"topic.metadata.refresh.interval.ms", "metadata.max.age.ms", "client.id", "client.rack"}
)


def consumer_config(doc: dict[str, Any], state: AgentState) -> ConsumerConfig:
    """The instance's settings from a create request; undotted unknown keys (``name``,
    ...) are ignored, dotted ones (Kafka consumer settings) refused.

    Raises:
        InvalidConsumerConfigError: an unknown format (422 42204, "Invalid format
            type."), a Kafka setting not honoured per instance, or a bad value for a
            known setting.
    """
    unknown = sorted(k for k in doc if "." in k and k not in HONOURED and k not in IGNORED)
    if unknown:
        raise InvalidConsumerConfigError(
            f"Invalid consumer configuration. {unknown[0]} is not a setting a consumer "
            f"instance honours; it honours {', '.join(sorted(HONOURED))}."
        )
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
    session = _int_setting(doc, ("session.timeout.ms",), s.consumer_session_timeout_ms, 1)
    if session <= s.consumer_heartbeat_interval_ms:
        raise InvalidConsumerConfigError(
            f"Invalid consumer configuration. session.timeout.ms ({session}) must be longer "
            f"than the agents' heartbeat interval ({s.consumer_heartbeat_interval_ms} ms)."
        )
    if session > s.group_max_session_timeout_ms:
        raise InvalidConsumerConfigError(
            f"Invalid consumer configuration. session.timeout.ms ({session}) is over "
            f"group.max.session.timeout.ms ({s.group_max_session_timeout_ms} ms)."
        )
    return ConsumerConfig(
        format=fmt.lower(),
        auto_offset_reset=reset,
        auto_commit=_bool_setting(
            doc,
            "auto.commit.enable" if "auto.commit.enable" in doc else "enable.auto.commit",
            default.auto_commit,
        ),
        fetch_min_bytes=_int_setting(
            doc, ("fetch.min.bytes", "responseMinBytes"), default.fetch_min_bytes, -1
        ),
        request_timeout_ms=_int_setting(
            doc,
            ("consumer.request.timeout.ms", "requestWaitMs", "fetch.max.wait.ms"),
            default.request_timeout_ms,
            0,
        ),
        session_timeout_ms=session,
        instance_timeout_ms=_int_setting(
            doc, ("consumer.instance.timeout.ms",), s.consumer_instance_timeout_ms, 1
        ),
        assignor=assignor,
        max_poll_interval_ms=_int_setting(
            doc, ("max.poll.interval.ms",), s.consumer_max_poll_interval_ms, 1
        ),
        max_poll_records=_int_setting(doc, ("max.poll.records",), default.max_poll_records, 1),
        isolation_level=_isolation(doc.get("isolation.level", default.isolation_level)),
    )


def _isolation(value: object) -> str:
    level = str(value).strip().lower()
    if level not in ISOLATION_LEVELS:
        raise InvalidConsumerConfigError(
            "Invalid consumer configuration. isolation.level must be read_uncommitted or "
            f"read_committed, got {value!r}."
        )
    return level


@route("POST", "/consumers/{group}", summary="Create a consumer instance in a group")
async def create_consumer(group: str, request: Request, state: StateDep) -> Response:
    """200 ``{"instance_id", "base_uri"}``; 409 40902 for a name already in the group."""
    doc = await json_body(request) or {}
    name = _setting(doc, "name", "id")
    if name is None:
        name = f"rest-consumer-{state.settings.agent_id[:8]}-{uuid.uuid4()}"
    if not isinstance(name, str) or not name or "/" in name:
        raise InvalidConsumerConfigError(
            "Invalid consumer configuration. name must be a non-empty string without '/'."
        )
    config = replace(consumer_config(doc, state), owner=principal_of(request.scope))
    await call(state.groups.create_consumer, group, name, config)
    state.consumers.served(
        group, name, idle_timeout_ms=config.instance_timeout_ms
    ).owner = config.owner
    base = base_url(request, state)
    uri = f"{base}/consumers/{quote(group, safe='')}/instances/{quote(name, safe='')}"
    return v2_json({"instance_id": name, "base_uri": uri})


@route("DELETE", INSTANCE, summary="Delete a consumer instance")
async def delete_consumer(group: str, instance: str, request: Request, state: StateDep) -> Response:
    await owned(state, request, group, instance, touch=False)
    await call(state.groups.delete_consumer, group, instance)
    state.consumers.changed(group, instance)
    state.consumers.forget(group, instance)
    return no_content()


# -- subscription and assignment -----------------------------------------------------------


@route("POST", INSTANCE + "/subscription", summary="Subscribe to topics or a pattern")
async def subscribe(group: str, instance: str, request: Request, state: StateDep) -> Response:
    """204. Topics and a pattern together, or a subscription while partitions are
    assigned by hand: 409 40903. Topics need not exist yet (assigned once created);
    a pattern is a Java regex (``coordinator.groups.patterns``: unsupported constructs 422)."""
    doc = await json_body(request) or {}
    topics = doc.get("topics")
    pattern = doc.get("topic_pattern")
    if topics is not None and pattern is not None:
        raise ConsumerStateError(
            "Subscription to topics, partitions and pattern are mutually exclusive."
        )
    await owned(state, request, group, instance)
    served = state.consumers.served(group, instance)
    if topics is not None:
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise UnprocessableRequestError("Payload error. topics must be an array of strings.")
        if not topics:  # Kafka: subscribing to nothing is unsubscribing
            await call(state.groups.unsubscribe, group, instance)
        else:
            await call(state.groups.subscribe, group, instance, list(topics), None)
        served.changed()
        return no_content()
    if pattern is not None:
        if not isinstance(pattern, str):
            raise UnprocessableRequestError("Payload error. topic_pattern must be a string.")
        await call(state.groups.subscribe, group, instance, (), pattern)
        served.changed()
        return no_content()
    raise UnprocessableRequestError("Payload error. topics or topic_pattern is required.")


@route("GET", INSTANCE + "/subscription", summary="The subscribed topics")
async def get_subscription(
    group: str, instance: str, request: Request, state: StateDep
) -> Response:
    st = await owned(state, request, group, instance)
    state.consumers.served(group, instance)
    return v2_json({"topics": list(st.subscription)})


@route("DELETE", INSTANCE + "/subscription", summary="Unsubscribe")
async def delete_subscription(
    group: str, instance: str, request: Request, state: StateDep
) -> Response:
    await owned(state, request, group, instance)
    await call(state.groups.unsubscribe, group, instance)
    state.consumers.served(group, instance).changed()
    return no_content()


@route("POST", INSTANCE + "/assignments", summary="Assign partitions by hand")
async def assign(group: str, instance: str, request: Request, state: StateDep) -> Response:
    """204; while subscribed 409 40903; unknown topic 40401, unknown partition 40402."""
    tps = parse_partitions(_require(await json_body(request), "partitions"))
    await owned(state, request, group, instance)
    await call(state.groups.assign, group, instance, tps)
    state.consumers.served(group, instance).changed()
    return no_content()


@route("GET", INSTANCE + "/assignments", summary="The assigned partitions")
async def get_assignments(group: str, instance: str, request: Request, state: StateDep) -> Response:
    st = await owned(state, request, group, instance)
    state.consumers.served(group, instance)
    return v2_json(
        {"partitions": [{"topic": tp.topic, "partition": tp.partition} for tp in st.assignment]}
    )


# -- positions -----------------------------------------------------------------------------


async def _check_seek(
    state: AgentState, request: Request, group: str, instance: str, tps: Sequence[TopicPartition]
) -> None:
    """A seek of ``tps``: the principal's instance, each partition assigned to it, and
    DESCRIBE on each topic (the offsets it looks up: Kafka's ListOffsets).

    Raises:
        AuthorizationError (403 40301), ConsumerStateError (409 40903).
    """
    st = await owned(state, request, group, instance)
    assigned = set(st.assignment)
    for tp in tps:
        if tp not in assigned:
            raise ConsumerStateError(
                f"No current assignment for partition {tp.topic}-{tp.partition}."
            )
    await rights(request).require(Operation.DESCRIBE, ResourceType.TOPIC, (tp.topic for tp in tps))


@route("POST", INSTANCE + "/positions", summary="Seek to offsets or timestamps")
async def seek(group: str, instance: str, request: Request, state: StateDep) -> Response:
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
    await _check_seek(state, request, group, instance, [*targets, *(tp for tp, _ in by_time)])
    for i, (tp, item) in enumerate(by_time):
        ts = parse_timestamp(item.get("timestamp"), i)
        off = await call(state.reader.offset_for_timestamp, tp.topic, tp.partition, ts)
        if off is None:
            off = (await call(state.coordinator.offsets, tp.topic, tp.partition)).high_watermark
        targets[tp] = off
    await call(state.groups.seek, group, instance, targets)
    state.consumers.served(group, instance).changed()
    return no_content()


async def _seek_edge(
    group: str, instance: str, request: Request, state: AgentState, end: bool
) -> Response:
    tps = parse_partitions(_require(await json_body(request), "partitions"))
    await _check_seek(state, request, group, instance, tps)
    found = await call(state.coordinator.offsets_many, tps)
    targets = {}
    for tp in tps:
        if tp not in found:  # deleted since it was assigned
            raise TopicNotFoundError(f"Topic '{tp.topic}' not found.")
        targets[tp] = found[tp].high_watermark if end else found[tp].log_start
    await call(state.groups.seek, group, instance, targets)
    state.consumers.served(group, instance).changed()
    return no_content()


@route("POST", INSTANCE + "/positions/beginning", summary="Seek to the log-start offset")
async def seek_beginning(group: str, instance: str, request: Request, state: StateDep) -> Response:
    return await _seek_edge(group, instance, request, state, end=False)


@route("POST", INSTANCE + "/positions/end", summary="Seek to the high watermark")
async def seek_end(group: str, instance: str, request: Request, state: StateDep) -> Response:
    return await _seek_edge(group, instance, request, state, end=True)


# -- offsets -------------------------------------------------------------------------------


@route("POST", INSTANCE + "/offsets", summary="Commit offsets")
async def commit_offsets(group: str, instance: str, request: Request, state: StateDep) -> Response:
    """Explicit offsets store ``offset + 1`` (the body names the last consumed record);
    an empty body commits everything fetched so far. 200 ``[]``, as kafka-rest. READ on
    each topic committed (Kafka's OffsetCommit): else 403 40301, and nothing stored."""
    doc = await json_body(request)
    st = await owned(state, request, group, instance)
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
    await rights(request).require(Operation.READ, ResourceType.TOPIC, (tp.topic for tp in commits))
    if commits:
        await call(state.groups.commit_offsets, group, instance, commits, st.generation)
    state.consumers.served(group, instance)
    return v2_json([])


@route("GET", INSTANCE + "/offsets", summary="Committed offsets (GET with a JSON body)")
async def get_offsets(group: str, instance: str, request: Request, state: StateDep) -> Response:
    """``{"offsets": [{"topic", "partition", "offset", "metadata"}]}`` for the partitions
    named in the body; partitions with no committed offset, and those of topics the
    principal may not DESCRIBE (Kafka's OffsetFetch), are left out. No body: 404 40402,
    as kafka-rest."""
    doc = await json_body(request)
    await owned(state, request, group, instance)
    if doc is None or doc.get("partitions") is None:
        raise PartitionNotFoundError("Partition not found.")
    tps = parse_partitions(_require(doc, "partitions"))
    hidden = set(
        await rights(request).denied(Operation.DESCRIBE, ResourceType.TOPIC, (t.topic for t in tps))
    )
    tps = [tp for tp in tps if tp.topic not in hidden]
    committed = await call(state.groups.committed_offsets, group, tps) if tps else {}
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
    ``application/vnd.kafka.v2+json``; ``*/*`` (or no Accept) takes anything;
    ``application/json`` (as Karapace) is answered as ``application/json``.

    Raises:
        ConsumerFormatMismatchError: 406 40601.
    """
    answer = f"application/vnd.kafka.{fmt}.v2+json"
    if not accept:
        return answer
    allowed = {answer, f"application/vnd.kafka.{fmt}+json", f"application/vnd.kafka.{fmt}.v1+json"}
    if fmt == "binary":
        allowed |= {V2_CONTENT_TYPE, "application/vnd.kafka+json"}
    plain = False
    for part in accept.split(","):
        media = _media_type(part)
        if media in allowed or media in _ACCEPT_ANY:
            return answer
        plain = plain or media in _ACCEPT_JSON
    if plain:
        return "application/json"
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
    max_records: int = 0,
    bounds: dict[TopicPartition, PartitionOffsets] | None = None,
    read_committed: bool = False,
) -> tuple[list[ConsumedRecord], dict[TopicPartition, int], int]:
    """Read ``positions`` record by record in turn, until ``max_bytes`` or nothing is left.

    Each partition is read up to its high watermark in ``bounds`` (its topic id and
    offsets as the caller read them; asked for here when None); ``read_committed``: up
    to its last stable offset, leaving out aborted transactions' records. A partition
    read to that end moves its position there, past markers (offsets without records).

    At most ``max_records`` records (0: no limit: an instance's max.poll.records).
    A record that would take the total past ``max_bytes`` is not returned (unless
    it is the first and ``at_least_one``), and no position moves past a record
    that is not returned.

    A partition whose read fails retriably (its metadata shard is down) is skipped; the
    error is raised only when every partition failed.

    Returns:
        (records, next positions, their size in key+value bytes)
    """
    order = list(positions)
    if order:
        k = start % len(order)
        order = order[k:] + order[:k]
    share = max(max_bytes // max(len(order), 1), 1)
    if bounds is None:
        try:
            # Every partition's bounds (topic id, high watermark) in one call; each read
            # serves that topic, up to that high watermark.
            bounds = reader.coordinator.offsets_many(order) if order else {}
        except CoordinatorUnavailableError:
            bounds = {}  # a metadata shard is down: each partition asks for its own
    aborted: dict[TopicPartition, tuple[tuple[int, int, int], ...]] = {}
    if read_committed and order:
        bounds, aborted = _stable(reader, order, positions, bounds)
        # A partition without a last stable offset (its shard is down, or it was
        # deleted) is not read this time: its high watermark alone could pass an
        # undecided transaction.
        order = [tp for tp in order if tp in bounds]
    streams = {
        tp: reader.records(
            tp.topic,
            tp.partition,
            positions[tp],
            bounds=bounds.get(tp),
            read_ahead_bytes=share,
            aborted=aborted.get(tp, ()),
        )
        for tp in order
    }
    out: list[ConsumedRecord] = []
    new = dict(positions)
    size = 0
    active = deque(order)
    unavailable: LakelogError | None = None
    failed: set[TopicPartition] = set()
    while active:
        tp = active.popleft()
        try:
            rec = next(streams[tp], None)
        except LakelogError as e:
            if not e.retriable:
                raise
            # This partition's index is unavailable for now (its metadata shard is down):
            # the others are still served; it stays where it is.
            unavailable = unavailable or e
            failed.add(tp)
            continue
        if rec is None:
            if tp in bounds:  # read to its end: past any marker or gap before it
                new[tp] = max(new[tp], bounds[tp].high_watermark)
            continue
        n = record_size(rec)
        if size + n > max_bytes and (out or not at_least_one):
            break
        out.append(rec)
        size += n
        new[tp] = rec.offset + 1
        if size >= max_bytes or len(out) == max_records:
            break
        active.append(tp)
    if unavailable is not None and len(failed) == len(order):
        raise unavailable  # none could be read: say why rather than answer empty
    return out, new, size


def _stable(
    reader: CachingLogReader,
    order: list[TopicPartition],
    positions: dict[TopicPartition, int],
    bounds: dict[TopicPartition, PartitionOffsets],
) -> tuple[
    dict[TopicPartition, PartitionOffsets], dict[TopicPartition, tuple[tuple[int, int, int], ...]]
]:
    """read_committed bounds (each high watermark cut to the last stable offset) and each
    partition's aborted transactions from its position on, of the partitions whose
    bounds and stable offsets are known."""
    known = [tp for tp in order if tp in bounds]
    txns = cast(TransactionCoordinator, reader.coordinator)
    views = txns.stable_offsets(
        [
            IndexWant(tp.topic, tp.partition, positions[tp], bounds[tp].topic_id or None)
            for tp in known
        ]
    )
    cut = {}
    aborted = {}
    for i, tp in enumerate(known):
        view = views.get(i)
        if view is None:
            continue  # deleted meanwhile: its read says so
        cut[tp] = dataclasses.replace(bounds[tp], high_watermark=view.last_stable)
        aborted[tp] = view.aborted
    return cut, aborted


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _json_value(data: bytes | None, what: str) -> Any:
    # The stored text as it is: a parse + dump would round integers beyond 64 bits.
    return json_fragment(data, what)


def render_records(records: list[ConsumedRecord], fmt: str) -> list[dict[str, Any]]:
    """Records as v2 JSON: binary keys/values base64 (the shape of ``BinaryRecord``), json
    ones embedded.

    Raises:
        UnprocessableRequestError: a json consumer met a key or value that is not JSON.
    """
    if fmt != "json":
        rendered: list[dict[str, Any]] = msgspec.to_builtins(binary_records(records))
        return rendered
    return [
        {
            "topic": r.topic,
            "key": _json_value(r.key, "key"),
            "value": _json_value(r.value, "value"),
            "partition": r.partition,
            "offset": r.offset,
            "timestamp": r.timestamp_ms,
            "headers": [{"key": k, "value": _b64(v)} for k, v in r.headers],
        }
        for r in records
    ]


class BinaryHeader(msgspec.Struct):
    key: str
    value: bytes | None


class BinaryRecord(msgspec.Struct):
    """A record in the v2 consumer's binary shape, fields in its order: msgspec writes its
    bytes as base64 (the standard alphabet, padded) as it writes the JSON, in C, where
    ``render_records`` makes a string of each and a dict of each record first."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    timestamp: int
    headers: list[BinaryHeader]


def binary_records(records: Sequence[ConsumedRecord]) -> list[BinaryRecord]:
    return [
        BinaryRecord(
            r.topic,
            r.key,
            r.value,
            r.partition,
            r.offset,
            r.timestamp_ms,
            [BinaryHeader(k, v) for k, v in r.headers],
        )
        for r in records
    ]


JSON_ENCODER = msgspec.json.Encoder()


def encode_records(records: Sequence[ConsumedRecord], fmt: str) -> bytes:
    """The JSON array of ``render_records``: binary records written by msgspec.

    Raises:
        UnprocessableRequestError: as ``render_records``.
    """
    if fmt == "binary":
        return JSON_ENCODER.encode(binary_records(records))
    return orjson.dumps(render_records(list(records), fmt))


class _Fetch:
    """One ``GET .../records``: its lease on the instance, its reads, its answer.

    Steps: wait for this agent's lock on the instance (a second fetch through this
    agent queues), take the instance's fetch lease in the coordinator (a fetch
    through another agent waits for it, retrying, until its own deadline), read
    and long-poll from the leased positions, confirm before answering that
    neither a seek nor a rebalance moved them (else read again from the new
    ones), then answer with a ``DeliveryResponse`` whose completion stores the new
    positions only if the body got out, and frees the lease and the lock.
    """

    def __init__(
        self, state: AgentState, group: str, instance: str, request: Request, started: float
    ) -> None:
        self.state = state
        self.group = group
        self.instance = instance
        self.started = started
        self.served = state.consumers.served(group, instance)
        self.watch = DisconnectWatch(request.receive)
        self.token: str | None = None
        self.grant = 0
        self.lock: asyncio.Lock | None = None

    def lease_ms(self) -> int:
        return self.state.settings.consumer_fetch_lease_ms

    async def take_lease(self, deadline: float) -> FetchLease:
        """The instance's fetch lease, or (at the deadline, or on a disconnect) a lease
        answer without a token."""
        groups, delay = self.state.groups, 0.02
        token = uuid.uuid4().hex
        while True:
            lease = await call(
                groups.begin_fetch, self.group, self.instance, token, self.lease_ms()
            )
            if lease.token is not None:
                self.token = self.served.token = lease.token
                return lease
            self.state.consume_metrics.fetch_lease_waits.inc()
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.watch.disconnected:
                return lease
            # Another agent's fetch holds it: try again soon (it frees it when done).
            await asyncio.sleep(min(delay, remaining, max(lease.busy_for_s, 0.005)))
            delay = min(delay * 2, 0.25)

    async def _end(self, token: str, positions: dict[TopicPartition, int] | None) -> None:
        """``end_fetch``, sent again after ``END_FETCH_BACKOFF_S`` while the coordinator is
        unavailable. A repeat after an attempt that did store is harmless: the lease is
        gone, and an end under a token no longer held changes nothing."""
        for backoff in (*END_FETCH_BACKOFF_S, None):
            try:
                await call(self.state.groups.end_fetch, self.group, self.instance, token, positions)
                return
            except CoordinatorUnavailableError:
                if backoff is None:
                    raise
                await asyncio.sleep(backoff)

    async def release(self, positions: dict[TopicPartition, int] | None) -> None:
        """Free the lease (storing ``positions`` if given), the budget and the lock."""
        token, self.token = self.token, None
        self.served.token = None
        self.served.wake = None
        try:
            if token is not None:
                await self._end(token, positions)
        except LakelogError as e:
            # The lease lapses by itself; positions not stored are fetched again.
            log.warning("end of fetch on %s/%s failed: %s", self.group, self.instance, e)
        finally:
            await self.state.consumers.budget.release(self.grant)
            self.grant = 0
            lock, self.lock = self.lock, None
            if lock is not None:
                lock.release()


async def _readable(access: Rights, st: ConsumerState) -> dict[TopicPartition, int]:
    """The positions a fetch of ``st`` reads: every assigned partition, but those of topics a
    pattern subscription may not see (no DESCRIBE), once READ is allowed on each topic.

    Raises:
        AuthorizationError: a topic it may not READ (403 40301: Kafka's
            TOPIC_AUTHORIZATION_FAILED); NoOffsetError: a partition without a committed
            offset under policy none.
    """
    topics = {tp.topic for tp in st.assignment}
    if st.pattern is not None:
        topics -= set(await access.denied(Operation.DESCRIBE, ResourceType.TOPIC, topics))
    await access.require(Operation.READ, ResourceType.TOPIC, topics)
    for tp in st.unresolved:
        if tp.topic in topics:
            raise NoOffsetError(
                f"No committed offset for partition {tp.topic}-{tp.partition} and "
                "auto.offset.reset is none: seek first."
            )
    return {tp: off for tp, off in st.positions.items() if tp.topic in topics}


def fetch_limit(state: AgentState, max_bytes: int | None) -> int:
    """Key+value bytes a fetch may return: its ``max_bytes``, at most (and by default) the
    agent's ``consumer_request_max_bytes``, as kafka-rest's consumer.request.max.bytes
    caps what a client asks for."""
    cap = state.settings.consumer_request_max_bytes
    return cap if max_bytes is None or max_bytes <= 0 else min(max_bytes, cap)


@route("GET", INSTANCE + "/records", summary="Fetch records (long-polls up to timeout)")
async def fetch_records(
    group: str,
    instance: str,
    request: Request,
    state: StateDep,
    wait: int | None = Query(None, alias="timeout", description="Long-poll at most this many ms."),
    max_bytes: int | None = Query(None, description="Key+value bytes to return at most."),
) -> Response:
    """An array of records in the instance's format, possibly ``[]`` after ``timeout`` ms.

    Positions move only for an answer the client received: a client that hung up
    first gets the same records from its next fetch.
    """
    principal = principal_of(request.scope)
    known = state.consumers.owner_of(group, instance)
    if known != principal:  # not yet checked on this agent (the lease's state says again)
        await owned(state, request, group, instance, touch=False)
    f = _Fetch(state, group, instance, request, time.monotonic())
    f.served.owner = principal
    f.watch.start()
    try:
        return await _fetch(f, request, wait, max_bytes)
    except BaseException:
        await f.watch.stop()
        await f.release(None)
        raise


async def _fetch(f: _Fetch, request: Request, wait: int | None, max_bytes: int | None) -> Response:
    state, settings = f.state, f.state.settings
    accept = request.headers.get("accept")

    def deadline_for(st: ConsumerState | None) -> float:
        if wait is not None and wait >= 0:
            wait_ms = wait
        elif st is not None:
            wait_ms = st.config.request_timeout_ms
        else:
            wait_ms = f.served.request_timeout_ms or ConsumerConfig().request_timeout_ms
        return f.started + min(wait_ms, settings.consumer_max_wait_ms) / 1000

    # One fetch of an instance at a time through this agent.
    # At most: the longest wait, a lease without renewal, and 5 minutes to send the answer.
    hold_s = (settings.consumer_max_wait_ms + settings.consumer_fetch_lease_ms) / 1000 + 300
    f.lock = await f.served.acquire(deadline_for(None) - time.monotonic(), hold_s)
    if f.lock is None:
        state.consume_metrics.fetch_lease_waits.inc()
        st = await call(state.groups.consumer, f.group, f.instance)
        await f.watch.stop()
        return v2_json([], media_type=check_records_accept(accept, st.config.format))

    lease = await f.take_lease(deadline_for(None))
    st = lease.state
    access = rights(request)
    check_owner(st, access.principal)  # the instance may have been made again since
    f.served.request_timeout_ms = st.config.request_timeout_ms
    media_type = check_records_accept(accept, st.config.format)
    deadline = deadline_for(st)

    async def empty() -> Response:
        await f.release(None)
        await f.watch.stop()
        state.consume_metrics.fetch_seconds.observe(time.monotonic() - f.started)
        return v2_json([], media_type=media_type)

    if lease.token is None:  # another fetch held the instance until our deadline
        return await empty()
    positions = await _readable(access, st)
    limit = fetch_limit(state, max_bytes)
    f.grant = await state.consumers.budget.acquire(
        limit, FETCH_MIN_GRANT, deadline - time.monotonic()
    )
    if f.grant == 0:  # every byte of the budget stayed taken until our deadline
        return await empty()
    while True:
        records, start, new = await _read(f, st, positions, f.grant, deadline)
        if f.watch.disconnected:
            state.consume_metrics.fetches_undelivered.inc()
            return await empty()
        if not records and not f.served.moved:
            return await empty()  # the deadline passed with nothing to answer
        # Again before answering: a READ revoked during a long poll answers nothing.
        await access.require(Operation.READ, ResourceType.TOPIC, {r.topic for r in records})
        f.served.moved = False
        assert f.token is not None
        lease = await call(
            state.groups.confirm_fetch, f.group, f.instance, f.token, start, f.lease_ms()
        )
        if lease.ok and lease.token is not None and records:
            break
        # A seek or a rebalance moved the positions: what was read is not answered.
        state.consume_metrics.fetch_rereads.inc()
        if lease.token is None:  # the seek revoked our lease: take it again
            f.token = f.served.token = None
            lease = await f.take_lease(deadline)
            if lease.token is None:
                return await empty()
        if time.monotonic() >= deadline:
            return await empty()
        st = lease.state
        positions = await _readable(access, st)

    # Rendering and JSON of a big answer (up to 64 MiB) run off the event loop. A 422
    # here (a key or value its format cannot render) moves no position.
    size = sum(record_size(r) for r in records)
    if st.config.format in SCHEMA_TYPE_OF_FORMAT:
        rendered = await render_schema_records(state.registry, records, st.config.format)
        body = orjson.dumps(rendered)
    elif size >= RENDER_INLINE_BYTES:
        body = await run(Kind.CPU, encode_records, records, st.config.format)
    else:
        body = encode_records(records, st.config.format)
    moved = {tp: new[tp] for tp in start}
    count = len(records)
    del records
    metrics = state.consume_metrics

    async def done(delivered: bool) -> None:
        if delivered:
            metrics.consumed_records.inc(count)
            metrics.consumed_bytes.inc(size)
        else:
            metrics.fetches_undelivered.inc()
        metrics.fetch_seconds.observe(time.monotonic() - f.started)
        await f.release(moved if delivered else None)

    return DeliveryResponse(body, media_type, f.watch, done)


async def _read(
    f: _Fetch,
    st: ConsumerState,
    positions: dict[TopicPartition, int],
    limit: int,
    deadline: float,
) -> tuple[list[ConsumedRecord], dict[TopicPartition, int], dict[TopicPartition, int]]:
    """Read from ``positions``, long-polling until ``deadline`` for data (or for
    ``fetch.min.bytes``), a disconnect, or a change made through this agent.

    Returns:
        (records, the start positions of the partitions read from, the new positions)
    """
    state = f.state
    # Topic ids key the wake-ups; a topic deleted meanwhile is skipped.
    ids: dict[TopicPartition, PartitionKey] = {}
    for tp in list(positions):
        try:
            info = await state.topics.get(tp.topic)
        except TopicNotFoundError:
            del positions[tp]
            continue
        ids[tp] = (info.topic_id, tp.partition)
    start = dict(positions)
    watches = {ids[tp]: (tp.topic, off) for tp, off in positions.items()}
    records: list[ConsumedRecord] = []
    size = 0
    first = random.randrange(1 << 30)
    min_bytes = st.config.fetch_min_bytes
    max_records = st.config.max_poll_records
    with state.notifier.watch(watches) as waiter:
        f.served.wake = waiter.event.set
        f.watch.callbacks.append(waiter.event.set)
        try:
            while True:
                batch, positions, got = await run(
                    Kind.READ,
                    read_round_robin,
                    state.reader,
                    positions,
                    limit - size,
                    at_least_one=not records,
                    start=first,
                    max_records=max_records - len(records) if max_records else 0,
                    read_committed=st.config.isolation_level == "read_committed",
                )
                records += batch
                size += got
                for tp, off in positions.items():
                    waiter.update(ids[tp], off)
                if size >= limit or (records and size >= min_bytes):
                    break
                if max_records and len(records) >= max_records:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0 or f.watch.disconnected or f.served.moved:
                    break
                with state.consume_metrics.fetches_waiting.track_inprogress():
                    await state.notifier.wait(waiter, remaining)
        finally:
            f.served.wake = None
            f.watch.callbacks.remove(waiter.event.set)
    read_from = {tp: off for tp, off in start.items() if positions[tp] != off}
    return records, read_from, positions
