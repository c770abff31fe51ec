"""The coordinator's HTTP API: the Coordinator Protocol as a small JSON API under ``/v1``.

Routes (wire format in ``coordinator.http.client``; topic ids are hex)::

    GET    /health                           {"status": "ok"} when the db answers
    GET    /metrics                          Prometheus text
    GET    /v1/cluster                       {"cluster_id"}
    GET    /v1/topics                        {"topics": [topic]}
    POST   /v1/topics                        topic (201; 200 if validate_only)
                                             <- {"name", "partitions", "configs", "validate_only"}
    GET    /v1/topics/{name}                 topic
    DELETE /v1/topics/{name}                 204
    POST   /v1/topics/{name}/partitions      topic  <- {"partitions"}
    POST   /v1/topics/{name}/configs         topic  <- {"set", "delete", "validate_only"}
    GET    /v1/broker-configs                {"configs": {name: value}}  (cluster-wide)
    POST   /v1/broker-configs                {"configs"}  <- {"set", "delete", "validate_only"}
    GET    /v1/topics/{name}/partitions/{p}/offsets                 {"log_start", "high_watermark"}
    POST   /v1/offsets                       {"offsets": [tp + log_start + high_watermark]}
                                             <- {"partitions": [tp]}  (unknown ones left out)
    GET    /v1/topics/{name}/partitions/{p}/lookup?offset=&max_chunks=   {"chunks": [ref]}
    GET    /v1/topics/{name}/partitions/{p}/lookup-timestamp?ts=         {"chunk": ref | null}
    POST   /v1/topics/{name}/partitions/{p}/delete-records  {"log_start"}  <- {"offset"}
    GET    /v1/topic-ids/{hex}               topic
    POST   /v1/commit                        {"base_offsets"}  <- {"object_key", "chunks"}
                                             (sharded metadata, some shards failed: 503
                                             PartialCommitError with "base_offsets" [int |
                                             null] and "failures" [null | {"error",
                                             "message"}], one per chunk)
    POST   /v1/producers/init                {"producer_id", "epoch"}  <- {"producer_id", "epoch"}
    POST   /v1/producers/state               {"states": [{"topic_id", "partition", "epoch",
                                             "batches"}]}  <- {"producer_id", "partitions"}
    POST   /v1/objects/committed             {"committed": [key]}  <- {"keys"}
    POST   /v1/objects/pending               {"deleted": [key]}  <- {"lease_id", "keys", "ttl_s"}
                                             (a user's call: only its own leases, 403)
    POST   /v1/objects/pending/release       {}  <- {"lease_id"}  (the same)
    POST   /v1/objects/pending/live          {"pending": [key]}  <- {"keys"}
    POST   /v1/agents/heartbeat              {"broker_id"}  <- {"agent_id", "host", "port",
                                                               "kafka_host", "kafka_port"}
    GET    /v1/agents?max_age_s=             {"agents": [agent]}
    GET    /v1/orphans?grace_s=&prefix=      {"orphans": [object]}  (only with a store)
    POST   /v1/janitors/{name}/run           NDJSON stream (only with a store): {"progress":
                                             {"done", "total", "what"}} lines, then {"report"}
                                             or {"error", "message"}; 503 JanitorBusyError
                                             <- {"topic", "tier_age_s", "tier_untiered_bytes",
                                                 "gc_grace_s"} (all optional)
    GET    /v1/store                         {"url", "endpoint", "region"}: where the objects
                                             are, for Spark jobs (nulls without a store;
                                             never credentials)

    Kafka consumer groups (KafkaGroupCoordinator): POST /v1/kafka-groups/{join, sync,
    heartbeat, leave, commit, committed, describe, delete}, each naming the group (and
    member) in the body; bytes (protocol metadata, assignments) travel as hex.

    Consumer groups (GroupCoordinator). Each call is a POST naming the group and the
    instance in the body, never in the path: every one may write (expiry, timers), and
    names may hold characters a path would need escaped. tp = {"topic", "partition"}.

    GET    /v1/groups                        {"groups": [group id]}
    POST   /v1/groups/describe               group  <- {"group"}
    POST   /v1/groups/committed              {"offsets": [committed]}
                                             <- {"group", "partitions": [tp]}
    POST   /v1/groups/alter-offsets          204  <- {"group", "offsets": [tp + offset + metadata]}
    POST   /v1/groups/delete                 204  <- {"group"}
    POST   /v1/consumers/create              consumer (201)  <- {"group", "name", "config"}
    POST   /v1/consumers/delete              204  <- {"group", "name"}
    POST   /v1/consumers/get                 consumer  <- {"group", "name", "touch"}
    POST   /v1/consumers/subscribe           consumer  <- {"group", "name", "topics", "pattern"}
    POST   /v1/consumers/unsubscribe         204  <- {"group", "name"}
    POST   /v1/consumers/assign              consumer  <- {"group", "name", "partitions": [tp]}
    POST   /v1/consumers/seek                204  <- {"group", "name", "positions": [tp + offset]}
    POST   /v1/consumers/advance             consumer
                                             <- {"group", "name", "generation", "positions"}
    POST   /v1/consumers/commit              204  <- {"group", "name", "generation" | null,
                                                      "offsets": [tp + offset + metadata]}
    POST   /v1/consumers/fetch/begin         lease  <- {"group", "name", "token", "lease_ms"}
    POST   /v1/consumers/fetch/confirm       lease  <- {"group", "name", "token", "start",
                                                        "lease_ms"}
    POST   /v1/consumers/fetch/end           204  <- {"group", "name", "token",
                                                      "positions" | null}
    POST   /v1/consumers/heartbeat           {"gone": [{"group", "name"}]}
                                             <- {"members": [{"group", "name", "token"}],
                                                 "lease_ms"}

    lease = {"state": consumer, "token" | null, "ok", "busy_for_s"}.

``lakelog_coordinator_requests_total{method, route}`` counts every request by route
template, so a test or an operator can see how many calls a view costs.

    Schema registry (SchemaStore). Subjects travel in bodies, as group names do.
    ref = {"name", "subject", "version"}; sv = {"subject", "version", "deleted",
    "schema": {"schema_id", "schema_type", "schema", "references": [ref]}}.

    POST   /v1/schemas/register              sv  <- {"subject", "schema_type", "schema",
                                                      "references", "expected_versions" | null}
    POST   /v1/schemas/get                   schema  <- {"schema_id"}
    POST   /v1/schemas/uses                  {"versions": [[subject, version]]}
                                             <- {"schema_id", "deleted"}
    POST   /v1/schemas/subjects              {"subjects"}  <- {"deleted"}
    POST   /v1/schemas/versions              {"versions"}  <- {"subject", "deleted"}
    POST   /v1/schemas/version               sv  <- {"subject", "version", "deleted"}
    POST   /v1/schemas/find                  sv  <- {"subject", "schema_type", "schema",
                                                      "references", "deleted"}
    POST   /v1/schemas/delete-subject        {"versions"}  <- {"subject", "permanent"}
    POST   /v1/schemas/delete-version        {"version"}  <- {"subject", "version", "permanent"}
    POST   /v1/schemas/referenced-by         {"ids"}  <- {"subject", "version"}
    POST   /v1/schemas/config/get            {"compatibility"}  <- {"subject" | null}
    POST   /v1/schemas/config/set            {"compatibility"}  <- {"subject" | null, "level"}
    POST   /v1/schemas/config/delete         {"compatibility"}  <- {"subject" | null}

Every ``LakelogError`` is answered as ``{"error": <class name>, "message", "retriable"}``
with the status from ``_STATUS_BY_ERROR``; a malformed request is a ``MalformedRequestError``
with status 422. The coordinator calls block (SQLite), so they run in the threadpool.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from fastapi import Body, FastAPI, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator.client import Coordinator
from coordinator.groups.kafka import KafkaGroupCoordinator
from coordinator.groups.metrics import GroupLagCollector
from coordinator.groups.model import GroupCoordinator
from coordinator.http.client import (
    agent_to_json,
    assignment_from_json,
    chunk_commit_from_json,
    chunk_ref_to_json,
    committed_from_json,
    committed_to_json,
    consumer_config_from_json,
    consumer_state_to_json,
    fetch_lease_to_json,
    group_info_to_json,
    heartbeat_from_json,
    heartbeat_result_to_json,
    join_result_to_json,
    kafka_group_to_json,
    object_info_to_json,
    offsets_to_json,
    partition_offsets_to_json,
    positions_from_json,
    reference_from_json,
    store_location_to_json,
    stored_schema_to_json,
    subject_version_to_json,
    topic_to_json,
    tp_from_json,
)
from coordinator.janitors.context import JanitorConfig
from coordinator.janitors.leases import Lease
from coordinator.janitors.orphans import find_orphans
from coordinator.janitors.runner import JanitorRunner
from coordinator.log.group_commit import GroupCommitCollector
from coordinator.schemas.model import LATEST, SchemaStore
from coordinator.security.access import AccessMiddleware, user_of
from coordinator.security.http import install_security_routes
from coordinator.security.settings import AccessSettings
from coordinator.security.store import SecurityStore, SqlSecurityStore
from segments.errors import LakelogError, MalformedRequestError, PartialCommitError
from segments.store import ObjectStore, absolute_store_url
from segments.types import StoreLocation, TopicPartition

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


#: The options of ``KafkaGroupStore.consumer_heartbeat`` a request may carry.
_HEARTBEAT_OPTIONS = (
    "instance_id",
    "rack_id",
    "rebalance_timeout_ms",
    "subscribed_topic_names",
    "subscribed_topic_regex",
    "server_assignor",
    "owned",
    "client_id",
    "client_host",
    "session_timeout_ms",
)


@contextmanager
def _parsing(what: str) -> Iterator[None]:
    """Turn the errors of picking a JSON body apart into MalformedRequestError."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _malformed(f"bad {what} body: {e!r}") from None


