"""Check a history (see ``tests.chaos.history``) against a model of a Kafka log.

The model, per topic incarnation (a topic id: a topic deleted and created again under
the same name is another log) and partition: a sequence of records at offsets
``log_start .. high_watermark - 1``, contiguous unless the topic is compacted, where
``log_start`` only moves forward (retention, DeleteRecords). Every value the clients
send is unique in the run, so a value found in a log names the one produce that sent it.

A produce is attributed to an incarnation when it ran wholly inside the incarnation's
life (from its create's ``ok`` to the ``invoke`` of the delete that ended it); one
that overlapped a delete or create is attributed to none, and then only what it
returned is checked, not where it must be found.

Anomalies (``kind``):

- ``lost``: a produce acknowledged at (partition, offset) of a live incarnation, not
  found there at the end, though the offset is at or past the log start and no later
  record of its key in a compacted topic explains it.
- ``duplicate``: one sent value stored at two places (all our producers send a value
  once; only an idempotent retry resends it, and that must not store it again).
- ``wrong_offset``: a value read (or stored) at another (partition, offset) than the
  one its produce was acknowledged with, or than where the final read finds it.
- ``wrong_topic`` / ``wrong_incarnation``: a value served in a topic it was not sent
  to, or in an incarnation other than the one it was acknowledged in.
- ``phantom``: a value nobody sent. ``failed_write_visible``: a value whose produce
  was refused outright (``fail``) found in a log.
- ``offset_order``: offsets of one answer (or of the final log) not strictly
  increasing; ``gap``: offsets of a non-compacted final log not contiguous from the
  log start to the high watermark; ``outside_log``: a final record below the log
  start or at/past the high watermark.
- ``past_hw``: a read returned an offset at or past the high watermark it reported;
  ``read_before_offset``: a record before the offset asked for.
- ``inconsistent_read``: a read returned, at an offset the final log still holds,
  another value than the final log holds there.
- ``poll_nonmonotonic``: a consumer got an offset of a partition at or below one it
  already got since its last assignment (duplicate delivery or reordering).
- ``poll_skip``: a consumer's consecutive records of a partition jump over offsets
  the final log holds (Jepsen's poll-skip); ``resume_skip``: after an assignment a
  consumer started past the group's committed offset, over records the log holds.
- ``retry_answer_differs``: a request acknowledged whole, sent again with its
  Idempotency-Key, was acknowledged whole with other offsets (so it was stored again).
- ``missing_object``: an object an index entry or an Iceberg table references is not
  in the bucket after quiescence; ``leaked_object``: an object in the bucket (under
  ``segments/`` or ``tiered/``) nothing references, unreferenced (or, never committed,
  written) so long ago that it was due (GC grace) before a GC pass that finished began,
  or longer ago than GC grace and a stall bound: garbage collection missed it. An upload
  that a write lease still held during that GC pass is not one (invariant 9: a Spark job
  whose abort could not reach a coordinator leaves its uploads pending until its lease
  lapses).
- ``zombie_write``: an idempotent producer's batch acknowledged on a partition at an
  epoch older than one of its batches acknowledged there before (a fenced producer
  wrote); ``out_of_sequence_write``: one acknowledged whose sequence neither starts its
  epoch (0) nor follows a batch of that epoch that may have been stored, on a partition
  that held the producer's state (a batch of it acknowledged there before).
- ``stream_duplicate`` / ``stream_skip``: a group stream resumed with a cursor that
  delivered a partition from before the cursor's offset, or from past it over records
  the log holds (exactly once from a cursor); ``commit_backward``: a group stream's
  committed offsets (read, or where a connection without a cursor started) below what
  was seen before, with no cursor taking them back meanwhile.
- ``commit_past_hw``: a committed offset beyond the final high watermark;
  ``committed_unknown``: the group's final committed offset is none that was ever
  committed.

The transactional workload (``txn`` ops; ``_check_txns``). A transaction's outcome is
``committed`` (the commit returned), ``aborted`` (surely: the abort returned, or a
commit failed into an abort that returned, or a zombie's commit was refused once the
instance fencing it had begun, or no commit was ever asked) or ``unknown`` (a commit
that failed or timed out may still have been decided): the final read_committed read,
after every transactional id was settled by a last ``init_transactions``, decides an
unknown one (none of its records there: aborted; all: committed). Its records are
sends like any produce's (in the log as stored whatever the outcome, so ``lost``,
``duplicate``, ``wrong_offset`` hold), required at the end only when committed (tiering
leaves aborted records out); markers' offsets are no ``gap``.

- ``aborted_read`` (Elle's G1a): a record of an aborted transaction read under
  read_committed, by a reader during the run or at the final read.
- ``intermediate_read`` (G1b): a record read under read_committed before its
  transaction's commit was asked (its ``txn_end``).
- ``txn_lost``: a record of a transaction whose commit returned ok, missing from the
  final read_committed read; ``txn_partial``: a transaction (any outcome) some of
  whose records the final read holds and some not (atomic visibility).
- ``txn_write_order`` (G0 within one transactional id): in a partition of the final
  read_committed log, one id's transactions out of their order (or one transaction's
  records out of the order sent). Across ids Kafka promises no order (concurrent
  transactions interleave in partitions; write cycles between them are allowed), so
  none is checked.
- ``poll_nonmonotonic`` / ``poll_skip`` for a ``txn_poll`` reader: offsets of a
  partition not increasing; under read_committed, a record of the final
  read_committed log skipped between two consecutive ones (a committed transaction's
  records in a partition are seen together). Whether a reader saw a transaction in
  all its partitions at once is not checked: Kafka's read_committed is per partition.
- ``zombie_commit``: a commit that returned ok after a second instance of its
  transactional id had finished ``init_transactions`` (the zombie was not fenced).
- ``txn_offsets_aborted`` / ``txn_offsets_wrong``: a group's final committed offset of
  a partition (``final_txn_offsets``) is one only aborted transactions sent; or it is
  neither that of the last transaction committed ok that sent one nor that of a later
  one not aborted (stale, nobody's, or missing though a commit returned ok).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: At most this many anomalies of one kind are listed in full (all are counted).
MAX_LISTED = 20
#: Between the database's GC pass start and the stamps and store times it compares
#: (one machine's clock; an S3 modification time is whole seconds).
GC_CLOCK_SLACK_S = 1.0


@dataclass
class Send:
    op: int
    topic: str
    mode: str
    key: str | None
    t0: float
    t1: float = math.inf
    status: str = "pending"  # ok, info, fail, pending (no completion: a crashed client)
    pos: tuple[int, int] | None = None
    incarnation: str | None = None
    #: Acknowledged in this partition, at an offset not told (a Spark write).
    partition: int | None = None


@dataclass
class Incarnation:
    topic: str
    topic_id: str
    born: float
    died: float = math.inf


@dataclass
class FinalPart:
    topic: str
    topic_id: str
    partition: int
    log_start: int
    high_watermark: int
    compacted: bool
    records: list[tuple[int, str | None, str]]
    #: Transaction markers take offsets no record holds (and tiering drops aborted
    #: records): holes are no gap.
    markers: bool = False


@dataclass
class _Batch:
    """One idempotent producer's batch on one partition (``_check_producers``)."""

    op: int
    t0: float
    t1: float
    status: str
    epoch: int
    sequence: int
    count: int


