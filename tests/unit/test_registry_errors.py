"""The registry door's error table: every class answered, statuses from the codes."""

from __future__ import annotations

from segments import errors as e
from service.errors import content_type_for, status_for
from service.registry.errors import (
    REGISTRY_CONTENT_TYPE,
    RegistryCode,
    is_registry_path,
    registry_code_for,
)


def test_every_error_class_has_a_registry_code_whose_status_is_real() -> None:
    for cls in e.ERRORS_BY_NAME.values():
        code = registry_code_for(cls("x"))
        assert code in set(RegistryCode), cls
        assert 400 <= status_for(code) < 600, cls


def test_registry_codes_of_the_registry_errors() -> None:
    assert registry_code_for(e.SubjectNotFoundError("x")) == 40401
    assert registry_code_for(e.VersionNotFoundError("x")) == 40402
    assert registry_code_for(e.SchemaNotFoundError("x")) == 40403
    assert registry_code_for(e.IncompatibleSchemaError("x")) == 409
    assert registry_code_for(e.InvalidSchemaError("x")) == 42201
    assert registry_code_for(e.TopicNotFoundError("x")) == 50001  # nothing of the registry's
    assert status_for(RegistryCode.INCOMPATIBLE_SCHEMA) == 409


def test_registry_paths_and_content_type() -> None:
    for path in ("/subjects", "/subjects/a/versions", "/schemas/ids/1", "/config", "/mode"):
        assert is_registry_path(path)
        assert content_type_for(path) == REGISTRY_CONTENT_TYPE
    for path in ("/topics/t", "/consumers/g", "/v3/clusters", "/", "/subjectsx"):
        assert not is_registry_path(path)
