"""Topic tables: publish recorded changes as Iceberg snapshots, expire old snapshots, and
serve the tables through a pyiceberg catalog over the metadata database.

**Publishing** (:meth:`TopicTables.publish`): the current snapshot's summary says up to
which change of each database (``lakelog.changes``) it includes; the changes after that
(``coordinator.iceberg.changes``) become ONE snapshot: an append of the tier objects
added, or an overwrite when objects went too (retention, DeleteRecords, compaction). A
new file's statistics and row-group offsets come from its Parquet footer (one ranged
GET). The metadata pointer moves by compare-and-set in the metadata database, so two
publishers of one table cannot both win: the loser starts over from the new snapshot
(pyiceberg's own retry is off: it would apply the same changes twice).

**Expiry** (:meth:`TopicTables.expire`): snapshots older than the topic's
``table.snapshot.retention.ms`` go, keeping at least ``table.snapshot.min.count`` (and
always the current one). Then the oldest retained snapshot's changes release the
``table_files`` rows of objects removed up to there (no retained snapshot can name them;
garbage collection takes them a grace period later), and table files nothing reachable
names (old metadata files, manifests, manifest lists of expired snapshots, commits that
lost their race) are deleted once older than the grace period. A deleted topic's table
prefix goes the same way.

A reader holding a snapshot that expiry removes keeps reading for the grace period (GC's
``gc_grace_s``) and then fails cleanly: the data files are gone (``FileNotFoundError``
from the store), never replaced by other bytes (tier object keys are unique).

**The pyiceberg catalog** (:class:`LakelogCatalog`): loads tables by topic name in the
``topics`` namespace and commits what ``TopicTables`` itself produces; everything else
(create, drop, rename, namespaces, views) is refused: outside engines only read.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromByteStream
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties

from coordinator import clock
from coordinator.iceberg.changes import Pending, TableFile
from coordinator.iceberg.fileio import StoreFileIO
from coordinator.iceberg.schema import (
    CHANGES_PROPERTY,
    METADATA_PREFIX,
    NAMESPACE,
    PARTITION_SPEC,
    TABLE_SCHEMA,
    table_prefix,
    table_properties,
)
from coordinator.log.topic_configs import effective_configs
from segments.errors import (
    CommitConflictError,
    CoordinatorUnavailableError,
    ObjectNotFoundError,
    TopicNotFoundError,
)
from segments.store import ObjectStore

if TYPE_CHECKING:
    import pyarrow as pa_types  # noqa: F401

    from coordinator.janitors.catalog import Catalog
    from coordinator.shards import ShardedCatalog

log = logging.getLogger(__name__)

_TOPICS = "SELECT topic_id, name FROM topics WHERE name NOT LIKE '#%' ORDER BY name"
_TOPIC_ID = "SELECT topic_id FROM topics WHERE name = ?"
_TOPIC_CONFIGS = "SELECT name, value FROM topic_configs WHERE topic_id = ?"
_CLUSTER_CONFIGS = "SELECT name, value FROM cluster_configs"
_POINTER = "SELECT metadata_location FROM iceberg_tables WHERE topic_id = ?"
_POINTERS = "SELECT topic_id, metadata_location FROM iceberg_tables"
_CREATE_POINTER = (
    "INSERT INTO iceberg_tables (topic_id, metadata_location, updated_at) "
    "SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = ?) "
    "ON CONFLICT (topic_id) DO NOTHING RETURNING topic_id"
)
_SWAP_POINTER = (
    "UPDATE iceberg_tables SET metadata_location = ?, updated_at = ? "
    "WHERE topic_id = ? AND metadata_location = ? RETURNING topic_id"
)

#: Footer bytes fetched with the first ranged GET of a new file (one GET for most).
FOOTER_GUESS = 256 << 10
#: Footer GETs in flight while a snapshot is prepared.
FOOTER_THREADS = 8
#: Publish attempts before a conflict is reported (each starts from the newest snapshot).
PUBLISH_ATTEMPTS = 5
#: Parsed metadata files kept (they never change: a location names one version).
METADATA_CACHE = 64


def changes_of(snapshot: Snapshot | None) -> dict[str, int]:
    """The last change of each database a snapshot includes (empty: none)."""
    if snapshot is None or snapshot.summary is None:
        return {}
    raw = snapshot.summary.additional_properties.get(CHANGES_PROPERTY)
    return {str(k): int(v) for k, v in json.loads(raw).items()} if raw else {}


@dataclass
class PublishReport:
    """What publishing did: tables created, snapshots committed, files added/removed."""

    tables_created: int = 0
    snapshots: int = 0
    files_added: int = 0
    files_removed: int = 0
    conflicts: int = 0
    skipped: list[str] = field(default_factory=list)


@dataclass
class ExpiryReport:
    snapshots_expired: int = 0
    files_released: int = 0
    metadata_deleted: int = 0


class TopicTables:
    """The topic tables of one cluster (see the module docstring).

    Args:
        catalog: the janitors' view of the metadata (one database or sharded).
        store: the object store holding tier objects and the tables' own files.
        now: the clock (epoch seconds).
    """

    def __init__(
        self,
        catalog: Catalog | ShardedCatalog,
        store: ObjectStore,
        now: Callable[[], float] = clock.now,
    ) -> None:
        self.catalog = catalog
        self.store = store
        self.io = StoreFileIO(store)
        self.now = now
        self._db = catalog.catalog_db
        self._q = self._db.dialect.sql
        self._metadata: OrderedDict[str, TableMetadata] = OrderedDict()
        self._lock = threading.Lock()
        self.iceberg = LakelogCatalog(self)

    # -- topics and pointers -----------------------------------------------------------
    def topics(self) -> list[tuple[bytes, str]]:
        """Every topic (id, name), by name."""
        with self._db.read() as conn:
            return [(bytes(t), str(n)) for t, n in conn.execute(self._q(_TOPICS)).fetchall()]

    def topic_id(self, topic: str) -> bytes:
        """Raises TopicNotFoundError."""
        with self._db.read() as conn:
            row = conn.execute(self._q(_TOPIC_ID), (topic,)).fetchone()
        if row is None:
            raise TopicNotFoundError(f"Topic {topic!r} not found.")
        return bytes(row[0])

    def pointer(self, topic_id: bytes) -> str | None:
        """The location of the table's current metadata file (None: no table yet)."""
        with self._db.read() as conn:
            row = conn.execute(self._q(_POINTER), (topic_id,)).fetchone()
        return None if row is None else str(row[0])

    def _swap_pointer(self, topic_id: bytes, old: str, new: str) -> bool:
        with self._db.write() as conn:
            row = conn.execute(self._q(_SWAP_POINTER), (new, self.now(), topic_id, old)).fetchone()
        return row is not None

    def configs(self, topic_id: bytes) -> dict[str, str]:
        """The topic's effective configs (its overrides over the cluster-wide defaults)."""
        from coordinator.log.topic_configs import topic_defaults

        with self._db.read() as conn:
            defaults = topic_defaults(dict(conn.execute(self._q(_CLUSTER_CONFIGS)).fetchall()))
            own = dict(conn.execute(self._q(_TOPIC_CONFIGS), (topic_id,)).fetchall())
        return effective_configs(own, defaults)

    def metadata(self, location: str) -> TableMetadata:
        """A metadata file, parsed (cached: a location names one immutable version)."""
        with self._lock:
            hit = self._metadata.get(location)
            if hit is not None:
                self._metadata.move_to_end(location)
                return hit
        data = self.metadata_bytes(location)
        parsed = FromByteStream.table_metadata(pa.BufferReader(data))
        with self._lock:
            self._metadata[location] = parsed
            while len(self._metadata) > METADATA_CACHE:
                self._metadata.popitem(last=False)
        return parsed

    def metadata_bytes(self, location: str) -> bytes:
        """A metadata file's JSON as stored (the REST catalog serves it as it is)."""
        return self.store.get(self.io.key(location))

    def table(self, topic_id: bytes, topic: str) -> Table | None:
        """The topic's table as of now (None: not created yet)."""
        location = self.pointer(topic_id)
        if location is None:
            return None
        return Table((NAMESPACE, topic), self.metadata(location), location, self.io, self.iceberg)

    def ensure(self, topic_id: bytes, topic: str) -> Table:
        """The topic's table, created (empty) if it has none yet.

        Raises:
            TopicNotFoundError: the topic was deleted meanwhile.
        """
        existing = self.table(topic_id, topic)
        if existing is not None:
            return existing
        root = self.io.root
        metadata = new_table_metadata(
            schema=TABLE_SCHEMA,
            partition_spec=PARTITION_SPEC,
            sort_order=UNSORTED_SORT_ORDER,
            location=f"{root}/{table_prefix(topic_id).rstrip('/')}",
            properties={
                **table_properties(root, topic, topic_id),
                # Publishing retries itself from the newest snapshot (module docstring).
                "commit.retry.num-retries": "0",
            },
        )
        location = (
            f"{root}/{table_prefix(topic_id)}metadata/00000-{metadata.table_uuid}.metadata.json"
        )
        MetastoreCatalog._write_metadata(metadata, self.io, location)
        with self._db.write() as conn:
            made = conn.execute(
                self._q(_CREATE_POINTER), (topic_id, location, self.now(), topic_id)
            ).fetchone()
        if made is None:
            self.io.delete(location)
            found = self.table(topic_id, topic)
            if found is None:
                raise TopicNotFoundError(f"Topic {topic!r} was deleted.")
            return found
        log.info("table %s.%s created at %s", NAMESPACE, topic, location)
        return Table((NAMESPACE, topic), metadata, location, self.io, self.iceberg)

    # -- publishing -------------------------------------------------------------------
    def publish_all(
        self, topic: str | None = None, check: Callable[[], None] | None = None
    ) -> PublishReport:
        """Publish the pending changes of every topic's table (or ``topic``'s)."""
        report = PublishReport()
        for topic_id, name in self.topics():
            if topic is not None and name != topic:
                continue
            if check is not None:
                check()
            try:
                self.publish(topic_id, name, report)
            except TopicNotFoundError:
                continue  # deleted meanwhile
        return report

    def publish(
        self, topic_id: bytes, topic: str, report: PublishReport | None = None
    ) -> Snapshot | None:
        """Commit the topic's pending changes as one snapshot; None when there were none.

        Raises:
            CommitConflictError: other publishers won PUBLISH_ATTEMPTS times in a row.
            TopicNotFoundError: the topic was deleted meanwhile.
        """
        report = report if report is not None else PublishReport()
        for _ in range(PUBLISH_ATTEMPTS):
            existed = self.pointer(topic_id) is not None
            table = self.ensure(topic_id, topic)
            report.tables_created += 0 if existed else 1
            marks = changes_of(table.current_snapshot())
            pending: dict[str, Pending] = {}
            for key, files in self.catalog.table_files().items():
                try:
                    found = files.pending(topic_id, marks.get(key, 0))
                except CoordinatorUnavailableError as e:
                    log.warning("table %s: changes in %s left for later: %s", topic, key, e)
                    report.skipped.append(f"{topic}@{key}")
                    continue
                if found.through > found.since:
                    pending[key] = found
            if not pending:
                return None
            added = [f for p in pending.values() for f in p.added]
            removed = [f for p in pending.values() for f in p.removed]
            new_marks = marks | {k: p.through for k, p in pending.items()}
            try:
                snapshot = self._commit(table, added, removed, new_marks)
            except CommitFailedException:
                report.conflicts += 1
                self._forget(table.metadata_location)
                continue
            report.snapshots += 1
            report.files_added += len(added)
            report.files_removed += len(removed)
            return snapshot
        raise CommitConflictError(f"table of topic {topic!r}: publishing kept losing its race")

    def _forget(self, location: str) -> None:
        with self._lock:
            self._metadata.pop(location, None)

    def _commit(
        self,
        table: Table,
        added: Sequence[TableFile],
        removed: Sequence[TableFile],
        marks: dict[str, int],
    ) -> Snapshot:
        new_files = self.data_files(table.metadata, added)
        old_files = self._held_data_files(table, removed)
        props = {CHANGES_PROPERTY: json.dumps(marks, sort_keys=True)}
        tx = table.transaction()
        update = tx.update_snapshot(snapshot_properties=props)
        producer = update.overwrite() if old_files else update.merge_append()
        with producer as files:
            for f in old_files:
                files.delete_data_file(f)
            for f in new_files:
                files.append_data_file(f)
        committed = tx.commit_transaction()
        snapshot = committed.current_snapshot()
        assert snapshot is not None
        return snapshot

    def data_files(self, metadata: TableMetadata, files: Sequence[TableFile]) -> list[DataFile]:
        """DataFiles of new tier objects, from their Parquet footers (fetched in parallel)."""
        if not files:
            return []
        plan = compute_statistics_plan(metadata.schema(), metadata.properties)
        mapping = parquet_path_to_id_mapping(metadata.schema())
        spec, schema = metadata.spec(), metadata.schema()

        def one(f: TableFile) -> DataFile:
            footer = self._footer(f)
            stats = data_file_statistics_from_parquet_metadata(footer, plan, mapping)
            return DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=self.io.location(f.object_key),
                file_format=FileFormat.PARQUET,
                partition=stats.partition(spec, schema),
                file_size_in_bytes=f.size,
                sort_order_id=None,
                spec_id=metadata.default_spec_id,
                equality_ids=None,
                key_metadata=None,
                **stats.to_serialized_dict(),
            )

        with ThreadPoolExecutor(min(FOOTER_THREADS, len(files))) as pool:
            return list(pool.map(one, files))

    def _footer(self, f: TableFile) -> pq.FileMetaData:
        start = max(0, f.size - FOOTER_GUESS)
        tail = self.store.get_range(f.object_key, start, f.size - start)
        footer_len = int.from_bytes(tail[-8:-4], "little")
        if footer_len + 8 > len(tail):
            start = max(0, f.size - footer_len - 8)
            tail = self.store.get_range(f.object_key, start, f.size - start)
        return pq.read_metadata(pa.BufferReader(tail))

    def _held_data_files(self, table: Table, files: Sequence[TableFile]) -> list[DataFile]:
        """The table's DataFile entries of these objects (from the current snapshot)."""
        if not files:
            return []
        wanted = {self.io.location(f.object_key) for f in files}
        parts = sorted({f.partition for f in files})
        found = {
            task.file.file_path: task.file
            for task in table.scan(
                row_filter=f"partition IN ({', '.join(map(str, parts))})"
            ).plan_files()
            if task.file.file_path in wanted
        }
        missing = sorted(wanted - set(found))
        if missing:
            # The bookkeeping says the table holds them and it does not: never guess.
            raise CommitConflictError(f"table {table.name()} lacks files it should hold: {missing}")
        return list(found.values())

    # -- expiry -----------------------------------------------------------------------
    def expire_all(self, grace_s: float, check: Callable[[], None] | None = None) -> ExpiryReport:
        """Expire every table's old snapshots, release their files, delete unreachable
        table files older than ``grace_s``, and the files of deleted topics' tables."""
        report = ExpiryReport()
        live: set[bytes] = set()
        for topic_id, name in self.topics():
            live.add(topic_id)
            if check is not None:
                check()
            try:
                self.expire(topic_id, name, grace_s, report)
            except TopicNotFoundError:
                continue
        self._drop_deleted_tables(live, grace_s, report)
        return report

    def expire(
        self, topic_id: bytes, topic: str, grace_s: float, report: ExpiryReport | None = None
    ) -> ExpiryReport:
        """Expire one table's snapshots (see the module docstring)."""
        report = report if report is not None else ExpiryReport()
        for _ in range(PUBLISH_ATTEMPTS):
            table = self.table(topic_id, topic)
            if table is None:
                return report
            doomed = self._doomed(table, self.configs(topic_id))
            if not doomed:
                break
            try:
                table.maintenance.expire_snapshots().by_ids(doomed).commit()
            except CommitFailedException:
                self._forget(table.metadata_location)
                continue
            report.snapshots_expired += len(doomed)
            break
        table = self.table(topic_id, topic)
        if table is None:
            return report
        self._release(topic_id, table, report)
        self._delete_unreachable(topic_id, table, grace_s, report)
        return report

    def _doomed(self, table: Table, configs: dict[str, str]) -> list[int]:
        retention_ms = int(configs["table.snapshot.retention.ms"])
        keep = int(configs["table.snapshot.min.count"])
        current = table.current_snapshot()
        snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number or 0)
        if retention_ms < 0 or len(snapshots) <= keep:
            return []
        cutoff = int(self.now() * 1000) - retention_ms
        candidates = snapshots[: len(snapshots) - keep]
        return [
            s.snapshot_id
            for s in candidates
            if s.timestamp_ms < cutoff and (current is None or s.snapshot_id != current.snapshot_id)
        ]

    def _release(self, topic_id: bytes, table: Table, report: ExpiryReport) -> None:
        snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number or 0)
        if not snapshots:
            return
        oldest = changes_of(snapshots[0])
        for key, files in self.catalog.table_files().items():
            through = oldest.get(key, 0)
            if through <= 0:
                continue
            try:
                report.files_released += files.release(topic_id, through, self.now())
            except CoordinatorUnavailableError as e:
                log.warning("table files of %s in %s not released yet: %s", table.name(), key, e)

    def _reachable(self, table: Table) -> set[str]:
        keys = {self.io.key(table.metadata_location)}
        keys.update(self.io.key(m.metadata_file) for m in table.metadata.metadata_log)
        for snapshot in table.snapshots():
            keys.add(self.io.key(snapshot.manifest_list))
            keys.update(self.io.key(m.manifest_path) for m in snapshot.manifests(self.io))
        return keys

    def _delete_unreachable(
        self, topic_id: bytes, table: Table, grace_s: float, report: ExpiryReport
    ) -> None:
        reachable = self._reachable(table)
        cutoff = self.now() - grace_s
        for info in self.store.list(table_prefix(topic_id)):
            if info.key not in reachable and info.last_modified <= cutoff:
                self.store.delete(info.key)
                report.metadata_deleted += 1

    def _drop_deleted_tables(self, live: set[bytes], grace_s: float, report: ExpiryReport) -> None:
        cutoff = self.now() - grace_s
        for info in self.store.list(METADATA_PREFIX):
            hex_id = info.key[len(METADATA_PREFIX) :].split("/", 1)[0]
            try:
                topic_id = bytes.fromhex(hex_id)
            except ValueError:
                continue  # not ours
            if topic_id not in live and info.last_modified <= cutoff:
                self.store.delete(info.key)
                report.metadata_deleted += 1


