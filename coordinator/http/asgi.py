"""Small ASGI pieces the coordinator's and the agents' middleware share: read a request's
body ahead of the app (and hand it the same bytes again), and rewrite a JSON answer
before it is sent."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

import orjson
from starlette.types import Message, Receive, Send


async def read_body(receive: Receive) -> bytes:
    """The whole request body."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes) -> Receive:
    """A ``receive`` that gives the app ``body`` (already read) as the request's."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


class RewriteJson:
    """A ``send`` that collects a 200 JSON answer, passes its document through ``rewrite``
    and sends the result (with its new length); any other answer goes as it is."""

    def __init__(self, send: Send, rewrite: Callable[[Any], Any]) -> None:
        self.send = send
        self.rewrite = rewrite
        self.start: Message | None = None
        self.chunks: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            return
        if message["type"] != "http.response.body" or self.start is None:
            await self.send(message)
            return
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        raw = b"".join(self.chunks)
        start = self.start
        if start["status"] == 200:
            with suppress(orjson.JSONDecodeError):
                raw = orjson.dumps(self.rewrite(orjson.loads(raw)))
        headers = [(n, v) for n, v in start.get("headers", []) if n.lower() != b"content-length"]
        headers.append((b"content-length", b"%d" % len(raw)))
        await self.send({**start, "headers": headers})
        await self.send({"type": "http.response.body", "body": raw})
