"""Where Kafka clients are told to reach an agent (``service.app.kafka_address``): never
a host name clients elsewhere may not resolve, when an address can be had."""

from __future__ import annotations

from service.app import kafka_address, kafka_advertises_per_connection
from service.settings import Settings


def test_an_advertised_address_wins_and_is_the_same_for_every_connection() -> None:
    s = Settings(host="0.0.0.0", kafka_advertised="kafka.example:9093")
    assert kafka_address(s, 9092) == ("kafka.example", 9093)
    assert not kafka_advertises_per_connection(s)


def test_a_specific_listen_host_is_the_address() -> None:
    s = Settings(host="127.0.0.1")
    assert kafka_address(s, 19092) == ("127.0.0.1", 19092)
    assert not kafka_advertises_per_connection(s)


def test_every_interface_registers_the_one_toward_the_coordinator() -> None:
    """An agent listening everywhere registers the address of the interface it reaches
    the coordinator through (here loopback), and answers each connection with the address
    that connection reached (``lakelog serve`` has no coordinator to route to)."""
    s = Settings(host="0.0.0.0", coordinator="http://127.0.0.1:8083")
    assert kafka_address(s, 9092) == ("127.0.0.1", 9092)
    assert kafka_advertises_per_connection(s)
    assert kafka_advertises_per_connection(Settings(host="::", coordinator=""))