@dataclass
class Txn:
    """One transaction of the transactional workload (a ``txn`` op). ``status``: its
    completion as written (``pending``: none); ``outcome``: ``committed`` (the commit
    returned), ``aborted`` (surely: the abort returned; the commit was refused once the
    instance fencing it had begun; or the commit was never asked) or ``unknown`` (a
    commit that failed may still have been decided), which the final read may decide."""

    op: int
    topic: str
    tid: str
    n: int
    values: list[str]
    intent: str
    status: str
    outcome: str
    group: str | None
    #: {partition of the source topic: offset} sent with it (send_offsets_to_transaction).
    offsets: dict[int, int]
    zombie: bool
    #: A zombie's: the ``txn_init`` op of the instance that fenced it (returned ok).
    fenced_by: int | None


@dataclass
class Report:
    """Counts and anomalies; ``summary()`` is the run's last JSON line."""

    ops: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    records: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def anomaly(self, kind: str, **detail: Any) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= MAX_LISTED:
            self.anomalies.append({"kind": kind, **detail})

    def at(self, **place: Any) -> Callable[..., None]:
        """``anomaly`` with the details every anomaly of one place has (``where``,
        ``topic``, ``partition``, ...) given once: ``flag = report.at(where=w, topic=t)``,
        then ``flag("gap", missing=m)``."""
        return functools.partial(self.anomaly, **place)

    def summary(self) -> dict[str, Any]:
        return {
            "operations": sum(sum(c.values()) for c in self.ops.values()),
            "ops": {k: dict(v) for k, v in sorted(self.ops.items())},
            "records": dict(self.records),
            "faults": dict(self.faults),
            "anomaly_counts": dict(self.counts),
            "anomalies": self.anomalies,
        }


def check(events: Iterable[dict[str, Any]]) -> Report:
    """Check the events of one history; returns the report (anomalies empty: valid)."""
    return _Checker(list(events)).run()


