"""Index rows of a partition under steady load, with and without the janitors.

A flush writes one index row per partition it touches; tiering collapses runs of
them into one row, retention drops expired rows, compaction rewrites runs of tiered
rows. Simulates ``--rounds`` rounds of ``--round-s`` (fake) seconds on a SQLite
coordinator and a memory store: each round ``--flushes`` flushes, each touching
every one of ``--partitions`` partitions with 10 keyed records, then (unless
``--no-janitors``) tiering and retention (``--retention-s``) or compaction
(``--policy compact``, 100 keys). Every ``--every`` rounds one JSON line:

    {"bench": "index_growth", "round": ..., "policy": ..., "janitors": true,
     "flushes": ..., "rows": ..., "rows_per_partition_max": ...,
     "lookup_us_p50": ..., "lookup_us_p99": ..., "loadavg_1m": ...}

``lookup_us_*``: ``LocalCoordinator.lookup`` at random offsets of partition 0 (a
primary-key search, so it stays flat as rows grow, janitors or not).

Run: ``.venv/bin/python bench/index_growth.py [--no-janitors]`` (under a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coordinator.janitors.catalog import Catalog  # noqa: E402
from coordinator.janitors.context import JanitorConfig, JanitorContext  # noqa: E402
from coordinator.janitors.retention import run_retention  # noqa: E402
from coordinator.janitors.tiering import run_compaction, run_tiering  # noqa: E402
from coordinator.local import LocalCoordinator  # noqa: E402
from index.log import LogWriter  # noqa: E402
from segments.memory import MemoryStore  # noqa: E402
from segments.segment import SegmentBuilder  # noqa: E402
from segments.types import Record  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--round-s", type=float, default=10.0)
    parser.add_argument("--flushes", type=int, default=40)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--retention-s", type=float, default=120.0)
    parser.add_argument("--policy", choices=("delete", "compact"), default="delete")
    parser.add_argument("--no-janitors", action="store_true")
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args(argv)
    clock = [time.time() + 60]
    with tempfile.TemporaryDirectory(prefix="lakelog-index-growth-") as d:
        coordinator = LocalCoordinator(f"sqlite:///{d}/meta.db")
        store = MemoryStore("growth")
        writer = LogWriter(store, coordinator)
        catalog = Catalog(coordinator.db)
        ctx = JanitorContext(catalog, coordinator.store, store, lambda: clock[0])
        config = JanitorConfig(tier_age_s=0.0, gc_grace_s=60.0)
        configs = (
            {"cleanup.policy": "delete", "retention.ms": str(int(args.retention_s * 1000))}
            if args.policy == "delete"
            else {"cleanup.policy": "compact", "delete.retention.ms": "0"}
        )
        topic = coordinator.create_topic("growth", args.partitions, configs)
        rng = random.Random(7)
        seq = 0
        for n in range(1, args.rounds + 1):
            clock[0] += args.round_s
            now_ms = int(clock[0] * 1000)
            for _ in range(args.flushes):
                b = SegmentBuilder()
                for p in range(args.partitions):
                    b.append(
                        topic.topic_id,
                        p,
                        [
                            Record(f"k{(seq + i) % 100}".encode(), b"v" * 100, now_ms)
                            for i in range(10)
                        ],
                    )
                seq += 10
                writer.write(b)
            if not args.no_janitors:
                run_tiering(ctx, config)
                if args.policy == "delete":
                    run_retention(ctx)
                else:
                    run_compaction(ctx, config)
            if n % args.every and n != args.rounds:
                continue
            per_partition = [len(catalog.rows(topic.topic_id, p)) for p in range(args.partitions)]
            offsets = coordinator.offsets("growth", 0)
            lat = []
            for _ in range(200):
                at = rng.randrange(offsets.log_start, offsets.high_watermark)
                t0 = time.perf_counter()
                coordinator.lookup("growth", 0, at, 4)
                lat.append(time.perf_counter() - t0)
            lat.sort()
            line = {
                "bench": "index_growth",
                "round": n,
                "policy": args.policy,
                "janitors": not args.no_janitors,
                "flushes": n * args.flushes,
                "partitions": args.partitions,
                "rows": catalog.index_row_count(),
                "rows_per_partition_max": max(per_partition),
                "lookup_us_p50": round(statistics.median(lat) * 1e6, 1),
                "lookup_us_p99": round(lat[int(len(lat) * 0.99)] * 1e6, 1),
                "loadavg_1m": round(os.getloadavg()[0], 2),
            }
            print(json.dumps(line), flush=True)
        coordinator.close()


if __name__ == "__main__":
    main()
