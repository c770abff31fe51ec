"""The one tree of lakelog's domain errors.

Every layer raises these; only the web layer knows HTTP, through one table in
``service/errors.py`` that maps each class to (status, Confluent error code)::

    LakelogError
    ├── StorageError                  object store and object formats
    │   ├── ObjectNotFoundError
    │   ├── PreconditionFailedError   put(if_none_match=True) on an existing key
    │   ├── StorageUnavailableError   retriable: 5xx, throttling, timeouts, resets
    │   └── CorruptSegmentError       bad magic, length or CRC; truncated object
    │       └── BatchTooLargeError    a stored batch over lakelog.max.decompressed.bytes
    ├── MetadataError                 coordinator state and requests
    │   ├── TopicNotFoundError
    │   ├── PartitionNotFoundError
    │   ├── TopicExistsError
    │   ├── InvalidTopicNameError
    │   ├── InvalidPartitionsError
    │   ├── InvalidConfigError
    │   ├── CommitConflictError       same object key committed with other chunks
    │   │   └── ObjectDeletedError    the object was collected (GC): never committable
    │   ├── CoordinatorUnavailableError  retriable: the coordinator cannot be reached
    │   ├── ClusterNotFoundError      a cluster id other than ours
    │   ├── ConfigNotFoundError       a config name the topic does not have
    │   ├── BrokerNotFoundError       no live agent with that broker id
    │   ├── ReassignmentNotFoundError no reassignment of that partition (there never is one)
    │   ├── ConsumerNotFoundError     no consumer instance of that group and name
    │   ├── ConsumerExistsError       a consumer instance of that name is in the group
    │   ├── GroupNotFoundError        no consumer group of that id
    │   ├── ConsumerStateError        subscribe vs assign conflict, seek of an unassigned partition
    │   ├── StaleGenerationError      a commit from a generation the group has left behind
    │   │   ├── FencedMemberEpochError  a consumer-protocol member's epoch is not its own: rejoin
    │   │   └── StaleMemberEpochError   a commit or fetch of offsets at another member epoch
    │   ├── UnreleasedInstanceIdError a static member's instance id held by a live member
    │   ├── InvalidConsumerConfigError
    │   │   └── UnsupportedAssignorError  a server-side assignor lakelog does not have
    │   ├── InvalidTopicPatternError  a topic_pattern we cannot run (Java syntax RE2 lacks)
    │   ├── NoOffsetError             auto.offset.reset=none and no committed offset
    │   ├── OffsetOutOfRangeError     an offset beyond the partition's high watermark
    │   ├── IndexHoleError            no index entry holds an offset below the high watermark
    │   ├── ProducerFencedError       an idempotent producer's epoch is not its latest
    │   ├── GroupProtocolConflictError  a group used through the other door (REST/Kafka)
    │   ├── RebalanceInProgressError  retriable: a Kafka group is rebalancing, rejoin
    │   ├── NonEmptyGroupError        deleting a group that has members
    │   ├── JanitorBusyError          retriable: another run holds the janitor's lease
    │   ├── ProducerConflictError     retriable: a batch's sequence clashed at commit
    │   ├── TransactionError          a transactional producer's request its transaction refuses
    │   │   ├── TransactionFencedError      a newer instance of the transactional id took over
    │   │   ├── InvalidTxnStateError        not allowed in the transaction's state
    │   │   ├── ConcurrentTransactionsError retriable: the previous transaction is still ending
    │   │   ├── InvalidProducerIdMappingError  the producer id is not the transactional id's
    │   │   ├── InvalidTxnTimeoutError      a transaction timeout over the cluster's maximum
    │   │   └── TransactionalIdNotFoundError  no transaction state for that id
    │   ├── SchemaRegistryError       the schema registry's subjects, versions, schemas
    │   │   ├── SubjectNotFoundError
    │   │   ├── VersionNotFoundError
    │   │   ├── SchemaNotFoundError   no schema of that id (or none that matches)
    │   │   ├── SubjectSoftDeletedError      soft delete of a soft-deleted subject
    │   │   ├── SubjectNotSoftDeletedError   permanent delete before the soft delete
    │   │   ├── VersionSoftDeletedError
    │   │   ├── VersionNotSoftDeletedError
    │   │   ├── SubjectConfigNotFoundError   no subject-level compatibility to delete
    │   │   ├── IncompatibleSchemaError      breaks the subject's compatibility level
    │   │   ├── InvalidSchemaError           does not parse, unknown type, bad reference
    │   │   ├── InvalidVersionError          not 1..2^31-1 or "latest"
    │   │   ├── InvalidCompatibilityLevelError
    │   │   ├── InvalidSubjectError
    │   │   ├── ReferenceExistsError         a version other schemas still reference
    │   │   └── SchemaConflictError          retriable: the subject changed under a registration
    │   ├── SecurityDisabledError     ACL requests while no authorizer is configured
    │   └── SecurityError             who may connect and what each may do (issue 15)
    │       ├── AuthenticationError       a missing or bad credential (401)
    │       ├── AuthorizationError        an operation no ACL allows (403)
    │       ├── LoginThrottledError       too many failed logins lately (429, Retry-After)
    │       ├── PrincipalNotFoundError    no such user or API key
    │       ├── PrincipalExistsError      a user of that name exists
    │       └── InvalidSecurityRequestError  a bad user name, password or ACL
    ├── BufferFullError               retriable: the agent's write buffer stayed full
    ├── InternalError                 not retriable: an unexpected failure (a bug) inside lakelog
    └── RequestError                  a client's request is not acceptable (web layer)
        ├── MalformedRequestError     bad JSON, wrong JSON types, bad base64
        ├── UnsupportedMediaTypeError
        ├── NotAcceptableError        an Accept header we cannot answer
        │   └── ConsumerFormatMismatchError  Accept names another format than the consumer's
        ├── RequestTooLargeError      the request body is over the limit
        ├── RecordTooLargeError       one record is over max.message.bytes
        ├── CorruptRecordError        a producer's RecordBatch fails its checks (CRC, ...)
        ├── InvalidRecordError        a record its topic refuses (no key, compacted topic)
        ├── UnprocessableRequestError well-formed but unusable (empty records, ...)
        ├── InvalidBatchError         records:batch: empty, too many entries, ids not distinct
        ├── IdempotencyKeyMismatchError  an Idempotency-Key reused for another request
        ├── UnsupportedFormatError    a key/value that names no format (v3 without type)
        ├── KeySchemaMissingError     schema-format keys and no key_schema(_id)
        ├── ValueSchemaMissingError   schema-format values and no value_schema(_id)
        └── RecordSchemaError         a key/value that does not fit its schema

``retriable`` says whether the same request may succeed if sent again unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator


class LakelogError(Exception):
    """Base of every error lakelog raises on purpose."""

    retriable: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class StorageError(LakelogError):
    """The object store or an object's bytes."""


