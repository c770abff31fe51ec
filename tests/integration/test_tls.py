"""TLS with a test CA (trustme): the coordinator over HTTPS (agents verify it with
tls_ca_file), the agent's REST API over HTTPS, and its Kafka listener as SASL_SSL for
confluent-kafka, kafka-python and aiokafka."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from aiokafka import AIOKafkaProducer
from confluent_kafka import Producer
from kafka import KafkaProducer

from tests.coordinator_calls import call
from tests.procs import ROOT, Proc, agent_args, create_user, free_port, lakelog_cmd

PASSWORD = "tls-user-password-1"
SECRET = "tls-shared-secret-9-0123456789abcdef0123"
#: Kafka's ssl.principal.mapping.rules: service certificates (OU=ServiceUsers) become
#: svc-<cn>, lowered; any other certificate its CN (the default without rules).
MAPPING_RULES = r"RULE:^CN=([^,]+),OU=ServiceUsers,.*$/svc-$1/L,RULE:^CN=([^,]+)(,.*)?$/$1/"


@dataclass
class TlsCluster:
    coordinator: str
    rest: str
    bootstrap: str
    ca_file: str
    procs: list[Proc]


def wait_https(url: str, ca_file: str, proc: Proc, timeout: float = 90.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.popen.poll() is None, proc.output()
        try:
            if (
                httpx.get(
                    url, verify=ssl.create_default_context(cafile=ca_file), timeout=1
                ).status_code
                < 500
            ):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer: {proc.output()}")


def basic() -> dict[str, str]:
    """The super user's credential."""
    return {"Authorization": "Basic " + base64.b64encode(f"tuser:{PASSWORD}".encode()).decode()}


def allow(cluster: TlsCluster, principal: str, operation: str, topic: str) -> None:
    """An ALLOW ACL made by the super user over REST v3."""
    verify = ssl.create_default_context(cafile=cluster.ca_file)
    cid = httpx.get(f"{cluster.rest}/v3/clusters", headers=basic(), verify=verify).json()["data"][
        0
    ]["cluster_id"]
    acl = {
        "resource_type": "TOPIC",
        "resource_name": topic,
        "pattern_type": "LITERAL",
        "principal": principal,
        "host": "*",
        "operation": operation,
        "permission": "ALLOW",
    }
    made = httpx.post(
        f"{cluster.rest}/v3/clusters/{cid}/acls", json=acl, headers=basic(), verify=verify
    )
    assert made.status_code == 201, made.text


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    tmp = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    client = ca.issue_cert("svc-mtls.test", common_name="svc-mtls")
    ca.private_key_pem.write_to_path(str(tmp / "ca.key"))
    client.private_key_and_cert_chain_pem.write_to_path(str(tmp / "client.pem"))
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_pem.write_to_path(str(key_file))
    cert_file.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    db = f"sqlite:///{tmp / 'meta.db'}"
    create_user(db, "tuser", PASSWORD)
    env = {
        "PYTHONPATH": str(ROOT),
        "LAKELOG_AUTHENTICATION": "basic",
        "LAKELOG_AUTHORIZATION": "acl",
        "LAKELOG_SUPER_USERS": "User:tuser",
        "LAKELOG_COORDINATOR_SECRET": SECRET,
        "LAKELOG_TLS_CERT_FILE": str(cert_file),
        "LAKELOG_TLS_KEY_FILE": str(key_file),
    }
    cport, aport, kport = free_port(), free_port(), free_port()
    coordinator = Proc(
        lakelog_cmd("coordinator", "--db", db, "--port", str(cport)), tmp / "c.log", env=env
    )
    agent = Proc(
        lakelog_cmd(*agent_args(f"https://127.0.0.1:{cport}", tmp, aport, kport)),
        tmp / "a.log",
        env={
            **env,
            "LAKELOG_TLS_CA_FILE": str(ca_file),
            "LAKELOG_TLS_CLIENT_CA_FILE": str(ca_file),
            "LAKELOG_TLS_PRINCIPAL_MAPPING_RULES": MAPPING_RULES,
        },
    )
    procs = [coordinator, agent]
    try:
        wait_https(f"https://127.0.0.1:{cport}/health", str(ca_file), coordinator)
        wait_https(f"https://127.0.0.1:{aport}/health", str(ca_file), agent)
        yield TlsCluster(
            f"https://127.0.0.1:{cport}",
            f"https://127.0.0.1:{aport}",
            f"127.0.0.1:{kport}",
            str(ca_file),
            procs,
        )
    finally:
        for p in procs:
            p.stop()


