"""The web layer's one mapping from domain errors to Confluent error responses.

Every error body is ``{"error_code": <int>, "message": <str>}``. The HTTP status
is the first three digits of ``error_code`` (3-digit codes are the status
itself), except 40001 which travels with 422 (REST-API.md §1.3).

Routers never build ``HTTPException``: they raise ``segments.errors`` classes and
``install_error_handlers`` renders them from ``ERROR_TABLE``. The handler also
renders FastAPI's request validation errors, unknown routes (404), wrong
methods (405) and unexpected exceptions (500) in the same shape.
"""

from __future__ import annotations

import logging
from enum import IntEnum, unique
from http import HTTPStatus
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from segments import errors as e
from service.registry.errors import REGISTRY_CONTENT_TYPE, is_registry_path, registry_code_for

log = logging.getLogger(__name__)

V2_CONTENT_TYPE = "application/vnd.kafka.v2+json"
V3_CONTENT_TYPE = "application/json"


@unique
class ErrorCode(IntEnum):
    """Confluent REST error codes (kafka-rest ``Errors.java``, rest-utils, Karapace)."""

    BAD_REQUEST = 400
    NOT_FOUND = 404
    METHOD_NOT_ALLOWED = 405
    NOT_ACCEPTABLE = 406
    REQUEST_TOO_LARGE = 413
    UNSUPPORTED_MEDIA_TYPE = 415
    UNPROCESSABLE_ENTITY = 422
    CONFLICT = 409
    #: A client over its quota (service.security.quotas), with Retry-After.
    TOO_MANY_REQUESTS = 429
    INTERNAL_SERVER_ERROR = 500
    #: The one exception to "first three digits are the status": sent with HTTP 422.
    INVALID_CONSUMER_CONFIG_CONSTRAINTS = 40001
    KAFKA_BAD_REQUEST = 40002
    KAFKA_AUTHENTICATION = 40101
    KAFKA_AUTHORIZATION = 40301
    TOPIC_NOT_FOUND = 40401
    PARTITION_NOT_FOUND = 40402
    #: Two meanings, as in kafka-rest and Karapace: Kafka's UnknownTopicOrPartition
    #: (v3) and "consumer instance not found" (v2). See CONSUMER_INSTANCE_NOT_FOUND.
    UNKNOWN_TOPIC_OR_PARTITION = 40403
    LEADER_NOT_AVAILABLE = 40404
    CONSUMER_GROUP_NOT_FOUND = 40405
    CONSUMER_FORMAT_MISMATCH = 40601
    SCHEMA_REGISTRY_ERROR = 40801
    CONSUMER_ALREADY_SUBSCRIBED = 40901
    CONSUMER_ALREADY_EXISTS = 40902
    ILLEGAL_STATE = 40903
    KEY_SCHEMA_MISSING = 42201
    VALUE_SCHEMA_MISSING = 42202
    JSON_CONVERSION = 42203
    INVALID_CONSUMER_CONFIG = 42204
    INVALID_SCHEMA = 42205
    PAYLOAD_ERROR = 42206
    SERIALIZATION_ERROR = 42207
    BATCH_ERROR = 42208
    #: lakelog's own: an Idempotency-Key reused with another request (issue 16).
    IDEMPOTENCY_KEY_MISMATCH = 42209
    ZOOKEEPER_ERROR = 50001
    KAFKA_ERROR = 50002
    KAFKA_RETRIABLE_ERROR = 50003
    NO_SSL_SUPPORT = 50101
    NO_SIMPLE_CONSUMER_AVAILABLE = 50301
    BROKER_NOT_AVAILABLE = 50302


#: The same number as UNKNOWN_TOPIC_OR_PARTITION (``@unique`` forbids an alias member).
CONSUMER_INSTANCE_NOT_FOUND = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def status_for(code: int) -> int:
    """The HTTP status an error code travels with."""
    if code == ErrorCode.INVALID_CONSUMER_CONFIG_CONSTRAINTS:
        return 422
    return code if code < 1000 else code // 100