class ObjectNotFoundError(StorageError):
    """The key does not exist in the store."""


class PreconditionFailedError(StorageError):
    """A conditional put found the key already present."""


class StorageUnavailableError(StorageError):
    """The store could not be reached or answered with a transient failure."""

    retriable = True


class CorruptSegmentError(StorageError):
    """An object's bytes fail validation (magic, length, CRC, truncation)."""


class BatchTooLargeError(CorruptSegmentError):
    """A stored batch whose records decompress to more than its topic's
    ``lakelog.max.decompressed.bytes`` (stored before the bound, or the bound lowered
    since): readers fail that batch rather than inflate it; raising the bound reads it."""


class MetadataError(LakelogError):
    """Coordinator state or a request to it."""


class TopicNotFoundError(MetadataError):
    """No topic of that name (or id)."""


class PartitionNotFoundError(MetadataError):
    """The topic exists but has no such partition."""


class TopicExistsError(MetadataError):
    """A topic of that name already exists."""


class InvalidTopicNameError(MetadataError):
    """The name breaks Kafka's rules: [a-zA-Z0-9._-], 1-249 chars, not '.' or '..'."""


class InvalidPartitionsError(MetadataError):
    """A partition count below 1, or not above the current count when increasing."""


class InvalidConfigError(MetadataError):
    """An unknown topic config name or a value it does not accept."""


