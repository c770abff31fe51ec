"""The coordinator's HTTP API: every operation of ``coordinator.api`` at ``POST /v2/<name>``.

Each operation's route is made from its definition (``coordinator.api``): the request
body is a MessagePack map of its arguments, the answer (200) its result in MessagePack.
Beside them::

    GET    /health                  {"status": "ok"} when the db answers
    GET    /metrics                 Prometheus text
    POST   /v1/janitors/{name}/run  NDJSON stream (only with a store): {"progress":
                                    {"done", "total", "what"}} lines, then {"report"}
                                    or {"error", "message"}; 503 JanitorBusyError
                                    <- {"topic", "tier_age_s", "tier_untiered_bytes",
                                        "gc_grace_s"} (all optional, JSON)
    /v1/security/...                users, API keys and ACLs (``coordinator.security.http``)
    /iceberg/...                    the Iceberg REST catalog of the topic tables

``lakelog_coordinator_requests_total{method, route}`` counts every request by route
template (one per operation), so a test or an operator can see how many calls a view
costs.

A request body over ``max_request_bytes`` (``coordinator_max_request_bytes``; a gigabyte
body must not take the memory of the process the whole cluster commits through) is a
413 ``RequestTooLargeError`` (``_BodyLimit``), on every route.

Every ``LakelogError`` is answered as JSON ``{"error": <class name>, "message",
"retriable"}`` with the status from ``_STATUS_BY_ERROR``; a malformed request (a body
that does not decode to the operation's arguments, or arguments the coordinator
refuses with ValueError) is a ``MalformedRequestError`` with status 422. The
coordinator calls block (SQLite), so they run in the threadpool.

Upgrades: this API replaced the per-operation ``/v1`` routes of earlier releases, so
agents and coordinators of one release talk to each other: upgrade the coordinators and
the agents together (agents hold no state; stop the old ones, start the new ones), as
the README's upgrade note says.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import msgspec
import orjson
from fastapi import Body, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.api import MEDIA_TYPE, OPERATIONS, Operation, ServedCoordinator
from coordinator.client import StoreLocation
from coordinator.groups.metrics import GroupLagCollector
from coordinator.janitors.context import JanitorConfig
from coordinator.janitors.leases import Lease
from coordinator.janitors.orphans import find_orphans
from coordinator.janitors.runner import JanitorRunner
from coordinator.log.group_commit import GroupCommitCollector
from coordinator.security.access import RESULT_FILTER, AccessMiddleware, user_of
from coordinator.security.http import install_security_routes
from coordinator.security.settings import AccessSettings
from coordinator.security.store import SecurityStore, SqlSecurityStore
from coordinator.settings import COORDINATOR_MAX_REQUEST_BYTES
from segments.errors import (
    LakelogError,
    MalformedRequestError,
    PartialCommitError,
    RequestTooLargeError,
)
from segments.store import ObjectInfo, ObjectStore, absolute_store_url

if TYPE_CHECKING:
    from coordinator.local import LocalCoordinator

log = logging.getLogger(__name__)

#: Status per error class name; a class without an entry takes its nearest base's.
#: Keyed by name so this table survives additions to the error tree.
_STATUS_BY_ERROR: dict[str, int] = {
    "LakelogError": 500,
    "StorageError": 500,
    "ObjectNotFoundError": 404,
    "PreconditionFailedError": 409,
    "StorageUnavailableError": 503,
    "MetadataError": 500,
    "TopicNotFoundError": 404,
    "PartitionNotFoundError": 404,
    "TopicExistsError": 409,
    "InvalidTopicNameError": 400,
    "InvalidPartitionsError": 400,
    "InvalidConfigError": 400,
    "CommitConflictError": 409,
    "CoordinatorUnavailableError": 503,
    "ClusterNotFoundError": 404,
    "ConfigNotFoundError": 404,
    "ConsumerNotFoundError": 404,
    "ConsumerExistsError": 409,
    "GroupNotFoundError": 404,
    "ConsumerStateError": 409,
    "StaleGenerationError": 409,
    "InvalidConsumerConfigError": 400,
    "InvalidTopicPatternError": 400,
    "NoOffsetError": 409,
    "OffsetOutOfRangeError": 400,
    "ProducerFencedError": 409,
    "ProducerConflictError": 503,
    "TransactionError": 409,
    "ConcurrentTransactionsError": 503,
    "InvalidTxnTimeoutError": 400,
    "TransactionalIdNotFoundError": 404,
    "GroupProtocolConflictError": 409,
    "RebalanceInProgressError": 503,
    "NonEmptyGroupError": 409,
    "JanitorBusyError": 503,
    "BufferFullError": 503,
    "RequestError": 400,
    "MalformedRequestError": 422,
    "UnsupportedMediaTypeError": 415,
    "NotAcceptableError": 406,
    "RequestTooLargeError": 413,
    "RecordTooLargeError": 413,
    "CorruptRecordError": 400,
    "InvalidRecordError": 400,
    "UnprocessableRequestError": 422,
    "SchemaRegistryError": 400,
    "SubjectNotFoundError": 404,
    "VersionNotFoundError": 404,
    "SchemaNotFoundError": 404,
    "SubjectSoftDeletedError": 404,
    "SubjectNotSoftDeletedError": 404,
    "VersionSoftDeletedError": 404,
    "VersionNotSoftDeletedError": 404,
    "SubjectConfigNotFoundError": 404,
    "IncompatibleSchemaError": 409,
    "SchemaConflictError": 503,
    "InvalidSchemaError": 422,
    "InvalidVersionError": 422,
    "InvalidCompatibilityLevelError": 422,
    "InvalidSubjectError": 422,
    "ReferenceExistsError": 422,
    "SecurityError": 400,
    "AuthenticationError": 401,
    "AuthorizationError": 403,
    "LoginThrottledError": 429,
    "PrincipalNotFoundError": 404,
    "PrincipalExistsError": 409,
    "InvalidSecurityRequestError": 400,
}


def status_for(exc: LakelogError) -> int:
    """The HTTP status of an error: its own class's entry, else its nearest base's."""
    for cls in type(exc).__mro__:
        status = _STATUS_BY_ERROR.get(cls.__name__)
        if status is not None:
            return status
    return 500


def error_body(exc: LakelogError) -> dict[str, Any]:
    body: dict[str, Any] = {
        "error": type(exc).__name__,
        "message": exc.message,
        "retriable": exc.retriable,
    }
    if isinstance(exc, PartialCommitError):  # what the shards that answered committed
        body["base_offsets"] = exc.base_offsets
        body["failures"] = [
            None if f is None else {"error": type(f).__name__, "message": f.message}
            for f in exc.failures
        ]
    return body


def _json(data: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status_code, media_type="application/json")


def _malformed(message: str) -> LakelogError:
    return MalformedRequestError(message)


@contextmanager
def _parsing(what: str) -> Iterator[None]:
    """Turn the errors of picking a JSON body apart into MalformedRequestError."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _malformed(f"bad {what} body: {e!r}") from None


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{key} must be a string or null, got {value!r}")
    return value


