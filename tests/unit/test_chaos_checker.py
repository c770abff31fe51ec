"""The chaos checker finds each anomaly in a crafted history, and none in a valid one.

A checker that never fails proves nothing: each test below breaks one valid history in
one way (a lost ack, a duplicate, a record under another topic id, a reordering, ...)
and asserts that exactly that kind is reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.checker import check, excerpt
from tests.chaos.history import History, read_history


class H:
    """Builds a history in memory with explicit times."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.next_id = 1
        self.t = 0.0

    def op(self, op: str, outcome: str | None, inv: dict[str, Any], **done: Any) -> int:
        op_id = self.next_id
        self.next_id += 1
        self.t += 1
        self.events.append(
            {"id": op_id, "t": self.t, "proc": "p", "type": "invoke", "op": op, **inv}
        )
        if outcome is not None:
            self.t += 1
            self.events.append(
                {"id": op_id, "t": self.t, "proc": "p", "type": outcome, "op": op, **done}
            )
        return op_id

    def read(
        self, topic: str, offset: int | None, records: list[list[Any]], hw: int, **done: Any
    ) -> int:
        """An ``ok`` read of partition 0 from ``offset``: ``records`` ([offset, value] each)
        and the high watermark ``hw`` (``done``: more of the answer)."""
        inv = {"topic": topic, "partition": 0, "offset": offset}
        return self.op("read", "ok", inv, records=records, high_watermark=hw, **done)

    def create(self, topic: str, tid: str) -> None:
        self.op("create_topic", "ok", {"topic": topic, "partitions": 1}, topic_id=tid)

    def produce(
        self,
        topic: str,
        values: list[str],
        results: list[Any],
        outcome: str = "ok",
        mode: str = "v2",
        keys: list[str | None] | None = None,
    ) -> None:
        inv: dict[str, Any] = {"topic": topic, "mode": mode, "values": values}
        if keys is not None:
            inv["keys"] = keys
        self.op("produce", outcome, inv, results=results)

    def final(
        self,
        topic: str,
        tid: str,
        records: list[tuple[int, str]],
        log_start: int = 0,
        hw: int | None = None,
        p: int = 0,
        compacted: bool = False,
        keys: dict[int, str] | None = None,
        markers: bool = False,
    ) -> None:
        self.t += 1
        self.events.append(
            {
                "id": self.next_id,
                "t": self.t,
                "proc": "final",
                "type": "ok",
                "op": "final_read",
                "topic": topic,
                "topic_id": tid,
                "partition": p,
                "log_start": log_start,
                "high_watermark": hw if hw is not None else log_start + len(records),
                "compacted": compacted,
                "markers": markers,
                "records": [[o, (keys or {}).get(o), v] for o, v in records],
            }
        )
        self.next_id += 1


def kinds(h: H) -> set[str]:
    return set(check(h.events).counts)


def valid() -> H:
    h = H()
    h.create("a", "A1")
    h.produce("a", ["a1", "a2"], [[0, 0], [0, 1]])
    h.produce("a", ["a3"], [], outcome="info")  # unknown: may be missing
    return h


def test_a_valid_history_has_no_anomaly() -> None:
    h = valid()
    h.final("a", "A1", [(0, "a1"), (1, "a2")])
    report = check(h.events)
    assert report.anomalies == []
    assert report.records["acked_found"] == 2
    assert report.summary()["records"]["unknown"] == 1


def test_lost_ack() -> None:
    h = valid()
    h.final("a", "A1", [(0, "a1")], hw=1)
    assert kinds(h) == {"lost"}


def test_lost_ack_explained_by_log_start_is_no_anomaly() -> None:
    h = valid()
    h.final("a", "A1", [(1, "a2")], log_start=1)
    assert kinds(h) == set()


def test_duplicate() -> None:
    h = valid()
    h.final("a", "A1", [(0, "a1"), (1, "a2"), (2, "a3"), (3, "a3")])
    assert kinds(h) == {"duplicate"}


def idem(
    h: H,
    values: list[str],
    epoch: int,
    sequence: int,
    offset: int,
    outcome: str = "ok",
    pid: int = 7,
) -> None:
    """An idempotent producer's batch to partition 0 of topic a."""
    inv = {
        "topic": "a",
        "mode": "v3-idem",
        "values": values,
        "partitions": [0] * len(values),
        "producer": {"producer_id": pid, "producer_epoch": epoch, "sequences": {"0": sequence}},
    }
    h.op("produce", outcome, inv, results=[[0, offset + i] for i in range(len(values))])


