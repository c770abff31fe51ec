"""Consumed records as the REST doors write them: msgspec's binary writer against the
documented shape (``render_records``), and the group stream's frames."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from segments.types import ConsumedRecord
from service.v2.consumers import binary_records, encode_records, render_records
from service.v3.group_stream import _GroupStream

nullable = st.one_of(st.none(), st.binary(max_size=300))
records = st.builds(
    ConsumedRecord,
    topic=st.text(min_size=1, max_size=20),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
    key=nullable,
    value=nullable,
    timestamp_ms=st.integers(-1, 2**63 - 1),
    headers=st.lists(st.tuples(st.text(max_size=10), nullable), max_size=3).map(tuple),
)


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def documented(r: ConsumedRecord) -> dict[str, object]:
    """The v2 consumer's binary record, as Confluent's REST Proxy documents it."""
    return {
        "topic": r.topic,
        "key": b64(r.key),
        "value": b64(r.value),
        "partition": r.partition,
        "offset": r.offset,
        "timestamp": r.timestamp_ms,
        "headers": [{"key": k, "value": b64(v)} for k, v in r.headers],
    }


@settings(max_examples=200, deadline=None)
@given(st.lists(records, max_size=20))
def test_binary_records_are_written_as_render_records_shapes_them(
    recs: list[ConsumedRecord],
) -> None:
    """Same fields, same order, same base64 (standard alphabet, padded), nulls kept."""
    written = encode_records(recs, "binary")
    assert render_records(recs, "binary") == [documented(r) for r in recs]
    assert orjson.loads(written) == render_records(recs, "binary")
    assert written == orjson.dumps(render_records(recs, "binary"))  # byte for byte
    assert written == orjson.dumps([documented(r) for r in recs])


def test_a_value_of_a_mebibyte_is_written_whole() -> None:
    value = bytes(range(256)) * 4096
    (doc,) = orjson.loads(encode_records([ConsumedRecord("t", 0, 7, None, value, 1)], "binary"))
    assert base64.b64decode(doc["value"]) == value and doc["key"] is None


@given(st.lists(records, min_size=1, max_size=5))
def test_the_streams_frames_carry_each_record_then_its_cursor(
    recs: list[ConsumedRecord],
) -> None:
    """NDJSON: the record's fields then ``cursor``, one line; SSE: the cursor as the event
    id and the record as its data. The binary writer's frames equal the dicts'."""
    cursor = "eyIwOnQiOjF9"
    for sse in (False, True):
        stream = SimpleNamespace(sse=sse)
        for doc, struct in zip(render_records(recs, "binary"), binary_records(recs), strict=True):
            frame = _GroupStream._frame(stream, doc, cursor)  # type: ignore[arg-type]
            assert frame == _GroupStream._frame(stream, struct, cursor)  # type: ignore[arg-type]
            if sse:
                head, data = frame.split(b"\ndata: ", 1)
                assert head == b"id: " + cursor.encode() + b"\nevent: record"
                assert orjson.loads(data) == doc
            else:
                assert frame.endswith(b"\n") and frame.count(b"\n") == 1
                assert orjson.loads(frame) == {**doc, "cursor": cursor}
