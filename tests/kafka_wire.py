"""Kafka's wire protocol below any client, for the tests and benchmarks that speak it
themselves: kio messages with neutral fields, request frames, answers read off a socket."""

from __future__ import annotations

import dataclasses
import io
import socket
import struct
from typing import Any

from kio.index import load_response_from_request
from kio.serial import entity_reader, entity_writer

from service.kafka.framing import build, nested


def request_frame(body: Any, correlation: int, client_id: str, padding: int = 0) -> bytes:
    """One request frame of ``body`` (a kio request), as a client sends it; ``padding``
    zero bytes after the body (brokers ignore them)."""
    cls = type(body)
    out = io.BytesIO()
    header_cls = cls.__header_schema__
    entity_writer(header_cls)(
        out,
        header_cls(
            request_api_key=cls.__api_key__,
            request_api_version=cls.__version__,
            correlation_id=correlation,
            client_id=client_id,
        ),
    )
    entity_writer(cls)(out, body)
    out.write(b"\0" * padding)
    return struct.pack(">i", out.tell()) + out.getvalue()


def read_answer(sock: socket.socket, request_cls: type, correlation: int) -> Any:
    """The next response frame on ``sock``, decoded as the answer to a ``request_cls``
    request; asserts that it answers ``correlation``."""
    size = struct.unpack(">i", read_exact(sock, 4))[0]
    frame = read_exact(sock, size)
    resp = load_response_from_request(request_cls)
    header, used = entity_reader(resp.__header_schema__)(frame, 0)
    assert header.correlation_id == correlation
    answer, _ = entity_reader(resp)(frame, used)
    return answer


def read_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(n - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("closed by the agent")
        data += chunk
    return bytes(data)


def make(cls: type, *, string: str = "", number: int = -1, **given: Any) -> Any:
    """A kio message of ``cls``: the ``given`` fields (dicts and lists of dicts become its
    nested entities), every other required field a neutral default: None where it may
    be, empty tuples and bytes, False, ``string`` for a string and ``number`` for a
    number."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in given:
            v = given[f.name]
            entity = _entity(cls, f)
            if entity is not None and isinstance(v, list):
                v = tuple(
                    make(entity, string=string, number=number, **i) if isinstance(i, dict) else i
                    for i in v
                )
            values[f.name] = v
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kind = str(f.metadata.get("kafka_type", ""))
            text = str(f.type)
            if "None" in text:
                values[f.name] = None
            elif text.startswith("tuple"):
                values[f.name] = ()
            elif kind == "string":
                values[f.name] = string
            elif kind == "bool":
                values[f.name] = False
            elif kind in ("bytes", "records"):
                values[f.name] = b""
            else:
                values[f.name] = number
    return build(cls, **values)


def _entity(cls: type, f: dataclasses.Field[Any]) -> Any:
    text = str(f.type)
    if not text.startswith("tuple[") or f.metadata.get("kafka_type"):
        return None
    return nested(cls, text.removeprefix("tuple[").split(",")[0].rsplit(".", 1)[-1])