def _str(body: dict[str, Any], key: str) -> str:
    value = body[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a string, got {value!r}")
    return value


def _list(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key) or []
    if not isinstance(value, list):
        raise TypeError(f"{key} must be a list, got {value!r}")
    return value


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise TypeError(f"{key} must be a boolean, got {value!r}")
    return value


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{key} must be a string or null, got {value!r}")
    return value


def _int_field(body: dict[str, Any], key: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if type(value) is not int:
        raise TypeError(f"{key} must be an integer, got {value!r}")
    return value


def _opt_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is not None and (type(value) is not int):
        raise TypeError(f"{key} must be an integer or null, got {value!r}")
    return value


# -- request bodies (the light routes; /v1/commit is parsed by hand, see below) --


class CreateTopicBody(BaseModel):
    name: str
    partitions: int
    configs: dict[str, str] = Field(default_factory=dict)
    validate_only: bool = False


class AddPartitionsBody(BaseModel):
    partitions: int


class AlterConfigsBody(BaseModel):
    set: dict[str, str] = Field(default_factory=dict)
    delete: list[str] = Field(default_factory=list)
    validate_only: bool = False


class KeysBody(BaseModel):
    keys: list[str]


class LeaseBody(BaseModel):
    lease_id: str = Field(min_length=1, max_length=200)


class PendingBody(LeaseBody):
    keys: list[str] = Field(default_factory=list)
    ttl_s: float = Field(gt=0, le=24 * 3600)


class HeartbeatBody(BaseModel):
    agent_id: str
    host: str
    port: int
    kafka_host: str = ""
    kafka_port: int = 0


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


class FullCoordinator(Coordinator, GroupCoordinator, KafkaGroupCoordinator, SchemaStore, Protocol):
    """What the server serves: the log, both doors' consumer groups, the schema registry."""


def create_app(
    coordinator: FullCoordinator,
    store: ObjectStore | None = None,
    location: StoreLocation | None = None,
    *,
    security: SecurityStore | None = None,
    access: AccessSettings | None = None,
) -> FastAPI:
    """The coordinator's HTTP API over ``coordinator``; ``store`` enables /v1/orphans.

    ``location`` is what /v1/store tells Spark jobs (default: ``store``'s URL, made
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

    # -- cluster and topics -----------------------------------------------------

    @app.get("/v1/cluster")
    def cluster() -> Response:
        return _json({"cluster_id": coordinator.cluster_id()})

    @app.get("/v1/topics")
    def list_topics() -> Response:
        return _json({"topics": [topic_to_json(t) for t in coordinator.list_topics()]})

    @app.post("/v1/topics")
    def create_topic(body: CreateTopicBody) -> Response:
        topic = coordinator.create_topic(
            body.name, body.partitions, body.configs, validate_only=body.validate_only
        )
        return _json(topic_to_json(topic), 200 if body.validate_only else 201)

    @app.get("/v1/topic-ids/{topic_id}")
    def get_topic_by_id(topic_id: str) -> Response:
        try:
            raw = bytes.fromhex(topic_id)
        except ValueError:
            raise _malformed(f"topic id {topic_id!r} is not hex") from None
        return _json(topic_to_json(coordinator.get_topic_by_id(raw)))

    # The name is a ``path`` parameter so a (bad) name holding "/" still reaches the
    # coordinator and gets its error; the longer routes are registered first.

    @app.get("/v1/topics/{name:path}/partitions/{partition}/offsets")
    def offsets(name: str, partition: int) -> Response:
        return _json(partition_offsets_to_json(coordinator.offsets(name, partition)))

    @app.post("/v1/offsets")
    def offsets_many(body: dict[str, Any] = Body()) -> Response:
        with _parsing("offsets"):
            partitions = [tp_from_json(tp) for tp in _list(body, "partitions")]
        return _json({"offsets": offsets_to_json(coordinator.offsets_many(partitions))})

    @app.get("/v1/topics/{name:path}/partitions/{partition}/lookup")
    def lookup(
        name: str,
        partition: int,
        offset: int = Query(),
        max_chunks: int = Query(16, ge=1),
        topic_id: str | None = Query(None),
    ) -> Response:
        wanted = None
        if topic_id is not None:
            try:
                wanted = bytes.fromhex(topic_id)
            except ValueError:
                raise _malformed(f"topic id {topic_id!r} is not hex") from None
        chunks = coordinator.lookup(name, partition, offset, max_chunks, topic_id=wanted)
        return _json({"chunks": [chunk_ref_to_json(c) for c in chunks]})

    @app.get("/v1/topics/{name:path}/partitions/{partition}/lookup-timestamp")
    def lookup_timestamp(
        name: str, partition: int, ts: int = Query(), from_offset: int = Query(0)
    ) -> Response:
        chunk = coordinator.lookup_timestamp(name, partition, ts, from_offset)
        return _json({"chunk": None if chunk is None else chunk_ref_to_json(chunk)})

    @app.post("/v1/topics/{name:path}/partitions/{partition}/delete-records")
    def delete_records(name: str, partition: int, body: dict[str, Any] = Body()) -> Response:
        with _parsing("delete records"):
            offset = _opt_int(body, "offset")
            if offset is None:
                raise KeyError("offset")
        return _json({"log_start": coordinator.delete_records(name, partition, offset)})

    @app.post("/v1/topics/{name:path}/partitions")
    def add_partitions(name: str, body: AddPartitionsBody) -> Response:
        return _json(topic_to_json(coordinator.add_partitions(name, body.partitions)))

    @app.post("/v1/topics/{name:path}/configs")
    def alter_configs(name: str, body: AlterConfigsBody) -> Response:
        topic = coordinator.alter_configs(
            name, body.set, body.delete, validate_only=body.validate_only
        )
        return _json(topic_to_json(topic))

    @app.get("/v1/broker-configs")
    def broker_configs() -> Response:
        return _json({"configs": coordinator.broker_configs()})

    @app.post("/v1/broker-configs")
    def alter_broker_configs(body: AlterConfigsBody) -> Response:
        after = coordinator.alter_broker_configs(
            body.set, body.delete, validate_only=body.validate_only
        )
        return _json({"configs": after})

    @app.get("/v1/topics/{name:path}")
    def get_topic(name: str) -> Response:
        return _json(topic_to_json(coordinator.get_topic(name)))

    @app.delete("/v1/topics/{name:path}", status_code=204)
    def delete_topic(name: str, topic_id: str | None = None) -> Response:
        """``topic_id`` (hex): delete only the topic of that id (see Coordinator)."""
        with _parsing("delete topic"):
            expected = None if topic_id is None else bytes.fromhex(topic_id)
        coordinator.delete_topic(name, topic_id=expected)
        return Response(status_code=204)

    # -- the log ----------------------------------------------------------------

    @app.post("/v1/commit")
    async def commit(request: Request) -> Response:
        # The hot route: orjson and explicit checks instead of a pydantic model.
        try:
            body = orjson.loads(await request.body())
            object_key = body["object_key"]
            if not isinstance(object_key, str) or not object_key:
                raise TypeError("object_key must be a non-empty string")
            chunks = [chunk_commit_from_json(c) for c in body["chunks"]]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise _malformed(f"bad commit body: {e!r}") from None
        start = time.perf_counter()
        try:
            base_offsets = await run_in_threadpool(coordinator.commit, object_key, chunks)
        except ValueError as e:  # chunks the store refuses: overlapping, empty, negative
            metrics.commits.labels("MalformedRequestError").inc()
            raise _malformed(f"bad commit: {e}") from None
        except LakelogError as e:
            metrics.commits.labels(type(e).__name__).inc()
            raise
        finally:
            metrics.commit_seconds.observe(time.perf_counter() - start)
        metrics.commits.labels("ok").inc()
        metrics.chunks.inc(len(chunks))
        metrics.records.inc(sum(c.record_count for c in chunks))
        return _json({"base_offsets": base_offsets})

    @app.post("/v1/producers/init")
    def init_producer_id(body: dict[str, Any] = Body()) -> Response:
        with _parsing("init producer id"):
            producer_id = _opt_int(body, "producer_id")
            epoch = _opt_int(body, "epoch")
        pid, new_epoch = coordinator.init_producer_id(
            -1 if producer_id is None else producer_id, -1 if epoch is None else epoch
        )
        return _json({"producer_id": pid, "epoch": new_epoch})

    @app.post("/v1/producers/state")
    def producer_state(body: dict[str, Any] = Body()) -> Response:
        with _parsing("producer state"):
            producer_id = _opt_int(body, "producer_id")
            if producer_id is None:
                raise KeyError("producer_id")
            partitions = [
                (bytes.fromhex(_str(d, "topic_id")), int(d["partition"]))
                for d in _list(body, "partitions")
            ]
        states = coordinator.producer_state(producer_id, partitions)
        return _json(
            {
                "states": [
                    {"topic_id": t.hex(), "partition": p, "epoch": s.epoch, "batches": s.batches}
                    for (t, p), s in states.items()
                ]
            }
        )

    @app.post("/v1/request-keys/get")
    def request_key(body: dict[str, Any] = Body()) -> Response:
        with _parsing("request key"):
            topic_id = bytes.fromhex(_str(body, "topic_id"))
            key = _str(body, "key")
            now_ms = _opt_int(body, "now_ms")
            if now_ms is None:
                raise KeyError("now_ms")
        found = coordinator.request_key(topic_id, key, now_ms)
        if found is None:
            return _json({"found": None})
        return _json(
            {
                "found": {
                    "digest": found.digest,
                    "created_ms": found.created_ms,
                    "parts": [list(p) for p in found.parts],
                    "partitions": found.partitions,
                }
            }
        )

    @app.post("/v1/objects/committed")
    def committed_object_keys(body: KeysBody) -> Response:
        return _json({"committed": sorted(coordinator.committed_object_keys(body.keys))})

    @app.post("/v1/objects/pending")
    def keep_pending(request: Request, body: PendingBody) -> Response:
        deleted = coordinator.keep_pending(
            body.lease_id, body.keys, body.ttl_s, principal=user_of(request.scope)
        )
        return _json({"deleted": sorted(deleted)})

    @app.post("/v1/objects/pending/release")
    def release_pending(request: Request, body: LeaseBody) -> Response:
        coordinator.release_pending(body.lease_id, principal=user_of(request.scope))
        return _json({})

    @app.post("/v1/objects/pending/live")
    def pending_object_keys(body: KeysBody) -> Response:
        return _json({"pending": sorted(coordinator.pending_object_keys(body.keys))})

    # -- agents -----------------------------------------------------------------

    @app.post("/v1/agents/heartbeat")
    def heartbeat(body: HeartbeatBody) -> Response:
        broker_id = coordinator.heartbeat_agent(
            body.agent_id, body.host, body.port, body.kafka_host, body.kafka_port
        )
        return _json({"broker_id": broker_id})

    @app.get("/v1/agents")
    def list_agents(max_age_s: float = Query(30.0, ge=0)) -> Response:
        return _json({"agents": [agent_to_json(a) for a in coordinator.list_agents(max_age_s)]})

    # -- consumer groups ----------------------------------------------------------

    @app.get("/v1/groups")
    def list_groups() -> Response:
        return _json({"groups": coordinator.list_groups()})

    @app.post("/v1/groups/describe")
    def describe_group(body: dict[str, Any] = Body()) -> Response:
        with _parsing("describe"):
            group = _str(body, "group")
        return _json(group_info_to_json(coordinator.describe_group(group)))

    @app.post("/v1/groups/committed")
    def committed_offsets(body: dict[str, Any] = Body()) -> Response:
        with _parsing("committed offsets"):
            group = _str(body, "group")
            partitions = [tp_from_json(tp) for tp in _list(body, "partitions")]
        offsets = coordinator.committed_offsets(group, partitions)
        return _json({"offsets": committed_to_json(offsets)})

    @app.post("/v1/groups/alter-offsets")
    def alter_group_offsets(body: dict[str, Any] = Body()) -> Response:
        with _parsing("alter group offsets"):
            group = _str(body, "group")
            offsets = committed_from_json(_list(body, "offsets"))
        coordinator.alter_group_offsets(group, offsets)
        return Response(status_code=204)

    @app.post("/v1/groups/delete")
    def delete_group(body: dict[str, Any] = Body()) -> Response:
        with _parsing("delete group"):
            group = _str(body, "group")
        coordinator.delete_group(group)
        return Response(status_code=204)

    @app.post("/v1/consumers/create")
    def create_consumer(body: dict[str, Any] = Body()) -> Response:
        with _parsing("create consumer"):
            group, name = _str(body, "group"), _str(body, "name")
            config = consumer_config_from_json(body.get("config") or {})
        state = coordinator.create_consumer(group, name, config)
        return _json(consumer_state_to_json(state), 201)

    @app.post("/v1/consumers/delete")
    def delete_consumer(body: dict[str, Any] = Body()) -> Response:
        with _parsing("delete consumer"):
            group, name = _str(body, "group"), _str(body, "name")
        coordinator.delete_consumer(group, name)
        return Response(status_code=204)

    @app.post("/v1/consumers/get")
    def get_consumer(body: dict[str, Any] = Body()) -> Response:
        with _parsing("consumer"):
            group, name = _str(body, "group"), _str(body, "name")
            touch = body.get("touch", True)
            if not isinstance(touch, bool):
                raise TypeError(f"touch must be a boolean, got {touch!r}")
        return _json(consumer_state_to_json(coordinator.consumer(group, name, touch=touch)))

    @app.post("/v1/consumers/subscribe")
    def subscribe(body: dict[str, Any] = Body()) -> Response:
        with _parsing("subscribe"):
            group, name = _str(body, "group"), _str(body, "name")
            topics = _list(body, "topics")
            if not all(isinstance(t, str) for t in topics):
                raise TypeError("topics must be strings")
            pattern = body.get("pattern")
            if pattern is not None and not isinstance(pattern, str):
                raise TypeError(f"pattern must be a string or null, got {pattern!r}")
        state = coordinator.subscribe(group, name, topics, pattern)
        return _json(consumer_state_to_json(state))

    @app.post("/v1/consumers/unsubscribe")
    def unsubscribe(body: dict[str, Any] = Body()) -> Response:
        with _parsing("unsubscribe"):
            group, name = _str(body, "group"), _str(body, "name")
        coordinator.unsubscribe(group, name)
        return Response(status_code=204)

    @app.post("/v1/consumers/assign")
    def assign(body: dict[str, Any] = Body()) -> Response:
        with _parsing("assign"):
            group, name = _str(body, "group"), _str(body, "name")
            partitions = [tp_from_json(tp) for tp in _list(body, "partitions")]
        return _json(consumer_state_to_json(coordinator.assign(group, name, partitions)))

    @app.post("/v1/consumers/seek")
    def seek(body: dict[str, Any] = Body()) -> Response:
        with _parsing("seek"):
            group, name = _str(body, "group"), _str(body, "name")
            positions = positions_from_json(_list(body, "positions"))
        coordinator.seek(group, name, positions)
        return Response(status_code=204)

    @app.post("/v1/consumers/advance")
    def advance(body: dict[str, Any] = Body()) -> Response:
        with _parsing("advance"):
            group, name = _str(body, "group"), _str(body, "name")
            generation = _opt_int(body, "generation")
            if generation is None:
                raise KeyError("generation")
            positions = positions_from_json(_list(body, "positions"))
        state = coordinator.advance(group, name, generation, positions)
        return _json(consumer_state_to_json(state))

    @app.post("/v1/consumers/commit")
    def commit_offsets(body: dict[str, Any] = Body()) -> Response:
        with _parsing("commit offsets"):
            group, name = _str(body, "group"), _str(body, "name")
            generation = _opt_int(body, "generation")
            offsets = committed_from_json(_list(body, "offsets"))
        coordinator.commit_offsets(group, name, offsets, generation)
        return Response(status_code=204)

    # -- Kafka consumer groups ----------------------------------------------------

    @app.post("/v1/kafka-groups/join")
    def kafka_join(body: dict[str, Any] = Body()) -> Response:
        with _parsing("kafka join"):
            group, member_id = _str(body, "group"), _str(body, "member_id")
            options = dict(body.get("options") or {})
            if "protocols" in options:
                options["protocols"] = [(n, bytes.fromhex(m)) for n, m in options["protocols"]]
        result = coordinator.kafka_join(group, member_id, **options)
        return _json(join_result_to_json(result))

    @app.post("/v1/kafka-groups/sync")
    def kafka_sync(body: dict[str, Any] = Body()) -> Response:
        with _parsing("kafka sync"):
            group, member_id = _str(body, "group"), _str(body, "member_id")
            generation = int(body["generation"])
            raw = body.get("assignments")
            assignments = None if raw is None else {m: bytes.fromhex(a) for m, a in raw.items()}
        got = coordinator.kafka_sync(group, member_id, generation, assignments)
        return _json({"assignment": None if got is None else got.hex()})

    @app.post("/v1/kafka-groups/heartbeat")
    def kafka_heartbeat(body: dict[str, Any] = Body()) -> Response:
        with _parsing("kafka heartbeat"):
            group, member_id = _str(body, "group"), _str(body, "member_id")
            generation = int(body["generation"])
        coordinator.kafka_heartbeat(group, member_id, generation)
        return Response(status_code=204)

    @app.post("/v1/kafka-groups/leave")
    def kafka_leave(body: dict[str, Any] = Body()) -> Response:
        with _parsing("kafka leave"):
            group = _str(body, "group")
            members = [str(m) for m in _list(body, "member_ids")]
        return _json({"results": coordinator.kafka_leave(group, members)})

    @app.post("/v1/kafka-groups/commit")
    def kafka_commit(body: dict[str, Any] = Body()) -> Response:
        with _parsing("kafka commit"):
            group, member_id = _str(body, "group"), _str(body, "member_id")
            generation = int(body["generation"])
            offsets = committed_from_json(_list(body, "offsets"))
        coordinator.kafka_commit_offsets(group, member_id, generation, offsets)
        return Response(status_code=204)

    @app.post("/v1/kafka-groups/committed")
    def kafka_committed(body: dict[str, Any] = Body()) -> Response:
        with _parsing("kafka committed"):
            group = _str(body, "group")
            raw = body.get("partitions")
            partitions = None if raw is None else [tp_from_json(tp) for tp in raw]
            member_id = str(body.get("member_id") or "")
            member_epoch = int(body.get("member_epoch", -1))
        found = coordinator.kafka_committed(
            group, partitions, member_id=member_id, member_epoch=member_epoch
        )
        return _json({"offsets": committed_to_json(found)})

    @app.post("/v1/kafka-groups/consumer-heartbeat")
    def kafka_consumer_heartbeat(body: dict[str, Any] = Body()) -> Response:
        with _parsing("kafka consumer heartbeat"):
            group, member_id = _str(body, "group"), _str(body, "member_id")
            member_epoch = int(body["member_epoch"])
            unknown = set(body) - {"group", "member_id", "member_epoch", *_HEARTBEAT_OPTIONS}
            if unknown:
                raise ValueError(f"unknown fields {sorted(unknown)}")
            options = {k: body[k] for k in _HEARTBEAT_OPTIONS if k in body}
            if options.get("owned") is not None:
                options["owned"] = assignment_from_json(options["owned"])
        result = coordinator.kafka_consumer_heartbeat(group, member_id, member_epoch, **options)
        return _json(heartbeat_result_to_json(result))

    @app.post("/v1/kafka-groups/describe")
    def kafka_describe(body: dict[str, Any] = Body()) -> Response:
        with _parsing("kafka describe"):
            group = _str(body, "group")
        g = coordinator.kafka_describe(group)
        return _json({"group": None if g is None else kafka_group_to_json(g)})

    @app.post("/v1/kafka-groups/delete")
    def kafka_delete(body: dict[str, Any] = Body()) -> Response:
        with _parsing("kafka delete"):
            group = _str(body, "group")
        coordinator.kafka_delete_group(group)
        return Response(status_code=204)

    # -- schema registry ----------------------------------------------------------

    def _schema_text(body: dict[str, Any]) -> tuple[str, str, str, list[Any]]:
        refs = [reference_from_json(r) for r in _list(body, "references")]
        return _str(body, "subject"), _str(body, "schema_type"), _str(body, "schema"), refs

    @app.post("/v1/schemas/register")
    def register_schema(body: dict[str, Any] = Body()) -> Response:
        with _parsing("register schema"):
            subject, schema_type, schema, refs = _schema_text(body)
            expected = body.get("expected_versions")
            if expected is not None and not (
                isinstance(expected, list) and all(type(v) is int for v in expected)
            ):
                raise TypeError(f"expected_versions must be integers or null, got {expected!r}")
        sv = coordinator.register_schema(
            subject, schema_type, schema, refs, expected_versions=expected
        )
        return _json(subject_version_to_json(sv))

    @app.post("/v1/schemas/get")
    def get_schema(body: dict[str, Any] = Body()) -> Response:
        with _parsing("get schema"):
            schema_id = _int_field(body, "schema_id")
        return _json(stored_schema_to_json(coordinator.get_schema(schema_id)))

    @app.post("/v1/schemas/uses")
    def schema_uses(body: dict[str, Any] = Body()) -> Response:
        with _parsing("schema versions"):
            schema_id, deleted = _int_field(body, "schema_id"), _bool(body, "deleted")
        versions = coordinator.schema_versions(schema_id, deleted=deleted)
        return _json({"versions": [list(v) for v in versions]})

    @app.post("/v1/schemas/subjects")
    def list_subjects(body: dict[str, Any] = Body()) -> Response:
        with _parsing("subjects"):
            deleted = _bool(body, "deleted")
        return _json({"subjects": coordinator.list_subjects(deleted=deleted)})

    @app.post("/v1/schemas/versions")
    def subject_versions(body: dict[str, Any] = Body()) -> Response:
        with _parsing("subject versions"):
            subject, deleted = _str(body, "subject"), _bool(body, "deleted")
        return _json({"versions": coordinator.subject_versions(subject, deleted=deleted)})

    @app.post("/v1/schemas/version")
    def subject_version(body: dict[str, Any] = Body()) -> Response:
        with _parsing("subject version"):
            subject, deleted = _str(body, "subject"), _bool(body, "deleted")
            version = _int_field(body, "version", LATEST)
        sv = coordinator.get_subject_version(subject, version, deleted=deleted)
        return _json(subject_version_to_json(sv))

    @app.post("/v1/schemas/find")
    def find_schema(body: dict[str, Any] = Body()) -> Response:
        with _parsing("find schema"):
            subject, schema_type, schema, refs = _schema_text(body)
            deleted = _bool(body, "deleted")
        sv = coordinator.find_schema(subject, schema_type, schema, refs, deleted=deleted)
        return _json(subject_version_to_json(sv))

    @app.post("/v1/schemas/delete-subject")
    def delete_subject(body: dict[str, Any] = Body()) -> Response:
        with _parsing("delete subject"):
            subject, permanent = _str(body, "subject"), _bool(body, "permanent")
        return _json({"versions": coordinator.delete_subject(subject, permanent=permanent)})

    @app.post("/v1/schemas/delete-version")
    def delete_subject_version(body: dict[str, Any] = Body()) -> Response:
        with _parsing("delete subject version"):
            subject, permanent = _str(body, "subject"), _bool(body, "permanent")
            version = _int_field(body, "version", LATEST)
        deleted = coordinator.delete_subject_version(subject, version, permanent=permanent)
        return _json({"version": deleted})

    @app.post("/v1/schemas/referenced-by")
    def referenced_by(body: dict[str, Any] = Body()) -> Response:
        with _parsing("referenced by"):
            subject, version = _str(body, "subject"), _int_field(body, "version")
        return _json({"ids": coordinator.referenced_by(subject, version)})

    @app.post("/v1/schemas/config/get")
    def get_compatibility(body: dict[str, Any] = Body()) -> Response:
        with _parsing("get config"):
            subject = _opt_str(body, "subject")
        return _json({"compatibility": coordinator.get_compatibility(subject)})

    @app.post("/v1/schemas/config/set")
    def set_compatibility(body: dict[str, Any] = Body()) -> Response:
        with _parsing("set config"):
            subject, level = _opt_str(body, "subject"), _str(body, "level")
        return _json({"compatibility": coordinator.set_compatibility(level, subject)})

    @app.post("/v1/schemas/config/delete")
    def delete_compatibility(body: dict[str, Any] = Body()) -> Response:
        with _parsing("delete config"):
            subject = _opt_str(body, "subject")
        return _json({"compatibility": coordinator.delete_compatibility(subject)})

    @app.get("/v1/store")
    def store_location() -> Response:
        return _json(store_location_to_json(location))

    @app.post("/v1/consumers/fetch/begin")
    def begin_fetch(body: dict[str, Any] = Body()) -> Response:
        with _parsing("begin fetch"):
            group, name, token = _str(body, "group"), _str(body, "name"), _str(body, "token")
            lease_ms = _int_field(body, "lease_ms")
        return _json(fetch_lease_to_json(coordinator.begin_fetch(group, name, token, lease_ms)))

    @app.post("/v1/consumers/fetch/confirm")
    def confirm_fetch(body: dict[str, Any] = Body()) -> Response:
        with _parsing("confirm fetch"):
            group, name, token = _str(body, "group"), _str(body, "name"), _str(body, "token")
            start = positions_from_json(_list(body, "start"))
            lease_ms = _int_field(body, "lease_ms")
        lease = coordinator.confirm_fetch(group, name, token, start, lease_ms)
        return _json(fetch_lease_to_json(lease))

    @app.post("/v1/consumers/fetch/end")
    def end_fetch(body: dict[str, Any] = Body()) -> Response:
        with _parsing("end fetch"):
            group, name, token = _str(body, "group"), _str(body, "name"), _str(body, "token")
            raw = body.get("positions")
            positions: dict[TopicPartition, int] | None = (
                None if raw is None else positions_from_json(_list(body, "positions"))
            )
        coordinator.end_fetch(group, name, token, positions)
        return Response(status_code=204)

    @app.post("/v1/consumers/heartbeat")
    def heartbeat_consumers(body: dict[str, Any] = Body()) -> Response:
        with _parsing("consumer heartbeat"):
            members = [heartbeat_from_json(m) for m in _list(body, "members")]
            lease_ms = _int_field(body, "lease_ms")
        gone = coordinator.heartbeat_consumers(members, lease_ms)
        return _json({"gone": [{"group": g, "name": n} for g, n in gone]})

    # -- garbage report ---------------------------------------------------------

    if store is not None:
        object_store = store

        @app.get("/v1/orphans")
        def orphans(grace_s: float = Query(ge=0), prefix: str = Query("segments/")) -> Response:
            found = find_orphans(object_store, coordinator, grace_s, prefix)
            return _json({"orphans": [object_info_to_json(o) for o in found]})

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
        app = create_process_app(coordinator, store, janitors, location, access)
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
    p.add_argument("--store", default=None, help="object store URL, enables /v1/orphans")
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
