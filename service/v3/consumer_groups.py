"""v3 consumer groups (read-only views of the coordinator's group state, REST-API.md §3.7).

Groups are those of v2 consumer instances: ``consumer_id``, ``instance_id`` and
``client_id`` are all the instance's name. Lags compare each partition's
committed offset (else the owning instance's position) with its high
watermark: ``lag = log_end_offset - current_offset``. Unknown group: 404 40405;
a partition without lag or assignment: 404 40402.

With authorization on, a view shows only the topics the caller may DESCRIBE (Kafka's
OffsetFetch): the assignments, lags and lag summary leave the others out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fastapi import APIRouter, Request

from coordinator.client import TopicPartition
from coordinator.groups.model import ConsumerState, GroupInfo
from coordinator.security.model import Operation, ResourceType
from segments.errors import ConsumerNotFoundError, LakelogError, PartitionNotFoundError
from service.security.acl import Rights, rights
from service.state import AgentState, StateDep
from service.v3.common import JSON, Links, LinksDep, call, related

router = APIRouter(tags=["v3 consumer groups"])

GROUPS = "/v3/clusters/{cluster_id}/consumer-groups"
GROUP = GROUPS + "/{consumer_group_id}"


@dataclass(frozen=True, slots=True)
class Lag:
    tp: TopicPartition
    current: int
    log_end: int
    owner: str | None

    @property
    def lag(self) -> int:
        return max(self.log_end - self.current, 0)


def _group_url(links: Links, group: str, suffix: str = "") -> str:
    return links.cluster(f"/consumer-groups/{group}{suffix}")


def group_data(links: Links, info: GroupInfo, coordinator_id: int) -> JSON:
    """A KafkaConsumerGroup resource."""
    g = info.group
    return Links.resource(
        "KafkaConsumerGroup",
        _group_url(links, g),
        links.crn(("consumer-group", g)),
        cluster_id=links.cluster_id,
        consumer_group_id=g,
        is_simple=bool(info.members) and all(m.manual for m in info.members),
        partition_assignor=info.assignor,
        state=info.state,
        type=info.group_type,
        is_mixed_consumer_group=False,
        coordinator=related(links.broker(coordinator_id)),
        consumers=related(_group_url(links, g, "/consumers")),
        lag_summary=related(_group_url(links, g, "/lag-summary")),
    )


def consumer_data(links: Links, group: str, member: ConsumerState) -> JSON:
    """A KafkaConsumer resource: a v2 consumer instance."""
    url = _group_url(links, group, f"/consumers/{member.name}")
    return Links.resource(
        "KafkaConsumer",
        url,
        links.crn(("consumer-group", group), ("consumer", member.name)),
        cluster_id=links.cluster_id,
        consumer_group_id=group,
        consumer_id=member.name,
        instance_id=member.name,
        client_id=member.name,
        assignments=related(url + "/assignments"),
    )


def assignment_data(links: Links, group: str, member: str, tp: TopicPartition) -> JSON:
    """A KafkaConsumerAssignment resource."""
    suffix = f"/consumers/{member}/assignments/{tp.topic}/partitions/{tp.partition}"
    return Links.resource(
        "KafkaConsumerAssignment",
        _group_url(links, group, suffix),
        links.crn(
            ("consumer-group", group),
            ("consumer", member),
            ("assignment", tp.topic),
            ("partition", tp.partition),
        ),
        cluster_id=links.cluster_id,
        consumer_group_id=group,
        consumer_id=member,
        topic_name=tp.topic,
        partition_id=tp.partition,
        partition=related(links.partition(tp.topic, tp.partition)),
        lag=related(_group_url(links, group, f"/lags/{tp.topic}/partitions/{tp.partition}")),
    )


def lag_data(links: Links, group: str, lag: Lag) -> JSON:
    """A KafkaConsumerLag resource."""
    tp = lag.tp
    return Links.resource(
        "KafkaConsumerLag",
        _group_url(links, group, f"/lags/{tp.topic}/partitions/{tp.partition}"),
        links.crn(("consumer-group", group), ("lag", tp.topic), ("partition", tp.partition)),
        cluster_id=links.cluster_id,
        consumer_group_id=group,
        topic_name=tp.topic,
        partition_id=tp.partition,
        current_offset=lag.current,
        log_end_offset=lag.log_end,
        lag=lag.lag,
        consumer_id=lag.owner or "",
        instance_id=lag.owner,
        client_id=lag.owner or "",
    )


async def _describe(state: AgentState, request: Request, group: str) -> GroupInfo:
    """The group as the caller may see it (see the module doc).

    Raises:
        GroupNotFoundError (404).
    """
    return await described(rights(request), await call(state.groups.describe_group, group))


async def described(access: Rights, info: GroupInfo) -> GroupInfo:
    """``info`` without the topics ``access``'s principal may not DESCRIBE."""
    topics = {tp.topic for tp in info.committed}
    topics.update(tp.topic for m in info.members for tp in m.assignment)
    hidden = set(await access.denied(Operation.DESCRIBE, ResourceType.TOPIC, topics))
    if not hidden:
        return info

    def seen(tp: TopicPartition) -> bool:
        return tp.topic not in hidden

    members = tuple(
        replace(
            m,
            subscription=tuple(t for t in m.subscription if t not in hidden),
            assignment=tuple(filter(seen, m.assignment)),
            positions={tp: o for tp, o in m.positions.items() if seen(tp)},
            unresolved=tuple(filter(seen, m.unresolved)),
        )
        for m in info.members
    )
    committed = {tp: c for tp, c in info.committed.items() if seen(tp)}
    return replace(info, members=members, committed=committed)


