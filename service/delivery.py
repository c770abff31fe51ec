"""Knowing whether an answer reached its client: disconnect watching and reporting responses.

HTTP has no acknowledgement, so "delivered" here means: the whole body was
handed to the connection while the client was still connected. A client that
hung up before (a timeout shorter than the long-poll, a killed process) is
seen by the server as an ``http.disconnect`` message on the request's ASGI
``receive`` channel; ``DisconnectWatch`` waits on that channel for the whole
request and ``DeliveryResponse`` reports to its ``on_done`` callback whether
it got its body out first; ``DeliveryStream`` does the same for each chunk of a
stream (the v3 group stream commits only what was delivered). Bytes still in
socket buffers when a client dies can be lost; that window is the kernel's, and
the at-least-once redelivery covers it only if the client had not yet been
answered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

#: Body slices written one after another, each after checking the client is still there
#: (and under uvicorn's flow control, so a 64 MiB answer is not buffered whole twice).
SLICE_BYTES = 1 << 20
#: Event-loop turns the response waits, after its last byte, for a disconnect to show.
DISCONNECT_TURNS = 4


class DisconnectWatch:
    """Waits on a request's ``receive`` channel until the client disconnects.

    Start it before the long-poll (a GET has no body to read, so nobody else
    reads ``receive``); ``on_disconnect`` callbacks run when it happens (e.g. to
    wake a waiting fetch). After the response is complete, ASGI servers answer
    ``receive`` with ``http.disconnect`` too: stop the watch before that.
    """

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task: asyncio.Task[None] | None = None
        self.disconnected = False
        self.callbacks: list[Callable[[], None]] = []

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name="lakelog-disconnect-watch")

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                for callback in self.callbacks:
                    callback()
                return

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class DeliveryResponse(Response):
    """A response that writes its body in slices, gives up when the client is gone, and
    then calls ``on_done(delivered)`` (also when it never got to send anything).

    ``watch`` must have been started; it is stopped here, before the last byte of the
    body completes the response.
    """

    def __init__(
        self,
        content: bytes,
        media_type: str,
        watch: DisconnectWatch,
        on_done: Callable[[bool], Awaitable[None]],
    ) -> None:
        super().__init__(content, media_type=media_type)
        self.watch = watch
        self.on_done = on_done

    @staticmethod
    async def _settle() -> None:
        """A hang-up already in the socket takes a few loop turns to show: the server
        reads it, uvicorn wakes its receive(), the watch task runs."""
        for _ in range(DISCONNECT_TURNS):
            await asyncio.sleep(0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        delivered = False
        try:
            await self._settle()
            if not self.watch.disconnected:
                await send(
                    {
                        "type": "http.response.start",
                        "status": self.status_code,
                        "headers": self.raw_headers,
                    }
                )
                # Everything but the last byte first: until it is sent no client has the
                # whole answer, so a hang-up seen before it means "not delivered", and a
                # client that closes as soon as it has read the answer cannot look like one.
                view = memoryview(self.body)
                held = max(len(view) - 1, 0)
                for start in range(0, held, SLICE_BYTES):
                    if self.watch.disconnected:
                        break
                    chunk = bytes(view[start : min(start + SLICE_BYTES, held)])
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                else:
                    await self._settle()
                    if not self.watch.disconnected:
                        await self.watch.stop()  # receive() reports the end as a disconnect
                        last = bytes(view[held:])
                        await send({"type": "http.response.body", "body": last, "more_body": False})
                        delivered = True
        finally:
            await self.watch.stop()
            await self.on_done(delivered)


class DeliveryStream(Response):
    """A streaming response that calls ``on_delivered()`` after each chunk of ``chunks``
    got out to a client still connected, and stops at the first sign it is gone.

    A chunk is sent in slices, its last byte held back: sending that byte waits until
    the rest left the server's buffers (uvicorn's flow control), then a hang-up is
    looked for. A chunk cut short, or followed by a hang-up, is not delivered. The
    generator is closed (its ``finally`` runs) before ``__call__`` returns. ``watch``
    must have been started.
    """

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        media_type: str,
        watch: DisconnectWatch,
        on_delivered: Callable[[], None],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # Not Response.__init__: without a body, no Content-Length (as StreamingResponse).
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)
        self.chunks = chunks
        self.watch = watch
        self.on_delivered = on_delivered

    async def _send_chunk(self, send: Send, chunk: bytes) -> bool:
        """Whether the whole chunk got out while the client was there."""
        view = memoryview(chunk)
        held = max(len(view) - 1, 0)
        for start in range(0, held, SLICE_BYTES):
            if self.watch.disconnected:
                return False
            part = bytes(view[start : min(start + SLICE_BYTES, held)])
            await send({"type": "http.response.body", "body": part, "more_body": True})
        if self.watch.disconnected:
            return False
        await send({"type": "http.response.body", "body": bytes(view[held:]), "more_body": True})
        await DeliveryResponse._settle()
        return not self.watch.disconnected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await DeliveryResponse._settle()
            if self.watch.disconnected:
                return
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for chunk in self.chunks:
                if not await self._send_chunk(send, chunk):
                    return
                self.on_delivered()
            if not self.watch.disconnected:
                await self.watch.stop()  # receive() reports the end as a disconnect
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
            await self.watch.stop()
