"""Settings of every lakelog process, one way: ``LAKELOG_*`` variables and a TOML file.

Each process reads a pydantic-settings class (``service.settings.Settings`` for
``lakelog serve`` and ``lakelog agent``; :class:`CoordinatorSettings` and
:class:`JanitorCommandSettings` here). Values come from, highest first:

1. the command's flags (``--port 8083``; each flag is a field of the same name),
2. ``LAKELOG_<FIELD>`` environment variables,
3. the config file given by ``--config`` or ``LAKELOG_CONFIG``: TOML whose top-level
   keys apply to every process and whose ``[serve]``, ``[agent]``, ``[coordinator]``
   and ``[janitor]`` tables apply to that process only (so one file can configure a
   whole cluster: ``port`` under ``[agent]`` and under ``[coordinator]``),
4. the defaults.

A key the file has that no process knows is an error (a typo must not be silently
ignored); a bad value fails at start-up with pydantic's message naming the field.
``lakelog settings`` prints every setting as the README's table.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from coordinator.janitors.context import DEFAULT_INTERVALS_S, JANITORS, JanitorConfig
from coordinator.security.settings import CoordinatorSecuritySettings

#: The environment variable naming the config file (``--config`` wins).
CONFIG_ENV = "LAKELOG_CONFIG"
ENV_PREFIX = "LAKELOG_"
#: Kafka's cluster id form: a UUID as 22 characters of URL-safe base64, no padding.
CLUSTER_ID_RE = re.compile(r"^[A-Za-z0-9_-]{22}$")

MiB = 1 << 20
#: The coordinator API's default body limit: twice a commit of 10,000 partitions' chunks
#: with 10 producer batches and 10 request keys each (~30 MiB); a gigabyte body from a
#: caller must not take the coordinator's memory.
COORDINATOR_MAX_REQUEST_BYTES = 64 * MiB

COORDINATOR_URLS = (
    "Coordinator URL(s), comma-separated: an agent commits there; `lakelog janitor` asks it "
    "to run the janitor. Empty: the agent runs an in-process coordinator on db (serve), the "
    "janitor runs directly on db and store."
)

S = TypeVar("S", bound="LakelogSettings")


class ConfigFileError(ValueError):
    """The config file is missing, is not TOML, or names settings nobody has."""


_config_file: ContextVar[Path | None] = ContextVar("lakelog_config_file", default=None)
_process: ContextVar[str | None] = ContextVar("lakelog_process", default=None)


def read_config_file(path: Path, process: str, known: set[str]) -> dict[str, Any]:
    """The values ``process`` takes from a config file: top-level keys, then its table.

    Raises:
        ConfigFileError: no such file, not TOML, or keys no process has.
    """
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigFileError(f"cannot read config file {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigFileError(f"config file {path} is not TOML: {e}") from None
    # A process's name is its table; ``coordinator = "http://..."`` (not a table) is the
    # setting of that name.
    tables = {k: v for k, v in doc.items() if k in PROCESS_NAMES and isinstance(v, dict)}
    top = {k: v for k, v in doc.items() if k not in tables}
    unknown = sorted(k for k in top if k not in known)
    for name, table in tables.items():
        unknown += sorted(f"{name}.{k}" for k in table if k not in known)
    if unknown:
        raise ConfigFileError(
            f"config file {path}: unknown settings {', '.join(unknown)} "
            "(lakelog settings lists them all)"
        )
    return {**top, **(tables.get(process) or {})}


class _ConfigFileSource(PydanticBaseSettingsSource):
    """The config file's values for the process being configured (see module doc)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ answers for every field

    def __call__(self) -> dict[str, Any]:
        given = _config_file.get() or os.environ.get(CONFIG_ENV)
        if not given:
            return {}
        process = _process.get() or str(getattr(self.settings_cls, "process", ""))
        values = read_config_file(Path(given), process, all_setting_names())
        return {k: v for k, v in values.items() if k in self.settings_cls.model_fields}


