"""The agent's write path, from a request's records to a committed segment object.

- ``formats``: the embedded formats of produce requests (binary, JSON, Avro, ...);
- ``partitioner``: Kafka's default partitioner;
- ``topic_cache``: a short-lived cache of topic metadata for produce;
- ``request_keys``: ``Idempotency-Key`` (a retried request answered, not stored again);
- ``idempotence``: idempotent Kafka producers' duplicates answered before buffering;
- ``batcher``: one buffer per agent; flushes one object and commits it (DESIGN.md
  "Write path").

May import: ``segments`` (builder, codecs, types), ``index.log`` (LogAppendTime),
``coordinator.client`` and the log's pure rules (``coordinator.log.producers``,
``topic_configs``), ``service.executors``, ``service.metrics`` and ``service.state``;
the doors (``v2``, ``v3``, ``kafka``) call it, it calls no door.
"""
