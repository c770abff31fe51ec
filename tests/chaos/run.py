"""One chaos run: a cluster of real processes, seeded clients and faults, a history.

``run(Params)`` starts moto, the fault proxy in front of it and the topology of
``tests.integration.topology`` (coordinators on PostgreSQL or one on SQLite, two
agents behind a load balancer, every janitor on a schedule of seconds; ``sharded``:
two coordinators on a catalog and two shard databases), then for
``minutes`` runs client threads and a nemesis, each drawing its operations from its
own ``random.Random`` seeded by (seed, thread name): the seed fixes each thread's
schedule of operations (timing, and so interleavings, still vary). Then it stops the
faults, restarts what is down, waits for the janitors, reads every partition whole
(``final_read``) and the groups' committed offsets, and checks the history.

Clients: REST and Kafka producers, v3 readers, a v2 consumer instance, Kafka group
members, a group stream (``Run.group_stream``), transactional producers
(``Run.txn_producer``: confluent-kafka, a ``transactional.id`` each, committing or
aborting at random, some transactions carrying offsets of ``stable`` consumed
read_committed, now and then a zombie instance that must be fenced) with a
read_committed and a read_uncommitted Kafka reader of their topic (``Run.txn_reader``)
and, in runs of ``SPARK_MIN_MINUTES`` or more, a Spark process (``Run.spark_loop``,
``tests.chaos.spark_client``).

Topics: ``stable`` (3 partitions; the consumers read it), ``retained``
(``retention.ms`` of seconds, changed at random), ``compacted``
(``cleanup.policy=compact``, keys from a small set), ``churn`` (deleted and created
again under the same name, partitions added, DeleteRecords), ``reborn`` (the
reincarnation probe's: ``Run.reincarnate``), ``txn`` (transactions only; at the end every
transactional id is settled by a last instance, ``Run.txn_settle``, and the topic read
whole read_committed too, ``Run.final_txn``).

Targeted probes, each aimed at one defect a random mix rarely reaches: ``reincarnate``
(an agent's cache outliving a topic's incarnation) and the idempotent REST producer's
``resend``, ``zombie`` and ``gap`` (``Run.idempotent_round``: fencing and sequence
checks).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import random
import signal
import sqlite3
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.chaos.checker import check
from tests.chaos.faults import Faults
from tests.chaos.history import History, read_history
from tests.integration.topology import ADMIN, ADMIN_PASSWORD, S3_ENV, Topology, start_topology
from tests.procs import start_moto

BINARY_V2 = "application/vnd.kafka.binary.v2+json"
V2 = "application/vnd.kafka.v2+json"
PROFILES = ("sqlite", "postgres", "sharded")

#: Every janitor often, with thresholds of seconds (GC grace stays above the longest read
#: and flush under injected delays: what the janitors' docs ask of an operator).
COORDINATOR_ENV = {
    "LAKELOG_JANITOR_INTERVAL": "tier=2,retention=2,compact=4,gc=3,table=10",
    "LAKELOG_TIER_AGE_S": "3",
    "LAKELOG_GC_GRACE_S": "30",
    "LAKELOG_LEASE_TTL_S": "10",
}
AGENT_ENV = {
    "LAKELOG_LINGER_MS": "20",
    "LAKELOG_FLUSH_BYTES": "65536",
    "LAKELOG_METADATA_TTL_S": "1",
}

TOPICS: dict[str, tuple[int, dict[str, str]]] = {
    "stable": (3, {}),
    "retained": (2, {"retention.ms": "15000"}),
    "compacted": (2, {"cleanup.policy": "compact"}),
    "churn": (2, {}),
    "reborn": (1, {}),
    "txn": (3, {}),
}
#: The transactional workload (``Run.txn_producer``, ``Run.txn_reader``): its topic (only
#: transactions write it), the topic its consume-transform-produce side reads, its
#: producers (each its own ``transactional.id``), how often a round is a zombie's.
TXN_TOPIC = "txn"
TXN_SOURCE = "stable"
TXN_PRODUCERS = ("txn-1", "txn-2")
TXN_ID_PREFIX = "chaos-"
TXN_ZOMBIE_P = 0.08
#: transaction.timeout.ms: a transaction left open by a frozen or replaced producer is
#: aborted by the agents' sweep within a run.
TXN_TIMEOUT_MS = 20000
#: How long a transactional client call may run past its own timeout (``_bounded``).
TXN_CALL_LIMIT_S = 45.0
#: Runs this long or longer have a Spark client (``Run.spark_loop``): a JVM is no part of
#: the short in-suite run.
SPARK_MIN_MINUTES = 5.0
#: Seconds between two Spark jobs (drawn between these), and the longest wait for one.
SPARK_EVERY_S = (30.0, 75.0)
SPARK_JOB_TIMEOUT_S = 180.0
#: The consumer groups of the run (their committed offsets are read at the end).
GROUPS = ("g-kafka", "g-v2-consumer-1")


@dataclass
class Params:
    seed: int
    minutes: float
    profile: str
    out: Path
    #: LAKELOG_CHAOS_BREAK for agents and coordinators (a deliberately broken build).
    break_env: dict[str, str] = field(default_factory=dict)


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def unb64(s: str | None) -> str | None:
    return None if s is None else base64.b64decode(s).decode(errors="replace")


class Run:
    """The clients, the nemesis and the final read over one topology."""

    def __init__(self, topo: Topology, hist: History, params: Params) -> None:
        self.topo = topo
        self.hist = hist
        self.params = params
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.partitions = {t: n for t, (n, _) in TOPICS.items()}
        self.kafka_bootstrap = ",".join(
            a.environment["LAKELOG_KAFKA_ADVERTISED"] for a in topo.agents
        )
        self.v3 = f"{topo.url}/v3/clusters/{topo.cluster_id}"
        self.churn_lock = threading.Lock()
        #: topic -> the ids its incarnations were created with (``create_topic``).
        self.topic_ids: dict[str, set[str]] = {}
        #: The PostgreSQL, clock and janitor faults (``tests.chaos.faults``).
        self.faults = Faults(topo, hist, self.stop, params.profile)
        #: A group stream's connection -> the last cursor it recorded (``group_stream``).
        self._stream_cursor: dict[str, str | None] = {}

    def rng(self, name: str) -> random.Random:
        return random.Random(f"{self.params.seed}:{name}")

    def client(self, timeout: float = 20.0) -> httpx.Client:
        return httpx.Client(timeout=timeout, auth=ADMIN)

    def kafka_conf(self, **extra: Any) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.kafka_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "admin",
            "sasl.password": ADMIN_PASSWORD,
            **extra,
        }

    def consumer(self, group: str, conf: dict[str, Any]) -> Any:
        """A Kafka consumer in ``group`` that commits only when told (``conf`` adds to
        ``kafka_conf``)."""
        from confluent_kafka import Consumer

        return Consumer(self.kafka_conf(**{"group.id": group, "enable.auto.commit": False, **conf}))

    # -- admin --------------------------------------------------------------------------

    def topic_id(self, topic: str) -> str | None:
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.kafka_conf())
        try:
            fut = admin.describe_topics(TopicCollection([topic]), request_timeout=15)[topic]
            return str(fut.result(timeout=20).topic_id)
        except Exception:
            return None

    def create_topic(self, proc: str, name: str) -> bool:
        n, configs = TOPICS[name]
        op = self.hist.invoke(proc, "create_topic", topic=name, partitions=n, configs=configs)
        body = {
            "topic_name": name,
            "partitions_count": n,
            "configs": [{"name": k, "value": v} for k, v in configs.items()],
        }
        try:
            with self.client() as c:
                r = c.post(f"{self.v3}/topics", json=body)
        except httpx.HTTPError as e:
            self.hist.complete(op, proc, "create_topic", "info", error=repr(e))
            return False
        # "Already exists": an earlier create whose answer was lost made it (none of ours
        # deletes it meanwhile: the admin thread alone deletes). Its life is counted from
        # now, later than it began: fewer produces are attributed to it, none wrongly.
        exists = r.status_code == 400 and "already exists" in r.text
        if r.status_code != 201 and not exists:
            self.hist.complete(op, proc, "create_topic", _outcome(r.status_code), error=r.text)
            return False
        # The id, from an agent's metadata: one that has not seen the create yet (its
        # cache lives LAKELOG_METADATA_TTL_S, 1 s) answers the last incarnation's, and
        # the model would give this one's records to that one. Ids are never reused: wait
        # for one not recorded before; but "already exists" after a delete that failed
        # is the last incarnation living on, whose id stays (past the cache's life).
        seen = self.topic_ids.setdefault(name, set())
        tid = None
        for attempt in range(20):
            tid = self.topic_id(name)
            if self.stop.is_set() or (
                tid is not None and (tid not in seen or (exists and attempt >= 8))
            ):
                break
            time.sleep(0.25)
        if tid is None or (tid in seen and not exists):
            self.hist.complete(
                op, proc, "create_topic", "info", error="no new topic id", last_id=tid
            )
            return False
        seen.add(tid)
        self.partitions[name] = n
        self.hist.complete(op, proc, "create_topic", "ok", topic_id=tid, existed=exists)
        return True

    def admin_loop(self) -> None:
        proc = "admin"
        rng = self.rng(proc)
        while not self.stop.wait(rng.uniform(3, 7)):
            what = rng.choice(["recreate", "recreate", "partitions", "delete_records", "retention"])
            try:
                getattr(self, f"_admin_{what}")(proc, rng)
            except Exception:
                self.errors.append(f"{proc}: {traceback.format_exc()}")

    def _admin_recreate(self, proc: str, rng: random.Random) -> None:
        with self.churn_lock:
            self.delete_topic(proc, "churn")
            time.sleep(rng.uniform(0, 1))
            for _ in range(10):
                if self.create_topic(proc, "churn") or self.stop.is_set():
                    break
                time.sleep(1)

    def delete_topic(self, proc: str, topic: str) -> bool:
        op = self.hist.invoke(proc, "delete_topic", topic=topic)
        try:
            with self.client() as c:
                r = c.delete(f"{self.v3}/topics/{topic}")
            outcome = "ok" if r.status_code == 204 else _outcome(r.status_code)
            self.hist.complete(op, proc, "delete_topic", outcome, status=r.status_code)
            return outcome == "ok"
        except httpx.HTTPError as e:
            self.hist.complete(op, proc, "delete_topic", "info", error=repr(e))
            return False

    def _admin_partitions(self, proc: str, rng: random.Random) -> None:
        from confluent_kafka.admin import AdminClient, NewPartitions

        with self.churn_lock:
            n = self.partitions["churn"]
            if n >= 6:
                return
            op = self.hist.invoke(proc, "add_partitions", topic="churn", count=n + 1)
            admin = AdminClient(self.kafka_conf())
            try:
                admin.create_partitions([NewPartitions("churn", n + 1)], request_timeout=15)[
                    "churn"
                ].result(timeout=20)
                self.partitions["churn"] = n + 1
                self.hist.complete(op, proc, "add_partitions", "ok")
            except Exception as e:
                self.hist.complete(op, proc, "add_partitions", "info", error=repr(e))

    def _admin_delete_records(self, proc: str, rng: random.Random) -> None:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient

        topic = rng.choice(["churn", "retained"])
        p = rng.randrange(TOPICS[topic][0])
        offsets = self.offsets(topic, p)
        if offsets is None or offsets[1] <= offsets[0]:
            return
        target = rng.randint(offsets[0], offsets[1])
        op = self.hist.invoke(proc, "delete_records", topic=topic, partition=p, offset=target)
        admin = AdminClient(self.kafka_conf())
        try:
            res = admin.delete_records([TopicPartition(topic, p, target)], request_timeout=15)
            tp = next(iter(res.values())).result(timeout=20)
            self.hist.complete(op, proc, "delete_records", "ok", low_watermark=tp.low_watermark)
        except Exception as e:
            self.hist.complete(op, proc, "delete_records", "info", error=repr(e))

    def _admin_retention(self, proc: str, rng: random.Random) -> None:
        value = str(rng.choice([5000, 15000, 60000, 600000]))
        op = self.hist.invoke(
            proc, "alter_config", topic="retained", name="retention.ms", value=value
        )
        try:
            with self.client() as c:
                r = c.put(f"{self.v3}/topics/retained/configs/retention.ms", json={"value": value})
            outcome = "ok" if r.status_code == 204 else _outcome(r.status_code)
            self.hist.complete(op, proc, "alter_config", outcome, status=r.status_code)
        except httpx.HTTPError as e:
            self.hist.complete(op, proc, "alter_config", "info", error=repr(e))

    def offsets(self, topic: str, p: int) -> tuple[int, int] | None:
        """(log start, high watermark) through a v3 read of nothing."""
        try:
            with self.client() as c:
                r = c.get(
                    f"{self.v3}/topics/{topic}/partitions/{p}/records",
                    params={"max_bytes": 1, "timeout_ms": 0},
                )
            if r.status_code != 200:
                return None
            d = r.json()
            return d["log_start_offset"], d["high_watermark"]
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    # -- producers ----------------------------------------------------------------------

    def rest_producer(self, proc: str) -> None:
        rng = self.rng(proc)
        client = self.client()
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                topic = rng.choice(["stable", "stable", "retained", "compacted", "churn"])
                mode = rng.choice(["v2", "v2-key", "v3-batch"])
                size = rng.randint(1, 10)
                values = [f"{topic}|{proc}|{n}|{i}" for i in range(size)]
                keys = [
                    f"k{rng.randrange(5)}" if topic == "compacted" else values[i]
                    for i in range(size)
                ]
                try:
                    if mode == "v3-batch":
                        self._v3_batch(client, proc, topic, values, keys)
                    else:
                        resend = mode == "v2-key" and rng.random() < 0.25
                        self._v2(client, proc, topic, values, keys, mode == "v2-key", n, resend)
                except httpx.HTTPError:
                    client.close()
                    client = self.client()
                time.sleep(rng.uniform(0, 0.1))
        finally:
            client.close()

    def _v2(
        self,
        client: httpx.Client,
        proc: str,
        topic: str,
        values: list[str],
        keys: list[str],
        keyed: bool,
        n: int,
        resend: bool = False,
        url: str | None = None,
    ) -> bool:
        """One v2 produce (through ``url``, an agent's, else the LB); whether it was
        acknowledged whole."""
        body = orjson.dumps(
            {
                "records": [
                    {"key": b64(k), "value": b64(v)} for k, v in zip(keys, values, strict=True)
                ]
            }
        )
        headers = {"Content-Type": BINARY_V2}
        mode = "v2"
        if keyed:
            mode = "v2-key"
            headers["Idempotency-Key"] = f"{proc}-{self.params.seed}-{n}"
        op = self.hist.invoke(proc, "produce", topic=topic, mode=mode, values=values, keys=keys)
        attempts = 4 if keyed else 1
        last: str = ""
        tries: list[str] = []  # what each failed attempt got
        for attempt in range(attempts):
            try:
                r = client.post(
                    f"{url or self.topo.url}/topics/{topic}", content=body, headers=headers
                )
            except httpx.HTTPError as e:
                last = repr(e)
                tries.append(last[:200])
                if attempt + 1 < attempts:
                    time.sleep(0.5)
                    continue
                self.hist.complete(op, proc, "produce", "info", error=last)
                raise
            if r.status_code == 200:
                offsets = r.json().get("offsets", [])
                results = [
                    [o["partition"], o["offset"]]
                    if o.get("error_code") is None and isinstance(o.get("offset"), int)
                    else None
                    for o in offsets
                ]
                if len(results) != len(values):
                    results = [None] * len(values)
                self.hist.complete(
                    op, proc, "produce", "ok", results=results, attempts=attempt + 1, tries=tries
                )
                if resend:
                    # A client that lost this answer sends the request again: the key
                    # must make it a duplicate (same offsets, nothing stored twice).
                    with contextlib.suppress(httpx.HTTPError):
                        again = client.post(
                            f"{url or self.topo.url}/topics/{topic}", content=body, headers=headers
                        )
                        self._resent(proc, op, again, _same_offsets(results, again))
                return None not in results
            last = f"{r.status_code} {r.text[:200]}"
            tries.append(last)
            if r.status_code < 500 and r.status_code not in (408, 429):
                # A refusal before anything was stored (but a refused retry of a keyed
                # request whose first try may have landed is unknown).
                outcome = "fail" if attempt == 0 else "info"
                self.hist.complete(op, proc, "produce", outcome, error=last)
                return False
            if attempt + 1 < attempts:
                time.sleep(0.5)
        self.hist.complete(op, proc, "produce", "info", error=last)
        return False

    def _v3_batch(
        self, client: httpx.Client, proc: str, topic: str, values: list[str], keys: list[str]
    ) -> None:
        entries = [
            {
                "id": str(i),
                "key": {"type": "BINARY", "data": b64(k)},
                "value": {"type": "BINARY", "data": b64(v)},
            }
            for i, (k, v) in enumerate(zip(keys, values, strict=True))
        ]
        op = self.hist.invoke(
            proc, "produce", topic=topic, mode="v3-batch", values=values, keys=keys
        )
        try:
            r = client.post(f"{self.v3}/topics/{topic}/records:batch", json={"entries": entries})
        except httpx.HTTPError as e:
            self.hist.complete(op, proc, "produce", "info", error=repr(e))
            raise
        if r.status_code != 207:
            self.hist.complete(
                op,
                proc,
                "produce",
                _outcome(r.status_code),
                error=f"{r.status_code} {r.text[:200]}",
            )
            return
        d = r.json()
        results: list[Any] = [None] * len(values)
        for s in d.get("successes", []):
            results[int(s["id"])] = [s["partition_id"], s["offset"]]
        self.hist.complete(op, proc, "produce", "ok", results=results)

    def kafka_producer(self, proc: str) -> None:
        """An idempotent confluent-kafka producer; a new one after a fatal error (a topic
        deleted and created again resets the partition's producer state, and librdkafka
        calls the sequence mismatch fatal, as it would against Kafka)."""
        from confluent_kafka import Producer

        rng = self.rng(proc)
        fatal = threading.Event()

        def on_error(err: Any) -> None:
            if err.fatal():
                fatal.set()

        def new_producer() -> Any:
            fatal.clear()
            return Producer(
                self.kafka_conf(
                    **{
                        "enable.idempotence": True,
                        "acks": "all",
                        "linger.ms": 20,
                        "message.timeout.ms": 20000,
                        "partitioner": "murmur2_random",
                        "error_cb": on_error,
                    }
                )
            )

        producer = new_producer()
        n = 0
        while not self.stop.is_set():
            n += 1
            topic = rng.choice(["stable", "retained", "compacted", "churn"])
            size = rng.randint(1, 20)
            values = [f"{topic}|{proc}|{n}|{i}" for i in range(size)]
            keys = [f"k{rng.randrange(5)}" if topic == "compacted" else v for v in values]
            results: list[Any] = [None] * size
            op = self.hist.invoke(
                proc, "produce", topic=topic, mode="kafka", values=values, keys=keys
            )

            def report(i: int, out: list[Any] = results) -> Callable[[Any, Any], None]:
                # ``out`` bound now: a late delivery must not land in a later op's results.
                def cb(err: Any, msg: Any) -> None:
                    if err is None:
                        out[i] = [msg.partition(), msg.offset()]

                return cb

            try:
                for i, (k, v) in enumerate(zip(keys, values, strict=True)):
                    producer.produce(topic, v.encode(), k.encode(), on_delivery=report(i))
                left = producer.flush(30)
                outcome, error = "ok", None
            except Exception as e:  # BufferError, KafkaException: nothing is known
                outcome, error, left = "info", repr(e), -1
            if outcome == "ok":
                self.hist.complete(op, proc, "produce", "ok", results=results, unflushed=left)
            else:
                self.hist.complete(op, proc, "produce", "info", error=error)
            if fatal.is_set() or outcome != "ok":
                self.hist.info(proc, "producer_reset", error=error)
                with contextlib.suppress(Exception):
                    producer.flush(5)
                producer = new_producer()
            time.sleep(rng.uniform(0, 0.2))
        producer.flush(30)

    # -- transactions -------------------------------------------------------------------

    def txn_conf(self, transactional_id: str) -> dict[str, Any]:
        """A transactional producer's configuration: a timeout the agents' sweep acts on
        within a run (a producer frozen by a fault is aborted, not waited for)."""
        return self.kafka_conf(
            **{
                "transactional.id": transactional_id,
                "transaction.timeout.ms": TXN_TIMEOUT_MS,
                "message.timeout.ms": TXN_TIMEOUT_MS - 5000,
                "linger.ms": 5,
            }
        )

    def txn_init(self, proc: str, transactional_id: str, **fields: Any) -> tuple[Any, int] | None:
        """A new instance of ``transactional_id`` (``init_transactions``: its earlier
        instance is fenced and a transaction it left open aborted): (the producer, the
        ``txn_init`` op id), or None when it did not answer ok."""
        from confluent_kafka import Producer

        op = self.hist.invoke(proc, "txn_init", transactional_id=transactional_id, **fields)
        try:
            producer = Producer(self.txn_conf(transactional_id))
            producer.init_transactions(30)
        except Exception as e:
            self.hist.complete(op, proc, "txn_init", "info", error=repr(e)[:300])
            return None
        self.hist.complete(op, proc, "txn_init", "ok")
        return producer, op

    def txn_producer(self, proc: str) -> None:
        """A transactional producer (``transactional.id`` = ``TXN_ID_PREFIX + proc``) on
        topic ``txn``; see ``txn_round``. A new instance after any outcome it cannot
        account for (a fatal error, a timeout): its ``init_transactions`` settles what the
        last one left open."""
        from confluent_kafka import TopicPartition

        rng = self.rng(proc)
        tid = TXN_ID_PREFIX + proc
        group = f"g-{proc}"
        # The consume side of consume-transform-produce: ``stable`` read_committed from
        # the group's committed offsets (only transactions commit them), never sought back.
        source = self.consumer(
            group, {"auto.offset.reset": "earliest", "isolation.level": "read_committed"}
        )
        source.assign([TopicPartition(TXN_SOURCE, p) for p in range(TOPICS[TXN_SOURCE][0])])
        producer: Any = None
        n = itertools.count(1)
        try:
            while not self.stop.is_set():
                if producer is None:
                    got = self.txn_init(proc, tid)
                    if got is None:
                        self.stop.wait(1)
                        continue
                    producer = got[0]
                try:
                    producer = self.txn_round(proc, tid, group, producer, source, rng, next(n))
                except Exception:
                    self.errors.append(f"{proc}: {traceback.format_exc()}")
                    producer = None
                self.stop.wait(rng.uniform(0, 0.2))
        finally:
            with contextlib.suppress(Exception):
                source.close()

    def txn_round(
        self,
        proc: str,
        tid: str,
        group: str,
        producer: Any,
        source: Any,
        rng: random.Random,
        n: int,
    ) -> Any:
        """One transaction of ``producer``: 2-8 records over 1-3 partitions of ``txn`` (each
        value ``txn|proc|n|i``), in some the offsets of records just consumed from
        ``stable`` (``send_offsets_to_transaction``), then committed or aborted as drawn.
        Now and then a zombie round: a second instance of the id is started after the
        records are acknowledged, and only then the first commits (it must be fenced).
        Returns the producer to go on with (None: a new instance is needed).

        The ``txn`` op's outcome: ``ok`` the intended end returned; ``fail`` the
        transaction was surely aborted (``abort_transaction`` returned after an abortable
        error, or the zombie's commit refused after the fencing instance's init returned);
        ``info`` anything else. A ``txn_end`` info is written right before the commit or
        abort is asked: a read_committed reader that got a record earlier read it
        uncommitted."""
        from confluent_kafka import KafkaException, TopicPartition

        zombie = rng.random() < TXN_ZOMBIE_P
        intent = "commit" if zombie or rng.random() < 0.7 else "abort"
        parts = rng.sample(range(TOPICS[TXN_TOPIC][0]), rng.randint(1, 3))
        placed = [rng.choice(parts) for _ in range(rng.randint(2, 8))]
        values = [f"{TXN_TOPIC}|{proc}|{n}|{i}" for i in range(len(placed))]
        offsets: dict[str, int] = {}
        if rng.random() < 0.4:
            offsets = self._txn_consume(proc, source)
        op = self.hist.invoke(
            proc,
            "txn",
            topic=TXN_TOPIC,
            transactional_id=tid,
            n=n,
            values=values,
            partitions=placed,
            intent=intent,
            group=group if offsets else None,
            source=TXN_SOURCE,
            offsets=offsets or None,
            zombie=zombie,
        )
        results: list[Any] = [None] * len(values)

        def report(i: int) -> Callable[[Any, Any], None]:
            def cb(err: Any, msg: Any) -> None:
                if err is None:
                    results[i] = [msg.partition(), msg.offset()]

            return cb

        fenced_by: int | None = None
        try:
            producer.begin_transaction()
            for i, (p, v) in enumerate(zip(placed, values, strict=True)):
                producer.produce(
                    TXN_TOPIC, v.encode(), v.encode(), partition=p, on_delivery=report(i)
                )
            if producer.flush(30):
                raise KafkaException("records unacknowledged after 30 s")
            if offsets:
                metadata = source.consumer_group_metadata()
                _bounded(
                    lambda: producer.send_offsets_to_transaction(
                        [TopicPartition(TXN_SOURCE, int(p), o) for p, o in offsets.items()],
                        metadata,
                        30,
                    ),
                    TXN_CALL_LIMIT_S,
                )
            if zombie:
                fresh = self.txn_init(proc, tid, fences=op)
                if fresh is None:  # the zombie may or may not be fenced: nothing is known
                    self.hist.complete(op, proc, "txn", "info", results=results, error="fence")
                    return None
                fenced_by = fresh[1]
                self.hist.info(proc, "txn_end", op_id=op, action="commit")
                try:
                    producer.commit_transaction(30)
                except KafkaException as e:
                    self.hist.complete(
                        op, proc, "txn", "fail", results=results, fenced_by=fenced_by, error=str(e)
                    )
                    return fresh[0]
                self.hist.complete(op, proc, "txn", "ok", results=results, fenced_by=fenced_by)
                return fresh[0]
            self.hist.info(proc, "txn_end", op_id=op, action=intent)
            if intent == "commit":
                producer.commit_transaction(30)
            else:
                producer.abort_transaction(30)
            self.hist.complete(op, proc, "txn", "ok", results=results)
            return producer
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if hasattr(err, "txn_requires_abort") and err.txn_requires_abort():
                try:
                    producer.abort_transaction(30)
                except KafkaException as e2:
                    self.hist.complete(op, proc, "txn", "info", results=results, error=str(e2))
                    return None
                self.hist.complete(op, proc, "txn", "fail", results=results, error=str(e))
                return producer
            self.hist.complete(op, proc, "txn", "info", results=results, error=str(e))
            return None
        except Exception as e:  # BufferError, ...: nothing is known
            self.hist.complete(op, proc, "txn", "info", results=results, error=repr(e))
            return None

    def _txn_consume(self, proc: str, source: Any) -> dict[str, int]:
        """A few records of ``stable`` read_committed (a ``poll`` of the consumer
        ``<proc>-in``); {partition: the offset after the last} for those read."""
        msgs = source.consume(50, 0.5)
        recs = [[m.partition(), m.offset(), m.value().decode()] for m in msgs if m.error() is None]
        if not recs:
            return {}
        op = self.hist.invoke(proc, "poll", consumer=f"{proc}-in")
        self.hist.complete(
            op, proc, "poll", "ok", consumer=f"{proc}-in", topic=TXN_SOURCE, records=recs
        )
        return {str(p): o + 1 for p, o, _ in recs}

    def txn_reader(self, proc: str, isolation: str) -> None:
        """A Kafka consumer of every partition of ``txn`` from its start with
        ``isolation.level`` = ``isolation``, never committing nor seeking: each batch it
        gets is a ``txn_poll`` with its records (partition, offset, value)."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        consumer = self.consumer(
            f"g-{proc}",
            {
                "isolation.level": isolation,
                "fetch.wait.max.ms": 100,
                # A reset goes back to the start: poll_nonmonotonic, not a silent jump.
                "auto.offset.reset": "earliest",
            },
        )
        n = TOPICS[TXN_TOPIC][0]
        consumer.assign([TopicPartition(TXN_TOPIC, p, OFFSET_BEGINNING) for p in range(n)])
        try:
            while not self.stop.is_set():
                msgs = consumer.consume(100, 0.5)
                recs = [
                    [m.partition(), m.offset(), m.value().decode()]
                    for m in msgs
                    if m.error() is None
                ]
                if recs:
                    op = self.hist.invoke(proc, "txn_poll", consumer=proc)
                    self.hist.complete(
                        op,
                        proc,
                        "txn_poll",
                        "ok",
                        consumer=proc,
                        topic=TXN_TOPIC,
                        isolation=isolation,
                        records=recs,
                    )
        except Exception:
            self.errors.append(f"{proc}: {traceback.format_exc()}")
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def txn_settle(self) -> None:
        """A last instance of every transactional id (``txn_init``, retried): whatever a
        producer left open is aborted, so the final read_committed read sees each
        transaction decided."""
        for proc in TXN_PRODUCERS:
            for _ in range(5):
                if self.txn_init("final", TXN_ID_PREFIX + proc, settle=True) is not None:
                    break
                time.sleep(2)

    def final_txn(self) -> None:
        """``txn`` read whole read_committed (a ``final_txn_read`` per partition), and the
        transactional producers' groups' committed offsets on ``stable``
        (``final_txn_offsets``)."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        proc = "final"
        n = TOPICS[TXN_TOPIC][0]
        consumer = self.consumer(
            "g-final-txn",
            {
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 100,
                # A position reset would jump over records silently: an error instead.
                "auto.offset.reset": "error",
            },
        )
        try:
            ends = {
                p: consumer.get_watermark_offsets(TopicPartition(TXN_TOPIC, p), 15, False)[1]
                for p in range(n)
            }
            consumer.assign([TopicPartition(TXN_TOPIC, p, OFFSET_BEGINNING) for p in range(n)])
            got: dict[int, list[list[Any]]] = {p: [] for p in range(n)}
            errors: list[str] = []
            done: set[int] = {p for p, end in ends.items() if end <= 0}
            deadline = time.monotonic() + 120
            idle_since = time.monotonic()
            while len(done) < n and time.monotonic() < deadline:
                if time.monotonic() - idle_since > 10:  # the rest are markers or aborted
                    break
                for m in consumer.consume(500, 0.5):
                    if m.error() is None:
                        got[m.partition()].append([m.offset(), m.value().decode()])
                        idle_since = time.monotonic()
                    elif len(errors) < 20:
                        errors.append(f"{m.partition()}: {m.error()}")
                for tp in consumer.position([TopicPartition(TXN_TOPIC, p) for p in range(n)]):
                    if tp.offset >= ends[tp.partition]:
                        done.add(tp.partition)
            for p in range(n):
                op = self.hist.invoke(proc, "final_txn_read", topic=TXN_TOPIC, partition=p)
                self.hist.complete(
                    op,
                    proc,
                    "final_txn_read",
                    "ok",
                    topic=TXN_TOPIC,
                    partition=p,
                    isolation="read_committed",
                    last_stable=ends[p],
                    reached_end=p in done,
                    errors=errors,
                    records=got[p],
                )
        except Exception as e:
            self.hist.info(proc, "final_txn_error", error=repr(e)[:300])
        finally:
            with contextlib.suppress(Exception):
                consumer.close()
        groups = [f"g-{p}" for p in TXN_PRODUCERS]
        self._final_committed(proc, groups, TXN_SOURCE, "final_txn_offsets")

    # -- readers ------------------------------------------------------------------------

    def v3_reader(self, proc: str) -> None:
        rng = self.rng(proc)
        known: dict[tuple[str, int], tuple[int, int]] = {}
        with self.client() as client:
            while not self.stop.wait(rng.uniform(0.05, 0.3)):
                topic = rng.choice(list(TOPICS))
                p = rng.randrange(TOPICS[topic][0])
                params: dict[str, Any] = {
                    "max_bytes": rng.choice([200, 5000, 50000]),
                    "timeout_ms": 200,
                }
                if (topic, p) in known and rng.random() < 0.8:
                    ls, hw = known[(topic, p)]
                    params["offset"] = rng.randint(ls, max(ls, hw - 1))
                d = self.read(client, self.v3, proc, topic, p, params)
                if d is None:
                    known.pop((topic, p), None)
                else:
                    known[(topic, p)] = (d["log_start_offset"], d["high_watermark"])

    def read(
        self, client: httpx.Client, v3: str, proc: str, topic: str, p: int, params: dict[str, Any]
    ) -> dict[str, Any] | None:
        """One v3 read by offset through ``v3`` (the LB's or one agent's), recorded; its
        answer, or None when it failed."""
        op = self.hist.invoke(proc, "read", topic=topic, partition=p, offset=params.get("offset"))
        try:
            r = client.get(f"{v3}/topics/{topic}/partitions/{p}/records", params=params)
        except httpx.HTTPError as e:
            self.hist.complete(op, proc, "read", "info", error=repr(e))
            return None
        if r.status_code != 200:
            self.hist.complete(op, proc, "read", "fail", error=r.text[:200])
            return None
        d: dict[str, Any] = r.json()
        self.hist.complete(
            op,
            proc,
            "read",
            "ok",
            records=[[x["offset"], unb64(x["value"])] for x in d["records"]],
            high_watermark=d["high_watermark"],
            log_start=d["log_start_offset"],
        )
        return d

    def v2_consumer(self, proc: str) -> None:
        """A v2 instance assigned every partition of ``stable``, committing after each poll;
        now and then abandoned for a new one (which starts at the committed offsets)."""
        rng = self.rng(proc)
        group = f"g-{proc}"
        while not self.stop.is_set():
            name = f"{proc}-{uuid.uuid4().hex[:6]}"
            try:
                with self.client(timeout=30) as c:
                    self._v2_instance(c, proc, group, name, rng)
            except (httpx.HTTPError, _Refused) as e:
                self.hist.info(proc, "consumer_error", consumer=name, error=repr(e)[:300])
                time.sleep(0.5)

    def _v2_instance(
        self, c: httpx.Client, proc: str, group: str, name: str, rng: random.Random
    ) -> None:
        h = {"Content-Type": V2}
        cfg = {
            "name": name,
            "format": "binary",
            "auto.offset.reset": "earliest",
            "auto.commit.enable": "false",
        }
        _expect(c.post(f"{self.topo.url}/consumers/{group}", json=cfg, headers=h), 200)
        base = f"{self.topo.url}/consumers/{group}/instances/{name}"
        parts = [{"topic": "stable", "partition": p} for p in range(3)]
        _expect(c.post(f"{base}/assignments", json={"partitions": parts}, headers=h), 204)
        self._assigned(proc, name, group, [0, 1, 2])
        while not self.stop.is_set():
            if rng.random() < 0.03:
                with contextlib.suppress(httpx.HTTPError):
                    c.delete(base, headers=h)
                return
            r = c.get(
                f"{base}/records",
                params={"timeout": 500, "max_bytes": 30000},
                headers={"Accept": BINARY_V2},
            )
            _expect(r, 200)
            recs = [[x["partition"], x["offset"], unb64(x["value"])] for x in r.json()]
            op = self.hist.invoke(proc, "poll", consumer=name)
            self.hist.complete(op, proc, "poll", "ok", consumer=name, topic="stable", records=recs)
            last: dict[int, int] = {}
            for p, o, _ in recs:
                last[p] = o + 1
            if not last:
                continue
            offsets = {str(p): o for p, o in last.items()}
            op = self.hist.invoke(
                proc, "commit", consumer=name, group=group, topic="stable", offsets=offsets
            )
            body = {
                "offsets": [
                    {"topic": "stable", "partition": p, "offset": o - 1} for p, o in last.items()
                ]
            }
            try:
                r = c.post(f"{base}/offsets", json=body, headers=h)
            except httpx.HTTPError as e:
                self.hist.complete(op, proc, "commit", "info", error=repr(e))
                raise
            self.hist.complete(
                op, proc, "commit", "ok" if r.status_code == 200 else "info", status=r.status_code
            )
            _expect(r, 200)

    def _assigned(self, proc: str, consumer: str, group: str, partitions: list[int]) -> None:
        """An ``assign`` in the history: ``consumer`` of ``group`` holds ``partitions`` of
        ``stable``."""
        op = self.hist.invoke(proc, "assign", consumer=consumer)
        self.hist.complete(
            op,
            proc,
            "assign",
            "ok",
            consumer=consumer,
            group=group,
            topic="stable",
            partitions=partitions,
        )

    def kafka_consumer(self, proc: str) -> None:
        """Members of one Kafka group on ``stable``; each now and then leaves (a rebalance)."""
        from confluent_kafka import KafkaException, TopicPartition

        rng = self.rng(proc)
        group = "g-kafka"
        while not self.stop.is_set():
            name = f"{proc}-{uuid.uuid4().hex[:6]}"
            consumer = self.consumer(
                group,
                {
                    "auto.offset.reset": "earliest",
                    "session.timeout.ms": 6000,
                    "heartbeat.interval.ms": 1000,
                },
            )

            def on_assign(_c: Any, parts: list[Any], name: str = name) -> None:
                self._assigned(proc, name, group, [p.partition for p in parts])

            consumer.subscribe(["stable"], on_assign=on_assign)
            try:
                polls = rng.randint(20, 200)
                for _ in range(polls):
                    if self.stop.is_set():
                        break
                    msgs = consumer.consume(100, 0.5)
                    recs = [
                        [m.partition(), m.offset(), m.value().decode()]
                        for m in msgs
                        if m.error() is None
                    ]
                    if not recs:
                        continue
                    op = self.hist.invoke(proc, "poll", consumer=name)
                    self.hist.complete(
                        op, proc, "poll", "ok", consumer=name, topic="stable", records=recs
                    )
                    last: dict[int, int] = {}
                    for p, o, _ in recs:
                        last[p] = o + 1
                    offsets = {str(p): o for p, o in last.items()}
                    op = self.hist.invoke(
                        proc, "commit", consumer=name, group=group, topic="stable", offsets=offsets
                    )
                    try:
                        consumer.commit(
                            offsets=[TopicPartition("stable", p, o) for p, o in last.items()],
                            asynchronous=False,
                        )
                        self.hist.complete(op, proc, "commit", "ok")
                    except KafkaException as e:
                        self.hist.complete(op, proc, "commit", "info", error=str(e))
            except Exception:
                self.errors.append(f"{proc}: {traceback.format_exc()}")
            finally:
                with contextlib.suppress(Exception):
                    consumer.close()

    # -- group streams --------------------------------------------------------------------

    def group_stream(self, proc: str) -> None:
        """A reader of ``stable``'s group stream (NDJSON) in its own group (``g-<proc>``,
        no members): each connection (a ``stream_open``, then its records as
        ``stream_poll``s) ends after a while and the next resumes, with the last cursor
        it recorded (exactly once from there) or without one (from the group's committed
        offsets, read first as ``group_offsets``: at least once)."""
        rng = self.rng(proc)
        group = f"g-{proc}"
        cursor: str | None = None
        while not self.stop.is_set():
            name = f"{proc}-{uuid.uuid4().hex[:6]}"
            use = cursor if cursor is not None and rng.random() < 0.6 else None
            if use is None:
                self.group_offsets(proc, group)
            try:
                # No record on this connection: the last cursor is still the one before.
                cursor = self._stream_connection(proc, group, name, use, rng) or cursor
            except (httpx.HTTPError, ValueError) as e:
                # Its server side may outlive it (a paused agent) and commit late.
                self.hist.info(proc, "stream_error", consumer=name, error=repr(e)[:300])
                cursor = self._stream_cursor.pop(name, None) or cursor
                self.stop.wait(0.5)

    def group_offsets(self, proc: str, group: str) -> None:
        """The group's committed offsets on ``stable`` once they stay put (a stream that
        ended commits what it delivered as it goes: wait for that)."""
        url = f"{self.v3}/consumer-groups/{group}/lags"
        last: dict[str, int] | None = None
        op = self.hist.invoke(proc, "group_offsets", group=group, topic="stable")
        try:
            with self.client() as c:
                for _ in range(10):
                    r = c.get(url)
                    if r.status_code == 404:  # nothing committed yet
                        offsets: dict[str, int] | None = {}
                    elif r.status_code != 200:
                        offsets = None
                    else:
                        offsets = {
                            str(x["partition_id"]): x["current_offset"]
                            for x in r.json()["data"]
                            if x["topic_name"] == "stable"
                        }
                    if offsets is not None and offsets == last:
                        self.hist.complete(
                            op, proc, "group_offsets", "ok", group=group, offsets=offsets
                        )
                        return
                    last = offsets
                    if self.stop.wait(0.7):
                        break
        except httpx.HTTPError as e:
            self.hist.complete(op, proc, "group_offsets", "info", error=repr(e)[:300])
            return
        self.hist.complete(op, proc, "group_offsets", "info", error="offsets kept moving")

    def _stream_connection(
        self, proc: str, group: str, name: str, cursor: str | None, rng: random.Random
    ) -> str | None:
        """One connection of the group stream, from ``cursor`` (None: the committed
        offsets); the last cursor recorded (None: no record). Records are recorded in
        ``stream_poll``s of a few, each with the cursor after its last record; the
        connection ends after ``wanted`` records or a few seconds of nothing new."""
        params: dict[str, Any] = {"topics": "stable", "keepalive_ms": 300}
        if cursor is not None:
            params["cursor"] = cursor
        op = self.hist.invoke(
            proc,
            "stream_open",
            consumer=name,
            group=group,
            topic="stable",
            cursor=_decode_cursor(cursor) if cursor is not None else None,
        )
        wanted = rng.randint(20, 600)
        idle_max = rng.randint(3, 20)  # keepalives in a row before it hangs up
        got = idle = 0
        batch: list[list[Any]] = []
        last: str | None = None

        def flush() -> None:
            nonlocal batch
            if batch:
                p_op = self.hist.invoke(proc, "stream_poll", consumer=name)
                self.hist.complete(
                    p_op,
                    proc,
                    "stream_poll",
                    "ok",
                    consumer=name,
                    topic="stable",
                    records=batch,
                    cursor=_decode_cursor(last) if last else None,
                )
                batch = []
                self._stream_cursor[name] = last

        with (
            self.client(timeout=15) as c,
            c.stream(
                "GET",
                f"{self.v3}/consumer-groups/{group}/records",
                params=params,
                headers={"Accept": "application/x-ndjson"},
            ) as r,
        ):
            if r.status_code != 200:
                r.read()
                self.hist.complete(
                    op, proc, "stream_open", _outcome(r.status_code), error=r.text[:300]
                )
                self.stop.wait(0.5)
                return None
            self.hist.complete(op, proc, "stream_open", "ok", consumer=name, group=group)
            try:
                for line in r.iter_lines():
                    if not line:
                        continue
                    doc = orjson.loads(line)
                    if doc.get("keepalive"):
                        flush()
                        idle += 1
                        if idle >= idle_max or self.stop.is_set():
                            break
                        continue
                    if "cursor" not in doc:  # the error that ends the stream
                        self.hist.info(proc, "stream_end", consumer=name, error=doc)
                        break
                    idle = 0
                    batch.append([doc["partition"], doc["offset"], unb64(doc["value"])])
                    last = doc["cursor"]
                    got += 1
                    if len(batch) >= 50:
                        flush()
                    if got >= wanted or self.stop.is_set():
                        break
            finally:
                flush()
        self._stream_cursor.pop(name, None)
        return last

    # -- Spark --------------------------------------------------------------------------

    def spark_loop(self, proc: str) -> None:
        """Spark batch jobs now and then (runs of ``SPARK_MIN_MINUTES`` or more): one
        ``tests.chaos.spark_client`` process (a local SparkSession) that every
        ``SPARK_EVERY_S`` in turn appends a few hundred rows to ``stable`` through the
        Spark writer (a ``produce`` of mode ``spark``: each row's partition is chosen,
        its offset is not told) or reads ``stable`` whole (a ``read`` per partition)."""
        import queue
        import subprocess
        import sys

        rng = self.rng(proc)
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": str(root)}
        log = (self.params.out / "spark.log").open("ab")
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.spark_client"],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        answers: queue.Queue[dict[str, Any] | None] = queue.Queue()

        def pump() -> None:
            assert child.stdout is not None
            for line in child.stdout:
                answers.put(orjson.loads(line))
            answers.put(None)

        threading.Thread(target=pump, daemon=True).start()

        def answer(timeout: float) -> dict[str, Any] | None:
            deadline = time.monotonic() + timeout
            while not self.stop.is_set() and time.monotonic() < deadline:
                with contextlib.suppress(queue.Empty):
                    return answers.get(timeout=1)
            return None

        ids = itertools.count(1)

        def ask(cmd: dict[str, Any]) -> dict[str, Any] | None:
            """The answer to ``cmd`` (None: none in time); a late answer to an earlier
            command is dropped."""
            assert child.stdin is not None
            cmd_id = next(ids)
            try:
                child.stdin.write(orjson.dumps({**cmd, "id": cmd_id}) + b"\n")
                child.stdin.flush()
            except OSError:
                return None
            deadline = time.monotonic() + SPARK_JOB_TIMEOUT_S
            while (got := answer(deadline - time.monotonic())) is not None:
                if got.get("id") == cmd_id:
                    return got
            return None

        n = 0
        try:
            # A JVM's start on a loaded machine (two runs side by side) took over 120 s;
            # a process that dies answers None at once (``pump``).
            if answer(600) is None:
                self.errors.append(f"{proc}: the Spark process did not start (spark.log)")
                return
            self.stop.wait(rng.uniform(5, 20))
            while not self.stop.is_set():
                n += 1
                options = {
                    "coordinator": rng.choice(self.topo.coordinators).url,
                    "user": "admin",
                    "password": ADMIN_PASSWORD,
                }
                if n % 2:  # a write, then a read that finds it
                    self._spark_write(proc, ask, options, rng, n)
                else:
                    self._spark_read(proc, ask, options)
                if child.poll() is not None:
                    self.errors.append(f"{proc}: the Spark process died (spark.log)")
                    return
                self.stop.wait(rng.uniform(*SPARK_EVERY_S))
        finally:
            with contextlib.suppress(OSError):
                assert child.stdin is not None
                child.stdin.close()
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            log.close()

    def _spark_write(
        self,
        proc: str,
        ask: Callable[[dict[str, Any]], dict[str, Any] | None],
        options: dict[str, str],
        rng: random.Random,
        n: int,
    ) -> None:
        topic = "stable"
        size = rng.randint(100, 500)
        values = [f"{topic}|{proc}|{n}|{i}" for i in range(size)]
        parts = [rng.randrange(TOPICS[topic][0]) for _ in range(size)]
        op = self.hist.invoke(
            proc, "produce", topic=topic, mode="spark", values=values, keys=values, partitions=parts
        )
        got = ask(
            {
                "op": "write",
                "options": {**options, "topic": topic},
                "rows": [[p, v, v] for p, v in zip(parts, values, strict=True)],
            }
        )
        if got is not None and got.get("ok"):
            # Acknowledged, each row in its partition; the writer tells no offsets.
            self.hist.complete(op, proc, "produce", "ok", results=None, placed=True)
        else:
            error = (got or {}).get("error", "no answer")
            self.hist.complete(op, proc, "produce", "info", error=error)

    def _spark_read(
        self,
        proc: str,
        ask: Callable[[dict[str, Any]], dict[str, Any] | None],
        options: dict[str, str],
    ) -> None:
        """``stable`` read whole by one Spark job: one ``read`` op per partition (all
        invoked before the job, completed after it)."""
        topic = "stable"
        ops = {
            p: self.hist.invoke(proc, "read", topic=topic, partition=p, offset=None, spark=True)
            for p in range(TOPICS[topic][0])
        }
        got = ask({"op": "read", "options": {**options, "subscribe": topic}})
        if got is None or not got.get("ok"):
            error = (got or {}).get("error", "no answer")
            for op in ops.values():
                self.hist.complete(op, proc, "read", "info", error=error)
            return
        rows = sorted(got["rows"])
        for p, op in ops.items():
            records = [[o, v] for q, o, v in rows if q == p]
            self.hist.complete(op, proc, "read", "ok", records=records, high_watermark=None)

    # -- targeted probes ------------------------------------------------------------------

    def reincarnation_loop(self, proc: str) -> None:
        rng = self.rng(proc)
        n = itertools.count(1)
        while not self.stop.wait(rng.uniform(2, 6)):
            try:
                self.reincarnate(proc, rng, n)
            except httpx.HTTPError:
                pass  # a fault: the probe's operations are recorded as they ended
            except Exception:
                self.errors.append(f"{proc}: {traceback.format_exc()}")

    def reincarnate(self, proc: str, rng: random.Random, n: Iterator[int]) -> None:
        """Topic ``reborn`` written and read at offset 0 through one agent, deleted,
        created again under its name, written and read at offset 0 through the same
        agent (one connection: one worker), all within the agent's index-cache lifetime
        (``index_cache_ttl_s``, 30 s): an agent that serves the old incarnation's index
        to the new one returns records acknowledged in the old (``wrong_incarnation``)."""
        agent = rng.choice(self.topo.agents)
        v3 = f"{agent.url}/v3/clusters/{self.topo.cluster_id}"
        topic = "reborn"
        with self.client() as c:

            def produce() -> bool:
                i = next(n)
                values = [f"{topic}|{proc}|{i}|{j}" for j in range(rng.randint(2, 8))]
                return self._v2(c, proc, topic, values, values, False, i, url=agent.url)

            for _ in range(10):  # the agent may still know the last incarnation
                if produce() or self.stop.is_set():
                    break
                time.sleep(0.5)
            else:
                return
            if self.read(c, v3, proc, topic, 0, {"offset": 0, "timeout_ms": 0}) is None:
                return
            if not self.delete_topic(proc, topic):
                return
            for _ in range(10):
                if self.create_topic(proc, topic) or self.stop.is_set():
                    break
                time.sleep(0.5)
            else:
                return
            for _ in range(10):
                if produce() or self.stop.is_set():
                    break
                time.sleep(0.5)
            else:
                return
            self.read(c, v3, proc, topic, 0, {"offset": 0, "timeout_ms": 0})

    def idempotent_producer(self, proc: str) -> None:
        """An idempotent REST producer (``POST .../producers``, ``records:batch`` with a
        ``producer``) on ``stable``; now and then a probe of its fencing."""
        rng = self.rng(proc)
        state = IdempotentState()
        client = self.client()
        try:
            while not self.stop.wait(rng.uniform(0, 0.2)):
                try:
                    self.idempotent_round(client, proc, rng, state)
                except httpx.HTTPError:
                    client.close()
                    client = self.client()
                    self.stop.wait(0.5)
                except Exception:
                    self.errors.append(f"{proc}: {traceback.format_exc()}")
        finally:
            client.close()

    def idempotent_round(
        self,
        c: httpx.Client,
        proc: str,
        rng: random.Random,
        state: IdempotentState,
        probe: str | None = None,
    ) -> None:
        """One batch of the idempotent producer (a new producer id, or the next epoch,
        after any batch not acknowledged), or one of the probes (at most one):

        - ``resend``: an acknowledged batch sent again as it was (its answer lost): a
          duplicate, answered with the first offsets (else ``retry_answer_differs``,
          and the final log holds it twice: ``duplicate``);
        - ``zombie``: the producer's next epoch writes partitions, then the old epoch
          writes them (a zombie): refused (else ``zombie_write``);
        - ``gap``: a batch whose sequence skips ahead: refused (else
          ``out_of_sequence_write``).

        ``probe``: this one (``none``: a plain batch) rather than one drawn at random.
        """
        if state.producer_id < 0 and not self.init_producer(c, proc, state):
            self.stop.wait(0.5)  # the coordinator is away: not a request per 0.1 s meanwhile
            return
        topic = "stable"
        parts = [rng.randrange(TOPICS[topic][0]) for _ in range(rng.randint(1, 6))]
        probe = probe or rng.choices(["none", "resend", "zombie", "gap"], [85, 5, 5, 5])[0]
        if probe == "zombie":
            old = (state.epoch, dict(state.sequences))
            if not self.init_producer(c, proc, state, bump=True):
                return
            if self.idempotent_batch(c, proc, state, topic, parts) is None:
                return
            zombie = IdempotentState(state.producer_id, old[0], old[1], state.n)
            self.idempotent_batch(c, proc, zombie, topic, parts, probe="zombie")
            state.n = zombie.n
            return
        if probe == "gap":
            skip = {p: 3 for p in parts}
            self.idempotent_batch(c, proc, state, topic, parts, probe="gap", skip=skip)
            return
        body = self.idempotent_batch(c, proc, state, topic, parts)
        if body is not None and probe == "resend":
            op, results, content = body
            again = c.post(
                f"{self.v3}/topics/{topic}/records:batch",
                content=content,
                headers={"Content-Type": "application/json"},
            )
            self._resent(proc, op, again, _same_batch_offsets(results, again))

    def _resent(self, proc: str, op: int, again: httpx.Response, same: bool | None) -> None:
        """The answer to produce op ``op``'s request sent again with its Idempotency-Key
        (``same``: whether it gave the same offsets), as a ``resend`` info."""
        self.hist.info(
            proc, "resend", op_id=op, status=again.status_code, same=same, answer=again.text[:2000]
        )

    def init_producer(
        self, c: httpx.Client, proc: str, state: IdempotentState, bump: bool = False
    ) -> bool:
        """A new producer id (or, ``bump``, the next epoch of this one); sequences from 0."""
        body = {"producer_id": state.producer_id, "producer_epoch": state.epoch} if bump else {}
        op = self.hist.invoke(proc, "init_producer", **body)
        try:
            r = c.post(f"{self.v3}/producers", json=body)
        except httpx.HTTPError as e:
            self.hist.complete(op, proc, "init_producer", "info", error=repr(e))
            state.producer_id = -1
            raise
        if r.status_code != 200:
            self.hist.complete(op, proc, "init_producer", _outcome(r.status_code), error=r.text)
            state.producer_id = -1  # a new id next time
            return False
        d = r.json()
        state.producer_id, state.epoch = d["producer_id"], d["producer_epoch"]
        state.sequences = {}
        self.hist.complete(op, proc, "init_producer", "ok", **d)
        return True

    def idempotent_batch(
        self,
        c: httpx.Client,
        proc: str,
        state: IdempotentState,
        topic: str,
        parts: list[int],
        probe: str | None = None,
        skip: dict[int, int] | None = None,
    ) -> tuple[int, list[Any], bytes] | None:
        """One records:batch of the idempotent producer ``state`` (a record per entry of
        ``parts``, to that partition), retried as it is on a retriable error or a lost
        answer. Acknowledged: (op id, results, the body sent), the sequences advanced;
        else None and, unless refused outright, a new epoch for the next batch (what was
        stored of it is unknown)."""
        state.n += 1
        values = [f"{topic}|{proc}|{state.n}|{i}" for i in range(len(parts))]
        counts = Counter(parts)
        sequences = {p: state.sequences.get(p, 0) + (skip or {}).get(p, 0) for p in counts}
        producer = {
            "producer_id": state.producer_id,
            "producer_epoch": state.epoch,
            "sequences": [{"partition_id": p, "sequence": q} for p, q in sequences.items()],
        }
        entries = [
            {
                "id": str(i),
                "partition_id": p,
                "key": {"type": "BINARY", "data": b64(v)},
                "value": {"type": "BINARY", "data": b64(v)},
            }
            for i, (p, v) in enumerate(zip(parts, values, strict=True))
        ]
        content = orjson.dumps({"producer": producer, "entries": entries})
        op = self.hist.invoke(
            proc,
            "produce",
            topic=topic,
            mode="v3-idem",
            values=values,
            keys=values,
            partitions=parts,
            producer={
                "producer_id": state.producer_id,
                "producer_epoch": state.epoch,
                "sequences": {str(p): q for p, q in sequences.items()},
            },
            probe=probe,
        )
        tries: list[str] = []
        outcome = "info"
        for attempt in range(4):
            if attempt:
                time.sleep(0.5)
            try:
                r = c.post(
                    f"{self.v3}/topics/{topic}/records:batch",
                    content=content,
                    headers={"Content-Type": "application/json"},
                )
            except httpx.HTTPError as e:
                tries.append(repr(e)[:200])
                continue
            if r.status_code == 207:
                d = r.json()
                if not d["failures"] and len(d["successes"]) == len(values):
                    results: list[Any] = [None] * len(values)
                    for x in d["successes"]:
                        results[int(x["id"])] = [x["partition_id"], x["offset"]]
                    self.hist.complete(op, proc, "produce", "ok", results=results, tries=tries)
                    for p, k in counts.items():
                        state.sequences[p] = sequences[p] + k
                    return op, results, content
                codes = {x.get("error_code") for x in d["failures"]}
                tries.append(f"207 {sorted(codes, key=str)} {r.text[:200]}")
                if all(isinstance(x, int) and x < 50000 for x in codes) and not d["successes"]:
                    outcome = "fail" if attempt == 0 else "info"
                    break
                continue
            tries.append(f"{r.status_code} {r.text[:200]}")
            if r.status_code < 500 and r.status_code not in (408, 429):
                outcome = "fail" if attempt == 0 else "info"
                break
        self.hist.complete(op, proc, "produce", outcome, error=tries[-1] if tries else "")
        if probe is None or outcome != "fail":
            state.producer_id = -1  # what was stored is unknown (or refused): start anew
        return None

    # -- the nemesis ----------------------------------------------------------------------

    def nemesis(self) -> None:
        proc = "nemesis"
        rng = self.rng(proc)
        proxy = self.topo.proxy
        assert proxy is not None
        while not self.stop.wait(rng.uniform(2, 6)):
            kind = rng.choice(
                [
                    "s3",
                    "s3",
                    "kill_agent",
                    "kill_agent",
                    "kill_coordinator",
                    "pause_agent",
                    "pause_coordinator",
                    *self.faults.kinds(),
                ]
            )
            try:
                if kind in self.faults.kinds():
                    self.faults.inject(proc, kind, rng, self.churn_lock)
                elif kind == "s3":
                    rule = rng.choice(
                        [
                            {"action": "status", "status": 503, "rate": 0.2},
                            {
                                "action": "status",
                                "status": 500,
                                "when": "after",
                                "rate": 0.1,
                                "method": "PUT",
                            },
                            {"action": "reset", "rate": 0.1},
                            {"action": "reset", "when": "after", "rate": 0.1},
                            {"action": "delay", "delay_s": rng.uniform(0.2, 2.0), "rate": 0.3},
                        ]
                    )
                    secs = rng.uniform(2, 6)
                    self.hist.info(
                        proc,
                        "fault",
                        kind=f"s3_{rule['action']}",
                        rule=rule,
                        seconds=round(secs, 2),
                    )
                    proxy.set_rules(rule)
                    self.stop.wait(secs)
                    proxy.clear()
                else:
                    agents = kind.endswith("_agent")
                    svc = rng.choice(self.topo.agents if agents else self.topo.coordinators)
                    # A pause outlasts the lease and session timeouts now and then (10 s).
                    down = rng.uniform(0.5, 3) if kind.startswith("kill") else rng.uniform(1, 12)
                    self.hist.info(
                        proc, "fault", kind=kind, target=svc.name, seconds=round(down, 2)
                    )
                    if kind.startswith("kill"):
                        svc.kill()
                        self.stop.wait(down)
                        svc.restart()
                    else:  # SIGSTOP: frozen, its connections open, then SIGCONT
                        os.kill(svc.pid, signal.SIGSTOP)
                        try:
                            time.sleep(down)
                        finally:
                            os.kill(svc.pid, signal.SIGCONT)
            except Exception:
                self.errors.append(f"{proc}: {traceback.format_exc()}")

    # -- the end --------------------------------------------------------------------------

    def quiesce(self) -> None:
        assert self.topo.proxy is not None
        self.topo.proxy.clear()
        self.faults.undo()
        self.topo.ensure_running()
        time.sleep(8)  # agents flush, janitors run a round (intervals of 2-4 s)

    def final_reads(self, topics: Iterable[str] = TOPICS, groups: Iterable[str] = GROUPS) -> None:
        """Every partition of ``topics`` read whole, and the committed offsets of
        ``groups`` on ``stable``."""
        proc = "final"
        with self.client(timeout=60) as c:
            for topic in topics:
                tid = self.topic_id(topic)
                r = c.get(f"{self.v3}/topics/{topic}/partitions")
                if tid is None or r.status_code != 200:
                    self.hist.info(proc, "final_missing", topic=topic, status=r.status_code)
                    continue
                for part in r.json()["data"]:
                    p = part["partition_id"]
                    self._final_partition(c, proc, topic, tid, p)
            self._final_committed(proc, groups, "stable", topic_id=self.topic_id("stable"))

    def _final_partition(self, c: httpx.Client, proc: str, topic: str, tid: str, p: int) -> None:
        url = f"{self.v3}/topics/{topic}/partitions/{p}/records"
        records: list[list[Any]] = []
        first = c.get(url, params={"max_bytes": 1, "timeout_ms": 0}).json()
        ls, hw = first["log_start_offset"], first["high_watermark"]
        offset = ls
        while offset < hw:
            r = c.get(url, params={"offset": offset, "max_bytes": 1 << 20, "timeout_ms": 0})
            if r.status_code != 200:
                self.hist.info(
                    proc, "final_error", topic=topic, partition=p, offset=offset, error=r.text[:300]
                )
                break
            d = r.json()
            if not d["records"]:
                break
            records += [[x["offset"], unb64(x["key"]), unb64(x["value"])] for x in d["records"]]
            offset = d["next_offset"]
        op = self.hist.invoke(proc, "final_read", topic=topic, partition=p)
        self.hist.complete(
            op,
            proc,
            "final_read",
            "ok",
            topic=topic,
            topic_id=tid,
            partition=p,
            log_start=ls,
            high_watermark=hw,
            records=records,
            compacted=TOPICS[topic][1].get("cleanup.policy") == "compact",
            # Transaction markers take offsets no record holds; tiering drops aborted ones.
            markers=topic == TXN_TOPIC,
        )

    def _final_committed(
        self,
        proc: str,
        groups: Iterable[str],
        topic: str,
        name: str = "final_committed",
        **detail: Any,
    ) -> None:
        """Each group's committed offsets on ``topic`` (those set), as a ``name`` op with
        ``detail``."""
        from confluent_kafka import ConsumerGroupTopicPartitions
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.kafka_conf())
        for group in groups:
            try:
                fut = admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group)], request_timeout=15
                )[group]
                res = fut.result(timeout=20)
            except Exception as e:
                self.hist.info(proc, "final_committed_error", group=group, error=repr(e))
                continue
            offsets = {
                str(tp.partition): tp.offset
                for tp in res.topic_partitions
                if tp.topic == topic and tp.offset >= 0
            }
            op = self.hist.invoke(proc, name, group=group)
            self.hist.complete(
                op, proc, name, "ok", group=group, topic=topic, **detail, offsets=offsets
            )


#: Objects whose keys the storage check compares (what garbage collection owns).
STORAGE_PREFIXES = ("segments/", "tiered/")
#: How long beyond GC grace an unreferenced object may wait when no GC pass that began
#: after it was due has finished (GC stuck, or never running): GC runs every 3 s, but a
#: pass over hundreds of objects takes 30-40 s on a loaded box (one conditional row
#: delete, on every shard, and one S3 DELETE each), behind a lease of 10 s that a killed
#: coordinator may still hold. An object due before a pass that finished ok began is a
#: leak whatever its age (``gc_pass_started``).
GC_SLACK_S = 120.0
#: The start of the last garbage-collection pass that finished ok (any coordinator).
_GC_PASS_STARTED = (
    "SELECT MAX(started_at) FROM janitor_runs"
    " WHERE janitor = 'gc' AND outcome = 'ok' AND finished_at IS NOT NULL"
)
_REFERENCED = (
    "SELECT o.object_key FROM objects o"
    " WHERE EXISTS (SELECT 1 FROM index_entries e WHERE e.object_id = o.object_id)"
    " OR EXISTS (SELECT 1 FROM table_files f WHERE f.object_id = o.object_id)"
)
_OBJECT_ROWS = "SELECT object_key, unreferenced_at FROM objects"
_PENDING = (
    "SELECT p.object_key, l.expires_at FROM pending_objects p"
    " JOIN write_leases l ON l.lease_id = p.lease_id"
)


def _query(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on one metadata database, read only."""
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        with contextlib.closing(
            sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        ) as conn:
            return conn.execute(sql).fetchall()
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as conn:
        return conn.execute(sql).fetchall()


