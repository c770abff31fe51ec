"""Cluster-wide broker configs in the coordinator, on SQLite and PostgreSQL: stored,
validated, inherited by every topic's TopicInfo, all or nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coordinator.local import LocalCoordinator
from coordinator.log.topic_configs import effective_configs
from segments.errors import InvalidConfigError


@pytest.fixture
def c(db_url: str) -> Iterator[LocalCoordinator]:
    coord = LocalCoordinator(db_url)
    yield coord
    coord.close()


def test_set_inherit_reset(c: LocalCoordinator) -> None:
    c.create_topic("plain", 1)
    c.create_topic("own", 1, {"retention.ms": "5"})
    assert c.broker_configs() == {}
    after = c.alter_broker_configs({"log.retention.ms": " 1000 ", "message.max.bytes": "2000"})
    assert after == c.broker_configs() == {"log.retention.ms": "1000", "message.max.bytes": "2000"}
    plain, own = c.get_topic("plain"), c.get_topic("own")
    assert plain.defaults == own.defaults == {"retention.ms": "1000", "max.message.bytes": "2000"}
    assert effective_configs(plain.configs, plain.defaults)["retention.ms"] == "1000"
    assert effective_configs(own.configs, own.defaults)["retention.ms"] == "5"
    assert {t.name: t.defaults for t in c.list_topics()}["plain"] == plain.defaults
    assert c.create_topic("new", 1).defaults == plain.defaults

    c.alter_broker_configs({"log.retention.ms": "9"}, validate_only=True)
    assert c.broker_configs()["log.retention.ms"] == "1000"
    c.alter_broker_configs(None, ["log.retention.ms"])
    assert c.broker_configs() == {"message.max.bytes": "2000"}
    assert c.get_topic("plain").defaults == {"max.message.bytes": "2000"}


def test_bad_alters_store_nothing(c: LocalCoordinator) -> None:
    c.alter_broker_configs({"log.cleaner.max.compaction.lag.ms": "100"})
    c.create_topic("t", 1, {"min.compaction.lag.ms": "50"})
    for sets, deletes in (
        ({"log.retention.ms": "1", "message.max.bytes": "x"}, []),
        ({"retention.ms": "1"}, []),
        ({"log.retention.ms": "1"}, ["log.retention.ms"]),
        # A topic's own min.compaction.lag.ms would exceed the new cluster-wide maximum.
        ({"log.cleaner.max.compaction.lag.ms": "10"}, []),
    ):
        with pytest.raises(InvalidConfigError):
            c.alter_broker_configs(sets, deletes)
    assert c.broker_configs() == {"log.cleaner.max.compaction.lag.ms": "100"}
