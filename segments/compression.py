"""Bounded decompression of Kafka RecordBatches: a pure function over bytes.

A batch's records are compressed as a whole (codec in the attributes' bits 0-2: 1 gzip,
2 snappy in Xerial's framing or raw, 3 LZ4 frames, 4 zstd frames). Sixteen KiB of zstd
can hold 500 MiB: a decoder that inflates whatever it is given lets one small batch
take an agent's memory. Here every codec is decompressed as a stream, a slice at a
time, and stops as soon as the output would pass the caller's ``limit`` (a topic's
``lakelog.max.decompressed.bytes``): the memory held is at most ``limit`` plus one
step's output (1 MiB; 8 MiB for zstd), whatever the input claims.

:func:`plain_batch` turns a checked batch (framing and CRC already verified) into the
same batch uncompressed, so that aiokafka's reader, which inflates without a bound,
only ever sees plain records.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import lz4.frame
import zstandard

__all__ = [
    "DECOMPRESSED_CONFIG",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "OverLimitError",
    "decompress",
    "plain_batch",
]

#: The topic config (and cluster-wide broker config) holding the bound, and its default:
#: a 16 KiB zstd batch of 500 MiB is far over it; 32x Kafka's default max.message.bytes.
DECOMPRESSED_CONFIG = "lakelog.max.decompressed.bytes"
DEFAULT_MAX_DECOMPRESSED_BYTES = 32 * 1024 * 1024

#: Output slice of one decompression step.
SLICE = 1 << 20
_CODEC_MASK = 0x07
_ATTRIBUTES_AT = 21
_LENGTH = struct.Struct(">i")
_ATTRIBUTES = struct.Struct(">h")
_RECORDS_AT = 61  # the batch header's size: records start here
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16
_BLOCK = struct.Struct(">i")
#: Compressed bytes given to zstd per step (see _zstd).
_ZSTD_STEP = 256
#: zlib's wbits for "gzip or zlib, whichever header it has".
_GZIP_OR_ZLIB = 47


class OverLimitError(ValueError):
    """The records decompress to more than the limit (``size`` bytes were seen so far)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"records decompress to more than {limit} bytes")
        self.size = size
        self.limit = limit


def decompress(codec: int, data: bytes | memoryview, limit: int) -> bytearray:
    """The records of a batch compressed with ``codec`` (Kafka's attribute code).

    Raises:
        OverLimitError: more than ``limit`` bytes would come out; decompression stops there.
        ValueError: an unknown codec, or bytes that are not a whole stream of that codec.
    """
    if codec == 1:
        return _gzip(data, limit)
    if codec == 2:
        return _snappy(memoryview(data), limit)
    if codec == 3:
        return _lz4(data, limit)
    if codec == 4:
        return _zstd(data, limit)
    raise ValueError(f"unknown compression codec {codec}")


def plain_batch(batch: bytes | memoryview, limit: int) -> bytes | bytearray | memoryview:
    """``batch`` with its records decompressed and its codec bits cleared (the batch CRC
    no longer matches: check it before); an uncompressed batch is returned as it is.

    Raises:
        OverLimitError: the records take more than ``limit`` bytes, compressed or not.
        ValueError: the compressed records do not decompress.
    """
    view = memoryview(batch)
    (attributes,) = _ATTRIBUTES.unpack_from(view, _ATTRIBUTES_AT)
    codec = attributes & _CODEC_MASK
    if codec == 0:
        if len(view) - _RECORDS_AT > limit:
            raise OverLimitError(len(view) - _RECORDS_AT, limit)
        return batch
    records = decompress(codec, view[_RECORDS_AT:], limit)
    out = bytearray(view[:_RECORDS_AT])
    out += records
    del records
    _LENGTH.pack_into(out, 8, len(out) - 12)
    _ATTRIBUTES.pack_into(out, _ATTRIBUTES_AT, attributes & ~_CODEC_MASK)
    return out


