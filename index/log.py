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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ulid import ULID

from coordinator.client import ChunkCommit, Coordinator
from segments.errors import CorruptSegmentError, LakelogError
from segments.segment import SegmentBuilder, decode_chunk
from segments.store import ObjectStore
from segments.types import ChunkInfo, ChunkRef, ConsumedRecord

log = logging.getLogger(__name__)

T = TypeVar("T")

SEGMENT_PREFIX = "segments/"


def new_object_key() -> str:
    """``segments/<random prefix>/<ULID>.seg``: the prefix spreads keys over S3 partitions."""
    return f"{SEGMENT_PREFIX}{secrets.token_hex(2)}/{ULID()}.seg"


def retry(call: Callable[[], T], attempts: int = 5, first_delay: float = 0.05) -> T:
    """Run ``call``, retrying errors marked retriable with exponential backoff."""
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except LakelogError as e:
            if not e.retriable or attempt == attempts:
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


@dataclass(frozen=True, slots=True)
class UploadedSegment:
    """A segment object that is in the store but not committed (not visible) yet."""

    object_key: str
    size: int
    chunks: list[ChunkInfo]
    #: The object's bytes, handed to ``LogWriter.listeners`` after the commit.
    data: bytes = b""


#: Called after every committed write with the result and the object's bytes.
WriteListener = Callable[[WriteResult, bytes], None]


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

    def upload(self, builder: SegmentBuilder) -> UploadedSegment:
        """Step 1 of ``write``: build and PUT the object (nothing visible yet)."""
        data, chunks = builder.build()
        key = new_object_key()
        retry(lambda: self.store.put(key, data, if_none_match=True))
        return UploadedSegment(key, len(data), chunks, data)

    def commit(self, uploaded: UploadedSegment) -> WriteResult:
        """Step 2 of ``write``: commit an uploaded object's chunks; returns base offsets."""
        commits = [
            ChunkCommit(
                topic_id=c.topic_id,
                partition=c.partition,
                position=c.position,
                length=c.length,
                record_count=c.record_count,
                min_timestamp_ms=c.min_timestamp_ms,
                max_timestamp_ms=c.max_timestamp_ms,
            )
            for c in uploaded.chunks
        ]
        # Safe to retry: the coordinator answers a repeated object key with the same offsets.
        offsets = retry(lambda: self.coordinator.commit(uploaded.object_key, commits))
        result = WriteResult(uploaded.object_key, uploaded.size, uploaded.chunks, offsets)
        for listener in self.listeners:
            try:
                listener(result, uploaded.data)
            except Exception:
                # The write is committed and acked whatever a cache or wake-up does.
                log.exception("write listener %r failed", listener)
        return result


class LogReader:
    """Read committed records of one partition from the object store."""

    def __init__(self, store: ObjectStore, coordinator: Coordinator) -> None:
        self.store = store
        self.coordinator = coordinator

    def fetch_chunk(self, ref: ChunkRef) -> bytes:
        """The bytes of one index entry (a ranged GET). Subclasses add caching."""
        data = self.store.get_range(ref.object_key, ref.position, ref.length)
        if len(data) != ref.length:
            raise CorruptSegmentError(
                f"{ref.object_key}: chunk at {ref.position} is {len(data)} bytes, "
                f"index says {ref.length}"
            )
        return data

    def read(
        self, topic: str, partition: int, offset: int, *, max_bytes: int = 1 << 20
    ) -> list[ConsumedRecord]:
        """Records from ``offset`` on (from log-start if below it), up to the high watermark.

        Stops once the key+value bytes returned reach ``max_bytes``, but always
        returns at least one record when one exists.
        """
        out: list[ConsumedRecord] = []
        size = 0
        next_offset = offset
        while True:
            refs = self.coordinator.lookup(topic, partition, next_offset)
            if not refs:
                return out
            for ref in refs:
                for off, rec in decode_chunk(
                    self.fetch_chunk(ref), ref.base_offset, ref.record_count
                ):
                    if off < next_offset:
                        continue
                    out.append(
                        ConsumedRecord(
                            topic, partition, off, rec.key, rec.value, rec.timestamp_ms, rec.headers
                        )
                    )
                    size += len(rec.key or b"") + len(rec.value or b"")
                    if size >= max_bytes:
                        return out
                next_offset = ref.end_offset

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp_ms``, or None."""
        ref = self.coordinator.lookup_timestamp(topic, partition, timestamp_ms)
        if ref is None:
            return None
        for off, rec in decode_chunk(self.fetch_chunk(ref), ref.base_offset, ref.record_count):
            if rec.timestamp_ms >= timestamp_ms:
                return off
        # The index's max timestamp comes from these very records, so this is corruption.
        raise CorruptSegmentError(
            f"{ref.object_key}: no record at or after {timestamp_ms} in a chunk whose "
            f"max timestamp is {ref.max_timestamp_ms}"
        )
