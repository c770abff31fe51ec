"""Value types shared by every layer. Frozen, named once, used everywhere."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

#: Record headers: (key, value) pairs; values are nullable bytes, as in Kafka.
Headers = tuple[tuple[str, bytes | None], ...]


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class Record(NamedTuple):
    """One record as a producer sends it. ``timestamp_ms`` is CreateTime in epoch ms.

    A NamedTuple rather than a dataclass: decoders build one per record, and a tuple is
    half the cost to construct (measured 0.7 vs 1.4 µs).
    """

    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Headers = ()
    #: 0 CreateTime; 1 LogAppendTime (the batch's append time, as decoded from a topic
    #: with message.timestamp.type=LogAppendTime).
    timestamp_type: int = 0


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """A committed record as a reader sees it: a Record plus where it sits."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Headers = ()
    #: 0 CreateTime, 1 LogAppendTime (Kafka's timestampType).
    timestamp_type: int = 0


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """One footer entry of a segment object: where one topic-partition's chunk lies.

    ``topic_id`` is the coordinator's 16-byte topic UUID (``uuid.UUID.bytes``).
    """

    topic_id: bytes
    partition: int
    position: int
    length: int
    record_count: int
    min_timestamp_ms: int
    max_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """An index entry: offsets [base_offset, base_offset + record_count) of a partition.

    ``kind`` is ``"segment"``: a chunk of Kafka RecordBatches at [position,
    position + length) of ``object_key``, holding exactly ``record_count`` records;
    or ``"parquet"``: a whole tier object (``position`` 0, ``length`` its size,
    decoded with ``segments.tier.TierReader``) covering that offset span, which
    after compaction may hold fewer rows than ``record_count`` (offset gaps).
    """

    object_key: str
    position: int
    length: int
    base_offset: int
    record_count: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    kind: str = "segment"

    @property
    def end_offset(self) -> int:
        """One past the last offset this chunk holds."""
        return self.base_offset + self.record_count


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """``log_start``: first readable offset; ``high_watermark``: next offset to assign.

    ``topic_id``: the topic the bounds were read from (b"" where the caller did not ask).
    A topic deleted and created again under its name is another log, so readers key what
    they cache by it; it is not part of the value compared (the bounds are).
    """

    log_start: int
    high_watermark: int
    topic_id: bytes = field(default=b"", compare=False)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic as the coordinator stores it. ``configs`` holds only the overrides;
    ``defaults`` the cluster-wide broker configs it inherits, keyed by topic config name
    (``coordinator.log.topic_configs.effective_configs`` combines the two)."""

    name: str
    topic_id: bytes
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """A live agent, shown to REST clients as a Kafka broker."""

    broker_id: int
    agent_id: str
    host: str
    port: int
    last_seen: float  # epoch seconds
    #: Where its Kafka listener is reached ("" and 0: no listener).
    kafka_host: str = ""
    kafka_port: int = 0


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """Where a cluster keeps its objects, as the coordinator tells readers (never credentials).

    ``url`` is an object store URL (``s3://bucket/prefix``, ``file:///abs/path``);
    ``endpoint`` and ``region`` apply to ``s3://`` (MinIO, a moto server).
    """

    url: str
    endpoint: str | None = None
    region: str | None = None