class _Checker:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.report = Report()
        self.sends: dict[str, Send] = {}
        self.incarnations: dict[str, list[Incarnation]] = defaultdict(list)
        self.finals: dict[tuple[str, int], FinalPart] = {}
        self.live: dict[str, str] = {}  # topic -> topic id of the final read
        self.located: dict[str, tuple[str, str, int, int]] = {}  # value -> (topic, id, p, o)
        self.txn_of: dict[str, tuple[Txn, int]] = {}  # value -> (its transaction, index)
        self.txn_ends: dict[int, float] = {}  # txn op -> when its commit or abort was asked

    # -- building the model ---------------------------------------------------------

    def run(self) -> Report:
        invokes: dict[int, dict[str, Any]] = {}
        completions: dict[int, dict[str, Any]] = {}
        for e in self.events:
            if e["type"] == "invoke":
                invokes[e["id"]] = e
            elif e["id"] in invokes:
                completions[e["id"]] = e
            elif e["op"] == "fault":
                self.report.faults[e.get("kind", "?")] += 1
            elif e["op"] == "resend":
                self.report.records["keyed_resends"] += 1
                if e.get("same") is False:
                    self.report.anomaly("retry_answer_differs", op=e["op_id"], proc=e["proc"])
        for op_id, inv in invokes.items():
            done = completions.get(op_id)
            # Spark's jobs apart: ``produce:spark``, ``read:spark``.
            spark = inv.get("mode") == "spark" or inv.get("spark")
            op = f"{inv['op']}:spark" if spark else inv["op"]
            self.report.ops[op][done["type"] if done else "pending"] += 1
        self._incarnations(invokes, completions)
        self._sends(invokes, completions)
        self._finals()
        self._check_finals()
        self._check_lost()
        for op_id, inv in invokes.items():
            done = completions.get(op_id)
            if done is not None and done["type"] == "ok" and inv["op"] == "read":
                self._check_read(inv, done)
        self._check_polls(completions)
        self._check_commits(invokes, completions)
        self._check_streams(invokes, completions)
        self._check_producers(invokes, completions)
        self._check_txns(invokes, completions)
        for e in self.events:
            if e["type"] == "info" and e["op"] == "storage":
                self._check_storage(e)
        return self.report

    def _check_storage(self, e: dict[str, Any]) -> None:
        """The storage snapshot (``tests.chaos.run.storage_snapshot``) after quiescence."""
        listed: dict[str, float] = e["listed"]
        rows: dict[str, float | None] = e["rows"]
        self.report.records["objects"] = len(listed)
        for key in e["referenced"]:
            if key not in listed:
                self.report.anomaly("missing_object", key=key, in_rows=key in rows)
        held = set(e.get("referenced_after", e["referenced"]))
        cutoff = e["now"] - e["grace_s"] - e["slack_s"]
        started = e.get("gc_pass_started")
        if started is not None:
            # A pass that began once the object was due, and finished, deleted it.
            cutoff = max(cutoff, started - e["grace_s"] - GC_CLOCK_SLACK_S)
        for key, modified in sorted(listed.items()):
            if key in held:
                continue
            since = rows.get(key, modified)  # no row: an orphan, as old as its PUT
            if since is None or since > cutoff:
                self.report.records["objects_pending_gc"] += 1
                continue
            leased_until = e.get("pending", {}).get(key)
            if (
                leased_until is not None
                and leased_until >= (e["now"] if started is None else started) - GC_CLOCK_SLACK_S
            ):
                self.report.records["objects_held_by_write_leases"] += 1
                continue
            self.report.anomaly(
                "leaked_object",
                key=key,
                row=key in rows,
                unreferenced_s=round(e["now"] - since, 1),
                due_before_gc_pass=started is not None
                and since < started - e["grace_s"] - GC_CLOCK_SLACK_S,
            )

    def _incarnations(
        self, invokes: dict[int, dict[str, Any]], completions: dict[int, dict[str, Any]]
    ) -> None:
        for op_id, inv in invokes.items():
            done = completions.get(op_id)
            if inv["op"] == "create_topic" and done is not None and done["type"] == "ok":
                self.incarnations[inv["topic"]].append(
                    Incarnation(inv["topic"], done["topic_id"], done["t"])
                )
        for incs in self.incarnations.values():
            incs.sort(key=lambda i: i.born)
        for op_id, inv in sorted(invokes.items(), key=lambda kv: kv[1]["t"]):
            done = completions.get(op_id)
            if inv["op"] != "delete_topic" or (done is not None and done["type"] == "fail"):
                continue
            for inc in self.incarnations.get(inv["topic"], []):
                if inc.born <= inv["t"] < inc.died:
                    inc.died = inv["t"]

    def _attribute(self, topic: str, t0: float, t1: float) -> str | None:
        for inc in self.incarnations.get(topic, []):
            if inc.born <= t0 and t1 <= inc.died:
                return inc.topic_id
        return None

    def _sends(
        self, invokes: dict[int, dict[str, Any]], completions: dict[int, dict[str, Any]]
    ) -> None:
        rec = self.report.records
        for op_id, inv in invokes.items():
            if inv["op"] == "txn":
                self._txn_sends(inv, completions.get(op_id))
            if inv["op"] != "produce":
                continue
            done = completions.get(op_id)
            keys = inv.get("keys") or [None] * len(inv["values"])
            results = (done or {}).get("results") or [None] * len(inv["values"])
            placed = inv.get("partitions") if (done or {}).get("placed") else None
            for i, value in enumerate(inv["values"]):
                s = Send(op_id, inv["topic"], inv["mode"], keys[i], inv["t"])
                if done is not None:
                    s.t1 = done["t"]
                    s.status = done["type"]
                    if done["type"] == "ok":
                        if results[i] is None and placed:
                            s.partition = placed[i]
                        elif results[i] is None:
                            s.status = "info"
                        else:
                            s.pos = (results[i][0], results[i][1])
                rec["sent"] += 1
                rec[{"ok": "acked", "fail": "failed"}.get(s.status, "unknown")] += 1
                if s.status == "ok":
                    s.incarnation = self._attribute(s.topic, s.t0, s.t1)
                self.sends[value] = s

    def _txn_sends(self, inv: dict[str, Any], done: dict[str, Any] | None) -> None:
        """A transaction's records as sends: each acknowledged one at its offset (stored
        in the log whatever the transaction's fate), required in the final log only when
        the commit returned (tiering leaves aborted records out)."""
        results = (done or {}).get("results") or [None] * len(inv["values"])
        committed = done is not None and done["type"] == "ok" and inv["intent"] == "commit"
        committed = committed and not inv.get("zombie")
        for i, value in enumerate(inv["values"]):
            s = Send(inv["id"], inv["topic"], "txn", value, inv["t"])
            s.t1 = done["t"] if done is not None else math.inf
            s.status = "ok" if committed else "info"
            if results[i] is not None:
                s.pos = (results[i][0], results[i][1])
            else:
                s.partition = inv["partitions"][i]
            self.report.records["txn_sent"] += 1
            if s.status == "ok":
                s.incarnation = self._attribute(s.topic, s.t0, s.t1)
            self.sends[value] = s

    def _finals(self) -> None:
        for e in self.events:
            if e["op"] == "final_read" and e["type"] == "ok":
                part = FinalPart(
                    e["topic"],
                    e["topic_id"],
                    e["partition"],
                    e["log_start"],
                    e["high_watermark"],
                    bool(e.get("compacted")),
                    [(r[0], r[1], r[2]) for r in e["records"]],
                    bool(e.get("markers")),
                )
                self.finals[(part.topic_id, part.partition)] = part
                self.live[part.topic] = part.topic_id

    # -- checks -----------------------------------------------------------------------

    def _check_value(self, where: str, topic: str, p: int, o: int, value: str) -> None:
        """What holds wherever a value is served: it was sent, to this topic, here."""
        flag = self.report.at(where=where, topic=topic, partition=p, offset=o, value=value)
        s = self.sends.get(value)
        if s is None:
            flag("phantom")
            return
        if s.topic != topic:
            flag("wrong_topic", sent_to=s.topic, op=s.op)
        elif s.pos is not None and s.pos != (p, o):
            flag("wrong_offset", acked_at=list(s.pos), op=s.op, mode=s.mode)
        elif s.partition is not None and s.partition != p:
            flag("wrong_offset", acked_in_partition=s.partition, op=s.op, mode=s.mode)
        if s.status == "fail":
            flag("failed_write_visible", op=s.op)

    def _check_finals(self) -> None:
        seen: dict[str, list[tuple[str, str, int, int]]] = defaultdict(list)
        for (tid, p), part in sorted(self.finals.items()):
            where = f"final {part.topic}/{p}"
            flag = self.report.at(where=where, topic_id=tid)
            bounds = {"log_start": part.log_start, "high_watermark": part.high_watermark}
            offs = [o for o, _, _ in part.records]
            if any(b <= a for a, b in itertools.pairwise(offs)):
                flag("offset_order", offsets=offs[:50])
            outside = [o for o in offs if o < part.log_start or o >= part.high_watermark]
            if outside:
                flag("outside_log", offsets=outside[:20], **bounds)
            contiguous = not part.compacted and not part.markers
            if contiguous and offs != list(range(part.log_start, part.high_watermark)):
                missing = sorted(set(range(part.log_start, part.high_watermark)) - set(offs))
                flag("gap", missing=missing[:20], missing_count=len(missing), **bounds)
            at_p = self.report.at(where=where, topic_id=tid, partition=p)
            for o, _key, value in part.records:
                self.report.records["final"] += 1
                self._check_value(where, part.topic, p, o, value)
                self._check_incarnation(at_p, tid, o, value)
                seen[value].append((part.topic, tid, p, o))
                self.located[value] = (part.topic, tid, p, o)
        for value, places in seen.items():
            if len(places) > 1:
                s = self.sends.get(value)
                self.report.anomaly(
                    "duplicate",
                    value=value,
                    places=[list(x) for x in places],
                    mode=s.mode if s else None,
                    op=s.op if s else None,
                )

    def _check_lost(self) -> None:
        later_keys: dict[tuple[str, int, str], int] = {}
        for s in self.sends.values():
            if s.status == "ok" and s.incarnation and s.key is not None and s.pos:
                k = (s.incarnation, s.pos[0], s.key)
                later_keys[k] = max(later_keys.get(k, -1), s.pos[1])
        for (tid, p), part in self.finals.items():  # a produce of unknown outcome that landed
            for o, key, _ in part.records:
                if key is not None:
                    later_keys[(tid, p, key)] = max(later_keys.get((tid, p, key), -1), o)
        final_at = {
            (tid, p, o): v for (tid, p), part in self.finals.items() for o, _, v in part.records
        }
        rec = self.report.records
        for value, s in self.sends.items():
            if s.status == "ok" and s.pos is None and s.partition is not None:
                self._check_placed(value, s)
            if s.status != "ok" or s.pos is None:
                continue
            if s.incarnation is None:
                rec["acked_unattributed"] += 1
                continue
            p, o = s.pos
            part = self.finals.get((s.incarnation, p))
            if part is None:
                rec["acked_in_deleted_topics"] += 1
                continue
            if final_at.get((s.incarnation, p, o)) == value:
                rec["acked_found"] += 1
            elif o < part.log_start:
                rec["acked_removed_by_log_start"] += 1
            elif (
                part.compacted
                and s.key is not None
                and later_keys.get((s.incarnation, p, s.key), -1) > o
            ):
                rec["acked_compacted_away"] += 1
            else:
                self._lost(value, s, part, p, o, found_there=final_at.get((s.incarnation, p, o)))

    def _lost(
        self, value: str, s: Send, part: FinalPart, p: int | None, o: int | None, **detail: Any
    ) -> None:
        """An acknowledged record missing from ``part``, the final log it belongs in."""
        self.report.anomaly(
            "lost",
            topic=s.topic,
            topic_id=s.incarnation,
            partition=p,
            offset=o,
            value=value,
            op=s.op,
            mode=s.mode,
            log_start=part.log_start,
            high_watermark=part.high_watermark,
            **detail,
        )

    def _check_placed(self, value: str, s: Send) -> None:
        """An acknowledged record whose partition alone is known (a Spark write): found
        in that partition of its incarnation, unless the log start moved (it may have
        been below it) or compaction may have removed it."""
        rec = self.report.records
        if s.incarnation is None:
            rec["acked_unattributed"] += 1
            return
        part = self.finals.get((s.incarnation, s.partition or 0))
        loc = self.located.get(value)
        if part is None:
            rec["acked_in_deleted_topics"] += 1
        elif loc is not None and loc[1:3] == (s.incarnation, s.partition):
            rec["acked_found"] += 1
        elif part.log_start > 0 or part.compacted:
            rec["acked_unplaced_unverified"] += 1
        else:
            self._lost(value, s, part, s.partition, None)

    def _against_final(
        self, where: str, topic: str, p: int, records: list[tuple[int, str]]
    ) -> None:
        """A read's records vs the final log of the incarnation they came from."""
        tids = {self.located[v][1] for _, v in records if v in self.located}
        for tid in tids:
            part = self.finals.get((tid, p))
            if part is None:
                continue
            held = {o: v for o, _, v in part.records}
            flag = self.report.at(where=where, topic=topic, partition=p)
            for o, v in records:
                if o >= part.log_start and o in held and held[o] != v:
                    flag("inconsistent_read", offset=o, read=v, final=held[o])

    def _check_read(self, inv: dict[str, Any], done: dict[str, Any]) -> None:
        topic, p = inv["topic"], inv["partition"]
        where = f"read op {inv['id']}"
        flag = self.report.at(where=where, topic=topic, partition=p)
        records = [(r[0], r[1]) for r in done["records"]]
        offs = [o for o, _ in records]
        if any(b <= a for a, b in itertools.pairwise(offs)):
            flag("offset_order", offsets=offs[:50])
        hw = done.get("high_watermark")
        if hw is not None and offs and offs[-1] >= hw:
            flag("past_hw", offset=offs[-1], high_watermark=hw)
        asked = inv.get("offset")
        if asked is not None and offs and offs[0] < asked:
            flag("read_before_offset", offset=offs[0], asked=asked)
        # A read wholly inside one incarnation's life serves that incarnation only.
        served = self._attribute(topic, inv["t"], done["t"])
        for o, v in records:
            self.report.records["read"] += 1
            self._check_value(where, topic, p, o, v)
            self._check_located(where, topic, p, o, v)
            if served:
                self._check_incarnation(flag, served, o, v, served_by=served)
        self._against_final(where, topic, p, records)

    def _check_incarnation(
        self, flag: Callable[..., None], served: str, o: int, value: str, **detail: Any
    ) -> None:
        """``wrong_incarnation``: served by incarnation ``served``, acknowledged in another."""
        s = self.sends.get(value)
        if s is not None and s.incarnation is not None and s.incarnation != served:
            flag(
                "wrong_incarnation",
                offset=o,
                value=value,
                **detail,
                acked_in=s.incarnation,
                op=s.op,
            )

    def _check_located(self, where: str, topic: str, p: int, o: int, v: str) -> None:
        loc = self.located.get(v)
        if loc is not None and loc[0] == topic and (loc[2], loc[3]) != (p, o):
            s = self.sends.get(v)
            if s is None or s.pos is None:  # else _check_value reported it already
                flag = self.report.at(where=where, topic=topic, partition=p, offset=o, value=v)
                flag("wrong_offset", final_at=[loc[2], loc[3]])

    def _check_polls(self, completions: dict[int, dict[str, Any]]) -> None:
        # consumer -> (topic, partition) -> (last offset, incarnation of the last value)
        last: dict[str, dict[tuple[str, int], tuple[int, str | None]]] = defaultdict(dict)
        for e in sorted(completions.values(), key=lambda e: e["t"]):
            if e["type"] != "ok":
                continue
            if e["op"] == "assign":
                last[e["consumer"]] = {}
                continue
            if e["op"] not in ("poll", "stream_poll"):
                continue
            c, topic = e["consumer"], e["topic"]
            where = f"poll op {e['id']} by {c}"
            flag = self.report.at(where=where, consumer=c, topic=topic)
            by_p: dict[int, list[tuple[int, str]]] = defaultdict(list)
            for p, o, v in e["records"]:
                self.report.records["polled" if e["op"] == "poll" else "streamed"] += 1
                self._check_value(where, topic, p, o, v)
                self._check_located(where, topic, p, o, v)
                by_p[p].append((o, v))
                tid = self.located[v][1] if v in self.located else None
                prev = last[c].get((topic, p))
                if prev is not None:
                    if o <= prev[0]:
                        flag("poll_nonmonotonic", partition=p, offset=o, after=prev[0])
                    elif o > prev[0] + 1 and tid is not None and tid == prev[1]:
                        part = self.finals.get((tid, p))
                        if part is not None:
                            skipped = [x for x, _, _ in part.records if prev[0] < x < o]
                            if skipped:
                                flag(
                                    "poll_skip",
                                    partition=p,
                                    offset=o,
                                    after=prev[0],
                                    skipped=skipped[:20],
                                )
                last[c][(topic, p)] = (o, tid)
            for p, recs in by_p.items():
                self._against_final(where, topic, p, recs)

    def _check_streams(
        self, invokes: dict[int, dict[str, Any]], completions: dict[int, dict[str, Any]]
    ) -> None:
        """Group streams (``stream_open``, ``stream_poll``, ``group_offsets``): a
        connection opened with a cursor delivers each partition from exactly the cursor's
        offset (``stream_duplicate``: before it; ``stream_skip``: past records the log
        holds), and the group's committed offsets (read, or where a connection without a
        cursor started) never go below what was seen before, except where a cursor took a
        partition back (``commit_backward``). A connection that ended in an error may
        live on at the server (a paused agent) and commit late: no floor is kept across
        one. Within a connection, ``_check_polls`` checks each ``stream_poll``."""
        opens: dict[str, dict[str, Any]] = {}  # connection -> its stream_open invoke
        firsts: dict[str, dict[int, tuple[int, str]]] = defaultdict(dict)
        for op_id, inv in invokes.items():
            done = completions.get(op_id)
            if inv["op"] == "stream_open" and done is not None and done["type"] == "ok":
                opens[inv["consumer"]] = inv
        for e in sorted(completions.values(), key=lambda e: e["t"]):
            if e["op"] == "stream_poll" and e["type"] == "ok":
                for p, o, v in e["records"]:
                    firsts[e["consumer"]].setdefault(p, (o, v))
        for conn, inv in opens.items():
            for p_s, at in (inv.get("cursor") or {}).items():
                first = firsts[conn].get(int(p_s))
                if first is None:
                    continue
                o, v = first
                flag = self.report.at(
                    where=f"stream {conn} op {inv['id']}",
                    group=inv["group"],
                    topic=inv["topic"],
                    partition=int(p_s),
                    offset=o,
                    cursor=at,
                )
                if o < at:
                    flag("stream_duplicate")
                    continue
                tid = self.located[v][1] if v in self.located else None
                part = self.finals.get((tid, int(p_s))) if tid else None
                skipped = [x for x, _, _ in part.records if at <= x < o] if part else []
                if skipped:
                    flag("stream_skip", skipped=skipped[:20])
        # The committed offsets' floor per (group, partition), in history order.
        floor: dict[tuple[str, int], tuple[int, str]] = {}
        group_of = {conn: inv["group"] for conn, inv in opens.items()}
        seen: list[tuple[float, str, dict[int, int], str, bool]] = []
        for op_id, inv in invokes.items():
            done = completions.get(op_id)
            if inv["op"] == "group_offsets" and done is not None and done["type"] == "ok":
                offs = {int(p): o for p, o in done["offsets"].items()}
                seen.append((done["t"], inv["group"], offs, f"group_offsets op {op_id}", False))
            elif inv["op"] == "stream_open" and inv["consumer"] in opens:
                if inv.get("cursor") is not None:
                    at = {int(p): o for p, o in inv["cursor"].items()}
                    seen.append((inv["t"], inv["group"], at, f"cursor op {op_id}", True))
                else:
                    starts = {p: o for p, (o, _) in firsts[inv["consumer"]].items()}
                    seen.append((inv["t"], inv["group"], starts, f"stream_open op {op_id}", False))
        for e in self.events:
            if e["op"] == "stream_error" and e.get("consumer") in group_of:
                seen.append((e["t"], group_of[e["consumer"]], {}, "error", True))
        for _t, group, offs, where, lowers in sorted(seen, key=lambda x: x[0]):
            if where == "error":
                for k in [k for k in floor if k[0] == group]:
                    del floor[k]
                continue
            for p, o in offs.items():
                k = (group, p)
                if lowers:
                    if k in floor and o < floor[k][0]:
                        floor[k] = (o, where)
                    continue
                if k in floor and o < floor[k][0]:
                    self.report.anomaly(
                        "commit_backward",
                        where=where,
                        group=group,
                        partition=p,
                        offset=o,
                        floor=floor[k][0],
                        floor_seen=floor[k][1],
                    )
                floor[k] = (o, where)

    def _check_producers(
        self, invokes: dict[int, dict[str, Any]], completions: dict[int, dict[str, Any]]
    ) -> None:
        """Idempotent producers' batches (a produce with a ``producer``), per producer id,
        topic incarnation and partition: one acknowledged must follow a batch of its epoch
        that may have been stored (or start its epoch at sequence 0), and none may be
        acknowledged at an epoch older than one already acknowledged there."""
        batches: dict[tuple[int, str, int], list[_Batch]] = defaultdict(list)
        for op_id, inv in invokes.items():
            producer = inv.get("producer")
            if inv["op"] != "produce" or not producer:
                continue
            done = completions.get(op_id)
            status = done["type"] if done is not None else "pending"
            if status == "fail":  # refused: nothing stored
                continue
            t1 = done["t"] if done is not None else math.inf
            inc = self._attribute(inv["topic"], inv["t"], t1)
            if inc is None:
                continue
            counts = Counter(inv["partitions"])
            for p_s, seq in producer["sequences"].items():
                key = (producer["producer_id"], inc, int(p_s))
                batches[key].append(
                    _Batch(
                        op_id,
                        inv["t"],
                        t1,
                        status,
                        producer["producer_epoch"],
                        seq,
                        counts[int(p_s)],
                    )
                )
        for (pid, inc, p), bs in batches.items():
            for b in bs:
                if b.status != "ok":
                    continue
                flag = self.report.at(
                    op=b.op, producer_id=pid, topic_id=inc, partition=p, epoch=b.epoch
                )
                newer = [x for x in bs if x.status == "ok" and x.epoch > b.epoch and x.t1 < b.t0]
                if newer:
                    flag("zombie_write", fenced_by=newer[0].op, newer_epoch=newer[0].epoch)
                # A partition with no state of the producer takes any sequence (Kafka's
                # rule: a topic created again); it surely held state once a batch of
                # the producer was acknowledged there before this one began.
                held = any(x.status == "ok" and x.t1 < b.t0 for x in bs)
                follows = (
                    not held
                    or b.sequence == 0
                    or any(
                        x.epoch == b.epoch and x.sequence + x.count == b.sequence and x.t0 < b.t1
                        for x in bs
                    )
                )
                if not follows:
                    ends = sorted(
                        x.sequence + x.count for x in bs if x.epoch == b.epoch and x is not b
                    )
                    flag("out_of_sequence_write", sequence=b.sequence, before=ends[-5:])

    def _check_commits(
        self, invokes: dict[int, dict[str, Any]], completions: dict[int, dict[str, Any]]
    ) -> None:
        deleted = {inv["topic"] for inv in invokes.values() if inv["op"] == "delete_topic"}
        committed: dict[tuple[str, str, int], set[int]] = defaultdict(set)
        # (group, topic, partition) -> [(time the commit was invoked, offset)] of commits
        # that may have happened, for the resume check.
        history: dict[tuple[str, str, int], list[tuple[float, float, int]]] = defaultdict(list)
        for op_id, inv in invokes.items():
            if inv["op"] != "commit":
                continue
            done = completions.get(op_id)
            if done is None or done["type"] == "fail":
                continue
            for p_s, o in inv["offsets"].items():
                k = (inv["group"], inv["topic"], int(p_s))
                committed[k].add(o)
                history[k].append((inv["t"], done["t"] if done["type"] == "ok" else math.inf, o))
                tid = self.live.get(inv["topic"])
                part = self.finals.get((tid, int(p_s))) if tid else None
                if inv["topic"] not in deleted and part is not None and o > part.high_watermark:
                    self.report.anomaly(
                        "commit_past_hw",
                        op=op_id,
                        group=inv["group"],
                        topic=inv["topic"],
                        partition=int(p_s),
                        offset=o,
                        high_watermark=part.high_watermark,
                    )
        for e in self.events:
            if e["op"] == "final_committed" and e["type"] == "ok" and e["topic"] not in deleted:
                for p_s, o in e["offsets"].items():
                    k = (e["group"], e["topic"], int(p_s))
                    flag = self.report.at(group=k[0], topic=k[1], partition=k[2], offset=o)
                    part = self.finals.get((e["topic_id"], int(p_s)))
                    if part is not None and o > part.high_watermark:
                        flag("commit_past_hw", high_watermark=part.high_watermark)
                    if o >= 0 and o not in committed[k]:
                        flag("committed_unknown", committed=sorted(committed[k])[-10:])
        self._check_resumes(completions, history, deleted)

    def _check_resumes(
        self,
        completions: dict[int, dict[str, Any]],
        history: dict[tuple[str, str, int], list[tuple[float, float, int]]],
        deleted: set[str],
    ) -> None:
        """After an assignment, a consumer starts at most at the group's committed offset."""
        pending: dict[str, tuple[float, str, str]] = {}  # consumer -> (assigned at, group, topic)
        started: set[tuple[str, int]] = set()
        for e in sorted(completions.values(), key=lambda e: e["t"]):
            if e["type"] != "ok":
                continue
            if e["op"] == "assign" and e.get("group") and e["topic"] not in deleted:
                pending[e["consumer"]] = (e["t"], e["group"], e["topic"])
                started = {x for x in started if x[0] != e["consumer"]}
            elif e["op"] == "poll" and e["consumer"] in pending:
                at, group, topic = pending[e["consumer"]]
                for p, o, v in e["records"]:
                    if (e["consumer"], p) in started:
                        continue
                    started.add((e["consumer"], p))
                    # Commits acknowledged before the assignment are in; any that may have
                    # landed before it could be the position too: the highest is the bound.
                    bound = max(
                        (off for t0, _t1, off in history[(group, topic, p)] if t0 < at),
                        default=None,
                    )
                    tid = self.located[v][1] if v in self.located else None
                    part = self.finals.get((tid, p)) if tid else None
                    if bound is None or part is None or o <= bound:
                        continue
                    skipped = [x for x, _, _ in part.records if bound <= x < o]
                    if skipped:
                        self.report.anomaly(
                            "resume_skip",
                            consumer=e["consumer"],
                            group=group,
                            topic=topic,
                            partition=p,
                            offset=o,
                            committed=bound,
                            skipped=skipped[:20],
                        )

    # -- transactions -------------------------------------------------------------------

    def _txns(
        self, invokes: dict[int, dict[str, Any]], completions: dict[int, dict[str, Any]]
    ) -> dict[int, Txn]:
        """The ``txn`` ops as transactions, each with its outcome as the client knows it
        (see ``Txn``)."""
        ends: dict[int, str] = {}
        for e in self.events:
            if e["op"] == "txn_end" and e["type"] == "info":
                ends[e["op_id"]] = e["action"]
                self.txn_ends[e["op_id"]] = e["t"]
        txns: dict[int, Txn] = {}
        for op_id, inv in invokes.items():
            if inv["op"] != "txn":
                continue
            done = completions.get(op_id)
            status = done["type"] if done is not None else "pending"
            if status == "ok" and inv.get("zombie"):
                outcome = "unknown"  # a zombie's commit that succeeded: zombie_commit
            elif status == "ok":
                outcome = "committed" if inv["intent"] == "commit" else "aborted"
            elif status == "fail" or ends.get(op_id) != "commit":
                # Refused after its fencing instance's init returned, aborted after an
                # abortable error, or never asked to commit: nothing can commit it.
                outcome = "aborted"
            else:
                outcome = "unknown"  # a commit that failed may still have been decided
            t = Txn(
                op=op_id,
                topic=inv["topic"],
                tid=inv["transactional_id"],
                n=inv["n"],
                values=inv["values"],
                intent=inv["intent"],
                status=status,
                outcome=outcome,
                group=inv.get("group"),
                offsets={int(p): o for p, o in (inv.get("offsets") or {}).items()},
                zombie=bool(inv.get("zombie")),
                fenced_by=(done or {}).get("fenced_by"),
            )
            txns[op_id] = t
            for i, v in enumerate(t.values):
                self.txn_of[v] = (t, i)
        return txns

    def _check_txns(
        self, invokes: dict[int, dict[str, Any]], completions: dict[int, dict[str, Any]]
    ) -> None:
        """The transactional workload (Elle's G0 and G1 for Kafka transactions, as far as
        a log shows them); the kinds are listed in the module docstring. The final
        read_committed read (``final_txn_read``, after every transactional id was
        settled by a last ``init_transactions``) decides the transactions the client
        could not: none of its records there, it was aborted; all, committed."""
        txns = self._txns(invokes, completions)
        if not txns:
            return
        rec = self.report.records
        final: dict[tuple[str, int], list[tuple[int, str]]] = {}
        for e in self.events:
            if e["op"] == "final_txn_read" and e["type"] == "ok":
                final[(e["topic"], e["partition"])] = [(r[0], r[1]) for r in e["records"]]
        visible = {v for recs in final.values() for _, v in recs}
        for t in txns.values():
            if final and t.outcome == "unknown":
                seen = [v in visible for v in t.values]
                if not any(seen) or all(seen):
                    t.outcome = "committed" if all(seen) else "aborted"
                    rec[f"txn_unknown_{t.outcome}"] += 1
            rec[f"txn_{t.outcome}"] += 1
            if t.zombie:
                rec["txn_zombies"] += 1
                if t.status == "ok" and t.fenced_by is not None:
                    self.report.anomaly(
                        "zombie_commit", op=t.op, transactional_id=t.tid, fenced_by=t.fenced_by
                    )
        for (topic, p), recs in sorted(final.items()):
            where = f"final_txn_read {topic}/{p}"
            self._check_txn_records(where, topic, p, recs, math.inf, "read_committed")
            self._check_txn_order(where, topic, p, recs)
        if final:
            self._check_txn_final(txns, visible)
        self._check_txn_polls(completions, final)
        self._check_txn_offsets(txns)

    def _check_txn_records(
        self,
        where: str,
        topic: str,
        p: int,
        records: list[tuple[int, str]],
        t: float,
        isolation: str,
    ) -> None:
        """Records a transactional topic served at time ``t``: sent there, at their
        offsets; under read_committed, of no aborted transaction (``aborted_read``) and
        of none whose commit was not yet asked (``intermediate_read``)."""
        flag = self.report.at(where=where, topic=topic, partition=p)
        for o, v in records:
            self._check_value(where, topic, p, o, v)
            got = self.txn_of.get(v)
            if got is None or isolation != "read_committed":
                continue
            txn = got[0]
            asked = self.txn_ends.get(txn.op)  # None: never asked
            if txn.outcome == "aborted":
                flag("aborted_read", offset=o, value=v, op=txn.op, status=txn.status)
            elif t < (math.inf if asked is None else asked):
                flag("intermediate_read", offset=o, value=v, op=txn.op, commit_asked_at=asked)

    def _check_txn_order(
        self, where: str, topic: str, p: int, records: list[tuple[int, str]]
    ) -> None:
        """G0 within one transactional id: its transactions are sequential (a new
        instance settles the last one's before it begins), so in a partition of the
        read_committed log they appear in their order, each one's records as sent."""
        last: dict[str, tuple[int, int, int]] = {}  # id -> (txn number, index, offset)
        flag = self.report.at(where=where, topic=topic, partition=p)
        for o, v in records:
            got = self.txn_of.get(v)
            if got is None:
                continue
            txn, i = got
            prev = last.get(txn.tid)
            if prev is not None and (txn.n, i) <= prev[:2]:
                flag("txn_write_order", offset=o, value=v, op=txn.op, after=list(prev))
            last[txn.tid] = (txn.n, i, o)

    def _check_txn_final(self, txns: dict[int, Txn], visible: set[str]) -> None:
        for t in txns.values():
            seen = [v for v in t.values if v in visible]
            missing = [v for v in t.values if v not in visible]
            if t.outcome == "committed" and t.status == "ok" and missing:
                self.report.anomaly(
                    "txn_lost", op=t.op, topic=t.topic, value=missing[0], missing=missing
                )
            elif seen and missing:
                self.report.anomaly(
                    "txn_partial",
                    op=t.op,
                    topic=t.topic,
                    value=seen[0],
                    visible=seen,
                    missing=missing,
                    status=t.status,
                )

    def _check_txn_polls(
        self,
        completions: dict[int, dict[str, Any]],
        final: dict[tuple[str, int], list[tuple[int, str]]],
    ) -> None:
        """The transactional topic's readers (``txn_poll``): their records as
        ``_check_txn_records`` says, offsets of a partition increasing, and under
        read_committed no record of the final read_committed log skipped between two
        consecutive ones (a committed transaction's records in a partition seen
        together). Whether a reader saw a transaction in all its partitions at once is
        not checked: Kafka's read_committed is per partition."""
        last: dict[tuple[str, str, int], int] = {}
        held = {k: [o for o, _ in recs] for k, recs in final.items()}
        for e in sorted(completions.values(), key=lambda e: e["t"]):
            if e["op"] != "txn_poll" or e["type"] != "ok":
                continue
            c, topic, isolation = e["consumer"], e["topic"], e["isolation"]
            where = f"txn_poll op {e['id']} by {c}"
            flag = self.report.at(where=where, consumer=c, topic=topic)
            by_p: dict[int, list[tuple[int, str]]] = defaultdict(list)
            for p, o, v in e["records"]:
                self.report.records[f"txn_polled_{isolation}"] += 1
                by_p[p].append((o, v))
                prev = last.get((c, topic, p))
                if prev is not None and o <= prev:
                    flag("poll_nonmonotonic", partition=p, offset=o, after=prev)
                elif prev is not None and isolation == "read_committed":
                    skipped = [x for x in held.get((topic, p), []) if prev < x < o]
                    if skipped:
                        flag("poll_skip", partition=p, offset=o, after=prev, skipped=skipped[:20])
                last[(c, topic, p)] = o
            for p, recs in by_p.items():
                self._check_txn_records(where, topic, p, recs, e["t"], isolation)

    def _check_txn_offsets(self, txns: dict[int, Txn]) -> None:
        """A group's final committed offsets (``final_txn_offsets``) against the offsets
        its transactions sent (``send_offsets_to_transaction``): per partition, the last
        transaction committed ok that sent one, or a later one not aborted (one of
        unknown outcome may have committed), else ``txn_offsets_aborted`` (only aborted
        transactions sent it) or ``txn_offsets_wrong`` (a stale offset, one nobody sent,
        or none though a transaction committed one)."""
        for e in self.events:
            if e["op"] != "final_txn_offsets" or e["type"] != "ok":
                continue
            group, topic = e["group"], e["topic"]
            sent = sorted((t for t in txns.values() if t.group == group), key=lambda t: t.op)
            parts = {p for t in sent for p in t.offsets} | {int(p) for p in e["offsets"]}
            for p in sorted(parts):
                got = e["offsets"].get(str(p))
                mine = [t for t in sent if p in t.offsets]
                ok = [t for t in mine if t.outcome == "committed" and t.status == "ok"]
                after = ok[-1].op if ok else -1
                allowed = {t.offsets[p] for t in mine if t.op >= after and t.outcome != "aborted"}
                if got in allowed or (got is None and not ok):
                    self.report.records["txn_offsets_checked"] += 1
                    continue
                aborted = {t.offsets[p] for t in mine if t.outcome == "aborted"}
                self.report.anomaly(
                    "txn_offsets_aborted" if got in aborted else "txn_offsets_wrong",
                    group=group,
                    topic=topic,
                    partition=p,
                    offset=got,
                    allowed=sorted(allowed)[-10:],
                    last_committed_op=ok[-1].op if ok else None,
                )


