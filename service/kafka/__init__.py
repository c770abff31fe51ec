"""The Kafka wire protocol: a second front door onto the agent's core (DESIGN.md "Doors").

- ``framing``: sans-io: size-prefixed frames in and out, request headers, kio decoding
  and encoding of every message type (pure functions over bytes, no sockets);
- ``batches``: sans-io: checks of producers' RecordBatches, base-offset patching of
  stored batches for Fetch, tier rows re-encoded as batches;
- ``handlers``: one async function per API, calling the same domain objects the REST
  routes call (batcher, caching reader, notifier, topic cache, coordinator); the
  groups' APIs in ``groups``, the admin ones in ``admin`` and ``acls``, the
  transactions' in ``transactions`` (with the agents' transaction-timeout sweep);
- ``server``: the asyncio listener; it only moves bytes and calls the two above.

May import the agent's domain objects (``service.produce``, ``service.consume``,
``service.read_cache``, ``service.state``, ``service.security``), ``index``,
``coordinator`` and ``segments``; of the REST routes, only ``service.v3.common`` (the
brokers both doors show).
"""
