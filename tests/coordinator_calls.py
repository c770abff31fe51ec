"""Raw calls of the coordinator's operations (``POST /v2/<name>``, MessagePack), for
tests that speak to its HTTP API below the client: malformed bodies, other callers'
credentials, status codes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import httpx
import msgspec
import orjson

from coordinator.api import MEDIA_TYPE, OPERATIONS


def op_path(name: str) -> str:
    """The route of the operation ``name`` (KeyError for none)."""
    return OPERATIONS[name].path


def call(
    client: httpx.Client | Any,
    name: str,
    args: dict[str, Any] | bytes | None = None,
    *,
    base: str = "",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """Send ``args`` (a dict, encoded as they are, unchecked; or raw bytes) to the
    operation ``name`` through ``client`` (an httpx or Starlette test client)."""
    content = args if isinstance(args, bytes) else msgspec.msgpack.encode(args or {})
    return client.post(  # type: ignore[no-any-return]
        base + op_path(name),
        content=content,
        headers={"content-type": MEDIA_TYPE, **(headers or {})},
    )


def answer(resp: httpx.Response) -> Any:
    """The decoded answer: the result (untyped) for a 200, the error body otherwise."""
    if resp.status_code == 200:
        return msgspec.msgpack.decode(resp.content)
    return resp.json()


def raw_post(
    app: Any,
    path: str,
    pieces: Iterable[bytes],
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> tuple[int, Any, int]:
    """POST ``pieces`` to ``app`` straight over ASGI, one ``http.request`` message each
    (a chunked body unless ``headers`` declare a Content-Length), pulling a piece only
    when the app asks for more. Returns (status, the JSON answer, pieces pulled): what a
    test needs to see that a body was cut off, not read whole."""
    pending = iter(pieces)
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        piece = next(pending, None)
        if piece is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        pulled += 1
        return {"type": "http.request", "body": piece, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    asyncio.run(app(scope, receive, send))
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], orjson.loads(body), pulled
