"""The Iceberg REST catalog (Apache Iceberg's REST catalog OpenAPI spec), read-only.

Mounted at ``/iceberg`` by the coordinator's HTTP app and by ``lakelog serve``: clients
are given ``http://HOST:PORT/iceberg`` as the catalog URI (pyiceberg's ``uri``, Spark's
``spark.sql.catalog.X.uri``, Trino's ``iceberg.rest-catalog.uri``). Routes, each also
served without the ``/{prefix}`` part (older clients)::

    GET  /v1/config                                     defaults, overrides (prefix), endpoints
    POST /v1/oauth/tokens                               client credentials -> bearer token
    GET  /v1/{prefix}/namespaces                        [["topics"]]
    GET  /v1/{prefix}/namespaces/{ns}                   its properties; HEAD: 204
    GET  /v1/{prefix}/namespaces/{ns}/tables            the topics the caller may DESCRIBE
    GET  /v1/{prefix}/namespaces/{ns}/tables/{t}        metadata location, metadata, config
                                                        (READ on the topic); HEAD: 204;
                                                        ETag / If-None-Match -> 304
    GET  /v1/{prefix}/namespaces/{ns}/tables/{t}/credentials   [] (none vended)
    POST /v1/{prefix}/namespaces/{ns}/tables/{t}/metrics       scan reports: 204, dropped
    GET  /v1/{prefix}/namespaces/{ns}/views             [] (no views; one: 404)

Every write the spec defines (create, commit, drop, rename, register, namespaces, views,
transactions) answers 403 ``ForbiddenException``: only lakelog writes the tables.
Errors are the spec's ``{"error": {"message", "type", "code"}}``.

**Authentication** (when the process has it on): HTTP Basic with a user and password or
an API key id and secret (``rest.auth.type=basic`` in Iceberg 1.7+), or a bearer token
from ``POST /v1/oauth/tokens`` (the OAuth2 client-credentials exchange that pyiceberg's
and Iceberg's ``credential`` property perform: ``client_id`` and ``client_secret`` are
the same user/password or key/secret). Tokens are HMAC-signed with a key kept in the
metadata database, so every coordinator and ``serve`` process accepts them; they last
``TOKEN_TTL_S``. **Authorization** (ACLs on): listing shows the topics the principal may
DESCRIBE; loading a table needs READ on its topic (without DESCRIBE either, the table
does not exist, as Kafka hides topics).

**Storage credentials**: none are vended (``/credentials`` answers an empty list): clients
read the bucket with their own (AWS's standard chain; ``s3.*`` client properties), and the
bucket's policies decide who reads data files. The config's defaults carry where the
bucket is (``s3.endpoint``, ``s3.region``), never keys.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError

from coordinator.clock import now as coordinator_now
from coordinator.db import MetadataDatabase
from coordinator.iceberg.schema import NAMESPACE
from coordinator.security.model import ANONYMOUS, AclFilter, Authorizer, Operation, ResourceType
from coordinator.security.store import SecurityStore
from segments.errors import (
    AuthenticationError,
    CoordinatorUnavailableError,
    LakelogError,
    StorageError,
    TopicNotFoundError,
)

if TYPE_CHECKING:
    from coordinator.iceberg.tables import TopicTables
    from coordinator.local import LocalCoordinator
    from segments.store import ObjectStore

#: The path prefix the catalog is mounted at, and the ``prefix`` its config announces.
MOUNT = "/iceberg"
PREFIX = "lakelog"
#: How long an issued bearer token is accepted.
TOKEN_TTL_S = 3600
#: How long a verified Basic credential and the ACLs are trusted before asking again.
CACHE_TTL_S = 5.0
_TOKEN_KEY = "iceberg.token_key"
_GET_KEY = "SELECT value FROM meta WHERE key = ?"
_PUT_KEY = "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"

#: The access mechanisms a client may ask for (``X-Iceberg-Access-Delegation``).
DELEGATIONS = ("vended-credentials", "remote-signing")

ENDPOINTS = [
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}/credentials",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics",
    "GET /v1/{prefix}/namespaces/{namespace}/views",
]


class CatalogError(Exception):
    """An answer in the spec's error shape."""

    def __init__(self, code: int, kind: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code = code
        self.kind = kind
        self.message = message
        self.headers = headers or {}


def _error(exc: CatalogError) -> Response:
    body = {"error": {"message": exc.message, "type": exc.kind, "code": exc.code}}
    return Response(
        orjson.dumps(body), exc.code, media_type="application/json", headers=exc.headers
    )


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json", headers=headers)


def _unauthorized(message: str) -> CatalogError:
    return CatalogError(
        401, "NotAuthorizedException", message, {"WWW-Authenticate": 'Basic realm="lakelog"'}
    )


@dataclass
class CatalogSecurity:
    """Who may use the catalog: credentials checked by ``store``, decisions by its ACLs.

    Args:
        store: users, API keys and ACLs (the coordinator's).
        db: the metadata database (holds the token signing key).
        acl: decide by ACLs (else every authenticated principal may read every table).
        super_users: principals allowed everything.
    """

    store: SecurityStore
    db: MetadataDatabase
    acl: bool
    super_users: frozenset[str] = frozenset()
    clock: Callable[[], float] = coordinator_now
    _key: bytes | None = None
    _verified: dict[bytes, tuple[str, float]] = field(default_factory=dict)
    _authorizer: tuple[Authorizer, float] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _signing_key(self) -> bytes:
        if self._key is None:
            q = self.db.dialect.sql
            with self.db.write() as conn:
                conn.execute(q(_PUT_KEY), (_TOKEN_KEY, secrets.token_hex(32)))
                self._key = bytes.fromhex(conn.execute(q(_GET_KEY), (_TOKEN_KEY,)).fetchone()[0])
        return self._key

    def issue(self, principal: str) -> str:
        """A bearer token for ``principal``, valid TOKEN_TTL_S."""
        body = base64.urlsafe_b64encode(
            orjson.dumps({"p": principal, "exp": int(self.clock()) + TOKEN_TTL_S})
        ).decode()
        sig = hmac.new(self._signing_key(), body.encode(), hashlib.sha256).hexdigest()
        return f"llk1.{body}.{sig}"

    def _token_principal(self, token: str) -> str:
        try:
            version, body, sig = token.split(".")
            want = hmac.new(self._signing_key(), body.encode(), hashlib.sha256).hexdigest()
            if version != "llk1" or not hmac.compare_digest(sig, want):
                raise ValueError("bad signature")
            claims = orjson.loads(base64.urlsafe_b64decode(body))
        except (ValueError, binascii.Error, orjson.JSONDecodeError):
            raise _unauthorized("The bearer token is not one this catalog issued.") from None
        if int(claims["exp"]) < self.clock():
            raise CatalogError(419, "AuthenticationTimeoutException", "The token expired.")
        return str(claims["p"])

    def check_credential(self, name: str, secret: str) -> str:
        """The principal of a user/password or API key/secret (cached CACHE_TTL_S)."""
        digest = hmac.new(self._signing_key(), f"{name}\0{secret}".encode(), "sha256").digest()
        now = self.clock()
        with self._lock:
            hit = self._verified.get(digest)
        if hit is not None and hit[1] > now:
            return hit[0]
        try:
            principal = self.store.authenticate(name, secret)
        except AuthenticationError:
            raise _unauthorized("Wrong user name or password (or API key and secret).") from None
        with self._lock:
            if len(self._verified) > 10_000:
                self._verified.clear()
            self._verified[digest] = (principal, now + CACHE_TTL_S)
        return principal

    def principal(self, authorization: str | None) -> str:
        """The caller's principal from its ``Authorization`` header."""
        if not authorization:
            raise _unauthorized(
                "Authentication is required: HTTP Basic (user and password, or API key and "
                "secret) or a bearer token from /v1/oauth/tokens."
            )
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return self._token_principal(value.strip())
        if scheme.lower() == "basic":
            try:
                name, sep, secret = base64.b64decode(value.strip()).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                name, sep, secret = "", "", ""
            if sep and name:
                return self.check_credential(name, secret)
        raise _unauthorized("Malformed Authorization header.")

    def allowed(self, principal: str, operation: Operation, topic: str, host: str) -> bool:
        if not self.acl:
            return True
        now = self.clock()
        with self._lock:
            cached = self._authorizer
        if cached is None or cached[1] <= now:
            authorizer = Authorizer(self.store.describe_acls([AclFilter()]), self.super_users)
            with self._lock:
                self._authorizer = cached = (authorizer, now + CACHE_TTL_S)
        return cached[0].authorize(principal, host, operation, ResourceType.TOPIC, topic)


@dataclass
class CatalogService:
    """What the catalog routes use: the tables, the security (None: off), the storage
    properties clients get (``s3.endpoint``, ``s3.region``)."""

    tables: TopicTables
    security: CatalogSecurity | None = None
    storage: dict[str, str] = field(default_factory=dict)


def create_catalog_app(service: Callable[[], CatalogService | None]) -> FastAPI:
    """The catalog as an app to mount at ``MOUNT``. ``service`` is asked per request (the
    agent of ``lakelog serve`` builds it in its lifespan); None answers 503."""
    app = FastAPI(title="lakelog Iceberg REST catalog", docs_url=None, redoc_url=None)

    @app.exception_handler(CatalogError)
    async def catalog_error(request: Request, exc: CatalogError) -> Response:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        where = "; ".join(
            ".".join(str(p) for p in e.get("loc", ())) + f": {e.get('msg', 'invalid')}"
            for e in exc.errors()
        )
        return _error(CatalogError(400, "BadRequestException", f"Malformed request: {where}"))

    @app.exception_handler(LakelogError)
    async def lakelog_error(request: Request, exc: LakelogError) -> Response:
        if isinstance(exc, CoordinatorUnavailableError | StorageError) and exc.retriable:
            return _error(CatalogError(503, "ServiceUnavailableException", exc.message))
        return _error(CatalogError(500, "InternalServerError", exc.message))

    def ready() -> CatalogService:
        found = service()
        if found is None:
            raise CatalogError(503, "ServiceUnavailableException", "The catalog is starting.")
        return found

    async def caller(request: Request) -> tuple[CatalogService, str]:
        svc = ready()
        if svc.security is None:
            return svc, ANONYMOUS
        header = request.headers.get("authorization")
        principal = await run_in_threadpool(svc.security.principal, header)
        return svc, principal

    def host(request: Request) -> str:
        return request.client.host if request.client else ""

    def check_prefix(prefix: str | None) -> None:
        if prefix is not None and prefix != PREFIX:
            raise CatalogError(404, "NoSuchWarehouseException", f"No catalog prefix {prefix!r}.")

    def check_page_size(size: int | None) -> None:
        if size is not None and size < 1:
            raise CatalogError(400, "BadRequestException", "pageSize must be >= 1")

    def check_namespace(namespace: str) -> None:
        parts = namespace.replace("%1F", "\x1f").split("\x1f")
        if parts != [NAMESPACE]:
            raise CatalogError(
                404, "NoSuchNamespaceException", f"Namespace does not exist: {namespace}"
            )

    def visible(svc: CatalogService, principal: str, topic: str, where: str) -> bool:
        return svc.security is None or svc.security.allowed(
            principal, Operation.DESCRIBE, topic, where
        )

    async def namespace_of(
        request: Request, prefix: str | None, namespace: str
    ) -> tuple[CatalogService, str]:
        """The service and caller of a request naming ``namespace``; 404 for another prefix
        (before authenticating the caller) or namespace (after)."""
        check_prefix(prefix)
        found = await caller(request)
        check_namespace(namespace)
        return found

    async def table_of(
        request: Request, prefix: str | None, namespace: str, table: str, op: Operation
    ) -> tuple[CatalogService, str, bytes]:
        svc, principal = await namespace_of(request, prefix, namespace)
        missing = CatalogError(404, "NoSuchTableException", f"Table does not exist: {table}")
        if not visible(svc, principal, table, host(request)):
            raise missing
        if svc.security is not None and not svc.security.allowed(
            principal, op, table, host(request)
        ):
            raise CatalogError(403, "ForbiddenException", f"Not authorized to read {table}.")
        try:
            topic_id = await run_in_threadpool(svc.tables.topic_id, table)
        except TopicNotFoundError:
            raise missing from None
        return svc, principal, topic_id

    # -- config and tokens ------------------------------------------------------------

    @app.get("/v1/config")
    async def get_config(request: Request, warehouse: str | None = None) -> Response:
        svc, _ = await caller(request)
        return _json(
            {
                "defaults": dict(svc.storage),
                "overrides": {"prefix": PREFIX},
                "endpoints": ENDPOINTS,
            }
        )

    @app.post("/v1/oauth/tokens")
    async def get_token(request: Request) -> Response:
        svc = ready()
        form = parse_qs((await request.body()).decode("utf-8", "replace"))

        def one(name: str) -> str | None:
            values = form.get(name)
            return values[0] if values else None

        def oauth_error(code: int, kind: str, text: str) -> Response:
            return _json({"error": kind, "error_description": text}, code)

        grant = one("grant_type")
        if grant != "client_credentials":
            return oauth_error(400, "unsupported_grant_type", "Only client_credentials is served.")
        client_id, client_secret = one("client_id"), one("client_secret")
        if svc.security is None:
            principal = ANONYMOUS
        elif not client_id or client_secret is None:
            return oauth_error(400, "invalid_request", "client_id and client_secret are needed.")
        else:
            try:
                principal = await run_in_threadpool(
                    svc.security.check_credential, client_id, client_secret
                )
            except CatalogError:
                return oauth_error(401, "invalid_client", "Wrong client id or secret.")
        token = svc.security.issue(principal) if svc.security is not None else secrets.token_hex(16)
        return _json(
            {
                "access_token": token,
                "token_type": "bearer",
                "expires_in": TOKEN_TTL_S,
                "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
            }
        )

    # -- namespaces, tables -----------------------------------------------------------

    for base in ("/v1", "/v1/{prefix}"):

        @app.get(f"{base}/namespaces")
        async def list_namespaces(
            request: Request,
            prefix: str | None = None,
            parent: str | None = None,
            pageToken: str | None = None,
            pageSize: int | None = None,
        ) -> Response:
            check_prefix(prefix)
            await caller(request)
            check_page_size(pageSize)
            if parent:
                check_namespace(parent)
                return _json({"namespaces": []})
            return _json({"namespaces": [[NAMESPACE]]})

        @app.get(f"{base}/namespaces/{{namespace}}")
        async def load_namespace(
            request: Request, namespace: str, prefix: str | None = None
        ) -> Response:
            await namespace_of(request, prefix, namespace)
            return _json(
                {
                    "namespace": [NAMESPACE],
                    "properties": {"comment": "lakelog topics, one table each (read-only)"},
                }
            )

        @app.head(f"{base}/namespaces/{{namespace}}")
        async def namespace_exists(
            request: Request, namespace: str, prefix: str | None = None
        ) -> Response:
            await namespace_of(request, prefix, namespace)
            return Response(status_code=204)

        @app.get(f"{base}/namespaces/{{namespace}}/tables")
        async def list_tables(
            request: Request,
            namespace: str,
            prefix: str | None = None,
            pageToken: str | None = None,
            pageSize: int | None = None,
        ) -> Response:
            svc, principal = await namespace_of(request, prefix, namespace)
            check_page_size(pageSize)
            topics = await run_in_threadpool(svc.tables.topics)
            where = host(request)
            names = [n for _, n in topics if visible(svc, principal, n, where)]
            if pageToken:
                names = [n for n in names if n > pageToken]
            body: dict[str, Any] = {}
            if pageSize is not None and len(names) > pageSize:
                names = names[:pageSize]
                body["next-page-token"] = names[-1]
            body["identifiers"] = [{"namespace": [NAMESPACE], "name": n} for n in names]
            return _json(body)

        @app.get(f"{base}/namespaces/{{namespace}}/views")
        async def list_views(
            request: Request,
            namespace: str,
            prefix: str | None = None,
            pageToken: str | None = None,
            pageSize: int | None = None,
        ) -> Response:
            await namespace_of(request, prefix, namespace)
            check_page_size(pageSize)
            return _json({"identifiers": []})

        @app.get(f"{base}/namespaces/{{namespace}}/tables/{{table}}")
        async def load_table(
            request: Request,
            namespace: str,
            table: str,
            prefix: str | None = None,
            snapshots: str | None = None,
        ) -> Response:
            svc, _, topic_id = await table_of(request, prefix, namespace, table, Operation.READ)
            delegation = request.headers.get("x-iceberg-access-delegation")
            asked = [m.strip() for m in (delegation or "").split(",") if m.strip()]
            if any(m not in DELEGATIONS for m in asked):
                raise CatalogError(
                    400,
                    "BadRequestException",
                    f"X-Iceberg-Access-Delegation takes {', '.join(DELEGATIONS)}",
                )
            if snapshots not in (None, "all", "refs"):
                raise CatalogError(400, "BadRequestException", "snapshots must be all or refs")
            location = await run_in_threadpool(svc.tables.pointer, topic_id)
            if location is None:  # no table yet: create it now (empty), so it exists
                made = await run_in_threadpool(svc.tables.ensure, topic_id, table)
                location = made.metadata_location
            etag = '"' + hashlib.sha256(location.encode()).hexdigest()[:32] + '"'
            if request.headers.get("if-none-match") == etag:
                return Response(status_code=304, headers={"ETag": etag})
            raw = await run_in_threadpool(svc.tables.metadata_bytes, location)
            config = dict(svc.storage)
            body = (
                b'{"metadata-location":'
                + orjson.dumps(location)
                + b',"metadata":'
                + raw
                + b',"config":'
                + orjson.dumps(config)
                + b"}"
            )
            return Response(body, media_type="application/json", headers={"ETag": etag})

        @app.head(f"{base}/namespaces/{{namespace}}/tables/{{table}}")
        async def table_exists(
            request: Request, namespace: str, table: str, prefix: str | None = None
        ) -> Response:
            await table_of(request, prefix, namespace, table, Operation.DESCRIBE)
            return Response(status_code=204)

        @app.get(f"{base}/namespaces/{{namespace}}/tables/{{table}}/credentials")
        async def load_credentials(
            request: Request, namespace: str, table: str, prefix: str | None = None
        ) -> Response:
            await table_of(request, prefix, namespace, table, Operation.READ)
            return _json({"storage-credentials": []})

        @app.post(f"{base}/namespaces/{{namespace}}/tables/{{table}}/metrics")
        async def report_metrics(
            request: Request, namespace: str, table: str, prefix: str | None = None
        ) -> Response:
            await table_of(request, prefix, namespace, table, Operation.DESCRIBE)
            _check_report(await request.body())
            return Response(status_code=204)

        @app.get(f"{base}/namespaces/{{namespace}}/views/{{view}}")
        async def load_view(
            request: Request, namespace: str, view: str, prefix: str | None = None
        ) -> Response:
            await namespace_of(request, prefix, namespace)
            raise CatalogError(404, "NoSuchViewException", f"View does not exist: {view}")

        @app.head(f"{base}/namespaces/{{namespace}}/views/{{view}}")
        async def view_exists(
            request: Request, namespace: str, view: str, prefix: str | None = None
        ) -> Response:
            return await load_view(request, namespace, view, prefix)

        writes = [
            ("POST", "/namespaces"),
            ("DELETE", "/namespaces/{namespace}"),
            ("POST", "/namespaces/{namespace}/properties"),
            ("POST", "/namespaces/{namespace}/tables"),
            ("POST", "/namespaces/{namespace}/register"),
            ("POST", "/namespaces/{namespace}/tables/{table}"),
            ("DELETE", "/namespaces/{namespace}/tables/{table}"),
            ("POST", "/namespaces/{namespace}/tables/{table}/unregister"),
            ("POST", "/tables/rename"),
            ("POST", "/transactions/commit"),
            ("POST", "/namespaces/{namespace}/views"),
            ("POST", "/namespaces/{namespace}/views/{view}"),
            ("DELETE", "/namespaces/{namespace}/views/{view}"),
            ("POST", "/views/rename"),
            ("POST", "/namespaces/{namespace}/register-view"),
        ]
        for method, path in writes:

            async def refuse(request: Request, prefix: str | None = None) -> Response:
                check_prefix(prefix)
                await caller(request)
                raise CatalogError(
                    403,
                    "ForbiddenException",
                    "lakelog's topic tables are read-only: lakelog writes them as it tiers.",
                )

            app.add_api_route(f"{base}{path}", refuse, methods=[method])

    return app


def _check_report(body: bytes) -> None:
    """A metrics report must look like one (ScanReport or CommitReport); it is then
    dropped (lakelog keeps no scan statistics)."""
    try:
        report = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise CatalogError(400, "BadRequestException", "The report is not JSON.") from None
    ok = (
        isinstance(report, dict)
        and isinstance(report.get("report-type"), str)
        and isinstance(report.get("table-name"), str)
        and type(report.get("snapshot-id")) is int
        and isinstance(report.get("metrics"), dict)
    )
    if not ok:
        raise CatalogError(
            400,
            "BadRequestException",
            "A metrics report needs report-type, table-name, snapshot-id and metrics.",
        )


def storage_properties(endpoint: str | None, region: str | None) -> dict[str, str]:
    """The client properties that reach the bucket (never credentials)."""
    props: dict[str, str] = {}
    if endpoint:
        props["s3.endpoint"] = endpoint
        props["s3.path-style-access"] = "true"
    if region:
        props["s3.region"] = region
    return props


def lazy_service(
    coordinator: LocalCoordinator,
    store: ObjectStore,
    security: SecurityStore | None,
    *,
    authenticate: bool,
    acl: bool,
    super_users: frozenset[str],
    endpoint: str | None = None,
    region: str | None = None,
) -> Callable[[], CatalogService]:
    """The catalog of a coordinator or ``lakelog serve`` process, built at its first
    request (pyiceberg loads then, not at start); security off unless ``authenticate``."""

    @functools.cache
    def build() -> CatalogService:
        from coordinator.iceberg.tables import TopicTables

        guard = None
        if authenticate:
            if security is None:
                raise ValueError("catalog authentication needs the security store")
            guard = CatalogSecurity(security, coordinator.db, acl, super_users)
        tables = TopicTables(coordinator.janitor_catalog(), store)
        return CatalogService(tables, guard, storage_properties(endpoint, region))

    return build
