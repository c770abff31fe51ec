"""Spark reads, streams and writes of lakelog topics straight from the object store.

Nothing to register: an installed lakelog (``pip install 'lakelog[spark]'``) brings the
top-level module ``pyspark_lakelog``, which Spark 4 finds at session start, so
``spark.read.format("lakelog")``, ``readStream`` and ``write`` just work.
``register(session)`` remains for sessions that cannot see installed modules (an
editable install, a notebook with this tree on ``sys.path`` only). The data source
(``spark.source``) imports pyspark, so it loads only when asked for: the agent imports
nothing from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark.source import LakelogDataSource

__all__ = ["LakelogDataSource", "register"]


def register(session: Any) -> None:
    """Register the ``lakelog`` data source with a SparkSession, by hand.

    Not needed where lakelog is installed (see the module docstring). Filter pushdown
    stays the session's choice (``spark.sql.python.filterPushdown.enabled``).
    """
    from spark.source import LakelogDataSource

    session.dataSource.register(LakelogDataSource)


def __getattr__(name: str) -> Any:
    if name == "LakelogDataSource":
        from spark.source import LakelogDataSource

        return LakelogDataSource
    raise AttributeError(f"module 'spark' has no attribute {name!r}")
