"""``lakelog users``, ``lakelog api-keys`` and ``lakelog acls`` (issue 15).

Each works either on the metadata database directly (``--db``: the first super user
is made this way, as ``lakelog janitor`` runs on the database) or over an agent's
REST API (``--url``) as a super user, with the credentials in ``LAKELOG_USER`` and
``LAKELOG_PASSWORD`` (never on the command line). With neither, the agent at the default
URL, or when none answers there, the database ``lakelog serve`` uses in this directory.
``lakelog acls`` speaks kafka-acls' words: ``--allow-principal``, ``--deny-principal``,
``--operation``, ``--topic``, ``--group``, ``--cluster``, ``--resource-pattern-type``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, NoReturn
from urllib.parse import quote

import typer

from coordinator.security.model import AclBinding, AclFilter
from coordinator.security.store import (
    ApiKeyInfo,
    ApiKeySecret,
    SecurityStore,
    SqlSecurityStore,
    UserInfo,
)
from coordinator.security.wire import (
    ACL_KEYS,
    acl_from_json,
    acl_to_json,
    key_from_json,
    user_from_json,
)
from segments.errors import LakelogError

if TYPE_CHECKING:
    from service.cli import Rest

users_app = typer.Typer(
    help="Users (name and password) kept by the coordinator: on --db, or over --url as a "
    "super user (LAKELOG_USER, LAKELOG_PASSWORD)."
)
api_keys_app = typer.Typer(
    help="API keys (id and secret, shown once) of users: on --db, or over --url as a super user."
)
acls_app = typer.Typer(help="Kafka ACLs (like kafka-acls): on --db, or over --url.")

DbOpt = Annotated[
    str | None, typer.Option(help="Metadata store URL (sqlite:///... or postgresql://...).")
]
UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Base URL of a lakelog agent [default: LAKELOG_URL, else http://localhost:8082, "
        "else, when nothing answers there, lakelog serve's database here].",
    ),
]
UserArg = Annotated[str, typer.Argument(help="User name.")]
KeyIdArg = Annotated[str, typer.Argument(help="API key id.")]
PasswordStdinOpt = Annotated[
    bool, typer.Option("--password-stdin", help="Read the password from standard input.")
]


def _fail(message: str, code: int = 1) -> NoReturn:
    # service.cli imports this module at its top, so its helpers are imported late.
    from service.cli import _fail as fail

    fail(message, code)


class RestAdmin:
    """The principal and ACL calls of :class:`SecurityStore` over an agent's REST API."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest

    def create_user(self, name: str, password: str) -> UserInfo:
        body = {"name": name, "password": password}
        return user_from_json(self.rest.json("POST", "/security/users", json=body))

    def set_password(self, name: str, password: str) -> None:
        path = f"/security/users/{quote(name, safe='')}/password"
        self.rest.request("PUT", path, json={"password": password})

    def delete_user(self, name: str) -> None:
        self.rest.request("DELETE", f"/security/users/{quote(name, safe='')}")

    def list_users(self) -> list[UserInfo]:
        return [user_from_json(u) for u in self.rest.json("GET", "/security/users")["users"]]

    def create_api_key(self, owner: str, description: str = "") -> ApiKeySecret:
        body = {"owner": owner, "description": description}
        data = self.rest.json("POST", "/security/api-keys", json=body)
        return ApiKeySecret(key_from_json(data["api_key"]), str(data["secret"]))

    def list_api_keys(self, owner: str | None = None) -> list[ApiKeyInfo]:
        params = {"owner": owner} if owner is not None else {}
        data = self.rest.json("GET", "/security/api-keys", params=params)
        return [key_from_json(k) for k in data["api_keys"]]

    def rotate_api_key(self, key_id: str) -> ApiKeySecret:
        data = self.rest.json("POST", f"/security/api-keys/{quote(key_id, safe='')}/rotate")
        return ApiKeySecret(key_from_json(data["api_key"]), str(data["secret"]))

    def delete_api_key(self, key_id: str) -> None:
        self.rest.request("DELETE", f"/security/api-keys/{quote(key_id, safe='')}")

    def create_acls(self, bindings: Sequence[AclBinding]) -> None:
        data = [acl_to_json(b) for b in bindings]
        self.rest.request("POST", self.rest.cluster("/acls:batch"), json={"data": data})

    def _each(self, method: str, filters: Sequence[AclFilter]) -> list[AclBinding]:
        found: set[AclBinding] = set()
        for f in filters:
            params = {k: v for k, v in _filter_params(f).items() if v is not None}
            data = self.rest.json(method, self.rest.cluster("/acls"), params=params)
            found.update(acl_from_json(a) for a in data["data"])
        return sorted(found)

    def describe_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        return self._each("GET", filters)

    def delete_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        return self._each("DELETE", filters)


