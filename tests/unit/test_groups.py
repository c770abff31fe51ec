"""Consumer groups in the coordinator (coordinator.groups.store) through LocalCoordinator.

Every store test runs on SQLite and on PostgreSQL (the ``db_url`` fixture). A fake
clock is injected (``LocalCoordinator(now=...)``) so session and instance expiry are
tested without sleeping. High watermarks come from real commits.
The HTTP round trips and the multi-client race are in
``tests/integration/test_groups_http.py``.
"""

from __future__ import annotations

import itertools
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.client import ChunkCommit
from coordinator.client import TopicPartition as TP
from coordinator.groups.model import CommittedOffset, ConsumerConfig, ConsumerState, GroupInfo
from coordinator.groups.store import assign_range, assign_roundrobin
from coordinator.local import LocalCoordinator
from segments.errors import (
    ConsumerExistsError,
    ConsumerNotFoundError,
    ConsumerStateError,
    GroupNotFoundError,
    InvalidConsumerConfigError,
    InvalidTopicNameError,
    InvalidTopicPatternError,
    PartitionNotFoundError,
    StaleGenerationError,
    TopicNotFoundError,
)
from tests.conftest import sql_rows
from tests.unit.conftest import Clock

SESSION_MS = 10_000
INSTANCE_MS = 60_000


def cfg(**kw: object) -> ConsumerConfig:
    base: dict[str, object] = {
        "session_timeout_ms": SESSION_MS,
        "instance_timeout_ms": INSTANCE_MS,
        "auto_offset_reset": "earliest",
    }
    base.update(kw)
    return ConsumerConfig(**base)  # type: ignore[arg-type]


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(c: LocalCoordinator, topic: str, partition: int, count: int) -> None:
    """Commit ``count`` records to a partition, moving its high watermark."""
    topic_id = c.get_topic(topic).topic_id
    c.commit(f"obj-{uuid.uuid4().hex}", [ChunkCommit(topic_id, partition, 0, 10, count, 1, 2)])


def owners(info: GroupInfo) -> dict[TP, list[str]]:
    result: dict[TP, list[str]] = {}
    for m in info.members:
        if not m.manual:
            for tp in m.assignment:
                result.setdefault(tp, []).append(m.name)
    return result


# -- assignors ---------------------------------------------------------------