def _grow(out: bytearray, piece: bytes, limit: int) -> None:
    if len(out) + len(piece) > limit:
        raise OverLimitError(len(out) + len(piece), limit)
    out += piece


def _gzip(data: bytes | memoryview, limit: int) -> bytearray:
    out = bytearray()
    rest = bytes(data)
    while rest:  # gzip members back to back, as Java's GZIPInputStream reads them
        d = zlib.decompressobj(_GZIP_OR_ZLIB)
        pending = rest
        while pending:
            try:
                piece = d.decompress(pending, SLICE)
            except zlib.error as e:
                raise ValueError(f"gzip: {e}") from None
            _grow(out, piece, limit)
            pending = d.unconsumed_tail
            if d.eof:
                break
        while not d.eof:  # output still buffered inside zlib
            piece = d.decompress(b"", SLICE)
            if not piece:
                raise ValueError("gzip: truncated stream")
            _grow(out, piece, limit)
        rest = d.unused_data
    return out


def _snappy(view: memoryview, limit: int) -> bytearray:
    """Xerial's framing (what Java producers write: a 16-byte header, then blocks of i32
    length + raw snappy) or one raw snappy block. A raw block states its uncompressed
    length first, and snappy fails on a block that does not match it, so lengths are
    added up before anything is inflated."""
    blocks: list[memoryview] = []
    if len(view) > _XERIAL_HEADER and bytes(view[: len(_XERIAL_MAGIC)]) == _XERIAL_MAGIC:
        pos = _XERIAL_HEADER
        while pos < len(view):
            if len(view) - pos < _BLOCK.size:
                raise ValueError("snappy: truncated block length")
            (size,) = _BLOCK.unpack_from(view, pos)
            pos += _BLOCK.size
            if size < 0 or pos + size > len(view):
                raise ValueError("snappy: block overruns the batch")
            blocks.append(view[pos : pos + size])
            pos += size
    else:
        blocks.append(view)
    total = 0
    for block in blocks:
        try:
            total += cramjam.snappy.decompress_raw_len(block)
        except Exception as e:  # cramjam raises its own DecompressionError
            raise ValueError(f"snappy: {e}") from None
        if total > limit:
            raise OverLimitError(total, limit)
    out = bytearray()
    for block in blocks:
        try:
            out += cramjam.snappy.decompress_raw(block)
        except Exception as e:
            raise ValueError(f"snappy: {e}") from None
    if len(out) != total:
        raise ValueError("snappy: blocks do not hold the lengths they state")
    return out


def _lz4(data: bytes | memoryview, limit: int) -> bytearray:
    out = bytearray()
    rest = bytes(data)
    while rest:  # LZ4 frames back to back
        d = lz4.frame.LZ4FrameDecompressor()
        pending = rest
        try:
            while not d.eof:
                piece = d.decompress(pending, max_length=SLICE)
                pending = b""
                _grow(out, piece, limit)
                if d.needs_input and not d.eof:
                    raise ValueError("lz4: truncated frame")
        except RuntimeError as e:  # lz4.frame's error for bad input
            raise ValueError(f"lz4: {e}") from None
        rest = d.unused_data
    return out


def _zstd(data: bytes | memoryview, limit: int) -> bytearray:
    """Fed a little input at a time: a 4-byte zstd block may stand for 128 KiB (RLE), so
    ``_ZSTD_STEP`` input bytes give at most 8 MiB before the bound is checked again."""
    out = bytearray()
    rest = bytes(data)
    dctx = zstandard.ZstdDecompressor()
    while rest:  # zstd frames back to back
        d = dctx.decompressobj()
        at = 0
        try:
            while at < len(rest) and not d.eof:
                _grow(out, d.decompress(rest[at : at + _ZSTD_STEP]), limit)
                at += _ZSTD_STEP
        except zstandard.ZstdError as e:
            raise ValueError(f"zstd: {e}") from None
        if not d.eof:
            raise ValueError("zstd: truncated frame")
        rest = d.unused_data + rest[at:]
    return out
