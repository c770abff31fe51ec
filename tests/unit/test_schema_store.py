"""The schema registry's store on SQLite and PostgreSQL (``db_url`` runs each test on both).

The scenarios take any ``SchemaStore``, so ``tests/integration/test_coordinator_http.py``
runs the same ones through ``HttpCoordinator`` against a coordinator process.
"""

from __future__ import annotations

import uuid

import pytest

from coordinator.local import LocalCoordinator
from coordinator.schemas.model import LATEST, SchemaReference, SchemaStore
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
from tests.conftest import sql_rows
from tests.threads import run_threads


def _subject(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _avro(name: str) -> str:
    return f'{{"type":"record","name":"{name}","fields":[]}}'


# -- scenarios over any SchemaStore ----------------------------------------------


def check_ids_and_versions(store: SchemaStore) -> None:
    """Ids are global per (type, text, references); versions grow per subject; a live
    schema registered again is the same version; ids are never given to another schema."""
    a, b = _subject(), _subject()
    v1 = store.register_schema(a, "AVRO", _avro("A"))
    assert (v1.version, v1.deleted) == (1, False)
    assert store.register_schema(a, "AVRO", _avro("A")) == v1
    v2 = store.register_schema(a, "AVRO", _avro("B"))
    assert (v2.version, v2.schema.schema_id > v1.schema.schema_id) == (2, True)
    # The same schema in another subject keeps its id; another type is another schema.
    other = store.register_schema(b, "AVRO", _avro("A"))
    assert (other.version, other.schema.schema_id) == (1, v1.schema.schema_id)
    as_json = store.register_schema(b, "JSON", _avro("A"))
    assert as_json.schema.schema_id not in (v1.schema.schema_id, v2.schema.schema_id)

    assert store.get_schema(v1.schema.schema_id) == v1.schema
    assert store.schema_versions(v1.schema.schema_id) == sorted([(a, 1), (b, 1)])
    assert store.subject_versions(a) == [1, 2]
    assert store.get_subject_version(a) == v2
    assert store.get_subject_version(a, 1) == v1
    assert store.find_schema(a, "AVRO", _avro("A")) == v1
    assert {a, b} <= set(store.list_subjects())

    with pytest.raises(SubjectNotFoundError, match=r"^Subject 'nope-x' not found\.$"):
        store.subject_versions("nope-x")
    with pytest.raises(VersionNotFoundError, match=r"^Version 9 not found\.$"):
        store.get_subject_version(a, 9)
    with pytest.raises(SchemaNotFoundError, match=r"^Schema not found$"):
        store.find_schema(a, "AVRO", _avro("Z"))
    with pytest.raises(SchemaNotFoundError, match=r"^Schema 999999 not found$"):
        store.get_schema(999_999)
    with pytest.raises(InvalidSubjectError):
        store.register_schema(" ", "AVRO", _avro("A"))


def check_deletes(store: SchemaStore) -> None:
    """Soft delete hides, permanent delete needs a soft delete first; an id stays bound
    to its schema after every delete."""
    s = _subject()
    v1 = store.register_schema(s, "AVRO", _avro("D1"))
    v2 = store.register_schema(s, "AVRO", _avro("D2"))
    with pytest.raises(VersionNotSoftDeletedError, match="was not deleted first"):
        store.delete_subject_version(s, 1, permanent=True)
    assert store.delete_subject_version(s, 1) == 1
    with pytest.raises(VersionSoftDeletedError, match=r"Version 1 was soft deleted\.Set"):
        store.delete_subject_version(s, 1)
    assert store.subject_versions(s) == [2]
    assert store.subject_versions(s, deleted=True) == [1, 2]
    with pytest.raises(VersionNotFoundError):
        store.get_subject_version(s, 1)
    assert store.get_subject_version(s, 1, deleted=True).deleted
    assert store.get_schema(v1.schema.schema_id) == v1.schema  # soft-deleted: still served

    # A soft-deleted schema registered again is a new version with its old id.
    again = store.register_schema(s, "AVRO", _avro("D1"))
    assert (again.version, again.schema.schema_id) == (3, v1.schema.schema_id)

    with pytest.raises(SubjectNotSoftDeletedError, match="was not deleted first"):
        store.delete_subject(s, permanent=True)
    assert store.delete_subject(s) == [2, 3]
    with pytest.raises(SubjectSoftDeletedError, match=r"was soft deleted\.Set permanent=true"):
        store.delete_subject(s)
    assert s not in store.list_subjects()
    assert s in store.list_subjects(deleted=True)
    with pytest.raises(SubjectNotFoundError):
        store.subject_versions(s)
    assert store.delete_subject(s, permanent=True) == [1, 2, 3]
    assert s not in store.list_subjects(deleted=True)
    with pytest.raises(SubjectNotFoundError):
        store.delete_subject(s)
    # Gone for good: the id is not served, yet it is never reused.
    with pytest.raises(SchemaNotFoundError):
        store.get_schema(v2.schema.schema_id)
    fresh = store.register_schema(s, "AVRO", _avro("D3"))
    assert fresh.version == 1
    assert fresh.schema.schema_id not in (v1.schema.schema_id, v2.schema.schema_id)
    assert store.register_schema(s, "AVRO", _avro("D2")).schema.schema_id == v2.schema.schema_id


def check_references(store: SchemaStore) -> None:
    """A referenced version cannot be deleted; a reference must name a live version."""
    base, user = _subject("base"), _subject("user")
    store.register_schema(base, "AVRO", _avro("Base"))
    ref = SchemaReference("Base", base, 1)
    v = store.register_schema(user, "AVRO", _avro("User"), [ref])
    assert v.schema.references == (ref,)
    assert store.get_schema(v.schema.schema_id).references == (ref,)
    assert store.find_schema(user, "AVRO", _avro("User"), [ref]) == v
    with pytest.raises(SchemaNotFoundError):  # the same text without the reference
        store.find_schema(user, "AVRO", _avro("User"))
    assert store.referenced_by(base, 1) == [v.schema.schema_id]
    with pytest.raises(ReferenceExistsError, match=r"references exist to the schema"):
        store.delete_subject_version(base, 1)
    with pytest.raises(InvalidSchemaError, match="no schema reference found"):
        store.register_schema(user, "AVRO", _avro("U2"), [SchemaReference("X", base, 7)])
    store.delete_subject(user)
    assert store.referenced_by(base, 1) == []
    store.delete_subject_version(base, 1)  # only a soft-deleted version refers to it now
    with pytest.raises(ReferenceExistsError):
        store.delete_subject_version(base, 1, permanent=True)


def check_compatibility_levels(store: SchemaStore) -> None:
    s = _subject()
    assert store.get_compatibility(s) is None
    assert store.set_compatibility("full_transitive", s) == "FULL_TRANSITIVE"
    assert store.get_compatibility(s) == "FULL_TRANSITIVE"
    with pytest.raises(InvalidCompatibilityLevelError, match=r"^Invalid compatibility level\."):
        store.set_compatibility("SIDEWAYS", s)
    assert store.delete_compatibility(s) == "FULL_TRANSITIVE"
    with pytest.raises(SubjectConfigNotFoundError, match="does not have subject-level"):
        store.delete_compatibility(s)


def check_conflict(store: SchemaStore) -> None:
    """A registration whose compatibility check saw other live versions stores nothing."""
    s = _subject()
    store.register_schema(s, "AVRO", _avro("C1"))
    with pytest.raises(SchemaConflictError):
        store.register_schema(s, "AVRO", _avro("C2"), expected_versions=[])
    assert store.subject_versions(s) == [1]
    assert store.register_schema(s, "AVRO", _avro("C2"), expected_versions=[1]).version == 2
    # A schema already live needs no check: the precondition does not apply.
    assert store.register_schema(s, "AVRO", _avro("C1"), expected_versions=[]).version == 1


SCENARIOS = (
    check_ids_and_versions,
    check_deletes,
    check_references,
    check_compatibility_levels,
    check_conflict,
)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_schema_store(coord: LocalCoordinator, scenario: object) -> None:
    assert callable(scenario)
    scenario(coord)


def test_global_level_defaults_to_backward(coord: LocalCoordinator) -> None:
    assert coord.get_compatibility() == "BACKWARD"
    assert coord.set_compatibility("NONE") == "NONE"
    assert coord.get_compatibility() == "NONE"
    assert coord.delete_compatibility() == "NONE"
    assert coord.get_compatibility() == "BACKWARD"


def test_latest_is_highest_live_version(coord: LocalCoordinator) -> None:
    s = _subject()
    for n in range(3):
        coord.register_schema(s, "AVRO", _avro(f"L{n}"))
    coord.delete_subject_version(s, LATEST)
    assert coord.get_subject_version(s).version == 2
    assert coord.get_subject_version(s, LATEST, deleted=True).version == 3


def test_concurrent_registrations_get_distinct_versions(
    coord: LocalCoordinator, db_url: str
) -> None:
    """Race: 8 threads register 8 different schemas in one subject at once. Expected: 8
    versions 1..8, each with its own id, none lost (the writer lock serialises them)."""
    s = _subject()
    run_threads(lambda n: coord.register_schema(s, "AVRO", _avro(f"R{n}")), range(8))
    sql = "SELECT version, schema_id FROM subject_versions WHERE subject = ?"
    rows = sql_rows(db_url, sql, [s])
    assert sorted(v for v, _ in rows) == list(range(1, 9))
    assert len({sid for _, sid in rows}) == 8