def test_idempotent_batches_in_sequence_and_epoch_are_valid() -> None:
    """Sequences follow a batch that may have been stored (an unknown one too), a new
    epoch starts at 0, a refused zombie or gap is nothing; another producer is apart."""
    h = H()
    h.create("a", "A1")
    idem(h, ["i1", "i2"], 0, 0, 0)
    idem(h, ["i3"], 0, 2, 2, outcome="info")  # unknown: then stored, as the next shows
    idem(h, ["i4"], 0, 3, 3)
    idem(h, ["i5"], 1, 0, 4)  # the next epoch
    idem(h, ["z1"], 0, 4, 5, outcome="fail")  # a zombie refused
    idem(h, ["g1"], 1, 9, 5, outcome="fail")  # a gap refused
    idem(h, ["i6"], 1, 1, 5)
    idem(h, ["o1"], 0, 0, 6, pid=8)  # another producer, epoch 0
    h.final(
        "a", "A1", [(0, "i1"), (1, "i2"), (2, "i3"), (3, "i4"), (4, "i5"), (5, "i6"), (6, "o1")]
    )
    assert check(h.events).anomalies == []


def test_zombie_write() -> None:
    """Epoch 0 acknowledged on a partition after epoch 1 was acknowledged there."""
    h = H()
    h.create("a", "A1")
    idem(h, ["i1"], 0, 0, 0)
    idem(h, ["i2"], 1, 0, 1)
    idem(h, ["z1"], 0, 1, 2)
    h.final("a", "A1", [(0, "i1"), (1, "i2"), (2, "z1")])
    assert kinds(h) == {"zombie_write"}
    (a,) = check(h.events).anomalies
    assert (a["epoch"], a["newer_epoch"], a["producer_id"]) == (0, 1, 7), a


def test_zombie_write_needs_the_newer_epoch_acknowledged_first() -> None:
    """Epoch 1's batch overlapping the old epoch's (both in flight) fences nothing yet."""
    h = H()
    h.create("a", "A1")
    idem(h, ["i1"], 0, 0, 0)
    h.events.append(
        {
            "id": 90,
            "t": 10.0,
            "proc": "p",
            "type": "invoke",
            "op": "produce",
            "topic": "a",
            "mode": "v3-idem",
            "values": ["i2"],
            "partitions": [0],
            "producer": {"producer_id": 7, "producer_epoch": 1, "sequences": {"0": 0}},
        }
    )
    h.events.append(
        {
            "id": 91,
            "t": 10.5,
            "proc": "p",
            "type": "invoke",
            "op": "produce",
            "topic": "a",
            "mode": "v3-idem",
            "values": ["i3"],
            "partitions": [0],
            "producer": {"producer_id": 7, "producer_epoch": 0, "sequences": {"0": 1}},
        }
    )
    h.events.append(
        {"id": 90, "t": 11.0, "proc": "p", "type": "ok", "op": "produce", "results": [[0, 2]]}
    )
    h.events.append(
        {"id": 91, "t": 11.5, "proc": "p", "type": "ok", "op": "produce", "results": [[0, 1]]}
    )
    h.t = 12
    h.final("a", "A1", [(0, "i1"), (1, "i3"), (2, "i2")])
    assert kinds(h) == set()


def test_out_of_sequence_write() -> None:
    """A batch acknowledged at sequence 5 when the epoch's last batch ended at 2."""
    h = H()
    h.create("a", "A1")
    idem(h, ["i1", "i2"], 0, 0, 0)
    idem(h, ["g1"], 0, 5, 2)
    h.final("a", "A1", [(0, "i1"), (1, "i2"), (2, "g1")])
    assert kinds(h) == {"out_of_sequence_write"}
    (a,) = check(h.events).anomalies
    assert (a["sequence"], a["before"]) == (5, [2]), a


def test_a_recreated_topic_takes_a_producer_at_any_sequence() -> None:
    """The topic created again holds no state of the producer, which goes on counting
    (sequence 2 on A2): Kafka's rule, no anomaly; the next batch must follow it."""
    h = H()
    h.create("a", "A1")
    idem(h, ["i1", "i2"], 0, 0, 0)
    h.op("delete_topic", "ok", {"topic": "a"})
    h.create("a", "A2")
    idem(h, ["n1"], 0, 2, 0)
    idem(h, ["n2"], 0, 3, 1)
    h.final("a", "A2", [(0, "n1"), (1, "n2")])
    assert kinds(h) == set()
    idem(h, ["g1"], 0, 9, 2)
    h.final("a", "A2", [(0, "n1"), (1, "n2"), (2, "g1")])
    assert kinds(h) == {"out_of_sequence_write"}


def test_a_refused_batch_makes_no_sequence_follow() -> None:
    """A batch refused outright stored nothing: the next at its end is out of sequence."""
    h = H()
    h.create("a", "A1")
    idem(h, ["i1"], 0, 0, 0)
    idem(h, ["r1"], 0, 1, 1, outcome="fail")
    idem(h, ["i2"], 0, 2, 1)
    h.final("a", "A1", [(0, "i1"), (1, "i2")])
    assert kinds(h) == {"out_of_sequence_write"}


def test_record_served_under_another_topic_id() -> None:
    """a1 was acked in A1; after delete + recreate it is found in A2."""
    h = valid()
    h.op("delete_topic", "ok", {"topic": "a"})
    h.create("a", "A2")
    h.produce("a", ["b1"], [[0, 0]])
    h.final("a", "A2", [(0, "a1")])
    assert kinds(h) == {"wrong_incarnation", "lost"}


