"""The agent's security: who is calling, and may they.

- ``install``: puts it together for ``create_app`` (which middleware, which store,
  what is logged);
- ``auth``: REST authentication (HTTP Basic with a user or an API key), ``oauth``:
  bearer JWTs checked against a JWKS, ``mtls``: client certificates;
- ``acl``: REST routes authorized by Kafka ACLs (one table of rules);
- ``quotas``: produce, fetch and request rates per principal;
- ``routes``: principals over REST (super users only); ``cli``: ``lakelog users``,
  ``api-keys`` and ``acls``.

May import: ``coordinator.security`` (the model, the store, logins, settings and the
coordinator's security client), ``service.errors``, ``service.executors``,
``service.settings`` and ``service.web``; nothing of the produce or consume paths. The
Kafka door's own checks (``service.kafka.acl``, ``service.kafka.sasl``) use the same
model.
"""
