"""SASL on the Kafka listener with real clients: PLAIN and SCRAM-SHA-256/512 with
confluent-kafka (security.protocol=SASL_PLAINTEXT), kafka-python and aiokafka; wrong
passwords, unknown users and clients without SASL are refused; nothing is stored for them."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kafka.errors import KafkaError as KafkaPythonError

from tests.integration.test_security_processes import start_secured_serve
from tests.procs import Proc

PASSWORD = "kafka-user-password-1"
TOPIC = "sasl-topic"


@dataclass
class Listener:
    rest: str
    bootstrap: str
    proc: Proc


def basic() -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"kuser:{PASSWORD}".encode()).decode()}


@pytest.fixture(scope="module")
def listener(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listener]:
    tmp: Path = tmp_path_factory.mktemp("sasl")
    # librdkafka retries a failed login every few ms: no throttling in this module
    # (tests/unit/test_security_rest.py covers it).
    proc, port, kport = start_secured_serve(
        tmp, "kuser", PASSWORD, {"LAKELOG_AUTH_MAX_FAILURES": "1000000"}
    )
    try:
        rest = f"http://127.0.0.1:{port}"
        cid = httpx.get(f"{rest}/v3/clusters", headers=basic()).json()["data"][0]["cluster_id"]
        r = httpx.post(
            f"{rest}/v3/clusters/{cid}/topics",
            json={"topic_name": TOPIC, "partitions_count": 1},
            headers=basic(),
        )
        assert r.status_code == 201, r.text
        yield Listener(rest, f"127.0.0.1:{kport}", proc)
    finally:
        proc.stop()
    assert PASSWORD not in proc.output()


def end_offset(listener: Listener) -> int:
    r = httpx.get(f"{listener.rest}/topics/{TOPIC}/partitions/0/offsets", headers=basic())
    return int(r.json()["end_offset"])


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_kafka_sasl(listener: Listener, mechanism: str) -> None:
    conf = {
        "bootstrap.servers": listener.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": "kuser",
        "sasl.password": PASSWORD,
    }
    p = Producer(conf)
    reports: list[Any] = []
    p.produce(
        TOPIC, value=mechanism.encode(), on_delivery=lambda e, m: reports.append((e, m.offset()))
    )
    assert p.flush(30) == 0
    assert reports[0][0] is None
    offset = reports[0][1]
    c = Consumer({**conf, "group.id": f"g-{mechanism}", "enable.auto.commit": False})
    c.assign([TopicPartition(TOPIC, 0, offset)])
    try:
        deadline = time.monotonic() + 30
        m = None
        while m is None and time.monotonic() < deadline:
            m = c.poll(0.5)
        assert m is not None and m.error() is None and m.value() == mechanism.encode()
    finally:
        c.close()


@pytest.mark.parametrize(
    ("mechanism", "user", "password"),
    [
        ("PLAIN", "kuser", "wrong-password"),
        ("SCRAM-SHA-256", "kuser", "wrong-password"),
        ("SCRAM-SHA-512", "nobody", PASSWORD),
    ],
)
def test_confluent_kafka_bad_credentials_store_nothing(
    listener: Listener, mechanism: str, user: str, password: str
) -> None:
    before = end_offset(listener)
    errors: list[Any] = []
    p = Producer(
        {
            "bootstrap.servers": listener.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "message.timeout.ms": 3000,
            "error_cb": errors.append,
        }
    )
    p.produce(TOPIC, value=b"must not land")
    p.flush(10)
    assert any("Authentication failed" in str(e) or "SASL" in str(e) for e in errors), errors
    assert end_offset(listener) == before


def test_client_without_sasl_is_refused(listener: Listener) -> None:
    before = end_offset(listener)
    p = Producer({"bootstrap.servers": listener.bootstrap, "message.timeout.ms": 3000})
    delivered: list[Any] = []
    p.produce(TOPIC, value=b"plaintext", on_delivery=lambda e, m: delivered.append(e))
    p.flush(10)
    assert delivered and delivered[0] is not None
    assert end_offset(listener) == before
    with pytest.raises(KafkaException):
        Consumer({"bootstrap.servers": listener.bootstrap, "group.id": "x"}).list_topics(timeout=3)


def python_client_sasl(listener: Listener, mechanism: str) -> dict[str, Any]:
    """kafka-python's and aiokafka's settings (the same names) to log in as kuser."""
    return {
        "bootstrap_servers": listener.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "kuser",
        "sasl_plain_password": PASSWORD,
    }


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_sasl(listener: Listener, mechanism: str) -> None:
    conf = python_client_sasl(listener, mechanism)
    p = KafkaProducer(**conf, enable_idempotence=False)
    meta = p.send(TOPIC, b"kp-" + mechanism.encode()).get(timeout=30)
    p.close()
    c = KafkaConsumer(**conf, enable_auto_commit=False, consumer_timeout_ms=10000)
    tp = KTopicPartition(TOPIC, 0)
    c.assign([tp])
    c.seek(tp, meta.offset)
    got = next(iter(c))
    c.close()
    assert got.value == b"kp-" + mechanism.encode()
    # A wrong password: api_version given, so the constructor connects to nothing (a
    # producer failing in its constructor would leave its sockets to the collector).
    bad = KafkaProducer(
        **{**conf, "sasl_plain_password": "wrong-password"},
        enable_idempotence=False,
        api_version=(2, 5),
        max_block_ms=3000,
    )
    try:
        with pytest.raises(KafkaPythonError):
            bad.send(TOPIC, b"must not land").get(timeout=10)
    finally:
        bad.close(timeout=5)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_aiokafka_sasl(listener: Listener, mechanism: str) -> None:
    conf = python_client_sasl(listener, mechanism)

    async def run() -> bytes:
        prod = AIOKafkaProducer(**conf)
        await prod.start()
        try:
            meta = await prod.send_and_wait(TOPIC, b"aio-" + mechanism.encode(), partition=0)
        finally:
            await prod.stop()
        cons = AIOKafkaConsumer(**conf, enable_auto_commit=False)
        await cons.start()
        try:
            from aiokafka import TopicPartition as ATP

            tp = ATP(TOPIC, 0)
            cons.assign([tp])
            cons.seek(tp, meta.offset)
            msg = await asyncio.wait_for(cons.getone(), 30)
            return bytes(msg.value)
        finally:
            await cons.stop()

    assert asyncio.run(run()) == b"aio-" + mechanism.encode()