def _filter_params(f: AclFilter) -> dict[str, str | None]:
    """A filter as the v3 query (ANY where the filter takes any value)."""
    params: dict[str, str | None] = {}
    for k in ACL_KEYS:
        v = getattr(f, k)
        if k == "resource_name":
            params[k] = v
        elif k in ("principal", "host"):
            params[k] = None if v is None else str(v)
        else:
            params[k] = "ANY" if v is None else str(v)
    return params


def _server_answers(url: str) -> bool:
    """Whether anything answers HTTP at ``url`` (an agent, with or without security)."""
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=5.0)
    except httpx.TransportError:
        return False
    return True


def _serve_database() -> str:
    """The database ``lakelog serve`` would open here: ``LAKELOG_DB``, the config file
    (``LAKELOG_CONFIG``), else its default; its directory is made, as serve makes it."""
    from service.cli import _ensure_local_dirs, _load
    from service.settings import Settings

    db = _load(Settings, "serve", {}).db
    _ensure_local_dirs(db, None)
    return db


@contextmanager
def _admin(db: str | None, url: str | None) -> Iterator[SecurityStore | RestAdmin]:
    """The metadata database (``--db``) or an agent's API (``--url``); errors exit 1.

    Neither given: the agent at ``LAKELOG_URL`` (default ``http://localhost:8082``), and
    when nothing answers there, the database ``lakelog serve`` uses in this directory (so
    the first super user can be made before the first start; the command says so).
    """
    from service.cli import DEFAULT_URL, Rest

    if db and url:
        _fail("give --db or --url, not both", code=2)
    if not db and not url:
        url = os.environ.get("LAKELOG_URL") or DEFAULT_URL
        if not _server_answers(url):
            db = _serve_database()
            typer.echo(
                f"No server answers at {url}: using lakelog serve's database {db}.", err=True
            )
    try:
        if db:
            from coordinator.db import open_database

            database = open_database(db)
            try:
                yield SqlSecurityStore(database)
            finally:
                database.close()
        else:
            with Rest(url or DEFAULT_URL) as rest:
                yield RestAdmin(rest)
    except LakelogError as e:
        _fail(e.message)


def _read_password(password_stdin: bool) -> str:
    if not password_stdin:
        _fail("pass the password on standard input with --password-stdin", code=2)
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        _fail("no password on standard input", code=2)
    return password


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- users --------------------------------------------------------------------------


@users_app.command("create")
def users_create(
    name: Annotated[str, typer.Argument(help="User name (letters, digits, ._@-).")],
    password_stdin: PasswordStdinOpt = False,
    db: DbOpt = None,
    url: UrlOpt = None,
    exist_ok: Annotated[
        bool,
        typer.Option(
            "--exist-ok",
            help="A user of that name already there is success (its password unchanged): "
            "for start-up scripts that run on every start.",
        ),
    ] = False,
) -> None:
    """Create a user; its principal is User:NAME."""
    password = _read_password(password_stdin)
    with _admin(db, url) as admin:
        if exist_ok and any(u.name == name for u in admin.list_users()):
            typer.echo(f"User {name} exists; left as it is.")
            return
        admin.create_user(name, password)
    typer.echo(f"Created user {name} (principal User:{name}).")


@users_app.command("set-password")
def users_set_password(
    name: UserArg, password_stdin: PasswordStdinOpt = False, db: DbOpt = None, url: UrlOpt = None
) -> None:
    """Change a user's password (agents drop cached credentials within auth_cache_ttl_s)."""
    password = _read_password(password_stdin)
    with _admin(db, url) as admin:
        admin.set_password(name, password)
    typer.echo(f"Changed the password of {name}.")


