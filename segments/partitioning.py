"""Kafka's key partitioning: which partition a keyed record goes to, as every producer does.

``toPositive(murmur2(key)) % partitions``, exactly as the Java client's
``BuiltInPartitioner.partitionForKey`` computes it, so a key lands on the partition a
Java (or librdkafka ``murmur2_random``) producer, the agent and a Spark write would
choose. The hash is aiokafka's port of ``org.apache.kafka.common.utils.Utils.murmur2``
(seed 0x9747b28c); it returns the unsigned 32-bit value, and ``toPositive`` (``x &
0x7fffffff``) gives the same result for the signed and the unsigned reading.

Pure functions: no I/O, no state beyond a cache of hashes.
"""

from __future__ import annotations

from functools import lru_cache

from aiokafka.partitioner import murmur2 as _murmur2

__all__ = ["murmur2", "partition_for_key", "to_positive"]


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as a signed 32-bit int (Java's ``int`` result)."""
    h: int = _murmur2(data)
    return h - (1 << 32) if h >= 1 << 31 else h


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``: no overflow at MIN)."""
    return number & 0x7FFFFFFF


#: Keys up to this size are remembered; a bigger key is hashed every time. Keys may be
#: as big as a record (1 MiB): caching those would keep up to CACHED_KEYS of them alive.
CACHED_KEY_BYTES = 64
#: Entries of the cache: with CACHED_KEY_BYTES, it holds at most ~12 MiB.
CACHED_KEYS = 65536


# The pure-Python hash costs ~6 us per key; producers tend to reuse keys, so remember them.
@lru_cache(maxsize=CACHED_KEYS)
def _cached_hash(key: bytes) -> int:
    return to_positive(_murmur2(key))


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions`` (``toPositive(murmur2(key)) % n``)."""
    if len(key) <= CACHED_KEY_BYTES:
        return _cached_hash(key) % partitions
    return to_positive(_murmur2(key)) % partitions