def _touches(op: list[dict[str, Any]], topic: str | None, partition: int | None) -> bool:
    """Whether an operation (its invoke and completion) is about ``topic`` (and
    ``partition``: a produce's results, a poll's records, a read's or final read's)."""
    merged: dict[str, Any] = {k: v for e in op for k, v in e.items()}
    if topic is None or merged.get("topic") != topic:
        return False
    if partition is None or merged.get("partition") == partition:
        return True
    if merged.get("op") == "produce":
        return any(r and r[0] == partition for r in merged.get("results") or ())
    if merged.get("op") == "poll":
        return any(r[0] == partition for r in merged.get("records") or ())
    return False


def _carries(op: list[dict[str, Any]], value: str) -> bool:
    for e in op:
        if value in (e.get("values") or ()):
            return True
        if any(value in r for r in e.get("records") or () if isinstance(r, list)):
            return True
    return False


def excerpt(
    events: list[dict[str, Any]], anomaly: dict[str, Any], around: int = 3, limit: int = 40
) -> list[dict[str, Any]]:
    """The minimal part of a history that shows ``anomaly``: the operations it names
    (``op``, ``op_id``, ``... op N`` in ``where``) or that carry its ``value`` (else,
    for a final log's anomaly, that final read), each with the ``around`` operations of
    the same topic (and partition) before and after it, and the faults injected
    meanwhile; their events in history order, at most ``limit``."""
    ops: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        ops[e["id"]].append(e)
    named: set[int] = {anomaly[k] for k in ("op", "op_id") if isinstance(anomaly.get(k), int)}
    where = str(anomaly.get("where", "")).split()
    if len(where) >= 3 and where[-2] == "op" and where[-1].isdigit():
        named.add(int(where[-1]))
    topic = anomaly.get("topic") or anomaly.get("sent_to")
    partition = anomaly.get("partition")
    if len(where) == 2 and where[0] == "final" and "/" in where[1]:
        topic, p = where[1].rsplit("/", 1)
        partition = int(p) if p.isdigit() else partition
    value = anomaly.get("value")
    if isinstance(value, str):
        named.update(i for i, op in ops.items() if _carries(op, value))
    if not named and topic is not None:
        named.update(
            i
            for i, op in ops.items()
            if op[0]["op"] == "final_read" and _touches(op, topic, partition)
        )
    order = sorted(ops)  # ids follow invocations
    related = [i for i in order if _touches(ops[i], topic, partition)]
    chosen = set(named)
    for i in named:
        chosen.update(
            [j for j in related if j < i][-around:] + [j for j in related if j > i][:around]
        )
    if chosen:
        t0 = min(ops[i][0]["t"] for i in chosen) - 2
        t1 = max(ops[i][-1]["t"] for i in chosen) + 2
        chosen.update(
            i for i, op in ops.items() if op[0]["op"] == "fault" and t0 <= op[0]["t"] <= t1
        )
    out = sorted((e for i in chosen for e in ops[i]), key=lambda e: e["t"])
    return out[:limit]
