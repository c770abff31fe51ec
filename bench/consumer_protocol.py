"""What the consumer group protocol (KIP-848) costs the coordinator: heartbeats per second
of a stable group, and how many heartbeats (and how long) a group takes to settle when
members join, as the group and its topic grow.

In-process ``LocalCoordinator`` on SQLite (one write transaction per heartbeat, as every
agent's heartbeat is). Each member is a simulated client that gives up revoked partitions
at once, as librdkafka does. Prints one JSON line per size:

    {"bench": "consumer_protocol", "members": 10, "partitions": 1000,
     "join_heartbeats": ..., "join_ms": ..., "stable_heartbeats_per_s": ...,
     "stable_p99_ms": ...}

Run: ``.venv/bin/python bench/consumer_protocol.py`` (under a minute); progress on stderr.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

from coordinator.groups.assignors import Assignment, partitions_of
from coordinator.local import LocalCoordinator

SIZES = ((2, 10), (10, 1000), (50, 1000), (10, 10_000))


class Member:
    def __init__(self, c: LocalCoordinator, group: str, topic: str) -> None:
        self.c, self.group, self.topic = c, group, topic
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.owned: Assignment = {}

    def beat(self) -> None:
        first = self.epoch == 0
        r = self.c.kafka_consumer_heartbeat(
            self.group,
            self.member_id,
            self.epoch,
            rebalance_timeout_ms=60_000 if first else -1,
            subscribed_topic_names=[self.topic] if first else None,
            owned=self.owned,
        )
        self.epoch = r.member_epoch
        if r.assignment is not None:
            self.owned = r.assignment


def run(c: LocalCoordinator, members: int, partitions: int) -> dict[str, Any]:
    topic = f"b-{uuid.uuid4().hex[:8]}"
    c.create_topic(topic, partitions)
    group = f"g-{uuid.uuid4().hex[:8]}"
    ms = [Member(c, group, topic) for _ in range(members)]
    start = time.perf_counter()
    beats = 0
    for _ in range(20):  # rounds until every partition is owned once
        for m in ms:
            m.beat()
            beats += 1
        owned = [tp for m in ms for tp in partitions_of(m.owned)]
        if len(owned) == partitions == len(set(owned)):
            g = c.kafka_describe(group)
            if g is not None and g.state == "Stable":
                break
    join_ms = (time.perf_counter() - start) * 1000
    times = []
    for _ in range(max(3, 300 // members)):
        for m in ms:
            t0 = time.perf_counter()
            m.beat()
            times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "bench": "consumer_protocol",
        "members": members,
        "partitions": partitions,
        "join_heartbeats": beats,
        "join_ms": round(join_ms, 1),
        "stable_heartbeats_per_s": round(len(times) / sum(times), 1),
        "stable_p50_ms": round(statistics.median(times) * 1000, 2),
        "stable_p99_ms": round(times[int(len(times) * 0.99) - 1] * 1000, 2),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        c = LocalCoordinator(f"sqlite:///{tmp}/meta.db")
        try:
            for members, partitions in SIZES:
                print(f"{members} members, {partitions} partitions", file=sys.stderr)
                print(json.dumps(run(c, members, partitions)), flush=True)
        finally:
            c.close()


if __name__ == "__main__":
    main()
