"""Where reading meets the admin calls and janitors (issue 22, read side), real processes.

One cluster for the module: a coordinator process, one agent with a Kafka listener, S3
through the run's moto server. Every test uses its own topics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from coordinator.http.client import http_coordinator
from tests.conftest import sql_rows
from tests.integration.conftest import Cluster, start_cluster
from tests.integration.test_consumer_api import Consumer, produce, unb64
from tests.integration.test_kafka_clients import plain_consumer, poll_records

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("read-seams"), moto_endpoint, agents=1, kafka=True)
    try:
        yield c
    finally:
        c.stop()


def _topics_url(cluster: Cluster) -> str:
    return f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics"


def create(cluster: Cluster, name: str, partitions: int = 1, **configs: str) -> None:
    body: dict[str, Any] = {"topic_name": name, "partitions_count": partitions}
    if configs:
        body["configs"] = [{"name": k, "value": v} for k, v in configs.items()]
    r = httpx.post(_topics_url(cluster), json=body)
    assert r.status_code == 201, r.text


def delete(cluster: Cluster, name: str) -> None:
    r = httpx.delete(f"{_topics_url(cluster)}/{name}")
    assert r.status_code == 204, r.text


def v3_read(cluster: Cluster, topic: str, offset: int, **params: Any) -> httpx.Response:
    return httpx.get(
        f"{_topics_url(cluster)}/{topic}/partitions/0/records",
        params={"offset": offset, **params},
        timeout=30,
    )


def kafka_consumer(cluster: Cluster) -> KafkaConsumer:
    return plain_consumer(cluster.kafka[0], {"topic.metadata.refresh.interval.ms": 500})


def kafka_read(cluster: Cluster, topic: str, want: int, timeout_s: float = 15.0) -> list[Any]:
    """Records of partition 0 from offset 0 through the Kafka door (confluent-kafka)."""
    c = kafka_consumer(cluster)
    c.assign([TopicPartition(topic, 0, 0)])
    try:
        got = poll_records(c, lambda got: len(got) >= want, timeout_s, poll_s=0.2)
        # A little longer: whatever else the partition serves would show now.
        return got + poll_records(c, lambda _: False, timeout_s=1.0, poll_s=0.2)
    finally:
        c.close()


# -- defect 2: a recreated topic is a new log ----------------------------------------------


def _recreate_after_reading(
    cluster: Cluster, topic: str, read: Callable[[], object], old: int = 5
) -> None:
    """``topic`` with ``old`` records, read (so the agent caches its index), deleted,
    created again and given one record ``b"new"``."""
    create(cluster, topic)
    produce(cluster.agents[0], topic, [b"old-%d" % i for i in range(old)], partition=0)
    read()
    delete(cluster, topic)
    create(cluster, topic)
    produce(cluster.agents[0], topic, [b"new"], partition=0)


def test_v3_read_of_a_recreated_topic_serves_only_the_new_log(
    cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    """Read t, delete t, create t, produce one record: a read from 0 (within the agent's
    index cache lifetime) answers that one record, never the deleted topic's five."""
    topic = unique_topic("recreate-v3")

    def read_old() -> None:
        r = v3_read(cluster, topic, 0)
        assert r.status_code == 200, r.text
        assert len(r.json()["records"]) == 5

    _recreate_after_reading(cluster, topic, read_old)
    r = v3_read(cluster, topic, 0)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [(x["offset"], unb64(x["value"])) for x in body["records"]] == [(0, b"new")]
    assert body["high_watermark"] == 1 and body["next_offset"] == 1


