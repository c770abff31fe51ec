"""ASGI wrappers around the agent app: body limit, proxy headers, trailing slashes, the
cluster check, OPTIONS and ``Allow``.

- One body limit for every route but produce (``max_body_bytes``): consumer and
  admin bodies are small, and were read whole whatever their size. A declared
  ``Content-Length`` over the limit is answered 413 before anything is read; a
  chunked body is counted as it streams and cut off at the limit. Produce routes
  keep their own limits (``formats.read_body`` for v2, per record for v3 streams).
  Starlette/FastAPI have a ``max_body_size`` of their own, but it answers a
  declared oversize with a plain-text 413 that replaces whatever the app sends;
  clients here expect the Confluent error body.
- Behind a TLS-terminating proxy the agent sees ``http://`` and the proxy's own
  address, so ``base_uri`` and v3 ``self`` links would point clients at a URL they
  cannot use. From peers listed in ``forwarded_allow_ips`` the agent takes
  ``X-Forwarded-Proto`` and ``X-Forwarded-For`` (uvicorn's ``ProxyHeadersMiddleware``)
  and ``X-Forwarded-Host`` (here: uvicorn has no support for it). ``advertised_url``,
  when set, still wins for links.
- ``/topics/t/`` and ``/topics/t`` are the same resource (Karapace's tests call every
  consumer route both ways). Starlette would answer the slashed form with a 307
  redirect, which curl and many clients do not follow on a POST; the slash is
  dropped before routing instead.
- ``/v3/clusters/<id>/...`` with another cluster's id is a 404 (``Cluster <id> cannot
  be found.``) on every route and method, produce included, before anything is read.
- ``OPTIONS`` on a path answers 204 with ``Allow`` listing the methods its routes
  serve; a 405 lists all of them too (Starlette's names only the first route's, and
  our routes of one path are often several).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from service.errors import ErrorCode, content_type_for
from service.settings import Settings

#: POST routes that enforce their own body limits (produce).
_PRODUCE = re.compile(
    r"/topics/[^/]+(?:/partitions/[^/]+)?|/v3/clusters/[^/]+/topics/[^/]+/records(?::batch)?"
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: Peer addresses whose answer ``TrustedProxies`` remembers (then it starts again).
_SEEN_PEERS = 4096


class TrustedProxies:
    """Which direct peers may set ``X-Forwarded-*``: ``*``, IPs and CIDR networks."""

    def __init__(self, spec: str) -> None:
        items = [s.strip() for s in spec.split(",") if s.strip()]
        self.any = "*" in items
        self.networks: list[IPNetwork] = []
        self.names: set[str] = set()  # e.g. "unix:" peers, compared literally
        # Answers per peer address: parsing it was ~2% of a produce request's CPU.
        self._seen: dict[str, bool] = {}
        for item in items:
            if item == "*":
                continue
            try:
                self.networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                self.names.add(item)

    def __contains__(self, host: object) -> bool:
        if self.any:
            return True
        if not isinstance(host, str):
            return False
        known = self._seen.get(host)
        if known is None:
            known = self._trusted(host)
            if len(self._seen) >= _SEEN_PEERS:
                self._seen.clear()
            self._seen[host] = known
        return known

    def _trusted(self, host: str) -> bool:
        if host in self.names:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)


class ForwardedHostMiddleware:
    """A trusted proxy's ``X-Forwarded-Host`` becomes the request's ``Host``.

    Must run before ``ProxyHeadersMiddleware``, which replaces the peer address
    (that the trust decision is made on) with the client's.
    """

    def __init__(self, app: ASGIApp, trusted: TrustedProxies) -> None:
        self.app = app
        self.trusted = trusted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            client = scope.get("client")
            if client and client[0] in self.trusted:
                forwarded = None
                for name, value in scope["headers"]:
                    if name == b"x-forwarded-host":
                        forwarded = value
                if forwarded:
                    # The first host is the client's (proxies append theirs).
                    host = forwarded.split(b",", 1)[0].strip()
                    headers = [(n, v) for n, v in scope["headers"] if n != b"host"]
                    headers.append((b"host", host))
                    scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


class TrailingSlashMiddleware:
    """Route ``/a/b/`` as ``/a/b`` (the root ``/`` stays)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if len(path) > 1 and path.endswith("/"):
                scope = {**scope, "path": path.rstrip("/") or "/"}
                raw: bytes | None = scope.get("raw_path")
                if raw:
                    scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)


