"""Run the janitors: once on demand, or in the background of a coordinator under leases.

``run_janitor`` runs one janitor once. ``JanitorRunner`` is a thread in the
coordinator process that, every ``tick_s``, tries to take the lease of each
enabled janitor that is due (cluster-wide: the lease row keeps the schedule, so
N coordinators do not run a janitor N times per interval), runs it while a
second thread renews the lease, records the run in ``janitor_runs``, and
releases the lease with the next due time. Runs stop at their next check when
the lease is lost.

On demand (``lakelog janitor NAME``, here or through a coordinator's
``/v1/janitors/{name}/run``): ``take_lease`` takes the janitor's lease whatever its
schedule (JanitorBusyError while another run holds it), ``run_lease`` runs it the
same way, with a progress callback, and raises what stopped it.
"""

from __future__ import annotations

import logging
import threading
import uuid

from prometheus_client import CollectorRegistry, Counter, Gauge

from coordinator import clock
from coordinator.janitors.context import (
    JANITORS,
    JanitorConfig,
    JanitorContext,
    JanitorReport,
    Progress,
)
from coordinator.janitors.gc import run_gc
from coordinator.janitors.leases import Lease, LeaseLostError, LeaseStore, Renewer
from coordinator.janitors.retention import run_retention
from coordinator.janitors.tables import publish_after, run_tables
from coordinator.janitors.tiering import run_compaction, run_tiering
from coordinator.local import LocalCoordinator
from segments.errors import JanitorBusyError
from segments.store import ObjectStore

log = logging.getLogger(__name__)


def run_janitor(
    name: str, ctx: JanitorContext, config: JanitorConfig, topic: str | None = None
) -> JanitorReport:
    """Run janitor ``name`` once over every partition (or ``topic``'s). Tiering, compaction
    and retention publish the topic tables they changed before they end.

    Raises:
        ValueError: an unknown janitor name.
        LeaseLostError: ``ctx.check`` found the lease lost (the run stopped part way).
    """
    if name == "tier":
        return publish_after(ctx, run_tiering(ctx, config, topic), topic)
    if name == "compact":
        return publish_after(ctx, run_compaction(ctx, config, topic), topic)
    if name == "retention":
        return publish_after(ctx, run_retention(ctx, topic), topic)
    if name == "gc":
        return run_gc(ctx, config.gc_grace_s)
    if name == "table":
        return run_tables(ctx, config, topic)
    raise ValueError(f"unknown janitor {name!r}; expected one of {list(JANITORS)}")


