"""The consumer group protocol's server side (KIP-848), as pure functions: the assignors
that compute a group's target assignment, and the reconciliation that moves one member
from its current assignment to its target.

Kafka 4.x runs the assignment in the group coordinator (``group.consumer.assignors``:
``uniform``, the default, and ``range``); clients name one in ConsumerGroupHeartbeat's
``ServerAssignor`` or leave it to the group. No I/O here: ``coordinator.groups.kafka``
calls these inside the group's transaction.

Reconciliation (Kafka's ``CurrentAssignmentBuilder``): a member first gives up what its
target no longer holds (state UNREVOKED_PARTITIONS, at its current epoch, until a
heartbeat shows it no longer owns them), then takes the target's epoch and every
partition of its target that no other member holds (UNRELEASED_PARTITIONS while some are
still held elsewhere, STABLE once it has them all). A partition is never held by two
members at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: topic id -> partitions, sorted. The assignments of the consumer protocol.
Assignment = dict[bytes, tuple[int, ...]]

STABLE = "STABLE"
UNREVOKED_PARTITIONS = "UNREVOKED_PARTITIONS"
UNRELEASED_PARTITIONS = "UNRELEASED_PARTITIONS"

DEFAULT_ASSIGNOR = "uniform"


@dataclass(frozen=True, slots=True)
class Subscriber:
    """A member as the assignors see it: the topics (ids) it subscribes to that exist,
    and the partitions it is to keep if it can (its previous target)."""

    member_id: str
    topics: frozenset[bytes]
    previous: Assignment


def uniform(
    members: Sequence[Subscriber], partitions: Mapping[bytes, int]
) -> dict[str, Assignment]:
    """Every subscribed partition to one subscriber, the counts as even as the
    subscriptions allow, each member keeping what it had where the balance allows it."""
    owners: dict[tuple[bytes, int], str] = {}
    held: dict[str, list[tuple[bytes, int]]] = {m.member_id: [] for m in members}
    by_id = {m.member_id: m for m in members}
    wanted = sorted(
        (t, p)
        for t, count in partitions.items()
        if any(t in m.topics for m in members)
        for p in range(count)
    )
    active = [m for m in members if m.topics]
    cap = -(-len(wanted) // len(active)) if active else 0
    for m in sorted(members, key=lambda m: m.member_id):  # keep, up to the fair share
        for t, ps in sorted(m.previous.items()):
            for p in ps:
                tp = (t, p)
                if (
                    t in m.topics
                    and p < partitions.get(t, 0)
                    and tp not in owners
                    and len(held[m.member_id]) < cap
                ):
                    owners[tp] = m.member_id
                    held[m.member_id].append(tp)
    for tp in wanted:  # the rest, each to its least loaded subscriber
        if tp in owners:
            continue
        eligible = [m for m in members if tp[0] in m.topics]
        best = min(eligible, key=lambda m: (len(held[m.member_id]), m.member_id))
        owners[tp] = best.member_id
        held[best.member_id].append(tp)
    # Even out what the subscriptions allow: move one partition at a time from a member
    # with two more than another that may take it. Each move narrows the gap: bounded.
    for _ in range(len(wanted) * max(len(members), 1)):
        moved = False
        for src in sorted(held, key=lambda k: -len(held[k])):
            for dst in sorted(held, key=lambda k: len(held[k])):
                if len(held[src]) - len(held[dst]) < 2:
                    break
                movable = [tp for tp in held[src] if tp[0] in by_id[dst].topics]
                if movable:
                    tp = max(movable)
                    held[src].remove(tp)
                    held[dst].append(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            break
    return {mid: _as_assignment(tps) for mid, tps in held.items()}


def range_(members: Sequence[Subscriber], partitions: Mapping[bytes, int]) -> dict[str, Assignment]:
    """Per topic, its partitions in contiguous ranges over its subscribers (by member
    id): P // N each, the first P % N one more. Co-partitioned topics line up."""
    out: dict[str, dict[bytes, tuple[int, ...]]] = {m.member_id: {} for m in members}
    for t, count in sorted(partitions.items()):
        subs = sorted(m.member_id for m in members if t in m.topics)
        if not subs:
            continue
        each, extra = divmod(count, len(subs))
        start = 0
        for i, mid in enumerate(subs):
            n = each + (1 if i < extra else 0)
            if n:
                out[mid][t] = tuple(range(start, start + n))
            start += n
    return out


