"""Confluent's wire format for schema-framed keys and values. Pure functions over bytes.

Every key or value written with a registry schema (by Confluent's serializers,
Karapace, or lakelog's REST produce) starts with a header::

    offset  width  field
    0       1      magic byte, always 0
    1       4      schema id, big-endian signed int32 (the registry's global id)
    5       ...    Protobuf only: the message-index array (below)
    ...     rest   the body: Avro binary, UTF-8 JSON, or a Protobuf message

The Protobuf message-index array says which message of the schema's file the
body is: a zigzag varint count, then that many zigzag varint indexes (the
top-level message, then nested ones). The common case, the first top-level
message ``[0]``, is written as the single byte ``0x00`` (count 0).

Nothing here checks that the schema exists; ``SchemaFramingError`` means the bytes
are not in this format at all.
"""

from __future__ import annotations

import struct

MAGIC = 0
HEADER = struct.Struct(">bI")
HEADER_SIZE = HEADER.size  # 5


class SchemaFramingError(ValueError):
    """Bytes that do not start with the magic byte and a schema id, or a bad index array."""


def frame(schema_id: int, body: bytes) -> bytes:
    """``body`` with the 5-byte header for ``schema_id``."""
    return HEADER.pack(MAGIC, schema_id) + body


def unframe(data: bytes) -> tuple[int, memoryview]:
    """(schema id, the rest) of framed bytes.

    Raises:
        SchemaFramingError: shorter than the header, or a magic byte other than 0.
    """
    if len(data) < HEADER_SIZE:
        raise SchemaFramingError(
            f"{len(data)} bytes are too short for the schema registry's 5-byte header"
        )
    magic, schema_id = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SchemaFramingError(f"unknown magic byte {magic}: not schema registry framing")
    return schema_id, memoryview(data)[HEADER_SIZE:]


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_message_indexes(indexes: list[int]) -> bytes:
    """The message-index array; ``[0]`` is the single byte 0."""
    if indexes == [0]:
        return b"\x00"
    return _varint(_zigzag(len(indexes))) + b"".join(_varint(_zigzag(i)) for i in indexes)


def decode_message_indexes(data: memoryview | bytes) -> tuple[list[int], int]:
    """(indexes, bytes consumed) of a message-index array at the start of ``data``.

    Raises:
        SchemaFramingError: truncated, or an absurd count.
    """
    pos = 0

    def read() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= len(data) or shift > 63:
                raise SchemaFramingError("truncated Protobuf message-index array")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return _unzigzag(result)
            shift += 7

    count = read()
    if count == 0:
        return [0], pos
    if count < 0 or count > len(data):
        raise SchemaFramingError(f"bad Protobuf message-index count {count}")
    return [read() for _ in range(count)], pos
