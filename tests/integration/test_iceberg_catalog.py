"""The topic tables through the Iceberg REST catalog, with pyiceberg's own RestCatalog.

Two real deployments, one module-scoped each:

- ``lakelog serve`` (SQLite, ``file://`` store) with authentication and ACLs: records go
  in through the Kafka door (kafka-python, SASL/PLAIN), ``lakelog janitor tier`` tiers
  and publishes, pyiceberg lists, loads and scans; Spark reads the table's data files
  with its own Parquet reader;
- a coordinator process on S3 (a moto server): a table scanned through the catalog of
  the coordinator, with storage properties from its config; a snapshot read after
  retention, until expiry.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition
from pyiceberg.catalog import load_catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import ForbiddenError, NoSuchTableError, UnauthorizedError

from coordinator.iceberg.tables import TopicTables, changes_of
from tests.integration import test_shards
from tests.integration.test_security_processes import ROOT, run_cli, start_secured_serve
from tests.procs import Proc, lakelog_cmd, start_coordinator, start_moto
from tests.unit.janitor_helpers import table_rows

pytestmark = pytest.mark.integration

ADMIN_PW = "admin-password-123"
READER_PW = "reader-password-123"
TOPIC = "orders"
SECRET_TOPIC = "payroll"
RECORDS = 400


@dataclass
class Served:
    url: str
    kafka: str
    db: str
    store: str
    tmp: Path
    proc: Proc

    @property
    def catalog_uri(self) -> str:
        return f"{self.url}/iceberg"


def _basic(user: str, pw: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()}


def _catalog(served: Served, user: str, pw: str, *, oauth: bool = False) -> RestCatalog:
    """pyiceberg's RestCatalog as a user configures it (Basic, or OAuth2 credentials)."""
    props: dict[str, Any] = {"type": "rest", "uri": served.catalog_uri}
    if oauth:
        props["credential"] = f"{user}:{pw}"
        props["oauth2-server-uri"] = f"{served.catalog_uri}/v1/oauth/tokens"
    else:
        props["auth"] = {"type": "basic", "basic": {"username": user, "password": pw}}
    catalog = load_catalog("lake", **props)
    assert isinstance(catalog, RestCatalog)
    return catalog


def _kafka_conf(served: Served) -> dict[str, Any]:
    return {
        "bootstrap_servers": served.kafka,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "admin",
        "sasl_plain_password": ADMIN_PW,
    }


