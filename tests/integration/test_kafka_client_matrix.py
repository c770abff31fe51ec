"""Kafka clients of today against ``lakelog serve`` and against a two-agent cluster.

Clients: confluent-kafka (librdkafka 2.16; the classic group protocol and KIP-848's
``group.protocol=consumer``), kafka-python, aiokafka, kcat (Debian's, librdkafka 2.0),
kafkajs 2.2.4 and @platformatic/kafka 1.35 (a client that speaks only Kafka 3.x+ versions:
Fetch with topic ids, OffsetFetch of several groups; it also runs the consumer protocol).
The Node clients are installed from ``tests/node/package-lock.json`` with ``npm ci`` on
first use, and driven by ``tests/node/clients.mjs``.

Each client, on each target: metadata; idempotent produce with headers in every codec it
has; a group of two reading everything exactly once, its committed offsets, and a
restarted member reading nothing old (every client on the cluster, confluent-kafka's two
protocols on ``serve``: ``GROUP_CASES``); DescribeConfigs of a topic and a broker equal to
REST v3's view (the issue's kafkajs defect). And for the door itself: Metadata names
the address each connection reached (the issue's ``vm:9092``); InitProducerId without a
transactional id always gives a new producer id (the issue's platformatic defect); a
topic deleted and created again has a new id everywhere (Metadata, Fetch, DeleteTopics,
DescribeTopicPartitions); OffsetFetch of several groups; DescribeTopicPartitions' pages.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpConfigResourceType
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode

from tests.integration.conftest import Cluster, start_cluster
from tests.integration.test_kafka_clients import kafka_call
from tests.procs import Proc, free_port, lakelog_cmd, wait_http

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / "node"
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
#: Consumer-protocol members heartbeat this often here (Kafka's default is 5 s): each
#: heartbeat moves a rebalance one step, and the tests wait for several.
HEARTBEAT_MS = "500"
WAIT_S = 90.0


# -- the two targets ---------------------------------------------------------------------


@dataclass
class Target:
    """A running lakelog: its Kafka bootstrap addresses and its REST base URL."""

    name: str
    kafka: list[str]
    rest: str
    cluster_id: str
    logs: Callable[[], str]

    @property
    def bootstrap(self) -> str:
        return ",".join(self.kafka)

    def v3(self, path: str) -> str:
        return f"{self.rest}/v3/clusters/{self.cluster_id}{path}"

    def create_topic(self, partitions: int, name: str | None = None) -> str:
        topic = name or f"m-{uuid.uuid4().hex[:10]}"
        r = httpx.post(
            self.v3("/topics"), json={"topic_name": topic, "partitions_count": partitions}
        )
        assert r.status_code == 201, r.text
        return topic

    def group(self, group: str) -> dict[str, Any]:
        r = httpx.get(self.v3(f"/consumer-groups/{group}"))
        return dict(r.json()) if r.status_code == 200 else {}

    def group_members(self, group: str) -> list[dict[str, Any]]:
        r = httpx.get(self.v3(f"/consumer-groups/{group}/consumers"))
        return list(r.json()["data"]) if r.status_code == 200 else []

    def lags(self, group: str) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, partition) -> (committed offset, log-end offset), by REST."""
        r = httpx.get(self.v3(f"/consumer-groups/{group}/lags"))
        assert r.status_code == 200, r.text
        return {
            (x["topic_name"], x["partition_id"]): (x["current_offset"], x["log_end_offset"])
            for x in r.json()["data"]
        }


def _serve(tmp: Path) -> tuple[Target, Proc]:
    port, kafka_port = free_port(), free_port()
    proc = Proc(
        lakelog_cmd(
            "serve",
            "--host",
            "0.0.0.0",  # every interface: Metadata must name the one each client reached
            "--allow-unauthenticated",  # this test's clients log in to nothing
            "--port",
            str(port),
            "--kafka-port",
            str(kafka_port),
            "--db",
            f"sqlite:///{tmp / 'meta.db'}",
            "--store",
            f"file://{tmp / 'data'}",
            "--log-level",
            "warning",
        ),
        tmp / "serve.log",
        env={"LAKELOG_KAFKA_GROUP_HEARTBEAT_INTERVAL_MS": HEARTBEAT_MS},
    )
    rest = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{rest}/health", timeout=60, proc=proc.popen)
    except BaseException:
        proc.stop()
        raise
    cluster_id = httpx.get(f"{rest}/v3/clusters").json()["data"][0]["cluster_id"]
    target = Target("serve", [f"127.0.0.1:{kafka_port}"], rest, cluster_id, proc.output)
    return target, proc


