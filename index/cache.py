"""The agent's cache of index entries: ChunkRef lists per partition, keyed by topic id.

A committed index entry never changes, so it may be kept; tiering and retention swap or
drop entries, so only for a while (``ttl_s``). "Nothing past the high watermark" is never
kept, so new data is seen at once. Keyed by topic id, never by name: a topic deleted and
created again is another log. ``get`` answers only a contiguous run of entries from the
one holding the offset, as ``Coordinator.lookup`` does, so ``index.walk`` treats a hit
and a lookup alike.

Thread-safe, no I/O; imports ``ChunkRef`` only. The reader that uses it is the
agent's ``service.read_cache.CachingLogReader``.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import OrderedDict

from coordinator.client import ChunkRef

__all__ = ["IndexCache"]


class _PartitionIndex:
    """Known index entries of one partition, sorted by base offset."""

    __slots__ = ("bases", "created", "refs")

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.refs: list[ChunkRef] = []
        self.created = time.monotonic()


class IndexCache:
    """Committed index entries per partition, keyed by topic id, bounded in entries and age.

    Keyed by the topic's id, never its name: a topic deleted and created again is another
    log, whose entries are never mixed with the old one's.

    Args:
        max_entries: at most this many ChunkRefs in total (least recently used
            partitions are dropped first).
        ttl_s: a partition's entries are forgotten this long after the first was
            cached, so tiering and retention (which swap or drop entries) show
            through; 0 disables the cache.
    """

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._parts: OrderedDict[tuple[bytes, int], _PartitionIndex] = OrderedDict()
        self._count = 0

    def get(
        self, topic_id: bytes, partition: int, offset: int, max_chunks: int = 16
    ) -> list[ChunkRef]:
        """Cached entries from the one holding ``offset`` on (contiguous), else []."""
        key = (topic_id, partition)
        with self._lock:
            part = self._parts.get(key)
            if part is None:
                return []
            if time.monotonic() - part.created > self.ttl_s:
                self._drop(key)
                return []
            self._parts.move_to_end(key)
            i = bisect.bisect_right(part.bases, offset) - 1
            if i < 0 or not part.refs[i].base_offset <= offset < part.refs[i].end_offset:
                return []
            chain = [part.refs[i]]
            for ref in part.refs[i + 1 :]:
                if ref.base_offset != chain[-1].end_offset or len(chain) >= max_chunks:
                    break
                chain.append(ref)
            return chain

    def put(self, topic_id: bytes, partition: int, refs: list[ChunkRef]) -> None:
        """Remember committed entries (an empty list, "nothing yet", is never cached)."""
        if not refs or self.max_entries <= 0 or self.ttl_s <= 0:
            return
        with self._lock:
            key = (topic_id, partition)
            part = self._parts.get(key)
            if part is None:
                part = self._parts[key] = _PartitionIndex()
            self._parts.move_to_end(key)
            for ref in refs:
                i = bisect.bisect_left(part.bases, ref.base_offset)
                if i < len(part.bases) and part.bases[i] == ref.base_offset:
                    continue
                part.bases.insert(i, ref.base_offset)
                part.refs.insert(i, ref)
                self._count += 1
            while self._count > self.max_entries and self._parts:
                self._drop(next(iter(self._parts)))

    def invalidate(self, topic_id: bytes, partition: int) -> None:
        with self._lock:
            self._drop((topic_id, partition))

    def _drop(self, key: tuple[bytes, int]) -> None:
        part = self._parts.pop(key, None)
        if part is not None:
            self._count -= len(part.refs)

    def __len__(self) -> int:
        return self._count
