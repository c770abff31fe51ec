"""Tiering and compaction: rewrite index entries into Parquet tier objects.

Tiering is planned per SOURCE OBJECT, not per chunk. A run first reads every
partition's index and cuts, per partition, runs of contiguous segment chunks
committed at least ``tier_age_s`` ago (all of them once the partition's untiered
bytes reach ``tier_untiered_bytes``), each run at most ``tier_target_bytes`` of
source. Runs are then packed, in commit order, into waves of at most
``WAVE_BYTES`` of source (memory stays bounded whatever the partition count). Per
wave:

1. fetch and decode: the wave's chunks are grouped by segment object and each
   object's chunks are read with ONE ranged GET of their merged byte range (chunks
   further apart than ``MERGE_GAP_BYTES`` get a GET each), ``FETCH_THREADS`` GETs in
   flight. A segment object holds one chunk per partition of its flush, so one GET
   serves every partition being tiered instead of one GET per chunk: small segment
   objects are request-bound (see NOTES.md), and the GET count is what tiering
   costs. Each range's chunks are decoded with ``decode_chunk`` (batch CRCs, framing,
   exact record count) in the calling thread as soon as its GET lands, overlapping
   decoding with the GETs still in flight.
2. per run, in ``ENCODE_THREADS`` threads: encode the run's records as one tier
   object with ``encode_tier`` and PUT it (if-none-match).
3. per run, in the calling thread, as soon as its PUT is done: swap it into the
   index in one transaction that first checks the replaced entries are unchanged.

A reader at offset N sees the same record (key, value, timestamp, headers) before
and after (invariant 5): the records are copied, offsets included.

Compaction, per partition of a ``cleanup.policy=compact`` topic, works on the tiered
head of the partition: the tier entries from log-start up to the first segment chunk
(tier entries after an untiered chunk, left by an aborted swap or by coordinators whose
clocks disagree, wait until tiering fills the gap: an older value of a key in that chunk
must not outlive the key's tombstone). The head is rewritten keeping, per key, only the
record with the highest offset in it. Offsets are kept, so gaps appear (the one place
they may). A tombstone (null value) that is the latest of its key is dropped once
``delete.retention.ms`` has passed since the first compaction that saw it (Kafka's delete
horizon, KIP-534; never by its record timestamp, an event time that may be long past):
that compaction rewrites the head to stamp the horizon in the tier objects' footers
(``lakelog.delete_horizons``), where later rewrites carry it. Keyless records are kept:
Kafka refuses them on compacted topics, we accept them at produce and cannot compact them, so they
stay until retention (``compact,delete``) drops them. A head whose every record would go
(all its keys deleted long enough ago) keeps its last record, an expired tombstone, so
that its replacement entries cover its offsets and the index stays contiguous (readers
fail on a hole, DESIGN.md); the replacement's entries tile the head's offsets whatever
was dropped.

Object keys: ``tiered/<topic>/partition=<p>/<first:020d>-<last:020d>.<ULID>.parquet``,
DESIGN.md's key (``segments.tier.tier_object_key``) with a unique suffix, so that a
retried run or a compaction of the same offset range never overwrites an object a
reader may still hold.

A run that fails between its PUT and its swap leaves an object no index entry names:
an orphan, which garbage collection deletes after its grace period. A PUT older
than half that grace period is never swapped in, so GC can never delete an object
that is about to become referenced. When one run of a wave fails (a corrupt chunk),
the wave's other runs are still swapped, then the error is raised and later waves
are not started; when the lease is lost, nothing more is swapped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from ulid import ULID

from coordinator.janitors.catalog import IndexRow, NewRow, PartitionState
from coordinator.janitors.context import JanitorConfig, JanitorContext, JanitorReport, MiB
from coordinator.log.topic_configs import effective_configs
from segments.compression import DECOMPRESSED_CONFIG
from segments.errors import CorruptSegmentError
from segments.segment import decode_chunk, drop_aborted, iter_chunk_batches
from segments.tier import TierReader, encode_tier, tier_object_key
from segments.types import ConsumedRecord, Record

log = logging.getLogger(__name__)

#: Ranged GETs in flight while a wave's source objects are fetched.
FETCH_THREADS = 8
#: Runs decoded, encoded and PUT at once (pyarrow's encoder and the PUT release the GIL).
ENCODE_THREADS = 4
#: Source bytes fetched and held at once; a single run larger than this is a wave alone.
WAVE_BYTES = 128 * MiB
#: Chunks of one object at most this far apart are read with one GET (the bytes between
#: are read and dropped): one more request costs more than this many bytes on S3 and moto.
MERGE_GAP_BYTES = 1 * MiB


def new_tier_key(topic: str, partition: int, first_offset: int, last_offset: int) -> str:
    """A fresh tier object key for offsets [first, last] (see the module docstring)."""
    base = tier_object_key(topic, partition, first_offset, last_offset)
    return f"{base.removesuffix('.parquet')}.{ULID()}.parquet"


def _runs(rows: Sequence[IndexRow], target_bytes: int) -> list[list[IndexRow]]:
    """Cut rows (offset order) into runs of contiguous rows of at most ~target_bytes."""
    runs: list[list[IndexRow]] = []
    size = 0
    for r in rows:
        if runs and runs[-1][-1].end_offset == r.base_offset and size + r.length <= target_bytes:
            runs[-1].append(r)
            size += r.length
        else:
            runs.append([r])
            size = r.length
    return runs


def tier_candidates(
    rows: Sequence[IndexRow],
    log_start: int,
    config: JanitorConfig,
    now: float,
    stable: int | None = None,
) -> list[IndexRow]:
    """The segment entries to tier now: old enough, or all once the partition holds enough.

    Entries wholly below log-start are retention's to drop, never tiered. ``stable``: the
    first offset of a transaction still open; nothing from there on is tiered (tier rows
    keep no producer id: an abort decided later could not drop them).
    """
    segments = [
        r
        for r in rows
        if r.kind == "segment"
        and r.end_offset > log_start
        and (stable is None or r.end_offset <= stable)
    ]
    if sum(r.length for r in segments) >= max(config.tier_untiered_bytes, 1):
        return segments
    cutoff = now - config.tier_age_s
    return [r for r in segments if r.committed_at <= cutoff]


@dataclass(frozen=True, slots=True)
class TierRun:
    """Contiguous segment entries of one partition that become one tier object."""

    part: PartitionState
    rows: tuple[IndexRow, ...]
    #: The partition's aborted transactions (producer id, first offset, marker offset):
    #: their records are left out of the tier object, as markers are.
    aborted: tuple[tuple[int, int, int], ...] = ()

    @property
    def source_bytes(self) -> int:
        return sum(r.length for r in self.rows)


@dataclass(frozen=True, slots=True)
class FetchRange:
    """One ranged GET: bytes [start, start + length) of a segment object, and its chunks."""

    object_key: str
    start: int
    length: int
    rows: tuple[IndexRow, ...]

    def chunk(self, data: bytes, row: IndexRow) -> memoryview:
        """``row``'s chunk, cut out of this range's fetched ``data``.

        Raises:
            CorruptSegmentError: the object ended before the chunk the index names.
        """
        at = row.position - self.start
        view = memoryview(data)[at : at + row.length]
        if len(view) != row.length:
            raise CorruptSegmentError(
                f"{row.object_key}: chunk at {row.position} is {len(view)} bytes, "
                f"index says {row.length}"
            )
        return view


def plan_waves(runs: Sequence[TierRun], wave_bytes: int) -> list[list[TierRun]]:
    """Pack runs, oldest source first, into waves of at most ``wave_bytes`` of source.

    Runs of different partitions cut from the same flushes read the same segment
    objects; ordering by the first object's id (commit order) keeps them in one wave,
    so each object is fetched once unless a wave boundary falls inside it.
    """
    ordered = sorted(runs, key=lambda run: min(r.object_id for r in run.rows))
    waves: list[list[TierRun]] = []
    size = 0
    for run in ordered:
        if waves and size + run.source_bytes <= wave_bytes:
            waves[-1].append(run)
            size += run.source_bytes
        else:
            waves.append([run])
            size = run.source_bytes
    return waves


def plan_fetches(rows: Sequence[IndexRow], merge_gap: int = MERGE_GAP_BYTES) -> list[FetchRange]:
    """The ranged GETs that read ``rows``' chunks: per object, one per cluster of chunks.

    Chunks of one object are merged into one range when the gap between them is at
    most ``merge_gap`` bytes (overlapping or repeated chunks merge too).
    """
    by_object: dict[str, list[IndexRow]] = {}
    for r in rows:
        by_object.setdefault(r.object_key, []).append(r)
    ranges: list[FetchRange] = []
    for key, chunks in by_object.items():
        chunks.sort(key=lambda r: r.position)
        cluster = [chunks[0]]
        end = chunks[0].position + chunks[0].length
        for r in chunks[1:]:
            if r.position - end > merge_gap:
                ranges.append(_range(key, cluster, end))
                cluster = []
            cluster.append(r)
            end = max(end, r.position + r.length)
        ranges.append(_range(key, cluster, end))
    return ranges


def _range(key: str, cluster: list[IndexRow], end: int) -> FetchRange:
    start = cluster[0].position
    return FetchRange(key, start, end - start, tuple(cluster))


#: Each chunk's records, or the error its decoding raised.
Decoded = dict[IndexRow, list[tuple[int, Record]] | CorruptSegmentError]


class _Stopped(Exception):
    """A worker saw the run stopping before its PUT (internal; never escapes)."""


class _Nothing(Exception):
    """A run that holds no record to tier."""


@dataclass
class _Written:
    row: NewRow
    put_at: float


class Tierer:
    """Runs tiering or compaction over partitions (see the module docstring)."""

    def __init__(self, ctx: JanitorContext, config: JanitorConfig) -> None:
        self.ctx = ctx
        self.config = config
        # Set when a swap fails or the lease is lost: workers then start no more PUTs.
        self._stopping = threading.Event()

    # -- shared ---------------------------------------------------------------------
    def _put(
        self,
        part: PartitionState,
        records: Sequence[ConsumedRecord] | Sequence[tuple[int, Record]],
        delete_horizons: Sequence[tuple[int, int]] = (),
    ) -> tuple[str, bytes, float]:
        """Encode and PUT one tier object; returns its key, bytes and the time of the PUT.

        The time is taken just before the PUT: the object's modification time, by which
        GC ages orphans, is no earlier, so ``_swap``'s age check stays on the safe side.
        """
        first = records[0].offset if isinstance(records[0], ConsumedRecord) else records[0][0]
        last = records[-1].offset if isinstance(records[-1], ConsumedRecord) else records[-1][0]
        data = encode_tier(
            part.topic,
            part.partition,
            records,
            compression=self.config.tier_compression,
            row_group_bytes=self.config.tier_row_group_bytes,
            delete_horizons=delete_horizons,
        )
        key = new_tier_key(part.topic, part.partition, first, last)
        if self._stopping.is_set():
            raise _Stopped
        put_at = self.ctx.now()
        self.ctx.store.put(key, data, if_none_match=True)
        return key, data, put_at

    def _swap(
        self,
        part: PartitionState,
        old: Sequence[IndexRow],
        written: Sequence[_Written],
        report: JanitorReport,
    ) -> bool:
        self.ctx.check()
        now = self.ctx.now()
        if any(now - w.put_at > self.config.max_swap_delay_s for w in written):
            log.warning(
                "%s/%d: tier objects written too long ago to swap in safely; left for GC",
                part.topic,
                part.partition,
            )
            report.aborted += 1
            return False
        if not self.ctx.catalog.swap(
            part.topic_id, part.partition, old, [w.row for w in written], now
        ):
            log.info(
                "%s/%d: index changed during the rewrite; swap aborted", part.topic, part.partition
            )
            report.aborted += 1
            return False
        report.rows_replaced += len(old)
        report.rows_written += len(written)
        report.objects_written += len(written)
        report.bytes_rewritten += sum(w.row.size for w in written)
        return True

    # -- tiering --------------------------------------------------------------------
    def plan_partition(self, part: PartitionState) -> list[TierRun]:
        """The runs to tier in one partition now, from a fresh read of its index."""
        rows = self.ctx.catalog.rows(part.topic_id, part.partition)
        stable, aborted = self.ctx.catalog.transactions(part.topic_id, part.partition)
        candidates = tier_candidates(rows, part.log_start, self.config, self.ctx.now(), stable)
        return [
            TierRun(part, tuple(run), tuple(aborted))
            for run in _runs(candidates, self.config.tier_target_bytes)
        ]

    def tier_runs(self, runs: Sequence[TierRun], report: JanitorReport) -> None:
        """Fetch, rewrite and swap ``runs``, wave by wave (see the module docstring).

        A run whose chunks do not decode (corrupt, or a batch over its topic's
        ``lakelog.max.decompressed.bytes``) stays untiered; the other runs and waves go
        on, and the first such error is raised at the end.
        """
        done = 0
        undecodable: CorruptSegmentError | None = None
        with (
            ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="tier-get") as fetch_pool,
            ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="tier-put") as put_pool,
        ):
            for wave in plan_waves(runs, WAVE_BYTES):
                self.ctx.check()
                decoded = self._fetch(fetch_pool, wave, report)
                try:
                    done = self._rewrite(put_pool, wave, decoded, report, done, len(runs))
                except CorruptSegmentError as e:
                    undecodable = undecodable or e
        if undecodable is not None:
            raise undecodable

    def _fetch(
        self, pool: ThreadPoolExecutor, wave: Sequence[TierRun], report: JanitorReport
    ) -> Decoded:
        """GET each object's chunks once, FETCH_THREADS at once; decode them as they land.

        Decoding here, in the calling thread, overlaps it with the GETs still in flight.
        A chunk that fails to decode fails its run only (see ``_encode_and_put``): also
        one holding a batch over its topic's ``lakelog.max.decompressed.bytes``, which is
        not inflated past that bound.
        """
        plan = plan_fetches([r for run in wave for r in run.rows])
        limits = {
            r: int(effective_configs(run.part.configs)[DECOMPRESSED_CONFIG])
            for run in wave
            for r in run.rows
        }
        aborted = {
            r: [a for a in run.aborted if a[1] < r.end_offset and a[2] >= r.base_offset]
            for run in wave
            for r in run.rows
        }
        store = self.ctx.store
        futures = {pool.submit(store.get_range, f.object_key, f.start, f.length): f for f in plan}
        decoded: Decoded = {}
        try:
            for fut in as_completed(futures):
                fetch = futures[fut]
                data = fut.result()
                report.bytes_read += len(data)
                for r in fetch.rows:
                    try:
                        if aborted[r]:
                            batches = iter_chunk_batches(
                                fetch.chunk(data, r), r.base_offset, limits[r], r.record_count
                            )
                            decoded[r] = list(drop_aborted(batches, aborted[r]))
                        else:
                            decoded[r] = decode_chunk(
                                fetch.chunk(data, r), r.base_offset, r.record_count, limits[r]
                            )
                    except CorruptSegmentError as exc:
                        decoded[r] = exc
            return decoded
        finally:
            for fut in futures:
                fut.cancel()  # after a failed GET: the rest of the wave is not needed

    def _encode_and_put(self, run: TierRun, decoded: Decoded) -> _Written:
        """Encode a run's decoded chunks as one tier object and PUT it (a worker).

        Raises:
            CorruptSegmentError: one of the run's chunks failed to decode.
        """
        records: list[tuple[int, Record]] = []
        for r in run.rows:
            chunk = decoded[r]
            if isinstance(chunk, CorruptSegmentError):
                raise chunk
            records.extend(chunk)
        if not records:
            # Only markers and aborted records: nothing for a tier object to hold (it
            # needs a row). The entries stay; a later run joins them to newer records.
            raise _Nothing
        key, data, put_at = self._put(run.part, records)
        rows = run.rows
        return _Written(
            NewRow(
                key,
                len(data),
                rows[0].base_offset,
                rows[-1].end_offset - rows[0].base_offset,
                min(r.min_ts for r in rows),
                max(r.max_ts for r in rows),
            ),
            put_at,
        )

    def _rewrite(
        self,
        pool: ThreadPoolExecutor,
        wave: Sequence[TierRun],
        decoded: Decoded,
        report: JanitorReport,
        done: int,
        total: int,
    ) -> int:
        """Rewrite a wave's runs in the pool and swap each as soon as it is PUT.

        Returns the runs done so far (for progress). Raises the first run's error once
        every other run of the wave is swapped.
        """
        futures: dict[Future[_Written], TierRun] = {
            pool.submit(self._encode_and_put, run, decoded): run for run in wave
        }
        error: Exception | None = None
        try:
            for fut in as_completed(futures):
                run = futures[fut]
                try:
                    written = fut.result()
                except (_Stopped, _Nothing):
                    continue
                except Exception as exc:
                    # Its PUT, if any, is an orphan for GC; the other runs go on.
                    log.warning(
                        "%s/%d: tiering offsets %d-%d failed: %s",
                        run.part.topic,
                        run.part.partition,
                        run.rows[0].base_offset,
                        run.rows[-1].end_offset - 1,
                        exc,
                    )
                    error = error or exc
                    continue
                try:
                    self._swap(run.part, run.rows, [written], report)
                except BaseException:
                    self._stopping.set()
                    raise
                done += 1
                self.ctx.report_progress(done, total, f"{run.part.topic}/{run.part.partition}")
        finally:
            for fut in futures:
                fut.cancel()  # the lease is lost or a swap failed: start no more rewrites
        if error is not None:
            raise error
        return done

    # -- compaction -----------------------------------------------------------------
    def compact_partition(self, part: PartitionState, report: JanitorReport) -> None:
        """Compact one partition's tiered head (see the module docstring)."""
        head: list[IndexRow] = []
        for r in self.ctx.catalog.rows(part.topic_id, part.partition):
            if r.end_offset <= part.log_start:
                continue
            if r.kind != "parquet":
                break  # an untiered chunk: what follows it waits for tiering
            head.append(r)
        if not head:
            return
        now_ms = int(self.ctx.now() * 1000)
        first_seen_horizon = now_ms + int(effective_configs(part.configs)["delete.retention.ms"])
        records: list[ConsumedRecord] = []
        # The delete horizon of every tombstone: from its object, else (never seen by a
        # compaction) delete.retention.ms from now.
        horizons: dict[int, int] = {}
        unseen = False
        for r in head:
            self.ctx.check()
            data = self.ctx.store.get(r.object_key)
            report.bytes_read += len(data)
            reader = TierReader(data)
            for x in reader.records(max(r.base_offset, part.log_start)):
                if x.offset >= r.end_offset:
                    break
                records.append(x)
                if x.value is None and x.key is not None:
                    seen = reader.delete_horizon(x.offset)
                    unseen = unseen or seen is None
                    horizons[x.offset] = first_seen_horizon if seen is None else seen
        if not records:
            return
        latest = {x.key: x.offset for x in records if x.key is not None}

        def keep(x: ConsumedRecord) -> bool:
            if x.key is None:
                return True
            if latest[x.key] != x.offset:
                return False
            return x.value is not None or now_ms < horizons[x.offset]

        # Never nothing: the replacement's entries must cover the head's offsets.
        kept = [x for x in records if keep(x)] or records[-1:]
        if len(kept) == len(records) and not unseen:
            return  # nothing to drop or to stamp; leave its objects alone
        report.records_dropped += len(records) - len(kept)
        written = self._write_compacted(part, head, kept, horizons)
        report.rows_dropped += max(0, len(head) - len(written))
        self._swap(part, head, written, report)

    def _write_compacted(
        self,
        part: PartitionState,
        run: list[IndexRow],
        kept: list[ConsumedRecord],
        horizons: dict[int, int],
    ) -> list[_Written]:
        """Tier objects for a run's kept records, with the delete horizons of their
        tombstones; their spans tile the run's span."""
        chunks: list[list[ConsumedRecord]] = []
        size = 0
        for x in kept:
            n = len(x.key or b"") + len(x.value or b"") + 24
            if not chunks or size + n > self.config.tier_target_bytes:
                chunks.append([])
                size = 0
            chunks[-1].append(x)
            size += n
        out: list[_Written] = []
        for i, chunk in enumerate(chunks):
            start = run[0].base_offset if i == 0 else chunk[0].offset
            end = chunks[i + 1][0].offset if i + 1 < len(chunks) else run[-1].end_offset
            key, data, put_at = self._put(part, chunk, _horizon_ranges(chunk, horizons))
            new = NewRow(
                key,
                len(data),
                start,
                end - start,
                min(x.timestamp_ms for x in chunk),
                max(x.timestamp_ms for x in chunk),
            )
            out.append(_Written(new, put_at))
        return out


