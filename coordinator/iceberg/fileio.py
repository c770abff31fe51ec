"""pyiceberg's ``FileIO`` over a lakelog ``ObjectStore``: the tables' metadata files and
manifests are read and written with the same store (and errors) as everything else.

Locations are absolute URIs under the store's URL (``s3://bucket/prefix/iceberg/...``,
``file:///data/iceberg/...``, ``memory://name/iceberg/...``); the key is what follows
the store URL. A location outside the store is a caller's error (ValueError).
"""

from __future__ import annotations

import io
from types import TracebackType

from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile, OutputStream

from segments.errors import ObjectNotFoundError, PreconditionFailedError
from segments.store import ObjectStore, absolute_store_url


def store_root(store: ObjectStore) -> str:
    """The URI every key of ``store`` is under (no trailing slash)."""
    return absolute_store_url(store.url).rstrip("/")


class _Reader(io.BytesIO):
    """A whole object in memory (metadata files and manifests are small)."""


class _InputFile(InputFile):
    def __init__(self, fio: StoreFileIO, location: str) -> None:
        super().__init__(location)
        self._fio = fio
        self._key = fio.key(location)
        self._data: bytes | None = None

    def _bytes(self) -> bytes:
        if self._data is None:
            try:
                self._data = self._fio.store.get(self._key)
            except ObjectNotFoundError as e:
                raise FileNotFoundError(self.location) from e
        return self._data

    def __len__(self) -> int:
        return len(self._bytes())

    def exists(self) -> bool:
        try:
            self._fio.store.head(self._key)
        except ObjectNotFoundError:
            return False
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return _Reader(self._bytes())


class _Writer(io.BytesIO):
    """Buffers a file and PUTs it whole on close (if-none-match unless overwriting)."""

    def __init__(self, store: ObjectStore, key: str, overwrite: bool) -> None:
        super().__init__()
        self._store = store
        self._key = key
        self._overwrite = overwrite
        self._done = False

    def close(self) -> None:
        if not self._done:
            self._done = True
            try:
                self._store.put(self._key, self.getvalue(), if_none_match=not self._overwrite)
            except PreconditionFailedError as e:
                raise FileExistsError(self._key) from e
        super().close()

    def __exit__(
        self,
        exctype: type[BaseException] | None,
        excinst: BaseException | None,
        exctb: TracebackType | None,
    ) -> None:
        if exctype is None:
            self.close()
        else:
            self._done = True  # a failed write leaves nothing
            super().close()


class _OutputFile(OutputFile):
    def __init__(self, fio: StoreFileIO, location: str) -> None:
        super().__init__(location)
        self._fio = fio
        self._key = fio.key(location)

    def __len__(self) -> int:
        return self._fio.store.head(self._key).size

    def exists(self) -> bool:
        return _InputFile(self._fio, self.location).exists()

    def to_input_file(self) -> InputFile:
        return _InputFile(self._fio, self.location)

    def create(self, overwrite: bool = False) -> OutputStream:
        return _Writer(self._fio.store, self._key, overwrite)


class StoreFileIO(FileIO):
    """``FileIO`` whose locations are keys of ``store`` (see the module docstring)."""

    def __init__(self, store: ObjectStore) -> None:
        super().__init__({})
        self.store = store
        self.root = store_root(store)

    def key(self, location: str) -> str:
        """The store key of an absolute location under the store's root.

        Raises:
            ValueError: the location is outside the store.
        """
        prefix = self.root + "/"
        if not location.startswith(prefix):
            raise ValueError(f"{location!r} is not in the store {self.root!r}")
        return location[len(prefix) :]

    def location(self, key: str) -> str:
        return f"{self.root}/{key}"

    def new_input(self, location: str) -> InputFile:
        return _InputFile(self, location)

    def new_output(self, location: str) -> OutputFile:
        return _OutputFile(self, location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        where = location if isinstance(location, str) else location.location
        self.store.delete(self.key(where))
