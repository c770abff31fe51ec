"""Options of the ``lakelog`` Spark data source, parsed and checked before anything is read.

The names and value forms follow Spark's Kafka source (``subscribe``,
``subscribePattern``, ``startingOffsets``, ``endingOffsets``, ``startingTimestamp``,
``endingTimestamp``, ``startingOffsetsByTimestampStrategy``, ``failOnDataLoss``), plus
where to find the log: ``coordinator`` (URL of a coordinator process) or ``db`` (a
coordinator database URL, opened read-only, for offline use), and ``store`` with
``store.endpoint`` / ``store.region``. ``trace`` names a file that planning and every
task append one JSON line to (objects opened, row groups read): instrumentation.

Option names are case-insensitive, as Spark passes them (a case-insensitive map).
Pure: no I/O, no pyspark.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

__all__ = ["EARLIEST", "LATEST", "OffsetSpec", "ReadOptions", "parse_options"]

#: Spark's Kafka source markers in the per-partition JSON form.
EARLIEST = -2
LATEST = -1

#: ``"earliest"``, ``"latest"`` or ``{topic: {partition: offset}}`` (offset -2/-1 allowed).
OffsetSpec = str | dict[str, dict[int, int]]

_KNOWN = {
    "subscribe",
    "subscribepattern",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "endingtimestamp",
    "startingoffsetsbytimestampstrategy",
    "failondataloss",
    "coordinator",
    "db",
    "store",
    "store.endpoint",
    "store.region",
    "trace",
    "maxbytespertask",
}


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """One read's options, checked.

    ``topics`` (subscribe) or ``pattern`` (subscribePattern): exactly one is set.
    ``starting``/``ending``: ``"earliest"``, ``"latest"`` or per-partition offsets.
    ``starting_timestamp``/``ending_timestamp`` (ms) take precedence over offsets, as
    in Spark. ``max_bytes_per_task``: merge index entries up to about this size.
    """

    topics: tuple[str, ...] | None
    pattern: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: int | None
    ending_timestamp: int | None
    timestamp_strategy: str
    fail_on_data_loss: bool
    coordinator: str | None
    db: str | None
    store: str
    store_endpoint: str | None
    store_region: str | None
    trace: str | None
    max_bytes_per_task: int


def _offsets(name: str, raw: str, *, starting: bool) -> OffsetSpec:
    value = raw.strip()
    if value.lower() in ("earliest", "latest"):
        word = value.lower()
        if starting and word == "latest":
            raise ValueError("startingOffsets='latest' is not allowed for a batch read (as Spark)")
        if not starting and word == "earliest":
            raise ValueError("endingOffsets='earliest' is not allowed for a batch read (as Spark)")
        return word
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValueError(
            f"{name} must be 'earliest', 'latest' or JSON like "
            f'{{"topic":{{"0":23,"1":-2}}}}; cannot parse {raw!r}: {exc}'
        ) from exc
    if not isinstance(parsed, dict) or not parsed:
        raise ValueError(f"{name}: expected a JSON object of topics, got {raw!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in parsed.items():
        if not isinstance(parts, dict) or not parts:
            raise ValueError(f"{name}: topic {topic!r} needs an object of partition offsets")
        offsets: dict[int, int] = {}
        for p, off in parts.items():
            if not re.fullmatch(r"\d+", p):
                raise ValueError(f"{name}: partition {p!r} of topic {topic!r} is not a number")
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                raise ValueError(
                    f"{name}: offset {off!r} of {topic}-{p} must be an integer >= 0, "
                    "-2 (earliest) or -1 (latest)"
                )
            if starting and off == LATEST:
                raise ValueError(f"{name}: -1 (latest) is not allowed as a starting offset")
            if not starting and off == EARLIEST:
                raise ValueError(f"{name}: -2 (earliest) is not allowed as an ending offset")
            offsets[int(p)] = off
        out[topic] = offsets
    return out


def _timestamp(name: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        ts = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name} must be epoch milliseconds, not {raw!r}") from None
    if ts < 0:
        raise ValueError(f"{name} must be >= 0, not {ts}")
    return ts


def _bool(name: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise ValueError(f"{name} must be 'true' or 'false', not {raw!r}")


def parse_options(options: Mapping[str, str]) -> ReadOptions:
    """Check a read's options (names case-insensitive); every error names the option.

    Raises:
        ValueError: an unknown option, both or neither of subscribe/subscribePattern, a bad
            regular expression, malformed offsets JSON, a non-numeric timestamp, neither or
            both of coordinator/db, no store.
    """
    opts = {k.lower(): v for k, v in options.items()}
    unknown = sorted(k for k in opts if k not in _KNOWN and k != "path")
    if unknown:
        raise ValueError(f"unknown lakelog option(s): {', '.join(unknown)}")
    subscribe, pattern = opts.get("subscribe"), opts.get("subscribepattern")
    if (subscribe is None) == (pattern is None):
        raise ValueError("set exactly one of the options 'subscribe' and 'subscribePattern'")
    topics: tuple[str, ...] | None = None
    if subscribe is not None:
        topics = tuple(dict.fromkeys(t.strip() for t in subscribe.split(",") if t.strip()))
        if not topics:
            raise ValueError(f"subscribe names no topic: {subscribe!r}")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(
                f"subscribePattern {pattern!r} is not a regular expression: {exc}"
            ) from None
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise ValueError(
            f"startingOffsetsByTimestampStrategy must be 'error' or 'latest', not {strategy!r}"
        )
    coordinator, db = opts.get("coordinator"), opts.get("db")
    if (coordinator is None) == (db is None):
        raise ValueError(
            "set exactly one of 'coordinator' (URL of a coordinator process) and "
            "'db' (a coordinator database URL, for offline reads)"
        )
    store = opts.get("store")
    if not store:
        raise ValueError("option 'store' (an object store URL: s3://bucket/prefix) is required")
    try:
        max_bytes = int(opts.get("maxbytespertask", str(64 << 20)))
    except ValueError:
        raise ValueError("maxBytesPerTask must be an integer") from None
    if max_bytes < 1:
        raise ValueError("maxBytesPerTask must be >= 1")
    return ReadOptions(
        topics=topics,
        pattern=pattern,
        starting=_offsets(
            "startingOffsets", opts.get("startingoffsets", "earliest"), starting=True
        ),
        ending=_offsets("endingOffsets", opts.get("endingoffsets", "latest"), starting=False),
        starting_timestamp=_timestamp("startingTimestamp", opts.get("startingtimestamp")),
        ending_timestamp=_timestamp("endingTimestamp", opts.get("endingtimestamp")),
        timestamp_strategy=strategy,
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss"), True),
        coordinator=coordinator,
        db=db,
        store=store,
        store_endpoint=opts.get("store.endpoint"),
        store_region=opts.get("store.region"),
        trace=opts.get("trace"),
        max_bytes_per_task=max_bytes,
    )