def test_record_served_under_another_topic() -> None:
    h = valid()
    h.create("b", "B1")
    h.final("a", "A1", [(0, "a1"), (1, "a2")])
    h.final("b", "B1", [(0, "a3")])
    assert kinds(h) == {"wrong_topic"}


def test_produce_overlapping_a_delete_is_not_required_but_checked() -> None:
    h = H()
    h.create("a", "A1")
    h.events.append(
        {
            "id": 99,
            "t": 2.5,
            "proc": "p",
            "type": "invoke",
            "op": "produce",
            "topic": "a",
            "mode": "v2",
            "values": ["x"],
        }
    )
    h.op("delete_topic", "ok", {"topic": "a"})
    h.create("a", "A2")
    h.events.append(
        {"id": 99, "t": h.t + 1, "proc": "p", "type": "ok", "op": "produce", "results": [[0, 0]]}
    )
    h.final("a", "A2", [], hw=0)
    assert kinds(h) == set()  # unattributed: may be in the deleted incarnation
    h.events[-1]["records"] = [[3, None, "x"]]
    h.events[-1]["log_start"], h.events[-1]["high_watermark"] = 3, 4
    assert kinds(h) == {"wrong_offset"}


def test_reordering_in_the_final_log_and_in_a_read() -> None:
    h = valid()
    h.final("a", "A1", [(1, "a2"), (0, "a1")])
    assert "offset_order" in kinds(h)
    h = valid()
    h.read("a", 0, [[1, "a2"], [0, "a1"]], hw=2)
    h.final("a", "A1", [(0, "a1"), (1, "a2")])
    assert kinds(h) == {"offset_order"}
    h = valid()  # the values swapped, the offsets in order
    h.read("a", 0, [[0, "a2"], [1, "a1"]], hw=2)
    h.final("a", "A1", [(0, "a1"), (1, "a2")])
    assert kinds(h) == {"wrong_offset", "inconsistent_read"}


def test_read_past_the_high_watermark_and_inconsistent_read() -> None:
    h = valid()
    h.read("a", 0, [[0, "a1"], [1, "a2"]], hw=1)
    h.final("a", "A1", [(0, "a1"), (1, "a2")])
    assert kinds(h) == {"past_hw"}
    h = valid()
    h.produce("a", ["a4"], [[0, 2]])
    h.read("a", 1, [[1, "a2"], [2, "a3"]], hw=3)  # a3 (unknown) read at 2
    h.final("a", "A1", [(0, "a1"), (1, "a2"), (2, "a4")])
    assert kinds(h) == {"inconsistent_read"}


def test_gap_and_phantom() -> None:
    h = valid()
    h.final("a", "A1", [(0, "a1"), (1, "a2"), (3, "zz")], hw=4)
    assert kinds(h) == {"gap", "phantom"}


def test_failed_write_visible() -> None:
    h = valid()
    h.produce("a", ["f1"], [], outcome="fail")
    h.final("a", "A1", [(0, "a1"), (1, "a2"), (2, "f1")])
    assert kinds(h) == {"failed_write_visible"}


def test_compaction_explains_a_missing_ack_only_with_a_later_record_of_its_key() -> None:
    h = H()
    h.create("c", "C1")
    h.produce("c", ["c1", "c2", "c3"], [[0, 0], [0, 1], [0, 2]], keys=["k", "j", "k"])
    h.final("c", "C1", [(1, "c2"), (2, "c3")], hw=3, compacted=True, keys={1: "j", 2: "k"})
    assert kinds(h) == set()
    h = H()
    h.create("c", "C1")
    h.produce("c", ["c1", "c2", "c3"], [[0, 0], [0, 1], [0, 2]], keys=["k", "j", "k"])
    h.final("c", "C1", [(0, "c1"), (2, "c3")], hw=3, compacted=True, keys={0: "k", 2: "k"})
    assert kinds(h) == {"lost"}


def _consumer_history(polls: list[list[list[Any]]], commit: int | None = None) -> H:
    h = H()
    h.create("s", "S1")
    h.produce("s", [f"s{i}" for i in range(5)], [[0, i] for i in range(5)])
    if commit is not None:
        h.op(
            "commit", "ok", {"consumer": "c1", "group": "g", "topic": "s", "offsets": {"0": commit}}
        )
    h.op("assign", "ok", {}, consumer="c2", group="g", topic="s", partitions=[0])
    for records in polls:
        h.op("poll", "ok", {}, consumer="c2", topic="s", records=records)
    h.final("s", "S1", [(i, f"s{i}") for i in range(5)])
    return h


def test_consumer_polls() -> None:
    ok = [[[0, 0, "s0"], [0, 1, "s1"]], [[0, 2, "s2"]]]
    assert kinds(_consumer_history(ok)) == set()
    skip = [[[0, 0, "s0"], [0, 1, "s1"]], [[0, 3, "s3"]]]
    assert kinds(_consumer_history(skip)) == {"poll_skip"}
    again = [[[0, 0, "s0"], [0, 1, "s1"]], [[0, 1, "s1"]]]
    assert kinds(_consumer_history(again)) == {"poll_nonmonotonic"}
    resumed_past_commit = [[[0, 3, "s3"]]]
    assert kinds(_consumer_history(resumed_past_commit, commit=2)) == {"resume_skip"}
    assert kinds(_consumer_history([[[0, 2, "s2"]]], commit=2)) == set()


