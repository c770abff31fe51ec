"""The agent's FastAPI app: ``create_app(settings)`` with a lifespan that owns every client.

Nothing is built at import time. The lifespan opens the coordinator client
(in-process ``LocalCoordinator`` when ``settings.coordinator`` is empty, else
``HttpCoordinator``), the object store, the log writer, metrics and the write
batcher; registers the agent with the coordinator (agents are the cluster's
brokers) and keeps heartbeating; and closes all of it on shutdown, flushing the
batcher first. Blocking calls run on bounded pools, one per kind of work
(``service.executors``), so a slow store cannot starve flushes or the heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast
from urllib.parse import urlsplit

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from coordinator.client import Coordinator, TransactionCoordinator
from coordinator.groups.model import GroupCoordinator
from coordinator.janitors.context import JanitorConfig
from coordinator.schemas.model import SchemaStore
from coordinator.security.model import parse_super_users
from index.cache import IndexCache
from index.log import LogWriter
from segments.errors import CoordinatorUnavailableError, LakelogError
from segments.store import ObjectStore, open_store
from service import errors
from service import executors as executors_module
from service.consume.metrics import ConsumeMetrics
from service.consume.notify import Notifier
from service.consume.sessions import ConsumerSessions
from service.coordinator_api import start_coordinator_api
from service.executors import ExecutorCollector, Executors, Kind
from service.kafka import transactions
from service.kafka.server import KafkaServer
from service.metrics import Metrics
from service.produce.batcher import Batcher
from service.produce.topic_cache import TopicCache
from service.read_cache import CachingLogReader, RangeCache
from service.registry import routes as registry_routes
from service.registry.core import RegistryMetrics, SchemaRegistry
from service.security import install as security
from service.security import routes as security_routes
from service.security.quotas import QuotaMiddleware
from service.settings import Settings, get_settings
from service.state import AgentState, StateDep
from service.v2 import consumers as v2_consumers
from service.v2 import metadata as v2_metadata
from service.v2 import produce as v2_produce
from service.v3 import acls as v3_acls
from service.v3 import brokers as v3_brokers
from service.v3 import clusters as v3_clusters
from service.v3 import configs as v3_configs
from service.v3 import consume as v3_consume
from service.v3 import consumer_groups as v3_consumer_groups
from service.v3 import group_admin as v3_group_admin
from service.v3 import group_stream as v3_group_stream
from service.v3 import partitions as v3_partitions
from service.v3 import records as v3_records
from service.v3 import topics as v3_topics
from service.v3.common import broker_max_age_s, call
from service.version import lakelog_version
from service.web import install_middleware

log = logging.getLogger(__name__)

#: How long start-up waits for a coordinator that is not answering yet.
COORDINATOR_WAIT_S = 30.0


def build_coordinator(settings: Settings) -> Coordinator:
    """The coordinator client the settings ask for."""
    urls = settings.coordinator_urls()
    if urls:
        from coordinator.http.client import http_coordinator
        from coordinator.security.wire import secret_headers

        return http_coordinator(
            urls,
            headers=secret_headers(settings.shared_secret()),
            verify=settings.coordinator_verify(),
        )
    from coordinator.local import LocalCoordinator

    return LocalCoordinator(settings.db, cluster_id=settings.cluster_id, shards=settings.db_shards)


def as_group_coordinator(coordinator: Coordinator) -> GroupCoordinator:
    """The coordinator client's consumer-group side (both clients implement both)."""
    missing = [
        name
        for name in ("create_consumer", "consumer", "advance", "describe_group")
        if not callable(getattr(coordinator, name, None))
    ]
    if missing:
        log.warning("coordinator client %r has no consumer-group API (%s)", coordinator, missing)
    return cast(GroupCoordinator, coordinator)


