"""Embedded formats of produce requests: content types and key/value decoding.

v2 picks the format from the Content-Type
(``application/vnd.kafka[.binary|.json|.avro|.jsonschema|.protobuf][.v1|.v2]+json``);
following REST-API.md section 1.1 we are lenient like Karapace: ``application/json``,
``application/octet-stream``, ``application/vnd.kafka.v2+json`` and a missing
Content-Type all mean *binary*. v3 names the format per key/value (``BINARY``,
``JSON``, ``STRING``, or a schema type). The schema formats (avro, jsonschema,
protobuf) are encoded with the registry's schemas by ``service.registry.rest``.

JSON keys and values are stored as the exact text the client sent for them (their
span in the request, found by msgspec's ``Raw``), never parsed and re-serialized: a
parse into Python floats turned ``123456789012345678901234567890`` into
``1.2345678901234568e+29``, and a log must store what it was given. Consumers of
format json embed the stored text as it is (``orjson.Fragment``).
"""

from __future__ import annotations

import binascii
import re
from typing import Any, Final

import msgspec
import orjson
from starlette.requests import Request

from segments.errors import (
    MalformedRequestError,
    NotAcceptableError,
    RequestTooLargeError,
    UnprocessableRequestError,
    UnsupportedMediaTypeError,
)

BINARY: Final = "binary"
JSON: Final = "json"
SCHEMA_FORMATS: Final = frozenset({"avro", "jsonschema", "protobuf"})

V2_CONTENT_TYPE: Final = "application/vnd.kafka.v2+json"

_V2_TYPE = re.compile(
    r"application/vnd\.kafka(?:\.(binary|json|avro|jsonschema|protobuf))?(?:\.v[12])?\+json"
)
_BINARY_ALIASES = frozenset({"application/json", "application/octet-stream"})
_V2_ACCEPT = re.compile(
    r"application/vnd\.kafka(?:\.(?:binary|json|avro|jsonschema|protobuf))?(?:\.v[12])?\+json"
    r"|application/json|application/\*|\*/json|\*/\*"
)


def _media_type(header: str) -> str:
    """The media type of a header value, lower-cased, without parameters."""
    return header.split(";", 1)[0].strip().lower()


def v2_format(content_type: str | None) -> str:
    """The embedded format a v2 produce Content-Type selects: binary, json, or one of
    ``SCHEMA_FORMATS``.

    Raises:
        UnsupportedMediaTypeError: any other type.
    """
    if not content_type:
        return BINARY
    media = _media_type(content_type)
    if media in _BINARY_ALIASES:
        return BINARY
    match = _V2_TYPE.fullmatch(media)
    if match is None:
        raise UnsupportedMediaTypeError("HTTP 415 Unsupported Media Type")
    return match.group(1) or BINARY


def binary_hint(content_type: str | None) -> str:
    """Why a v2 produce's keys and values had to be base64, and which types exist, when
    binary was assumed (``application/json``, no type...): for the error a client sending
    JSON values that way gets. Empty when the client asked for binary."""
    match = _V2_TYPE.fullmatch(_media_type(content_type or ""))
    if match is not None and match.group(1) == BINARY:
        return ""
    given = f"Content-Type {_media_type(content_type)}" if content_type else "No Content-Type"
    return (
        f"{given} means binary: keys and values are base64 strings. For JSON keys and values "
        "send application/vnd.kafka.json.v2+json; the v2 produce types are "
        "application/vnd.kafka.{binary,json,avro,jsonschema,protobuf}.v2+json."
    )


def check_v2_accept(accept: str | None) -> None:
    """Refuse an Accept header that allows no JSON answer (Karapace's 406 behaviour).

    Raises:
        NotAcceptableError: no listed media range admits a v2 JSON response.
    """
    if not accept:
        return
    for part in accept.split(","):
        media = _media_type(part)
        if not media or _V2_ACCEPT.fullmatch(media):
            return
    raise NotAcceptableError("HTTP 406 Not Acceptable")