@pytest.fixture(scope="module", params=["serve", "cluster"])
def target(
    request: pytest.FixtureRequest, moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    """``lakelog serve`` (SQLite, file://) or a coordinator with two agents (S3 on moto)."""
    tmp = tmp_path_factory.mktemp(f"matrix-{request.param}")
    if request.param == "serve":
        t, proc = _serve(tmp)
        try:
            yield t
        finally:
            proc.stop()
        return
    cluster: Cluster = start_cluster(
        tmp,
        moto_endpoint,
        kafka=True,
        agent_env={"LAKELOG_KAFKA_GROUP_HEARTBEAT_INTERVAL_MS": HEARTBEAT_MS},
    )
    try:
        yield Target("cluster", cluster.kafka, cluster.agents[0], cluster.cluster_id, cluster.logs)
    finally:
        cluster.stop()


# -- reading back what was produced --------------------------------------------------------


def read_all(t: Target, topic: str, partitions: int, want: int) -> list[Any]:
    """Every record of ``topic`` from offset 0, through the last agent (confluent-kafka,
    assigned partitions, no group)."""
    c = Consumer(
        {
            "bootstrap.servers": t.kafka[-1],
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[Any] = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < want and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m)
        end = time.monotonic() + 1
        while time.monotonic() < end:  # anything past ``want`` is a record too many
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m)
    finally:
        c.close()
    return got


def produce_plain(t: Target, topic: str, count: int, tag: str) -> set[str]:
    p = Producer({"bootstrap.servers": t.kafka[0], "linger.ms": 5})
    for i in range(count):
        p.produce(topic, key=b"k%d" % (i % 11), value=f"{tag}-{i}".encode())
    assert p.flush(60) == 0
    return {f"{tag}-{i}" for i in range(count)}


# -- the clients ---------------------------------------------------------------------------

Record = tuple[str, int, int]  # value, partition, offset


class Client:
    """One Kafka client: produce (idempotent, headers ``h`` = the value), a group of
    members consuming until they have ``expected`` records, DescribeConfigs."""

    name = ""
    codecs: tuple[str, ...] = CODECS
    protocol = "classic"
    #: What the client reported of its last group (joins, rebalances, failed commits), if
    #: it reports anything: shown when a test fails.
    events: list[Any] = []

    def produce(self, t: Target, topic: str, codec: str, count: int, tag: str) -> None:
        raise NotImplementedError

    def consume(
        self,
        t: Target,
        topic: str,
        group: str,
        members: int,
        expected: int,
        ready: Callable[[], None],
    ) -> list[Record]:
        """Start ``members`` members, call ``ready`` once the group holds every partition,
        then read until ``expected`` records (and a moment more), commit, leave."""
        raise NotImplementedError

    def describe_configs(
        self, t: Target, topic: str, broker: str
    ) -> tuple[dict[str, str], dict[str, str]] | None:
        """{name: value} of the topic and of the broker; None: the client has no admin."""
        return None


def _describe_group(t: Target, group: str) -> Any:
    """ConsumerGroupDescribe of ``group`` through the Kafka door."""
    from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest

    request = ConsumerGroupDescribeRequest(group_ids=(group,), include_authorized_operations=False)
    return kafka_call(t.kafka[0], request).groups[0]


def group_view(t: Target, group: str, protocol: str) -> tuple[Any, int, int]:
    """(REST state, REST member count, partitions held) of ``group``.

    The view takes several requests; the state is read before and after them, and a
    group whose state moved in between shows as ``"CHANGING"``: a member joining after
    the first read would otherwise pair a Stable state with two members of which one
    still holds every partition of the generation before.

    A consumer-protocol group's holdings are read with ConsumerGroupDescribe: librdkafka's
    member ids are base64 and may hold "/", which no REST v3 consumer path can carry."""
    g = t.group(group)
    consumers = t.group_members(group) if g else []
    held = 0
    if protocol == "consumer":
        held = sum(
            len(tp.partitions)
            for m in _describe_group(t, group).members
            for tp in m.assignment.topic_partitions
        )
    for c in consumers if protocol != "consumer" else ():
        url = t.v3(f"/consumer-groups/{group}/consumers/{c['consumer_id']}/assignments")
        r = httpx.get(url)
        held += len(r.json()["data"]) if r.status_code == 200 else 0
    state = g.get("state")
    if t.group(group).get("state") != state:
        state = "CHANGING"
    return state, len(consumers), held


def wait_group_ready(
    t: Target, group: str, members: int, partitions: int, protocol: str = "classic"
) -> None:
    """Until REST shows ``members`` members of ``group``, Stable, holding all ``partitions``,
    twice in a row (a REST answer lost to the machine's load is asked again). The members
    must be polled meanwhile (on another thread): clients give up revoked partitions in
    their poll. Records produced before the group is ready are read in a generation that
    ends: a member whose commit then fails rejoins, and the group reads them again."""
    deadline = time.monotonic() + WAIT_S
    seen: Any = None
    ready = 0
    while time.monotonic() < deadline:
        try:
            seen = group_view(t, group, protocol)
        except (httpx.HTTPError, OSError) as e:
            seen = e
            continue
        ready = ready + 1 if seen == ("STABLE", members, partitions) else 0
        if ready == 2:
            return
        time.sleep(0.2)
    try:
        kafka_view: Any = _describe_group(t, group)
    except Exception as e:
        kafka_view = e
    raise AssertionError(
        f"group {group} not ready: REST {seen!r}, Kafka {kafka_view!r}\n{t.logs()[-3000:]}"
    )


@dataclass
class Members:
    """A client's members of one group: ``count`` of them, each made by ``make`` (and
    closed by its close()); ``poll`` returns the records one poll of a member gave."""

    count: int
    make: Callable[[], Any]
    poll: Callable[[Any], list[Record]]


class Settle:
    """When a group's consumption may end: 1.5 s after it first had all it expected and
    its ``ready`` had returned, time for a record read twice to show."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.until: float | None = None

    def __call__(self, got: int, ready: bool) -> bool:
        if got < self.expected or not ready:
            return False
        self.until = self.until or time.monotonic() + 1.5
        return time.monotonic() > self.until


def _threaded_consume(members: Members, expected: int, ready: Callable[[], None]) -> list[Record]:
    """Members polled in turn on this thread; ``ready`` on another once they are in."""
    consumers = [members.make() for _ in range(members.count)]
    got: list[Record] = []
    signalled = threading.Event()
    failed: list[BaseException] = []

    def signal() -> None:
        try:
            ready()
        except BaseException as e:  # raised below, on the test's thread
            failed.append(e)
        signalled.set()

    waiter = threading.Thread(target=signal, daemon=True)
    waiter.start()
    deadline = time.monotonic() + WAIT_S
    settled = Settle(expected)
    try:
        while time.monotonic() < deadline:
            for c in consumers:
                got += members.poll(c)
            if failed or settled(len(got), signalled.is_set()):
                break
    finally:
        for c in consumers:
            c.close()
        waiter.join(WAIT_S)
    if failed:
        raise failed[0]
    return got


#: kafka-python 3.0.12 throws away a join round that ends after the poll() that started
#: it returned: the next poll() sends a new JoinGroup instead of taking the finished
#: round's assignment, which rebalances the group again, round after round, while its
#: members read little or nothing. Each of its members therefore polls on its own thread
#: (as applications do), long enough for a round to end inside one poll().
POLL_MS_KAFKA_PYTHON = 5_000


def _member_threads(members: Members, expected: int, ready: Callable[[], None]) -> list[Record]:
    """Each member polled on a thread of its own; ``ready`` on another once they are in."""
    consumers = [members.make() for _ in range(members.count)]
    got: list[Record] = []
    lock = threading.Lock()
    stop = threading.Event()
    failed: list[BaseException] = []

    def run(c: Any) -> None:
        try:
            while not stop.is_set():
                records = members.poll(c)
                with lock:
                    got.extend(records)
        except BaseException as e:  # raised below, on the test's thread
            failed.append(e)

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in consumers]
    for th in threads:
        th.start()
    try:
        ready()
        deadline = time.monotonic() + WAIT_S
        settled = Settle(expected)
        while time.monotonic() < deadline and not failed:
            with lock:
                n = len(got)
            if settled(n, True):
                break
            time.sleep(0.1)
    finally:
        stop.set()
        for th in threads:
            th.join(WAIT_S)
        for c in consumers:
            c.close()
    if failed:
        raise failed[0]
    return list(got)


class Confluent(Client):
    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.name = f"confluent-kafka-{protocol}"

    def produce(self, t: Target, topic: str, codec: str, count: int, tag: str) -> None:
        p = Producer(
            {
                "bootstrap.servers": t.bootstrap,
                "enable.idempotence": True,
                "compression.type": codec,
                "linger.ms": 5,
            }
        )
        errors: list[Any] = []
        for i in range(count):
            v = f"{tag}-{i}".encode()
            p.produce(
                topic,
                key=b"k%d" % (i % 7),
                value=v,
                headers=[("h", v)],
                on_delivery=lambda e, m: errors.append(e) if e else None,
            )
        assert p.flush(60) == 0 and errors == []

    def consume(self, t, topic, group, members, expected, ready):  # type: ignore[no-untyped-def]
        conf: dict[str, Any] = {
            "bootstrap.servers": t.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
            "group.protocol": self.protocol,
        }
        if self.protocol == "classic":
            conf.update({"session.timeout.ms": 10_000, "heartbeat.interval.ms": 500})

        def make() -> Any:
            c = Consumer(dict(conf))
            c.subscribe([topic])
            return c

        def poll(c: Any) -> list[Record]:
            m = c.poll(0.1)
            if m is None or m.error() is not None:
                return []
            return [(m.value().decode(), m.partition(), m.offset())]

        return _threaded_consume(Members(members, make, poll), expected, ready)

    def describe_configs(self, t, topic, broker):  # type: ignore[no-untyped-def]
        admin = AdminClient({"bootstrap.servers": t.bootstrap})
        out = []
        for rtype, name in ((ResourceType.TOPIC, topic), (ResourceType.BROKER, broker)):
            futures = admin.describe_configs([ConfigResource(rtype, name)])
            (entries,) = [f.result(30) for f in futures.values()]
            out.append({k: e.value for k, e in entries.items()})
        return out[0], out[1]


#: kafka-python's and aiokafka's group members' settings (the same names in both).
MEMBER_SETTINGS: dict[str, Any] = {
    "auto_offset_reset": "earliest",
    "session_timeout_ms": 10_000,
    "heartbeat_interval_ms": 500,
    "fetch_max_wait_ms": 100,
    "auto_commit_interval_ms": 200,
}


class KafkaPython(Client):
    name = "kafka-python"
    # kafka-python's snappy needs python-snappy, which nothing here installs (aiokafka
    # and the others cover snappy).
    codecs = ("none", "gzip", "lz4", "zstd")

    def produce(self, t: Target, topic: str, codec: str, count: int, tag: str) -> None:
        p = KafkaProducer(
            bootstrap_servers=t.kafka,
            compression_type=None if codec == "none" else codec,
            enable_idempotence=True,
            acks="all",
        )
        futures = []
        for i in range(count):
            v = f"{tag}-{i}".encode()
            futures.append(p.send(topic, key=b"k%d" % (i % 7), value=v, headers=[("h", v)]))
        p.flush()
        for f in futures:
            f.get(30)
        p.close()

    def consume(self, t, topic, group, members, expected, ready):  # type: ignore[no-untyped-def]
        def make() -> Any:
            c = KafkaConsumer(bootstrap_servers=t.kafka, group_id=group, **MEMBER_SETTINGS)
            # A leader that joined before it knew the topic's partitions rejoins when the
            # metadata arrives, a rejoin kafka-python 3.0.12 drops if it outlasts one
            # poll(); known partitions before the first join keep that path away.
            assert c.partitions_for_topic(topic), f"no metadata for {topic}"
            c.subscribe([topic])
            return c

        def poll(c: Any) -> list[Record]:
            out: list[Record] = []
            for records in c.poll(timeout_ms=POLL_MS_KAFKA_PYTHON).values():
                out += [(r.value.decode(), r.partition, r.offset) for r in records]
            return out

        return _member_threads(Members(members, make, poll), expected, ready)

    def describe_configs(self, t, topic, broker):  # type: ignore[no-untyped-def]
        admin = KafkaAdminClient(bootstrap_servers=t.kafka)
        try:
            got = admin.describe_configs(
                [
                    KpConfigResource(KpConfigResourceType.TOPIC, topic),
                    KpConfigResource(KpConfigResourceType.BROKER, broker),
                ],
                config_filter="all",
            )
        finally:
            admin.close()
        return (
            {k: v["value"] for k, v in got["topic"][topic].items()},
            {k: v["value"] for k, v in got["broker"][broker].items()},
        )


class AioKafka(Client):
    name = "aiokafka"

    def produce(self, t: Target, topic: str, codec: str, count: int, tag: str) -> None:
        async def run() -> None:
            p = AIOKafkaProducer(
                bootstrap_servers=t.bootstrap,
                compression_type=None if codec == "none" else codec,
                enable_idempotence=True,
            )
            await p.start()
            try:
                sends = []
                for i in range(count):
                    v = f"{tag}-{i}".encode()
                    sends.append(await p.send(topic, v, key=b"k%d" % (i % 7), headers=[("h", v)]))
                await asyncio.gather(*sends)
            finally:
                await p.stop()

        asyncio.run(run())

    def consume(self, t, topic, group, members, expected, ready):  # type: ignore[no-untyped-def]
        async def run() -> list[Record]:
            consumers = [
                AIOKafkaConsumer(
                    topic, bootstrap_servers=t.bootstrap, group_id=group, **MEMBER_SETTINGS
                )
                for _ in range(members)
            ]
            for c in consumers:
                await c.start()
            waiter = asyncio.get_running_loop().run_in_executor(None, ready)
            got: list[Record] = []
            deadline = time.monotonic() + WAIT_S
            settled = Settle(expected)
            try:
                while time.monotonic() < deadline:
                    for c in consumers:
                        for records in (await c.getmany(timeout_ms=100)).values():
                            got += [(r.value.decode(), r.partition, r.offset) for r in records]
                    if settled(len(got), waiter.done()):
                        break
            finally:
                for c in consumers:
                    await c.stop()
                await waiter
            return got

        return asyncio.run(run())

    def describe_configs(self, t, topic, broker):  # type: ignore[no-untyped-def]
        async def run() -> tuple[dict[str, str], dict[str, str]]:
            admin = AIOKafkaAdminClient(bootstrap_servers=t.bootstrap)
            await admin.start()
            try:
                out = []
                for rtype, name in (
                    (AioConfigResourceType.TOPIC, topic),
                    (AioConfigResourceType.BROKER, broker),
                ):
                    (resp,) = await admin.describe_configs([AioConfigResource(rtype, name)])
                    ((*_, entries),) = [r[:5] for r in resp.resources]
                    out.append({e[0]: e[1] for e in entries})
                return out[0], out[1]
            finally:
                await admin.close()

        return asyncio.run(run())


class Kcat(Client):
    """Debian's kcat 1.7.1 (librdkafka 2.0.2): ``-P`` idempotent with a header, ``-G``
    balanced consumers (two processes)."""

    name = "kcat"

    def produce(self, t: Target, topic: str, codec: str, count: int, tag: str) -> None:
        lines = "".join(f"{tag}-{i}\n" for i in range(count))
        # -H sets one header on every message: the value's header is checked elsewhere;
        # here h carries the tag (kcat has no per-message headers from stdin).
        out = subprocess.run(
            [
                "kcat",
                "-P",
                "-b",
                t.bootstrap,
                "-t",
                topic,
                "-z",
                codec,
                "-H",
                f"h={tag}",
                "-X",
                "enable.idempotence=true",
                "-X",
                "partitioner=murmur2_random",
            ],
            input=lines.encode(),
            capture_output=True,
            timeout=WAIT_S,
        )
        assert out.returncode == 0, out.stderr.decode()

    def consume(self, t, topic, group, members, expected, ready):  # type: ignore[no-untyped-def]
        procs = [
            subprocess.Popen(
                [
                    "kcat",
                    "-u",  # unbuffered: each record as it comes
                    "-b",
                    t.bootstrap,
                    "-G",
                    group,
                    "-f",
                    "%s %p %o\n",
                    "-X",
                    "auto.offset.reset=earliest",
                    "-X",
                    "fetch.wait.max.ms=100",
                    "-X",
                    "auto.commit.interval.ms=200",
                    "-X",
                    "session.timeout.ms=10000",
                    "-X",
                    "heartbeat.interval.ms=500",
                    topic,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(members)
        ]
        got: list[Record] = []
        lock = threading.Lock()

        def read(p: subprocess.Popen[bytes]) -> None:
            assert p.stdout is not None
            for line in p.stdout:
                value, part, off = line.decode().split()
                with lock:
                    got.append((value, int(part), int(off)))

        readers = [threading.Thread(target=read, args=(p,), daemon=True) for p in procs]
        for r in readers:
            r.start()
        ready()
        deadline = time.monotonic() + WAIT_S
        while len(got) < expected and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)
        for p in procs:
            p.terminate()  # kcat commits what it read and leaves the group
        for p in procs:
            p.wait(30)
        for r in readers:
            r.join(10)
        for p in procs:
            assert p.stdout is not None
            p.stdout.close()
        return got


class Node(Client):
    """kafkajs or @platformatic/kafka through ``tests/node/clients.mjs``."""

    def __init__(self, client: str, protocol: str = "classic") -> None:
        self.client, self.protocol = client, protocol
        self.name = client if protocol == "classic" else f"{client}-{protocol}"
        # kafkajs has gzip only (its snappy, lz4 and zstd codecs are separate packages);
        # @platformatic/kafka's zstd is Node's zlib's, which Node 20 lacks (>= 22.15).
        self.codecs = ("none", "gzip") if client == "kafkajs" else CODECS[:-1]

    def run(self, t: Target, **args: Any) -> dict[str, Any]:
        out = subprocess.run(
            [
                node(),
                "clients.mjs",
                json.dumps({"client": self.client, "bootstrap": t.kafka, **args}),
            ],
            cwd=NODE_DIR,
            capture_output=True,
            timeout=WAIT_S * 2,
        )
        result = json.loads(out.stdout.decode().strip().splitlines()[-1])
        assert "error" not in result, result["error"]
        return dict(result)

    def produce(self, t: Target, topic: str, codec: str, count: int, tag: str) -> None:
        self.run(t, op="produce", topic=topic, codec=codec, idempotent=True, count=count, tag=tag)

    def consume(self, t, topic, group, members, expected, ready):  # type: ignore[no-untyped-def]
        box: dict[str, Any] = {}
        worker = threading.Thread(
            target=lambda: box.update(
                self.run(
                    t,
                    op="consume",
                    topic=topic,
                    group=group,
                    members=members,
                    expected=expected,
                    protocol=self.protocol,
                    timeoutMs=int(WAIT_S * 1000),
                    settleMs=1500,
                )
            )
        )
        worker.start()
        ready()
        worker.join(WAIT_S * 2)
        self.events = box.get("events", [])
        return [(v, p, o) for v, p, o, _ in box["records"]]

    def describe_configs(self, t, topic, broker):  # type: ignore[no-untyped-def]
        got = self.run(t, op="configs", topic=topic, broker=broker)
        return (
            {k: v for k, (v, _) in got["topic"].items()},
            {k: v for k, (v, _) in got["broker"].items()},
        )


CLIENTS: list[Client] = [
    Confluent("classic"),
    Confluent("consumer"),
    KafkaPython(),
    AioKafka(),
    Kcat(),
    Node("kafkajs"),
    Node("platformatic"),
    Node("platformatic", "consumer"),
]


def node() -> str:
    """The node binary, with ``tests/node``'s packages installed (``npm ci``, once)."""
    exe = shutil.which("node")
    npm = shutil.which("npm")
    assert exe and npm, "node and npm are needed (Node >= 20.19): .ci/run installs them"
    if not (NODE_DIR / "node_modules" / "@platformatic" / "kafka").is_dir():
        with _NPM_LOCK:
            if not (NODE_DIR / "node_modules" / "@platformatic" / "kafka").is_dir():
                out = subprocess.run(
                    [npm, "ci", "--no-audit", "--no-fund"],
                    cwd=NODE_DIR,
                    capture_output=True,
                    timeout=600,
                )
                assert out.returncode == 0, out.stderr.decode()
    return exe


_NPM_LOCK = threading.Lock()


#: One entry per producer (the consumer-protocol entries share their client's producer).
PRODUCERS = [c for c in CLIENTS if c.protocol == "classic"]
#: The clients with an admin API (kcat has none).
ADMINS = [c for c in PRODUCERS if not isinstance(c, Kcat)]


def _ready(c: Client) -> Client:
    if isinstance(c, Kcat):
        assert shutil.which("kcat"), "kcat is needed: apt-get install kcat (.ci/run does)"
    if isinstance(c, Node):
        node()
    return c


@pytest.fixture(params=CLIENTS, ids=lambda c: c.name)
def client(request: pytest.FixtureRequest) -> Client:
    """Every client, each of its group protocols."""
    return _ready(request.param)


@pytest.fixture(params=PRODUCERS, ids=lambda c: c.name)
def producer(request: pytest.FixtureRequest) -> Client:
    return _ready(request.param)


@pytest.fixture(params=ADMINS, ids=lambda c: c.name)
def admin(request: pytest.FixtureRequest) -> Client:
    return _ready(request.param)


# -- every client, on each target ----------------------------------------------------------


def test_produce_idempotent_in_every_codec_with_headers(target: Target, producer: Client) -> None:
    """Idempotent producers' batches in each codec the client has are stored as sent and
    read back whole, headers included, nothing twice."""
    client = producer
    topic = target.create_topic(3)
    sent: set[str] = set()
    for codec in client.codecs:
        tag = f"{client.name}-{codec}"
        client.produce(target, topic, codec, 40, tag)
        sent |= {f"{tag}-{i}" for i in range(40)}
    got = read_all(target, topic, 3, len(sent))
    values = [m.value().decode() for m in got]
    assert sorted(values) == sorted(sent)  # all there, none twice
    for m in got:
        headers = dict(m.headers() or [])
        expected = m.value().decode()
        if isinstance(client, Kcat):
            expected = expected.rsplit("-", 1)[0]  # kcat: one header for all, the tag
        assert headers.get("h") == expected.encode(), (m.value(), headers)
    for p in range(3):
        offsets = sorted(m.offset() for m in got if m.partition() == p)
        assert offsets == list(range(len(offsets)))


#: Every client's group runs on the two-agent cluster (its members on different agents);
#: on ``lakelog serve``, confluent-kafka's two group protocols. The group code is the same
#: (``coordinator.groups.kafka``) on both targets, and each of these runs takes 10-30 s.
GROUP_CASES = [pytest.param("cluster", c, id=f"cluster-{c.name}") for c in CLIENTS] + [
    pytest.param("serve", c, id=f"serve-{c.name}") for c in CLIENTS if isinstance(c, Confluent)
]


@pytest.mark.parametrize(("target", "client"), GROUP_CASES, indirect=True)
def test_group_of_two_reads_everything_once_commits_and_restarts_reading_nothing_old(
    target: Target, client: Client
) -> None:
    """Two members of one group (the client's protocol) read every record exactly once;
    the group's committed offsets are the log ends; a member started afterwards in the
    same group reads only what was produced since."""
    topic = target.create_topic(4)
    group = f"g-{client.name}-{uuid.uuid4().hex[:6]}"
    sent: set[str] = set()

    def produce_first() -> None:
        wait_group_ready(target, group, 2, 4, client.protocol)
        sent.update(produce_plain(target, topic, 200, "first"))

    got = client.consume(target, topic, group, 2, 200, produce_first)
    assert sorted(v for v, _, _ in got) == sorted(sent), f"{client.events}\n{target.logs()[-3000:]}"
    assert len({(p, o) for _, p, o in got}) == len(got) == 200  # exactly once
    deadline = time.monotonic() + WAIT_S
    every = {(topic, p) for p in range(4)}
    lags = target.lags(group)
    while (set(lags) != every or any(c != end for c, end in lags.values())) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)  # a commit on close may still be on its way
        lags = target.lags(group)
    assert set(lags) == every, target.logs()[-3000:]
    assert all(c == end for c, end in lags.values()), lags
    assert sum(end for _, end in lags.values()) == 200
    later: set[str] = set()

    def produce_more() -> None:
        wait_group_ready(target, group, 1, 4, client.protocol)
        later.update(produce_plain(target, topic, 30, "later"))

    again = client.consume(target, topic, group, 1, 30, produce_more)
    assert sorted(v for v, _, _ in again) == sorted(later)


