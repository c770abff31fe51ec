"""Topic tables (coordinator.iceberg) at realistic size: what the table costs, what it gives.

Writes ``--records`` records (200 random bytes each, 4 partitions; ``spark_scan.py``'s
data), then prints one JSON line per figure (progress on stderr):

- ``tier_without_table``: the tiering janitor's own work (fetch, encode, PUT, swap),
  without publishing the table; ``table_publish``: publishing the same run's tier objects
  as one snapshot (footers read, manifests and metadata written, pointer swapped);
  ``tier_with_table``: both, as ``lakelog janitor tier`` runs them, and the ratio.
- ``pyarrow_table_files``: pyarrow reading the snapshot's data files (the floor);
  ``pyiceberg_scan``: pyiceberg's own scan to Arrow (up to 5M records: it holds it all);
- ``spark_native_table_files``: Spark's Parquet reader over the snapshot's data files (what
  Spark's Iceberg runtime reads), the aggregate of ``spark_scan.py``;
  ``spark_lakelog``: ``format("lakelog")`` over the same topic; ``native_vs_lakelog``;
- ``catalog_load_table``: pyiceberg's ``RestCatalog.load_table`` against the catalog served
  by uvicorn on loopback: p50/p99 over ``--loads`` calls (and the raw GET's).

Usage: ``python bench/iceberg.py [--records N] [--repeat R] [--no-spark]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import spark_scan  # noqa: E402
from spark_scan import best_of, embedded, produce, progress, spark_agg  # noqa: E402

from coordinator.iceberg.rest import CatalogService, create_catalog_app  # noqa: E402
from coordinator.iceberg.tables import TopicTables  # noqa: E402
from coordinator.janitors.catalog import Catalog  # noqa: E402
from coordinator.janitors.context import JanitorConfig, JanitorContext  # noqa: E402
from coordinator.janitors.tiering import run_tiering  # noqa: E402
from tests.procs import free_port  # noqa: E402


def emit(case: str, rows: int, payload: int, seconds: float, **extra: Any) -> None:
    """``spark_scan.py``'s figure line, as this bench's."""
    spark_scan.emit(case, rows, payload, seconds, bench="iceberg", **extra)


def line(**fields: Any) -> None:
    print(orjson.dumps({"bench": "iceberg", **fields}).decode(), flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def serve(tables: TopicTables) -> tuple[str, Any]:
    import uvicorn

    port = free_port()
    app = create_catalog_app(lambda: CatalogService(tables))
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--loads", type=int, default=200)
    ap.add_argument("--no-spark", action="store_true")
    args = ap.parse_args()
    tmp, db, coord, store = embedded("lakelog-iceberg-bench-")
    progress(f"writing {args.records:,} records under {tmp}")
    payload = produce(store, coord, "t", args.records)
    total = args.records // 4 * 4
    catalog = Catalog(coord.db)
    ctx = JanitorContext(catalog, coord.store, store)
    started = time.perf_counter()
    report = run_tiering(ctx, JanitorConfig(tier_age_s=0), "t")
    tier_s = time.perf_counter() - started
    emit("tier_without_table", total, payload, tier_s, tier_objects=report.objects_written)
    tables = TopicTables(catalog, store)
    topic_id = coord.get_topic("t").topic_id
    started = time.perf_counter()
    snapshot = tables.publish(topic_id, "t")
    publish_s = time.perf_counter() - started
    assert snapshot is not None
    emit("table_publish", total, payload, publish_s, files=report.objects_written)
    emit(
        "tier_with_table",
        total,
        payload,
        tier_s + publish_s,
        with_vs_without=round(tier_s / (tier_s + publish_s), 3),
    )

    table = tables.iceberg.load_table(("topics", "t"))
    paths = [task.file.file_path for task in table.scan().plan_files()]
    local = [p.removeprefix("file://") for p in paths]

    def direct() -> None:
        assert sum(pq.read_table(p).num_rows for p in local) == total

    emit("pyarrow_table_files", total, payload, best_of(args.repeat, direct))

    def pyiceberg_scan() -> None:
        assert table.scan().to_arrow().num_rows == total

    if total <= 5_000_000:  # one Arrow table of it all: ~1 GB per 5M rows in memory
        emit("pyiceberg_scan", total, payload, best_of(args.repeat, pyiceberg_scan))

    url, server = serve(tables)
    from pyiceberg.catalog import load_catalog

    rest = load_catalog("bench", type="rest", uri=url)
    loads, gets = [], []
    http = httpx.Client()  # one client: a new one per call costs its TLS context
    for _ in range(args.loads):
        t = time.perf_counter()
        rest.load_table(("topics", "t"))
        loads.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert http.get(f"{url}/v1/lakelog/namespaces/topics/tables/t").status_code == 200
        gets.append(time.perf_counter() - t)
    line(
        case="catalog_load_table",
        loads=args.loads,
        files=len(paths),
        p50_ms=round(percentile(loads, 0.5) * 1000, 2),
        p99_ms=round(percentile(loads, 0.99) * 1000, 2),
        http_get_p50_ms=round(percentile(gets, 0.5) * 1000, 2),
        http_get_p99_ms=round(percentile(gets, 0.99) * 1000, 2),
        load_avg=round(os.getloadavg()[0], 2),
    )
    http.close()
    server.should_exit = True
    if args.no_spark:
        return

    session = spark_scan.start_spark()

    def native() -> None:
        assert spark_agg(session.read.parquet(*paths)) == (total, payload)

    def lakelog() -> None:
        df = session.read.format("lakelog").options(db=db, store=store.url, subscribe="t")
        assert spark_agg(df.load()) == (total, payload)

    native()  # warm-up
    lakelog()
    native_s = best_of(args.repeat, native)
    emit("spark_native_table_files", total, payload, native_s)
    lakelog_s = best_of(args.repeat, lakelog)
    emit(
        "spark_lakelog", total, payload, lakelog_s, native_vs_lakelog=round(lakelog_s / native_s, 3)
    )
    session.stop()


if __name__ == "__main__":
    main()