def check_v3_content_type(content_type: str | None) -> None:
    """v3 produce takes ``application/json`` only.

    Raises:
        UnsupportedMediaTypeError: any other (or no) Content-Type.
        MalformedRequestError: a charset other than UTF-8.
    """
    if not content_type or _media_type(content_type) != "application/json":
        raise UnsupportedMediaTypeError("HTTP 415 Unsupported Media Type")
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            raise MalformedRequestError(f"Bad Request: unsupported charset {value.strip()}")


def decode_base64(data: object, what: str) -> bytes | None:
    """Base64 text (standard alphabet, padded) to bytes; None stays None.

    Raises:
        MalformedRequestError: not a string, or not valid base64.
    """
    if data is None:
        return None
    if not isinstance(data, str):
        raise MalformedRequestError(f"Bad Request: {what} must be a base64 string or null.")
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        shown = data if len(data) <= 40 else data[:40] + "..."
        raise MalformedRequestError(
            f"Bad Request: {what}={shown} is not a base64 string."
        ) from None


# -- exact JSON text ------------------------------------------------------------------

_NULL: Final = msgspec.Raw(b"null")


class _V2RecordSpans(msgspec.Struct):
    key: msgspec.Raw = _NULL
    value: msgspec.Raw = _NULL


class _V2BodySpans(msgspec.Struct):
    records: list[_V2RecordSpans] = msgspec.field(default_factory=list)


class _DataSpan(msgspec.Struct):
    data: msgspec.Raw = _NULL


class _V3RecordSpans(msgspec.Struct):
    key: _DataSpan | None = None
    value: _DataSpan | None = None


# Other members are skipped (checked already by the orjson parse of the same text;
# both keep the last of duplicate members, so both see the same ones).
_V2_SPANS = msgspec.json.Decoder(_V2BodySpans)
_V3_SPANS = msgspec.json.Decoder(_V3RecordSpans)


def _text(raw: msgspec.Raw) -> bytes | None:
    """The JSON text of a span; JSON null is a null key/value."""
    data = bytes(raw)
    return None if data == b"null" else data


def _spans(decoder: msgspec.json.Decoder[Any], text: bytes) -> Any:
    try:
        return decoder.decode(text)
    except msgspec.DecodeError:  # orjson took it; msgspec's stricter types did not
        raise MalformedRequestError("Bad Request: malformed JSON.") from None


def v2_json_spans(body: bytes) -> list[tuple[bytes | None, bytes | None]]:
    """The exact text of each record's key and value in a v2 json-format body.

    The body must already have passed the structural checks (an object whose
    ``records`` is an array of objects).
    """
    doc: _V2BodySpans = _spans(_V2_SPANS, body)
    return [(_text(r.key), _text(r.value)) for r in doc.records]


def v3_json_span(record: bytes, what: str) -> bytes | None:
    """The exact text of ``<what>.data`` (``key`` or ``value``) of one v3 record object."""
    doc: _V3RecordSpans = _spans(_V3_SPANS, record)
    part = doc.key if what == "key" else doc.value
    return None if part is None else _text(part.data)


def json_object(body: bytes) -> dict[str, Any]:
    """A v2 request body, which must be one JSON object.

    Raises:
        MalformedRequestError: malformed JSON, or JSON that is not an object (400).
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise MalformedRequestError("Bad Request: malformed JSON.") from None
    if not isinstance(doc, dict):
        raise MalformedRequestError("Bad Request: the body must be a JSON object.")
    return doc


def json_fragment(data: bytes | None, what: str) -> orjson.Fragment | None:
    """A stored JSON key/value to embed in a response as it is (no float round trip).

    Raises:
        UnprocessableRequestError: the bytes are not JSON (422, as Karapace answers).
    """
    if data is None:
        return None
    try:
        orjson.loads(data)  # checks only: the text itself is what is sent
    except orjson.JSONDecodeError:
        raise UnprocessableRequestError(f"{what} deserialization error for format json") from None
    return orjson.Fragment(data)


# -- limits --------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body, refusing more than ``limit`` bytes as early as possible.

    Content-Length is checked before reading; a chunked (or lying) body is counted
    while it arrives, so an oversized upload is cut off instead of buffered.

    Raises:
        RequestTooLargeError: the body is (or announces to be) over ``limit``.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(
            f"Request body of {declared} bytes exceeds the limit of {limit} bytes."
        )
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
        parts.append(chunk)
    return b"".join(parts)