def test_describe_configs_of_topics_and_brokers_as_rest_shows_them(
    target: Target, admin: Client
) -> None:
    """The issue's kafkajs defect: after a cluster-wide log.retention.ms, a topic without
    an override shows the inherited value (REST: DYNAMIC_DEFAULT_BROKER_CONFIG), and the
    broker resource "0" lists every broker config, as REST's /brokers/0/configs does."""
    client = admin
    topic = target.create_topic(1)
    r = httpx.put(target.v3("/broker-configs/log.retention.ms"), json={"value": "86400000"})
    assert r.status_code == 204, r.text
    r = httpx.put(target.v3(f"/topics/{topic}/configs/cleanup.policy"), json={"value": "compact"})
    assert r.status_code == 204, r.text
    broker = str(httpx.get(target.v3("/brokers")).json()["data"][0]["broker_id"])
    try:
        got = client.describe_configs(target, topic, broker)
        rest_topic = {
            c["name"]: c["value"]
            for c in httpx.get(target.v3(f"/topics/{topic}/configs")).json()["data"]
        }
        rest_broker = {
            c["name"]: c["value"]
            for c in httpx.get(target.v3(f"/brokers/{broker}/configs")).json()["data"]
        }
    finally:
        httpx.delete(target.v3("/broker-configs/log.retention.ms"))
    assert got is not None
    topic_cfg, broker_cfg = got
    assert rest_topic["retention.ms"] == "86400000" and rest_topic["cleanup.policy"] == "compact"
    assert topic_cfg == rest_topic
    assert broker_cfg == rest_broker and broker_cfg["log.retention.ms"] == "86400000"


