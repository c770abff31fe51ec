"""Kafka admin APIs over the coordinator's topic admin (the calls v3 REST routes make).

CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, DescribeCluster, DeleteRecords, OffsetForLeaderEpoch. Each
resource or topic gets its own error code; one failing never stops the others.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from coordinator.client import TopicInfo
from coordinator.log.topic_configs import (
    BROKER_CONFIG_DEFS,
    CONFIG_DEFS,
    SOURCE_BROKER_DEFAULT,
    SOURCE_DEFAULT,
    SOURCE_OVERRIDE,
    ConfigDef,
    ConfigEntry,
    ConfigType,
    broker_config_def,
    config_def,
    describe_broker_configs,
    describe_configs,
)
from segments.errors import (
    BrokerNotFoundError,
    InvalidConfigError,
    LakelogError,
    TopicNotFoundError,
)
from service.executors import call
from service.kafka.acl import CLUSTER_DENIED, TOPIC_DENIED, Access
from service.kafka.errors import code_for
from service.kafka.framing import Request, build, nested
from service.kafka.handlers import (
    LEADER_EPOCH,
    KafkaContext,
    partition_entries,
    resolve_topic,
    response_cls,
    topic_entry,
    topic_fields,
    topic_key,
)

T = TypeVar("T")

#: DescribeConfigs resource types and config sources (Kafka's ConfigResource.Type,
#: DescribeConfigsResponse.ConfigSource).
TOPIC, BROKER = 2, 4
DYNAMIC_TOPIC_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, DEFAULT_CONFIG = 1, 3, 5
_SOURCE_IDS = {
    SOURCE_OVERRIDE: DYNAMIC_TOPIC_CONFIG,
    SOURCE_BROKER_DEFAULT: DYNAMIC_DEFAULT_BROKER_CONFIG,
    SOURCE_DEFAULT: DEFAULT_CONFIG,
}
_CONFIG_TYPE_IDS = {
    ConfigType.BOOLEAN: 1,
    ConfigType.STRING: 2,
    ConfigType.INT: 3,
    ConfigType.LONG: 5,
    ConfigType.DOUBLE: 6,
    ConfigType.LIST: 7,
}
#: IncrementalAlterConfigs operations.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def _error(e: LakelogError) -> tuple[ErrorCode, str | None]:
    return code_for(e), e.message


def _config_denied(access: Access, r: Any) -> ErrorCode | None:
    """The authorization code of a config resource (a topic, or a broker: the cluster's)."""
    if r.resource_type == TOPIC and not access.topic(r.resource_name):
        return TOPIC_DENIED
    if r.resource_type == BROKER and not access.cluster():
        return CLUSTER_DENIED
    return None


async def create_topics(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    resp = response_cls(type(body))
    result_cls, config_cls = (
        nested(resp, "CreatableTopicResult"),
        nested(resp, "CreatableTopicConfigs"),
    )
    st = ctx.state
    validate_only = bool(getattr(body, "validate_only", False))
    results = []
    for t in body.topics:
        code, message = ErrorCode.none, None
        partitions = st.settings.default_partitions if t.num_partitions == -1 else t.num_partitions
        configs = {c.name: c.value for c in t.configs if c.value is not None}
        try:
            if not access.may_create(t.name):
                code, message = TOPIC_DENIED, None
            else:
                info: TopicInfo = await call(
                    st.coordinator.create_topic,
                    t.name,
                    partitions,
                    configs,
                    validate_only=validate_only,
                )
        except LakelogError as e:
            code, message = _error(e)
        if code != ErrorCode.none:
            results.append(
                build(
                    result_cls,
                    name=t.name,
                    topic_id=None,
                    error_code=code,
                    error_message=message,
                    topic_config_error_code=0,
                    num_partitions=-1,
                    replication_factor=-1,
                    configs=None,
                )
            )
            continue
        st.topics.invalidate(t.name)
        entries = config_cls and tuple(  # v5+ answers with the topic's configs
            build(
                config_cls,
                name=entry.name,
                value=entry.value,
                read_only=False,
                config_source=_SOURCE_IDS[entry.source],
                is_sensitive=False,
            )
            for entry in describe_configs(info.configs, defaults=info.defaults)
        )
        results.append(
            build(
                result_cls,
                name=t.name,
                topic_id=uuid.UUID(bytes=info.topic_id),
                error_code=0,
                error_message=None,
                topic_config_error_code=0,
                num_partitions=info.partitions,
                replication_factor=1,
                configs=entries,
            )
        )
    return build(resp, throttle_time=0, topics=tuple(results))


async def delete_topics(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Delete topics named by name, or (v6) by name or id: an id deletes that topic only,
    never one created since under the same name (UNKNOWN_TOPIC_ID then)."""
    body = req.body
    resp = response_cls(type(body))
    result_cls = nested(resp, "DeletableTopicResult")
    asked = getattr(body, "topics", None)
    keys = [topic_key(t) for t in asked] if asked is not None else list(body.topic_names)
    results = []
    for key in keys:
        code, message = ErrorCode.none, None
        named = await resolve_topic(ctx, key, access.topic) if isinstance(key, uuid.UUID) else None
        name = key if isinstance(key, str) else (named.name if named else None)
        info = named.info if named is not None else None
        if named is not None and info is None:
            code = named.error
        elif name is not None and not access.topic(name):
            code = TOPIC_DENIED
        elif name is not None:
            try:
                expected = info.topic_id if info is not None else None
                await call(ctx.state.coordinator.delete_topic, name, topic_id=expected)
            except TopicNotFoundError as e:
                code, message = _error(e)
                if info is not None:  # deleted or recreated since we looked it up
                    code, message = ErrorCode.unknown_topic_id, None
            except LakelogError as e:
                code, message = _error(e)
            ctx.state.topics.invalidate(name)
        fields = topic_fields(key, info)
        if code == TOPIC_DENIED and isinstance(key, uuid.UUID):
            fields["name"] = None  # a principal that may not see it does not learn its name
        results.append(build(result_cls, **fields, error_code=code, error_message=message))
    return build(resp, throttle_time=0, responses=tuple(results))


async def create_partitions(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    resp = response_cls(type(body))
    result_cls = nested(resp, "CreatePartitionsTopicResult")
    coordinator = ctx.state.coordinator
    results = []
    for t in body.topics:
        code, message = ErrorCode.none, None
        try:
            if not access.topic(t.name):
                code = TOPIC_DENIED
            elif body.validate_only:
                info = await call(coordinator.get_topic, t.name)
                if t.count <= info.partitions:
                    code = ErrorCode.invalid_partitions
                    message = f"Topic already has {info.partitions} partitions."
            else:
                await call(coordinator.add_partitions, t.name, t.count)
        except LakelogError as e:
            code, message = _error(e)
        ctx.state.topics.invalidate(t.name)
        results.append(build(result_cls, name=t.name, error_code=code, error_message=message))
    return build(resp, throttle_time=0, results=tuple(results))


async def describe_configs_api(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Configs of topics and brokers as REST v3 shows them (one source of truth,
    ``coordinator.log.topic_configs``): a topic's override, else the cluster-wide broker
    config it inherits (DYNAMIC_DEFAULT_BROKER_CONFIG), else Kafka's default.

    A broker resource named by a live broker id shows every broker config (they are
    cluster-wide: the same for each); named "" (``--entity-default``) the cluster-wide
    ones set. Synonyms and documentation when asked (v1+, v3+).
    """
    body = req.body
    resp = response_cls(type(body))
    result_cls = nested(resp, "DescribeConfigsResult")
    entry_cls = nested(resp, "DescribeConfigsResourceResult")
    synonym_cls = nested(resp, "DescribeConfigsSynonym")
    with_synonyms = bool(getattr(body, "include_synonyms", False))
    with_docs = bool(getattr(body, "include_documentation", False))

    def row(entry: ConfigEntry, d: ConfigDef) -> Any:
        return build(
            entry_cls,
            name=entry.name,
            value=entry.value,
            read_only=entry.is_read_only,
            config_source=_SOURCE_IDS[entry.source],
            is_default=entry.is_default,
            is_sensitive=entry.is_sensitive,
            synonyms=tuple(
                build(synonym_cls, name=y.name, value=y.value, source=_SOURCE_IDS[y.source])
                for y in entry.synonyms
            )
            if with_synonyms and synonym_cls is not None
            else (),
            config_type=_CONFIG_TYPE_IDS.get(entry.type, 0),
            documentation=d.doc if with_docs else None,
        )

    async def answer(r: Any) -> tuple[Any, ...]:
        names = r.configuration_keys
        if r.resource_type == TOPIC:
            info = await call(ctx.state.coordinator.get_topic, r.resource_name)
            entries = describe_configs(info.configs, names, info.defaults)
            return tuple(row(e, CONFIG_DEFS[e.name]) for e in entries)
        dynamic = await call(ctx.state.coordinator.broker_configs)
        if r.resource_name != "":
            await _check_broker(ctx, r.resource_name)
        elif names is None:  # the cluster default: only what is set
            names = sorted(dynamic)
        entries = describe_broker_configs(dynamic, names)
        return tuple(row(e, BROKER_CONFIG_DEFS[e.name]) for e in entries)

    results = await _config_results(access, body.resources, result_cls, answer)
    return build(resp, throttle_time=0, results=results)


async def _config_results(
    access: Access,
    resources: Any,
    result_cls: type,
    answer: Callable[[Any], Awaitable[tuple[Any, ...]]],
) -> tuple[Any, ...]:
    """DescribeConfigs' and AlterConfigs' result of each resource: a topic's or broker's
    ``answer`` (its configs; AlterConfigs' results have none), else why not: no right to
    it, its LakelogError, or a resource type neither."""
    results = []
    for r in resources:
        code, message, configs = ErrorCode.none, None, ()
        denied = _config_denied(access, r)
        try:
            if denied is not None:
                code = denied
            elif r.resource_type in (TOPIC, BROKER):
                configs = await answer(r)
            else:
                code = ErrorCode.invalid_request
                message = f"Resource type {r.resource_type} is not supported."
        except LakelogError as e:
            code, message = _error(e)
        results.append(
            build(
                result_cls,
                error_code=code,
                error_message=message,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
                configs=configs,
            )
        )
    return tuple(results)


async def _check_broker(ctx: KafkaContext, name: str) -> None:
    """Raises BrokerNotFoundError unless ``name`` is a live broker's id (Kafka's broker
    answers INVALID_REQUEST for a broker id not its own)."""
    ids = {str(b.node_id) for b in await ctx.brokers()}
    if name not in ids:
        raise BrokerNotFoundError(
            f"Unexpected broker id {name!r}: the live brokers are {', '.join(sorted(ids))}."
        )


async def alter_configs(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Legacy AlterConfigs: the given set replaces every override of the topic (or, for
    the broker resource "", every cluster-wide broker config)."""

    async def apply(r: Any, current: dict[str, str]) -> tuple[dict[str, str], list[str]]:
        wanted = {c.name: c.value for c in r.configs if c.value is not None}
        return wanted, [name for name in current if name not in wanted]

    return await _alter(ctx, req, access, apply)


async def incremental_alter_configs(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """SET, DELETE, APPEND and SUBTRACT (list configs) per config name, on a topic or on
    the cluster-wide broker configs (broker resource "")."""

    async def apply(r: Any, current: dict[str, str]) -> tuple[dict[str, str], list[str]]:
        broker = r.resource_type == BROKER
        defn = broker_config_def if broker else config_def
        sets: dict[str, str] = {}
        deletes: list[str] = []
        for c in r.configs:
            op = c.config_operation
            if op == SET:
                sets[c.name] = c.value or ""
            elif op == DELETE:
                deletes.append(c.name)
            elif op in (APPEND, SUBTRACT):
                d = defn(c.name)
                if d.type is not ConfigType.LIST:
                    raise InvalidConfigError(f"Config {c.name} is not a list: cannot {op}.")
                value = current.get(c.name, d.default)  # the value in force
                items = [i.strip() for i in value.split(",") if i.strip()]
                given = [i.strip() for i in (c.value or "").split(",") if i.strip()]
                if op == APPEND:
                    items += [i for i in given if i not in items]
                else:
                    items = [i for i in items if i not in given]
                sets[c.name] = ",".join(items)
            else:
                raise InvalidConfigError(f"Unknown config operation {op} for {c.name}.")
        return sets, deletes

    return await _alter(ctx, req, access, apply)


Apply = Callable[[Any, dict[str, str]], Awaitable[tuple[dict[str, str], list[str]]]]


async def _alter(ctx: KafkaContext, req: Request, access: Access, apply: Apply) -> Any:
    """Run ``apply`` on each resource: a topic's configs (its overrides and inherited values
    in force), or the cluster-wide broker configs (broker resource ""). Per-broker
    configs are refused, as the REST door refuses them: every agent serves every
    partition, so a value for one agent alone would make a topic's behaviour depend on
    which agent answers."""
    resp = response_cls(type(req.body))
    result_cls = nested(resp, "AlterConfigsResourceResponse")
    validate_only = req.body.validate_only
    coordinator = ctx.state.coordinator

    async def answer(r: Any) -> tuple[Any, ...]:
        if r.resource_type == TOPIC:
            info = await call(coordinator.get_topic, r.resource_name)
            current = {**info.defaults, **info.configs}
            sets, deletes = await apply(r, current)
            # Only overrides are reset: a name inherited, not set, has none to drop.
            deletes = [n for n in deletes if n in info.configs or n not in current]
            await call(
                coordinator.alter_configs,
                r.resource_name,
                sets,
                deletes,
                validate_only=validate_only,
            )
            ctx.state.topics.invalidate(r.resource_name)
        elif r.resource_name == "":
            current = await call(coordinator.broker_configs)
            sets, deletes = await apply(r, current)
            await call(
                coordinator.alter_broker_configs,
                sets,
                deletes,
                validate_only=validate_only,
            )
            if not validate_only:
                ctx.state.topics.invalidate_all()  # topics carry what they inherit
        else:
            await _check_broker(ctx, r.resource_name)
            raise InvalidConfigError(
                "Per-broker config overrides are not supported: every agent serves "
                "every partition, so broker configs are cluster-wide. Alter the "
                'default broker resource ("", kafka-configs --entity-default).'
            )
        return ()

    results = await _config_results(access, req.body.resources, result_cls, answer)
    return build(resp, throttle_time=0, responses=results)


async def describe_cluster(ctx: KafkaContext, req: Request, access: Access) -> Any:
    resp = response_cls(type(req.body))
    broker_cls = nested(resp, "DescribeClusterBroker")
    brokers = await ctx.brokers()
    return build(
        resp,
        throttle_time=0,
        error_code=0,
        error_message=None,
        endpoint_type=1,
        cluster_id=ctx.state.cluster_id,
        controller_id=brokers[0].node_id if brokers else -1,
        brokers=tuple(
            build(broker_cls, broker_id=b.node_id, host=b.host, port=b.port, is_fenced=False)
            for b in brokers
        ),
        cluster_authorized_operations=-(2**31),
    )


async def describe_topic_partitions(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """KIP-966's paged Metadata (Kafka 3.7+ admin clients' describeTopics): the named
    topics, or all the principal may DESCRIBE, sorted by name, from the cursor on, at most
    ``response_partition_limit`` partitions per answer; ``next_cursor`` says where the
    next answer starts (null: nothing left). A topic the principal may not DESCRIBE is
    TOPIC_AUTHORIZATION_FAILED; an unknown one UNKNOWN_TOPIC_OR_PARTITION."""
    body = req.body
    resp = response_cls(type(body))
    topic_cls, part_cls, cursor_cls = (
        nested(resp, "DescribeTopicPartitionsResponseTopic"),
        nested(resp, "DescribeTopicPartitionsResponsePartition"),
        nested(resp, "Cursor"),
    )
    brokers = await ctx.brokers()
    limit = min(max(body.response_partition_limit, 1), MAX_PARTITIONS_PER_PAGE)
    cursor = body.cursor
    asked: list[tuple[str, TopicInfo | None, ErrorCode]] = []
    if body.topics:
        for name in sorted({t.name for t in body.topics}):
            named = await resolve_topic(ctx, name, access.topic)
            asked.append((name, named.info, named.error))
    else:
        listed = await call(ctx.state.coordinator.list_topics)
        asked = [(t.name, t, ErrorCode.none) for t in listed if access.topic(t.name)]
        asked.sort(key=lambda a: a[0])
    out: list[Any] = []
    next_cursor = None
    left = limit
    for name, info, error in asked:
        first = 0
        if cursor is not None:
            if name < cursor.topic_name:
                continue
            if name == cursor.topic_name:
                first = max(cursor.partition_index, 0)
        if left <= 0:
            next_cursor = build(cursor_cls, topic_name=name, partition_index=first)
            break
        parts: tuple[Any, ...] = ()
        if info is not None:
            end = min(info.partitions, first + left)
            parts = partition_entries(part_cls, brokers, info.name, range(first, end))
            left -= len(parts)
            if end < info.partitions:
                next_cursor = build(cursor_cls, topic_name=name, partition_index=end)
        out.append(topic_entry(topic_cls, name, info, error, parts))
        if next_cursor is not None:
            break
    return build(resp, throttle_time=0, topics=tuple(out), next_cursor=next_cursor)


#: Kafka's ``max.request.partition.size.limit`` default: the most partitions one
#: DescribeTopicPartitions answer holds, whatever the request's limit.
MAX_PARTITIONS_PER_PAGE = 2000


async def delete_records(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Moves each partition's log-start (the low watermark) up to the given offset."""
    resp = response_cls(type(req.body))
    part_cls, topic_cls = (
        nested(resp, "DeleteRecordsPartitionResult"),
        nested(resp, "DeleteRecordsTopicResult"),
    )
    topics = []
    for t in req.body.topics:
        parts = []
        allowed = access.topic(t.name)
        for p in t.partitions:
            code, low = ErrorCode.none, -1
            try:
                if not allowed:
                    code = TOPIC_DENIED
                else:
                    low = await call(
                        ctx.state.coordinator.delete_records, t.name, p.partition_index, p.offset
                    )
            except LakelogError as e:
                code = code_for(e)
            parts.append(
                build(
                    part_cls, partition_index=p.partition_index, low_watermark=low, error_code=code
                )
            )
        topics.append(build(topic_cls, name=t.name, partitions=tuple(parts)))
    return build(resp, throttle_time=0, topics=tuple(topics))


async def offset_for_leader_epoch(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Every partition has one leader epoch (0) whose end is the high watermark."""
    resp = response_cls(type(req.body))
    part_cls, topic_cls = nested(resp, "EpochEndOffset"), nested(resp, "OffsetForLeaderTopicResult")
    topics = []
    for t in req.body.topics:
        parts = []
        allowed = access.topic(t.topic)
        for p in t.partitions:
            code, epoch, end = ErrorCode.none, LEADER_EPOCH, -1
            try:
                if not allowed:
                    code, epoch = TOPIC_DENIED, -1
                else:
                    end = (
                        await call(ctx.state.coordinator.offsets, t.topic, p.partition)
                    ).high_watermark
            except LakelogError as e:
                code, epoch = code_for(e), -1
            if code == ErrorCode.none and p.leader_epoch > LEADER_EPOCH:
                epoch, end = -1, -1  # an epoch we never had
            parts.append(
                build(
                    part_cls,
                    error_code=code,
                    partition=p.partition,
                    leader_epoch=epoch,
                    end_offset=end,
                )
            )
        topics.append(build(topic_cls, topic=t.topic, partitions=tuple(parts)))
    return build(resp, throttle_time=0, topics=tuple(topics))
