"""Writing Kafka-sink rows as segment objects: what a Spark write task and the job commit do.

A task turns its rows (the Kafka sink's columns: ``key``, ``value``, ``topic`` or the
``topic`` option, optional ``partition`` and ``headers``) into segment objects of at
most about ``maxBytesPerObject`` (one per task unless it writes more than that; an
Arrow batch larger than that spans objects), PUTs them under fresh random keys and
returns their chunk lists. Nothing is visible yet. Rows are checked, placed and encoded
as whole Arrow columns (``segments.arrow_records``): no Python per row.

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

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.client import Coordinator, TopicInfo
from coordinator.log.producers import RequestKey
from coordinator.log.topic_configs import (
    BATCH_OVERHEAD,
    compacted,
    keyless_refused,
    log_append_time,
    record_limit,
    record_too_large,
)
from index.log import LogWriter, UploadedSegment, WriteResult, chunk_commits, retry
from segments.arrow_records import (
    HeaderBlobs,
    arange,
    as_large_binary,
    batch_bytes,
    byte_count,
    cut_batches,
    encode_records,
    header_blobs,
    partitions_for_keys,
    record_offsets,
    record_sizes_estimate,
)
from segments.errors import ProducerConflictError
from segments.segment import COMPRESSIONS, SegmentBuilder
from segments.store import ObjectStore
from segments.types import ChunkInfo

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
#: The largest Kafka batch a task makes (before compression): SegmentBuilder's default.
MAX_BATCH_BYTES = 1 << 20


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


@dataclass(frozen=True, slots=True)
class _Rows:
    """One topic's rows of an Arrow batch, checked and placed (``partitions``: int64)."""

    info: TopicInfo
    keys: pa.Array
    values: pa.Array
    headers: HeaderBlobs
    partitions: pa.Array