def storage_snapshot(topo: Topology, db_urls: list[str], stopped_at: float) -> dict[str, Any]:
    """What the metadata references and what the bucket holds, once every process of the
    topology has stopped (``stopped_at``): nothing changes between the two reads, so no
    janitor caught between its steps (GC drops an object's row, then the object) can
    fake an anomaly. ``referenced``: keys an index entry or an Iceberg table holds;
    ``listed``: key -> modified; ``rows``: key -> unreferenced since (None: not stamped);
    ``gc_pass_started``: when the last GC pass that finished ok began (None: none did);
    ``pending``: key -> when the write lease holding that upload lapses.
    """
    import boto3

    referenced = sorted({k for url in db_urls for (k,) in _query(url, _REFERENCED)})
    rows: dict[str, float | None] = {}
    for url in db_urls:
        for key, since in _query(url, _OBJECT_ROWS):
            # Sharded: one row per shard; unreferenced since the last stamp, if all are.
            if key in rows and (rows[key] is None or since is None):
                rows[key] = None
            else:
                rows[key] = None if since is None else max(float(since), rows.get(key) or 0.0)
    passes = [
        float(started)
        for url in db_urls
        for (started,) in _query(url, _GC_PASS_STARTED)
        if started is not None
    ]
    pending: dict[str, float] = {}
    for url in db_urls:
        for key, expires in _query(url, _PENDING):
            pending[key] = max(float(expires), pending.get(key, 0.0))
    prefix = topo.store_url.split("/", 3)[3].strip("/") + "/"
    s3 = boto3.client("s3", endpoint_url=topo.moto_endpoint)
    listed: dict[str, float] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=topo.bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            key = o["Key"].removeprefix(prefix)
            if key.startswith(STORAGE_PREFIXES):
                listed[key] = o["LastModified"].timestamp()
    return {
        "referenced": referenced,
        "listed": listed,
        "rows": rows,
        "now": stopped_at,
        "grace_s": float(COORDINATOR_ENV["LAKELOG_GC_GRACE_S"]),
        "slack_s": GC_SLACK_S,
        "gc_pass_started": max(passes, default=None),
        "pending": pending,
    }