class ErrorSpec(NamedTuple):
    """How one error class is answered.

    ``message`` replaces the exception's message when set (the fixed texts
    clients know from kafka-rest); ``{message}`` in it is the exception's own,
    which names what was not found. ``v3_code``/``v3_message`` apply under
    ``/v3/`` where kafka-rest answers differently (UnknownTopicOrPartition).
    """

    code: ErrorCode
    message: str | None = None
    v3_code: ErrorCode | None = None
    v3_message: str | None = None


#: kafka-rest's v3 text for UnknownTopicOrPartition, then which topic it was.
_NOT_HOSTED = "This server does not host this topic-partition. {message}"

#: The one table: every class of ``segments.errors`` -> its answer. Subclasses
#: not listed here fall back to their nearest listed ancestor (see ``spec_for``).
ERROR_TABLE: dict[type[e.LakelogError], ErrorSpec] = {
    e.LakelogError: ErrorSpec(ErrorCode.KAFKA_ERROR),
    # -- storage: never the client's fault ------------------------------------
    e.StorageError: ErrorSpec(ErrorCode.KAFKA_ERROR),
    e.ObjectNotFoundError: ErrorSpec(ErrorCode.KAFKA_ERROR),
    e.PreconditionFailedError: ErrorSpec(ErrorCode.KAFKA_ERROR),
    e.StorageUnavailableError: ErrorSpec(ErrorCode.KAFKA_RETRIABLE_ERROR),
    e.CorruptSegmentError: ErrorSpec(ErrorCode.KAFKA_ERROR),
    e.BatchTooLargeError: ErrorSpec(ErrorCode.KAFKA_ERROR),
    # -- metadata -------------------------------------------------------------
    e.MetadataError: ErrorSpec(ErrorCode.KAFKA_ERROR),
    e.TopicNotFoundError: ErrorSpec(
        ErrorCode.TOPIC_NOT_FOUND, None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, _NOT_HOSTED
    ),
    e.PartitionNotFoundError: ErrorSpec(ErrorCode.PARTITION_NOT_FOUND),
    e.TopicExistsError: ErrorSpec(ErrorCode.KAFKA_BAD_REQUEST),
    e.InvalidTopicNameError: ErrorSpec(ErrorCode.PAYLOAD_ERROR, "Invalid topic name."),
    e.InvalidPartitionsError: ErrorSpec(ErrorCode.KAFKA_BAD_REQUEST),
    e.InvalidConfigError: ErrorSpec(ErrorCode.KAFKA_BAD_REQUEST),
    e.CommitConflictError: ErrorSpec(ErrorCode.KAFKA_ERROR),
    e.ObjectDeletedError: ErrorSpec(ErrorCode.KAFKA_ERROR),
    e.CoordinatorUnavailableError: ErrorSpec(ErrorCode.KAFKA_RETRIABLE_ERROR),
    e.PartialCommitError: ErrorSpec(ErrorCode.KAFKA_RETRIABLE_ERROR),
    e.ClusterNotFoundError: ErrorSpec(ErrorCode.NOT_FOUND),
    e.ConfigNotFoundError: ErrorSpec(ErrorCode.NOT_FOUND),
    e.BrokerNotFoundError: ErrorSpec(ErrorCode.NOT_FOUND),
    e.ReassignmentNotFoundError: ErrorSpec(ErrorCode.NOT_FOUND),
    e.ConsumerNotFoundError: ErrorSpec(CONSUMER_INSTANCE_NOT_FOUND, "Consumer instance not found."),
    e.ConsumerExistsError: ErrorSpec(
        ErrorCode.CONSUMER_ALREADY_EXISTS,
        "Consumer with specified consumer ID already exists in the specified consumer group.",
    ),
    # Only v3 looks groups up; kafka-rest answers a plain 404 there.
    e.GroupNotFoundError: ErrorSpec(ErrorCode.NOT_FOUND),
    e.ConsumerStateError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    # A rebalance overtook the request: the client retries with the new assignment.
    e.StaleGenerationError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    e.FencedMemberEpochError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    e.StaleMemberEpochError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    e.UnreleasedInstanceIdError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    e.InvalidConsumerConfigError: ErrorSpec(ErrorCode.INVALID_CONSUMER_CONFIG),
    e.UnsupportedAssignorError: ErrorSpec(ErrorCode.INVALID_CONSUMER_CONFIG),
    e.InvalidTopicPatternError: ErrorSpec(ErrorCode.PAYLOAD_ERROR),
    e.NoOffsetError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    e.NonEmptyGroupError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    e.JanitorBusyError: ErrorSpec(ErrorCode.KAFKA_RETRIABLE_ERROR),
    e.SecurityDisabledError: ErrorSpec(ErrorCode.KAFKA_BAD_REQUEST),
    e.SecurityError: ErrorSpec(ErrorCode.KAFKA_BAD_REQUEST),
    e.AuthenticationError: ErrorSpec(ErrorCode.KAFKA_AUTHENTICATION),
    e.AuthorizationError: ErrorSpec(ErrorCode.KAFKA_AUTHORIZATION),
    e.LoginThrottledError: ErrorSpec(ErrorCode.TOO_MANY_REQUESTS),
    e.PrincipalNotFoundError: ErrorSpec(ErrorCode.NOT_FOUND),
    e.PrincipalExistsError: ErrorSpec(ErrorCode.CONFLICT),
    e.InvalidSecurityRequestError: ErrorSpec(ErrorCode.KAFKA_BAD_REQUEST),
    e.OffsetOutOfRangeError: ErrorSpec(ErrorCode.KAFKA_BAD_REQUEST),
    # A damaged index: never the client's fault, never worth retrying.
    e.IndexHoleError: ErrorSpec(ErrorCode.KAFKA_ERROR),
    e.ProducerFencedError: ErrorSpec(ErrorCode.KAFKA_BAD_REQUEST),
    e.ProducerConflictError: ErrorSpec(ErrorCode.KAFKA_RETRIABLE_ERROR),
    e.TransactionError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    e.TransactionFencedError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    e.InvalidTxnStateError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    e.InvalidProducerIdMappingError: ErrorSpec(ErrorCode.KAFKA_BAD_REQUEST),
    e.ConcurrentTransactionsError: ErrorSpec(ErrorCode.KAFKA_RETRIABLE_ERROR),
    e.TransactionalIdNotFoundError: ErrorSpec(ErrorCode.NOT_FOUND),
    e.InvalidTxnTimeoutError: ErrorSpec(ErrorCode.KAFKA_BAD_REQUEST),
    e.GroupProtocolConflictError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    e.RebalanceInProgressError: ErrorSpec(ErrorCode.KAFKA_RETRIABLE_ERROR),
    e.NonEmptyGroupError: ErrorSpec(ErrorCode.ILLEGAL_STATE),
    # -- the write buffer -----------------------------------------------------
    e.BufferFullError: ErrorSpec(ErrorCode.KAFKA_RETRIABLE_ERROR),
    # -- a bug: never retriable, the traceback is in the agent's log ------------
    e.InternalError: ErrorSpec(ErrorCode.INTERNAL_SERVER_ERROR),
    # -- the client's request -------------------------------------------------
    e.RequestError: ErrorSpec(ErrorCode.BAD_REQUEST),
    e.MalformedRequestError: ErrorSpec(ErrorCode.BAD_REQUEST),
    e.UnsupportedMediaTypeError: ErrorSpec(ErrorCode.UNSUPPORTED_MEDIA_TYPE),
    e.NotAcceptableError: ErrorSpec(ErrorCode.NOT_ACCEPTABLE),
    e.ConsumerFormatMismatchError: ErrorSpec(ErrorCode.CONSUMER_FORMAT_MISMATCH),
    e.RequestTooLargeError: ErrorSpec(ErrorCode.REQUEST_TOO_LARGE),
    e.RecordTooLargeError: ErrorSpec(ErrorCode.REQUEST_TOO_LARGE),
    e.CorruptRecordError: ErrorSpec(ErrorCode.BAD_REQUEST),
    e.InvalidRecordError: ErrorSpec(ErrorCode.KAFKA_BAD_REQUEST),
    e.UnprocessableRequestError: ErrorSpec(ErrorCode.PAYLOAD_ERROR),
    e.InvalidBatchError: ErrorSpec(ErrorCode.BATCH_ERROR),
    e.IdempotencyKeyMismatchError: ErrorSpec(ErrorCode.IDEMPOTENCY_KEY_MISMATCH),
    e.UnsupportedFormatError: ErrorSpec(ErrorCode.VALUE_SCHEMA_MISSING),
    e.KeySchemaMissingError: ErrorSpec(ErrorCode.KEY_SCHEMA_MISSING),
    e.ValueSchemaMissingError: ErrorSpec(ErrorCode.VALUE_SCHEMA_MISSING),
    e.RecordSchemaError: ErrorSpec(ErrorCode.INVALID_SCHEMA),
    # -- the schema registry, as the REST Proxy reports it (the registry's own door
    # answers with its own codes: service/registry/errors.py) ------------------------
    e.SchemaRegistryError: ErrorSpec(ErrorCode.SCHEMA_REGISTRY_ERROR),
    e.SubjectNotFoundError: ErrorSpec(ErrorCode.INVALID_SCHEMA),
    e.VersionNotFoundError: ErrorSpec(ErrorCode.INVALID_SCHEMA),
    e.SchemaNotFoundError: ErrorSpec(ErrorCode.INVALID_SCHEMA),
    e.SubjectSoftDeletedError: ErrorSpec(ErrorCode.SCHEMA_REGISTRY_ERROR),
    e.SubjectNotSoftDeletedError: ErrorSpec(ErrorCode.SCHEMA_REGISTRY_ERROR),
    e.VersionSoftDeletedError: ErrorSpec(ErrorCode.SCHEMA_REGISTRY_ERROR),
    e.VersionNotSoftDeletedError: ErrorSpec(ErrorCode.SCHEMA_REGISTRY_ERROR),
    e.SubjectConfigNotFoundError: ErrorSpec(ErrorCode.SCHEMA_REGISTRY_ERROR),
    # Karapace and kafka-rest: registering an incompatible schema on produce is 408 40801.
    e.IncompatibleSchemaError: ErrorSpec(ErrorCode.SCHEMA_REGISTRY_ERROR),
    e.InvalidSchemaError: ErrorSpec(ErrorCode.INVALID_SCHEMA),
    e.InvalidVersionError: ErrorSpec(ErrorCode.INVALID_SCHEMA),
    e.InvalidCompatibilityLevelError: ErrorSpec(ErrorCode.SCHEMA_REGISTRY_ERROR),
    e.InvalidSubjectError: ErrorSpec(ErrorCode.INVALID_SCHEMA),
    e.ReferenceExistsError: ErrorSpec(ErrorCode.SCHEMA_REGISTRY_ERROR),
    e.SchemaConflictError: ErrorSpec(ErrorCode.KAFKA_RETRIABLE_ERROR),
}