def test_committed_offsets() -> None:
    h = _consumer_history([], commit=9)
    assert kinds(h) == {"commit_past_hw"}
    h = _consumer_history([], commit=2)
    h.events.append(
        {
            "id": 1000,
            "t": h.t + 1,
            "proc": "final",
            "type": "ok",
            "op": "final_committed",
            "group": "g",
            "topic": "s",
            "topic_id": "S1",
            "offsets": {"0": 4},
        }
    )
    assert kinds(h) == {"committed_unknown"}


@pytest.mark.parametrize("outcome", ["fail", "info"])
def test_history_file_round_trip(tmp_path: Path, outcome: str) -> None:
    path = tmp_path / "h.jsonl"
    hist = History(path)
    op = hist.invoke("w1", "produce", topic="a", mode="v2", values=["v"])
    hist.complete(op, "w1", "produce", outcome)
    hist.info("nemesis", "fault", kind="kill")
    hist.close()
    events = list(read_history(path))
    assert [e["type"] for e in events] == ["invoke", outcome, "info"]
    report = check(events)
    assert report.faults == {"kill": 1}
    assert json.loads(json.dumps(report.summary()))["ops"] == {"produce": {outcome: 1}}


def test_keyed_resend_answered_with_other_offsets() -> None:
    h = valid()
    h.final("a", "A1", [(0, "a1"), (1, "a2")])
    h.events.append(
        {
            "id": 500,
            "t": h.t + 1,
            "proc": "p",
            "type": "info",
            "op": "resend",
            "op_id": 2,
            "status": 200,
            "same": True,
        }
    )
    assert kinds(h) == set()
    h.events[-1]["same"] = False
    assert kinds(h) == {"retry_answer_differs"}


def test_a_read_of_a_new_incarnation_serving_the_old_ones_records() -> None:
    """What the checker found on the commit before the read seams were fixed (issue 22):
    a v3 read just after delete + recreate answered the deleted topic's records."""
    h = valid()
    h.op("delete_topic", "ok", {"topic": "a"})
    h.create("a", "A2")
    h.read("a", None, [[0, "a1"], [1, "a2"]], hw=0, log_start=0)
    h.final("a", "A2", [], hw=0)
    assert kinds(h) == {"wrong_incarnation", "past_hw"}


def _storage(h: H, **snapshot: Any) -> H:
    base: dict[str, Any] = {
        "referenced": [],
        "listed": {},
        "rows": {},
        "now": 1000.0,
        "grace_s": 30.0,
        "slack_s": 20.0,
    }
    h.events.append(
        {"id": 999, "t": h.t + 1, "proc": "final", "type": "info", "op": "storage"}
        | base
        | snapshot
    )
    return h


def test_storage_referenced_objects_exist_and_garbage_is_collected() -> None:
    listed = {"segments/a.seg": 10.0, "tiered/t/b.parquet": 990.0, "segments/new.seg": 995.0}
    ok = _storage(
        valid(),
        referenced=["segments/a.seg"],
        listed=listed,
        # b: unreferenced 10 s ago (within grace); new: written 5 s ago, not committed yet
        rows={"segments/a.seg": None, "tiered/t/b.parquet": 990.0},
    )
    assert kinds(ok) == set()
    assert check(ok.events).records["objects_pending_gc"] == 2

    missing = _storage(valid(), referenced=["segments/gone.seg"], rows={"segments/gone.seg": None})
    assert kinds(missing) == {"missing_object"}

    for rows in ({"segments/old.seg": 900.0}, {}):  # unreferenced long ago / an old orphan
        leak = _storage(valid(), listed={"segments/old.seg": 100.0}, rows=rows)
        assert kinds(leak) == {"leaked_object"}, rows


def test_an_object_due_before_a_finished_gc_pass_began_is_a_leak() -> None:
    """GC passes of 30-40 s: an object due (grace 30 s) after the last finished pass
    began is pending whatever its age within the stall bound; one due before it began
    is leaked however young."""
    listed = {"segments/before.seg": 1.0, "segments/after.seg": 1.0}
    rows = {"segments/before.seg": 955.0, "segments/after.seg": 962.0}
    snapshot = {"listed": listed, "rows": rows, "slack_s": 120.0}
    h = _storage(valid(), **snapshot, gc_pass_started=990.0)
    report = check(h.events)
    assert [a["key"] for a in report.anomalies] == ["segments/before.seg"], report.anomalies
    assert report.anomalies[0]["due_before_gc_pass"] is True
    assert report.records["objects_pending_gc"] == 1
    # No pass finished: both wait, up to the stall bound (and past it, leaked).
    assert check(_storage(valid(), **snapshot).events).anomalies == []
    late = _storage(valid(), listed=listed, rows=rows, slack_s=5.0)
    assert kinds(late) == {"leaked_object"}