def test_rest_and_coordinator_over_https_only(tls_cluster: TlsCluster) -> None:
    verify = ssl.create_default_context(cafile=tls_cluster.ca_file)
    r = httpx.get(f"{tls_cluster.rest}/v3/clusters", headers=basic(), verify=verify)
    assert r.status_code == 200
    cid = r.json()["data"][0]["cluster_id"]
    made = httpx.post(
        f"{tls_cluster.rest}/v3/clusters/{cid}/topics",
        json={"topic_name": "tls-topic", "partitions_count": 1},
        headers=basic(),
        verify=verify,
    )
    assert made.status_code == 201, made.text  # the agent reached the coordinator over HTTPS
    # Plaintext to the TLS ports fails; a client without the CA refuses the certificate.
    for url in (tls_cluster.rest, tls_cluster.coordinator):
        with pytest.raises(httpx.HTTPError):
            httpx.get(url.replace("https://", "http://") + "/health", timeout=3)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=3, verify=True)
    with httpx.Client(base_url=tls_cluster.coordinator, verify=verify) as coordinator:
        assert call(coordinator, "list_topics").status_code == 401


def test_kafka_sasl_ssl_clients(tls_cluster: TlsCluster) -> None:
    p = Producer(
        {
            "bootstrap.servers": tls_cluster.bootstrap,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": tls_cluster.ca_file,
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "tuser",
            "sasl.password": PASSWORD,
        }
    )
    reports: list[Any] = []
    p.produce("tls-topic", value=b"over tls", on_delivery=lambda e, m: reports.append(e))
    assert p.flush(30) == 0 and reports == [None]

    kp = KafkaProducer(
        bootstrap_servers=tls_cluster.bootstrap,
        security_protocol="SASL_SSL",
        ssl_cafile=tls_cluster.ca_file,
        sasl_mechanism="PLAIN",
        sasl_plain_username="tuser",
        sasl_plain_password=PASSWORD,
        enable_idempotence=False,
    )
    assert kp.send("tls-topic", b"kafka-python over tls").get(timeout=30).offset >= 0
    kp.close()

    async def aio() -> int:
        from aiokafka.helpers import create_ssl_context

        prod = AIOKafkaProducer(
            bootstrap_servers=tls_cluster.bootstrap,
            security_protocol="SASL_SSL",
            ssl_context=create_ssl_context(cafile=tls_cluster.ca_file),
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="tuser",
            sasl_plain_password=PASSWORD,
        )
        await prod.start()
        try:
            meta = await prod.send_and_wait("tls-topic", b"aiokafka over tls", partition=0)
            return int(meta.offset)
        finally:
            await prod.stop()

    assert asyncio.run(aio()) >= 0
    verify = ssl.create_default_context(cafile=tls_cluster.ca_file)
    offsets = httpx.get(
        f"{tls_cluster.rest}/topics/tls-topic/partitions/0/offsets", headers=basic(), verify=verify
    )
    assert offsets.json()["end_offset"] >= 3
    logs = "".join(p.output() for p in tls_cluster.procs)
    assert PASSWORD not in logs and SECRET not in logs


def test_kafka_mtls_client_certificate_is_the_principal(tls_cluster: TlsCluster) -> None:
    """security.protocol=SSL with a client certificate of the CA: no SASL, yet served; the
    same without a certificate is refused (the listener needs a principal)."""
    allow(tls_cluster, "User:svc-mtls", "WRITE", "tls-topic")
    client_pem = str(Path(tls_cluster.ca_file).with_name("client.pem"))
    conf = {
        "bootstrap.servers": tls_cluster.bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": tls_cluster.ca_file,
        "message.timeout.ms": 5000,
    }
    ok = Producer({**conf, "ssl.certificate.location": client_pem, "ssl.key.location": client_pem})
    reports: list[Any] = []
    ok.produce("tls-topic", value=b"mtls", on_delivery=lambda e, m: reports.append(e))
    assert ok.flush(30) == 0 and reports == [None]
    anonymous = Producer(conf)
    refused: list[Any] = []
    anonymous.produce("tls-topic", value=b"no cert", on_delivery=lambda e, m: refused.append(e))
    anonymous.flush(10)
    assert refused and refused[0] is not None