@dataclass
class TaskWriter:
    """One write task: Arrow batches in, uploaded segment objects out.

    Each Arrow batch is encoded column-wise (``segments.arrow_records``): its rows are
    checked and placed as whole columns, sorted by partition, cut into Kafka batches of
    at most ``max_batch_bytes`` and encoded with no Python per row; the batches go into
    the current segment object, which is uploaded once it holds ``max_bytes``, so an
    Arrow batch larger than that spans several objects.

    Args:
        writer: PUTs objects (``LogWriter.upload``: fresh random key, if-none-match).
        topic_info: looks a topic up by name (cached here per topic).
        topic: the ``topic`` option, overriding the ``topic`` column.
        compression: batch compression of the segment objects.
        max_bytes: a new object is started once the current one holds this many bytes.
        before_put: called with each new object key before its PUT (``WriteLease.register``).
        max_batch_bytes: the largest Kafka batch (before compression) made, but for a
            record larger than that, which gets a batch of its own.
    """

    writer: LogWriter
    topic_info: Callable[[str], TopicInfo]
    topic: str | None
    compression: str
    max_bytes: int
    before_put: Callable[[str], object] | None = None
    max_batch_bytes: int = MAX_BATCH_BYTES
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
        """Append one batch's rows (uploading the current object whenever it is full).

        Every row is checked before any is encoded: a refused batch adds nothing.

        Raises:
            ValueError: a null topic, an unknown topic, a partition out of range.
            RecordTooLargeError: a row over its topic's max.message.bytes (or
                lakelog.max.decompressed.bytes, when lower), as REST produce refuses it.
            InvalidRecordError: a row without a key for a compacted topic.
            TypeError: a header without a key.
        """
        n = batch.num_rows
        if not n:
            return
        names = batch.schema.names

        def column(name: str) -> pa.Array | None:
            return batch.column(names.index(name)) if name in names else None

        value_column = column("value")
        values = as_large_binary(pa.nulls(n) if value_column is None else value_column)
        key_column = column("key")
        keys = pa.nulls(n, pa.large_binary()) if key_column is None else as_large_binary(key_column)
        parts = column("partition")
        headers = header_blobs(column("headers"), n)
        groups: list[tuple[str, pa.Array | None]]
        if self.topic is not None:
            groups = [(self.topic, None)]
        else:
            topics = column("topic")
            if topics is None or topics.null_count:
                raise ValueError("a row's topic is null: set the 'topic' column or option")
            distinct = pc.unique(topics).to_pylist()
            groups = (
                [(distinct[0], None)]
                if len(distinct) == 1
                else [(name, pc.equal(topics, name)) for name in distinct]
            )
        checked = []
        for name, mask in groups:
            if mask is None:
                checked.append(self._check(self._info(name), keys, values, parts, headers))
                continue

            def only(array: pa.Array, mask: pa.Array = mask) -> pa.Array:
                return pc.filter(array, mask)

            checked.append(
                self._check(
                    self._info(name),
                    only(keys),
                    only(values),
                    None if parts is None else only(parts),
                    headers.map(only),
                )
            )
        for rows in checked:
            self._append(rows, int(time.time() * 1000))
        self.records += n

    def _check(
        self,
        info: TopicInfo,
        keys: pa.Array,
        values: pa.Array,
        parts: pa.Array | None,
        headers: HeaderBlobs,
    ) -> _Rows:
        """Place one topic's rows (explicit partition, else murmur2 of the key, else the
        batch's sticky partition) and refuse what REST produce refuses."""
        n, count = len(keys), info.partitions
        placed = pa.nulls(n, pa.int64())
        if parts is not None and parts.null_count < n:
            placed = pc.cast(parts, pa.int64())
            bad = pc.fill_null(pc.or_(pc.less(placed, 0), pc.greater_equal(placed, count)), False)
            if pc.any(bad).as_py():
                p = placed[pc.index(bad, True).as_py()].as_py()
                raise ValueError(
                    f"partition {p} of topic {info.name!r} does not exist ({count} partitions)"
                )
        if placed.null_count and keys.null_count < n:
            placed = pc.coalesce(placed, partitions_for_keys(keys, count))
        if placed.null_count:
            placed = pc.fill_null(placed, self._keyless_partition(info))
        limit, config = record_limit(info)
        # As check_record_size counts a record (less BATCH_OVERHEAD).
        sizes = pc.add(pc.add(byte_count(keys), byte_count(values)), headers.sizes)
        too_large = pc.greater(sizes, limit - BATCH_OVERHEAD)
        if pc.any(too_large).as_py():
            at = pc.index(too_large, True).as_py()
            size = BATCH_OVERHEAD + sizes[at].as_py()
            raise record_too_large(size, limit, config)
        if keys.null_count and compacted(info):
            at = pc.index(pc.is_null(keys), True).as_py()
            raise keyless_refused(info, placed[at].as_py())
        return _Rows(info, keys, values, headers, placed)

    def _append(self, rows: _Rows, now: int) -> None:
        """Encode one topic's checked rows into Kafka batches, partition by partition."""
        keys, values, headers, placed = rows.keys, rows.values, rows.headers, rows.partitions
        low, high = pc.min_max(placed).values()
        if low.as_py() == high.as_py():
            run_ends, run_partitions = [len(placed)], [low.as_py()]
        else:  # stable: each partition's rows keep their order
            order = pc.sort_indices(placed)
            keys, values, placed = (
                pc.take(keys, order),
                pc.take(values, order),
                pc.take(placed, order),
            )
            headers = headers.map(lambda a: pc.take(a, order))
            runs = pc.run_end_encode(placed)
            run_ends = runs.run_ends.to_pylist()
            run_partitions = runs.values.to_pylist()
        estimates = pc.cumulative_sum(record_sizes_estimate(keys, values, headers)).to_pylist()
        cuts = list(cut_batches(run_ends, estimates, self.max_batch_bytes))
        n = len(placed)
        if len(cuts) == 1:
            deltas = arange(n)
        else:
            bounds = pa.array([s for s, _ in cuts] + [n], pa.int32())
            parent = pc.list_parent_indices(pa.ListArray.from_arrays(bounds, pa.nulls(n)))
            starts = pc.take(bounds, parent).cast(pa.int64())
            deltas = pc.subtract(arange(n), starts)
        encoded = encode_records(keys, values, headers, deltas)
        offsets = record_offsets(encoded)
        data = memoryview(encoded.buffers()[2]) if n else memoryview(b"")
        codec = COMPRESSIONS.index(self.compression)
        topic_id, append_time = rows.info.topic_id, log_append_time(rows.info)
        run = 0
        for start, end in cuts:
            while end > run_ends[run]:
                run += 1
            if self._builder is None:
                self._builder = SegmentBuilder(compression=self.compression)
            self._builder.append_batch(
                topic_id,
                run_partitions[run],
                memoryview(
                    batch_bytes(data[offsets[start] : offsets[end]], end - start, now, codec)
                ),
                end - start,
                now,
                now,
                log_append_time=append_time,
            )
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
    store: ObjectStore,
    coordinator: Coordinator,
    tasks: Iterable[ObjectsWritten | None],
    batch_key: str | None = None,
) -> list[WriteResult]:
    """The job commit: every task's objects to the coordinator, in task order.

    A repeated commit of an object key answers the offsets it already has, so running
    this again after a failure part way commits each object once.

    ``batch_key``: a stream's micro-batch (its sink and batch id). Its objects are then
    committed in one transaction (``Coordinator.commit_atomic``) with the key stored
    beside their offsets (as a REST idempotency key is). A micro-batch that Spark runs
    again after a crash (it committed here, Spark did not record it) finds its key
    stored: its new objects are not committed (and are deleted), its records are there
    once. Exactly once whatever rows each task of the rerun holds; keys are kept
    ``SINK_KEY_TTL_S``.
    """
    ordered = sorted((t for t in tasks if t is not None), key=lambda t: t.partition_id)
    if batch_key is None:
        writer = LogWriter(store, coordinator)
        return [
            writer.commit(UploadedSegment(key, size, list(chunks)))
            for task in ordered
            for key, size, chunks in task.objects
        ]
    objects = [obj for task in ordered for obj in task.objects]
    if not objects:
        return []
    commits = []
    for n, (key, size, chunks) in enumerate(objects):
        uploaded = UploadedSegment(key, size, list(chunks))
        if n == 0:  # the batch's key, on one chunk: stored with the whole commit
            uploaded.request_keys.update(_sink_key(batch_key, chunks[0]))
        commits.append((key, chunk_commits(uploaded)))
    try:
        bases = retry(lambda: coordinator.commit_atomic(commits), give_up=(ProducerConflictError,))
    except ProducerConflictError:
        first = objects[0][2][0]
        now_ms = int(time.time() * 1000)
        if coordinator.request_key(first.topic_id, batch_key, now_ms) is None:
            raise
        log.info("%s was committed by an earlier run: its rerun is not", batch_key)
        for key, _, _ in objects:
            _delete_quietly(store, key)
        return []
    return [
        WriteResult(key, size, list(chunks), offsets)
        for (key, size, chunks), offsets in zip(objects, bases, strict=True)
    ]


#: How long a stream's micro-batch keys are kept: a query restarted later than this with
#: a micro-batch Spark did not record may write that batch twice.
SINK_KEY_TTL_S = 7 * 24 * 3600


def _sink_key(name: str, chunk: ChunkInfo) -> dict[tuple[bytes, int], list[RequestKey]]:
    now_ms = int(time.time() * 1000)
    expires = now_ms + SINK_KEY_TTL_S * 1000
    key = RequestKey(name, name, 0, chunk.record_count, now_ms, expires)
    return {(chunk.topic_id, chunk.partition): [key]}


def _delete_quietly(store: ObjectStore, key: str) -> None:
    try:
        store.delete(key)
    except Exception:  # an orphan then: garbage collection deletes it later
        log.warning("could not delete %s", key, exc_info=True)


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
