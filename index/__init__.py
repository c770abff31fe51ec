"""The log as its readers and writers see it: (topic, partition, offsets) to index entries,
bytes and records.

Owns:
    log.py    ``LogWriter`` (build, PUT, then commit one segment object) and ``LogReader``
              (an offset range to entries and records, never past the high watermark;
              ListOffsets by time), with ``decode_entry`` for both kinds of entry.
    walk.py   the one walk over a partition's index that every reader uses (the agent's
              doors, the plain reader, Spark's planning): pages, clipping, what a gap
              at the cursor means, holes; and the timestamp seek.
    cache.py  the agent's index cache, keyed by topic id.

May import ``segments`` (formats, object stores, errors, types) and the coordinator's
protocol and value types (``coordinator.client``, ``coordinator.log.producers``); never
``service`` or ``spark``, which import it.
"""
