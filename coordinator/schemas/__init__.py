"""The schema registry's state: subjects, versions and global schema ids.

- ``model``: the storage interface and the rules it keeps (one id per schema);
- ``store``: that state in the metadata database (every registry SQL statement).

May import: ``coordinator.db``, ``coordinator.clock`` and ``segments.errors``. What a
schema means (Avro, Protobuf, JSON Schema, compatibility) is the agents' business
(``service.registry``); this package stores and numbers them.
"""
