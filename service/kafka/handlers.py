"""One async handler per Kafka API, each a thin layer over the agent's core.

A handler takes the connection's :class:`KafkaContext` and a decoded request and
returns the response body (a kio type), or a :class:`Deferred` whose task yields it
later (Produce: the connection reads the next request while a flush is pending;
answers still leave in request order), or None for no answer (acks=0).

The domain objects are the ones REST routes use, held by ``service.state.AgentState``:
the shared batcher, the caching reader, the notifier, the topic cache and the
coordinator client. Errors map to codes through ``service.kafka.errors`` only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import takewhile
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from coordinator.client import ChunkRef, IndexWant, PartitionOffsets, TopicInfo, TopicPartition
from coordinator.log.producers import ProducerBatch
from coordinator.log.topic_configs import (
    compacted,
    keyless_refused,
    log_append_time,
    max_decompressed_bytes,
    max_message_bytes,
)
from index.log import PartitionWant, decode_entry
from segments.batches import (
    BatchInfo,
    Pieces,
    check_batches,
    compressed,
    control_batch,
    encode_records,
    fetch_batches,
)
from segments.errors import (
    CoordinatorUnavailableError,
    InvalidRecordError,
    LakelogError,
    PartitionNotFoundError,
    TopicNotFoundError,
)
from segments.types import ConsumedRecord
from service.executors import Kind, call, run
from service.kafka.acl import CLUSTER_DENIED, TOPIC_DENIED, TRANSACTIONAL_ID_DENIED, Access
from service.kafka.errors import code_for
from service.kafka.framing import Request, build, millis, nested
from service.produce.batcher import PartlyCommittedError, RawBatch
from service.produce.idempotence import Admission, ProducerGate, Ticket
from service.security.quotas import FETCH, PRODUCE
from service.state import AgentState
from service.v3.common import broker_max_age_s

if TYPE_CHECKING:
    from service.security.acl import AclCache

#: How long the live-broker list behind Metadata answers is reused.
BROKERS_TTL_S = 1.0
#: Leader epoch reported for every partition: leadership is only a routing hint here.
LEADER_EPOCH = 0
#: ListOffsets special timestamps: v7 max timestamp (KIP-734), v8 earliest local
#: (KIP-405); v9's latest tiered (-5) and v11's earliest pending upload (-6) are the
#: other negatives (see ``_offset_for``).
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL = -1, -2, -3, -4
#: Fetch and ListOffsets isolation levels (0: read_uncommitted, the default).
READ_COMMITTED = 1


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int


@dataclass
class _BrokerList:
    """The live-broker list, shared by every connection of one listener."""

    at: float = 0.0
    brokers: list[Broker] = field(default_factory=list)


@dataclass
class KafkaContext:
    """What every handler of one agent shares: the agent's state, its own address and,
    with authorization on, its ACL cache (the REST door's).

    ``host``/``port``: where clients are told to reach this agent (Metadata,
    FindCoordinator, DescribeCluster). Unless an address is advertised, each connection
    gets a context of its own (:meth:`at`) whose address is the one that connection
    reached: a client that got here can come back the same way, from this machine,
    another one or a container, with nothing configured.
    """

    state: AgentState
    host: str
    port: int
    acl: AclCache | None = None
    _brokers: _BrokerList = field(default_factory=_BrokerList)
    gate: ProducerGate = field(init=False)

    def __post_init__(self) -> None:
        self.gate = self.state.gate

    def at(self, host: str, port: int) -> KafkaContext:
        """This context for a connection that reached the agent at ``host:port`` (the
        broker list's cache stays shared)."""
        return dataclasses.replace(self, host=host, port=port, _brokers=self._brokers)

    async def brokers(self) -> list[Broker]:
        """Live agents with a Kafka listener, by node id; this agent always among them,
        at the address this context advertises."""
        cache = self._brokers
        if time.monotonic() - cache.at >= BROKERS_TTL_S or not cache.brokers:
            agents = await call(self.state.coordinator.list_agents, broker_max_age_s(self.state))
            cache.brokers = [
                Broker(a.broker_id, a.kafka_host, a.kafka_port) for a in agents if a.kafka_port
            ]
            cache.at = time.monotonic()
        me = self.state.broker_id
        brokers = [b for b in cache.brokers if b.node_id != me]
        if me >= 0:
            brokers.append(Broker(me, self.host, self.port))
            brokers.sort(key=lambda b: b.node_id)
        return brokers


class Deferred:
    """A response that a task produces later; None from it means "no response"."""

    __slots__ = ("task",)

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task


Handler = Callable[[KafkaContext, Request, Access], Awaitable[Any]]


def leader_for(brokers: list[Broker], topic: str, partition: int) -> int:
    """The partition's leader: rendezvous hashing over the live brokers.

    Stable while the broker set is, and a broker's death moves only its own partitions.
    Any agent accepts any partition; the leader only spreads clients over agents.
    """
    if not brokers:
        return -1
    key = f"{topic}\0{partition}\0".encode()
    return max(brokers, key=lambda b: zlib.crc32(key + b.node_id.to_bytes(4, "big"))).node_id


def partition_entries(
    part_cls: type, brokers: list[Broker], topic: str, partitions: range
) -> tuple[Any, ...]:
    """Metadata's and DescribeTopicPartitions' entries of ``partitions``: each led by
    ``leader_for``, its only replica and in-sync replica."""
    return tuple(
        build(
            part_cls,
            error_code=0,
            partition_index=p,
            leader_id=(leader := leader_for(brokers, topic, p)),
            leader_epoch=LEADER_EPOCH,
            replica_nodes=(leader,),
            isr_nodes=(leader,),
            eligible_leader_replicas=(),
            last_known_elr=(),
            offline_replicas=(),
        )
        for p in partitions
    )


# -- ApiVersions -------------------------------------------------------------------------


async def api_versions(ctx: KafkaContext, req: Request, access: Access) -> Any:
    return api_versions_response(type(req.body), ErrorCode.none)


def api_versions_response(request_cls: type, error: ErrorCode) -> Any:
    from service.kafka.server import SUPPORTED  # the table lives with the dispatcher

    resp = response_cls(request_cls)
    version_cls = nested(resp, "ApiVersion")
    keys = tuple(
        build(version_cls, api_key=k, min_version=lo, max_version=hi)
        for k, (lo, hi) in sorted(SUPPORTED.items())
    )
    return build(
        resp,
        error_code=error,
        api_keys=keys,
        throttle_time=0,
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )


def response_cls(request_cls: type) -> type:
    """kio's response type answering ``request_cls``."""
    from kio.index import load_response_from_request

    return load_response_from_request(request_cls)


# -- topics named by name or by id ------------------------------------------------------

#: How a request names a topic: its name (older versions) or its id (KIP-516 versions).
TopicKey = str | uuid.UUID


@dataclass(frozen=True, slots=True)
class NamedTopic:
    """A topic a request named, resolved: ``info`` None with the ``error`` to answer."""

    key: TopicKey
    info: TopicInfo | None
    error: ErrorCode = ErrorCode.none
    message: str | None = None

    @property
    def name(self) -> str | None:
        """Its name: the one asked for, else the found topic's (None: an unknown id)."""
        if isinstance(self.key, str):
            return self.key
        return self.info.name if self.info is not None else None

    @property
    def topic_id(self) -> uuid.UUID | None:
        if isinstance(self.key, uuid.UUID):
            return self.key
        return uuid.UUID(bytes=self.info.topic_id) if self.info is not None else None


def topic_key(entry: Any, name_field: str = "name") -> TopicKey:
    """The topic a request entry names: its ``topic_id`` in topic-id versions (KIP-516),
    else its name (field ``name_field``)."""
    name = getattr(entry, name_field, None)
    if name is None and getattr(entry, "topic_id", None) is not None:
        return uuid.UUID(str(entry.topic_id))
    return str(name or "")


async def resolve_topic(
    ctx: KafkaContext, key: TopicKey, allowed: Callable[[str], bool]
) -> NamedTopic:
    """The topic ``key`` names, if the principal may use it (``allowed``, by name).

    An id no topic has is UNKNOWN_TOPIC_ID (a topic deleted and created again has a new
    id, so the old one is unknown); a name, UNKNOWN_TOPIC_OR_PARTITION. A topic the
    principal may not use is TOPIC_AUTHORIZATION_FAILED, whether it exists or not.
    """
    if isinstance(key, uuid.UUID):
        try:
            info = await ctx.state.topics.by_id(key.bytes)
        except TopicNotFoundError:
            return NamedTopic(key, None, ErrorCode.unknown_topic_id)
        except LakelogError as e:
            return NamedTopic(key, None, code_for(e), e.message)
        if not allowed(info.name):
            return NamedTopic(key, None, TOPIC_DENIED)
        return NamedTopic(key, info)
    if not allowed(key):
        return NamedTopic(key, None, TOPIC_DENIED)
    try:
        return NamedTopic(key, await ctx.state.topics.get(key))
    except LakelogError as e:
        return NamedTopic(key, None, code_for(e), e.message)


def topic_fields(key: TopicKey, info: TopicInfo | None = None) -> dict[str, Any]:
    """The name and id fields of a topic's answer entry (``build`` keeps those its
    version has): the name asked for or found, the id asked for or found."""
    t = NamedTopic(key, info)
    return {"name": t.name, "topic": t.name, "topic_id": t.topic_id}


def topic_entry(
    topic_cls: type, key: TopicKey, info: TopicInfo | None, error: int, parts: tuple[Any, ...]
) -> Any:
    """Metadata's and DescribeTopicPartitions' entry of one topic and its ``parts``."""
    fields = topic_fields(key, info)
    if info is None and isinstance(key, uuid.UUID):
        fields["name"] = None  # Kafka names no topic for an unknown id
    return build(
        topic_cls,
        error_code=error,
        **fields,
        is_internal=False,
        partitions=parts,
        topic_authorized_operations=-(2**31),
    )


# -- Metadata ----------------------------------------------------------------------------


async def metadata(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Brokers and topics: all those the principal may DESCRIBE, or the ones named, by
    name or by id (those it may not DESCRIBE, or may not create when missing, get
    TOPIC_AUTHORIZATION_FAILED; an unknown id UNKNOWN_TOPIC_ID)."""
    body = req.body
    resp = response_cls(type(body))
    st = ctx.state
    brokers = await ctx.brokers()
    topics: list[tuple[TopicKey, TopicInfo | None, ErrorCode]] = []
    if body.topics is None:
        listed = await call(st.coordinator.list_topics)
        topics = [(t.name, t, ErrorCode.none) for t in listed if access.topic(t.name)]
    else:
        auto = bool(getattr(body, "allow_auto_topic_creation", True)) and st.topics.auto_create
        for t in body.topics:
            key = topic_key(t)
            if isinstance(key, uuid.UUID):
                found = await resolve_topic(ctx, key, access.topic)
                topics.append((key, found.info, found.error))
                continue
            name = key
            if not access.topic(name):
                topics.append((name, None, TOPIC_DENIED))
                continue
            try:
                info: TopicInfo | None
                try:
                    info = await st.topics.get(name)
                except TopicNotFoundError:
                    if not auto:
                        raise
                    if not access.may_create(name):
                        topics.append((name, None, TOPIC_DENIED))
                        continue
                    info = await st.topics.get_or_create(name)
                topics.append((name, info, ErrorCode.none))
            except LakelogError as e:
                topics.append((name, None, code_for(e)))
    topic_cls, part_cls = (
        nested(resp, "MetadataResponseTopic"),
        nested(resp, "MetadataResponsePartition"),
    )
    out = []
    for key, info, error in topics:
        parts = ()
        if info is not None:
            parts = partition_entries(part_cls, brokers, info.name, range(info.partitions))
        out.append(topic_entry(topic_cls, key, info, error, parts))
    broker_cls = nested(resp, "MetadataResponseBroker")
    return build(
        resp,
        throttle_time=0,
        error_code=0,
        brokers=tuple(
            build(broker_cls, node_id=b.node_id, host=b.host, port=b.port) for b in brokers
        ),
        cluster_id=st.cluster_id,
        controller_id=brokers[0].node_id if brokers else -1,
        topics=tuple(out),
        cluster_authorized_operations=-(2**31),
    )


#: A partition of a topic as the request named it.
_KeyPartition = tuple[TopicKey, int]


# -- Produce -----------------------------------------------------------------------------


async def produce(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Check every partition's batches, append the good ones to the shared batcher.

    Transactional batches need WRITE on the request's transactional id: without it
    every partition gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka answers; they
    reach the commit marked so (``RawBatch.transactional``), which refuses those of a
    partition their transaction did not add (INVALID_TXN_STATE).

    A partition of a topic the principal may not WRITE, an unknown topic or partition,
    a corrupt batch, a batch over ``max.message.bytes`` (as stored) or whose records
    decompress to more than ``lakelog.max.decompressed.bytes`` (MESSAGE_TOO_LARGE) gets its
    error and stores nothing; the others are appended in one call, so they share a flush. The answer
    waits for that flush's commit (acks 1 and all alike: an ack means committed); with
    acks=0 there is none.
    """
    body = req.body
    resp = response_cls(type(body))
    errors: dict[_KeyPartition, tuple[ErrorCode, str | None]] = {}
    order: list[_KeyPartition] = []
    raws: list[RawBatch] = []
    firsts: dict[_KeyPartition, int] = {}  # partition -> index of its first batch in raws
    checked: dict[_KeyPartition, tuple[bytes, memoryview, list[BatchInfo]]] = {}
    to_check: list[tuple[_KeyPartition, TopicInfo, bytes | None]] = []
    for td in body.topic_data:
        named = await resolve_topic(ctx, topic_key(td), access.topic)
        topic = named.info
        error = (named.error, named.message)
        for pd in td.partition_data:
            tp = (named.key, pd.index)
            order.append(tp)
            if topic is None:
                errors[tp] = error
                continue
            if not 0 <= pd.index < topic.partitions:
                errors[tp] = (ErrorCode.unknown_topic_or_partition, None)
                continue
            to_check.append((tp, topic, pd.records))
    # Decompressing to check records is CPU work (up to lakelog.max.decompressed.bytes a
    # batch): off the event loop unless the request is small and uncompressed.
    size = sum(len(pd.records or b"") for td in body.topic_data for pd in td.partition_data)
    offload = size >= ctx.state.settings.offload_parse_bytes or any(
        compressed(records) for _, _, records in to_check if records
    )
    results = await run(Kind.CPU, _check_all, to_check) if offload else _check_all(to_check)
    stamped: set[_KeyPartition] = set()  # LogAppendTime topics: the flush stamps them
    for (tp, topic, records), problem in zip(to_check, results, strict=True):
        if isinstance(problem, tuple):
            errors[tp] = problem
            continue
        assert records is not None
        checked[tp] = (topic.topic_id, memoryview(records), problem)
        if log_append_time(topic):
            stamped.add(tp)
    ctx.state.metrics.produce_requests.labels(api="kafka").inc()
    throttle_ms = ctx.state.quotas.kafka_throttle_ms(
        req.header.client_id, PRODUCE, size, access.principal
    )
    if any(b.transactional for _, _, infos in checked.values() for b in infos):
        # Kafka: transactional batches need WRITE on the request's transactional id (and
        # one named at all); else the whole request fails with it, storing nothing.
        tid = getattr(body, "transactional_id", None)
        if tid is None or not access.transactional_id(tid):
            errors = dict.fromkeys(order, (TRANSACTIONAL_ID_DENIED, None))
            checked = {}
    tickets, duplicates = await _admit_idempotent(ctx, checked, errors)
    for tp, (topic_id, view, infos) in checked.items():
        if tp in errors or tp in duplicates:
            continue
        firsts[tp] = len(raws)
        raws.extend(
            RawBatch(
                topic_id,
                tp[1],
                view[b.position : b.position + b.length],
                b.record_count,
                b.min_timestamp_ms,
                b.max_timestamp_ms,
                (b.producer_id, b.producer_epoch, b.base_sequence) if b.idempotent else None,
                log_append_time=tp in stamped,
                transactional=b.transactional,
            )
            for b in infos
        )

    async def finish() -> Any:
        bases: Sequence[int | None] = []
        failure: tuple[ErrorCode, str | None] | None = None
        append_time_ms = -1
        try:
            if raws:
                offsets = await ctx.state.batcher.append_batches(raws)
                bases, append_time_ms = offsets, offsets.append_time_ms
        except PartlyCommittedError as e:  # some partitions' shard failed: only they fail
            bases, append_time_ms = e.offsets, e.append_time_ms
            for tp, i in firsts.items():
                if (error := e.errors[i]) is not None:
                    errors[tp] = (code_for(error), error.message)
        except LakelogError as e:
            failure = (code_for(e), e.message)
            if isinstance(e, TopicNotFoundError):  # deleted (and made again?) meanwhile
                ctx.state.topics.invalidate_all()
        finally:
            for ticket in tickets:
                ctx.gate.release(ticket)
        if body.acks == 0:
            return None
        # Kafka answers the append time for LogAppendTime topics, -1 otherwise (and for
        # a duplicate, whose first append time is not kept).
        stamps = dict.fromkeys(stamped, append_time_ms)
        return _produce_response(
            resp, order, errors, firsts, bases, failure, duplicates, throttle_ms, stamps
        )

    return Deferred(asyncio.get_running_loop().create_task(finish()))


async def _admit_idempotent(
    ctx: KafkaContext,
    checked: dict[_KeyPartition, tuple[bytes, memoryview, list[BatchInfo]]],
    errors: dict[_KeyPartition, tuple[ErrorCode, str | None]],
) -> tuple[list[Ticket], dict[_KeyPartition, int]]:
    """Idempotent partitions through the agent's ProducerGate: the tickets of those to
    append, the offsets of duplicates; refusals go into ``errors``."""
    wanted: list[_KeyPartition] = []
    requests: list[tuple[bytes, int, list[ProducerBatch]]] = []
    for tp, (topic_id, _, infos) in checked.items():
        if not any(b.idempotent for b in infos):
            continue
        if len({(b.producer_id, b.producer_epoch) for b in infos}) != 1:
            errors[tp] = (ErrorCode.invalid_record, "Batches of one producer epoch only.")
            continue
        wanted.append(tp)
        requests.append(
            (
                topic_id,
                tp[1],
                [
                    ProducerBatch(
                        b.producer_id,
                        b.producer_epoch,
                        b.base_sequence,
                        b.record_count,
                        transactional=b.transactional,
                    )
                    for b in infos
                ],
            )
        )
    tickets: list[Ticket] = []
    duplicates: dict[_KeyPartition, int] = {}
    if not requests:
        return tickets, duplicates
    try:
        decisions = await ctx.gate.admit(requests)
    except LakelogError as e:
        for tp in wanted:
            errors[tp] = (code_for(e), e.message)
        return tickets, duplicates
    for tp, d in zip(wanted, decisions, strict=True):
        if d.admission is Admission.APPEND and d.ticket is not None:
            tickets.append(d.ticket)
        elif d.admission is Admission.DUPLICATE:
            duplicates[tp] = d.offset
        else:
            errors[tp] = (_REFUSED[d.admission], None)
    return tickets, duplicates


_REFUSED = {
    Admission.FENCED: ErrorCode.invalid_producer_epoch,
    Admission.OUT_OF_ORDER: ErrorCode.out_of_order_sequence_number,
    # A retry of a batch this agent is still writing: try again once it is committed.
    Admission.IN_FLIGHT: ErrorCode.request_timed_out,
}


def _check_all(
    partitions: list[tuple[_KeyPartition, TopicInfo, bytes | None]],
) -> list[list[Any] | tuple[ErrorCode, str | None]]:
    """:func:`_check_partition` of each partition against its topic's limits."""
    return [_check_partition(records, topic, tp[1]) for tp, topic, records in partitions]


def _check_partition(
    records: bytes | None, topic: TopicInfo, partition: int
) -> list[Any] | tuple[ErrorCode, str | None]:
    """The checked batches of one partition, or its (error code, message): its topic's
    size limits, and keys on a compacted topic (as Kafka: INVALID_RECORD)."""
    if not records:
        return ErrorCode.corrupt_message, "The record set is empty."
    limit = max_message_bytes(topic)
    try:
        infos = check_batches(
            records, max_decompressed_bytes(topic), keys_required=compacted(topic)
        )
    except InvalidRecordError:
        refused = keyless_refused(topic, partition)
        return code_for(refused), refused.message
    except LakelogError as e:
        return code_for(e), e.message
    for info in infos:
        if info.length > limit:
            return (
                ErrorCode.message_too_large,
                f"A batch of {info.length} bytes is over max.message.bytes ({limit}).",
            )
    return infos


def _produce_response(
    resp: type,
    order: list[_KeyPartition],
    errors: dict[_KeyPartition, tuple[ErrorCode, str | None]],
    firsts: dict[_KeyPartition, int],
    bases: Sequence[int | None],
    failure: tuple[ErrorCode, str | None] | None,
    duplicates: dict[_KeyPartition, int],
    throttle_ms: int = 0,
    append_times: dict[_KeyPartition, int] | None = None,
) -> Any:
    """``append_times``: the partitions of LogAppendTime topics and their append time."""
    part_cls = nested(resp, "PartitionProduceResponse")
    by_topic: dict[TopicKey, list[Any]] = {}
    for tp in order:
        error = errors.get(tp)
        if error is None and failure is not None and tp not in duplicates:
            error = failure
        found = duplicates.get(tp)
        if error is None and found is None:
            found = bases[firsts[tp]]
        base = -1 if error is not None or found is None else found
        code, message = error if error is not None else (ErrorCode.none, None)
        by_topic.setdefault(tp[0], []).append(
            build(
                part_cls,
                index=tp[1],
                error_code=code,
                base_offset=base,
                log_append_time=-1
                if error is not None or tp in duplicates
                else (append_times or {}).get(tp, -1),
                log_start_offset=-1,
                record_errors=(),
                error_message=message,
            )
        )
    topic_cls = nested(resp, "TopicProduceResponse")
    return build(
        resp,
        responses=tuple(
            build(topic_cls, **topic_fields(key), partition_responses=tuple(parts))
            for key, parts in by_topic.items()
        ),
        throttle_time=throttle_ms,
    )


# -- InitProducerId ----------------------------------------------------------------------


async def init_producer_id(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """A new producer id at epoch 0 from the coordinator, or a transactional id's producer.

    Without a transactional id the producer id and epoch the request carries are ignored,
    as Kafka's broker ignores them: an idempotent producer that asks again (after a
    sequence error, or on a restart with the ids it had) gets a new id, never
    INVALID_PRODUCER_EPOCH. A transactional id's producer is bumped to its next epoch,
    fencing older instances (``service.kafka.transactions.init_transactional``); v6's
    two-phase commit (KIP-939, ``enable2_pc``) is refused with INVALID_REQUEST.
    """
    body = req.body
    resp = response_cls(type(body))
    denied = None
    if body.transactional_id is not None:
        if not access.transactional_id(body.transactional_id):
            denied = TRANSACTIONAL_ID_DENIED
    elif not (access.cluster() or access.any_topic()):
        denied = CLUSTER_DENIED
    if denied is not None:
        return build(resp, throttle_time=0, error_code=denied, producer_id=-1, producer_epoch=-1)
    if body.transactional_id is not None:
        from service.kafka.transactions import init_transactional  # it imports this module

        if getattr(body, "enable2_pc", False):
            code, pid, epoch = ErrorCode.invalid_request, -1, -1
        else:
            code, pid, epoch = await init_transactional(
                ctx, body.transactional_id, body, req.header.api_version
            )
        return build(resp, throttle_time=0, error_code=code, producer_id=pid, producer_epoch=epoch)
    try:
        pid, epoch = await call(ctx.state.coordinator.init_producer_id)
    except LakelogError as e:
        return build(
            resp, throttle_time=0, error_code=code_for(e), producer_id=-1, producer_epoch=-1
        )
    return build(resp, throttle_time=0, error_code=0, producer_id=pid, producer_epoch=epoch)


# -- Fetch -------------------------------------------------------------------------------


@dataclass
class _PartitionRead:
    error: ErrorCode = ErrorCode.none
    high_watermark: int = -1
    log_start: int = -1
    records: Pieces = field(default_factory=Pieces)
    #: read_committed: the last stable offset and the aborted transactions (producer
    #: id, first offset) in the range read; None under read_uncommitted.
    last_stable: int | None = None
    aborted: tuple[tuple[int, int, int], ...] = ()


async def fetch(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Batches from each partition's offset, long-polling until ``min_bytes`` or ``max_wait``.

    The answer holds at most ``max_bytes`` of batches, capped by the agent's
    ``kafka_fetch_max_bytes`` (Kafka's fetch.max.bytes), each partition at most its
    ``partition_max_bytes``.

    Stored batches go out as they are, base offsets patched; tiered rows are encoded
    as batches. At least one batch is returned when the first non-empty partition's
    first batch is over the limits (KIP-74). Commits wake the wait (``service.consume.notify``).
    """
    body = req.body
    st = ctx.state
    # (topic, partition, offset, partition max bytes, the topic id a request by id named)
    wanted: list[tuple[str, int, int, int, bytes | None]] = []
    keys: list[_KeyPartition] = []  # the request's name for each of ``wanted``
    unknown: dict[_KeyPartition, ErrorCode] = {}
    watches: dict[tuple[bytes, int], tuple[str, int]] = {}
    for t in body.topics:
        named = await resolve_topic(ctx, topic_key(t, "topic"), access.topic)
        info = named.info
        for p in t.partitions:
            if info is None or not 0 <= p.partition < info.partitions:
                unknown[(named.key, p.partition)] = (
                    named.error if info is None else ErrorCode.unknown_topic_or_partition
                )
                continue
            by_id = info.topic_id if isinstance(named.key, uuid.UUID) else None
            wanted.append((info.name, p.partition, p.fetch_offset, p.partition_max_bytes, by_id))
            keys.append((named.key, p.partition))
            watches[(info.topic_id, p.partition)] = (info.name, p.fetch_offset)
    read_committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
    max_wait_s = max(0, millis(body.max_wait)) / 1000
    deadline = time.monotonic() + max_wait_s
    # The agent's fetch.max.bytes caps what the request asks for (partitions' limits too).
    max_bytes = max(0, min(body.max_bytes, st.settings.kafka_fetch_max_bytes))
    min_bytes = min(body.min_bytes, max_bytes)
    with st.notifier.watch(watches) as waiter:
        while True:
            reads = await run(Kind.READ, _read_partitions, st, wanted, max_bytes, read_committed)
            total = sum(len(r.records) for r in reads)
            remaining = deadline - time.monotonic()
            failed = unknown or any(r.error != ErrorCode.none for r in reads)
            if total >= min_bytes or failed or remaining <= 0:
                break
            await st.notifier.wait(waiter, remaining)
    resp = response_cls(type(body))
    part_cls, topic_cls = nested(resp, "PartitionData"), nested(resp, "FetchableTopicResponse")
    aborted_cls = nested(resp, "AbortedTransaction")
    by_topic: dict[TopicKey, list[Any]] = {}
    results = dict(zip(keys, reads, strict=True))
    for t in body.topics:
        key = topic_key(t, "topic")
        for p in t.partitions:
            tp = (key, p.partition)
            r = results.get(tp) or _PartitionRead(error=unknown[tp])
            by_topic.setdefault(key, []).append(
                build(
                    part_cls,
                    partition_index=p.partition,
                    error_code=r.error,
                    high_watermark=r.high_watermark,
                    last_stable_offset=r.high_watermark if r.last_stable is None else r.last_stable,
                    log_start_offset=r.log_start,
                    aborted_transactions=None
                    if r.last_stable is None
                    else tuple(
                        build(aborted_cls, producer_id=pid, first_offset=first)
                        for pid, first, _ in r.aborted
                    ),
                    preferred_read_replica=-1,
                    records=r.records,  # written as is: no copy
                )
            )
    size = sum(len(r.records or b"") for r in reads)
    throttle_ms = st.quotas.kafka_throttle_ms(req.header.client_id, FETCH, size, access.principal)
    return build(
        resp,
        throttle_time=throttle_ms,
        error_code=0,
        session_id=0,
        responses=tuple(
            build(topic_cls, **topic_fields(key), partitions=tuple(parts))
            for key, parts in by_topic.items()
        ),
    )


def _offsets_or_none(st: AgentState, tp: TopicPartition) -> PartitionOffsets | None:
    """One partition's offsets; None for an unknown topic or partition (other errors,
    such as its metadata shard being down, are raised)."""
    try:
        return st.coordinator.offsets(tp.topic, tp.partition)
    except (TopicNotFoundError, PartitionNotFoundError):
        return None


def _read_partitions(
    st: AgentState,
    wanted: list[tuple[str, int, int, int, bytes | None]],
    max_bytes: int,
    read_committed: bool = False,
) -> list[_PartitionRead]:
    """One pass over the fetched partitions (worker thread): offsets, then batches.

    A partition asked for by topic id (Fetch v13+) whose name now belongs to another
    topic (deleted and created again since the agent's metadata was read) answers
    UNKNOWN_TOPIC_ID: the log it named is gone.

    ``read_committed``: each partition is read up to its last stable offset, and its
    answer names the aborted transactions in the range (the client drops their records
    when it meets their abort marker, as with Kafka).
    """
    known: dict[TopicPartition, PartitionOffsets] | None
    try:
        known = st.coordinator.offsets_many([TopicPartition(t, p) for t, p, *_ in wanted])
    except CoordinatorUnavailableError:
        # Some partitions' offsets are unavailable (a metadata shard is down): ask one
        # by one, so that only those partitions answer with an error.
        known = None
    out = [_PartitionRead() for _ in wanted]
    bounds: list[PartitionOffsets | None] = []  # those of partitions with records to read
    for (topic, partition, offset, _, by_id), r in zip(wanted, out, strict=True):
        found = None
        try:
            tp = TopicPartition(topic, partition)
            offsets = known.get(tp) if known is not None else _offsets_or_none(st, tp)
            if offsets is None:
                r.error = ErrorCode.unknown_topic_or_partition
            elif by_id is not None and offsets.topic_id and offsets.topic_id != by_id:
                r.error = ErrorCode.unknown_topic_id
            else:
                r.high_watermark, r.log_start = offsets.high_watermark, offsets.log_start
                if not offsets.log_start <= offset <= offsets.high_watermark:
                    r.error = ErrorCode.offset_out_of_range
                elif offset < offsets.high_watermark:
                    found = offsets
        except LakelogError as e:
            r.error = code_for(e)
        bounds.append(found)
    if read_committed:
        _stabilize(st, wanted, out, bounds)
    # The chunks the reads below start with, in few GETs (one per run of nearby chunks of
    # one object, not one per partition's chunk): at 1,000 partitions an object holds a
    # small chunk of each.
    st.reader.prefetch_partitions(
        [
            PartitionWant(topic, partition, offset, b, partition_max)
            for (topic, partition, offset, partition_max, _), b in zip(wanted, bounds, strict=True)
            if b is not None
        ],
        max_bytes,
    )
    remaining = max_bytes
    empty = True  # nothing in the answer yet: the next first batch goes in whatever size
    for (topic, partition, offset, partition_max, _), r, b in zip(wanted, out, bounds, strict=True):
        if b is None or (remaining <= 0 and not empty):
            continue
        try:
            budget = min(partition_max, remaining)
            _collect(st, topic, partition, offset, b, budget, empty, r.records, r.aborted)
        except LakelogError as e:
            r.error = code_for(e)
            r.records.clear()
            continue
        remaining -= len(r.records)
        empty = empty and not r.records
    return out


def _stabilize(
    st: AgentState,
    wanted: list[tuple[str, int, int, int, bytes | None]],
    out: list[_PartitionRead],
    bounds: list[PartitionOffsets | None],
) -> None:
    """read_committed: each readable partition's bounds cut at its last stable offset,
    its answer given that offset and the aborted transactions from the fetch offset on."""
    asked = [i for i, r in enumerate(out) if r.error == ErrorCode.none]
    views = st.txns.stable_offsets(
        [IndexWant(wanted[i][0], wanted[i][1], wanted[i][2], wanted[i][4]) for i in asked]
    )
    for n, i in enumerate(asked):
        r, b, view = out[i], bounds[i], views.get(n)
        if view is None:  # deleted (and created again?) since its offsets were read
            r.error, bounds[i] = ErrorCode.unknown_topic_or_partition, None
            continue
        r.last_stable, r.aborted = view.last_stable, view.aborted
        if b is not None:
            offset = wanted[i][2]
            bounds[i] = (
                dataclasses.replace(b, high_watermark=view.last_stable)
                if offset < view.last_stable
                else None
            )


def _collect(
    st: AgentState,
    topic: str,
    partition: int,
    offset: int,
    bounds: PartitionOffsets,
    budget: int,
    first_may_exceed: bool,
    out: Pieces,
    aborted: Sequence[tuple[int, int, int]] = (),
) -> None:
    """Append whole batches from ``offset`` to ``out`` while they fit in ``budget``, up to
    the high watermark of ``bounds`` (the one this Fetch reports) and of its topic id.

    ``aborted`` (read_committed): the aborted transactions this answer names. A tier
    object holds neither their records nor their markers; a consumer told of one waits
    for its marker, dropping that producer's batches until then (its later, committed
    ones too). So where a tier object served here spans a marker's offset, the marker
    is sent again, as a control batch at that offset (``_tier_batches``).
    """
    # No read-ahead here: ``prefetch_partitions`` read this Fetch's chunks and started on
    # the next one's, a run of chunks of an object per GET (not a GET per chunk).
    entries = st.reader.entries(topic, partition, offset, bounds=bounds)
    end = bounds.high_watermark  # the last stable offset under read_committed
    for ref, data, start in entries:
        if ref.kind == "segment":
            if not fetch_batches(
                data, ref.base_offset, start, out, budget, first_may_exceed, until=end
            ):
                return
        else:  # a tier object: its rows from `start`, encoded as batches
            rows = decode_entry(ref, data, topic, partition, start)
            stop = min(end, ref.end_offset)
            markers = sorted((last, pid) for pid, _, last in aborted if start <= last < stop)
            rows = takewhile(lambda rec: rec.offset < end, rows)
            for batch in _tier_batches(rows, budget, markers, ref.max_timestamp_ms):
                if len(out) + len(batch) > budget and (out or not first_may_exceed):
                    return
                out += batch
        if len(out) >= budget:
            return


def _tier_batches(
    records: Any,
    budget: int,
    markers: Sequence[tuple[int, int]] = (),
    marker_timestamp_ms: int = -1,
) -> list[bytes]:
    """Rows of a tier object as batches, no more than about ``budget`` bytes in all.

    ``markers``: (offset, producer id) of abort markers the tier object's span held,
    sent as control batches at their offsets, in offset order among the rows (a marker
    follows every row before it; none is sent past the last row sent unless every row
    was). Consumers match an abort marker to its transaction by producer id; the epoch
    sent is 0.
    """
    out: list[bytes] = []
    rows: list[ConsumedRecord] = []
    pending = list(markers)
    size = 0

    def flush_rows() -> None:
        if rows:
            out.append(encode_records(rows))
            rows.clear()

    def marker(offset: int, producer_id: int) -> bytes:
        batch = bytearray(control_batch(producer_id, 0, False, marker_timestamp_ms))
        struct.pack_into(">q", batch, 0, offset)  # the base offset: not under the CRC
        return bytes(batch)

    exhausted = True
    for rec in records:
        while pending and pending[0][0] < rec.offset:
            flush_rows()
            out.append(marker(*pending.pop(0)))
        rows.append(rec)
        size += len(rec.key or b"") + len(rec.value or b"") + 16
        if size >= budget:
            exhausted = False
            break
    flush_rows()
    if exhausted:
        out.extend(marker(*m) for m in pending)
    return out


# -- ListOffsets -------------------------------------------------------------------------


async def list_offsets(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    resp = response_cls(type(body))
    part_cls, topic_cls = (
        nested(resp, "ListOffsetsPartitionResponse"),
        nested(resp, "ListOffsetsTopicResponse"),
    )
    topics = []
    for t in body.topics:
        parts = []
        allowed = access.topic(t.name)
        for p in t.partitions:
            offset, ts, code = -1, -1, TOPIC_DENIED
            try:
                if allowed:
                    offset, ts = await run(
                        Kind.READ,
                        _offset_for,
                        ctx.state,
                        t.name,
                        p.partition_index,
                        int(p.timestamp),
                        getattr(body, "isolation_level", 0) == READ_COMMITTED,
                    )
                    code = ErrorCode.none
            except LakelogError as e:
                offset, ts, code = -1, -1, code_for(e)
            parts.append(
                build(
                    part_cls,
                    partition_index=p.partition_index,
                    error_code=code,
                    timestamp=ts,
                    offset=offset,
                    leader_epoch=LEADER_EPOCH if code == ErrorCode.none else -1,
                    old_style_offsets=(),
                )
            )
        topics.append(build(topic_cls, name=t.name, partitions=tuple(parts)))
    return build(resp, throttle_time=0, topics=tuple(topics))


def _offset_for(
    st: AgentState, topic: str, partition: int, timestamp: int, read_committed: bool = False
) -> tuple[int, int]:
    """(offset, timestamp) ListOffsets answers for one partition (worker thread); the
    latest offset of a read_committed reader is the last stable offset."""
    offsets = st.coordinator.offsets(topic, partition)
    if timestamp == LATEST and read_committed:
        view = st.txns.stable_offsets([IndexWant(topic, partition, offsets.high_watermark)])
        return (view[0].last_stable if 0 in view else offsets.high_watermark), -1
    if timestamp == LATEST:
        return offsets.high_watermark, -1
    if timestamp in (EARLIEST, EARLIEST_LOCAL):  # the whole log is as near as it gets
        return offsets.log_start, -1
    if timestamp == MAX_TIMESTAMP:
        return _max_timestamp(st, topic, partition, offsets.log_start)
    if timestamp < 0:
        # Latest tiered, earliest pending upload: Kafka's remote log storage (KIP-405),
        # which lakelog does not have (its Parquet tier is read as the log itself); Kafka
        # answers -1 for a topic without it. Unknown specials the same.
        return -1, -1
    found = st.reader.record_for_timestamp(topic, partition, timestamp)
    if found is None or found.offset < offsets.log_start:
        return -1, -1
    return found.offset, found.timestamp_ms


def _max_timestamp(st: AgentState, topic: str, partition: int, log_start: int) -> tuple[int, int]:
    """The first record at or after log-start with the partition's largest timestamp
    (KIP-734), or (-1, -1)."""
    straddling: ConsumedRecord | None = None  # the best of an entry straddling log-start
    best: ChunkRef | None = None
    limit = st.reader.decompressed_limit(topic)
    offset = log_start
    while True:
        refs = st.coordinator.lookup(topic, partition, offset, 1000)
        if not refs:
            break
        for ref in refs:
            if ref.base_offset < log_start:
                # Only its records from log-start count, whatever its max timestamp says.
                data = st.reader.fetch_chunk(ref)
                for rec in decode_entry(ref, data, topic, partition, log_start, limit):
                    if straddling is None or rec.timestamp_ms > straddling.timestamp_ms:
                        straddling = rec
            elif best is None or ref.max_timestamp_ms > best.max_timestamp_ms:
                best = ref
        offset = refs[-1].end_offset
    if best is None or (
        straddling is not None and straddling.timestamp_ms >= best.max_timestamp_ms
    ):
        return (-1, -1) if straddling is None else (straddling.offset, straddling.timestamp_ms)
    data = st.reader.fetch_chunk(best)
    for rec in decode_entry(best, data, topic, partition, best.base_offset, limit):
        if rec.timestamp_ms == best.max_timestamp_ms:
            return rec.offset, rec.timestamp_ms
    return -1, -1
