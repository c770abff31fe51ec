"""Spark 4 finds the ``lakelog`` data source here, with no registration step.

At session start Spark imports every installed top-level module whose name starts with
``pyspark_`` and registers its ``DefaultSource`` (a ``DataSource`` subclass) under
``DefaultSource.name()`` (``pyspark/sql/worker/lookup_data_sources.py``). The source
itself lives in the ``spark`` package (``spark.source``).
"""

from spark.source import LakelogDataSource as DefaultSource

__all__ = ["DefaultSource"]
