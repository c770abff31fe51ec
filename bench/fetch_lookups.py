"""Index lookups of a Fetch of many partitions, through a coordinator process (issue 29).

Starts ``lakelog coordinator`` on SQLite and writes, through ``LogWriter`` to a local
store, one segment object holding one record in each of ``--partitions`` partitions.
Then, as a Kafka Fetch of every partition does on a fresh agent, a ``CachingLogReader``
over ``http_coordinator`` prefetches the partitions (``prefetch_partitions``) and reads
each one's records; timed for two ways of looking the partitions up, side by side:

- ``one_call``: the index entries of every partition the cache lacks in one
  ``lookup_many`` (what the agent does);
- ``per_partition``: one ``lookup`` each (what it did before).

Each line: partitions, mode, round, milliseconds to prefetch and to read, the
coordinator requests it cost (its ``lakelog_coordinator_requests_total``), load average.

    .venv/bin/python bench/fetch_lookups.py [--partitions 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.produce import emit, load_avg, log
from coordinator.client import TopicPartition
from coordinator.http.client import http_coordinator
from index.cache import IndexCache
from index.log import LogWriter, PartitionWant
from segments.segment import SegmentBuilder
from segments.store import open_store
from segments.types import Record
from service.read_cache import CachingLogReader, RangeCache
from tests.procs import start_coordinator


def requests_served(url: str) -> float:
    total = 0.0
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("lakelog_coordinator_requests_total{") and "/v2/" in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--partitions", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        proc, url = start_coordinator(tmp, f"sqlite:///{tmp / 'meta.db'}")
        try:
            coordinator = http_coordinator(url, timeout=60)
            store = open_store(f"file://{tmp / 'data'}")
            topic = coordinator.create_topic("wide", a.partitions)
            builder = SegmentBuilder()
            for partition in range(a.partitions):
                builder.append(topic.topic_id, partition, [Record(None, b"v" * 100, 1_000)])
            LogWriter(store, coordinator).write(builder)
            tps = [TopicPartition("wide", partition) for partition in range(a.partitions)]
            bounds = coordinator.offsets_many(tps)
            wants = [PartitionWant("wide", tp.partition, 0, bounds[tp], 1 << 16) for tp in tps]
            log(f"{a.partitions} partitions written; timing {a.rounds} rounds per mode")
            for round_no in range(a.rounds):
                for mode in ("one_call", "per_partition"):
                    reader = CachingLogReader(
                        store, coordinator, RangeCache(1 << 26, 1 << 26), IndexCache(100_000, 60)
                    )
                    if mode == "per_partition":
                        reader._lookup_uncached = lambda wants: None  # type: ignore[method-assign]
                    before = requests_served(url)
                    started = time.perf_counter()
                    reader.prefetch_partitions(wants, 1 << 26)
                    prefetched = time.perf_counter()
                    records = sum(
                        len(list(reader.records("wide", w.partition, 0, bounds=w.bounds)))
                        for w in wants
                    )
                    done = time.perf_counter()
                    reader.close()
                    assert records == a.partitions, records
                    emit(
                        bench="fetch_lookups",
                        partitions=a.partitions,
                        mode=mode,
                        round=round_no,
                        prefetch_ms=round((prefetched - started) * 1000, 1),
                        read_ms=round((done - prefetched) * 1000, 1),
                        coordinator_requests=int(requests_served(url) - before),
                        load=load_avg(),
                    )
            coordinator.close()
        finally:
            proc.stop()


if __name__ == "__main__":
    main()
