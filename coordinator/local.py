"""The in-process coordinator: the Coordinator and GroupCoordinator protocols over a SQLite
or PostgreSQL metadata store."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Literal

from coordinator import clock
from coordinator.api import ServedCoordinator, forward
from coordinator.client import TopicPartition
from coordinator.db import MetadataDatabase, WriteMode, open_database
from coordinator.groups.kafka import KafkaGroupStore, kafka_group_info
from coordinator.groups.model import (
    CommittedOffset,
    ConsumerConfig,
    ConsumerState,
    GroupCoordinator,
    GroupInfo,
    GroupTopicLag,
)
from coordinator.groups.store import GroupStore
from coordinator.janitors.catalog import Catalog
from coordinator.log.store import MetadataStore
from coordinator.log.transactions import TransactionStore
from coordinator.schemas.model import SchemaStore
from coordinator.schemas.store import SchemaRegistryStore
from coordinator.shards import (
    ShardedCatalog,
    ShardedPartitions,
    ShardedStore,
    check_unsharded,
    open_shards,
)
from segments.errors import GroupNotFoundError, GroupProtocolConflictError, NonEmptyGroupError


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
            self._txns = TransactionStore(
                self._db,
                self._kafka_groups.check_member,
                None if self._sharded is None else ShardedPartitions(self._sharded),
            )
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

    # -- the operations: each served by the store that owns it ------------------
    # (``forward``: the store's method, typed as it; the protocols' docstrings say what
    # each does.)

    cluster_id = forward("_store", MetadataStore.cluster_id)
    create_topic = forward("_store", MetadataStore.create_topic)
    get_topic = forward("_store", MetadataStore.get_topic)
    get_topic_by_id = forward("_store", MetadataStore.get_topic_by_id)
    list_topics = forward("_store", MetadataStore.list_topics)
    delete_topic = forward("_store", MetadataStore.delete_topic)
    add_partitions = forward("_store", MetadataStore.add_partitions)
    alter_configs = forward("_store", MetadataStore.alter_configs)
    broker_configs = forward("_store", MetadataStore.broker_configs)
    alter_broker_configs = forward("_store", MetadataStore.alter_broker_configs)
    commit = forward("_store", MetadataStore.commit)
    commit_atomic = forward("_store", MetadataStore.commit_atomic)
    offsets = forward("_store", MetadataStore.offsets)
    offsets_many = forward("_store", MetadataStore.offsets_many)
    lookup = forward("_store", MetadataStore.lookup)
    lookup_many = forward("_store", MetadataStore.lookup_many)
    lookup_timestamp = forward("_store", MetadataStore.lookup_timestamp)
    committed_object_keys = forward("_store", MetadataStore.committed_object_keys)
    keep_pending = forward("_store", MetadataStore.keep_pending)
    release_pending = forward("_store", MetadataStore.release_pending)
    pending_object_keys = forward("_store", MetadataStore.pending_object_keys)
    delete_records = forward("_store", MetadataStore.delete_records)
    init_producer_id = forward("_store", MetadataStore.init_producer_id)
    producer_state = forward("_store", MetadataStore.producer_state)
    request_key = forward("_store", MetadataStore.request_key)
    heartbeat_agent = forward("_store", MetadataStore.heartbeat_agent)
    list_agents = forward("_store", MetadataStore.list_agents)

    # -- transactions (coordinator.log.transactions) ------------------------------

    init_transaction = forward("_txns", TransactionStore.init)
    add_txn_partitions = forward("_txns", TransactionStore.add_partitions)
    add_txn_group = forward("_txns", TransactionStore.add_group)
    end_transaction = forward("_txns", TransactionStore.end)
    complete_transaction = forward("_txns", TransactionStore.complete)
    abort_expired_transactions = forward("_txns", TransactionStore.abort_expired)

    txn_commit_offsets = forward("_txns", TransactionStore.hold_offsets)
    list_transactions = forward("_txns", TransactionStore.list_all)
    held_offsets = forward("_txns", TransactionStore.held_offsets)

    stable_offsets = forward("_txns", TransactionStore.stable_offsets)

    # -- consumer groups: both doors' stores, one group id used by one door at a time --

    delete_consumer = forward("_groups", GroupStore.delete_consumer)
    consumer = forward("_groups", GroupStore.consumer)
    subscribe = forward("_groups", GroupStore.subscribe)
    unsubscribe = forward("_groups", GroupStore.unsubscribe)
    assign = forward("_groups", GroupStore.assign)
    seek = forward("_groups", GroupStore.seek)
    advance = forward("_groups", GroupStore.advance)
    begin_fetch = forward("_groups", GroupStore.begin_fetch)
    confirm_fetch = forward("_groups", GroupStore.confirm_fetch)
    end_fetch = forward("_groups", GroupStore.end_fetch)
    heartbeat_consumers = forward("_groups", GroupStore.heartbeat_consumers)
    commit_offsets = forward("_groups", GroupStore.commit_offsets)
    committed_offsets = forward("_groups", GroupStore.committed_offsets)

    kafka_join = forward("_kafka_groups", KafkaGroupStore.join)
    kafka_sync = forward("_kafka_groups", KafkaGroupStore.sync)
    kafka_heartbeat = forward("_kafka_groups", KafkaGroupStore.heartbeat)
    kafka_leave = forward("_kafka_groups", KafkaGroupStore.leave)
    kafka_commit_offsets = forward("_kafka_groups", KafkaGroupStore.commit_offsets)
    kafka_committed = forward("_kafka_groups", KafkaGroupStore.committed)
    kafka_describe = forward("_kafka_groups", KafkaGroupStore.describe)
    kafka_consumer_heartbeat = forward("_kafka_groups", KafkaGroupStore.consumer_heartbeat)

    def create_consumer(self, group: str, name: str, config: ConsumerConfig) -> ConsumerState:
        if self._kafka_groups.has_members(group):
            raise GroupProtocolConflictError(
                f"Consumer group '{group}' has Kafka protocol members; a group is used through "
                "one door at a time."
            )
        return self._groups.create_consumer(group, name, config)

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

    register_schema = forward("_schemas", SchemaRegistryStore.register_schema)
    get_schema = forward("_schemas", SchemaRegistryStore.get_schema)
    schema_versions = forward("_schemas", SchemaRegistryStore.schema_versions)
    list_subjects = forward("_schemas", SchemaRegistryStore.list_subjects)
    subject_versions = forward("_schemas", SchemaRegistryStore.subject_versions)
    get_subject_version = forward("_schemas", SchemaRegistryStore.get_subject_version)
    find_schema = forward("_schemas", SchemaRegistryStore.find_schema)
    delete_subject = forward("_schemas", SchemaRegistryStore.delete_subject)
    delete_subject_version = forward("_schemas", SchemaRegistryStore.delete_subject_version)
    referenced_by = forward("_schemas", SchemaRegistryStore.referenced_by)
    get_compatibility = forward("_schemas", SchemaRegistryStore.get_compatibility)
    set_compatibility = forward("_schemas", SchemaRegistryStore.set_compatibility)
    delete_compatibility = forward("_schemas", SchemaRegistryStore.delete_compatibility)


def _conforms(c: LocalCoordinator) -> ServedCoordinator:
    # mypy checks here that LocalCoordinator implements every served protocol exactly.
    return c


def _store_conforms_groups(s: GroupStore) -> GroupCoordinator:
    return s


def _store_conforms_schemas(s: SchemaRegistryStore) -> SchemaStore:
    return s