def spec_for(exc: e.LakelogError) -> ErrorSpec:
    """The table entry of ``exc``'s class, else of its nearest listed ancestor."""
    for cls in type(exc).__mro__:
        spec = ERROR_TABLE.get(cls)
        if spec is not None:
            return spec
    raise AssertionError("LakelogError is in the table")  # pragma: no cover


def error_code_for(exc: e.LakelogError, *, v3: bool = False) -> int:
    """The Confluent error code ``exc`` is answered with (v2 unless ``v3``)."""
    spec = spec_for(exc)
    return int(spec.v3_code if v3 and spec.v3_code is not None else spec.code)


def error_message_for(exc: e.LakelogError, *, v3: bool = False) -> str:
    """The message ``exc`` is answered with: the table's fixed text, else its own."""
    spec = spec_for(exc)
    fixed = spec.v3_message if v3 and spec.v3_message is not None else spec.message
    return exc.message if fixed is None else fixed.format(message=exc.message)


def kafka_error_code(exc: e.LakelogError) -> int:
    """kafka-rest's per-record code in v2 produce responses: 50003 if retriable, else 50002."""
    return int(ErrorCode.KAFKA_RETRIABLE_ERROR if exc.retriable else ErrorCode.KAFKA_ERROR)


# -- rendering -------------------------------------------------------------------


