"""REST beyond Confluent (issue 16): what idempotence, streaming and fast start cost.

Starts one moto server and ``lakelog serve`` (agent + in-process SQLite coordinator)
as processes (``bench/consume.py``'s Agent), then prints JSON lines:

- ``idempotent_produce``: ``--producers`` closed-loop clients post v2 batches of
  ``--records`` x 1 KiB for ``--duration`` s, plain and with an ``Idempotency-Key``
  per request, alternated in rounds in the same run; records/s of each and the
  overhead (target < 10%).
- ``consume``: ``--mb`` MiB produced, then read by one v2 consumer instance fetching
  in a loop (``max_bytes`` 8 MiB) and by one SSE group stream: MB/s of values each.
- ``first_record``: a topic with data; a new v2 instance is created, subscribed and
  fetched until the first record: ms from creation to the first record, and how
  many fetches that took (1 when the first fetch answers data), median of ``--starts``.

Each line has the load average. Run: ``.venv/bin/python bench/rest_plus.py``.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from consume import BINARY, V2, Agent, Consumer, emit, log, served

RECORD = b"x" * 1024


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _body(records: int, tag: str) -> bytes:
    value = base64.b64encode(RECORD).decode()
    return orjson.dumps({"records": [{"value": value} for _ in range(records)]})


def produce_round(
    base: str, topic: str, producers: int, seconds: float, records: int, keyed: bool
) -> float:
    """Records/s of ``producers`` closed-loop clients for ``seconds``."""
    done = [0] * producers
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        with httpx.Client(base_url=base, timeout=60) as http:
            while time.monotonic() < stop:
                headers = {"Content-Type": BINARY}
                if keyed:
                    headers["Idempotency-Key"] = uuid.uuid4().hex
                r = http.post(f"/topics/{topic}", content=_body(records, ""), headers=headers)
                r.raise_for_status()
                done[i] += records

    threads = [threading.Thread(target=run, args=(i,)) for i in range(producers)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - started)


def _create_topic(agent: Agent, name: str, partitions: int) -> str:
    httpx.post(
        f"{agent.base}/v3/clusters/{agent.cluster_id}/topics",
        json={"topic_name": name, "partitions_count": partitions},
    ).raise_for_status()
    return name


def bench_idempotent(agent: Agent, args: argparse.Namespace) -> None:
    topic = _create_topic(agent, "idem", 8)
    plain: list[float] = []
    keyed: list[float] = []
    for r in range(args.rounds):  # alternated, so drift of the machine hits both
        for is_keyed, into in ((False, plain), (True, keyed)):
            rate = produce_round(
                agent.base, topic, args.producers, args.duration, args.records, is_keyed
            )
            into.append(rate)
            log(f"round {r} {'keyed' if is_keyed else 'plain'}: {rate:.0f} records/s")
    p, k = statistics.median(plain), statistics.median(keyed)
    emit(
        bench="idempotent_produce",
        plain_records_s=round(p),
        keyed_records_s=round(k),
        overhead_pct=round(100 * (p - k) / p, 1),
        target_pct=10,
        producers=args.producers,
        records_per_request=args.records,
        rounds=args.rounds,
        load=_load(),
    )


def bench_consume(agent: Agent, args: argparse.Namespace) -> None:
    topic = _create_topic(agent, "stream", 4)
    total = args.mb * 1024
    with httpx.Client(base_url=agent.base, timeout=60) as http:
        for _ in range(0, total, 500):
            r = http.post(
                f"/topics/{topic}", content=_body(500, ""), headers={"Content-Type": BINARY}
            )
            r.raise_for_status()
    log(f"consume: {total} records produced")
    consumer = Consumer(agent.base, topic, "earliest")
    got = size = 0
    started = time.monotonic()
    while got < total:
        n, b = consumer.fetch(1000, 8 << 20)
        got, size = got + n, size + b
    v2_s = time.monotonic() - started
    got = size = 0
    path = f"/v3/clusters/{agent.cluster_id}/consumer-groups/bench-sse/records"
    started = time.monotonic()
    with httpx.stream(
        "GET",
        agent.base + path,
        params={"topics": topic},
        headers={"Accept": "text/event-stream"},
        timeout=60,
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                size += len(orjson.loads(line[6:])["value"]) * 3 // 4  # as Consumer.fetch
                got += 1
                if got == total:
                    break
    sse_s = time.monotonic() - started
    mb = total * len(RECORD) / 1e6
    emit(
        bench="consume",
        records=total,
        v2_poll_mb_s=round(mb / v2_s, 1),
        sse_mb_s=round(mb / sse_s, 1),
        sse_vs_v2=round(v2_s / sse_s, 2),
        load=_load(),
    )


def bench_first_record(agent: Agent, args: argparse.Namespace) -> None:
    topic = "stream"  # has data (bench_consume)
    times: list[float] = []
    fetches: list[int] = []
    for _ in range(args.starts):
        started = time.monotonic()
        c = Consumer(agent.base, topic, "earliest")
        n = 0
        tries = 0
        while n == 0:
            n, _ = c.fetch(5000, 1 << 16)
            tries += 1
        times.append((time.monotonic() - started) * 1000)
        fetches.append(tries)
        c.http.delete(c.path, headers=V2)
    emit(
        bench="first_record",
        median_ms=round(statistics.median(times), 1),
        max_ms=round(max(times), 1),
        fetches_max=max(fetches),
        starts=args.starts,
        load=_load(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=4.0, help="Seconds per round.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--records", type=int, default=100, help="Records per request.")
    parser.add_argument("--mb", type=int, default=40, help="MiB to consume.")
    parser.add_argument("--starts", type=int, default=10)
    args = parser.parse_args()
    with served("lakelog-bench-restplus-", "bench-restplus") as (agent, _, _):
        bench_idempotent(agent, args)
        bench_consume(agent, args)
        bench_first_record(agent, args)


if __name__ == "__main__":
    main()
