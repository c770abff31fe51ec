"""Janitor leases: at most one coordinator runs a given janitor at a time.

One row per janitor in ``janitor_leases``. Every change is ONE conditional
statement, so two coordinators on one database cannot both win, whatever the
interleaving, on SQLite (the write lock serialises) and PostgreSQL alike (an
``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` locks the row and re-checks the
condition; an ``UPDATE ... WHERE`` re-evaluates it on the locked row)::

    acquire   upsert, taking the row only if its lease has expired (or we hold it)
              and, for a scheduled run, the janitor is due; the token grows on
              every change of holder
    renew     push expires_at on, only while we hold an unexpired lease
    release   expire now and set when the janitor is next due

A holder that stalls past ``expires_at`` loses the lease; its renewals fail from
then on and the running janitor stops at its next check (``Lease.check``).
Clocks: lease times are the coordinators' wall clocks, so they must agree to well
within the lease TTL (NTP does that); the TTL defaults to a minute.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from coordinator import clock
from coordinator.db import MetadataDatabase

_ACQUIRE = (
    "INSERT INTO janitor_leases (name, holder, token, acquired_at, expires_at, next_due_at) "
    "VALUES (?, ?, 1, ?, ?, 0) "
    "ON CONFLICT (name) DO UPDATE SET "
    "token = CASE WHEN janitor_leases.holder = excluded.holder "
    "THEN janitor_leases.token ELSE janitor_leases.token + 1 END, "
    "holder = excluded.holder, acquired_at = excluded.acquired_at, "
    "expires_at = excluded.expires_at "
    "WHERE (janitor_leases.expires_at <= ? OR janitor_leases.holder = excluded.holder) "
    "AND janitor_leases.next_due_at <= ? "
    "RETURNING token"
)
_RENEW = (
    "UPDATE janitor_leases SET expires_at = ? "
    "WHERE name = ? AND holder = ? AND token = ? AND expires_at >= ? RETURNING expires_at"
)
_RELEASE = (
    "UPDATE janitor_leases SET expires_at = ?, next_due_at = ?, last_finished_at = ? "
    "WHERE name = ? AND holder = ? AND token = ?"
)
_LEASES = (
    "SELECT name, holder, token, acquired_at, expires_at, next_due_at, last_finished_at "
    "FROM janitor_leases ORDER BY name"
)
_RUN_START = (
    "INSERT INTO janitor_runs (janitor, holder, token, started_at) VALUES (?, ?, ?, ?) "
    "RETURNING run_id"
)
_RUN_END = "UPDATE janitor_runs SET finished_at = ?, outcome = ?, summary = ? WHERE run_id = ?"
_RUNS = (
    "SELECT run_id, janitor, holder, token, started_at, finished_at, outcome, summary "
    "FROM janitor_runs ORDER BY run_id"
)


class LeaseLostError(Exception):
    """This coordinator no longer holds the janitor's lease: the run stops.

    Internal to the janitors (never crosses an API), so not part of the error tree.
    """


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    name: str
    holder: str
    token: int
    acquired_at: float
    expires_at: float
    next_due_at: float
    last_finished_at: float | None


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: int
    janitor: str
    holder: str
    token: int
    started_at: float
    finished_at: float | None
    outcome: str | None
    summary: dict[str, object]


@dataclass(eq=False)
class Lease:
    """A held lease. ``check()`` raises LeaseLostError once it is lost or expired."""

    leases: LeaseStore
    name: str
    holder: str
    token: int
    expires_at: float
    lost: bool = field(default=False, init=False)

    def check(self) -> None:
        """Raises LeaseLostError if the lease is lost or past its expiry by our clock."""
        if self.lost or self.leases.now() >= self.expires_at:
            self.lost = True
            raise LeaseLostError(f"lease on janitor {self.name!r} lost by {self.holder}")

    def renew(self) -> bool:
        """Extend the lease by the TTL; False (and lost from now on) if it was lost."""
        if self.lost:
            return False
        expires = self.leases.renew(self.name, self.holder, self.token)
        if expires is None:
            self.lost = True
            return False
        self.expires_at = expires
        return True


class LeaseStore:
    """Acquire, renew and release janitor leases; record janitor runs.

    Args:
        db: the metadata database (shared by every coordinator).
        ttl_s: how long a lease lasts without renewal.
        now: the clock, epoch seconds.
    """

    def __init__(
        self, db: MetadataDatabase, *, ttl_s: float = 60.0, now: Callable[[], float] = clock.now
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be > 0, not {ttl_s}")
        self._db = db
        self._q = db.dialect.sql
        self.ttl_s = ttl_s
        self.now = now

    def acquire(self, name: str, holder: str, *, scheduled: bool = True) -> Lease | None:
        """Take the lease on janitor ``name`` for ``holder``, or None if someone holds it.

        With ``scheduled`` the janitor must also be due (its last holder released it
        with a next-due time); an on-demand run ignores the schedule, not the lease.
        """
        now = self.now()
        expires = now + self.ttl_s
        due_by = now if scheduled else 1e300  # any schedule
        with self._db.write() as conn:
            row = conn.execute(
                self._q(_ACQUIRE), (name, holder, now, expires, now, due_by)
            ).fetchone()
        if row is None:
            return None
        return Lease(self, name, holder, int(row[0]), expires)

    def renew(self, name: str, holder: str, token: int) -> float | None:
        """The new expiry, or None when ``holder`` no longer holds a live lease."""
        now = self.now()
        with self._db.write() as conn:
            row = conn.execute(
                self._q(_RENEW), (now + self.ttl_s, name, holder, token, now)
            ).fetchone()
        return None if row is None else float(row[0])

    def release(self, lease: Lease, next_due_at: float) -> None:
        """Give the lease up; nobody starts a scheduled run before ``next_due_at``."""
        now = self.now()
        with self._db.write() as conn:
            conn.execute(
                self._q(_RELEASE),
                (now, next_due_at, now, lease.name, lease.holder, lease.token),
            )
        lease.lost = True

    def leases(self) -> list[LeaseInfo]:
        with self._db.read() as conn:
            rows = conn.execute(self._q(_LEASES)).fetchall()
        return [LeaseInfo(*r) for r in rows]

    def start_run(self, lease: Lease) -> int:
        with self._db.write() as conn:
            row = conn.execute(
                self._q(_RUN_START), (lease.name, lease.holder, lease.token, self.now())
            ).fetchone()
        return int(row[0])

    def finish_run(self, run_id: int, outcome: str, summary: dict[str, object]) -> None:
        with self._db.write() as conn:
            conn.execute(
                self._q(_RUN_END), (self.now(), outcome, orjson.dumps(summary).decode(), run_id)
            )

    def runs(self) -> list[RunRecord]:
        with self._db.read() as conn:
            rows = conn.execute(self._q(_RUNS)).fetchall()
        return [
            RunRecord(r[0], r[1], r[2], r[3], r[4], r[5], r[6], orjson.loads(r[7])) for r in rows
        ]


class Renewer:
    """A thread renewing a lease every third of its TTL until stopped or lost."""

    def __init__(self, lease: Lease, interval_s: float) -> None:
        self._lease = lease
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"lease-{lease.name}", daemon=True)

    def __enter__(self) -> Renewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                if not self._lease.renew():
                    return
            except Exception:  # the database is down: the lease runs out by itself
                continue
