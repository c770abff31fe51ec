"""Consumer groups under real clients, in the coordinator (issue 17): fetch leases,
liveness kept by agent heartbeats, subscriptions to topics that do not exist yet,
topic patterns never matched inside the write transaction, batched offsets.

Every test runs on SQLite and on PostgreSQL (``db_url``); a fake clock stands in
for waiting. The REST-level races are in tests/integration/test_consumer_concurrency.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from coordinator.client import PartitionOffsets
from coordinator.client import TopicPartition as TP
from coordinator.groups import store as groups_store
from coordinator.groups.model import CommittedOffset, ConsumerConfig, ConsumerHeartbeat, FetchLease
from coordinator.groups.patterns import check_java_pattern, compile_topic_pattern, match_topics
from coordinator.local import LocalCoordinator
from segments.errors import ConsumerNotFoundError, InvalidTopicPatternError, StaleGenerationError
from tests.unit.conftest import Clock
from tests.unit.test_groups import cfg, produce

LEASE_MS = 10_000


def token() -> str:
    return uuid.uuid4().hex


def fetched(c: LocalCoordinator, lease: FetchLease, count: int) -> dict[TP, int]:
    """What a fetch that read ``count`` records of each owned partition would store."""
    return {tp: off + count for tp, off in lease.state.positions.items()}


# -- fetch leases ------------------------------------------------------------------


def test_one_fetch_at_a_time_per_instance(c: LocalCoordinator) -> None:
    """Race (sequential form): a second fetch of an instance asks for the lease while the
    first holds it. Expected: it is refused until the first ends, then starts from the
    positions the first stored; a retried begin with the same token keeps the lease."""
    c.create_topic("ser", 1)
    produce(c, "ser", 0, 10)
    c.create_consumer("g", "x", cfg())
    c.assign("g", "x", [TP("ser", 0)])
    first, second = token(), token()
    a = c.begin_fetch("g", "x", first, LEASE_MS)
    assert a.token == first and a.state.positions == {TP("ser", 0): 0}
    assert c.begin_fetch("g", "x", first, LEASE_MS).token == first  # a retry
    busy = c.begin_fetch("g", "x", second, LEASE_MS)
    assert busy.token is None and 0 < busy.busy_for_s <= LEASE_MS / 1000
    assert c.confirm_fetch("g", "x", first, {TP("ser", 0): 0}, LEASE_MS).ok
    c.end_fetch("g", "x", first, {TP("ser", 0): 4})
    b = c.begin_fetch("g", "x", second, LEASE_MS)
    assert b.token == second and b.state.positions == {TP("ser", 0): 4}
    c.end_fetch("g", "x", first, {TP("ser", 0): 9})  # a stale end changes nothing
    assert c.consumer("g", "x").positions == {TP("ser", 0): 4}


def test_parallel_fetches_through_two_coordinators_never_share_records(
    db_url: str, clock: Clock
) -> None:
    """Race: 4 threads, half on each of two LocalCoordinators over one database (two
    agents' views), fetch one instance in a loop: begin, "read" 3 records, confirm, end.
    Expected: every offset range is handed out exactly once, in order, none skipped."""
    coords = [LocalCoordinator(db_url, now=clock) for _ in range(2)]
    try:
        coords[0].create_topic("par", 1)
        produce(coords[0], "par", 0, 90)
        coords[0].create_consumer("g", "x", cfg())
        coords[0].assign("g", "x", [TP("par", 0)])
        got: list[int] = []
        lock = threading.Lock()
        errors: list[BaseException] = []

        def worker(coord: LocalCoordinator) -> None:
            try:
                while True:
                    mine = token()
                    lease = coord.begin_fetch("g", "x", mine, LEASE_MS)
                    if lease.token is None:
                        time.sleep(0.001)
                        continue
                    pos = lease.state.positions[TP("par", 0)]
                    if pos >= 90:
                        coord.end_fetch("g", "x", mine, None)
                        return
                    end = min(pos + 3, 90)
                    assert coord.confirm_fetch("g", "x", mine, {TP("par", 0): pos}, LEASE_MS).ok
                    with lock:
                        got.extend(range(pos, end))
                    coord.end_fetch("g", "x", mine, {TP("par", 0): end})
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(coords[i % 2],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert got == list(range(90))
    finally:
        for coord in coords:
            coord.close()


def test_seek_revokes_the_lease_of_a_fetch_in_flight(c: LocalCoordinator) -> None:
    """A seek made while a fetch long-polls is not overwritten by that fetch: its confirm
    reports the lease lost, and its end stores nothing."""
    c.create_topic("sk", 1)
    produce(c, "sk", 0, 10)
    c.create_consumer("g", "x", cfg(auto_offset_reset="latest"))
    c.assign("g", "x", [TP("sk", 0)])
    mine = token()
    lease = c.begin_fetch("g", "x", mine, LEASE_MS)
    assert lease.state.positions == {TP("sk", 0): 10}
    c.seek("g", "x", {TP("sk", 0): 2})
    produce(c, "sk", 0, 1)  # the fetch wakes up with record 10
    confirm = c.confirm_fetch("g", "x", mine, {TP("sk", 0): 10}, LEASE_MS)
    assert (confirm.ok, confirm.token) == (False, None)
    assert confirm.state.positions == {TP("sk", 0): 2}
    c.end_fetch("g", "x", mine, {TP("sk", 0): 11})
    assert c.consumer("g", "x").positions == {TP("sk", 0): 2}
    # The lease is free again: the fetch takes it anew and reads from the seek.
    again = c.begin_fetch("g", "x", token(), LEASE_MS)
    assert again.token is not None and again.state.positions == {TP("sk", 0): 2}


def test_confirm_sees_a_rebalance_and_end_stores_only_owned_partitions(
    c: LocalCoordinator,
) -> None:
    c.create_topic("rb", 2)
    for p in range(2):
        produce(c, "rb", p, 10)
    c.create_consumer("g", "a", cfg())
    c.subscribe("g", "a", ["rb"])
    mine = token()
    lease = c.begin_fetch("g", "a", mine, LEASE_MS)
    assert set(lease.state.positions) == {TP("rb", 0), TP("rb", 1)}
    c.create_consumer("g", "b", cfg())
    c.subscribe("g", "b", ["rb"])  # b takes partition 1
    confirm = c.confirm_fetch("g", "a", mine, {TP("rb", 0): 0, TP("rb", 1): 0}, LEASE_MS)
    assert not confirm.ok and confirm.token == mine  # read again from partition 0 only
    assert confirm.state.positions == {TP("rb", 0): 0}
    assert c.confirm_fetch("g", "a", mine, {TP("rb", 0): 0}, LEASE_MS).ok
    c.end_fetch("g", "a", mine, {TP("rb", 0): 5, TP("rb", 1): 5})
    assert c.consumer("g", "a").positions == {TP("rb", 0): 5}
    assert c.consumer("g", "b").positions == {TP("rb", 1): 0}


def test_undelivered_fetch_moves_nothing_and_a_lapsed_lease_is_taken_over(
    c: LocalCoordinator, clock: Clock
) -> None:
    c.create_topic("ud", 1)
    produce(c, "ud", 0, 5)
    c.create_consumer("g", "x", cfg())
    c.assign("g", "x", [TP("ud", 0)])
    first = token()
    c.begin_fetch("g", "x", first, LEASE_MS)
    c.end_fetch("g", "x", first, None)  # the client went away: nothing delivered
    assert c.consumer("g", "x").positions == {TP("ud", 0): 0}
    dead = token()
    c.begin_fetch("g", "x", dead, LEASE_MS)  # its agent dies holding the lease
    assert c.begin_fetch("g", "x", token(), LEASE_MS).token is None
    c.heartbeat_consumers([ConsumerHeartbeat("g", "x", dead)], LEASE_MS)  # renewed...
    clock.advance(LEASE_MS / 1000 - 1)
    assert c.begin_fetch("g", "x", token(), LEASE_MS).token is None
    clock.advance(2)  # ... then no more heartbeats: it lapses
    taken = c.begin_fetch("g", "x", token(), LEASE_MS)
    assert taken.token is not None and taken.state.positions == {TP("ud", 0): 0}


def test_auto_commit_at_begin_commits_only_delivered_positions(c: LocalCoordinator) -> None:
    c.create_topic("ac", 1)
    produce(c, "ac", 0, 5)
    c.create_consumer("g", "x", cfg(auto_commit=True))
    c.assign("g", "x", [TP("ac", 0)])
    first = token()
    c.begin_fetch("g", "x", first, LEASE_MS)
    c.end_fetch("g", "x", first, None)  # not delivered
    c.end_fetch("g", "x", token(), {TP("ac", 0): 5})  # not the lease holder: ignored
    c.begin_fetch("g", "x", second := token(), LEASE_MS)
    assert c.committed_offsets("g", [TP("ac", 0)]) == {TP("ac", 0): CommittedOffset(0)}
    c.end_fetch("g", "x", second, {TP("ac", 0): 5})
    c.begin_fetch("g", "x", token(), LEASE_MS)
    assert c.committed_offsets("g", [TP("ac", 0)]) == {TP("ac", 0): CommittedOffset(5)}


# -- liveness --------------------------------------------------------------------


def _two_members(c: LocalCoordinator, config: ConsumerConfig) -> FetchLease:
    c.create_topic("live", 2)
    for p in range(2):
        produce(c, "live", p, 10)
    for name in ("slow", "busy"):
        c.create_consumer("g", name, config)
        c.subscribe("g", name, ["live"])
    return c.begin_fetch("g", "slow", token(), LEASE_MS)


def test_member_processing_a_minute_with_heartbeats_still_commits(
    c: LocalCoordinator, clock: Clock
) -> None:
    """kafka-rest's defaults (session 30 s, max.poll.interval 300 s): "slow" fetches,
    processes for 60 s while its agent heartbeats every 3 s and "busy" polls; then it
    commits at the generation of its fetch. Without heartbeats it would have left the
    group after 30 s and the commit would be refused (see the next test)."""
    lease = _two_members(c, ConsumerConfig(auto_offset_reset="earliest"))
    assert lease.token is not None
    c.end_fetch("g", "slow", lease.token, fetched(c, lease, 10))
    for _ in range(20):
        clock.advance(3)
        c.heartbeat_consumers([ConsumerHeartbeat("g", "slow")], LEASE_MS)
        c.consumer("g", "busy")  # polls: settles the group each time
    offsets = {tp: CommittedOffset(10) for tp in lease.state.assignment}
    c.commit_offsets("g", "slow", offsets, lease.state.generation)
    assert c.consumer("g", "slow").generation == lease.state.generation


def test_without_heartbeats_the_session_lapses_and_the_commit_is_refused(
    c: LocalCoordinator, clock: Clock
) -> None:
    """An agent that died stops heartbeating: after the session timeout the member leaves
    the assignment (its partitions move) and its commit at the old generation fails."""
    lease = _two_members(c, ConsumerConfig(auto_offset_reset="earliest"))
    for _ in range(12):
        clock.advance(3)
        c.consumer("g", "busy")
    assert len(c.consumer("g", "busy", touch=False).assignment) == 2
    with pytest.raises(StaleGenerationError):
        offsets = {tp: CommittedOffset(10) for tp in lease.state.assignment}
        c.commit_offsets("g", "slow", offsets, lease.state.generation)


def test_max_poll_interval_drops_a_heartbeated_member_that_stops_fetching(
    c: LocalCoordinator, clock: Clock
) -> None:
    config = ConsumerConfig(auto_offset_reset="earliest", instance_timeout_ms=600_000)
    lease = _two_members(c, config)
    for _ in range(101):  # 303 s of heartbeats, no fetch from "slow"
        clock.advance(3)
        c.heartbeat_consumers([ConsumerHeartbeat("g", "slow")], LEASE_MS)
        c.consumer("g", "busy")
    assert c.consumer("g", "slow", touch=False).assignment == ()
    back = c.begin_fetch("g", "slow", token(), LEASE_MS)  # its next fetch: rejoins
    assert len(back.state.assignment) == 1
    assert back.state.generation > lease.state.generation


def test_heartbeat_reports_gone_instances_and_renews_no_idle_timer(
    c: LocalCoordinator, clock: Clock
) -> None:
    c.create_consumer("g", "x", cfg())
    gone = c.heartbeat_consumers(
        [ConsumerHeartbeat("g", "x"), ConsumerHeartbeat("g", "nobody")], LEASE_MS
    )
    assert gone == [("g", "nobody")]
    clock.advance(61)  # past cfg()'s 60 s instance timeout, heartbeated all along
    c.heartbeat_consumers([ConsumerHeartbeat("g", "x")], LEASE_MS)
    with pytest.raises(ConsumerNotFoundError):
        c.consumer("g", "x")
    assert c.heartbeat_consumers([ConsumerHeartbeat("g", "x")], LEASE_MS) == [("g", "x")]


# -- subscriptions ---------------------------------------------------------------


def test_subscribe_then_create(c: LocalCoordinator) -> None:
    """A subscription to a topic that does not exist (and a pattern matching nothing yet)
    is stored; the topics are assigned at the first call after they are created."""
    c.create_consumer("g", "t", cfg())
    c.create_consumer("g2", "p", cfg())
    s = c.subscribe("g", "t", ["later"])
    assert (s.subscription, s.assignment) == (("later",), ())
    assert c.subscribe("g2", "p", pattern=r"later-\d+").assignment == ()
    c.create_topic("later", 2)
    c.create_topic("later-7", 1)
    t = c.begin_fetch("g", "t", token(), LEASE_MS).state
    assert t.assignment == (TP("later", 0), TP("later", 1))
    assert t.positions == {TP("later", 0): 0, TP("later", 1): 0}
    p = c.consumer("g2", "p")
    assert (p.subscription, p.assignment) == (("later-7",), (TP("later-7", 0),))


def test_patterns_are_never_matched_inside_a_write_transaction(
    c: LocalCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pattern evaluation happens with no write transaction open (a slow pattern
    would otherwise stall every writer); the transaction that needed it runs again."""
    inside = threading.local()
    real_write = c.db.write
    calls: list[str] = []

    def write(*args: Any, **kwargs: Any) -> Any:
        cm = real_write(*args, **kwargs)

        class Tracked:
            def __enter__(self) -> Any:
                inside.flag = True
                return cm.__enter__()

            def __exit__(self, *exc: Any) -> Any:
                inside.flag = False
                return cm.__exit__(*exc)

        return Tracked()

    def match(pattern: str, names: Any) -> tuple[str, ...]:
        assert not getattr(inside, "flag", False), "pattern matched inside a write transaction"
        calls.append(pattern)
        return match_topics(pattern, names)

    monkeypatch.setattr(c.db, "write", write)
    monkeypatch.setattr(groups_store, "match_topics", match)
    c.create_topic("pat-a", 1)
    c.create_consumer("g", "x", cfg())
    assert c.subscribe("g", "x", pattern="pat-.*").subscription == ("pat-a",)
    c.create_topic("pat-b", 1)  # the cached matches are stale now
    assert c.consumer("g", "x").subscription == ("pat-a", "pat-b")
    assert c.list_groups() == ["g"]
    assert calls == ["pat-.*", "pat-.*"]  # once per set of topic names


@pytest.mark.timeout(120)
def test_a_catastrophic_pattern_matches_in_linear_time(c: LocalCoordinator) -> None:
    """``(a|aa)*b`` against a 240-character name backtracks for ages in Python's re (and
    Java's); RE2 answers at once. Without it this test hangs until its timeout."""
    name = "a" * 240 + "c"
    c.create_topic(name, 1)
    c.create_consumer("g", "x", cfg())
    assert c.subscribe("g", "x", pattern="(a|aa)*b").subscription == ()
    assert c.subscribe("g", "x", pattern="(a|aa)*c").subscription == (name,)


# -- batched offsets ------------------------------------------------------------


def test_offsets_many(c: LocalCoordinator) -> None:
    c.create_topic("om", 3000)
    produce(c, "om", 2999, 7)
    produce(c, "om", 5, 2)
    wanted = [TP("om", p) for p in range(3000)] + [TP("om", 3000), TP("nope", 0)]
    found = c.offsets_many(wanted)
    assert len(found) == 3000  # the missing partition and topic are left out
    assert found[TP("om", 2999)] == PartitionOffsets(0, 7)
    assert found[TP("om", 5)] == PartitionOffsets(0, 2)
    assert found[TP("om", 0)] == PartitionOffsets(0, 0)
    assert c.offsets_many([]) == {}


# -- Java pattern syntax (no database) --------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "matches"),
    [
        ("orders-.*", ["orders-1", "orders-eu"]),
        (r"orders-\d+", ["orders-1"]),
        (r"\Qorders-1\E", ["orders-1"]),  # \Q...\E quoting
        ("(?i)ORDERS-EU", ["orders-eu"]),
        ("(?<region>orders)-eu", ["orders-eu"]),
        ("orders-[^0-9]+", ["orders-eu"]),
        ("orders-.{1,2}?", ["orders-1", "orders-eu"]),
        ("orders", []),  # whole names only (Matcher.matches)
    ],
)
def test_supported_java_patterns(pattern: str, matches: list[str]) -> None:
    assert list(match_topics(pattern, ["orders-1", "orders-eu", "other"])) == matches


