"""Consumer groups over the coordinator's HTTP API: a real coordinator process
(``lakelog coordinator``), driven through the HTTP client and compared with a
LocalCoordinator on the same database file; raw calls (``POST /v2/<name>``,
MessagePack) for exact statuses and bodies; two clients in two threads racing on one
group."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import httpx
import pytest

from coordinator.client import ChunkCommit
from coordinator.client import TopicPartition as TP
from coordinator.groups.model import CommittedOffset, ConsumerConfig, ConsumerHeartbeat
from coordinator.http.client import HttpCoordinator, http_coordinator
from coordinator.local import LocalCoordinator
from segments.errors import (
    ConsumerExistsError,
    ConsumerNotFoundError,
    ConsumerStateError,
    GroupNotFoundError,
    InvalidConsumerConfigError,
    InvalidTopicNameError,
    InvalidTopicPatternError,
    LakelogError,
    PartitionNotFoundError,
    StaleGenerationError,
    TopicNotFoundError,
)
from tests.coordinator_calls import answer, call

pytestmark = pytest.mark.integration


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(c: HttpCoordinator, topic: str, partition: int, count: int) -> None:
    topic_id = c.get_topic(topic).topic_id
    c.commit(uniq("obj"), [ChunkCommit(topic_id, partition, 0, 10, count, 1, 2)])


def test_every_method_round_trips(remote: HttpCoordinator, served_db: LocalCoordinator) -> None:
    """Each GroupCoordinator method through HTTP returns what the store holds (read back
    through a LocalCoordinator on the same file without touching anything)."""
    topic, group = uniq("t"), uniq("g")
    remote.create_topic(topic, 3)
    produce(remote, topic, 0, 10)
    config = ConsumerConfig(
        format="json",
        auto_offset_reset="earliest",
        auto_commit=False,
        fetch_min_bytes=100,
        request_timeout_ms=2500,
        session_timeout_ms=20_000,
        instance_timeout_ms=90_000,
        assignor="roundrobin",
    )
    created = remote.create_consumer(group, "a", config)
    assert created.config == config
    assert created == served_db.consumer(group, "a", touch=False)

    sub = remote.subscribe(group, "a", [topic])
    assert sub.assignment == tuple(TP(topic, p) for p in range(3))
    assert sub.positions == {TP(topic, p): 0 for p in range(3)}
    assert sub == served_db.consumer(group, "a", touch=False)
    by_pattern = remote.subscribe(group, "a", pattern=f"{topic}|nothing-.*")
    assert by_pattern.pattern == f"{topic}|nothing-.*"
    assert by_pattern.subscription == (topic,)

    remote.seek(group, "a", {TP(topic, 0): 4})
    assert remote.consumer(group, "a").positions[TP(topic, 0)] == 4
    adv = remote.advance(group, "a", sub.generation, {TP(topic, 0): 7, TP(topic, 1): 0})
    assert adv.positions == {TP(topic, 0): 7, TP(topic, 1): 0, TP(topic, 2): 0}
    remote.commit_offsets(group, "a", {TP(topic, 0): CommittedOffset(7, "m")}, adv.generation)
    remote.commit_offsets(group, "a", {TP(topic, 1): CommittedOffset(0)})
    committed = remote.committed_offsets(group, [TP(topic, 0), TP(topic, 1), TP(topic, 2)])
    assert committed == {TP(topic, 0): CommittedOffset(7, "m"), TP(topic, 1): CommittedOffset(0)}
    assert committed == served_db.committed_offsets(group, [TP(topic, p) for p in range(3)])

    info = remote.describe_group(group)
    assert info == served_db.describe_group(group)
    assert (info.state, info.assignor, info.generation) == ("STABLE", "roundrobin", adv.generation)
    assert group in remote.list_groups()
    assert remote.list_groups() == served_db.list_groups()

    lease = remote.begin_fetch(group, "a", "tok-1", 5000)
    assert lease.token == "tok-1" and lease.state == served_db.consumer(group, "a", touch=False)
    assert remote.begin_fetch(group, "a", "tok-2", 5000).token is None
    assert remote.heartbeat_consumers(
        [ConsumerHeartbeat(group, "a", "tok-1"), ConsumerHeartbeat(group, "zz")], 5000
    ) == [(group, "zz")]
    confirm = remote.confirm_fetch(group, "a", "tok-1", {TP(topic, 0): 7}, 5000)
    assert (confirm.ok, confirm.token) == (True, "tok-1")
    remote.end_fetch(group, "a", "tok-1", {TP(topic, 0): 9})
    assert served_db.consumer(group, "a", touch=False).positions[TP(topic, 0)] == 9
    remote.end_fetch(group, "a", "tok-1", None)  # repeated: changes nothing
    assert remote.begin_fetch(group, "a", "tok-2", 5000).token == "tok-2"
    remote.end_fetch(group, "a", "tok-2", None)
    offsets = remote.offsets_many([TP(topic, 0), TP(topic, 2), TP("nope", 0)])
    assert offsets == served_db.offsets_many([TP(topic, 0), TP(topic, 2)])
    assert offsets[TP(topic, 0)].high_watermark == 10

    remote.unsubscribe(group, "a")
    assert remote.consumer(group, "a").assignment == ()
    manual = remote.assign(group, "a", [TP(topic, 2)])
    assert (manual.manual, manual.assignment) == (True, (TP(topic, 2),))
    assert manual == served_db.consumer(group, "a", touch=False)
    remote.delete_consumer(group, "a")
    with pytest.raises(ConsumerNotFoundError):
        served_db.consumer(group, "a")
    assert remote.describe_group(group).state == "EMPTY"


def test_errors_come_back_as_the_same_classes(remote: HttpCoordinator) -> None:
    topic, group = uniq("t"), uniq("g")
    remote.create_topic(topic, 2)
    remote.create_consumer(group, "a", ConsumerConfig())
    cases: list[tuple[type[LakelogError], Any]] = [
        (ConsumerExistsError, lambda: remote.create_consumer(group, "a", ConsumerConfig())),
        (
            InvalidConsumerConfigError,
            lambda: remote.create_consumer(group, "b", ConsumerConfig(format="xml")),
        ),
        (InvalidConsumerConfigError, lambda: remote.create_consumer("a/b", "b", ConsumerConfig())),
        (ConsumerNotFoundError, lambda: remote.consumer(group, "nobody")),
        (ConsumerNotFoundError, lambda: remote.delete_consumer(group, "nobody")),
        (GroupNotFoundError, lambda: remote.describe_group(uniq("nogroup"))),
        (InvalidTopicNameError, lambda: remote.subscribe(group, "a", ["bad name"])),
        (InvalidTopicPatternError, lambda: remote.subscribe(group, "a", pattern="(?=x)")),
        (ConsumerStateError, lambda: remote.subscribe(group, "a", [topic], pattern=".*")),
        (ConsumerStateError, lambda: remote.seek(group, "a", {TP(topic, 0): 1})),
        (PartitionNotFoundError, lambda: remote.assign(group, "a", [TP(topic, 9)])),
        (
            TopicNotFoundError,
            lambda: remote.commit_offsets(group, "a", {TP("x", 0): CommittedOffset(1)}),
        ),
    ]
    for cls, attempt in cases:
        with pytest.raises(cls):
            attempt()
    state = remote.subscribe(group, "a", [topic])
    remote.create_consumer(group, "b", ConsumerConfig())
    remote.subscribe(group, "b", [topic])
    with pytest.raises(StaleGenerationError):
        remote.advance(group, "a", state.generation, {TP(topic, 0): 0})
    with pytest.raises(StaleGenerationError):
        remote.commit_offsets(group, "a", {TP(topic, 0): CommittedOffset(0)}, state.generation)
    with pytest.raises(ConsumerStateError):
        remote.assign(group, "a", [TP(topic, 0)])
    assert remote.committed_offsets(group, [TP(topic, 0)]) == {}


def _ok(resp: httpx.Response) -> Any:
    """The decoded result of a successful call: every success is a 200."""
    assert resp.status_code == 200, resp.text
    return answer(resp)


def _error(resp: httpx.Response) -> tuple[int, Any]:
    """(status, error class name) of a refused call; (200, the result) of one that was not."""
    if resp.status_code == 200:
        return 200, answer(resp)
    return resp.status_code, resp.json()["error"]


def test_exact_statuses_and_bodies(served: tuple[str, str], served_db: LocalCoordinator) -> None:
    url = served[0]
    group = uniq("g")
    with httpx.Client(base_url=url) as h:
        created = _ok(call(h, "create_consumer", {"group": group, "name": "a", "config": {}}))
        assert created["config"] == {
            "format": "binary",
            "auto_offset_reset": "latest",
            "auto_commit": True,
            "fetch_min_bytes": -1,
            "request_timeout_ms": 1000,
            "session_timeout_ms": 30_000,
            "instance_timeout_ms": 300_000,
            "assignor": "range",
            "max_poll_interval_ms": 300_000,
            "max_poll_records": 0,
            "isolation_level": "read_uncommitted",
            "owner": "",
        }
        assert (created["group"], created["name"], created["generation"]) == (group, "a", 1)
        r = call(h, "create_consumer", {"group": group, "name": "a", "config": {}})
        assert r.status_code == 409
        assert r.json() == {
            "error": "ConsumerExistsError",
            "message": (
                f"Consumer with specified consumer ID 'a' already exists in group '{group}'."
            ),
            "retriable": False,
        }
        r = call(h, "consumer", {"group": group, "name": "zz"})
        assert r.status_code == 404
        assert r.json() == {
            "error": "ConsumerNotFoundError",
            "message": f"Consumer instance 'zz' not found in group '{group}'.",
            "retriable": False,
        }
        r = call(h, "subscribe", {"group": group, "name": "a", "topics": [], "pattern": None})
        assert _error(r) == (409, "ConsumerStateError")
        r = call(h, "seek", {"group": group, "name": "a", "positions": [{"topic": "t"}]})
        assert _error(r) == (422, "MalformedRequestError")
        assert r.json()["retriable"] is False
        r = call(h, "create_consumer", {"group": group, "name": "c"})  # config is required
        assert _error(r) == (422, "MalformedRequestError")
        r = call(h, "create_consumer", {"group": group, "name": "c", "config": {"format": 1}})
        assert _error(r) == (422, "MalformedRequestError")
        r = call(h, "create_consumer", {"group": group, "name": "c", "config": {"format": "xml"}})
        assert _error(r) == (400, "InvalidConsumerConfigError")
        # None of the refused creations made a consumer.
        with pytest.raises(ConsumerNotFoundError):
            served_db.consumer(group, "c", touch=False)
        r = call(h, "advance", {"group": group, "name": "a", "generation": 0, "positions": {}})
        assert _error(r) == (409, "StaleGenerationError")
        r = call(h, "describe_group", {"group": uniq("none")})
        assert _error(r) == (404, "GroupNotFoundError")
        assert _ok(call(h, "delete_consumer", {"group": group, "name": "a"})) is None
        with pytest.raises(ConsumerNotFoundError):
            served_db.consumer(group, "a", touch=False)


def test_unknown_arguments_are_refused(
    served: tuple[str, str], served_db: LocalCoordinator
) -> None:
    """An argument the operation does not have (a typo, a newer agent's) is a malformed
    request, not silently dropped: 422, and no consumer made. (Fields inside a value,
    such as the config's, are the value type's: msgspec ignores those it does not know,
    as ``coordinator.api`` says.)"""
    group = uniq("g")
    with httpx.Client(base_url=served[0]) as h:
        body = {"group": group, "name": "c", "config": {}, "nope": 1}
        r = call(h, "create_consumer", body)
    assert _error(r) == (422, "MalformedRequestError")
    with pytest.raises(ConsumerNotFoundError):
        served_db.consumer(group, "c", touch=False)


def test_odd_group_and_consumer_names_reach_the_coordinator(
    served: tuple[str, str], served_db: LocalCoordinator
) -> None:
    """Group and consumer names that were path-like ("a/b", "..") travel in the body as
    they are: refused or served by the coordinator itself, for that very name."""
    with httpx.Client(base_url=served[0]) as h:
        r = call(h, "describe_group", {"group": "../x"})
        assert r.status_code == 404
        with pytest.raises(GroupNotFoundError) as missing:
            served_db.describe_group("../x")
        assert r.json()["message"] == missing.value.message
        for group, name in ((uniq("g"), "a/b"), (uniq("g") + "/..", "a")):
            r = call(h, "create_consumer", {"group": group, "name": name, "config": {}})
            assert r.status_code == 400
            with pytest.raises(InvalidConsumerConfigError) as refused:
                served_db.create_consumer(group, name, ConsumerConfig())
            assert r.json()["message"] == refused.value.message
            assert group not in served_db.list_groups()
        group = f"..{uniq('g')}.."
        created = _ok(call(h, "create_consumer", {"group": group, "name": "..", "config": {}}))
        assert (created["group"], created["name"]) == (group, "..")
        assert served_db.consumer(group, "..", touch=False).group == group
        assert _ok(call(h, "describe_group", {"group": group}))["group"] == group
        assert _ok(call(h, "delete_consumer", {"group": group, "name": ".."})) is None
        with pytest.raises(ConsumerNotFoundError):
            served_db.consumer(group, "..", touch=False)


def test_session_expiry_over_http(remote: HttpCoordinator) -> None:
    """The server's real clock: a member silent past a 400 ms session loses its partitions
    to the member that keeps polling."""
    topic, group = uniq("t"), uniq("g")
    remote.create_topic(topic, 2)
    short = ConsumerConfig(session_timeout_ms=400)
    for name in ("a", "b"):
        remote.create_consumer(group, name, short)
        remote.subscribe(group, name, [topic])
    assert len(remote.consumer(group, "b").assignment) == 1
    time.sleep(0.25)
    remote.consumer(group, "b")
    time.sleep(0.25)
    assert remote.consumer(group, "b").assignment == (TP(topic, 0), TP(topic, 1))


def test_two_clients_in_threads_keep_one_consistent_group(served: tuple[str, str]) -> None:
    """Race: two HttpCoordinators in two threads join, poll, advance, commit and leave one
    group at once (each call one BEGIN IMMEDIATE transaction in the server).

    Expected: every describe shows each partition owned by exactly one member; the
    generations each thread sees never go down; and no two accepted commits for one
    partition come from different members in the same generation (a commit is accepted
    only from the partition's owner at the current generation).
    """
    url = served[0]
    topic, group = uniq("t"), uniq("g")
    with http_coordinator(url) as setup:
        setup.create_topic(topic, 6)
        for p in range(6):
            produce(setup, topic, p, 100)
    accepted: list[tuple[int, str, TP]] = []
    stale: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(prefix: str) -> None:
        try:
            with http_coordinator(url) as c:
                seen_gen = 0
                for round_ in range(6):
                    name = f"{prefix}{round_}"
                    c.create_consumer(group, name, ConsumerConfig(auto_offset_reset="earliest"))
                    c.subscribe(group, name, [topic])
                    for _ in range(4):
                        state = c.consumer(group, name)
                        assert state.generation >= seen_gen
                        seen_gen = state.generation
                        moved = {tp: pos + 1 for tp, pos in state.positions.items()}
                        try:
                            state = c.advance(group, name, state.generation, moved)
                            offsets = {tp: CommittedOffset(o) for tp, o in moved.items()}
                            c.commit_offsets(group, name, offsets, state.generation)
                        except StaleGenerationError:
                            with lock:
                                stale.append(name)
                            continue
                        with lock:
                            accepted.extend((state.generation, name, tp) for tp in moved)
                        info = c.describe_group(group)
                        owned = [tp for m in info.members for tp in m.assignment]
                        assert len(owned) == len(set(owned)) == 6
                    if round_ % 2:
                        c.delete_consumer(group, name)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(p,)) for p in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    owner: dict[tuple[int, TP], str] = {}
    for generation, name, tp in accepted:
        assert owner.setdefault((generation, tp), name) == name
    # Some commits got through (typically 50-65 partition commits and 4-14 stale rounds).
    assert accepted, f"no commit accepted; {len(stale)} stale rounds"


def test_consumer_protocol_over_http_matches_the_database(
    remote: HttpCoordinator, served_db: LocalCoordinator, served: tuple[str, str]
) -> None:
    """KIP-848 heartbeats, describe, commits at a member epoch and their errors through
    the coordinator's HTTP API: the same answers and state as in the database."""
    from segments.errors import FencedMemberEpochError, StaleMemberEpochError

    topic = uniq("kt")
    tid = remote.create_topic(topic, 3).topic_id
    group, member = uniq("kg"), str(uuid.uuid4())
    joined = remote.kafka_consumer_heartbeat(
        group,
        member,
        0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=[topic],
        owned={},
        server_assignor="range",
        client_id="c1",
        session_timeout_ms=45_000,
    )
    assert joined.member_id == member and joined.member_epoch >= 1
    assert joined.assignment == {tid: (0, 1, 2)}
    again = remote.kafka_consumer_heartbeat(
        group, member, joined.member_epoch, owned=joined.assignment
    )
    assert (again.member_epoch, again.assignment) == (joined.member_epoch, None)
    g = remote.kafka_describe(group)
    truth = served_db.kafka_describe(group)
    assert g is not None and truth is not None
    assert (g.group_type, g.state, g.generation, g.topic_names) == (
        "consumer",
        "Stable",
        truth.generation,
        {tid: topic},
    )
    c = g.members[member].consumer
    assert c is not None and (c.assigned, c.assignor, c.topics) == (
        {tid: (0, 1, 2)},
        "range",
        (topic,),
    )
    info = remote.describe_group(group)
    assert info.group_type == "CONSUMER" and info.members[0].assignment == tuple(
        TP(topic, p) for p in range(3)
    )
    offsets = {TP(topic, 1): CommittedOffset(9, "m")}
    remote.kafka_commit_offsets(group, member, joined.member_epoch, offsets)
    assert (
        remote.kafka_committed(group, member_id=member, member_epoch=joined.member_epoch) == offsets
    )
    with pytest.raises(StaleMemberEpochError):
        remote.kafka_commit_offsets(group, member, joined.member_epoch + 1, offsets)
    with pytest.raises(FencedMemberEpochError):
        remote.kafka_consumer_heartbeat(group, member, joined.member_epoch + 7)
    assert remote.kafka_consumer_heartbeat(group, member, -1).member_epoch == -1
    before = served_db.kafka_describe(group)
    args = {"group": group, "member_id": member, "member_epoch": 0, "nonsense": 1}
    with httpx.Client(base_url=served[0]) as h:
        r = call(h, "kafka_consumer_heartbeat", args)
    assert r.status_code == 422 and "nonsense" in r.text, r.text
    assert r.json()["error"] == "MalformedRequestError"
    assert served_db.kafka_describe(group) == before  # the member did not join again