def is_v3(path: str) -> bool:
    return path == "/v3" or path.startswith("/v3/")


def content_type_for(path: str) -> str:
    """v2 surfaces answer ``application/vnd.kafka.v2+json``, the schema registry
    ``application/vnd.schemaregistry.v1+json``; everything else JSON."""
    if path == "/" or path.startswith(("/topics", "/brokers", "/consumers")):
        return V2_CONTENT_TYPE
    if is_registry_path(path):
        return REGISTRY_CONTENT_TYPE
    return V3_CONTENT_TYPE


def error_response(
    request: Request, code: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The one place an error body is built."""
    return JSONResponse(
        {"error_code": int(code), "message": message},
        status_code=status_for(code),
        media_type=content_type_for(request.url.path),
        headers=headers,
    )


async def _lakelog_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, e.LakelogError)
    path = request.url.path
    if is_registry_path(path):  # the registry door has its own table
        code, message = registry_code_for(exc), exc.message
    else:
        v3 = is_v3(path)
        code, message = error_code_for(exc, v3=v3), error_message_for(exc, v3=v3)
    if status_for(code) >= 500:
        log.warning("%s %s failed: %s: %s", request.method, path, type(exc).__name__, exc)
    return error_response(request, code, message)


def _validation_answer(errors: list[dict[str, Any]]) -> tuple[ErrorCode, str]:
    """Map FastAPI's validation errors to (code, message), kafka-rest style.

    A bad path parameter is a route that does not exist (404, as a non-integer
    partition is in kafka-rest); a missing body is 422 42206; malformed JSON and
    wrong JSON types are 400.
    """
    first = errors[0] if errors else {}
    loc = tuple(first.get("loc", ()))
    kind = first.get("type", "")
    if loc[:1] == ("path",):
        return ErrorCode.NOT_FOUND, "HTTP 404 Not Found"
    if kind == "json_invalid":
        return ErrorCode.BAD_REQUEST, "Bad Request: malformed JSON."
    if kind == "missing" and loc == ("body",):
        return ErrorCode.PAYLOAD_ERROR, "Payload error. Request body is empty. Data is required."
    where = ".".join(str(p) for p in loc[1:]) or str(loc[0] if loc else "request")
    detail = first.get("msg", "invalid value")
    return ErrorCode.BAD_REQUEST, f"Bad Request: {where}: {detail}"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    code, message = _validation_answer(list(exc.errors()))
    return error_response(request, code, message)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    try:
        phrase = HTTPStatus(exc.status_code).phrase
    except ValueError:
        phrase = "Error"
    # Starlette's own exceptions carry its phrase; ours (the body limit) a real message.
    message = exc.detail if exc.detail != phrase else f"HTTP {exc.status_code} {phrase}"
    return error_response(
        request,
        exc.status_code,
        message,
        headers=dict(exc.headers) if exc.headers else None,
    )


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(request, ErrorCode.INTERNAL_SERVER_ERROR, "Internal Server Error")


def install_error_handlers(app: FastAPI) -> None:
    """Render every error of ``app`` as ``{"error_code", "message"}``."""
    app.add_exception_handler(e.LakelogError, _lakelog_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
