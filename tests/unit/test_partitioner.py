"""Kafka's default partitioner: murmur2 vectors, key -> partition, keyless spreading."""

from __future__ import annotations

import itertools

import pytest

from service.produce.partitioner import Partitioner, murmur2, partition_for_key, to_positive

# The Java client's own test vectors: apache/kafka
# clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2()
# (Utils.murmur2 returns a signed Java int).
KAFKA_UTILS_TEST_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("key", "expected"), KAFKA_UTILS_TEST_VECTORS)
def test_murmur2_matches_kafka_utils_test(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_to_positive_clears_the_sign_bit_like_kafka() -> None:
    # Utils.toPositive(n) = n & 0x7fffffff (not abs: Integer.MIN_VALUE maps to 0).
    assert to_positive(-973932308) == (-973932308) & 0x7FFFFFFF == 1173551340
    assert to_positive(-(2**31)) == 0
    assert to_positive(479470107) == 479470107


@pytest.mark.parametrize(("key", "hashed"), KAFKA_UTILS_TEST_VECTORS)
@pytest.mark.parametrize("partitions", [1, 3, 12, 100, 1000])
def test_partition_for_key_is_to_positive_murmur2_mod_n(
    key: bytes, hashed: int, partitions: int
) -> None:
    # BuiltInPartitioner.partitionForKey: toPositive(murmur2(key)) % numPartitions.
    assert partition_for_key(key, partitions) == (hashed & 0x7FFFFFFF) % partitions


def test_known_key_partitions() -> None:
    """Spot values worked out by hand from the vectors above, so a wrong modulus shows."""
    assert partition_for_key(b"21", 12) == 1173551340 % 12 == 0
    assert partition_for_key(b"foobar", 100) == ((-790332482) & 0x7FFFFFFF) % 100 == 66
    assert partition_for_key(b"abc", 7) == 479470107 % 7 == 4


def test_sticky_keyless_partition_moves_on_every_request() -> None:
    """Keyless records of one request share a partition; requests round-robin."""
    p = Partitioner(seed=1)
    chosen = [p.sticky_partition("t", 100) for _ in range(5)]
    assert len(set(chosen)) == 5
    assert [(b - a) % 100 for a, b in itertools.pairwise(chosen)] == [1, 1, 1, 1]
    # Cursors are per topic.
    q = Partitioner(seed=1)
    first_t = q.sticky_partition("t", 100)
    q.sticky_partition("other", 100)
    assert q.sticky_partition("t", 100) == (first_t + 1) % 100


def test_sticky_partition_stays_in_range() -> None:
    p = Partitioner()
    assert {p.sticky_partition("t", 3) for _ in range(30)} == {0, 1, 2}
    assert {p.sticky_partition("one", 1) for _ in range(5)} == {0}


def test_big_keys_are_hashed_but_never_kept_alive() -> None:
    """Keys can be as big as a record (1 MiB): the key cache keeps only small ones.

    Expected: a big key lands where murmur2 says, and the cache holds no key longer
    than CACHED_KEY_BYTES (before, it kept up to 65,536 keys of any size alive).
    """
    from segments import partitioning

    partitioning._cached_hash.cache_clear()
    big = bytes(range(256)) * 1024  # 256 KiB
    assert partition_for_key(big, 7) == to_positive(murmur2(big)) % 7
    assert partition_for_key(b"small", 7) == to_positive(murmur2(b"small")) % 7
    info = partitioning._cached_hash.cache_info()
    assert (info.currsize, info.misses) == (1, 1)  # only the small key was cached