# -- the door itself, on each target -------------------------------------------------------


def test_metadata_names_the_address_each_connection_reached(target: Target) -> None:
    """The issue's ``vm:9092``: listening on every interface with nothing advertised,
    Metadata names, for the agent answering, the address the client reached it at (a
    second loopback address stands for another machine's view), never the host name.
    The cluster's agents listen on 127.0.0.1: Metadata names both, wherever it is asked."""
    if target.name != "serve":
        for addr in target.kafka:
            md = AdminClient({"bootstrap.servers": addr}).list_topics(timeout=30)
            assert sorted(f"{b.host}:{b.port}" for b in md.brokers.values()) == sorted(target.kafka)
        return
    port = target.kafka[0].rsplit(":", 1)[1]
    for host in ("127.0.0.1", "127.0.0.2"):
        admin = AdminClient({"bootstrap.servers": f"{host}:{port}"})
        md = admin.list_topics(timeout=30)
        assert [f"{b.host}:{b.port}" for b in md.brokers.values()] == [f"{host}:{port}"]
    body = _metadata_request(None)
    got = kafka_call(f"127.0.0.2:{port}", body)
    assert [(b.host, b.port) for b in got.brokers] == [("127.0.0.2", int(port))]


def test_init_producer_id_without_transactional_id_is_always_a_new_id(target: Target) -> None:
    """The issue's @platformatic/kafka defect: InitProducerId with producer id 0 and epoch 0
    (or any id and epoch) and no transactional id gets a new producer id, as Kafka."""
    from kio.schema.init_producer_id.v5.request import InitProducerIdRequest

    ids = set()
    for pid, epoch in ((0, 0), (-1, -1), (123456, 7)):
        got = kafka_call(
            target.kafka[0],
            InitProducerIdRequest(
                transactional_id=None,
                transaction_timeout=datetime.timedelta(seconds=60),
                producer_id=pid,
                producer_epoch=epoch,
            ),
        )
        assert (got.error_code, got.producer_epoch) == (ErrorCode.none, 0)
        ids.add(got.producer_id)
    assert len(ids) == 3


