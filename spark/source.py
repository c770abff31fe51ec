"""The ``lakelog`` Spark 4 Python data source: reads, streams and writes of topics.

Usage (no registration: Spark finds the installed top-level module ``pyspark_lakelog``)::

    df = (spark.read.format("lakelog")
          .option("coordinator", "http://127.0.0.1:8083")
          .option("subscribe", "orders")
          .load())
    stream = spark.readStream.format("lakelog").option(...).load()
    df.write.format("lakelog").option("coordinator", ...).option("topic", "out").save()

Reads plan in Spark's Python planner process: the options are parsed (errors surface
as the query's analysis error), filters are pushed down when Spark offers them, the
coordinator gives the snapshot and says where the objects are, and the snapshot is cut
into input partitions (``spark.plan``, ``index.plan``). Each Spark task then reads its objects with
boto3/pyarrow and yields Arrow record batches (``spark.scan``). A stream does the same
per micro-batch between offsets kept in Spark's checkpoint (``spark.stream``). Writes
upload segment objects from the tasks and commit them from the driver
(``spark.write``).

The columns are Spark's Kafka source's (``headers`` only with ``includeHeaders=true``);
a user-given schema with a subset of them (``.schema("offset long, value binary")``)
decodes only those columns from Parquet objects.

This module imports pyspark; ``spark/__init__.py`` and ``pyspark_lakelog`` load it,
the agent never does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import math
import os
import sys
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from coordinator.client import Coordinator, PartitionOffsets, StoreLocation, TopicInfo
from coordinator.security.model import Operation
from index.plan import Bounds, ScanTask, plan_tasks
from spark.access import TopicAccess, topic_access
from spark.connect import get_store, open_coordinator, opened, resolve_store
from spark.options import ReadOptions, parse_options, parse_write_options
from spark.plan import plan_read
from spark.stream import (
    current_offsets,
    from_json,
    initial_offsets,
    latest_offsets,
    micro_batch_ranges,
    to_json,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from spark.write import ObjectsWritten

# Decoding, encoding and writing (spark.scan, spark.write: pyarrow.parquet, the Kafka
# codec) are imported where used: Spark's planner starts a Python process for every
# query it plans, which needs only the light modules above.

__all__ = ["SCHEMA", "LakelogDataSource"]

log = logging.getLogger(__name__)

#: Spark's Kafka source schema with includeHeaders=true, as DDL.
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>"
)
#: ... and without (the default, as Spark's Kafka source).
SCHEMA_NO_HEADERS = SCHEMA.rsplit(", headers", 1)[0]
_TYPES = dict(f.split(" ", 1) for f in SCHEMA.split(", "))


def _columns(schema: StructType) -> tuple[str, ...]:
    """The Kafka columns a (user-given) schema asks for; each must have Spark's type."""
    for f in schema.fields:
        want = _TYPES.get(f.name)
        if want is None:
            raise ValueError(f"schema: {f.name!r} is not a Kafka source column ({list(_TYPES)})")
        if f.dataType.simpleString() != want.replace(" ", ""):
            raise ValueError(f"schema: column {f.name!r} must be {want}")
    return tuple(f.name for f in schema.fields)


def _ms(value: Any, *, upper: bool) -> int | None:
    """A timestamp literal as epoch ms, rounded outwards; naive datetimes widened by a day.

    Spark hands naive datetimes in the session's time zone, which the planner does not
    know: the bound is widened so pruning stays safe (Spark applies the filter exactly).
    """
    if not isinstance(value, dt.datetime):
        return None
    slack = 0
    if value.tzinfo is None:
        value, slack = value.replace(tzinfo=dt.UTC), 86_400_000
    ms = value.timestamp() * 1000
    return int(math.ceil(ms) + slack if upper else math.floor(ms) - slack)


