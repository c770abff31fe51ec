"""Kafka's rules for topic names and topic configs, as pure functions.

The config table follows Kafka 3.x ``LogConfig``: each entry has Kafka's
default, type and documented valid range, so a client that works against
Kafka gets the same answers here. Values are kept as the strings the client
sent (trimmed): the coordinator stores overrides only, and
:func:`effective_configs` / :func:`describe_configs` add the defaults.

Cluster-wide broker configs (Kafka's dynamic default broker configs, ``/broker-configs``
in REST v3) are the defaults topics inherit: each topic config has Kafka's broker
synonym (``retention.ms`` <- ``log.retention.ms``, ``max.message.bytes`` <-
``message.max.bytes``, ...). A topic's value is its override, else the cluster-wide
broker config (source ``DYNAMIC_DEFAULT_BROKER_CONFIG``), else Kafka's default.
Those synonyms are the only broker configs lakelog has: every agent serves every
partition, so nothing is configured per broker.

No I/O here; ``coordinator.log.store`` calls these inside its transactions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from coordinator.client import TopicInfo
from segments.compression import DECOMPRESSED_CONFIG, DEFAULT_MAX_DECOMPRESSED_BYTES
from segments.errors import (
    InvalidConfigError,
    InvalidRecordError,
    InvalidTopicNameError,
    RecordTooLargeError,
)
from segments.types import Record

#: Kafka's limit: 249, so that ``<topic>-<partition>`` directory names fit in 255 bytes.
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")

_INT_MAX = 2**31 - 1
_INT_MIN = -(2**31)
_LONG_MAX = 2**63 - 1
_LONG_MIN = -(2**63)
# Java's Integer/Long.parseLong accept an optional sign and ASCII digits only; Python's int()
# would also take "1_000", " 5" and non-ASCII digits, which Kafka rejects.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DOUBLE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

#: DECOMPRESSED_CONFIG: lakelog's bound on a batch's decompressed records, beside Kafka's
#: max.message.bytes (which counts the batch as stored, compressed). Vendor-prefixed as
#: Confluent's own topic configs are (``confluent.*``); the broker default has the same name.
#: Its smallest value: above the 1 MiB batches the agent builds from REST records, so
#: that only a single record larger than the bound can exceed it (and is refused).
MIN_DECOMPRESSED_BYTES = 2 * 1024 * 1024

SOURCE_OVERRIDE = "DYNAMIC_TOPIC_CONFIG"
SOURCE_BROKER_DEFAULT = "DYNAMIC_DEFAULT_BROKER_CONFIG"
SOURCE_DEFAULT = "DEFAULT_CONFIG"


def validate_topic_name(name: object) -> str:
    """Check a topic name against Kafka's rules and return it.

    Raises:
        InvalidTopicNameError: not a string, empty, ``.`` or ``..``, longer than 249
            characters, or a character outside ``[a-zA-Z0-9._-]``.
    """
    if not isinstance(name, str):
        raise InvalidTopicNameError(f"Topic name must be a string, not {type(name).__name__}.")
    if not name:
        raise InvalidTopicNameError("Topic name is illegal, it can't be empty.")
    if name in (".", ".."):
        raise InvalidTopicNameError('Topic name cannot be "." or "..".')
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicNameError(
            f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters, "
            f"topic name: {name}"
        )
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        raise InvalidTopicNameError(
            f"Topic name {name!r} is illegal, it contains a character other than "
            "ASCII alphanumerics, '.', '_' and '-'."
        )
    return name


class ConfigType(StrEnum):
    """Kafka's ``ConfigDef.Type`` names, as DescribeConfigs reports them."""

    BOOLEAN = "BOOLEAN"
    INT = "INT"
    LONG = "LONG"
    DOUBLE = "DOUBLE"
    STRING = "STRING"
    LIST = "LIST"


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """One topic config: Kafka's type, default and valid values.

    ``minimum``/``maximum`` bound numbers (inclusive); ``choices`` bounds strings and
    each element of a list.
    """

    name: str
    type: ConfigType
    default: str
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None

    def validate(self, value: object) -> str:
        """Check ``value`` and return it trimmed, as it will be stored.

        Raises:
            InvalidConfigError: the message names the config and the value.
        """
        if not isinstance(value, str):
            raise InvalidConfigError(
                f"Invalid value {value!r} for configuration {self.name}: must be a string"
            )
        text = value.strip()
        check = _CHECKS[self.type]
        problem = check(self, text)
        if problem is not None:
            raise InvalidConfigError(
                f"Invalid value {value} for configuration {self.name}: {problem}"
            )
        return text

    def describe_range(self) -> str:
        """Kafka's wording of the valid values, for messages and docs."""
        if self.choices is not None:
            return "[" + ", ".join(self.choices) + "]"
        if self.minimum is not None and self.maximum is not None:
            return f"[{_num(self.minimum)},...,{_num(self.maximum)}]"
        if self.minimum is not None:
            return f"[{_num(self.minimum)},...]"
        return ""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _bounds(d: ConfigDef, n: float) -> str | None:
    if d.minimum is not None and n < d.minimum:
        return f"Value must be at least {_num(d.minimum)}"
    if d.maximum is not None and n > d.maximum:
        return f"Value must be no more than {_num(d.maximum)}"
    return None


