"""The storage API: write records as one segment object, read them back by offset or time.

``LogWriter`` is the write path of DESIGN.md steps 3-4 (build one segment object,
PUT it, commit its chunks); ``LogReader`` is the read path (coordinator lookup,
ranged GET, decode, never past the high watermark). Both are synchronous and
thread-safe; the agent calls them from worker threads.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple, TypeVar, cast

from ulid import ULID

from coordinator.client import (
    ChunkCommit,
    ChunkRef,
    Coordinator,
    PartitionOffsets,
    PendingMarkers,
    TransactionCoordinator,
    TxnMarker,
)
from coordinator.log.producers import ProducerBatch, RequestKey
from index.walk import seek_timestamp, walk
from segments.batches import control_batch
from segments.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from segments.errors import (
    CoordinatorUnavailableError,
    CorruptSegmentError,
    LakelogError,
    ObjectDeletedError,
    ObjectNotFoundError,
    PartialCommitError,
    PreconditionFailedError,
    ProducerConflictError,
    TopicNotFoundError,
)
from segments.segment import SegmentBuilder, drop_aborted, iter_chunk, iter_chunk_batches
from segments.store import ObjectStore
from segments.tier import TierReader
from segments.types import ChunkInfo, ConsumedRecord

log = logging.getLogger(__name__)

T = TypeVar("T")

SEGMENT_PREFIX = "segments/"


def new_object_key() -> str:
    """``segments/<random prefix>/<ULID>.seg``: the prefix spreads keys over S3 partitions."""
    return f"{SEGMENT_PREFIX}{secrets.token_hex(2)}/{ULID()}.seg"


def retry(
    call: Callable[[], T],
    attempts: int = 5,
    first_delay: float = 0.05,
    give_up: tuple[type[LakelogError], ...] = (),
) -> T:
    """Run ``call``, retrying errors marked retriable with exponential backoff.

    ``give_up``: retriable errors that sending the same call again cannot cure (the
    client's request may succeed again, this call will not).
    """
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except LakelogError as e:
            if not e.retriable or attempt == attempts or isinstance(e, give_up):
                raise
            log.warning("retriable failure (attempt %d/%d): %s", attempt, attempts, e)
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class WriteResult:
    """One flushed and committed segment object: its chunks and their base offsets."""

    object_key: str
    size: int
    chunks: list[ChunkInfo]
    base_offsets: list[int]
    #: The time stamped on the batches of LogAppendTime topics (ms; -1 unknown).
    append_time_ms: int = -1


@dataclass(frozen=True, slots=True)
class UploadedSegment:
    """A segment object that is in the store but not committed (not visible) yet."""

    object_key: str
    size: int
    chunks: list[ChunkInfo]
    #: The object's bytes, handed to ``LogWriter.listeners`` after the commit.
    data: bytes = b""
    #: Idempotent producers' batches per chunk (SegmentBuilder.producer_batches).
    producer_batches: dict[tuple[bytes, int], list[ProducerBatch]] = field(default_factory=dict)
    #: REST idempotency keys per chunk, stored by the commit (set by the batcher).
    request_keys: dict[tuple[bytes, int], list[RequestKey]] = field(default_factory=dict)
    #: Chunks that are one transaction marker each (``LogWriter.write_markers``).
    markers: dict[tuple[bytes, int], TxnMarker] = field(default_factory=dict)
    #: The time stamped on the batches of LogAppendTime topics (ms; -1 unknown).
    append_time_ms: int = -1


#: Called after every committed write with the result and the object's bytes.
WriteListener = Callable[[WriteResult, bytes], None]


def chunk_commits(uploaded: UploadedSegment) -> list[ChunkCommit]:
    """What the coordinator's commit is told of an uploaded object's chunks."""
    return [
        ChunkCommit(
            topic_id=c.topic_id,
            partition=c.partition,
            position=c.position,
            length=c.length,
            record_count=c.record_count,
            min_timestamp_ms=c.min_timestamp_ms,
            max_timestamp_ms=c.max_timestamp_ms,
            producer_batches=tuple(uploaded.producer_batches.get((c.topic_id, c.partition), ())),
            request_keys=tuple(uploaded.request_keys.get((c.topic_id, c.partition), ())),
            marker=uploaded.markers.get((c.topic_id, c.partition)),
        )
        for c in uploaded.chunks
    ]


class LogWriter:
    """Flush a SegmentBuilder as one object, then commit it (never the other way round).

    ``listeners`` run in the writing thread after the commit: the agent's read
    cache keeps the bytes (write-through) and tailing readers are woken.
    """

    def __init__(self, store: ObjectStore, coordinator: Coordinator) -> None:
        self.store = store
        self.coordinator = coordinator
        self.listeners: list[WriteListener] = []

    def write(self, builder: SegmentBuilder) -> WriteResult:
        """PUT the built object, then commit its chunks; returns their base offsets.

        Raises whatever the store or coordinator raise after retries. If the PUT
        succeeds and the commit fails, the object is an orphan: nothing in it is
        visible, and garbage collection removes it later (invariant 3).
        """
        return self.commit(self.upload(builder))

    def upload(
        self, builder: SegmentBuilder, *, before_put: Callable[[str], object] | None = None
    ) -> UploadedSegment:
        """Step 1 of ``write``: build and PUT the object (nothing visible yet).

        Args:
            before_put: called with the new key before the PUT (a Spark task registers
                it as pending under its job's write lease: ``Coordinator.keep_pending``).
        """
        # The append time of LogAppendTime topics: this writer's clock at the flush.
        append_time_ms = time.time_ns() // 1_000_000
        data, chunks = builder.build(append_time_ms=append_time_ms)
        key = new_object_key()
        if before_put is not None:
            retry(lambda: before_put(key))
        retry(lambda: self._put_new(key, data))
        producers = {
            tp: [ProducerBatch(*b) for b in batches]
            for tp, batches in builder.producer_batches().items()
        }
        return UploadedSegment(
            key, len(data), chunks, data, producers, append_time_ms=append_time_ms
        )

    def _put_new(self, key: str, data: bytes) -> None:
        """PUT a fresh key; a 412 whose object holds exactly ``data`` is our own earlier try.

        When a PUT lands but its answer is lost (reset, 5xx after the write), the SDK's
        retry of the conditional PUT meets the object it just wrote. The key is new and
        random, so nobody else wrote it: same bytes means the write succeeded.
        """
        try:
            self.store.put(key, data, if_none_match=True)
        except PreconditionFailedError:
            if self.store.get(key) != data:
                raise
            log.info("%s: PUT answer was lost, but the object holds our bytes", key)

    def commit(self, uploaded: UploadedSegment) -> WriteResult:
        """Step 2 of ``write``: commit an uploaded object's chunks; returns base offsets."""
        commits = chunk_commits(uploaded)
        # Safe to retry: the coordinator answers a repeated object key with the same offsets.
        try:
            offsets = retry(
                lambda: self.coordinator.commit(uploaded.object_key, commits),
                # Partly committed (sharded metadata): the batcher answers the requests
                # whose partitions committed now rather than holding them all back.
                give_up=(ProducerConflictError, PartialCommitError),
            )
        except ObjectDeletedError:
            # Our commit came after garbage collection took the object (a commit retried
            # through a long coordinator outage): nothing was committed. With the bytes
            # at hand, PUT them again under a new key and commit that instead.
            if not uploaded.data:
                raise
            log.warning("%s was collected before its commit: uploading again", uploaded.object_key)
            key = new_object_key()
            retry(lambda: self._put_new(key, uploaded.data))
            return self.commit(replace(uploaded, object_key=key))
        except PartialCommitError as e:
            # What did commit is readable now: the cache and waiting fetches hear of it.
            done = [
                (c, base)
                for c, base in zip(uploaded.chunks, e.base_offsets, strict=False)
                if base is not None
            ]
            self._tell(
                WriteResult(
                    uploaded.object_key,
                    uploaded.size,
                    [c for c, _ in done],
                    [base for _, base in done],
                    uploaded.append_time_ms,
                ),
                uploaded.data,
            )
            raise
        result = WriteResult(
            uploaded.object_key, uploaded.size, uploaded.chunks, offsets, uploaded.append_time_ms
        )
        self._tell(result, uploaded.data)
        return result

    def write_markers(self, pending: PendingMarkers) -> None:
        """End a decided transaction: one object holding a marker (a control batch) for
        each of its partitions, PUT and committed like data (each marker's commit closes
        its partition's open transaction, in the transaction that gives it its offset),
        then the transaction completed. Safe to repeat, by any agent: a marker for a
        partition closed already changes no state.

        Partitions of topics deleted meanwhile get no marker (their open rows went with
        them).

        Raises:
            CoordinatorUnavailableError: a partition stayed open (try again later), or
                what the store and coordinator raise after retries.
        """
        txns = cast(TransactionCoordinator, self.coordinator)  # both clients serve both
        partitions = list(pending.partitions)
        while partitions:
            now_ms = time.time_ns() // 1_000_000
            batch = control_batch(pending.producer_id, pending.epoch, pending.commit, now_ms)
            builder = SegmentBuilder()
            for topic_id, partition in partitions:
                builder.append_batch(topic_id, partition, batch, 1, now_ms, now_ms)
            uploaded = self.upload(builder)
            marker = pending.marker()
            try:
                self.commit(replace(uploaded, markers=dict.fromkeys(partitions, marker)))
                break
            except TopicNotFoundError:
                left = [tp for tp in partitions if self._topic_exists(tp[0])]
                if left == partitions:
                    raise
                partitions = left
        if not retry(
            lambda: txns.complete_transaction(
                pending.transactional_id, pending.producer_id, pending.epoch
            )
        ):
            raise CoordinatorUnavailableError(
                f"The markers of '{pending.transactional_id}' are committed but a partition "
                "is still open: try again."
            )

    def _topic_exists(self, topic_id: bytes) -> bool:
        try:
            retry(lambda: self.coordinator.get_topic_by_id(topic_id))
        except TopicNotFoundError:
            return False
        return True

    def _tell(self, result: WriteResult, data: bytes) -> None:
        """Hand a commit to the listeners (read cache, fetch wake-ups)."""
        for listener in self.listeners:
            try:
                listener(result, data)
            except Exception:
                # The write is committed and acked whatever a cache or wake-up does.
                log.exception("write listener %r failed", listener)


def decode_entry(
    ref: ChunkRef,
    data: bytes,
    topic: str,
    partition: int,
    from_offset: int,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    aborted: Sequence[tuple[int, int, int]] = (),
) -> Iterator[ConsumedRecord]:
    """The records of one index entry's bytes at offsets >= ``from_offset``, in order.

    ``aborted``: aborted transactions (producer id, first offset, marker offset) whose
    records a read_committed reader leaves out (a tier object holds none of them).

    A ``"segment"`` entry is a chunk of RecordBatches, decoded one batch at a time (a
    reader that stops early inflates no further batch), none inflated past
    ``max_decompressed_bytes`` (the topic's ``lakelog.max.decompressed.bytes``); a
    ``"parquet"`` entry is a whole tier object, decoded one row group at a time (only the
    groups from ``from_offset`` on), holding only records inside the entry's offset span.

    Raises:
        BatchTooLargeError: a batch over ``max_decompressed_bytes``.
        CorruptSegmentError: undecodable bytes, or an unknown entry kind.
    """
    if ref.kind == "segment":
        # The index counts offsets: a transaction marker takes one and gives no record.
        inside = [a for a in aborted if a[1] < ref.end_offset and a[2] >= ref.base_offset]
        records = (
            drop_aborted(
                iter_chunk_batches(data, ref.base_offset, max_decompressed_bytes, ref.record_count),
                inside,
            )
            if inside
            else iter_chunk(
                data, ref.base_offset, max_decompressed_bytes, ref.record_count, from_offset
            )
        )
        for off, rec in records:
            if off >= from_offset:
                yield ConsumedRecord(
                    topic,
                    partition,
                    off,
                    rec.key,
                    rec.value,
                    rec.timestamp_ms,
                    rec.headers,
                    rec.timestamp_type,
                )
        return
    if ref.kind != "parquet":
        raise CorruptSegmentError(f"{ref.object_key}: unknown index entry kind {ref.kind!r}")
    reader = TierReader(data)
    if reader.partition != partition or reader.first_offset < ref.base_offset:
        raise CorruptSegmentError(
            f"{ref.object_key}: tier object of partition {reader.partition} at "
            f"{reader.first_offset}, index entry says {partition} at {ref.base_offset}"
        )
    for group in reader.row_groups:
        if group.last_offset < from_offset:
            continue
        if group.first_offset >= ref.end_offset:
            return
        start = max(from_offset, group.first_offset)
        # At most this many records from `start` to the group's end; fewer if compaction
        # left gaps, in which case the reader goes on into the next group: cut there.
        for row in reader.records(start, max_records=group.last_offset - start + 1):
            if row.offset > group.last_offset:
                break
            if row.offset >= ref.end_offset:
                return
            yield ConsumedRecord(
                topic,
                partition,
                row.offset,
                row.key,
                row.value,
                row.timestamp_ms,
                row.headers,
                row.timestamp_type,
            )


class PartitionWant(NamedTuple):
    """A read about to start (``LogReader.prefetch_partitions``): a partition from
    ``offset`` within ``bounds`` (its offsets as the reader read them), at most ``budget``
    bytes of it."""

    topic: str
    partition: int
    offset: int
    bounds: PartitionOffsets
    budget: int


def _default_limit(topic: str) -> int:
    return DEFAULT_MAX_DECOMPRESSED_BYTES


class LogReader:
    """Read committed records of one partition from the object store.

    Index entries are segment chunks or tier objects (``decode_entry``). Records
    below the partition's log-start are never returned, even from an entry that
    straddles it, nor records at or past the high watermark the read started from
    (a reader reports that one). An entry whose object is gone (tiering, compaction or
    retention replaced it and GC deleted it) is looked up again once. Every lookup
    names the topic's id: a topic deleted and created again under the same name is
    another log, and a read that started on the old one ends with TopicNotFoundError.

    Subclasses cache (``service.read_cache.CachingLogReader``) by overriding
    ``fetch_chunk``, ``lookup``, ``forget`` and ``prefetch``.
    """

    def __init__(self, store: ObjectStore, coordinator: Coordinator) -> None:
        self.store = store
        self.coordinator = coordinator
        #: A topic's ``lakelog.max.decompressed.bytes`` (the agent sets its topic cache's).
        self.decompressed_limit: Callable[[str], int] = _default_limit

    def fetch_chunk(self, ref: ChunkRef) -> bytes:
        """The bytes of one index entry (a ranged GET). Subclasses add caching."""
        data = self.store.get_range(ref.object_key, ref.position, ref.length)
        if len(data) != ref.length:
            raise CorruptSegmentError(
                f"{ref.object_key}: chunk at {ref.position} is {len(data)} bytes, "
                f"index says {ref.length}"
            )
        return data

    def lookup(self, topic: str, partition: int, offset: int, topic_id: bytes) -> list[ChunkRef]:
        """Index entries from the one holding ``offset`` on, of topic id ``topic_id`` (b"":
        whichever topic the name names). Subclasses cache them."""
        return self.coordinator.lookup(topic, partition, offset, topic_id=topic_id or None)

    def forget(self, topic_id: bytes, partition: int) -> None:
        """Drop what is cached of a partition's index (an entry's object was gone)."""

    def prefetch(self, refs: list[ChunkRef], budget: int) -> None:
        """Start fetching ``refs`` (at most ``budget`` bytes) ahead of the reader; the
        base reader reads nothing ahead."""

    def prefetch_partitions(self, wants: Sequence[PartitionWant], max_bytes: int) -> None:
        """Fetch, before reading them one by one, what the reads of several partitions
        will use first (at most ``max_bytes``), in as few GETs as will do (one run of
        nearby chunks of one object per GET); the base reader keeps nothing, so reads
        nothing ahead."""

    def entries(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        bounds: PartitionOffsets | None = None,
        read_ahead_bytes: int = 0,
    ) -> Iterator[tuple[ChunkRef, bytes, int]]:
        """The index entries from ``offset`` on, up to the high watermark, with their bytes.

        Yields (entry, its bytes, first offset wanted from it), lazily: the offset is
        never below log-start, even in an entry that straddles it, and no entry reaches
        past the high watermark (a tier object that does is cut there). ``bounds``: the
        partition's offsets as the caller read them (read here when None): the read ends
        at that high watermark and reads that topic id only. Callers decode (REST,
        ``records``) or pass batches on (Kafka Fetch). ``read_ahead_bytes``: how many
        bytes of the following entries may be fetched in parallel ahead of the one
        being used (0: none).

        Raises:
            TopicNotFoundError: the topic was deleted (or deleted and created again).
            IndexHoleError: the index does not hold an offset below the high watermark.
        """
        if bounds is None:
            bounds = self.coordinator.offsets(topic, partition)
        end, topic_id = bounds.high_watermark, bounds.topic_id

        def page(at: int) -> list[ChunkRef]:
            refs = self.lookup(topic, partition, at, topic_id)
            if refs:
                self.prefetch(refs[1:], read_ahead_bytes - refs[0].length)
            return refs

        where = f"partition {partition} of topic '{topic}'"
        at = max(offset, bounds.log_start)
        retried = False
        while True:
            for ref, lo, hi in walk(page, at, end, follow_log_start=True, where=where):
                if ref.end_offset > hi and ref.kind == "parquet":
                    # Tiered past our high watermark: the rows after it are not ours to serve.
                    ref = replace(ref, record_count=hi - ref.base_offset)
                try:
                    data = self.fetch_chunk(ref)
                except ObjectNotFoundError:
                    # The entry was swapped or dropped after our lookup: ask again, once.
                    if retried:
                        raise
                    retried = True
                    self.forget(topic_id, partition)
                    break
                retried = False
                yield ref, data, lo
                at = hi
            else:
                return

    def records(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        bounds: PartitionOffsets | None = None,
        read_ahead_bytes: int = 0,
        aborted: Sequence[tuple[int, int, int]] = (),
    ) -> Iterator[ConsumedRecord]:
        """Committed records from ``offset`` on (from log-start if below it), up to the
        high watermark, lazily; see ``entries``.

        A read_committed reader passes ``bounds`` whose high watermark is the last stable
        offset (it may fall inside a chunk: no record from there on is given) and the
        aborted transactions whose records it leaves out (``decode_entry``).
        """
        if bounds is None:
            bounds = self.coordinator.offsets(topic, partition)
        end = bounds.high_watermark
        for ref, data, start in self.entries(
            topic, partition, offset, bounds=bounds, read_ahead_bytes=read_ahead_bytes
        ):
            for rec in decode_entry(
                ref, data, topic, partition, start, self.decompressed_limit(topic), aborted
            ):
                if rec.offset >= end:
                    return
                yield rec

    def read(
        self, topic: str, partition: int, offset: int, *, max_bytes: int = 1 << 20
    ) -> list[ConsumedRecord]:
        """Records from ``offset`` on (from log-start if below it), up to the high watermark.

        Stops once the key+value bytes returned reach ``max_bytes``, but always
        returns at least one record when one exists.
        """
        out: list[ConsumedRecord] = []
        size = 0
        for rec in self.records(topic, partition, offset, read_ahead_bytes=max_bytes):
            out.append(rec)
            size += len(rec.key or b"") + len(rec.value or b"")
            if size >= max_bytes:
                break
        return out

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The first offset at or after log-start whose record timestamp is >=
        ``timestamp_ms``, or None."""
        found = self.record_for_timestamp(topic, partition, timestamp_ms)
        return None if found is None else found.offset

    def record_for_timestamp(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> ConsumedRecord | None:
        """The first record at or after log-start whose timestamp is >= ``timestamp_ms``,
        or None (Kafka's ListOffsets by timestamp)."""

        def first_at(ref: ChunkRef, start: int) -> ConsumedRecord | None:
            records = decode_entry(
                ref, self.fetch_chunk(ref), topic, partition, start, self.decompressed_limit(topic)
            )
            return next((r for r in records if r.timestamp_ms >= timestamp_ms), None)

        return seek_timestamp(
            lambda start: self.coordinator.lookup_timestamp(topic, partition, timestamp_ms, start),
            first_at,
            self.coordinator.offsets(topic, partition).log_start,
        )