def test_an_upload_a_write_lease_held_through_the_gc_pass_is_no_leak() -> None:
    """A Spark job whose abort could not reach a coordinator (killed) leaves its uploads
    pending under its write lease until the lease lapses (invariant 9; the PostgreSQL
    run of seed 43 met it). Held through the last finished GC pass: not a leak. Lapsed
    before that pass began: the pass should have deleted it, a leak."""
    listed = {"segments/held.seg": 1.0, "segments/lapsed.seg": 1.0}
    h = _storage(
        valid(),
        listed=listed,
        rows={},
        gc_pass_started=990.0,
        pending={"segments/held.seg": 1500.0, "segments/lapsed.seg": 600.0},
    )
    report = check(h.events)
    assert [a["key"] for a in report.anomalies] == ["segments/lapsed.seg"], report.anomalies
    assert report.records["objects_held_by_write_leases"] == 1


#: Each deliberately broken build: (LAKELOG_CHAOS_BREAK name, module, flag).
BREAKS = [
    ("dedupe", "service.produce.request_keys", "_BROKEN_DEDUPE"),
    ("stale_cache", "service.read_cache", "_BROKEN_STALE_CACHE"),
    ("no_fencing", "coordinator.log.producers", "_BROKEN_FENCING"),
]


@pytest.mark.parametrize("setting", [None, "other", "dedupe", "x,stale_cache", "no_fencing"])
def test_broken_builds_are_off_by_default_and_read_from_the_environment(
    setting: str | None,
) -> None:
    """Each deliberately broken build (``python -m tests.chaos --break NAME``) is one
    module flag, read once from LAKELOG_CHAOS_BREAK: on only when named there."""
    code = "; ".join(f"import {m}; print({m}.{flag})" for _, m, flag in BREAKS)
    env = {k: v for k, v in os.environ.items() if k != "LAKELOG_CHAOS_BREAK"}
    if setting is not None:
        env["LAKELOG_CHAOS_BREAK"] = setting
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    named = (setting or "").split(",")
    assert out.stdout.split() == [str(name in named) for name, _, _ in BREAKS], out.stderr


def test_an_anomaly_comes_with_the_part_of_the_history_that_shows_it() -> None:
    """``excerpt``: the named read, the produce that sent its value, the operations of
    the same topic and partition next to them and the faults meanwhile; nothing of
    another topic."""
    h = H()
    h.create("a", "A1")
    h.create("b", "B1")
    h.produce("b", ["b1"], [[0, 0]])
    h.produce("a", ["a1"], [[0, 0]])
    h.events.append({"id": 50, "t": h.t + 0.5, "proc": "nemesis", "type": "info", "op": "fault"})
    read = h.read("a", 0, [[0, "a1"]], hw=0, log_start=0)
    (a,) = [x for x in check(h.events).anomalies if x["kind"] == "past_hw"]
    shown = excerpt(h.events, a)
    ids = {e["id"] for e in shown}
    assert read in ids and 50 in ids
    assert any(e.get("values") == ["a1"] for e in shown)
    assert not any(e.get("topic") == "b" or e.get("values") == ["b1"] for e in shown), shown


def _stream_history(
    connections: list[tuple[dict[str, int] | None, list[list[Any]]]],
    offsets: list[tuple[int, dict[str, int]]] | None = None,
) -> H:
    """``s`` holds s0..s9 on partition 0; each connection of group ``g-s`` (opened with
    a cursor or none) delivers its records; ``offsets``: (after which connection, the
    group's committed offsets read)."""
    h = H()
    h.create("s", "S1")
    h.produce("s", [f"s{i}" for i in range(10)], [[0, i] for i in range(10)])
    for n, (cursor, records) in enumerate(connections):
        conn = f"c{n}"
        h.op(
            "stream_open", "ok", {"consumer": conn, "group": "g-s", "topic": "s", "cursor": cursor}
        )
        h.op("stream_poll", "ok", {"consumer": conn}, consumer=conn, topic="s", records=records)
        for after, offs in offsets or []:
            if after == n:
                h.op("group_offsets", "ok", {"group": "g-s", "topic": "s"}, offsets=offs)
    h.final("s", "S1", [(i, f"s{i}") for i in range(10)])
    return h


def test_group_stream_resumed_with_a_cursor_delivers_from_it_exactly() -> None:
    first = (None, [[0, 0, "s0"], [0, 1, "s1"], [0, 2, "s2"]])
    assert kinds(_stream_history([first, ({"0": 3}, [[0, 3, "s3"], [0, 4, "s4"]])])) == set()
    skipped = ({"0": 3}, [[0, 5, "s5"]])
    assert kinds(_stream_history([first, skipped])) == {"stream_skip"}
    again = ({"0": 3}, [[0, 2, "s2"], [0, 3, "s3"]])
    assert kinds(_stream_history([first, again])) == {"stream_duplicate"}
    # Within a connection the poll checks apply (a stream is a consumer).
    gap = (None, [[0, 0, "s0"], [0, 2, "s2"]])
    assert kinds(_stream_history([gap])) == {"poll_skip"}
    phantom = (None, [[0, 0, "nobody-sent-it"]])
    assert "phantom" in kinds(_stream_history([phantom]))