def register_coordinator_metrics(metrics: Metrics, coordinator: Coordinator) -> None:
    """``lakelog serve``: the in-process coordinator's consumer-group lag on this /metrics
    (a coordinator process exports it on its own)."""
    from coordinator.groups.metrics import GroupLagCollector
    from coordinator.local import LocalCoordinator

    if isinstance(coordinator, LocalCoordinator):
        metrics.registry.register(GroupLagCollector(coordinator.group_lag))


def build_read_path(
    settings: Settings, store: ObjectStore, coordinator: Coordinator, metrics: Metrics
) -> tuple[CachingLogReader, Notifier, ConsumeMetrics]:
    """The caching reader and the fetch notifier, with their metrics on ``metrics.registry``."""
    consume_metrics = ConsumeMetrics(metrics.registry)
    cache = RangeCache(
        settings.read_cache_tail_bytes, settings.read_cache_history_bytes, consume_metrics
    )
    index = IndexCache(settings.index_cache_entries, settings.index_cache_ttl_s)
    reader = CachingLogReader(
        store,
        coordinator,
        cache,
        index,
        metrics=consume_metrics,
        read_ahead=settings.read_ahead_chunks,
    )
    notifier = Notifier(
        coordinator.offsets_many, settings.hw_poll_interval_ms / 1000, consume_metrics
    )
    return reader, notifier, consume_metrics


def broker_address(settings: Settings) -> tuple[str, int]:
    """The host and port this agent registers as a broker: advertised, else listened on."""
    if settings.advertised_url:
        parts = urlsplit(settings.advertised_url)
        default_port = 443 if parts.scheme == "https" else 80
        return parts.hostname or "localhost", parts.port or default_port
    host = settings.host
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return host, settings.port


_ANY_HOST = ("", "0.0.0.0", "::")


def kafka_address(settings: Settings, bound_port: int) -> tuple[str, int]:
    """The host and port this agent registers for its Kafka listener (what Metadata tells
    clients about it when another agent answers).

    ``kafka_advertised`` if set; else the listen host; listening on every interface, the
    address of the one this machine reaches the coordinator through (the cluster's
    network), never the host name, which clients elsewhere or in containers may not
    resolve. Never the REST ``advertised_url``'s host: that is often a load balancer,
    and Kafka clients must reach each broker itself. (This agent's own answers name the
    address each connection reached: :func:`kafka_advertises_per_connection`.)
    """
    if settings.kafka_advertised:
        host, _, port = settings.kafka_advertised.rpartition(":")
        return host, int(port)
    host = settings.host
    if host in _ANY_HOST:
        host = _address_toward(settings.coordinator_urls()) or socket.gethostname()
    return host, bound_port


def kafka_advertises_per_connection(settings: Settings) -> bool:
    """Whether this agent's Kafka answers name, for itself, the address each connection
    reached (no ``kafka_advertised``, listening on every interface)."""
    return not settings.kafka_advertised and settings.host in _ANY_HOST


def _address_toward(urls: list[str]) -> str | None:
    """The local address of the interface that routes to the first URL's host (a UDP
    socket's connect sends nothing), or None (no URL, or no route)."""
    host = urlsplit(urls[0]).hostname if urls else None
    if not host:
        return None
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(address)
            return str(s.getsockname()[0])
    except OSError:
        return None


def _close(obj: object) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        close()


async def _wait_for_cluster_id(coordinator: Coordinator) -> str:
    """The cluster id; waits up to COORDINATOR_WAIT_S for a coordinator still starting."""
    deadline = time.monotonic() + COORDINATOR_WAIT_S
    delay = 0.1
    while True:
        try:
            return await call(coordinator.cluster_id)
        except CoordinatorUnavailableError as e:
            if time.monotonic() > deadline:
                raise
            log.warning("coordinator not answering yet (%s); retrying", e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)


async def heartbeat_once(state: AgentState) -> None:
    """Register or refresh this agent; learn its broker id (on the ``heartbeat`` pool)."""
    host, port = broker_address(state.settings)
    kafka_host, kafka_port = state.kafka_address or ("", 0)
    broker_id = await state.executors.run(
        Kind.HEARTBEAT,
        state.coordinator.heartbeat_agent,
        state.settings.agent_id,
        host,
        port,
        kafka_host,
        kafka_port,
    )
    if broker_id != state.broker_id:
        log.info("agent %s is broker %d (%s:%d)", state.settings.agent_id, broker_id, host, port)
        state.broker_id = broker_id


