"""REST consume against the Kafka door on the same data and agent (issue 29).

Starts one moto server and ``lakelog serve --kafka-port ...`` (agent + in-process SQLite
coordinator, S3 on moto; ``bench/kafka.py``'s ``Lakelog``), creates an 8-partition topic
and produces exactly ``--records`` keyed 1 KiB records through the Kafka door
(confluent-kafka, acks=all). Then each reader reads all of them from offset 0 through
the same agent (its read cache warm with what it wrote, as far as it holds):

- ``kafka``: a fresh confluent-kafka consumer (``bench/kafka_catchup.py``'s);
- ``v2``: one REST v2 consumer instance (binary), fetches of ``max_bytes`` 8 MiB;
- ``v3_read``: the stateless v3 read by offset, partition after partition, 8 MiB a read;
  ``v3_read_4``: the same, four partitions at a time (four client threads);
- ``group_stream``: the v3 group stream (NDJSON), until every record came.

Each line: MB/s of record values, the agent's and this process's CPU (cores), the agent's
peak resident set during the read, the load average; then ``ratio`` lines (each REST
reader over the Kafka door; the issue's target is >= 0.5). The REST clients parse every
answer (orjson) and count the bytes of the values without decoding them (base64 is 4/3 of
the value).

``--profile DIR``: py-spy samples the agent during each REST reader (as
``bench/kafka_catchup.py``'s): the top functions go to stderr, the samples to DIR.

Run: ``.venv/bin/python bench/rest_consume.py`` (about a minute), e.g. ``--records 50000``.
Progress goes to stderr, JSON lines to stdout.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import boto3  # noqa: E402
import httpx  # noqa: E402
import orjson  # noqa: E402
from kafka import BUCKET, RECORD_BYTES, Lakelog, create_topic  # noqa: E402
from kafka_catchup import Profiled, catch_up, produce_exactly, py_spy  # noqa: E402
from produce import CpuMeter, PeakRss, emit, load_avg, log  # noqa: E402

from tests.procs import fake_aws_credentials, start_moto  # noqa: E402

fake_aws_credentials()

PARTITIONS = 8
MAX_BYTES = 8 << 20
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BINARY = "application/vnd.kafka.binary.v2+json"


def value_bytes(records: list[dict[str, Any]]) -> int:
    """Bytes of the values of base64 records, without decoding them."""
    return sum(len(r["value"]) * 3 // 4 for r in records)


def read_v2(base: str, topic: str, expected: int) -> int:
    with httpx.Client(base_url=base, timeout=60) as http:
        group = f"bench-{uuid.uuid4().hex[:6]}"
        r = http.post(f"/consumers/{group}", json={"auto.offset.reset": "earliest"}, headers=V2)
        r.raise_for_status()
        path = f"/consumers/{group}/instances/{r.json()['instance_id']}"
        http.post(f"{path}/subscription", json={"topics": [topic]}, headers=V2).raise_for_status()
        got = size = 0
        while got < expected:
            r = http.get(
                f"{path}/records",
                params={"timeout": 1000, "max_bytes": MAX_BYTES},
                headers={"Accept": BINARY},
            )
            r.raise_for_status()
            records = orjson.loads(r.content)
            got += len(records)
            size += value_bytes(records)
        http.delete(path, headers=V2)
        return size


def read_v3(base: str, cluster: str, topic: str, expected: int, threads: int = 1) -> int:
    """Every partition read to its end by offset, ``threads`` partitions at a time."""

    def read_partition(p: int) -> tuple[int, int]:
        got = size = offset = 0
        with httpx.Client(base_url=base, timeout=60) as http:
            while True:
                r = http.get(
                    f"/v3/clusters/{cluster}/topics/{topic}/partitions/{p}/records",
                    params={"offset": offset, "max_bytes": MAX_BYTES, "timeout_ms": 0},
                )
                r.raise_for_status()
                doc = orjson.loads(r.content)
                got += len(doc["records"])
                size += value_bytes(doc["records"])
                offset = doc["next_offset"]
                if offset >= doc["high_watermark"]:
                    return got, size

    with ThreadPoolExecutor(threads) as pool:
        done = list(pool.map(read_partition, range(PARTITIONS)))
    got = sum(n for n, _ in done)
    if got != expected:
        raise RuntimeError(f"v3 read {got} records, expected {expected}")
    return sum(b for _, b in done)


def read_group_stream(base: str, cluster: str, topic: str, expected: int) -> int:
    got = size = 0
    path = f"/v3/clusters/{cluster}/consumer-groups/bench-{uuid.uuid4().hex[:6]}/records"
    with httpx.stream(
        "GET",
        base + path,
        params={"topics": topic, "auto_offset_reset": "earliest"},
        headers={"Accept": "application/x-ndjson"},
        timeout=60,
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            doc = orjson.loads(line)
            if "value" in doc:
                got += 1
                size += len(doc["value"]) * 3 // 4
                if got == expected:
                    break
    return size


def timed(agent: Lakelog, read: Callable[[], int]) -> dict[str, Any]:
    cpu = CpuMeter({"agent": agent.pid})
    peak = PeakRss(agent.pid)
    peak.start()
    cpu.start()
    started = time.monotonic()
    size = read()
    seconds = time.monotonic() - started
    return {
        "seconds": round(seconds, 2),
        "mb_per_s": round(size / 1e6 / seconds, 1),
        "cpu_cores": cpu.stop(),
        "agent_peak_rss_mib": peak.stop(),
        "load_avg": load_avg(),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--profile", default=None, help="a directory for py-spy samples")
    args = p.parse_args()
    out_dir = None if args.profile is None else Path(args.profile)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        moto, endpoint = start_moto(tmp)
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
            agent = Lakelog(tmp, endpoint, f"rc-{uuid.uuid4().hex[:6]}")
            try:
                topic = "rest-consume"
                create_topic(agent.bootstrap, topic, PARTITIONS)
                log(f"producing {args.records} records of {RECORD_BYTES} bytes")
                produce_exactly(agent.bootstrap, topic, args.records)
                cluster = httpx.get(f"{agent.base}/v3/clusters").json()["data"][0]["cluster_id"]
                rows: dict[str, dict[str, Any]] = {}
                readers: dict[str, Callable[[], int]] = {
                    "v2": lambda: read_v2(agent.base, topic, args.records),
                    "v3_read": lambda: read_v3(agent.base, cluster, topic, args.records),
                    "v3_read_4": lambda: read_v3(agent.base, cluster, topic, args.records, 4),
                    "group_stream": lambda: read_group_stream(
                        agent.base, cluster, topic, args.records
                    ),
                }
                log("kafka: a fresh confluent-kafka consumer")
                kafka_row = catch_up(agent, topic, PARTITIONS, args.records)
                kept = ("seconds", "mb_per_s", "cpu_cores", "agent_peak_rss_mib")
                rows["kafka"] = {k: kafka_row[k] for k in kept}
                emit(bench="rest_consume", reader="kafka", records=args.records, **rows["kafka"])
                for name, read in readers.items():
                    log(f"{name}")
                    spy = Profiled(py_spy() if out_dir else None, out_dir, name)
                    spy.start(agent)
                    rows[name] = timed(agent, read)
                    spy.stop()
                    emit(bench="rest_consume", reader=name, records=args.records, **rows[name])
                for name in readers:
                    emit(
                        bench="ratio",
                        reader=name,
                        over_kafka=round(rows[name]["mb_per_s"] / rows["kafka"]["mb_per_s"], 2),
                    )
            finally:
                agent.stop()
        finally:
            moto.stop()


if __name__ == "__main__":
    main()