class _Metrics:
    """One registry per app, so tests can build several apps in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.commits = Counter(
            "lakelog_coordinator_commits",
            "Commits answered, by outcome (ok or the error class).",
            ["outcome"],
            registry=self.registry,
        )
        self.commit_seconds = Histogram(
            "lakelog_coordinator_commit_seconds",
            "Time to apply one commit, successful or not.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )
        self.chunks = Counter(
            "lakelog_coordinator_committed_chunks",
            "Chunks given offsets by successful commits.",
            registry=self.registry,
        )
        self.records = Counter(
            "lakelog_coordinator_committed_records",
            "Records given offsets by successful commits.",
            registry=self.registry,
        )
        self.errors = Counter(
            "lakelog_coordinator_errors",
            "Requests answered with a lakelog error, by class.",
            ["error"],
            registry=self.registry,
        )
        self.requests = Counter(
            "lakelog_coordinator_requests",
            "Requests answered, by method and route template.",
            ["method", "route"],
            registry=self.registry,
        )


class _CountRequests:
    """ASGI middleware: counts each request under its route template once it is answered."""

    def __init__(self, app: ASGIApp, metrics: _Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(scope["method"], route).inc()


class _BodyOverLimit(Exception):
    """Raised from ``_BodyLimit``'s ``receive`` once the body passes the limit: not a
    ``LakelogError``, so no handler inside the app answers it; ``_BodyLimit`` does."""


class _BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413
    ``RequestTooLargeError``. A ``Content-Length`` over it is refused before anything is
    read; otherwise (a chunked body) the bytes are counted as they are received and the
    read stops at the limit, whoever reads: a route, FastAPI's JSON parsing (which would
    make the cut-off a 400) or the access checks, which read a user's commit ahead of the
    route. Outermost, so it also bounds what the access checks read."""

    def __init__(self, app: ASGIApp, limit: int, metrics: _Metrics) -> None:
        self.app = app
        self.limit = limit
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._refuse(send)
                return
        received = 0
        over = False
        started = False

        async def counted() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    over = True
                    raise _BodyOverLimit
            return message

        async def answer(message: Message) -> None:
            nonlocal started
            if over:  # whatever the app made of the cut-off body, it is a 413
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await self._refuse(send)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, answer)
        except _BodyOverLimit:
            if started:  # an answer was under way before the body passed the limit
                raise
        if over and not started:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        exc = RequestTooLargeError(
            f"request body over the coordinator's limit of {self.limit} bytes "
            "(coordinator_max_request_bytes)"
        )
        self.metrics.errors.labels(type(exc).__name__).inc()
        body = orjson.dumps(error_body(exc))
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status_for(exc), "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _Served:
    """What the operations are called on: ``coordinator`` for all but ``StoreView``'s,
    which the server answers from its object store."""

    def __init__(
        self,
        coordinator: ServedCoordinator,
        store: ObjectStore | None,
        location: StoreLocation | None,
    ) -> None:
        self._coordinator = coordinator
        self._store = store
        self._location = location

    def __getattr__(self, name: str) -> Any:
        return getattr(self._coordinator, name)

    def store_location(self) -> StoreLocation | None:
        return self._location

    def find_orphans(self, grace_s: float, prefix: str = "segments/") -> list[ObjectInfo]:
        if self._store is None:
            raise MalformedRequestError("this coordinator has no object store")
        if grace_s < 0:
            raise MalformedRequestError(f"grace_s must not be negative, got {grace_s}")
        return find_orphans(self._store, self._coordinator, grace_s, prefix)