async def heartbeat_loop(state: AgentState) -> None:
    """Heartbeat every ``heartbeat_interval_s``; a failure is logged and retried next time.

    Any exception, not only lakelog's, is logged (with its traceback when unexpected)
    and counted: the loop must outlive a bad answer, or the agent would silently be
    declared dead.
    """
    while True:
        await asyncio.sleep(state.settings.heartbeat_interval_s)
        try:
            await heartbeat_once(state)
        except LakelogError as e:
            state.metrics.heartbeat_failures.inc()
            log.warning("heartbeat failed: %s", e)
        except Exception:
            state.metrics.heartbeat_failures.inc()
            log.exception("heartbeat failed unexpectedly; retrying")


async def _start_janitors(
    stack: AsyncExitStack,
    coordinator: Coordinator,
    store: ObjectStore,
    config: JanitorConfig,
    metrics: Metrics,
) -> None:
    """Run the janitors in this process (``lakelog serve``), stopped with the app."""
    from coordinator.janitors.runner import JanitorMetrics, JanitorRunner
    from coordinator.local import LocalCoordinator

    if not isinstance(coordinator, LocalCoordinator):
        log.info("janitors left to the coordinator processes")
        return
    runner = JanitorRunner(coordinator, store, config, metrics=JanitorMetrics(metrics.registry))
    runner.start()
    # Stopping waits for the current unit of work: off the event loop.
    stack.push_async_callback(asyncio.to_thread, runner.stop)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    async with AsyncExitStack() as stack:
        coordinator = build_coordinator(settings)
        stack.callback(_close, coordinator)
        store = open_store(
            settings.store, endpoint_url=settings.store_endpoint, region=settings.store_region
        )
        stack.callback(store.close)
        executors = Executors(
            {Kind.COORDINATOR: settings.coordinator_threads, Kind.READ: settings.read_threads}
        )
        stack.callback(executors.shutdown)  # after everything below has stopped
        executors_module.install(executors)
        stack.callback(executors_module.install, None)
        cluster_id = await _wait_for_cluster_id(coordinator)
        writer = LogWriter(store, coordinator)
        metrics = Metrics()
        metrics.registry.register(ExecutorCollector(executors))
        register_coordinator_metrics(metrics, coordinator)
        reader, notifier, consume_metrics = build_read_path(settings, store, coordinator, metrics)
        notifier.attach(asyncio.get_running_loop())
        stack.callback(reader.close)
        stack.push_async_callback(notifier.close)
        # Write-through into the read cache first, then wake the waiting fetches.
        writer.listeners.append(reader.cache.on_write)
        writer.listeners.append(notifier.on_write)
        batcher = Batcher(writer, settings, metrics, offload=executors[Kind.FLUSH].run)
        await batcher.start()
        stack.push_async_callback(batcher.close)  # flushes what is buffered
        topics = TopicCache(
            coordinator,
            settings.metadata_ttl_s,
            auto_create=settings.auto_create_topics,
            default_partitions=settings.default_partitions,
        )
        reader.decompressed_limit = topics.max_decompressed_bytes
        groups = as_group_coordinator(coordinator)
        consumers = ConsumerSessions(
            groups,
            heartbeat_interval_ms=settings.consumer_heartbeat_interval_ms,
            lease_ms=settings.consumer_fetch_lease_ms,
            fetch_memory_bytes=settings.consumer_fetch_memory_bytes,
            run=call,
            metrics=consume_metrics,
        )
        state = AgentState(
            settings=settings,
            coordinator=coordinator,
            store=store,
            writer=writer,
            batcher=batcher,
            topics=topics,
            metrics=metrics,
            broker_id=-1,
            cluster_id=cluster_id,
            groups=groups,
            txns=cast(TransactionCoordinator, coordinator),
            reader=reader,
            notifier=notifier,
            consume_metrics=consume_metrics,
            registry=SchemaRegistry(
                cast(SchemaStore, coordinator),
                RegistryMetrics(metrics.registry),
                latest_ttl_s=settings.metadata_ttl_s,
            ),
            executors=executors,
            consumers=consumers,
        )
        security.start(app, settings, coordinator, metrics.registry)
        if settings.kafka_port:
            kafka = KafkaServer(
                state,
                settings.host,
                settings.kafka_port,
                authenticator=app.state.authenticator
                if settings.authentication != "none"
                else None,
                tls=settings.server_tls(),
                acl=app.state.acl_cache if settings.authorization == "acl" else None,
                reuse_port=settings.workers > 1,
            )
            await kafka.start()
            state.kafka_address = kafka_address(settings, kafka.port)
            kafka.advertise(
                state.kafka_address,
                per_connection=kafka_advertises_per_connection(settings),
            )
            stack.push_async_callback(kafka.close)  # before the batcher's flush-and-close
            # Transactions come through the Kafka door: its agents abort those past their
            # timeout and finish the markers of those whose writer went away.
            expiry = asyncio.create_task(
                transactions.expiry_loop(state), name="lakelog-transaction-expiry"
            )

            async def _stop_expiry() -> None:
                expiry.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await expiry

            stack.push_async_callback(_stop_expiry)
        try:
            await heartbeat_once(state)
        except LakelogError as e:
            log.warning("first heartbeat failed, will retry: %s", e)
        task = asyncio.create_task(heartbeat_loop(state), name="lakelog-heartbeat")

        async def _stop_heartbeat() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        stack.push_async_callback(_stop_heartbeat)
        consumer_heartbeat = asyncio.create_task(
            consumers.heartbeat_loop(), name="lakelog-consumer-heartbeat"
        )

        async def _stop_consumer_heartbeat() -> None:
            consumer_heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer_heartbeat

        stack.push_async_callback(_stop_consumer_heartbeat)
        app.state.agent = state
        app.state.iceberg = lazy_catalog(settings, coordinator, store, app)
        janitors: JanitorConfig | None = app.state.janitors
        if janitors is not None and janitors.enabled:
            await _start_janitors(stack, coordinator, store, janitors, metrics)
        from coordinator.local import LocalCoordinator

        if app.state.coordinator_api and isinstance(coordinator, LocalCoordinator):
            await start_coordinator_api(stack, settings, coordinator, store, janitors)
        log.info(
            "lakelog agent %s up: cluster %s, coordinator %s, store %s",
            settings.agent_id,
            cluster_id,
            settings.coordinator or f"in-process ({settings.db})",
            settings.store,
        )
        # What startup built (modules, the app, clients, the coordinator's engine) lives as
        # long as the agent: out of the garbage collector's sight, or every full collection
        # walks all of it again (45% of the event loop's CPU under REST produce).
        gc.collect()
        gc.freeze()
        yield
        gc.unfreeze()


