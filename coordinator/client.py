"""The one interface agents (and tests, and Spark) use to talk to a coordinator, and the
values it speaks in: topics, partitions' offsets, index entries, agents, where the store
is, and what a commit or an index lookup names.

Two implementations: ``coordinator.local.LocalCoordinator`` (in-process, over a
metadata store) and ``coordinator.http.client.HttpCoordinator`` (over the
coordinator's HTTP API). Both raise the same ``segments.errors`` classes. The
interface is synchronous and thread-safe; async callers run it in a thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from coordinator.log.producers import ProducerBatch, ProducerPartitionState, RequestKey, StoredKey
from segments.types import ChunkInfo


class TopicPartition(NamedTuple):
    topic: str
    partition: int


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


@dataclass(frozen=True, slots=True)
class ChunkCommit(ChunkInfo):
    """One chunk of a flushed segment object, as the agent reports it at commit: its
    footer entry, and what the commit checks and stores with it."""

    #: Idempotent producers' batches in this chunk, in chunk order: their sequences
    #: are checked inside the commit (``coordinator.log.producers``).
    producer_batches: tuple[ProducerBatch, ...] = ()
    #: REST idempotency keys of requests with records in this chunk: stored by the
    #: commit with their offsets, refused at commit if already stored (live).
    request_keys: tuple[RequestKey, ...] = ()
    #: Set on a chunk that is one transaction marker (a control batch of one record):
    #: the commit closes the producer's transaction in this partition.
    marker: TxnMarker | None = None


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A transaction's end in one partition: what the control batch of a marker chunk
    says. Committed like data (``ChunkCommit.marker``), at its own offset."""

    producer_id: int
    epoch: int
    commit: bool


@dataclass(frozen=True, slots=True)
class PendingMarkers:
    """A decided transaction whose markers are not all committed yet: the partitions
    (topic id, partition) still open. Whoever holds it writes one marker chunk per
    partition (``index.log.LogWriter.write_markers``), then calls
    ``complete_transaction``. Writing the same markers twice is harmless: a marker for a
    partition the transaction no longer holds open changes nothing but the offsets."""

    transactional_id: str
    producer_id: int
    epoch: int
    commit: bool
    partitions: tuple[tuple[bytes, int], ...]

    def marker(self) -> TxnMarker:
        return TxnMarker(self.producer_id, self.epoch, self.commit)


@dataclass(frozen=True, slots=True)
class TxnProducer:
    """InitProducerId's answer for a transactional id: its producer id and epoch, or the
    markers of its previous transaction that must be committed first (then ask again)."""

    producer_id: int
    epoch: int
    pending: PendingMarkers | None = None


@dataclass(frozen=True, slots=True)
class StableView:
    """What a read_committed reader of one partition needs: the last stable offset
    (below it every transaction is decided; the high watermark when none is open) and
    the aborted transactions (producer id, first offset, abort marker's offset) whose
    records lie in the range asked for (Kafka's Fetch answers the first two)."""

    last_stable: int
    aborted: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    """A transactional id's state, for DescribeTransactions and ListTransactions."""

    transactional_id: str
    producer_id: int
    epoch: int
    #: Kafka's names: Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit,
    #: CompleteAbort.
    state: str
    timeout_ms: int
    #: When the ongoing transaction began (ms since the epoch), -1 when none is.
    started_ms: int
    partitions: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class IndexWant:
    """One partition's read about to start, for ``lookup_many``: its entries from
    ``offset`` on, of topic id ``topic_id`` only (None: whichever topic the name names)."""

    topic: str
    partition: int
    offset: int
    topic_id: bytes | None = None


