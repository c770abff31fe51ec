"""The agent's settings (``lakelog serve`` and ``lakelog agent``), env prefix ``LAKELOG_``.

One of the per-process settings classes of ``coordinator.settings`` (which says where
values come from: flags, ``LAKELOG_*`` variables, the ``--config`` TOML file, the
defaults). A bad value fails at start-up with pydantic's message naming the field.
``settings_table()`` renders every process's settings as the README's table.
"""

from __future__ import annotations

import uuid
from functools import lru_cache
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticUndefined

from coordinator.security.settings import AgentSecuritySettings
from coordinator.settings import (
    CLUSTER_ID_RE as CLUSTER_ID_RE,
)
from coordinator.settings import (
    COORDINATOR_URLS,
    PROCESS_NAMES,
    CoordinatorApiSettings,
    DatabaseSettings,
    JanitorSchedule,
    LakelogSettings,
    StoreSettings,
    process_settings,
    register,
)

MiB = 1 << 20

Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]


QUOTA_KINDS = ("produce_bytes", "fetch_bytes", "requests")


def parse_quota_overrides(text: str) -> dict[str, dict[str, float]]:
    """``quota_overrides`` as {principal: {kind: rate}}; a client id becomes ``client:<id>``
    (``address:<ip>`` and ``User:<name>`` stay as they are).

    Raises:
        ValueError: not ``principal=kind:rate,...;...`` with known kinds and rates >= 0.
    """
    out: dict[str, dict[str, float]] = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        who, sep, spec = entry.partition("=")
        who = who.strip()
        if not sep or not who:
            raise ValueError(f"quota_overrides entry {entry!r} is not principal=kind:rate,...")
        kept = who.startswith(("address:", "User:"))  # addresses, authenticated users
        principal = who if kept else f"client:{who}"
        rates = out.setdefault(principal, {})
        for item in spec.split(","):
            kind, sep, rate = item.strip().partition(":")
            if not sep or kind not in QUOTA_KINDS or not rate.strip().isdigit():
                raise ValueError(
                    f"quota_overrides: {item.strip()!r} of {who} is not kind:rate with kind "
                    f"one of {', '.join(QUOTA_KINDS)} and a whole rate >= 0"
                )
            rates[kind] = float(rate)
    return out


def _new_agent_id() -> str:
    return uuid.uuid4().hex


