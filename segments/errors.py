"""The one tree of lakelog's domain errors.

Every layer raises these; only the web layer knows HTTP, through one table in
``service/errors.py`` that maps each class to (status, Confluent error code)::

    LakelogError
    ├── StorageError                  object store and object formats
    │   ├── ObjectNotFoundError
    │   ├── PreconditionFailedError   put(if_none_match=True) on an existing key
    │   ├── StorageUnavailableError   retriable: 5xx, throttling, timeouts, resets
    │   └── CorruptSegmentError       bad magic, length or CRC; truncated object
    ├── MetadataError                 coordinator state and requests
    │   ├── TopicNotFoundError
    │   ├── PartitionNotFoundError
    │   ├── TopicExistsError
    │   ├── InvalidTopicNameError
    │   ├── InvalidPartitionsError
    │   ├── InvalidConfigError
    │   ├── CommitConflictError       same object key committed with other chunks
    │   └── CoordinatorUnavailableError  retriable: the coordinator cannot be reached
    └── RequestError                  a client's request is malformed (web layer)

``retriable`` says whether the same request may succeed if sent again unchanged.
"""

from __future__ import annotations


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


class CoordinatorUnavailableError(MetadataError):
    """The coordinator could not be reached or failed transiently."""

    retriable = True


class RequestError(LakelogError):
    """A client's request is malformed or not acceptable."""


#: Name -> class, so the coordinator's HTTP client can re-raise what the server raised.
ERRORS_BY_NAME: dict[str, type[LakelogError]] = {
    cls.__name__: cls
    for cls in (
        LakelogError,
        StorageError,
        ObjectNotFoundError,
        PreconditionFailedError,
        StorageUnavailableError,
        CorruptSegmentError,
        MetadataError,
        TopicNotFoundError,
        PartitionNotFoundError,
        TopicExistsError,
        InvalidTopicNameError,
        InvalidPartitionsError,
        InvalidConfigError,
        CommitConflictError,
        CoordinatorUnavailableError,
        RequestError,
    )
}