@users_app.command("list")
def users_list(db: DbOpt = None, url: UrlOpt = None) -> None:
    """Every user, with when it was created."""
    with _admin(db, url) as admin:
        for u in admin.list_users():
            typer.echo(f"{u.name}\t{_when(u.created_at)}")


@users_app.command("delete")
def users_delete(name: UserArg, db: DbOpt = None, url: UrlOpt = None) -> None:
    """Delete a user and its API keys (its ACLs stay, as Kafka's do)."""
    with _admin(db, url) as admin:
        admin.delete_user(name)
    typer.echo(f"Deleted user {name}.")


# -- API keys -------------------------------------------------------------------------


def _show_secret(key: ApiKeySecret) -> None:
    typer.echo(f"API key:    {key.key.key_id}")
    typer.echo(f"Secret:     {key.secret}")
    typer.echo("Keep the secret now: it is not stored and cannot be shown again.", err=True)


@api_keys_app.command("create")
def api_keys_create(
    owner: Annotated[str, typer.Option("--owner", help="The user the key acts as.")],
    description: Annotated[str, typer.Option(help="What the key is for.")] = "",
    db: DbOpt = None,
    url: UrlOpt = None,
) -> None:
    """A new API key (id and secret) acting as OWNER; the secret is shown once."""
    with _admin(db, url) as admin:
        key = admin.create_api_key(owner, description)
    _show_secret(key)


@api_keys_app.command("list")
def api_keys_list(
    owner: Annotated[str | None, typer.Option("--owner", help="Only this user's keys.")] = None,
    db: DbOpt = None,
    url: UrlOpt = None,
) -> None:
    """API keys (never their secrets)."""
    with _admin(db, url) as admin:
        for k in admin.list_api_keys(owner):
            typer.echo(f"{k.key_id}\t{k.owner}\t{_when(k.created_at)}\t{k.description}")


@api_keys_app.command("rotate")
def api_keys_rotate(key_id: KeyIdArg, db: DbOpt = None, url: UrlOpt = None) -> None:
    """A new secret for the key; the old one stops working."""
    with _admin(db, url) as admin:
        key = admin.rotate_api_key(key_id)
    _show_secret(key)


@api_keys_app.command("delete")
def api_keys_delete(key_id: KeyIdArg, db: DbOpt = None, url: UrlOpt = None) -> None:
    """Delete an API key."""
    with _admin(db, url) as admin:
        admin.delete_api_key(key_id)
    typer.echo(f"Deleted API key {key_id}.")


# -- ACLs -------------------------------------------------------------------------------


TopicsOpt = Annotated[list[str] | None, typer.Option("--topic", help="Topic (or prefix).")]
GroupsOpt = Annotated[list[str] | None, typer.Option("--group", help="Group (or prefix).")]
ClusterFlag = Annotated[bool, typer.Option("--cluster", help="The cluster resource.")]
PrincipalsOpt = Annotated[
    list[str] | None, typer.Option("--principal", help="Only this principal's.")
]


def _resources(
    topics: list[str] | None, groups: list[str] | None, cluster: bool
) -> list[tuple[str, str]]:
    out = [("TOPIC", t) for t in topics or []] + [("GROUP", g) for g in groups or []]
    if cluster:
        out.append(("CLUSTER", "kafka-cluster"))
    return out


def _describe(b: AclBinding) -> str:
    return (
        f"(principal={b.principal}, host={b.host}, operation={b.operation.value}, "
        f"permissionType={b.permission.value}) on "
        f"{b.resource_type.value}:{b.pattern_type.value}:{b.resource_name}"
    )