def _check_integer(d: ConfigDef, text: str) -> str | None:
    lo, hi = (_INT_MIN, _INT_MAX) if d.type is ConfigType.INT else (_LONG_MIN, _LONG_MAX)
    if not _INTEGER.fullmatch(text) or not lo <= int(text) <= hi:
        return f"Not a number of type {d.type.value}"
    return _bounds(d, int(text))


def _check_double(d: ConfigDef, text: str) -> str | None:
    if not _DOUBLE.fullmatch(text):
        return "Not a number of type DOUBLE"
    return _bounds(d, float(text))


def _check_boolean(d: ConfigDef, text: str) -> str | None:
    if text.lower() not in ("true", "false"):
        return "Expected value to be either true or false"
    return None


def _check_string(d: ConfigDef, text: str) -> str | None:
    if d.choices is not None and text not in d.choices:
        return f"String must be one of: {', '.join(d.choices)}"
    return None


def _check_list(d: ConfigDef, text: str) -> str | None:
    items = [item.strip() for item in text.split(",")]
    if not text or any(not item for item in items):
        return f"Expected a comma-separated list of {d.describe_range()}"
    if d.choices is not None:
        bad = [item for item in items if item not in d.choices]
        if bad:
            return f"Invalid value {bad[0]}, must be one of {d.describe_range()}"
    return None


_CHECKS: dict[ConfigType, Callable[[ConfigDef, str], str | None]] = {
    ConfigType.INT: _check_integer,
    ConfigType.LONG: _check_integer,
    ConfigType.DOUBLE: _check_double,
    ConfigType.BOOLEAN: _check_boolean,
    ConfigType.STRING: _check_string,
    ConfigType.LIST: _check_list,
}


def _long(name: str, default: int, minimum: int | None, doc: str) -> ConfigDef:
    return ConfigDef(name, ConfigType.LONG, str(default), doc, minimum=minimum)


def _int(name: str, default: int, minimum: int, doc: str) -> ConfigDef:
    return ConfigDef(name, ConfigType.INT, str(default), doc, minimum=minimum)


def _bool(name: str, default: bool, doc: str) -> ConfigDef:
    return ConfigDef(name, ConfigType.BOOLEAN, str(default).lower(), doc)


