"""Kafka consumer-group APIs over the coordinator's group state (``coordinator.groups.kafka``).

Every agent is a group coordinator, and a transaction coordinator (FindCoordinator
answers with the agent asked, for a group or a transactional id): the group and the
transaction live in the coordinator, so a client may reach any agent with any call.
JoinGroup and SyncGroup wait for the round to complete by asking the coordinator
again every ``POLL_S`` (the other members' calls may reach other agents); the wait
ends at the rebalance timeout. Committed offsets are the ones REST consumers use.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

from kio.schema.errors import ErrorCode

from coordinator.client import TopicInfo, TopicPartition
from coordinator.groups.assignors import Assignment
from coordinator.groups.kafka import (
    CLASSIC,
    CONSUMER,
    HeartbeatResult,
    JoinResult,
    KafkaGroup,
    KafkaGroupCoordinator,
    group_assignor,
)
from coordinator.groups.model import CommittedOffset
from segments.errors import LakelogError
from service.executors import call
from service.kafka.acl import GROUP_DENIED, TOPIC_DENIED, TRANSACTIONAL_ID_DENIED, Access
from service.kafka.errors import code_for
from service.kafka.framing import Request, build, millis, nested
from service.kafka.handlers import (
    KafkaContext,
    NamedTopic,
    TopicKey,
    resolve_topic,
    response_cls,
    topic_fields,
    topic_key,
)

#: How often a waiting JoinGroup or SyncGroup asks the coordinator again.
POLL_S = 0.05
GROUP_KEY, TRANSACTION_KEY = 0, 1


def _groups(ctx: KafkaContext) -> KafkaGroupCoordinator:
    return cast(KafkaGroupCoordinator, ctx.state.coordinator)


async def _describe(
    ctx: KafkaContext, access: Access, group_id: str
) -> tuple[KafkaGroup | None, ErrorCode, str | None]:
    """DescribeGroups' and ConsumerGroupDescribe's look at one group: the group (None: no
    such group) and ErrorCode.none, else None, the error code and its message."""
    if not access.group(group_id):
        return None, GROUP_DENIED, None
    try:
        return await call(_groups(ctx).kafka_describe, group_id), ErrorCode.none, None
    except LakelogError as e:
        return None, code_for(e), e.message


async def find_coordinator(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    resp = response_cls(type(body))
    me = ctx.state.broker_id
    keys = getattr(body, "coordinator_keys", None) or (getattr(body, "key", ""),)
    key_type = getattr(body, "key_type", GROUP_KEY)  # v0 asks for groups only

    def found(key: str) -> dict[str, Any]:
        code, message = ErrorCode.none, None
        if key_type not in (GROUP_KEY, TRANSACTION_KEY):  # v6's share groups (KIP-932)
            code, message = ErrorCode.invalid_request, "Share groups are not supported."
        elif key_type == TRANSACTION_KEY:
            # Any agent coordinates any transactional id: its state is in the coordinator.
            if not access.transactional_id(key):
                code = TRANSACTIONAL_ID_DENIED
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
    the others get TOPIC_AUTHORIZATION_FAILED and are not stored. Topics are named by
    name, or by id from v10. A commit naming an unknown topic, id or partition stores
    nothing, as Kafka. From v9 a consumer-protocol member commits at its member epoch."""
    body = req.body
    resp = response_cls(type(body))
    generation = getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1))
    group_allowed = access.group(body.group_id)
    named: dict[TopicKey, NamedTopic] = {}
    for t in body.topics if group_allowed else ():
        key = topic_key(t)
        named[key] = await resolve_topic(ctx, key, access.topic)
    denied = {k for k, n in named.items() if n.error == TOPIC_DENIED}
    code = ErrorCode.none if group_allowed else GROUP_DENIED
    offsets: dict[TopicPartition, CommittedOffset] = {}
    for t in body.topics if group_allowed else ():
        n = named[topic_key(t)]
        if n.error == TOPIC_DENIED:
            continue
        for p in t.partitions:
            if n.info is None or not 0 <= p.partition_index < n.info.partitions:
                code = n.error if n.info is None else ErrorCode.unknown_topic_or_partition
                continue
            offsets[TopicPartition(n.info.name, p.partition_index)] = CommittedOffset(
                p.committed_offset, p.committed_metadata or ""
            )
    try:
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
    topics = []
    for t in body.topics:
        key = topic_key(t)
        topics.append(
            build(
                topic_cls,
                **topic_fields(key),
                partitions=tuple(
                    build(
                        part_cls,
                        partition_index=p.partition_index,
                        error_code=TOPIC_DENIED if key in denied else code,
                    )
                    for p in t.partitions
                ),
            )
        )
    return build(resp, throttle_time=0, topics=tuple(topics))


