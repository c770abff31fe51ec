"""``memory://``: an object store in a dict, for tests and throwaway runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from segments.errors import ObjectNotFoundError, PreconditionFailedError
from segments.store import ObjectInfo, ObjectStore, check_key, check_range


class MemoryStore(ObjectStore):
    """A thread-safe dict of key -> (bytes, modification time); gone when the process ends."""

    def __init__(self, name: str = "") -> None:
        self.url = f"memory://{name}"
        self._lock = threading.Lock()
        self._objects: dict[str, tuple[bytes, float]] = {}

    def _entry(self, key: str) -> tuple[bytes, float]:
        check_key(key)
        with self._lock:
            entry = self._objects.get(key)
        if entry is None:
            raise ObjectNotFoundError(f"no object {key!r} in {self.url}")
        return entry

    def get(self, key: str) -> bytes:
        return self._entry(key)[0]

    def get_range(self, key: str, start: int, length: int) -> bytes:
        check_range(start, length)
        return self._entry(key)[0][start : start + length]

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> None:
        check_key(key)
        data = bytes(data)  # a caller's bytearray must not change the stored object later
        with self._lock:
            if if_none_match and key in self._objects:
                raise PreconditionFailedError(f"object {key!r} already exists in {self.url}")
            self._objects[key] = (data, time.time())

    def head(self, key: str) -> ObjectInfo:
        data, mtime = self._entry(key)
        return ObjectInfo(key, len(data), mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        with self._lock:
            snapshot = [
                (k, len(v[0]), v[1]) for k, v in self._objects.items() if k.startswith(prefix)
            ]
        for key, size, mtime in sorted(snapshot):
            yield ObjectInfo(key, size, mtime)

    def delete(self, key: str) -> None:
        check_key(key)
        with self._lock:
            self._objects.pop(key, None)
