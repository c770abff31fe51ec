"""The nemesis's faults beyond S3 and signals: PostgreSQL, a shard down, clock skew,
janitors run at a bad moment; and how quiescence undoes each.

- ``pg_kill``: every backend of the run's databases (or one of them) terminated
  (``pg_terminate_backend``) from an admin connection to another database: the
  coordinators' pools find dead connections and reconnect.
- ``pg_refuse``: one of the run's databases refuses new connections (``ALTER DATABASE
  .. WITH ALLOW_CONNECTIONS false``, then its backends terminated) for a few seconds,
  then accepts them again. ``shard_down`` (profile sharded): the same, 5-20 s, on one
  shard database: the partitions it holds cannot commit or be read meanwhile; those of
  the other shard go on. Only the run's own databases are ever touched, never the
  server's configuration.
- ``clock_skew``: a coordinator restarted with ``LAKELOG_CLOCK_SKEW_MS`` (see
  ``coordinator.clock``, which also says what skew lakelog tolerates and why: one
  coordinator at a time, 1-3 s either way, is within it), later restarted at 0.
- ``janitor_now``: janitors run at once on a coordinator (``POST /v1/janitors/{name}/
  run``, the operator's trigger; tiering with tier age 0 now and then, so chunks
  committed a moment ago are rewritten while readers read them), preferably while the
  admin thread is deleting and recreating a topic or adding partitions, over the
  producers' steady commits and the consumers' rebalances.

Each fault is written to the history as a ``fault`` info before it is applied
(``kind`` as above), so the checker's summary counts it. ``Faults.undo`` (from
``Run.quiesce``) allows every database again and restarts every skewed coordinator at 0.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import httpx
import orjson

from tests.chaos.history import History
from tests.integration.topology import COORDINATOR_SECRET, Service, Topology

SKEW = "LAKELOG_CLOCK_SKEW_MS"
#: Janitors the nemesis may run at once (``table`` publishes Iceberg snapshots: slow,
#: and reaches nothing the log model checks).
JANITORS = ("tier", "retention", "compact", "gc")

_KILL = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = ANY(%s) AND pid <> pg_backend_pid()"
)


def db_names(topo: Topology) -> tuple[str, list[str]]:
    """(the catalog or only database, the shard databases) of a PostgreSQL topology."""
    env = topo.coordinators[0].environment
    shards = [u for u in env.get("LAKELOG_DB_SHARDS", "").split(",") if u]
    return _name(env["LAKELOG_DB"]), [_name(u) for u in shards]


def _name(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


class PgFaults:
    """Faults of the run's PostgreSQL databases, through an admin connection."""

    def __init__(self, admin_url: str, catalog: str, shards: list[str]) -> None:
        self.admin_url = admin_url
        self.catalog = catalog
        self.shards = shards
        self.refused: set[str] = set()
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return [self.catalog, *self.shards]

    def _admin(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(sql, params).fetchone() if params else conn.execute(sql)
            return row

    def kill(self, names: list[str]) -> int:
        """Terminate every backend of ``names`` (ours only); how many were."""
        assert set(names) <= set(self.names), names
        row = self._admin(_KILL, (names,))
        return int(row[0])

    def refuse(self, name: str) -> int:
        """``name`` refuses new connections and loses those it has; how many it had."""
        assert name in self.names, name
        with self._lock:
            self.refused.add(name)
        self._admin(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        return self.kill([name])

    def allow(self, name: str) -> None:
        self._admin(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        with self._lock:
            self.refused.discard(name)

    def allow_all(self) -> None:
        for name in self.names:  # a refuse whose answer was lost counts too
            self.allow(name)


class Faults:
    """The nemesis's new fault kinds over one topology (``kinds`` says which fit)."""

    def __init__(self, topo: Topology, hist: History, stop: threading.Event, profile: str):
        self.topo = topo
        self.hist = hist
        self.stop = stop
        self.profile = profile
        self.pg: PgFaults | None = None
        if profile != "sqlite":
            from tests.conftest import PG_ADMIN_URL

            catalog, shards = db_names(topo)
            self.pg = PgFaults(PG_ADMIN_URL, catalog, shards)

    def kinds(self) -> list[str]:
        """The fault kinds of this profile, each once (the nemesis weighs them)."""
        kinds = ["clock_skew", "janitor_now"]
        if self.pg is not None:
            kinds += ["pg_kill", "pg_refuse"]
            if self.pg.shards:
                kinds.append("shard_down")
        return kinds

    def inject(self, proc: str, kind: str, rng: random.Random, busy: threading.Lock) -> None:
        """One fault of ``kind``, held for its time (``busy``: held while the admin
        thread recreates a topic or adds partitions; ``janitor_now`` waits for it)."""
        getattr(self, kind)(proc, rng, busy)

    def pg_kill(self, proc: str, rng: random.Random, busy: threading.Lock) -> None:
        assert self.pg is not None
        names = rng.choice([self.pg.names, [rng.choice(self.pg.names)]])
        self.hist.info(proc, "fault", kind="pg_kill", databases=names)
        killed = self.pg.kill(names)
        self.hist.info(proc, "fault_done", kind="pg_kill", backends=killed)

    def pg_refuse(self, proc: str, rng: random.Random, busy: threading.Lock) -> None:
        assert self.pg is not None
        self._refuse(proc, "pg_refuse", rng.choice(self.pg.names), rng.uniform(1, 5))

    def shard_down(self, proc: str, rng: random.Random, busy: threading.Lock) -> None:
        assert self.pg is not None and self.pg.shards
        self._refuse(proc, "shard_down", rng.choice(self.pg.shards), rng.uniform(5, 20))

    def _refuse(self, proc: str, kind: str, name: str, seconds: float) -> None:
        assert self.pg is not None
        self.hist.info(proc, "fault", kind=kind, database=name, seconds=round(seconds, 2))
        try:
            killed = self.pg.refuse(name)
            self.hist.info(proc, "fault_done", kind=kind, backends=killed)
            self.stop.wait(seconds)
        finally:
            self.pg.allow(name)

    def clock_skew(self, proc: str, rng: random.Random, busy: threading.Lock) -> None:
        svc = rng.choice(self.topo.coordinators)
        ms = rng.choice([-1, 1]) * rng.randint(1000, 3000)
        seconds = rng.uniform(5, 15)
        self.hist.info(
            proc, "fault", kind="clock_skew", target=svc.name, ms=ms, seconds=round(seconds, 2)
        )
        try:
            set_skew(svc, ms)
            self.stop.wait(seconds)
        finally:
            set_skew(svc, 0)

    def janitor_now(self, proc: str, rng: random.Random, busy: threading.Lock) -> None:
        deadline = time.monotonic() + 8
        while not busy.locked() and time.monotonic() < deadline and not self.stop.is_set():
            time.sleep(0.05)
        names = rng.sample(JANITORS, rng.randint(1, len(JANITORS)))
        svc = rng.choice([c for c in self.topo.coordinators if c.alive] or self.topo.coordinators)
        body: dict[str, Any] = {"tier_age_s": 0} if rng.random() < 0.5 else {}
        self.hist.info(
            proc,
            "fault",
            kind="janitor_now",
            target=svc.name,
            janitors=names,
            during_admin=busy.locked(),
            body=body,
        )
        outcomes = {}
        for name in names:
            if self.stop.is_set():
                break
            outcomes[name] = run_janitor(svc.url, name, body if name == "tier" else {}, self.stop)
        self.hist.info(proc, "fault_done", kind="janitor_now", outcomes=outcomes)

    def undo(self) -> None:
        """Every database accepting connections, every coordinator at skew 0 and running."""
        if self.pg is not None:
            self.pg.allow_all()
        for svc in self.topo.coordinators:
            if svc.environment.get(SKEW, "0") != "0":
                set_skew(svc, 0)


def set_skew(svc: Service, ms: int) -> None:
    """Restart coordinator ``svc`` with its clock ``ms`` off (0: the host's)."""
    svc.environment[SKEW] = str(ms)
    svc.restart()


def run_janitor(
    url: str, name: str, body: dict[str, Any], stop: threading.Event, timeout: float = 60
) -> str:
    """Run janitor ``name`` now on the coordinator at ``url``; its outcome in a word
    (``ok``, ``busy``: another run holds its lease, ``error:<name>``, ``http:<status>``,
    ``transport:<exception>``, ``left``: the run stopped first; the janitor goes on)."""
    headers = {"authorization": f"Bearer {COORDINATOR_SECRET}"}
    try:
        with (
            httpx.Client(timeout=timeout, headers=headers) as c,
            c.stream("POST", f"{url}/v1/janitors/{name}/run", json=body) as r,
        ):
            if r.status_code == 503:
                return "busy"
            if r.status_code != 200:
                return f"http:{r.status_code}"
            last = ""
            for line in r.iter_lines():
                if stop.is_set():
                    return "left"
                if line.strip():
                    last = line
        event = orjson.loads(last) if last else {}
        return "ok" if "report" in event else f"error:{event.get('error', 'none')}"
    except httpx.HTTPError as e:
        return f"transport:{type(e).__name__}"
