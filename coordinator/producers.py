"""Idempotent producers: the sequence rules, as pure functions (no SQL, no I/O).

Kafka's rules, kept per (producer id, partition): batches carry the producer's epoch
and a base sequence; the partition remembers the producer's epoch and its last five
batches (first sequence, last sequence, base offset). A batch is

- a **duplicate** when its sequences equal a remembered batch's: it is answered with
  that batch's offset and stored no second time, whichever agent the retry reached;
- **appended** when it follows the last one (sequence + 1, wrapping at 2**31), or opens
  a new epoch at sequence 0, or is the producer's first batch on the partition at
  sequence 0;
- **fenced** (INVALID_PRODUCER_EPOCH) when its epoch is older than the partition's;
- **out of order** (OUT_OF_ORDER_SEQUENCE_NUMBER) otherwise.

The coordinator applies :func:`judge` inside the commit transaction (the authority);
agents apply it before buffering, to answer duplicates and fenced producers at once.
REST idempotent produce can carry the same ``ProducerBatch`` through the same commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum

#: Batches remembered per (producer, partition), as Kafka's ProducerStateEntry.
REMEMBERED_BATCHES = 5
_SEQ_MOD = 1 << 31


@dataclass(frozen=True, slots=True)
class ProducerBatch:
    """One idempotent batch of a chunk: who sent it and where it sits in the chunk."""

    producer_id: int
    epoch: int
    base_sequence: int
    record_count: int
    relative_offset: int = 0  # records of the chunk before it

    @property
    def last_sequence(self) -> int:
        return (self.base_sequence + self.record_count - 1) % _SEQ_MOD


@dataclass
class ProducerPartitionState:
    """What a partition remembers of one producer: its epoch and its last batches."""

    epoch: int
    #: (first sequence, last sequence, base offset), oldest first, at most five.
    batches: list[tuple[int, int, int]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(self.batches)

    @classmethod
    def from_row(cls, epoch: int, batches: str) -> ProducerPartitionState:
        return cls(epoch, [(int(f), int(la), int(o)) for f, la, o in json.loads(batches)])


class Verdict(StrEnum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    FENCED = "fenced"


def judge(state: ProducerPartitionState | None, batch: ProducerBatch) -> tuple[Verdict, int | None]:
    """The verdict on ``batch`` given the partition's ``state``; with DUPLICATE, the
    offset the first copy was stored at."""
    if state is None:
        if batch.base_sequence == 0:
            return Verdict.APPEND, None
        return Verdict.OUT_OF_ORDER, None
    if batch.epoch < state.epoch:
        return Verdict.FENCED, None
    if batch.epoch > state.epoch:
        return (Verdict.APPEND, None) if batch.base_sequence == 0 else (Verdict.OUT_OF_ORDER, None)
    for first, last, offset in state.batches:
        if (first, last) == (batch.base_sequence, batch.last_sequence):
            return Verdict.DUPLICATE, offset
    if not state.batches:
        return (Verdict.APPEND, None) if batch.base_sequence == 0 else (Verdict.OUT_OF_ORDER, None)
    if batch.base_sequence == (state.batches[-1][1] + 1) % _SEQ_MOD:
        return Verdict.APPEND, None
    return Verdict.OUT_OF_ORDER, None


def remember(
    state: ProducerPartitionState | None, batch: ProducerBatch, base_offset: int
) -> ProducerPartitionState:
    """The state after ``batch`` was appended at ``base_offset`` (judged APPEND)."""
    if state is None or batch.epoch != state.epoch:
        state = ProducerPartitionState(batch.epoch)
    state.batches.append((batch.base_sequence, batch.last_sequence, base_offset))
    del state.batches[:-REMEMBERED_BATCHES]
    return state