def _metadata_request(topics: Any) -> Any:
    from kio.schema.metadata.v13.request import MetadataRequest

    return MetadataRequest(
        topics=topics, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )


def test_a_recreated_topic_has_a_new_id_everywhere(target: Target) -> None:
    """Topic ids are the same in Metadata, Fetch, DescribeTopicPartitions and DeleteTopics;
    a topic deleted and created again under its name has a new one, and the old id is
    UNKNOWN_TOPIC_ID everywhere (never the new topic's data)."""
    from kio.schema.delete_topics.v6.request import DeleteTopicsRequest, DeleteTopicState
    from kio.schema.describe_topic_partitions.v0.request import (
        DescribeTopicPartitionsRequest,
        TopicRequest,
    )
    from kio.schema.fetch.v17.request import FetchPartition, FetchRequest, FetchTopic
    from kio.schema.metadata.v13.request import MetadataRequestTopic

    addr = target.kafka[-1]
    topic = target.create_topic(2)
    produce_plain(target, topic, 5, "old")

    def topic_id_by_name() -> uuid.UUID:
        got = kafka_call(
            addr, _metadata_request((MetadataRequestTopic(name=topic, topic_id=None),))
        )
        (t,) = got.topics
        assert t.error_code == ErrorCode.none
        return uuid.UUID(str(t.topic_id))

    def by_id(tid: uuid.UUID) -> Any:
        got = kafka_call(addr, _metadata_request((MetadataRequestTopic(name=None, topic_id=tid),)))
        return got.topics[0]

    def fetch(tid: uuid.UUID) -> Any:
        body = FetchRequest(
            max_wait=datetime.timedelta(milliseconds=10),
            min_bytes=0,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=(
                FetchTopic(
                    topic_id=tid,
                    partitions=(
                        FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),
                    ),
                ),
            ),
            forgotten_topics_data=(),
            rack_id="",
        )
        return kafka_call(addr, body).responses[0]

    def describe() -> Any:
        body = DescribeTopicPartitionsRequest(
            topics=(TopicRequest(name=topic),), response_partition_limit=100, cursor=None
        )
        return kafka_call(addr, body).topics[0]

    def delete(tid: uuid.UUID) -> Any:
        body = DeleteTopicsRequest(
            topics=(DeleteTopicState(name=None, topic_id=tid),),
            timeout=datetime.timedelta(seconds=30),
        )
        return kafka_call(addr, body).responses[0]

    old = topic_id_by_name()
    assert by_id(old).name == topic and uuid.UUID(str(describe().topic_id)) == old
    answer = fetch(old)
    assert uuid.UUID(str(answer.topic_id)) == old
    assert answer.partitions[0].error_code == ErrorCode.none and answer.partitions[0].records
    r = httpx.delete(target.v3(f"/topics/{topic}"))
    assert r.status_code == 204, r.text
    target.create_topic(2, topic)
    time.sleep(2.5)  # past the agents' topic cache (metadata_ttl_s)
    new = topic_id_by_name()
    assert new != old and uuid.UUID(str(describe().topic_id)) == new
    gone = by_id(old)
    assert (gone.error_code, gone.name) == (ErrorCode.unknown_topic_id, None)
    assert fetch(old).partitions[0].error_code == ErrorCode.unknown_topic_id
    assert fetch(new).partitions[0].records in (None, b"")  # the new topic is empty
    # DeleteTopics by the old id never deletes the new topic.
    assert delete(old).error_code == ErrorCode.unknown_topic_id
    assert topic_id_by_name() == new
    res = delete(new)
    assert (res.error_code, res.name) == (ErrorCode.none, topic)
    assert httpx.get(target.v3(f"/topics/{topic}")).status_code == 404


