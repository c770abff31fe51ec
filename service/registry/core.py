"""The agent's schema registry: the domain object behind the registry API and the REST
Proxy's schema formats, over the coordinator's ``SchemaStore``.

It parses (``service.registry.schemas``), checks compatibility, and registers
with the optimistic precondition of ``SchemaStore.register_schema``: the live
versions a check saw must still be the live versions when the schema is
stored, else the check runs again (``SchemaConflictError``).

Caches, so that a produce costs no store call after the first:

- ``by_id``: schema id -> (stored schema, parsed schema). Ids never change
  meaning (``coordinator.schemas.model``), so entries never go stale; a bounded LRU.
- ``by_text``: (subject, type, text, references) -> schema id, for REST
  produce's ``key_schema``/``value_schema``: once registered (or found), the same
  text in the same subject is the same id. A later delete of that version does
  not take the id away from data that carries it, as with Confluent's serializers.
- ``latest``: subject -> its latest version, for v3 produce without a schema; kept
  ``latest_ttl_s`` (the registry may move on; Confluent's clients cache it the same way).

``store_calls`` counts every call to the store, by call, on the agent's metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter

from coordinator.schemas.model import (
    LATEST,
    SchemaReference,
    SchemaStore,
    StoredSchema,
    SubjectVersion,
)
from segments.errors import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    SchemaConflictError,
    SchemaNotFoundError,
    SubjectNotFoundError,
    VersionNotFoundError,
)
from service.registry.schemas import (
    ParsedSchema,
    check_compatibility,
    parse_schema,
    versions_to_check,
)

T = TypeVar("T")

#: Registrations retried after a SchemaConflictError before giving up.
_REGISTER_ATTEMPTS = 8
#: How deep references may nest (a cycle would otherwise recurse forever).
_MAX_REFERENCE_DEPTH = 32


class RegistryMetrics:
    """The registry's counters on the agent's Prometheus registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.store_calls = Counter(
            "lakelog_schema_store_calls",
            "Calls from this agent's schema registry to the coordinator's schema store, by call.",
            ["call"],
            registry=registry,
        )
        self.registrations = Counter(
            "lakelog_schema_registrations",
            "Schema registrations, by outcome (new, existing, incompatible).",
            ["outcome"],
            registry=registry,
        )


