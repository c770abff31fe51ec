"""The schema registry's storage interface: subjects, versions and global schema ids.

The coordinator keeps a Confluent-style schema registry's state (no ``_schemas``
topic, no extra process): every agent serves the registry API over it.
``LocalCoordinator`` and ``HttpCoordinator`` implement ``SchemaStore`` beside
``Coordinator`` and ``GroupCoordinator``.

The store does not parse schemas; the agent does (``service.registry``), and
hands the store a canonical text. The store keeps the rules that need one
consistent view: ids are global and never reused (the same type, text and
references get the same id in every subject), versions grow per subject, soft
and permanent deletes, references that block deletes, and compatibility
levels. A registration is checked for compatibility by the agent first, then
stored with the list of live versions the check saw (``expected_versions``):
if another registration or delete changed that list meanwhile, the store
raises ``SchemaConflictError`` and the agent checks again
(``service.registry.core``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

#: The schema types, as the registry API names them.
SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")

#: Compatibility levels, Confluent's names.
COMPATIBILITY_LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)

#: The global level of a registry that was never configured (Confluent's default).
DEFAULT_COMPATIBILITY = "BACKWARD"

#: ``version`` argument meaning "the latest live version".
LATEST = -1


@dataclass(frozen=True, slots=True)
class SchemaReference:
    """One import of a schema: ``name`` as the schema text spells it, and the subject
    version that holds it."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True, slots=True)
class StoredSchema:
    """A schema under its global id."""

    schema_id: int
    schema_type: str
    schema: str
    references: tuple[SchemaReference, ...] = ()


@dataclass(frozen=True, slots=True)
class SubjectVersion:
    """One version of a subject; ``deleted`` when soft-deleted."""

    subject: str
    version: int
    schema: StoredSchema
    deleted: bool = False


class SchemaStore(Protocol):
    def register_schema(
        self,
        subject: str,
        schema_type: str,
        schema: str,
        references: Sequence[SchemaReference] = (),
        *,
        expected_versions: Sequence[int] | None = None,
    ) -> SubjectVersion:
        """Store ``schema`` as the subject's next version; its id if the same type, text and
        references were stored before (in any subject).

        A schema that is a live version of the subject already is returned as it is
        (no new version, no check). ``expected_versions`` are the subject's live
        versions the caller checked compatibility against; if they differ now,
        nothing is stored. Raises SchemaConflictError (then), InvalidSchemaError (a
        reference to a missing or deleted version), InvalidSubjectError.
        """
        ...

    def get_schema(self, schema_id: int) -> StoredSchema:
        """Raises SchemaNotFoundError unless some version (live or soft-deleted) holds it."""
        ...

    def schema_versions(self, schema_id: int, *, deleted: bool = False) -> list[tuple[str, int]]:
        """(subject, version) pairs that hold the schema. Raises SchemaNotFoundError."""
        ...

    def list_subjects(self, *, deleted: bool = False) -> list[str]:
        """Subjects with a live version (or any version with ``deleted``), by name."""
        ...

    def subject_versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        """The subject's versions, ascending. Raises SubjectNotFoundError."""
        ...

    def get_subject_version(
        self, subject: str, version: int = LATEST, *, deleted: bool = False
    ) -> SubjectVersion:
        """One version (``LATEST``: the highest live one). Raises SubjectNotFoundError,
        VersionNotFoundError."""
        ...

    def find_schema(
        self,
        subject: str,
        schema_type: str,
        schema: str,
        references: Sequence[SchemaReference] = (),
        *,
        deleted: bool = False,
    ) -> SubjectVersion:
        """The subject's latest version holding this schema. Raises SubjectNotFoundError,
        SchemaNotFoundError."""
        ...

    def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        """Soft-delete every live version, or (``permanent``) remove the soft-deleted ones
        and the subject's config; returns the versions deleted. Raises
        SubjectNotFoundError, SubjectSoftDeletedError, SubjectNotSoftDeletedError,
        ReferenceExistsError."""
        ...

    def delete_subject_version(
        self, subject: str, version: int = LATEST, *, permanent: bool = False
    ) -> int:
        """Soft-delete one version, or remove a soft-deleted one; returns the version.
        Raises SubjectNotFoundError, VersionNotFoundError, VersionSoftDeletedError,
        VersionNotSoftDeletedError, ReferenceExistsError."""
        ...

    def referenced_by(self, subject: str, version: int) -> list[int]:
        """Ids of the schemas that reference this version (live versions only), ascending.
        Raises SubjectNotFoundError, VersionNotFoundError."""
        ...

    def get_compatibility(self, subject: str | None = None) -> str | None:
        """The subject's own level (None: not set), or the global one (``subject`` None;
        never None)."""
        ...

    def set_compatibility(self, level: str, subject: str | None = None) -> str:
        """Set the subject's or the global level. Raises InvalidCompatibilityLevelError."""
        ...

    def delete_compatibility(self, subject: str | None = None) -> str:
        """Drop the subject's level (back to the global one), or reset the global one to
        the default; returns the level that was set. Raises SubjectConfigNotFoundError."""
        ...