def test_v2_consumer_of_a_recreated_topic_gets_the_new_log_and_stays_within_it(
    cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    """A v2 consumer read the old topic; a new instance reading the recreated topic from 0
    gets its one record at offset 0, and its position is 1, not past the end."""
    topic = unique_topic("recreate-v2")
    agents = cluster.agents

    def read_old() -> None:
        c = Consumer.create(agents, f"g-{topic}-old", **{"auto.offset.reset": "earliest"})
        c.assign(topic, 0)
        assert len(c.fetch(2000)) == 5
        c.delete()

    _recreate_after_reading(cluster, topic, read_old)
    c = Consumer.create(agents, f"g-{topic}-new", **{"auto.offset.reset": "earliest"})
    c.assign(topic, 0)
    got = c.fetch(2000)
    assert [(x["offset"], unb64(x["value"])) for x in got] == [(0, b"new")]
    produce(agents[0], topic, [b"next"], partition=0)
    got = c.fetch(5000)
    assert [(x["offset"], unb64(x["value"])) for x in got] == [(1, b"next")]
    c.commit()
    assert c.committed(topic, 0) == {0: 2}


def test_kafka_fetch_of_a_recreated_topic_serves_only_the_new_log(
    cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    """The same through the Kafka door with confluent-kafka: one record, offset 0, and
    the high watermark the Fetch reports is 1."""
    topic = unique_topic("recreate-kafka")
    _recreate_after_reading(cluster, topic, lambda: kafka_read(cluster, topic, 5))
    got = kafka_read(cluster, topic, 1)
    assert [(m.offset(), m.value()) for m in got] == [(0, b"new")]


# -- defect 3: timestamp lookups start at log-start, also inside a chunk ----------------------


def _one_chunk_cut_at_five(cluster: Cluster, topic: str) -> None:
    """``topic``: ten records with timestamps 1000..1009 in ONE index entry, then
    DeleteRecords at 5: log-start lies inside the entry."""
    create(cluster, topic)
    p = Producer({"bootstrap.servers": cluster.kafka[0], "linger.ms": 50, "acks": "all"})
    for i in range(10):
        p.produce(topic, value=b"v%d" % i, partition=0, timestamp=1000 + i)
    assert p.flush(30) == 0
    with http_coordinator(cluster.coordinator_url) as coordinator:
        refs = coordinator.lookup(topic, 0, 0)
        assert [(r.base_offset, r.record_count) for r in refs] == [(0, 10)]
    admin = AdminClient({"bootstrap.servers": cluster.kafka[0]})
    (done,) = admin.delete_records([TopicPartition(topic, 0, 5)]).values()
    assert done.result(30).low_watermark == 5


def test_kafka_offsets_for_times_answers_from_log_start_inside_a_chunk(
    cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    """ListOffsets by timestamp (confluent-kafka's offsets_for_times): the first offset at
    or after log-start whose timestamp is at or after the one asked; a timestamp past
    every record: no offset (-1)."""
    topic = unique_topic("ts-kafka")
    _one_chunk_cut_at_five(cluster, topic)
    c = kafka_consumer(cluster)
    try:
        for ts, expected in ((1002, 5), (1000, 5), (1007, 7), (1009, 9), (5000, -1)):
            (found,) = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=20)
            assert found.error is None, found.error
            assert found.offset == expected, (ts, found.offset)
    finally:
        c.close()


def test_rest_seek_by_timestamp_never_seeks_below_log_start(
    cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    """REST v2 seek by timestamp to a time before log-start: the consumer (auto.offset.reset
    latest) reads from log-start, offsets 5..9, instead of being reset to the end."""
    topic = unique_topic("ts-rest")
    _one_chunk_cut_at_five(cluster, topic)
    c = Consumer.create(cluster.agents, f"g-{topic}", **{"auto.offset.reset": "latest"})
    c.assign(topic, 0)
    r = c.call(
        "POST", "/positions", {"timestamps": [{"topic": topic, "partition": 0, "timestamp": 1002}]}
    )
    assert r.status_code == 204, r.text
    got = c.fetch(2000)
    assert [(x["offset"], unb64(x["value"])) for x in got] == [
        (i, b"v%d" % i) for i in range(5, 10)
    ]


# -- defect 4: a hole in the index fails every reader, none spins -----------------------------


def _holed(cluster: Cluster, topic: str, where: str) -> None:
    """``topic``: three index entries of five records (offsets 0-14), then the one at 5
    (``middle``) or at 10 (``end``: the index ends before the high watermark) deleted
    behind the coordinator's back."""
    create(cluster, topic)
    for i in range(3):
        produce(cluster.agents[0], topic, [b"r%d-%d" % (i, j) for j in range(5)], partition=0)
    with http_coordinator(cluster.coordinator_url) as coordinator:
        topic_id = coordinator.get_topic(topic).topic_id
        assert [r.base_offset for r in coordinator.lookup(topic, 0, 0)] == [0, 5, 10]
    base = {"middle": 5, "end": 10}[where]
    sql_rows(
        f"sqlite:///{cluster.tmp / 'meta.db'}",
        "DELETE FROM index_entries WHERE topic_id = ? AND partition = 0 AND base_offset = ?",
        (topic_id, base),
    )


HOLE = {"error_code": 50002}


@pytest.mark.parametrize("where", ["middle", "end"])
def test_rest_readers_fail_on_a_hole_instead_of_spinning(
    cluster: Cluster, unique_topic: Callable[[str], str], where: str
) -> None:
    """A hole below the high watermark: the v3 read and the v2 consumer's fetch (which
    long-polls for records it believes are coming) answer 500 50002 naming the hole; the
    group stream, already streaming, ends with that error as its last line."""
    topic = unique_topic(f"hole-rest-{where}")
    _holed(cluster, topic, where)
    r = v3_read(cluster, topic, 0, timeout_ms=5000)
    assert (r.status_code, r.json()["error_code"]) == (500, 50002), r.text
    assert "index" in r.json()["message"]

    c = Consumer.create(cluster.agents, f"g-{topic}", **{"auto.offset.reset": "earliest"})
    c.assign(topic, 0)
    r = c.fetch_raw(5000)
    assert (r.status_code, r.json()["error_code"]) == (500, 50002), r.text

    url = (
        f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/consumer-groups/g-{topic}-s/records"
    )
    with httpx.stream("GET", url, params={"topics": topic, "keepalive_ms": 500}, timeout=30) as s:
        assert s.status_code == 200
        lines = [orjson.loads(line) for line in s.iter_lines() if line]
    assert lines[-1]["error_code"] == 50002, lines
    assert all("keepalive" not in x for x in lines)


@pytest.mark.parametrize("where", ["middle", "end"])
def test_a_kafka_consumer_gets_an_error_on_a_hole_instead_of_waiting(
    cluster: Cluster, unique_topic: Callable[[str], str], where: str
) -> None:
    """The same hole through the Kafka door: confluent-kafka's consumer reports the
    partition's error (UNKNOWN_SERVER_ERROR) instead of waiting for records forever."""
    topic = unique_topic(f"hole-kafka-{where}")
    _holed(cluster, topic, where)
    c = kafka_consumer(cluster)
    c.assign([TopicPartition(topic, 0, 0)])
    errors = []
    deadline = time.monotonic() + 20
    try:
        while not errors and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is not None:
                errors.append(m.error())
    finally:
        c.close()
    assert errors, "the consumer waited without an error"
    assert errors[0].code() == KafkaError.UNKNOWN, errors[0]