class CommitConflictError(MetadataError):
    """An object key that is already committed was committed again with other chunks."""


class ObjectDeletedError(CommitConflictError):
    """A commit of an object that garbage collection deleted (or may be deleting): an
    upload whose pending lease lapsed, or a key collected after an earlier commit. Never
    committed; not retriable as is (upload the bytes again under a new key)."""


class CoordinatorUnavailableError(MetadataError):
    """The coordinator could not be reached or failed transiently."""

    retriable = True


class PartialCommitError(CoordinatorUnavailableError):
    """A commit over sharded metadata (``coordinator.shards``) that some shards applied and
    others did not: ``base_offsets[i]`` is chunk i's base offset where its shard committed
    it, else None and ``failures[i]`` is why. Sending the same commit again is safe (the
    shards that committed answer with the same offsets)."""

    def __init__(
        self,
        message: str,
        base_offsets: list[int | None] | None = None,
        failures: list[LakelogError | None] | None = None,
    ) -> None:
        super().__init__(message)
        self.base_offsets: list[int | None] = list(base_offsets or [])
        self.failures: list[LakelogError | None] = list(failures or [])
        # Retriable unless some failure is not (a refused idempotent batch, say).
        self.retriable = all(f is None or f.retriable for f in self.failures)


class ClusterNotFoundError(MetadataError):
    """A cluster id other than this cluster's."""


class ConfigNotFoundError(MetadataError):
    """A config name the topic does not have."""


class BrokerNotFoundError(MetadataError):
    """No live agent (broker) with that id."""


class ReassignmentNotFoundError(MetadataError):
    """No reassignment is in progress for the partition (with one replica, never)."""


class ConsumerNotFoundError(MetadataError):
    """No consumer instance of that group and name."""


class ConsumerExistsError(MetadataError):
    """A consumer instance of that name already exists in the group."""


class GroupNotFoundError(MetadataError):
    """No consumer group of that id (no member and no committed offset)."""


class ConsumerStateError(MetadataError):
    """Illegal consumer state: subscribe vs assign, seek of an unassigned partition."""


class StaleGenerationError(MetadataError):
    """A commit or position update from a generation the group has moved past."""


class InvalidConsumerConfigError(MetadataError):
    """A consumer setting the instance cannot take (format, reset policy, sizes)."""


class FencedMemberEpochError(StaleGenerationError):
    """A consumer-protocol member (KIP-848) sent an epoch that is not its current one (or
    it left the group): it must rejoin at epoch 0."""


class StaleMemberEpochError(StaleGenerationError):
    """Offsets committed or fetched at a member epoch other than the member's current one."""


class UnreleasedInstanceIdError(MetadataError):
    """A static member's instance id is still held by a member that has not left."""


class UnsupportedAssignorError(InvalidConsumerConfigError):
    """A server-side assignor other than those lakelog runs (``uniform``, ``range``)."""


class InvalidTopicPatternError(MetadataError):
    """A subscription pattern that is not valid, or uses Java regex features we do not run."""


class NoOffsetError(MetadataError):
    """auto.offset.reset is none and the partition has no committed offset."""


class JanitorBusyError(MetadataError):
    """A janitor asked to run now is running elsewhere (another run holds its lease)."""

    retriable = True


class SecurityDisabledError(MetadataError):
    """An ACL request while no authorizer is configured (Kafka's SecurityDisabledException)."""


class SecurityError(MetadataError):
    """Authentication and authorization (``coordinator.security.model``)."""


