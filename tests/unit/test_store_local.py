"""open_store's scheme table, and what only the file store must get right: atomic writes,
a root nothing escapes, and one winner among racing conditional writers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from segments.errors import ObjectNotFoundError, PreconditionFailedError, StorageError
from segments.localfs import FileStore
from segments.memory import MemoryStore
from segments.s3 import S3Store
from segments.store import ObjectStore, open_store
from tests.threads import run_threads

REPO = Path(__file__).resolve().parents[2]


def tmp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".lakelog-tmp-")]


# --- open_store --------------------------------------------------------------------------------


def test_open_store_memory() -> None:
    a, b = open_store("memory://"), open_store("memory://named")
    assert isinstance(a, MemoryStore)
    assert isinstance(b, MemoryStore)
    assert b.url == "memory://named"
    a.put("k", b"v")
    with pytest.raises(ObjectNotFoundError):
        b.get("k")  # each call is a fresh store


def test_open_store_file_absolute(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/abs")
    assert isinstance(store, FileStore)
    assert store.root == tmp_path / "abs"
    store.put("x/y", b"1")
    assert (tmp_path / "abs" / "x" / "y").read_bytes() == b"1"


@pytest.mark.parametrize(("url", "rel"), [("file://./data", "data"), ("file://rel/dir", "rel/dir")])
def test_open_store_file_relative_to_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, rel: str
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store(url)
    assert isinstance(store, FileStore)
    store.put("k", b"v")
    assert (tmp_path / rel / "k").read_bytes() == b"v"
    assert store.url == f"file://{tmp_path / rel}"


def test_open_store_s3_parses_bucket_and_prefix() -> None:
    store = open_store("s3://my-bucket/some/prefix/", endpoint_url="http://127.0.0.1:1")
    try:
        assert isinstance(store, S3Store)
        assert store.bucket == "my-bucket"
        assert store.url == "s3://my-bucket/some/prefix"
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("gs://bucket/x", "unsupported object store URL 'gs://bucket/x'"),
        ("/just/a/path", "expected one of s3://, file://, memory://"),
        ("s3:///prefix", "needs a bucket"),
        ("file://", "needs a path"),
    ],
)
def test_open_store_rejects_bad_urls(url: str, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        open_store(url)
    assert needle in str(info.value)


# --- file store: atomic writes -----------------------------------------------------------------


def test_file_put_failing_after_temp_write_leaves_nothing_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename fails after the temp file is written: no object, no temp file, old bytes kept."""
    store = FileStore(tmp_path)
    store.put("seg/old", b"old bytes")

    def failing_replace(src: object, dst: object) -> None:
        assert any(tmp_files(tmp_path)), "the temp file exists when the rename is attempted"
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(StorageError, match="No space left"):
        store.put("seg/new", b"new bytes")
    with pytest.raises(StorageError):
        store.put("seg/old", b"replacement")
    monkeypatch.undo()

    with pytest.raises(ObjectNotFoundError):
        store.get("seg/new")
    assert store.get("seg/old") == b"old bytes"
    assert [i.key for i in store.list()] == ["seg/old"]
    assert tmp_files(tmp_path) == []