#: The server-side assignors, by the names clients give (``group.remote.assignor``).
ASSIGNORS: dict[
    str, Callable[[Sequence[Subscriber], Mapping[bytes, int]], dict[str, Assignment]]
] = {
    "uniform": uniform,
    "range": range_,
}


def _as_assignment(tps: Sequence[tuple[bytes, int]]) -> Assignment:
    out: dict[bytes, list[int]] = {}
    for t, p in tps:
        out.setdefault(t, []).append(p)
    return {t: tuple(sorted(ps)) for t, ps in sorted(out.items())}


def intersect(a: Assignment, b: Assignment) -> Assignment:
    return _clean({t: _keep(ps, set(b.get(t, ())), True) for t, ps in a.items()})


def minus(a: Assignment, b: Assignment) -> Assignment:
    return _clean({t: _keep(ps, set(b.get(t, ())), False) for t, ps in a.items()})


def _keep(ps: Sequence[int], other: set[int], inside: bool) -> tuple[int, ...]:
    return tuple(p for p in ps if (p in other) == inside)


def union(a: Assignment, b: Assignment) -> Assignment:
    keys = set(a) | set(b)
    return _clean({t: tuple(sorted(set(a.get(t, ())) | set(b.get(t, ())))) for t in keys})


def _clean(a: Mapping[bytes, Sequence[int]]) -> Assignment:
    return {t: tuple(sorted(ps)) for t, ps in sorted(a.items()) if ps}


def partitions_of(a: Assignment) -> set[tuple[bytes, int]]:
    return {(t, p) for t, ps in a.items() for p in ps}


@dataclass(frozen=True, slots=True)
class Reconciled:
    """Where a member stands after one step of reconciliation."""

    epoch: int
    state: str
    assigned: Assignment
    revoking: Assignment


def reconcile(
    *,
    epoch: int,
    state: str,
    assigned: Assignment,
    revoking: Assignment,
    target: Assignment,
    target_epoch: int,
    owned: Assignment | None,
    held_elsewhere: Callable[[bytes, int], bool],
) -> Reconciled:
    """One step of a member towards its ``target`` (see the module docstring).

    Args:
        epoch, state, assigned, revoking: the member as stored.
        target, target_epoch: its target assignment and the epoch it was computed at.
        owned: the partitions the member's heartbeat says it owns (None: not sent, so
            unchanged since its last full heartbeat).
        held_elsewhere: whether another member holds a partition (assigned or revoking).
    """
    if state == UNREVOKED_PARTITIONS:
        still_owned = owned is None or bool(partitions_of(intersect(owned, revoking)))
        if still_owned:
            return Reconciled(epoch, state, assigned, revoking)
    elif state == STABLE and epoch == target_epoch and not revoking:
        return Reconciled(epoch, state, assigned, {})
    # Past UNREVOKED_PARTITIONS: the revoked partitions are given up (``revoking`` drops).
    keep = intersect(assigned, target)
    revoke = minus(assigned, target)
    if revoke and (owned is None or partitions_of(intersect(owned, revoke))):
        return Reconciled(epoch, UNREVOKED_PARTITIONS, keep, revoke)
    new = minus(target, keep)
    free = [(t, p) for t, p in sorted(partitions_of(new)) if not held_elsewhere(t, p)]
    assigned_now = union(keep, _as_assignment(free))
    unreleased = len(free) < len(partitions_of(new))
    return Reconciled(
        target_epoch, UNRELEASED_PARTITIONS if unreleased else STABLE, assigned_now, {}
    )
