"""``lakelog groups`` (kafka-consumer-groups) against groups of REST consumers on real processes.

The CLI runs in-process (typer's runner) against the shared cluster's agents; the
group calls go agent -> coordinator process -> SQLite, the records through moto S3.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest
from typer.testing import CliRunner

from service.cli import app, parse_duration_ms
from tests.integration.conftest import Cluster
from tests.integration.test_consumer_api import Consumer, create_topic, produce

pytestmark = pytest.mark.integration

PARTITIONS = 3
PER_PARTITION = 10


def lakelog(cluster: Cluster, *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(app, [*args, "--url", cluster.agents[1]])
    assert result.exit_code == code, (result.output, result.exception)
    return result.output


def describe(cluster: Cluster, group: str) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(
        lakelog(cluster, "groups", "describe", group, "--members", "--offsets", "-o", "json")
    )
    return out


def wait_left(cluster: Cluster, group: str) -> None:
    """Until the group has no member: librdkafka's close() sends LeaveGroup without
    waiting for its answer, so the coordinator may not have removed the member yet."""
    deadline = time.monotonic() + 30
    while describe(cluster, group)["members"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not describe(cluster, group)["members"]


def committed(cluster: Cluster, group: str) -> dict[int, int]:
    return {o["partition"]: o["current_offset"] for o in describe(cluster, group)["offsets"]}


@pytest.fixture
def topic(lakelog_cluster: Cluster, unique_topic: Callable[[str], str]) -> str:
    name = create_topic(lakelog_cluster, unique_topic("groups"), PARTITIONS)
    for p in range(PARTITIONS):
        produce(lakelog_cluster.agents[0], name, [b"v"] * PER_PARTITION, partition=p)
    return name


def drain(c: Consumer) -> dict[int, int]:
    """Fetch until nothing comes back; records per partition."""
    got: dict[int, int] = {}
    while records := c.fetch(timeout_ms=200):
        for r in records:
            got[r["partition"]] = got.get(r["partition"], 0) + 1
    return got


def test_describe_shows_the_lag_the_consumer_sees(lakelog_cluster: Cluster, topic: str) -> None:
    """Committed 4, 0 and 7 of 10: describe says lag 6, 10, 3; a consumer of the group then
    gets exactly that many records per partition."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    cluster = lakelog_cluster
    c = Consumer.create(cluster.agents, group, format="binary", **{"auto.commit.enable": "false"})
    c.assign(topic, *range(PARTITIONS))
    c.commit(
        [
            {"topic": topic, "partition": 0, "offset": 3},  # the last consumed: stores 4
            {"topic": topic, "partition": 2, "offset": 6},
        ]
    )
    c.call("POST", "/positions", {"offsets": [{"topic": topic, "partition": 1, "offset": 0}]})
    view = describe(cluster, group)
    assert view["state"] == "STABLE"
    assert [m["consumer_id"] for m in view["members"]] == [c.name]
    assert len(view["members"][0]["assignment"]) == PARTITIONS
    lags = {
        o["partition"]: (o["current_offset"], o["log_end_offset"], o["lag"])
        for o in view["offsets"]
    }
    assert lags == {0: (4, 10, 6), 1: (0, 10, 10), 2: (7, 10, 3)}
    # The coordinator's /metrics: committed offsets only (partition 1 has none).
    metrics = httpx.get(f"{cluster.coordinator_url}/metrics").text
    labels = f'{{group="{group}",topic="{topic}"}}'
    assert f"lakelog_consumer_group_lag{labels} 9.0" in metrics
    assert f"lakelog_consumer_group_max_lag{labels} 6.0" in metrics
    assert f"lakelog_consumer_group_partitions{labels} 2.0" in metrics

    table = lakelog(cluster, "groups", "describe", group).splitlines()
    header = table[table.index(next(line for line in table if line.startswith("GROUP")))]
    assert header.split() == [
        "GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
        "CONSUMER-ID", "HOST", "CLIENT-ID",
    ]  # fmt: skip
    assert f"{group} {topic} 0 4 10 6 {c.name} - {c.name}" in [" ".join(r.split()) for r in table]
    assert group in lakelog(cluster, "groups", "list").split()

    c.delete()
    reader = Consumer.create(
        cluster.agents, group, format="binary", **{"auto.offset.reset": "earliest"}
    )
    reader.assign(topic, *range(PARTITIONS))
    assert drain(reader) == {0: 6, 1: 10, 2: 3}
    reader.delete()