def _response(metadata: TableMetadata, location: str) -> CommitTableResponse:
    return CommitTableResponse.model_validate({"metadata": metadata, "metadata-location": location})


class LakelogCatalog(MetastoreCatalog):
    """pyiceberg's view of the topic tables: one namespace (``topics``), a table per
    topic; only lakelog's own snapshots are committed (see the module docstring)."""

    def __init__(self, tables: TopicTables, name: str = "lakelog") -> None:
        super().__init__(name)
        self._tables = tables

    def _load_file_io(
        self, properties: Properties = EMPTY_DICT, location: str | None = None
    ) -> FileIO:
        return self._tables.io

    def _topic(self, identifier: str | Identifier) -> str:
        parts = self.identifier_to_tuple(identifier)
        if len(parts) != 2 or parts[0] != NAMESPACE:
            raise NoSuchTableError(f"no table {'.'.join(parts)}: tables are {NAMESPACE}.<topic>")
        return parts[1]

    def load_table(self, identifier: str | Identifier) -> Table:
        topic = self._topic(identifier)
        try:
            topic_id = self._tables.topic_id(topic)
        except TopicNotFoundError:
            raise NoSuchTableError(f"no table {NAMESPACE}.{topic}: no such topic") from None
        table = self._tables.table(topic_id, topic)
        if table is None:
            raise NoSuchTableError(f"no table {NAMESPACE}.{topic} yet")
        return table

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        """Commit a snapshot or expiry that ``TopicTables`` produced: compare-and-set of the
        metadata pointer. Raises CommitFailedException when another commit won."""
        topic = self._topic(table.name())
        topic_id = self._tables.topic_id(topic)
        current = self._tables.table(topic_id, topic)
        if current is None:
            raise NoSuchTableError(f"no table {NAMESPACE}.{topic}")
        staged = self._update_and_stage_table(current, table.name(), requirements, updates)
        if staged.metadata == current.metadata:
            return _response(current.metadata, current.metadata_location)
        self._write_metadata(staged.metadata, staged.io, staged.metadata_location)
        if not self._tables._swap_pointer(
            topic_id, current.metadata_location, staged.metadata_location
        ):
            staged.io.delete(staged.metadata_location)
            raise CommitFailedException(f"table {NAMESPACE}.{topic} changed meanwhile")
        self._delete_old_metadata(staged.io, current.metadata, staged.metadata)
        return _response(staged.metadata, staged.metadata_location)

    def list_tables(self, namespace: str | Identifier) -> list[Identifier]:
        self._namespace(namespace)
        return [(NAMESPACE, name) for _, name in self._tables.topics()]

    def list_namespaces(self, namespace: str | Identifier = ()) -> list[Identifier]:
        return [(NAMESPACE,)] if not self.identifier_to_tuple(namespace) else []

    def load_namespace_properties(self, namespace: str | Identifier) -> Properties:
        self._namespace(namespace)
        return {"comment": "lakelog topics, one table each (read-only)"}

    def _namespace(self, namespace: str | Identifier) -> None:
        if self.identifier_to_tuple(namespace) != (NAMESPACE,):
            raise NoSuchNamespaceError(f"no namespace {namespace!r}: the namespace is {NAMESPACE}")

    def list_views(self, namespace: str | Identifier) -> list[Identifier]:
        return []

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("lakelog's topic tables are read-only: lakelog writes them")

    def create_table(
        self,
        identifier: str | Identifier,
        schema: Schema | Any,
        location: str | None = None,
        partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
        sort_order: SortOrder = UNSORTED_SORT_ORDER,
        properties: Properties = EMPTY_DICT,
    ) -> Table:
        raise NotImplementedError("lakelog's topic tables are read-only: lakelog writes them")

    register_table = _read_only
    drop_table = _read_only
    rename_table = _read_only
    create_namespace = _read_only
    drop_namespace = _read_only
    update_namespace_properties = _read_only
    load_view = _read_only
    register_view = _read_only
    drop_view = _read_only

    def view_exists(self, identifier: str | Identifier) -> bool:
        return False