class SchemaRegistry:
    """Registry operations over a ``SchemaStore`` (the coordinator client), with caches."""

    def __init__(
        self,
        store: SchemaStore,
        metrics: RegistryMetrics,
        *,
        max_cached: int = 10_000,
        latest_ttl_s: float = 2.0,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.max_cached = max_cached
        self.latest_ttl_s = latest_ttl_s
        self._by_id: OrderedDict[int, tuple[StoredSchema, ParsedSchema]] = OrderedDict()
        self._by_text: OrderedDict[tuple[str, str, str, tuple[SchemaReference, ...]], int] = (
            OrderedDict()
        )
        self._latest: dict[str, tuple[float, SubjectVersion]] = {}

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One store call, off the event loop, counted."""
        self.metrics.store_calls.labels(fn.__name__).inc()
        return await asyncio.to_thread(fn, *args, **kwargs)

    # -- parsing ------------------------------------------------------------------

    async def parse(
        self,
        schema_type: str,
        text: str,
        references: Sequence[SchemaReference] = (),
        _depth: int = 0,
    ) -> ParsedSchema:
        """Parse ``text`` with its references resolved through the store.

        Raises:
            InvalidSchemaError: the schema does not parse, or a reference names no live
                version.
        """
        if _depth > _MAX_REFERENCE_DEPTH:
            raise InvalidSchemaError("Invalid schema: references nest too deep (a cycle?)")
        deps: list[tuple[str, ParsedSchema]] = []
        for ref in references:
            try:
                sv = await self.call(self.store.get_subject_version, ref.subject, ref.version)
            except (SubjectNotFoundError, VersionNotFoundError):
                raise InvalidSchemaError(
                    f"Invalid schema: no schema reference found for subject "
                    f'"{ref.subject}" and version {ref.version}'
                ) from None
            deps.append((ref.name, await self._parsed(sv.schema, _depth + 1)))
        return await asyncio.to_thread(parse_schema, schema_type, text, deps)

    async def _parsed(self, stored: StoredSchema, depth: int = 0) -> ParsedSchema:
        hit = self._by_id.get(stored.schema_id)
        if hit is not None:
            self._by_id.move_to_end(stored.schema_id)
            return hit[1]
        parsed = await self.parse(stored.schema_type, stored.schema, stored.references, depth)
        self._remember(stored, parsed)
        return parsed

    def _remember(self, stored: StoredSchema, parsed: ParsedSchema) -> None:
        self._by_id[stored.schema_id] = (stored, parsed)
        self._by_id.move_to_end(stored.schema_id)
        while len(self._by_id) > self.max_cached:
            self._by_id.popitem(last=False)

    async def by_id(self, schema_id: int) -> tuple[StoredSchema, ParsedSchema]:
        """A schema by its global id (cached for good). Raises SchemaNotFoundError."""
        hit = self._by_id.get(schema_id)
        if hit is not None:
            self._by_id.move_to_end(schema_id)
            return hit
        stored = await self.call(self.store.get_schema, schema_id)
        parsed = await self._parsed(stored)
        return stored, parsed

    async def version(self, subject: str, version: int = LATEST) -> SubjectVersion:
        """One live version of a subject. Raises SubjectNotFoundError, VersionNotFoundError."""
        return await self.call(self.store.get_subject_version, subject, version)

    async def latest(self, subject: str) -> SubjectVersion:
        """The subject's latest version, cached ``latest_ttl_s``."""
        hit = self._latest.get(subject)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.latest_ttl_s:
            return hit[1]
        sv = await self.version(subject)
        self._latest[subject] = (now, sv)
        return sv

    # -- compatibility and registration --------------------------------------------

    async def level(self, subject: str) -> str:
        """The subject's compatibility level, else the global one."""
        own = await self.call(self.store.get_compatibility, subject)
        if own is not None:
            return own
        level = await self.call(self.store.get_compatibility, None)
        assert level is not None  # the global level always has a value
        return level

    async def _olds(self, subject: str, versions: Sequence[int]) -> list[tuple[int, ParsedSchema]]:
        olds = []
        for v in versions:
            sv = await self.call(self.store.get_subject_version, subject, v)
            olds.append((v, await self._parsed(sv.schema)))
        return olds

    async def _live_versions(self, subject: str) -> list[int]:
        try:
            return await self.call(self.store.subject_versions, subject)
        except SubjectNotFoundError:
            return []

    async def check(
        self, subject: str, new: ParsedSchema, version: int | None = None
    ) -> tuple[list[str], list[int]]:
        """(problems, the live versions seen) of ``new`` under the subject's level.

        ``version``: check against that one version only, whatever the level says
        about transitivity (``/compatibility/subjects/{s}/versions/{v}``). As in
        Confluent's registry, ``LATEST`` of a subject with no live version checks against
        nothing (compatible), and a numbered version that does not exist is
        VersionNotFoundError, whether or not the subject does.
        """
        level = await self.level(subject)
        live = await self._live_versions(subject)
        if version is None:
            targets = versions_to_check(level, live)
        elif version == LATEST:
            targets = versions_to_check(level, live[-1:])
        elif version in live:
            targets = versions_to_check(level, [version])
        else:
            raise VersionNotFoundError(f"Version {version} not found.")
        return check_compatibility(level, new, await self._olds(subject, targets)), live

    async def _find(
        self,
        subject: str,
        parsed: ParsedSchema,
        references: tuple[SchemaReference, ...],
        *,
        deleted: bool = False,
    ) -> SubjectVersion | None:
        """The subject's latest version holding ``parsed`` (live ones, or all with
        ``deleted``), else None.

        The store finds the canonical text by its fingerprint; a version stored in an
        older canonical form is found by parsing the subject's versions again and
        comparing canonical forms (Confluent's ``canLookup`` pass does the same).
        """
        try:
            return await self.call(
                self.store.find_schema,
                subject,
                parsed.schema_type,
                parsed.canonical,
                references,
                deleted=deleted,
            )
        except (SubjectNotFoundError, SchemaNotFoundError):
            pass
        try:
            versions = await self.call(self.store.subject_versions, subject, deleted=deleted)
        except SubjectNotFoundError:
            return None
        for v in reversed(versions):
            sv = await self.call(self.store.get_subject_version, subject, v, deleted=deleted)
            old = sv.schema
            if old.schema_type != parsed.schema_type or old.references != references:
                continue
            if old.schema == parsed.canonical or (await self._parsed(old)).canonical == (
                parsed.canonical
            ):
                return sv
        return None

    async def register(
        self,
        subject: str,
        schema_type: str,
        text: str,
        references: Sequence[SchemaReference] = (),
    ) -> tuple[SubjectVersion, ParsedSchema]:
        """Register under ``subject`` (its live version if it has this schema already).

        Raises:
            InvalidSchemaError, IncompatibleSchemaError, and the store's errors.
        """
        parsed = await self.parse(schema_type, text, references)
        refs = tuple(references)
        # A schema the subject holds already is answered before any compatibility check,
        # as Confluent does: a producer still on v1 re-registers it after v2 exists.
        existing = await self._find(subject, parsed, refs)
        if existing is not None:
            self.metrics.registrations.labels("existing").inc()
            self._remember(existing.schema, parsed)
            return existing, parsed
        for _ in range(_REGISTER_ATTEMPTS):
            problems, live = await self.check(subject, parsed)
            if problems:
                self.metrics.registrations.labels("incompatible").inc()
                raise IncompatibleSchemaError(
                    "Schema being registered is incompatible with an earlier schema for "
                    f'subject "{subject}", details: [{"; ".join(problems)}]'
                )
            try:
                sv = await self.call(
                    self.store.register_schema,
                    subject,
                    schema_type,
                    parsed.canonical,
                    refs,
                    expected_versions=live,
                )
            except SchemaConflictError:
                continue
            self.metrics.registrations.labels("existing" if sv.version in live else "new").inc()
            self._remember(sv.schema, parsed)
            return sv, parsed
        raise SchemaConflictError(
            f"Subject '{subject}' kept changing during the registration; try again."
        )

    async def lookup(
        self,
        subject: str,
        schema_type: str,
        text: str,
        references: Sequence[SchemaReference] = (),
        *,
        deleted: bool = False,
    ) -> SubjectVersion:
        """The subject's version holding this schema. Raises SubjectNotFoundError,
        SchemaNotFoundError, InvalidSchemaError."""
        parsed = await self.parse(schema_type, text, references)
        found = await self._find(subject, parsed, tuple(references), deleted=deleted)
        if found is None:
            # 40401 for a subject without versions, 40403 for a schema it does not hold.
            await self.call(self.store.subject_versions, subject, deleted=deleted)
            raise SchemaNotFoundError("Schema not found")
        return found

    async def find_id(
        self,
        subject: str,
        schema_type: str,
        text: str,
        references: Sequence[SchemaReference] = (),
    ) -> tuple[int, ParsedSchema] | None:
        """The id of ``text`` in ``subject`` if it is registered there (never registering);
        cached as ``id_for``'s."""
        key = (subject, schema_type, text, tuple(references))
        schema_id = self._by_text.get(key)
        if schema_id is None:
            try:
                sv = await self.lookup(subject, schema_type, text, references)
            except (SubjectNotFoundError, SchemaNotFoundError):
                return None
            schema_id = self._by_text[key] = sv.schema.schema_id
            while len(self._by_text) > self.max_cached:
                self._by_text.popitem(last=False)
        self._by_text.move_to_end(key)
        return schema_id, (await self.by_id(schema_id))[1]

    async def id_for(
        self,
        subject: str,
        schema_type: str,
        text: str,
        references: Sequence[SchemaReference] = (),
    ) -> tuple[int, ParsedSchema]:
        """The id of ``text`` in ``subject``, registering it on first use (REST produce's
        auto-registration); cached, so later calls cost no store call."""
        key = (subject, schema_type, text, tuple(references))
        schema_id = self._by_text.get(key)
        if schema_id is not None:
            self._by_text.move_to_end(key)
            return schema_id, (await self.by_id(schema_id))[1]
        sv, parsed = await self.register(subject, schema_type, text, references)
        self._by_text[key] = sv.schema.schema_id
        while len(self._by_text) > self.max_cached:
            self._by_text.popitem(last=False)
        return sv.schema.schema_id, parsed