class Settings(
    LakelogSettings,
    DatabaseSettings,
    StoreSettings,
    JanitorSchedule,
    AgentSecuritySettings,
    CoordinatorApiSettings,
):
    """Everything an agent (and ``lakelog serve``) can be configured with."""

    process: ClassVar[str] = "agent"
    #: Settings only ``serve`` uses (its in-process coordinator and janitors) / only
    #: ``agent`` uses.
    SERVE_ONLY: ClassVar[frozenset[str]] = frozenset(
        {
            "db",
            "cluster_id",
            "coordinator_port",
            *JanitorSchedule.model_fields,
            *CoordinatorApiSettings.model_fields,
        }
    )
    AGENT_ONLY: ClassVar[frozenset[str]] = frozenset({"coordinator", "workers"})

    janitors: str = Field(
        default="all",
        description="Janitors to run in the background on their schedules: comma-separated "
        "tier, retention, compact, gc, table, or all, or none.",
    )

    # -- listening and identity ----------------------------------------------
    host: str = Field(
        default="127.0.0.1",
        description="Interface to listen on (0.0.0.0: every one; with authentication none "
        "that needs allow_unauthenticated).",
    )
    port: Annotated[int, Field(ge=1, le=65535)] = Field(
        default=8082, description="Port to listen on."
    )
    access_log: bool = Field(default=False, description="Log every request.")
    http_header_timeout_s: Annotated[float, Field(gt=0)] = Field(
        default=20.0,
        description="Close an HTTP connection whose request head (request line and headers) "
        "is not complete this long after it opened or its last response ended (slow "
        "clients); a request being served is never cut.",
    )
    advertised_url: str | None = Field(
        default=None,
        description="Base URL clients reach this agent at (behind a proxy or NAT): v2 base_uri, "
        "v3 self links, the broker's host and port. Unset: from the request.",
    )
    forwarded_allow_ips: str = Field(
        default="127.0.0.1",
        description="Proxies trusted to set X-Forwarded-Proto/-Host/-For (comma-separated IPs "
        "or CIDRs, * for any); advertised_url wins when set.",
    )
    agent_id: str = Field(
        default_factory=_new_agent_id,
        min_length=1,
        description="Stable agent id (its broker id follows it); random when unset.",
    )
    workers: Annotated[int, Field(ge=1, le=64)] = Field(
        default=1,
        description="Agent processes sharing the HTTP and Kafka ports (SO_REUSEPORT), each "
        "with its own batcher; one agent id, one broker. A dead one is restarted.",
    )

    # -- coordinator ---------------------------------------------------------
    coordinator: str = Field(default="", description=COORDINATOR_URLS)
    coordinator_port: Annotated[int, Field(ge=0, le=65535)] = Field(
        default=8083,
        description="Port on host where lakelog serve answers the coordinator API, as lakelog "
        "coordinator does (Spark jobs, lakelog janitor --coordinator, more agents); 0 turns it "
        "off. With authentication on, users reach it by their credentials and other agents "
        "by coordinator_secret (unset: no other agent).",
    )

    # -- write path ----------------------------------------------------------
    linger_ms: Annotated[int, Field(ge=0)] = Field(
        default=50, description="Flush the write buffer at least this often."
    )
    flush_bytes: Annotated[int, Field(gt=0)] = Field(
        default=4 * MiB,
        description="Flush when this many bytes are buffered (one object per flush).",
    )
    max_buffer_bytes: Annotated[int, Field(gt=0)] = Field(
        default=64 * MiB, description="Most bytes buffered at once; produce waits beyond."
    )
    flushes_in_flight: Annotated[int, Field(ge=1, le=8)] = Field(
        default=2,
        description="Segment objects a batcher writes at once (PUTs overlap; commits keep "
        "append order).",
    )
    buffer_wait_ms: Annotated[int, Field(ge=0)] = Field(
        default=5000, description="How long produce waits for room in a full buffer (then 50003)."
    )
    max_request_bytes: Annotated[int, Field(gt=0)] = Field(
        default=16 * MiB, description="Largest produce body (v2, records:batch) or v3 record."
    )
    max_body_bytes: Annotated[int, Field(gt=0)] = Field(
        default=1 * MiB, description="Body limit of every route but produce (consumer, admin)."
    )
    offload_parse_bytes: Annotated[int, Field(ge=0)] = Field(
        default=256 * 1024,
        description="Produce bodies (or v3 record groups) from this size on are parsed on the "
        "cpu pool, off the event loop.",
    )
    compression: Compression = Field(
        default="none", description="Batch compression: none, gzip, snappy, lz4, zstd."
    )
    produce_batch_max_entries: Annotated[int, Field(ge=1)] = Field(
        default=10,
        description="Most entries of one v3 records:batch (kafka-rest's "
        "api.v3.produce.batch.maximum.entries).",
    )
    quota_produce_bytes_per_s: Annotated[int, Field(ge=0)] = Field(
        default=0,
        description="Produce bytes/s per principal across the cluster (Kafka's "
        "producer_byte_rate; 0: none). Over it: 429 + Retry-After, Kafka throttle_time_ms.",
    )
    quota_fetch_bytes_per_s: Annotated[int, Field(ge=0)] = Field(
        default=0,
        description="Fetch bytes/s per principal across the cluster (Kafka's "
        "consumer_byte_rate; 0: none).",
    )
    quota_requests_per_s: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Requests/s per principal across the cluster (0: none)."
    )
    quota_overrides: str = Field(
        default="",
        description="Per-principal quotas over the defaults, as Kafka's client-id quotas: "
        "'client-a=produce_bytes:1048576,requests:50;address:10.0.0.7=fetch_bytes:0' "
        "(a client id, address:IP, or User:name when authentication is on; 0: no quota for "
        "that principal).",
    )
    idempotency_key_window_s: Annotated[int, Field(ge=1)] = Field(
        default=86400,
        description="How long a REST produce's Idempotency-Key is remembered: a retry within "
        "it answers the first offsets and stores nothing; after it the key is free again.",
    )

    # -- the Kafka protocol --------------------------------------------------
    kafka_port: Annotated[int, Field(ge=0, le=65535)] = Field(
        default=9092, description="Port of the Kafka listener on host; 0 turns it off."
    )
    kafka_advertised: str | None = Field(
        default=None,
        description="host:port Kafka clients reach this agent at (Metadata's broker address); "
        "unset: the listen host and kafka_port, or, listening on every interface, the "
        "address each client's connection reached (other agents are told the address "
        "this one reaches the coordinator from).",
    )
    kafka_max_request_bytes: Annotated[int, Field(gt=0)] = Field(
        default=100 * MiB,
        description="Largest request frame the Kafka listener reads (Kafka's "
        "socket.request.max.bytes).",
    )
    kafka_max_unauthenticated_bytes: Annotated[int, Field(gt=0)] = Field(
        default=512 * 1024,
        description="Largest request frame read before a connection has authenticated "
        "(Kafka's sasl.server.max.receive.size); bigger closes the connection.",
    )
    kafka_max_unsent_bytes: Annotated[int, Field(gt=0)] = Field(
        default=64 * MiB,
        description="A Kafka connection is no longer read while its answers not yet sent "
        "(and produce requests not yet answered) exceed this: a client that does not read "
        "holds at most this plus one answer.",
    )
    kafka_fetch_max_bytes: Annotated[int, Field(ge=1024)] = Field(
        default=57_671_680,
        description="Most record bytes of one Fetch answer, whatever its max_bytes asks "
        "(Kafka's fetch.max.bytes); a first batch larger than this still goes (KIP-74).",
    )
    kafka_connections_max_idle_ms: Annotated[int, Field(gt=0)] = Field(
        default=600_000,
        description="Close a Kafka connection that neither sent nor received anything for "
        "this long (Kafka's connections.max.idle.ms).",
    )
    kafka_authentication_timeout_ms: Annotated[int, Field(gt=0)] = Field(
        default=30_000,
        description="Close a Kafka connection that has not completed SASL this long after it "
        "was opened (authentication on).",
    )
    kafka_connections_max_reauth_ms: Annotated[int, Field(ge=0)] = Field(
        default=3_600_000,
        description="Session lifetime of a SASL login (KIP-368, Kafka's "
        "connections.max.reauth.ms): clients re-authenticate before it ends, others are "
        "disconnected, so a deleted user or changed password ends its connections. 0: never.",
    )
    kafka_max_connections_per_ip: Annotated[int, Field(ge=1)] = Field(
        default=1000,
        description="Kafka connections one client address may hold at once (Kafka's "
        "max.connections.per.ip); more are closed on accept.",
    )
    kafka_group_session_timeout_ms: Annotated[int, Field(gt=0)] = Field(
        default=45_000,
        description="Consumer-protocol (KIP-848) members silent this long leave their group "
        "(Kafka's group.consumer.session.timeout.ms). Set it alike on every agent.",
    )
    kafka_group_heartbeat_interval_ms: Annotated[int, Field(gt=0)] = Field(
        default=5_000,
        description="How often consumer-protocol members heartbeat; each heartbeat moves a "
        "rebalance one step (Kafka's group.consumer.heartbeat.interval.ms).",
    )
    kafka_transaction_abort_interval_ms: Annotated[int, Field(gt=0)] = Field(
        default=10_000,
        description="How often an agent with a Kafka listener aborts the transactions past "
        "their timeout and writes the markers of decided transactions left unwritten "
        "(Kafka's transaction.abort.timed.out.transaction.cleanup.interval.ms).",
    )

    # -- topics and metadata -------------------------------------------------
    auto_create_topics: bool = Field(default=False, description="Create topics on first produce.")
    default_partitions: Annotated[int, Field(ge=1)] = Field(
        default=1, description="Partitions of auto-created topics and of creates that give none."
    )
    heartbeat_interval_s: Annotated[float, Field(gt=0)] = Field(
        default=3.0, description="How often the agent tells the coordinator it is alive (a broker)."
    )
    coordinator_threads: Annotated[int, Field(ge=1)] = Field(
        default=8, description="Threads for coordinator calls (service/executors.py)."
    )
    read_threads: Annotated[int, Field(ge=1)] = Field(
        default=8, description="Threads for consumers' store reads (service/executors.py)."
    )
    metadata_ttl_s: Annotated[float, Field(ge=0)] = Field(
        default=2.0, description="How long topic metadata (and registry lookups) are cached."
    )

    # -- consumers and the read path -----------------------------------------
    consumer_request_max_bytes: Annotated[int, Field(gt=0)] = Field(
        default=64 * MiB,
        description="Most key+value bytes one consumer fetch or v3 read returns, and the "
        "default of their max_bytes (kafka-rest's consumer.request.max.bytes: a client's "
        "max_bytes can only lower it).",
    )
    consumer_max_wait_ms: Annotated[int, Field(ge=0)] = Field(
        default=60_000, description="Longest long-poll of a fetch, whatever timeout it asks for."
    )
    consumer_session_timeout_ms: Annotated[int, Field(gt=0)] = Field(
        default=30_000, description="Default session timeout of new consumer instances."
    )
    group_min_session_timeout_ms: Annotated[int, Field(gt=0)] = Field(
        default=6_000,
        description="Shortest session.timeout.ms a Kafka consumer may join a group with "
        "(Kafka's group.min.session.timeout.ms); shorter: INVALID_SESSION_TIMEOUT.",
    )
    group_max_session_timeout_ms: Annotated[int, Field(gt=0)] = Field(
        default=1_800_000,
        description="Longest session.timeout.ms of a Kafka consumer (Kafka's "
        "group.max.session.timeout.ms; longer: INVALID_SESSION_TIMEOUT) or REST consumer "
        "instance (422); a JoinGroup's rebalance timeout is cut to it.",
    )
    consumer_max_poll_interval_ms: Annotated[int, Field(gt=0)] = Field(
        default=300_000,
        description="Default max.poll.interval.ms of new consumer instances: a member that "
        "does not fetch for this long leaves its group's assignment (kafka-rest's default).",
    )
    consumer_instance_timeout_ms: Annotated[int, Field(gt=0)] = Field(
        default=300_000, description="Default idle timeout of new consumer instances."
    )
    consumer_heartbeat_interval_ms: Annotated[int, Field(gt=0)] = Field(
        default=3_000,
        description="How often the agent heartbeats the consumer instances it served (one "
        "coordinator call for all) and renews its fetch leases.",
    )
    consumer_fetch_lease_ms: Annotated[int, Field(gt=0)] = Field(
        default=10_000,
        description="How long a fetch's lease on its instance lasts without renewal (what an "
        "agent that died mid-fetch holds the instance up for).",
    )
    consumer_fetch_memory_bytes: Annotated[int, Field(gt=0)] = Field(
        default=256 * MiB,
        description="Key+value bytes all fetches in flight on this agent may hold at once.",
    )
    hw_poll_interval_ms: Annotated[int, Field(gt=0)] = Field(
        default=200,
        description="How often waiting fetches check high watermarks (commits through other "
        "agents; local ones wake them at once).",
    )
    read_cache_tail_bytes: Annotated[int, Field(ge=0)] = Field(
        default=64 * MiB, description="Read cache for this agent's own flushes (the hot tail)."
    )
    read_cache_history_bytes: Annotated[int, Field(ge=0)] = Field(
        default=128 * MiB, description="Read cache for ranges fetched from the store (history)."
    )
    index_cache_entries: Annotated[int, Field(ge=0)] = Field(
        default=100_000, description="Index entries (chunk locations) cached per agent."
    )
    index_cache_ttl_s: Annotated[float, Field(ge=0)] = Field(
        default=30.0, description="How long index entries are cached (tiering swaps them)."
    )
    read_ahead_chunks: Annotated[int, Field(ge=0)] = Field(
        default=8, description="Chunks fetched ahead of a reader catching up on history."
    )

    @field_validator("advertised_url")
    @classmethod
    def _check_advertised_url(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"advertised_url must be an http(s) URL with a host; got {v!r}")
        return v.rstrip("/")

    @field_validator("kafka_advertised")
    @classmethod
    def _check_kafka_advertised(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"kafka_advertised must be host:port; got {v!r}")
        return v

    @field_validator("quota_overrides")
    @classmethod
    def _check_quota_overrides(cls, v: str) -> str:
        parse_quota_overrides(v)
        return v

    @model_validator(mode="after")
    def _check_sizes(self) -> Settings:
        if self.max_buffer_bytes < self.flush_bytes:
            raise ValueError(
                f"max_buffer_bytes ({self.max_buffer_bytes}) must be >= flush_bytes "
                f"({self.flush_bytes}): a flush could never fill"
            )
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ValueError(
                f"group_min_session_timeout_ms ({self.group_min_session_timeout_ms}) must not "
                f"exceed group_max_session_timeout_ms ({self.group_max_session_timeout_ms})"
            )
        if 2 * self.consumer_heartbeat_interval_ms > self.consumer_fetch_lease_ms:
            raise ValueError(
                f"consumer_fetch_lease_ms ({self.consumer_fetch_lease_ms}) must be at least "
                f"twice consumer_heartbeat_interval_ms ({self.consumer_heartbeat_interval_ms}):"
                " heartbeats renew the leases"
            )
        return self

    def coordinator_urls(self) -> list[str]:
        """The ``coordinator`` setting split into URLs; empty means in-process."""
        return [u.strip().rstrip("/") for u in self.coordinator.split(",") if u.strip()]