#: Every topic config lakelog accepts, by name: Kafka 3.x defaults and valid ranges.
CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        ConfigDef(
            "cleanup.policy",
            ConfigType.LIST,
            "delete",
            "delete: drop old records by retention; compact: keep the latest record per key.",
            choices=("compact", "delete"),
        ),
        ConfigDef(
            "compression.type",
            ConfigType.STRING,
            "producer",
            "Compression of stored batches; producer keeps what the producer sent.",
            choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
        ),
        _long("delete.retention.ms", 86_400_000, 0, "How long delete tombstones are kept."),
        _long("file.delete.delay.ms", 60_000, 0, "Delay before deleting a dropped object."),
        _long("flush.messages", _LONG_MAX, 1, "Kafka's fsync interval in messages (no effect)."),
        _long("flush.ms", _LONG_MAX, 0, "Kafka's fsync interval in ms (no effect)."),
        _int("index.interval.bytes", 4096, 0, "Kafka's offset index density (no effect)."),
        _long("max.compaction.lag.ms", _LONG_MAX, 1, "Longest a record stays uncompacted."),
        _int(
            DECOMPRESSED_CONFIG,
            DEFAULT_MAX_DECOMPRESSED_BYTES,
            MIN_DECOMPRESSED_BYTES,
            "Most bytes the records of one batch may take once decompressed (lakelog's: "
            "Kafka never decompresses for readers; lakelog does for REST, Spark and "
            "tiering). A batch over it is refused on produce and not decoded by readers.",
        ),
        _int("max.message.bytes", 1_048_588, 0, "Largest record batch a topic accepts."),
        _bool("message.downconversion.enable", True, "Down-conversion for old consumers."),
        _long(
            "message.timestamp.difference.max.ms",
            _LONG_MAX,
            0,
            "Largest allowed gap between a CreateTime timestamp and the append time.",
        ),
        _long(
            "message.timestamp.before.max.ms",
            _LONG_MAX,
            0,
            "How far in the past a CreateTime timestamp may be.",
        ),
        _long(
            "message.timestamp.after.max.ms",
            _LONG_MAX,
            0,
            "How far in the future a CreateTime timestamp may be.",
        ),
        ConfigDef(
            "message.timestamp.type",
            ConfigType.STRING,
            "CreateTime",
            "Record timestamps: the producer's (CreateTime) or the append time.",
            choices=("CreateTime", "LogAppendTime"),
        ),
        ConfigDef(
            "min.cleanable.dirty.ratio",
            ConfigType.DOUBLE,
            "0.5",
            "Dirty share of the log above which compaction runs.",
            minimum=0.0,
            maximum=1.0,
        ),
        _long("min.compaction.lag.ms", 0, 0, "Shortest a record stays uncompacted."),
        _int("min.insync.replicas", 1, 1, "Kafka's ISR minimum (no effect: one object store)."),
        _bool("preallocate", False, "Kafka's segment preallocation (no effect)."),
        _long("retention.bytes", -1, -1, "Size a partition may keep before dropping old data."),
        _long("retention.ms", 604_800_000, -1, "Age after which data is dropped; -1: forever."),
        _int("segment.bytes", 1_073_741_824, 14, "Kafka's segment file size."),
        _int("segment.index.bytes", 10_485_760, 4, "Kafka's offset index size (no effect)."),
        _long("segment.jitter.ms", 0, 0, "Random jitter subtracted from segment.ms."),
        _long("segment.ms", 604_800_000, 1, "Kafka's segment roll time."),
        # lakelog's own: the topic's Iceberg table (coordinator.iceberg), Iceberg's defaults.
        _long(
            "table.snapshot.retention.ms",
            432_000_000,
            -1,
            "How long the topic table's old snapshots stay readable; -1: forever.",
        ),
        _int(
            "table.snapshot.min.count",
            1,
            1,
            "Snapshots of the topic table kept however old (the current one included).",
        ),
        _bool("unclean.leader.election.enable", False, "Kafka's unclean election (no effect)."),
    )
}


#: Kafka's broker config (``ServerTopicConfigSynonyms``) giving each topic config its
#: cluster-wide default.
BROKER_SYNONYMS: dict[str, str] = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "index.interval.bytes": "log.index.interval.bytes",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    DECOMPRESSED_CONFIG: DECOMPRESSED_CONFIG,
    "max.message.bytes": "message.max.bytes",
    "message.downconversion.enable": "log.message.downconversion.enable",
    "message.timestamp.difference.max.ms": "log.message.timestamp.difference.max.ms",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "message.timestamp.type": "log.message.timestamp.type",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "min.insync.replicas": "min.insync.replicas",
    "preallocate": "log.preallocate",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "segment.index.bytes": "log.index.size.max.bytes",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "segment.ms": "log.roll.ms",
    "table.snapshot.retention.ms": "log.table.snapshot.retention.ms",
    "table.snapshot.min.count": "log.table.snapshot.min.count",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}

#: The topic config each broker config is the default of.
TOPIC_CONFIG_OF: dict[str, str] = {broker: topic for topic, broker in BROKER_SYNONYMS.items()}

#: Every broker config lakelog accepts, by name: the topic config's type, range, default.
BROKER_CONFIG_DEFS: dict[str, ConfigDef] = {
    broker: replace(CONFIG_DEFS[topic], name=broker)
    for broker, topic in sorted(TOPIC_CONFIG_OF.items())
}


def broker_config_def(name: object) -> ConfigDef:
    """The definition of a broker config.

    Raises:
        InvalidConfigError: no broker config has that name.
    """
    d = BROKER_CONFIG_DEFS.get(name) if isinstance(name, str) else None
    if d is None:
        raise InvalidConfigError(
            f"Unknown broker config name: {name}. lakelog's broker configs are the "
            "cluster-wide defaults of topic configs, e.g. log.retention.ms."
        )
    return d


def validate_broker_configs(configs: Mapping[str, str]) -> dict[str, str]:
    """Check cluster-wide broker configs, each alone and together; values trimmed.

    Raises:
        InvalidConfigError: the first bad name or value, or a cross-config rule broken.
    """
    checked = {name: broker_config_def(name).validate(value) for name, value in configs.items()}
    check_consistent({}, topic_defaults(checked))
    return checked


