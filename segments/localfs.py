"""``file://``: an object store in a local directory (the embedded default ``file://./data``).

Keys map to paths under the root: ``segments/ab/01J.seg`` -> ``<root>/segments/ab/01J.seg``.
A write goes to a temporary file in the target's directory, is fsynced, then renamed over
the final name (``os.replace``), and the directory is fsynced: a reader sees the whole
object or none of it, and a crash mid-write leaves at worst an invisible temporary file.
A conditional write hard-links the temporary file to the final name instead, which fails
atomically if the name exists, so exactly one of many racing writers wins.

Objects are readable by their owner only (files 0600, directories 0700): the records
are the users' data, whoever else shares the machine.

Temporary files start with ``.lakelog-tmp-``; ``list`` skips them and keys may not use
that prefix in any segment. A key cannot be both an object and a "directory" of other
keys (``a`` and ``a/b``): the file system cannot hold both; lakelog's layouts never do.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

from segments.errors import ObjectNotFoundError, PreconditionFailedError, StorageError
from segments.store import ObjectInfo, ObjectStore, check_key, check_range

_TMP_PREFIX = ".lakelog-tmp-"

# What the OS says when a key names nothing readable: no file, a directory, or a path
# through a file (key "a/b" when "a" is an object).
_MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)


class FileStore(ObjectStore):
    """Objects as files under one root directory, created if missing."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root).absolute()
        self.url = f"file://{self._root}"
        try:
            self._root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create store root {self._root}: {e}") from e

    @property
    def root(self) -> Path:
        return self._root

    def _path(self, key: str) -> Path:
        check_key(key)
        parts = key.split("/")
        if any(p.startswith(_TMP_PREFIX) for p in parts):
            raise ValueError(f"invalid object key {key!r}: {_TMP_PREFIX!r} is reserved")
        return self._root.joinpath(*parts)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            with path.open("rb") as f:
                return f.read()
        except _MISSING as e:
            raise ObjectNotFoundError(f"no object {key!r} in {self.url}") from e
        except OSError as e:
            raise StorageError(f"cannot read {key!r} in {self.url}: {e}") from e

    def get_range(self, key: str, start: int, length: int) -> bytes:
        check_range(start, length)
        path = self._path(key)
        try:
            with path.open("rb") as f:
                f.seek(start)
                return f.read(length)
        except _MISSING as e:
            raise ObjectNotFoundError(f"no object {key!r} in {self.url}") from e
        except OSError as e:
            raise StorageError(f"cannot read {key!r} in {self.url}: {e}") from e

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> None:
        path = self._path(key)
        parent = path.parent
        tmp = parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        tmp_exists = False
        try:
            self._makedirs(parent)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            tmp_exists = True
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            if if_none_match:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise PreconditionFailedError(
                        f"object {key!r} already exists in {self.url}"
                    ) from None
            else:
                os.replace(tmp, path)
                tmp_exists = False
            _fsync_dir(parent)
        except OSError as e:
            raise StorageError(f"cannot write {key!r} in {self.url}: {e}") from e
        finally:
            if tmp_exists:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def head(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            st = path.stat()
        except _MISSING as e:
            raise ObjectNotFoundError(f"no object {key!r} in {self.url}") from e
        except OSError as e:
            raise StorageError(f"cannot stat {key!r} in {self.url}: {e}") from e
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFoundError(f"no object {key!r} in {self.url}")
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # Start in the deepest directory the prefix names in full; "segments/ab" starts in
        # "segments" and keeps "ab..." entries only.
        base, _, _ = prefix.rpartition("/")
        if base and any(p in ("", ".", "..") for p in base.split("/")):
            return  # no valid key has such a segment, so none can match
        directory = self._root.joinpath(*base.split("/")) if base else self._root
        yield from self._walk(directory, f"{base}/" if base else "", prefix)

    def _walk(self, directory: Path, key_prefix: str, prefix: str) -> Iterator[ObjectInfo]:
        try:
            with os.scandir(directory) as it:
                # Sorting "name/" for directories and "name" for files gives exactly the
                # order of the full keys: every key under a directory starts with "name/".
                entries = sorted(
                    (f"{e.name}/" if e.is_dir() else e.name, e)
                    for e in it
                    if not e.name.startswith(_TMP_PREFIX)
                )
        except _MISSING:
            return
        except OSError as e:
            raise StorageError(f"cannot list {directory} in {self.url}: {e}") from e
        for name, entry in entries:
            key = key_prefix + name
            if name.endswith("/"):
                if key.startswith(prefix) or prefix.startswith(key):
                    yield from self._walk(Path(entry.path), key, prefix)
            elif key.startswith(prefix):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue  # deleted while we listed
                except OSError as e:
                    raise StorageError(f"cannot stat {key!r} in {self.url}: {e}") from e
                yield ObjectInfo(key, st.st_size, st.st_mtime)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except _MISSING:
            pass
        except OSError as e:
            raise StorageError(f"cannot delete {key!r} in {self.url}: {e}") from e
        # Empty directories stay: removing them would race with a put creating a file there.

    def _makedirs(self, directory: Path) -> None:
        """Create ``directory`` and missing ancestors, fsyncing each new entry's parent."""
        missing: list[Path] = []
        d = directory
        while not d.is_dir():
            missing.append(d)
            d = d.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):  # a concurrent put made it first
                d.mkdir(mode=0o700)
            _fsync_dir(d.parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(directory: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
