"""Kafka's topic name rules and topic config definitions (pure functions, no database)."""

from __future__ import annotations

import pytest

from coordinator.log.topic_configs import (
    BROKER_CONFIG_DEFS,
    BROKER_SYNONYMS,
    CONFIG_DEFS,
    SOURCE_BROKER_DEFAULT,
    SOURCE_DEFAULT,
    SOURCE_OVERRIDE,
    ConfigType,
    describe_broker_configs,
    describe_configs,
    effective_configs,
    is_default,
    topic_defaults,
    validate_broker_configs,
    validate_config,
    validate_configs,
    validate_topic_name,
)
from segments.errors import InvalidConfigError, InvalidTopicNameError

LONG_MAX = str(2**63 - 1)


@pytest.mark.parametrize(
    "name", ["a", "A-b_c.9", "-", "_", "...", ".a", "x" * 249, "orders.v1", "0"]
)
def test_legal_topic_names(name: str) -> None:
    assert validate_topic_name(name) == name


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "can't be empty"),
        (".", '"." or ".."'),
        ("..", '"." or ".."'),
        ("x" * 250, "longer than 249"),
        ("a b", "character other than"),
        ("a/b", "character other than"),
        ("a:b", "character other than"),
        ("é", "character other than"),
        ("٣", "character other than"),  # a non-ASCII digit: \d would accept it
        ("a\n", "character other than"),
    ],
)
def test_illegal_topic_names(name: str, fragment: str) -> None:
    with pytest.raises(InvalidTopicNameError, match=fragment):
        validate_topic_name(name)


def test_topic_name_must_be_a_string() -> None:
    with pytest.raises(InvalidTopicNameError):
        validate_topic_name(42)


def test_required_configs_have_kafka_defaults_and_types() -> None:
    expected = {
        "cleanup.policy": ("delete", ConfigType.LIST),
        "compression.type": ("producer", ConfigType.STRING),
        "delete.retention.ms": ("86400000", ConfigType.LONG),
        "file.delete.delay.ms": ("60000", ConfigType.LONG),
        "flush.messages": (LONG_MAX, ConfigType.LONG),
        "flush.ms": (LONG_MAX, ConfigType.LONG),
        "index.interval.bytes": ("4096", ConfigType.INT),
        "max.compaction.lag.ms": (LONG_MAX, ConfigType.LONG),
        "max.message.bytes": ("1048588", ConfigType.INT),
        "message.timestamp.difference.max.ms": (LONG_MAX, ConfigType.LONG),
        "message.timestamp.type": ("CreateTime", ConfigType.STRING),
        "min.cleanable.dirty.ratio": ("0.5", ConfigType.DOUBLE),
        "min.compaction.lag.ms": ("0", ConfigType.LONG),
        "min.insync.replicas": ("1", ConfigType.INT),
        "preallocate": ("false", ConfigType.BOOLEAN),
        "retention.bytes": ("-1", ConfigType.LONG),
        "retention.ms": ("604800000", ConfigType.LONG),
        "segment.bytes": ("1073741824", ConfigType.INT),
        "segment.index.bytes": ("10485760", ConfigType.INT),
        "segment.jitter.ms": ("0", ConfigType.LONG),
        "segment.ms": ("604800000", ConfigType.LONG),
        "unclean.leader.election.enable": ("false", ConfigType.BOOLEAN),
    }
    for name, (default, kind) in expected.items():
        d = CONFIG_DEFS[name]
        assert (d.default, d.type) == (default, kind), name
    # Every default passes its own validator.
    for d in CONFIG_DEFS.values():
        assert d.validate(d.default) == d.default


