"""Who may connect and what each may do.

- ``model``: principals, ACLs and the rule that decides, pure values and functions;
- ``store``: users, API keys and ACLs in the metadata database (every security SQL
  statement, argon2id hashes);
- ``logins``: verifying logins (cache of verified credentials, throttle of failed ones),
  for agents and coordinators alike;
- ``settings``: the security settings of every process;
- ``access``: who may call which route of the coordinator's HTTP API;
- ``http``: the security routes of that API and the agents' client of them;
- ``wire``: the JSON form of users, keys, credentials and ACLs on those routes (no web
  framework: the ``lakelog`` command uses it and starts quickly).

May import: ``coordinator.db``, ``coordinator.clock``, ``coordinator.client`` (the
protocol it extends) and ``coordinator.http.asgi`` (middleware pieces); nothing of the
log, groups or schemas. The doors' checks (``service.security.acl``, ``service.kafka.acl``) use
``model``; nothing here knows a door.
"""
