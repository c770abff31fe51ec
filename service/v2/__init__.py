"""The Confluent REST Proxy v2 API: produce, consumers (instances, subscriptions, fetch,
offsets) and metadata.

Routes only: they parse requests and call the agent's domain objects (``service.produce``,
``service.consume``, ``service.read_cache``, the coordinator). May import ``service``'s
shared web pieces (``errors``, ``web``, ``state``, ``security``, ``registry``) and, of
v3, only ``service.v3.common`` (URLs, brokers, ``call``); v3's consume and group stream
read with ``consumers.read_round_robin``.
"""
