"""The agent: the doors producers, consumers and admins use, over the log and the
coordinator.

Owns:
    app.py, state.py, settings.py, cli.py   the agent's app, what it holds while it runs,
                its settings, and the ``lakelog`` command line
    web.py, http_server.py, errors.py, delivery.py   the HTTP face: ASGI wrappers, uvicorn,
                errors as Confluent error bodies, knowing whether an answer arrived
    v2/, v3/    the Confluent REST Proxy API
    kafka/      the Kafka wire protocol
    registry/   the Confluent Schema Registry API and the schema formats
    produce/, consume/   the write batcher and the read side (long-poll, notify, metrics)
    read_cache.py, executors.py, metrics.py   the byte cache, thread pools, Prometheus
    security/   logins and ACL checks at the doors

May import ``segments``, ``index`` and ``coordinator`` (the agent calls the coordinator
through its API: ``coordinator.client`` in-process or ``coordinator.http.client``);
nothing imports ``service`` but its entry points and the tests.
"""