class BodyTooLargeError(HTTPException):
    """A body over the limit (an HTTPException so FastAPI's body parsing passes it on)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"Request body exceeds the limit of {limit} bytes.")


class BodyLimitMiddleware:
    """Refuse bodies over ``limit`` bytes on every route but produce (see module doc)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (
            scope["method"] == "POST" and _PRODUCE.fullmatch(scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._refuse(scope, send)
                return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLargeError(self.limit)
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        message = BodyTooLargeError(self.limit).detail
        await send_error(scope, send, 413, int(ErrorCode.REQUEST_TOO_LARGE), message)


async def send_error(
    scope: Scope,
    send: Send,
    status: int,
    code: int,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Answer with the Confluent error body, from an ASGI wrapper (before any route)."""
    body = orjson.dumps({"error_code": code, "message": message})
    media_type = content_type_for(scope["path"])
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", media_type.encode()),
                (b"content-length", b"%d" % len(body)),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


_CLUSTER_PATH = re.compile(r"/v3/clusters/([^/]+)(?:/|$)")


class ClusterCheckMiddleware:
    """404 for every request naming another cluster than this agent's (see module doc)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            m = _CLUSTER_PATH.match(scope["path"])
            agent = getattr(scope["app"].state, "agent", None) if m else None
            if m and agent is not None and m.group(1) != agent.cluster_id:
                message = f"Cluster {m.group(1)} cannot be found."
                await send_error(scope, send, 404, int(ErrorCode.NOT_FOUND), message)
                return
        await self.app(scope, receive, send)


class ShortcutRoute(Route):
    """A plain Starlette route served ahead of the FastAPI route of the same path and
    method (the produce routes, ``create_app``): the endpoint takes the ``Request`` and
    reads what it needs itself, so no dependency solving or parameter validation runs
    per request (~15% of a v2 produce request's CPU). Errors go through the app's
    exception handlers as the FastAPI route's do. Hidden from the route table
    (``_leaf_routes``: ACL rules, ``Allow``), where the FastAPI route, which matches the
    same requests, stands for it and keeps the OpenAPI description."""

    def __init__(self, path: str, endpoint: Callable[[Request], Awaitable[Response]]) -> None:
        super().__init__(path, endpoint, methods=["POST"], include_in_schema=False)


def _leaf_routes(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route, included routers flattened (newer FastAPI keeps an included router as
    one entry with its ``original_router``; ours are included without a prefix), without
    the shortcuts (``ShortcutRoute``)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _leaf_routes(inner.routes)
        elif not isinstance(route, ShortcutRoute):
            yield route


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """The methods the routes of this request's path serve (none: no such path)."""
    routes: list[BaseRoute] | None = getattr(app.state, "leaf_routes", None)
    if routes is None:
        routes = app.state.leaf_routes = list(_leaf_routes(app.router.routes))
    methods: set[str] = set()
    for route in routes:
        match, _ = route.matches({**scope, "method": "GET"})
        route_methods = getattr(route, "methods", None)
        if match is not Match.NONE and route_methods:
            methods.update(route_methods)
    return sorted(methods)


class MethodsMiddleware:
    """``OPTIONS`` -> 204 with ``Allow``; every 405 carries the path's full ``Allow``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS":
            methods = allowed_methods(scope["app"], scope)
            if methods:
                allow = ", ".join([*methods, "OPTIONS"]).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 204,
                        "headers": [(b"allow", allow)],
                    }
                )
                await send({"type": "http.response.body", "body": b""})
                return

        async def send_with_allow(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                allow = ", ".join([*allowed_methods(scope["app"], scope), "OPTIONS"])
                headers = [(n, v) for n, v in message.get("headers", []) if n.lower() != b"allow"]
                message = {**message, "headers": [*headers, (b"allow", allow.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_allow)


def install_middleware(app: FastAPI, settings: Settings) -> None:
    """Wrap ``app``: forwarded host, proto/for, trailing slash, the cluster check, OPTIONS
    and Allow, body limit (outermost first)."""
    trusted = settings.forwarded_allow_ips
    # add_middleware puts each new one outside the ones added before.
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(MethodsMiddleware)
    app.add_middleware(ClusterCheckMiddleware)
    app.add_middleware(TrailingSlashMiddleware)
    app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=trusted)
    app.add_middleware(ForwardedHostMiddleware, trusted=TrustedProxies(trusted))
