"""Who may call which route of a coordinator's HTTP API, with authentication on.

Three kinds of callers, told apart by what they present:

- **agents**: ``Authorization: Bearer <coordinator_secret>``. The shared secret lets an
  agent do what agents do (commit, groups, lookups, verify its clients' logins, read the
  ACLs) and nothing more: every route but the management ones below.
- **users** (Spark jobs, scripts): ``Authorization: Basic base64(name:secret)``, a user's
  password or an API key id and secret. A user may call the routes a Spark job uses,
  each decided with the coordinator's ACLs (authorization ``acl``) as an agent decides
  its clients' requests: READ on a topic to look its chunks up, WRITE on every topic a
  commit names, DESCRIBE to see a topic (the topic list shows only those); no other
  route. A write lease (a Spark write's pending uploads) belongs to the user that took
  it: the route gets the user's principal (:func:`user_of`) and another user's lease,
  or a key pending under it, is refused with 403; taking or keeping one needs WRITE on
  some topic. A super user's calls are trusted as an agent's: any lease is theirs to
  release.
- **management** (users, API keys; creating and deleting ACLs) needs a principal's own
  credential, verified here: a super user's for users and API keys, ALTER on the
  cluster (Kafka's CreateAcls/DeleteAcls; a super user's with authorization ``none``)
  for ACLs. A user sends it as Basic; an agent forwards its client's in
  ``X-Lakelog-Principal`` (:func:`forwarded`): ``Basic ...`` (a password or an API key
  secret, REST Basic or Kafka SASL/PLAIN) or ``SCRAM-SHA-256 ...`` / ``SCRAM-SHA-512
  ...`` (the three messages of the client's SCRAM login, checked here against the
  user's verifier). The secret alone manages nothing.

:data:`RULES` names every route that is not an agent's; every other route serves
agents only (a test checks the table against the app's routes, and that every
``/v1/security`` route has an entry); the Iceberg REST catalog under ``/iceberg/``
authenticates and authorizes its own callers. Refusals are the coordinator's error bodies
(``{"error", "message", "retriable"}``): 401 ``AuthenticationError`` for a missing or
wrong credential, 403 ``AuthorizationError`` for a caller the route does not serve or
an ACL that does not allow it. Logins are cached and throttled as an agent's
(``coordinator.security.logins``). ``/health`` is open; ``/metrics`` too unless
``protect_metrics`` (then agents, and users with DESCRIBE on the cluster).

Without authentication (``authentication none``) nothing here runs: whoever reaches
the coordinator may do anything.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgspec
import orjson
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from scramp import ScramException, ScramMechanism
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.api import OPERATIONS, PREFIX
from coordinator.client import Coordinator, TopicInfo
from coordinator.http.asgi import read_body, replay
from coordinator.security.logins import AuthMetrics, Logins
from coordinator.security.model import (
    AclFilter,
    Authorizer,
    Check,
    Operation,
    ResourceType,
    check_name,
    parse_basic,
    user_principal,
)
from coordinator.security.settings import AccessSettings
from coordinator.security.store import SCRAM_MECHANISMS, SecurityStore
from segments.errors import (
    AuthenticationError,
    AuthorizationError,
    LakelogError,
    LoginThrottledError,
)

#: Where an agent forwards its client's own credential (management routes only).
PRINCIPAL_HEADER = "x-lakelog-principal"
#: The ASGI scope key holding the principal of a user's request (not an agent's).
USER_SCOPE = "lakelog.user"
#: The ASGI scope key holding what a user's answer passes through before it is sent (a
#: topic list without the topics the user may not DESCRIBE).
RESULT_FILTER = "lakelog.result_filter"
#: Paths that authenticate and authorize their own callers (users, not agents), in their
#: own error shape: the Iceberg REST catalog (``coordinator.iceberg.rest``).
SELF_GUARDED = ("/iceberg/",)
CLUSTER_NAME = "kafka-cluster"
#: How long a coordinator decides with one copy of the ACLs.
ACL_TTL_S = 1.0
#: How long a coordinator trusts a user's verified credential (a Spark job's): a user or
#: API key deleted, a password changed, stops working here within this (the agents'
#: ``auth_cache_ttl_s`` default).
LOGIN_CACHE_TTL_S = 5.0
Op = Operation


class Caller(Enum):
    """Who a route serves."""

    ANYONE = "anyone"  # no credential needed
    AGENT = "agent"  # the shared secret
    USER = "user"  # an agent, or a user whose ACLs allow it
    SUPER_USER = "super user"  # a super user's own credential
    ACL_ADMIN = "acl admin"  # ALTER on the cluster, with a principal's own credential


@dataclass(frozen=True, slots=True)
class Request:
    """What a user's checks see: the operation's arguments (decoded; None unless the rule
    reads them, or when they do not decode: the route then answers the malformed
    request itself), and the coordinator (to name a topic by its id)."""

    args: Any
    coordinator: Coordinator


@dataclass(frozen=True, slots=True)
class Rule:
    """A route's callers; for users, what each request needs (``checks``, run in a
    thread, given the arguments when ``body``) and whether the answer is a topic list
    to filter by DESCRIBE."""

    caller: Caller
    checks: Callable[[Request], list[Check]] = field(default=lambda r: [])
    body: bool = False
    topic_listing: bool = False
    #: An operation the user must be allowed on at least one resource of the type
    #: (``Authorizer.authorize_any``), whatever the request names.
    on_any: tuple[Operation, ResourceType] | None = None
    #: Whether a call changes who may log in (a password changed, a user or an API key
    #: deleted or rotated): the coordinator's cached logins are dropped after it.
    changes_logins: bool = False
    #: What a user needs, in words (README's table, :func:`rules_table`).
    needs: str = ""


def _topic(op: Operation, argument: str = "topic") -> Rule:
    """``op`` on the topic the operation's ``argument`` names."""

    def checks(r: Request) -> list[Check]:
        name = getattr(r.args, argument, None)
        return [Check(op, ResourceType.TOPIC, name)] if isinstance(name, str) else []

    return Rule(Caller.USER, checks, body=True, needs=f"{op} on the topic")