def test_offset_fetch_of_several_groups_in_one_request(target: Target) -> None:
    """OffsetFetch v8+ (KIP-709): each group's committed offsets, by name and (v10) by id;
    an unknown topic id is UNKNOWN_TOPIC_ID for that topic only."""
    from kio.schema.offset_fetch.v8.request import (
        OffsetFetchRequest,
        OffsetFetchRequestGroup,
        OffsetFetchRequestTopics,
    )
    from kio.schema.offset_fetch.v10.request import OffsetFetchRequest as OffsetFetchV10
    from kio.schema.offset_fetch.v10.request import OffsetFetchRequestGroup as GroupV10
    from kio.schema.offset_fetch.v10.request import OffsetFetchRequestTopics as TopicsV10

    topic = target.create_topic(2)
    groups = [f"og-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    for i, g in enumerate(groups[:2]):
        c = Consumer({"bootstrap.servers": target.bootstrap, "group.id": g})
        c.commit(
            offsets=[TopicPartition(topic, 0, 10 + i), TopicPartition(topic, 1, 20 + i)],
            asynchronous=False,
        )
        c.close()
    got = kafka_call(
        target.kafka[0],
        OffsetFetchRequest(
            groups=tuple(
                OffsetFetchRequestGroup(
                    group_id=g,
                    topics=(OffsetFetchRequestTopics(name=topic, partition_indexes=(0, 1)),),
                )
                for g in groups
            ),
            require_stable=False,
        ),
    )
    found = {
        g.group_id: [
            (p.partition_index, p.committed_offset) for t in g.topics for p in t.partitions
        ]
        for g in got.groups
    }
    assert found == {
        groups[0]: [(0, 10), (1, 20)],
        groups[1]: [(0, 11), (1, 21)],
        groups[2]: [(0, -1), (1, -1)],
    }
    md = kafka_call(target.kafka[0], _metadata_request(None))
    tid = next(uuid.UUID(str(t.topic_id)) for t in md.topics if t.name == topic)
    unknown = uuid.uuid4()
    got = kafka_call(
        target.kafka[0],
        OffsetFetchV10(
            groups=(
                GroupV10(
                    group_id=groups[1],
                    member_id=None,
                    member_epoch=-1,
                    topics=(
                        TopicsV10(topic_id=tid, partition_indexes=(1,)),
                        TopicsV10(topic_id=unknown, partition_indexes=(0,)),
                    ),
                ),
            ),
            require_stable=False,
        ),
    )
    rows = {
        uuid.UUID(str(t.topic_id)): [(p.committed_offset, p.error_code) for p in t.partitions]
        for t in got.groups[0].topics
    }
    assert rows == {tid: [(21, ErrorCode.none)], unknown: [(-1, ErrorCode.unknown_topic_id)]}


def test_describe_topic_partitions_pages_past_its_limits(target: Target) -> None:
    """KIP-966's paging: a request's partition limit, and Kafka's cap of 2000 partitions per
    answer whatever the request asks, cut the answer; the cursor resumes exactly there."""
    from kio.schema.describe_topic_partitions.v0.request import (
        Cursor,
        DescribeTopicPartitionsRequest,
        TopicRequest,
    )

    big = target.create_topic(2050)
    small = target.create_topic(3)
    names = sorted([big, small])

    def page(limit: int, cursor: Any) -> Any:
        return kafka_call(
            target.kafka[0],
            DescribeTopicPartitionsRequest(
                topics=tuple(TopicRequest(name=n) for n in names),
                response_partition_limit=limit,
                cursor=cursor,
            ),
        )

    seen: list[tuple[str, int]] = []
    cursor = None
    pages = 0
    while True:
        got = page(5000, cursor)
        pages += 1
        assert sum(len(t.partitions) for t in got.topics) <= 2000
        seen += [(t.name, p.partition_index) for t in got.topics for p in t.partitions]
        if got.next_cursor is None:
            break
        cursor = Cursor(
            topic_name=got.next_cursor.topic_name, partition_index=got.next_cursor.partition_index
        )
    assert pages == 2
    expected = [(n, p) for n in names for p in range(2050 if n == big else 3)]
    assert seen == expected
    small_pages = []
    cursor = None
    while True:
        got = page(7, cursor)
        small_pages.append(sum(len(t.partitions) for t in got.topics))
        if got.next_cursor is None:
            break
        cursor = Cursor(
            topic_name=got.next_cursor.topic_name, partition_index=got.next_cursor.partition_index
        )
        if len(small_pages) > 3:
            break
    assert small_pages[:3] == [7, 7, 7]


def test_consumer_protocol_group_survives_an_agent_killed(
    cluster_factory: Any, unique_topic: Any
) -> None:
    """Fault: the agent a KIP-848 group's members talk to is SIGKILLed while they read.
    The group lives in the coordinator, so the members carry on through the other agent
    at the same epochs (no rebalance: no partition changes hands), and every record, of
    before and after the kill, is read exactly once."""
    cluster = cluster_factory(
        kafka=True, agent_env={"LAKELOG_KAFKA_GROUP_HEARTBEAT_INTERVAL_MS": HEARTBEAT_MS}
    )
    t = Target("cluster", cluster.kafka, cluster.agents[1], cluster.cluster_id, cluster.logs)
    topic = t.create_topic(4)
    group = f"g-kill-{uuid.uuid4().hex[:6]}"
    conf = {
        "bootstrap.servers": cluster.kafka[0],  # the first agent: the one about to die
        "group.id": group,
        "group.protocol": "consumer",
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "auto.commit.interval.ms": 200,
    }
    members = [Consumer(dict(conf)) for _ in range(2)]
    for m in members:
        m.subscribe([topic])
    got: list[tuple[str, int, int]] = []

    def poll_until(n: int, wait_s: float = WAIT_S) -> None:
        deadline = time.monotonic() + wait_s
        while len(got) < n and time.monotonic() < deadline:
            for m in members:
                msg = m.poll(0.1)
                if msg is not None and msg.error() is None:
                    got.append((msg.value().decode(), msg.partition(), msg.offset()))

    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:  # polled: members revoke in their poll
            for m in members:
                m.poll(0.1)
            if group_view(t, group, "consumer") == ("STABLE", 2, 4):
                break
        assert group_view(t, group, "consumer") == ("STABLE", 2, 4), _describe_group(t, group)
        before_kill = {c["consumer_id"] for c in t.group_members(group)}
        sent = produce_plain(t, topic, 100, "before")
        poll_until(100)
        cluster.agent_procs[0].kill()
        p = Producer({"bootstrap.servers": cluster.kafka[1], "linger.ms": 5})
        for i in range(100):
            p.produce(topic, value=f"after-{i}".encode())
        assert p.flush(60) == 0
        sent |= {f"after-{i}" for i in range(100)}
        poll_until(200)
        poll_until(201, wait_s=1.5)  # a record twice would show up now
    finally:
        for m in members:
            m.close()
    assert sorted(v for v, _, _ in got) == sorted(sent), cluster.logs()[-3000:]
    assert len(set(got)) == len(got)
    assert {c["consumer_id"] for c in t.group_members(group)} <= before_kill  # same members


def test_list_offsets_special_timestamps_of_the_newest_versions(target: Target) -> None:
    """ListOffsets v11: latest, earliest, earliest-local (the log start: the whole log is
    local here), and the remote-storage specials (latest tiered, earliest pending upload:
    -1, as Kafka answers for a topic without remote storage)."""
    from kio.schema.list_offsets.v11.request import (
        ListOffsetsPartition,
        ListOffsetsRequest,
        ListOffsetsTopic,
    )

    topic = target.create_topic(1)
    produce_plain(target, topic, 5, "lo")
    answers = []
    for ts in (-1, -2, -4, -5, -6):
        got = kafka_call(
            target.kafka[-1],
            ListOffsetsRequest(
                replica_id=-1,
                isolation_level=0,
                topics=(
                    ListOffsetsTopic(
                        name=topic,
                        partitions=(
                            ListOffsetsPartition(
                                partition_index=0, current_leader_epoch=-1, timestamp=ts
                            ),
                        ),
                    ),
                ),
                timeout=datetime.timedelta(seconds=30),
            ),
        )
        (p,) = got.topics[0].partitions
        answers.append((p.error_code, p.offset))
    assert answers == [(ErrorCode.none, o) for o in (5, 0, 0, -1, -1)]
