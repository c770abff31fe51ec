"""Consumer groups: everything a coordinator keeps so that any agent serves any member.

- ``model``: the REST consumer instances' interface and values (configs, positions,
  committed offsets), and the rules they keep;
- ``store``: their state in the metadata database (every REST-group SQL statement);
- ``kafka``: Kafka's groups, the classic protocol and KIP-848's, on the same committed
  offsets; ``assignors``: KIP-848's assignors and reconciliation, pure functions;
- ``offset_reset``: where ``reset-offsets`` moves a group; ``patterns``: topic-pattern
  subscriptions; ``metrics``: lag on ``/metrics``.

May import: ``coordinator.db``, ``coordinator.clock``, ``coordinator.log.topic_configs``
(names a subscription may match) and ``segments``' errors and value types; nothing of
the log's commit path, the HTTP face or the agents. The agents reach it through the
``Coordinator`` protocol (``coordinator.client``).
"""