def topic_defaults(broker_configs: Mapping[str, str]) -> dict[str, str]:
    """Cluster-wide broker configs keyed by the topic configs they are the defaults of."""
    return {TOPIC_CONFIG_OF[b]: v for b, v in broker_configs.items() if b in TOPIC_CONFIG_OF}


def config_def(name: object) -> ConfigDef:
    """The definition of a topic config.

    Raises:
        InvalidConfigError: no topic config has that name.
    """
    d = CONFIG_DEFS.get(name) if isinstance(name, str) else None
    if d is None:
        raise InvalidConfigError(f"Unknown topic config name: {name}")
    return d


def validate_config(name: object, value: object) -> str:
    """Check one config override; return the value as it will be stored (trimmed).

    Raises:
        InvalidConfigError: unknown name or a value it does not accept.
    """
    return config_def(name).validate(value)


def validate_configs(configs: Mapping[str, str] | None) -> dict[str, str]:
    """Check a set of overrides, each alone and together (see :func:`check_consistent`).

    Returns:
        The overrides with trimmed values.

    Raises:
        InvalidConfigError: the first bad name or value.
    """
    checked = {name: validate_config(name, value) for name, value in (configs or {}).items()}
    check_consistent(checked)
    return checked


def check_consistent(
    overrides: Mapping[str, str], defaults: Mapping[str, str] | None = None
) -> None:
    """Cross-config rules Kafka enforces on the effective configs of a topic.

    Raises:
        InvalidConfigError: ``min.compaction.lag.ms`` above ``max.compaction.lag.ms``.
    """
    effective = effective_configs(overrides, defaults)
    min_lag = int(effective["min.compaction.lag.ms"])
    max_lag = int(effective["max.compaction.lag.ms"])
    if min_lag > max_lag:
        raise InvalidConfigError(
            f"conflict topic config setting min.compaction.lag.ms ({min_lag}) > "
            f"max.compaction.lag.ms ({max_lag})"
        )