def test_reset_offsets_dry_run_execute_and_live_members(
    lakelog_cluster: Cluster, topic: str
) -> None:
    cluster = lakelog_cluster
    group = f"g-{uuid.uuid4().hex[:8]}"
    c = Consumer.create(cluster.agents, group, format="binary", **{"auto.commit.enable": "false"})
    c.assign(topic, *range(PARTITIONS))
    c.commit([{"topic": topic, "partition": p, "offset": 4} for p in range(PARTITIONS)])

    # A live member: refused with Kafka's message, dry run included; nothing moves.
    for mode in ("--dry-run", "--execute"):
        out = lakelog(
            cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest", mode,
            code=1,
        )  # fmt: skip
        assert (
            f"Assignments can only be reset if the group '{group}' is inactive, but the "
            "current state is Stable." in out
        )
    c.delete()
    assert committed(cluster, group) == {0: 5, 1: 5, 2: 5}

    # Dry run: the plan, and no change.
    out = lakelog(cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest")
    rows = [line.split() for line in out.splitlines() if line.startswith(group)]
    assert rows == [[group, topic, str(p), "0"] for p in range(PARTITIONS)]
    assert "No action will be performed" in out
    assert committed(cluster, group) == {0: 5, 1: 5, 2: 5}

    # --execute moves exactly the partitions listed.
    out = lakelog(
        cluster, "groups", "reset-offsets", group, "--topic", f"{topic}:0,2", "--to-offset", "2",
        "--execute", "-o", "json",
    )  # fmt: skip
    plan = orjson.loads(out)
    assert [(p["partition_id"], p["current_offset"], p["new_offset"]) for p in plan["data"]] == [
        (0, 5, 2),
        (2, 5, 2),
    ]
    assert committed(cluster, group) == {0: 2, 1: 5, 2: 2}

    # Shifts and offsets past the ends are clamped, as Kafka does.
    lakelog(
        cluster, "groups", "reset-offsets", group, "--topic", f"{topic}:1", "--shift-by", "100",
        "--execute",
    )  # fmt: skip
    lakelog(
        cluster, "groups", "reset-offsets", group, "--topic", f"{topic}:0", "--shift-by", "-9",
        "--execute",
    )  # fmt: skip
    assert committed(cluster, group) == {0: 0, 1: 10, 2: 2}

    # Bad partitions and missing offsets are clear errors.
    out = lakelog(
        cluster, "groups", "reset-offsets", group, "--topic", f"{topic}:7", "--to-latest",
        code=1,
    )  # fmt: skip
    assert f"Partition 7 of topic '{topic}' not found." in out and "error_code" not in out
    out = lakelog(cluster, "groups", "reset-offsets", group, "--topic", topic, code=2)
    assert "exactly one of" in out


def test_reset_to_datetime_and_by_duration(
    lakelog_cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    """Records stamped 2024-01-01T00:00:0i: --to-datetime finds the first at or after it;
    a time after every record is the log-end; --by-duration counts back from now."""
    cluster = lakelog_cluster
    topic = create_topic(cluster, unique_topic("ts"), 1)
    body = b"".join(
        orjson.dumps(
            {"partition_id": 0, "value": {"type": "STRING", "data": str(i)},
             "timestamp": f"2024-01-01T00:00:0{i}Z"}
        )
        for i in range(5)
    )  # fmt: skip
    r = httpx.post(
        f"{cluster.agents[0]}/v3/clusters/{cluster.cluster_id}/topics/{topic}/records",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 200 and r.text.count('"error_code":200') == 5, r.text
    group = f"g-{uuid.uuid4().hex[:8]}"

    def reset(*how: str) -> int:
        out = lakelog(cluster, "groups", "reset-offsets", group, "--topic", topic, *how,
                      "--execute", "-o", "json")  # fmt: skip
        return int(orjson.loads(out)["data"][0]["new_offset"])

    assert reset("--to-datetime", "2024-01-01T00:00:02.500+00:00") == 3
    assert reset("--to-datetime", "2024-01-01T00:00:02Z") == 2
    assert reset("--to-datetime", "2030-01-01T00:00:00Z") == 5
    assert committed(cluster, group) == {0: 5}
    since_2024 = datetime.now(UTC) - datetime(2024, 1, 1, tzinfo=UTC)
    assert reset("--by-duration", f"P{since_2024.days + 1}D") == 0
    assert reset("--by-duration", "PT1M") == 5


def test_delete_group(lakelog_cluster: Cluster, topic: str) -> None:
    cluster = lakelog_cluster
    group = f"g-{uuid.uuid4().hex[:8]}"
    c = Consumer.create(cluster.agents, group, format="binary")
    c.assign(topic, 0)
    c.commit([{"topic": topic, "partition": 0, "offset": 1}])
    out = lakelog(cluster, "groups", "delete", group, code=1)
    assert "the group is not empty" in out and "error_code" not in out
    c.delete()
    out = lakelog(cluster, "groups", "delete", group)
    assert out.strip() == f"Deletion of requested consumer groups ('{group}') was successful."
    assert group not in lakelog(cluster, "groups", "list").split()
    gone = lakelog(cluster, "groups", "delete", group, code=1)
    assert f"Consumer group '{group}' not found." in gone and "error_code" not in gone


@pytest.mark.parametrize(
    ("text", "ms"),
    [("PT1H", 3_600_000), ("P1DT2H30M", 95_400_000), ("PT0.5S", 500), ("p2d", 172_800_000)],
)
def test_durations_as_java_parses_them(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["P", "PT", "1H", "P1Y", "PT1H2D", "P1DT"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(text)


def test_groups_of_kafka_clients(
    kafka_cluster: Cluster, unique_topic: Callable[[str], str]
) -> None:
    """The same tool on a group of Kafka clients: describe shows what it committed and its
    member; reset is refused with its state while it runs, moves its offsets once it left
    (the client then starts there), and delete removes it."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import Producer
    from confluent_kafka import TopicPartition as KafkaTP

    cluster = kafka_cluster
    topic = create_topic(cluster, unique_topic("kgroups"), 1)
    producer = Producer({"bootstrap.servers": cluster.kafka[0]})
    for i in range(10):
        producer.produce(topic, value=b"%d" % i, partition=0)
    assert producer.flush(30) == 0
    group = f"k-{uuid.uuid4().hex[:8]}"
    settings = {
        "bootstrap.servers": cluster.kafka[0],
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 300,
    }
    consumer = KafkaConsumer(settings)
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 40
    while got < 4 and time.monotonic() < deadline:
        if (m := consumer.poll(0.2)) is not None and m.error() is None:
            got += 1
    assert got == 4
    consumer.commit(offsets=[KafkaTP(topic, 0, 4)], asynchronous=False)
    view = describe(cluster, group)
    assert view["state"] == "STABLE" and len(view["members"]) == 1
    assert [(o["current_offset"], o["log_end_offset"], o["lag"]) for o in view["offsets"]] == [
        (4, 10, 6)
    ]
    out = lakelog(cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-offset",
                  "8", "--execute", code=1)  # fmt: skip
    assert "is inactive, but the current state is Stable." in out
    consumer.close()
    wait_left(cluster, group)

    lakelog(cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-offset", "8",
            "--execute")  # fmt: skip
    assert committed(cluster, group) == {0: 8}
    again = KafkaConsumer(settings)
    again.subscribe([topic])
    first = None
    deadline = time.monotonic() + 40
    while first is None and time.monotonic() < deadline:
        if (m := again.poll(0.2)) is not None and m.error() is None:
            first = m.offset()
    again.close()
    assert first == 8
    wait_left(cluster, group)
    out = lakelog(cluster, "groups", "delete", group)
    assert "was successful" in out
    assert group not in lakelog(cluster, "groups", "list").split()
