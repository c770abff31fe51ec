"""The agent's side of idempotent produce: answer duplicates before buffering them.

The coordinator is the authority: it judges every idempotent batch inside the commit
(``coordinator.log.producers``), so a batch is never stored twice whatever agents see.
This gate spares the common retry a second object: before a batch is buffered, it is
judged against what the coordinator remembers of the producer *and* the batches this
agent has buffered but not committed yet (pipelined requests of one producer). A batch
the coordinator already stored is answered with its first offsets; an older epoch is
fenced; a gap is out of order; a retry of a batch still in flight here must wait.

Any door can use it: it speaks ``ProducerBatch`` and (topic id, partition), not a
protocol. REST requests with an ``Idempotency-Key`` go through the same gate
(:meth:`ProducerGate.admit_key`): a key stored by a commit is a duplicate (answered with
the stored offsets), stored for another request a mismatch, held by a request this agent
is still writing in flight; the commit judges it again (``coordinator.log.producers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from coordinator.client import Coordinator
from coordinator.log.producers import (
    ProducerBatch,
    ProducerPartitionState,
    StoredKey,
    Verdict,
    judge,
    judge_key,
    remember,
)
from service.executors import call

#: (producer id, topic id, partition)
Key = tuple[int, bytes, int]
#: (topic id, REST idempotency key)
RequestKeyOf = tuple[bytes, str]


class Admission(StrEnum):
    APPEND = "append"
    DUPLICATE = "duplicate"  # stored before: answer with the offset
    FENCED = "fenced"
    OUT_OF_ORDER = "out_of_order"
    IN_FLIGHT = "in_flight"  # a retry of a batch this agent is still writing
    MISMATCH = "mismatch"  # an idempotency key stored for another request


@dataclass
class Ticket:
    """Batches admitted for one partition, pending until their flush ends."""

    key: Key | RequestKeyOf
    batches: list[ProducerBatch] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Decision:
    admission: Admission
    offset: int = -1  # the first copy's base offset, for DUPLICATE
    ticket: Ticket | None = None  # for APPEND: release it once the flush ended
    stored: StoredKey | None = None  # for a DUPLICATE idempotency key: what was stored


class ProducerGate:
    """Pre-checks idempotent batches on one agent (see the module docstring)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self._pending: dict[Key | RequestKeyOf, list[Ticket]] = {}
        self._versions: dict[Key | RequestKeyOf, int] = {}

    async def admit(
        self, requests: Sequence[tuple[bytes, int, Sequence[ProducerBatch]]]
    ) -> list[Decision]:
        """One decision per (topic id, partition, its batches in order).

        A partition is appended only if every batch of it is; it is a duplicate only if
        every batch is one (answered with the first batch's offset).
        """
        for _ in range(2):
            versions = {self._key(r): self._versions.get(self._key(r), 0) for r in requests}
            states = await self._states(requests)
            decisions = [self._decide(r, states.get(self._key(r))) for r in requests]
            moved = any(
                self._versions.get(k, 0) != v for k, v in versions.items()
            )  # a flush of this producer ended while we asked: ask again
            if not moved or all(d.admission is Admission.APPEND for d in decisions):
                break
            for d in decisions:
                if d.ticket is not None:
                    self.release(d.ticket)
        return decisions

    async def admit_key(self, topic_id: bytes, key: str, digest: str, now_ms: int) -> Decision:
        """The decision on a REST request under idempotency ``key`` (see the module
        docstring); an APPEND holds the key on this agent until its ticket is released."""
        held: RequestKeyOf = (topic_id, key)
        if held in self._pending:
            return Decision(Admission.IN_FLIGHT)
        ticket = Ticket(held)
        self._pending[held] = [ticket]  # before asking: a concurrent retry here waits
        try:
            stored = await call(self.coordinator.request_key, topic_id, key, now_ms)
        except BaseException:
            self.release(ticket)
            raise
        verdict = judge_key(stored, digest)
        if verdict is Verdict.APPEND:
            return Decision(Admission.APPEND, ticket=ticket)
        self.release(ticket)
        if verdict is Verdict.DUPLICATE:
            return Decision(Admission.DUPLICATE, stored=stored)
        return Decision(Admission.MISMATCH)

    def release(self, ticket: Ticket) -> None:
        """The ticket's flush ended (committed or failed): stop counting its batches."""
        tickets = self._pending.get(ticket.key)
        if tickets is not None and ticket in tickets:
            tickets.remove(ticket)
            if not tickets:
                del self._pending[ticket.key]
        self._versions[ticket.key] = self._versions.get(ticket.key, 0) + 1

    @staticmethod
    def _key(request: tuple[bytes, int, Sequence[ProducerBatch]]) -> Key:
        topic_id, partition, batches = request
        return batches[0].producer_id, topic_id, partition

    async def _states(
        self, requests: Sequence[tuple[bytes, int, Sequence[ProducerBatch]]]
    ) -> dict[Key, ProducerPartitionState]:
        by_producer: dict[int, list[tuple[bytes, int]]] = {}
        for r in requests:
            pid, topic_id, partition = self._key(r)
            by_producer.setdefault(pid, []).append((topic_id, partition))
        out: dict[Key, ProducerPartitionState] = {}
        for pid, partitions in by_producer.items():
            found = await call(self.coordinator.producer_state, pid, partitions)
            out.update({(pid, t, p): s for (t, p), s in found.items()})
        return out

    def _decide(
        self,
        request: tuple[bytes, int, Sequence[ProducerBatch]],
        committed: ProducerPartitionState | None,
    ) -> Decision:
        key = self._key(request)
        state = _copy(committed)
        pending = [b for t in self._pending.get(key, ()) for b in t.batches]
        for b in pending:  # in flight here: they come next, at offsets not known yet
            state = remember(state, b, -1)
        verdicts = []
        for b in request[2]:  # each judged after the ones before it were taken
            verdict, offset = judge(state, b)
            verdicts.append((verdict, offset))
            if verdict is Verdict.APPEND:
                state = remember(state, b, -1)
        kinds = {v for v, _ in verdicts}
        if kinds == {Verdict.APPEND}:
            ticket = Ticket(key, list(request[2]))
            self._pending.setdefault(key, []).append(ticket)
            return Decision(Admission.APPEND, ticket=ticket)
        if kinds == {Verdict.DUPLICATE}:
            offset = verdicts[0][1]
            if offset is None or offset < 0:
                return Decision(Admission.IN_FLIGHT)
            return Decision(Admission.DUPLICATE, offset)
        if Verdict.FENCED in kinds:
            return Decision(Admission.FENCED)
        return Decision(Admission.OUT_OF_ORDER)


def _copy(state: ProducerPartitionState | None) -> ProducerPartitionState | None:
    return None if state is None else ProducerPartitionState(state.epoch, list(state.batches))
