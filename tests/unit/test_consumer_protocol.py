"""The consumer group protocol (KIP-848): the server-side assignors and reconciliation
(``coordinator.groups.assignors``, pure) and the group state in the coordinator
(``coordinator.groups.kafka`` through LocalCoordinator, on SQLite and PostgreSQL, with a
fake clock for sessions and rebalance timeouts).

The Kafka wire side (real clients: librdkafka and @platformatic/kafka with
``group.protocol=consumer``) is in ``tests/integration/test_kafka_client_matrix.py``.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.client import TopicPartition as TP
from coordinator.groups import assignors
from coordinator.groups.assignors import Assignment, Subscriber, partitions_of, range_, uniform
from coordinator.groups.kafka import HeartbeatResult
from coordinator.groups.model import CommittedOffset, ConsumerConfig
from coordinator.local import LocalCoordinator
from segments.errors import (
    ConsumerNotFoundError,
    FencedMemberEpochError,
    GroupNotFoundError,
    GroupProtocolConflictError,
    RequestError,
    StaleGenerationError,
    StaleMemberEpochError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
)
from tests.unit.conftest import Clock

T1, T2, T3 = b"\x01" * 16, b"\x02" * 16, b"\x03" * 16

# -- assignors -----------------------------------------------------------------------------


def subs(*topics: frozenset[bytes], previous: list[Assignment] | None = None) -> list[Subscriber]:
    prev = previous or [{} for _ in topics]
    return [Subscriber(f"m{i}", t, p) for i, (t, p) in enumerate(zip(topics, prev, strict=True))]


def owners(result: dict[str, Assignment]) -> dict[tuple[bytes, int], list[str]]:
    out: dict[tuple[bytes, int], list[str]] = {}
    for member, a in result.items():
        for tp in partitions_of(a):
            out.setdefault(tp, []).append(member)
    return out


topic_sets = st.sets(st.sampled_from([T1, T2, T3]), min_size=0, max_size=3).map(frozenset)


@settings(max_examples=200, deadline=None)
@given(
    counts=st.tuples(st.integers(1, 12), st.integers(1, 12), st.integers(1, 12)),
    subscriptions=st.lists(topic_sets, min_size=1, max_size=6),
    name=st.sampled_from(["uniform", "range"]),
)
def test_assignors_give_every_subscribed_partition_to_exactly_one_subscriber(
    counts: tuple[int, int, int], subscriptions: list[frozenset[bytes]], name: str
) -> None:
    partitions = dict(zip((T1, T2, T3), counts, strict=True))
    members = subs(*subscriptions)
    result = assignors.ASSIGNORS[name](members, partitions)
    assert set(result) == {m.member_id for m in members}
    got = owners(result)
    wanted = {
        (t, p)
        for t, n in partitions.items()
        for p in range(n)
        if any(t in s for s in subscriptions)
    }
    assert set(got) == wanted
    assert all(len(v) == 1 for v in got.values())
    by_id = {m.member_id: m for m in members}
    assert all(t in by_id[v[0]].topics for (t, _), v in got.items())


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(1, 20), min_size=1, max_size=3), n=st.integers(1, 7))
def test_uniform_is_even_for_one_subscription_and_sticky_when_a_member_joins(
    counts: list[int], n: int
) -> None:
    partitions = dict(zip((T1, T2, T3), counts, strict=False))
    everything = frozenset(partitions)
    before = uniform(subs(*[everything] * n), partitions)
    sizes = [len(partitions_of(a)) for a in before.values()]
    assert max(sizes) - min(sizes) <= 1
    # One more member: the others keep what they had as far as the new share allows.
    previous = [before[f"m{i}"] for i in range(n)] + [{}]
    after = uniform(subs(*[everything] * (n + 1), previous=previous), partitions)
    sizes = [len(partitions_of(a)) for a in after.values()]
    assert max(sizes) - min(sizes) <= 1
    total = sum(counts)
    for i in range(n):
        kept = partitions_of(after[f"m{i}"]) & partitions_of(before[f"m{i}"])
        assert len(kept) >= min(len(partitions_of(before[f"m{i}"])), total // (n + 1))


def test_range_splits_each_topic_in_contiguous_ranges_by_member_id() -> None:
    """Kafka's range: 7 partitions over 3 subscribers are 3, 2, 2; co-partitioned topics
    line up (partition p of T1 and T2 with the same member)."""
    both = frozenset({T1, T2})
    result = range_(subs(both, both, both), {T1: 7, T2: 7})
    assert result["m0"] == {T1: (0, 1, 2), T2: (0, 1, 2)}
    assert result["m1"] == {T1: (3, 4), T2: (3, 4)}
    assert result["m2"] == {T1: (5, 6), T2: (5, 6)}


# -- reconciliation ------------------------------------------------------------------------


def test_a_member_revokes_before_another_gets_its_partitions() -> None:
    """m0 holds 0-3 at epoch 1; the target at epoch 2 gives 2-3 to m1. m0 must revoke them
    first (its epoch stays 1); m1 takes epoch 2 but not 2-3 while m0 holds them; once m0's
    heartbeat shows it let go, m0 is at epoch 2 and m1 gets 2-3."""
    m0 = dict(epoch=1, state=assignors.STABLE, assigned={T1: (0, 1, 2, 3)}, revoking={})
    step = assignors.reconcile(
        **m0,
        target={T1: (0, 1)},
        target_epoch=2,
        owned=None,
        held_elsewhere=lambda t, p: False,
    )
    assert (step.epoch, step.state, step.assigned, step.revoking) == (
        1,
        assignors.UNREVOKED_PARTITIONS,
        {T1: (0, 1)},
        {T1: (2, 3)},
    )
    held = partitions_of(step.assigned) | partitions_of(step.revoking)
    m1 = assignors.reconcile(
        epoch=0,
        state=assignors.STABLE,
        assigned={},
        revoking={},
        target={T1: (2, 3)},
        target_epoch=2,
        owned={},
        held_elsewhere=lambda t, p: (t, p) in held,
    )
    assert (m1.epoch, m1.state, m1.assigned) == (2, assignors.UNRELEASED_PARTITIONS, {})

    def m0_heartbeat(owned: Assignment) -> assignors.Reconciled:
        """m0's next step from ``step`` towards the same target, reporting ``owned``."""
        return assignors.reconcile(
            epoch=step.epoch,
            state=step.state,
            assigned=step.assigned,
            revoking=step.revoking,
            target={T1: (0, 1)},
            target_epoch=2,
            owned=owned,
            held_elsewhere=lambda t, p: False,
        )

    assert m0_heartbeat({T1: (0, 1, 2, 3)}) == step  # has not revoked yet
    released = m0_heartbeat({T1: (0, 1)})
    assert (released.epoch, released.state, released.assigned, released.revoking) == (
        2,
        assignors.STABLE,
        {T1: (0, 1)},
        {},
    )
    m1 = assignors.reconcile(
        epoch=m1.epoch,
        state=m1.state,
        assigned=m1.assigned,
        revoking={},
        target={T1: (2, 3)},
        target_epoch=2,
        owned={},
        held_elsewhere=lambda t, p: (t, p) in partitions_of(released.assigned),
    )
    assert (m1.epoch, m1.state, m1.assigned) == (2, assignors.STABLE, {T1: (2, 3)})


