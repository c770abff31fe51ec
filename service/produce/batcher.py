"""The write batcher: ONE buffer per agent for every topic-partition (DESIGN.md "Write path").

Requests append their records to the open ``SegmentBuilder`` and wait. The buffer is
flushed as ONE segment object when ``flush_bytes`` is reached or ``linger_ms`` has
passed since its first record; the LogWriter PUTs it and commits its chunks in a
worker thread (``upload`` then ``commit``, timed separately), and only then is every
request of that flush answered with its offsets (base offset of its partition's chunk
+ the record's index within that chunk).

Up to ``flushes_in_flight`` flushes (default 2) run at once: the next buffer's PUT
overlaps the previous one's PUT and commit, but each flush commits only once the one
before it has committed (or failed), so commit order = append order per partition.
While flushes are in flight the next buffer fills, so under load the flush size grows
to what arrives during one PUT + commit.

Memory is bounded: bytes buffered + bytes in flight never exceed ``max_buffer_bytes``.
An append that does not fit waits up to ``buffer_wait_ms`` and then raises
``BufferFullError`` (retriable); nothing queues without bound. A failed flush fails
exactly the requests whose records it held, with a retriable error unless the store or
coordinator said otherwise, or unless it was an unexpected exception (a bug: answered
with a non-retriable ``InternalError`` and logged with its traceback, so clients do not
retry it forever); no request is answered twice. A commit that refuses one request (its
idempotency key, producer sequence or transaction) fails that request alone: ``_split``
commits the others again, in append order, in new objects.

One request's records are buffered all or nothing (``SegmentBuilder.append_groups``
checks every record before encoding any): a request that fails never leaves some of
its records behind to be flushed unacknowledged.

The blocking PUT + commit runs on the pool given as ``offload`` (the agent's ``flush``
pool, so lagging readers cannot starve it; asyncio's default pool when not given).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from coordinator.log.producers import ProducerBatch, RequestKey
from index.log import LogWriter, UploadedSegment, WriteResult
from segments.errors import (
    BufferFullError,
    CoordinatorUnavailableError,
    InternalError,
    InvalidTxnStateError,
    LakelogError,
    MetadataError,
    PartialCommitError,
    ProducerConflictError,
    RecordTooLargeError,
    StorageUnavailableError,
)
from segments.segment import SegmentBuilder
from segments.types import Record
from service.metrics import Metrics

if TYPE_CHECKING:
    from service.settings import Settings

log = logging.getLogger(__name__)

#: An idempotent REST producer's records: (producer id, epoch, partition -> base sequence).
RestProducer = tuple[int, int, Mapping[int, int]]


class BaseOffsets(dict[tuple[bytes, int], int]):
    """Offsets of a flush: (topic id, partition) -> base offset of that chunk, and the
    append time stamped on LogAppendTime topics' batches."""

    append_time_ms: int = -1


class Offsets(list[int]):
    """A request's offsets, and the append time of the flush that committed them (ms):
    what LogAppendTime topics' records carry (Kafka's Produce ``log_append_time_ms``)."""

    append_time_ms: int = -1

    @classmethod
    def of(cls, offsets: Iterable[int], append_time_ms: int) -> Offsets:
        out = cls(offsets)
        out.append_time_ms = append_time_ms
        return out


#: Runs a blocking call off the event loop: ``await offload(fn, *args)``.
Offload = Callable[..., Awaitable[Any]]

# Per-record bytes the batch codec adds around key, value and headers (varint lengths,
# deltas, attributes): an estimate for memory accounting only.
RECORD_OVERHEAD = 16


def record_size(record: Record) -> int:
    """Bytes a record holds in memory: key, value, header names and values, overhead."""
    size = RECORD_OVERHEAD + len(record.key or b"") + len(record.value or b"")
    for name, value in record.headers:
        size += len(name) + len(value or b"")
    return size


@dataclass(frozen=True, slots=True)
class Grouped:
    """One request's records grouped per partition, as ``Batcher.append_grouped`` takes
    them: ``groups[p]`` the records of partition ``p`` in request order, ``partitions``
    each record's partition in request order, ``size`` the sum of their ``record_size``."""

    groups: dict[int, list[Record]]
    partitions: list[int]
    size: int