class _Refused(Exception):
    """An answer a healthy consumer would not get (the instance is abandoned)."""


def _expect(r: httpx.Response, status: int) -> None:
    if r.status_code != status:
        raise _Refused(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:200]}")


def _same_offsets(first: list[Any], again: httpx.Response) -> bool | None:
    """Whether a keyed resend was answered with the first answer's offsets: None when
    there is nothing to compare (a record failed either time: a retry may store it)."""
    if again.status_code != 200 or None in first:
        return None
    offsets = again.json().get("offsets") or []
    second = [[o.get("partition"), o.get("offset")] for o in offsets]
    if len(second) != len(first) or any(o.get("error_code") is not None for o in offsets):
        return None
    return second == first


def _same_batch_offsets(first: list[Any], again: httpx.Response) -> bool | None:
    """Whether a resent records:batch was answered with the first answer's offsets
    (None: refused, nothing to compare)."""
    if again.status_code != 207:
        return None
    d = again.json()
    if d.get("failures") or len(d.get("successes") or []) != len(first):
        return None
    second: list[Any] = [None] * len(first)
    for x in d["successes"]:
        second[int(x["id"])] = [x["partition_id"], x["offset"]]
    return second == first


@dataclass
class IdempotentState:
    """An idempotent REST producer: its id (-1: ask for one), epoch and next sequence
    per partition; ``n`` numbers its batches (values are unique in the run)."""

    producer_id: int = -1
    epoch: int = 0
    sequences: dict[int, int] = field(default_factory=dict)
    n: int = 0