class AuthenticationError(SecurityError):
    """A missing, malformed or wrong credential (Kafka's SaslAuthenticationException)."""


class AuthorizationError(SecurityError):
    """The principal may not do this (Kafka's *AuthorizationException)."""


class LoginThrottledError(SecurityError):
    """Too many failed logins for this principal or address lately (not retriable as is:
    the window must pass first; 429 with Retry-After on REST)."""


class PrincipalNotFoundError(SecurityError):
    """No user or API key of that name."""


class PrincipalExistsError(SecurityError):
    """A user of that name exists already."""


class InvalidSecurityRequestError(SecurityError):
    """A user name, password, API key or ACL that is not acceptable."""


class OffsetOutOfRangeError(MetadataError):
    """An offset outside what the partition holds (DeleteRecords past the high watermark)."""


class IndexHoleError(MetadataError):
    """A partition's index does not cover an offset between its log-start and its high
    watermark (DESIGN.md: the index is contiguous). Never expected: a bug or a damaged
    database; readers fail with it instead of waiting for records that cannot come."""


class ProducerFencedError(MetadataError):
    """An idempotent producer's epoch is older than its latest (Kafka's
    INVALID_PRODUCER_EPOCH), or its id is unknown."""


class ProducerConflictError(MetadataError):
    """An idempotent producer's batch in a commit is a duplicate, out of order or fenced
    by what another commit stored meanwhile; nothing of that commit was stored."""

    retriable = True
    #: One request's doing, even when it breaks a shared transaction: a group commit
    #: runs its requests again one by one rather than failing them all.
    request_specific = True


class TransactionError(MetadataError):
    """A transactional producer's request that its transaction's state refuses."""


class TransactionFencedError(TransactionError):
    """The transactional id was taken over by a newer producer instance (its epoch is
    newer), or the coordinator aborted the transaction on its timeout: Kafka's
    PRODUCER_FENCED. Fatal to the producer instance that gets it."""


class InvalidTxnStateError(TransactionError):
    """A transactional request not allowed in the transaction's state (a batch for a
    partition the transaction did not add, an EndTxn that contradicts the one before)."""


class ConcurrentTransactionsError(TransactionError):
    """The transactional id's previous transaction is still writing its markers: retry."""

    retriable = True


class InvalidProducerIdMappingError(TransactionError):
    """A producer id that is not the one the transactional id holds (or no such id)."""


class InvalidTxnTimeoutError(TransactionError):
    """A transaction timeout that is not positive or is over
    ``transaction.max.timeout.ms``."""


class TransactionalIdNotFoundError(TransactionError):
    """No transaction state for that transactional id."""


class GroupProtocolConflictError(MetadataError):
    """A group id in use through the other door (REST consumer instances vs Kafka
    members), or members with no assignment protocol in common (Kafka's
    INCONSISTENT_GROUP_PROTOCOL)."""


class RebalanceInProgressError(MetadataError):
    """A Kafka group is rebalancing: the member must rejoin."""

    retriable = True


class NonEmptyGroupError(MetadataError):
    """A group with members cannot be deleted."""


class BufferFullError(LakelogError):
    """The agent's write buffer stayed full for longer than the wait bound."""

    retriable = True


class InternalError(LakelogError):
    """An unexpected exception inside lakelog (a bug, not the client's input or a fault).

    Not retriable: the same request would meet the same bug, so a client must not
    retry it forever. The agent logs the traceback.
    """


class RequestError(LakelogError):
    """A client's request is not acceptable."""


class MalformedRequestError(RequestError):
    """Bad JSON, wrong JSON types, bad base64."""


class UnsupportedMediaTypeError(RequestError):
    """A Content-Type this endpoint does not take."""


class NotAcceptableError(RequestError):
    """An Accept header this endpoint cannot answer."""


class ConsumerFormatMismatchError(NotAcceptableError):
    """A fetch's Accept names an embedded format other than the consumer instance's."""