def _janitor(served: Served, name: str) -> dict[str, Any]:
    done = subprocess.run(
        lakelog_cmd(
            "janitor", name, "--db", served.db, "--store", served.store, "--tier-age-s", "0"
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("iceberg-serve")
    proc, port, kport = start_secured_serve(
        tmp,
        "admin",
        ADMIN_PW,
        {
            "LAKELOG_AUTHORIZATION": "acl",
            "LAKELOG_SUPER_USERS": "User:admin",
            "LAKELOG_JANITORS": "none",
            "LAKELOG_AUTH_CACHE_TTL_S": "0.5",
        },
    )
    db = f"sqlite:///{tmp / 'meta.db'}"
    s = Served(
        f"http://127.0.0.1:{port}", f"127.0.0.1:{kport}", db, f"file://{tmp / 'data'}", tmp, proc
    )
    try:
        for user in ("reader", "describer", "outsider"):
            made = run_cli(
                "users", "create", user, "--password-stdin", "--db", db, stdin=READER_PW + "\n"
            )
            assert made.returncode == 0, made.stderr
        admin = _basic("admin", ADMIN_PW)
        cid = httpx.get(f"{s.url}/v3/clusters", headers=admin).json()["data"][0]["cluster_id"]
        for topic in (TOPIC, SECRET_TOPIC):
            r = httpx.post(
                f"{s.url}/v3/clusters/{cid}/topics",
                json={"topic_name": topic, "partitions_count": 2},
                headers=admin,
            )
            assert r.status_code == 201, r.text
        for user, op in (("reader", "READ"), ("describer", "DESCRIBE")):
            r = httpx.post(
                f"{s.url}/v3/clusters/{cid}/acls",
                json={
                    "resource_type": "TOPIC",
                    "resource_name": TOPIC,
                    "pattern_type": "LITERAL",
                    "principal": f"User:{user}",
                    "host": "*",
                    "operation": op,
                    "permission": "ALLOW",
                },
                headers=admin,
            )
            assert r.status_code == 201, r.text
        producer = KafkaProducer(**_kafka_conf(s), enable_idempotence=False)
        for i in range(RECORDS):
            headers = [("i", str(i).encode())] if i % 3 == 0 else []
            value = None if i % 50 == 7 else f"value-{i}".encode() * (1 + i % 5)
            producer.send(
                TOPIC, key=f"k{i % 37}".encode(), value=value, partition=i % 2, headers=headers
            )
            producer.send(SECRET_TOPIC, value=b"salary", partition=0)
        producer.flush(30)
        producer.close()
        report = _janitor(s, "tier")
        assert report["objects_written"] >= 2 and report["snapshots_published"] >= 1, report
        yield s
    finally:
        proc.stop()


def _door(served: Served, topic: str, partitions: int, ends: dict[int, int]) -> list[tuple]:
    """The Kafka door's read of offsets [0, ends[p]) of each partition."""
    consumer = KafkaConsumer(**_kafka_conf(served), enable_auto_commit=False)
    out = []
    try:
        for p in range(partitions):
            tp = KTopicPartition(topic, p)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got: list[Any] = []
            while len(got) < ends[p]:
                batch = consumer.poll(timeout_ms=5000)
                assert batch, f"the Kafka door stopped at {len(got)} of {ends[p]}"
                for msgs in batch.values():
                    got += msgs
            for m in got[: ends[p]]:
                hs = tuple((k, v) for k, v in m.headers)
                out.append((m.partition, m.offset, m.key, m.value, m.timestamp, hs))
    finally:
        consumer.close()
    return sorted(out, key=lambda t: (t[0], t[1]))


def test_pyiceberg_lists_loads_and_scans_equal_to_the_kafka_door(served: Served) -> None:
    """pyiceberg's RestCatalog against ``lakelog serve``: the namespace, the tables, and a
    scan equal record for record to what the Kafka door reads of the tiered range."""
    catalog = _catalog(served, "admin", ADMIN_PW)
    assert catalog.list_namespaces() == [("topics",)]
    assert set(catalog.list_tables("topics")) >= {("topics", TOPIC), ("topics", SECRET_TOPIC)}
    table = catalog.load_table(("topics", TOPIC))
    assert table.metadata.properties["lakelog.read-only"] == "true"
    rows = table_rows(table.scan().to_arrow())
    assert len(rows) == RECORDS
    ends = {p: 1 + max(r[1] for r in rows if r[0] == p) for p in (0, 1)}
    assert _door(served, TOPIC, 2, ends) == rows
    # The data files are the tier objects themselves: no copy.
    for task in table.scan().plan_files():
        assert task.file.file_path.startswith(f"{served.store}/tiered/{TOPIC}/partition=")
    # Filters prune by partition and offset statistics.
    some = table.scan(row_filter="partition = 1 and offset >= 150").to_arrow()
    assert sorted(some.column("offset").to_pylist()) == list(range(150, ends[1]))


def test_oauth_client_credentials_give_a_token_the_catalog_accepts(served: Served) -> None:
    """``credential`` (OAuth2 client credentials) as pyiceberg and Iceberg's Java client
    send it: exchanged at /v1/oauth/tokens for a bearer token used from then on."""
    catalog = _catalog(served, "reader", READER_PW, oauth=True)
    assert catalog.list_tables("topics") == [("topics", TOPIC)]
    assert catalog.load_table(("topics", TOPIC)).scan().to_arrow().num_rows == RECORDS
    bad = httpx.post(
        f"{served.catalog_uri}/v1/oauth/tokens",
        data={"grant_type": "client_credentials", "client_id": "reader", "client_secret": "no"},
    )
    assert bad.status_code == 401 and bad.json()["error"] == "invalid_client"
    forged = httpx.get(
        f"{served.catalog_uri}/v1/lakelog/namespaces",
        headers={"Authorization": "Bearer llk1.eyJwIjoiVXNlcjphZG1pbiJ9.00"},
    )
    assert forged.status_code == 401
    assert forged.json()["error"]["type"] == "NotAuthorizedException"


def test_acls_decide_what_each_principal_lists_and_loads(served: Served) -> None:
    """READ loads, DESCRIBE lists but may not load (403), nothing hides the table (404);
    no credential or a wrong one is 401, in the spec's error shape."""
    reader = _catalog(served, "reader", READER_PW)
    assert reader.list_tables("topics") == [("topics", TOPIC)]
    with pytest.raises(NoSuchTableError):
        reader.load_table(("topics", SECRET_TOPIC))
    describer = _catalog(served, "describer", READER_PW)
    assert describer.list_tables("topics") == [("topics", TOPIC)]
    with pytest.raises(ForbiddenError):
        describer.load_table(("topics", TOPIC))
    outsider = _catalog(served, "outsider", READER_PW)
    assert outsider.list_tables("topics") == []
    with pytest.raises(NoSuchTableError):
        outsider.load_table(("topics", TOPIC))
    with pytest.raises(UnauthorizedError):
        _catalog(served, "reader", "wrong-password").list_tables("topics")
    anonymous = httpx.get(f"{served.catalog_uri}/v1/lakelog/namespaces/topics/tables")
    assert anonymous.status_code == 401
    assert anonymous.json() == {
        "error": {
            "message": anonymous.json()["error"]["message"],
            "type": "NotAuthorizedException",
            "code": 401,
        }
    }


def test_the_catalog_refuses_every_write(served: Served) -> None:
    """Tables are read-only to outside engines: the config announces only read endpoints
    (pyiceberg then refuses writes itself), and the server answers 403 to any write."""
    admin = _catalog(served, "admin", ADMIN_PW)
    with pytest.raises(NotImplementedError, match="does not support endpoint"):
        admin.create_namespace("mine")
    table = admin.load_table(("topics", TOPIC))
    with pytest.raises(NotImplementedError, match="does not support endpoint"):
        table.transaction().set_properties(owner="me").commit_transaction()
    base = f"{served.catalog_uri}/v1/lakelog/namespaces/topics"
    auth = _basic("admin", ADMIN_PW)
    for method, url, body in (
        ("DELETE", f"{base}/tables/{TOPIC}", None),
        ("POST", f"{base}/tables/{TOPIC}", {"requirements": [], "updates": []}),
        ("POST", f"{base}/tables", {"name": "new", "schema": {}}),
        ("POST", f"{served.catalog_uri}/v1/lakelog/namespaces", {"namespace": ["x"]}),
    ):
        r = httpx.request(method, url, json=body, headers=auth)
        assert r.status_code == 403, (method, url, r.text)
        assert r.json()["error"]["type"] == "ForbiddenException"
    # Nothing changed.
    assert admin.load_table(("topics", TOPIC)).metadata_location == table.metadata_location


def test_load_table_answers_304_while_the_table_is_unchanged(served: Served) -> None:
    url = f"{served.catalog_uri}/v1/lakelog/namespaces/topics/tables/{TOPIC}"
    admin = _basic("admin", ADMIN_PW)
    first = httpx.get(url, headers=admin)
    assert first.status_code == 200 and first.headers["etag"]
    again = httpx.get(url, headers={**admin, "If-None-Match": first.headers["etag"]})
    assert again.status_code == 304


def test_spark_native_parquet_read_of_the_table_files_equals_format_lakelog(
    served: Served, spark: Any
) -> None:
    """Spark's own Parquet reader over the table's data files (what Spark's Iceberg
    runtime reads) returns the rows ``format("lakelog")`` returns for the tiered range."""
    table = _catalog(served, "admin", ADMIN_PW).load_table(("topics", TOPIC))
    paths = [t.file.file_path for t in table.scan().plan_files()]
    native = spark.read.parquet(*paths)
    ours = (
        spark.read.format("lakelog")
        .option("db", served.db)
        .option("store", served.store)
        .option("subscribe", TOPIC)
        .option("includeHeaders", "true")
        .load()
    )
    cols = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]

    def rows(df: Any) -> list[tuple[Any, ...]]:
        return sorted((tuple(r) for r in df.select(*cols).collect()), key=lambda t: (t[3], t[4]))

    assert rows(native) == rows(ours)
    assert native.count() == RECORDS


# -- a coordinator process on S3 --------------------------------------------------------


@dataclass
class OnS3:
    coordinator: str
    endpoint: str
    db: str
    store: str


@pytest.fixture(scope="module")
def on_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OnS3]:
    tmp = tmp_path_factory.mktemp("iceberg-s3")
    moto, endpoint = start_moto(tmp)
    env_keys = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    os.environ.update({**env_keys, "AWS_DEFAULT_REGION": "us-east-1"})
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="lake")
    db = f"sqlite:///{tmp / 'meta.db'}"
    store = "s3://lake/c1"
    proc, url = start_coordinator(tmp, db, store_url=store, store_endpoint=endpoint)
    try:
        yield OnS3(url, endpoint, db, store)
    finally:
        proc.stop()
        moto.stop()


