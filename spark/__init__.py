"""Spark reads, streams and writes of lakelog topics straight from the object store.

Nothing to register: an installed lakelog (``pip install 'lakelog[spark]'``, or the
checkout's ``make spark``) brings the top-level module ``pyspark_lakelog``, which Spark 4
finds at session start, so ``spark.read.format("lakelog")``, ``readStream`` and ``write``
just work. ``register(session)`` remains for sessions that cannot see installed modules
(a default editable install, a notebook with this tree on ``sys.path`` only); where Spark
found the source already it does nothing. The data source (``spark.source``) imports
pyspark, so it loads only when asked for: the agent imports nothing from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark.source import LakelogDataSource

__all__ = ["LakelogDataSource", "register"]


def register(session: Any) -> bool:
    """Register the ``lakelog`` data source with a SparkSession, by hand, once.

    Not needed where lakelog is installed (see the module docstring): when the session
    already has a ``lakelog`` source (Spark's own lookup found ``pyspark_lakelog``, or
    an earlier call), nothing is done, so Spark does not warn that a registration
    replaced another. Filter pushdown stays the session's choice
    (``spark.sql.python.filterPushdown.enabled``).

    Returns:
        Whether this call registered the source.
    """
    from spark.source import LakelogDataSource

    try:
        # The JVM's registry of Python sources; its first use runs Spark's static lookup.
        manager = session._jsparkSession.sessionState().dataSourceManager()
        if manager.dataSourceExists(LakelogDataSource.name()):
            return False
    except AttributeError:
        pass  # Spark Connect: no JVM session here; registering is the one way to know
    session.dataSource.register(LakelogDataSource)
    return True


def __getattr__(name: str) -> Any:
    if name == "LakelogDataSource":
        from spark.source import LakelogDataSource

        return LakelogDataSource
    raise AttributeError(f"module 'spark' has no attribute {name!r}")
