"""The Confluent Schema Registry API, served by every agent on its REST port.

Same port as the REST Proxy: the registry's paths (``/subjects``, ``/schemas``,
``/config``, ``/compatibility``, ``/mode``) collide with none of the proxy's, so one
listener, one load balancer and one health check serve both; clients set
``schema.registry.url`` to the agent's URL. Answers are
``application/vnd.schemaregistry.v1+json``; errors use the registry's codes
(``service.registry.errors``).

Requests take ``application/vnd.schemaregistry.v1+json``,
``application/vnd.schemaregistry+json``, ``application/json``,
``application/octet-stream`` or no Content-Type; anything else is 415. Query
flags (``deleted``, ``permanent``, ``verbose``, ...) accept ``true``/``True``/``1``.
``normalize`` is accepted and ignored (schemas are stored in canonical form).
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request, Response

from coordinator.schemas.model import (
    LATEST,
    SCHEMA_TYPES,
    SchemaReference,
    StoredSchema,
    SubjectVersion,
)
from coordinator.schemas.store import check_level, check_subject
from segments.errors import (
    InvalidSchemaError,
    InvalidVersionError,
    MalformedRequestError,
    SubjectConfigNotFoundError,
    UnsupportedMediaTypeError,
)
from service.registry.core import SchemaRegistry
from service.registry.errors import REGISTRY_CONTENT_TYPE
from service.registry.protobuf_format import ProtobufSchema
from service.state import StateDep

router = APIRouter(tags=["schema registry"])

_REQUEST_TYPES = frozenset(
    {
        "application/vnd.schemaregistry.v1+json",
        "application/vnd.schemaregistry+json",
        "application/json",
        "application/octet-stream",
    }
)
_MAX_VERSION = 2**31 - 1


def _registry(state: StateDep) -> SchemaRegistry:
    return state.registry


Registry = Annotated[SchemaRegistry, Depends(_registry)]


def _answer(payload: Any) -> Response:
    return Response(orjson.dumps(payload), media_type=REGISTRY_CONTENT_TYPE)


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "").strip().lower() in ("true", "1")


def _version(raw: str) -> int:
    """``latest``, ``-1`` or 1..2^31-1. Raises InvalidVersionError (42202)."""
    if raw == "latest" or raw == "-1":
        return LATEST
    if raw.isdigit() and 1 <= int(raw) <= _MAX_VERSION:
        return int(raw)
    raise InvalidVersionError(
        f"The specified version '{raw}' is not a valid version id. Allowed values are "
        'between [1, 2^31-1] and the string "latest"'
    )


async def _body(request: Request) -> dict[str, Any]:
    header = request.headers.get("content-type")
    if header and header.split(";", 1)[0].strip().lower() not in _REQUEST_TYPES:
        raise UnsupportedMediaTypeError("HTTP 415 Unsupported Media Type")
    raw = await request.body()
    try:
        doc = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        raise MalformedRequestError("Unexpected character: malformed JSON") from None
    if not isinstance(doc, dict):
        raise MalformedRequestError("The request body must be a JSON object")
    return doc


async def _schema_body(request: Request) -> tuple[str, str, tuple[SchemaReference, ...]]:
    """(schemaType, schema, references) of a registration, lookup or compatibility body.

    Raises:
        InvalidSchemaError: no schema, an unknown schemaType or malformed references (42201).
    """
    doc = await _body(request)
    text = doc.get("schema")
    if not isinstance(text, str) or not text.strip():
        raise InvalidSchemaError("Empty schema")
    schema_type = doc.get("schemaType") or "AVRO"
    if not isinstance(schema_type, str) or schema_type.upper() not in SCHEMA_TYPES:
        raise InvalidSchemaError(f"Invalid schema type {schema_type}")
    refs = []
    for ref in doc.get("references") or []:
        if (
            not isinstance(ref, dict)
            or not isinstance(ref.get("name"), str)
            or not isinstance(ref.get("subject"), str)
            or type(ref.get("version")) is not int
        ):
            raise InvalidSchemaError(
                'Invalid schema: each reference is {"name": str, "subject": str, "version": int}'
            )
        refs.append(SchemaReference(ref["name"], ref["subject"], ref["version"]))
    return schema_type.upper(), text, tuple(refs)


async def _schema_text(registry: SchemaRegistry, stored: StoredSchema, fmt: str | None) -> str:
    """The schema as stored, or a Protobuf one as base64 descriptor (``format=serialized``)."""
    if fmt == "serialized" and stored.schema_type == "PROTOBUF":
        _, parsed = await registry.by_id(stored.schema_id)
        assert isinstance(parsed, ProtobufSchema)
        return parsed.serialized()
    return stored.schema


async def _schema_json(
    registry: SchemaRegistry, stored: StoredSchema, fmt: str | None
) -> dict[str, Any]:
    """The fields every schema answer shares; Avro's type and empty references are left
    out, as Confluent does."""
    out: dict[str, Any] = {}
    if stored.schema_type != "AVRO":
        out["schemaType"] = stored.schema_type
    if stored.references:
        out["references"] = [
            {"name": r.name, "subject": r.subject, "version": r.version} for r in stored.references
        ]
    out["schema"] = await _schema_text(registry, stored, fmt)
    return out


async def _version_json(
    registry: SchemaRegistry, sv: SubjectVersion, fmt: str | None
) -> dict[str, Any]:
    body = {"subject": sv.subject, "version": sv.version, "id": sv.schema.schema_id}
    body.update(await _schema_json(registry, sv.schema, fmt))
    return body


async def _subject_version(
    registry: SchemaRegistry, subject: str, version: str, request: Request
) -> SubjectVersion:
    """``subject``'s ``version`` (``deleted=true``: soft-deleted ones too)."""
    return await registry.call(
        registry.store.get_subject_version,
        subject,
        _version(version),
        deleted=_flag(request, "deleted"),
    )


