"""Topic tables: each topic's tier as an Apache Iceberg table whose data files are the tier
objects themselves (zero copy), and the Iceberg REST catalog that serves them.

Modules:

- ``changes``: the SQL that records, in the index's own transactions, which tier objects a
  topic's table gains and loses, and that reads and releases those records;
- ``schema``: the tables' Iceberg schema, partition spec, properties and locations (pure);
- ``fileio``: pyiceberg's ``FileIO`` over lakelog's ``ObjectStore`` (metadata, manifests);
- ``tables``: publishing recorded changes as snapshots, expiring snapshots, the tables'
  catalog (a pyiceberg ``MetastoreCatalog`` over the metadata database) and the check that
  a table agrees with the log;
- ``rest``: the Iceberg REST catalog (read-only) under ``/iceberg``, with lakelog's
  authentication and ACLs.

May import: ``segments``, ``coordinator.db``, ``coordinator.security.model*``, ``coordinator.
janitors.catalog`` and ``context`` (the janitors' view of the index), pyiceberg, pyarrow,
FastAPI. Imported by the janitors (hooks and the ``table`` janitor), the coordinator's
HTTP app and the agent's app of ``lakelog serve`` (the REST catalog), and ``spark``
(``asOfTimestamp`` reads through ``tables``).
"""
