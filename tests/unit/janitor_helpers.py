"""Shared pieces of the janitor tests: a clocked memory store, a small harness, and the
rows of the Iceberg tables the tiering janitor writes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from coordinator.janitors.catalog import Catalog
from coordinator.janitors.context import JanitorConfig, JanitorContext
from coordinator.local import LocalCoordinator
from index.log import LogReader, LogWriter
from segments.memory import MemoryStore
from segments.segment import SegmentBuilder
from segments.store import ObjectInfo
from segments.types import ConsumedRecord, Record

if TYPE_CHECKING:
    import pyarrow as pa


class FakeClock:
    """Epoch seconds that move only when told.

    Starts a minute ahead of the real clock: commits stamp ``committed_at`` with the
    real time, and the tests' chunks must look committed in the fake past.
    """

    def __init__(self) -> None:
        self.t = time.time() + 60

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class ClockedStore(MemoryStore):
    """A memory store whose modification times come from a fake clock (for orphan age)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__("clocked")
        self.clock = clock
        self.mtimes: dict[str, float] = {}
        self.deleted: list[str] = []

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> None:
        super().put(key, data, if_none_match=if_none_match)
        self.mtimes[key] = self.clock()

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for info in super().list(prefix):
            yield ObjectInfo(info.key, info.size, self.mtimes[info.key])

    def head(self, key: str) -> ObjectInfo:
        info = super().head(key)
        return ObjectInfo(key, info.size, self.mtimes[key])

    def delete(self, key: str) -> None:
        super().delete(key)
        self.deleted.append(key)

    def key_set(self) -> set[str]:
        return {o.key for o in super().list("")}


@dataclass
class Harness:
    """A SQLite coordinator, a clocked memory store, a writer and a reader."""

    tmp: Path
    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        self.coordinator = LocalCoordinator(f"sqlite:///{self.tmp / 'meta.db'}")
        self.store = ClockedStore(self.clock)
        self.writer = LogWriter(self.store, self.coordinator)
        self.reader = LogReader(self.store, self.coordinator)
        self.catalog = Catalog(self.coordinator.db)

    def ctx(self) -> JanitorContext:
        return JanitorContext(self.catalog, self.coordinator.store, self.store, self.clock)

    def config(self, **kw: object) -> JanitorConfig:
        base: dict[str, object] = {"tier_age_s": 0.0, "gc_grace_s": 60.0}
        base.update(kw)
        return JanitorConfig(**base)  # type: ignore[arg-type]

    def produce(self, topic: str, partition: int, records: list[Record]) -> int:
        """One flush of ``records`` to one partition; returns the base offset."""
        info = self.coordinator.get_topic(topic)
        b = SegmentBuilder()
        b.append(info.topic_id, partition, records)
        return self.writer.write(b).base_offsets[0]

    def walk(self, topic: str, partition: int) -> list[ConsumedRecord]:
        """Every readable record, read from every offset one at a time and in one go."""
        offsets = self.coordinator.offsets(topic, partition)
        whole = self.reader.read(topic, partition, 0, max_bytes=1 << 40)
        for rec in whole:
            one = self.reader.read(topic, partition, rec.offset, max_bytes=1)
            assert one[0] == rec
        assert all(offsets.log_start <= r.offset < offsets.high_watermark for r in whole)
        return whole

    def close(self) -> None:
        self.coordinator.close()


def records(n: int, start_ts: int, key_mod: int | None = None, tag: str = "") -> list[Record]:
    """``n`` varied records: null and empty keys and values, headers, rising timestamps."""
    out = []
    for i in range(n):
        key: bytes | None
        if key_mod is not None:
            key = f"k{i % key_mod}".encode()
        else:
            key = None if i % 5 == 0 else f"key-{tag}{i}".encode()
        value = None if i % 7 == 3 else (f"v{tag}{i}-" * (i % 4)).encode()
        headers = (("h", f"{i}".encode()), ("n", None)) if i % 3 == 0 else ()
        out.append(Record(key, value, start_ts + i, headers))
    return out


def table_rows(table: pa.Table) -> list[tuple[object, ...]]:
    """A table's rows as comparable tuples, by partition and offset."""
    out = []
    for r in table.to_pylist():
        headers = tuple((h["key"], h["value"]) for h in r["headers"] or ())
        ts = int(r["timestamp"].timestamp() * 1000)
        out.append((r["partition"], r["offset"], r["key"], r["value"], ts, headers))
    return sorted(out, key=lambda t: (t[0], t[1]))
