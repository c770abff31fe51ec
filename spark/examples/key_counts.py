"""Example job: read a topic of JSON records, count records and sum a field per key.

Reads with the ``lakelog`` data source, parses values with ``from_json`` against a
schema given on the command line, and writes one row per key (records, and the sum of a
numeric field if named) as Parquet::

    python -m spark.examples.key_counts --topic events \\
        --db "sqlite:///$PWD/data/lakelog.db" --store "file://$PWD/data" \\
        --schema "amount double, user string" --sum amount --out /tmp/key_counts

    python -m spark.examples.key_counts --topic events \\
        --coordinator http://127.0.0.1:8083 --out /tmp/key_counts

With ``--coordinator`` the coordinator tells where the bucket is; ``--store`` and
``--store-endpoint`` override it (an executor may reach the bucket at another address).
Coordinators with authentication on need a user: the job takes it from ``LAKELOG_USER``
/ ``LAKELOG_PASSWORD`` (as the ``lakelog`` CLI does), never from its command line, and
``LAKELOG_ALLOW_PLAINTEXT_COORDINATOR`` (``true``: send them to an ``http://``
coordinator on another host, as agents do on a private network).
"""

from __future__ import annotations

import argparse
import os
import sys

#: Source options the job takes from the environment (secrets stay off its command line).
SECURITY_OPTIONS = {
    "user": "LAKELOG_USER",
    "password": "LAKELOG_PASSWORD",
    "coordinator.allowPlaintext": "LAKELOG_ALLOW_PLAINTEXT_COORDINATOR",
}


def build_parser() -> argparse.ArgumentParser:
    """The job's command line (docker-compose.yml's ``spark`` service is checked with it)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--topic", required=True, help="topic (or comma list) to read")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--coordinator", help="URL of a coordinator process")
    where.add_argument("--db", help="coordinator database URL (offline: sqlite:////abs/path.db)")
    ap.add_argument(
        "--store", help="object store URL (s3://bucket/prefix, file:///dir); needed with --db"
    )
    ap.add_argument("--store-endpoint", help="S3 endpoint URL (MinIO, a moto server)")
    ap.add_argument("--schema", default="amount double", help="DDL of the JSON values")
    ap.add_argument("--sum", help="a numeric field of --schema to sum per key")
    ap.add_argument("--out", required=True, help="output directory (Parquet)")
    ap.add_argument("--master", default="local[2]")
    return ap


def main(argv: list[str] | None = None) -> None:
    """Run the job: read, aggregate per key, write Parquet and show the first rows."""
    args = build_parser().parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark as lakelog_spark

    if args.db and not args.store:
        build_parser().error("--db needs --store")
    session = SparkSession.builder.master(args.master).appName("lakelog-key-counts").getOrCreate()
    # Where lakelog is installed Spark finds the source itself; this also covers a checkout
    # run in place (an editable install is not a module Spark's lookup can list).
    lakelog_spark.register(session)
    options = {"subscribe": args.topic}
    if args.store:
        options["store"] = args.store
    if args.coordinator:
        options["coordinator"] = args.coordinator
    else:
        options["db"] = args.db
    if args.store_endpoint:
        options["store.endpoint"] = args.store_endpoint
    if args.coordinator:
        for option, variable in SECURITY_OPTIONS.items():
            if os.environ.get(variable):
                options[option] = os.environ[variable]
    records = session.read.format("lakelog").options(**options).load()
    parsed = records.select(
        F.col("key").cast("string").alias("key"),
        F.from_json(F.col("value").cast("string"), args.schema).alias("v"),
    )
    aggregates = [F.count(F.lit(1)).alias("records")]
    if args.sum:
        aggregates.append(F.sum(F.col(f"v.{args.sum}")).alias(f"sum_{args.sum}"))
    result = parsed.groupBy("key").agg(*aggregates).orderBy("key")
    result.write.mode("overwrite").parquet(args.out)
    result.show(20, truncate=False)
    session.stop()


if __name__ == "__main__":
    main()
