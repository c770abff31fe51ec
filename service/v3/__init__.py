"""The Confluent REST Proxy v3 API (clusters, brokers, topics, partitions, configs,
consumer groups, ACLs, records) and lakelog's own v3 routes (consume by offset, the
group stream, group administration).

Routes only: they parse requests and call the agent's domain objects and the
coordinator; ``common`` holds what several of them (and v2's, and the Kafka door's
broker views) share: URLs, CRNs, the cluster check, brokers. May import ``service``'s
shared web pieces (``errors``, ``web``, ``state``, ``security``, ``registry``) and, of
v2, only the consumers' reads (``service.v2.consumers``), which v3 consume and the group
stream serve too.
"""
