"""The in-process coordinator: the Coordinator and GroupCoordinator protocols over a SQLite
or PostgreSQL metadata store."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

from coordinator import clock
from coordinator.client import ChunkCommit, Coordinator
from coordinator.db import MetadataDatabase, WriteMode, open_database
from coordinator.groups.kafka import (
    HeartbeatResult,
    JoinResult,
    KafkaGroup,
    KafkaGroupCoordinator,
    KafkaGroupStore,
    kafka_group_info,
)
from coordinator.groups.model import (
    CommittedOffset,
    ConsumerConfig,
    ConsumerHeartbeat,
    ConsumerState,
    FetchLease,
    GroupCoordinator,
    GroupInfo,
    GroupTopicLag,
)
from coordinator.groups.store import GroupStore
from coordinator.janitors.catalog import Catalog
from coordinator.log.producers import ProducerPartitionState, StoredKey
from coordinator.log.store import MetadataStore
from coordinator.schemas.model import (
    LATEST,
    SchemaReference,
    SchemaStore,
    StoredSchema,
    SubjectVersion,
)
from coordinator.schemas.store import SchemaRegistryStore
from coordinator.shards import ShardedCatalog, ShardedStore, check_unsharded, open_shards
from segments.errors import GroupNotFoundError, GroupProtocolConflictError, NonEmptyGroupError
from segments.types import AgentInfo, ChunkRef, PartitionOffsets, TopicInfo, TopicPartition


class LocalCoordinator:
    """A coordinator in this process, on a SQLite file or PostgreSQL database that other
    processes may share.

    Thread-safe. Each process that opens the same database gets the same cluster
    id, topics and offsets; offsets stay contiguous across all of them.
    """

    def __init__(
        self,
        db_url: str,
        *,
        cluster_id: str | None = None,
        write_mode: WriteMode = "lock",
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        timeout_s: float | None = None,
        now: Callable[[], float] = clock.now,
        shards: Sequence[str] = (),
    ) -> None:
        """Open (creating and migrating if needed) the database at ``db_url``.

        Args:
            db_url: ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``
                (missing parent directories are created), or
                ``postgresql://user@host:port/dbname``.
            cluster_id: the id a fresh database takes; for an existing one it must
                match the stored id.
            write_mode, synchronous, timeout_s: see ``coordinator.db.open_database``.
            now: the clock (epoch seconds) of consumer session and instance expiry;
                tests pass a fake one.
            shards: URLs of shard databases: ``db_url`` is then the catalog and the
                partitions' data lives in the shards (``coordinator.shards``). Empty:
                everything in ``db_url``.

        Raises:
            ValueError: a bad URL, or ``cluster_id`` differs from the stored one;
                ``ShardConfigError`` for a shard URL that does not fit the catalog.
            CoordinatorUnavailableError: the database cannot be opened.
        """
        self._db = open_database(
            db_url, write_mode=write_mode, synchronous=synchronous, timeout_s=timeout_s
        )
        self._sharded: ShardedStore | None = None
        try:
            self._store: MetadataStore | ShardedStore
            bounds = None
            if shards:
                # The catalog's cluster id first: a fresh shard takes it.
                catalog_id = MetadataStore(self._db, cluster_id=cluster_id).cluster_id()
                opened = open_shards(self._db, catalog_id, list(shards), timeout_s=timeout_s)
                self._sharded = ShardedStore(self._db, opened, cluster_id=cluster_id)
                self._store = self._sharded
                bounds = self._sharded.topic_bounds
            else:
                check_unsharded(self._db)
                self._store = MetadataStore(self._db, cluster_id=cluster_id)
            self._groups = GroupStore(self._db, now=now, bounds_of=bounds)
            self._kafka_groups = KafkaGroupStore(self._db, now=now)
            self._schemas = SchemaRegistryStore(self._db)
        except BaseException:
            if self._sharded is not None:
                self._sharded.close()
            self._db.close()
            raise

    @property
    def db(self) -> MetadataDatabase:
        """The metadata database, for the janitors (their SQL lives in ``coordinator.janitors``)."""
        return self._db

    @property
    def store(self) -> MetadataStore | ShardedStore:
        """The metadata store, for janitors that need more than the protocol."""
        return self._store

    @property
    def sharded(self) -> ShardedStore | None:
        """The sharded store when partitions live in shard databases, else None."""
        return self._sharded

    def janitor_catalog(self) -> Catalog | ShardedCatalog:
        """The janitors' view of the partitions and objects (every shard's, if sharded)."""
        if self._sharded is not None:
            return ShardedCatalog(self._sharded)
        return Catalog(self._db)

    @property
    def groups(self) -> GroupStore:
        """The consumer-group store (the GroupCoordinator methods below delegate to it)."""
        return self._groups

    @property
    def schemas(self) -> SchemaRegistryStore:
        """The schema registry's store (the SchemaStore methods below delegate to it)."""
        return self._schemas

    def close(self) -> None:
        """Close the database connections. Idempotent; later calls raise RuntimeError."""
        if self._sharded is not None:
            self._sharded.close()
        self._db.close()

    def __enter__(self) -> LocalCoordinator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def cluster_id(self) -> str:
        return self._store.cluster_id()

    # -- topics ---------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        return self._store.create_topic(name, partitions, configs, validate_only=validate_only)

    def get_topic(self, name: str) -> TopicInfo:
        return self._store.get_topic(name)

    def get_topic_by_id(self, topic_id: bytes) -> TopicInfo:
        return self._store.get_topic_by_id(topic_id)

    def list_topics(self) -> list[TopicInfo]:
        return self._store.list_topics()

    def delete_topic(self, name: str, *, topic_id: bytes | None = None) -> None:
        self._store.delete_topic(name, topic_id=topic_id)

    def add_partitions(self, name: str, partitions: int) -> TopicInfo:
        return self._store.add_partitions(name, partitions)

    def alter_configs(
        self,
        name: str,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Sequence[str] = (),
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        return self._store.alter_configs(
            name, set_configs, delete_configs, validate_only=validate_only
        )

    def broker_configs(self) -> dict[str, str]:
        return self._store.broker_configs()

    def alter_broker_configs(
        self,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Sequence[str] = (),
        *,
        validate_only: bool = False,
    ) -> dict[str, str]:
        return self._store.alter_broker_configs(
            set_configs, delete_configs, validate_only=validate_only
        )

    # -- the log --------------------------------------------------------------
    def commit(self, object_key: str, chunks: Sequence[ChunkCommit]) -> list[int]:
        return self._store.commit(object_key, chunks)

    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        return self._store.offsets(topic, partition)

    def offsets_many(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, PartitionOffsets]:
        return self._store.offsets_many(partitions)

    def lookup(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_chunks: int = 16,
        *,
        topic_id: bytes | None = None,
    ) -> list[ChunkRef]:
        return self._store.lookup(topic, partition, offset, max_chunks, topic_id=topic_id)

    def lookup_timestamp(
        self, topic: str, partition: int, timestamp_ms: int, from_offset: int = 0
    ) -> ChunkRef | None:
        return self._store.lookup_timestamp(topic, partition, timestamp_ms, from_offset)

    def committed_object_keys(self, keys: Sequence[str]) -> set[str]:
        return self._store.committed_object_keys(keys)

    def keep_pending(
        self, lease_id: str, keys: Sequence[str], ttl_s: float, *, principal: str | None = None
    ) -> set[str]:
        return self._store.keep_pending(lease_id, keys, ttl_s, principal=principal)

    def release_pending(self, lease_id: str, *, principal: str | None = None) -> None:
        self._store.release_pending(lease_id, principal=principal)

    def pending_object_keys(self, keys: Sequence[str]) -> set[str]:
        return self._store.pending_object_keys(keys)

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        return self._store.delete_records(topic, partition, offset)

    # -- idempotent producers -------------------------------------------------
    def init_producer_id(self, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
        return self._store.init_producer_id(producer_id, epoch)

    def producer_state(
        self, producer_id: int, partitions: Sequence[tuple[bytes, int]]
    ) -> dict[tuple[bytes, int], ProducerPartitionState]:
        return self._store.producer_state(producer_id, partitions)

    def request_key(self, topic_id: bytes, key: str, now_ms: int) -> StoredKey | None:
        return self._store.request_key(topic_id, key, now_ms)

    # -- agents ---------------------------------------------------------------
    def heartbeat_agent(
        self, agent_id: str, host: str, port: int, kafka_host: str = "", kafka_port: int = 0
    ) -> int:
        return self._store.heartbeat_agent(agent_id, host, port, kafka_host, kafka_port)

    def list_agents(self, max_age_s: float = 30.0) -> list[AgentInfo]:
        return self._store.list_agents(max_age_s)

    # -- consumer groups ------------------------------------------------------
    def create_consumer(self, group: str, name: str, config: ConsumerConfig) -> ConsumerState:
        if self._kafka_groups.has_members(group):
            raise GroupProtocolConflictError(
                f"Consumer group '{group}' has Kafka protocol members; a group is used through "
                "one door at a time."
            )
        return self._groups.create_consumer(group, name, config)

    def delete_consumer(self, group: str, name: str) -> None:
        self._groups.delete_consumer(group, name)

    def consumer(self, group: str, name: str, *, touch: bool = True) -> ConsumerState:
        return self._groups.consumer(group, name, touch=touch)

    def subscribe(
        self, group: str, name: str, topics: Sequence[str] = (), pattern: str | None = None
    ) -> ConsumerState:
        return self._groups.subscribe(group, name, topics, pattern)

    def unsubscribe(self, group: str, name: str) -> None:
        self._groups.unsubscribe(group, name)

    def assign(self, group: str, name: str, partitions: Sequence[TopicPartition]) -> ConsumerState:
        return self._groups.assign(group, name, partitions)

    def seek(self, group: str, name: str, positions: Mapping[TopicPartition, int]) -> None:
        self._groups.seek(group, name, positions)

    def advance(
        self, group: str, name: str, generation: int, positions: Mapping[TopicPartition, int]
    ) -> ConsumerState:
        return self._groups.advance(group, name, generation, positions)

    def begin_fetch(self, group: str, name: str, token: str, lease_ms: int) -> FetchLease:
        return self._groups.begin_fetch(group, name, token, lease_ms)

    def confirm_fetch(
        self, group: str, name: str, token: str, start: Mapping[TopicPartition, int], lease_ms: int
    ) -> FetchLease:
        return self._groups.confirm_fetch(group, name, token, start, lease_ms)

    def end_fetch(
        self, group: str, name: str, token: str, positions: Mapping[TopicPartition, int] | None
    ) -> None:
        self._groups.end_fetch(group, name, token, positions)

    def heartbeat_consumers(
        self, members: Sequence[ConsumerHeartbeat], lease_ms: int
    ) -> list[tuple[str, str]]:
        return self._groups.heartbeat_consumers(members, lease_ms)

    def commit_offsets(
        self,
        group: str,
        name: str,
        offsets: Mapping[TopicPartition, CommittedOffset],
        generation: int | None = None,
    ) -> None:
        self._groups.commit_offsets(group, name, offsets, generation)

    def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, CommittedOffset]:
        return self._groups.committed_offsets(group, partitions)

    def list_groups(self) -> list[str]:
        """REST groups and Kafka groups (one model: both doors' groups in one list)."""
        kafka = [g for g in self._kafka_groups.list_groups() if self._kafka_groups.has_members(g)]
        return sorted(set(self._groups.list_groups()) | set(kafka))

    def describe_group(self, group: str) -> GroupInfo:
        """A Kafka group with members as the v3 views show groups, else the REST group."""
        kafka = self._kafka_groups.describe(group)
        if kafka is not None and kafka.members:
            return kafka_group_info(kafka, self._kafka_groups.committed(group))
        return self._groups.describe_group(group)

    def alter_group_offsets(
        self, group: str, offsets: Mapping[TopicPartition, CommittedOffset]
    ) -> None:
        """Any door's group: refused while it has Kafka members or REST instances."""
        kafka = self._kafka_groups.describe(group)
        if kafka is not None and kafka.members:
            raise NonEmptyGroupError(
                f"Assignments can only be reset if the group '{group}' is inactive, but the "
                f"current state is {kafka.state}."
            )
        self._groups.alter_group_offsets(group, offsets)

    def delete_group(self, group: str) -> None:
        """Any door's group (one door at a time uses an id): its state and its offsets."""
        kafka = self._kafka_groups.describe(group)
        if kafka is not None and kafka.members:
            raise NonEmptyGroupError(
                f"Group '{group}' could not be deleted: the group is not empty."
            )
        if kafka is not None and kafka.stored:
            self._kafka_groups.delete(group)  # its row and the committed offsets
            with contextlib.suppress(GroupNotFoundError):
                self._groups.delete_group(group)
            return
        self._groups.delete_group(group)

    def group_lag(self) -> list[GroupTopicLag]:
        return self._groups.lag_by_topic()

    # -- Kafka consumer groups ------------------------------------------------
    def kafka_join(self, group: str, member_id: str, **options: Any) -> JoinResult:
        return self._kafka_groups.join(group, member_id, **options)

    def kafka_sync(
        self,
        group: str,
        member_id: str,
        generation: int,
        assignments: Mapping[str, bytes] | None = None,
    ) -> bytes | None:
        return self._kafka_groups.sync(group, member_id, generation, assignments)

    def kafka_heartbeat(self, group: str, member_id: str, generation: int) -> None:
        self._kafka_groups.heartbeat(group, member_id, generation)

    def kafka_leave(self, group: str, member_ids: Sequence[str]) -> list[str | None]:
        return self._kafka_groups.leave(group, member_ids)

    def kafka_commit_offsets(
        self,
        group: str,
        member_id: str,
        generation: int,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> None:
        self._kafka_groups.commit_offsets(group, member_id, generation, offsets)

    def kafka_committed(
        self,
        group: str,
        partitions: Sequence[TopicPartition] | None = None,
        *,
        member_id: str = "",
        member_epoch: int = -1,
    ) -> dict[TopicPartition, CommittedOffset]:
        return self._kafka_groups.committed(
            group, partitions, member_id=member_id, member_epoch=member_epoch
        )

    def kafka_describe(self, group: str) -> KafkaGroup | None:
        return self._kafka_groups.describe(group)

    def kafka_consumer_heartbeat(
        self, group: str, member_id: str, member_epoch: int, **options: Any
    ) -> HeartbeatResult:
        return self._kafka_groups.consumer_heartbeat(group, member_id, member_epoch, **options)

    def kafka_delete_group(self, group: str) -> None:
        if self._groups_have_instances(group):
            raise NonEmptyGroupError(f"Consumer group '{group}' has REST consumer instances.")
        self._kafka_groups.delete(group)

    def _groups_have_instances(self, group: str) -> bool:
        try:
            return bool(self._groups.describe_group(group).members)
        except GroupNotFoundError:
            return False

    # -- schema registry ------------------------------------------------------
    def register_schema(
        self,
        subject: str,
        schema_type: str,
        schema: str,
        references: Sequence[SchemaReference] = (),
        *,
        expected_versions: Sequence[int] | None = None,
    ) -> SubjectVersion:
        return self._schemas.register_schema(
            subject, schema_type, schema, references, expected_versions=expected_versions
        )

    def get_schema(self, schema_id: int) -> StoredSchema:
        return self._schemas.get_schema(schema_id)

    def schema_versions(self, schema_id: int, *, deleted: bool = False) -> list[tuple[str, int]]:
        return self._schemas.schema_versions(schema_id, deleted=deleted)

    def list_subjects(self, *, deleted: bool = False) -> list[str]:
        return self._schemas.list_subjects(deleted=deleted)

    def subject_versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        return self._schemas.subject_versions(subject, deleted=deleted)

    def get_subject_version(
        self, subject: str, version: int = LATEST, *, deleted: bool = False
    ) -> SubjectVersion:
        return self._schemas.get_subject_version(subject, version, deleted=deleted)

    def find_schema(
        self,
        subject: str,
        schema_type: str,
        schema: str,
        references: Sequence[SchemaReference] = (),
        *,
        deleted: bool = False,
    ) -> SubjectVersion:
        return self._schemas.find_schema(subject, schema_type, schema, references, deleted=deleted)

    def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        return self._schemas.delete_subject(subject, permanent=permanent)

    def delete_subject_version(
        self, subject: str, version: int = LATEST, *, permanent: bool = False
    ) -> int:
        return self._schemas.delete_subject_version(subject, version, permanent=permanent)

    def referenced_by(self, subject: str, version: int) -> list[int]:
        return self._schemas.referenced_by(subject, version)

    def get_compatibility(self, subject: str | None = None) -> str | None:
        return self._schemas.get_compatibility(subject)

    def set_compatibility(self, level: str, subject: str | None = None) -> str:
        return self._schemas.set_compatibility(level, subject)

    def delete_compatibility(self, subject: str | None = None) -> str:
        return self._schemas.delete_compatibility(subject)


def _conforms(c: LocalCoordinator) -> Coordinator:
    # mypy checks here that LocalCoordinator implements the protocol exactly.
    return c


def _conforms_groups(c: LocalCoordinator) -> GroupCoordinator:
    return c


def _store_conforms_groups(s: GroupStore) -> GroupCoordinator:
    return s


def _conforms_kafka_groups(c: LocalCoordinator) -> KafkaGroupCoordinator:
    return c


def _conforms_schemas(c: LocalCoordinator) -> SchemaStore:
    return c


def _store_conforms_schemas(s: SchemaRegistryStore) -> SchemaStore:
    return s