def _member(info: GroupInfo, consumer_id: str) -> ConsumerState:
    for m in info.members:
        if m.name == consumer_id:
            return m
    raise ConsumerNotFoundError(
        f"Consumer {consumer_id} cannot be found in consumer group {info.group}."
    )


def _lags(state: AgentState, info: GroupInfo) -> list[Lag]:
    """Every partition with a committed offset or an owner's position, with its lag."""
    owners: dict[TopicPartition, ConsumerState] = {}
    for m in info.members:
        for tp in m.assignment:
            owners[tp] = m
    current: dict[TopicPartition, int] = {tp: c.offset for tp, c in info.committed.items()}
    for tp, m in owners.items():
        if tp not in current and tp in m.positions:
            current[tp] = m.positions[tp]
    ends = state.coordinator.offsets_many(list(current))  # one call, however many partitions
    out = []
    for tp in sorted(current):
        if tp not in ends:
            continue  # topic deleted since
        owner = owners.get(tp)
        out.append(Lag(tp, current[tp], ends[tp].high_watermark, owner.name if owner else None))
    return out


@router.get(GROUPS)
async def list_groups(links: LinksDep, state: StateDep) -> JSON:
    """KafkaConsumerGroupList."""
    data = []
    for g in await call(state.groups.list_groups):
        try:
            info = await call(state.groups.describe_group, g)  # names no topic
        except LakelogError:
            continue  # expired since it was listed
        data.append(group_data(links, info, state.broker_id))
    return Links.collection("KafkaConsumerGroupList", links.cluster("/consumer-groups"), data)


@router.get(GROUP)
async def get_group(
    consumer_group_id: str, request: Request, links: LinksDep, state: StateDep
) -> JSON:
    """KafkaConsumerGroup."""
    return group_data(links, await _describe(state, request, consumer_group_id), state.broker_id)


@router.get(GROUP + "/consumers")
async def list_consumers(
    consumer_group_id: str, request: Request, links: LinksDep, state: StateDep
) -> JSON:
    """KafkaConsumerList."""
    info = await _describe(state, request, consumer_group_id)
    data = [consumer_data(links, info.group, m) for m in info.members]
    return Links.collection("KafkaConsumerList", _group_url(links, info.group, "/consumers"), data)