def group_records(records: Iterable[tuple[int, Record]]) -> Grouped:
    """``(partition, record)`` pairs as a ``Grouped``."""
    groups: dict[int, list[Record]] = {}
    parts: list[int] = []
    size = 0
    for partition, record in records:
        size += record_size(record)
        group = groups.get(partition)
        if group is None:
            group = groups[partition] = []
        group.append(record)
        parts.append(partition)
    return Grouped(groups, parts, size)


def _in_order(parts: list[int], firsts: dict[int, int]) -> list[int]:
    """Each record's offset given its partition (``parts``, in request order) and the
    offset of the first record of each partition's group."""
    following = dict(firsts)
    out: list[int] = []
    append = out.append
    for p in parts:
        offset = following[p]
        append(offset)
        following[p] = offset + 1
    return out


class PartlyCommittedError(CoordinatorUnavailableError):
    """Some partitions of a request committed and others did not (sharded metadata, a
    shard down): ``offsets[i]`` is item i's offset (a record for ``append``, a batch for
    ``append_batches``) where it committed, else None and ``errors[i]`` is why.
    Retriable as a whole; a client should resend only the failed items."""

    def __init__(
        self, message: str, offsets: list[int | None], errors: list[LakelogError | None]
    ) -> None:
        super().__init__(message)
        self.offsets = offsets
        self.errors = errors
        #: As ``Offsets.append_time_ms``, for the items that committed.
        self.append_time_ms = -1


class _PartlyDone(Exception):
    """A waiter's answer when its flush committed some of its partitions (internal)."""

    def __init__(self, done: BaseOffsets, failed: dict[tuple[bytes, int], LakelogError]) -> None:
        super().__init__("partly committed")
        self.done = done
        self.failed = failed

    def answer(self, keys: list[tuple[bytes, int]], offsets: list[int]) -> PartlyCommittedError:
        """The request's error: ``keys[i]`` is item i's partition, ``offsets[i]`` its
        offset relative to the partition's base in the flush."""
        out: list[int | None] = []
        errors: list[LakelogError | None] = []
        for key, relative in zip(keys, offsets, strict=True):
            base = self.done.get(key)
            out.append(None if base is None else base + relative)
            errors.append(self.failed[key] if base is None else None)
        first = next(e for e in errors if e is not None)
        error = PartlyCommittedError(
            f"Some partitions of the request were written, others not: {first.message}",
            out,
            errors,
        )
        error.append_time_ms = self.done.append_time_ms
        return error


@dataclass(eq=False)
class _Buffer:
    """One segment object being filled, and who waits for it."""

    builder: SegmentBuilder
    created: float = field(default_factory=time.monotonic)
    size: int = 0  # accounted bytes (record_size), not the encoded size
    records: int = 0
    counts: dict[tuple[bytes, int], int] = field(default_factory=dict)
    waiters: list[asyncio.Future[BaseOffsets]] = field(default_factory=list)
    #: The partitions each waiter's records went to (read only to answer a partly
    #: committed flush, so a generator: nothing is built on the hot path).
    keys_of: dict[asyncio.Future[BaseOffsets], Iterable[tuple[bytes, int]]] = field(
        default_factory=dict
    )
    #: REST idempotency keys of the requests buffered here, per chunk.
    request_keys: dict[tuple[bytes, int], list[RequestKey]] = field(default_factory=dict)
    #: REST records of idempotent producers (v3 records:batch), per chunk.
    producer_batches: dict[tuple[bytes, int], list[ProducerBatch]] = field(default_factory=dict)
    #: Each request as appended, in order: replayed into a new buffer without the
    #: requests the commit refused (``Batcher._split``).
    entries: list[_Entry] = field(default_factory=list)
    #: A replayed request's offsets differ from those it was first given: per waiter,
    #: (chunk -> new start - first start), added to the chunk's base offset.
    shifts: dict[asyncio.Future[BaseOffsets], dict[tuple[bytes, int], int]] = field(
        default_factory=dict
    )