def test_rest_mtls_client_certificate_is_the_principal(
    tls_cluster: TlsCluster, tmp_path: Path
) -> None:
    """HTTPS with a client certificate of tls_client_ca_file's CA and no Authorization
    header: served as User:<CN> (denied until an ACL names User:svc-mtls, then allowed);
    without a certificate: 401; a credential given with the certificate is checked (and
    wins); a certificate of another CA fails the handshake."""
    client_pem = str(Path(tls_cluster.ca_file).with_name("client.pem"))
    with_cert = ssl.create_default_context(cafile=tls_cluster.ca_file)
    with_cert.load_cert_chain(client_pem)
    verify = ssl.create_default_context(cafile=tls_cluster.ca_file)
    url = f"{tls_cluster.rest}/v3/clusters"
    cid = httpx.get(url, headers=basic(), verify=verify).json()["data"][0]["cluster_id"]
    made = httpx.post(
        f"{url}/{cid}/topics",
        json={"topic_name": "mtls-rest", "partitions_count": 1},
        headers=basic(),
        verify=verify,
    )
    assert made.status_code == 201, made.text
    topic_url = f"{url}/{cid}/topics/mtls-rest"
    denied = httpx.get(topic_url, verify=with_cert)  # authenticated (not 401), no ACL yet
    assert denied.status_code == 403 and denied.json()["error_code"] == 40301, denied.text
    allow(tls_cluster, "User:svc-mtls", "DESCRIBE", "mtls-rest")
    served = httpx.get(topic_url, verify=with_cert)
    assert served.status_code == 200, served.text
    assert served.json()["topic_name"] == "mtls-rest"
    plain = ssl.create_default_context(cafile=tls_cluster.ca_file)
    assert httpx.get(url, verify=plain).status_code == 401
    bad = {"Authorization": "Basic " + base64.b64encode(b"tuser:wrong-password").decode()}
    assert httpx.get(url, verify=with_cert, headers=bad).status_code == 401
    # A certificate of the CA whose common name is no user name: not a principal, but the
    # connection still serves a client that authenticates otherwise.
    odd = trustme.CA.from_pem(  # the same CA, from its files
        Path(tls_cluster.ca_file).read_bytes(),
        Path(tls_cluster.ca_file).with_name("ca.key").read_bytes(),
    ).issue_cert("odd.test", common_name="John Smith")
    odd_pem = tmp_path / "odd.pem"
    odd.private_key_and_cert_chain_pem.write_to_path(str(odd_pem))
    with_odd = ssl.create_default_context(cafile=tls_cluster.ca_file)
    with_odd.load_cert_chain(str(odd_pem))
    assert httpx.get(url, verify=with_odd).status_code == 401
    assert httpx.get(url, verify=with_odd, headers=basic()).status_code == 200
    stranger = trustme.CA().issue_cert("other.test", common_name="svc-mtls")
    stranger_pem = tmp_path / "stranger.pem"
    stranger.private_key_and_cert_chain_pem.write_to_path(str(stranger_pem))
    forged = ssl.create_default_context(cafile=tls_cluster.ca_file)
    forged.load_cert_chain(str(stranger_pem))
    with pytest.raises(httpx.TransportError):
        httpx.get(url, verify=forged)


def test_principal_mapping_rules_name_certificate_principals(
    tls_cluster: TlsCluster, tmp_path: Path
) -> None:
    """A certificate CN=Billing,OU=ServiceUsers,O=Acme is User:svc-billing under the
    agent's mapping rules, on the Kafka listener and over HTTPS: its ACL, for
    User:svc-billing, lets it in; under the CN alone (User:Billing) it would be denied."""
    verify = ssl.create_default_context(cafile=tls_cluster.ca_file)
    url = f"{tls_cluster.rest}/v3/clusters"
    cid = httpx.get(url, headers=basic(), verify=verify).json()["data"][0]["cluster_id"]
    made = httpx.post(
        f"{url}/{cid}/topics", json={"topic_name": "tls-mapped"}, headers=basic(), verify=verify
    )
    assert made.status_code == 201, made.text
    allow(tls_cluster, "User:svc-billing", "WRITE", "tls-mapped")
    ca_file = Path(tls_cluster.ca_file)
    cert = trustme.CA.from_pem(
        ca_file.read_bytes(), ca_file.with_name("ca.key").read_bytes()
    ).issue_cert(
        "billing.test",
        common_name="Billing",
        organization_unit_name="ServiceUsers",
        organization_name="Acme",
    )
    pem = tmp_path / "billing.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(pem))
    conf = {
        "bootstrap.servers": tls_cluster.bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": tls_cluster.ca_file,
        "ssl.certificate.location": str(pem),
        "ssl.key.location": str(pem),
        "message.timeout.ms": 10000,
    }
    producer = Producer(conf)
    reports: list[Any] = []
    producer.produce("tls-mapped", value=b"mapped", on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(30) == 0 and reports == [None]
    with_cert = ssl.create_default_context(cafile=tls_cluster.ca_file)
    with_cert.load_cert_chain(str(pem))
    served = httpx.get(f"{url}/{cid}/topics/tls-mapped", verify=with_cert)
    assert served.status_code == 200, served.text


def test_certificate_principal_is_the_common_name() -> None:
    from service.kafka.sasl import certificate_principal

    subject = ((("organizationName", "Example"),), (("commonName", "svc-mtls"),))
    assert certificate_principal({"subject": subject}) == "User:svc-mtls"
    assert certificate_principal(None) is None
    assert certificate_principal({}) is None