def test_coordinator_catalog_on_s3_and_snapshot_reads_after_retention(on_s3: OnS3) -> None:
    """Through the coordinator's catalog on S3: tier, then retention drops the oldest
    object; the current snapshot lacks its rows, the previous snapshot still reads them
    while retained, and after expiry loading that snapshot fails cleanly."""
    from coordinator.http.client import http_coordinator
    from index.log import LogWriter
    from segments.segment import SegmentBuilder
    from segments.store import open_store
    from segments.types import Record

    coord = http_coordinator([on_s3.coordinator])
    store = open_store(on_s3.store, endpoint_url=on_s3.endpoint, region="us-east-1")
    try:
        coord.create_topic("events", 1, {"retention.ms": "86400000"})
        topic_id = coord.get_topic("events").topic_id
        writer = LogWriter(store, coord)
        old_ms = int(time.time() * 1000) - 3 * 86_400_000
        for batch, ts in ((0, old_ms), (1, int(time.time() * 1000))):
            b = SegmentBuilder()
            b.append(
                topic_id,
                0,
                [Record(b"k%d" % i, b"v%d-%d" % (batch, i), ts + i, ()) for i in range(50)],
            )
            writer.write(b)
            run = _coordinator_janitor(on_s3, "tier")
            assert run["objects_written"] == 1
    finally:
        store.close()
    catalog = load_catalog(
        "s3lake",
        type="rest",
        uri=f"{on_s3.coordinator}/iceberg",
        **{"s3.access-key-id": "test", "s3.secret-access-key": "test"},
    )
    table = catalog.load_table(("topics", "events"))
    assert table.io.properties.get("s3.endpoint") == on_s3.endpoint  # from the config
    before = table.current_snapshot()
    assert before is not None
    assert table.scan().to_arrow().num_rows == 100
    assert _coordinator_janitor(on_s3, "retention")["rows_dropped"] == 1
    table = catalog.load_table(("topics", "events"))
    assert sorted(table.scan().to_arrow().column("offset").to_pylist()) == list(range(50, 100))
    old = table.scan(snapshot_id=before.snapshot_id).to_arrow()
    assert sorted(old.column("offset").to_pylist()) == list(range(100))
    # Expiry: the coordinator's table janitor with a retention of 0 ms for snapshots.
    coord.alter_configs("events", {"table.snapshot.retention.ms": "0"})
    assert _coordinator_janitor(on_s3, "table")["snapshots_expired"] >= 1
    table = catalog.load_table(("topics", "events"))
    assert table.snapshot_by_id(before.snapshot_id) is None
    with pytest.raises(ValueError, match="Snapshot not found"):
        table.scan(snapshot_id=before.snapshot_id).to_arrow()
    coord.close()