@dataclass(eq=False, slots=True)
class _Entry:
    """One request in a buffer: its waiter, how to append it again, where it started."""

    future: asyncio.Future[BaseOffsets]
    #: Appends the request to a buffer; returns its first relative offset per chunk.
    place: Callable[[_Buffer], dict[tuple[bytes, int], int]]
    #: Its first relative offset per chunk in the buffer it was first appended to.
    starts: dict[tuple[bytes, int], int]
    #: It carries what a commit may refuse on its own (an idempotency key, producer
    #: sequences): a ProducerConflictError can only be its doing.
    refusable: bool


@dataclass(frozen=True, slots=True)
class RawBatch:
    """A producer's RecordBatch for one partition, checked (``segments.batches``)."""

    topic_id: bytes
    partition: int
    data: bytes | memoryview
    record_count: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    #: (producer id, epoch, base sequence) of an idempotent producer, checked at commit.
    producer: tuple[int, int, int] | None = None
    #: The topic has message.timestamp.type=LogAppendTime: stamped at the flush.
    log_append_time: bool = False
    #: Part of the producer's transaction: the commit checks the transaction added the
    #: partition (``ProducerBatch.transactional``).
    transactional: bool = False


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    """The Settings fields the batcher reads (so unit tests need no Settings)."""

    linger_ms: float = 50.0
    flush_bytes: int = 4 << 20
    max_buffer_bytes: int = 64 << 20
    buffer_wait_ms: float = 5000.0
    compression: str = "none"
    flushes_in_flight: int = 2

    @classmethod
    def from_settings(cls, settings: Settings) -> BatcherConfig:
        return cls(
            linger_ms=float(settings.linger_ms),
            flush_bytes=int(settings.flush_bytes),
            max_buffer_bytes=int(settings.max_buffer_bytes),
            buffer_wait_ms=float(settings.buffer_wait_ms),
            compression=str(settings.compression),
            flushes_in_flight=int(settings.flushes_in_flight),
        )


@dataclass(frozen=True, slots=True)
class _RecordsPlacement:
    """Appends one ``Batcher.append`` request's records to a buffer (synchronously)."""

    topic_id: bytes
    groups: Mapping[int, Sequence[Record]]
    request_key: RequestKey | None
    producer: RestProducer | None
    log_append_time: bool

    def __call__(self, buf: _Buffer) -> dict[tuple[bytes, int], int]:
        """Returns the first relative offset of the records in each chunk."""
        topic_id = self.topic_id
        starts = {p: buf.counts.get((topic_id, p), 0) for p in self.groups}
        buf.builder.append_groups(topic_id, self.groups, log_append_time=self.log_append_time)
        for partition, group in self.groups.items():
            buf.counts[(topic_id, partition)] = starts[partition] + len(group)
            if self.request_key is not None:
                part = replace(
                    self.request_key, relative_offset=starts[partition], record_count=len(group)
                )
                buf.request_keys.setdefault((topic_id, partition), []).append(part)
            if self.producer is not None:
                pid, epoch, sequences = self.producer
                batch = ProducerBatch(
                    pid, epoch, sequences[partition], len(group), starts[partition]
                )
                buf.producer_batches.setdefault((topic_id, partition), []).append(batch)
            buf.records += len(group)
        return {(topic_id, p): start for p, start in starts.items()}


@dataclass(frozen=True, slots=True)
class _BatchesPlacement:
    """Appends one ``Batcher.append_batches`` request's batches to a buffer."""

    batches: Sequence[RawBatch]

    def append(self, buf: _Buffer) -> list[tuple[tuple[bytes, int], int]]:
        """Returns each batch's chunk and relative offset."""
        placed: list[tuple[tuple[bytes, int], int]] = []
        for b in self.batches:
            key = (b.topic_id, b.partition)
            relative = buf.builder.append_batch(
                b.topic_id,
                b.partition,
                b.data,
                b.record_count,
                b.min_timestamp_ms,
                b.max_timestamp_ms,
                b.producer,
                log_append_time=b.log_append_time,
                transactional=b.transactional,
            )
            buf.counts[key] = buf.counts.get(key, 0) + b.record_count
            buf.records += b.record_count
            placed.append((key, relative))
        return placed

    def __call__(self, buf: _Buffer) -> dict[tuple[bytes, int], int]:
        first: dict[tuple[bytes, int], int] = {}
        for key, relative in self.append(buf):
            first.setdefault(key, relative)
        return first