# -- the group state in the coordinator ----------------------------------------------------


class Member:
    """A consumer-protocol client as the coordinator sees it: heartbeats that report what
    it owns, revoking at once what it is told to give up (as librdkafka does)."""

    def __init__(self, c: LocalCoordinator, group: str, topics: list[str], **kw: Any) -> None:
        self.c, self.group, self.topics, self.kw = c, group, topics, kw
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.owned: Assignment = {}

    def beat(self, **kw: Any) -> HeartbeatResult:
        first = self.epoch == 0
        options: dict[str, Any] = {
            "rebalance_timeout_ms": 30_000 if first else -1,
            "subscribed_topic_names": self.topics if first else None,
            "owned": self.owned,
            "session_timeout_ms": 10_000,
            **self.kw,
            **kw,
        }
        r = self.c.kafka_consumer_heartbeat(self.group, self.member_id, self.epoch, **options)
        self.epoch = r.member_epoch
        if r.assignment is not None:
            self.owned = r.assignment
        return r

    def leave(self) -> HeartbeatResult:
        return self.c.kafka_consumer_heartbeat(self.group, self.member_id, -1)


def settle(members: list[Member], rounds: int = 6) -> None:
    for _ in range(rounds):
        for m in members:
            m.beat()


def no_partition_twice(members: list[Member]) -> set[tuple[bytes, int]]:
    seen: set[tuple[bytes, int]] = set()
    for m in members:
        mine = partitions_of(m.owned)
        assert not seen & mine, "a partition owned by two members"
        seen |= mine
    return seen


