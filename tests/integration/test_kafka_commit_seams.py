"""Kafka OffsetCommit where it meets bad input and rebalances (issue 22, write side).

Raw requests over a socket (kio types) to the shared Kafka cluster, so each answer's
exact error code is seen, as a Kafka client would get it.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.join_group.v7.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.sync_group.v5.request import SyncGroupRequest, SyncGroupRequestAssignment
from kio.static.primitive import i32, i64

from tests.integration.conftest import Cluster
from tests.integration.test_kafka_clients import create_topic, kafka_call

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _commit(
    addr: str, group: str, topic: str, offset: int, *, member: str = "", generation: int = -1
) -> int:
    """One OffsetCommit v8 of partition 0; its error code."""
    body = OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=i32(generation),
        member_id=member,
        group_instance_id=None,
        topics=(
            OffsetCommitRequestTopic(
                name=topic,
                partitions=(
                    OffsetCommitRequestPartition(
                        partition_index=i32(0),
                        committed_offset=i64(offset),
                        committed_leader_epoch=i32(-1),
                        committed_metadata="",
                    ),
                ),
            ),
        ),
    )
    return int(kafka_call(addr, body).topics[0].partitions[0].error_code)


def _fetch(addr: str, group: str, topic: str) -> int:
    """OffsetFetch v7 of partition 0: the committed offset (-1: none)."""
    body = OffsetFetchRequest(
        group_id=group,
        topics=(OffsetFetchRequestTopic(name=topic, partition_indexes=(i32(0),)),),
        require_stable=False,
    )
    part = kafka_call(addr, body).topics[0].partitions[0]
    assert part.error_code == ErrorCode.none
    return int(part.committed_offset)


def test_a_negative_committed_offset_means_none_as_in_kafka(
    kafka_cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    """Issue 22 defect 7. Kafka's broker accepts a negative committed offset (it checks
    only the metadata's size), and every Kafka client reads a negative committed offset
    as "no committed offset". So: answered NONE, on a connection that stays usable, and
    the partition has no committed offset afterwards (OffsetFetch -1). On main the
    database's check failed unmapped and the connection was closed."""
    addr = kafka_cluster.kafka[0]
    topic, group = unique_topic("neg"), unique_topic("neg-g")
    create_topic(kafka_cluster, topic, 1)
    assert _commit(addr, group, topic, 5) == ErrorCode.none
    assert _fetch(addr, group, topic) == 5
    for offset in (-1, -7):
        assert _commit(addr, group, topic, offset) == ErrorCode.none
        assert _fetch(addr, group, topic) == -1


def _join(addr: str, group: str, member: str) -> Any:
    body = JoinGroupRequest(
        group_id=group,
        session_timeout=datetime.timedelta(seconds=10),
        rebalance_timeout=datetime.timedelta(seconds=10),
        member_id=member,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(JoinGroupRequestProtocol(name="range", metadata=b"\0\0\0\0\0\0"),),
    )
    return kafka_call(addr, body)


def test_offset_commit_while_the_group_completes_a_rebalance(
    kafka_cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    """Suspicion (issue 22): OffsetCommit during a rebalance. Kafka answers
    REBALANCE_IN_PROGRESS to a member at the new generation while the group completes its
    rebalance (joined, the leader's SyncGroup not in yet), and stores nothing; once synced,
    the same commit is accepted."""
    addr = kafka_cluster.kafka[0]
    topic, group = unique_topic("reb"), unique_topic("reb-g")
    create_topic(kafka_cluster, topic, 1)
    first = _join(addr, group, "")
    assert first.error_code == ErrorCode.member_id_required
    joined = _join(addr, group, first.member_id)
    assert joined.error_code == ErrorCode.none and joined.leader == first.member_id
    member, generation = first.member_id, int(joined.generation_id)

    code = _commit(addr, group, topic, 3, member=member, generation=generation)
    assert code == ErrorCode.rebalance_in_progress
    assert _fetch(addr, group, topic) == -1

    synced = kafka_call(
        addr,
        SyncGroupRequest(
            group_id=group,
            generation_id=i32(generation),
            member_id=member,
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=(SyncGroupRequestAssignment(member_id=member, assignment=b""),),
        ),
    )
    assert synced.error_code == ErrorCode.none
    assert _commit(addr, group, topic, 3, member=member, generation=generation) == 0
    assert _fetch(addr, group, topic) == 3