def _operation_route(
    op: Operation, served: _Served, metrics: _Metrics
) -> Callable[[Request], Awaitable[Response]]:
    """The route of one operation: decode its arguments, call it in the threadpool (as the
    caller's principal, where it takes one), answer its result."""
    instrumented = op.name == "commit"

    async def route(request: Request) -> Response:
        body = await request.body()
        principal = user_of(request.scope)

        def run() -> tuple[Any, Any]:
            args = op.decode(body)
            return args, op.invoke(served, args, principal)

        start = time.perf_counter()
        try:
            args, result = await run_in_threadpool(run)
        except (msgspec.DecodeError, ValueError) as e:
            if instrumented:
                metrics.commits.labels("MalformedRequestError").inc()
            raise _malformed(f"bad {op.name} request: {e}") from None
        except LakelogError as e:
            if instrumented:
                metrics.commits.labels(type(e).__name__).inc()
            raise
        finally:
            if instrumented:
                metrics.commit_seconds.observe(time.perf_counter() - start)
        if instrumented:
            chunks = args.chunks
            metrics.commits.labels("ok").inc()
            metrics.chunks.inc(len(chunks))
            metrics.records.inc(sum(c.record_count for c in chunks))
        keep = request.scope.get(RESULT_FILTER)
        if keep is not None:
            result = keep(result)
        return Response(op.answer(result), media_type=MEDIA_TYPE)

    return route