def _decode_cursor(cursor: str) -> dict[str, int]:
    """A group stream's cursor as {partition: next offset} of ``stable`` (the stream's
    encoding: URL-safe base64 of JSON ``{"partition:topic": offset}``)."""
    doc = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    return {k.split(":", 1)[0]: v for k, v in doc.items() if k.split(":", 1)[1] == "stable"}


class _Abandoned(Exception):
    """A client call that outlived its own timeout; its instance is given up."""


def _bounded(fn: Callable[[], Any], limit: float) -> Any:
    """``fn()`` in a thread of its own, given up after ``limit`` s (``_Abandoned``).

    librdkafka's ``send_offsets_to_transaction`` ignores its timeout when the group
    coordinator it cached goes away (confluentinc/librdkafka#5456, #5511: an agent killed
    here), and would hang its worker for the rest of the run; the thread left behind
    holds only the abandoned instance, which the next instance of the id fences."""
    box: list[Any] = []

    def call() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:
            box.append((False, e))

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(limit)
    if not box:
        raise _Abandoned(f"no answer in {limit} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _outcome(status: int) -> str:
    """A 4xx refused before anything happened; a 5xx (or 408/429) may or may not have."""
    return "fail" if status < 500 and status not in (408, 429) else "info"


# -- the whole run ----------------------------------------------------------------------------


def _databases(profile: str, tmp: Path) -> tuple[str, dict[str, str], Callable[[], None]]:
    """(the coordinators' LAKELOG_DB, more of their environment, how to drop it all)."""
    if profile == "sqlite":
        return f"sqlite:///{tmp / 'meta.db'}", {}, lambda: None
    import psycopg

    from tests.conftest import PG_ADMIN_URL

    info = psycopg.conninfo.conninfo_to_dict(PG_ADMIN_URL)
    prefix = (
        f"postgresql://{info.get('user', 'postgres')}@{info.get('host', '127.0.0.1')}:"
        f"{info.get('port', '5432')}/"
    )
    names = [
        f"lakelog_chaos_{uuid.uuid4().hex[:10]}" for _ in range(3 if profile == "sharded" else 1)
    ]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as admin:
        for name in names:
            admin.execute(f"CREATE DATABASE {name}")

    def drop() -> None:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=10) as admin:
            for name in names:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    env = {"LAKELOG_DB_SHARDS": ",".join(prefix + n for n in names[1:])} if names[1:] else {}
    return prefix + names[0], env, drop


