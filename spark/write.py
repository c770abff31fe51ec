"""Writing Kafka-sink rows as segment objects: what a Spark write task and the job commit do.

A task turns its rows (the Kafka sink's columns: ``key``, ``value``, ``topic`` or the
``topic`` option, optional ``partition`` and ``headers``) into segment objects of at
most about ``maxBytesPerObject`` (one per task unless it writes more than that), PUTs
them under fresh random keys and returns their chunk lists. Nothing is visible yet.

The job commit (Spark's driver, once every task has succeeded) commits the objects to
the coordinator, task by task: each commit is one transaction that assigns the
object's offsets, and repeating it with the same object key answers the same offsets.

Uploads stay alive until the job commits (invariant 9): the job has a write lease (an
id made on the driver, shared by its tasks); each task registers a key as pending under
it before the PUT (``Coordinator.keep_pending``) and renews the lease while it runs
(``WriteLease``), so garbage collection leaves the uploads of a job that runs for hours
alone; the job commit renews it once more, then releases it. A job whose lease lapsed
(every task finished, the driver silent longer than ``LEASE_TTL_S``) may find its
objects collected: its commit then fails with ``ObjectDeletedError``, never succeeds.

Why the driver commits, not the task: Spark may run a task more than once (a retry
after a failure, a speculative copy) and uses only one attempt's result. An attempt
that committed its own objects and then failed, or lost the race, would leave its
records visible next to the retry's: duplicates. Here an attempt that fails or loses
only leaves objects no index entry names; garbage collection deletes them after its
grace period, like any flush that died before its commit (invariant 3).

Partitioning is the Kafka producer's: an explicit ``partition`` wins, a keyed record
goes to ``murmur2`` of its key (``segments.partitioning``, as the agent and Java
clients place it), keyless records stick to one partition per Arrow batch and move on
round-robin.

No pyspark here.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from coordinator.client import Coordinator
from coordinator.topic_configs import (
    check_record_key,
    check_record_size,
    log_append_time,
    record_limit,
)
from index.log import LogWriter, UploadedSegment, WriteResult
from segments.partitioning import partition_for_key
from segments.segment import SegmentBuilder
from segments.store import ObjectStore
from segments.types import ChunkInfo, Headers, Record, TopicInfo

__all__ = [
    "LEASE_TTL_S",
    "SINK_COLUMNS",
    "ObjectsWritten",
    "TaskWriter",
    "WriteLease",
    "check_sink_schema",
    "commit_objects",
    "delete_objects",
]

log = logging.getLogger(__name__)

#: A job's write lease lives this long after its last renewal: the time its driver has
#: between the last task's end and the commit, and the longest outage it survives.
LEASE_TTL_S = 600.0
#: Running tasks renew the lease this often.
LEASE_RENEW_S = 30.0


class WriteLease:
    """A job's write lease as one task (or the job commit) holds it: registers uploads as
    pending and, inside ``with``, renews the lease every ``renew_s`` from a thread.

    Renewal failures are logged, not raised: the commit will tell (ObjectDeletedError)
    if the lease lapsed and garbage collection took an object meanwhile.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        lease_id: str,
        ttl_s: float = LEASE_TTL_S,
        renew_s: float = LEASE_RENEW_S,
    ) -> None:
        self.coordinator = coordinator
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self, key: str) -> None:
        """Register ``key`` (before its PUT) under the lease, renewing the lease."""
        self.coordinator.keep_pending(self.lease_id, [key], self.ttl_s)

    def renew(self) -> set[str]:
        """Extend the lease now; returns nothing useful without keys (see keep_pending)."""
        return self.coordinator.keep_pending(self.lease_id, [], self.ttl_s)

    def release(self) -> None:
        self.coordinator.release_pending(self.lease_id)

    def _run(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                self.renew()
            except Exception:
                log.warning("renewal of write lease %s failed", self.lease_id, exc_info=True)

    def __enter__(self) -> WriteLease:
        self.renew()
        self._thread = threading.Thread(
            target=self._run, name=f"write-lease-{self.lease_id[:8]}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


#: The Kafka sink's columns and the Spark types each may have (DDL ``simpleString``).
SINK_COLUMNS: dict[str, tuple[str, ...]] = {
    "key": ("binary", "string"),
    "value": ("binary", "string"),
    "topic": ("string",),
    "partition": ("int",),
    "headers": ("array<struct<key:string,value:binary>>",),
}


def check_sink_schema(columns: dict[str, str], topic_option: str | None) -> None:
    """Refuse a DataFrame that is not Kafka-sink shaped, naming the column.

    Args:
        columns: column name -> Spark type ``simpleString()``.
        topic_option: the ``topic`` option (then the ``topic`` column is ignored).

    Raises:
        ValueError: no ``value`` column, no topic at all, an unknown column or a column
            of another type.
    """
    for name, kind in columns.items():
        allowed = SINK_COLUMNS.get(name)
        if allowed is None:
            raise ValueError(
                f"column {name!r} is not one of the Kafka sink's columns "
                f"({', '.join(SINK_COLUMNS)}); select only those"
            )
        if kind not in allowed:
            raise ValueError(f"column {name!r} must be {' or '.join(allowed)}, not {kind}")
    if "value" not in columns:
        raise ValueError("a write needs a 'value' column (binary or string)")
    if topic_option is None and "topic" not in columns:
        raise ValueError("a write needs a 'topic' column or the option 'topic'")


@dataclass(frozen=True, slots=True)
class ObjectsWritten:
    """A task's uploaded (not yet committed) segment objects: its commit message's body.

    ``objects``: (object key, size, chunks) per object, in the order written;
    ``topics``: the topics they hold (the job checks WRITE on each before committing).
    """

    objects: tuple[tuple[str, int, tuple[ChunkInfo, ...]], ...]
    records: int
    partition_id: int = -1
    attempt: int = -1
    topics: frozenset[str] = frozenset()


def _as_bytes(values: list[Any]) -> list[bytes | None]:
    return [v.encode() if isinstance(v, str) else v for v in values]


def _headers(value: Any) -> Headers:
    if not value:
        return ()
    return tuple((h["key"], h["value"]) for h in value)


@dataclass
class TaskWriter:
    """One write task: Arrow batches in, uploaded segment objects out.

    Args:
        writer: PUTs objects (``LogWriter.upload``: fresh random key, if-none-match).
        topic_info: looks a topic up by name (cached here per topic).
        topic: the ``topic`` option, overriding the ``topic`` column.
        compression: batch compression of the segment objects.
        max_bytes: a new object is started once the current one holds this many bytes.
        before_put: called with each new object key before its PUT (``WriteLease.register``).
    """

    writer: LogWriter
    topic_info: Callable[[str], TopicInfo]
    topic: str | None
    compression: str
    max_bytes: int
    before_put: Callable[[str], object] | None = None
    _builder: SegmentBuilder | None = None
    _uploaded: list[UploadedSegment] = field(default_factory=list)
    _topics: dict[str, TopicInfo] = field(default_factory=dict)
    _sticky: dict[str, int] = field(default_factory=dict)
    _random: random.Random = field(default_factory=random.Random)
    records: int = 0

    def _info(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            info = self._topics[name] = self.topic_info(name)
        return info

    def _keyless_partition(self, info: TopicInfo) -> int:
        cursor = self._sticky.get(info.name)
        cursor = self._random.randrange(1 << 31) if cursor is None else cursor + 1
        self._sticky[info.name] = cursor
        return cursor % info.partitions

    def add(self, batch: pa.RecordBatch) -> None:
        """Append one batch's rows (uploading the current object when it is full).

        Raises:
            ValueError: a null topic, an unknown topic, a partition out of range.
            RecordTooLargeError: a row over its topic's max.message.bytes (or
                lakelog.max.decompressed.bytes, when lower), as REST produce refuses it.
        """
        n = batch.num_rows
        if not n:
            return
        names = batch.schema.names

        def column(name: str) -> list[Any]:
            return batch.column(names.index(name)).to_pylist() if name in names else [None] * n

        values = _as_bytes(column("value"))
        keys = _as_bytes(column("key"))
        topics = [self.topic] * n if self.topic is not None else column("topic")
        parts = column("partition")
        headers = [_headers(h) for h in column("headers")]
        now = int(time.time() * 1000)
        grouped: dict[tuple[str, int], list[Record]] = {}
        keyless: dict[str, int] = {}
        for i in range(n):
            name = topics[i]
            if name is None:
                raise ValueError("a row's topic is null: set the 'topic' column or option")
            info = self._info(name)
            p, key = parts[i], keys[i]
            if p is not None:
                if not 0 <= p < info.partitions:
                    raise ValueError(
                        f"partition {p} of topic {name!r} does not exist "
                        f"({info.partitions} partitions)"
                    )
            elif key is not None:
                p = partition_for_key(key, info.partitions)
            else:
                p = keyless.get(name)
                if p is None:
                    p = keyless[name] = self._keyless_partition(info)
            record = Record(key, values[i], now, headers[i])
            check_record_size(record, *record_limit(info))
            check_record_key(record, info, p)  # a compacted topic takes keyed ones only
            grouped.setdefault((name, p), []).append(record)
        if self._builder is None:
            self._builder = SegmentBuilder(compression=self.compression)
        for (name, p), records in grouped.items():
            info = self._info(name)
            self._builder.append(info.topic_id, p, records, log_append_time=log_append_time(info))
        self.records += n
        if self._builder.estimated_size >= self.max_bytes:
            self._upload()

    def _upload(self) -> None:
        if self._builder is not None and self._builder.record_count:
            up = self.writer.upload(self._builder, before_put=self.before_put)
            # Without the bytes: the job commit needs the key and the chunks only.
            self._uploaded.append(UploadedSegment(up.object_key, up.size, up.chunks))
            log.info("uploaded %s (%d bytes)", up.object_key, up.size)
        self._builder = None

    def finish(self, partition_id: int = -1, attempt: int = -1) -> ObjectsWritten:
        """Upload what is left; the objects for the job commit (nothing committed here)."""
        self._upload()
        return ObjectsWritten(
            tuple((u.object_key, u.size, tuple(u.chunks)) for u in self._uploaded),
            self.records,
            partition_id,
            attempt,
            frozenset(self._topics),
        )


def commit_objects(
    store: ObjectStore, coordinator: Coordinator, tasks: Iterable[ObjectsWritten | None]
) -> list[WriteResult]:
    """The job commit: every task's objects to the coordinator, in task order.

    A repeated commit of an object key answers the offsets it already has, so running
    this again after a failure part way commits each object once.
    """
    writer = LogWriter(store, coordinator)
    results = []
    for task in sorted((t for t in tasks if t is not None), key=lambda t: t.partition_id):
        for key, size, chunks in task.objects:
            results.append(writer.commit(UploadedSegment(key, size, list(chunks))))
    return results


def delete_objects(
    store: ObjectStore, coordinator: Coordinator, tasks: Sequence[ObjectsWritten | None]
) -> int:
    """Best effort after a failed job: delete the objects its finished tasks uploaded
    that no commit references. A commit that failed part way (an object committed before
    the failure, or on some shards of a sharded coordinator) leaves objects the index
    refers to: those stay. If the coordinator cannot say which are committed, nothing is
    deleted (garbage collection finds the unreferenced ones as orphans later).

    Tasks that failed part way may have uploaded objects nobody reports: garbage
    collection finds those as orphans.
    """
    keys = [key for task in tasks if task is not None for key, _size, _chunks in task.objects]
    try:
        committed = coordinator.committed_object_keys(keys) if keys else set()
    except Exception:
        log.warning("abort: cannot tell committed objects; garbage collection will", exc_info=True)
        return 0
    deleted = 0
    for key in keys:
        if key not in committed:
            try:
                store.delete(key)
                deleted += 1
            except Exception:
                log.warning("could not delete %s; garbage collection will", key, exc_info=True)
    return deleted
