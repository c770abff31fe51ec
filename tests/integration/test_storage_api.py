"""The storage API end to end: many topic-partitions in ONE segment object, committed, read back.

Runs against memory://, file:// and s3:// (a moto server process over HTTP), with a
real SQLite coordinator.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.client import ChunkCommit
from coordinator.janitors.orphans import find_orphans
from coordinator.local import LocalCoordinator
from index.log import SEGMENT_PREFIX, LogReader, LogWriter
from segments.errors import CorruptSegmentError, StorageUnavailableError
from segments.segment import SegmentBuilder
from segments.store import ObjectStore, open_store
from segments.types import Record

pytestmark = pytest.mark.integration


@pytest.fixture(params=["memory", "file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "memory":
        s = open_store("memory://")
    elif request.param == "file":
        s = open_store(f"file://{tmp_path / 'objects'}")
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        s = open_store(request.getfixturevalue("s3_url"), endpoint_url=endpoint)
    yield s
    s.close()


@pytest.fixture
def coord(tmp_path: Path) -> Iterator[LocalCoordinator]:
    c = LocalCoordinator(f"sqlite:///{tmp_path / 'meta.db'}")
    yield c
    c.close()


def make_records(n: int, seed: int, t0: int = 1_700_000_000_000) -> list[Record]:
    rng = random.Random(seed)
    return [
        Record(
            key=None if i % 5 == 0 else f"k{rng.randrange(100)}".encode(),
            value=None if i % 11 == 0 else rng.randbytes(rng.randrange(0, 300)),
            timestamp_ms=t0 + i * 10,
            headers=(("h", f"{i}".encode()),) if i % 3 == 0 else (),
        )
        for i in range(n)
    ]


def test_one_object_many_partitions_round_trip(store: ObjectStore, coord: LocalCoordinator) -> None:
    """Two flushes over 2 topics x 3 partitions: two objects, contiguous offsets, exact records."""
    a = coord.create_topic("alpha", 3)
    b = coord.create_topic("beta", 3)
    writer = LogWriter(store, coord)
    expected: dict[tuple[str, int], list[Record]] = {}
    for flush in range(2):
        builder = SegmentBuilder(compression="zstd" if flush else "none")
        for topic in (a, b):
            for p in range(3):
                recs = make_records(20 + p, seed=hash((topic.name, p, flush)) & 0xFFFF)
                builder.append(topic.topic_id, p, recs)
                expected.setdefault((topic.name, p), []).extend(recs)
        result = writer.write(builder)
        assert len(result.chunks) == 6
        # offsets continue where the previous flush stopped
        assert sorted(result.base_offsets) == sorted([0] * 6 if flush == 0 else [20, 21, 22] * 2)

    assert len(list(store.list(SEGMENT_PREFIX))) == 2  # one object per flush, not per partition
    reader = LogReader(store, coord)
    for (topic_name, p), recs in expected.items():
        assert coord.offsets(topic_name, p).high_watermark == len(recs)
        got = reader.read(topic_name, p, 0, max_bytes=1 << 30)
        assert [r.offset for r in got] == list(range(len(recs)))
        assert [(r.key, r.value, r.timestamp_ms, r.headers) for r in got] == [
            (r.key, r.value, r.timestamp_ms, r.headers) for r in recs
        ]
        # any single offset reads back the same record
        for off in (0, len(recs) // 2, len(recs) - 1):
            first = reader.read(topic_name, p, off, max_bytes=1)
            # at least one record even when it is over max_bytes; empty ones don't count
            assert first[0].offset == off
            assert len(first) == 1 or not (first[0].key or first[0].value)
            assert first[0].value == recs[off].value
        assert reader.read(topic_name, p, len(recs)) == []  # never past the high watermark


def test_offset_for_timestamp(store: ObjectStore, coord: LocalCoordinator) -> None:
    t = coord.create_topic("times", 1)
    writer = LogWriter(store, coord)
    for flush in range(3):
        builder = SegmentBuilder()
        builder.append(t.topic_id, 0, make_records(10, seed=flush, t0=1000 * (flush + 1)))
        writer.write(builder)
    reader = LogReader(store, coord)
    assert reader.offset_for_timestamp("times", 0, 0) == 0
    assert reader.offset_for_timestamp("times", 0, 2000) == 10
    assert reader.offset_for_timestamp("times", 0, 2015) == 12  # 2000, 2010, 2020 -> third
    assert reader.offset_for_timestamp("times", 0, 10_000) is None


class FailingCommit:
    """A coordinator whose commit dies: the crash between PUT and commit."""

    def __init__(self, inner: LocalCoordinator) -> None:
        self.inner = inner

    def commit(self, object_key: str, chunks: list[ChunkCommit]) -> list[int]:
        raise StorageUnavailableError("simulated crash before commit")

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_crash_between_put_and_commit_leaves_nothing_visible(
    store: ObjectStore, coord: LocalCoordinator
) -> None:
    """Invariant 3: the PUT lands, the commit never does -> no record visible, orphan reported."""
    t = coord.create_topic("crash", 2)
    good = SegmentBuilder()
    good.append(t.topic_id, 0, make_records(5, seed=1))
    committed = LogWriter(store, coord).write(good)

    bad = SegmentBuilder()
    bad.append(t.topic_id, 0, make_records(7, seed=2))
    bad.append(t.topic_id, 1, make_records(7, seed=3))
    with pytest.raises(StorageUnavailableError):
        LogWriter(store, FailingCommit(coord)).write(bad)  # type: ignore[arg-type]

    assert coord.offsets("crash", 0).high_watermark == 5
    assert coord.offsets("crash", 1).high_watermark == 0
    assert len(LogReader(store, coord).read("crash", 0, 0)) == 5
    assert LogReader(store, coord).read("crash", 1, 0) == []
    keys = [o.key for o in store.list(SEGMENT_PREFIX)]
    assert len(keys) == 2
    orphans = [o.key for o in find_orphans(store, coord, grace_s=0)]
    assert orphans == [k for k in keys if k != committed.object_key]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_object_raises_corruption_never_wrong_records(
    store: ObjectStore, coord: LocalCoordinator, damage: str
) -> None:
    t = coord.create_topic("damaged", 1)
    builder = SegmentBuilder()
    builder.append(t.topic_id, 0, make_records(50, seed=9))
    result = LogWriter(store, coord).write(builder)
    data = bytearray(store.get(result.object_key))
    if damage == "flip":
        data[result.chunks[0].length // 2] ^= 0x40
    else:
        data = data[: result.chunks[0].length // 2]
    store.put(result.object_key, bytes(data))
    with pytest.raises(CorruptSegmentError):
        LogReader(store, coord).read("damaged", 0, 0)
