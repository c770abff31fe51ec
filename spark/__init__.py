"""Spark batch reads of lakelog topics straight from the object store.

``spark.register(session)`` makes ``session.read.format("lakelog")`` available. The data
source (``spark.source``) imports pyspark, so it loads only when asked for: the agent
imports nothing from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark.source import LakelogDataSource

__all__ = ["LakelogDataSource", "register"]


def register(session: Any) -> None:
    """Register the ``lakelog`` data source with a SparkSession and enable filter pushdown.

    Spark refuses a Python data source that implements ``pushFilters`` unless
    ``spark.sql.python.filterPushdown.enabled`` is true, so this sets it.
    """
    from spark.source import LakelogDataSource

    session.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    session.dataSource.register(LakelogDataSource)


def __getattr__(name: str) -> Any:
    if name == "LakelogDataSource":
        from spark.source import LakelogDataSource

        return LakelogDataSource
    raise AttributeError(f"module 'spark' has no attribute {name!r}")
