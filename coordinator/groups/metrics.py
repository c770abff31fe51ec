"""Consumer-group lag on /metrics, computed at scrape time from the committed offsets.

One read of the metadata database per scrape (``GroupStore.lag_by_topic``), whatever
the number of partitions; groups of every door (REST consumers, Kafka clients) commit
to the same table, so every group is there. Labelled by group and topic: a partition
label would multiply the series by the partition count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coordinator.groups.model import GroupTopicLag

log = logging.getLogger(__name__)

_FAMILIES = (
    (
        "lakelog_consumer_group_lag",
        "Records between a group's committed offsets and the high watermarks, summed over "
        "the topic's partitions that have a committed offset.",
    ),
    (
        "lakelog_consumer_group_max_lag",
        "The largest lag of one partition of the topic for the group.",
    ),
    (
        "lakelog_consumer_group_partitions",
        "Partitions of the topic the group has a committed offset for.",
    ),
)


class GroupLagCollector(Collector):
    """A Prometheus collector over ``lag`` (``LocalCoordinator.group_lag``)."""

    def __init__(self, lag: Callable[[], list[GroupTopicLag]]) -> None:
        self._lag = lag

    def describe(self) -> Iterator[Metric]:
        # Registering calls this instead of collect(): no database read at start-up.
        for name, help_ in _FAMILIES:
            yield GaugeMetricFamily(name, help_, labels=["group", "topic"])

    def collect(self) -> Iterator[Metric]:
        lag, top, count = (GaugeMetricFamily(n, h, labels=["group", "topic"]) for n, h in _FAMILIES)
        try:
            rows = self._lag()
        except Exception:
            log.warning("consumer group lag unavailable for /metrics", exc_info=True)
            rows = []
        for row in rows:
            labels = [row.group, row.topic]
            lag.add_metric(labels, row.lag)
            top.add_metric(labels, row.max_lag)
            count.add_metric(labels, row.partitions)
        yield from (lag, top, count)