def _horizon_ranges(
    records: Sequence[ConsumedRecord], horizons: dict[int, int]
) -> list[tuple[int, int]]:
    """The ``delete_horizons`` of a tier object holding ``records``: a new range at each
    tombstone whose horizon differs from the previous tombstone's."""
    out: list[tuple[int, int]] = []
    for x in records:
        horizon = horizons.get(x.offset)
        if horizon is not None and (not out or out[-1][1] != horizon):
            out.append((x.offset, horizon))
    return out


def _partitions(ctx: JanitorContext, topic: str | None) -> list[PartitionState]:
    return ctx.catalog.partitions(topic)


def run_tiering(
    ctx: JanitorContext, config: JanitorConfig, topic: str | None = None
) -> JanitorReport:
    """Tier every partition (of ``topic``, if given): plan all, then fetch per object."""
    started = time.perf_counter()
    report = JanitorReport("tier")
    tierer = Tierer(ctx, config)
    runs: list[TierRun] = []
    for part in _partitions(ctx, topic):
        ctx.check()
        runs.extend(tierer.plan_partition(part))
        report.partitions += 1
    tierer.tier_runs(runs, report)
    report.seconds = time.perf_counter() - started
    return report


def is_compacted(configs: dict[str, str]) -> bool:
    policy = effective_configs(configs)["cleanup.policy"]
    return "compact" in [p.strip() for p in policy.split(",")]


def run_compaction(
    ctx: JanitorContext, config: JanitorConfig, topic: str | None = None
) -> JanitorReport:
    """Compact every partition of the compacted topics (or of ``topic``, if compacted)."""
    started = time.perf_counter()
    report = JanitorReport("compact")
    tierer = Tierer(ctx, config)
    parts = [p for p in _partitions(ctx, topic) if is_compacted(p.configs)]
    for i, part in enumerate(parts):
        ctx.check()
        tierer.compact_partition(part, report)
        report.partitions += 1
        ctx.report_progress(i + 1, len(parts), f"{part.topic}/{part.partition}")
    report.seconds = time.perf_counter() - started
    return report
