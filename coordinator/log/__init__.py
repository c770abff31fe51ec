"""The log and its commit: topics, configs, offsets and the chunk index.

- ``store``: the metadata store of topics, configs, partitions' offsets, the chunk
  index and agents (every log SQL statement, one transaction per commit);
- ``group_commit``: concurrent commits taken together into one transaction;
- ``producers``: idempotent producers' sequence rules, pure functions;
- ``topic_configs``: Kafka's rules for topic names and configs, pure functions.

May import: ``coordinator.db``, ``coordinator.clock``, ``coordinator.client`` (the
values of a commit), ``coordinator.iceberg.changes`` (what "unreferenced" means) and
``segments``' value types, errors and codecs' names; nothing of groups, security,
schemas or the HTTP face.
"""
