"""Kafka consumer-group APIs over the coordinator's group state (``coordinator.kafka_groups``).

Every agent is a group coordinator (FindCoordinator answers with the agent asked):
the group lives in the coordinator, so a member may reach any agent with any call.
JoinGroup and SyncGroup wait for the round to complete by asking the coordinator
again every ``POLL_S`` (the other members' calls may reach other agents); the wait
ends at the rebalance timeout. Committed offsets are the ones REST consumers use.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from kio.schema.errors import ErrorCode

from coordinator.groups import CommittedOffset
from coordinator.kafka_groups import JoinResult, KafkaGroupCoordinator
from segments.errors import LakelogError
from segments.types import TopicPartition
from service.executors import call
from service.kafka.acl import GROUP_DENIED, TOPIC_DENIED, TRANSACTIONAL_ID_DENIED, Access
from service.kafka.errors import code_for
from service.kafka.framing import Request, build, millis, nested
from service.kafka.handlers import KafkaContext, response_cls

#: How often a waiting JoinGroup or SyncGroup asks the coordinator again.
POLL_S = 0.05
GROUP_KEY, TRANSACTION_KEY = 0, 1


def _groups(ctx: KafkaContext) -> KafkaGroupCoordinator:
    return cast(KafkaGroupCoordinator, ctx.state.coordinator)


async def find_coordinator(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    resp = response_cls(type(body))
    me = ctx.state.broker_id
    keys = getattr(body, "coordinator_keys", None) or (getattr(body, "key", ""),)

    def found(key: str) -> dict[str, Any]:
        code, message = ErrorCode.none, None
        if body.key_type == TRANSACTION_KEY:
            code, message = ErrorCode.coordinator_not_available, "Transactions are not supported."
            if not access.transactional_id(key):
                code, message = TRANSACTIONAL_ID_DENIED, None
        elif not access.group(key):
            code = GROUP_DENIED
        return dict(
            error_code=code,
            error_message=message,
            node_id=me if code == ErrorCode.none else -1,
            host=ctx.host if code == ErrorCode.none else "",
            port=ctx.port if code == ErrorCode.none else -1,
        )

    answers = [found(k) for k in keys]
    coordinator_cls = nested(resp, "Coordinator")
    return build(
        resp,
        throttle_time=0,
        **answers[0],
        coordinators=tuple(
            build(coordinator_cls, key=k, **a) for k, a in zip(keys, answers, strict=True)
        )
        if coordinator_cls is not None
        else (),
    )


async def join_group(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    resp = response_cls(type(body))
    version = req.header.api_version
    session_ms = millis(body.session_timeout)
    rebalance_ms = millis(getattr(body, "rebalance_timeout", None))
    if rebalance_ms < 0:
        rebalance_ms = session_ms
    settings = ctx.state.settings
    # Kafka's group.max.session.timeout.ms; the rebalance timeout (how long this join may
    # wait, holding its connection) is cut to it rather than refused: clients set it from
    # max.poll.interval.ms, which some set to "for ever".
    rebalance_ms = min(rebalance_ms, settings.group_max_session_timeout_ms)
    session_ok = (
        settings.group_min_session_timeout_ms <= session_ms <= settings.group_max_session_timeout_ms
    )
    options = dict(
        client_id=req.header.client_id or "",
        client_host="",
        instance_id=getattr(body, "group_instance_id", None),
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        protocol_type=body.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in body.protocols],
        require_member_id=version >= 4,
    )

    def answer(code: ErrorCode, result: JoinResult | None = None, member_id: str = "") -> Any:
        member_cls = nested(resp, "JoinGroupResponseMember")
        r = result or JoinResult("", member_id)
        return build(
            resp,
            throttle_time=0,
            error_code=code,
            generation_id=r.generation,
            protocol_type=body.protocol_type,
            protocol_name=(r.protocol or None) if version >= 7 else r.protocol,
            leader=r.leader,
            skip_assignment=False,
            member_id=r.member_id or member_id,
            members=tuple(
                build(member_cls, member_id=m, group_instance_id=i, metadata=meta)
                for m, i, meta in r.members
            ),
        )

    if not access.group(body.group_id):
        return answer(GROUP_DENIED, member_id=body.member_id)
    if not session_ok:
        return answer(ErrorCode.invalid_session_timeout, member_id=body.member_id)
    groups = _groups(ctx)
    try:
        result: JoinResult = await call(groups.kafka_join, body.group_id, body.member_id, **options)
        if result.status == "member_id_required":
            return answer(ErrorCode.member_id_required, member_id=result.member_id)
        deadline = time.monotonic() + rebalance_ms / 1000 + 5
        while result.status == "waiting" and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            result = await call(groups.kafka_join, body.group_id, result.member_id, poll=True)
        if result.status == "waiting":
            return answer(ErrorCode.rebalance_in_progress, member_id=result.member_id)
        return answer(ErrorCode.none, result)
    except LakelogError as e:
        return answer(code_for(e), member_id=body.member_id)


async def sync_group(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    resp = response_cls(type(body))
    assignments = {a.member_id: bytes(a.assignment) for a in body.assignments} or None
    groups = _groups(ctx)
    code, assignment = ErrorCode.none, b""
    if not access.group(body.group_id):
        code = GROUP_DENIED
    else:
        try:
            got = await call(
                groups.kafka_sync, body.group_id, body.member_id, body.generation_id, assignments
            )
            deadline = time.monotonic() + 300
            while got is None and time.monotonic() < deadline:
                await asyncio.sleep(POLL_S)
                got = await call(
                    groups.kafka_sync, body.group_id, body.member_id, body.generation_id
                )
            if got is None:
                code = ErrorCode.rebalance_in_progress
            else:
                assignment = got
        except LakelogError as e:
            code = code_for(e)
    return build(
        resp,
        throttle_time=0,
        error_code=code,
        protocol_type=getattr(body, "protocol_type", None),
        protocol_name=getattr(body, "protocol_name", None),
        assignment=assignment,
    )


async def heartbeat(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    code = ErrorCode.none
    if not access.group(body.group_id):
        code = GROUP_DENIED
    else:
        try:
            await call(
                _groups(ctx).kafka_heartbeat, body.group_id, body.member_id, body.generation_id
            )
        except LakelogError as e:
            code = code_for(e)
    return build(response_cls(type(body)), throttle_time=0, error_code=code)


async def leave_group(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    resp = response_cls(type(body))
    members = getattr(body, "members", None)
    ids = [m.member_id for m in members] if members is not None else [body.member_id]
    if not access.group(body.group_id):
        return build(resp, throttle_time=0, error_code=GROUP_DENIED, members=())
    try:
        results = await call(_groups(ctx).kafka_leave, body.group_id, ids)
    except LakelogError as e:
        return build(resp, throttle_time=0, error_code=code_for(e), members=())
    member_cls = nested(resp, "MemberResponse")
    codes = [ErrorCode.unknown_member_id if r else ErrorCode.none for r in results]
    top = codes[0] if members is None else ErrorCode.none
    return build(
        resp,
        throttle_time=0,
        error_code=top,
        members=tuple(
            build(member_cls, member_id=m, group_instance_id=None, error_code=c)
            for m, c in zip(ids, codes, strict=True)
        )
        if member_cls is not None
        else (),
    )


async def offset_commit(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Commit the partitions of topics the principal may READ (READ on the group first);
    the others get TOPIC_AUTHORIZATION_FAILED and are not stored."""
    body = req.body
    resp = response_cls(type(body))
    generation = getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1))
    group_allowed = access.group(body.group_id)
    denied = {t.name for t in body.topics if group_allowed and not access.topic(t.name)}
    offsets = {
        TopicPartition(t.name, p.partition_index): CommittedOffset(
            p.committed_offset, p.committed_metadata or ""
        )
        for t in body.topics
        if t.name not in denied
        for p in t.partitions
    }
    code = ErrorCode.none
    try:
        if not group_allowed:
            code = GROUP_DENIED
        for tp in offsets:  # a commit naming an unknown partition stores nothing, as Kafka
            if code != ErrorCode.none:
                break
            topic = await ctx.state.topics.get(tp.topic)
            if not 0 <= tp.partition < topic.partitions:
                code = ErrorCode.unknown_topic_or_partition
        if code == ErrorCode.none and (offsets or not denied):
            await call(
                _groups(ctx).kafka_commit_offsets,
                body.group_id,
                body.member_id,
                generation,
                offsets,
            )
    except LakelogError as e:
        code = code_for(e)
    part_cls, topic_cls = (
        nested(resp, "OffsetCommitResponsePartition"),
        nested(resp, "OffsetCommitResponseTopic"),
    )
    return build(
        resp,
        throttle_time=0,
        topics=tuple(
            build(
                topic_cls,
                name=t.name,
                partitions=tuple(
                    build(
                        part_cls,
                        partition_index=p.partition_index,
                        error_code=TOPIC_DENIED if t.name in denied else code,
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        ),
    )


async def offset_fetch(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Committed offsets of the named partitions (TOPIC_AUTHORIZATION_FAILED for topics the
    principal may not DESCRIBE) or of all, less those topics; DESCRIBE on the group first."""
    body = req.body
    resp = response_cls(type(body))
    part_cls, topic_cls = (
        nested(resp, "OffsetFetchResponsePartition"),
        nested(resp, "OffsetFetchResponseTopic"),
    )
    code = ErrorCode.none
    wanted = None
    if body.topics is not None:
        wanted = [TopicPartition(t.name, p) for t in body.topics for p in t.partition_indexes]
    denied = {tp.topic for tp in wanted or () if not access.topic(tp.topic)}
    found: dict[TopicPartition, CommittedOffset] = {}
    if not access.group(body.group_id):
        code = GROUP_DENIED
        if req.header.api_version >= 2:  # the top-level code says it; v1 has one per partition
            wanted = []
        else:
            denied = {tp.topic for tp in wanted or ()}
    else:
        try:
            asked = None if wanted is None else [tp for tp in wanted if tp.topic not in denied]
            found = await call(_groups(ctx).kafka_committed, body.group_id, asked)
        except LakelogError as e:
            code = code_for(e)
    if wanted is None:
        found = {tp: c for tp, c in found.items() if access.topic(tp.topic)}
    by_topic: dict[str, list[int]] = {}
    for tp in wanted if wanted is not None else sorted(found):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    topics = []
    for name, parts in by_topic.items():
        rows = []
        for p in parts:
            c = found.get(TopicPartition(name, p))
            rows.append(
                build(
                    part_cls,
                    partition_index=p,
                    committed_offset=-1 if c is None else c.offset,
                    committed_leader_epoch=-1,
                    metadata="" if c is None else c.metadata,
                    error_code=(code if code == GROUP_DENIED else TOPIC_DENIED)
                    if name in denied
                    else 0,
                )
            )
        topics.append(build(topic_cls, name=name, partitions=tuple(rows)))
    return build(resp, throttle_time=0, topics=tuple(topics), error_code=code)


async def describe_groups(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    resp = response_cls(type(body))
    group_cls, member_cls = nested(resp, "DescribedGroup"), nested(resp, "DescribedGroupMember")

    def failed(group_id: str, code: ErrorCode) -> Any:
        return build(
            group_cls,
            error_code=code,
            group_id=group_id,
            group_state="",
            protocol_type="",
            protocol_data="",
            members=(),
            authorized_operations=-(2**31),
        )

    out = []
    for group_id in body.groups:
        if not access.group(group_id):
            out.append(failed(group_id, GROUP_DENIED))
            continue
        try:
            g = await call(_groups(ctx).kafka_describe, group_id)
        except LakelogError as e:
            out.append(failed(group_id, code_for(e)))
            continue
        if g is None or not g.members:
            state = "Dead" if g is None else g.state
            out.append(
                build(
                    group_cls,
                    error_code=0,
                    group_id=group_id,
                    group_state=state,
                    protocol_type="" if g is None else g.protocol_type,
                    protocol_data="",
                    members=(),
                    authorized_operations=-(2**31),
                )
            )
            continue
        members = tuple(
            build(
                member_cls,
                member_id=m.member_id,
                group_instance_id=m.instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=dict(m.protocols).get(g.protocol, b""),
                member_assignment=m.assignment,
            )
            for m in g.members.values()
        )
        out.append(
            build(
                group_cls,
                error_code=0,
                group_id=group_id,
                group_state=g.state,
                protocol_type=g.protocol_type,
                protocol_data=g.protocol,
                members=members,
                authorized_operations=-(2**31),
            )
        )
    return build(resp, throttle_time=0, groups=tuple(out))


async def list_groups(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Every group of both doors (REST groups show protocol type "consumer" too): all with
    DESCRIBE on the cluster, else those the principal may DESCRIBE."""
    body = req.body
    resp = response_cls(type(body))
    listed_cls = nested(resp, "ListedGroup")
    wanted = {s.lower() for s in getattr(body, "states_filter", ()) or ()}
    names = await call(ctx.state.groups.list_groups)
    if not access.cluster():
        names = [n for n in names if access.group(n)]
    out = []
    for name in names:
        g = await call(_groups(ctx).kafka_describe, name)
        state = g.state if g is not None and g.members else "Empty"
        if g is None:
            info = await call(ctx.state.groups.describe_group, name)
            state = "Stable" if info.members else "Empty"
        if wanted and state.lower() not in wanted:
            continue
        out.append(build(listed_cls, group_id=name, protocol_type="consumer", group_state=state))
    return build(resp, throttle_time=0, error_code=0, groups=tuple(out))


async def delete_groups(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    resp = response_cls(type(body))
    result_cls = nested(resp, "DeletableGroupResult")
    out = []
    for group_id in body.groups_names:
        code = ErrorCode.none
        if not access.group(group_id):
            code = GROUP_DENIED
        else:
            try:
                await call(_groups(ctx).kafka_delete_group, group_id)
            except LakelogError as e:
                code = code_for(e)
        out.append(build(result_cls, group_id=group_id, error_code=code))
    return build(resp, throttle_time=0, results=tuple(out))