def check_table(tables: TopicTables, topic: str) -> list[str]:
    """What is wrong with a topic's table (empty: nothing), for checkers and tests.

    Every retained snapshot's data files exist in the store; and, once the table's
    pending changes are published, the current snapshot's files are exactly the tier
    objects the table should hold (those the index names, and those dropped from it by
    changes not yet published count as pending, so call after publishing).
    """
    problems: list[str] = []
    topic_id = tables.topic_id(topic)
    table = tables.table(topic_id, topic)
    if table is None:
        return [f"{topic}: no table"]
    for snapshot in table.snapshots():
        for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
            key = tables.io.key(task.file.file_path)
            try:
                tables.store.head(key)
            except ObjectNotFoundError:
                problems.append(f"{topic}: snapshot {snapshot.snapshot_id} names missing {key}")
    current = table.current_snapshot()
    marks = changes_of(current)
    held: set[str] = set()
    for key, files in tables.catalog.table_files().items():
        last, rows = files.held(topic_id)
        if last != marks.get(key, 0):
            problems.append(f"{topic}: changes {marks.get(key, 0)}..{last} of {key} unpublished")
        held.update(tables.io.location(f.object_key) for f in rows)
    in_table = (
        {t.file.file_path for t in table.scan(snapshot_id=current.snapshot_id).plan_files()}
        if current is not None
        else set()
    )
    if in_table != held:
        problems.append(
            f"{topic}: table files differ from the tier objects it holds: "
            f"extra {sorted(in_table - held)}, missing {sorted(held - in_table)}"
        )
    return problems