@router.get(GROUP + "/consumers/{consumer_id}")
async def get_consumer(
    consumer_group_id: str, consumer_id: str, request: Request, links: LinksDep, state: StateDep
) -> JSON:
    """KafkaConsumer."""
    info = await _describe(state, request, consumer_group_id)
    return consumer_data(links, info.group, _member(info, consumer_id))


@router.get(GROUP + "/consumers/{consumer_id}/assignments")
async def list_assignments(
    consumer_group_id: str, consumer_id: str, request: Request, links: LinksDep, state: StateDep
) -> JSON:
    """KafkaConsumerAssignmentList."""
    info = await _describe(state, request, consumer_group_id)
    member = _member(info, consumer_id)
    data = [assignment_data(links, info.group, member.name, tp) for tp in member.assignment]
    url = _group_url(links, info.group, f"/consumers/{member.name}/assignments")
    return Links.collection("KafkaConsumerAssignmentList", url, data)


@router.get(GROUP + "/consumers/{consumer_id}/assignments/{topic_name}/partitions/{partition_id}")
async def get_assignment(
    consumer_group_id: str,
    consumer_id: str,
    topic_name: str,
    partition_id: int,
    request: Request,
    links: LinksDep,
    state: StateDep,
) -> JSON:
    """KafkaConsumerAssignment."""
    info = await _describe(state, request, consumer_group_id)
    member = _member(info, consumer_id)
    tp = TopicPartition(topic_name, partition_id)
    if tp not in member.assignment:
        raise PartitionNotFoundError(
            f"Partition {partition_id} of topic {topic_name} is not assigned to {consumer_id}."
        )
    return assignment_data(links, info.group, member.name, tp)


@router.get(GROUP + "/lag-summary")
async def get_lag_summary(
    consumer_group_id: str, request: Request, links: LinksDep, state: StateDep
) -> JSON:
    """KafkaConsumerGroupLagSummary: the largest lag and the sum over partitions."""
    info = await _describe(state, request, consumer_group_id)
    lags = await call(_lags, state, info)
    top = max(lags, key=lambda lag: lag.lag, default=None)
    g = info.group
    owner = top.owner if top else None
    return Links.resource(
        "KafkaConsumerGroupLagSummary",
        _group_url(links, g, "/lag-summary"),
        links.crn(("consumer-group", g)) + "/lag-summary",
        cluster_id=links.cluster_id,
        consumer_group_id=g,
        max_lag_consumer_id=owner or "",
        max_lag_instance_id=owner,
        max_lag_client_id=owner or "",
        max_lag_topic_name=top.tp.topic if top else "",
        max_lag_partition_id=top.tp.partition if top else -1,
        max_lag=top.lag if top else 0,
        total_lag=sum(lag.lag for lag in lags),
        max_lag_consumer=related(_group_url(links, g, f"/consumers/{owner}")) if owner else None,
        max_lag_partition=(
            related(links.partition(top.tp.topic, top.tp.partition)) if top else None
        ),
    )


@router.get(GROUP + "/lags")
async def list_lags(
    consumer_group_id: str, request: Request, links: LinksDep, state: StateDep
) -> JSON:
    """KafkaConsumerLagList, by topic and partition."""
    info = await _describe(state, request, consumer_group_id)
    data = [lag_data(links, info.group, lag) for lag in await call(_lags, state, info)]
    return Links.collection("KafkaConsumerLagList", _group_url(links, info.group, "/lags"), data)


@router.get(GROUP + "/lags/{topic_name}/partitions/{partition_id}")
async def get_lag(
    consumer_group_id: str,
    topic_name: str,
    partition_id: int,
    request: Request,
    links: LinksDep,
    state: StateDep,
) -> JSON:
    """KafkaConsumerLag of one partition; 404 when the group has no offset for it."""
    info = await _describe(state, request, consumer_group_id)
    tp = TopicPartition(topic_name, partition_id)
    for lag in await call(_lags, state, info):
        if lag.tp == tp:
            return lag_data(links, info.group, lag)
    raise PartitionNotFoundError(
        f"Consumer group {info.group} has no offset for partition {partition_id} "
        f"of topic {topic_name}."
    )