def test_range_matches_kafka_range_assignor() -> None:
    """Kafka's RangeAssignor examples: 2 members over topics of 3 partitions -> c0 gets
    p0,p1 and c1 gets p2, per topic; uneven subscriptions range per topic."""
    subs = {"c1": ["t0", "t1"], "c0": ["t0", "t1"]}
    assert assign_range(subs, {"t0": 3, "t1": 3}) == {
        "c0": [TP("t0", 0), TP("t0", 1), TP("t1", 0), TP("t1", 1)],
        "c1": [TP("t0", 2), TP("t1", 2)],
    }
    # 3 members, 7 partitions: 3, 2, 2.
    assert assign_range({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": 7}) == {
        "a": [TP("t", 0), TP("t", 1), TP("t", 2)],
        "b": [TP("t", 3), TP("t", 4)],
        "c": [TP("t", 5), TP("t", 6)],
    }
    # More members than partitions: the last ones get nothing.
    assert assign_range({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": 2}) == {
        "a": [TP("t", 0)],
        "b": [TP("t", 1)],
        "c": [],
    }


def test_roundrobin_matches_kafka_roundrobin_assignor() -> None:
    """Kafka's RoundRobinAssignor examples (its javadoc): equal and unequal subscriptions."""
    assert assign_roundrobin({"C0": ["t0", "t1"], "C1": ["t0", "t1"]}, {"t0": 3, "t1": 3}) == {
        "C0": [TP("t0", 0), TP("t0", 2), TP("t1", 1)],
        "C1": [TP("t0", 1), TP("t1", 0), TP("t1", 2)],
    }
    subs = {"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}
    assert assign_roundrobin(subs, {"t0": 1, "t1": 2, "t2": 3}) == {
        "C0": [TP("t0", 0)],
        "C1": [TP("t1", 0)],
        "C2": [TP("t1", 1), TP("t2", 0), TP("t2", 1), TP("t2", 2)],
    }


subscriptions_st = st.dictionaries(
    st.sampled_from([f"m{i}" for i in range(6)]),
    st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4, unique=True),
    min_size=1,
)
counts_st = st.fixed_dictionaries({t: st.integers(1, 9) for t in "abcd"})


@given(subs=subscriptions_st, counts=counts_st, assignor=st.sampled_from(["range", "roundrobin"]))
def test_assignors_own_every_subscribed_partition_exactly_once(
    subs: dict[str, list[str]], counts: dict[str, int], assignor: str
) -> None:
    fn = assign_range if assignor == "range" else assign_roundrobin
    result = fn(subs, counts)
    assert set(result) == set(subs)
    owned = [tp for tps in result.values() for tp in tps]
    wanted = {TP(t, p) for ts in subs.values() for t in ts for p in range(counts[t])}
    assert sorted(owned) == sorted(wanted)  # exactly once each
    for member, tps in result.items():
        assert {tp.topic for tp in tps} <= set(subs[member])
    if assignor == "range":
        # Per topic, the subscribers' shares differ by at most one.
        for t in {t for ts in subs.values() for t in ts}:
            shares = [sum(tp.topic == t for tp in result[m]) for m in subs if t in subs[m]]
            assert max(shares) - min(shares) <= 1


# -- rebalancing through the store -----------------------------------------------


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    counts=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    members=st.lists(
        st.tuples(st.sets(st.integers(0, 3), min_size=1), st.booleans()), min_size=1, max_size=5
    ),
    assignor=st.sampled_from(["range", "roundrobin"]),
)
def test_group_assignment_properties(
    shared: tuple[LocalCoordinator, Clock],
    counts: list[int],
    members: list[tuple[set[int], bool]],
    assignor: str,
) -> None:
    """Random members, subscriptions and partition counts, through the real store: every
    subscribed partition is owned by exactly one live member, nobody owns a topic it did
    not subscribe to, each join/subscribe bumps the generation, and the assignment is the
    assignor's over the live members; after some sessions lapse the same holds for the rest.
    """
    c, clock = shared
    prefix = uniq("p")
    topics = [f"{prefix}-{i}" for i in range(len(counts))]
    for t, n in zip(topics, counts, strict=True):
        c.create_topic(t, n)
    group = uniq("g")
    generation = 0
    subs: dict[str, list[str]] = {}
    for i, (wanted, _) in enumerate(members):
        name = f"m{i}"
        state = c.create_consumer(group, name, cfg(assignor=assignor))
        assert state.generation > generation
        generation = state.generation
        subs[name] = sorted(topics[j] for j in wanted if j < len(topics)) or [topics[0]]
        state = c.subscribe(group, name, subs[name])
        assert state.generation > generation
        generation = state.generation

    def check(live: dict[str, list[str]]) -> None:
        info = c.describe_group(group)
        own = owners(info)
        wanted = {
            TP(t, p) for ts in live.values() for t in ts for p in range(c.get_topic(t).partitions)
        }
        assert set(own) == wanted
        assert all(len(names) == 1 for names in own.values())
        fn = assign_range if assignor == "range" else assign_roundrobin
        expected = fn(live, {t: c.get_topic(t).partitions for ts in live.values() for t in ts})
        for m in info.members:
            assert {tp.topic for tp in m.assignment} <= set(live.get(m.name, []))
            assert list(m.assignment) == expected.get(m.name, [])
            assert m.generation == info.generation
            # Everyone is "earliest" on empty partitions: every owned partition at 0.
            assert m.positions == dict.fromkeys(m.assignment, 0)

    check(subs)
    # Members flagged True stop polling; the others poll just before the session lapses.
    clock.advance(SESSION_MS / 1000 - 1)
    keep = {f"m{i}" for i, (_, stops) in enumerate(members) if not stops}
    for name in sorted(keep):
        c.consumer(group, name)
    clock.advance(2)
    check({name: ts for name, ts in subs.items() if name in keep})


def test_generation_bumps_on_each_change(c: LocalCoordinator) -> None:
    """Join, subscribe, partition growth, a new topic matching a pattern, topic deletion,
    unsubscribe and leave each give a new generation; a no-op re-subscribe does not."""
    c.create_topic("gen-a", 2)
    gens = [c.create_consumer("g", "x", cfg()).generation]

    def bumped(state: ConsumerState | None = None) -> None:
        now = (state or c.consumer("g", "x")).generation
        assert now == gens[-1] + 1
        gens.append(now)

    bumped(c.subscribe("g", "x", ["gen-a"]))
    assert c.subscribe("g", "x", ["gen-a"]).generation == gens[-1]  # same subscription
    c.create_consumer("g", "y", cfg())
    bumped()
    c.add_partitions("gen-a", 4)
    bumped()
    assert len(c.consumer("g", "x").assignment) == 4
    c.create_topic("gen-b", 1)
    assert c.consumer("g", "x").generation == gens[-1]  # nobody subscribes to it
    bumped(c.subscribe("g", "x", pattern=r"gen-.*"))
    assert c.consumer("g", "x").subscription == ("gen-a", "gen-b")
    # The same matches through another pattern: not a change (as Kafka compares topic sets).
    assert c.subscribe("g", "x", pattern=r"gen-[a-z]").generation == gens[-1]
    c.create_topic("gen-c", 1)  # a new topic matching the pattern
    bumped()
    c.create_topic("gen-cc", 1)  # does not fullmatch gen-[a-z]
    assert c.consumer("g", "x").subscription == ("gen-a", "gen-b", "gen-c")
    c.create_topic("other", 1)  # does not match: no rebalance
    assert c.consumer("g", "x").generation == gens[-1]
    c.delete_topic("gen-a")
    bumped()
    assert c.consumer("g", "x").assignment == (TP("gen-b", 0), TP("gen-c", 0))
    c.unsubscribe("g", "x")
    bumped()
    c.delete_consumer("g", "y")
    bumped()
    assert c.consumer("g", "x").assignment == ()


def test_session_expiry_moves_partitions_to_the_others(c: LocalCoordinator, clock: Clock) -> None:
    """A member that stops polling past its session timeout loses its partitions to the
    live ones at the next group call; its stale advance and commit are refused; it rejoins
    (new generation, its share back) when it polls again."""
    c.create_topic("se", 4)
    for name in ("a", "b"):
        c.create_consumer("g", name, cfg())
        c.subscribe("g", name, ["se"])
    a = c.consumer("g", "a")
    assert a.assignment == (TP("se", 0), TP("se", 1))
    clock.advance(6)
    c.consumer("g", "b")  # b keeps polling
    clock.advance(6)  # a silent for 12 s > 10 s
    b = c.consumer("g", "b")
    assert b.assignment == tuple(TP("se", p) for p in range(4))
    assert b.generation == a.generation + 1
    info = c.describe_group("g")
    assert [m.name for m in info.members] == ["a", "b"]  # a still exists
    assert info.members[0].assignment == ()

    with pytest.raises(StaleGenerationError):
        c.advance("g", "a", a.generation, {TP("se", 0): 5})
    with pytest.raises(StaleGenerationError):
        c.commit_offsets("g", "a", {TP("se", 0): CommittedOffset(5)}, a.generation)
    assert c.committed_offsets("g", [TP("se", 0)]) == {}

    a2 = c.consumer("g", "a")  # polls again: rejoins
    assert a2.assignment == (TP("se", 0), TP("se", 1))
    assert a2.generation > b.generation


def test_lapsed_member_unobserved_keeps_its_partitions(c: LocalCoordinator, clock: Clock) -> None:
    """Expiry is lazy: a member silent past its session whose lapse no other call saw
    polls again at the same generation (nobody else can have taken its partitions)."""
    c.create_topic("lazy", 2)
    c.create_consumer("g", "a", cfg())
    state = c.subscribe("g", "a", ["lazy"])
    clock.advance(SESSION_MS / 1000 * 3)
    again = c.advance("g", "a", state.generation, {TP("lazy", 0): 0})
    assert again.generation == state.generation
    assert again.assignment == state.assignment


def test_instance_expiry_deletes(c: LocalCoordinator, clock: Clock) -> None:
    """An instance idle past instance_timeout_ms is deleted (404 afterwards); committed
    offsets stay and the group shows EMPTY. Any call renews the idle timer."""
    c.create_topic("ie", 1)
    c.create_consumer("g", "idle", cfg())
    c.subscribe("g", "idle", ["ie"])
    c.commit_offsets("g", "idle", {TP("ie", 0): CommittedOffset(0, "m")})
    clock.advance(INSTANCE_MS / 1000 - 1)
    c.commit_offsets("g", "idle", {})  # renews last_seen (not the session)
    clock.advance(INSTANCE_MS / 1000 - 1)
    assert c.consumer("g", "idle", touch=False).name == "idle"
    clock.advance(2)
    with pytest.raises(ConsumerNotFoundError):
        c.consumer("g", "idle")
    with pytest.raises(ConsumerNotFoundError):
        c.seek("g", "idle", {})
    info = c.describe_group("g")
    assert info.state == "EMPTY"
    assert info.members == ()
    assert info.committed == {TP("ie", 0): CommittedOffset(0, "m")}
    assert c.list_groups() == ["g"]
    # The name is free again.
    assert c.create_consumer("g", "idle", cfg()).name == "idle"


def test_consumer_without_touch_renews_nothing(c: LocalCoordinator, clock: Clock) -> None:
    c.create_consumer("g", "x", cfg())
    clock.advance(INSTANCE_MS / 1000 - 1)
    assert c.consumer("g", "x", touch=False).last_seen == clock.t - (INSTANCE_MS / 1000 - 1)
    clock.advance(2)
    with pytest.raises(ConsumerNotFoundError):
        c.consumer("g", "x", touch=False)


# -- positions -------------------------------------------------------------------


def test_positions_resolve_from_committed_offsets_then_reset_policy(
    c: LocalCoordinator, db_url: str
) -> None:
    """Newly owned partitions start at the group's committed offset, else at the reset
    policy (earliest = log-start, latest = high watermark, none = unresolved); a committed
    offset or position below log-start follows the reset policy."""
    c.create_topic("pos", 3)
    for p in range(3):
        produce(c, "pos", p, 10)
    c.create_consumer("g", "a", cfg(auto_offset_reset="earliest"))
    a = c.subscribe("g", "a", ["pos"])
    assert a.positions == {TP("pos", p): 0 for p in range(3)}
    c.commit_offsets("g", "a", {TP("pos", 0): CommittedOffset(4)}, a.generation)
    c.delete_consumer("g", "a")

    c.create_consumer("g", "b", cfg(auto_offset_reset="latest"))
    b = c.subscribe("g", "b", ["pos"])
    assert b.positions == {TP("pos", 0): 4, TP("pos", 1): 10, TP("pos", 2): 10}
    assert b.unresolved == ()
    # "latest" is resolved once: new records after that are consumed, not skipped.
    produce(c, "pos", 1, 5)
    assert c.consumer("g", "b").positions[TP("pos", 1)] == 10
    c.delete_consumer("g", "b")

    c.create_consumer("g", "n", cfg(auto_offset_reset="none"))
    n = c.subscribe("g", "n", ["pos"])
    assert n.positions == {TP("pos", 0): 4}
    assert n.unresolved == (TP("pos", 1), TP("pos", 2))

    # Retention moved log-start of p0 past the committed offset and n's position.
    sql_rows(
        db_url,
        "UPDATE partitions SET log_start_offset = 6 WHERE partition = 0 AND topic_id = ?",
        (c.get_topic("pos").topic_id,),
    )
    n = c.consumer("g", "n")
    assert n.positions == {}
    assert n.unresolved == (TP("pos", 0), TP("pos", 1), TP("pos", 2))
    c.delete_consumer("g", "n")
    c.create_consumer("g", "e", cfg(auto_offset_reset="earliest"))
    e = c.subscribe("g", "e", ["pos"])
    assert e.positions == {TP("pos", 0): 6, TP("pos", 1): 0, TP("pos", 2): 0}


def test_rebalance_keeps_positions_of_kept_partitions(c: LocalCoordinator) -> None:
    """Positions of partitions a member keeps survive a rebalance; the partitions it
    loses are dropped, and their new owner starts from the committed offset."""
    c.create_topic("keep", 2)
    for p in range(2):
        produce(c, "keep", p, 10)
    c.create_consumer("g", "a", cfg())
    a = c.subscribe("g", "a", ["keep"])
    a = c.advance("g", "a", a.generation, {TP("keep", 0): 7, TP("keep", 1): 8})
    c.commit_offsets("g", "a", {TP("keep", 1): CommittedOffset(3)}, a.generation)
    c.create_consumer("g", "b", cfg())
    b = c.subscribe("g", "b", ["keep"])
    assert c.consumer("g", "a").positions == {TP("keep", 0): 7}
    assert b.positions == {TP("keep", 1): 3}


def test_seek(c: LocalCoordinator) -> None:
    """Seek sets positions of assigned partitions only; past the end it follows the reset
    policy (Kafka's out-of-range handling); negative offsets are refused."""
    c.create_topic("sk", 2)
    produce(c, "sk", 0, 10)
    c.create_consumer("g", "a", cfg(auto_offset_reset="latest"))
    c.assign("g", "a", [TP("sk", 0)])
    c.seek("g", "a", {TP("sk", 0): 3})
    assert c.consumer("g", "a").positions == {TP("sk", 0): 3}
    with pytest.raises(ConsumerStateError):
        c.seek("g", "a", {TP("sk", 1): 0})
    with pytest.raises(ConsumerStateError):
        c.seek("g", "a", {TP("sk", 0): -1})
    assert c.consumer("g", "a").positions == {TP("sk", 0): 3}
    c.seek("g", "a", {TP("sk", 0): 50})
    assert c.consumer("g", "a").positions == {TP("sk", 0): 10}
    c.create_consumer("g", "b", cfg())
    with pytest.raises(ConsumerStateError):
        c.seek("g", "b", {TP("sk", 0): 0})  # nothing assigned


def test_stale_generation_commit_and_advance_store_nothing(c: LocalCoordinator) -> None:
    """After a rebalance, advance and commit at the old generation raise
    StaleGenerationError and store nothing; a commit of a partition the member no
    longer owns is refused even at the current generation."""
    c.create_topic("st", 2)
    produce(c, "st", 0, 10)
    produce(c, "st", 1, 10)
    c.create_consumer("g", "a", cfg())
    old = c.subscribe("g", "a", ["st"])
    c.create_consumer("g", "b", cfg())
    c.subscribe("g", "b", ["st"])
    with pytest.raises(StaleGenerationError):
        c.advance("g", "a", old.generation, {TP("st", 0): 5})
    with pytest.raises(StaleGenerationError):
        c.commit_offsets("g", "a", {TP("st", 0): CommittedOffset(5)}, old.generation)
    now = c.consumer("g", "a")
    assert now.positions == {TP("st", 0): 0}
    assert c.committed_offsets("g", [TP("st", 0), TP("st", 1)]) == {}
    with pytest.raises(StaleGenerationError):  # p1 belongs to b now
        c.commit_offsets(
            "g",
            "a",
            {TP("st", 0): CommittedOffset(5), TP("st", 1): CommittedOffset(5)},
            now.generation,
        )
    assert c.committed_offsets("g", [TP("st", 0), TP("st", 1)]) == {}
    with pytest.raises(ConsumerStateError):  # current generation, not its partition
        c.advance("g", "a", now.generation, {TP("st", 1): 5})
    c.commit_offsets("g", "a", {TP("st", 0): CommittedOffset(5, "md")}, now.generation)
    c.commit_offsets("g", "a", {TP("st", 0): CommittedOffset(6)})  # no generation: ownership
    assert c.committed_offsets("g", [TP("st", 0), TP("st", 1)]) == {TP("st", 0): CommittedOffset(6)}
    assert c.advance("g", "a", now.generation, {TP("st", 0): 9}).positions == {TP("st", 0): 9}


def test_commit_errors(c: LocalCoordinator) -> None:
    c.create_topic("ce", 1)
    c.create_consumer("g", "a", cfg())
    c.assign("g", "a", [TP("ce", 0)])
    with pytest.raises(TopicNotFoundError):
        c.commit_offsets("g", "a", {TP("nope", 0): CommittedOffset(1)})
    with pytest.raises(PartitionNotFoundError):
        c.commit_offsets("g", "a", {TP("ce", 3): CommittedOffset(1)})
    with pytest.raises(ConsumerStateError):
        c.commit_offsets("g", "a", {TP("ce", 0): CommittedOffset(-1)})
    with pytest.raises(ConsumerNotFoundError):
        c.commit_offsets("g", "zz", {TP("ce", 0): CommittedOffset(1)})
    assert c.committed_offsets("g", [TP("ce", 0)]) == {}


# -- subscribe vs assign -------------------------------------------------------


def test_subscribe_and_assign_conflicts(c: LocalCoordinator) -> None:
    c.create_topic("sa", 2)
    c.create_consumer("g", "x", cfg())
    with pytest.raises(ConsumerStateError):
        c.subscribe("g", "x", ["sa"], pattern="s.*")  # both
    with pytest.raises(ConsumerStateError):
        c.subscribe("g", "x")  # neither
    with pytest.raises(InvalidTopicPatternError):
        c.subscribe("g", "x", pattern="(")  # not a regex
    with pytest.raises(InvalidTopicPatternError):
        c.subscribe("g", "x", pattern="(?=s)sa")  # Java lookahead: refused, not misread
    with pytest.raises(InvalidTopicNameError):
        c.subscribe("g", "x", ["sa", "no spaces"])
    assert c.consumer("g", "x").subscription == ()  # nothing stored by the failures

    c.subscribe("g", "x", ["sa"])
    with pytest.raises(ConsumerStateError):
        c.assign("g", "x", [TP("sa", 0)])
    c.unsubscribe("g", "x")
    state = c.assign("g", "x", [TP("sa", 1)])
    assert state.manual and state.assignment == (TP("sa", 1),)
    with pytest.raises(ConsumerStateError):
        c.subscribe("g", "x", ["sa"])
    with pytest.raises(TopicNotFoundError):
        c.assign("g", "x", [TP("missing", 0)])
    with pytest.raises(PartitionNotFoundError):
        c.assign("g", "x", [TP("sa", 2)])
    assert c.consumer("g", "x").assignment == (TP("sa", 1),)
    c.unsubscribe("g", "x")
    assert c.subscribe("g", "x", ["sa"]).assignment == (TP("sa", 0), TP("sa", 1))
    with pytest.raises(ConsumerNotFoundError):
        c.subscribe("g", "ghost", ["sa"])


def test_manual_members_are_outside_the_group_assignment(c: LocalCoordinator) -> None:
    """Like Kafka's assign(): a manual member owns what it assigned, the subscribed members
    share all partitions between them, and the manual member may commit any partition."""
    c.create_topic("mm", 2)
    c.create_topic("mm2", 1)
    c.create_consumer("g", "man", cfg())
    man = c.assign("g", "man", [TP("mm", 0)])
    c.create_consumer("g", "sub", cfg())
    sub = c.subscribe("g", "sub", ["mm"])
    assert sub.assignment == (TP("mm", 0), TP("mm", 1))
    assert c.consumer("g", "man").assignment == (TP("mm", 0),)
    # Its generation is not checked; it commits anything of an existing topic.
    c.commit_offsets("g", "man", {TP("mm2", 0): CommittedOffset(2)}, man.generation)
    assert c.committed_offsets("g", [TP("mm2", 0)]) == {TP("mm2", 0): CommittedOffset(2)}
    assert c.advance("g", "man", 0, {TP("mm", 0): 0}).positions == {TP("mm", 0): 0}
    with pytest.raises(StaleGenerationError):  # no longer assigned to it
        c.advance("g", "man", 0, {TP("mm", 1): 0})
    c.delete_topic("mm")  # a deleted topic drops out of manual assignments
    assert c.consumer("g", "man").assignment == ()


def test_deleted_topic_drops_out(c: LocalCoordinator) -> None:
    c.create_topic("d1", 1)
    c.create_topic("d2", 1)
    c.create_consumer("g", "x", cfg())
    s = c.subscribe("g", "x", ["d1", "d2"])
    c.commit_offsets("g", "x", {TP("d2", 0): CommittedOffset(0)}, s.generation)
    c.delete_topic("d2")
    s = c.consumer("g", "x")
    assert s.subscription == ("d1", "d2")  # as subscribed (Kafka keeps it too)
    assert s.assignment == (TP("d1", 0),)
    assert c.describe_group("g").committed == {}


def test_a_topic_created_again_starts_without_the_old_offsets_and_positions(
    c: LocalCoordinator,
) -> None:
    """Issue 22, the seam pass: committed offsets and positions are kept by topic name; a
    topic deleted and created again is a new log, so they go with the deleted topic (as
    Kafka's group coordinator drops a deleted topic's offsets). Here the new topic holds
    more records than the old offset: a consumer must start at the new log's beginning,
    not skip its first records."""
    c.create_topic("r", 1)
    produce(c, "r", 0, 5)
    c.create_consumer("g", "a", cfg(auto_offset_reset="earliest"))
    a = c.subscribe("g", "a", ["r"])
    c.commit_offsets("g", "a", {TP("r", 0): CommittedOffset(5)}, a.generation)
    c.create_consumer("g", "m", cfg(auto_offset_reset="earliest"))
    c.assign("g", "m", [TP("r", 0)])
    c.seek("g", "m", {TP("r", 0): 4})
    c.delete_topic("r")
    c.create_topic("r", 1)
    produce(c, "r", 0, 10)
    assert c.committed_offsets("g", [TP("r", 0)]) == {}
    assert c.consumer("g", "m").positions == {TP("r", 0): 0}


# -- validation, listing, restart ---------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"format": "xml"},
        {"auto_offset_reset": "smallest"},
        {"assignor": "sticky"},
        {"fetch_min_bytes": -2},
        {"fetch_min_bytes": True},
        {"request_timeout_ms": 0},
        {"session_timeout_ms": -5},
        {"instance_timeout_ms": 1.5},
        {"auto_commit": "true"},
    ],
)
def test_invalid_config(c: LocalCoordinator, bad: dict[str, object]) -> None:
    with pytest.raises(InvalidConsumerConfigError):
        c.create_consumer("g", "x", ConsumerConfig(**bad))  # type: ignore[arg-type]
    with pytest.raises(GroupNotFoundError):
        c.describe_group("g")