def _topic_name(r: Request, topic_id: object) -> str | None:
    """The name of the topic of ``topic_id`` now; None for a bad or unknown id (the
    operation answers it itself, naming nothing)."""
    if not isinstance(topic_id, bytes):
        return None
    try:
        return r.coordinator.get_topic_by_id(topic_id).name
    except LakelogError:
        return None


def _topic_by_id(r: Request) -> list[Check]:
    name = _topic_name(r, getattr(r.args, "topic_id", None))
    return [] if name is None else [Check(Op.DESCRIBE, ResourceType.TOPIC, name)]


def _partitions(r: Request) -> list[Check]:
    names = {tp.topic for tp in getattr(r.args, "partitions", None) or ()}
    return [Check(Op.DESCRIBE, ResourceType.TOPIC, n) for n in sorted(names)]


def _wants(r: Request) -> list[Check]:
    """READ on the topic of every want (a read_committed read's stable offsets)."""
    names = {w.topic for w in getattr(r.args, "wants", None) or ()}
    return [Check(Op.READ, ResourceType.TOPIC, n) for n in sorted(names)]


def _commit(r: Request) -> list[Check]:
    """WRITE on the topic of every chunk (named by id)."""
    chunks = list(getattr(r.args, "chunks", None) or ())
    chunks += [c for _, of_object in getattr(r.args, "objects", None) or () for c in of_object]
    ids = {c.topic_id for c in chunks}
    names = {n for n in (_topic_name(r, i) for i in ids) if n is not None}
    return [Check(Op.WRITE, ResourceType.TOPIC, n) for n in sorted(names)]


def _v2(operation: str) -> tuple[str, str]:
    if operation not in OPERATIONS:
        raise KeyError(f"no operation {operation}")
    return "POST", OPERATIONS[operation].path


USER = Rule(Caller.USER, needs="authentication")
_S = "/v1/security"

