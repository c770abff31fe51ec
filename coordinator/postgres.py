"""The coordinator's metadata database on PostgreSQL, through psycopg 3 and a connection pool.

Same schema, migrations and SQL as SQLite (see ``coordinator.db``); what
differs is how writers are serialised:

- A commit, or a group of concurrent ones (``coordinator.log.group_commit``), is ONE
  statement outside any explicit transaction (``autocommit()``; a statement is its
  own transaction, one round trip in all) under READ COMMITTED. (Commits carrying
  idempotent producers' batches run a few statements in one transaction, with the
  same locks.) It locks only the partition rows it advances, with
  ``SELECT ... ORDER BY topic_id, partition FOR UPDATE`` (the rows are locked as
  they leave the sort, so in that order). Two commits touching common
  partitions lock them in the same order, so they queue instead of
  deadlocking, and commits to disjoint partitions run in parallel. The UPDATE
  re-reads each row's latest committed high watermark once it holds the lock,
  so offsets stay contiguous across any number of coordinator processes.
- Every other write (topics, agents, consumer groups, janitors) is a
  read-modify-write over several rows, which SQLite makes safe with its
  database-wide write lock. Here it takes one transaction-scoped advisory lock
  (``pg_advisory_xact_lock``) first, with the same effect for those writers.
  Commits never take it, so an exclusive writer waiting for a partition row
  can never be waited on by a commit: no cycle, no deadlock.
- Migrations hold the same advisory lock, so coordinators starting at once
  apply each migration exactly once.

The lock key is derived from the schema the connection works in
(``current_schema()``), so several clusters can share one database in
separate schemas (``?options=-csearch_path%3Dname`` in the URL).

Failures that a retry can cure (connection lost, server shutting down,
serialization failure, deadlock detected, no connection within the pool
timeout) become :class:`CoordinatorUnavailableError`. After a server restart
the first failing call makes the pool check its idle connections and replace
the dead ones, so later calls succeed with no manual step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from coordinator.db import MIGRATIONS, POSTGRESQL, Migration, migrate
from segments.errors import CoordinatorUnavailableError

#: First half of the advisory lock key: "lakelog" in ASCII, folded into 31 bits.
_LOCK_CLASS = 0x6C616B65

# Errors a retry may cure. OperationalError covers connection failures, AdminShutdown
# (57P01), SerializationFailure (40001), DeadlockDetected (40P01), LockNotAvailable
# and QueryCanceled (a statement timeout); InterfaceError is a connection closed under us.
_RETRIABLE = (psycopg.OperationalError, psycopg.InterfaceError)


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    with suppress(Exception):
        info = psycopg.conninfo.conninfo_to_dict(url)
        host, port, dbname = info.get("host", ""), info.get("port", ""), info.get("dbname", "")
        return f"postgresql://{info.get('user', '')}@{host}:{port}/{dbname}"
    return "postgresql://..."


class PgConnection:
    """The slice of ``sqlite3.Connection`` the stores use, over one psycopg connection.

    Placeholders must already be in PostgreSQL style (``Dialect.sql`` does that).
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(
        self, sql: str, params: Sequence[Any] | None = None, *, prepare: bool | None = None
    ) -> psycopg.Cursor[Any]:
        """Run one statement; the cursor has ``fetchone``/``fetchall`` and iterates rows.

        ``prepare``: psycopg's (None: prepared after a few runs; False: planned each run).
        """
        return self._conn.execute(sql, params, prepare=prepare)

    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        """Run one statement per parameter row (pipelined: one round trip)."""
        rows = list(params)
        if rows:
            with self._conn.cursor() as cur:
                cur.executemany(sql, rows)

    def fetch_each(self, sql: str, params: Sequence[Sequence[Any]]) -> list[Any]:
        """Run ``sql`` once per parameter row, in order, pipelined (one round trip).

        Returns:
            Each statement's first result row, or None where it returned none.
        """
        rows = list(params)
        if len(rows) <= 1:  # a pipeline costs more than it saves for one statement
            return [self._conn.execute(sql, row).fetchone() for row in rows]
        out: list[Any] = []
        with self._conn.cursor() as cur:
            cur.executemany(sql, rows, returning=True)
            while True:
                out.append(cur.fetchone())
                if not cur.nextset():
                    break
        return out

    def rollback(self) -> None:
        """End the current transaction, if any, discarding its changes."""
        if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self._conn.execute("ROLLBACK")


