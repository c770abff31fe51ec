"""``HttpCoordinator``: every coordinator operation over the coordinator's HTTP API.

The methods are not written here: each is made from its definition in
``coordinator.api`` (its protocol method's signature), and sends ``POST /v2/<name>``
with the arguments as a MessagePack map, decoding the answer to the method's return
type. Errors travel as ``{"error": <class name>, "message": ..., "retriable": bool}``
(JSON) and the client raises the same ``segments.errors`` class again.

Failure handling: a request that never reached a coordinator (connection
refused, connect timeout) is sent to the next URL, whatever it was. A request
that may have reached one (read timeout, reset, a 5xx without our error body)
is sent again only when its operation is safe to repeat (``coordinator.api.RETRY_UNSAFE``
names those that are not); commits are tried a few times, which the coordinator
de-duplicates by object key. Anything else surfaces as ``CoordinatorUnavailableError``
(retriable) for the caller to decide.
"""

from __future__ import annotations

import functools
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeGuard, cast

import httpx
import orjson

from coordinator.api import MEDIA_TYPE, OPERATIONS, FullCoordinator, Operation
from segments.errors import (
    ERRORS_BY_NAME,
    CoordinatorUnavailableError,
    LakelogError,
    PartialCommitError,
)

log = logging.getLogger(__name__)

_COMMIT_ATTEMPTS = 4
_BACKOFF_S = (0.05, 0.2, 0.5)
_SENT = {"content-type": MEDIA_TYPE, "accept": MEDIA_TYPE}


class HttpCoordinator(FullCoordinator, Protocol):
    """A coordinator over HTTP (:func:`http_coordinator` makes one): every operation,
    and the transport the management routes (``coordinator.security.http``) share."""

    def close(self) -> None: ...

    def __enter__(self) -> HttpCoordinator: ...

    def __exit__(self, *exc: object) -> None: ...

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str | int | float] | None = None,
        idempotent: bool,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """One JSON request with failover; the decoded answer (None for 204)."""
        ...


def http_coordinator(
    urls: str | Sequence[str],
    timeout: float = 10.0,
    *,
    client: httpx.Client | None = None,
    headers: Mapping[str, str] | None = None,
    verify: ssl.SSLContext | bool = True,
) -> HttpCoordinator:
    """A coordinator client; thread-safe, one connection pool.

    Args:
        urls: one base URL (``http://host:8083``) or several; on transport errors
            the client fails over to the next one and stays there.
        timeout: seconds for connect, read and write of one request.
        client: an ``httpx.Client`` to use instead of building one (tests pass a
            Starlette ``TestClient`` to run the real client against an app in-process).
        headers: sent with every request (the coordinator's shared secret).
        verify: how https:// coordinators are verified (a context with their CA).
    """
    return cast(HttpCoordinator, _Client(urls, timeout, client, headers, verify))


def is_http_coordinator(coordinator: object) -> TypeGuard[HttpCoordinator]:
    """Whether ``coordinator`` is one :func:`http_coordinator` made."""
    return isinstance(coordinator, _Client)


def _partial_commit(data: dict[str, Any]) -> PartialCommitError:
    """A PartialCommitError from its body (``coordinator.http.server.error_body``)."""
    failures: list[LakelogError | None] = []
    for f in data.get("failures") or []:
        if f is None:
            failures.append(None)
        else:
            cls = ERRORS_BY_NAME.get(str(f.get("error")), LakelogError)
            failures.append(cls(str(f.get("message", ""))))
    bases = [None if b is None else int(b) for b in data.get("base_offsets") or []]
    return PartialCommitError(str(data.get("message", "")), bases, failures)


class _MaybeDelivered(Exception):
    """A transport failure after the request may have reached the server."""


