"""Prometheus metrics of the read path, on the agent's registry (``Metrics.registry``).

Kept apart from ``service/metrics.py`` (the write path's): ``ConsumeMetrics(registry)``
adds its collectors to the same ``CollectorRegistry``, so ``GET /metrics`` shows both.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# A cached range is served in microseconds; a moto GET takes ~2-50 ms.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
_WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ConsumeMetrics:
    """Read cache, object GETs, index lookups, fetches and long-poll waits."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.registry = r
        self.cache_hits = Counter(
            "lakelog_read_cache_hits",
            "Chunk reads served from the read cache, by budget (tail | history).",
            ["budget"],
            registry=r,
        )
        self.cache_misses = Counter(
            "lakelog_read_cache_misses", "Chunk reads that had to GET from the store.", registry=r
        )
        self.cache_coalesced = Counter(
            "lakelog_read_cache_coalesced",
            "Chunk reads that waited for a GET of the same range already in flight.",
            registry=r,
        )
        self.cache_hit_bytes = Counter(
            "lakelog_read_cache_hit_bytes", "Bytes served from the read cache.", registry=r
        )
        self.gets = Counter(
            "lakelog_store_gets", "Ranged GETs sent to the object store.", registry=r
        )
        self.get_bytes = Counter(
            "lakelog_store_get_bytes", "Bytes read from the object store.", registry=r
        )
        self.get_seconds = Histogram(
            "lakelog_store_get_seconds",
            "Latency of one ranged GET.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.index_hits = Counter(
            "lakelog_index_cache_hits", "Index lookups served from the agent's cache.", registry=r
        )
        self.index_misses = Counter(
            "lakelog_index_cache_misses", "Index lookups sent to the coordinator.", registry=r
        )
        self.consumed_records = Counter(
            "lakelog_consumed_records", "Records returned to consumers.", registry=r
        )
        self.consumed_bytes = Counter(
            "lakelog_consumed_bytes", "Key and value bytes returned to consumers.", registry=r
        )
        self.fetch_seconds = Histogram(
            "lakelog_fetch_seconds",
            "Consumer fetch requests, long-poll included.",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.poll_waits = Counter(
            "lakelog_fetch_waits",
            "Times a fetch waited for new data, by outcome.",
            ["woken"],
            registry=r,
        )
        self.poll_wait_seconds = Histogram(
            "lakelog_fetch_wait_seconds",
            "Time a fetch spent waiting for new data.",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.fetches_undelivered = Counter(
            "lakelog_fetch_undelivered",
            "Fetch answers not delivered (the client went away first): no position moved.",
            registry=r,
        )
        self.fetch_lease_waits = Counter(
            "lakelog_fetch_lease_waits",
            "Fetches that waited for another fetch of the same consumer instance.",
            registry=r,
        )
        self.fetch_rereads = Counter(
            "lakelog_fetch_rereads",
            "Fetches that read again: a seek or rebalance moved the positions meanwhile.",
            registry=r,
        )
        self.fetches_waiting = Gauge(
            "lakelog_fetches_waiting",
            "Fetches long-polling for data right now.",
            registry=r,
        )
        self.fetch_budget_in_use = Gauge(
            "lakelog_fetch_budget_in_use_bytes",
            "Key+value bytes granted to fetches in flight (of consumer_fetch_memory_bytes).",
            registry=r,
        )
        self.consumer_heartbeats = Counter(
            "lakelog_consumer_heartbeats",
            "Background heartbeats sent for the consumer instances this agent serves.",
            registry=r,
        )
        self.hw_polls = Counter(
            "lakelog_hw_polls",
            "High-watermark checks by the background poller (one per watched partition).",
            registry=r,
        )
