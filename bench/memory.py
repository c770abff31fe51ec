"""The agent's memory against the number of partitions (issue 29: "nothing grows with
partitions beyond a stated bound per partition").

For each count in ``--partitions`` (default 8, 1000, 4000): a fresh ``lakelog serve
--kafka-port`` (agent + in-process SQLite coordinator, S3 on one moto server), one topic
of that many partitions, ``--records`` keyed 1 KiB records produced through the Kafka
door (confluent-kafka, acks=all), then read back from offset 0 by a fresh consumer of
every partition through the same agent. The agent's resident set is read from
``/proc/<pid>/status`` after each step: ``VmRSS`` now and ``VmHWM``, the most it has
held so far. One JSON line per count, then one ``per_partition`` line: how much more
the peak is per partition than at the smallest count.

The read cache's budgets bound what reads keep (``read_cache_history_bytes`` 128 MiB,
``read_cache_tail_bytes`` 64 MiB by default); the rest is the process (Python, FastAPI,
pyarrow) and what each partition costs: its entry in the batcher, the topic cache, the
index cache and the Kafka door's fetch sessions.

Run: ``.venv/bin/python bench/memory.py`` (a few minutes). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import boto3  # noqa: E402
from kafka import BUCKET, Lakelog, create_topic  # noqa: E402
from kafka_catchup import catch_up, produce_exactly  # noqa: E402
from produce import emit, load_avg, log  # noqa: E402

from tests.procs import start_moto  # noqa: E402


def memory_mib(pid: int) -> dict[str, float]:
    """The process's resident set now (``rss_mib``) and its peak so far (``peak_mib``)."""
    fields = {"VmRSS:": "rss_mib", "VmHWM:": "peak_mib"}
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, *rest = line.split()
            if name in fields:
                out[fields[name]] = round(int(rest[0]) / 1024, 1)
    return out


def run_case(tmp: Path, endpoint: str, partitions: int, records: int) -> dict[str, Any]:
    agent = Lakelog(tmp, endpoint, f"memory{partitions}-{uuid.uuid4().hex[:6]}")
    try:
        row: dict[str, Any] = {"partitions": partitions, "records": records}
        row["started"] = memory_mib(agent.pid)
        create_topic(agent.bootstrap, "memory", partitions)
        log(f"{partitions} partitions: producing {records} records")
        row["produce_s"] = round(produce_exactly(agent.bootstrap, "memory", records), 2)
        row["produced"] = memory_mib(agent.pid)
        log(f"{partitions} partitions: reading them back from offset 0")
        read = catch_up(agent, "memory", partitions, records)
        if read["records"] != records:
            raise RuntimeError(f"read {read['records']} of {records} records")
        row["read_mb_per_s"] = read["mb_per_s"]
        row["read"] = memory_mib(agent.pid)
        row["load_avg"] = load_avg()
        return row
    finally:
        agent.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="8,1000,4000", help="comma-separated counts")
    parser.add_argument("--records", type=int, default=40_000, help="keyed 1 KiB records")
    args = parser.parse_args()
    counts = sorted(int(p) for p in args.partitions.split(","))
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        moto, endpoint = start_moto(tmp)
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
            rows = [run_case(tmp, endpoint, p, args.records) for p in counts]
        finally:
            moto.stop()
    for row in rows:
        emit(bench="memory", **row)
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        extra = last["partitions"] - first["partitions"]
        emit(
            bench="memory",
            case="per_partition",
            partitions=f"{first['partitions']}->{last['partitions']}",
            peak_kib_per_partition=round(
                (last["read"]["peak_mib"] - first["read"]["peak_mib"]) * 1024 / extra, 1
            ),
            idle_kib_per_partition=round(
                (last["read"]["rss_mib"] - first["read"]["rss_mib"]) * 1024 / extra, 1
            ),
        )


if __name__ == "__main__":
    main()
