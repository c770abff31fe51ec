"""Parquet tier codec speed against pyarrow reading and writing the same table directly.

200,000 records (16-byte keys, 1 KiB semi-compressible values, one header) of one
topic-partition. Prints one JSON line per compression::

    {"bench": "tier_codec", "compression": "zstd", "records": 200000, "payload_mb": ...,
     "object_mb": ..., "row_groups": ...,
     "encode_mb_s": ..., "pyarrow_write_mb_s": ..., "encode_vs_pyarrow": ...,
     "decode_records_mb_s": ..., "decode_table_mb_s": ..., "pyarrow_read_mb_s": ...,
     "decode_table_vs_pyarrow": ..., "decode_records_vs_pyarrow": ...}

MB/s are of payload (key + value + header bytes, uncompressed), 10**6 bytes per MB.
"encode" = encode_tier from (offset, Record) pairs, Python objects to sealed bytes;
"pyarrow_write" = pq.write_table of the same Arrow table (same compression, pyarrow's
other defaults) into a BytesIO: the limit, with no Python-object conversion.
"decode_records" = TierReader(...).records(0) (Python ConsumedRecords, what an agent
serves); "decode_table" = TierReader(...).table() (Arrow, what Spark reads);
"pyarrow_read" = pq.read_table of our object's bytes. Best of 3 runs, ours and
pyarrow alternating so that load from other processes hits both alike.

Run: ``.venv/bin/python bench/tier_codec.py`` (under a minute); progress on stderr.
"""

from __future__ import annotations

import io
import json
import random
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyarrow.parquet as pq  # noqa: E402

from segments.tier import TierReader, encode_tier  # noqa: E402
from segments.types import Record  # noqa: E402

RECORDS = 200_000
VALUE_BYTES = 1024
RUNS = 3
TOPIC = "bench"
PARTITION = 0
WORDS = [b"lakelog", b"segment", b"chunk", b"batch", b"record", b"offset", b"topic", b"tier"]


def make_records(rng: random.Random) -> list[tuple[int, Record]]:
    """Values are 1 KiB slices of an 8 MiB pool of words and random hex (~2-3x zstd)."""
    parts: list[bytes] = []
    size = 0
    while size < 8 << 20:
        part = rng.choice(WORDS) if rng.random() < 0.6 else rng.randbytes(8).hex().encode()
        parts.append(part + b" ")
        size += len(part) + 1
    pool = b"".join(parts)
    out = []
    base_ts = 1_700_000_000_000
    for i in range(RECORDS):
        start = rng.randrange(len(pool) - VALUE_BYTES)
        out.append(
            (
                i,
                Record(
                    key=b"user-%011d" % rng.randrange(10**6),
                    value=pool[start : start + VALUE_BYTES],
                    timestamp_ms=base_ts + i,
                    headers=(("trace-id", rng.randbytes(8)),),
                ),
            )
        )
    return out


def timed(fn: Callable[[], Any]) -> float:
    """Seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(records: list[tuple[int, Record]], compression: str, mb: float) -> dict[str, Any]:
    """One JSON line's figures for one compression."""
    blob = encode_tier(TOPIC, PARTITION, records, compression=compression)
    table = TierReader(blob).table()
    pq_compression = "NONE" if compression == "none" else compression
    contenders: dict[str, Callable[[], Any]] = {
        "encode": partial(encode_tier, TOPIC, PARTITION, records, compression=compression),
        "pyarrow_write": lambda: pq.write_table(table, io.BytesIO(), compression=pq_compression),
        "decode_records": lambda: TierReader(blob).records(0),
        "decode_table": lambda: TierReader(blob).table(),
        "pyarrow_read": lambda: pq.read_table(io.BytesIO(blob)),
    }
    times = dict.fromkeys(contenders, float("inf"))
    for run in range(RUNS):
        print(f"{compression}: run {run + 1}/{RUNS}", file=sys.stderr)
        for name, fn in contenders.items():
            times[name] = min(times[name], timed(fn))
    rate = {name: mb / seconds for name, seconds in times.items()}
    return {
        "bench": "tier_codec",
        "compression": compression,
        "records": len(records),
        "payload_mb": round(mb, 1),
        "object_mb": round(len(blob) / 1e6, 1),
        "row_groups": len(TierReader(blob).row_groups),
        "encode_mb_s": round(rate["encode"], 1),
        "pyarrow_write_mb_s": round(rate["pyarrow_write"], 1),
        "encode_vs_pyarrow": round(rate["encode"] / rate["pyarrow_write"], 2),
        "decode_records_mb_s": round(rate["decode_records"], 1),
        "decode_table_mb_s": round(rate["decode_table"], 1),
        "pyarrow_read_mb_s": round(rate["pyarrow_read"], 1),
        "decode_table_vs_pyarrow": round(rate["decode_table"] / rate["pyarrow_read"], 2),
        "decode_records_vs_pyarrow": round(rate["decode_records"] / rate["pyarrow_read"], 2),
    }


def main() -> None:
    rng = random.Random(7)
    print(f"generating {RECORDS} records", file=sys.stderr)
    records = make_records(rng)
    payload = sum(
        len(r.key or b"") + len(r.value or b"") + sum(len(k) + len(v or b"") for k, v in r.headers)
        for _, r in records
    )
    for compression in ("zstd", "snappy", "none"):
        print(json.dumps(measure(records, compression, payload / 1e6)), flush=True)


if __name__ == "__main__":
    main()
