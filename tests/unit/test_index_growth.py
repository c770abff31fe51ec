"""Index growth stays bounded under steady load, and lookups use the index (O(log n)).

A flush writes one index row per partition it touches, so a busy partition gains
rows at the flush rate. Tiering collapses a run of them into one row, retention drops
expired rows, compaction rewrites runs of tiered rows: under steady load a
partition's row count levels off instead of growing with time.
"""

from __future__ import annotations

import pytest

from coordinator.janitors.retention import run_retention
from coordinator.janitors.tiering import run_compaction, run_tiering
from coordinator.local import LocalCoordinator
from coordinator.log.store import _LOOKUP
from segments.types import Record
from tests.conftest import backend_of
from tests.unit.janitor_helpers import Harness

ROUNDS = 30
FLUSHES_PER_ROUND = 20
ROUND_S = 10.0


@pytest.mark.parametrize("policy", ["delete", "compact"])
def test_a_partitions_row_count_levels_off_under_steady_load(h: Harness, policy: str) -> None:
    """30 rounds of 10 (fake) seconds, each 20 flushes of 10 keyed records per partition
    and then the janitors' passes (tiering; retention of 2 minutes for ``delete``,
    compaction over 50 keys for ``compact``). Expected: 600 flushes per partition leave
    at most a dozen-odd rows; the count in the last 10 rounds is no higher than in the
    10 before them (it stopped growing); every record still reads back."""
    configs = (
        {"cleanup.policy": "delete", "retention.ms": "120000"}
        if policy == "delete"
        else {"cleanup.policy": "compact", "delete.retention.ms": "0"}
    )
    topic = h.coordinator.create_topic("steady", 2, configs)
    counts: list[int] = []
    seq = 0
    for _ in range(ROUNDS):
        h.clock.advance(ROUND_S)
        now_ms = int(h.clock() * 1000)
        for _ in range(FLUSHES_PER_ROUND):
            for p in (0, 1):
                batch = [
                    Record(f"k{(seq + i) % 50}".encode(), f"v{seq + i}".encode(), now_ms)
                    for i in range(10)
                ]
                h.produce("steady", p, batch)
            seq += 10
        run_tiering(h.ctx(), h.config(tier_age_s=0.0))
        if policy == "delete":
            run_retention(h.ctx())
        else:
            run_compaction(h.ctx(), h.config())
        counts.append(len(h.catalog.rows(topic.topic_id, 0)))
    flushes = ROUNDS * FLUSHES_PER_ROUND
    assert max(counts) <= 16, counts  # against 600 rows without the janitors
    assert max(counts[-10:]) <= max(counts[-20:-10]), counts
    whole = h.walk("steady", 0)
    offsets = h.coordinator.offsets("steady", 0)
    assert offsets.high_watermark == flushes * 10
    if policy == "delete":
        assert whole and whole[-1].offset == offsets.high_watermark - 1
    else:  # one latest record per key (50 keys)
        assert len({r.key for r in whole}) == 50 and len(whole) == 50


def test_lookups_search_the_primary_key(db_url: str) -> None:
    """The offset lookup is a B-tree search on (topic_id, partition, base_offset) on both
    backends, never a scan of the partition's rows: O(log n) however many rows."""
    with LocalCoordinator(db_url) as c:
        topic = c.create_topic("plan", 1)
        params = (topic.topic_id, 0, topic.topic_id, 0, 5, 5, 16)
        with c.db.read() as conn:
            if backend_of(db_url) == "sqlite":
                plan = conn.execute("EXPLAIN QUERY PLAN " + _LOOKUP, params).fetchall()
                details = " | ".join(str(row[-1]) for row in plan)
                search = "SEARCH e USING PRIMARY KEY (topic_id=? AND partition=? AND base_offset>?)"
                assert search in details, details
                assert "SCAN e" not in details, details
            else:
                conn.execute("SET LOCAL enable_seqscan = off")  # as with many rows
                sql = c.db.dialect.sql(_LOOKUP)
                plan = conn.execute("EXPLAIN " + sql, params).fetchall()
                details = " | ".join(row[0] for row in plan)
                assert "index_entries_pkey" in details, details
                assert "Seq Scan on index_entries" not in details, details
