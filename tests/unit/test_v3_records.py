"""v3 produce: the stream splitter (concatenated JSON values cut out of a chunked body)
and a stream's failures (in-process app on SQLite and a file store)."""

from __future__ import annotations

import base64
import json
import logging
import re
import time
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import example, given, settings
from hypothesis import strategies as st

from coordinator.client import TopicInfo
from coordinator.log.topic_configs import record_limit
from segments.errors import LakelogError, RequestTooLargeError
from service.app import create_app
from service.settings import Settings
from service.v3 import records
from service.v3.records import Item, ObjectSplitter, SplitError

# Strings that stress the scanner: quotes, escapes, brackets inside strings, non-ASCII.
_text = st.text(alphabet=st.sampled_from('ab{}[]"\\/é€\n '), max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_records = st.lists(st.dictionaries(_text, _json, max_size=4), min_size=1, max_size=5)


def split(body: bytes, cuts: list[int], limit: int = 1 << 20) -> list[Item]:
    splitter = ObjectSplitter(limit)
    out: list[Item] = []
    last = 0
    for cut in sorted({c % (len(body) + 1) for c in cuts}):
        out += splitter.feed(body[last:cut])
        last = cut
    out += splitter.feed(body[last:])
    return out + splitter.finish()


@given(_records, st.lists(st.integers(min_value=0), max_size=20), st.sampled_from([b"", b" \n"]))
@example([{'a"\\': '\\"}'}], [3, 4, 5, 6], b"")  # cuts inside an escape and a string
def test_any_chunking_yields_exactly_the_values(
    records: list[dict[str, object]], cuts: list[int], gap: bytes
) -> None:
    body = gap.join(orjson.dumps(r) for r in records)
    items = split(body, cuts)
    assert [orjson.loads(i) for i in items if isinstance(i, bytes)] == records
    assert all(isinstance(i, bytes) for i in items)


def test_garbage_between_values_is_one_error_per_run() -> None:
    items = split(b'{"a":1} 12 "s" ] {"b":2}', [3, 11, 13])
    kinds = [type(i).__name__ if not isinstance(i, bytes) else i for i in items]
    assert kinds == [b'{"a":1}', "SplitError", "SplitError", b'{"b":2}']  # ' 12 "s"', ' ]'


def test_truncated_value_is_an_error_at_the_end() -> None:
    assert isinstance(split(b'{"a": "open', [4])[-1], SplitError)


def test_value_over_the_limit_ends_the_stream() -> None:
    items = split(b'{"a": "' + b"x" * 100 + b'"} {"b": 1}', [10, 50], limit=64)
    assert isinstance(items[-1], RequestTooLargeError)
    assert not any(isinstance(i, bytes) for i in items)


def test_a_4_mib_value_in_16_kib_chunks_costs_what_it_costs_whole() -> None:
    """Scanning is linear: feeding 4 MiB in 256 chunks takes about the CPU of one feed.

    Before, every chunk re-scanned the partial string from its start (quadratic:
    ~2 s of event-loop CPU here for what costs ~10 ms in one piece). The bound is a
    ratio of CPU times with a wide margin, not a wall-clock budget.
    """
    value = base64.b64encode(bytes(range(256)) * (3 * 4096)).decode()  # 4 MiB of base64
    body = orjson.dumps({"value": {"type": "BINARY", "data": value}})
    chunks = [body[i : i + 16384] for i in range(0, len(body), 16384)]

    def cpu(pieces: list[bytes]) -> float:
        splitter = ObjectSplitter(8 << 20)
        started = time.process_time()
        items: list[Item] = []
        for piece in pieces:
            items += splitter.feed(piece)
        spent = time.process_time() - started
        assert items == [body]
        return spent

    whole = min(cpu([body]) for _ in range(3))
    chunked = min(cpu(chunks) for _ in range(3))
    assert chunked < 20 * whole + 0.05, (chunked, whole)


def test_an_unexpected_exception_fails_only_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug while producing one record of a stream (a RuntimeError, not a lakelog
    error) after the 200 has gone out.

    Before, it escaped the stream and broke the response mid-way. Expected: that
    record's report is a non-retriable 500, the records around it are produced, and
    the traceback is logged.
    """
    real = records.parse_record

    def poisoned(text: Any, *args: Any, **kwargs: Any) -> Any:
        if "poison" in str(text):
            raise RuntimeError("a bug")
        return real(text, *args, **kwargs)

    monkeypatch.setattr(records, "parse_record", poisoned)
    settings = Settings(db=f"sqlite:///{tmp_path}/meta.db", store=f"file://{tmp_path}/data")
    body = b"".join(
        orjson.dumps({"value": {"type": "STRING", "data": d}}) for d in ("a", "poison", "b")
    )
    with TestClient(create_app(settings)) as client:
        cid = client.get("/v3/clusters").json()["data"][0]["cluster_id"]
        topics = f"/v3/clusters/{cid}/topics"
        assert client.post(topics, json={"topic_name": "t"}).status_code == 201
        r = client.post(
            f"{topics}/t/records", content=body, headers={"Content-Type": "application/json"}
        )
    reports = [orjson.loads(line) for line in r.content.splitlines() if line]
    assert r.status_code == 200
    assert [(x["error_code"], x.get("offset")) for x in reports] == [
        (200, 0),
        (500, None),
        (200, 1),
    ]
    assert "a bug" not in reports[1]["message"]
    assert any(rec.exc_info and rec.levelno == logging.ERROR for rec in caplog.records)


# -- the fast path of one record answers as the checked path -----------------------------

_b64ish = st.one_of(
    st.binary(max_size=9).map(lambda b: base64.b64encode(b).decode()),
    st.binary(max_size=9).map(lambda b: base64.b64encode(b).decode() + "="),
    st.text(alphabet=st.sampled_from("AQg+/=-_ \n"), max_size=8),
)
_any = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 9), st.integers(2**63, 2**64), _b64ish, _json
)
_data = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["BINARY", "binary", "JSON", "String", "AVRO", "XML", 1]),
            "data": _any,
            "schema_id": st.integers(1, 3),
        },
    ),
    _any,
)
_record = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "key": _data,
            "value": _data,
            "partition_id": st.integers(-1, 9) | _any,
            "timestamp": st.sampled_from(["2026-01-02T03:04:05Z", "2026-13-01", "1960-01-01"])
            | _any,
            "headers": st.lists(
                st.fixed_dictionaries({"name": st.text(max_size=2), "value": _b64ish | st.none()})
                | _any,
                max_size=2,
            )
            | _any,
            "other": _any,
        },
    ),
    _any,
)


# Common records (the fast path's), and near misses of them.
_common_data = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("BINARY")},
        optional={"data": st.binary(max_size=9).map(lambda b: base64.b64encode(b).decode())},
    ),
    st.fixed_dictionaries({"type": st.just("JSON")}, optional={"data": _json}),
    st.fixed_dictionaries({"type": st.just("STRING")}, optional={"data": _text | st.none()}),
)
_common = st.fixed_dictionaries(
    {},
    optional={
        "key": _common_data | st.none(),
        "value": _common_data | st.none(),
        "partition_id": st.integers(0, 3),
        "timestamp": st.sampled_from(["2026-01-02T03:04:05Z", "2026-13-01"]),
        "headers": st.lists(
            st.fixed_dictionaries({"name": st.text(max_size=2), "value": _b64ish | st.none()}),
            max_size=2,
        ),
    },
)


def _outcome(text: bytes, *, fast: bool) -> Any:
    topic = TopicInfo("t", b"\x01" * 16, 3, {"max.message.bytes": "200"})
    sticky = [2]  # the keyless partition of the group (chosen at random when -1)
    try:
        parsed = records.parse_record(text, topic, record_limit(topic), 1000, sticky, fast=fast)
    except records.NeedsSchema:
        return "needs schema"
    except LakelogError as exc:
        return (type(exc).__name__, exc.message)
    return (parsed.partition, parsed.record, parsed.key_report, parsed.value_report, sticky)


@settings(max_examples=400, deadline=None)
@given((_common | _record).map(lambda doc: json.dumps(doc).encode()))  # stdlib: big integers
@example(b'{"value":{"type":"BINARY","data":"eA==","type":"JSON"}}')  # the tag twice
@example(b'{"value":{"type":"binary","data":"eA=="}}')  # a lower-case type
@example(b'{"value":{"type":"BINARY","data":"eA=="},"value":{"type":"JSON","data":[1]}}')
@example(b'{"value":{"type":"JSON","data" :  12345678901234567890123 }}')  # exact text
@example(b'{"value":{"type":"XML","data":null}}')
@example(b'{"value":{"type":"BINARY","data":"URR4=="}}')  # excess padding: checked path only
@example(b'{"value":{"type":"STRING","data":"\\u00e9"},"partition_id":true}')
@example(b'{"value":{"type":"BINARY","data":"' + b"A" * 400 + b'"},"partition_id":"x"}')
def test_fast_and_checked_record_parses_agree(text: bytes) -> None:
    assert _outcome(text, fast=True) == _outcome(text, fast=False)


def test_the_fast_path_takes_common_records() -> None:
    text = orjson.dumps(
        {
            "key": {"type": "BINARY", "data": base64.b64encode(b"k").decode()},
            "value": {"type": "JSON", "data": {"n": 1}},
            "headers": [{"name": "h", "value": None}],
            "partition_id": 1,
        }
    )
    assert records._parse_fast(text, 1000) is not None
    assert _outcome(text, fast=True) == _outcome(text, fast=False)


_scanner_bytes = st.lists(
    st.sampled_from(
        [b"{", b"}", b"[", b"]", b'"', b"\\", b"a", b" ", b"\n", b'{"a":"b"}', b"\\\\"]
    ),
    max_size=30,
).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(_records.map(lambda rs: b"".join(orjson.dumps(r) for r in rs)), _scanner_bytes),
    st.lists(st.integers(min_value=0), max_size=8),
    st.sampled_from([1 << 20, 12]),
)
@example(b'{"a":"\\\\"}{"b":"\\"}"}', [], 1 << 20)  # a string ending in an escaped backslash
@example(b'a {"a":"b"}', [1], 1 << 20)  # garbage left by one chunk, a value next
@example(b"x{}" + b"[" * 9 + b"]" * 9 + b"{}", [2], 1 << 20)  # garbage, nesting past 8
def test_whole_value_matches_answer_as_the_tokens_alone(
    body: bytes, cuts: list[int], limit: int
) -> None:
    """The splitter cuts whole values with one regex match each (``_WHOLE``) and falls
    back to its tokens; with the regex never matching (tokens alone) every body, cut
    anywhere, gives the same items: values, garbage errors and the too-large end."""

    def kinds(items: list[Item]) -> list[object]:
        return [i if isinstance(i, bytes) else (type(i).__name__, str(i)) for i in items]

    fast = kinds(split(body, cuts, limit))
    with mock.patch.object(records, "_WHOLE", re.compile(rb"(?!)()")):
        slow = kinds(split(body, cuts, limit))
    assert fast == slow