@pytest.mark.parametrize(
    ("name", "value", "stored"),
    [
        ("cleanup.policy", "compact", "compact"),
        ("cleanup.policy", "compact,delete", "compact,delete"),
        ("cleanup.policy", "delete, compact", "delete, compact"),
        ("compression.type", "zstd", "zstd"),
        ("compression.type", "uncompressed", "uncompressed"),
        ("message.timestamp.type", "LogAppendTime", "LogAppendTime"),
        ("retention.ms", "-1", "-1"),
        ("retention.ms", " 3600000 ", "3600000"),
        ("retention.ms", LONG_MAX, LONG_MAX),
        ("retention.bytes", "-1", "-1"),
        ("retention.bytes", "0", "0"),
        ("min.cleanable.dirty.ratio", "0", "0"),
        ("min.cleanable.dirty.ratio", "1", "1"),
        ("min.cleanable.dirty.ratio", "0.25", "0.25"),
        ("min.cleanable.dirty.ratio", "1e-2", "1e-2"),
        ("preallocate", "TRUE", "TRUE"),
        ("unclean.leader.election.enable", "false", "false"),
        ("max.message.bytes", "2147483647", "2147483647"),
        ("segment.bytes", "14", "14"),
        ("min.insync.replicas", "2", "2"),
    ],
)
def test_valid_values_are_accepted_trimmed(name: str, value: str, stored: str) -> None:
    assert validate_config(name, value) == stored


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("retention.ms", "abc", "Not a number of type LONG"),
        ("retention.ms", "-2", "at least -1"),
        ("retention.ms", "1.5", "Not a number of type LONG"),
        ("retention.ms", "1_000", "Not a number of type LONG"),
        ("retention.ms", "", "Not a number of type LONG"),
        ("retention.ms", str(2**63), "Not a number of type LONG"),
        ("retention.bytes", "-5", "at least -1"),
        ("max.message.bytes", "2147483648", "Not a number of type INT"),
        ("max.message.bytes", "-1", "at least 0"),
        ("segment.bytes", "13", "at least 14"),
        ("segment.ms", "0", "at least 1"),
        ("min.insync.replicas", "0", "at least 1"),
        ("flush.messages", "0", "at least 1"),
        ("cleanup.policy", "foo", "Invalid value foo"),
        ("cleanup.policy", "", "comma-separated list"),
        ("cleanup.policy", "compact,", "comma-separated list"),
        ("cleanup.policy", "Compact", "Invalid value Compact"),
        ("compression.type", "brotli", "String must be one of"),
        ("compression.type", "GZIP", "String must be one of"),
        ("message.timestamp.type", "createtime", "String must be one of"),
        ("min.cleanable.dirty.ratio", "2", "no more than 1"),
        ("min.cleanable.dirty.ratio", "-0.1", "at least 0"),
        ("min.cleanable.dirty.ratio", "nan", "Not a number of type DOUBLE"),
        ("min.cleanable.dirty.ratio", "half", "Not a number of type DOUBLE"),
        ("preallocate", "yes", "true or false"),
        ("preallocate", "1", "true or false"),
    ],
)
def test_bad_values_name_the_config_and_the_value(name: str, value: str, fragment: str) -> None:
    with pytest.raises(InvalidConfigError, match=fragment) as info:
        validate_config(name, value)
    assert name in info.value.message
    assert f"Invalid value {value} " in info.value.message


def test_unknown_config_names_are_rejected() -> None:
    with pytest.raises(InvalidConfigError, match=r"Unknown topic config name: retention\.mss"):
        validate_config("retention.mss", "1")
    with pytest.raises(InvalidConfigError, match="Unknown topic config name"):
        validate_configs({"cleanup.policy": "compact", "foo": "bar"})


def test_non_string_values_are_rejected() -> None:
    with pytest.raises(InvalidConfigError, match=r"retention\.ms"):
        validate_config("retention.ms", 1000)


def test_validate_configs_checks_cross_config_rules() -> None:
    assert validate_configs({"min.compaction.lag.ms": "5", "max.compaction.lag.ms": "5"}) == {
        "min.compaction.lag.ms": "5",
        "max.compaction.lag.ms": "5",
    }
    with pytest.raises(InvalidConfigError, match=r"min\.compaction\.lag\.ms \(10\) > max"):
        validate_configs({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})
    assert validate_configs(None) == {}


def test_effective_configs_are_defaults_plus_overrides() -> None:
    eff = effective_configs({"retention.ms": "1000", "cleanup.policy": "compact"})
    assert set(eff) == set(CONFIG_DEFS)
    assert eff["retention.ms"] == "1000"
    assert eff["cleanup.policy"] == "compact"
    assert eff["compression.type"] == "producer"
    assert list(eff) == sorted(eff)


