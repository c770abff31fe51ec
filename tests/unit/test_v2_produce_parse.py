"""v2 produce, binary format: the msgspec fast path answers exactly as the checked path.

``_parse_body`` tries one typed msgspec decode first and falls back to ``_parse_checked``
(orjson, every check in order, each error with its message) when anything is off. For
any body, both must give the same records or the same error (type and message).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from segments.errors import LakelogError
from service.produce.formats import BINARY
from service.v2.produce import _parse_binary, _parse_body, _parse_checked


def outcome(parse: Any, body: bytes) -> Any:
    try:
        return ("ok", parse(body, BINARY, "application/vnd.kafka.binary.v2+json"))
    except LakelogError as exc:
        return ("error", type(exc).__name__, exc.message)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# base64 text, valid or nearly: padding variants, whitespace, other alphabets, non-ASCII.
_base64ish = st.one_of(
    st.binary(max_size=12).map(b64),
    st.binary(max_size=12).map(lambda b: b64(b).rstrip("=")),
    st.binary(max_size=12).map(lambda b: b64(b) + "="),
    st.binary(max_size=12).map(lambda b: base64.urlsafe_b64encode(b).decode()),
    st.text(alphabet=st.sampled_from("AQg+/=-_ \n.é"), max_size=10),
)
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(2**63 - 2, 2**64 + 2),
    st.floats(allow_nan=False, allow_infinity=False),
    _base64ish,
)
_header = st.one_of(
    st.fixed_dictionaries({"key": st.text(max_size=3), "value": _base64ish | st.none()}),
    st.dictionaries(st.sampled_from(["key", "value", "x"]), _scalar, max_size=2),
    _scalar,
)
_record = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "key": _base64ish | _scalar,
            "value": _base64ish | _scalar,
            "partition": st.none() | st.integers(-2, 5) | _scalar,
            "headers": st.lists(_header, max_size=2) | _scalar,
            "valur": _scalar,
        },
    ),
    _scalar,
)
_body = st.one_of(
    st.fixed_dictionaries(
        {"records": st.lists(_record, max_size=4) | _scalar},
        optional={"key_schema": _scalar, "value_schema_id": _scalar, "other": _scalar},
    ),
    st.lists(_record, max_size=2),
    _scalar,
).map(lambda doc: json.dumps(doc).encode())  # stdlib: integers beyond 64 bits too


@settings(max_examples=400, deadline=None)
@given(_body)
@example(b'{"records":[{"key":"AAAA","key":5}]}')  # duplicate members: the last counts
@example(b'{"records":[{"key":5,"key":"AAAA"}]}')
@example(b'{"records":[{"value":"AA\\u003d\\u003d"}]}')  # JSON escapes inside base64
@example(b'{"records":[{"value":"URR4=="}]}')  # excess padding: only the checked path takes it
@example(b'{"records":[{"value":"eA=="}],"records":null}')
@example(b'{"records":[{"value":"eA==","partition":-1}]}')
@example(b'{"records":[{"value":"eA==","headers":[{"key":"h","value":"%%"}]}]}')
@example(b'{"records":[{"value":"eA==","headers":0}]}')  # a falsy headers: no headers
@example(b'{"records":[{"value":"eA=="}]} x')
@example(b'\xef\xbb\xbf{"records":[{"value":"eA=="}]}')
def test_fast_and_checked_paths_agree(body: bytes) -> None:
    assert outcome(_parse_body, body) == outcome(_parse_checked, body)


@pytest.mark.parametrize(
    "body",
    [
        {"records": [{"key": b64(b"k"), "value": b64(b"v" * 1024), "partition": 2}]},
        {
            "records": [{"value": b64(b"v"), "headers": [{"key": "h", "value": b64(b"x")}]}],
            "key_schema": "ignored in the binary format",
        },
        {"records": [{"key": None, "value": None}, {}]},
    ],
)
def test_the_fast_path_takes_well_formed_bodies(body: dict[str, Any]) -> None:
    """The fast path is taken (not only correct by falling back) for the common shapes."""
    raw = orjson.dumps(body)
    assert _parse_binary(raw) is not None
    assert _parse_binary(raw) == _parse_checked(raw, BINARY)
