"""The agent's side of idempotent produce: answer duplicates before buffering them.

The coordinator is the authority: it judges every idempotent batch inside the commit
(``coordinator.producers``), so a batch is never stored twice whatever agents see.
This gate spares the common retry a second object: before a batch is buffered, it is
judged against what the coordinator remembers of the producer *and* the batches this
agent has buffered but not committed yet (pipelined requests of one producer). A batch
the coordinator already stored is answered with its first offsets; an older epoch is
fenced; a gap is out of order; a retry of a batch still in flight here must wait.

Any door can use it (Kafka Produce now, REST idempotent produce later): it speaks
``ProducerBatch`` and (topic id, partition), not a protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from coordinator.client import Coordinator
from coordinator.producers import (
    ProducerBatch,
    ProducerPartitionState,
    Verdict,
    judge,
    remember,
)
from service.executors import call

#: (producer id, topic id, partition)
Key = tuple[int, bytes, int]


class Admission(StrEnum):
    APPEND = "append"
    DUPLICATE = "duplicate"  # stored before: answer with the offset
    FENCED = "fenced"
    OUT_OF_ORDER = "out_of_order"
    IN_FLIGHT = "in_flight"  # a retry of a batch this agent is still writing


@dataclass
class Ticket:
    """Batches admitted for one partition, pending until their flush ends."""

    key: Key
    batches: list[ProducerBatch] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Decision:
    admission: Admission
    offset: int = -1  # the first copy's base offset, for DUPLICATE
    ticket: Ticket | None = None  # for APPEND: release it once the flush ended


class ProducerGate:
    """Pre-checks idempotent batches on one agent (see the module docstring)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self._pending: dict[Key, list[Ticket]] = {}
        self._versions: dict[Key, int] = {}

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
