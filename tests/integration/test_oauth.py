"""OAuth bearer JWTs checked against a JWKS file (joserfc): on REST (Authorization:
Bearer) and as SASL/OAUTHBEARER on the Kafka listener (confluent-kafka's oauth_cb); the
principal comes from the configured claim."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka import Producer
from joserfc import jwt
from joserfc.jwk import KeySet, OctKey, RSAKey

from tests.integration.test_security_processes import start_secured_serve
from tests.procs import Proc

ADMIN_PASSWORD = "oauth-admin-password"
ISSUER, AUDIENCE = "https://idp.test", "lakelog"


@dataclass
class Served:
    rest: str
    bootstrap: str
    key: RSAKey
    proc: Proc


def token(
    key: Any, *, sub: str = "svc-orders", exp_in: float = 300, alg: str = "RS256", **claims: Any
) -> str:
    now = int(time.time())
    body = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "email": sub,
        "exp": now + int(exp_in),
        "iat": now,
        **claims,
    }
    return jwt.encode({"alg": alg, "kid": key.kid}, body, key)


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def admin() -> dict[str, str]:
    return {
        "Authorization": "Basic " + base64.b64encode(f"admin:{ADMIN_PASSWORD}".encode()).decode()
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("oauth")
    key = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    jwks = tmp / "jwks.json"
    jwks.write_bytes(orjson.dumps(KeySet([key]).as_dict(private=False)))
    proc, port, kport = start_secured_serve(
        tmp,
        "admin",
        ADMIN_PASSWORD,
        {
            "LAKELOG_OAUTH_JWKS": str(jwks),
            "LAKELOG_OAUTH_ISSUER": ISSUER,
            "LAKELOG_OAUTH_AUDIENCE": AUDIENCE,
            "LAKELOG_OAUTH_PRINCIPAL_CLAIM": "email",
            "LAKELOG_AUTH_MAX_FAILURES": "1000",
            "LAKELOG_SUPER_USERS": "User:admin;User:ops-bot",
        },
    )
    rest = f"http://127.0.0.1:{port}"
    try:
        cid = httpx.get(f"{rest}/v3/clusters", headers=admin()).json()["data"][0]["cluster_id"]
        for name in ("orders", "payroll"):
            r = httpx.post(
                f"{rest}/v3/clusters/{cid}/topics",
                json={"topic_name": name, "partitions_count": 1},
                headers=admin(),
            )
            assert r.status_code == 201
        yield Served(rest, f"127.0.0.1:{kport}", key, proc)
    finally:
        proc.stop()


def test_rest_bearer_tokens(served: Served) -> None:
    record = {"records": [{"value": "aGk="}]}
    ct = {"Content-Type": "application/vnd.kafka.binary.v2+json"}
    ok = httpx.post(
        f"{served.rest}/topics/orders", json=record, headers={**bearer(token(served.key)), **ct}
    )
    assert ok.status_code == 200, ok.text
    other_key = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    secret = OctKey.generate_key(256, parameters={"kid": "k1"})
    refused = {
        "expired": token(served.key, exp_in=-60),
        "other key": token(other_key),
        "other audience": token(served.key, aud="someone-else"),
        "other issuer": token(served.key, iss="https://evil.test"),
        "HS256": token(secret, alg="HS256"),
        "garbage": "not.a.jwt",
    }
    for why, value in refused.items():
        r = httpx.get(f"{served.rest}/topics", headers=bearer(value))
        assert r.status_code == 401, why
        assert r.headers["www-authenticate"] == 'Bearer realm="lakelog", error="invalid_token"', why
        assert r.json()["error_code"] == 40101
    # The configured claim (email) is the principal: ops-bot is a super user, svc-orders not.
    users = f"{served.rest}/security/users"
    assert httpx.get(users, headers=bearer(token(served.key, sub="ops-bot"))).status_code == 200
    assert httpx.get(users, headers=bearer(token(served.key))).status_code == 403
    assert (
        httpx.get(f"{served.rest}/topics", headers=bearer(token(served.key, sub="a b"))).status_code
        == 401
    )


def test_kafka_oauthbearer(served: Served) -> None:
    def oauth_cb(_config: str) -> tuple[str, float]:
        return token(served.key), time.time() + 300

    errors: list[Any] = []
    p = Producer(
        {
            "bootstrap.servers": served.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": oauth_cb,
            "error_cb": errors.append,
        }
    )
    reports: list[Any] = []
    p.produce("orders", value=b"via oauthbearer", on_delivery=lambda e, m: reports.append(e))
    assert p.flush(30) == 0 and reports == [None], errors

    bad: list[Any] = []
    q = Producer(
        {
            "bootstrap.servers": served.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": lambda _c: (token(served.key, exp_in=-60), time.time() + 300),
            "error_cb": bad.append,
            "message.timeout.ms": 3000,
        }
    )
    q.produce("orders", value=b"must not land")
    q.flush(10)
    assert any("Authentication failed" in str(e) for e in bad), bad
    end = httpx.get(f"{served.rest}/topics/orders/partitions/0/offsets", headers=admin()).json()[
        "end_offset"
    ]
    assert end == 2  # the REST record and the OAUTHBEARER one