def create_app(
    coordinator: ServedCoordinator,
    store: ObjectStore | None = None,
    location: StoreLocation | None = None,
    *,
    security: SecurityStore | None = None,
    access: AccessSettings | None = None,
    max_request_bytes: int = COORDINATOR_MAX_REQUEST_BYTES,
) -> FastAPI:
    """The coordinator's HTTP API over ``coordinator``; ``store`` enables ``find_orphans``
    and the janitors' route. A request body over ``max_request_bytes`` is a 413.

    ``location`` is what ``store_location`` tells Spark jobs (default: ``store``'s URL, made
    absolute for ``file://``). The caller owns the coordinator and the store and closes
    them after the app stops. ``security`` adds the ``/v1/security`` routes; ``access``
    (the security settings) with authentication on decides who may call each route
    (``coordinator.security.access``), and how ``POST /v1/security/authorize`` decides.
    """
    if location is None and store is not None:
        location = StoreLocation(absolute_store_url(store.url))
    app = FastAPI(title="lakelog coordinator", docs_url=None, redoc_url=None)
    metrics = _Metrics()
    app.state.metrics = metrics
    app.add_middleware(_CountRequests, metrics=metrics)
    access = access or AccessSettings()
    if access.authentication != "none":
        if security is None:
            raise ValueError("authentication needs the security store")
        app.add_middleware(
            AccessMiddleware,
            settings=access,
            security=security,
            coordinator=coordinator,
            registry=metrics.registry,
        )
    if max_request_bytes <= 0:
        raise ValueError(f"max_request_bytes must be > 0, got {max_request_bytes}")
    # Added last, so outermost: it bounds what AccessMiddleware reads too.
    app.add_middleware(_BodyLimit, limit=max_request_bytes, metrics=metrics)
    if security is not None:
        install_security_routes(app, security, access)

    @app.exception_handler(LakelogError)
    async def lakelog_error(request: Request, exc: LakelogError) -> Response:
        metrics.errors.labels(type(exc).__name__).inc()
        return _json(error_body(exc), status_for(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()))
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return await lakelog_error(request, _malformed("; ".join(parts)))

    # -- health and metrics -----------------------------------------------------

    @app.get("/health")
    def health() -> Response:
        try:
            # A real query (not a cached value) so a dead database shows here.
            coordinator.committed_object_keys(["__health__"])
        except Exception as e:
            return _json({"status": "unavailable", "message": str(e)}, 503)
        return _json({"status": "ok"})

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- the operations ---------------------------------------------------------

    served = _Served(coordinator, store, location)
    for op in OPERATIONS.values():
        app.add_api_route(
            op.path,
            _operation_route(op, served, metrics),
            methods=["POST"],
            name=op.name,
            response_class=Response,
        )

    # -- janitors ---------------------------------------------------------------

    if store is not None:

        @app.post("/v1/janitors/{name}/run")
        async def run_janitor_now(
            name: str, request: Request, body: dict[str, Any] | None = Body(None)
        ) -> Response:
            runner: JanitorRunner | None = getattr(request.app.state, "janitor_runner", None)
            if runner is None:
                raise MalformedRequestError("this coordinator runs no janitors")
            with _parsing("run janitor"):
                topic, overrides = _janitor_request(body or {})
                config = replace(runner.config, **overrides)
            try:
                lease = await run_in_threadpool(runner.take_lease, name)
            except ValueError as e:
                raise _malformed(str(e)) from None
            return StreamingResponse(
                _janitor_events(runner, lease, config, topic), media_type="application/x-ndjson"
            )

    return app


#: What a request to run a janitor now may change for that run.
_JANITOR_OVERRIDES = {"tier_age_s": float, "tier_untiered_bytes": int, "gc_grace_s": float}