class JanitorMetrics:
    """Per-janitor Prometheus metrics on a given registry (the coordinator's /metrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = Counter(
            "lakelog_janitor_runs",
            "Janitor runs by this coordinator, by janitor and outcome (ok, error, lost).",
            ["janitor", "outcome"],
            registry=registry,
        )
        self.bytes_rewritten = Counter(
            "lakelog_janitor_bytes_rewritten",
            "Bytes of tier objects written by tiering and compaction.",
            ["janitor"],
            registry=registry,
        )
        self.objects_written = Counter(
            "lakelog_janitor_objects_written",
            "Tier objects swapped into the index.",
            ["janitor"],
            registry=registry,
        )
        self.objects_deleted = Counter(
            "lakelog_janitor_objects_deleted",
            "Objects deleted by garbage collection (unreferenced and orphans).",
            ["janitor"],
            registry=registry,
        )
        self.aborted = Counter(
            "lakelog_janitor_swaps_aborted",
            "Index swaps refused because the entries changed meanwhile.",
            ["janitor"],
            registry=registry,
        )
        self.lag = Gauge(
            "lakelog_janitor_lag_seconds",
            "Seconds since the janitor last finished a run anywhere in the cluster.",
            ["janitor"],
            registry=registry,
        )
        self.pending_gc = Gauge(
            "lakelog_janitor_unreferenced_objects",
            "Objects no index entry references, waiting for their grace period.",
            registry=registry,
        )

    def observe(self, report: JanitorReport, outcome: str) -> None:
        name = report.janitor
        self.runs.labels(name, outcome).inc()
        self.bytes_rewritten.labels(name).inc(report.bytes_rewritten)
        self.objects_written.labels(name).inc(report.objects_written)
        self.objects_deleted.labels(name).inc(report.objects_deleted + report.orphans_deleted)
        self.aborted.labels(name).inc(report.aborted)


class JanitorRunner:
    """The background janitors of one coordinator process (see the module docstring)."""

    def __init__(
        self,
        coordinator: LocalCoordinator,
        store: ObjectStore,
        config: JanitorConfig,
        *,
        metrics: JanitorMetrics | None = None,
        holder: str | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.holder = holder or f"coordinator-{uuid.uuid4().hex[:12]}"
        self.leases = LeaseStore(coordinator.db, ttl_s=config.lease_ttl_s)
        self.catalog = coordinator.janitor_catalog()
        self._coordinator = coordinator
        self._store = store
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lakelog-janitors", daemon=True)

    def start(self) -> None:
        if self.config.enabled:
            log.info("janitors %s enabled (holder %s)", sorted(self.config.enabled), self.holder)
            self._thread.start()

    def stop(self) -> None:
        """Stop after the current run (or its current unit of work)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for name in JANITORS:
                if name in self.config.enabled and not self._stop.is_set():
                    try:
                        self.tick(name)
                    except Exception:
                        log.exception("janitor %s: scheduling failed", name)
            self._update_lag()
            self._stop.wait(self.config.tick_s)

    def tick(self, name: str) -> JanitorReport | None:
        """Run janitor ``name`` if it is due and its lease is free; None if not run."""
        lease = self.leases.acquire(name, self.holder, scheduled=True)
        if lease is None:
            return None
        return self.run_under(lease)

    def run_under(self, lease: Lease) -> JanitorReport:
        """Run the lease's janitor, record the run, release the lease with the next due time."""
        report, _ = self._run(lease, self.config, None, None)
        return report

    def take_lease(self, name: str) -> Lease:
        """The lease of janitor ``name`` for a run now, whatever its schedule.

        Raises:
            ValueError: an unknown janitor.
            JanitorBusyError: another run (scheduled or not, any process) holds it.
        """
        if name not in JANITORS:
            raise ValueError(f"unknown janitor {name!r}; expected one of {', '.join(JANITORS)}")
        # A holder of its own: the background thread of this process must not re-enter it.
        holder = f"{self.holder}-now-{uuid.uuid4().hex[:8]}"
        lease = self.leases.acquire(name, holder, scheduled=False)
        if lease is None:
            raise JanitorBusyError(f"janitor {name} is running in another process; try again later")
        return lease

    def run_lease(
        self,
        lease: Lease,
        config: JanitorConfig | None = None,
        topic: str | None = None,
        progress: Progress | None = None,
    ) -> JanitorReport:
        """Run a lease from ``take_lease`` now (recorded and released as scheduled runs are).

        Raises:
            LeaseLostError: the lease was lost part way; whatever the janitor raised.
        """
        report, error = self._run(lease, config or self.config, topic, progress)
        if error is not None:
            raise error
        return report

    def _run(
        self,
        lease: Lease,
        config: JanitorConfig,
        topic: str | None,
        progress: Progress | None,
    ) -> tuple[JanitorReport, Exception | None]:
        name = lease.name

        def check() -> None:
            if self._stop.is_set():
                raise LeaseLostError("coordinator stopping")
            lease.check()

        ctx = JanitorContext(
            self.catalog, self._coordinator.store, self._store, clock.now, check, progress
        )
        run_id = self.leases.start_run(lease)
        report = JanitorReport(name)
        outcome = "error"
        failure: Exception | None = None
        try:
            with Renewer(lease, config.lease_ttl_s / 3):
                report = run_janitor(name, ctx, config, topic)
            outcome = "ok"
        except LeaseLostError as e:
            outcome, failure = "lost", e
            log.warning("janitor %s stopped: %s", name, e)
        except Exception as e:
            failure = e
            log.exception("janitor %s failed", name)
        finally:
            self.leases.finish_run(run_id, outcome, report.as_dict())
            self.leases.release(lease, clock.now() + config.interval_s(name))
        if self.metrics is not None:
            self.metrics.observe(report, outcome)
        # An idle run is routine (every minute or so, per janitor): INFO only for work done.
        level = logging.INFO if outcome != "ok" or report.did_work() else logging.DEBUG
        log.log(level, "janitor %s: %s %s", name, outcome, report.as_dict())
        return report, failure

    def _update_lag(self) -> None:
        if self.metrics is None:
            return
        try:
            now = clock.now()
            for info in self.leases.leases():
                if info.last_finished_at is not None:
                    self.metrics.lag.labels(info.name).set(now - info.last_finished_at)
            self.metrics.pending_gc.set(self.catalog.pending_deletion())
        except Exception:
            log.debug("janitor lag update failed", exc_info=True)