class RequestTooLargeError(RequestError):
    """The request body is larger than the configured maximum."""


class RecordTooLargeError(RequestError):
    """One record is larger than the topic's max.message.bytes."""


class CorruptRecordError(RequestError):
    """A producer's RecordBatch fails its checks: framing, magic, CRC, records (Kafka's
    CORRUPT_MESSAGE)."""


class InvalidRecordError(RequestError):
    """A well-formed record its topic does not take: one without a key on a compacted
    topic (``cleanup.policy`` with ``compact``), as Kafka's INVALID_RECORD."""


class UnprocessableRequestError(RequestError):
    """Well-formed but unusable: empty records, missing fields, ..."""


class InvalidBatchError(RequestError):
    """A v3 records:batch request that cannot be produced as a batch: no entry, more
    than the limit, ids that are not distinct 1-80 character strings."""


class IdempotencyKeyMismatchError(RequestError):
    """An ``Idempotency-Key`` the coordinator holds for a request with another body
    (or path or content type); nothing of this request was stored."""


class UnsupportedFormatError(RequestError):
    """A key or value that names no embedded format lakelog can encode."""


class KeySchemaMissingError(RequestError):
    """A schema-format request has keys but neither ``key_schema`` nor ``key_schema_id``."""


class ValueSchemaMissingError(RequestError):
    """A schema-format request has values but neither ``value_schema`` nor
    ``value_schema_id``."""


class RecordSchemaError(RequestError):
    """A key or value that does not fit its schema, or a schema the produce cannot use."""


class SchemaRegistryError(MetadataError):
    """The schema registry's state or a request to it."""


class SubjectNotFoundError(SchemaRegistryError):
    """No subject of that name (or only soft-deleted versions, unless asked for)."""


class VersionNotFoundError(SchemaRegistryError):
    """The subject has no such version."""


class SchemaNotFoundError(SchemaRegistryError):
    """No schema of that id, or the subject holds no such schema."""


class SubjectSoftDeletedError(SchemaRegistryError):
    """A soft delete of a subject whose versions are all soft-deleted already."""


class SubjectNotSoftDeletedError(SchemaRegistryError):
    """A permanent delete of a subject that still has live versions."""


class VersionSoftDeletedError(SchemaRegistryError):
    """A soft delete of a version that is soft-deleted already."""


class VersionNotSoftDeletedError(SchemaRegistryError):
    """A permanent delete of a version that was not soft-deleted first."""


class SubjectConfigNotFoundError(SchemaRegistryError):
    """The subject has no subject-level compatibility level."""


class IncompatibleSchemaError(SchemaRegistryError):
    """The new schema breaks the subject's compatibility level."""


class InvalidSchemaError(SchemaRegistryError):
    """A schema that does not parse, of an unknown type, or with a bad reference."""


class InvalidVersionError(SchemaRegistryError):
    """A version that is neither 1..2^31-1 nor ``latest``."""


class InvalidCompatibilityLevelError(SchemaRegistryError):
    """A compatibility level other than NONE, BACKWARD, FORWARD, FULL (+ _TRANSITIVE)."""


class InvalidSubjectError(SchemaRegistryError):
    """An empty subject name, or one with control characters."""


class ReferenceExistsError(SchemaRegistryError):
    """A version that other schemas reference cannot be deleted."""


class SchemaConflictError(SchemaRegistryError):
    """The subject's versions changed between a compatibility check and the registration."""

    retriable = True


def _tree(cls: type[LakelogError]) -> Iterator[type[LakelogError]]:
    yield cls
    for sub in cls.__subclasses__():
        yield from _tree(sub)


#: Name -> class of every error above, so the coordinator's HTTP client can re-raise what
#: the server raised (taken from the tree, so that no class is left out of it).
ERRORS_BY_NAME: dict[str, type[LakelogError]] = {cls.__name__: cls for cls in _tree(LakelogError)}
