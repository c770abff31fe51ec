"""Authorization of the agent's REST routes by Kafka ACLs (``authorization = acl``).

One table, :data:`RULES`, says for every route (method, path template) what the
request needs: an operation on the cluster, on the topic or group its path names,
on the topics its body names, a super user, or only an authenticated principal.
:class:`AclMiddleware` finds the request's route, evaluates its rule against the
agent's copy of the ACLs and answers 403 ``{"error_code": 40301}`` when denied. A
route with no rule is refused (and a test builds the matrix from the app's route
table, so a new route without a rule fails it).

Listing routes (v2 ``GET /topics``, v3 topics and consumer groups) answer only what
the principal may DESCRIBE: the middleware drops the others from the answer.

The agent's copy of the ACLs is at most ``auth_cache_ttl_s`` old: older, the next
request reloads it from the coordinator first (and fails with 503 if it cannot:
never an answer from a copy older than the bound). ACL changes made through this
agent drop the copy at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl

import orjson
from fastapi import FastAPI, Request
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator.http.asgi import RewriteJson, read_body, replay
from coordinator.security.model import AclFilter, Authorizer, Check, Operation, ResourceType
from coordinator.security.store import SecurityStore
from segments.errors import AuthorizationError, LakelogError
from service.errors import ErrorCode
from service.executors import call
from service.security.auth import SELF_GUARDED, client_address, principal_of
from service.web import _leaf_routes, send_error

log = logging.getLogger(__name__)

CLUSTER_NAME = "kafka-cluster"
#: The key of the query parameters among the path parameters a rule gets.
QUERY = "?"
Op = Operation


class AclCache:
    """The agent's copy of the ACLs, at most ``ttl_s`` old."""

    def __init__(
        self,
        store: SecurityStore,
        super_users: frozenset[str],
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.super_users = super_users
        self._ttl = ttl_s
        self._clock = clock
        self._authorizer: Authorizer | None = None
        self._loaded_at = 0.0
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        self._authorizer = None

    async def authorizer(self) -> Authorizer:
        """A decision maker over ACLs loaded within the bound (reloads if older)."""
        current = self._authorizer
        if current is not None and self._clock() - self._loaded_at < self._ttl:
            return current
        async with self._lock:
            current = self._authorizer
            if current is not None and self._clock() - self._loaded_at < self._ttl:
                return current
            started = self._clock()
            bindings = await call(self.store.describe_acls, [AclFilter()])
            self._authorizer = Authorizer(bindings, self.super_users)
            self._loaded_at = started
            return self._authorizer


class Rights:
    """What one request's principal may do on resources its handler learns only after
    reading the request or the coordinator (the topics of an instance's assignment, of a
    group's committed offsets): questions to the agent's ACL copy (the middleware's, with
    its staleness bound), asked again at each call, so a long request sees a revocation
    within the bound. With authorization off every answer is yes.
    """

    __slots__ = ("cache", "host", "principal")

    def __init__(self, cache: AclCache | None, principal: str, host: str) -> None:
        self.cache = cache
        self.principal = principal
        self.host = host

    async def denied(
        self, operation: Operation, resource_type: ResourceType, names: Iterable[str]
    ) -> list[str]:
        """The names of ``names`` (sorted, each once) the principal may not ``operation``."""
        if self.cache is None:
            return []
        authorizer = await self.cache.authorizer()
        return [
            n
            for n in sorted(set(names))
            if not authorizer.authorize(self.principal, self.host, operation, resource_type, n)
        ]

    async def require(
        self, operation: Operation, resource_type: ResourceType, names: Iterable[str]
    ) -> None:
        """Raises AuthorizationError (403 40301) naming those denied, in Kafka's words."""
        refused = await self.denied(operation, resource_type, names)
        if refused:
            kind = {ResourceType.TOPIC: "topics", ResourceType.GROUP: "groups"}.get(
                resource_type, resource_type.value.lower()
            )
            raise AuthorizationError(f"Not authorized to access {kind}: [{', '.join(refused)}]")


def rights(request: Request) -> Rights:
    """The request's :class:`Rights` (a FastAPI dependency)."""
    app = request.app
    cache = app.state.acl_cache if app.state.settings.authorization == "acl" else None
    return Rights(cache, principal_of(request.scope), client_address(request.scope))


# -- the rules --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """What a route needs. ``checks`` gets the path parameters (the query's under
    :data:`QUERY`) and the JSON body (None unless ``body``); all must be allowed, or one
    with ``any_of``. ``listing`` names the key whose items the answer is filtered on.
    ``needs`` says it in words (README's table, :func:`rules_table`); ``also`` what the
    route's handler checks besides (``Rights``), in words."""

    checks: Callable[[dict[str, Any], Any], list[Check]] = lambda p, b: []
    body: bool = False
    super_user: bool = False
    listing: tuple[ResourceType, str] | None = None
    any_of: bool = False
    needs: str = "an authenticated principal"
    also: str = ""


def cluster(op: Operation) -> Rule:
    return Rule(
        lambda p, b: [Check(op, ResourceType.CLUSTER, CLUSTER_NAME)], needs=f"{op} on the cluster"
    )


def topic(op: Operation, param: str = "topic_name") -> Rule:
    return Rule(
        lambda p, b: [Check(op, ResourceType.TOPIC, str(p[param]))], needs=f"{op} on the topic"
    )


def group(op: Operation, param: str = "consumer_group_id") -> Rule:
    return Rule(
        lambda p, b: [Check(op, ResourceType.GROUP, str(p[param]))], needs=f"{op} on the group"
    )


def group_topic(op: Operation) -> Rule:
    """A group's view of one topic: ``op`` on the group and DESCRIBE on the topic."""
    return Rule(
        lambda p, b: [
            Check(op, ResourceType.GROUP, str(p["consumer_group_id"])),
            Check(Op.DESCRIBE, ResourceType.TOPIC, str(p["topic_name"])),
        ],
        needs=f"{op} on the group, DESCRIBE on the topic",
    )


def noting(rule: Rule, also: str) -> Rule:
    """``rule``, its handler's own checks said in words."""
    return replace(rule, also=also)


AUTHENTICATED = Rule()
SUPER_USER = Rule(super_user=True, needs="a super user")


def _body_topics(body: Any) -> list[str]:
    """The topics a v2 subscribe or assign body names (``topics``, ``partitions[].topic``).
    A ``topic_pattern`` names none: each topic it matches is checked by its own ACLs at
    every fetch (``service.v2.consumers``)."""
    names: list[str] = []
    if isinstance(body, dict):
        topics = body.get("topics")
        if isinstance(topics, list):
            names += [t for t in topics if isinstance(t, str)]
        parts = body.get("partitions")
        if isinstance(parts, list):
            names += [
                p["topic"] for p in parts if isinstance(p, dict) and isinstance(p.get("topic"), str)
            ]
    return names


#: What every call on a v2 consumer instance checks besides its rule.
_OWNER = "the instance's creator only"


def _consumer_rule(op: Operation, *, with_topics: bool = False, also: str = _OWNER) -> Rule:
    def checks(p: dict[str, Any], b: Any) -> list[Check]:
        out = [Check(op, ResourceType.GROUP, str(p["group"]))]
        if with_topics:
            out += [Check(Op.READ, ResourceType.TOPIC, t) for t in _body_topics(b)]
        return out

    needs = f"{op} on the group" + (", READ on each topic named" if with_topics else "")
    return Rule(checks, body=with_topics, needs=needs, also=also)


def _group_stream(p: dict[str, Any], b: Any) -> list[Check]:
    """The v3 group stream: READ on the group and on every topic its ``topics`` names."""
    names = str(p.get(QUERY, {}).get("topics", "")).split(",")
    return [Check(Op.READ, ResourceType.GROUP, str(p["group_id"]))] + [
        Check(Op.READ, ResourceType.TOPIC, t.strip()) for t in names if t.strip()
    ]


def _create_topic(p: dict[str, Any], b: Any) -> list[Check]:
    """Kafka's CreateTopics: CREATE on the cluster, or on the topic."""
    name = b.get("topic_name") if isinstance(b, dict) else None
    return [
        Check(Op.CREATE, ResourceType.CLUSTER, CLUSTER_NAME),
        Check(Op.CREATE, ResourceType.TOPIC, name if isinstance(name, str) else ""),
    ]


_C = "/v3/clusters/{cluster_id}"
_G = "/consumers/{group}/instances/{instance}"
_LISTED = "an authenticated principal; lists only what it may DESCRIBE"
_LIST_TOPICS_V3 = Rule(listing=(ResourceType.TOPIC, "topic_name"), needs=_LISTED)
_LIST_TOPICS_V2 = Rule(listing=(ResourceType.TOPIC, ""), needs=_LISTED)
_LIST_GROUPS = Rule(listing=(ResourceType.GROUP, "consumer_group_id"), needs=_LISTED)
#: Produce: a record naming a registry schema (``service.registry.rest.ProduceSchemas``).
_SCHEMAS = "a schema named: DESCRIBE on the cluster; one registered: ALTER on the cluster"
#: The topics a group's view shows (``service.v3.consumer_groups``).
_DESCRIBED = "shows only the topics it may DESCRIBE"

#: (method, path template) -> what it needs. The registry's subjects are not Kafka
#: resources: reading them needs DESCRIBE on the cluster, changing them ALTER.
RULES: dict[tuple[str, str], Rule] = {
    ("GET", "/openapi.json"): AUTHENTICATED,
    ("GET", "/docs"): AUTHENTICATED,
    ("GET", "/docs/oauth2-redirect"): AUTHENTICATED,
    ("GET", "/redoc"): AUTHENTICATED,
    ("GET", "/health"): Rule(needs="nothing: open (service.security.auth.OPEN_PATHS)"),
    # Open unless protect_metrics; then, as a view of every group and topic, DESCRIBE on
    # the cluster.
    ("GET", "/metrics"): replace(
        cluster(Op.DESCRIBE), needs="nothing: open; with `protect_metrics`, DESCRIBE on the cluster"
    ),
    # -- v3 cluster, brokers, configs --------------------------------------------------
    ("GET", "/v3/clusters"): AUTHENTICATED,
    ("GET", _C): AUTHENTICATED,
    ("GET", _C + "/brokers"): AUTHENTICATED,
    ("GET", _C + "/brokers/{broker_id}"): AUTHENTICATED,
    ("GET", _C + "/brokers/-/configs"): cluster(Op.DESCRIBE_CONFIGS),
    ("GET", _C + "/brokers/{broker_id}/configs"): cluster(Op.DESCRIBE_CONFIGS),
    ("GET", _C + "/brokers/{broker_id}/configs/{name}"): cluster(Op.DESCRIBE_CONFIGS),
    ("PUT", _C + "/brokers/{broker_id}/configs/{name}"): cluster(Op.ALTER_CONFIGS),
    ("DELETE", _C + "/brokers/{broker_id}/configs/{name}"): cluster(Op.ALTER_CONFIGS),
    ("POST", _C + "/brokers/{broker_id}/configs:alter"): cluster(Op.ALTER_CONFIGS),
    ("GET", _C + "/broker-configs"): cluster(Op.DESCRIBE_CONFIGS),
    ("POST", _C + "/broker-configs:alter"): cluster(Op.ALTER_CONFIGS),
    ("GET", _C + "/broker-configs/{name}"): cluster(Op.DESCRIBE_CONFIGS),
    ("PUT", _C + "/broker-configs/{name}"): cluster(Op.ALTER_CONFIGS),
    ("DELETE", _C + "/broker-configs/{name}"): cluster(Op.ALTER_CONFIGS),
    ("GET", _C + "/brokers/{broker_id}/partition-replicas"): cluster(Op.DESCRIBE),
    # -- v3 ACLs (Kafka: DescribeAcls needs DESCRIBE, Create/DeleteAcls ALTER on the cluster)
    ("GET", _C + "/acls"): cluster(Op.DESCRIBE),
    ("POST", _C + "/acls"): cluster(Op.ALTER),
    ("DELETE", _C + "/acls"): cluster(Op.ALTER),
    ("POST", _C + "/acls:batch"): cluster(Op.ALTER),
    # -- v3 topics ---------------------------------------------------------------------
    ("GET", _C + "/topics/-/configs"): cluster(Op.DESCRIBE_CONFIGS),
    ("GET", _C + "/topics/{topic_name}/configs"): topic(Op.DESCRIBE_CONFIGS),
    ("GET", _C + "/topics/{topic_name}/configs/{name}"): topic(Op.DESCRIBE_CONFIGS),
    ("PUT", _C + "/topics/{topic_name}/configs/{name}"): topic(Op.ALTER_CONFIGS),
    ("DELETE", _C + "/topics/{topic_name}/configs/{name}"): topic(Op.ALTER_CONFIGS),
    ("POST", _C + "/topics/{topic_name}/configs:alter"): topic(Op.ALTER_CONFIGS),
    ("GET", _C + "/topics/-/partitions/-/reassignment"): cluster(Op.DESCRIBE),
    ("GET", _C + "/topics/{topic_name}/partitions/-/reassignment"): topic(Op.DESCRIBE),
    ("GET", _C + "/topics/{topic_name}/partitions"): topic(Op.DESCRIBE),
    ("GET", _C + "/topics/{topic_name}/partitions/{partition_id}"): topic(Op.DESCRIBE),
    ("GET", _C + "/topics/{topic_name}/partitions/{partition_id}/offset"): topic(Op.DESCRIBE),
    ("GET", _C + "/topics/{topic_name}/partitions/{partition_id}/replicas"): topic(Op.DESCRIBE),
    ("GET", _C + "/topics/{topic_name}/partitions/{partition_id}/replicas/{broker_id}"): topic(
        Op.DESCRIBE
    ),
    ("GET", _C + "/topics/{topic_name}/partitions/{partition_id}/reassignment"): topic(Op.DESCRIBE),
    ("GET", _C + "/topics"): _LIST_TOPICS_V3,
    ("POST", _C + "/topics"): Rule(
        _create_topic, body=True, any_of=True, needs="CREATE on the cluster or on the topic"
    ),
    ("GET", _C + "/topics/{topic_name}"): topic(Op.DESCRIBE),
    ("PATCH", _C + "/topics/{topic_name}"): topic(Op.ALTER),
    ("DELETE", _C + "/topics/{topic_name}"): topic(Op.DELETE),
    ("POST", _C + "/topics/{topic_name}/records"): noting(topic(Op.WRITE), _SCHEMAS),
    ("POST", _C + "/topics/{topic_name}/records:batch"): noting(topic(Op.WRITE), _SCHEMAS),
    ("GET", _C + "/topics/{topic_name}/partitions/{partition_id}/records"): topic(Op.READ),
    ("GET", _C + "/consumer-groups/{group_id}/records"): Rule(
        _group_stream,
        needs="READ on the group and on each topic of `topics`",
        also="the same again before every round it sends",
    ),
    # Kafka's InitProducerId for an idempotent producer: IDEMPOTENT_WRITE on the cluster.
    ("POST", _C + "/producers"): cluster(Op.IDEMPOTENT_WRITE),
    # -- v3 consumer groups ----------------------------------------------------------------
    ("GET", _C + "/consumer-groups"): _LIST_GROUPS,
    ("GET", _C + "/consumer-groups/{consumer_group_id}"): group(Op.DESCRIBE),
    ("GET", _C + "/consumer-groups/{consumer_group_id}/consumers"): group(Op.DESCRIBE),
    ("GET", _C + "/consumer-groups/{consumer_group_id}/consumers/{consumer_id}"): group(
        Op.DESCRIBE
    ),
    ("GET", _C + "/consumer-groups/{consumer_group_id}/consumers/{consumer_id}/assignments"): (
        noting(group(Op.DESCRIBE), _DESCRIBED)
    ),
    (
        "GET",
        _C + "/consumer-groups/{consumer_group_id}/consumers/{consumer_id}/assignments/"
        "{topic_name}/partitions/{partition_id}",
    ): group_topic(Op.DESCRIBE),
    ("GET", _C + "/consumer-groups/{consumer_group_id}/lag-summary"): noting(
        group(Op.DESCRIBE), _DESCRIBED
    ),
    ("GET", _C + "/consumer-groups/{consumer_group_id}/lags"): noting(
        group(Op.DESCRIBE), _DESCRIBED
    ),
    (
        "GET",
        _C + "/consumer-groups/{consumer_group_id}/lags/{topic_name}/partitions/{partition_id}",
    ): group_topic(Op.DESCRIBE),
    ("POST", _C + "/consumer-groups/{consumer_group_id}/offsets:reset"): noting(
        group(Op.READ),
        "READ on each topic moved (`all_topics`: those it may not DESCRIBE left out)",
    ),
    ("DELETE", _C + "/consumer-groups/{consumer_group_id}"): group(Op.DELETE),
    # -- v2 -------------------------------------------------------------------------------
    ("GET", "/"): AUTHENTICATED,
    ("POST", "/"): AUTHENTICATED,
    ("GET", "/topics"): _LIST_TOPICS_V2,
    ("GET", "/topics/{topic}"): topic(Op.DESCRIBE, "topic"),
    ("GET", "/topics/{topic}/partitions"): topic(Op.DESCRIBE, "topic"),
    ("GET", "/topics/{topic}/partitions/{partition}"): topic(Op.DESCRIBE, "topic"),
    ("GET", "/topics/{topic}/partitions/{partition}/offsets"): topic(Op.DESCRIBE, "topic"),
    ("GET", "/brokers"): AUTHENTICATED,
    ("POST", "/topics/{topic}"): noting(topic(Op.WRITE, "topic"), _SCHEMAS),
    ("POST", "/topics/{topic}/partitions/{partition}"): noting(topic(Op.WRITE, "topic"), _SCHEMAS),
    ("POST", "/consumers/{group}"): _consumer_rule(Op.READ, also="its creator owns it"),
    ("POST", "/consumers/{group}/"): _consumer_rule(Op.READ, also="its creator owns it"),
    ("DELETE", _G): _consumer_rule(Op.READ),
    ("POST", _G + "/subscription"): _consumer_rule(Op.READ, with_topics=True),
    ("GET", _G + "/subscription"): _consumer_rule(Op.DESCRIBE),
    ("DELETE", _G + "/subscription"): _consumer_rule(Op.READ),
    ("POST", _G + "/assignments"): _consumer_rule(Op.READ, with_topics=True),
    ("GET", _G + "/assignments"): _consumer_rule(Op.DESCRIBE),
    ("POST", _G + "/positions"): _consumer_rule(Op.READ, also=_OWNER + "; DESCRIBE on each topic"),
    ("POST", _G + "/positions/beginning"): _consumer_rule(
        Op.READ, also=_OWNER + "; DESCRIBE on each topic"
    ),
    ("POST", _G + "/positions/end"): _consumer_rule(
        Op.READ, also=_OWNER + "; DESCRIBE on each topic"
    ),
    ("POST", _G + "/offsets"): _consumer_rule(Op.READ, also=_OWNER + "; READ on each topic"),
    ("GET", _G + "/offsets"): _consumer_rule(Op.DESCRIBE, also=_OWNER + "; " + _DESCRIBED),
    ("GET", _G + "/records"): _consumer_rule(
        Op.READ,
        also=_OWNER + "; READ on each topic read, at every fetch (a pattern leaves out the "
        "topics it may not DESCRIBE)",
    ),
    # -- the schema registry ---------------------------------------------------------------
    ("GET", "/schemas/types"): AUTHENTICATED,
    ("GET", "/schemas/ids/{schema_id}"): cluster(Op.DESCRIBE),
    ("GET", "/schemas/ids/{schema_id}/schema"): cluster(Op.DESCRIBE),
    ("GET", "/schemas/ids/{schema_id}/versions"): cluster(Op.DESCRIBE),
    ("GET", "/schemas/ids/{schema_id}/subjects"): cluster(Op.DESCRIBE),
    ("GET", "/subjects"): cluster(Op.DESCRIBE),
    ("GET", "/subjects/{subject}/versions"): cluster(Op.DESCRIBE),
    ("POST", "/subjects/{subject}/versions"): cluster(Op.ALTER),
    ("GET", "/subjects/{subject}/versions/{version}"): cluster(Op.DESCRIBE),
    ("GET", "/subjects/{subject}/versions/{version}/schema"): cluster(Op.DESCRIBE),
    ("GET", "/subjects/{subject}/versions/{version}/referencedby"): cluster(Op.DESCRIBE),
    ("POST", "/subjects/{subject}"): cluster(Op.DESCRIBE),
    ("DELETE", "/subjects/{subject}"): cluster(Op.ALTER),
    ("DELETE", "/subjects/{subject}/versions/{version}"): cluster(Op.ALTER),
    ("POST", "/compatibility/subjects/{subject}/versions/{version}"): cluster(Op.DESCRIBE),
    ("POST", "/compatibility/subjects/{subject}/versions"): cluster(Op.DESCRIBE),
    ("GET", "/config"): cluster(Op.DESCRIBE_CONFIGS),
    ("PUT", "/config"): cluster(Op.ALTER_CONFIGS),
    ("DELETE", "/config"): cluster(Op.ALTER_CONFIGS),
    ("GET", "/config/{subject}"): cluster(Op.DESCRIBE_CONFIGS),
    ("PUT", "/config/{subject}"): cluster(Op.ALTER_CONFIGS),
    ("DELETE", "/config/{subject}"): cluster(Op.ALTER_CONFIGS),
    ("GET", "/mode"): cluster(Op.DESCRIBE_CONFIGS),
    ("GET", "/mode/{subject}"): cluster(Op.DESCRIBE_CONFIGS),
    # -- principals (service.security.routes): super users only ------------------------------
    ("GET", "/security/users"): SUPER_USER,
    ("POST", "/security/users"): SUPER_USER,
    ("PUT", "/security/users/{name}/password"): SUPER_USER,
    ("DELETE", "/security/users/{name}"): SUPER_USER,
    ("GET", "/security/api-keys"): SUPER_USER,
    ("POST", "/security/api-keys"): SUPER_USER,
    ("POST", "/security/api-keys/{key_id}/rotate"): SUPER_USER,
    ("DELETE", "/security/api-keys/{key_id}"): SUPER_USER,
}
# Both forms of the v2 consumer paths are routes (service.web strips the trailing slash).
RULES.update({(m, p + "/"): r for (m, p), r in list(RULES.items()) if p.startswith(_G)})


def rule_for(method: str, path: str) -> Rule | None:
    """The rule of a route (HEAD is GET's)."""
    return RULES.get(("GET" if method == "HEAD" else method, path))


def route_of(app: FastAPI, scope: Scope) -> tuple[str, dict[str, Any]] | None:
    """(path template, path parameters) of the route serving ``scope``; None if none."""
    routes = getattr(app.state, "leaf_routes", None)
    if routes is None:
        routes = app.state.leaf_routes = list(_leaf_routes(app.router.routes))
    for route in routes:
        match, child = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", "")), dict(child.get("path_params", {}))
    return None


def _filtered(data: Any, keep: Callable[[str], bool], key: str) -> Any:
    """A listing answer with the items the principal may not describe left out."""
    if isinstance(data, list) and not key:  # v2: a list of names
        return [n for n in data if isinstance(n, str) and keep(n)]
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        items = [i for i in data["data"] if isinstance(i, dict) and keep(str(i.get(key, "")))]
        return {**data, "data": items}
    return data


class AclMiddleware:
    """403 40301 for what the principal may not do (see the module doc). Added after
    (inside) authentication, only when authorization is on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app: FastAPI = scope["app"]
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or scope["method"] == "OPTIONS"
            or path in app.state.open_paths
            or path.startswith(SELF_GUARDED)
        ):
            await self.app(scope, receive, send)
            return
        found = route_of(app, scope)
        if found is None:  # 404/405: the router answers, naming nothing that exists
            await self.app(scope, receive, send)
            return
        template, found_params = found
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        params = {**found_params, QUERY: query}
        rule = rule_for(scope["method"], template)
        principal = principal_of(scope)
        cache: AclCache = app.state.acl_cache
        try:
            authorizer = await cache.authorizer()
        except LakelogError as e:
            await send_error(scope, send, 503, int(ErrorCode.KAFKA_RETRIABLE_ERROR), e.message)
            return
        host = client_address(scope)
        if rule is None:
            log.error("no authorization rule for %s %s: refused", scope["method"], template)
            await _deny(scope, send)
            return
        body: Any = None
        if rule.body:
            raw = await read_body(receive)
            receive = replay(raw)
            try:
                body = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                body = None  # the route answers the malformed body itself
        if rule.super_user and not authorizer.is_super_user(principal):
            await _deny(scope, send)
            return
        decisions = [
            authorizer.authorize(principal, host, c.operation, c.resource_type, c.name)
            for c in rule.checks(params, body)
        ]
        if decisions and not (any(decisions) if rule.any_of else all(decisions)):
            await _deny(scope, send)
            return
        if rule.listing is None:
            await self.app(scope, receive, send)
            return
        rtype, key = rule.listing

        def keep(name: str) -> bool:
            return authorizer.authorize(principal, host, Op.DESCRIBE, rtype, name)

        await self.app(scope, receive, RewriteJson(send, lambda doc: _filtered(doc, keep, key)))


async def _deny(scope: Scope, send: Send) -> None:
    await send_error(
        scope,
        send,
        403,
        int(ErrorCode.KAFKA_AUTHORIZATION),
        "Not authorized to perform this operation.",
    )


def missing_rules(app: FastAPI) -> list[str]:
    """Routes of ``app`` without a rule (a test and start-up check it is empty)."""
    return [
        f"{method} {getattr(route, 'path', '')}"
        for route in _leaf_routes(app.router.routes)
        for method in sorted(getattr(route, "methods", None) or ())
        if method != "HEAD" and rule_for(method, str(getattr(route, "path", ""))) is None
    ]


def rules_table() -> str:
    """Every REST route and what it needs, as README "Security" shows it (Markdown)."""
    lines = ["| method | path | needs | and its handler checks |", "|---|---|---|---|"]
    for (method, path), rule in sorted(RULES.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if path.endswith("/") and path != "/" and (method, path.rstrip("/")) in RULES:
            continue  # the trailing-slash twin of a route listed
        lines.append(f"| {method} | `{path}` | {rule.needs} | {rule.also} |")
    return "\n".join(lines) + "\n"
