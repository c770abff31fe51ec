"""A small fault-injecting HTTP/1.1 proxy to put in front of the moto S3 server.

Run as a process (``python -m tests.faultproxy --port P --upstream http://127.0.0.1:M``)
and steer it from a test over its control API, served on the same port under
``/__faults__``:

- ``PUT /__faults__/rules`` with a JSON list of rules replaces the rules (``[]`` clears);
- ``GET /__faults__/stats`` returns request counts per method and per rule how often it
  fired (a test asserts faults really happened, or it proves nothing);
- ``POST /__faults__/reset`` clears rules and counters.

A rule (JSON object) matches on ``method`` (``"PUT"``, ``"*"``) and ``path`` (a regular
expression searched in the request path) and fires with probability ``rate`` (seeded,
so runs repeat), at most ``times`` times (null: unbounded). ``action``:

- ``"status"``: answer ``status`` (default 503) with an S3 XML error ``code``
  (default ``SlowDown``). ``when="before"`` (default) never reaches moto: nothing is
  written; ``when="after"`` forwards first, so the write happened but the client
  sees a failure.
- ``"reset"``: abort the client connection with a TCP RST, before forwarding (nothing
  written) or after (written, answer lost).
- ``"delay"``: wait ``delay_s`` seconds, then forward (a slow response).

The first rule that matches and fires decides; no rule firing means a plain forward.

Forwarding: the request is read whole (``Expect: 100-continue`` is answered here,
chunked bodies are de-chunked), sent to moto on a fresh connection (moto closes
every connection after one answer), and the answer is relayed with a
``Content-Length`` so the client's connection stays alive.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import socket
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.procs import Proc, free_port

CONTROL = "/__faults__"
ACTIONS = ("status", "reset", "delay")

# -- rules ----------------------------------------------------------------------------


@dataclass
class Rule:
    """One fault: which requests, how often, what happens (see the module docstring)."""

    action: str
    method: str = "*"
    path: str = ""
    rate: float = 1.0
    times: int | None = None
    when: str = "before"
    status: int = 503
    code: str = "SlowDown"
    delay_s: float = 0.5
    fired: int = 0
    _path_re: re.Pattern[str] = field(default=re.compile(""), repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Rule:
        known = {"action", "method", "path", "rate", "times", "when", "status", "code", "delay_s"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown rule fields: {sorted(unknown)}")
        rule = cls(**d)
        if rule.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {rule.action!r}")
        if rule.when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', got {rule.when!r}")
        if rule.action == "delay" and rule.when != "before":
            raise ValueError("a delay happens before forwarding")
        rule._path_re = re.compile(rule.path)
        return rule

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "method": self.method,
            "path": self.path,
            "rate": self.rate,
            "times": self.times,
            "when": self.when,
            "status": self.status,
            "code": self.code,
            "delay_s": self.delay_s,
            "fired": self.fired,
        }

    def matches(self, method: str, path: str) -> bool:
        return (self.method in ("*", method)) and self._path_re.search(path) is not None


# -- HTTP framing ---------------------------------------------------------------------


class _Closed(Exception):
    """The peer closed the connection between requests."""


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, list[tuple[str, str]]]:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            raise _Closed from None
        raise
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return lines[0], headers


def _get(headers: list[tuple[str, str]], name: str) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def _without(headers: list[tuple[str, str]], *names: str) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in names]


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            # Trailers, if any, end with an empty line.
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readexactly(2)


async def _read_body(
    reader: asyncio.StreamReader, headers: list[tuple[str, str]], *, to_eof: bool
) -> bytes:
    if (_get(headers, "transfer-encoding") or "").lower() == "chunked":
        return await _read_chunked(reader)
    length = _get(headers, "content-length")
    if length is not None:
        return await reader.readexactly(int(length))
    return await reader.read() if to_eof else b""


def _render(start: str, headers: list[tuple[str, str]], body: bytes | None) -> bytes:
    lines = [start, *(f"{k}: {v}" for k, v in headers)]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def _error_response(status: int, code: str) -> bytes:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>injected by the fault proxy</Message><RequestId>faultproxy</RequestId>"
        f"</Error>"
    ).encode()
    return _render(f"HTTP/1.1 {status} Injected", [("Content-Type", "application/xml")], body)


def _json_response(status: int, data: Any) -> bytes:
    return _render(
        f"HTTP/1.1 {status} OK", [("Content-Type", "application/json")], json.dumps(data).encode()
    )


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0): the client sees 'connection reset by peer'."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# -- the proxy ------------------------------------------------------------------------


class FaultProxyServer:
    """The asyncio server behind ``python -m tests.faultproxy``."""

    def __init__(self, upstream: str, seed: int = 1) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port or 80))
        self.rules: list[Rule] = []
        self.random = random.Random(seed)
        self.requests: dict[str, int] = {}
        self.upstream_errors = 0

    def stats(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "rules": [r.to_json() for r in self.rules],
            "upstream_errors": self.upstream_errors,
        }

    def _pick(self, method: str, path: str) -> Rule | None:
        for rule in self.rules:
            if rule.times is not None and rule.fired >= rule.times:
                continue
            if rule.matches(method, path) and self.random.random() < rule.rate:
                rule.fired += 1
                return rule
        return None

    def _control(self, method: str, path: str, body: bytes) -> bytes:
        try:
            if path == f"{CONTROL}/rules" and method == "PUT":
                self.rules = [Rule.from_json(r) for r in json.loads(body or b"[]")]
                return _json_response(200, self.stats())
            if path == f"{CONTROL}/stats" and method == "GET":
                return _json_response(200, self.stats())
            if path == f"{CONTROL}/reset" and method == "POST":
                self.rules = []
                self.requests = {}
                self.upstream_errors = 0
                return _json_response(200, self.stats())
        except (ValueError, TypeError) as e:
            return _json_response(400, {"error": str(e)})
        return _json_response(404, {"error": f"no control endpoint {method} {path}"})

    async def _forward(
        self, start: str, headers: list[tuple[str, str]], body: bytes, method: str
    ) -> bytes:
        """One request to moto on a fresh connection; the answer re-framed for keep-alive."""
        reader, writer = await asyncio.open_connection(*self.upstream)
        try:
            fwd = _without(headers, "expect", "content-length", "transfer-encoding", "connection")
            fwd.append(("Connection", "close"))
            writer.write(_render(start, fwd, body))
            await writer.drain()
            status_line, resp_headers = await _read_head(reader)
            status = int(status_line.split(" ", 2)[1])
            no_body = method == "HEAD" or status in (204, 304) or 100 <= status < 200
            out = _without(resp_headers, "connection", "transfer-encoding", "keep-alive")
            if no_body:
                # HEAD keeps the object's Content-Length: pass it on, send no body.
                return _render(status_line, out, None)
            data = await _read_body(reader, resp_headers, to_eof=True)
            return _render(status_line, _without(out, "content-length"), data)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                start, headers = await _read_head(reader)
                method, target, _ = start.split(" ", 2)
                path = target.split("?", 1)[0]
                if (_get(headers, "expect") or "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await writer.drain()
                body = await _read_body(reader, headers, to_eof=False)
                if path.startswith(CONTROL):
                    writer.write(self._control(method, path, body))
                    await writer.drain()
                    continue
                self.requests[method] = self.requests.get(method, 0) + 1
                rule = self._pick(method, path)
                if rule is not None and rule.when == "before":
                    if rule.action == "reset":
                        _abort(writer)
                        return
                    if rule.action == "status":
                        writer.write(_error_response(rule.status, rule.code))
                        await writer.drain()
                        continue
                    await asyncio.sleep(rule.delay_s)
                try:
                    answer = await self._forward(start, headers, body, method)
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    self.upstream_errors += 1
                    answer = _error_response(502, "BadGateway")
                if rule is not None and rule.when == "after":
                    if rule.action == "reset":
                        _abort(writer)
                        return
                    answer = _error_response(rule.status, rule.code)
                writer.write(answer)
                await writer.drain()
        except (_Closed, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


async def serve(host: str, port: int, upstream: str, seed: int) -> None:
    proxy = FaultProxyServer(upstream, seed)
    server = await asyncio.start_server(proxy.handle, host, port, limit=1 << 20, backlog=512)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fault-injecting HTTP proxy for moto S3.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="http://host:port of the S3 server")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault dice")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, args.upstream, args.seed))


# -- the test side --------------------------------------------------------------------


class FaultProxy:
    """A running proxy process and its control API (used by tests and benchmarks)."""

    def __init__(self, proc: Proc, url: str) -> None:
        self.proc = proc
        self.url = url

    @classmethod
    def start(cls, tmp: Path, upstream: str, *, seed: int = 1) -> FaultProxy:
        """Start ``python -m tests.faultproxy`` on a free port in front of ``upstream``."""
        port = free_port()
        root = str(Path(__file__).resolve().parents[1])
        proc = Proc(
            [
                *(sys.executable, "-m", "tests.faultproxy", "--port", str(port)),
                *("--upstream", upstream, "--seed", str(seed)),
            ],
            tmp / f"faultproxy-{port}.log",
            env={"PYTHONPATH": root},
        )
        url = f"http://127.0.0.1:{port}"
        proc.wait_ready(f"{url}{CONTROL}/stats", "fault proxy")
        return cls(proc, url)

    def set_rules(self, *rules: dict[str, Any]) -> dict[str, Any]:
        """Replace the rules (none: forward everything); returns the stats."""
        r = httpx.put(f"{self.url}{CONTROL}/rules", json=list(rules), timeout=10)
        if r.status_code != 200:
            raise ValueError(r.text)
        data: dict[str, Any] = r.json()
        return data

    def clear(self) -> None:
        self.set_rules()

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(f"{self.url}{CONTROL}/stats", timeout=10).json()
        return data

    def reset(self) -> None:
        httpx.post(f"{self.url}{CONTROL}/reset", timeout=10).raise_for_status()

    def stop(self) -> None:
        self.proc.stop()


if __name__ == "__main__":
    main()
