"""Options of the ``lakelog`` Spark data source, parsed and checked before anything runs.

The names and value forms follow Spark's Kafka source and sink (``subscribe``,
``subscribePattern``, ``startingOffsets``, ``endingOffsets``, ``startingTimestamp``,
``endingTimestamp``, ``startingOffsetsByTimestampStrategy``, ``failOnDataLoss``,
``includeHeaders``, ``maxOffsetsPerTrigger``; ``topic`` for writes), plus where to find
the log: ``coordinator`` (URL of a coordinator process, which also tells where the
objects are) or ``db`` (a coordinator database URL, for offline use), and ``store``
with ``store.endpoint`` / ``store.region`` (required with ``db``; with ``coordinator``
an override of what the coordinator says). ``user`` and ``password`` (a user's password,
or an API key id and secret) are the job's credential with ``coordinator``: the job
reaches the coordinator as that user (HTTP Basic; never with the agents' shared secret),
and the coordinator decides by its ACLs what the job may read and write
(``spark.access``, ``coordinator.security.access``). They are not sent to an ``http://``
coordinator on another host unless ``coordinator.allowPlaintext`` is ``true``.
``trace`` names a file that planning and every task append one JSON line to (objects
opened, row groups read): instrumentation. lakelog's own: ``asOfTimestamp`` (epoch ms) or
``asOfSnapshot`` (a snapshot id) read the topic's table as it was then, records since
dropped by retention or compaction included (``spark.history``); ``latestByKey=true``
keeps the latest record of each key, tombstones applied (a compacted topic's view).

Option names are case-insensitive, as Spark passes them (a case-insensitive map).
Pure: no I/O, no pyspark.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from coordinator.security.model import plaintext_remote

__all__ = [
    "EARLIEST",
    "LATEST",
    "Connection",
    "OffsetSpec",
    "ReadOptions",
    "WriteOptions",
    "parse_options",
    "parse_write_options",
]

#: Spark's Kafka source markers in the per-partition JSON form.
EARLIEST = -2
LATEST = -1

#: ``"earliest"``, ``"latest"`` or ``{topic: {partition: offset}}`` (offset -2/-1 allowed).
OffsetSpec = str | dict[str, dict[int, int]]

_CONNECTION = {
    "coordinator",
    "db",
    "store",
    "store.endpoint",
    "store.region",
    "coordinator.cafile",
    "coordinator.allowplaintext",
    "user",
    "password",
}
_READ = {
    "subscribe",
    "subscribepattern",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "endingtimestamp",
    "startingoffsetsbytimestampstrategy",
    "failondataloss",
    "includeheaders",
    "trace",
    "maxbytespertask",
    "asoftimestamp",
    "asofsnapshot",
    "latestbykey",
    "kafka.isolation.level",
}
# Streams have no end; batch reads take no trigger limit (as Spark's Kafka source).
_BATCH_ONLY = {"endingoffsets", "endingtimestamp", "asoftimestamp", "asofsnapshot", "latestbykey"}
_STREAM_ONLY = {"maxoffsetspertrigger"}
_WRITE = {"topic", "compression", "maxbytesperobject", "sinkid"}


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the log is: exactly one of ``coordinator``/``db``; ``store`` and its S3 settings.

    ``store`` None: ask the coordinator (``store_location``); ``store_endpoint`` and
    ``store_region`` then override what it says.
    """

    coordinator: str | None
    db: str | None
    store: str | None
    store_endpoint: str | None
    store_region: str | None
    #: PEM CA file to verify https:// coordinators with (default: the system's CAs).
    coordinator_cafile: str | None = None
    #: The job's credential (a user, or an API key id), checked against the ACLs.
    user: str | None = None
    #: The user's password or the API key's secret; never printed.
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """One read's options, checked.

    ``topics`` (subscribe) or ``pattern`` (subscribePattern): exactly one is set.
    ``starting``/``ending``: ``"earliest"``, ``"latest"`` or per-partition offsets.
    ``starting_timestamp``/``ending_timestamp`` (ms) take precedence over offsets, as
    in Spark. ``max_bytes_per_task``: merge index entries up to about this size.
    ``max_offsets_per_trigger``: a stream's records per micro-batch (None: all).
    """

    topics: tuple[str, ...] | None
    pattern: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: int | None
    ending_timestamp: int | None
    timestamp_strategy: str
    fail_on_data_loss: bool
    include_headers: bool
    connection: Connection
    trace: str | None
    max_bytes_per_task: int
    max_offsets_per_trigger: int | None = None
    #: Read the topic's table as of this time (epoch ms) or snapshot id (``spark.history``).
    as_of_timestamp: int | None = None
    as_of_snapshot: int | None = None
    #: The latest record of each key (Kafka's compaction, tombstones applied).
    latest_by_key: bool = False
    #: ``kafka.isolation.level`` (default read_committed, unlike Spark's Kafka source:
    #: a job reads what transactions committed, never an aborted or undecided record).
    read_committed: bool = True

    @property
    def from_table(self) -> bool:
        """Whether the read goes through the topic's table snapshots."""
        return self.as_of_timestamp is not None or self.as_of_snapshot is not None


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """One write's options: ``topic`` (overrides the ``topic`` column), batch compression,
    and the size at which a task starts another segment object."""

    topic: str | None
    compression: str
    max_bytes_per_object: int
    connection: Connection
    #: A stream's stable identity (``sinkId``, else its ``checkpointLocation``): each
    #: micro-batch is then committed exactly once across restarts (``spark.write``).
    sink_id: str | None = None