class _Client:
    """The runtime side of :class:`HttpCoordinator`; its operations are set on the class
    below, one per ``coordinator.api.OPERATIONS`` entry."""

    def __init__(
        self,
        urls: str | Sequence[str],
        timeout: float,
        client: httpx.Client | None,
        headers: Mapping[str, str] | None,
        verify: ssl.SSLContext | bool,
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("a coordinator client needs at least one URL")
        self.urls = [u.rstrip("/") for u in self.urls]
        self._current = 0
        self._lock = threading.Lock()
        self._own_client = client is None
        # ~32 agent threads share the pool; keep every connection alive between calls.
        self._client = client or httpx.Client(
            timeout=timeout,
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
            headers=headers,  # the shared secret (coordinator.security.http)
            verify=verify,
        )
        self._cluster_id: str | None = None

    def close(self) -> None:
        if self._own_client:
            self._client.close()

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"http_coordinator({', '.join(self.urls)})"

    def cluster_id(self) -> str:
        # Stable for the life of the cluster, so one round trip is enough.
        if self._cluster_id is None:
            self._cluster_id = str(self._call(OPERATIONS["cluster_id"], (), {}))
        return self._cluster_id

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str | int | float] | None = None,
        idempotent: bool,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        content = None if body is None else orjson.dumps(body)
        if content is not None:
            headers = {**(headers or {}), "content-type": "application/json"}
        resp = self._send(
            method, path, content, params=params, headers=headers, idempotent=idempotent
        )
        if resp.status_code == 204 or not resp.content:
            return None
        return orjson.loads(resp.content)

    def _call(self, op: Operation, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        resp = self._send(
            "POST",
            op.path,
            op.request(args, kwargs),
            headers=_SENT,
            idempotent=op.retry_safe,
            attempts=_COMMIT_ATTEMPTS if op.name == "commit" else 1,
        )
        return op.read_answer(resp.content)

    def _send(
        self,
        method: str,
        path: str,
        content: bytes | None,
        *,
        params: Mapping[str, str | int | float] | None = None,
        headers: Mapping[str, str] | None = None,
        idempotent: bool,
        attempts: int = 1,
    ) -> httpx.Response:
        """Send one request with failover; the successful answer.

        Raises the server's ``LakelogError`` class, or CoordinatorUnavailableError
        when no coordinator answered.
        """
        last: Exception | None = None
        for attempt in range(attempts):
            if attempt:
                time.sleep(_BACKOFF_S[min(attempt - 1, len(_BACKOFF_S) - 1)])
            # One round tries each URL once, starting at the one that last worked.
            with self._lock:
                start = self._current
            for i in range(len(self.urls)):
                idx = (start + i) % len(self.urls)
                url = self.urls[idx] + path
                try:
                    resp = self._client.request(
                        method, url, content=content, headers=headers, params=params
                    )
                    _raise_for_error(resp)
                except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                    last = e  # never reached a server: any request may go elsewhere
                    continue
                except (httpx.TransportError, _MaybeDelivered) as e:
                    last = e
                    if not idempotent:
                        raise CoordinatorUnavailableError(
                            f"{method} {url} failed and may or may not have been applied: {e}"
                        ) from e
                    continue
                if idx != start:
                    with self._lock:
                        self._current = idx
                    log.warning("coordinator failover: now using %s", self.urls[idx])
                return resp
        raise CoordinatorUnavailableError(
            f"no coordinator answered {method} {path} (tried {', '.join(self.urls)}): {last}"
        ) from last


def _raise_for_error(resp: httpx.Response) -> None:
    if resp.is_success:
        return
    try:
        data = orjson.loads(resp.content) if resp.content else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        cls = ERRORS_BY_NAME.get(data["error"], LakelogError)
        if cls is PartialCommitError:
            raise _partial_commit(data)
        raise cls(str(data.get("message", "")))
    if resp.status_code >= 500:
        # A proxy, a crash, anything that is not our coordinator speaking.
        raise _MaybeDelivered(f"HTTP {resp.status_code} without an error body")
    raise LakelogError(f"unexpected HTTP {resp.status_code}: {resp.text[:200]}")


def _remote(op: Operation) -> Callable[..., Any]:
    @functools.wraps(op.method)
    def call(self: _Client, *args: Any, **kwargs: Any) -> Any:
        return self._call(op, args, kwargs)

    return call


for _op in OPERATIONS.values():
    if not hasattr(_Client, _op.name):
        setattr(_Client, _op.name, _remote(_op))