@acls_app.command("create")
def acls_create(
    allow_principal: Annotated[
        list[str] | None, typer.Option("--allow-principal", help="User:NAME to allow.")
    ] = None,
    deny_principal: Annotated[
        list[str] | None, typer.Option("--deny-principal", help="User:NAME to deny.")
    ] = None,
    operation: Annotated[
        list[str] | None, typer.Option("--operation", help="READ, WRITE, ... or ALL.")
    ] = None,
    topic: TopicsOpt = None,
    group: GroupsOpt = None,
    cluster: ClusterFlag = False,
    pattern: Annotated[
        str, typer.Option("--resource-pattern-type", help="literal or prefixed.")
    ] = "literal",
    host: Annotated[str, typer.Option("--host", help="Client address, * for any.")] = "*",
    db: DbOpt = None,
    url: UrlOpt = None,
) -> None:
    """Add ACLs: each principal x operation x resource (as kafka-acls --add)."""
    resources = _resources(topic, group, cluster)
    principals = [(p, "ALLOW") for p in allow_principal or []] + [
        (p, "DENY") for p in deny_principal or []
    ]
    if not resources or not principals or not operation:
        _fail(
            "name at least one resource (--topic, --group, --cluster), one principal "
            "(--allow-principal, --deny-principal) and one --operation",
            code=2,
        )
    with _admin(db, url) as admin:
        bindings = [
            AclBinding.of(p, host, rtype, name, pattern, op, perm)
            for rtype, name in resources
            for p, perm in principals
            for op in operation
        ]
        admin.create_acls(bindings)
    for b in sorted(bindings):
        typer.echo(f"Added ACL {_describe(b)}")


def _filters(
    topics: list[str] | None,
    groups: list[str] | None,
    cluster: bool,
    principals: list[str] | None,
    operations: list[str] | None,
    pattern: str,
) -> list[AclFilter]:
    resources: list[tuple[str | None, str | None]] = list(_resources(topics, groups, cluster))
    return [
        AclFilter.of(
            principal=p, resource_type=rtype, resource_name=name, pattern_type=pattern, operation=op
        )
        for rtype, name in resources or [(None, None)]
        for p in _or_any(principals)
        for op in _or_any(operations)
    ]


def _or_any(values: list[str] | None) -> list[str | None]:
    """The values given, else one None (any)."""
    return list(values) if values else [None]


@acls_app.command("list")
def acls_list(
    topic: TopicsOpt = None,
    group: GroupsOpt = None,
    cluster: ClusterFlag = False,
    principal: PrincipalsOpt = None,
    pattern: Annotated[
        str,
        typer.Option(
            "--resource-pattern-type", help="any, match (what applies), literal or prefixed."
        ),
    ] = "any",
    db: DbOpt = None,
    url: UrlOpt = None,
) -> None:
    """ACLs matching the options (all without any)."""
    with _admin(db, url) as admin:
        found = admin.describe_acls(_filters(topic, group, cluster, principal, None, pattern))
    for b in found:
        typer.echo(_describe(b))


@acls_app.command("delete")
def acls_delete(
    topic: TopicsOpt = None,
    group: GroupsOpt = None,
    cluster: ClusterFlag = False,
    principal: PrincipalsOpt = None,
    operation: Annotated[
        list[str] | None, typer.Option("--operation", help="Only this operation's.")
    ] = None,
    pattern: Annotated[
        str, typer.Option("--resource-pattern-type", help="any, literal or prefixed.")
    ] = "literal",
    db: DbOpt = None,
    url: UrlOpt = None,
) -> None:
    """Delete the ACLs matching the options (as kafka-acls --remove); a resource is required."""
    if not (topic or group or cluster):
        _fail("name the resource: --topic, --group or --cluster", code=2)
    with _admin(db, url) as admin:
        gone = admin.delete_acls(_filters(topic, group, cluster, principal, operation, pattern))
    for b in gone:
        typer.echo(f"Deleted ACL {_describe(b)}")
    if not gone:
        typer.echo("No ACL matched.")


def rules_tables() -> str:
    """What every REST route, Kafka API and coordinator route needs (README "Security")."""
    from coordinator.security.access import rules_table as coordinator_rules
    from service.kafka.acl import rules_table as kafka_rules
    from service.security.acl import rules_table as rest_rules

    return (
        "REST routes (`service/security/acl.py`):\n\n"
        + rest_rules()
        + "\nKafka APIs (`service/kafka/acl.py`):\n\n"
        + kafka_rules()
        + "\nCoordinator routes (`coordinator/security/access.py`):\n\n"
        + coordinator_rules()
    )


@acls_app.command("rules")
def acls_rules() -> None:
    """What each REST route, Kafka API and coordinator route needs, as Markdown tables."""
    typer.echo(rules_tables(), nl=False)
