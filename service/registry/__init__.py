"""The Confluent Schema Registry: its API on every agent, and the schema formats the REST
Proxy produces and consumes with.

- ``routes``: the registry API; ``core``: the domain object behind it (the store is the
  coordinator's, ``coordinator.schemas``); ``errors``: our errors as registry codes;
- ``schemas`` with ``avro_format``, ``jsonschema_format``, ``protobuf_format``: one
  interface over the three formats; ``*_diff``: compatibility as Confluent decides it
  (``diffs``: what the JSON Schema and Protobuf diffs share);
  ``protobuf_text``: canonical ``.proto`` text;
- ``wire``: Confluent's framing of schema-framed keys and values; ``rest``: the REST
  Proxy's schema formats.

May import ``segments`` and ``coordinator`` (schemas, security) and ``service.state`` /
``service.security``; the REST routes (``service.v2``, ``service.v3``) import it, never
the other way round.
"""