#: (method, path template) -> its callers, for every route that is not an agent's only.
RULES: dict[tuple[str, str], Rule] = {
    ("GET", "/health"): Rule(Caller.ANYONE),
    ("GET", "/metrics"): Rule(
        Caller.ANYONE, needs="with `protect_metrics`, DESCRIBE on the cluster (agents too)"
    ),
    # -- what a Spark job uses ----------------------------------------------------------
    _v2("cluster_id"): USER,
    _v2("store_location"): USER,
    _v2("list_topics"): Rule(
        Caller.USER, topic_listing=True, needs="authentication; lists what it may DESCRIBE"
    ),
    _v2("get_topic"): _topic(Op.DESCRIBE, "name"),
    _v2("get_topic_by_id"): Rule(
        Caller.USER, _topic_by_id, body=True, needs="DESCRIBE on the topic"
    ),
    _v2("offsets"): _topic(Op.DESCRIBE),
    _v2("offsets_many"): Rule(Caller.USER, _partitions, body=True, needs="DESCRIBE on each topic"),
    _v2("lookup"): _topic(Op.READ),
    _v2("lookup_timestamp"): _topic(Op.READ),
    _v2("stable_offsets"): Rule(Caller.USER, _wants, body=True, needs="READ on each topic"),
    _v2("commit"): Rule(Caller.USER, _commit, body=True, needs="WRITE on each topic committed"),
    _v2("commit_atomic"): Rule(
        Caller.USER, _commit, body=True, needs="WRITE on each topic committed"
    ),
    _v2("committed_object_keys"): USER,
    # A Spark write's tasks register their uploads and keep the job's write lease alive;
    # the lease is the user's own (which keys others' leases hold is for agents only).
    # Keeping uploads from garbage collection is for users who may write somewhere: a
    # user who may write nothing has no uploads to keep (and would only pin garbage).
    _v2("keep_pending"): Rule(
        Caller.USER,
        on_any=(Op.WRITE, ResourceType.TOPIC),
        needs="WRITE on some topic; its own write lease",
    ),
    _v2("release_pending"): Rule(Caller.USER, needs="its own write lease"),
    ("POST", _S + "/authorize"): USER,  # a Spark job's own rights
    # -- what agents do for their clients --------------------------------------------------
    ("GET", _S + "/settings"): Rule(Caller.AGENT),
    ("POST", _S + "/authenticate"): Rule(Caller.AGENT),
    ("POST", _S + "/scram"): Rule(Caller.AGENT),
    ("POST", _S + "/acls/describe"): Rule(Caller.AGENT),
    # -- management: a principal's own credential ------------------------------------------
    ("GET", _S + "/users"): Rule(Caller.SUPER_USER),
    ("POST", _S + "/users/create"): Rule(Caller.SUPER_USER),
    ("POST", _S + "/users/password"): Rule(Caller.SUPER_USER, changes_logins=True),
    ("POST", _S + "/users/delete"): Rule(Caller.SUPER_USER, changes_logins=True),
    ("POST", _S + "/api-keys/list"): Rule(Caller.SUPER_USER),
    ("POST", _S + "/api-keys/create"): Rule(Caller.SUPER_USER),
    ("POST", _S + "/api-keys/rotate"): Rule(Caller.SUPER_USER, changes_logins=True),
    ("POST", _S + "/api-keys/delete"): Rule(Caller.SUPER_USER, changes_logins=True),
    ("POST", _S + "/acls/create"): Rule(Caller.ACL_ADMIN),
    ("POST", _S + "/acls/delete"): Rule(Caller.ACL_ADMIN),
}
AGENT_ONLY = Rule(Caller.AGENT)
_PROTECTED_METRICS = Rule(
    Caller.USER,
    lambda r: [Check(Op.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)],
    needs="DESCRIBE on the cluster",
)


def user_of(scope: Scope) -> str | None:
    """The principal of the user a request is served for; None for an agent's request
    and without authentication (trusted callers)."""
    user = scope.get(USER_SCOPE)
    return user if isinstance(user, str) else None


def rule_for(method: str, template: str, *, protect_metrics: bool = False) -> Rule:
    if protect_metrics and template == "/metrics":
        return _PROTECTED_METRICS
    return RULES.get(("GET" if method == "HEAD" else method, template), AGENT_ONLY)