register("serve", Settings)
register("agent", Settings)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings from the environment (a FastAPI dependency; tests override it)."""
    return Settings()


# -- the README's table -------------------------------------------------------------------


def _applies(process: str, cls: type[LakelogSettings], name: str) -> bool:
    if name not in cls.model_fields:
        return False
    if cls is Settings:
        if process == "agent" and name in Settings.SERVE_ONLY:
            return False
        if process == "serve" and name in Settings.AGENT_ONLY:
            return False
    return True


def _default(cls: type[LakelogSettings], name: str) -> str:
    field = cls.model_fields[name]
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
        return "random" if name == "agent_id" else ("" if not value else str(value))
    value = field.default
    if value is PydanticUndefined or value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return "`(empty)`" if value == "" else f"`{value}`"


def settings_table() -> str:
    """Every setting of every process as a Markdown table (the README's, generated)."""
    classes = process_settings()
    names: list[str] = []
    for process in PROCESS_NAMES:
        for name in classes[process].model_fields:
            if name not in names:
                names.append(name)
    head = ["setting", "variable", *PROCESS_NAMES, "meaning"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in sorted(names):
        cells = [f"`{name}`", f"`LAKELOG_{name.upper()}`"]
        description = ""
        for process in PROCESS_NAMES:
            cls = classes[process]
            if _applies(process, cls, name):
                cells.append(_default(cls, name) or "(none)")
                description = description or (cls.model_fields[name].description or "")
            else:
                cells.append("")
        cells.append(description.replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
