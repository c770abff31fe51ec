"""The object-store interface. Implementations are chosen by URL scheme (see ``open_store``)."""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Iterator, Sequence
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

    def delete_many(self, keys: Sequence[str]) -> None:
        """Remove every object of ``keys`` (missing ones are no error). One call per
        key here; stores with a batch delete (S3's DeleteObjects) override it."""
        for key in keys:
            self.delete(key)

    def close(self) -> None:  # noqa: B027  (optional hook, most stores hold nothing)
        """Release clients and connections."""


def check_key(key: str) -> str:
    """Validate a key against the rules every store shares; return it unchanged.

    Keys are ``/``-separated relative paths: non-empty segments, no ``.`` or ``..``
    segment, no leading or trailing ``/``, no NUL. One rule for every store, so a
    key that works on ``memory://`` also works on ``file://`` and ``s3://``.

    Raises:
        ValueError: the key breaks a rule (a caller's bug, not a storage failure).
    """
    if not key or "\0" in key:
        raise ValueError(f"invalid object key {key!r}: empty or contains NUL")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(
                f"invalid object key {key!r}: empty, '.' or '..' segment "
                "(keys are relative and may not escape the store's root)"
            )
    return key


def check_range(start: int, length: int) -> None:
    """Reject a negative ``start`` or ``length`` for ``get_range`` (a caller's bug).

    Raises:
        ValueError: either is negative.
    """
    if start < 0 or length < 0:
        raise ValueError(f"invalid range: start={start}, length={length} (both must be >= 0)")


def _open_s3(rest: str, endpoint_url: str | None, region: str | None) -> ObjectStore:
    from segments.s3 import S3Store  # boto3 loads only for s3:// stores

    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"s3:// store URL needs a bucket: s3://{rest}")
    return S3Store(bucket, prefix, endpoint_url=endpoint_url, region=region)


def _open_file(rest: str, endpoint_url: str | None, region: str | None) -> ObjectStore:
    from segments.localfs import FileStore

    # file:///abs/path is absolute; file://./data and file://data are relative to the cwd.
    if not rest:
        raise ValueError("file:// store URL needs a path: file:///abs/path or file://./relative")
    return FileStore(rest)


def _open_memory(rest: str, endpoint_url: str | None, region: str | None) -> ObjectStore:
    from segments.memory import MemoryStore

    return MemoryStore(rest)


#: The one table: URL scheme -> opener(rest of the URL after "scheme://", endpoint, region).
_OPENERS: dict[str, Callable[[str, str | None, str | None], ObjectStore]] = {
    "s3": _open_s3,
    "file": _open_file,
    "memory": _open_memory,
}


def absolute_store_url(url: str) -> str:
    """``url`` as processes with another working directory must see it.

    ``file://./data`` and ``file://data`` become ``file:///abs/.../data``; other URLs
    are returned unchanged.
    """
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() == "file" and rest and not rest.startswith("/"):
        return f"file://{os.path.abspath(rest)}"
    return url


def open_store(
    url: str, *, endpoint_url: str | None = None, region: str | None = None
) -> ObjectStore:
    """Open a store from its URL: ``s3://bucket/prefix``, ``file:///path``, ``memory://``.

    ``endpoint_url`` and ``region`` apply to ``s3://`` only (MinIO, a moto server);
    without them boto3's standard chain decides (``AWS_ENDPOINT_URL``, ...).
    ``file://./data`` and ``file://data`` are relative to the current directory.
    Every ``memory://`` (or ``memory://name``) call returns a fresh, empty store.

    Raises:
        ValueError: the URL is malformed or its scheme is not one of the table's.
    """
    scheme, sep, rest = url.partition("://")
    opener = _OPENERS.get(scheme.lower()) if sep else None
    if opener is None:
        known = ", ".join(f"{s}://" for s in _OPENERS)
        raise ValueError(f"unsupported object store URL {url!r}: expected one of {known}")
    return opener(rest, endpoint_url, region)