# -- credentials ----------------------------------------------------------------------


def scram_proof(mechanism: str, client_first: str, server_first: str, client_final: str) -> str:
    """The ``X-Lakelog-Principal`` value of a SCRAM login an agent accepted: its three
    messages, which the coordinator replays against the user's verifier."""
    doc = {"client_first": client_first, "server_first": server_first, "client_final": client_final}
    return f"{mechanism} " + base64.b64encode(orjson.dumps(doc)).decode("ascii")


def forwarded(credential: str | None) -> dict[str, str]:
    """The header an agent adds to a management call for its client's credential."""
    return {PRINCIPAL_HEADER: credential} if credential else {}


def verify_scram(store: SecurityStore, mechanism: str, proof: str) -> str:
    """The principal of a forwarded SCRAM login: the coordinator plays the server's part
    again with the agent's nonce and its own verifier; a proof that does not match is
    AuthenticationError."""
    try:
        doc = orjson.loads(base64.b64decode(proof, validate=True))
        client_first, server_first, client_final = (
            str(doc["client_first"]),
            str(doc["server_first"]),
            str(doc["client_final"]),
        )
        attrs = dict(p.split("=", 1) for p in server_first.split(",") if "=" in p)
        client_nonce = dict(p.split("=", 1) for p in client_first.split(",")[2:] if "=" in p).get(
            "r", ""
        )
        combined = attrs["r"]
    except (ValueError, KeyError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise AuthenticationError("a malformed SCRAM proof") from None
    if not client_nonce or not combined.startswith(client_nonce):
        raise AuthenticationError("a malformed SCRAM proof")

    users: list[str] = []

    def lookup(user: str) -> tuple[bytes, bytes, bytes, int]:
        users.append(user)
        cred = store.scram_credential(check_name(user), mechanism)
        return cred.salt, cred.stored_key, cred.server_key, cred.iterations

    server = ScramMechanism(mechanism).make_server(lookup, s_nonce=combined[len(client_nonce) :])
    try:
        server.set_client_first(client_first)
        if server.get_server_first() != server_first:
            raise AuthenticationError("the SCRAM login does not match the user's verifier")
        server.set_client_final(client_final)
    except (ScramException, LakelogError) as e:
        raise AuthenticationError(f"the forwarded SCRAM login failed: {e}") from None
    return user_principal(users[0])


# -- the middleware ---------------------------------------------------------------------


def _leaf_routes(app: FastAPI) -> list[Any]:
    routes = getattr(app.state, "access_routes", None)
    if routes is None:
        routes = app.state.access_routes = list(app.router.routes)
    return routes


def route_of(app: FastAPI, scope: Scope) -> tuple[str, dict[str, Any]] | None:
    """(path template, path parameters) of the route serving ``scope``; None if none."""
    for route in _leaf_routes(app):
        match, child = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", "")), dict(child.get("path_params", {}))
    return None


def templates(app: FastAPI) -> Iterator[tuple[str, str]]:
    """(method, template) of every route of ``app`` (a test checks them against RULES)."""
    for route in _leaf_routes(app):
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD":
                yield method, str(getattr(route, "path", ""))


class AclSnapshot:
    """The coordinator's ACLs as one Authorizer, at most ``ACL_TTL_S`` old, and never
    older than an ACL change this coordinator served (``forget``): a user who was just
    granted a right through it is answered with that right."""

    def __init__(self, store: SecurityStore, super_users: frozenset[str]) -> None:
        self.store = store
        self.super_users = super_users
        self._lock = threading.Lock()
        self._at = 0.0
        self._authorizer: Authorizer | None = None

    def authorizer(self) -> Authorizer:
        with self._lock:
            if self._authorizer is None or time.monotonic() - self._at >= ACL_TTL_S:
                at = time.monotonic()
                self._authorizer = Authorizer(
                    self.store.describe_acls([AclFilter()]), self.super_users
                )
                self._at = at
            return self._authorizer

    def forget(self) -> None:
        """After an ACL change committed: the next decision reads the ACLs again (a load
        in progress finishes first, under the lock, and is dropped)."""
        with self._lock:
            self._authorizer = None


class AccessMiddleware:
    """Decides every request by :data:`RULES` (see the module doc)."""

    def __init__(
        self,
        app: ASGIApp,
        settings: AccessSettings,
        security: SecurityStore,
        coordinator: Coordinator,
        registry: CollectorRegistry,
    ) -> None:
        self.app = app
        self.settings = settings
        self.security = security
        self.coordinator = coordinator
        if not settings.secret:
            raise ValueError("a coordinator with authentication needs its shared secret")
        self._bearer = f"Bearer {settings.secret}".encode()
        self.acls = AclSnapshot(security, settings.super_users)
        # Users' logins (Spark jobs) as an agent's, with the agents' default bounds.
        self.logins = Logins(
            security,
            cache_ttl_s=LOGIN_CACHE_TTL_S,
            max_failures=10,
            failure_window_s=60.0,
            metrics=AuthMetrics(registry),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "").startswith(SELF_GUARDED):
            await self.app(scope, receive, send)
            return
        found = route_of(scope["app"], scope)
        if found is None:  # 404/405: the router answers, naming nothing that exists
            await self.app(scope, receive, send)
            return
        template, _ = found
        rule = rule_for(scope["method"], template, protect_metrics=self.settings.protect_metrics)
        if rule.caller is Caller.ANYONE:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        address = scope["client"][0] if scope.get("client") else ""
        try:
            agent, principal = await self._caller(headers.get("authorization", ""), address)
            if rule.caller in (Caller.SUPER_USER, Caller.ACL_ADMIN):
                if agent:
                    principal = await self._forwarded(headers.get(PRINCIPAL_HEADER), address)
                await run_in_threadpool(self._manage, rule.caller, principal, address)
            elif rule.caller is Caller.AGENT and not agent:
                raise AuthorizationError("this route serves agents only")
            elif rule.caller is Caller.USER and not agent:
                if not await run_in_threadpool(self._is_super_user, principal):
                    # A super user's calls are trusted as an agent's (any write lease).
                    scope[USER_SCOPE] = principal
                receive = await self._check_user(rule, scope, receive, template, principal, address)
                if rule.topic_listing and self.settings.authorization == "acl":
                    scope[RESULT_FILTER] = await self._topic_filter(principal or "", address)
        except LakelogError as e:
            await _refuse(send, e)
            return
        if rule.caller is Caller.ACL_ADMIN:
            send = _forgetting(send, self.acls.forget)
        elif rule.changes_logins:
            send = _forgetting(send, self.logins.forget)
        await self.app(scope, receive, send)

    async def _topic_filter(self, principal: str, host: str) -> Callable[[Any], Any]:
        """``list_topics`` for a user: the topics it may not DESCRIBE left out."""
        authorizer = await run_in_threadpool(self.acls.authorizer)

        def keep(topics: list[TopicInfo]) -> list[TopicInfo]:
            return [
                t
                for t in topics
                if authorizer.authorize(principal, host, Op.DESCRIBE, ResourceType.TOPIC, t.name)
            ]

        return keep

    def _is_super_user(self, principal: str | None) -> bool:
        return principal is not None and self.acls.authorizer().is_super_user(principal)

    async def _caller(self, authorization: str, address: str) -> tuple[bool, str | None]:
        """(whether the caller is an agent, the user's principal otherwise)."""
        if authorization.startswith("Bearer ") and hmac.compare_digest(
            authorization.encode("latin-1"), self._bearer
        ):
            return True, None
        credential = parse_basic(authorization)
        if credential is None:
            raise AuthenticationError(
                "this coordinator serves agents presenting its shared secret, and users "
                "(HTTP Basic: a user and password, or an API key id and secret)"
            )
        return False, await self.logins.authenticate(*credential, address, "coordinator")

    async def _forwarded(self, credential: str | None, address: str) -> str:
        """The principal of the credential an agent forwarded for its client."""
        if not credential:
            raise AuthorizationError(
                "managing users, API keys and ACLs needs the caller's own credential (a "
                "super user's): the coordinators' shared secret alone manages nothing"
            )
        scheme, _, value = credential.partition(" ")
        if scheme in SCRAM_MECHANISMS:
            return await run_in_threadpool(verify_scram, self.security, scheme, value)
        basic_credential = parse_basic(credential)
        if basic_credential is None:
            raise AuthenticationError("a malformed forwarded credential")
        return await self.logins.authenticate(*basic_credential, f"via:{address}", "coordinator")

    def _manage(self, caller: Caller, principal: str | None, address: str) -> None:
        authorizer = self.acls.authorizer()
        if principal is not None and authorizer.is_super_user(principal):
            return
        if (
            principal is not None
            and caller is Caller.ACL_ADMIN
            and self.settings.authorization == "acl"
            and authorizer.authorize(
                principal, address, Op.ALTER, ResourceType.CLUSTER, CLUSTER_NAME
            )
        ):
            return
        what = "ACLs (ALTER on the cluster)" if caller is Caller.ACL_ADMIN else "users and API keys"
        raise AuthorizationError(f"{principal} is not authorized to manage {what}")

    async def _check_user(
        self,
        rule: Rule,
        scope: Scope,
        receive: Receive,
        template: str,
        principal: str | None,
        address: str,
    ) -> Receive:
        """Raises AuthorizationError unless the user's ACLs allow the request; the
        ``receive`` to serve it with (the body read again if it was read here)."""
        if self.settings.authorization != "acl" or principal is None:
            return receive
        args: Any = None
        operation = OPERATIONS.get(template.removeprefix(PREFIX))
        if rule.body and operation is not None:
            raw = await read_body(receive)
            receive = replay(raw)
            with suppress(msgspec.DecodeError):
                args = operation.decode(raw)
        request = Request(args, self.coordinator)

        def decide() -> list[Check]:
            authorizer = self.acls.authorizer()
            if rule.on_any is not None and not authorizer.authorize_any(
                principal, address, *rule.on_any
            ):
                return [Check(rule.on_any[0], rule.on_any[1], "(any)")]
            return [
                c
                for c in rule.checks(request)
                if not authorizer.authorize(
                    principal, address, c.operation, c.resource_type, c.name
                )
            ]

        denied = await run_in_threadpool(decide)
        if denied:
            names = ", ".join(f"{c.resource_type.value} {c.name}" for c in denied)
            op = denied[0].operation.value
            raise AuthorizationError(f"{principal} is not authorized to {op} {names}")
        return receive


def _forgetting(send: Send, forget: Callable[[], None]) -> Send:
    """``send`` that calls ``forget`` before a management call's answer leaves (its change
    has committed by then), so the caller's next request sees the change here: an ACL
    change (the ACL snapshot), a password changed, a user or API key deleted (the cached
    logins; other coordinators stop trusting them within ``LOGIN_CACHE_TTL_S``)."""

    async def forget_then_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            await run_in_threadpool(forget)
        await send(message)

    return forget_then_send


async def _refuse(send: Send, e: LakelogError) -> None:
    status = 401 if isinstance(e, AuthenticationError) else 403
    if isinstance(e, LoginThrottledError):
        status = 429
    body = orjson.dumps({"error": type(e).__name__, "message": e.message, "retriable": False})
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 401:
        headers.append((b"www-authenticate", b'Basic realm="lakelog-coordinator"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def rules_table() -> str:
    """The coordinator routes that are not an agent's only (Markdown, README's)."""
    words = {
        Caller.ANYONE: "anyone",
        Caller.AGENT: "agents",
        Caller.USER: "agents, and users by their ACLs",
        Caller.SUPER_USER: "a super user's own credential",
        Caller.ACL_ADMIN: "ALTER on the cluster, by a principal's own credential",
    }
    lines = ["| method | route | who | a user needs |", "|---|---|---|---|"]
    for (method, path), rule in sorted(RULES.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(f"| {method} | `{path}` | {words[rule.caller]} | {rule.needs} |")
    lines.append("| any | `/iceberg/...` | the Iceberg REST catalog checks its own callers | |")
    lines.append("| any other | | agents (the shared secret) | |")
    return "\n".join(lines) + "\n"
