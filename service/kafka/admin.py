"""Kafka admin APIs over the coordinator's topic admin (the calls v3 REST routes make).

CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, DescribeCluster, DeleteRecords, OffsetForLeaderEpoch. Each
resource or topic gets its own error code; one failing never stops the others.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from coordinator.topic_configs import (
    ConfigType,
    config_def,
    describe_configs,
    effective_configs,
)
from segments.errors import InvalidConfigError, LakelogError
from segments.types import TopicInfo
from service.executors import call
from service.kafka.acl import CLUSTER_DENIED, TOPIC_DENIED, Access
from service.kafka.errors import code_for
from service.kafka.framing import Request, build, nested
from service.kafka.handlers import LEADER_EPOCH, KafkaContext, response_cls

T = TypeVar("T")

#: DescribeConfigs resource types and config sources (Kafka's ConfigResource.Type,
#: DescribeConfigsResponse.ConfigSource).
TOPIC, BROKER = 2, 4
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5
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
                config_source=DEFAULT_CONFIG if entry.is_default else DYNAMIC_TOPIC_CONFIG,
                is_sensitive=False,
            )
            for entry in describe_configs(info.configs)
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
    body = req.body
    resp = response_cls(type(body))
    result_cls = nested(resp, "DeletableTopicResult")
    results = []
    for name in body.topic_names:
        code, message = ErrorCode.none, None
        if not access.topic(name):
            code = TOPIC_DENIED
        else:
            try:
                await call(ctx.state.coordinator.delete_topic, name)
            except LakelogError as e:
                code, message = _error(e)
            ctx.state.topics.invalidate(name)
        results.append(build(result_cls, name=name, error_code=code, error_message=message))
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
    body = req.body
    resp = response_cls(type(body))
    result_cls = nested(resp, "DescribeConfigsResult")
    entry_cls = nested(resp, "DescribeConfigsResourceResult")
    results = []
    for r in body.resources:
        code, message, configs = ErrorCode.none, None, ()
        denied = _config_denied(access, r)
        if denied is not None:
            code = denied
        elif r.resource_type == TOPIC:
            try:
                info = await call(ctx.state.coordinator.get_topic, r.resource_name)
                configs = tuple(
                    build(
                        entry_cls,
                        name=entry.name,
                        value=entry.value,
                        read_only=False,
                        config_source=(
                            DEFAULT_CONFIG if entry.is_default else DYNAMIC_TOPIC_CONFIG
                        ),
                        is_default=entry.is_default,
                        is_sensitive=False,
                        synonyms=(),
                        config_type=_CONFIG_TYPE_IDS.get(entry.type, 0),
                        documentation=config_def(entry.name).doc,
                    )
                    for entry in describe_configs(info.configs, r.configuration_keys)
                )
            except LakelogError as e:
                code, message = _error(e)
        elif r.resource_type != BROKER:  # brokers have no dynamic configs to show here
            code = ErrorCode.invalid_request
            message = f"Resource type {r.resource_type} is not supported."
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
    return build(resp, throttle_time=0, results=tuple(results))


async def alter_configs(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Legacy AlterConfigs: the given set replaces every override of the topic."""

    async def apply(r: Any) -> None:
        info = await call(ctx.state.coordinator.get_topic, r.resource_name)
        wanted = {c.name: c.value for c in r.configs if c.value is not None}
        reset = [name for name in info.configs if name not in wanted]
        await call(
            ctx.state.coordinator.alter_configs,
            r.resource_name,
            wanted,
            reset,
            validate_only=req.body.validate_only,
        )

    return await _alter(ctx, req, access, apply)


async def incremental_alter_configs(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """SET, DELETE, APPEND and SUBTRACT (list configs) per config name."""

    async def apply(r: Any) -> None:
        info = await call(ctx.state.coordinator.get_topic, r.resource_name)
        effective = effective_configs(info.configs)
        sets: dict[str, str] = {}
        deletes: list[str] = []
        for c in r.configs:
            op = c.config_operation
            if op == SET:
                sets[c.name] = c.value or ""
            elif op == DELETE:
                deletes.append(c.name)
            elif op in (APPEND, SUBTRACT):
                if config_def(c.name).type is not ConfigType.LIST:
                    raise InvalidConfigError(f"Config {c.name} is not a list: cannot {op}.")
                items = [i.strip() for i in effective[c.name].split(",") if i.strip()]
                given = [i.strip() for i in (c.value or "").split(",") if i.strip()]
                if op == APPEND:
                    items += [i for i in given if i not in items]
                else:
                    items = [i for i in items if i not in given]
                sets[c.name] = ",".join(items)
            else:
                raise InvalidConfigError(f"Unknown config operation {op} for {c.name}.")
        await call(
            ctx.state.coordinator.alter_configs,
            r.resource_name,
            sets,
            deletes,
            validate_only=req.body.validate_only,
        )

    return await _alter(ctx, req, access, apply)


async def _alter(
    ctx: KafkaContext, req: Request, access: Access, apply: Callable[[Any], Any]
) -> Any:
    resp = response_cls(type(req.body))
    result_cls = nested(resp, "AlterConfigsResourceResponse")
    results = []
    for r in req.body.resources:
        code, message = ErrorCode.none, None
        denied = _config_denied(access, r)
        if denied is not None:
            code = denied
        elif r.resource_type != TOPIC:
            code = ErrorCode.invalid_request
            message = f"Only topic configs can be altered (resource type {r.resource_type})."
        else:
            try:
                await apply(r)
            except LakelogError as e:
                code, message = _error(e)
            ctx.state.topics.invalidate(r.resource_name)
        results.append(
            build(
                result_cls,
                error_code=code,
                error_message=message,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
            )
        )
    return build(resp, throttle_time=0, responses=tuple(results))


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
            build(broker_cls, broker_id=b.node_id, host=b.host, port=b.port) for b in brokers
        ),
        cluster_authorized_operations=-(2**31),
    )


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
