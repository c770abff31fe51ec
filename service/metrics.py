"""Prometheus metrics of one agent, in a registry of its own (one per app).

A private ``CollectorRegistry`` per ``Metrics()`` keeps several apps in one process
(tests) from colliding on metric names, and ``render`` serves exactly this agent's
figures at ``GET /metrics``.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# Latency buckets from 1 ms to 10 s: a moto PUT takes ~5-50 ms, a commit ~1-10 ms.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Segment object sizes from 1 KiB to 64 MiB, in factors of 4.
_SIZE_BUCKETS = tuple(float(1024 * 4**i) for i in range(9))


class Metrics:
    """The agent's metrics: produce counters, flush sizes and latencies, buffer gauge."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.produced_records = Counter(
            "lakelog_produced_records", "Records acked to producers.", registry=r
        )
        self.produced_bytes = Counter(
            "lakelog_produced_bytes", "Key, value and header bytes of acked records.", registry=r
        )
        self.produce_requests = Counter(
            "lakelog_produce_requests",
            "Produce requests answered, by API.",
            ["api"],
            registry=r,
        )
        self.failed_records = Counter(
            "lakelog_produce_failed_records",
            "Records that were accepted into the buffer but whose flush failed.",
            registry=r,
        )
        self.flushes = Counter(
            "lakelog_flushes", "Segment objects flushed, by outcome.", ["result"], registry=r
        )
        self.flush_bytes = Histogram(
            "lakelog_flush_bytes",
            "Size of each flushed segment object.",
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.flush_records = Histogram(
            "lakelog_flush_records",
            "Records in each flushed segment object.",
            buckets=(1, 10, 100, 1_000, 10_000, 100_000),
            registry=r,
        )
        self.flush_seconds = Histogram(
            "lakelog_flush_seconds",
            "Build + PUT + commit of one segment object.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.put_seconds = Histogram(
            "lakelog_put_seconds",
            "PUT of one segment object.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "lakelog_commit_seconds",
            "Coordinator commit of one segment object's chunks.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.buffer_bytes = Gauge(
            "lakelog_buffer_bytes", "Bytes buffered or in flight in the write batcher.", registry=r
        )
        self.buffer_full = Counter(
            "lakelog_buffer_full",
            "Appends refused because the buffer stayed full past buffer_wait_ms.",
            registry=r,
        )
        self.idempotent_requests = Counter(
            "lakelog_rest_idempotent_requests",
            "REST produce requests with an Idempotency-Key, by outcome: appended, "
            "duplicate (answered with the first offsets), mismatch (refused).",
            ["outcome"],
            registry=r,
        )
        self.quota_charged = Counter(
            "lakelog_quota_charged",
            "What quotas counted against principals: bytes, or requests, by kind.",
            ["kind"],
            registry=r,
        )
        self.quota_throttled = Counter(
            "lakelog_quota_throttled",
            "Requests throttled by a quota (429 on REST, throttle_time_ms on Kafka), by kind.",
            ["kind"],
            registry=r,
        )
        self.quota_throttle_seconds = Counter(
            "lakelog_quota_throttle_seconds",
            "Seconds of Retry-After / throttle time answered, by kind.",
            ["kind"],
            registry=r,
        )
        self.heartbeat_failures = Counter(
            "lakelog_heartbeat_failures",
            "Agent heartbeats to the coordinator that failed (retried at the next interval).",
            registry=r,
        )

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of this registry and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
