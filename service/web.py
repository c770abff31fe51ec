"""ASGI wrappers around the agent app: body limit, proxy headers, trailing slashes.

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
"""

from __future__ import annotations

import ipaddress
import re

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from service.errors import ErrorCode, content_type_for
from service.settings import Settings

#: POST routes that enforce their own body limits (produce).
_PRODUCE = re.compile(
    r"/topics/[^/]+(?:/partitions/[^/]+)?|/v3/clusters/[^/]+/topics/[^/]+/records"
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    """Which direct peers may set ``X-Forwarded-*``: ``*``, IPs and CIDR networks."""

    def __init__(self, spec: str) -> None:
        items = [s.strip() for s in spec.split(",") if s.strip()]
        self.any = "*" in items
        self.networks: list[IPNetwork] = []
        self.names: set[str] = set()  # e.g. "unix:" peers, compared literally
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
        body = orjson.dumps({"error_code": int(ErrorCode.REQUEST_TOO_LARGE), "message": message})
        media_type = content_type_for(scope["path"])
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", media_type.encode()),
                    (b"content-length", b"%d" % len(body)),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def install_middleware(app: FastAPI, settings: Settings) -> None:
    """Wrap ``app``: forwarded host, proto/for, trailing slash, body limit (outermost first)."""
    trusted = settings.forwarded_allow_ips
    # add_middleware puts each new one outside the ones added before.
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(TrailingSlashMiddleware)
    app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=trusted)
    app.add_middleware(ForwardedHostMiddleware, trusted=TrustedProxies(trusted))