def effective_configs(
    overrides: Mapping[str, str], defaults: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Every config's value for a topic: its override, else the cluster-wide default
    (``defaults``, keyed by topic config name), else Kafka's default. Sorted by name."""
    inherited = defaults or {}
    return {
        name: overrides.get(name, inherited.get(name, d.default))
        for name, d in sorted(CONFIG_DEFS.items())
    }


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    """One layer a config's value may come from (Kafka's ConfigSynonym)."""

    name: str
    value: str
    source: str


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One row of a DescribeConfigs answer (topic or broker), as REST v3 reports it.

    ``synonyms``: every layer that has a value, the one in force first (Kafka's order:
    topic override, cluster-wide broker config, default).
    """

    name: str
    value: str
    is_default: bool
    source: str  # SOURCE_OVERRIDE, SOURCE_BROKER_DEFAULT or SOURCE_DEFAULT
    type: ConfigType
    is_read_only: bool = False
    is_sensitive: bool = False
    synonyms: tuple[ConfigSynonym, ...] = ()


def _entry(name: str, d: ConfigDef, layers: list[ConfigSynonym]) -> ConfigEntry:
    layers.append(ConfigSynonym(name, d.default, SOURCE_DEFAULT))
    top = layers[0]
    return ConfigEntry(
        name=name,
        value=top.value,
        is_default=top.source == SOURCE_DEFAULT,
        source=top.source,
        type=d.type,
        synonyms=tuple(layers),
    )


def describe_configs(
    overrides: Mapping[str, str],
    names: Iterable[str] | None = None,
    defaults: Mapping[str, str] | None = None,
) -> list[ConfigEntry]:
    """Every config of a topic (or those in ``names``) with its value and where it comes
    from; ``defaults`` are the cluster-wide broker configs, keyed by topic config name.

    Raises:
        InvalidConfigError: a name in ``names`` is not a topic config.
    """
    wanted = sorted(CONFIG_DEFS) if names is None else [config_def(n).name for n in names]
    inherited = defaults or {}
    entries = []
    for name in wanted:
        layers = []
        if name in overrides:
            layers.append(ConfigSynonym(name, overrides[name], SOURCE_OVERRIDE))
        if name in inherited:
            layers.append(
                ConfigSynonym(BROKER_SYNONYMS[name], inherited[name], SOURCE_BROKER_DEFAULT)
            )
        entries.append(_entry(name, CONFIG_DEFS[name], layers))
    return entries


def describe_broker_configs(
    dynamic: Mapping[str, str], names: Iterable[str] | None = None
) -> list[ConfigEntry]:
    """Every broker config (or those in ``names``): its cluster-wide value, else the default.

    Raises:
        InvalidConfigError: a name in ``names`` is not a broker config.
    """
    wanted = (
        sorted(BROKER_CONFIG_DEFS) if names is None else [broker_config_def(n).name for n in names]
    )
    entries = []
    for name in wanted:
        layers = []
        if name in dynamic:
            layers.append(ConfigSynonym(name, dynamic[name], SOURCE_BROKER_DEFAULT))
        entries.append(_entry(name, BROKER_CONFIG_DEFS[name], layers))
    return entries


def is_default(overrides: Mapping[str, str], name: str) -> bool:
    """Whether ``name`` takes Kafka's default for a topic with these overrides."""
    config_def(name)
    return name not in overrides


# -- size limits of a topic's records -------------------------------------------------------

#: A Kafka v2 RecordBatch header (61 bytes) plus the worst-case varint framing of one
#: record: Kafka checks max.message.bytes against the batch, so a lone record's batch
#: size is what is compared.
BATCH_OVERHEAD = 61 + 5 * 5 + 1


def _int_config(topic: TopicInfo, name: str) -> int:
    """A topic's integer config: its override, else the cluster-wide default, else Kafka's."""
    value = topic.configs.get(name, topic.defaults.get(name))
    return int(CONFIG_DEFS[name].default if value is None else value)


def max_message_bytes(topic: TopicInfo) -> int:
    """The topic's ``max.message.bytes``: the largest batch, as stored (compressed)."""
    return _int_config(topic, "max.message.bytes")


def max_decompressed_bytes(topic: TopicInfo) -> int:
    """The topic's ``lakelog.max.decompressed.bytes``: the most a batch's records may take
    once decompressed (checked on produce, and by every reader that decompresses)."""
    return _int_config(topic, DECOMPRESSED_CONFIG)


def log_append_time(topic: TopicInfo) -> bool:
    """Whether the topic stamps records with their append time
    (``message.timestamp.type=LogAppendTime``): the agent sets it on every batch."""
    value = topic.configs.get(
        "message.timestamp.type", topic.defaults.get("message.timestamp.type")
    )
    return value == "LogAppendTime"


def compacted(topic: TopicInfo) -> bool:
    """Whether the topic is compacted (``cleanup.policy`` holds ``compact``): it takes
    only records with a key."""
    value = topic.configs.get("cleanup.policy", topic.defaults.get("cleanup.policy"))
    policy = CONFIG_DEFS["cleanup.policy"].default if value is None else value
    return "compact" in [p.strip() for p in policy.split(",")]


def keyless_refused(topic: TopicInfo, partition: int) -> InvalidRecordError:
    """Kafka's error (INVALID_RECORD) for a record without a key on a compacted topic."""
    return InvalidRecordError(
        "Compacted topic cannot accept message without key in topic partition "
        f"{topic.name}-{partition}."
    )


def check_record_key(record: Record, topic: TopicInfo, partition: int) -> None:
    """Refuse a record without a key for a compacted topic (REST and Spark writes; the
    Kafka door's batches are checked by ``segments.batches.check_batches``).

    Raises:
        InvalidRecordError: the record has no key and the topic is compacted.
    """
    if record.key is None and compacted(topic):
        raise keyless_refused(topic, partition)


def record_limit(topic: TopicInfo) -> tuple[int, str]:
    """The largest one-record batch a topic takes from REST and Spark (which write their
    records uncompressed into batches of their own making), and the config that sets it:
    ``max.message.bytes``, or ``lakelog.max.decompressed.bytes`` when that is lower."""
    stored, decompressed = max_message_bytes(topic), max_decompressed_bytes(topic)
    if decompressed < stored:
        return decompressed, DECOMPRESSED_CONFIG
    return stored, "max.message.bytes"


def check_record_size(record: Record, limit: int, name: str = "max.message.bytes") -> None:
    """Refuse a record whose one-record batch would exceed ``limit`` bytes (the topic's
    config ``name``; :func:`record_limit` gives both).

    Raises:
        RecordTooLargeError: key + value + headers + framing over the limit.
    """
    size = BATCH_OVERHEAD + len(record.key or b"") + len(record.value or b"")
    for header, value in record.headers:
        size += len(header) + len(value or b"") + 10
    if size > limit:
        raise record_too_large(size, limit, name)


def record_too_large(size: int, limit: int, name: str) -> RecordTooLargeError:
    """The error for a record of ``size`` bytes (as :func:`check_record_size` counts them)
    over ``limit``, the topic's config ``name``."""
    return RecordTooLargeError(
        f"The record is {size} bytes when serialized, which is larger than the topic's "
        f"{name} ({limit})."
    )
