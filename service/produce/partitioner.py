"""Which partition a produced record goes to: Kafka's default partitioner.

1. An explicit partition wins.
2. A keyed record goes to ``toPositive(murmur2(key)) % partitions``, exactly as the
   Java client's ``BuiltInPartitioner.partitionForKey`` computes it, so a key lands on
   the partition a Java (or librdkafka ``murmur2_random``) producer would choose.
   The hash is aiokafka's port of ``org.apache.kafka.common.utils.Utils.murmur2``
   (seed 0x9747b28c); it returns the unsigned 32-bit value, and ``toPositive`` (``x &
   0x7fffffff``) gives the same result for the signed and the unsigned reading.
3. Keyless records are *sticky per request*: all keyless records of one request to one
   topic go to one partition, and the next request moves on to the next partition
   (round-robin from a random start). Like Kafka's sticky partitioner this keeps a
   flush's chunk count (and so footer size and index rows) low while spreading load.
"""

from __future__ import annotations

import random

from segments.partitioning import murmur2, partition_for_key, to_positive

__all__ = ["DEFAULT_PARTITIONER", "Partitioner", "murmur2", "partition_for_key", "to_positive"]


class Partitioner:
    """Keeps the round-robin position of keyless records, per topic."""

    def __init__(self, seed: int | None = None) -> None:
        self._next: dict[str, int] = {}
        self._random = random.Random(seed)

    def sticky_partition(self, topic: str, partitions: int) -> int:
        """The partition for the keyless records of one request; advances the topic's cursor."""
        cursor = self._next.get(topic)
        if cursor is None:
            cursor = self._random.randrange(1 << 31)
        self._next[topic] = cursor + 1
        return cursor % partitions


#: The agent's partitioner (one per process: the cursor only spreads load).
DEFAULT_PARTITIONER = Partitioner()
