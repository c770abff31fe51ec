"""The log as its readers and writers see it: (topic, partition, offsets) to index entries,
bytes and records.

Owns:
    log.py    ``LogWriter`` (build, PUT, then commit one segment object) and ``LogReader``
              (an offset range to entries and records, never past the high watermark;
              ListOffsets by time), with ``decode_entry`` for both kinds of entry.
    walk.py   the one walk over a partition's index that every reader uses (the agent's
              reads and their prefetch, Spark's planning): pages, clipping, what a gap
              at the cursor means, holes; and the timestamp seek.
    cache.py  the agent's index cache, keyed by topic id.
    plan.py   offset ranges cut into scan tasks (Spark's batch reads, streams and
              history tables): slices of entries, big tier objects split by row group.

The bytes themselves come from ``segments`` (segment chunks, ``segments.tier`` for tier
objects, whole or by ranged GETs); the agent's byte cache is ``service.read_cache``.

May import ``segments`` (formats, object stores, errors, types) and the coordinator's
protocol and value modules (``coordinator.client``, ``coordinator.log.producers``,
``coordinator.log.topic_configs``); never ``service`` or ``spark``, which import it
(``tests/unit/test_layers.py`` checks).
"""
