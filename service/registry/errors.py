"""The schema registry door's one table from our errors to Confluent Schema Registry codes.

The registry answers in the same body shape as the REST Proxy
(``{"error_code": 40401, "message": "Subject 'x' not found."}``) but with the
registry's own codes and ``application/vnd.schemaregistry.v1+json``: the same
``SchemaNotFoundError`` is 40403 here and 42205 on REST produce
(``service/errors.py``). ``service.errors`` picks this table for the
registry's paths (:func:`is_registry_path`).
"""

from __future__ import annotations

from enum import IntEnum, unique

from segments import errors as e

REGISTRY_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

#: First path segments of the registry API (none of them is a REST Proxy path).
REGISTRY_ROOTS = ("subjects", "schemas", "config", "compatibility", "mode")


@unique
class RegistryCode(IntEnum):
    """Confluent Schema Registry error codes (its ``Errors`` class)."""

    BAD_REQUEST = 400
    NOT_FOUND = 404
    UNSUPPORTED_MEDIA_TYPE = 415
    UNPROCESSABLE_ENTITY = 422
    INCOMPATIBLE_SCHEMA = 409
    SUBJECT_NOT_FOUND = 40401
    VERSION_NOT_FOUND = 40402
    SCHEMA_NOT_FOUND = 40403
    SUBJECT_SOFT_DELETED = 40404
    SUBJECT_NOT_SOFT_DELETED = 40405
    SCHEMA_VERSION_SOFT_DELETED = 40406
    SCHEMA_VERSION_NOT_SOFT_DELETED = 40407
    SUBJECT_COMPATIBILITY_NOT_CONFIGURED = 40408
    INVALID_SCHEMA = 42201
    INVALID_VERSION = 42202
    INVALID_COMPATIBILITY_LEVEL = 42203
    REFERENCE_EXISTS = 42206
    INVALID_SUBJECT = 42208
    STORE_ERROR = 50001
    OPERATION_TIMEOUT = 50002


#: Every error class the registry answers specially; others take their nearest
#: listed ancestor's code (``registry_code_for``).
REGISTRY_TABLE: dict[type[e.LakelogError], RegistryCode] = {
    e.LakelogError: RegistryCode.STORE_ERROR,
    e.SubjectNotFoundError: RegistryCode.SUBJECT_NOT_FOUND,
    e.VersionNotFoundError: RegistryCode.VERSION_NOT_FOUND,
    e.SchemaNotFoundError: RegistryCode.SCHEMA_NOT_FOUND,
    e.SubjectSoftDeletedError: RegistryCode.SUBJECT_SOFT_DELETED,
    e.SubjectNotSoftDeletedError: RegistryCode.SUBJECT_NOT_SOFT_DELETED,
    e.VersionSoftDeletedError: RegistryCode.SCHEMA_VERSION_SOFT_DELETED,
    e.VersionNotSoftDeletedError: RegistryCode.SCHEMA_VERSION_NOT_SOFT_DELETED,
    e.SubjectConfigNotFoundError: RegistryCode.SUBJECT_COMPATIBILITY_NOT_CONFIGURED,
    e.IncompatibleSchemaError: RegistryCode.INCOMPATIBLE_SCHEMA,
    e.InvalidSchemaError: RegistryCode.INVALID_SCHEMA,
    e.InvalidVersionError: RegistryCode.INVALID_VERSION,
    e.InvalidCompatibilityLevelError: RegistryCode.INVALID_COMPATIBILITY_LEVEL,
    e.ReferenceExistsError: RegistryCode.REFERENCE_EXISTS,
    e.InvalidSubjectError: RegistryCode.INVALID_SUBJECT,
    e.SchemaConflictError: RegistryCode.OPERATION_TIMEOUT,
    e.RequestError: RegistryCode.BAD_REQUEST,
    e.MalformedRequestError: RegistryCode.BAD_REQUEST,
    e.UnsupportedMediaTypeError: RegistryCode.UNSUPPORTED_MEDIA_TYPE,
    e.UnprocessableRequestError: RegistryCode.UNPROCESSABLE_ENTITY,
}


def is_registry_path(path: str) -> bool:
    """Whether ``path`` belongs to the registry API (served on the agent's port)."""
    first = path.lstrip("/").split("/", 1)[0]
    return first in REGISTRY_ROOTS


def registry_code_for(exc: e.LakelogError) -> int:
    """The registry error code of ``exc``: its class's entry, else its nearest ancestor's."""
    for cls in type(exc).__mro__:
        code = REGISTRY_TABLE.get(cls)
        if code is not None:
            return int(code)
    return int(RegistryCode.STORE_ERROR)  # pragma: no cover - LakelogError is listed