def _coordinator_janitor(on_s3: OnS3, name: str) -> dict[str, Any]:
    r = httpx.post(
        f"{on_s3.coordinator}/v1/janitors/{name}/run", json={"tier_age_s": 0}, timeout=120
    )
    assert r.status_code == 200, r.text
    last = json.loads(r.text.strip().splitlines()[-1])
    assert "report" in last, last
    report: dict[str, Any] = last["report"]
    return report


def test_spark_reads_the_topic_as_of_a_time_past_delete_records_and_latest_by_key(
    served: Served, spark: Any
) -> None:
    """``asOfTimestamp`` reads the table snapshot of that time: records DeleteRecords has
    since dropped (below log-start, unreadable live) come back; ``asOfSnapshot`` too, and
    offsets clip it. ``latestByKey`` is Kafka's compaction as a view (tombstones applied)."""
    from coordinator.local import LocalCoordinator
    from segments.segment import SegmentBuilder
    from segments.store import open_store
    from segments.types import Record

    coordinator = LocalCoordinator(served.db)
    store = open_store(served.store)
    try:
        coordinator.create_topic("history", 1)
        topic_id = coordinator.get_topic("history").topic_id
        now = int(time.time() * 1000)
        records = [
            Record(f"k{i % 10}".encode(), None if i == 95 else f"v{i}".encode(), now + i, ())
            for i in range(100)
        ]
        b = SegmentBuilder()
        b.append(topic_id, 0, records)
        from index.log import LogWriter

        LogWriter(store, coordinator).write(b)
        _janitor(served, "tier")
        time.sleep(0.05)
        as_of = int(time.time() * 1000)
        time.sleep(0.05)
        coordinator.delete_records("history", 0, 100)  # past the whole tier object
        assert _janitor(served, "table")["snapshots_published"] == 1
    finally:
        store.close()
        coordinator.close()

    def read(**options: str) -> Any:
        reader = (
            spark.read.format("lakelog")
            .option("db", served.db)
            .option("store", served.store)
            .option("subscribe", "history")
        )
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()

    assert read().count() == 0  # live: everything is below log-start now
    then = read(asOfTimestamp=str(as_of))
    assert sorted(r.offset for r in then.select("offset").collect()) == list(range(100))
    clipped = read(
        asOfTimestamp=str(as_of),
        startingOffsets='{"history": {"0": 40}}',
        endingOffsets='{"history": {"0": 60}}',
    )
    assert sorted(r.offset for r in clipped.select("offset").collect()) == list(range(40, 60))
    latest = {
        r.key: (r.offset, r.value)
        for r in read(asOfTimestamp=str(as_of), latestByKey="true").collect()
    }
    # k5's latest record (offset 95) is a tombstone: the key is gone.
    assert latest == {
        f"k{k}".encode(): (90 + k, f"v{90 + k}".encode()) for k in range(10) if k != 5
    }
    with pytest.raises(Exception, match="no table snapshot"):
        read(asOfTimestamp="1000").count()


