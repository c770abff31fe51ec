"""Idempotent REST produce: the ``Idempotency-Key`` request header (issue 16).

A v2 ``POST /topics/{t}[/partitions/{p}]``, a v3 ``POST .../records`` or
``.../records:batch`` carrying ``Idempotency-Key: <1-255 visible ASCII characters>``
goes through the agent's ``ProducerGate`` (the Kafka door's idempotent-producer gate),
and its records are committed with the key (``coordinator.log.producers.RequestKey``): the
commit that stores the records stores, in the same transaction, the key, a SHA-256
digest of the request (method, path, content type, body) and the offsets the records
got. So, whichever agent a retry reaches, whenever (until the key expires after
``idempotency_key_window_s``):

- the same key and the same request: answered with the first answer's offsets (and
  the first request's timestamps), nothing stored;
- the same key and another request: 422 with error_code 42209, nothing stored;
- the same key while the first request is still being written by this agent: the
  retry waits for it (up to ``buffer_wait_ms``), then is answered as above; on two
  agents at once, the commit lets one through and the other request fails retriably
  (50003; the rest of its flush is committed without it, ``Batcher._split``), and its
  retry is answered with the first offsets.

A keyed request is produced as one group (a v3 stream is read whole first), and its
keyless records go to the partition the key hashes to (not the sticky round robin), so
a retry places every record where the first request did. The partition count the
records were placed with is stored with the key, and a retry is placed with that count
(``placed_on``): partitions added to the topic meanwhile do not move its records.

With sharded metadata (``coordinator.shards``) a request may commit on some shards and
fail on others (the client gets the failed records' errors): the key is stored only
where its records were. A retry is then answered with the stored offsets for the
partitions that committed and stores the records of the others, under the key, now
(``append_keyed``): a partly committed request is completed by its retry.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Annotated

from fastapi import Header, Request

from coordinator.client import TopicInfo
from coordinator.log.producers import RequestKey, StoredKey
from segments.errors import (
    BufferFullError,
    IdempotencyKeyMismatchError,
    InternalError,
    LakelogError,
    MalformedRequestError,
)
from segments.partitioning import partition_for_key
from segments.types import Record
from service.produce.idempotence import Admission, Ticket
from service.state import AgentState

HEADER = "idempotency-key"
#: The header as a route parameter, so the OpenAPI at /docs shows it (read from the request).
KeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retry-safe produce: the same key and request answer the first offsets "
        "and store nothing; the same key with another request is 422 42209.",
    ),
]
_MAX_KEY = 255
# While the same key is being written by this agent, look again this often.
_IN_FLIGHT_POLL_S = 0.01


@dataclass(frozen=True, slots=True)
class KeyedProduce:
    """What the gate and the commit need of one keyed request."""

    key: str
    digest: str
    now_ms: int
    expires_ms: int

    def request_key(self, partitions: int) -> RequestKey:
        """The key as the batcher carries it to the commit (offsets filled in there),
        with the partition count its records were placed with."""
        return RequestKey(self.key, self.digest, 0, 0, self.now_ms, self.expires_ms, partitions)

    def sticky_partition(self, partitions: int) -> int:
        """Where the request's keyless records go: the same on every retry."""
        return partition_for_key(self.key.encode(), partitions)


#: A deliberately broken build for the chaos checker to catch (tests/chaos):
#: ``LAKELOG_CHAOS_BREAK=dedupe`` ignores Idempotency-Key, so a retried request is stored
#: again. Read once, from the environment only: no setting, never for production.
_BROKEN_DEDUPE = "dedupe" in os.environ.get("LAKELOG_CHAOS_BREAK", "").split(",")


def keyed_produce(request: Request, body: bytes, window_s: int) -> KeyedProduce | None:
    """The request's idempotency key and digest; None without the header.

    Raises:
        MalformedRequestError: a key that is empty, longer than 255 characters or not
            visible ASCII (400).
    """
    key = request.headers.get(HEADER)
    if key is None or _BROKEN_DEDUPE:
        return None
    if not 0 < len(key) <= _MAX_KEY or not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise MalformedRequestError(
            f"Bad Request: the Idempotency-Key header must be 1 to {_MAX_KEY} visible ASCII "
            "characters."
        )
    digest = hashlib.sha256()
    for part in (request.method, request.url.path, request.headers.get("content-type", "")):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(body)
    now_ms = int(time.time() * 1000)
    return KeyedProduce(key, digest.hexdigest(), now_ms, now_ms + window_s * 1000)