def test_file_crash_mid_write_leaves_no_partial_object(tmp_path: Path) -> None:
    """A process killed between writing the temp file and renaming it: the temp file stays on
    disk, yet get() finds no object, list() shows none, and the key can be written later."""
    script = textwrap.dedent(
        f"""
        import os
        from segments import localfs
        store = localfs.FileStore({str(tmp_path)!r})
        os.replace = lambda src, dst: os._exit(9)  # die just before the rename
        store.put("segments/ab/crash.seg", b"x" * 100_000)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True)
    assert proc.returncode == 9, proc.stderr.decode()
    leftovers = tmp_files(tmp_path)
    assert len(leftovers) == 1 and leftovers[0].stat().st_size == 100_000

    store = FileStore(tmp_path)
    with pytest.raises(ObjectNotFoundError):
        store.get("segments/ab/crash.seg")
    assert list(store.list()) == []
    assert list(store.list("segments/ab/")) == []
    store.put("segments/ab/crash.seg", b"retried", if_none_match=True)
    assert [i.key for i in store.list()] == ["segments/ab/crash.seg"]


def test_file_readers_never_see_a_partial_overwrite(tmp_path: Path) -> None:
    """Race: readers get() while a writer overwrites one key with 1 MiB of 'a' then of 'b'.
    Expected: every read is one whole value, never a mix or a short read."""
    store = FileStore(tmp_path)
    values = [b"a" * (1 << 20), b"b" * (1 << 20)]
    store.put("k", values[0])
    stop = threading.Event()
    bad: list[int] = []

    def read() -> None:
        while not stop.is_set():
            data = store.get("k")
            if data not in values:
                bad.append(len(data))

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    for i in range(40):
        store.put("k", values[i % 2])
    stop.set()
    for t in readers:
        t.join()
    assert bad == []
    assert tmp_files(tmp_path) == []


# --- file store: the root ----------------------------------------------------------------------


@pytest.mark.parametrize("key", ["../escaped", "a/../../escaped", "/etc/escaped", "a/./b"])
def test_file_keys_escaping_the_root_are_rejected(tmp_path: Path, key: str) -> None:
    root = tmp_path / "root"
    store = FileStore(root)
    with pytest.raises(ValueError, match="invalid object key"):
        store.put(key, b"x")
    with pytest.raises(ValueError):
        store.delete(key)
    assert not (tmp_path / "escaped").exists()
    assert list(tmp_path.rglob("escaped")) == []


def test_file_list_prefix_cannot_walk_out_of_the_root(tmp_path: Path) -> None:
    (tmp_path / "outside").write_bytes(b"secret")
    store = FileStore(tmp_path / "root")
    store.put("inside", b"x")
    assert list(store.list("../")) == []
    assert list(store.list("../outside")) == []
    assert [i.key for i in store.list()] == ["inside"]


def test_file_temp_prefix_is_reserved(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    with pytest.raises(ValueError, match="reserved"):
        store.put("a/.lakelog-tmp-x", b"x")


def test_file_key_cannot_be_object_and_directory(tmp_path: Path) -> None:
    """'a' as an object and 'a/b' cannot coexist on a file system: a clear StorageError."""
    store = FileStore(tmp_path)
    store.put("a", b"file")
    with pytest.raises(StorageError, match="cannot write 'a/b'"):
        store.put("a/b", b"x")
    with pytest.raises(ObjectNotFoundError):
        store.get("a/b")
    assert store.get("a") == b"file"


# --- conditional writes under a race -----------------------------------------------------------


def race_conditional_puts(store: ObjectStore, key: str, n: int) -> tuple[list[int], list[int]]:
    """n threads put(key, if_none_match=True) at once; returns (winners, losers)."""
    barrier = threading.Barrier(n)
    winners: list[int] = []
    losers: list[int] = []

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            store.put(key, f"writer-{i}".encode() * 1000, if_none_match=True)
            winners.append(i)
        except PreconditionFailedError:
            losers.append(i)

    run_threads(attempt, range(n))
    return winners, losers


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_concurrent_if_none_match_has_exactly_one_winner(tmp_path: Path, kind: str) -> None:
    """Race: 16 threads put(if_none_match=True) the same key at once, 20 keys in a row.
    Expected: per key exactly one put succeeds, 15 raise PreconditionFailedError, and the
    stored bytes are the winner's. (Not run on moto: its conditional puts are not atomic.)"""
    store: ObjectStore = MemoryStore() if kind == "memory" else FileStore(tmp_path)
    for round_ in range(20):
        key = f"race/{round_}"
        winners, losers = race_conditional_puts(store, key, 16)
        assert len(winners) == 1, winners
        assert len(losers) == 15
        assert store.get(key) == f"writer-{winners[0]}".encode() * 1000
    if kind == "file":
        assert tmp_files(tmp_path) == []
    assert len(list(store.list("race/"))) == 20


def test_file_store_root_is_created(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"
    FileStore(root)
    assert root.is_dir()
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(StorageError, match="cannot create store root"):
        FileStore(blocker / "sub")


def test_file_objects_are_plain_files(tmp_path: Path) -> None:
    """The layout is documented: key -> <root>/<key>, so operators can inspect it."""
    store = FileStore(tmp_path)
    store.put("segments/ab/x.seg", b"data")
    assert (tmp_path / "segments" / "ab" / "x.seg").read_bytes() == b"data"