# -- schemas ---------------------------------------------------------------------------


@router.get("/schemas/types", summary="Schema types this registry supports")
async def schema_types() -> Response:
    return _answer(list(SCHEMA_TYPES))


@router.get("/schemas/ids/{schema_id}", summary="A schema by its global id")
async def get_schema(schema_id: int, request: Request, registry: Registry) -> Response:
    stored, _ = await registry.by_id(schema_id)
    fmt = request.query_params.get("format")
    return _answer(await _schema_json(registry, stored, fmt))


@router.get("/schemas/ids/{schema_id}/schema", summary="A schema's text by its global id")
async def get_schema_text(schema_id: int, request: Request, registry: Registry) -> Response:
    stored, _ = await registry.by_id(schema_id)
    text = await _schema_text(registry, stored, request.query_params.get("format"))
    return Response(text, media_type=REGISTRY_CONTENT_TYPE)


@router.get("/schemas/ids/{schema_id}/versions", summary="Subject versions holding a schema")
async def get_schema_versions(schema_id: int, request: Request, registry: Registry) -> Response:
    uses = await registry.call(
        registry.store.schema_versions, schema_id, deleted=_flag(request, "deleted")
    )
    return _answer([{"subject": s, "version": v} for s, v in uses])


@router.get("/schemas/ids/{schema_id}/subjects", summary="Subjects holding a schema")
async def get_schema_subjects(schema_id: int, request: Request, registry: Registry) -> Response:
    uses = await registry.call(
        registry.store.schema_versions, schema_id, deleted=_flag(request, "deleted")
    )
    return _answer(list(dict.fromkeys(s for s, _ in uses)))


# -- subjects --------------------------------------------------------------------------


@router.get("/subjects", summary="Subjects")
async def list_subjects(request: Request, registry: Registry) -> Response:
    subjects = await registry.call(registry.store.list_subjects, deleted=_flag(request, "deleted"))
    prefix = request.query_params.get("subjectPrefix", "")
    return _answer([s for s in subjects if s.startswith(prefix)])


@router.get("/subjects/{subject}/versions", summary="A subject's versions")
async def list_versions(subject: str, request: Request, registry: Registry) -> Response:
    versions = await registry.call(
        registry.store.subject_versions, subject, deleted=_flag(request, "deleted")
    )
    return _answer(versions)


@router.post("/subjects/{subject}/versions", summary="Register a schema under a subject")
async def register(subject: str, request: Request, registry: Registry) -> Response:
    """``{"id": N}``: the schema's global id (its existing one if it was registered before)."""
    check_subject(subject)
    schema_type, text, refs = await _schema_body(request)
    sv, _ = await registry.register(subject, schema_type, text, refs)
    return _answer({"id": sv.schema.schema_id})


@router.get("/subjects/{subject}/versions/{version}", summary="One version of a subject")
async def get_version(subject: str, version: str, request: Request, registry: Registry) -> Response:
    sv = await _subject_version(registry, subject, version, request)
    return _answer(await _version_json(registry, sv, request.query_params.get("format")))


@router.get("/subjects/{subject}/versions/{version}/schema", summary="A version's schema text")
async def get_version_text(
    subject: str, version: str, request: Request, registry: Registry
) -> Response:
    sv = await _subject_version(registry, subject, version, request)
    text = await _schema_text(registry, sv.schema, request.query_params.get("format"))
    return Response(text, media_type=REGISTRY_CONTENT_TYPE)


@router.get(
    "/subjects/{subject}/versions/{version}/referencedby",
    summary="Ids of the schemas that reference a version",
)
async def referenced_by(subject: str, version: str, registry: Registry) -> Response:
    return _answer(await registry.call(registry.store.referenced_by, subject, _version(version)))


