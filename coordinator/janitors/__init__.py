"""The coordinator's janitors: tiering, retention, compaction and garbage collection.

``catalog`` holds their SQL, ``leases`` makes one coordinator at a time run each,
``runner`` schedules them in the coordinator process or runs one on demand.

May import ``coordinator.log``, ``coordinator.iceberg``, ``coordinator.db`` and
``segments`` (formats, stores); the HTTP face and the CLI call ``runner``.
"""
