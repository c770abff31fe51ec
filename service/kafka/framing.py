"""Kafka frames and messages as pure functions over bytes (sans-io: no sockets, no loop).

Byte layout of everything on a Kafka connection (big-endian)::

    frame          i32 size (bytes that follow, >= 0), then size bytes of message
    request        request header, then the request body of (api key, version)
      header v1    i16 api key, i16 api version, i32 correlation id,
                   i16-prefixed nullable client id
      header v2    v1 + tagged fields (flexible versions; chosen by the message type)
    response       response header, then the response body
      header v0    i32 correlation id (ApiVersions always answers with v0)
      header v1    v0 + tagged fields (flexible versions)

Message bodies are read and written by kio (``kio.serial``), whose types are generated
from Kafka's own message schemas, every version, flexible ones included; nothing here
describes a message type by hand. The only bytes read without kio are the first eight
of a request (api key, version, correlation id): every header version starts with
them, and they are what an answer to an unknown API or version needs.

A ``FrameError`` means the connection cannot go on (Kafka closes it too): an
oversized or negative size, a body that does not parse, an API or version we do not
serve. Other connections are never affected.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import sys
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from segments.batches import Pieces

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FrameDecoder",
    "FrameError",
    "FrameTooLargeError",
    "InvalidFrameError",
    "Request",
    "RequestHeader",
    "UnsupportedRequestError",
    "build",
    "decode_request",
    "encode_frame",
    "encode_response",
    "millis",
    "nested",
    "peek_header",
    "request_class",
]

#: Kafka's ``socket.request.max.bytes`` default (100 MiB).
DEFAULT_MAX_FRAME_BYTES = 104_857_600

_SIZE = struct.Struct(">i")
_HEADER_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id


class FrameError(Exception):
    """The connection's byte stream cannot be served any further: close it."""


class FrameTooLargeError(FrameError):
    """A frame announces more bytes than the limit (``socket.request.max.bytes``)."""


class InvalidFrameError(FrameError):
    """A negative size, or a message that does not parse as its header says."""


class UnsupportedRequestError(FrameError):
    """An API key or version this listener does not serve.

    Carries the header prefix so the one answer Kafka gives (ApiVersions with
    UNSUPPORTED_VERSION) can be built.
    """

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"unsupported API key {api_key} version {api_version}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class FrameDecoder:
    """Cuts size-prefixed frames out of a byte stream as it arrives.

    Args:
        max_frame_bytes: a frame announcing more than this raises FrameTooLargeError
            before any of its body is buffered.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return every frame they complete, in order.

        Raises:
            FrameTooLargeError, InvalidFrameError: the stream is unusable from here on.
        """
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        while len(buf) - pos >= _SIZE.size:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0:
                raise InvalidFrameError(f"negative frame size {size}")
            if size > self.max_frame_bytes:
                raise FrameTooLargeError(
                    f"frame of {size} bytes exceeds socket.request.max.bytes "
                    f"({self.max_frame_bytes})"
                )
            end = pos + _SIZE.size + size
            if end > len(buf):
                break
            out.append(bytes(buf[pos + _SIZE.size : end]))
            pos = end
        if pos:
            del buf[:pos]
        return out


def encode_frame(payload: bytes) -> bytes:
    """``payload`` with its size prefix."""
    return _SIZE.pack(len(payload)) + payload


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True, slots=True)
class Request:
    """A decoded request: its header and its kio body (``kio.schema.<api>.v<N>``)."""

    header: RequestHeader
    body: Any


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id): the first eight bytes of any request.

    Raises:
        InvalidFrameError: fewer than eight bytes.
    """
    if len(frame) < _HEADER_PREFIX.size:
        raise InvalidFrameError(f"request of {len(frame)} bytes has no header")
    key, version, correlation_id = _HEADER_PREFIX.unpack_from(frame, 0)
    return key, version, correlation_id


@cache
def request_class(api_key: int, api_version: int) -> Any:
    """kio's request type of (api key, version)."""
    return load_request_schema(api_key, api_version)


@cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


def decode_request(frame: bytes, supported: dict[int, tuple[int, int]]) -> Request:
    """Decode one request frame (without its size prefix).

    Args:
        supported: api key -> (min version, max version) this listener serves.

    Raises:
        UnsupportedRequestError: api key or version outside ``supported``.
        InvalidFrameError: the header or body does not parse.

    Bytes after a whole body are ignored, as Kafka's brokers ignore them: librdkafka 2.16
    sends its all-topics Metadata v12 with three (``confluent_kafka``'s
    ``AdminClient.list_topics()``), and Apache Kafka serves it.
    """
    api_key, api_version, correlation_id = peek_header(frame)
    versions = supported.get(api_key)
    if versions is None or not versions[0] <= api_version <= versions[1]:
        raise UnsupportedRequestError(api_key, api_version, correlation_id)
    cls = request_class(api_key, api_version)
    try:
        header, used = _reader(cls.__header_schema__)(frame, 0)
        body, _ = _reader(cls)(frame, used)
    except Exception as e:  # kio raises its own and the native reader's errors
        raise InvalidFrameError(
            f"API key {api_key} v{api_version} request does not parse: {e!r}"
        ) from None
    return Request(
        RequestHeader(api_key, api_version, correlation_id, header.client_id),
        body,
    )


def encode_response(correlation_id: int, body: Any) -> Pieces:
    """One response frame: size, the header kio's type asks for, then ``body``.

    As pieces (``segments.batches.Pieces``): the records of a Fetch answer, which may be
    many MiB, stay the views of cached chunks they were read as; only the fields around
    them are encoded into buffers.
    """
    out = Pieces()
    out += bytes(_SIZE.size)
    header_cls: Any = type(body).__header_schema__
    _writer(header_cls)(out, header_cls(correlation_id=correlation_id))
    body_cls: Any = type(body)
    _writer(body_cls)(out, body)
    first = out.parts[0]
    assert isinstance(first, bytearray)  # the size and header: short, so copied together
    _SIZE.pack_into(first, 0, len(out) - _SIZE.size)
    return out


# -- building kio messages across versions ----------------------------------------------


@cache
def _fields(cls: type) -> dict[str, str]:
    """Field name -> kio's ``kafka_type`` (or "" for nested entities) of a kio type."""
    return {f.name: str(f.metadata.get("kafka_type", "")) for f in dataclasses.fields(cls)}


def _convert(kafka_type: str, value: Any) -> Any:
    if kafka_type == "error_code" and not isinstance(value, ErrorCode):
        return ErrorCode(int(value))
    if kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64" and isinstance(value, int):
        if value < 0:
            return None
        return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
    return value


def build(cls: type, **values: Any) -> Any:
    """An instance of kio type ``cls`` from the ``values`` this version has.

    Values for fields the version lacks are dropped (one handler serves every
    version); error codes, durations and timestamps may be given as plain ints
    (milliseconds; a negative timestamp is null).
    """
    fields = _fields(cls)
    return cls(**{k: _convert(fields[k], v) for k, v in values.items() if k in fields})


def nested(cls: type, name: str) -> Any:
    """The kio type ``name`` defined beside ``cls`` (its version's nested types), or None
    when that version has no such type."""
    return getattr(sys.modules[cls.__module__], name, None)


def millis(value: Any) -> int:
    """A kio duration or timestamp (or a plain int) as integer milliseconds; None is -1."""
    if value is None:
        return -1
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return round(value.timestamp() * 1000)
    return int(value)
