"""The object-store interface. Implementations are chosen by URL scheme (see ``open_store``)."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: float  # epoch seconds


class ObjectStore(abc.ABC):
    """Keys are relative to the store's root (bucket + prefix, directory, ...).

    Every implementation raises only errors from ``segments.errors``:
    ``ObjectNotFoundError`` for a missing key, ``PreconditionFailedError`` when
    ``put(..., if_none_match=True)`` finds the key present,
    ``StorageUnavailableError`` for transient failures that survived the retries.
    """

    url: str

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object. Raises ObjectNotFoundError."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes [start, start + length); shorter only if the object ends first.

        Raises ObjectNotFoundError.
        """

    @abc.abstractmethod
    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> None:
        """Write the whole object atomically: readers see all of it or none.

        With ``if_none_match`` raise PreconditionFailedError if the key exists.
        """

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size and modification time. Raises ObjectNotFoundError."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error."""

    def close(self) -> None:  # noqa: B027  (optional hook, most stores hold nothing)
        """Release clients and connections."""


def open_store(url: str, *, endpoint_url: str | None = None, region: str | None = None) -> ObjectStore:
    """Open a store from its URL: ``s3://bucket/prefix``, ``file:///path``, ``memory://``.

    ``endpoint_url`` and ``region`` apply to ``s3://`` only (MinIO, a moto server);
    without them boto3's standard chain decides (``AWS_ENDPOINT_URL``, ...).
    """
    raise NotImplementedError  # filled in by the store implementations