def _janitor_request(body: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(topic, config overrides) of a run-now request. Raises KeyError/TypeError/ValueError."""
    unknown = set(body) - {"topic", *_JANITOR_OVERRIDES}
    if unknown:
        raise KeyError(f"unknown fields {sorted(unknown)}")
    topic = _opt_str(body, "topic")
    overrides = {}
    for key, kind in _JANITOR_OVERRIDES.items():
        value = body.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{key} must be a number, got {value!r}")
            overrides[key] = kind(value)
    return topic, overrides


async def _janitor_events(
    runner: JanitorRunner, lease: Lease, config: JanitorConfig, topic: str | None
) -> AsyncIterator[bytes]:
    """Run a janitor on its own thread; one NDJSON line per progress step, then
    ``{"report": ...}`` or ``{"error", "message"}``. A client that goes away does not
    stop the run: it holds the lease until it ends."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def emit(event: dict[str, Any] | None) -> None:
        loop.call_soon_threadsafe(events.put_nowait, event)

    def progress(done: int, total: int, what: str) -> None:
        emit({"progress": {"done": done, "total": total, "what": what}})

    def work() -> None:
        try:
            report = runner.run_lease(lease, config, topic, progress)
            emit({"report": report.as_dict()})
        except Exception as e:
            emit({"error": type(e).__name__, "message": str(e)})
        finally:
            emit(None)

    threading.Thread(target=work, name=f"janitor-{lease.name}-now", daemon=True).start()
    while (event := await events.get()) is not None:
        yield orjson.dumps(event) + b"\n"


def create_process_app(
    coordinator: LocalCoordinator,
    store: ObjectStore | None,
    janitors: JanitorConfig | None,
    location: StoreLocation | None = None,
    access: AccessSettings | None = None,
    max_request_bytes: int = COORDINATOR_MAX_REQUEST_BYTES,
) -> FastAPI:
    """The app ``lakelog coordinator`` serves: the API, and on its /metrics the consumer
    groups' lag and, with a store, the janitors' (whose runner, not started, is
    ``app.state.janitor_runner``) and the Iceberg REST catalog of the topic tables at
    ``/iceberg`` (``coordinator.iceberg.rest``; it authenticates its own callers)."""
    from coordinator.janitors.runner import JanitorMetrics

    app = create_app(
        coordinator,
        store,
        location,
        security=SqlSecurityStore(coordinator.db),
        access=access,
        max_request_bytes=max_request_bytes,
    )
    app.state.metrics.registry.register(GroupLagCollector(coordinator.group_lag))
    app.state.metrics.registry.register(GroupCommitCollector(coordinator.store.group_commit_stats))
    app.state.janitor_runner = None
    if store is not None:
        from coordinator.iceberg.rest import MOUNT, create_catalog_app, lazy_service

        settings = access or AccessSettings()
        catalog = lazy_service(
            coordinator,
            store,
            SqlSecurityStore(coordinator.db),
            authenticate=settings.authentication != "none" or settings.authorization == "acl",
            acl=settings.authorization == "acl",
            super_users=settings.super_users,
            endpoint=location.endpoint if location else None,
            region=location.region if location else None,
        )
        app.mount(MOUNT, create_catalog_app(catalog))
        metrics = JanitorMetrics(app.state.metrics.registry)
        app.state.janitor_runner = JanitorRunner(
            coordinator, store, janitors or JanitorConfig(), metrics=metrics
        )
    return app


def run(
    db_url: str,
    host: str = "127.0.0.1",
    port: int = 8083,
    store_url: str | None = None,
    store_endpoint: str | None = None,
    cluster_id: str | None = None,
    janitors: JanitorConfig | None = None,
    store_region: str | None = None,
    access: AccessSettings | None = None,
    tls: tuple[str, str | None] | None = None,
    db_shards: Sequence[str] = (),
    max_request_bytes: int = COORDINATOR_MAX_REQUEST_BYTES,
) -> None:
    """Serve a coordinator over ``db_url`` with uvicorn until interrupted (HTTPS with
    ``tls``: certificate and key files). ``db_shards``: shard databases (``db_url`` is
    then the catalog; ``coordinator.shards``).

    ``janitors``: which janitors to run in the background, and how (they need
    ``store_url``). With a store, janitors can also be run now through the API, and
    their lag is on /metrics, whether or not any runs in the background.
    """
    import uvicorn

    from coordinator.local import LocalCoordinator
    from segments.store import open_store

    if janitors is not None and janitors.enabled and not store_url:
        raise ValueError("janitors need the object store: pass --store")
    coordinator = LocalCoordinator(db_url, cluster_id=cluster_id, shards=db_shards)
    store = (
        open_store(store_url, endpoint_url=store_endpoint, region=store_region)
        if store_url
        else None
    )
    runner: JanitorRunner | None = None
    try:
        location = (
            StoreLocation(absolute_store_url(store_url), store_endpoint, store_region)
            if store_url
            else None
        )
        app = create_process_app(coordinator, store, janitors, location, access, max_request_bytes)
        runner = app.state.janitor_runner
        if runner is not None:
            runner.start()
        log.info(
            "lakelog coordinator on http://%s:%d (db %s, %d shard(s), store %s, cluster %s)",
            host,
            port,
            coordinator.db.location,
            len(db_shards),
            store_url or "none",
            coordinator.cluster_id(),
        )
        cert, key = tls or (None, None)
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            ssl_certfile=cert,
            ssl_keyfile=key,
        )
    finally:
        if runner is not None:
            runner.stop()
        if store is not None:
            store.close()
        coordinator.close()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m coordinator.http.server --db sqlite:///... --port 8083``."""
    p = argparse.ArgumentParser(prog="python -m coordinator.http.server")
    p.add_argument("--db", required=True, help="metadata store URL, e.g. sqlite:///./meta.db")
    p.add_argument(
        "--db-shard",
        action="append",
        default=[],
        help="a shard database URL (repeatable): --db is then the catalog",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8083)
    p.add_argument("--store", default=None, help="object store URL (for find_orphans, janitors)")
    p.add_argument("--store-endpoint", default=None, help="S3 endpoint (MinIO, moto)")
    p.add_argument("--store-region", default=None, help="S3 region")
    p.add_argument("--cluster-id", default=None, help="cluster id for a new database")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    run(
        a.db,
        a.host,
        a.port,
        a.store,
        a.store_endpoint,
        a.cluster_id,
        store_region=a.store_region,
        db_shards=a.db_shard,
    )


if __name__ == "__main__":
    main()
