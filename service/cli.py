"""The ``lakelog`` command line.

Servers: ``lakelog serve`` (agent + in-process coordinator, SQLite and
``file://./data`` by default), ``lakelog agent`` (against coordinator processes),
``lakelog coordinator``. Clients over the REST API, like Kafka's tools:
``lakelog topics create|list|describe|delete|alter-config``, ``lakelog groups
list|describe|reset-offsets|delete`` (kafka-consumer-groups), ``lakelog produce``
and ``lakelog consume`` (console producer and consumer). Server flags map to ``Settings`` fields and
override ``LAKELOG_*`` environment variables.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import re
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import httpx
import typer
from pydantic import ValidationError

from service.settings import Settings

if TYPE_CHECKING:
    from coordinator.janitors.context import JanitorConfig

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
    help="Run a janitor once against the metadata database and the object store."
)
app.add_typer(janitor_app, name="janitor")

# -- shared options ---------------------------------------------------------------

HostOpt = Annotated[str | None, typer.Option(help="Interface to listen on [default: 0.0.0.0].")]
PortOpt = Annotated[int | None, typer.Option(help="Port to listen on [default: 8082].")]
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
LogLevelOpt = Annotated[str, typer.Option("--log-level", help="Python log level.")]
AccessLogOpt = Annotated[bool, typer.Option("--access-log", help="Log every request.")]
UrlOpt = Annotated[
    str, typer.Option("--url", envvar="LAKELOG_URL", help="Base URL of a lakelog agent.")
]

JanitorsOpt = Annotated[
    str,
    typer.Option(
        "--janitors",
        envvar="LAKELOG_JANITORS",
        help="Janitors to run in the background: comma-separated tier,retention,compact,gc "
        "or all [default: none].",
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
TierAgeOpt = Annotated[
    float | None,
    typer.Option("--tier-age-s", envvar="LAKELOG_TIER_AGE_S", help="Tier chunks this old."),
]
TierBytesOpt = Annotated[
    int | None,
    typer.Option(
        "--tier-untiered-bytes",
        envvar="LAKELOG_TIER_UNTIERED_BYTES",
        help="Tier a partition's chunks whatever their age once it holds this many bytes.",
    ),
]
GraceOpt = Annotated[
    float | None,
    typer.Option(
        "--gc-grace-s", envvar="LAKELOG_GC_GRACE_S", help="Delete garbage this long after."
    ),
]
LeaseTtlOpt = Annotated[
    float | None,
    typer.Option("--lease-ttl-s", envvar="LAKELOG_LEASE_TTL_S", help="Janitor lease TTL."),
]

DEFAULT_URL = "http://localhost:8082"


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code)


def _settings(**given: Any) -> Settings:
    """Settings from the environment, overridden by the flags that were given."""
    try:
        return Settings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in e.errors()
        )
        _fail(f"invalid settings: {problems}", code=2)


def _setup_logging(log_level: str) -> None:
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # One line per coordinator call at INFO would drown everything else.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))


def _run_agent(settings: Settings, log_level: str, access_log: bool) -> None:
    import uvicorn

    from service.app import create_app

    _setup_logging(log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level.lower(),
        access_log=access_log,
        proxy_headers=False,  # the app applies them, trusting settings.forwarded_allow_ips
    )


def _ensure_local_dirs(settings: Settings) -> None:
    """``serve`` runs on local paths by default; create their directories."""
    if settings.db.startswith("sqlite:///"):
        path = settings.db.removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if settings.store.startswith("file://"):
        Path(settings.store.removeprefix("file://")).mkdir(parents=True, exist_ok=True)


# -- servers ----------------------------------------------------------------------


@app.command()
def serve(
    host: HostOpt = None,
    port: PortOpt = None,
    db: Annotated[
        str | None, typer.Option(help="Metadata store URL (sqlite:///... or postgresql://...).")
    ] = None,
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
    log_level: LogLevelOpt = "info",
    access_log: AccessLogOpt = False,
) -> None:
    """Agent and coordinator in one process: SQLite and file://./data unless told otherwise."""
    settings = _settings(
        coordinator="",
        host=host,
        port=port,
        db=db,
        store=store,
        store_endpoint=store_endpoint,
        store_region=store_region,
        cluster_id=cluster_id,
        advertised_url=advertised_url,
        auto_create_topics=auto_create_topics,
        default_partitions=default_partitions,
        linger_ms=linger_ms,
        flush_bytes=flush_bytes,
        compression=compression,
    )
    _ensure_local_dirs(settings)
    _run_agent(settings, log_level, access_log)


