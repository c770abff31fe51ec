"""The ``lakelog`` command line.

Servers: ``lakelog serve`` (agent + in-process coordinator, SQLite and
``file://./data`` by default, on 127.0.0.1; it answers the coordinator API too, for
Spark jobs), ``lakelog agent`` (against coordinator processes),
``lakelog coordinator``; ``lakelog janitor NAME`` runs a janitor now, here or in a
coordinator. Every one of them reads the same ``LAKELOG_*`` variables and the same
optional TOML file (``--config``); their flags are settings of the same names and win
over both (``coordinator.settings``; ``lakelog settings`` lists them all). Clients over
the REST API, like Kafka's tools: ``lakelog topics create|list|describe|delete|
alter-config``, ``lakelog groups list|describe|reset-offsets|delete``
(kafka-consumer-groups), ``lakelog produce`` and ``lakelog consume`` (console producer
and consumer).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import re
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

# kio (the Kafka protocol's messages) registers a Hypothesis strategy for each of its
# types at import whenever Hypothesis can be imported, as in a development install, where
# the tests use it. No command here uses those strategies, and in a process started in a
# new directory they cost about 1 s and a 170 MiB peak (Hypothesis builds its character
# tables, and leaves a .hypothesis/ folder behind): so a command's process hides
# Hypothesis from kio. A process that imported it already (pytest) keeps it.
if "hypothesis" not in sys.modules:
    sys.modules["hypothesis"] = None  # type: ignore[assignment]

import httpx
import typer
from pydantic import ValidationError

from coordinator.settings import (
    ConfigFileError,
    CoordinatorSettings,
    JanitorCommandSettings,
    LakelogSettings,
    load,
)
from service.security.cli import acls_app, api_keys_app, users_app
from service.settings import Settings, settings_table

if TYPE_CHECKING:
    from coordinator.janitors.context import JanitorConfig, JanitorReport

S = TypeVar("S", bound=LakelogSettings)

app = typer.Typer(
    name="lakelog",
    help="A diskless Kafka-style log service: Confluent REST Proxy API on an object store.",
    no_args_is_help=True,
    add_completion=False,
)
topics_app = typer.Typer(help="Manage topics over the REST API (like kafka-topics).")
app.add_typer(topics_app, name="topics")
groups_app = typer.Typer(help="Consumer groups over the REST API (like kafka-consumer-groups).")
app.add_typer(groups_app, name="groups")
janitor_app = typer.Typer(
    help="Run a janitor now: in a running coordinator (--coordinator URL, under its lease) "
    "or here, against the metadata database and the object store."
)
app.add_typer(janitor_app, name="janitor")
app.add_typer(users_app, name="users")
app.add_typer(api_keys_app, name="api-keys")
app.add_typer(acls_app, name="acls")


def _print_version(value: bool) -> None:
    if value:
        from service.version import lakelog_version

        typer.echo(f"lakelog {lakelog_version()}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """A diskless Kafka-style log service: Confluent REST Proxy API on an object store."""


# -- shared options: each is a setting of the same name (None: not given) ----------------

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="LAKELOG_CONFIG",
        help="TOML settings file: top-level keys for every process, a table per process "
        "(serve, agent, coordinator, janitor) for one; LAKELOG_* variables and flags win.",
    ),
]
HostOpt = Annotated[str | None, typer.Option(help="Interface to listen on.")]
PortOpt = Annotated[int | None, typer.Option(help="Port to listen on.")]
DbOpt = Annotated[
    str | None, typer.Option(help="Metadata store URL (sqlite:///... or postgresql://...).")
]
DbShardOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--db-shard",
        help="Shard database URL (postgresql://...), repeatable: partitions are spread over "
        "the shards and --db keeps the catalog.",
    ),
]
StoreOpt = Annotated[
    str | None, typer.Option(help="Object store URL: s3://bucket/prefix, file:///path, memory://.")
]
EndpointOpt = Annotated[
    str | None, typer.Option("--store-endpoint", help="S3 endpoint URL (MinIO, a moto server).")
]
RegionOpt = Annotated[str | None, typer.Option("--store-region", help="S3 region.")]
ClusterOpt = Annotated[
    str | None, typer.Option("--cluster-id", help="Cluster id (22 chars of base64) for a new db.")
]
AdvertisedOpt = Annotated[
    str | None,
    typer.Option("--advertised-url", help="Base URL clients reach this agent at."),
]
AutoCreateOpt = Annotated[
    bool | None,
    typer.Option(
        "--auto-create-topics/--no-auto-create-topics", help="Create topics on first produce."
    ),
]
PartitionsOpt = Annotated[
    int | None,
    typer.Option("--default-partitions", help="Partitions of auto-created topics and defaults."),
]
LingerOpt = Annotated[int | None, typer.Option("--linger-ms", help="Flush at least this often.")]
FlushBytesOpt = Annotated[
    int | None, typer.Option("--flush-bytes", help="Flush when this many bytes are buffered.")
]
CompressionOpt = Annotated[
    str | None, typer.Option(help="Batch compression: none, gzip, snappy, lz4, zstd.")
]
KafkaPortOpt = Annotated[
    int | None,
    typer.Option("--kafka-port", help="Kafka protocol port; 0 turns it off [default: 9092]."),
]
KafkaAdvertisedOpt = Annotated[
    str | None,
    typer.Option("--kafka-advertised", help="host:port Kafka clients reach this agent at."),
]
LogLevelOpt = Annotated[str | None, typer.Option("--log-level", help="Python log level.")]
AuthenticationOpt = Annotated[
    str | None,
    typer.Option(help="none, or basic: clients need a user's password or an API key."),
]
AuthorizationOpt = Annotated[
    str | None, typer.Option(help="none, or acl: every request is checked against the ACLs.")
]
SuperUsersOpt = Annotated[
    str | None, typer.Option("--super-users", help="Principals allowed everything: User:a;User:b.")
]
AllowUnauthenticatedOpt = Annotated[
    bool | None,
    typer.Option(
        "--allow-unauthenticated/--no-allow-unauthenticated",
        help="Listen on a non-loopback --host with authentication none (anyone who reaches "
        "it may read, write and delete every topic).",
    ),
]
CoordinatorPortOpt = Annotated[
    int | None,
    typer.Option(
        "--coordinator-port",
        help="Port of the coordinator API (Spark jobs, lakelog janitor --coordinator); 0 turns "
        "it off [default: 8083].",
    ),
]
AccessLogOpt = Annotated[
    bool | None, typer.Option("--access-log/--no-access-log", help="Log every request.")
]
UrlOpt = Annotated[
    str, typer.Option("--url", envvar="LAKELOG_URL", help="Base URL of a lakelog agent.")
]
CoordinatorOpt = Annotated[str | None, typer.Option(help="Coordinator URL(s), comma-separated.")]
JanitorsOpt = Annotated[
    str | None,
    typer.Option(
        "--janitors",
        help="Janitors to run in the background: comma-separated tier,retention,compact,gc, "
        "all, or none [default: none].",
    ),
]
IntervalOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--janitor-interval",
        help="name=seconds between runs, repeatable (defaults: tier=60 retention=60 "
        "compact=600 gc=300).",
    ),
]
TierAgeOpt = Annotated[float | None, typer.Option("--tier-age-s", help="Tier chunks this old.")]
TierBytesOpt = Annotated[
    int | None,
    typer.Option(
        "--tier-untiered-bytes",
        help="Tier a partition's chunks whatever their age once it holds this many bytes.",
    ),
]
GraceOpt = Annotated[
    float | None, typer.Option("--gc-grace-s", help="Delete garbage this long after.")
]
LeaseTtlOpt = Annotated[float | None, typer.Option("--lease-ttl-s", help="Janitor lease TTL.")]

DEFAULT_URL = "http://localhost:8082"


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code)


def _load(cls: type[S], process: str, flags: dict[str, Any]) -> S:
    """``process``'s settings from a command's flags (its ``locals()``: each option is the
    setting of the same name; ``config`` is the file), LAKELOG_* variables and the config
    file; exits 2 if any is invalid."""
    given = {k: v for k, v in flags.items() if k in cls.model_fields and v != []}
    if given.get("janitor_interval"):  # --janitor-interval tier=30 (repeatable)
        given["janitor_interval"] = _pairs(given["janitor_interval"], "janitor interval")
    try:
        return load(cls, process, flags.get("config"), **given)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in e.errors()
        )
        _fail(f"invalid settings: {problems}", code=2)
    except ConfigFileError as e:
        _fail(str(e), code=2)


def _check_security(settings: CoordinatorSettings | Settings) -> None:
    """Exit 2 when the security settings do not go together."""
    problems = settings.security_problems()
    if problems:
        _fail(f"invalid settings: {'; '.join(problems)}", code=2)


def _setup_logging(log_level: str) -> None:
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # One line per coordinator call at INFO would drown everything else.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))


def _run_agent(
    settings: Settings, janitors: JanitorConfig | None = None, *, serve: bool = False
) -> None:
    """Serve the agent (``serve``: with its in-process coordinator's API) until stopped."""
    import uvicorn

    if settings.workers > 1:
        from service.workers import run_workers

        raise typer.Exit(run_workers(settings))

    from service.app import create_app
    from service.http_server import uvicorn_options

    _setup_logging(settings.log_level)
    uvicorn.run(
        create_app(settings, janitors=janitors, coordinator_api=serve),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
        proxy_headers=False,  # the app applies them, trusting settings.forwarded_allow_ips
        **uvicorn_options(settings),
    )


def _ensure_local_dirs(db: str, store: str | None) -> None:
    """Local paths (``serve``'s defaults) get their directories."""
    if db.startswith("sqlite:///"):
        path = db.removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if store and store.startswith("file://"):
        Path(store.removeprefix("file://")).mkdir(mode=0o700, parents=True, exist_ok=True)


# -- servers ----------------------------------------------------------------------


@app.command()
def serve(
    host: HostOpt = None,
    port: PortOpt = None,
    db: DbOpt = None,
    db_shards: DbShardOpt = None,
    store: StoreOpt = None,
    store_endpoint: EndpointOpt = None,
    store_region: RegionOpt = None,
    cluster_id: ClusterOpt = None,
    advertised_url: AdvertisedOpt = None,
    auto_create_topics: AutoCreateOpt = None,
    default_partitions: PartitionsOpt = None,
    linger_ms: LingerOpt = None,
    flush_bytes: FlushBytesOpt = None,
    compression: CompressionOpt = None,
    kafka_port: KafkaPortOpt = None,
    kafka_advertised: KafkaAdvertisedOpt = None,
    log_level: LogLevelOpt = None,
    access_log: AccessLogOpt = None,
    janitors: JanitorsOpt = None,
    janitor_interval: IntervalOpt = None,
    tier_age_s: TierAgeOpt = None,
    tier_untiered_bytes: TierBytesOpt = None,
    gc_grace_s: GraceOpt = None,
    lease_ttl_s: LeaseTtlOpt = None,
    authentication: AuthenticationOpt = None,
    authorization: AuthorizationOpt = None,
    super_users: SuperUsersOpt = None,
    allow_unauthenticated: AllowUnauthenticatedOpt = None,
    coordinator_port: CoordinatorPortOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Agent and coordinator in one process: SQLite and file://./data unless told otherwise.

    The janitors (tiering, retention, compaction, garbage collection) run in it on their
    schedules (``--janitors all``, the default), as ``lakelog coordinator --janitors all``.
    """
    settings = _load(Settings, "serve", {**locals(), "coordinator": ""})
    _check_security(settings)
    if settings.workers > 1:
        # Each worker would hold its own in-process coordinator on the one SQLite file:
        # their commits would queue on SQLite's polling busy handler, not group-commit.
        _fail(
            "workers is for lakelog agent (against a coordinator process); lakelog serve "
            "runs one process",
            code=2,
        )
    _ensure_local_dirs(settings.db, settings.store)
    _run_agent(settings, settings.background_janitors(), serve=True)


@app.command()
def agent(
    coordinator: CoordinatorOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    store: StoreOpt = None,
    store_endpoint: EndpointOpt = None,
    store_region: RegionOpt = None,
    advertised_url: AdvertisedOpt = None,
    agent_id: Annotated[
        str | None, typer.Option("--agent-id", help="Stable agent id [default: random].")
    ] = None,
    auto_create_topics: AutoCreateOpt = None,
    default_partitions: PartitionsOpt = None,
    linger_ms: LingerOpt = None,
    flush_bytes: FlushBytesOpt = None,
    compression: CompressionOpt = None,
    kafka_port: KafkaPortOpt = None,
    kafka_advertised: KafkaAdvertisedOpt = None,
    log_level: LogLevelOpt = None,
    access_log: AccessLogOpt = None,
    authentication: AuthenticationOpt = None,
    authorization: AuthorizationOpt = None,
    super_users: SuperUsersOpt = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers", help="Agent processes sharing the port(s), each with its own batcher."
        ),
    ] = None,
    allow_unauthenticated: AllowUnauthenticatedOpt = None,
    config: ConfigOpt = None,
) -> None:
    """A stateless agent serving the REST API against coordinator process(es)."""
    settings = _load(Settings, "agent", locals())
    _check_security(settings)
    if not settings.coordinator_urls():
        _fail("lakelog agent needs --coordinator URL (or LAKELOG_COORDINATOR); see lakelog serve")
    _run_agent(settings)


@app.command("coordinator")
def coordinator_cmd(
    db: DbOpt = None,
    db_shards: DbShardOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    store: Annotated[
        str | None,
        typer.Option(help="Object store URL: the janitors need it (background or run now)."),
    ] = None,
    store_endpoint: EndpointOpt = None,
    store_region: RegionOpt = None,
    cluster_id: ClusterOpt = None,
    log_level: LogLevelOpt = None,
    janitors: JanitorsOpt = None,
    janitor_interval: IntervalOpt = None,
    tier_age_s: TierAgeOpt = None,
    tier_untiered_bytes: TierBytesOpt = None,
    gc_grace_s: GraceOpt = None,
    lease_ttl_s: LeaseTtlOpt = None,
    authentication: AuthenticationOpt = None,
    authorization: AuthorizationOpt = None,
    super_users: SuperUsersOpt = None,
    allow_unauthenticated: AllowUnauthenticatedOpt = None,
    config: ConfigOpt = None,
) -> None:
    """The coordinator process: orders commits, keeps topics, offsets and agents."""
    from coordinator.http.server import run

    settings = _load(CoordinatorSettings, "coordinator", locals())
    _setup_logging(settings.log_level)
    _check_security(settings)
    try:
        background = settings.background_janitors()
    except ValueError as e:
        _fail(f"invalid janitor settings: {e}", code=2)
    if background.enabled and not settings.store:
        _fail("janitors need the object store: pass --store (or LAKELOG_STORE)", code=2)
    _ensure_local_dirs(settings.db, None)
    run(
        settings.db,
        settings.host,
        settings.port,
        settings.store,
        settings.store_endpoint,
        settings.cluster_id,
        janitors=background,
        store_region=settings.store_region,
        access=settings.access(),
        tls=(settings.tls_cert_file, settings.tls_key_file) if settings.tls_cert_file else None,
        db_shards=settings.db_shards,
        max_request_bytes=settings.coordinator_max_request_bytes,
    )


@app.command("settings")
def settings_cmd() -> None:
    """Every setting of every process (name, LAKELOG_* variable, defaults) as Markdown."""
    typer.echo(settings_table(), nl=False)


# -- janitors now ---------------------------------------------------------------------


def _progress_sink(janitor: str) -> tuple[Callable[[int, int, str], None], Callable[[], None]]:
    """Where progress goes: a bar on a terminal, else one line per step on stderr."""
    if sys.stderr.isatty():
        from rich.progress import Progress

        bar = Progress(transient=True)
        task = bar.add_task(f"janitor {janitor}", total=None)
        bar.start()

        def show(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=f"{janitor} {what}")

        return show, bar.stop

    def line(done: int, total: int, what: str) -> None:
        typer.echo(f"janitor {janitor}: {done}/{total} {what}", err=True)

    return line, lambda: None


def _run_here(name: str, settings: JanitorCommandSettings, topic: str | None) -> JanitorReport:
    """Run the janitor in this process, on the database and the store, under its lease."""
    from coordinator.janitors.leases import LeaseLostError
    from coordinator.janitors.runner import JanitorRunner
    from coordinator.local import LocalCoordinator
    from segments.errors import JanitorBusyError
    from segments.store import open_store

    coordinator = LocalCoordinator(settings.db, shards=settings.db_shards)
    store = open_store(
        settings.store, endpoint_url=settings.store_endpoint, region=settings.store_region
    )
    show, done = _progress_sink(name)
    try:
        runner = JanitorRunner(
            coordinator, store, settings.janitor_config(), holder=f"cli-{uuid.uuid4().hex[:12]}"
        )
        try:
            lease = runner.take_lease(name)
            return runner.run_lease(lease, topic=topic, progress=show)
        except (JanitorBusyError, LeaseLostError) as e:
            _fail(str(e))
    finally:
        done()
        store.close()
        coordinator.close()


def _run_remote(name: str, settings: JanitorCommandSettings, topic: str | None) -> dict[str, Any]:
    """Ask a coordinator to run the janitor now; follow its progress; its report."""
    import os

    import orjson

    from coordinator.security.wire import secret_headers

    body: dict[str, Any] = {"topic": topic}
    for key in ("tier_age_s", "tier_untiered_bytes", "gc_grace_s"):
        if key in settings.model_fields_set:
            body[key] = getattr(settings, key)
    show, done = _progress_sink(name)
    errors = []
    try:
        for url in settings.coordinator_urls():
            try:
                with (
                    httpx.Client(
                        timeout=httpx.Timeout(30.0, read=None),
                        # A coordinator with authentication on serves only its secret's holders.
                        headers=secret_headers(os.environ.get("LAKELOG_COORDINATOR_SECRET")),
                    ) as http,
                    http.stream("POST", f"{url}/v1/janitors/{name}/run", json=body) as resp,
                ):
                    if resp.status_code != 200:
                        resp.read()
                        try:
                            message = resp.json()["message"]
                        except (ValueError, KeyError, TypeError):
                            message = f"HTTP {resp.status_code} from {url}: {resp.text[:200]}"
                        _fail(message)
                    for line in resp.iter_lines():
                        if not line:
                            continue
                        event = orjson.loads(line)
                        if "progress" in event:
                            p = event["progress"]
                            show(p["done"], p["total"], p["what"])
                        elif "report" in event:
                            report: dict[str, Any] = event["report"]
                            return report
                        else:
                            _fail(f"janitor {name} failed: {event['error']}: {event['message']}")
                    _fail(f"{url} ended the run's stream without a report")
            except httpx.TransportError as e:
                errors.append(f"{url}: {e}")
        _fail(f"cannot reach a coordinator: {'; '.join(errors)}")
    finally:
        done()


def _janitor_shortcut(name: str) -> None:
    def command(
        topic: Annotated[str | None, typer.Option(help="Only this topic's partitions.")] = None,
        coordinator: Annotated[
            str | None,
            typer.Option(help="Ask this running coordinator (URLs, comma-separated) to run it."),
        ] = None,
        db: DbOpt = None,
        db_shards: DbShardOpt = None,
        store: StoreOpt = None,
        store_endpoint: EndpointOpt = None,
        store_region: RegionOpt = None,
        tier_age_s: TierAgeOpt = None,
        tier_untiered_bytes: TierBytesOpt = None,
        gc_grace_s: GraceOpt = None,
        lease_ttl_s: LeaseTtlOpt = None,
        log_level: LogLevelOpt = None,
        config: ConfigOpt = None,
    ) -> None:
        import orjson

        if topic is not None and name == "gc":
            _fail("gc works on the whole store; --topic does not apply", code=2)
        settings = _load(JanitorCommandSettings, "janitor", locals())
        _setup_logging(settings.log_level)
        if settings.coordinator_urls():
            report = _run_remote(name, settings, topic)
        else:
            report = _run_here(name, settings, topic).as_dict()
        typer.echo(orjson.dumps(report).decode())

    command.__doc__ = (
        f"Run the {name} janitor now, under its lease: in the coordinator given by "
        "--coordinator (LAKELOG_COORDINATOR), else here on --db and --store."
    )
    janitor_app.command(name)(command)


for _name in ("tier", "retention", "compact", "gc", "table"):
    _janitor_shortcut(_name)


# -- REST client ------------------------------------------------------------------


def rest_credentials() -> tuple[str, str] | None:
    """HTTP Basic credentials for an agent with authentication on: ``LAKELOG_USER`` (a user
    or an API key id) and ``LAKELOG_PASSWORD`` (its password or secret), never flags (a
    flag would show in ``ps``)."""
    import os

    user = os.environ.get("LAKELOG_USER")
    if not user:
        return None
    return user, os.environ.get("LAKELOG_PASSWORD", "")


class Rest:
    """A small client of one agent's REST API that turns error bodies into exits."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=30.0, auth=rest_credentials())
        self._cluster: str | None = None

    def __enter__(self) -> Rest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            _fail(f"cannot reach {self.url}: {e}")
        if resp.is_error:
            try:
                message = str(resp.json()["message"])  # a sentence; the code is for programs
            except (ValueError, KeyError, TypeError):
                message = f"HTTP {resp.status_code}: {resp.text[:200]}"
            _fail(message)
        return resp

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def cluster(self, suffix: str = "") -> str:
        """``/v3/clusters/<id><suffix>``, discovering the id once."""
        if self._cluster is None:
            self._cluster = str(self.json("GET", "/v3/clusters")["data"][0]["cluster_id"])
        return f"/v3/clusters/{self._cluster}{suffix}"


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            _fail(f"{what} must look like name=value, got {item!r}", code=2)
        out[name] = value
    return out


def _last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


# -- topics -----------------------------------------------------------------------


@topics_app.command("create")
def topics_create(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    partitions: Annotated[
        int | None, typer.Option("--partitions", "-p", help="Partition count.")
    ] = None,
    replication_factor: Annotated[
        int | None, typer.Option("--replication-factor", "-r", help="Accepted and reported.")
    ] = None,
    config: Annotated[
        list[str] | None, typer.Option("--config", "-c", help="name=value, repeatable.")
    ] = None,
    validate_only: Annotated[
        bool, typer.Option("--validate-only", help="Check only; create nothing.")
    ] = False,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Create a topic."""
    rest = Rest(url)
    body: dict[str, Any] = {"topic_name": topic, "validate_only": validate_only}
    if partitions is not None:
        body["partitions_count"] = partitions
    if replication_factor is not None:
        body["replication_factor"] = replication_factor
    configs = _pairs(config or [], "--config")
    body["configs"] = [{"name": k, "value": v} for k, v in configs.items()]
    data = rest.json("POST", rest.cluster("/topics"), json=body)
    if validate_only:
        typer.echo(f"Topic {topic} is valid ({data['partitions_count']} partitions); not created.")
    else:
        typer.echo(f"Created topic {topic}.")


@topics_app.command("list")
def topics_list(url: UrlOpt = DEFAULT_URL) -> None:
    """List topic names, one a line."""
    rest = Rest(url)
    for t in rest.json("GET", rest.cluster("/topics"))["data"]:
        typer.echo(t["topic_name"])


def _describe(rest: Rest, topic: str) -> Iterator[str]:
    t = rest.json("GET", rest.cluster(f"/topics/{topic}"))
    configs = rest.json("GET", rest.cluster(f"/topics/{topic}/configs"))["data"]
    overrides = ",".join(
        f"{c['name']}={c['value']}" for c in configs if c["source"] == "DYNAMIC_TOPIC_CONFIG"
    )
    yield (
        f"Topic: {topic}\tPartitionCount: {t['partitions_count']}\t"
        f"ReplicationFactor: {t['replication_factor']}\tConfigs: {overrides}"
    )
    for p in rest.json("GET", rest.cluster(f"/topics/{topic}/partitions"))["data"]:
        pid = p["partition_id"]
        leader = _last_segment(p["leader"]["related"])
        offsets = rest.json("GET", rest.cluster(f"/topics/{topic}/partitions/{pid}/offset"))
        yield (
            f"\tTopic: {topic}\tPartition: {pid}\tLeader: {leader}\tReplicas: {leader}\t"
            f"Isr: {leader}\tLogStartOffset: {offsets['earliest_offset']}\t"
            f"HighWatermark: {offsets['latest_offset']}"
        )


@topics_app.command("describe")
def topics_describe(
    topic: Annotated[str | None, typer.Argument(help="Topic name [default: every topic].")] = None,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Partitions, leaders, offsets and config overrides of a topic (or of every topic)."""
    rest = Rest(url)
    names = (
        [topic]
        if topic is not None
        else [t["topic_name"] for t in rest.json("GET", rest.cluster("/topics"))["data"]]
    )
    for name in names:
        for line in _describe(rest, name):
            typer.echo(line)


@topics_app.command("delete")
def topics_delete(
    topic: Annotated[str, typer.Argument(help="Topic name.")], url: UrlOpt = DEFAULT_URL
) -> None:
    """Delete a topic and its data."""
    rest = Rest(url)
    rest.request("DELETE", rest.cluster(f"/topics/{topic}"))
    typer.echo(f"Deleted topic {topic}.")


def _kafka_config_list(text: str) -> list[str]:
    """kafka-configs' ``a=1,b=[x,y]``: the comma-separated items, a bracketed value kept
    whole (its brackets dropped, as Kafka's tool does)."""
    items: list[str] = []
    depth, current = 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        current += ch
    items.append(current)
    out = []
    for item in (i.strip() for i in items if i.strip()):
        name, sep, value = item.partition("=")
        if sep and value.startswith("[") and value.endswith("]"):
            item = f"{name}={value[1:-1]}"
        out.append(item)
    return out


@topics_app.command("alter-config")
def topics_alter_config(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    add_config: Annotated[
        list[str] | None,
        typer.Option(
            "--add-config",
            "--set",
            help="name=value to set (kafka-configs' a=1,b=[x,y] lists too), repeatable.",
        ),
    ] = None,
    delete_config: Annotated[
        list[str] | None,
        typer.Option(
            "--delete-config",
            "--delete",
            help="Config to reset to its default (a,b lists too), repeatable.",
        ),
    ] = None,
    validate_only: Annotated[
        bool, typer.Option("--validate-only", help="Check only; change nothing.")
    ] = False,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Set and reset topic configs in one step, in kafka-configs' words."""
    to_set = _pairs([i for a in add_config or [] for i in _kafka_config_list(a)], "--add-config")
    to_delete = [n.strip() for d in delete_config or [] for n in d.split(",") if n.strip()]
    if not to_set and not to_delete:
        _fail("give at least one --add-config name=value or --delete-config name", code=2)
    data = [{"name": k, "value": v, "operation": "SET"} for k, v in to_set.items()]
    data += [{"name": k, "operation": "DELETE"} for k in to_delete]
    rest = Rest(url)
    rest.request(
        "POST",
        rest.cluster(f"/topics/{topic}/configs:alter"),
        json={"data": data, "validate_only": validate_only},
    )
    verb = "Validated" if validate_only else "Completed updating"
    typer.echo(f"{verb} config for topic {topic}.")


# -- consumer groups (like kafka-consumer-groups) ------------------------------------

OutputOpt = Annotated[
    str, typer.Option("--output", "-o", help="table (Kafka's tool's columns) or json.")
]


def _check_output(output: str) -> None:
    if output not in ("table", "json"):
        _fail(f"--output must be table or json, not {output!r}", code=2)


def _table(headers: list[str], rows: list[list[object]]) -> Iterator[str]:
    """Left-aligned columns as wide as their widest cell, as Kafka's tools print them."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    for row in [headers, *cells]:
        yield " ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()


def _dash(value: object) -> object:
    return "-" if value is None or value == "" else value


def _echo_json(data: object) -> None:
    import orjson

    typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


@groups_app.command("list")
def groups_list(
    state: Annotated[bool, typer.Option("--state", help="Show each group's state.")] = False,
    output: OutputOpt = "table",
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """List consumer groups (REST consumer groups and Kafka groups alike)."""
    _check_output(output)
    with Rest(url) as rest:
        groups = rest.json("GET", rest.cluster("/consumer-groups"))["data"]
        if output == "json":
            _echo_json([{"group": g["consumer_group_id"], "state": g["state"]} for g in groups])
        elif state:
            rows: list[list[object]] = [[g["consumer_group_id"], g["state"]] for g in groups]
            for line in _table(["GROUP", "STATE"], rows):
                typer.echo(line)
        else:
            for g in groups:
                typer.echo(g["consumer_group_id"])


def _coordinator_broker(rest: Rest, info: dict[str, Any]) -> str:
    """``host:port (id)`` of the broker shown as the group's coordinator."""
    broker_id = _last_segment(info["coordinator"]["related"])
    broker = rest.json("GET", rest.cluster(f"/brokers/{broker_id}"))
    return f"{broker['host']}:{broker['port']} ({broker_id})"


def _group_view(rest: Rest, group: str, members: bool) -> dict[str, Any]:
    """Everything ``describe`` shows, from the v3 consumer-group views."""
    base = f"/consumer-groups/{group}"
    info = rest.json("GET", rest.cluster(base))
    consumers = rest.json("GET", rest.cluster(base + "/consumers"))["data"]
    lags = rest.json("GET", rest.cluster(base + "/lags"))["data"]
    view: dict[str, Any] = {
        "group": group,
        "state": info["state"],
        "assignor": info["partition_assignor"],
        "coordinator": _coordinator_broker(rest, info),
        "offsets": [
            {
                "topic": lag["topic_name"],
                "partition": lag["partition_id"],
                "current_offset": lag["current_offset"],
                "log_end_offset": lag["log_end_offset"],
                "lag": lag["lag"],
                "consumer_id": lag["consumer_id"] or None,
                "client_id": lag["client_id"] or None,
            }
            for lag in lags
        ],
        "members": [],
    }
    for c in consumers:
        member: dict[str, Any] = {"consumer_id": c["consumer_id"], "client_id": c["client_id"]}
        if members:
            path = f"{base}/consumers/{c['consumer_id']}/assignments"
            assigned = rest.json("GET", rest.cluster(path))["data"]
            member["assignment"] = [
                {"topic": a["topic_name"], "partition": a["partition_id"]} for a in assigned
            ]
        view["members"].append(member)
    return view


@groups_app.command("describe")
def groups_describe(
    group: Annotated[str, typer.Argument(help="Consumer group id.")],
    members: Annotated[bool, typer.Option("--members", help="List the members.")] = False,
    offsets: Annotated[
        bool, typer.Option("--offsets", help="Offsets and lag per partition (the default).")
    ] = False,
    state: Annotated[bool, typer.Option("--state", help="The group's state.")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="With --members: each member's partitions.")
    ] = False,
    output: OutputOpt = "table",
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Committed offsets and lag per partition, members, or state of a group."""
    _check_output(output)
    with Rest(url) as rest:
        view = _group_view(rest, group, members)
        offsets = offsets or not (members or state)
        if output == "json":
            shown = {k: view[k] for k in ("group", "state", "assignor", "coordinator")}
            if offsets:
                shown["offsets"] = view["offsets"]
            if members:
                shown["members"] = view["members"]
            _echo_json(shown)
            return
        if not view["members"] and (offsets or members):
            typer.echo(f"\nConsumer group '{group}' has no active members.")
        if state:
            rows: list[list[object]] = [
                [
                    group,
                    view["coordinator"],
                    view["assignor"],
                    view["state"],
                    len(view["members"]),
                ]
            ]
            headers = ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"]
            typer.echo("")
            for line in _table(headers, rows):
                typer.echo(line)
        if members:
            headers = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
            if verbose:
                headers.append("ASSIGNMENT")
            rows = []
            for m in view["members"]:
                row: list[object] = [group, m["consumer_id"], "-", m["client_id"]]
                row.append(len(m["assignment"]))
                if verbose:
                    row.append(
                        ",".join(f"{a['topic']}({a['partition']})" for a in m["assignment"]) or "-"
                    )
                rows.append(row)
            typer.echo("")
            for line in _table(headers, rows):
                typer.echo(line)
        if offsets:
            headers = [
                "GROUP",
                "TOPIC",
                "PARTITION",
                "CURRENT-OFFSET",
                "LOG-END-OFFSET",
                "LAG",
                "CONSUMER-ID",
                "HOST",
                "CLIENT-ID",
            ]
            rows = [
                [
                    group,
                    o["topic"],
                    o["partition"],
                    o["current_offset"],
                    o["log_end_offset"],
                    o["lag"],
                    _dash(o["consumer_id"]),
                    "-",
                    _dash(o["client_id"]),
                ]
                for o in view["offsets"]
            ]
            typer.echo("")
            for line in _table(headers, rows):
                typer.echo(line)


_DURATION = re.compile(
    r"P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?"
)


def parse_duration_ms(text: str) -> int:
    """An ISO-8601 duration as Java's ``Duration.parse`` takes it (``PnDTnHnMn.nS``), in
    milliseconds. Hand-written: a dozen lines, no library needed. Raises ValueError."""
    m = _DURATION.fullmatch(text.strip().upper())
    if not m or text.strip().upper() in ("P", "PT") or text.strip().upper().endswith("T"):
        raise ValueError(f"not a duration like P1DT2H30M: {text!r}")
    d, h, mi, s = (float(m.group(k) or 0) for k in ("d", "h", "m", "s"))
    return int((((d * 24 + h) * 60 + mi) * 60 + s) * 1000)


def parse_datetime_ms(text: str) -> int:
    """``YYYY-MM-DDTHH:mm:SS[.sss][zone]`` in epoch ms; no zone: local time, as Kafka's
    tool. Raises ValueError."""
    from datetime import datetime

    when = datetime.fromisoformat(text.strip())
    return int(when.timestamp() * 1000)  # naive datetimes are local time here too


def _reset_topics(topics: list[str]) -> list[dict[str, Any]]:
    """``--topic t`` (every partition) or ``--topic t:0,2`` -> the request's partitions."""
    out: list[dict[str, Any]] = []
    for item in topics:
        name, sep, parts = item.partition(":")
        if not name:
            _fail(f"--topic must look like TOPIC or TOPIC:P,P, got {item!r}", code=2)
        if not sep:
            out.append({"topic_name": name})
            continue
        try:
            ids = [int(p) for p in parts.split(",")]
        except ValueError:
            _fail(f"--topic partitions must be integers, got {item!r}", code=2)
        out.extend({"topic_name": name, "partition_id": p} for p in ids)
    return out


@groups_app.command("reset-offsets")
def groups_reset_offsets(
    group: Annotated[str, typer.Argument(help="Consumer group id.")],
    topic: Annotated[
        list[str] | None,
        typer.Option("--topic", help="TOPIC (every partition) or TOPIC:P,P; repeatable."),
    ] = None,
    all_topics: Annotated[
        bool, typer.Option("--all-topics", help="Every topic the group has offsets for.")
    ] = False,
    to_earliest: Annotated[bool, typer.Option("--to-earliest", help="Log-start.")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest", help="Log-end.")] = False,
    to_offset: Annotated[int | None, typer.Option("--to-offset", help="This offset.")] = None,
    to_datetime: Annotated[
        str | None,
        typer.Option("--to-datetime", help="First offset at/after YYYY-MM-DDTHH:mm:SS.sss."),
    ] = None,
    shift_by: Annotated[
        int | None, typer.Option("--shift-by", help="Committed offset plus N (may be < 0).")
    ] = None,
    by_duration: Annotated[
        str | None, typer.Option("--by-duration", help="First offset at/after now - PnDTnHnM.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (default).")] = False,
    execute: Annotated[bool, typer.Option("--execute", help="Apply the plan.")] = False,
    output: OutputOpt = "table",
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Move a group's committed offsets; prints the plan, applies it with --execute.

    The group must have no members (Kafka's rule), even for a dry run.
    """
    _check_output(output)
    given: list[tuple[str, int | None]] = []
    if to_earliest:
        given.append(("EARLIEST", None))
    if to_latest:
        given.append(("LATEST", None))
    if to_offset is not None:
        given.append(("OFFSET", to_offset))
    if shift_by is not None:
        given.append(("SHIFT", shift_by))
    try:
        if to_datetime is not None:
            given.append(("TIMESTAMP", parse_datetime_ms(to_datetime)))
        if by_duration is not None:
            now_ms = int(time.time() * 1000)
            given.append(("TIMESTAMP", now_ms - parse_duration_ms(by_duration)))
    except ValueError as e:
        _fail(str(e), code=2)
    if len(given) != 1:
        _fail(
            "give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, "
            "--shift-by, --by-duration",
            code=2,
        )
    if dry_run and execute:
        _fail("--dry-run and --execute are mutually exclusive", code=2)
    if not topic and not all_topics:
        _fail("give --topic TOPIC[:P,...] (repeatable) or --all-topics", code=2)
    if not execute and not dry_run:
        typer.echo(
            "WARN: No action will be performed as the --execute option is missing. Add "
            "--dry-run to keep this behaviour without the warning.",
            err=True,
        )
    strategy, value = given[0]
    body = {
        "partitions": _reset_topics(topic or []),
        "all_topics": all_topics,
        "strategy": strategy,
        "value": value,
        "validate_only": not execute,
    }
    with Rest(url) as rest:
        plan = rest.json("POST", rest.cluster(f"/consumer-groups/{group}/offsets:reset"), json=body)
        if output == "json":
            _echo_json(plan)
            return
        rows: list[list[object]] = [
            [group, p["topic_name"], p["partition_id"], p["new_offset"]] for p in plan["data"]
        ]
        typer.echo("")
        for line in _table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], rows):
            typer.echo(line)


@groups_app.command("delete")
def groups_delete(
    group: Annotated[str, typer.Argument(help="Consumer group id.")], url: UrlOpt = DEFAULT_URL
) -> None:
    """Delete a group without members, with its committed offsets."""
    with Rest(url) as rest:
        rest.request("DELETE", rest.cluster(f"/consumer-groups/{group}"))
        typer.echo(f"Deletion of requested consumer groups ('{group}') was successful.")


# -- console producer ---------------------------------------------------------------


def _b64(data: str) -> str:
    return base64.b64encode(data.encode()).decode()


@app.command()
def produce(
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to write to.")],
    key_separator: Annotated[
        str | None,
        typer.Option("--key-separator", help="Split each line into key and value at this."),
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", help="Write every line to this partition.")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", help="Lines per request [default: 1 on a tty, else 500]."),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Console producer: each stdin line becomes a record; prints its partition and offset."""
    rest = Rest(url)
    size = batch_size or (1 if sys.stdin.isatty() else 500)
    path = f"/topics/{topic}" + (f"/partitions/{partition}" if partition is not None else "")
    headers = {"Content-Type": "application/vnd.kafka.binary.v2+json"}
    failed = 0

    def send(lines: list[str]) -> None:
        nonlocal failed
        records = []
        for line in lines:
            key: str | None = None
            value = line
            if key_separator is not None and key_separator in line:
                key, value = line.split(key_separator, 1)
            records.append({"key": None if key is None else _b64(key), "value": _b64(value)})
        body = rest.json("POST", path, json={"records": records}, headers=headers)
        for entry in body["offsets"]:
            if entry.get("error_code") is not None:
                failed += 1
                typer.echo(f"error {entry['error_code']}: {entry.get('error')}", err=True)
            else:
                typer.echo(f"partition {entry['partition']} offset {entry['offset']}")

    batch: list[str] = []
    for raw in sys.stdin:
        batch.append(raw.rstrip("\r\n"))
        if len(batch) >= size:
            send(batch)
            batch = []
    if batch:
        send(batch)
    if failed:
        raise typer.Exit(1)


# -- console consumer ---------------------------------------------------------------


def _text(data: str | None) -> str:
    return "null" if data is None else base64.b64decode(data).decode("utf-8", "replace")


@app.command()
def consume(
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to read.")],
    group: Annotated[
        str | None, typer.Option("--group", "-g", help="Consumer group [default: a new one].")
    ] = None,
    from_beginning: Annotated[
        bool,
        typer.Option(
            "--from-beginning", help="Start at the earliest offset when the group has none."
        ),
    ] = False,
    max_messages: Annotated[
        int | None, typer.Option("--max-messages", help="Exit after this many records.")
    ] = None,
    timeout_ms: Annotated[
        int | None,
        typer.Option("--timeout-ms", help="Exit when no record arrived for this long."),
    ] = None,
    print_key: Annotated[
        bool, typer.Option("--print-key/--no-print-key", help="Print key<TAB>value.")
    ] = True,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Console consumer: prints each record's key and value, committing as it goes.

    Ctrl-C and SIGTERM (docker stop, systemd, timeout) stop it the same way: the consumer
    leaves its group at once, so the group can be reset or deleted right after.
    """
    rest = Rest(url)
    # A subscription may name a topic that does not exist yet: wait for it, but say so.
    with contextlib.suppress(httpx.HTTPError):  # unreachable: the next call says so
        if rest.http.get(f"/topics/{topic}").status_code == 404:
            typer.echo(
                f"Topic '{topic}' does not exist: waiting for it to be created (Ctrl-C to stop).",
                err=True,
            )
    group = group or f"console-consumer-{uuid.uuid4().hex[:8]}"
    v2 = {"Content-Type": "application/vnd.kafka.v2+json"}
    instance: str | None = None
    seen = 0
    idle_since = time.monotonic()
    previous_sigterm = signal.signal(signal.SIGTERM, _interrupt)
    try:
        created = rest.json(
            "POST",
            f"/consumers/{group}",
            json={
                "format": "binary",
                "auto.offset.reset": "earliest" if from_beginning else "latest",
                "auto.commit.enable": "false",
            },
            headers=v2,
        )
        instance = f"/consumers/{group}/instances/{created['instance_id']}"
        rest.request("POST", instance + "/subscription", json={"topics": [topic]}, headers=v2)
        while max_messages is None or seen < max_messages:
            records = rest.json(
                "GET",
                instance + "/records?timeout=1000",
                headers={"Accept": "application/vnd.kafka.binary.v2+json"},
            )
            if not records:
                if timeout_ms is not None and time.monotonic() - idle_since > timeout_ms / 1000:
                    break
                continue
            idle_since = time.monotonic()
            last: dict[tuple[str, int], int] = {}
            for r in records[: None if max_messages is None else max_messages - seen]:
                value = _text(r["value"])
                typer.echo(f"{_text(r['key'])}\t{value}" if print_key else value)
                seen += 1
                last[(r["topic"], r["partition"])] = r["offset"]
            # Commit what was printed (not a record more: --max-messages may cut a batch).
            offsets = [{"topic": t, "partition": p, "offset": o} for (t, p), o in last.items()]
            rest.request("POST", instance + "/offsets", json={"offsets": offsets}, headers=v2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
        if instance is not None:
            with contextlib.suppress(httpx.HTTPError):
                rest.http.delete(instance, headers=v2)  # leaves the group now, not in 300 s
    typer.echo(f"Processed a total of {seen} messages", err=True)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: unwind, so the consumer leaves its group before exiting."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    app()
