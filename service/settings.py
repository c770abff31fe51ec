"""The agent's settings: one pydantic-settings class, env prefix ``LAKELOG_``.

Values come from (highest first) keyword arguments (the CLI passes its flags
this way), ``LAKELOG_*`` environment variables, then the defaults below. A bad
value fails at start-up with pydantic's message naming the field.
"""

from __future__ import annotations

import re
import uuid
from functools import lru_cache
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1 << 20

#: Kafka's cluster id form: a UUID as 22 characters of URL-safe base64, no padding.
CLUSTER_ID_RE = re.compile(r"^[A-Za-z0-9_-]{22}$")

Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]


def _new_agent_id() -> str:
    return uuid.uuid4().hex


class Settings(BaseSettings):
    """Everything an agent (and ``lakelog serve``) can be configured with."""

    model_config = SettingsConfigDict(env_prefix="LAKELOG_", extra="ignore")

    # -- listening and identity ----------------------------------------------
    host: str = "0.0.0.0"
    port: Annotated[int, Field(ge=1, le=65535)] = 8082
    #: Base URL clients reach this agent at (behind a proxy or NAT); used for v3
    #: ``self`` links and the broker host/port. None: from the request / listen address.
    advertised_url: str | None = None
    #: Proxies trusted to set ``X-Forwarded-Proto``/``-Host``/``-For`` (comma-separated
    #: IPs or CIDRs, ``*`` for any): behind a TLS proxy, ``base_uri`` and ``self`` links
    #: then carry the client's scheme and host. ``advertised_url`` wins when set.
    forwarded_allow_ips: str = "127.0.0.1"
    agent_id: str = Field(default_factory=_new_agent_id, min_length=1)
    cluster_id: str | None = None

    # -- coordinator and store -----------------------------------------------
    #: Comma-separated coordinator URLs; "" runs an in-process LocalCoordinator on ``db``.
    coordinator: str = ""
    db: str = "sqlite:///./data/lakelog.db"
    store: str = "file://./data"
    store_endpoint: str | None = None
    store_region: str | None = None

    # -- write path ----------------------------------------------------------
    linger_ms: Annotated[int, Field(ge=0)] = 50
    flush_bytes: Annotated[int, Field(gt=0)] = 4 * MiB
    max_buffer_bytes: Annotated[int, Field(gt=0)] = 64 * MiB
    buffer_wait_ms: Annotated[int, Field(ge=0)] = 5000
    max_request_bytes: Annotated[int, Field(gt=0)] = 16 * MiB
    #: Body limit of every route but produce (consumer, admin): these bodies are small.
    max_body_bytes: Annotated[int, Field(gt=0)] = 1 * MiB
    #: Produce bodies (v2) or record groups (v3) from this size on are parsed and
    #: partitioned in the ``cpu`` pool, off the event loop; smaller ones inline (the
    #: thread hop costs more than it saves).
    offload_parse_bytes: Annotated[int, Field(ge=0)] = 256 * 1024
    compression: Compression = "none"
    #: Most entries one v3 ``records:batch`` request may hold (kafka-rest's
    #: ``api.v3.produce.batch.maximum.entries``).
    produce_batch_max_entries: Annotated[int, Field(ge=1)] = 10

    # -- topics and metadata -------------------------------------------------
    auto_create_topics: bool = False
    default_partitions: Annotated[int, Field(ge=1)] = 1
    heartbeat_interval_s: Annotated[float, Field(gt=0)] = 3.0
    #: Threads of the pools for coordinator calls and for consumers' store reads (see
    #: service/executors.py: flushes and the heartbeat have pools of their own).
    coordinator_threads: Annotated[int, Field(ge=1)] = 8
    read_threads: Annotated[int, Field(ge=1)] = 8
    metadata_ttl_s: Annotated[float, Field(ge=0)] = 2.0

    # -- consumers and the read path -----------------------------------------
    #: Default ``max_bytes`` of a consumer fetch (kafka-rest's consumer.request.max.bytes).
    consumer_request_max_bytes: Annotated[int, Field(gt=0)] = 64 * MiB
    #: Upper bound of a fetch's long-poll, whatever ``timeout`` the client asks for.
    consumer_max_wait_ms: Annotated[int, Field(ge=0)] = 60_000
    #: Defaults of new consumer instances (a create request may override both).
    consumer_session_timeout_ms: Annotated[int, Field(gt=0)] = 30_000
    consumer_instance_timeout_ms: Annotated[int, Field(gt=0)] = 300_000
    #: How often the one background poller checks high watermarks while fetches wait
    #: (catches data committed through other agents; local commits wake at once).
    hw_poll_interval_ms: Annotated[int, Field(gt=0)] = 200
    #: Read cache budgets: this agent's own flushes (the hot tail) vs ranges fetched
    #: from the store (history), kept apart so a lagging reader cannot evict the tail.
    read_cache_tail_bytes: Annotated[int, Field(ge=0)] = 64 * MiB
    read_cache_history_bytes: Annotated[int, Field(ge=0)] = 128 * MiB
    #: Index entries (ChunkRef) cached per agent, and how long (tiering swaps them).
    index_cache_entries: Annotated[int, Field(ge=0)] = 100_000
    index_cache_ttl_s: Annotated[float, Field(ge=0)] = 30.0
    #: Chunks fetched ahead of a reader (in parallel) when catching up on history.
    read_ahead_chunks: Annotated[int, Field(ge=0)] = 8

    @field_validator("cluster_id")
    @classmethod
    def _check_cluster_id(cls, v: str | None) -> str | None:
        if v is not None and not CLUSTER_ID_RE.match(v):
            raise ValueError(
                "cluster_id must be 22 characters of URL-safe base64 (Kafka's form), "
                f"e.g. 'EV-5o5e3SViiGP0hpgKn1g'; got {v!r}"
            )
        return v

    @field_validator("advertised_url")
    @classmethod
    def _check_advertised_url(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"advertised_url must be an http(s) URL with a host; got {v!r}")
        return v.rstrip("/")

    @field_validator("store_endpoint", "store_region")
    @classmethod
    def _empty_is_none(cls, v: str | None) -> str | None:
        return v or None

    @model_validator(mode="after")
    def _check_sizes(self) -> Settings:
        if self.max_buffer_bytes < self.flush_bytes:
            raise ValueError(
                f"max_buffer_bytes ({self.max_buffer_bytes}) must be >= flush_bytes "
                f"({self.flush_bytes}): a flush could never fill"
            )
        return self

    def coordinator_urls(self) -> list[str]:
        """The ``coordinator`` setting split into URLs; empty means in-process."""
        return [u.strip().rstrip("/") for u in self.coordinator.split(",") if u.strip()]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings from the environment (a FastAPI dependency; tests override it)."""
    return Settings()
