"""Client quotas: the token bucket arithmetic and the Kafka door's throttle time."""

from __future__ import annotations

import pytest

from service.security.quotas import FETCH, PRODUCE, REQUESTS, Quotas, kinds_of
from service.settings import Settings


def _quotas(**rates: int) -> Quotas:
    return Quotas(Settings(store="memory://q", janitors="none", **rates))


def test_a_principal_in_debt_waits_it_out_and_another_does_not() -> None:
    q = _quotas(quota_produce_bytes_per_s=1000)
    assert q.delay("a", (PRODUCE,), now=0.0) == 0  # a full bucket: one second of rate
    q.charge("a", PRODUCE, 3000, now=0.0)  # 2000 bytes of debt
    assert q.delay("a", (PRODUCE,), now=0.0) == pytest.approx(2.0)
    assert q.delay("a", (PRODUCE,), now=1.5) == pytest.approx(0.5)
    assert q.delay("a", (PRODUCE,), now=2.0) == 0
    assert q.delay("b", (PRODUCE,), now=0.0) == 0  # per principal
    # The burst is one second of rate, however long the principal was idle.
    q.charge("b", PRODUCE, 1000, now=100.0)
    assert q.delay("b", (PRODUCE,), now=100.0) == 0
    q.charge("b", PRODUCE, 1, now=100.0)
    assert q.delay("b", (PRODUCE,), now=100.0) > 0


def test_the_rate_is_shared_by_the_live_agents() -> None:
    q = _quotas(quota_requests_per_s=10)
    q.agents = 2  # each agent admits 5/s
    for _ in range(5):
        q.charge("a", REQUESTS, 1, now=0.0)
    assert q.delay("a", (REQUESTS,), now=0.0) == 0
    q.charge("a", REQUESTS, 1, now=0.0)
    assert q.delay("a", (REQUESTS,), now=0.0) == pytest.approx(0.2)


def test_kafka_requests_get_a_throttle_time_and_nothing_is_refused() -> None:
    q = _quotas(quota_fetch_bytes_per_s=1000)
    assert q.kafka_throttle_ms("c1", FETCH, 500) == 0
    assert q.kafka_throttle_ms("c1", FETCH, 1500) == 1000  # 1000 bytes over: 1 s
    assert q.kafka_throttle_ms("c2", FETCH, 10) == 0
    assert _quotas().kafka_throttle_ms("c1", FETCH, 10**9) == 0  # no quota configured


def test_which_requests_count_as_produce_and_fetch() -> None:
    assert kinds_of("POST", "/topics/t") == (REQUESTS, PRODUCE)
    assert kinds_of("POST", "/topics/t/partitions/3") == (REQUESTS, PRODUCE)
    assert kinds_of("POST", "/v3/clusters/c/topics/t/records") == (REQUESTS, PRODUCE)
    assert kinds_of("POST", "/v3/clusters/c/topics/t/records:batch") == (REQUESTS, PRODUCE)
    assert kinds_of("GET", "/consumers/g/instances/i/records") == (REQUESTS, FETCH)
    assert kinds_of("GET", "/v3/clusters/c/topics/t/partitions/0/records") == (REQUESTS, FETCH)
    assert kinds_of("GET", "/topics") == (REQUESTS,)


def test_overrides_per_principal_like_kafkas_client_id_quotas() -> None:
    q = _quotas(
        quota_produce_bytes_per_s=1000,
        quota_overrides="big=produce_bytes:10000;address:10.0.0.7=produce_bytes:0,requests:2",
    )
    q.charge("client:big", PRODUCE, 5000, now=0.0)
    assert q.delay("client:big", (PRODUCE,), now=0.0) == 0  # its own, larger rate
    q.charge("client:other", PRODUCE, 5000, now=0.0)
    assert q.delay("client:other", (PRODUCE,), now=0.0) == pytest.approx(4.0)  # the default
    q.charge("address:10.0.0.7", PRODUCE, 10**9, now=0.0)
    assert q.delay("address:10.0.0.7", (PRODUCE,), now=0.0) == 0  # 0: no quota for it
    for _ in range(3):
        q.charge("address:10.0.0.7", REQUESTS, 1, now=0.0)
    assert q.delay("address:10.0.0.7", (REQUESTS,), now=0.0) == pytest.approx(0.5)
    assert _quotas(quota_overrides="x=requests:1").enabled  # an override alone turns quotas on


@pytest.mark.parametrize(
    "bad", ["nobody", "a=bytes:1", "a=requests:-1", "a=requests", "=requests:1"]
)
def test_bad_overrides_fail_at_start_up(bad: str) -> None:
    with pytest.raises(ValueError, match="quota_overrides"):
        _quotas(quota_overrides=bad)


def test_kafka_requests_charge_the_authenticated_principal_not_the_client_id() -> None:
    """Two clients of one SASL user share its bucket (and its User: override); without
    authentication the client id is charged, as before."""
    q = _quotas(quota_fetch_bytes_per_s=1000, quota_overrides="User:big=fetch_bytes:100000")
    assert q.kafka_throttle_ms("c1", FETCH, 1500, "User:alice") == 500
    assert q.kafka_throttle_ms("c2", FETCH, 10, "User:alice") > 0  # same user, other client
    assert q.kafka_throttle_ms("c2", FETCH, 10) == 0  # anonymous: its client id's bucket
    assert q.kafka_throttle_ms("c1", FETCH, 50000, "User:big") == 0  # the user's override
