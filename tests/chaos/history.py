"""The history: one JSON object per line, written by every client thread of a run.

An event is ``{"t": seconds since the run began, "proc": who, "id": op id, "type":
"invoke"|"ok"|"fail"|"info", "op": kind, ...}``. An operation is an ``invoke`` and
its completion with the same ``id``: ``ok`` (it happened, with what it returned),
``fail`` (it certainly did not happen: the server refused it before storing anything)
or ``info`` (unknown: a timeout or a lost answer; it may or may not have happened,
as in Jepsen). Events that are no operation (the nemesis's faults, the run's
parameters) are a lone ``info``.

Operations (fields beyond the common ones):

- ``create_topic`` invoke ``{topic, partitions, configs}``, ok ``{topic_id}``;
  ``delete_topic`` invoke ``{topic}``; ``add_partitions`` invoke ``{topic, count}``;
  ``delete_records`` invoke ``{topic, partition, offset}``; ``alter_config`` invoke
  ``{topic, name, value}``.
- ``produce`` invoke ``{topic, mode, values, keys}`` (``mode``: ``v2``, ``v2-key``
  (with an Idempotency-Key, retried with it), ``v3-batch``, ``kafka`` (an idempotent
  confluent-kafka producer), ``v3-idem`` (records:batch with an idempotent REST
  ``producer``: then also ``partitions`` (each value's), ``producer: {producer_id,
  producer_epoch, sequences: {partition: first sequence}}`` and ``probe`` (null,
  ``zombie``: an older epoch's batch, ``gap``: a sequence skipped ahead))); ok
  ``{results: [[partition, offset] | null, ...]}`` aligned with ``values`` (null: that
  record's outcome is unknown).
- ``init_producer`` invoke ``{}`` (a new id) or ``{producer_id, producer_epoch}`` (its
  next epoch), ok ``{producer_id, producer_epoch}``.
- ``resend`` (a lone ``info``: an acknowledged keyed or idempotent request sent again
  as it was) ``{op_id, status, same}``: ``same``, whether it was answered with the
  first answer's offsets (null: nothing to compare).
- ``read`` (v3 by offset) invoke ``{topic, partition, offset}``, ok ``{records:
  [[offset, value], ...], high_watermark, log_start}``.
- ``poll`` (a consumer: ``consumer`` names the v2 instance or Kafka consumer) ok
  ``{topic, records: [[partition, offset, value], ...]}``; ``assign`` ok ``{consumer,
  topic, partitions}`` (a new assignment: positions may go back to the committed ones).
- ``commit`` invoke ``{consumer, group, topic, offsets: {partition: offset}}``.
- ``stream_open`` (a group stream's connection, ``consumer`` naming it) invoke
  ``{consumer, group, topic, cursor: {partition: next offset} | null}`` (null: from the
  committed offsets); ``stream_poll`` ok ``{consumer, topic, records: [[partition,
  offset, value], ...], cursor}``: records it delivered, ``cursor`` the one after the
  last; ``group_offsets`` invoke ``{group, topic}``, ok ``{offsets: {partition:
  offset}}`` (the group's committed offsets, read twice alike); ``stream_error`` (a
  lone ``info``) ``{consumer, error}``: the connection broke.
- ``final_read`` ok ``{topic, topic_id, partition, log_start, high_watermark,
  records: [[offset, key, value], ...], compacted, markers}``: the whole log after
  quiescence (``markers``: a transactional topic, whose markers take offsets).
- ``final_committed`` ok ``{group, topic, topic_id, offsets: {partition: offset}}``.
- ``txn`` (a transaction of a transactional producer) invoke ``{topic, transactional_id,
  n, values, partitions (each value's), intent: commit|abort, group, source, offsets:
  {partition: offset} | null (sent with it, of topic ``source``), zombie}``, completion
  ``{results}`` as a produce's (the delivery reports: stored, whatever the outcome)
  and, for a zombie, ``fenced_by`` (the ``txn_init`` of the instance that fenced it):
  ``ok`` the intended end returned, ``fail`` surely aborted (see
  ``tests.chaos.run.Run.txn_round``), ``info`` unknown; ``txn_end`` (a lone ``info``)
  ``{op_id, action}``: its commit or abort is asked now. ``txn_init`` invoke
  ``{transactional_id, fences?: txn op, settle?: true}``: a new instance of the id.
  ``txn_poll`` ok ``{consumer, topic, isolation, records: [[partition, offset, value],
  ...]}``: a Kafka reader of the topic. ``final_txn_read`` ok ``{topic, partition,
  isolation: read_committed, last_stable, reached_end, errors, records: [[offset, value],
  ...]}`` (``errors``: what the reader got instead of records; it never resets a position);
  ``final_txn_offsets`` ok ``{group, topic, offsets: {partition: offset}}``.
- ``storage`` (a lone ``info``, last: once the topology stopped) ``{referenced, listed:
  {key: modified}, rows: {key: unreferenced since | null}, now, grace_s, slack_s,
  gc_pass_started}``:
  see ``tests.chaos.run.storage_snapshot``.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class History:
    """A thread-safe JSON-lines writer; ``invoke`` returns the op id its completion uses."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = path.open("w", buffering=1)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._t0 = time.monotonic()

    def _write(self, event: dict[str, Any]) -> None:
        event["t"] = round(time.monotonic() - self._t0, 4)
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            self._f.write(line + "\n")

    def invoke(self, proc: str, op: str, **fields: Any) -> int:
        op_id = next(self._ids)
        self._write({"id": op_id, "proc": proc, "type": "invoke", "op": op, **fields})
        return op_id

    def complete(self, op_id: int, proc: str, op: str, outcome: str, **fields: Any) -> None:
        assert outcome in ("ok", "fail", "info"), outcome
        self._write({"id": op_id, "proc": proc, "type": outcome, "op": op, **fields})

    def info(self, proc: str, op: str, **fields: Any) -> None:
        """An event that is no operation (a fault, a parameter of the run)."""
        self._write({"id": next(self._ids), "proc": proc, "type": "info", "op": op, **fields})

    def close(self) -> None:
        with self._lock:
            self._f.close()


def read_history(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