def test_describe_configs_tells_default_from_override() -> None:
    entries = {e.name: e for e in describe_configs({"retention.ms": "1000"})}
    assert set(entries) == set(CONFIG_DEFS)
    r = entries["retention.ms"]
    assert (r.value, r.is_default, r.source) == ("1000", False, SOURCE_OVERRIDE)
    s = entries["segment.ms"]
    assert (s.value, s.is_default, s.source) == ("604800000", True, SOURCE_DEFAULT)
    assert r.source == "DYNAMIC_TOPIC_CONFIG" and s.source == "DEFAULT_CONFIG"
    assert not r.is_read_only and not r.is_sensitive
    only = describe_configs({}, ["cleanup.policy"])
    assert [(e.name, e.value) for e in only] == [("cleanup.policy", "delete")]
    with pytest.raises(InvalidConfigError):
        describe_configs({}, ["nope"])
    assert is_default({}, "retention.ms")
    assert not is_default({"retention.ms": "1"}, "retention.ms")


def test_every_topic_config_has_a_broker_synonym_of_the_same_kind() -> None:
    """Kafka's ServerTopicConfigSynonyms: one broker config per topic config, same type,
    same default and range (so a cluster-wide value is checked as a topic value is)."""
    assert set(BROKER_SYNONYMS) == set(CONFIG_DEFS)
    assert len(set(BROKER_SYNONYMS.values())) == len(CONFIG_DEFS)
    for topic, broker in BROKER_SYNONYMS.items():
        d, b = CONFIG_DEFS[topic], BROKER_CONFIG_DEFS[broker]
        assert (b.type, b.default, b.minimum, b.choices) == (
            d.type,
            d.default,
            d.minimum,
            d.choices,
        )
    assert BROKER_SYNONYMS["retention.ms"] == "log.retention.ms"
    assert BROKER_SYNONYMS["max.message.bytes"] == "message.max.bytes"


def test_topics_inherit_cluster_wide_broker_configs() -> None:
    """Override, else the cluster-wide value, else Kafka's default; synonyms list every
    layer with a value, the one in force first."""
    defaults = topic_defaults({"log.retention.ms": "1000", "log.cleanup.policy": "compact"})
    assert defaults == {"retention.ms": "1000", "cleanup.policy": "compact"}
    effective = effective_configs({"cleanup.policy": "delete"}, defaults)
    assert effective["retention.ms"] == "1000"
    assert effective["cleanup.policy"] == "delete"
    assert effective["segment.ms"] == CONFIG_DEFS["segment.ms"].default
    inherited, overridden, plain = describe_configs(
        {"cleanup.policy": "delete"}, ["retention.ms", "cleanup.policy", "segment.ms"], defaults
    )
    assert (inherited.value, inherited.source, inherited.is_default) == (
        "1000",
        SOURCE_BROKER_DEFAULT,
        False,
    )
    assert [(s.name, s.value, s.source) for s in inherited.synonyms] == [
        ("log.retention.ms", "1000", SOURCE_BROKER_DEFAULT),
        ("retention.ms", "604800000", SOURCE_DEFAULT),
    ]
    assert [(s.name, s.value, s.source) for s in overridden.synonyms] == [
        ("cleanup.policy", "delete", SOURCE_OVERRIDE),
        ("log.cleanup.policy", "compact", SOURCE_BROKER_DEFAULT),
        ("cleanup.policy", "delete", SOURCE_DEFAULT),
    ]
    assert (plain.source, plain.is_default) == (SOURCE_DEFAULT, True)


def test_broker_configs_are_checked_like_topic_configs() -> None:
    assert validate_broker_configs({"log.retention.ms": " 5 "}) == {"log.retention.ms": "5"}
    with pytest.raises(InvalidConfigError, match=r"Unknown broker config name: retention\.ms"):
        validate_broker_configs({"retention.ms": "5"})
    with pytest.raises(InvalidConfigError, match=r"Invalid value x for configuration message\.max"):
        validate_broker_configs({"message.max.bytes": "x"})
    with pytest.raises(InvalidConfigError, match=r"min\.compaction\.lag\.ms"):
        validate_broker_configs(
            {"log.cleaner.min.compaction.lag.ms": "10", "log.cleaner.max.compaction.lag.ms": "5"}
        )
    (entry,) = describe_broker_configs({"message.max.bytes": "2000"}, ["message.max.bytes"])
    assert (entry.value, entry.source, entry.is_default) == ("2000", SOURCE_BROKER_DEFAULT, False)
    assert [s.source for s in entry.synonyms] == [SOURCE_BROKER_DEFAULT, SOURCE_DEFAULT]
    assert len(describe_broker_configs({})) == len(BROKER_CONFIG_DEFS)