new_db = test_shards.new_db  # the fixture: empty PostgreSQL databases, dropped afterwards


def test_sharded_metadata_publishes_every_shards_changes(new_db: Any) -> None:
    """With the index sharded over two PostgreSQL databases, one snapshot holds the tier
    objects of every shard (its summary records each shard's last change), the pointer is
    in the catalog database, and after retention and expiry GC takes the released objects
    from each shard."""
    from coordinator.iceberg.tables import check_table
    from coordinator.janitors.context import JanitorConfig, JanitorContext
    from coordinator.janitors.gc import run_gc
    from coordinator.janitors.runner import run_janitor
    from coordinator.local import LocalCoordinator
    from index.log import LogWriter
    from segments.segment import SegmentBuilder
    from tests.unit.janitor_helpers import ClockedStore, FakeClock, records

    clock = FakeClock()
    store = ClockedStore(clock)
    with LocalCoordinator(new_db(), shards=[new_db(), new_db()]) as coord:
        ctx = JanitorContext(coord.janitor_catalog(), coord.store, store, clock)
        config = JanitorConfig(tier_age_s=0, gc_grace_s=60)
        coord.create_topic("spread", 8, {"retention.ms": str(86_400_000)})
        topic_id = coord.get_topic("spread").topic_id
        writer = LogWriter(store, coord)
        old = int(clock() * 1000) - 3 * 86_400_000
        for ts in (old, int(clock() * 1000)):
            b = SegmentBuilder()
            for p in range(8):
                b.append(topic_id, p, records(10, ts, tag=f"{ts}."))
            writer.write(b)
            run_janitor("tier", ctx, config)
        tables = TopicTables(ctx.catalog, store, clock)
        table = tables.iceberg.load_table(("topics", "spread"))
        marks = changes_of(table.current_snapshot())
        assert set(marks) == set(ctx.catalog.table_files()) and len(marks) == 2
        assert table.scan().to_arrow().num_rows == 160
        assert check_table(tables, "spread") == []
        assert run_janitor("retention", ctx, config).rows_dropped == 8
        clock.advance(6 * 86_400)
        run_janitor("table", ctx, config)
        run_gc(ctx, 60.0)
        clock.advance(61)
        run_gc(ctx, 60.0)
        assert check_table(tables, "spread") == []
        table = tables.iceberg.load_table(("topics", "spread"))
        assert table.scan().to_arrow().num_rows == 80
        left = {k for k in store.key_set() if k.startswith("tiered/")}
        assert len(left) == 8