@pytest.mark.parametrize(
    ("group", "name"),
    [("", "x"), ("g", ""), ("a/b", "x"), ("g", "x/y"), ("g" * 250, "x"), ("g", "x" * 250)],
)
def test_invalid_names(c: LocalCoordinator, group: str, name: str) -> None:
    with pytest.raises(InvalidConsumerConfigError):
        c.create_consumer(group, name, cfg())


def test_duplicate_and_missing(c: LocalCoordinator) -> None:
    c.create_consumer("g", "x" * 249, cfg())
    with pytest.raises(ConsumerExistsError):
        c.create_consumer("g", "x" * 249, cfg())
    c.create_consumer("other", "x" * 249, cfg())  # same name, other group
    for call in (
        lambda: c.consumer("g", "y"),
        lambda: c.delete_consumer("g", "y"),
        lambda: c.unsubscribe("g", "y"),
        lambda: c.assign("g", "y", []),
        lambda: c.advance("g", "y", 1, {}),
        lambda: c.consumer("nogroup", "x"),
    ):
        with pytest.raises(ConsumerNotFoundError):
            call()
    with pytest.raises(GroupNotFoundError):
        c.describe_group("nogroup")
    assert c.committed_offsets("nogroup", [TP("t", 0)]) == {}


def test_list_and_describe_groups(c: LocalCoordinator) -> None:
    c.create_topic("ld", 3)
    assert c.list_groups() == []
    c.create_consumer("g2", "b", cfg(assignor="roundrobin"))
    c.create_consumer("g1", "a", cfg())
    c.subscribe("g2", "b", ["ld"])
    assert c.list_groups() == ["g1", "g2"]
    info = c.describe_group("g2")
    assert (info.state, info.assignor, [m.name for m in info.members]) == (
        "STABLE",
        "roundrobin",
        ["b"],
    )
    c.delete_consumer("g1", "a")
    assert c.list_groups() == ["g2"]  # no member, no committed offset
    with pytest.raises(GroupNotFoundError):
        c.describe_group("g1")


