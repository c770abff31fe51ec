"""Raw calls of the coordinator's operations (``POST /v2/<name>``, MessagePack), for
tests that speak to its HTTP API below the client: malformed bodies, other callers'
credentials, status codes."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

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