async def offset_fetch(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Committed offsets of each group asked (one before v8, several from v8: KIP-709).

    Per group: the named partitions (TOPIC_AUTHORIZATION_FAILED for topics the principal
    may not DESCRIBE; by id from v10, an unknown id UNKNOWN_TOPIC_ID) or all, less those
    topics; DESCRIBE on the group first. From v9 a consumer-protocol member names itself
    (member id and epoch), checked as Kafka checks it. With ``require_stable`` (v7+,
    what read_committed consumers send), a partition whose offset an ongoing transaction
    holds answers UNSTABLE_OFFSET_COMMIT, and the client asks again.
    """
    body = req.body
    resp = response_cls(type(body))
    version = req.header.api_version
    groups = getattr(body, "groups", None)
    if groups is None:  # before v8: one group, its fields at the top
        one = await _offset_fetch_group(
            ctx,
            access,
            version,
            body.group_id,
            None,
            -1,
            body.topics,
            getattr(body, "require_stable", False),
        )
        part_cls, topic_cls = (
            nested(resp, "OffsetFetchResponsePartition"),
            nested(resp, "OffsetFetchResponseTopic"),
        )
        return build(
            resp,
            throttle_time=0,
            topics=_offset_fetch_topics(one, topic_cls, part_cls),
            error_code=one.code,
        )
    group_cls, topic_cls, part_cls = (
        nested(resp, "OffsetFetchResponseGroup"),
        nested(resp, "OffsetFetchResponseTopics"),
        nested(resp, "OffsetFetchResponsePartitions"),
    )
    out = []
    for g in groups:
        one = await _offset_fetch_group(
            ctx,
            access,
            version,
            g.group_id,
            getattr(g, "member_id", None),
            getattr(g, "member_epoch", -1),
            g.topics,
            getattr(body, "require_stable", False),
        )
        out.append(
            build(
                group_cls,
                group_id=g.group_id,
                topics=_offset_fetch_topics(one, topic_cls, part_cls),
                error_code=one.code,
            )
        )
    return build(resp, throttle_time=0, groups=tuple(out))


@dataclass
class _GroupOffsets:
    """One group's OffsetFetch answer: its code, then per topic (as asked) its rows."""

    code: ErrorCode = ErrorCode.none
    #: topic key -> (topic info or None, [(partition, committed or None, code)])
    topics: dict[
        Any, tuple[TopicInfo | None, list[tuple[int, CommittedOffset | None, ErrorCode]]]
    ] = field(default_factory=dict)


async def _offset_fetch_group(
    ctx: KafkaContext,
    access: Access,
    version: int,
    group_id: str,
    member_id: str | None,
    member_epoch: int,
    topics: Any,
    require_stable: bool = False,
) -> _GroupOffsets:
    out = _GroupOffsets()
    named: dict[Any, NamedTopic] = {}
    if topics is not None:
        for t in topics:
            key = topic_key(t)
            if isinstance(key, uuid.UUID):
                named[key] = await resolve_topic(ctx, key, access.topic)
            else:
                ok = access.topic(key)
                named[key] = NamedTopic(key, None, ErrorCode.none if ok else TOPIC_DENIED)
    if not access.group(group_id):
        out.code = GROUP_DENIED
        if version < 2:  # v0/v1 have no top-level code: each partition says it
            for t in topics or ():
                key = topic_key(t)
                out.topics[key] = (None, [(p, None, GROUP_DENIED) for p in t.partition_indexes])
        return out
    asked = None
    if topics is not None:
        asked = [
            TopicPartition(str(named[k].name), p)
            for t in topics
            if named[k := topic_key(t)].error == ErrorCode.none
            for p in t.partition_indexes
        ]
    found: dict[TopicPartition, CommittedOffset] = {}
    try:
        found = await call(
            _groups(ctx).kafka_committed,
            group_id,
            asked,
            member_id=member_id or "",
            member_epoch=member_epoch,
        )
    except LakelogError as e:
        out.code = code_for(e)
    unstable: set[TopicPartition] = set()
    if require_stable and asked and out.code == ErrorCode.none:
        # Offsets an ongoing transaction holds: the client asks again once it ended.
        try:
            unstable = set(await call(ctx.state.txns.held_offsets, group_id))
        except LakelogError as e:
            out.code = code_for(e)
    if topics is None:
        ids: dict[str, TopicInfo | None] = {}
        for tp in sorted(found):
            if not access.topic(tp.topic):
                continue
            if tp.topic not in ids:
                ids[tp.topic] = await _topic_or_none(ctx, tp.topic)
            rows = out.topics.setdefault(tp.topic, (ids[tp.topic], []))[1]
            rows.append((tp.partition, found[tp], ErrorCode.none))
        return out
    for t in topics:
        key = topic_key(t)
        n = named[key]
        info = n.info
        if info is None and isinstance(key, str) and n.error == ErrorCode.none:
            info = await _topic_or_none(ctx, key)  # its id, for the answer (v10 has ids)
        rows = out.topics.setdefault(key, (info, []))[1]
        for p in t.partition_indexes:
            tp = TopicPartition(str(n.name), p)
            c = found.get(tp) if n.error == ErrorCode.none else None
            if n.error == ErrorCode.none and tp in unstable:
                rows.append((p, None, ErrorCode.unstable_offset_commit))
            else:
                rows.append((p, c, n.error))
    return out


async def _topic_or_none(ctx: KafkaContext, name: str) -> TopicInfo | None:
    try:
        return await ctx.state.topics.get(name)
    except LakelogError:
        return None


def _offset_fetch_topics(one: _GroupOffsets, topic_cls: Any, part_cls: Any) -> tuple[Any, ...]:
    return tuple(
        build(
            topic_cls,
            **topic_fields(key, info),
            partitions=tuple(
                build(
                    part_cls,
                    partition_index=p,
                    committed_offset=-1 if c is None else c.offset,
                    committed_leader_epoch=-1,
                    metadata="" if c is None else c.metadata,
                    error_code=code,
                )
                for p, c, code in rows
            ),
        )
        for key, (info, rows) in one.topics.items()
    )


async def describe_groups(ctx: KafkaContext, req: Request, access: Access) -> Any:
    body = req.body
    resp = response_cls(type(body))
    group_cls, member_cls = nested(resp, "DescribedGroup"), nested(resp, "DescribedGroupMember")

    def failed(
        group_id: str, code: ErrorCode, message: str | None = None, state: str = "", ptype: str = ""
    ) -> Any:
        return build(
            group_cls,
            error_code=code,
            error_message=message,
            group_id=group_id,
            group_state=state,
            protocol_type=ptype,
            protocol_data="",
            members=(),
            authorized_operations=-(2**31),
        )

    out = []
    for group_id in body.groups:
        g, code, _ = await _describe(ctx, access, group_id)
        if code != ErrorCode.none:
            out.append(failed(group_id, code))
            continue
        if g is not None and g.group_type == CONSUMER and g.members:
            # Kafka 4.x: DescribeGroups is for classic groups (v6 says why); the consumer
            # protocol's are described by ConsumerGroupDescribe.
            message = f"Group {group_id} is not a classic group."
            out.append(failed(group_id, ErrorCode.group_id_not_found, message, "Dead"))
            continue
        if g is None:
            out.append(failed(group_id, ErrorCode.none, state="Dead"))
            continue
        if not g.members:
            out.append(failed(group_id, ErrorCode.none, state=g.state, ptype=g.protocol_type))
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
    DESCRIBE on the cluster, else those the principal may DESCRIBE. From v5 each says its
    type ("classic" or "consumer": KIP-848's) and may be filtered by type (KIP-1043)."""
    body = req.body
    resp = response_cls(type(body))
    listed_cls = nested(resp, "ListedGroup")
    wanted = {s.lower() for s in getattr(body, "states_filter", ()) or ()}
    types = {t.lower() for t in getattr(body, "types_filter", ()) or ()}
    names = await call(ctx.state.groups.list_groups)
    if not access.cluster():
        names = [n for n in names if access.group(n)]
    out = []
    for name in names:
        g = await call(_groups(ctx).kafka_describe, name)
        state = g.state if g is not None and g.members else "Empty"
        group_type = g.group_type if g is not None else CLASSIC
        if g is None:
            info = await call(ctx.state.groups.describe_group, name)
            state = "Stable" if info.members else "Empty"
        if (wanted and state.lower() not in wanted) or (types and group_type not in types):
            continue
        out.append(
            build(
                listed_cls,
                group_id=name,
                protocol_type="consumer",
                group_state=state,
                group_type=group_type,
            )
        )
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


# -- the consumer group protocol (KIP-848) ----------------------------------------------


async def consumer_group_heartbeat(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """ConsumerGroupHeartbeat: join, stay or leave a consumer-protocol group; the answer
    carries the member's epoch and, when it changed, its assignment (by topic id).

    READ on the group; DESCRIBE on every topic a subscription names
    (TOPIC_AUTHORIZATION_FAILED otherwise, as Kafka). The group's state lives in the
    coordinator: any agent serves any heartbeat.
    """
    body = req.body
    resp = response_cls(type(body))
    settings = ctx.state.settings

    def answer(
        code: ErrorCode, message: str | None = None, result: HeartbeatResult | None = None
    ) -> Any:
        assignment = None
        if result is not None and result.assignment is not None:
            tp_cls, a_cls = nested(resp, "TopicPartitions"), nested(resp, "Assignment")
            assignment = build(
                a_cls,
                topic_partitions=tuple(
                    build(tp_cls, topic_id=uuid.UUID(bytes=t), partitions=ps)
                    for t, ps in result.assignment.items()
                ),
            )
        return build(
            resp,
            throttle_time=0,
            error_code=code,
            error_message=message,
            member_id=result.member_id if result is not None else (body.member_id or None),
            member_epoch=result.member_epoch if result is not None else -1,
            heartbeat_interval=settings.kafka_group_heartbeat_interval_ms,
            assignment=assignment,
        )

    if not access.group(body.group_id):
        return answer(GROUP_DENIED)
    names = body.subscribed_topic_names
    if names is not None and not all(access.topic(n) for n in names):
        return answer(TOPIC_DENIED)
    if req.header.api_version >= 1 and not body.member_id:  # v1: the client names itself
        return answer(ErrorCode.invalid_request, "MemberId can't be empty.")
    owned = None
    if body.topic_partitions is not None:
        owned = {
            bytes(uuid.UUID(str(t.topic_id)).bytes): tuple(sorted(int(p) for p in t.partitions))
            for t in body.topic_partitions
            if t.topic_id is not None
        }
    try:
        result = await call(
            _groups(ctx).kafka_consumer_heartbeat,
            body.group_id,
            body.member_id,
            body.member_epoch,
            instance_id=body.instance_id,
            rack_id=body.rack_id,
            rebalance_timeout_ms=millis(body.rebalance_timeout),
            subscribed_topic_names=None if names is None else list(names),
            subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None),
            server_assignor=body.server_assignor,
            owned=owned,
            client_id=req.header.client_id or "",
            client_host=access.host,
            session_timeout_ms=settings.kafka_group_session_timeout_ms,
        )
    except LakelogError as e:
        return answer(code_for(e), e.message)
    return answer(ErrorCode.none, None, result)


async def consumer_group_describe(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """ConsumerGroupDescribe: consumer-protocol groups with their epochs, members,
    subscriptions, assignments and targets. A classic group with members is
    GROUP_ID_NOT_FOUND ("not a consumer group"), as Kafka answers; an unknown or empty
    one is described as Empty (Kafka: Dead), so admin clients can fall back."""
    body = req.body
    resp = response_cls(type(body))
    group_cls, member_cls, a_cls, tp_cls = (
        nested(resp, "DescribedGroup"),
        nested(resp, "Member"),
        nested(resp, "Assignment"),
        nested(resp, "TopicPartitions"),
    )

    def failed(group_id: str, code: ErrorCode, message: str | None = None) -> Any:
        return build(
            group_cls,
            error_code=code,
            error_message=message,
            group_id=group_id,
            group_state="Dead",
            group_epoch=-1,
            assignment_epoch=-1,
            assignor_name="",
            members=(),
            authorized_operations=-(2**31),
        )

    def assignment(g: KafkaGroup, a: Assignment) -> Any:
        return build(
            a_cls,
            topic_partitions=tuple(
                build(
                    tp_cls,
                    topic_id=uuid.UUID(bytes=t),
                    topic_name=g.topic_names.get(t, ""),
                    partitions=ps,
                )
                for t, ps in a.items()
            ),
        )

    out = []
    for group_id in body.group_ids:
        g, code, message = await _describe(ctx, access, group_id)
        if code != ErrorCode.none:
            out.append(failed(group_id, code, message))
            continue
        if g is None:
            out.append(
                failed(group_id, ErrorCode.group_id_not_found, f"Group {group_id} not found.")
            )
            continue
        if g.group_type != CONSUMER and g.members:
            out.append(
                failed(
                    group_id,
                    ErrorCode.group_id_not_found,
                    f"Group {group_id} is not a consumer group.",
                )
            )
            continue
        members = []
        for m in sorted(g.members.values(), key=lambda m: m.member_id):
            c = m.consumer
            if c is None:
                continue
            members.append(
                build(
                    member_cls,
                    member_id=m.member_id,
                    instance_id=m.instance_id,
                    rack_id=c.rack_id,
                    member_epoch=c.epoch,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    subscribed_topic_names=c.topics,
                    subscribed_topic_regex=c.regex,
                    assignment=assignment(g, c.assigned),
                    target_assignment=assignment(g, c.target),
                    member_type=CONSUMER_MEMBER,
                )
            )
        out.append(
            build(
                group_cls,
                error_code=ErrorCode.none,
                error_message=None,
                group_id=group_id,
                group_state=g.state if g.members else "Empty",
                group_epoch=g.generation,
                assignment_epoch=g.assignment_epoch,
                assignor_name=group_assignor(list(g.members.values())),
                members=tuple(members),
                authorized_operations=-(2**31),
            )
        )
    return build(resp, throttle_time=0, groups=tuple(out))


#: ConsumerGroupDescribe v1's member types (KIP-1099): classic 0, consumer 1.
CONSUMER_MEMBER = 1
