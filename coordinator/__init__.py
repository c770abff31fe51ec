"""The coordinator: the one place that decides (offsets, group state, the index, who may
do what), behind one API that agents, Spark and the CLI call in-process or over HTTP.

Owns:
    client.py, api.py   the API: the ``Coordinator`` protocol and its values; every
                        operation of every protocol, with its wire codec (``api``)
    local.py, shards.py the in-process coordinator over one metadata database, or
                        partitions sharded over several
    db.py, postgres.py  the metadata database (SQLite, PostgreSQL) and its migrations
    settings.py, clock.py  settings of every process; the coordinator's wall clock
    log/       topics, configs, offsets, the chunk index, the commit
    groups/    REST and Kafka consumer groups
    schemas/   the schema registry's store
    security/  users, API keys, ACLs, and who may call which operation
    janitors/  tiering, retention, compaction, garbage collection, topic tables
    iceberg/   topic tables as Iceberg tables, and their REST catalog
    http/      the API over HTTP: the coordinator process's routes and its client

May import ``segments`` (errors, value types, formats, stores); never ``index``,
``service`` or ``spark``, which call it.
"""
