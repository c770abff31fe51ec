"""The Kafka listener's versions: for every API it serves, what a current Kafka 4.x broker
serves, built from the dispatcher's table (``service.kafka.server.HANDLERS``).

Kafka's newest version of each API comes from kio, whose message classes are generated
from Kafka's own message schemas (the ones Kafka 4.x's clients and brokers are generated
from): a served maximum below it fails here unless ``LOWER_MAXIMUM`` says why.
"""

from __future__ import annotations

import pytest
from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType

from service.kafka.framing import request_class
from service.kafka.server import HANDLERS, LOWER_MAXIMUM, SUPPORTED

#: What Kafka 4.x's Java clients send first of all, and what the issue's clients need:
#: a few maxima spelled out, so a wrong kio (or table) cannot pass unnoticed.
EXPECTED = {
    0: 13,  # Produce, topic ids (KIP-516)
    1: 18,  # Fetch, topic ids from v13
    3: 13,  # Metadata
    8: 10,  # OffsetCommit, topic ids
    9: 10,  # OffsetFetch, several groups from v8 (KIP-709)
    20: 6,  # DeleteTopics by id
    68: 1,  # ConsumerGroupHeartbeat (KIP-848)
    69: 1,  # ConsumerGroupDescribe
    75: 0,  # DescribeTopicPartitions (KIP-966)
}


def kafka_newest(api_key: int) -> int:
    """The newest request version of ``api_key`` in Kafka's message schemas (kio's)."""
    versions = schema_name_map[api_key_map[api_key]]
    return max(v for v, entities in versions.items() if EntityType.request in entities)


@pytest.mark.parametrize("api_key", sorted(HANDLERS))
def test_served_maximum_is_kafkas_newest_or_says_why(api_key: int) -> None:
    """Fails for an API served below Kafka 4.x's newest version with no stated reason."""
    _, served, _ = HANDLERS[api_key]
    newest = kafka_newest(api_key)
    assert served <= newest, f"{api_key_map[api_key]}: v{served} is past Kafka's v{newest}"
    if served < newest:
        assert LOWER_MAXIMUM.get(api_key), (
            f"{api_key_map[api_key]} is served up to v{served}, Kafka serves v{newest}: "
            "serve it, or say why not in service.kafka.server.LOWER_MAXIMUM"
        )


def test_every_stated_reason_is_for_a_lower_maximum() -> None:
    """No stale reasons: an API listed in LOWER_MAXIMUM really is below Kafka's newest."""
    for api_key, reason in LOWER_MAXIMUM.items():
        assert api_key in HANDLERS and reason
        assert HANDLERS[api_key][1] < kafka_newest(api_key), api_key_map[api_key]


def test_the_versions_the_new_clients_need() -> None:
    for api_key, version in EXPECTED.items():
        assert SUPPORTED[api_key][1] == version, api_key_map[api_key]


@pytest.mark.parametrize("api_key", sorted(HANDLERS))
def test_every_served_version_has_kafkas_message_classes(api_key: int) -> None:
    """Each version in the table is one kio decodes (no hole, no version Kafka lacks)."""
    low, high, _ = HANDLERS[api_key]
    assert 0 <= low <= high
    for version in range(low, high + 1):
        assert request_class(api_key, version).__version__ == version


def test_readme_table_is_the_served_one() -> None:
    """README's table of served APIs is exactly what ApiVersions advertises."""
    from pathlib import Path

    from service.kafka.server import api_versions_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("<!-- kafka-api-versions: start -->\n```text\n")
    end = readme.index("```\n<!-- kafka-api-versions: end -->")
    body = readme[start + len("<!-- kafka-api-versions: start -->\n```text\n") : end]
    assert body == api_versions_table(), "README's API table is stale: regenerate it"
