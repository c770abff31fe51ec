"""Spark against a coordinator with authentication and ACLs on (one coordinator process
for the module): jobs reach it as the user of the ``user``/``password`` options (never
with the agents' shared secret), whose every topic the coordinator decides (``POST
/v1/security/authorize``, and each route the job calls, ``coordinator.security.access``) before
anything is read or committed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.http.client import HttpCoordinator, http_coordinator
from coordinator.security.http import HttpSecurityStore
from coordinator.security.model import AclBinding, Check, Operation, ResourceType, basic
from coordinator.security.wire import secret_headers
from segments.errors import AuthenticationError, InvalidSecurityRequestError
from spark.options import parse_options, parse_write_options
from tests.integration.test_security_processes import run_cli
from tests.procs import Proc, free_port, lakelog_cmd, wait_http

ROOT = Path(__file__).resolve().parents[2]
SECRET = "spark-shared-secret-3-for-agents-only-0123456789"
PASSWORDS = {"admin": "admin-password-31", "alice": "alice-password-32", "bob": "bob-password-33"}
#: Topics the module's coordinator has, with the records the fixture writes to each.
TOPICS = {"team-a": 30, "team-b": 20, "team-secret": 10, "other": 5}


def _acl(principal: str, pattern: str, name: str, op: str, permission: str = "ALLOW") -> AclBinding:
    return AclBinding.of(principal, "*", "TOPIC", name, pattern, op, permission)


#: alice reads team-* but team-secret (DENY over ALLOW) and writes team-a; bob: no ACL.
ACLS = [
    _acl("User:alice", "PREFIXED", "team-", "READ"),
    _acl("User:alice", "LITERAL", "team-secret", "READ", "DENY"),
    _acl("User:alice", "LITERAL", "team-a", "WRITE"),
]


class Secured:
    def __init__(self, url: str, api_key: tuple[str, str]) -> None:
        self.url = url
        self.api_key = api_key

    def admin(self) -> HttpCoordinator:
        """The coordinator as the super user admin (a user: no shared secret)."""
        return http_coordinator(
            self.url, headers={"authorization": basic("admin", PASSWORDS["admin"])}
        )

    def high_watermarks(self) -> dict[str, int]:
        with self.admin() as c:
            return {t: c.offsets(t, 0).high_watermark for t in TOPICS}

    def options(self, user: str | None = None, password: str | None = None) -> dict[str, str]:
        opts = {"coordinator": self.url}
        if user is not None:
            opts |= {"user": user, "password": password or PASSWORDS[user]}
        return opts


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[Secured]:
    """The coordinator (authentication basic, authorization acl, super user admin), its
    users, alice's API key, the ACLs, and TOPICS written by admin in one Spark job."""
    tmp = tmp_path_factory.mktemp("spark-sec")
    (tmp / "data").mkdir()
    made = run_cli(
        "users",
        "create",
        "admin",
        "--password-stdin",
        "--db",
        f"sqlite:///{tmp / 'meta.db'}",
        stdin=PASSWORDS["admin"] + "\n",
    )
    assert made.returncode == 0, made.stderr
    port = free_port()
    proc = Proc(
        lakelog_cmd(
            "coordinator",
            "--db",
            f"sqlite:///{tmp / 'meta.db'}",
            "--port",
            str(port),
            "--store",
            f"file://{tmp / 'data'}",
            "--authorization",  # the flag here, super users from the variable
            "acl",
        ),
        tmp / "coordinator.log",
        env={
            "PYTHONPATH": str(ROOT),
            "LAKELOG_AUTHENTICATION": "basic",
            "LAKELOG_COORDINATOR_SECRET": SECRET,
            "LAKELOG_SUPER_USERS": "User:admin",
        },
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", timeout=90, proc=proc.popen)
        secured = Secured(url, ("", ""))
        with secured.admin() as c:  # managing needs the super user's own credential
            security = HttpSecurityStore(c)
            for name, password in PASSWORDS.items():
                if name != "admin":
                    security.create_user(name, password)
            key = security.create_api_key("alice", "spark")
            security.create_acls(ACLS)
        with http_coordinator(url, headers=secret_headers(SECRET)) as agent:  # an agent's job
            for topic in TOPICS:
                agent.create_topic(topic, 1)
        secured = Secured(url, (key.key.key_id, key.secret))
        rows = [(t, b"%s-%03d" % (t.encode(), i)) for t, n in TOPICS.items() for i in range(n)]
        df = spark.createDataFrame(rows, "topic string, value binary")
        df.write.format("lakelog").options(**secured.options("admin")).mode("append").save()
        yield secured
    finally:
        proc.stop()
    output = proc.output()
    assert SECRET not in output
    assert not [p for p in PASSWORDS.values() if p in output]


def read(spark: Any, options: dict[str, str], **more: str) -> list[tuple[str, bytes]]:
    rows = spark.read.format("lakelog").options(**options, **more).load().collect()
    return sorted((r["topic"], bytes(r["value"])) for r in rows)


def values(topic: str) -> list[tuple[str, bytes]]:
    return [(topic, b"%s-%03d" % (topic.encode(), i)) for i in range(TOPICS[topic])]


def test_a_super_user_writes_and_reads_everything(spark: Any, secured: Secured) -> None:
    rows = read(spark, secured.options("admin"), subscribePattern=".*")
    assert rows == sorted(r for t in TOPICS for r in values(t))


def test_an_allowed_read_with_a_password_or_an_api_key(spark: Any, secured: Secured) -> None:
    assert read(spark, secured.options("alice"), subscribe="team-a") == values("team-a")
    key_id, key_secret = secured.api_key
    assert read(spark, secured.options(key_id, key_secret), subscribe="team-b") == values("team-b")


def test_a_read_without_an_acl_is_denied(spark: Any, secured: Secured) -> None:
    with pytest.raises(Exception, match=r"TOPIC_AUTHORIZATION_FAILED: User:bob .* READ .*'team-a'"):
        read(spark, secured.options("bob"), subscribe="team-a")
    # A topic that does not exist is denied the same way: a denied job learns nothing.
    with pytest.raises(Exception, match=r"TOPIC_AUTHORIZATION_FAILED: User:bob .*'nowhere'"):
        read(spark, secured.options("bob"), subscribe="nowhere")


def test_deny_wins_over_a_prefixed_allow(spark: Any, secured: Secured) -> None:
    """team-secret: ALLOW READ on prefix team-, DENY READ on the name. Alice may still
    DESCRIBE it (an ALLOW of READ implies DESCRIBE; a DENY of READ denies READ only), so
    a pattern matching it fails too, as a Kafka consumer's fetch would."""
    with pytest.raises(
        Exception, match=r"TOPIC_AUTHORIZATION_FAILED: User:alice .* READ .*'team-secret'"
    ):
        read(spark, secured.options("alice"), subscribe="team-a,team-secret")
    with pytest.raises(Exception, match=r"TOPIC_AUTHORIZATION_FAILED: .*'team-secret'"):
        read(spark, secured.options("alice"), subscribePattern="team-.*")


def test_a_pattern_leaves_out_topics_it_may_not_describe(spark: Any, secured: Secured) -> None:
    """other matches the pattern and holds records, but alice may not DESCRIBE it: a
    Kafka pattern subscription never sees it, and neither does this read."""
    rows = read(spark, secured.options("alice"), subscribePattern="team-[ab]|other")
    assert rows == sorted(values("team-a") + values("team-b"))
    assert read(spark, secured.options("admin"), subscribe="other") == values("other")


def test_a_stream_reads_what_it_may_and_no_more(
    spark: Any, secured: Secured, tmp_path: Path
) -> None:
    def stream(options: dict[str, str], name: str) -> Any:
        got: list[Any] = []
        query = (
            spark.readStream.format("lakelog")
            .options(**options, startingOffsets="earliest")
            .load()
            .writeStream.foreachBatch(lambda df, _id: got.extend(df.collect()))
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        return query, sorted((r["topic"], bytes(r["value"])) for r in got)

    query, rows = stream(secured.options("alice") | {"subscribePattern": "team-[ab]|other"}, "a")
    assert query.exception() is None
    assert rows == sorted(values("team-a") + values("team-b"))
    with pytest.raises(Exception, match=r"TOPIC_AUTHORIZATION_FAILED: User:bob .*'team-a'"):
        stream(secured.options("bob") | {"subscribe": "team-a"}, "b")


def test_an_allowed_write(spark: Any, secured: Secured) -> None:
    before = secured.high_watermarks()
    df = spark.createDataFrame([(b"alice-%d" % i,) for i in range(7)], "value binary")
    df.write.format("lakelog").options(**secured.options("alice"), topic="team-a").mode(
        "append"
    ).save()
    after = secured.high_watermarks()
    assert after == before | {"team-a": before["team-a"] + 7}


def test_a_denied_write_writes_nothing(spark: Any, secured: Secured) -> None:
    """With the topic option the writer is refused before any task runs; with a topic
    column every topic the tasks wrote is checked before anything is committed, so the
    allowed topic (team-a) gets nothing either."""
    before = secured.high_watermarks()
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(
        Exception, match=r"TOPIC_AUTHORIZATION_FAILED: User:bob .* WRITE .*'team-a'"
    ):
        df.write.format("lakelog").options(**secured.options("bob"), topic="team-a").mode(
            "append"
        ).save()
    mixed = spark.createDataFrame(
        [("team-a", b"a%d" % i) for i in range(5)] + [("team-b", b"b%d" % i) for i in range(5)],
        "topic string, value binary",
    ).repartition(2)
    with pytest.raises(
        Exception, match=r"TOPIC_AUTHORIZATION_FAILED: User:alice .* WRITE .*'team-b'"
    ):
        mixed.write.format("lakelog").options(**secured.options("alice")).mode("append").save()
    assert secured.high_watermarks() == before


def test_a_denied_stream_write_writes_nothing(spark: Any, secured: Secured, tmp_path: Path) -> None:
    before = secured.high_watermarks()
    source = (
        spark.readStream.format("lakelog")
        .options(**secured.options("admin"), subscribe="other", startingOffsets="earliest")
        .load()
        .select("value")
    )
    with pytest.raises(Exception, match=r"TOPIC_AUTHORIZATION_FAILED: User:alice .*'team-b'"):
        query = (
            source.writeStream.format("lakelog")
            .options(**secured.options("alice"), topic="team-b")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
    assert secured.high_watermarks() == before


def test_authorization_on_needs_a_credential(spark: Any, secured: Secured) -> None:
    """A job without a credential is nobody: refused, saying which options it needs. The
    agents' shared secret is no option of a job at all."""
    with pytest.raises(Exception, match=r"'user' and 'password'"):
        read(spark, secured.options(), subscribe="team-a")
    with pytest.raises(Exception, match=r"'coordinator.secret' is gone"):
        read(spark, secured.options("alice") | {"coordinator.secret": SECRET}, subscribe="team-a")
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception, match=r"'user' and 'password'"):
        df.write.format("lakelog").options(**secured.options(), topic="team-a").mode(
            "append"
        ).save()


def test_a_bad_password_is_refused(spark: Any, secured: Secured) -> None:
    wrong = "not-alices-password"
    with pytest.raises(
        Exception, match=r"refused the credential of option 'user' \('alice'\)"
    ) as e:
        read(spark, secured.options("alice", wrong), subscribe="team-a")
    assert wrong not in str(e.value)


def test_the_authorize_route_decides_with_the_coordinators_acls(secured: Secured) -> None:
    checks = [
        Check(Operation.READ, ResourceType.TOPIC, "team-a"),
        Check(Operation.READ, ResourceType.TOPIC, "team-secret"),
        Check(Operation.DESCRIBE, ResourceType.TOPIC, "team-secret"),
        Check(Operation.WRITE, ResourceType.TOPIC, "team-b"),
        Check(Operation.READ, ResourceType.TOPIC, "other"),
        Check(Operation.READ, ResourceType.GROUP, "team-a"),
    ]
    with secured.admin() as c:
        security = HttpSecurityStore(c)
        alice = security.authorize("alice", PASSWORDS["alice"], checks)
        assert (alice.principal, alice.authorization) == ("User:alice", "acl")
        assert alice.allowed == (True, False, True, False, False, False)
        key_id, key_secret = secured.api_key
        assert security.authorize(key_id, key_secret, checks) == alice
        admin = security.authorize("admin", PASSWORDS["admin"], checks)
        assert admin.principal == "User:admin" and all(admin.allowed)
        bob = security.authorize("bob", PASSWORDS["bob"], checks)
        assert not any(bob.allowed)
        with pytest.raises(AuthenticationError, match="user name and password"):
            security.authorize(None, None, checks)
        with pytest.raises(AuthenticationError, match="Authentication failed"):
            security.authorize("alice", "wrong-password", checks)
        with pytest.raises(InvalidSecurityRequestError, match="invalid operation"):
            c.request(
                "POST",
                "/v1/security/authorize",
                body={
                    "name": "alice",
                    "secret": PASSWORDS["alice"],
                    "checks": [
                        {"operation": "EAT", "resource_type": "TOPIC", "resource_name": "t"}
                    ],
                },
                idempotent=True,
            )
    # Without any credential the route is closed, as every other.
    with (
        http_coordinator(secured.url) as anyone,
        pytest.raises(AuthenticationError, match="HTTP Basic"),
    ):
        HttpSecurityStore(anyone).authorize("alice", PASSWORDS["alice"], checks)


def test_credentials_are_never_printed() -> None:
    opts = parse_options(
        {
            "coordinator": "https://c:8083",
            "user": "alice",
            "password": PASSWORDS["alice"],
            "subscribe": "t",
        }
    )
    assert opts.connection.password == PASSWORDS["alice"]
    assert PASSWORDS["alice"] not in repr(opts)
    assert "alice" in repr(opts)


def test_a_password_is_never_sent_in_clear_to_another_host() -> None:
    plain = {"coordinator": "http://c:8083", "user": "alice", "password": "p", "subscribe": "t"}
    with pytest.raises(ValueError, match=r"http:// to another host"):
        parse_options(plain)
    assert parse_options(plain | {"coordinator.allowPlaintext": "true"}).connection.user == "alice"
    local = plain | {"coordinator": "http://127.0.0.1:8083"}
    assert parse_options(local).connection.user == "alice"


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"coordinator": "https://c", "user": "alice"}, "set both options 'user' and 'password'"),
        ({"coordinator": "https://c", "password": "p"}, "set both options 'user' and 'password'"),
        (
            {"db": "sqlite:///x.db", "store": "file:///x", "user": "a", "password": "p"},
            "'db' reads the database directly",
        ),
    ],
)
def test_credential_options_go_together(options: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_write_options({**options, "topic": "t"})
