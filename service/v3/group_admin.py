"""lakelog's operator routes for consumer groups, beside the v3 read-only views.

The v3 spec has no way to move or delete a group's offsets (kafka-rest issues #1010,
#1308); Kafka operators do it with ``kafka-consumer-groups``. ``lakelog groups`` calls
these two routes, which follow the v3 conventions (cluster check, error bodies):

- ``POST .../consumer-groups/{group}/offsets:reset``: plan, and unless ``validate_only``
  apply, a reset of committed offsets (``coordinator.groups.offset_reset`` has the rules).
  Groups of any door (REST instances, Kafka members) are refused while they have
  members, with Kafka's message (409 40903), in a dry run too, as Kafka's tool does.
- ``DELETE .../consumer-groups/{group}``: delete a group without members and its
  offsets (204; 404 unknown; 409 40903 not empty).

A reset needs READ on the group (``service.security.acl``) and on each topic it moves (Kafka's
OffsetCommit), in a dry run too: a topic named without it is 403 40301, and nothing
moves; ``all_topics`` leaves out the topics the caller may not DESCRIBE (as Kafka's
listings do) and refuses those it may DESCRIBE but not READ.

A reset costs a fixed number of coordinator calls whatever the partition count
(describe, the topics named, one ``offsets_many``, one ``alter_group_offsets``),
except TIMESTAMP, which looks up each partition's index on the read pool.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field, StrictBool

from coordinator.client import TopicPartition
from coordinator.groups.model import CommittedOffset, GroupInfo
from coordinator.groups.offset_reset import NEEDS_VALUE, PlannedReset, ResetStrategy, plan_reset
from coordinator.security.model import Operation, ResourceType
from segments.errors import (
    GroupNotFoundError,
    MalformedRequestError,
    NonEmptyGroupError,
    PartitionNotFoundError,
    UnprocessableRequestError,
)
from service.executors import Kind
from service.security.acl import Rights, rights
from service.state import AgentState, StateDep
from service.v3.common import JSON, Links, LinksDep, call
from service.v3.consumer_groups import GROUP

router = APIRouter(tags=["v3 consumer groups (lakelog)"])

#: The v3 group states as Kafka's tools print them.
KAFKA_STATES = {
    "STABLE": "Stable",
    "PREPARING_REBALANCE": "PreparingRebalance",
    "COMPLETING_REBALANCE": "CompletingRebalance",
    "EMPTY": "Empty",
    "DEAD": "Dead",
}


class ResetPartition(BaseModel):
    topic_name: str
    #: None: every partition of the topic.
    partition_id: int | None = None


class ResetOffsetsRequest(BaseModel):
    partitions: list[ResetPartition] = Field(default_factory=list)
    #: Every topic the group has committed offsets for.
    all_topics: bool = False
    strategy: ResetStrategy
    #: OFFSET: the offset; SHIFT: how far to move; TIMESTAMP: epoch milliseconds.
    value: int | None = None
    #: True (the default): answer the plan, change nothing (Kafka's --dry-run).
    validate_only: StrictBool = True


def _group_url(links: Links, group: str, suffix: str = "") -> str:
    return links.cluster(f"/consumer-groups/{group}{suffix}")


async def _group_or_none(state: AgentState, group: str) -> GroupInfo | None:
    try:
        return await call(state.groups.describe_group, group)
    except GroupNotFoundError:
        return None  # a group that does not exist yet may be given offsets


def _refuse_if_active(group: str, info: GroupInfo | None) -> None:
    if info is not None and info.members:
        current = KAFKA_STATES.get(info.state, info.state)
        raise NonEmptyGroupError(
            f"Assignments can only be reset if the group '{group}' is inactive, but the "
            f"current state is {current}."
        )


async def _partitions(
    state: AgentState, access: Rights, body: ResetOffsetsRequest, info: GroupInfo | None
) -> list[TopicPartition]:
    """The partitions the request names, checked (READ on each topic), sorted; one topic
    lookup per topic.

    Raises:
        AuthorizationError: a topic the caller may not READ.
    """
    wanted: set[TopicPartition] = set()
    if body.all_topics and info is not None:
        hidden = set(await access.denied(Operation.DESCRIBE, ResourceType.TOPIC, _topics(info)))
        wanted.update(tp for tp in info.committed if tp.topic not in hidden)
    await access.require(
        Operation.READ,
        ResourceType.TOPIC,
        {tp.topic for tp in wanted} | {p.topic_name for p in body.partitions},
    )
    counts: dict[str, int] = {}
    for p in body.partitions:
        if p.topic_name not in counts:
            topic = await call(state.coordinator.get_topic, p.topic_name)
            counts[p.topic_name] = topic.partitions
        count = counts[p.topic_name]
        if p.partition_id is None:
            wanted.update(TopicPartition(p.topic_name, i) for i in range(count))
        elif 0 <= p.partition_id < count:
            wanted.add(TopicPartition(p.topic_name, p.partition_id))
        else:
            raise PartitionNotFoundError(
                f"Partition {p.partition_id} of topic '{p.topic_name}' not found."
            )
    return sorted(wanted)


def _topics(info: GroupInfo) -> set[str]:
    return {tp.topic for tp in info.committed}


async def _by_timestamp(
    state: AgentState, partitions: list[TopicPartition], timestamp_ms: int
) -> dict[TopicPartition, int | None]:
    found = await asyncio.gather(
        *(
            state.executors.run(
                Kind.READ, state.reader.offset_for_timestamp, tp.topic, tp.partition, timestamp_ms
            )
            for tp in partitions
        )
    )
    return dict(zip(partitions, found, strict=True))


def _planned_data(p: PlannedReset) -> JSON:
    return {
        "topic_name": p.tp.topic,
        "partition_id": p.tp.partition,
        "current_offset": p.current,
        "new_offset": p.new,
        "log_start_offset": p.bounds.log_start,
        "log_end_offset": p.bounds.high_watermark,
    }


@router.post(GROUP + "/offsets:reset", summary="Reset a consumer group's offsets (lakelog)")
async def reset_offsets(
    consumer_group_id: str,
    body: ResetOffsetsRequest,
    request: Request,
    links: LinksDep,
    state: StateDep,
) -> JSON:
    """The plan (``current_offset`` -> ``new_offset`` per partition), applied unless
    ``validate_only``. Refused while the group has members (409 40903)."""
    group = consumer_group_id
    if body.strategy in NEEDS_VALUE and body.value is None:
        raise MalformedRequestError(f"Bad Request: strategy {body.strategy} needs a value.")
    if body.strategy is ResetStrategy.TIMESTAMP and body.value is not None and body.value < 0:
        raise MalformedRequestError("Bad Request: a TIMESTAMP value is epoch ms, >= 0.")
    if not body.partitions and not body.all_topics:
        raise UnprocessableRequestError("Payload error. partitions or all_topics is required.")
    info = await _group_or_none(state, group)
    _refuse_if_active(group, info)
    partitions = await _partitions(state, rights(request), body, info)
    bounds = await call(state.coordinator.offsets_many, partitions)
    partitions = [tp for tp in partitions if tp in bounds]  # a topic deleted meanwhile
    committed = {tp: c.offset for tp, c in (info.committed if info else {}).items()}
    by_timestamp = None
    if body.strategy is ResetStrategy.TIMESTAMP:
        assert body.value is not None
        by_timestamp = await _by_timestamp(state, partitions, body.value)
    plan = plan_reset(body.strategy, body.value, partitions, bounds, committed, by_timestamp)
    if not body.validate_only and plan:
        offsets = {p.tp: CommittedOffset(p.new) for p in plan}
        await call(state.groups.alter_group_offsets, group, offsets)
    return {
        "kind": "KafkaConsumerGroupOffsetResetList",
        "metadata": {"self": _group_url(links, group, "/offsets:reset"), "next": None},
        "consumer_group_id": group,
        "validate_only": body.validate_only,
        "data": [_planned_data(p) for p in plan],
    }


@router.delete(GROUP, status_code=204, summary="Delete a consumer group (lakelog)")
async def delete_group(consumer_group_id: str, links: LinksDep, state: StateDep) -> Response:
    """204; 404 for an unknown group; 409 40903 while it has members."""
    await call(state.groups.delete_group, consumer_group_id)
    return Response(status_code=204)
