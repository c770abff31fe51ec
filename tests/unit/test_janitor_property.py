"""Property test: random interleavings of produce, tier, compact, retention, gc, reads and time.

In process: a SQLite file coordinator, a memory store with a fake clock. After every
step the test checks, from its own bookkeeping rather than the janitors':

- no object an index entry references has ever been deleted;
- a read that looked its entries up less than the grace period ago can fetch them all;
- every record any reader returns is the one produced at that offset, at or above
  log-start and below the high watermark;
- after a GC run at time T, every object in the store that no index entry references
  (nor the topic's table holds for a retained snapshot) became unreferenced (or was
  written) after T - grace: no garbage survives past grace + one GC run.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from coordinator.client import ChunkRef
from coordinator.janitors.catalog import Catalog
from coordinator.janitors.context import JanitorContext
from coordinator.janitors.gc import run_gc
from coordinator.janitors.retention import run_retention
from coordinator.janitors.tables import run_tables
from coordinator.janitors.tiering import run_compaction, run_tiering
from segments.errors import ObjectNotFoundError
from segments.types import Record
from tests.unit.janitor_helpers import Harness

GRACE_S = 30.0
TOPIC = "p"


class _CrashingCatalog(Catalog):
    def swap(self, *args: object, **kwargs: object) -> bool:
        raise RuntimeError("crashed between PUT and swap")


class JanitorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="janitor-prop-"))
        self.h = Harness(self.tmp)
        self.h.coordinator.create_topic(
            TOPIC,
            1,
            {
                "cleanup.policy": "compact,delete",
                "delete.retention.ms": "20000",
                "table.snapshot.retention.ms": "20000",
            },
        )
        self.sent: dict[int, Record] = {}
        self.unreferenced_since: dict[str, float] = {}
        self.pending: list[tuple[float, list[ChunkRef]]] = []
        self.ts = int(self.h.clock() * 1000) - 100_000

    def teardown(self) -> None:
        self.h.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers ----------------------------------------------------------------------
    def referenced(self) -> set[str]:
        """Objects an index entry names, tier objects the topic's table still holds (a
        retained snapshot may name them until expiry releases them), and the table's own
        metadata and manifests (the table janitor's, not GC's)."""
        topic_id = self.h.coordinator.get_topic(TOPIC).topic_id
        with self.h.coordinator.db.read() as conn:
            held = conn.execute(
                "SELECT o.object_key FROM table_files f JOIN objects o USING (object_id)"
            ).fetchall()
        tables = {k for k in self.h.store.key_set() if k.startswith("iceberg/")}
        return (
            {r.object_key for r in self.h.catalog.rows(topic_id, 0)} | {k for (k,) in held} | tables
        )

    def ctx(self) -> JanitorContext:
        """A janitor context; first a reader looks the partition up (a read in flight)."""
        refs = self.h.coordinator.lookup(TOPIC, 0, 0)
        if refs:
            self.pending.append((self.h.clock(), refs))
        return self.h.ctx()

    # -- rules ------------------------------------------------------------------------
    @rule(n=st.integers(1, 12), keys=st.integers(1, 5), tombstone=st.booleans())
    def produce(self, n: int, keys: int, tombstone: bool) -> None:
        recs = []
        for i in range(n):
            self.ts += 1000
            value = None if tombstone and i == n - 1 else f"v{self.ts}".encode()
            recs.append(Record(f"k{i % keys}".encode(), value, self.ts, (("i", b"1"),)))
        base = self.h.produce(TOPIC, 0, recs)
        for i, r in enumerate(recs):
            self.sent[base + i] = r

    @rule()
    def tier(self) -> None:
        run_tiering(self.ctx(), self.h.config())

    @rule()
    def crash_tier(self) -> None:
        ctx = self.ctx()
        ctx.catalog = _CrashingCatalog(self.h.coordinator.db)
        with contextlib.suppress(RuntimeError):
            run_tiering(ctx, self.h.config())

    @rule()
    def tables(self) -> None:
        """Publish the topic's table and expire its snapshots (releasing tier objects)."""
        run_tables(self.ctx(), self.h.config(gc_grace_s=GRACE_S))

    @rule()
    def compact(self) -> None:
        run_compaction(self.ctx(), self.h.config())

    @rule(limit=st.integers(0, 4000))
    def retention(self, limit: int) -> None:
        self.h.coordinator.alter_configs(TOPIC, {"retention.bytes": str(limit)})
        run_retention(self.ctx())

    @rule()
    def gc(self) -> None:
        now = self.h.clock()
        run_gc(self.ctx(), GRACE_S)
        self.track()
        referenced = self.referenced()
        for key in self.h.store.key_set() - referenced:
            since = self.unreferenced_since[key]
            assert since > now - GRACE_S, f"{key} unreferenced since {now - since:.0f}s survived GC"

    @rule(seconds=st.floats(0, 2 * GRACE_S))
    def advance(self, seconds: float) -> None:
        self.h.clock.advance(seconds)

    @rule(offset=st.integers(0, 80))
    def start_read(self, offset: int) -> None:
        high_watermark = self.h.coordinator.offsets(TOPIC, 0).high_watermark
        refs = self.h.coordinator.lookup(TOPIC, 0, offset % max(high_watermark, 1))
        if refs:
            self.pending.append((self.h.clock(), refs))

    @rule()
    def forget_reads(self) -> None:
        self.pending.clear()

    @rule(offset=st.integers(0, 80))
    def read(self, offset: int) -> None:
        o = self.h.coordinator.offsets(TOPIC, 0)
        got = self.h.reader.read(TOPIC, 0, offset, max_bytes=1 << 30)
        offsets = [r.offset for r in got]
        assert offsets == sorted(set(offsets))
        for r in got:
            assert max(offset, o.log_start) <= r.offset < o.high_watermark
            sent = self.sent[r.offset]
            assert (r.key, r.value, r.timestamp_ms, r.headers) == (
                sent.key,
                sent.value,
                sent.timestamp_ms,
                sent.headers,
            )

    # -- invariants -------------------------------------------------------------------
    def track(self) -> None:
        now = self.h.clock()
        referenced = self.referenced()
        for key in self.h.store.key_set():
            if key in referenced:
                self.unreferenced_since.pop(key, None)
            else:
                self.unreferenced_since.setdefault(key, now)

    @invariant()
    def reads_in_flight_can_fetch(self) -> None:
        """Reads looked up less than the grace period ago can still fetch every entry."""
        now = self.h.clock()
        self.pending = [(t, refs) for t, refs in self.pending if now - t < GRACE_S]
        for started, refs in self.pending:
            for ref in refs:
                try:
                    self.h.reader.fetch_chunk(ref)
                except ObjectNotFoundError as e:
                    raise AssertionError(f"read in flight for {now - started}s lost {ref}") from e

    @invariant()
    def referenced_objects_exist(self) -> None:
        referenced = self.referenced()
        assert not referenced & set(self.h.store.deleted)
        assert referenced <= self.h.store.key_set()
        self.track()


TestJanitorInterleavings = JanitorMachine.TestCase
TestJanitorInterleavings.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