def test_group_stream_committed_offsets_never_go_back_but_by_a_cursor() -> None:
    first = (None, [[0, 0, "s0"], [0, 1, "s1"], [0, 2, "s2"]])
    # Committed 3 after the first; the next connection without a cursor starts there.
    ok = _stream_history([first, (None, [[0, 3, "s3"]])], offsets=[(0, {"0": 3})])
    assert kinds(ok) == set()
    # It started at 1: the committed offset went back from 3.
    back = _stream_history([first, (None, [[0, 1, "s1"]])], offsets=[(0, {"0": 3})])
    assert kinds(back) == {"commit_backward"}
    # A cursor at 1 takes it back (the stream commits what it delivers from there).
    by_cursor = _stream_history(
        [first, ({"0": 1}, [[0, 1, "s1"]]), (None, [[0, 2, "s2"]])],
        offsets=[(0, {"0": 3}), (1, {"0": 2})],
    )
    assert kinds(by_cursor) == set()
    # Read committed offsets alone: 3, then 2.
    read_back = _stream_history([first], offsets=[(0, {"0": 3}), (0, {"0": 2})])
    assert kinds(read_back) == {"commit_backward"}


def _spark_history(final: list[tuple[int, str]], log_start: int = 0) -> H:
    """A Spark write acknowledged (rows w0 to partition 0, w1 to partition 1: offsets
    not told), then the final logs of both partitions (``final`` is partition 0's)."""
    h = H()
    h.op("create_topic", "ok", {"topic": "s", "partitions": 2}, topic_id="S1")
    h.op(
        "produce",
        "ok",
        {"topic": "s", "mode": "spark", "values": ["w0", "w1"], "partitions": [0, 1]},
        results=None,
        placed=True,
    )
    h.final("s", "S1", final, log_start=log_start, hw=log_start + len(final))
    h.final("s", "S1", [(0, "w1")], p=1)
    return h


def test_a_spark_write_is_found_in_its_partitions() -> None:
    ok = _spark_history([(0, "w0")])
    assert kinds(ok) == set()
    assert check(ok.events).records["acked_found"] == 2
    assert kinds(_spark_history([])) == {"lost"}
    # Below a log start that moved: it may have been removed.
    assert kinds(_spark_history([], log_start=3)) == set()
    h = _spark_history([])
    h.events[-1]["records"].append([1, None, "w0"])  # stored in partition 1
    h.events[-1]["high_watermark"] = 2
    assert kinds(h) == {"lost", "wrong_offset"}


# -- the transactional workload ----------------------------------------------------------


class TxnH(H):
    """A history of the transactional workload on topic ``txn`` (partitions 0 and 1): each
    transaction's records take the next offsets of their partitions, and one marker per
    partition follows once it is decided (markers take offsets no record holds)."""

    def __init__(self) -> None:
        super().__init__()
        self.create("txn", "T1")
        self.next_offset = {0: 0, 1: 0}
        self.log: dict[int, list[tuple[int, str]]] = {0: [], 1: []}

    def event(self, **e: Any) -> int:
        self.t += 1
        if "id" not in e:
            e["id"] = self.next_id
            self.next_id += 1
        self.events.append({"t": self.t, "proc": "p", **e})
        return int(e["id"])

    def txn(
        self,
        n: int,
        parts: list[int],
        intent: str = "commit",
        outcome: str | None = "ok",
        asked: bool = True,
        tid: str = "chaos-txn-1",
        offsets: dict[str, int] | None = None,
        zombie: bool = False,
        **done: Any,
    ) -> tuple[int, list[str]]:
        """A transaction writing a record to each of ``parts`` (stored, acknowledged),
        then ``intent`` asked (``asked``: a ``txn_end``), completed ``outcome``."""
        values = [f"txn|{tid}|{n}|{i}" for i in range(len(parts))]
        op = self.event(
            type="invoke",
            op="txn",
            topic="txn",
            transactional_id=tid,
            n=n,
            values=values,
            partitions=parts,
            intent=intent,
            group="g-txn" if offsets else None,
            offsets=offsets,
            zombie=zombie,
        )
        results = []
        for p, v in zip(parts, values, strict=True):
            results.append([p, self.next_offset[p]])
            self.log[p].append((self.next_offset[p], v))
            self.next_offset[p] += 1
        if asked:
            self.event(type="info", op="txn_end", op_id=op, action=intent)
        for p in set(parts):  # its marker
            self.next_offset[p] += 1
        if outcome is not None:
            self.event(id=op, type=outcome, op="txn", results=results, **done)
        return op, values

    def poll(self, isolation: str, records: list[list[Any]], consumer: str = "r") -> int:
        op = self.event(type="invoke", op="txn_poll", consumer=consumer)
        self.event(
            id=op,
            type="ok",
            op="txn_poll",
            consumer=consumer,
            topic="txn",
            isolation=isolation,
            records=records,
        )
        return op

    def finish(self, committed: list[str], offsets: dict[str, int] | None = None) -> None:
        """The final reads: the log as stored (read_uncommitted, markers' offsets empty),
        ``committed`` read_committed, and the group's committed ``offsets``."""
        for p in (0, 1):
            self.final("txn", "T1", self.log[p], p=p, hw=self.next_offset[p], markers=True)
            recs = [[o, v] for o, v in self.log[p] if v in committed]
            self.event(type="ok", op="final_txn_read", topic="txn", partition=p, records=recs)
        if offsets is not None:
            self.event(
                type="ok", op="final_txn_offsets", group="g-txn", topic="stable", offsets=offsets
            )