class LakelogSettings(BaseSettings):
    """What every process's settings share: the env prefix, the config file, logging."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")
    #: The config file's table for this class (``load`` may name another).
    process: ClassVar[str] = ""

    log_level: str = Field(
        default="info", description="Python log level: debug, info, warning, error, critical."
    )

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, v: str) -> str:
        if v.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise ValueError(f"log_level must be debug, info, warning, error or critical: {v!r}")
        return v.lower()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _ConfigFileSource(settings_cls)


# -- pieces several processes share -------------------------------------------------


class StoreSettings(BaseModel):
    """Where the objects are."""

    store: str = Field(
        default="file://./data",
        description="Object store URL: s3://bucket/prefix, file:///path or memory://.",
    )
    store_endpoint: str | None = Field(
        default=None, description="S3 endpoint URL (MinIO, a moto server); none for AWS."
    )
    store_region: str | None = Field(default=None, description="S3 region.")

    @field_validator("store_endpoint", "store_region")
    @classmethod
    def _empty_is_none(cls, v: str | None) -> str | None:
        return v or None


class DatabaseSettings(BaseModel):
    """The metadata database."""

    db: str = Field(
        default="sqlite:///./data/lakelog.db",
        description="Metadata database URL: sqlite:///path or postgresql://user@host/db.",
    )
    db_shards: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Shard databases (PostgreSQL URLs, comma-separated; --db-shard "
        "repeatable): partitions' offsets and index are spread over them and db keeps the "
        "catalog. Empty: everything in db.",
    )
    cluster_id: str | None = Field(
        default=None,
        description="Cluster id given to a new database (22 characters of URL-safe base64, "
        "as Kafka's); random when unset.",
    )

    @field_validator("db_shards", mode="before")
    @classmethod
    def _split_shards(cls, v: object) -> object:
        if isinstance(v, str):
            return [u.strip() for u in v.split(",") if u.strip()]
        return v

    @field_validator("cluster_id")
    @classmethod
    def _check_cluster_id(cls, v: str | None) -> str | None:
        if v is not None and not CLUSTER_ID_RE.match(v):
            raise ValueError(
                "cluster_id must be 22 characters of URL-safe base64 (Kafka's form), "
                f"e.g. 'EV-5o5e3SViiGP0hpgKn1g'; got {v!r}"
            )
        return v


def _interval_pairs(value: object) -> object:
    """``tier=30,gc=60`` (the variable's and flag's form) or JSON -> a dict."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("{"):
        return json.loads(text)
    pairs: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, seconds = item.partition("=")
        if not sep:
            raise ValueError(f"janitor intervals look like tier=30,gc=60; got {item!r}")
        pairs[name.strip()] = seconds.strip()
    return pairs


class JanitorTuning(BaseModel):
    """How the janitors work when they run."""

    janitor_interval: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=dict,
        description="Seconds between runs, by janitor: tier=60,retention=60,compact=600,table=60,"
        "gc=300 are the defaults; give the ones to change.",
    )
    tier_age_s: Annotated[float, Field(ge=0)] = Field(
        default=600.0, description="Tier segment chunks committed at least this long ago."
    )
    tier_untiered_bytes: Annotated[int, Field(ge=0)] = Field(
        default=256 * MiB,
        description="Tier a partition's chunks whatever their age once it holds this many "
        "untiered bytes.",
    )
    gc_grace_s: Annotated[float, Field(gt=0)] = Field(
        default=600.0,
        description="Delete an unreferenced or orphan object this long after it lost its last "
        "index entry (longer than any read or flush).",
    )
    lease_ttl_s: Annotated[float, Field(gt=0)] = Field(
        default=60.0, description="A janitor's lease lasts this long unless renewed."
    )

    @field_validator("janitor_interval", mode="before")
    @classmethod
    def _parse_intervals(cls, v: object) -> object:
        v = _interval_pairs(v)
        if isinstance(v, dict):
            unknown = sorted(set(v) - set(JANITORS))
            if unknown:
                raise ValueError(f"intervals of unknown janitors {unknown}; known: {JANITORS}")
        return v

    def janitor_config(self, enabled: frozenset[str] = frozenset()) -> JanitorConfig:
        return JanitorConfig(
            enabled=enabled,
            intervals_s={**DEFAULT_INTERVALS_S, **self.janitor_interval},
            tier_age_s=self.tier_age_s,
            tier_untiered_bytes=self.tier_untiered_bytes,
            gc_grace_s=self.gc_grace_s,
            lease_ttl_s=self.lease_ttl_s,
        )