def test_restart_keeps_groups_members_positions_and_offsets(db_url: str, clock: Clock) -> None:
    """Close and reopen the database: groups, members, generation, assignment, positions
    and committed offsets are all still there (and the next call rebalances nothing)."""
    c = LocalCoordinator(db_url, now=clock)
    c.create_topic("rs", 3)
    produce(c, "rs", 0, 5)
    c.create_consumer("g", "a", cfg(assignor="roundrobin"))
    s = c.subscribe("g", "a", ["rs"])
    c.create_consumer("g", "b", cfg())
    c.subscribe("g", "b", ["rs"])
    c.create_consumer("g", "m", cfg(auto_offset_reset="none", format="json"))
    c.assign("g", "m", [TP("rs", 2)])
    s = c.consumer("g", "a")
    c.advance("g", "a", s.generation, {TP("rs", 0): 3})
    c.commit_offsets("g", "a", {TP("rs", 0): CommittedOffset(2, "meta")}, s.generation)
    before = c.describe_group("g")
    c.close()
    c2 = LocalCoordinator(db_url, now=clock)
    try:
        after = c2.describe_group("g")
        assert after == before
        assert after.members[0].positions == {TP("rs", 0): 3, TP("rs", 2): 0}
        assert after.members[2].unresolved == (TP("rs", 2),)
        assert after.committed == {TP("rs", 0): CommittedOffset(2, "meta")}
        assert c2.list_groups() == ["g"]
    finally:
        c2.close()


def test_each_call_is_one_transaction_across_two_coordinators(db_url: str, clock: Clock) -> None:
    """Two LocalCoordinators on one file (two connection sets, as two processes) see
    one group: joins through either end in one assignment with distinct generations."""
    c1 = LocalCoordinator(db_url, now=clock)
    c2 = LocalCoordinator(db_url, now=clock)
    try:
        c1.create_topic("two", 4)
        gens = set()
        for i, coord in zip(range(6), itertools.cycle([c1, c2]), strict=False):
            coord.create_consumer("g", f"m{i}", cfg())
            gens.add(coord.subscribe("g", f"m{i}", ["two"]).generation)
        assert len(gens) == 6
        info1, info2 = c1.describe_group("g"), c2.describe_group("g")
        assert info1 == info2
        assert sorted(owners(info1)) == [TP("two", p) for p in range(4)]
    finally:
        c1.close()
        c2.close()
