"""service.web's ASGI helpers that need no running agent."""

from __future__ import annotations

import ipaddress
from unittest import mock

from service import web
from service.web import TrustedProxies


def test_trusted_proxies_parse_each_peer_once_and_answer_as_before() -> None:
    """The answer per peer address is remembered (parsing it was ~2% of a produce
    request); answers are the same on the first and later asks, and after the memory
    starts again."""
    trusted = TrustedProxies("10.0.0.0/8, 127.0.0.1, unix:")
    asks = ["10.1.2.3", "127.0.0.1", "192.168.0.1", "unix:", "not an address", "::1"]
    expected = [True, True, False, True, False, False]
    with mock.patch.object(web.ipaddress, "ip_address", wraps=ipaddress.ip_address) as parse:
        for _ in range(3):
            assert [h in trusted for h in asks] == expected
        assert parse.call_count == 5  # once per address ("unix:" is a name)
    with mock.patch.object(web, "_SEEN_PEERS", 2):
        assert [h in trusted for h in asks] == expected
    assert 5 not in trusted
    assert "10.0.0.1" in TrustedProxies("*")