def parse_janitors(text: str) -> frozenset[str]:
    """``all``, ``none``, ``""`` or comma-separated names. Raises ValueError."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    if names == {"all"}:
        return frozenset(JANITORS)
    if names in ({"none"}, set()):
        return frozenset()
    unknown = sorted(names - set(JANITORS))
    if unknown:
        raise ValueError(f"unknown janitors {unknown}; expected {', '.join(JANITORS)}, all or none")
    return frozenset(names)


class JanitorSchedule(JanitorTuning):
    """Which janitors a process runs in the background, and how."""

    janitors: str = Field(
        default="",
        description="Janitors to run in the background on their schedules: comma-separated "
        "tier, retention, compact, gc, table, or all, or none.",
    )

    @field_validator("janitors")
    @classmethod
    def _check_janitors(cls, v: str) -> str:
        parse_janitors(v)
        return v

    def background_janitors(self) -> JanitorConfig:
        return self.janitor_config(parse_janitors(self.janitors))


class CoordinatorApiSettings(BaseModel):
    """The coordinator API's limits, wherever it is served: ``lakelog coordinator``, and
    ``lakelog serve`` on ``coordinator_port``."""

    coordinator_max_request_bytes: Annotated[int, Field(gt=0)] = Field(
        default=COORDINATOR_MAX_REQUEST_BYTES,
        description="Largest request body the coordinator API reads; bigger is answered 413 "
        "RequestTooLargeError (before it is read when Content-Length says so). A commit "
        "takes ~170 bytes a chunk, more with its producer batches and request keys: 10,000 "
        "chunks with 10 of each are ~30 MiB.",
    )


# -- the coordinator and the janitor command -------------------------------------------


class CoordinatorSettings(
    LakelogSettings,
    DatabaseSettings,
    StoreSettings,
    JanitorSchedule,
    CoordinatorSecuritySettings,
    CoordinatorApiSettings,
):
    """``lakelog coordinator``."""

    process: ClassVar[str] = "coordinator"

    host: str = Field(default="127.0.0.1", description="Interface to listen on.")
    port: Annotated[int, Field(ge=1, le=65535)] = Field(
        default=8083, description="Port to listen on."
    )
    store: str | None = Field(  # type: ignore[assignment]
        default=None,
        description="Object store URL: the janitors need it (and Spark jobs learn it from the "
        "coordinator).",
    )


class JanitorCommandSettings(LakelogSettings, DatabaseSettings, StoreSettings, JanitorTuning):
    """``lakelog janitor NAME``: run one janitor now, here or in a coordinator."""

    process: ClassVar[str] = "janitor"

    log_level: str = Field(
        default="warning", description="Python log level: debug, info, warning, error, critical."
    )
    coordinator: str = Field(default="", description=COORDINATOR_URLS)

    def coordinator_urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.coordinator.split(",") if u.strip()]


# -- every process ----------------------------------------------------------------------

#: The config file's tables, one per process.
PROCESS_NAMES = ("serve", "agent", "coordinator", "janitor")
_REGISTRY: dict[str, type[LakelogSettings]] = {}


def register(process: str, cls: type[LakelogSettings]) -> None:
    """Declare which settings class a process reads (``service.settings`` adds its own)."""
    if process not in PROCESS_NAMES:
        raise ValueError(f"unknown process {process!r}")
    _REGISTRY[process] = cls


register("coordinator", CoordinatorSettings)
register("janitor", JanitorCommandSettings)


def process_settings() -> Mapping[str, type[LakelogSettings]]:
    """Each process's settings class (serve and agent once ``service.settings`` is loaded)."""
    return dict(_REGISTRY)


def all_setting_names() -> set[str]:
    return {name for cls in _REGISTRY.values() for name in cls.model_fields}


@contextmanager
def _configuring(process: str, config: Path | None) -> Iterator[None]:
    t1, t2 = _process.set(process), _config_file.set(config)
    try:
        yield
    finally:
        _process.reset(t1)
        _config_file.reset(t2)


def load(cls: type[S], process: str, config: Path | None = None, **flags: Any) -> S:
    """Settings of ``process`` (its table in the config file) from flags, environment,
    config file (``config``, else ``LAKELOG_CONFIG``) and defaults. Flags given as None
    are left to the other sources.

    Raises:
        pydantic.ValidationError: a bad value. ConfigFileError: a bad config file.
    """
    with _configuring(process, config):
        return cls(**{k: v for k, v in flags.items() if v is not None})