class Batcher:
    """Buffers records of every topic-partition and flushes them as segment objects.

    Args:
        writer: PUTs and commits one SegmentBuilder (called from a worker thread).
        settings: ``linger_ms``, ``flush_bytes``, ``max_buffer_bytes``,
            ``buffer_wait_ms``, ``compression`` (a Settings or a BatcherConfig).
        metrics: where flush and produce figures go.
        offload: runs the blocking PUT + commit (default: ``asyncio.to_thread``).
    """

    def __init__(
        self,
        writer: LogWriter,
        settings: Settings | BatcherConfig,
        metrics: Metrics,
        offload: Offload | None = None,
    ) -> None:
        self.writer = writer
        self._offload: Offload = offload or asyncio.to_thread
        self.config = (
            settings
            if isinstance(settings, BatcherConfig)
            else BatcherConfig.from_settings(settings)
        )
        self.metrics = metrics
        self._current = self._new_buffer()
        self._sealed: deque[_Buffer] = deque()  # full buffers waiting for their flush
        self._in_flight = 0  # accounted bytes of the flushes being written
        self._reserved = 0  # bytes of admitted waiters that have not appended yet
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()  # FIFO
        self._wake = asyncio.Event()  # something to flush (or closing)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> None:
        """Start the flush loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="lakelog-batcher")

    async def close(self) -> None:
        """Flush what is buffered, then stop; later appends raise BufferFullError."""
        if self._closed:
            return
        self._closing = True
        self._admit()  # waiters for space get BufferFullError now
        self._wake.set()
        if self._task is not None:
            await self._task
        else:  # never started: flush inline so nothing buffered is dropped
            await self._drain()
        self._closed = True
        self._admit()

    @property
    def buffered_bytes(self) -> int:
        """Accounted bytes buffered plus in flight."""
        return self._used()

    # -- appending ------------------------------------------------------------
    async def append(
        self,
        topic_id: bytes,
        records: Sequence[tuple[int, Record]],
        request_key: RequestKey | None = None,
        producer: RestProducer | None = None,
        *,
        log_append_time: bool = False,
    ) -> Offsets:
        """Buffer ``(partition, record)`` pairs of one topic; wait for their flush.

        ``log_append_time``: the topic has message.timestamp.type=LogAppendTime; its
        batches get the flush's time (``SegmentBuilder.build``).

        Records of one partition keep their order; the whole call lands in one flush.
        ``request_key`` (its offset and count ignored): a REST idempotency key the
        commit stores with the offsets of these records, or refuses if already stored.
        ``producer``: an idempotent producer's (id, epoch, base sequence per partition)
        for these records, checked by the commit as a Kafka producer's batches are.

        Returns:
            The offset of each record, in the order given.

        Raises:
            BufferFullError: no room within ``buffer_wait_ms`` (or the batcher is closed).
            RecordTooLargeError: the records alone exceed ``max_buffer_bytes``.
            InternalError: the builder refused the records (callers validate them
                first, so this is a bug); none of them was buffered.
            LakelogError: the flush holding them failed (retriable unless the store
                or coordinator said otherwise).
        """
        if not records:
            return Offsets()
        return await self.append_grouped(
            topic_id,
            group_records(records),
            request_key,
            producer,
            log_append_time=log_append_time,
        )

    async def append_grouped(
        self,
        topic_id: bytes,
        grouped: Grouped,
        request_key: RequestKey | None = None,
        producer: RestProducer | None = None,
        *,
        log_append_time: bool = False,
    ) -> Offsets:
        """``append`` of records already grouped per partition (``Grouped``: a REST
        route builds it in the pass that places its records, so no per-record pairs or
        slots are built here). As ``append``: returns each record's offset, in the
        order of ``grouped.partitions``; raises the same errors."""
        groups, parts, size = grouped.groups, grouped.partitions, grouped.size
        if not parts:
            return Offsets()
        # No await after _open to the end of the appends: the request lands in one buffer.
        buf, was_empty = await self._open(size)
        place = _RecordsPlacement(topic_id, groups, request_key, producer, log_append_time)
        try:
            first = place(buf)
        except Exception as exc:
            buf.size -= size
            self._refused(buf, exc)
            raise InternalError(
                "Internal error while buffering the records; none was stored "
                "(not retriable: see the agent's log)."
            ) from exc
        refusable = request_key is not None or producer is not None
        keys = ((topic_id, p) for p in groups)
        future = self._queue(buf, was_empty, keys, place, first, refusable)
        # shield: a cancelled request (client gone) must not cancel the shared future.
        try:
            bases = await asyncio.shield(future)
        except _PartlyDone as partly:
            relative = _in_order(parts, {p: first[(topic_id, p)] for p in groups})
            raise partly.answer([(topic_id, p) for p in parts], relative) from None
        self.metrics.produced_records.inc(len(parts))
        self.metrics.produced_bytes.inc(size - RECORD_OVERHEAD * len(parts))
        out = Offsets(
            _in_order(parts, {p: bases[(topic_id, p)] + first[(topic_id, p)] for p in groups})
        )
        out.append_time_ms = bases.append_time_ms
        return out

    async def _open(self, size: int) -> tuple[_Buffer, bool]:
        """Room for ``size`` bytes (``_reserve``), then the open buffer with them
        accounted, and whether it was empty."""
        await self._reserve(size)
        buf = self._current
        was_empty = buf.records == 0
        if was_empty:
            buf.created = time.monotonic()  # linger counts from the batch's first record
        buf.size += size  # accounted before appending: whatever gets in is counted
        return buf, was_empty

    def _queue(
        self,
        buf: _Buffer,
        was_empty: bool,
        keys: Iterable[tuple[bytes, int]],
        place: Callable[[_Buffer], dict[tuple[bytes, int], int]],
        first: dict[tuple[bytes, int], int],
        refusable: bool,
    ) -> asyncio.Future[BaseOffsets]:
        """The waiter of a request just appended to ``buf`` (as an ``_Entry``); seals a
        full buffer, wakes the flusher for it or a first request."""
        future: asyncio.Future[BaseOffsets] = asyncio.get_running_loop().create_future()
        buf.waiters.append(future)
        buf.keys_of[future] = keys
        buf.entries.append(_Entry(future, place, first, refusable))
        if buf.size >= self.config.flush_bytes:
            self._seal()
            self._wake.set()
        elif was_empty:
            self._wake.set()
        self.metrics.buffer_bytes.set(self._used())
        return future

    async def append_batches(self, batches: Sequence[RawBatch]) -> Offsets:
        """Buffer producers' RecordBatches (Kafka Produce) as they are; wait for their flush.

        They share the open buffer, and so the next segment object, with every other
        append (REST records included). Batches of one partition keep their order; the
        whole call lands in one flush.

        Returns:
            The base offset of each batch, in the order given.

        Raises:
            As ``append``.
        """
        if not batches:
            return Offsets()
        size = sum(len(b.data) for b in batches)
        # No await after _open to the end of the appends: the request lands in one buffer.
        buf, was_empty = await self._open(size)
        placement = _BatchesPlacement(batches)
        placed = placement.append(buf)
        records = sum(b.record_count for b in batches)
        first: dict[tuple[bytes, int], int] = {}
        for key, relative in placed:
            first.setdefault(key, relative)
        refusable = any(b.producer is not None for b in batches)
        keys = (key for key, _ in placed)
        future = self._queue(buf, was_empty, keys, placement, first, refusable)
        try:
            bases = await asyncio.shield(future)
        except _PartlyDone as partly:
            raise partly.answer([k for k, _ in placed], [r for _, r in placed]) from None
        self.metrics.produced_records.inc(records)
        self.metrics.produced_bytes.inc(size)
        return Offsets.of((bases[key] + relative for key, relative in placed), bases.append_time_ms)

    # -- internals ------------------------------------------------------------
    def _refused(self, buf: _Buffer, exc: Exception) -> None:
        """The builder raised on an append: log it; drop the buffer if it was changed.

        ``append_groups`` checks everything before encoding, so a refusal normally
        leaves the buffer as it was. If the builder failed part way through (a codec
        bug), the buffer holds records of a request that is answered with an error:
        it is discarded, never flushed, and its other requests get a retriable error
        (nothing of theirs was stored either).
        """
        log.error("the segment builder refused an append", exc_info=exc)
        if buf.builder.record_count == buf.records:
            self._admit()  # the refused request's bytes are free again
            return
        if buf is self._current:
            self._current = self._new_buffer()
        self.metrics.failed_records.inc(buf.records)
        retry = BufferFullError(
            "The agent's write buffer was discarded after an internal error; nothing in "
            "it was stored: retry."
        )
        for future in buf.waiters:
            if not future.done():
                future.set_exception(retry)
        self.metrics.buffer_bytes.set(self._used())
        self._admit()

    def _new_buffer(self) -> _Buffer:
        return _Buffer(SegmentBuilder(self.config.compression))

    def _used(self) -> int:
        return (
            self._in_flight
            + self._reserved
            + self._current.size
            + sum(b.size for b in self._sealed)
        )

    async def _reserve(self, size: int) -> None:
        """Wait until ``size`` more bytes fit under max_buffer_bytes, or raise.

        Waiters are admitted strictly first come, first served (a later small append
        never overtakes an earlier large one, which would also reorder a v3 stream),
        and admission reserves their bytes at once so wake-ups never over-commit.
        """
        limit = self.config.max_buffer_bytes
        if size > limit:
            raise RecordTooLargeError(
                f"Records of {size} bytes exceed the agent's buffer of {limit} bytes."
            )
        if self._closing:
            raise BufferFullError("The agent is shutting down; retry against another agent.")
        if not self._waiters and self._used() + size <= limit:
            return
        self._seal()  # a full buffer must not linger: let the flush loop free space
        self._wake.set()
        admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, admitted)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(admitted, self.config.buffer_wait_ms / 1000.0)
        except BaseException as exc:
            if admitted.done() and not admitted.cancelled():
                self._reserved -= size  # admitted, but leaving: give the bytes back
            elif entry in self._waiters:
                self._waiters.remove(entry)
            self._admit()  # the head may have left: the next one may fit now
            if isinstance(exc, TimeoutError):
                self.metrics.buffer_full.inc()
                raise BufferFullError(
                    f"The agent's write buffer stayed full ({self._used()} of {limit} bytes) "
                    f"for {self.config.buffer_wait_ms:g} ms; retry later."
                ) from None
            raise
        self._reserved -= size  # the caller appends now, synchronously
        if self._closing:
            raise BufferFullError("The agent is shutting down; retry against another agent.")

    def _admit(self) -> None:
        """Admit waiters from the head of the queue while they fit (all when closing)."""
        limit = self.config.max_buffer_bytes
        while self._waiters:
            size, admitted = self._waiters[0]
            if admitted.done():  # timed out or cancelled
                self._waiters.popleft()
                continue
            if not self._closing and self._used() + size > limit:
                return
            self._waiters.popleft()
            self._reserved += size
            admitted.set_result(None)

    def _seal(self) -> None:
        """Move the open buffer to the flush queue (if it holds anything)."""
        if self._current.records:
            self._sealed.append(self._current)
            self._current = self._new_buffer()

    def _next_due(self) -> tuple[_Buffer | None, float]:
        """The buffer to flush now, or None and how long to wait for the open one."""
        if self._sealed:
            return self._sealed.popleft(), 0.0
        if not self._current.records:
            return None, float("inf")
        due = self._current.created + self.config.linger_ms / 1000.0
        now = time.monotonic()
        if self._closing or now >= due:
            buf = self._current
            self._current = self._new_buffer()
            return buf, 0.0
        return None, due - now

    async def _run(self) -> None:
        flights: set[asyncio.Task[None]] = set()
        previous: asyncio.Future[None] | None = None  # the last flush's commit (or failure)
        try:
            while True:
                while len(flights) >= max(1, self.config.flushes_in_flight):
                    await asyncio.wait(flights, return_when=asyncio.FIRST_COMPLETED)
                buf, wait = self._next_due()
                if buf is not None:
                    committed = asyncio.get_running_loop().create_future()
                    task = asyncio.create_task(self._flush(buf, previous, committed))
                    flights.add(task)
                    task.add_done_callback(flights.discard)
                    previous = committed
                    continue
                if self._closing:
                    return
                self._wake.clear()
                timeout = None if wait == float("inf") else wait
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        finally:
            if flights:  # let every flush end: its waiters are answered either way
                await asyncio.gather(*flights, return_exceptions=True)

    async def _drain(self) -> None:
        self._seal()
        while self._sealed:
            await self._flush(self._sealed.popleft())

    async def _flush(
        self,
        buf: _Buffer,
        after: asyncio.Future[None] | None = None,
        committed: asyncio.Future[None] | None = None,
    ) -> None:
        """Write one buffer and answer its waiters; never raises.

        Args:
            after: resolved once the previous flush committed or failed: this one's
                PUT may run before, its commit only after.
            committed: resolved here once this flush committed or failed.
        """
        self._in_flight += buf.size
        self.metrics.buffer_bytes.set(self._used())
        try:
            await self._write(buf, after)
        except BaseException as exc:  # cancellation / interpreter exit: waiters answered
            self._fail(buf, exc)
            raise
        finally:
            if committed is not None and not committed.done():
                committed.set_result(None)
            self._in_flight -= buf.size
            self.metrics.buffer_bytes.set(self._used())
            self._admit()

    async def _write(self, buf: _Buffer, after: asyncio.Future[None] | None = None) -> None:
        """PUT and commit one buffer and answer its waiters; raises only on cancellation.

        A commit refused with a ProducerConflictError (an idempotency key stored
        meanwhile through another agent, an idempotent batch that is a duplicate or out
        of order) or an InvalidTxnStateError (a transactional batch for a partition its
        transaction did not add) is the doing of the requests that carry such things,
        not of the whole flush: the buffer is split (``_split``) until the refused
        requests are alone, and every other request is committed, in append order.
        """
        started = time.perf_counter()
        uploaded: UploadedSegment | None = None
        try:
            uploaded = await self._offload(self._upload, buf)
            if after is not None:
                await asyncio.shield(after)
            result = await self._offload(self._commit, uploaded)
        except PartialCommitError as exc:
            assert uploaded is not None
            self._answer_partly(buf, uploaded, exc)
        except (ProducerConflictError, InvalidTxnStateError) as exc:
            await self._split(buf.entries, exc)
        except Exception as exc:
            self._fail(buf, exc)
        else:
            bases = BaseOffsets(
                ((chunk.topic_id, chunk.partition), base)
                for chunk, base in zip(result.chunks, result.base_offsets, strict=True)
            )
            bases.append_time_ms = result.append_time_ms
            self.metrics.flushes.labels(result="ok").inc()
            self.metrics.flush_bytes.observe(result.size)
            self.metrics.flush_records.observe(buf.records)
            self.metrics.flush_seconds.observe(time.perf_counter() - started)
            for future in buf.waiters:
                if not future.done():
                    future.set_result(_shifted(buf, future, bases))

    async def _split(
        self, entries: list[_Entry], error: ProducerConflictError | InvalidTxnStateError
    ) -> None:
        """``entries`` were refused together: commit each half again in its own object,
        first half first (so append order is commit order), splitting again a half
        that is refused, until a refused request is alone and gets the error.

        The refused objects stay uncommitted (garbage, collected as any failed
        flush's); the index never references them. A half without a request that a
        commit could refuse (no key, no producer) is not refused again.
        """
        if len(entries) == 1 or not any(e.refusable for e in entries):
            log.warning("commit refused %d request(s): %s", len(entries), error.message)
            self._fail_futures([e.future for e in entries], error)
            return
        mid = len(entries) // 2
        for half in (entries[:mid], entries[mid:]):
            if all(e.future.done() for e in half):
                continue
            await self._write(self._rebuild(half))

    def _rebuild(self, entries: list[_Entry]) -> _Buffer:
        """A new buffer holding ``entries`` again, each answered at its new offsets."""
        buf = self._new_buffer()
        for e in entries:
            now = e.place(buf)
            buf.waiters.append(e.future)
            buf.keys_of[e.future] = list(now)
            buf.shifts[e.future] = {k: now[k] - e.starts[k] for k in now}
            buf.entries.append(e)
        return buf

    def _fail(self, buf: _Buffer, exc: BaseException) -> None:
        """Answer every waiter of a failed flush (nothing of it was committed)."""
        error = _as_flush_error(exc)
        if isinstance(exc, Exception) and not isinstance(exc, LakelogError):
            log.error("flush of %d records failed unexpectedly", buf.records, exc_info=exc)
        else:
            log.warning("flush of %d records failed: %s", buf.records, error.message)
        self.metrics.failed_records.inc(buf.records)
        self._fail_futures(buf.waiters, exc)

    def _fail_futures(
        self, futures: Iterable[asyncio.Future[BaseOffsets]], exc: BaseException
    ) -> None:
        error = _as_flush_error(exc)
        self.metrics.flushes.labels(result="error").inc()
        for future in futures:
            if not future.done():
                future.set_exception(error)

    def _answer_partly(
        self, buf: _Buffer, uploaded: UploadedSegment, exc: PartialCommitError
    ) -> None:
        """Some metadata shards committed the flush, others failed: a request whose
        partitions all committed gets its offsets, one with none committed its shard's
        error, one with some committed a PartlyCommittedError saying which."""
        done = BaseOffsets()
        done.append_time_ms = uploaded.append_time_ms
        failed: dict[tuple[bytes, int], LakelogError] = {}
        for c, base, failure in zip(uploaded.chunks, exc.base_offsets, exc.failures, strict=False):
            if base is not None:
                done[(c.topic_id, c.partition)] = base
            else:
                failed[(c.topic_id, c.partition)] = failure or exc
        log.warning(
            "flush of %d records partly committed (%d of %d chunks): %s",
            buf.records,
            len(done),
            len(uploaded.chunks),
            exc.message,
        )
        self.metrics.flushes.labels(result="partial").inc()
        for future in buf.waiters:
            if future.done():
                continue
            keys = list(buf.keys_of.get(future, ()))
            missing = [k for k in keys if k not in done]
            if not missing:
                future.set_result(_shifted(buf, future, done))
            elif len(missing) < len(keys):
                mine = {k: _as_flush_error(failed.get(k, exc)) for k in missing}
                future.set_exception(_PartlyDone(_shifted(buf, future, done), mine))
            else:
                future.set_exception(_as_flush_error(failed.get(missing[0], exc)))

    def _upload(self, buf: _Buffer) -> UploadedSegment:
        """Build + PUT (the first step of LogWriter.write), timed; the REST requests'
        idempotency keys and producer batches join the Kafka producers' batches."""
        started = time.perf_counter()
        uploaded = self.writer.upload(buf.builder)
        producers = dict(uploaded.producer_batches)
        for tp, batches in buf.producer_batches.items():  # REST ones among Kafka's
            merged = [*producers.get(tp, ()), *batches]
            producers[tp] = sorted(merged, key=lambda b: b.relative_offset)
        uploaded = replace(uploaded, request_keys=buf.request_keys, producer_batches=producers)
        self.metrics.put_seconds.observe(time.perf_counter() - started)
        return uploaded

    def _commit(self, uploaded: UploadedSegment) -> WriteResult:
        """Commit an uploaded object (the second step of LogWriter.write), timed."""
        started = time.perf_counter()
        result = self.writer.commit(uploaded)
        self.metrics.commit_seconds.observe(time.perf_counter() - started)
        return result


def _shifted(buf: _Buffer, future: asyncio.Future[BaseOffsets], bases: BaseOffsets) -> BaseOffsets:
    """The base offsets a waiter adds its first relative offsets to: as committed,
    unless its request was appended again to this buffer at other relative offsets."""
    shift = buf.shifts.get(future)
    if not shift:
        return bases
    out = BaseOffsets((k, base + shift.get(k, 0)) for k, base in bases.items())
    out.append_time_ms = bases.append_time_ms
    return out


def _as_flush_error(exc: BaseException) -> LakelogError:
    """The error every request of a failed flush gets.

    Nothing of a failed flush was committed, so sending the same request again may
    succeed: retriable errors pass through, and so do metadata errors that describe
    the client's target (a topic deleted meanwhile); any other lakelog error (a
    storage error such as a missing bucket) becomes a retriable StorageUnavailableError
    naming the cause. An exception that is not a lakelog error is a bug: the same
    request would meet it again, so it is a non-retriable InternalError (the
    traceback goes to the log, not to the client).
    """
    if isinstance(exc, LakelogError) and (exc.retriable or isinstance(exc, MetadataError)):
        return exc
    if isinstance(exc, LakelogError):
        return StorageUnavailableError(f"Flush failed: {exc.message}")
    return InternalError(
        "Internal error while writing the records (not retriable: see the agent's log)."
    )
