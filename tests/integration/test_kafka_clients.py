"""Real Kafka clients against a coordinator and two agent processes (the Kafka door).

Producers talk to one agent and consumers to the other, so everything read went
through the shared batcher, the coordinator commit and the object store.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.serial import entity_reader

from tests.integration.conftest import Cluster
from tests.integration.test_consumer_api import BINARY, b64
from tests.integration.test_consumer_api import Consumer as RestConsumer
from tests.kafka_wire import request_frame
from tests.procs import lakelog_cmd

pytestmark = pytest.mark.integration

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def create_topic(cluster: Cluster, name: str, partitions: int = 3, **configs: str) -> None:
    body: dict[str, Any] = {"topic_name": name, "partitions_count": partitions}
    if configs:
        body["configs"] = [{"name": k, "value": v} for k, v in configs.items()]
    r = httpx.post(f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics", json=body)
    assert r.status_code == 201, r.text


def plain_consumer(bootstrap: str, config: dict[str, Any] | None = None) -> Consumer:
    """A confluent-kafka consumer to assign() partitions to: it joins no group and
    commits nothing; ``config`` adds to its settings or overrides them."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
            **(config or {}),
        }
    )


def poll_records(
    c: Consumer, enough: Callable[[list[Any]], bool], timeout_s: float = 30, poll_s: float = 0.5
) -> list[Any]:
    """The records ``c`` polls until ``enough`` of them (or ``timeout_s`` has passed);
    an error event fails the test."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while not enough(got) and time.monotonic() < deadline:
        m = c.poll(poll_s)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m)
    return got


def consume_all(bootstrap: str, topic: str, partitions: int, want: int) -> list[Any]:
    """Every record of ``topic`` from offset 0 with confluent-kafka (assign, no group)."""
    c = plain_consumer(bootstrap)
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    try:
        return poll_records(c, lambda got: len(got) >= want)
    finally:
        c.close()


def produce_and_read_back(
    p: Producer, bootstrap: str, topic: str, partitions: int, records: list[dict[str, Any]]
) -> list[Any]:
    """Each of ``records`` (produce()'s keyword arguments) through ``p``, every one
    acknowledged, then read back from ``bootstrap``: each at the offset it was acked at,
    nothing else, each partition's offsets contiguous from 0. Returns what was read."""
    reports: list[tuple[Any, int, int]] = []
    for r in records:
        p.produce(
            topic, **r, on_delivery=lambda e, m: reports.append((e, m.partition(), m.offset()))
        )
    assert p.flush(30) == 0
    assert all(e is None for e, _, _ in reports), reports[:3]
    got = consume_all(bootstrap, topic, partitions, len(records))
    assert sorted(m.value() for m in got) == sorted(r["value"] for r in records)
    acked = {(part, off) for _, part, off in reports}
    assert {(m.partition(), m.offset()) for m in got} == acked
    for part in range(partitions):
        offsets = sorted(o for pa, o in acked if pa == part)
        assert offsets == list(range(len(offsets)))  # contiguous from 0
    return got


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_produce_and_consume_every_codec(
    kafka_cluster: Cluster, unique_topic: Any, codec: str
) -> None:
    """librdkafka's batches of each codec are stored as they came and read back whole."""
    topic = unique_topic(f"kc-{codec}")
    create_topic(kafka_cluster, topic)
    p = Producer(
        {
            "bootstrap.servers": kafka_cluster.kafka[0],
            "compression.type": codec,
            "acks": "all",
            "linger.ms": 20,
            "partitioner": "murmur2_random",
        }
    )
    records = [
        {
            "key": b"key-%d" % (i % 17),
            "value": b"value-%d-" % i + b"x" * 200,
            "headers": [("h", b"%d" % i)],
        }
        for i in range(300)
    ]
    got = produce_and_read_back(p, kafka_cluster.kafka[1], topic, 3, records)
    m = got[0]
    assert dict(m.headers() or [])["h"] == m.value().split(b"-")[1]


def test_kafka_python_and_aiokafka_clients(kafka_cluster: Cluster, unique_topic: Any) -> None:
    """kafka-python (none, gzip, lz4) and aiokafka (lz4) produce; each reads the other's."""
    topic = unique_topic("kp")
    create_topic(kafka_cluster, topic, 2)
    sent = []
    for codec in (None, "gzip", "lz4"):
        p = KafkaProducer(
            bootstrap_servers=kafka_cluster.kafka[0],
            compression_type=codec,
            acks="all",
            enable_idempotence=False,
        )
        futures = [
            p.send(topic, key=b"k", value=b"%s-%d" % (str(codec).encode(), i)) for i in range(50)
        ]
        p.flush()
        sent += [f.get(10) for f in futures]
        p.close()

    async def aio() -> list[bytes]:
        prod = AIOKafkaProducer(bootstrap_servers=kafka_cluster.kafka[1], compression_type="lz4")
        await prod.start()
        try:
            batch = [prod.send(topic, b"aio-%d" % i, partition=1) for i in range(50)]
            await asyncio.gather(*[await f for f in batch])
        finally:
            await prod.stop()
        cons = AIOKafkaConsumer(
            bootstrap_servers=kafka_cluster.kafka[0], auto_offset_reset="earliest"
        )
        await cons.start()
        try:
            cons.assign([KTopicPartition(topic, 0), KTopicPartition(topic, 1)])
            values: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(values) < 200 and time.monotonic() < deadline:
                for records in (await cons.getmany(timeout_ms=500)).values():
                    values += [r.value for r in records]
            return values
        finally:
            await cons.stop()

    values = asyncio.run(aio())
    assert len(values) == 200 and len(set(values)) == 200
    c = KafkaConsumer(
        bootstrap_servers=kafka_cluster.kafka[1],
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    c.assign([KTopicPartition(topic, 1)])
    assert sorted(m.value for m in c)[:3] == [b"aio-0", b"aio-1", b"aio-10"]
    c.close()


def test_rest_produced_read_by_kafka_and_kafka_produced_read_by_rest(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """One log for both doors: REST records and Kafka batches interleave in one partition."""
    topic = unique_topic("mixed")
    create_topic(kafka_cluster, topic, 1)
    rest = httpx.post(
        f"{kafka_cluster.agents[1]}/topics/{topic}",
        json={"records": [{"value": b64(b"rest-%d" % i)} for i in range(20)]},
        headers={"content-type": BINARY},
    )
    assert rest.status_code == 200, rest.text
    p = Producer({"bootstrap.servers": kafka_cluster.kafka[0], "compression.type": "snappy"})
    for i in range(20):
        p.produce(topic, value=b"kafka-%d" % i, partition=0)
    assert p.flush(30) == 0
    got = consume_all(kafka_cluster.kafka[1], topic, 1, 40)
    assert [m.offset() for m in got] == list(range(40))
    assert {m.value() for m in got} == {b"rest-%d" % i for i in range(20)} | {
        b"kafka-%d" % i for i in range(20)
    }
    rc = RestConsumer.create(
        kafka_cluster.agents, unique_topic("g"), **{"auto.offset.reset": "earliest"}
    )
    rc.assign(topic, 0)
    records: list[Any] = []
    deadline = time.monotonic() + 20
    while len(records) < 40 and time.monotonic() < deadline:
        records.extend(rc.fetch(500))
    rc.delete()
    assert [r["offset"] for r in records] == list(range(40))


def test_partly_tiered_topic_read_from_zero(kafka_cluster: Cluster, unique_topic: Any) -> None:
    """Tier (Parquet) rows come back as batches, then the untiered chunks follow."""
    topic = unique_topic("tiered")
    create_topic(kafka_cluster, topic, 1)
    p = Producer({"bootstrap.servers": kafka_cluster.kafka[0], "linger.ms": 5})
    for i in range(100):
        p.produce(topic, key=b"k%d" % i, value=b"old-%d" % i, partition=0)
    assert p.flush(30) == 0
    c = kafka_cluster
    out = subprocess.run(
        lakelog_cmd(
            "janitor",
            "tier",
            "--db",
            f"sqlite:///{c.tmp / 'meta.db'}",
            "--store",
            c.store_url,
            "--store-endpoint",
            c.store_endpoint,
            "--topic",
            topic,
            "--tier-age-s",
            "0",
        ),
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode()
    assert b'"tiered_chunks": 0' not in out.stdout, out.stdout
    for i in range(50):
        p.produce(topic, key=b"k%d" % i, value=b"new-%d" % i, partition=0)
    assert p.flush(30) == 0
    got = consume_all(c.kafka[1], topic, 1, 150)
    assert [m.offset() for m in got] == list(range(150))
    assert [m.value() for m in got[:2]] == [b"old-0", b"old-1"]
    assert got[100].value() == b"new-0" and got[5].key() == b"k5"


def test_fetch_larger_than_max_bytes_and_many_partitions_in_one_produce(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    """A produce request spanning 64 partitions; a catch-up fetch of several MiB read
    through a consumer whose fetch.max.bytes is far smaller (many Fetch rounds)."""
    topic = unique_topic("big")
    create_topic(kafka_cluster, topic, 64)
    p = Producer(
        {"bootstrap.servers": kafka_cluster.kafka[0], "linger.ms": 200, "batch.size": 1 << 20}
    )
    value = b"v" * 10_000
    for i in range(640):
        p.produce(topic, value=value + b"%d" % i, partition=i % 64)
    assert p.flush(30) == 0
    c = Consumer(
        {
            "bootstrap.servers": kafka_cluster.kafka[1],
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.max.bytes": 100_000,
            "message.max.bytes": 100_000,
            "max.partition.fetch.bytes": 50_000,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(64)])
    got = 0
    deadline = time.monotonic() + 60
    while got < 640 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got += 1
    c.close()
    assert got == 640


# -- bad input, with the exact Kafka error codes ----------------------------------------


def kafka_call(addr: str, body: Any) -> Any:
    """One request (a kio request body) over a plain socket; returns the decoded response."""
    from kio.index import load_response_from_request

    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request_frame(body, 1, "test"))
        data = _read_frame(s)
    resp_cls: Any = load_response_from_request(type(body))
    _, used = entity_reader(resp_cls.__header_schema__)(data, 0)
    resp, _ = entity_reader(resp_cls)(data, used)
    return resp


def _raw_produce(addr: str, topic: str, partition: int, records: bytes) -> Any:
    """One Produce v9 (acks=all) over a plain socket; returns the partition's answer."""
    body = ProduceRequest(
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            TopicProduceData(
                name=topic, partition_data=(PartitionProduceData(index=partition, records=records),)
            ),
        ),
    )
    return kafka_call(addr, body).responses[0].partition_responses[0]


def _read_frame(s: socket.socket) -> bytes:
    size = struct.unpack(">i", _read_exact(s, 4))[0]
    return _read_exact(s, size)


def _read_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _batch(n: int, size: int = 10) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 30)
    for i in range(n):
        b.append(i, 1000, None, b"x" * size, [])
    return bytes(b.build())


def watermarks(cluster: Cluster, topic: str, partition: int = 0) -> tuple[int, int]:
    """(log-start, high watermark) through ListOffsets."""
    c = Consumer({"bootstrap.servers": cluster.kafka[-1], "group.id": "unused"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
    finally:
        c.close()
    return int(low), int(high)


def test_produce_errors_store_nothing(kafka_cluster: Cluster, unique_topic: Any) -> None:
    """CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION and MESSAGE_TOO_LARGE, each with
    nothing stored; a good batch after them lands at offset 0."""
    topic = unique_topic("bad")
    create_topic(kafka_cluster, topic, 1, **{"max.message.bytes": "2000"})
    addr = kafka_cluster.kafka[0]
    bad = bytearray(_batch(3))
    bad[-1] ^= 0xFF
    assert _raw_produce(addr, topic, 0, bytes(bad)).error_code == ErrorCode.corrupt_message
    assert (
        _raw_produce(addr, topic, 7, _batch(1)).error_code == ErrorCode.unknown_topic_or_partition
    )
    assert (
        _raw_produce(addr, unique_topic("nope"), 0, _batch(1)).error_code
        == ErrorCode.unknown_topic_or_partition
    )
    too_big = _raw_produce(addr, topic, 0, _batch(1, 5000))
    assert too_big.error_code == ErrorCode.message_too_large
    good = _raw_produce(addr, topic, 0, _batch(2))
    assert (good.error_code, good.base_offset) == (ErrorCode.none, 0)
    assert watermarks(kafka_cluster, topic) == (0, 2)


def _keyed_batch(*keys: bytes | None) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 30)
    for i, key in enumerate(keys):
        b.append(i, 1000, key, b"v%d" % i, [])
    return bytes(b.build())


KEYLESS = "Compacted topic cannot accept message without key in topic partition"


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_a_compacted_topic_refuses_keyless_records_at_both_doors(
    kafka_cluster: Cluster, unique_topic: Any, policy: str
) -> None:
    """As Kafka: a record without a key on a compacted topic is INVALID_RECORD on the wire
    (its whole batch refused: a raw Produce and librdkafka) and 400 40002 on REST (v2
    and v3), naming the topic partition; nothing of it is stored, keyed records are."""
    topic = unique_topic("compacted")
    create_topic(kafka_cluster, topic, 1, **{"cleanup.policy": policy})
    addr, rest = kafka_cluster.kafka[0], kafka_cluster.agents[1]
    wire = [_raw_produce(addr, topic, 0, _keyed_batch(*keys)) for keys in ([None], [b"k", None])]
    p = Producer({"bootstrap.servers": addr, "retries": 0})
    reports: list[Any] = []
    p.produce(topic, value=b"no key", partition=0, on_delivery=lambda err, _: reports.append(err))
    assert p.flush(30) == 0
    v2 = httpx.post(
        f"{rest}/topics/{topic}",
        json={"records": [{"key": b64(b"k"), "value": b64(b"a")}, {"value": b64(b"b")}]},
        headers={"content-type": BINARY},
    )
    v3_url = f"{rest}/v3/clusters/{kafka_cluster.cluster_id}/topics/{topic}/records"
    v3 = httpx.post(v3_url, json={"value": {"type": "STRING", "data": "b"}})
    stored_before = watermarks(kafka_cluster, topic)
    keyed = _raw_produce(addr, topic, 0, _keyed_batch(b"k1", b"k2"))
    v3_keyed = httpx.post(
        v3_url,
        json={"key": {"type": "STRING", "data": "k"}, "value": {"type": "STRING", "data": "c"}},
    )

    assert [w.error_code for w in wire] == [ErrorCode.invalid_record] * 2, wire
    assert all(w.error_message.startswith(f"{KEYLESS} {topic}-0.") for w in wire), wire
    assert [e.code() for e in reports] == [KafkaError.INVALID_RECORD], reports
    assert v2.status_code == 400, v2.text
    assert v2.json() == {"error_code": 40002, "message": f"{KEYLESS} {topic}-0."}
    assert v3.status_code == 200, v3.text  # v3 answers each record in its report
    assert v3.json() == {"error_code": 40002, "message": f"{KEYLESS} {topic}-0."}
    assert stored_before == (0, 0)
    assert (keyed.error_code, keyed.base_offset) == (ErrorCode.none, 0)
    assert (v3_keyed.json()["error_code"], v3_keyed.json()["offset"]) == (200, 2), v3_keyed.text


def test_fetch_below_log_start_is_offset_out_of_range(
    kafka_cluster: Cluster, unique_topic: Any
) -> None:
    topic = unique_topic("oor")
    create_topic(kafka_cluster, topic, 1)
    _raw_produce(kafka_cluster.kafka[0], topic, 0, _batch(5))
    c = plain_consumer(kafka_cluster.kafka[1], {"auto.offset.reset": "error"})
    c.assign([TopicPartition(topic, 0, 10)])
    err = None
    deadline = time.monotonic() + 20
    while err is None and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is not None:
            err = m.error()
    c.close()
    assert err is not None and err.code() == KafkaError._AUTO_OFFSET_RESET, err


def test_broken_connections_leave_others_alone(kafka_cluster: Cluster) -> None:
    """An unknown API key, an oversized frame and garbage each close their own connection;
    ApiVersions at an unknown version answers UNSUPPORTED_VERSION (35) with our versions."""
    host, port = kafka_cluster.kafka[0].split(":")
    keep = socket.create_connection((host, int(port)), timeout=10)

    def closed_after(data: bytes) -> bool:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(data)
            try:
                return s.recv(1) == b""
            except ConnectionResetError:
                return True

    assert closed_after(struct.pack(">ihhi", 10, 999, 0, 1) + b"\0\0")
    assert closed_after(struct.pack(">i", 200 * 1024 * 1024))
    assert closed_after(struct.pack(">i", 6) + b"\0\0\0\0\0\0")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">ihhi", 10, 18, 99, 77) + b"\xff\xff")
        frame = _read_frame(s)
    correlation_id, error = struct.unpack_from(">ih", frame)
    assert (correlation_id, error) == (77, ErrorCode.unsupported_version)
    # The connection opened before all this still works.
    keep.sendall(struct.pack(">ihhi", 10, 18, 0, 5) + b"\xff\xff")
    frame = _read_frame(keep)
    assert struct.unpack_from(">ih", frame) == (5, 0)
    keep.close()


def test_topic_deleted_mid_flush_stores_nothing(cluster_factory: Any, unique_topic: Any) -> None:
    """Race: a produce waits in a long linger while its topic is deleted; the flush's
    commit fails, the producer gets UNKNOWN_TOPIC_OR_PARTITION, and the topic recreated
    under the same name is empty."""
    import threading

    cluster = cluster_factory(kafka=True, agents=1, agent_env={"LAKELOG_LINGER_MS": "1500"})
    topic = unique_topic("gone")
    create_topic(cluster, topic, 1)
    answers: list[Any] = []
    t = threading.Thread(
        target=lambda: answers.append(_raw_produce(cluster.kafka[0], topic, 0, _batch(3)))
    )
    t.start()
    time.sleep(0.5)  # the batch is buffered, its flush not yet due
    r = httpx.delete(f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics/{topic}")
    assert r.status_code == 204, r.text
    t.join(30)
    assert answers and answers[0].error_code == ErrorCode.unknown_topic_or_partition
    create_topic(cluster, topic, 1)
    assert watermarks(cluster, topic) == (0, 0)