class PostgresDatabase:
    """A PostgreSQL metadata database behind a psycopg connection pool.

    Thread-safe; any number of processes may open the same database.
    """

    dialect = POSTGRESQL

    def __init__(
        self,
        url: str,
        *,
        min_connections: int = 1,
        max_connections: int = 8,
        timeout_s: float = 5.0,
        migrations: Sequence[Migration] = MIGRATIONS,
    ) -> None:
        """Connect, then apply missing migrations under the advisory lock.

        Args:
            url: ``postgresql://user@host:port/dbname`` (libpq URL; query parameters
                such as ``options=-csearch_path%3Dx`` are passed through).
            min_connections, max_connections: pool bounds.
            timeout_s: how long a call waits for a connection (and a connection
                attempt for the server) before it reports the database unavailable.

        Raises:
            CoordinatorUnavailableError: the server cannot be reached.
        """
        self.url = url
        self.location = redact(url)
        self._timeout_s = timeout_s
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url,
            kwargs={"autocommit": True, "connect_timeout": max(1, round(timeout_s))},
            min_size=min_connections,
            max_size=max_connections,
            timeout=timeout_s,
            # Keep trying through a long outage; each call still fails after timeout_s.
            reconnect_timeout=24 * 3600.0,
            name="lakelog-metadata",
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=timeout_s)
            with self._pool.connection(timeout=timeout_s) as raw:
                row = raw.execute("SELECT current_schema(), hashtext(current_schema())").fetchone()
                if row is None or row[0] is None:
                    raise CoordinatorUnavailableError(
                        f"{self.location}: no schema to work in (the search_path names none "
                        "that exists); create it first"
                    )
                self.schema: str = row[0]
                self._lock_sql = f"SELECT pg_advisory_xact_lock({_LOCK_CLASS}, {int(row[1])})"
                migrate(PgConnection(raw), self.dialect, migrations, lock=self._lock_sql)
        except (*_RETRIABLE, PoolTimeout) as e:
            self._pool.close()
            raise CoordinatorUnavailableError(
                f"cannot open metadata database {self.location}: {e}"
            ) from e
        except BaseException:
            self._pool.close()
            raise

    @contextmanager
    def _transaction(self, begin: str | None, lock: bool) -> Iterator[PgConnection]:
        try:
            with self._pool.connection(timeout=self._timeout_s) as raw:
                conn = PgConnection(raw)
                try:
                    if begin is not None:
                        # One round trip: BEGIN and the lock as one simple-protocol query.
                        raw.execute(f"{begin}; {self._lock_sql}" if lock else begin)
                    yield conn
                    if begin is not None:
                        raw.execute("COMMIT")
                except BaseException:
                    if not raw.broken and not raw.closed:
                        with suppress(psycopg.Error):
                            conn.rollback()
                    if raw.broken or raw.closed:
                        self._drop_dead_connections()
                    raise
        except PoolTimeout as e:
            raise CoordinatorUnavailableError(
                f"metadata database {self.location} unavailable: {e}"
            ) from e
        except PoolClosed as e:
            raise RuntimeError("the metadata database is closed") from e
        except _RETRIABLE as e:
            raise CoordinatorUnavailableError(
                f"metadata database {self.location} failed: {type(e).__name__}: {e}"
            ) from e

    def _drop_dead_connections(self) -> None:
        # After a server restart every idle connection is dead; checking them now (one
        # round trip each) spares the next callers one failure per dead connection.
        with suppress(Exception):
            self._pool.check()

    @contextmanager
    def read(self) -> Iterator[PgConnection]:
        """A read-only transaction on one snapshot (REPEATABLE READ).

        Raises:
            CoordinatorUnavailableError: the server is unreachable or failed.
        """
        with self._transaction(self.dialect.begin_read, lock=False) as conn:
            yield conn

    @contextmanager
    def write(self, *, exclusive: bool = True) -> Iterator[PgConnection]:
        """A write transaction (READ COMMITTED); commits unless the body raises.

        Args:
            exclusive: hold the database-wide writer lock (see the module docstring).
                Pass False only when the transaction locks every row it
                read-modify-writes itself, in a fixed order (commits).

        Raises:
            CoordinatorUnavailableError: the server is unreachable or failed, or the
                transaction was chosen as a deadlock or serialization victim.
        """
        with self._transaction(self.dialect.begin_write, lock=exclusive) as conn:
            yield conn

    @contextmanager
    def autocommit(self) -> Iterator[PgConnection]:
        """A connection outside any transaction: each statement is its own transaction.

        For writes that fit in ONE statement (commits: see ``MetadataStore.commit``);
        the statement and its commit cost one round trip, against three for BEGIN,
        the statement and COMMIT. The statement must lock what it read-modify-writes
        itself, in a fixed order, as ``write(exclusive=False)`` transactions do.

        Raises:
            CoordinatorUnavailableError: the server is unreachable or failed, or the
                statement was chosen as a deadlock or serialization victim.
        """
        with self._transaction(None, lock=False) as conn:
            yield conn

    def close(self) -> None:
        """Close the pool; later calls raise RuntimeError. Idempotent."""
        self._pool.close()