@pytest.mark.parametrize(
    ("pattern", "what"),
    [
        ("(?=a)a", "lookahead"),
        ("(?<!a)b", "lookbehind"),
        ("(?>a)", "an atomic group"),
        ("a*+", "a possessive quantifier"),
        ("a{2}+", "a possessive quantifier"),
        (r"(a)\1", "back-reference"),
        (r"(?<n>a)\k<n>", "back-reference"),
        ("[a-z&&[^x]]", "intersection"),
        ("[a[b]]", "nested character class"),
        ("[[:alpha:]]", "nested character class"),
        ("(?U)a", "UNICODE_CHARACTER_CLASS"),
        ("(?x)a b", "comments mode"),
        (r"a\Z", r"\Z"),
        (r"\h", r"\h"),
        (r"\p{Lower}", "invalid character class"),
        ("(", "missing )"),
        ("[abc", "unclosed character class"),
        ("a" * 4097, "at most 4096"),
    ],
)
def test_refused_java_patterns(pattern: str, what: str) -> None:
    with pytest.raises(InvalidTopicPatternError) as info:
        compile_topic_pattern(pattern)
    assert what in info.value.message


def test_pattern_check_leaves_escaped_and_quoted_text_alone() -> None:
    for ok in (r"a\*+", r"\Q(?=x)a*+\E", r"[\[]", "[]a]", r"a\{2}+"):
        check_java_pattern(ok)