def _txn_history(
    committed: list[str] | None = None,
    offsets: dict[str, int] | None = None,
    polls: list[tuple[str, list[list[Any]]]] = (),  # type: ignore[assignment]
) -> tuple[TxnH, dict[str, list[str]]]:
    """A valid history: ``c1`` committed (offset 5 of the group), ``a2`` aborted (offset 7
    sent), ``u3`` a commit of unknown outcome that the final read shows committed
    (offset 9), ``u4`` one that it shows aborted, ``f5`` a commit that failed into an
    abort; then ``polls`` and the final reads (``committed`` overrides what the
    read_committed one holds, ``offsets`` the group's)."""
    h = TxnH()
    v: dict[str, list[str]] = {}
    _, v["c1"] = h.txn(1, [0, 1], offsets={"0": 5})
    _, v["a2"] = h.txn(2, [0], intent="abort", offsets={"0": 7})
    _, v["u3"] = h.txn(3, [0, 1], outcome="info", offsets={"0": 9})
    _, v["u4"] = h.txn(4, [1], outcome="info")
    _, v["f5"] = h.txn(5, [0, 1], outcome="fail")
    for isolation, records in polls:
        h.poll(isolation, records, consumer=isolation)
    committed = v["c1"] + v["u3"] if committed is None else committed
    h.finish(committed, {"0": 9} if offsets is None else offsets)
    return h, v


def test_a_valid_transactional_history_has_no_anomaly() -> None:
    c1, a2 = "txn|chaos-txn-1|1|", "txn|chaos-txn-1|2|"
    h, _ = _txn_history(
        polls=[
            ("read_committed", [[0, 0, c1 + "0"]]),
            ("read_committed", [[1, 0, c1 + "1"]]),
            ("read_uncommitted", [[0, 0, c1 + "0"], [0, 2, a2 + "0"]]),
        ]
    )
    report = check(h.events)
    assert report.anomalies == []
    r = report.records
    assert (r["txn_committed"], r["txn_aborted"], r["txn_unknown_committed"]) == (2, 3, 1)
    assert r["txn_unknown_aborted"] == 1 and r["txn_offsets_checked"] == 1
    assert r["acked_found"] == 2  # c1's records in the log as stored; no gap for markers


def test_a_record_of_an_aborted_transaction_read_committed() -> None:
    """G1a: the client saw the abort (a2), or the commit fail into an abort (f5), or the
    outcome was unknown and the final read holds none of it (u4): no read_committed
    reader may ever get its records, during the run or at the end."""
    _, v = _txn_history()
    a2, u4, f5 = v["a2"][0], v["u4"][0], v["f5"][0]
    for value, p, o in ((a2, 0, 2), (u4, 1, 4), (f5, 0, 6)):
        h, _ = _txn_history(polls=[("read_committed", [[p, o, value]])])
        assert kinds(h) == {"aborted_read"}, value
        h, _ = _txn_history(polls=[("read_uncommitted", [[p, o, value]])])
        assert kinds(h) == set(), value
    h, _ = _txn_history(committed=[*v["c1"], *v["u3"], a2])
    assert kinds(h) == {"aborted_read"}


def test_a_transaction_never_asked_to_commit_is_aborted() -> None:
    """A client that gave up before asking for the commit (a fatal error mid-produce)
    left a transaction nothing can commit: its records read_committed are G1a."""
    h = TxnH()
    _, v = h.txn(1, [0], outcome="info", asked=False)
    h.poll("read_committed", [[0, 0, v[0]]])
    h.finish([])
    assert kinds(h) == {"aborted_read"}


def test_a_record_read_committed_before_its_commit_was_asked() -> None:
    """G1b: a read_committed reader got a record of a transaction still open (its
    ``txn_end`` after the poll): the last stable offset did not hold it back."""
    h = TxnH()
    values = ["txn|chaos-txn-1|1|0"]
    op = h.event(
        type="invoke",
        op="txn",
        topic="txn",
        transactional_id="chaos-txn-1",
        n=1,
        values=values,
        partitions=[0],
        intent="commit",
        group=None,
        offsets=None,
        zombie=False,
    )
    h.log[0].append((0, values[0]))
    h.next_offset[0] = 2
    h.poll("read_committed", [[0, 0, values[0]]])
    h.event(type="info", op="txn_end", op_id=op, action="commit")
    h.event(id=op, type="ok", op="txn", results=[[0, 0]])
    h.finish(values)
    assert kinds(h) == {"intermediate_read"}


