"""The schema registry's state in the metadata database. Every registry SQL statement
lives in this module (see ``coordinator.schemas.model`` for the rules it keeps).

Each public method is one transaction; writes hold the database's writer lock
(SQLite's ``BEGIN IMMEDIATE``, PostgreSQL's advisory lock), so a registration's
read of the subject's versions and its insert see one state.

Ids: a schema row is found again by its fingerprint (a SHA-256 of type, text and
references) and is never deleted, so an id stays bound to one schema for good:
the same schema registered again, in any subject, after any delete, gets its
old id back, and no other schema can ever get it. Versions: the next version of
a subject is one above the highest row it holds (soft-deleted included); a
permanent delete of the highest version lets that number be used again, as in
Confluent's registry.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from coordinator import clock
from coordinator.db import MetadataDatabase
from coordinator.schemas.model import (
    COMPATIBILITY_LEVELS,
    DEFAULT_COMPATIBILITY,
    LATEST,
    SchemaReference,
    StoredSchema,
    SubjectVersion,
)
from segments.errors import (
    InvalidCompatibilityLevelError,
    InvalidSchemaError,
    InvalidSubjectError,
    ReferenceExistsError,
    SchemaConflictError,
    SchemaNotFoundError,
    SubjectConfigNotFoundError,
    SubjectNotFoundError,
    SubjectNotSoftDeletedError,
    SubjectSoftDeletedError,
    VersionNotFoundError,
    VersionNotSoftDeletedError,
    VersionSoftDeletedError,
)

#: Subject name under which ``schema_configs`` keeps the global level.
_GLOBAL = ""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_SCHEMA_BY_ID = "SELECT schema_type, schema_text FROM schemas WHERE schema_id = ?"
_SCHEMA_BY_FINGERPRINT = "SELECT schema_id FROM schemas WHERE fingerprint = ?"
_INSERT_SCHEMA = (
    "INSERT INTO schemas (schema_type, schema_text, fingerprint, created_at) "
    "VALUES (?, ?, ?, ?) RETURNING schema_id"
)
_REFS_OF = (
    "SELECT name, subject, version FROM schema_references WHERE schema_id = ? ORDER BY position"
)
_INSERT_REF = (
    "INSERT INTO schema_references (schema_id, position, name, subject, version) "
    "VALUES (?, ?, ?, ?, ?)"
)
_VERSIONS_OF = (
    "SELECT version, schema_id, deleted FROM subject_versions WHERE subject = ? ORDER BY version"
)
_INSERT_VERSION = (
    "INSERT INTO subject_versions (subject, version, schema_id, deleted, created_at) "
    "VALUES (?, ?, ?, 0, ?)"
)
_SOFT_DELETE = "UPDATE subject_versions SET deleted = 1 WHERE subject = ? AND version = ?"
_HARD_DELETE = "DELETE FROM subject_versions WHERE subject = ? AND version = ?"
_USES_OF_SCHEMA = (
    "SELECT subject, version, deleted FROM subject_versions WHERE schema_id = ? "
    "ORDER BY subject, version"
)
_SUBJECTS = "SELECT subject, MIN(deleted) FROM subject_versions GROUP BY subject ORDER BY subject"
# Versions whose schema references (subject, version); deleted = 1 when soft-deleted.
_REFERRERS = (
    "SELECT DISTINCT v.schema_id, v.deleted FROM schema_references r "
    "JOIN subject_versions v ON v.schema_id = r.schema_id "
    "WHERE r.subject = ? AND r.version = ?"
)
_GET_CONFIG = "SELECT compatibility FROM schema_configs WHERE subject = ?"
_PUT_CONFIG = (
    "INSERT INTO schema_configs (subject, compatibility) VALUES (?, ?) "
    "ON CONFLICT (subject) DO UPDATE SET compatibility = excluded.compatibility"
)
_DELETE_CONFIG = "DELETE FROM schema_configs WHERE subject = ?"


def check_subject(subject: object) -> str:
    """Raises InvalidSubjectError for a non-string, empty or control-character subject."""
    if not isinstance(subject, str) or not subject.strip() or _CONTROL.search(subject):
        raise InvalidSubjectError(f"The specified subject '{subject}' is not a valid.")
    return subject


def check_level(level: object) -> str:
    """The level upper-cased. Raises InvalidCompatibilityLevelError."""
    if isinstance(level, str) and level.upper() in COMPATIBILITY_LEVELS:
        return level.upper()
    raise InvalidCompatibilityLevelError(
        "Invalid compatibility level. Valid values are none, backward, forward, full, "
        "backward_transitive, forward_transitive, and full_transitive"
    )


def fingerprint(schema_type: str, schema: str, references: Sequence[SchemaReference]) -> str:
    """What makes two registrations the same schema (and so the same id)."""
    refs = [[r.name, r.subject, r.version] for r in references]
    blob = json.dumps([schema_type, schema, refs], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def subject_not_found(subject: str) -> SubjectNotFoundError:
    return SubjectNotFoundError(f"Subject '{subject}' not found.")


def version_not_found(version: int) -> VersionNotFoundError:
    return VersionNotFoundError(f"Version {version} not found.")


class SchemaRegistryStore:
    """Implements ``coordinator.schemas.model.SchemaStore`` over one metadata database."""

    def __init__(self, db: MetadataDatabase) -> None:
        self._db = db
        self._q = db.dialect.sql

    # -- helpers (inside a transaction) ------------------------------------------

    def _versions(self, conn: Any, subject: str) -> list[tuple[int, int, bool]]:
        rows = conn.execute(self._q(_VERSIONS_OF), (subject,)).fetchall()
        return [(int(v), int(sid), bool(d)) for v, sid, d in rows]

    def _stored(self, conn: Any, schema_id: int) -> StoredSchema | None:
        row = conn.execute(self._q(_SCHEMA_BY_ID), (schema_id,)).fetchone()
        if row is None:
            return None
        refs = tuple(
            SchemaReference(name, subject, int(version))
            for name, subject, version in conn.execute(self._q(_REFS_OF), (schema_id,))
        )
        return StoredSchema(schema_id, row[0], row[1], refs)

    def _subject_version(
        self, conn: Any, subject: str, version: int, schema_id: int, deleted: bool
    ) -> SubjectVersion:
        stored = self._stored(conn, schema_id)
        assert stored is not None  # schema rows are never deleted
        return SubjectVersion(subject, version, stored, deleted)

    def _pick(
        self, conn: Any, subject: str, version: int, *, deleted: bool
    ) -> tuple[int, int, bool]:
        """(version, schema id, deleted) of one version; LATEST is the highest visible."""
        rows = self._versions(conn, subject)
        visible = [r for r in rows if deleted or not r[2]]
        if not visible:
            raise subject_not_found(subject)
        if version == LATEST:
            return visible[-1]
        for row in visible:
            if row[0] == version:
                return row
        raise version_not_found(version)

    def _live_referrers(self, conn: Any, subject: str, version: int, *, any_: bool) -> list[int]:
        rows = conn.execute(self._q(_REFERRERS), (subject, version)).fetchall()
        return sorted({int(sid) for sid, deleted in rows if any_ or not deleted})

    # -- registration ------------------------------------------------------------

    def register_schema(
        self,
        subject: str,
        schema_type: str,
        schema: str,
        references: Sequence[SchemaReference] = (),
        *,
        expected_versions: Sequence[int] | None = None,
    ) -> SubjectVersion:
        check_subject(subject)
        refs = tuple(references)
        fp = fingerprint(schema_type, schema, refs)
        now = clock.now()
        with self._db.write() as conn:
            rows = self._versions(conn, subject)
            row = conn.execute(self._q(_SCHEMA_BY_FINGERPRINT), (fp,)).fetchone()
            schema_id = None if row is None else int(row[0])
            live = [(v, sid) for v, sid, d in rows if not d]
            for v, sid in reversed(live):
                if sid == schema_id:
                    return self._subject_version(conn, subject, v, sid, False)
            if expected_versions is not None and [v for v, _ in live] != list(expected_versions):
                raise SchemaConflictError(
                    f"Subject '{subject}' changed while the schema was checked; try again."
                )
            for ref in refs:
                targets = self._versions(conn, ref.subject)
                if not any(v == ref.version and not d for v, _, d in targets):
                    raise InvalidSchemaError(
                        f"Invalid schema: no schema reference found for subject "
                        f'"{ref.subject}" and version {ref.version}'
                    )
            if schema_id is None:
                schema_id = int(
                    conn.execute(
                        self._q(_INSERT_SCHEMA), (schema_type, schema, fp, now)
                    ).fetchone()[0]
                )
                conn.executemany(
                    self._q(_INSERT_REF),
                    [(schema_id, i, r.name, r.subject, r.version) for i, r in enumerate(refs)],
                )
            version = max((v for v, _, _ in rows), default=0) + 1
            conn.execute(self._q(_INSERT_VERSION), (subject, version, schema_id, now))
            return SubjectVersion(
                subject, version, StoredSchema(schema_id, schema_type, schema, refs), False
            )

    # -- reads -------------------------------------------------------------------

    def get_schema(self, schema_id: int) -> StoredSchema:
        with self._db.read() as conn:
            used = conn.execute(self._q(_USES_OF_SCHEMA), (schema_id,)).fetchone()
            stored = self._stored(conn, schema_id) if used is not None else None
        if stored is None:
            raise SchemaNotFoundError(f"Schema {schema_id} not found")
        return stored

    def schema_versions(self, schema_id: int, *, deleted: bool = False) -> list[tuple[str, int]]:
        with self._db.read() as conn:
            rows = conn.execute(self._q(_USES_OF_SCHEMA), (schema_id,)).fetchall()
        if not rows:
            raise SchemaNotFoundError(f"Schema {schema_id} not found")
        return [(s, int(v)) for s, v, d in rows if deleted or not d]

    def list_subjects(self, *, deleted: bool = False) -> list[str]:
        with self._db.read() as conn:
            rows = conn.execute(self._q(_SUBJECTS)).fetchall()
        return [s for s, all_deleted in rows if deleted or not all_deleted]

    def subject_versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        with self._db.read() as conn:
            rows = self._versions(conn, subject)
        versions = [v for v, _, d in rows if deleted or not d]
        if not versions:
            raise subject_not_found(subject)
        return versions

    def get_subject_version(
        self, subject: str, version: int = LATEST, *, deleted: bool = False
    ) -> SubjectVersion:
        with self._db.read() as conn:
            v, sid, d = self._pick(conn, subject, version, deleted=deleted)
            return self._subject_version(conn, subject, v, sid, d)

    def find_schema(
        self,
        subject: str,
        schema_type: str,
        schema: str,
        references: Sequence[SchemaReference] = (),
        *,
        deleted: bool = False,
    ) -> SubjectVersion:
        fp = fingerprint(schema_type, schema, tuple(references))
        with self._db.read() as conn:
            rows = [r for r in self._versions(conn, subject) if deleted or not r[2]]
            if not rows:
                raise subject_not_found(subject)
            found = conn.execute(self._q(_SCHEMA_BY_FINGERPRINT), (fp,)).fetchone()
            for v, sid, d in reversed(rows):
                if found is not None and sid == int(found[0]):
                    return self._subject_version(conn, subject, v, sid, d)
        raise SchemaNotFoundError("Schema not found")

    def referenced_by(self, subject: str, version: int) -> list[int]:
        with self._db.read() as conn:
            v, _, _ = self._pick(conn, subject, version, deleted=False)
            return self._live_referrers(conn, subject, v, any_=False)

    # -- deletes -----------------------------------------------------------------

    def _check_unreferenced(self, conn: Any, subject: str, version: int, permanent: bool) -> None:
        # Live referrers block any delete; a permanent delete is blocked by soft-deleted
        # referrers too, so that no stored schema ever names a version that is gone.
        if self._live_referrers(conn, subject, version, any_=permanent):
            raise ReferenceExistsError(
                f"One or more references exist to the schema {{subject={subject},"
                f"version={version}}}."
            )

    def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        with self._db.write() as conn:
            rows = self._versions(conn, subject)
            if not rows:
                raise subject_not_found(subject)
            live = [v for v, _, d in rows if not d]
            if permanent:
                if live:
                    raise SubjectNotSoftDeletedError(
                        f"Subject '{subject}' was not deleted first before being permanently "
                        "deleted"
                    )
                gone = [v for v, _, _ in rows]
                for v in gone:
                    self._check_unreferenced(conn, subject, v, True)
                conn.executemany(self._q(_HARD_DELETE), [(subject, v) for v in gone])
                conn.execute(self._q(_DELETE_CONFIG), (subject,))
                return gone
            if not live:
                raise SubjectSoftDeletedError(
                    f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently"
                )
            for v in live:
                self._check_unreferenced(conn, subject, v, False)
            conn.executemany(self._q(_SOFT_DELETE), [(subject, v) for v in live])
            return live

    def delete_subject_version(
        self, subject: str, version: int = LATEST, *, permanent: bool = False
    ) -> int:
        with self._db.write() as conn:
            rows = self._versions(conn, subject)
            if not rows:
                raise subject_not_found(subject)
            if version == LATEST:
                live = [r for r in rows if not r[2]]
                if not live:  # Confluent: a subject whose versions are all soft-deleted
                    raise subject_not_found(subject)
                row = live[-1]
            else:
                found = [r for r in rows if r[0] == version]
                if not found:
                    raise version_not_found(version)
                row = found[0]
            v, _, deleted = row
            if permanent and not deleted:
                raise VersionNotSoftDeletedError(
                    f"Subject '{subject}' Version {v} was not deleted first before being "
                    "permanently deleted"
                )
            if deleted and not permanent:
                raise VersionSoftDeletedError(
                    f"Subject '{subject}' Version {v} was soft deleted.Set permanent=true to "
                    "delete permanently"
                )
            self._check_unreferenced(conn, subject, v, permanent)
            conn.execute(self._q(_HARD_DELETE if permanent else _SOFT_DELETE), (subject, v))
            return v

    # -- compatibility levels ----------------------------------------------------

    def get_compatibility(self, subject: str | None = None) -> str | None:
        with self._db.read() as conn:
            row = conn.execute(self._q(_GET_CONFIG), (subject or _GLOBAL,)).fetchone()
        if row is not None:
            return str(row[0])
        return None if subject else DEFAULT_COMPATIBILITY

    def set_compatibility(self, level: str, subject: str | None = None) -> str:
        level = check_level(level)
        if subject is not None:
            check_subject(subject)
        with self._db.write() as conn:
            conn.execute(self._q(_PUT_CONFIG), (subject or _GLOBAL, level))
        return level

    def delete_compatibility(self, subject: str | None = None) -> str:
        with self._db.write() as conn:
            row = conn.execute(self._q(_GET_CONFIG), (subject or _GLOBAL,)).fetchone()
            if row is None:
                if subject:
                    raise SubjectConfigNotFoundError(
                        f"Subject '{subject}' does not have subject-level compatibility configured"
                    )
                return DEFAULT_COMPATIBILITY
            conn.execute(self._q(_DELETE_CONFIG), (subject or _GLOBAL,))
            return str(row[0])
