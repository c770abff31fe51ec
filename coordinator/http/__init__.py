"""The coordinator's HTTP face: its operations (``coordinator.api``) over HTTP.

- ``server``: one route per operation (``POST /v2/<name>``) over a ``LocalCoordinator``
  or a sharded one, with the janitors' runner and the management routes;
- ``client``: ``http_coordinator``, the agents' side, its methods made from the same
  definitions;
- ``asgi``: small ASGI pieces the coordinator's and the agents' middleware share.

May import every other room of ``coordinator`` (it serves them all); nothing imports
it but the processes that serve or call it (``service``, ``spark``, ``deploy``) and
``coordinator.security`` (``asgi``, the client's transport).
"""
