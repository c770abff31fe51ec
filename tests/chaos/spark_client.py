"""The chaos run's Spark client: one long-lived local SparkSession in its own process.

``python -m tests.chaos.spark_client`` (started by ``tests.chaos.run.Run.spark_loop``
in runs of five minutes or more) reads one JSON command a line on stdin and answers
each with one JSON line on stdout (the command's ``id`` echoed):

- ``{"op": "write", "options": {...}, "rows": [[partition, key, value], ...]}``: the
  rows appended through lakelog's Spark writer (``df.write.format("lakelog")``, the
  rows' topic the ``topic`` option); ``{"ok": true}`` once the job committed, else
  ``{"ok": false, "error": ...}`` (what a failed job stored is unknown).
- ``{"op": "read", "options": {...}}``: a batch read (``spark.read.format("lakelog")``,
  earliest to latest); ``{"ok": true, "rows": [[partition, offset, value], ...]}``.

It ends at end of input. Driver memory is bounded (``DRIVER_MEMORY``; two local cores).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import orjson

from tests.procs import start_spark

DRIVER_MEMORY = "512m"


def session() -> Any:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    return start_spark(
        {
            "spark.app.name": "lakelog-chaos",
            "spark.driver.memory": DRIVER_MEMORY,
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.python.filterPushdown.enabled": "true",
        }
    )


def serve(s: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

    if cmd["op"] == "write":
        schema = StructType(
            [
                StructField("partition", IntegerType()),
                StructField("key", BinaryType()),
                StructField("value", BinaryType()),
            ]
        )
        rows = [(p, k.encode(), v.encode()) for p, k, v in cmd["rows"]]
        df = s.createDataFrame(rows, schema).repartition(2)
        df.write.format("lakelog").options(**cmd["options"]).mode("append").save()
        return {"ok": True}
    df = (
        s.read.format("lakelog")
        .options(**cmd["options"])
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .select("partition", "offset", "value")
    )
    out = [
        [r["partition"], r["offset"], bytes(r["value"]).decode(errors="replace")]
        for r in df.collect()
    ]
    return {"ok": True, "rows": out}


def main() -> None:
    s = session()
    print(orjson.dumps({"ready": True}).decode(), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = orjson.loads(line)
        try:
            answer = serve(s, cmd)
        except Exception as e:
            answer = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:500]}"}
            traceback.print_exc()
        print(orjson.dumps({**answer, "id": cmd.get("id")}).decode(), flush=True)
    s.stop()


if __name__ == "__main__":
    main()