def test_a_committed_transactions_records_all_visible_at_the_end() -> None:
    """A commit the client saw succeed: every record of it read_committed at the end
    (``txn_lost``); any transaction: all its records or none (``txn_partial``)."""
    _, v = _txn_history()
    h, _ = _txn_history(committed=[v["c1"][0], *v["u3"]])
    assert kinds(h) == {"txn_lost"}
    h, _ = _txn_history(committed=[*v["c1"], v["u3"][1]])
    assert kinds(h) == {"txn_partial"}


def test_one_transactional_ids_transactions_in_order_in_every_partition() -> None:
    """G0 within one transactional id: its transactions are sequential, so transaction 2
    stored before transaction 1 in a partition is a write out of order; two ids'
    transactions may interleave."""
    h = TxnH()
    _, v2 = h.txn(2, [0, 0])
    _, v1 = h.txn(1, [0, 1])
    h.finish(v2 + v1)
    assert kinds(h) == {"txn_write_order"}
    h = TxnH()
    _, v2 = h.txn(2, [0, 0], tid="chaos-txn-2")
    _, v1 = h.txn(1, [0, 1])
    h.finish(v2 + v1)
    assert kinds(h) == set()


def test_a_zombie_that_commits_after_its_fencing_instance_began() -> None:
    h = TxnH()
    fence = h.event(type="invoke", op="txn_init", transactional_id="chaos-txn-1", fences=1)
    h.event(id=fence, type="ok", op="txn_init")
    _, v = h.txn(1, [0], zombie=True, fenced_by=fence)
    h.finish(v)
    assert kinds(h) == {"zombie_commit"}
    h = TxnH()
    _, v = h.txn(1, [0], zombie=True, outcome="fail", fenced_by=fence)
    h.finish([])
    assert kinds(h) == set()


def test_offsets_sent_to_a_transaction_are_committed_with_it() -> None:
    """The group's final committed offset: the last transaction committed ok that sent
    one (c1: 5) or a later one that may have committed (u3: 9); never only an aborted
    one's (a2: 7), nor an older or missing one."""
    h, _ = _txn_history(offsets={"0": 7})
    assert kinds(h) == {"txn_offsets_aborted"}
    h, _ = _txn_history(offsets={"0": 3})
    assert kinds(h) == {"txn_offsets_wrong"}
    h, _ = _txn_history(offsets={})
    assert kinds(h) == {"txn_offsets_wrong"}
    _, v = _txn_history()
    h, _ = _txn_history(committed=v["c1"], offsets={"0": 9})  # u3 decided aborted
    assert kinds(h) == {"txn_offsets_aborted"}
    h, _ = _txn_history(committed=v["c1"], offsets={"0": 5})
    assert kinds(h) == set()


def test_a_read_committed_reader_skips_no_committed_record() -> None:
    """A read_committed reader of a partition gets every committed record between two
    it got (a transaction's records in a partition are seen together), offsets rising;
    aborted records and markers between are no skip."""
    h = TxnH()
    _, v1 = h.txn(1, [0])
    h.txn(2, [0], intent="abort")
    _, v3 = h.txn(3, [0])
    _, v4 = h.txn(4, [0])
    h.poll("read_committed", [[0, 0, v1[0]]])
    h.poll("read_committed", [[0, 4, v3[0]]])
    h.poll("read_committed", [[0, 6, v4[0]]])
    h.finish(v1 + v3 + v4)
    assert kinds(h) == set()
    skipped = [e for e in h.events if e["op"] == "txn_poll" and e["type"] == "ok"][1]
    skipped["records"] = []
    assert kinds(h) == {"poll_skip"}
    skipped["records"] = [[0, 6, v4[0]]]
    assert kinds(h) == {"poll_nonmonotonic", "poll_skip"}


def test_the_log_as_stored_holds_markers_and_may_lose_aborted_records() -> None:
    """In the read_uncommitted final log of a transactional topic, markers' offsets hold
    no record (no ``gap``) and an aborted transaction's records may be gone (tiering
    leaves them out); a committed one's may not (``lost``)."""
    h, v = _txn_history()
    for e in h.events:
        if e["op"] == "final_read" and e["partition"] == 0:
            e["records"] = [r for r in e["records"] if r[2] != v["a2"][0]]
    assert kinds(h) == set()
    for e in h.events:
        if e["op"] == "final_read" and e["partition"] == 0:
            e["records"] = [r for r in e["records"] if r[2] != v["c1"][0]]
    assert kinds(h) == {"lost"}
    h, _ = _txn_history()
    for e in h.events:
        if e["op"] == "final_read":
            e["markers"] = False
    assert kinds(h) == {"gap"}
