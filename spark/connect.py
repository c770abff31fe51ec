"""Reaching the log from Spark: the coordinator client and the object store.

The planner (Spark's driver side) opens the coordinator the options name and resolves
the store location once: the ``store`` option if given, else what the coordinator
says (``store_location``: URL, endpoint, region; credentials come from the standard AWS
chain of whichever process reads). The resolved :class:`StoreLocation` travels to the
executors inside each task, so executors never ask for it again.

No pyspark here.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from coordinator.client import Coordinator, StoreLocation
from coordinator.security.model import basic
from segments.store import ObjectStore, open_store
from spark.options import Connection

__all__ = ["get_store", "open_coordinator", "opened", "resolve_store"]


def open_coordinator(conn: Connection) -> Coordinator:
    """The coordinator client the options name (``coordinator`` URL or ``db``).

    Raises:
        ValueError: ``db`` names a SQLite file that does not exist.
    """
    if conn.coordinator is not None:
        from coordinator.http.client import http_coordinator

        # The job is its user at the coordinator (never the agents' shared secret).
        auth = {}
        if conn.user is not None and conn.password is not None:
            auth = {"authorization": basic(conn.user, conn.password)}
        return http_coordinator(
            [u.strip() for u in conn.coordinator.split(",") if u.strip()],
            headers=auth,
            verify=ssl.create_default_context(cafile=conn.coordinator_cafile)
            if conn.coordinator_cafile
            else True,
        )
    from coordinator.db import parse_sqlite_url
    from coordinator.local import LocalCoordinator

    assert conn.db is not None
    if conn.db.startswith("sqlite:"):
        path = parse_sqlite_url(conn.db)
        # Opening a missing file would create an empty database: say what is wrong instead.
        if not Path(path).is_file():
            raise ValueError(f"db: no coordinator database at {path} (from {conn.db!r})")
    return LocalCoordinator(conn.db)


@contextmanager
def opened(conn: Connection) -> Iterator[Coordinator]:
    """``open_coordinator``, closed on exit."""
    coordinator = open_coordinator(conn)
    try:
        yield coordinator
    finally:
        close = getattr(coordinator, "close", None)
        if close is not None:
            close()


def resolve_store(conn: Connection, coordinator: Coordinator) -> StoreLocation:
    """Where the objects are: the ``store`` option, else the coordinator's ``store_location``.

    ``store.endpoint`` and ``store.region`` override the coordinator's (an executor may
    reach the bucket at another address than the coordinator does).

    Raises:
        ValueError: no ``store`` option and the coordinator has no store to tell.
    """
    if conn.store is not None:
        return StoreLocation(conn.store, conn.store_endpoint, conn.store_region)
    ask = getattr(coordinator, "store_location", None)
    told = ask() if ask is not None else None
    if told is None:
        raise ValueError(
            f"the coordinator at {conn.coordinator} was started without --store, so it "
            "cannot tell where the objects are: pass the option 'store'"
        )
    return StoreLocation(
        told.url, conn.store_endpoint or told.endpoint, conn.store_region or told.region
    )


_stores: dict[StoreLocation, ObjectStore] = {}
_stores_lock = threading.Lock()


def get_store(location: StoreLocation) -> ObjectStore:
    """One store per location per process: Python workers run many tasks."""
    with _stores_lock:
        store = _stores.get(location)
        if store is None:
            store = _stores[location] = open_store(
                location.url, endpoint_url=location.endpoint, region=location.region
            )
        return store