def lazy_catalog(
    settings: Settings, coordinator: Coordinator, store: ObjectStore, app: FastAPI
) -> Callable[[], Any] | None:
    """``lakelog serve``: the Iceberg REST catalog of the in-process coordinator's topic
    tables (``coordinator.iceberg.rest``, built at its first request); None for an agent of
    coordinator processes (they serve it)."""
    from coordinator.iceberg.rest import lazy_service
    from coordinator.local import LocalCoordinator

    if not isinstance(coordinator, LocalCoordinator):
        return None
    return lazy_service(
        coordinator,
        store,
        app.state.security_store,
        authenticate=settings.authentication != "none",
        acl=settings.authorization == "acl",
        super_users=parse_super_users(settings.super_users),
        endpoint=settings.store_endpoint,
        region=settings.store_region,
    )


async def health(state: StateDep) -> JSONResponse:
    """200 while the coordinator answers, else 503."""
    try:
        agents = await call(state.coordinator.list_agents, broker_max_age_s(state))
    except LakelogError as e:
        return JSONResponse({"status": "unavailable", "error": e.message}, status_code=503)
    body: dict[str, Any] = {
        "status": "ok",
        "cluster_id": state.cluster_id,
        "broker_id": state.broker_id,
        "agent_id": state.settings.agent_id,
        "brokers": len(agents),
    }
    return JSONResponse(body)