async def admit(
    state: AgentState, topic_id: bytes, keyed: KeyedProduce
) -> tuple[Ticket | None, StoredKey | None]:
    """Judge a keyed request: (its ticket, None) to produce it, releasing the ticket
    once produced; (None, what was stored) for a duplicate.

    Raises:
        IdempotencyKeyMismatchError: the key is stored for another request (422).
        BufferFullError: the first request under the key was still being written here
            after ``buffer_wait_ms`` (retriable).
    """
    metric = state.metrics.idempotent_requests
    deadline = time.monotonic() + state.settings.buffer_wait_ms / 1000
    while True:
        decision = await state.gate.admit_key(topic_id, keyed.key, keyed.digest, keyed.now_ms)
        if decision.admission is Admission.APPEND:
            metric.labels(outcome="appended").inc()
            return decision.ticket, None
        if decision.admission is Admission.DUPLICATE:
            metric.labels(outcome="duplicate").inc()
            return None, decision.stored
        if decision.admission is Admission.MISMATCH:
            metric.labels(outcome="mismatch").inc()
            raise IdempotencyKeyMismatchError(
                f"Idempotency-Key {keyed.key!r} was used for another request (another "
                "body, path or content type); nothing was stored. Use a new key."
            )
        if time.monotonic() > deadline:
            raise BufferFullError(
                f"The request under Idempotency-Key {keyed.key!r} is still being written; retry."
            )
        await asyncio.sleep(_IN_FLIGHT_POLL_S)


def placed_on(topic: TopicInfo, stored: StoredKey | None) -> TopicInfo:
    """The topic as a keyed request's records are placed on: for a retry of a stored
    request, with the partition count the first request was placed with (so keys hash
    and keyless records go where they did, whatever partitions were added since)."""
    if stored is None or not stored.partitions or stored.partitions == topic.partitions:
        return topic
    return replace(topic, partitions=stored.partitions)


def stored_offsets(stored: StoredKey, partitions: Sequence[int]) -> list[int]:
    """The offsets a duplicate is answered with: one per record, given each record's
    partition in request order (records of one partition are contiguous in the log).

    Raises:
        InternalError: the records do not fit what was stored (cannot happen for the
            same digest unless the topic changed partitions meanwhile).
    """
    following = {p: first for p, first, _ in stored.parts}
    counts = {p: n for p, _, n in stored.parts}
    out = []
    for p in partitions:
        if p not in following:
            break
        out.append(following[p])
        following[p] += 1
    seen = {p: following[p] - first for p, first, _ in stored.parts}
    if len(out) != len(partitions) or seen != counts:
        raise InternalError(
            "The records of this request do not match what was stored under its "
            "Idempotency-Key (did the topic's partition count change?)."
        )
    return out


async def append_keyed(
    state: AgentState,
    topic_id: bytes,
    entries: Sequence[tuple[int, Record]],
    keyed: KeyedProduce | None,
    stored: StoredKey | None,
    *,
    partitions: int,
    log_append_time: bool = False,
) -> list[int]:
    """Produce a (keyed) request's ``(partition, record)`` entries, placed over
    ``partitions`` partitions (``placed_on``); the offset of each.

    Not stored yet: appended with the key. Stored: the stored offsets; stored for some
    partitions only (committed on some metadata shards, see the module docstring): the
    stored offsets for those, and the records of the others appended with the key.

    Raises:
        PartlyCommittedError: as ``Batcher.append``, with an entry per record.
        InternalError: as ``stored_offsets``; LakelogError: as ``Batcher.append``.
    """
    from service.produce.batcher import PartlyCommittedError  # the batcher imports the state

    request_key = None if keyed is None else keyed.request_key(partitions)
    if stored is None:
        return await state.batcher.append(
            topic_id, entries, request_key, log_append_time=log_append_time
        )
    done = {p for p, _, _ in stored.parts}
    missing = [i for i, (p, _) in enumerate(entries) if p not in done]
    if not missing or request_key is None:
        return stored_offsets(stored, [p for p, _ in entries])
    kept = stored_offsets(stored, [p for p, _ in entries if p in done])
    try:
        added: list[int | None] = list(
            await state.batcher.append(
                topic_id,
                [entries[i] for i in missing],
                request_key,
                log_append_time=log_append_time,
            )
        )
        errors: list[LakelogError | None] = [None] * len(missing)
    except PartlyCommittedError as exc:
        added, errors = exc.offsets, exc.errors
    fresh = dict(zip(missing, zip(added, errors, strict=True), strict=True))
    first = iter(kept)
    offsets: list[int | None] = []
    failures: list[LakelogError | None] = []
    for i in range(len(entries)):
        offset, error = fresh[i] if i in fresh else (next(first), None)
        offsets.append(offset)
        failures.append(error)
    if any(e is not None for e in failures):
        raise PartlyCommittedError(
            "Some partitions of the request were not stored; retry it.", offsets, failures
        )
    return [o for o in offsets if o is not None]


def release(state: AgentState, ticket: Ticket | None) -> None:
    """The keyed request was produced (or failed): a retry here may be judged now."""
    if ticket is not None:
        state.gate.release(ticket)