def _bounds(filters: Sequence[Filter]) -> tuple[Bounds, list[Filter]]:
    """Filters as Bounds, and those Spark must still evaluate (unsupported or partial)."""
    topics: set[str] | None = None
    partitions: set[int] | None = None
    lo_off: int | None = None
    hi_off: int | None = None
    lo_ts: int | None = None
    hi_ts: int | None = None
    rest: list[Filter] = []

    def low(current: int | None, value: int) -> int:
        return value if current is None else max(current, value)

    def high(current: int | None, value: int) -> int:
        return value if current is None else min(current, value)

    for f in filters:
        column: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
        name = column[0] if len(column) == 1 else None
        value: Any = getattr(f, "value", None)
        ints = isinstance(value, int) and not isinstance(value, bool)
        if name in ("topic", "partition") and isinstance(f, EqualTo | In):
            values: set[Any] = set(value) if isinstance(f, In) else {value}
            if name == "topic" and all(isinstance(v, str) for v in values):
                topics = values if topics is None else topics & values
                continue
            if name == "partition" and all(type(v) is int for v in values):
                partitions = values if partitions is None else partitions & values
                continue
        elif name == "offset" and ints:
            assert isinstance(value, int)
            if isinstance(f, EqualTo):
                lo_off, hi_off = low(lo_off, value), high(hi_off, value)
                continue
            if isinstance(f, GreaterThan | GreaterThanOrEqual):
                lo_off = low(lo_off, value + 1 if isinstance(f, GreaterThan) else value)
                continue
            if isinstance(f, LessThan | LessThanOrEqual):
                hi_off = high(hi_off, value - 1 if isinstance(f, LessThan) else value)
                continue
        elif name == "offset" and isinstance(f, In) and value:
            ok = [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
            if len(ok) == len(value):
                lo_off, hi_off = low(lo_off, min(ok)), high(hi_off, max(ok))
        elif name == "timestamp":
            # Pruned here, evaluated exactly by Spark (always returned below).
            if isinstance(f, EqualTo | GreaterThan | GreaterThanOrEqual):
                ms = _ms(value, upper=False)
                lo_ts = lo_ts if ms is None else low(lo_ts, ms)
            if isinstance(f, EqualTo | LessThan | LessThanOrEqual):
                ms = _ms(value, upper=True)
                hi_ts = hi_ts if ms is None else high(hi_ts, ms)
        rest.append(f)
    bounds = Bounds(
        topics=None if topics is None else frozenset(topics),
        partitions=None if partitions is None else frozenset(partitions),
        min_offset=lo_off,
        max_offset=hi_off,
        min_ts=lo_ts,
        max_ts=hi_ts,
    )
    return bounds, rest


def _spark_pushes_filters() -> bool:
    """Whether Spark will offer this read's filters to ``pushFilters``.

    Spark (>= 4.1) calls ``pushFilters`` only when the session sets
    ``spark.sql.python.filterPushdown.enabled``, and otherwise refuses a reader that
    overrides it (DATA_SOURCE_PUSHDOWN_DISABLED); a source can neither ask for the
    setting nor see it. The planner that runs without pushdown
    (``pyspark.sql.worker.plan_data_source_read``) has read the setting into its local
    ``enable_pushdown`` before it calls ``DataSource.reader``; the planner that pushes
    filters runs only when the setting is on and has no such local. So the frames
    calling ``reader`` tell, and a read works whatever the setting: pruned with it,
    filtered by Spark after a full read without it.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if "enable_pushdown" in frame.f_locals and frame.f_code.co_name == "_main":
            return bool(frame.f_locals["enable_pushdown"])
        frame = frame.f_back  # type: ignore[assignment]
    return True


class LakelogPartition(InputPartition):
    """One Spark input partition: a scan task and where its objects are."""

    def __init__(self, index: int, task: ScanTask, location: StoreLocation) -> None:
        super().__init__(index)
        self.task = task
        self.location = location


def _read(
    partition: InputPartition, columns: Sequence[str], bounds: Bounds, trace: str | None
) -> Iterator[pa.RecordBatch]:
    """Read one input partition (batch or micro-batch) as Arrow batches.

    A plan without tasks reaches here as Spark's placeholder ``InputPartition(None)``
    (Spark runs one task when ``partitions`` returns none): it reads nothing.
    """
    if not isinstance(partition, LakelogPartition):
        if partition.value is not None:
            raise TypeError(f"not a lakelog input partition: {partition!r}")
        return
    from spark.scan import ScanStats, append_trace, read_task

    stats = ScanStats()
    yield from read_task(get_store(partition.location), partition.task, columns, bounds, stats)
    if trace:
        append_trace(trace, {"event": "task", "pid": os.getpid(), **stats.as_json()})


class LakelogReader(DataSourceReader):
    """Plans one snapshot (``partitions``) and reads scan tasks (``read``); no pushdown."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = parse_options(options)
        self.columns = _columns(schema)
        self.bounds = Bounds()

    def partitions(self) -> list[InputPartition]:
        """Take the snapshot and cut it into input partitions (one per scan task)."""
        opts = self.opts
        if opts.from_table:
            return self._history_partitions()
        with opened(opts.connection) as coordinator:
            access = topic_access(opts.connection, coordinator)
            location = resolve_store(opts.connection, coordinator)
            plan = plan_read(opts, coordinator, get_store(location), self.bounds, access)
        if opts.latest_by_key:
            from spark.history import by_partition

            plan = replace(plan, tasks=by_partition(plan.tasks))
        if opts.trace:
            from spark.scan import append_trace

            append_trace(
                opts.trace,
                {
                    "event": "plan",
                    "snapshot": {f"{t}-{p}": list(v) for (t, p), v in plan.snapshot.items()},
                    "ranges": {f"{t}-{p}": list(v) for (t, p), v in plan.ranges.items()},
                    "tasks": len(plan.tasks),
                    "slices": sum(len(t.slices) for t in plan.tasks),
                    "objects": len({s.object_key for t in plan.tasks for s in t.slices}),
                    "store": location.url,
                },
            )
        return [LakelogPartition(i, task, location) for i, task in enumerate(plan.tasks)]

    def _history_partitions(self) -> list[InputPartition]:
        """``asOfTimestamp``/``asOfSnapshot``: tasks over the table snapshot's files (the
        catalog applies the job's ACLs)."""
        from spark.history import by_partition, plan_history, table_catalog

        opts = self.opts
        with opened(opts.connection) as coordinator:
            location = resolve_store(opts.connection, coordinator)
        with table_catalog(opts, location) as catalog:
            tasks = plan_history(opts, catalog, location, self.bounds)
        if opts.latest_by_key:
            tasks = by_partition(tasks)
        return [LakelogPartition(i, task, location) for i, task in enumerate(tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not self.opts.latest_by_key:
            yield from _read(partition, self.columns, self.bounds, self.opts.trace)
            return
        import pyarrow as pa

        from spark.history import latest_by_key

        wanted = list(dict.fromkeys([*self.columns, "key", "value", "offset"]))
        batches = list(_read(partition, wanted, self.bounds, self.opts.trace))
        if not batches:
            return
        latest = latest_by_key(pa.Table.from_batches(batches)).select(list(self.columns))
        yield from latest.to_batches()


class LakelogPruningReader(LakelogReader):
    """A reader that takes Spark's pushed filters: partitions, objects and row groups pruned."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Keep what prunes partitions, offsets and timestamps; return the rest to Spark."""
        self.bounds, rest = _bounds(filters)
        return rest


class LakelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches between Kafka-source offsets kept in Spark's checkpoint."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts: ReadOptions = parse_options(options, streaming=True)
        self.columns = _columns(schema)
        self._cap: dict[tuple[str, int], int] | None = None
        self._coordinator: Coordinator | None = None
        self._access: TopicAccess | None = None
        self._location: StoreLocation | None = None
        # The id of each topic as last seen, and those seen with another id since the
        # last planned micro-batch (deleted and created again): this query's memory only.
        self._topic_ids: dict[str, bytes] = {}
        self._recreated: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to the executors for read(): without the planner's open client.
        state = dict(self.__dict__)
        state["_coordinator"] = state["_access"] = None
        return state

    def _client(self) -> Coordinator:
        if self._coordinator is None:
            self._coordinator = open_coordinator(self.opts.connection)
            self._access = topic_access(self.opts.connection, self._coordinator)
        return self._coordinator

    def _offsets(self) -> dict[tuple[str, int], PartitionOffsets]:
        """The subscribed partitions now (a ``subscribe`` topic deleted meanwhile is left
        out); notes the topics whose id changed (deleted and created again)."""
        now = current_offsets(self.opts, self._client(), self._access, missing_ok=True)
        for (topic, _), o in now.items():
            seen = self._topic_ids.setdefault(topic, o.topic_id)
            if o.topic_id and seen != o.topic_id:
                self._recreated.add(topic)
                self._topic_ids[topic] = o.topic_id
        return now

    def initialOffset(self) -> dict[str, Any]:
        coordinator = self._client()
        store = None
        if self.opts.starting_timestamp is not None:
            store = get_store(self._store_location(coordinator))
        return to_json(initial_offsets(self.opts, coordinator, store, self._access))

    def _store_location(self, coordinator: Coordinator) -> StoreLocation:
        if self._location is None:
            self._location = resolve_store(self.opts.connection, coordinator)
        return self._location

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.opts.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        now = self._offsets()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return to_json(latest_offsets(now, from_json(start), max_rows, self._cap))

    def reportLatestOffset(self) -> dict[str, Any] | None:
        now = self._offsets()
        return to_json({tp: o.high_watermark for tp, o in now.items()})

    def prepareForTriggerAvailableNow(self) -> None:
        now = self._offsets()
        self._cap = {tp: o.high_watermark for tp, o in now.items()}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        coordinator = self._client()
        location = self._store_location(coordinator)
        recreated, self._recreated = self._recreated, set()
        ranges = micro_batch_ranges(
            self.opts, coordinator, from_json(start), from_json(end), recreated
        )
        store = get_store(location)
        tasks = plan_tasks(
            coordinator,
            store,
            ranges,
            Bounds(),
            self.opts.max_bytes_per_task,
            self._topic_ids,
            read_committed=self.opts.read_committed,
        )
        if self.opts.trace:
            from spark.scan import append_trace

            append_trace(
                self.opts.trace,
                {
                    "event": "micro-batch",
                    "ranges": {f"{t}-{p}": list(v) for (t, p), v in ranges.items()},
                    "tasks": len(tasks),
                },
            )
        return [LakelogPartition(i, task, location) for i, task in enumerate(tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition, self.columns, Bounds(), self.opts.trace)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: offsets live in Spark's checkpoint, objects in the store."""

    def stop(self) -> None:
        if self._coordinator is not None:
            close = getattr(self._coordinator, "close", None)
            if close is not None:
                close()
            self._coordinator = self._access = None


class LakelogCommitMessage(WriterCommitMessage):
    """What a write task hands the driver: its uploaded, uncommitted objects."""

    def __init__(self, written: ObjectsWritten) -> None:
        self.written = written


class _Writer:
    """What the batch and streaming writers share: set up on the driver, write on tasks."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        from spark.write import check_sink_schema

        self.opts = parse_write_options(options)
        columns = {f.name: f.dataType.simpleString() for f in schema.fields}
        check_sink_schema(columns, self.opts.topic)
        with opened(self.opts.connection) as coordinator:
            access = topic_access(self.opts.connection, coordinator)
            if access is not None:  # fail before any task runs, when it can tell
                access.require(
                    Operation.WRITE, [] if self.opts.topic is None else [self.opts.topic]
                )
            self.location = resolve_store(self.opts.connection, coordinator)
            # With the topic option, one lookup here instead of one per task.
            self.topic: TopicInfo | None = (
                None if self.opts.topic is None else _topic(coordinator, self.opts.topic)
            )
        # The job's write lease: its tasks' uploads are pending under it until the commit.
        self.lease_id = f"spark-{uuid.uuid4().hex}"

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> LakelogCommitMessage:
        from pyspark import TaskContext

        from index.log import LogWriter
        from spark.write import TaskWriter, WriteLease

        context = TaskContext.get()
        store = get_store(self.location)
        with (
            opened(self.opts.connection) as coordinator,
            WriteLease(coordinator, self.lease_id) as lease,  # renewed while the task runs
        ):
            known = {} if self.topic is None else {self.topic.name: self.topic}
            task = TaskWriter(
                LogWriter(store, coordinator),
                lambda name: known.get(name) or _topic(coordinator, name),
                None if self.topic is None else self.topic.name,
                self.opts.compression,
                self.opts.max_bytes_per_object,
                before_put=lease.register,
            )
            for batch in iterator:
                task.add(batch)
            written = task.finish(
                context.partitionId() if context else -1,
                context.attemptNumber() if context else -1,
            )
        return LakelogCommitMessage(written)

    def _commit(
        self,
        messages: Sequence[WriterCommitMessage | None],
        what: str,
        batch_key: str | None = None,
    ) -> None:
        from spark.write import WriteLease, commit_objects

        written = [m.written if isinstance(m, LakelogCommitMessage) else None for m in messages]
        with opened(self.opts.connection) as coordinator:
            access = topic_access(self.opts.connection, coordinator)
            if access is not None:
                # Every topic the tasks wrote (the topic column's too), before any commit:
                # a denied write leaves nothing visible, and Spark's abort deletes its objects.
                access.require(Operation.WRITE, {t for w in written if w for t in w.topics})
            lease = WriteLease(coordinator, self.lease_id)
            with lease:  # alive through a long commit; released once it is done
                results = commit_objects(get_store(self.location), coordinator, written, batch_key)
            lease.release()
        records = sum(w.records for w in written if w is not None)
        log.info("%s: committed %d objects, %d records", what, len(results), records)

    def _abort(self, messages: Sequence[WriterCommitMessage | None], what: str) -> None:
        from spark.write import WriteLease, delete_objects

        written = [m.written if isinstance(m, LakelogCommitMessage) else None for m in messages]
        with opened(self.opts.connection) as coordinator:
            deleted = delete_objects(get_store(self.location), coordinator, written)
            try:  # what is left (failed attempts' objects) is an orphan from now on
                WriteLease(coordinator, self.lease_id).release()
            except Exception:
                log.warning("abort: write lease %s left to expire", self.lease_id, exc_info=True)
        log.warning("%s aborted: deleted %d uncommitted objects", what, deleted)


def _topic(coordinator: Coordinator, name: str) -> TopicInfo:
    from segments.errors import TopicNotFoundError

    try:
        return coordinator.get_topic(name)
    except TopicNotFoundError:
        raise ValueError(f"topic {name!r} does not exist: create it first") from None


class LakelogWriter(_Writer, DataSourceArrowWriter):
    """``df.write.format("lakelog")``: objects from the tasks, one commit per object from
    the driver once every task succeeded (see ``spark.write``)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._commit(messages, "write")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._abort(messages, "write")


class LakelogStreamWriter(_Writer, DataSourceStreamArrowWriter):
    """``df.writeStream.format("lakelog")``: each micro-batch written like a batch write.

    Exactly once when the query has a stable identity (option ``sinkId``, else its
    ``checkpointLocation`` option): a micro-batch that Spark runs again after a crash
    (its commit here done, not yet recorded by Spark) finds its objects' keys stored and
    commits nothing twice (``spark.write.commit_objects``). Without one, at least once,
    as Spark's Kafka sink.
    """

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sink = self.opts.sink_id
        key = None
        if sink is not None:
            digest = hashlib.sha256(sink.encode()).hexdigest()[:24]
            key = f"spark-sink:{digest}:{batchId}"
        self._commit(messages, f"micro-batch {batchId}", key)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._abort(messages, f"micro-batch {batchId}")


class LakelogDataSource(DataSource):
    """``format("lakelog")``: see the module docstring and ``spark.options``."""

    @classmethod
    def name(cls) -> str:
        return "lakelog"

    def schema(self) -> str:
        raw = {k.lower(): v for k, v in self.options.items()}.get("includeheaders", "false")
        return SCHEMA if raw.strip().lower() == "true" else SCHEMA_NO_HEADERS

    def reader(self, schema: StructType) -> DataSourceReader:
        if _spark_pushes_filters():
            return LakelogPruningReader(dict(self.options), schema)
        return LakelogReader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LakelogStreamReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> LakelogWriter:
        if overwrite:
            raise ValueError(
                "a lakelog topic is append-only: write with mode 'append' (as Spark's Kafka sink)"
            )
        return LakelogWriter(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> LakelogStreamWriter:
        # Output mode "complete" asks to overwrite: like Spark's Kafka sink, each
        # micro-batch's whole result is appended.
        return LakelogStreamWriter(dict(self.options), schema)
