"""The Kafka door's sans-io layer: frames, request decoding, response encoding."""

from __future__ import annotations

import datetime
import io
import struct

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.request_header.v2.header import RequestHeader
from kio.serial import entity_reader, entity_writer

from segments.batches import Pieces
from service.kafka.framing import (
    FrameDecoder,
    FrameTooLargeError,
    InvalidFrameError,
    UnsupportedRequestError,
    decode_request,
    encode_frame,
    encode_response,
)
from service.kafka.handlers import api_versions_response
from service.kafka.server import SUPPORTED

frames = st.lists(st.binary(max_size=300), max_size=8)


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


@given(frames, st.lists(st.integers(min_value=0), max_size=10))
@example([b"", b"x"], [0, 1, 4])
def test_frames_round_trip_however_the_stream_is_cut(
    payloads: list[bytes], cuts: list[int]
) -> None:
    """decode(encode(x)) == x, every byte consumed, whatever the read boundaries."""
    stream = b"".join(encode_frame(p) for p in payloads)
    decoder = FrameDecoder(1000)
    got: list[bytes] = []
    for piece in _cut(stream, cuts):
        got.extend(decoder.feed(piece))
    assert got == payloads
    assert decoder.buffered == 0


@given(frames, st.integers(min_value=0))
def test_a_truncated_stream_yields_only_complete_frames(payloads: list[bytes], cut: int) -> None:
    """A stream cut anywhere gives the frames wholly before the cut and buffers the rest."""
    stream = b"".join(encode_frame(p) for p in payloads)
    cut %= len(stream) + 1
    decoder = FrameDecoder(1000)
    got = decoder.feed(stream[:cut])
    ends, pos = [], 0
    for p in payloads:
        pos += 4 + len(p)
        ends.append(pos)
    complete = sum(1 for e in ends if e <= cut)
    assert got == payloads[:complete]
    assert decoder.buffered == cut - (ends[complete - 1] if complete else 0)


def test_oversized_and_negative_frames_are_refused_before_buffering() -> None:
    decoder = FrameDecoder(100)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(struct.pack(">i", 101))
    assert FrameDecoder(100).feed(struct.pack(">i", 100) + b"x" * 100) == [b"x" * 100]
    with pytest.raises(InvalidFrameError):
        FrameDecoder(100).feed(struct.pack(">i", -1))


def _request(header_version_cls: type, body: object, key: int, version: int) -> bytes:
    out = io.BytesIO()
    entity_writer(header_version_cls)(
        out,
        header_version_cls(
            request_api_key=key, request_api_version=version, correlation_id=7, client_id="c"
        ),
    )
    entity_writer(type(body))(out, body)
    return out.getvalue()


def test_requests_decode_with_their_flexible_header() -> None:
    body = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name="t"),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    req = decode_request(_request(RequestHeader, body, 3, 12), SUPPORTED)
    assert (req.header.api_key, req.header.api_version, req.header.correlation_id) == (3, 12, 7)
    assert req.header.client_id == "c"
    assert req.body == body


@given(st.integers(min_value=0))
def test_any_truncated_request_is_an_invalid_frame(cut: int) -> None:
    """A request frame cut short never decodes into a wrong request."""
    body = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name="topic"),),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    frame = _request(RequestHeader, body, 3, 12)
    cut %= len(frame)
    with pytest.raises(InvalidFrameError):
        decode_request(frame[:cut], SUPPORTED)


@given(st.binary(min_size=1, max_size=64))
def test_bytes_after_a_whole_request_are_ignored_as_kafka_ignores_them(extra: bytes) -> None:
    """librdkafka 2.16's all-topics Metadata v12 carries three bytes past its body."""
    body = MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    frame = _request(RequestHeader, body, 3, 12)
    assert decode_request(frame + extra, SUPPORTED).body == body


def test_unknown_api_and_version_are_refused_with_the_correlation_id() -> None:
    frame = struct.pack(">hhi", 999, 0, 42) + b"\xff\xff"
    with pytest.raises(UnsupportedRequestError) as err:
        decode_request(frame, SUPPORTED)
    assert (err.value.api_key, err.value.correlation_id) == (999, 42)
    with pytest.raises(UnsupportedRequestError):
        decode_request(struct.pack(">hhi", 18, 99, 1), SUPPORTED)


def test_api_versions_answer_uses_header_v0_and_lists_every_supported_api() -> None:
    resp = api_versions_response(ApiVersionsRequest, 0)
    frame = bytes(encode_response(5, resp))
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    (correlation_id,) = struct.unpack_from(">i", frame, 4)
    assert correlation_id == 5
    body, used = entity_reader(type(resp))(frame, 8)  # no tagged fields in header v0
    assert used == len(frame) - 8
    assert {k.api_key: (k.min_version, k.max_version) for k in body.api_keys} == SUPPORTED


def test_a_fetch_answer_keeps_its_records_as_the_views_it_was_read_as() -> None:
    """A Fetch answer of many MiB is not copied to be encoded: the records' big pieces
    are the frame's own pieces (the very views of the cached chunks), small ones are
    gathered into one buffer with the fields around them; the frame reads back whole."""
    from kio.schema.fetch.v12.response import (
        FetchableTopicResponse,
        FetchResponse,
        PartitionData,
    )

    chunk = bytes(range(256)) * (12 << 10)  # 3 MiB: over SMALL_PIECE and the write slice
    big = memoryview(chunk)[100:]
    records = Pieces()
    records += b"head"
    records += big
    records += b"t" * 10
    records += b"ail"
    assert len(records.parts) == 3 and records.parts[1] is big
    part = PartitionData(
        partition_index=0,
        error_code=ErrorCode.none,
        high_watermark=1,
        last_stable_offset=1,
        log_start_offset=0,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=records,  # type: ignore[arg-type]
    )
    answer = FetchResponse(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(FetchableTopicResponse(topic="t", partitions=(part,)),),
    )
    frame = encode_response(7, answer)
    assert any(p is big for p in frame.parts)
    assert sum(len(p) for p in frame.parts) == len(frame)
    data = bytes(frame)
    (size,) = struct.unpack_from(">i", data)
    assert size == len(data) - 4
    _, used = entity_reader(type(answer).__header_schema__)(data, 4)
    body, _ = entity_reader(type(answer))(data, 4 + used)
    got = body.responses[0].partitions[0].records
    assert bytes(got) == b"head" + chunk[100:] + b"t" * 10 + b"ail"


def test_every_lakelog_error_has_a_kafka_code() -> None:
    """The Kafka door's one table covers the whole error tree (through ancestors), and the
    client-side errors get the codes Kafka clients act on."""
    from segments import errors as e
    from service.kafka.errors import code_for

    for cls in e.ERRORS_BY_NAME.values():
        assert isinstance(code_for(cls("x")), ErrorCode)
    assert code_for(e.CorruptRecordError("x")) == ErrorCode.corrupt_message
    assert code_for(e.TopicNotFoundError("x")) == ErrorCode.unknown_topic_or_partition
    assert code_for(e.RecordTooLargeError("x")) == ErrorCode.message_too_large
    assert code_for(ValueError("bug")) == ErrorCode.unknown_server_error
