"""Per-consumer overrides on v2 instance creation and the fast first fetch (issue 16)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.conftest import Cluster, create_topic
from tests.integration.test_consumer_api import BINARY, Consumer, b64, request

pytestmark = [pytest.mark.integration]


def _produce(cluster: Cluster, topic: str, n: int) -> None:
    r = request(
        "POST",
        f"{cluster.agents[1]}/topics/{topic}",
        {"records": [{"value": b64(b"r%d" % i), "partition": 0} for i in range(n)]},
        content_type=BINARY,
    )
    assert r.status_code == 200, r.text


def test_max_poll_records_and_the_first_fetch(lakelog_cluster: Cluster, unique_topic: Any) -> None:
    """max.poll.records caps every fetch (here 3 of 10 records ready); the first fetch of
    a new instance answers data at once (no empty first answer); isolation.level and
    fetch.max.wait.ms are taken; the settings survive the coordinator (other agent)."""
    c = lakelog_cluster
    topic = unique_topic("overrides")
    create_topic(c, topic, 1)
    _produce(c, topic, 10)
    consumer = Consumer.create(
        c.agents,
        "g-overrides",
        **{
            "auto.offset.reset": "earliest",
            "max.poll.records": "3",
            "isolation.level": "read_committed",
            "fetch.max.wait.ms": 200,
        },
    )
    consumer.subscribe(topic)
    got = [consumer.fetch(None, agent=i % 2) for i in range(4)]  # the instance's own wait
    assert [[r["offset"] for r in page] for page in got] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"fetch.max.bytes": 1024}, "fetch.max.bytes is not a setting a consumer instance honours"),
        ({"enable.idempotence": True}, "enable.idempotence is not"),
        ({"isolation.level": "read_dirty"}, "isolation.level must be"),
        ({"max.poll.records": 0}, "max.poll.records must be an integer >= 1"),
    ],
)
def test_other_kafka_settings_are_refused(
    lakelog_cluster: Cluster, config: dict[str, Any], needle: str
) -> None:
    r = request("POST", f"{lakelog_cluster.agents[0]}/consumers/g-refused", config)
    assert r.status_code == 422
    assert r.json()["error_code"] == 42204
    assert needle in r.json()["message"]
