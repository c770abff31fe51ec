"""The ``lakelog`` Spark 4 Python data source: batch reads of topics from the object store.

Usage::

    import spark as lakelog_spark
    lakelog_spark.register(session)          # or session.dataSource.register(...)
    df = (session.read.format("lakelog")
          .option("coordinator", "http://127.0.0.1:9092")
          .option("store", "s3://bucket/lakelog")
          .option("subscribe", "orders")
          .load())

The reader plans in Spark's Python planner process: it parses the options (errors
surface as the query's analysis error), pushes filters down, takes the snapshot and
cuts it into input partitions (``spark.plan``). Each Spark task then reads its objects
with boto3/pyarrow and yields Arrow record batches (``spark.scan``).

A user-given schema with a subset of the Kafka columns (``.schema("offset long, value
binary")``) decodes only those columns from Parquet objects.

This module imports pyspark; ``spark/__init__.py`` loads it only on demand, so the agent
never needs pyspark.
"""

from __future__ import annotations

import datetime as dt
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from coordinator.client import Coordinator
from spark.options import ReadOptions, parse_options
from spark.plan import Bounds, ScanTask, plan_read
from spark.scan import COLUMNS, ScanStats, append_trace, get_store, read_task

__all__ = ["SCHEMA", "LakelogDataSource", "LakelogReader"]

#: Spark's Kafka source schema (with includeHeaders=true), as DDL.
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>"
)
_TYPES = dict(f.split(" ", 1) for f in SCHEMA.split(", "))


def _open_coordinator(opts: ReadOptions) -> Coordinator:
    if opts.coordinator is not None:
        from coordinator.http_client import HttpCoordinator

        return HttpCoordinator(opts.coordinator)
    from coordinator.db import parse_sqlite_url
    from coordinator.local import LocalCoordinator

    assert opts.db is not None
    if opts.db.startswith("sqlite:"):
        path = parse_sqlite_url(opts.db)
        # Opening a missing file would create an empty database: say what is wrong instead.
        if not Path(path).is_file():
            raise ValueError(f"db: no coordinator database at {path} (from {opts.db!r})")
    return LocalCoordinator(opts.db)


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


class LakelogPartition(InputPartition):
    """One Spark input partition: a scan task."""

    def __init__(self, index: int, task: ScanTask) -> None:
        super().__init__(index)
        self.task = task


class LakelogReader(DataSourceReader):
    """Plans one snapshot (``partitions``) and reads scan tasks (``read``)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = parse_options(options)
        names = [f.name for f in schema.fields]
        for f in schema.fields:
            want = _TYPES.get(f.name)
            if want is None:
                raise ValueError(f"schema: {f.name!r} is not a Kafka source column ({COLUMNS})")
            if f.dataType.simpleString() != want:
                raise ValueError(f"schema: column {f.name!r} must be {want}")
        self.columns = tuple(names)
        self.bounds = Bounds()

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Keep what prunes partitions, offsets and timestamps; return the rest to Spark."""
        self.bounds, rest = _bounds(filters)
        return rest

    def partitions(self) -> list[InputPartition]:
        """Take the snapshot and cut it into input partitions (one per scan task)."""
        opts = self.opts
        store = get_store(opts.store, opts.store_endpoint, opts.store_region)
        coordinator = _open_coordinator(opts)
        try:
            plan = plan_read(opts, coordinator, store, self.bounds)
        finally:
            close = getattr(coordinator, "close", None)
            if close is not None:
                close()
        if opts.trace:
            append_trace(
                opts.trace,
                {
                    "event": "plan",
                    "snapshot": {f"{t}-{p}": list(v) for (t, p), v in plan.snapshot.items()},
                    "ranges": {f"{t}-{p}": list(v) for (t, p), v in plan.ranges.items()},
                    "tasks": len(plan.tasks),
                    "slices": sum(len(t.slices) for t in plan.tasks),
                    "objects": len({s.object_key for t in plan.tasks for s in t.slices}),
                },
            )
        return [LakelogPartition(i, task) for i, task in enumerate(plan.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one scan task as Arrow batches.

        A plan without tasks reaches here as Spark's placeholder ``InputPartition(None)``
        (Spark runs one task when ``partitions`` returns none): it reads nothing.
        """
        if not isinstance(partition, LakelogPartition):
            if partition.value is not None:
                raise TypeError(f"not a lakelog input partition: {partition!r}")
            return
        opts = self.opts
        store = get_store(opts.store, opts.store_endpoint, opts.store_region)
        stats = ScanStats()
        yield from read_task(store, partition.task, self.columns, self.bounds, stats)
        if opts.trace:
            append_trace(opts.trace, {"event": "task", "pid": os.getpid(), **stats.as_json()})


class LakelogDataSource(DataSource):
    """``spark.read.format("lakelog")``: see the module docstring and ``spark.options``."""

    @classmethod
    def name(cls) -> str:
        return "lakelog"

    def schema(self) -> str:
        parse_options(self.options)  # bad options fail at load(), before any planning
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return LakelogReader(dict(self.options), schema)
