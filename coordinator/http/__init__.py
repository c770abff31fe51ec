"""The coordinator's HTTP face: the ``Coordinator`` protocol over HTTP.

- ``server``: the routes (``/v1``) over a ``LocalCoordinator`` or a sharded one, with
  the janitors' runner;
- ``client``: ``HttpCoordinator``, the agents' side, and the wire format both use;
- ``asgi``: small ASGI pieces the coordinator's and the agents' middleware share.

May import every other room of ``coordinator`` (it serves them all); nothing imports
it but the processes that serve or call it (``service``, ``spark``, ``deploy``) and
``coordinator.security.http`` (``asgi``).
"""