@router.post("/subjects/{subject}", summary="Look a schema up under a subject")
async def lookup(subject: str, request: Request, registry: Registry) -> Response:
    schema_type, text, refs = await _schema_body(request)
    sv = await registry.lookup(subject, schema_type, text, refs, deleted=_flag(request, "deleted"))
    return _answer(await _version_json(registry, sv, request.query_params.get("format")))


@router.delete("/subjects/{subject}", summary="Delete a subject (soft, or permanent)")
async def delete_subject(subject: str, request: Request, registry: Registry) -> Response:
    versions = await registry.call(
        registry.store.delete_subject, subject, permanent=_flag(request, "permanent")
    )
    return _answer(versions)


@router.delete("/subjects/{subject}/versions/{version}", summary="Delete one version")
async def delete_version(
    subject: str, version: str, request: Request, registry: Registry
) -> Response:
    deleted = await registry.call(
        registry.store.delete_subject_version,
        subject,
        _version(version),
        permanent=_flag(request, "permanent"),
    )
    return _answer(deleted)


# -- compatibility -----------------------------------------------------------------------


async def _compatibility(
    subject: str, version: int | None, request: Request, registry: SchemaRegistry
) -> Response:
    verbose = _flag(request, "verbose")
    schema_type, text, refs = await _schema_body(request)
    try:
        parsed = await registry.parse(schema_type, text, refs)
    except InvalidSchemaError as e:
        if not verbose:
            raise
        # Confluent answers a verbose check of a schema that does not parse with the reason.
        return _answer({"is_compatible": False, "messages": [e.message]})
    problems, _ = await registry.check(subject, parsed, version)
    body: dict[str, Any] = {"is_compatible": not problems}
    if verbose:
        body["messages"] = problems
    return _answer(body)


@router.post(
    "/compatibility/subjects/{subject}/versions/{version}",
    summary="Test a schema against one version",
)
async def test_compatibility(
    subject: str, version: str, request: Request, registry: Registry
) -> Response:
    return await _compatibility(subject, _version(version), request, registry)


@router.post(
    "/compatibility/subjects/{subject}/versions",
    summary="Test a schema against the versions the subject's level names",
)
async def test_compatibility_all(subject: str, request: Request, registry: Registry) -> Response:
    return await _compatibility(subject, None, request, registry)


# -- config and mode ---------------------------------------------------------------------


async def _set_compatibility(
    request: Request, registry: SchemaRegistry, subject: str | None
) -> Response:
    """Set the level of ``subject`` (None: the global one) from the body's
    ``compatibility``."""
    wanted = check_level((await _body(request)).get("compatibility"))
    level = await registry.call(registry.store.set_compatibility, wanted, subject)
    return _answer({"compatibility": level})


@router.get("/config", summary="The global compatibility level")
async def get_global_config(registry: Registry) -> Response:
    level = await registry.call(registry.store.get_compatibility, None)
    return _answer({"compatibilityLevel": level})


@router.put("/config", summary="Set the global compatibility level")
async def put_global_config(request: Request, registry: Registry) -> Response:
    return await _set_compatibility(request, registry, None)


@router.delete("/config", summary="Reset the global compatibility level")
async def delete_global_config(registry: Registry) -> Response:
    level = await registry.call(registry.store.delete_compatibility, None)
    return _answer({"compatibilityLevel": level})


@router.get("/config/{subject}", summary="A subject's compatibility level")
async def get_subject_config(subject: str, request: Request, registry: Registry) -> Response:
    """40408 unless the subject has its own level, or ``defaultToGlobal=true``."""
    level = await registry.call(registry.store.get_compatibility, subject)
    if level is None:
        if not _flag(request, "defaultToGlobal"):
            raise SubjectConfigNotFoundError(
                f"Subject '{subject}' does not have subject-level compatibility configured"
            )
        level = await registry.call(registry.store.get_compatibility, None)
    return _answer({"compatibilityLevel": level})


@router.put("/config/{subject}", summary="Set a subject's compatibility level")
async def put_subject_config(subject: str, request: Request, registry: Registry) -> Response:
    return await _set_compatibility(request, registry, subject)


@router.delete("/config/{subject}", summary="Drop a subject's compatibility level")
async def delete_subject_config(subject: str, registry: Registry) -> Response:
    level = await registry.call(registry.store.delete_compatibility, subject)
    return _answer({"compatibilityLevel": level})


@router.get("/mode", summary="The registry's mode (always READWRITE)")
async def get_mode() -> Response:
    return _answer({"mode": "READWRITE"})


@router.get("/mode/{subject}", summary="A subject's mode (always READWRITE)")
async def get_subject_mode(subject: str) -> Response:
    return _answer({"mode": "READWRITE"})