def new_topic_and_group(c: LocalCoordinator, partitions: int) -> tuple[str, bytes, str]:
    """A new topic (name, id) and a new group name: tests on the shared coordinator each
    use their own."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    return name, c.create_topic(name, partitions).topic_id, f"g-{uuid.uuid4().hex[:8]}"


def test_two_members_split_a_topic_and_a_leave_gives_all_back(
    shared: tuple[LocalCoordinator, Clock],
) -> None:
    c, _ = shared
    topic, tid, group = new_topic_and_group(c, 6)
    a = Member(c, group, [topic])
    first = a.beat()
    assert first.member_epoch >= 1 and first.assignment == {tid: (0, 1, 2, 3, 4, 5)}
    b = Member(c, group, [topic])
    settle([a, b])
    owned = no_partition_twice([a, b])
    assert owned == {(tid, p) for p in range(6)}
    assert len(partitions_of(a.owned)) == len(partitions_of(b.owned)) == 3
    assert a.epoch == b.epoch  # both at the group's assignment epoch
    g = c.kafka_describe(group)
    assert g is not None and g.state == "Stable" and g.topic_names[tid] == topic
    assert b.leave().member_epoch == -1
    settle([a])
    assert partitions_of(a.owned) == owned


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(order=st.lists(st.integers(0, 3), min_size=10, max_size=60))
def test_no_partition_is_ever_owned_twice_whatever_the_heartbeat_order(
    shared: tuple[LocalCoordinator, Clock], order: list[int]
) -> None:
    """Race: four members join one at a time and heartbeat in any order (the order their
    requests reach the coordinator through different agents); at every step no partition
    is owned by two, and once all have heartbeated enough each owns its fair share."""
    c, _ = shared
    topic, tid, group = new_topic_and_group(c, 10)
    members = [Member(c, group, [topic]) for _ in range(4)]
    joined: list[Member] = []
    for i in order:
        m = members[i]
        if m not in joined:
            joined.append(m)
        m.beat()
        no_partition_twice(joined)
    settle(joined)
    assert no_partition_twice(joined) == {(tid, p) for p in range(10)}
    sizes = sorted(len(partitions_of(m.owned)) for m in joined)
    assert sizes[-1] - sizes[0] <= 1


def test_session_expiry_and_revocation_timeout_move_partitions(
    shared: tuple[LocalCoordinator, Clock],
) -> None:
    """A member silent past its session leaves; one that never gives up revoked
    partitions is removed after its rebalance timeout: the others get them."""
    c, clock = shared
    topic, tid, group = new_topic_and_group(c, 4)
    a, b = Member(c, group, [topic]), Member(c, group, [topic])
    settle([a, b])
    for _ in range(2):  # 12 s: past b's 10 s session; a heartbeats meanwhile
        clock.advance(6)
        a.beat()
    settle([a])
    assert partitions_of(a.owned) == {(tid, p) for p in range(4)}
    with pytest.raises(ConsumerNotFoundError):
        b.beat()
    # A member that keeps reporting revoked partitions as owned is removed at its
    # rebalance timeout (30 s here), and the newcomer gets them.
    d = Member(c, group, [topic])
    d.beat()
    hold = dict(a.owned)
    a.beat(owned=hold)  # told to revoke two, a keeps saying it owns all four
    clock.advance(5)
    a.beat(owned=hold)
    d.beat()
    assert partitions_of(d.owned) == set()
    for _ in range(4):  # 29 s more: past a's 30 s rebalance timeout (d stays alive)
        clock.advance(6.5)
        d.beat()
    with pytest.raises(ConsumerNotFoundError):
        a.beat(owned=hold)
    settle([d])
    assert partitions_of(d.owned) == {(tid, p) for p in range(4)}


def test_epochs_are_checked(shared: tuple[LocalCoordinator, Clock]) -> None:
    c, _ = shared
    topic, _, group = new_topic_and_group(c, 2)
    a = Member(c, group, [topic])
    a.beat()
    with pytest.raises(FencedMemberEpochError):
        c.kafka_consumer_heartbeat(group, a.member_id, a.epoch + 5)
    with pytest.raises(ConsumerNotFoundError):
        c.kafka_consumer_heartbeat(group, "nobody", 3)
    with pytest.raises(UnsupportedAssignorError):
        c.kafka_consumer_heartbeat(group, a.member_id, a.epoch, server_assignor="sticky")
    with pytest.raises(RequestError):  # joining while claiming partitions
        c.kafka_consumer_heartbeat(
            group, "new", 0, subscribed_topic_names=[topic], owned={T1: (0,)}
        )
    # Offsets are committed and fetched at the member's epoch only.
    offsets = {TP(topic, 0): CommittedOffset(5, "")}
    with pytest.raises(StaleMemberEpochError):
        c.kafka_commit_offsets(group, a.member_id, a.epoch - 1, offsets)
    with pytest.raises(StaleGenerationError):  # a simple consumer while the group has members
        c.kafka_commit_offsets(group, "", -1, offsets)
    c.kafka_commit_offsets(group, a.member_id, a.epoch, offsets)
    assert c.kafka_committed(group, member_id=a.member_id, member_epoch=a.epoch) == offsets
    with pytest.raises(StaleMemberEpochError):
        c.kafka_committed(group, member_id=a.member_id, member_epoch=a.epoch + 1)
    assert c.kafka_committed(group) == offsets  # an admin asks without a member


def test_one_protocol_at_a_time_and_empty_groups_convert(
    shared: tuple[LocalCoordinator, Clock],
) -> None:
    """As Kafka with group.consumer.migration.policy=disabled: a group with members of one
    protocol refuses the other (GROUP_ID_NOT_FOUND / INCONSISTENT_GROUP_PROTOCOL); once
    empty it converts, its committed offsets kept. REST consumers exclude both."""
    c, _ = shared
    topic, _, group = new_topic_and_group(c, 2)
    joined = c.kafka_join(group, "classic-1", protocols=[("range", b"")], require_member_id=False)
    assert joined.status == "done"
    with pytest.raises(GroupNotFoundError, match="not a consumer group"):
        Member(c, group, [topic]).beat()
    # Synced first: Kafka refuses a commit while the group completes its rebalance.
    c.kafka_sync(group, "classic-1", joined.generation, {"classic-1": b""})
    c.kafka_commit_offsets(
        group, "classic-1", joined.generation, {TP(topic, 0): CommittedOffset(7, "")}
    )
    c.kafka_leave(group, ["classic-1"])
    m = Member(c, group, [topic])
    m.beat()  # empty: converts to the consumer protocol
    assert c.kafka_committed(group) == {TP(topic, 0): CommittedOffset(7, "")}
    with pytest.raises(GroupProtocolConflictError, match="consumer protocol"):
        c.kafka_join(group, "classic-2", protocols=[("range", b"")], require_member_id=False)
    with pytest.raises(GroupProtocolConflictError):
        c.create_consumer(group, "rest-1", ConsumerConfig())
    m.leave()
    assert c.kafka_join(group, "classic-2", protocols=[("range", b"")], require_member_id=False)
    rest_group = f"g-{uuid.uuid4().hex[:8]}"
    c.create_consumer(rest_group, "rest-1", ConsumerConfig())
    with pytest.raises(GroupProtocolConflictError):
        Member(c, rest_group, [topic]).beat()


def test_topic_changes_start_a_new_epoch(shared: tuple[LocalCoordinator, Clock]) -> None:
    """New partitions, and a topic deleted and created again (a new id), reach the members
    on their next heartbeats, at a new epoch."""
    c, _ = shared
    topic, tid, group = new_topic_and_group(c, 2)
    a = Member(c, group, [topic])
    settle([a])
    epoch = a.epoch
    c.add_partitions(topic, 3)
    settle([a])
    assert a.epoch > epoch and a.owned == {tid: (0, 1, 2)}
    c.delete_topic(topic)
    new_id = c.create_topic(topic, 1).topic_id
    settle([a])
    assert a.owned == {new_id: (0,)}


def test_static_member_comes_back_with_its_partitions(
    shared: tuple[LocalCoordinator, Clock],
) -> None:
    c, _ = shared
    topic, tid, group = new_topic_and_group(c, 4)
    a = Member(c, group, [topic], instance_id="a")
    b = Member(c, group, [topic], instance_id="b")
    settle([a, b])
    mine = dict(a.owned)
    with pytest.raises(UnreleasedInstanceIdError):
        Member(c, group, [topic], instance_id="a").beat()
    assert c.kafka_consumer_heartbeat(group, a.member_id, -2).member_epoch == -2
    settle([b])
    assert partitions_of(b.owned).isdisjoint(partitions_of(mine))  # kept for "a"
    back = Member(c, group, [topic], instance_id="a")
    r = back.beat()
    assert r.assignment == mine
    settle([back, b])
    assert no_partition_twice([back, b]) == {(tid, p) for p in range(4)}


def test_a_lost_answer_is_asked_again_at_the_previous_epoch(
    shared: tuple[LocalCoordinator, Clock],
) -> None:
    """Lost answer: a heartbeat moved the member to a new epoch (a partition was added) but
    its answer never arrived; the member asks again at its previous epoch, owning what it
    owned. Accepted (Kafka accepts the previous epoch when the member owns no more than it
    was given), and the answer carries the new epoch and assignment. An older epoch, or
    the previous one claiming partitions it was never given, is fenced."""
    c, _ = shared
    topic, tid, group = new_topic_and_group(c, 2)
    a = Member(c, group, [topic])
    settle([a])
    old_epoch, old_owned = a.epoch, dict(a.owned)
    c.add_partitions(topic, 3)
    lost = c.kafka_consumer_heartbeat(group, a.member_id, old_epoch, owned=old_owned)
    assert lost.member_epoch > old_epoch  # the answer the client never saw
    again = c.kafka_consumer_heartbeat(group, a.member_id, old_epoch, owned=old_owned)
    assert again.member_epoch == lost.member_epoch and again.assignment == {tid: (0, 1, 2)}
    with pytest.raises(FencedMemberEpochError):
        c.kafka_consumer_heartbeat(group, a.member_id, old_epoch, owned={T1: (0,)})
    with pytest.raises(FencedMemberEpochError):
        c.kafka_consumer_heartbeat(group, a.member_id, old_epoch - 1, owned={})


def test_a_group_at_the_size_of_a_big_topic(shared: tuple[LocalCoordinator, Clock]) -> None:
    """2,500 partitions over 7 members (more than one DescribeTopicPartitions page, more
    than any test above): each partition owned once, the counts within one of each other,
    and a member leaving hands its partitions to the others without moving the rest."""
    c, _ = shared
    topic, tid, group = new_topic_and_group(c, 2500)
    members = [Member(c, group, [topic]) for _ in range(7)]
    settle(members, rounds=4)
    assert no_partition_twice(members) == {(tid, p) for p in range(2500)}
    sizes = sorted(len(partitions_of(m.owned)) for m in members)
    assert sizes[-1] - sizes[0] <= 1
    before = {m.member_id: partitions_of(m.owned) for m in members}
    members[0].leave()
    settle(members[1:], rounds=4)
    assert no_partition_twice(members[1:]) == {(tid, p) for p in range(2500)}
    for m in members[1:]:
        assert before[m.member_id] <= partitions_of(m.owned)  # sticky: nothing taken away
