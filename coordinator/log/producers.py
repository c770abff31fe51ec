"""Idempotent producers: the sequence rules, as pure functions (no SQL, no I/O).

Kafka's rules, kept per (producer id, partition): batches carry the producer's epoch
and a base sequence; the partition remembers the producer's epoch and its last five
batches (first sequence, last sequence, base offset). A batch is

- a **duplicate** when its sequences equal a remembered batch's: it is answered with
  that batch's offset and stored no second time, whichever agent the retry reached;
- **appended** when it follows the last one (sequence + 1, wrapping at 2**31), or opens
  a new epoch at sequence 0, or is the first batch the partition knows of the producer,
  at any sequence: Kafka's rule since KIP-360 for a producer whose state the partition
  does not hold (a topic deleted and created again under the same name, state expired).
  A client keeps counting where it stood; refusing it would be fatal to librdkafka's
  idempotent producer;
- **fenced** (INVALID_PRODUCER_EPOCH) when its epoch is older than the partition's;
- **out of order** (OUT_OF_ORDER_SEQUENCE_NUMBER) otherwise.

The coordinator applies :func:`judge` inside the commit transaction (the authority);
agents apply it before buffering, to answer duplicates and fenced producers at once.
REST idempotent produce can carry the same ``ProducerBatch`` through the same commit.
"""

from __future__ import annotations

import json
import os
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
    #: Part of a transaction: the commit checks that the transaction added the
    #: partition at this epoch (KIP-890's verification, in the commit itself).
    transactional: bool = False

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


#: A deliberately broken build for the chaos checker to catch (tests/chaos):
#: ``LAKELOG_CHAOS_BREAK=no_fencing`` skips the epoch and sequence checks, so an
#: idempotent producer's retry is stored again and a fenced producer still writes. Read
#: once, from the environment only: no setting, never for production.
_BROKEN_FENCING = "no_fencing" in os.environ.get("LAKELOG_CHAOS_BREAK", "").split(",")


class Verdict(StrEnum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    FENCED = "fenced"
    MISMATCH = "mismatch"  # an idempotency key reused for another request


def judge(state: ProducerPartitionState | None, batch: ProducerBatch) -> tuple[Verdict, int | None]:
    """The verdict on ``batch`` given the partition's ``state``; with DUPLICATE, the
    offset the first copy was stored at."""
    if _BROKEN_FENCING:
        return Verdict.APPEND, None
    if state is None:
        return Verdict.APPEND, None
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


# -- REST idempotency keys --------------------------------------------------------------
#
# The same rule for REST clients that send an ``Idempotency-Key`` header instead of a
# producer id and sequences: the key, a digest of the request and the offsets its records
# got are stored by the commit that stores the records (the same transaction as the
# producer state above), and judged the same way: a key already stored with the same
# digest is a duplicate (answered with its first offsets), with another digest a
# mismatch; a key that is not stored (or has expired) is appended.


@dataclass(frozen=True, slots=True)
class RequestKey:
    """The part of one keyed REST request that sits in one chunk (one partition)."""

    key: str
    digest: str  # of the request (method, path, content type, body)
    relative_offset: int  # records of the chunk before this request's
    record_count: int
    created_ms: int  # when the agent took the request (its records' default timestamp)
    expires_ms: int
    #: The topic's partition count the agent placed the request's records with (0: not
    #: known, from an agent before it was sent).
    partitions: int = 0


@dataclass(frozen=True, slots=True)
class StoredKey:
    """A key as the coordinator stored it: the request's digest and its records' offsets."""

    digest: str
    created_ms: int
    #: (partition, first offset, record count) per partition of the request.
    parts: tuple[tuple[int, int, int], ...]
    #: The partition count the records were placed with, so a retry places them the same
    #: way after partitions were added (0: not known, stored before it was kept).
    partitions: int = 0

    def to_json(self) -> str:
        parts = [list(p) for p in self.parts]
        if not self.partitions:
            return json.dumps(parts)
        return json.dumps({"partitions": self.partitions, "parts": parts})

    @classmethod
    def from_row(cls, digest: str, created_ms: int, parts: str) -> StoredKey:
        """The key as ``to_json`` wrote it (a bare list of parts: stored by an older
        coordinator, partition count not known)."""
        found = json.loads(parts)
        partitions = 0
        if isinstance(found, dict):
            partitions, found = int(found["partitions"]), found["parts"]
        return cls(
            digest,
            int(created_ms),
            tuple((int(p), int(o), int(n)) for p, o, n in found),
            partitions,
        )


def judge_key(stored: StoredKey | None, digest: str) -> Verdict:
    """APPEND a key not stored, DUPLICATE one stored with the same digest, else
    MISMATCH (the key was used for another request)."""
    if stored is None:
        return Verdict.APPEND
    return Verdict.DUPLICATE if stored.digest == digest else Verdict.MISMATCH