async def metrics(state: StateDep) -> Response:
    """Prometheus text format of this agent's metrics."""
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


def create_app(
    settings: Settings | None = None,
    *,
    janitors: JanitorConfig | None = None,
    coordinator_api: bool = False,
) -> FastAPI:
    """The agent app. ``settings`` default to ``get_settings()`` (the environment).

    ``janitors``: run these in the background when the coordinator is in-process
    (``lakelog serve``); an agent of coordinator processes leaves them to those.
    ``coordinator_api``: with the coordinator in-process, also answer its HTTP API on
    ``settings.coordinator_port`` (``lakelog serve``; ``service.coordinator_api``).
    """
    settings = settings if settings is not None else get_settings()
    app = FastAPI(
        # Both forms of every path are served (service.web strips a trailing slash):
        # no 307 that curl would not follow on a POST.
        redirect_slashes=False,
        title="lakelog",
        summary="A diskless Kafka-style log: Confluent REST Proxy API on an object store.",
        version=lakelog_version(),
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.janitors = janitors
    app.state.coordinator_api = coordinator_api
    # No dependency_overrides: with any override set, FastAPI rebuilds the dependant of
    # every dependency of every request (``get_dependant``, signature inspection), ~10%
    # of a produce request's CPU. Routes reach the settings through ``get_state``.
    errors.install_error_handlers(app)
    # Innermost, inside authentication: quotas charge the authenticated principal (a
    # throttled request costs its authentication, cached, and nothing else). Security is
    # inside the body limit, trailing-slash and proxy-header middleware added next.
    app.add_middleware(QuotaMiddleware)
    security.install(app, settings)
    install_middleware(app, settings)
    app.add_api_route("/health", health, methods=["GET"], tags=["ops"])
    # The Iceberg REST catalog (lakelog serve: an in-process coordinator; built in the
    # lifespan, None until then and for agents of coordinator processes).
    from coordinator.iceberg.rest import MOUNT, create_catalog_app

    app.state.iceberg = None
    app.mount(MOUNT, create_catalog_app(lambda: app.state.iceberg and app.state.iceberg()))
    app.add_api_route("/metrics", metrics, methods=["GET"], tags=["ops"])
    # Produce first: FastAPI matches a request against the routes in order (about 65
    # match attempts per v2 produce when it came after the v3 and v2 metadata routes,
    # ~15% of a produce request's CPU). No other POST route matches their paths, and
    # an other method's request still finds its route (a method mismatch is only a
    # partial match; the 405's Allow lists every route's methods, service.web).
    # Then v3: the v2 root routes are all literal or under /topics, /brokers.
    for router in (
        v2_produce.router,
        v3_records.router,
        v3_clusters.router,
        v3_brokers.router,
        v3_acls.router,
        v3_configs.router,  # before topics: /topics/-/configs
        v3_group_stream.router,  # before consumer groups: .../consumer-groups/{g}/records
        v3_consumer_groups.router,
        v3_group_admin.router,
        v3_consume.router,  # before partitions: .../partitions/{p}/records
        v3_partitions.router,
        v3_topics.router,
        v2_metadata.router,
        v2_consumers.router,
        registry_routes.router,
        security_routes.router,
    ):
        app.include_router(router)
    # Ahead of them all: the produce routes without FastAPI's per-request dependency
    # solving (service.web.ShortcutRoute).
    app.router.routes[:0] = [*v2_produce.SHORTCUTS, *v3_records.SHORTCUTS]
    return app