def _offsets(name: str, raw: str, *, starting: bool, streaming: bool) -> OffsetSpec:
    value = raw.strip()
    if value.lower() in ("earliest", "latest"):
        word = value.lower()
        if starting and word == "latest" and not streaming:
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
            if starting and off == LATEST and not streaming:
                raise ValueError(f"{name}: -1 (latest) is not allowed as a starting offset")
            if not starting and off == EARLIEST:
                raise ValueError(f"{name}: -2 (earliest) is not allowed as an ending offset")
            offsets[int(p)] = off
        out[topic] = offsets
    return out


def _integer(
    name: str, raw: str | None, default: int | None, what: str, minimum: int | None = None
) -> int | None:
    """Option ``name``'s integer (``default`` when it is not set), at least ``minimum``."""
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name} must be {what}, not {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value}")
    return value


def _timestamp(name: str, raw: str | None) -> int | None:
    return _integer(name, raw, None, "epoch milliseconds", minimum=0)


def _snapshot_id(raw: str | None) -> int | None:
    return _integer("asOfSnapshot", raw, None, "a snapshot id (an integer)")


def _bool(name: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise ValueError(f"{name} must be 'true' or 'false', not {raw!r}")


def _isolation(raw: str | None) -> bool:
    """``kafka.isolation.level``: True for read_committed (the default)."""
    level = "read_committed" if raw is None else raw.strip().lower()
    if level not in ("read_committed", "read_uncommitted"):
        raise ValueError(
            f"kafka.isolation.level must be 'read_committed' or 'read_uncommitted', not {raw!r}"
        )
    return level == "read_committed"


def _positive(name: str, raw: str | None, default: int | None) -> int | None:
    return _integer(name, raw, default, "an integer", minimum=1)


def _lowered(options: Mapping[str, str], known: set[str]) -> dict[str, str]:
    opts = {k.lower(): v for k, v in options.items()}
    if "coordinator.secret" in opts:
        raise ValueError(
            "option 'coordinator.secret' is gone: a Spark job never holds the agents' shared "
            "secret; it reaches the coordinator as the user of options 'user' and 'password'"
        )
    unknown = sorted(k for k in opts if k not in known and k != "path")
    if unknown:
        raise ValueError(f"unknown lakelog option(s): {', '.join(unknown)}")
    return opts


def _connection(opts: Mapping[str, str]) -> Connection:
    coordinator, db = opts.get("coordinator"), opts.get("db")
    if (coordinator is None) == (db is None):
        raise ValueError(
            "set exactly one of 'coordinator' (URL of a coordinator process) and "
            "'db' (a coordinator database URL, for offline use)"
        )
    store = opts.get("store") or None
    if db is not None and store is None:
        raise ValueError(
            "option 'store' (an object store URL: s3://bucket/prefix, file:///path) is "
            "required with 'db'; with 'coordinator' the coordinator tells it"
        )
    user, password = opts.get("user") or None, opts.get("password") or None
    if (user is None) != (password is None):
        raise ValueError("set both options 'user' and 'password' (or an API key id and secret)")
    if db is not None and user is not None:
        raise ValueError(
            "options 'user' and 'password' go with 'coordinator', which checks them against "
            "its ACLs; 'db' reads the database directly, where no ACL applies"
        )
    plaintext = _bool("coordinator.allowPlaintext", opts.get("coordinator.allowplaintext"), False)
    clear = [u for u in (coordinator or "").split(",") if u.strip() and plaintext_remote(u)]
    if user is not None and clear and not plaintext:
        raise ValueError(
            f"coordinator {clear[0].strip()} is http:// to another host: the job's password "
            "would cross the network in clear; use https:// (coordinator.cafile), or set "
            "coordinator.allowPlaintext=true on a private network"
        )
    return Connection(
        coordinator=coordinator,
        db=db,
        store=store,
        store_endpoint=opts.get("store.endpoint") or None,
        store_region=opts.get("store.region") or None,
        coordinator_cafile=opts.get("coordinator.cafile") or None,
        user=user,
        password=password,
    )


def parse_options(options: Mapping[str, str], *, streaming: bool = False) -> ReadOptions:
    """Check a read's options (names case-insensitive); every error names the option.

    Streams default to ``startingOffsets=latest`` and take ``maxOffsetsPerTrigger``;
    batch reads default to ``earliest`` and take ``endingOffsets``/``endingTimestamp``,
    as Spark's Kafka source.

    Raises:
        ValueError: an unknown option (or one of the other mode), both or neither of
            subscribe/subscribePattern, a bad regular expression, malformed offsets JSON,
            a non-numeric timestamp or limit, neither or both of coordinator/db, db
            without store.
    """
    known = _CONNECTION | _READ | (_STREAM_ONLY if streaming else set())
    if streaming:
        known -= _BATCH_ONLY
    try:
        opts = _lowered(options, known)
    except ValueError as exc:
        other = _BATCH_ONLY if streaming else _STREAM_ONLY
        wrong = sorted(k.lower() for k in options if k.lower() in other)
        if wrong:
            mode = "streaming" if streaming else "batch"
            raise ValueError(f"option(s) {', '.join(wrong)} do not apply to a {mode} read") from exc
        raise
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
    max_bytes = _positive("maxBytesPerTask", opts.get("maxbytespertask"), 64 << 20)
    assert max_bytes is not None
    default_start = "latest" if streaming else "earliest"
    read = ReadOptions(
        topics=topics,
        pattern=pattern,
        starting=_offsets(
            "startingOffsets",
            opts.get("startingoffsets", default_start),
            starting=True,
            streaming=streaming,
        ),
        ending=_offsets(
            "endingOffsets", opts.get("endingoffsets", "latest"), starting=False, streaming=False
        ),
        starting_timestamp=_timestamp("startingTimestamp", opts.get("startingtimestamp")),
        ending_timestamp=_timestamp("endingTimestamp", opts.get("endingtimestamp")),
        timestamp_strategy=strategy,
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss"), True),
        include_headers=_bool("includeHeaders", opts.get("includeheaders"), False),
        connection=_connection(opts),
        trace=opts.get("trace"),
        max_bytes_per_task=max_bytes,
        max_offsets_per_trigger=_positive(
            "maxOffsetsPerTrigger", opts.get("maxoffsetspertrigger"), None
        ),
        as_of_timestamp=_timestamp("asOfTimestamp", opts.get("asoftimestamp")),
        as_of_snapshot=_snapshot_id(opts.get("asofsnapshot")),
        latest_by_key=_bool("latestByKey", opts.get("latestbykey"), False),
        read_committed=_isolation(opts.get("kafka.isolation.level")),
    )
    if read.as_of_timestamp is not None and read.as_of_snapshot is not None:
        raise ValueError("set at most one of asOfTimestamp and asOfSnapshot")
    if read.from_table and (
        read.starting_timestamp is not None or read.ending_timestamp is not None
    ):
        raise ValueError(
            "asOfTimestamp/asOfSnapshot read a table snapshot: give offsets "
            "(startingOffsets, endingOffsets), not startingTimestamp/endingTimestamp"
        )
    return read


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check a write's options (names case-insensitive).

    Raises:
        ValueError: an unknown option, an empty topic, an unknown compression, a bad
            size, neither or both of coordinator/db, db without store.
    """
    opts = _lowered(options, _CONNECTION | _WRITE | {"checkpointlocation"})
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise ValueError("option 'topic' is empty")
    from segments.segment import COMPRESSIONS  # the Kafka codec: loaded by writes only

    compression = opts.get("compression", "zstd").strip().lower()
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}")
    size = _positive("maxBytesPerObject", opts.get("maxbytesperobject"), 64 << 20)
    assert size is not None
    return WriteOptions(
        topic=None if topic is None else topic.strip(),
        compression=compression,
        max_bytes_per_object=size,
        connection=_connection(opts),
        sink_id=(opts.get("sinkid") or opts.get("checkpointlocation") or "").strip() or None,
    )
