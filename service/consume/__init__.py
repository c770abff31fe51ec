"""What the agent keeps to serve consumers (nothing that must survive it).

- ``sessions``: per REST consumer instance, what this agent serves it from (the
  coordinator holds the instance's state);
- ``notify``: wake-ups for long-polling fetches, without polling the coordinator;
- ``metrics``: the read path's Prometheus metrics.

May import: ``index.log``, ``segments``' types and errors and ``coordinator.groups.model``
(the values of an instance); the doors call it. The bytes themselves come through
``service.read_cache`` and ``index``.
"""
