"""segments/segment.py is a pure codec: it pulls in no I/O, web or event-loop code of its own."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import segments.segment

# Modules whose presence would mean the codec does I/O or serves HTTP.
IO_MODULES = {
    "boto3",
    "botocore",
    "s3transfer",
    "urllib3",
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "httpcore",
    "pydantic",
    "sqlite3",
    "psycopg",
    "pyarrow",
}
#: Pure codec libraries segments/compression.py streams batches through.
CODECS = {"zstandard", "lz4", "cramjam", "crc32c"}
PROBE = """
import json, sys
import aiokafka.record.default_records, aiokafka.record.util
before = set(sys.modules)
import segments.segment
print(json.dumps({"added": sorted(set(sys.modules) - before), "all": sorted(sys.modules)}))
"""


def test_import_pulls_no_io_modules() -> None:
    """Importing the codec in a fresh interpreter loads none of the I/O or web libraries.

    aiokafka's package ``__init__`` (and its ``aiokafka.util``, which the record module
    needs) imports asyncio and aiokafka's own network client; that cannot be avoided when
    using its record codec, so the event-loop check is on what *segments.segment* adds
    beyond aiokafka's record module: our own small packages and the codec libraries.
    """
    root = Path(segments.segment.__file__).parents[1]
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=root, capture_output=True, text=True, check=True
    )
    loaded = json.loads(out.stdout)
    top_level = {name.partition(".")[0] for name in loaded["all"]}
    assert top_level.isdisjoint(IO_MODULES), sorted(top_level & IO_MODULES)
    assert {m for m in loaded["added"] if m.startswith("segments")} == {
        "segments",
        "segments.compression",
        "segments.errors",
        "segments.segment",
        "segments.types",
    }
    # Beyond our own: the codec libraries of bounded decompression and the standard
    # library modules they use, but no event loop and no sockets.
    tops = {name.partition(".")[0] for name in loaded["added"]}
    assert tops - set(sys.stdlib_module_names) <= {"segments", *CODECS}
    assert tops.isdisjoint({"asyncio", "socket", "ssl", "selectors"}), sorted(tops)


def test_source_imports_only_codec_modules() -> None:
    """The module's own import statements name only the stdlib codec helpers and aiokafka.record."""
    tree = ast.parse(Path(segments.segment.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.module is not None
            imported.add(node.module)
    assert imported <= {
        "__future__",
        "bisect",
        "struct",
        "typing",
        "collections.abc",
        "dataclasses",
        "aiokafka.record.default_records",
        "aiokafka.record.util",
        "crc32c",
        "segments.compression",
        "segments.errors",
        "segments.types",
    }, imported
    assert "asyncio" not in imported