@app.command()
def agent(
    coordinator: Annotated[
        str | None, typer.Option(help="Coordinator URL(s), comma-separated.")
    ] = None,
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
    log_level: LogLevelOpt = "info",
    access_log: AccessLogOpt = False,
) -> None:
    """A stateless agent serving the REST API against coordinator process(es)."""
    settings = _settings(
        coordinator=coordinator,
        host=host,
        port=port,
        store=store,
        store_endpoint=store_endpoint,
        store_region=store_region,
        advertised_url=advertised_url,
        agent_id=agent_id,
        auto_create_topics=auto_create_topics,
        default_partitions=default_partitions,
        linger_ms=linger_ms,
        flush_bytes=flush_bytes,
        compression=compression,
    )
    if not settings.coordinator_urls():
        _fail("lakelog agent needs --coordinator URL (or LAKELOG_COORDINATOR); see lakelog serve")
    _run_agent(settings, log_level, access_log)


@app.command("coordinator")
def coordinator_cmd(
    db: Annotated[
        str, typer.Option(help="Metadata store URL (sqlite:///... or postgresql://...).")
    ] = "sqlite:///./data/lakelog.db",
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8083,
    store: Annotated[
        str | None, typer.Option(help="Object store URL (enables the orphan report).")
    ] = None,
    store_endpoint: EndpointOpt = None,
    cluster_id: ClusterOpt = None,
    log_level: LogLevelOpt = "info",
    janitors: JanitorsOpt = "",
    janitor_interval: IntervalOpt = None,
    tier_age_s: TierAgeOpt = None,
    tier_untiered_bytes: TierBytesOpt = None,
    gc_grace_s: GraceOpt = None,
    lease_ttl_s: LeaseTtlOpt = None,
) -> None:
    """The coordinator process: orders commits, keeps topics, offsets and agents."""
    from coordinator.server import run

    _setup_logging(log_level)
    config = _janitor_config(
        janitors, janitor_interval, tier_age_s, tier_untiered_bytes, gc_grace_s, lease_ttl_s
    )
    if config.enabled and not store:
        _fail("janitors need the object store: pass --store", code=2)
    if db.startswith("sqlite:///"):
        Path(db.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    run(db, host, port, store, store_endpoint, cluster_id, janitors=config)


def _janitor_config(
    janitors: str,
    intervals: list[str] | None,
    tier_age_s: float | None,
    tier_untiered_bytes: int | None,
    gc_grace_s: float | None,
    lease_ttl_s: float | None,
) -> JanitorConfig:
    """A JanitorConfig from the flags (unset ones keep the defaults); exits 2 if invalid."""
    from coordinator.janitors.context import DEFAULT_INTERVALS_S, JanitorConfig

    names = {n.strip() for n in janitors.split(",") if n.strip()}
    if names == {"all"}:
        names = set(DEFAULT_INTERVALS_S)
    given: dict[str, Any] = {
        "tier_age_s": tier_age_s,
        "tier_untiered_bytes": tier_untiered_bytes,
        "gc_grace_s": gc_grace_s,
        "lease_ttl_s": lease_ttl_s,
    }
    try:
        every = dict(DEFAULT_INTERVALS_S)
        for k, v in _pairs(intervals or [], "janitor interval").items():
            every[k] = float(v)
        return JanitorConfig(
            enabled=frozenset(names),
            intervals_s=every,
            **{k: v for k, v in given.items() if v is not None},
        )
    except ValueError as e:
        _fail(f"invalid janitor settings: {e}", code=2)


def run_janitor_once(
    janitor: str,
    db: str,
    store: str,
    store_endpoint: str | None,
    topic: str | None,
    tier_age_s: float | None,
    tier_untiered_bytes: int | None,
    gc_grace_s: float | None,
    log_level: str,
) -> None:
    """``lakelog janitor <name>``: one run with a progress bar on stderr, its report as JSON."""
    import orjson
    from rich.progress import Progress

    from coordinator.janitors.catalog import Catalog
    from coordinator.janitors.context import JANITORS, JanitorContext
    from coordinator.janitors.leases import LeaseLostError, LeaseStore
    from coordinator.janitors.runner import run_janitor
    from coordinator.local import LocalCoordinator
    from segments.store import open_store

    _setup_logging(log_level)
    if janitor not in JANITORS:
        _fail(f"unknown janitor {janitor!r}; expected one of {', '.join(JANITORS)}", code=2)
    if topic is not None and janitor == "gc":
        _fail("gc works on the whole store; --topic does not apply", code=2)
    config = _janitor_config("", None, tier_age_s, tier_untiered_bytes, gc_grace_s, None)
    coordinator = LocalCoordinator(db)
    object_store = open_store(store, endpoint_url=store_endpoint)
    try:
        leases = LeaseStore(coordinator.db, ttl_s=config.lease_ttl_s)
        lease = leases.acquire(janitor, f"cli-{uuid.uuid4().hex[:12]}", scheduled=False)
        if lease is None:
            _fail(f"janitor {janitor} is running in another process; try again later")
        with Progress(transient=True) as bar:
            task = bar.add_task(f"janitor {janitor}", total=None)

            def progress(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total, description=f"{janitor} {what}")

            ctx = JanitorContext(
                Catalog(coordinator.db),
                coordinator.store,
                object_store,
                check=lease.check,
                progress=progress,
            )
            run_id = leases.start_run(lease)
            outcome, summary = "error", {}
            try:
                report = run_janitor(janitor, ctx, config, topic)
                outcome, summary = "ok", report.as_dict()
            except LeaseLostError as e:
                outcome = "lost"
                _fail(str(e))
            finally:
                leases.finish_run(run_id, outcome, summary)
                leases.release(lease, time.time() + config.interval_s(janitor))
        typer.echo(orjson.dumps(report.as_dict()).decode())
    finally:
        object_store.close()
        coordinator.close()


def _janitor_shortcut(name: str) -> None:
    def command(
        db: Annotated[
            str, typer.Option(help="Metadata store URL.")
        ] = "sqlite:///./data/lakelog.db",
        store: Annotated[str, typer.Option(help="Object store URL.")] = "file://./data",
        store_endpoint: EndpointOpt = None,
        topic: Annotated[str | None, typer.Option(help="Only this topic's partitions.")] = None,
        tier_age_s: TierAgeOpt = None,
        tier_untiered_bytes: TierBytesOpt = None,
        gc_grace_s: GraceOpt = None,
        log_level: LogLevelOpt = "warning",
    ) -> None:
        run_janitor_once(
            name,
            db,
            store,
            store_endpoint,
            topic,
            tier_age_s,
            tier_untiered_bytes,
            gc_grace_s,
            log_level,
        )

    command.__doc__ = f"Run the {name} janitor once, now (under its lease)."
    janitor_app.command(name)(command)


for _name in ("tier", "retention", "compact", "gc"):
    _janitor_shortcut(_name)


# -- REST client ------------------------------------------------------------------


class Rest:
    """A small client of one agent's REST API that turns error bodies into exits."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=30.0)
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
                body = resp.json()
                message = f"{body['message']} (error_code {body['error_code']})"
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


@topics_app.command("alter-config")
def topics_alter_config(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="name=value to set, repeatable.")
    ] = None,
    delete: Annotated[
        list[str] | None, typer.Option("--delete", help="Config to reset, repeatable.")
    ] = None,
    validate_only: Annotated[
        bool, typer.Option("--validate-only", help="Check only; change nothing.")
    ] = False,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Set and reset topic configs in one step."""
    to_set = _pairs(set_ or [], "--set")
    if not to_set and not delete:
        _fail("give at least one --set name=value or --delete name", code=2)
    data = [{"name": k, "value": v, "operation": "SET"} for k, v in to_set.items()]
    data += [{"name": k, "operation": "DELETE"} for k in delete or []]
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
    """Console consumer: prints each record's key and value, committing as it goes."""
    rest = Rest(url)
    group = group or f"console-consumer-{uuid.uuid4().hex[:8]}"
    created = rest.json(
        "POST",
        f"/consumers/{group}",
        json={
            "format": "binary",
            "auto.offset.reset": "earliest" if from_beginning else "latest",
            "auto.commit.enable": "false",
        },
        headers={"Content-Type": "application/vnd.kafka.v2+json"},
    )
    instance = f"/consumers/{group}/instances/{created['instance_id']}"
    v2 = {"Content-Type": "application/vnd.kafka.v2+json"}
    seen = 0
    idle_since = time.monotonic()
    try:
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
        with contextlib.suppress(httpx.HTTPError):
            rest.http.delete(instance, headers=v2)
    typer.echo(f"Processed a total of {seen} messages", err=True)


if __name__ == "__main__":
    app()