def run(params: Params) -> dict[str, Any]:
    """Run, check, and return the summary (``anomaly_counts`` empty: no anomaly)."""
    if params.profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}")
    params.out.mkdir(parents=True, exist_ok=True)
    for k, v in S3_ENV.items():  # moto's fake credentials, for this process's boto3
        os.environ.setdefault(k, v)
    history_path = params.out / "history.jsonl"
    hist = History(history_path)
    hist.info(
        "runner",
        "params",
        seed=params.seed,
        minutes=params.minutes,
        profile=params.profile,
        break_env=params.break_env,
    )
    moto, endpoint = start_moto(params.out)
    db_url, db_env, drop_db = _databases(params.profile, params.out)
    topo: Topology | None = None
    started = time.monotonic()
    errors: list[str] = []
    finished = False
    try:
        topo = start_topology(
            params.out / "cluster",
            endpoint,
            db_url,
            agents=2,
            coordinators=1 if params.profile == "sqlite" else 2,
            agent_env={**AGENT_ENV, **params.break_env},
            coordinator_env={**COORDINATOR_ENV, **db_env, **params.break_env},
            seed=params.seed,
        )
        r = Run(topo, hist, params)
        for topic in TOPICS:
            assert r.create_topic("setup", topic), f"cannot create {topic}"
        workers = [
            threading.Thread(target=r.rest_producer, args=("rest-1",)),
            threading.Thread(target=r.rest_producer, args=("rest-2",)),
            threading.Thread(target=r.kafka_producer, args=("kafka-producer-1",)),
            threading.Thread(target=r.idempotent_producer, args=("idem-1",)),
            threading.Thread(target=r.reincarnation_loop, args=("reborn-1",)),
            threading.Thread(target=r.v3_reader, args=("v3-reader-1",)),
            threading.Thread(target=r.v2_consumer, args=("v2-consumer-1",)),
            threading.Thread(target=r.kafka_consumer, args=("kafka-consumer-1",)),
            threading.Thread(target=r.kafka_consumer, args=("kafka-consumer-2",)),
            threading.Thread(target=r.group_stream, args=("group-stream-1",)),
            *(threading.Thread(target=r.txn_producer, args=(p,)) for p in TXN_PRODUCERS),
            threading.Thread(target=r.txn_reader, args=("txn-reader-rc", "read_committed")),
            threading.Thread(target=r.txn_reader, args=("txn-reader-ru", "read_uncommitted")),
            threading.Thread(target=r.admin_loop),
            *(
                [threading.Thread(target=r.spark_loop, args=("spark-1",))]
                if params.minutes >= SPARK_MIN_MINUTES
                else []
            ),
            threading.Thread(target=r.nemesis),
        ]
        for w in workers:
            w.daemon = True
            w.start()
        r.stop.wait(params.minutes * 60)
        r.stop.set()
        for w in workers:
            w.join(90)
            if w.is_alive():
                errors.append(f"a client thread did not stop: {w.name}")
        r.quiesce()
        r.txn_settle()
        r.final_reads()
        r.final_txn()
        errors += r.errors
        finished = True
    finally:
        stopped_at = time.time()
        if topo is not None:
            topo.stop()
        if topo is not None and finished:
            db_urls = [db_url, *filter(None, db_env.get("LAKELOG_DB_SHARDS", "").split(","))]
            try:
                hist.info("final", "storage", **storage_snapshot(topo, db_urls, stopped_at))
            except Exception:
                errors.append(f"storage snapshot: {traceback.format_exc()}")
        hist.close()
        moto.stop()
        with contextlib.suppress(Exception):
            drop_db()
    report = check(read_history(history_path))
    summary = {
        "seed": params.seed,
        "profile": params.profile,
        "minutes": params.minutes,
        "seconds": round(time.monotonic() - started, 1),
        "history": str(history_path),
        **report.summary(),
        "client_errors": errors[:10],
    }
    (params.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