class Coordinator(Protocol):
    def cluster_id(self) -> str:
        """The cluster's stable id: 22 characters of URL-safe base64, as Kafka's."""
        ...

    # -- topics ---------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        """Raises InvalidTopicNameError, InvalidPartitionsError, InvalidConfigError,
        TopicExistsError."""
        ...

    def get_topic(self, name: str) -> TopicInfo:
        """Raises TopicNotFoundError."""
        ...

    def get_topic_by_id(self, topic_id: bytes) -> TopicInfo:
        """Raises TopicNotFoundError."""
        ...

    def list_topics(self) -> list[TopicInfo]: ...

    def delete_topic(self, name: str, *, topic_id: bytes | None = None) -> None:
        """Raises TopicNotFoundError (also when ``topic_id`` is given and the topic named
        ``name`` now has another id: a topic recreated under the name is never deleted by
        its predecessor's id). Its index rows go; its objects become garbage."""
        ...

    def add_partitions(self, name: str, partitions: int) -> TopicInfo:
        """Grow to ``partitions`` in total. Raises InvalidPartitionsError unless it grows."""
        ...

    def alter_configs(
        self,
        name: str,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Sequence[str] = (),
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        """Set and reset overrides in one step. Raises InvalidConfigError."""
        ...

    def broker_configs(self) -> dict[str, str]:
        """The cluster-wide broker configs set (Kafka's names: ``log.retention.ms``, ...);
        topics without an override inherit them."""
        ...

    def alter_broker_configs(
        self,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Sequence[str] = (),
        *,
        validate_only: bool = False,
    ) -> dict[str, str]:
        """Set and reset cluster-wide broker configs in one step; returns them all after.
        Raises InvalidConfigError."""
        ...

    # -- the log --------------------------------------------------------------
    def commit(self, object_key: str, chunks: Sequence[ChunkCommit]) -> list[int]:
        """Assign base offsets to every chunk of one object in ONE transaction.

        Returns the base offset of each chunk, in the order given. A retry with
        the same object key and chunks returns the same offsets. Raises
        TopicNotFoundError / PartitionNotFoundError (nothing committed) and
        CommitConflictError (same key, other chunks).
        """
        ...

    def commit_atomic(
        self, objects: Sequence[tuple[str, Sequence[ChunkCommit]]]
    ) -> list[list[int]]:
        """``commit`` of several objects in ONE transaction: all of them or none (a
        Spark stream's micro-batch, whose tasks each wrote objects). Returns each
        object's base offsets. The same objects again (a retry) return the same
        offsets; CommitConflictError when only some of them were committed before.
        Raises what ``commit`` raises, for the whole call; InvalidBatchError when the
        objects' partitions lie in more than one shard (sharded metadata)."""
        ...

    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        """Log-start offset and high watermark, with the id of the topic the name names
        now. Raises Topic/PartitionNotFoundError."""
        ...

    def offsets_many(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, PartitionOffsets]:
        """``offsets`` of many partitions in one call (lag views, fetch wake-ups); those of
        unknown topics or partitions are left out."""
        ...

    def lookup(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_chunks: int = 16,
        *,
        topic_id: bytes | None = None,
    ) -> list[ChunkRef]:
        """Index entries covering ``offset`` and after, in offset order, at most
        ``max_chunks``; empty when ``offset`` >= high watermark. An offset below
        log-start returns entries from log-start. With ``topic_id``: TopicNotFoundError
        when the name now belongs to another topic (deleted and created again).
        IndexHoleError when the entries do not follow each other up to the high
        watermark (the index is damaged)."""
        ...

    def lookup_many(
        self, wants: Sequence[IndexWant], max_chunks: int = 16
    ) -> dict[int, list[ChunkRef]]:
        """``lookup`` of many partitions in one call (a Fetch of many partitions about to
        read): each want's entries, keyed by its place in ``wants``. A want whose lookup
        fails (an unknown or recreated topic, an index hole) is left out, for its own
        ``lookup`` to report; so is one with nothing to read. ValueError if ``max_chunks``
        < 1."""
        ...

    def lookup_timestamp(
        self, topic: str, partition: int, timestamp_ms: int, from_offset: int = 0
    ) -> ChunkRef | None:
        """The first index entry, from the one holding ``max(from_offset, log-start)`` on,
        whose max timestamp is >= ``timestamp_ms`` (the chunk holding the first record
        with timestamp >= t, unless that record lies below log-start in an entry that
        straddles it), or None."""
        ...

    def committed_object_keys(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are committed objects (for orphan detection)."""
        ...

    def keep_pending(
        self, lease_id: str, keys: Sequence[str], ttl_s: float, *, principal: str | None = None
    ) -> set[str]:
        """Register uploads under a writer's lease (before their PUT) and extend the
        lease to ``ttl_s`` from now; garbage collection leaves them alone while it lives.
        Returns the keys given that garbage collection deleted already (their commit
        would fail with ObjectDeletedError). Safe to repeat.

        ``principal``: the user a coordinator serves the call for (its HTTP API sets it
        from the caller's credential; over HTTP the caller's credential decides, and
        this argument is not sent). A lease belongs to the user that took it: another
        user's call on it, or on a key pending under it, raises AuthorizationError.
        None: a trusted caller (an agent, no authentication), which may touch all."""
        ...

    def release_pending(self, lease_id: str, *, principal: str | None = None) -> None:
        """Drop a writer's lease and its pending keys (its commit is done or abandoned).
        AuthorizationError for a lease another ``principal`` took (see keep_pending)."""
        ...

    def pending_object_keys(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are uploads under a live write lease (not orphans)."""
        ...

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Move log-start up to ``offset`` (-1: the high watermark), as Kafka's DeleteRecords;
        returns the new log-start. Raises Topic/PartitionNotFoundError, and
        OffsetOutOfRangeError past the high watermark."""
        ...

    # -- idempotent producers -------------------------------------------------
    def init_producer_id(self, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
        """A new producer id at epoch 0; or, given an id and its current epoch, the same id
        at the next epoch (KIP-360). Raises ProducerFencedError for a stale epoch."""
        ...

    def producer_state(
        self, producer_id: int, partitions: Sequence[tuple[bytes, int]]
    ) -> dict[tuple[bytes, int], ProducerPartitionState]:
        """What the partitions (topic id, partition) remember of a producer."""
        ...

    def request_key(self, topic_id: bytes, key: str, now_ms: int) -> StoredKey | None:
        """A REST idempotency key of a topic as its commit stored it; None when it was
        never stored or expired before ``now_ms``."""
        ...

    # -- agents (the cluster's "brokers") -------------------------------------
    def heartbeat_agent(
        self, agent_id: str, host: str, port: int, kafka_host: str = "", kafka_port: int = 0
    ) -> int:
        """Register or refresh an agent (and its Kafka listener, port 0 for none); returns
        its stable integer broker id."""
        ...

    def list_agents(self, max_age_s: float = 30.0) -> list[AgentInfo]:
        """Agents heard from within ``max_age_s``, by broker id."""
        ...


class TransactionCoordinator(Protocol):
    """Kafka's transaction coordinator (``coordinator.log.transactions``): the state of
    each transactional id, and what read_committed readers need. Served by the same
    coordinator as the log (agents reach it as ``AgentState.txns``)."""

    def init_transaction(
        self, transactional_id: str, timeout_ms: int, producer_id: int = -1, epoch: int = -1
    ) -> TxnProducer:
        """InitProducerId with a transactional id: a new producer id at epoch 0 for a new
        id; else the id's producer at the next epoch, which fences every older instance.
        An ongoing transaction of the id is aborted first: the answer then carries its
        markers as ``pending`` (the epoch is bumped already, so its zombie is fenced).
        ``producer_id``/``epoch`` (KIP-360, -1: none) must be the id's current ones.
        Raises InvalidTxnTimeoutError, TransactionFencedError (an older epoch),
        InvalidProducerIdMappingError, ConcurrentTransactionsError (its markers are being
        written)."""
        ...

    def add_txn_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        partitions: Sequence[TopicPartition],
    ) -> None:
        """AddPartitionsToTxn: the partitions join the transaction (which begins if it
        was not ongoing); only then may the producer's transactional batches be
        committed to them. All or nothing. Raises TransactionFencedError,
        InvalidProducerIdMappingError, ConcurrentTransactionsError,
        InvalidTxnStateError, Topic/PartitionNotFoundError."""
        ...

    def add_txn_group(
        self, transactional_id: str, producer_id: int, epoch: int, group: str
    ) -> None:
        """AddOffsetsToTxn: the group's offsets may be committed in the transaction.
        Raises as ``add_txn_partitions``."""
        ...

    def txn_commit_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        group: str,
        offsets: Mapping[TopicPartition, tuple[int, str]],
        member_id: str = "",
        generation: int = -1,
    ) -> None:
        """TxnOffsetCommit: offsets (offset, metadata) held in the transaction, written
        to the group's committed offsets (the table both doors share) when it commits,
        dropped when it aborts. With ``member_id`` (KIP-447: the consumer whose records
        the transaction transformed), that member must be in the group at ``generation``
        (its member epoch in a consumer-protocol group): a zombie that lost its
        partitions in a rebalance cannot commit their offsets. Raises as
        ``add_txn_partitions``; InvalidTxnStateError if the group was not added;
        ConsumerNotFoundError, StaleGenerationError (StaleMemberEpochError)."""
        ...

    def end_transaction(
        self, transactional_id: str, producer_id: int, epoch: int, commit: bool
    ) -> PendingMarkers | None:
        """EndTxn: decide the ongoing transaction (durably: a commit's offsets are
        written now), and return the markers to write, or None when it holds no
        partition (it is complete already). The same call again returns the same
        markers (a retry); the other decision is InvalidTxnStateError. Raises
        TransactionFencedError (among others when the coordinator aborted it on its
        timeout), InvalidProducerIdMappingError."""
        ...

    def complete_transaction(self, transactional_id: str, producer_id: int, epoch: int) -> bool:
        """After the markers of a decided transaction are committed: it is complete
        (CompleteCommit/CompleteAbort) and the id may begin another. Returns False
        when a partition is still open (its marker is not committed): write it first.
        Safe to repeat."""
        ...

    def stable_offsets(self, wants: Sequence[IndexWant]) -> dict[int, StableView]:
        """For read_committed readers: each want's last stable offset and the aborted
        transactions with records at or after its ``offset`` and below that offset, keyed
        by its place in ``wants``. Unknown topics and partitions are left out."""
        ...

    def abort_expired_transactions(self, now_ms: int) -> list[PendingMarkers]:
        """Ongoing transactions past their timeout are aborted (their epoch bumped, so
        their producer is fenced); returns the markers of every decided transaction
        still to write (those just aborted, and those whose writer went away)."""
        ...

    def held_offsets(self, group: str) -> list[TopicPartition]:
        """The group's partitions whose offsets an ongoing transaction holds (committed
        with it or dropped: OffsetFetch's ``require_stable`` answers them
        UNSTABLE_OFFSET_COMMIT until then)."""
        ...

    def list_transactions(self) -> list[TransactionInfo]:
        """Every transactional id's state (ListTransactions, DescribeTransactions)."""
        ...
