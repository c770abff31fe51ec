"""The security part of the coordinator's HTTP API: routes and the agents' client.

Routes (under ``/v1/security``; names travel in bodies, as group names do)::

    GET  /v1/security/settings        {"authentication", "authorization", "super_users"}
    POST /v1/security/authenticate    {"principal"}  <- {"name", "secret"}   (401 if wrong)
    POST /v1/security/authorize       {"principal", "authorization", "allowed": [bool]}
                                      <- {"name", "secret", "checks": [check]}   (401 if wrong)
    GET  /v1/security/users           {"users": [{"name", "created_at"}]}
    POST /v1/security/users/create    user (201)  <- {"name", "password"}
    POST /v1/security/users/password  204  <- {"name", "password"}
    POST /v1/security/users/delete    204  <- {"name"}
    POST /v1/security/api-keys/list   {"api_keys": [key]}  <- {"owner" | null}
    POST /v1/security/api-keys/create {"api_key": key, "secret"} (201)  <- {"owner", "description"}
    POST /v1/security/api-keys/rotate {"api_key": key, "secret"}  <- {"key_id"}
    POST /v1/security/api-keys/delete 204  <- {"key_id"}
    POST /v1/security/scram           {"credential": {"salt", "stored_key", "server_key",
                                      "iterations"}}  <- {"name", "mechanism"} (hex; a
                                      decoy for a name without one)
    POST /v1/security/acls/create     204  <- {"acls": [acl]}
    POST /v1/security/acls/describe   {"acls": [acl]}  <- {"filters": [filter]}
    POST /v1/security/acls/delete     {"acls": [acl]}  <- {"filters": [filter]}

    acl = {"principal", "host", "resource_type", "resource_name", "pattern_type",
    "operation", "permission"}; a filter has the same keys, each null for any;
    check = {"operation", "resource_type", "resource_name"}.

``authorize`` is how a client that is not an agent (a Spark job) learns what its
principal may do: the coordinator authenticates the credential and decides each check
with its own ACLs and super users (``authorization``, ``super_users``), from the
caller's address. With authorization ``none`` every check is allowed, and the
credential may be left out (null name and secret: ``User:ANONYMOUS``); with ``acl`` a
missing credential is 401.

Who may call each route is ``coordinator.security.access``'s business: agents (the shared
secret) everything but management; users, management and the routes Spark jobs use by
their own credentials. An agent's management calls forward its client's credential
(:meth:`HttpSecurityStore.acting_for`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import Body, Request, Response

from coordinator.security.access import forwarded
from coordinator.security.model import ANONYMOUS, AclBinding, AclFilter, Authorizer, Check
from coordinator.security.settings import AccessSettings
from coordinator.security.store import (
    ApiKeyInfo,
    ApiKeySecret,
    ScramCredential,
    SecurityStore,
    UserInfo,
)
from coordinator.security.wire import (
    acl_from_json,
    acl_to_json,
    check_from_json,
    check_to_json,
    filter_from_json,
    filter_to_json,
    key_from_json,
    key_to_json,
    scram_from_json,
    scram_to_json,
    user_from_json,
    user_to_json,
)
from segments.errors import AuthenticationError, InvalidSecurityRequestError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from coordinator.http.client import HttpCoordinator

#: What ``POST /v1/security/authorize`` answers to a credential without one.
NO_CREDENTIAL = (
    "this coordinator checks ACLs (authorization acl): a user name and password, or an API "
    "key id and secret, are needed"
)


@dataclass(frozen=True, slots=True)
class Authorized:
    """The answer of ``POST /v1/security/authorize``: who the credential is, whether the
    coordinator checks ACLs, and each check's decision (in the checks' order)."""

    principal: str
    authorization: str
    allowed: tuple[bool, ...]


def _field(body: Any, key: str) -> str:
    value = body.get(key) if isinstance(body, dict) else None
    if not isinstance(value, str):
        raise InvalidSecurityRequestError(f"{key} must be a string")
    return value


def _items(body: Any, key: str) -> list[Any]:
    value = body.get(key) if isinstance(body, dict) else None
    if not isinstance(value, list):
        raise InvalidSecurityRequestError(f"{key} must be a list")
    return value


# -- server ---------------------------------------------------------------------------


def install_security_routes(app: FastAPI, security: SecurityStore, access: AccessSettings) -> None:
    """Add the ``/v1/security`` routes over ``security`` to a coordinator app; ``access``
    (its ``authorization`` and ``super_users``) is how ``authorize`` decides."""
    authorization, super_users = access.authorization, access.super_users

    def js(data: Any, status: int = 200) -> Response:
        return Response(orjson.dumps(data), status_code=status, media_type="application/json")

    @app.get("/v1/security/settings")
    def settings() -> Response:
        return js(access.public())

    @app.post("/v1/security/authenticate")
    def authenticate(body: Any = Body()) -> Response:
        return js(
            {"principal": security.authenticate(_field(body, "name"), _field(body, "secret"))}
        )

    @app.post("/v1/security/authorize")
    def authorize(request: Request, body: Any = Body()) -> Response:
        checks = [check_from_json(c) for c in _items(body, "checks")]
        if body.get("name") is None and body.get("secret") is None:
            if authorization == "acl":
                raise AuthenticationError(NO_CREDENTIAL)
            principal = ANONYMOUS
        else:
            principal = security.authenticate(_field(body, "name"), _field(body, "secret"))
        if authorization == "acl":
            # The ACLs as they are now: a decision is never older than this request.
            authorizer = Authorizer(security.describe_acls([AclFilter()]), super_users)
            host = request.client.host if request.client else ""
            allowed = [
                authorizer.authorize(principal, host, c.operation, c.resource_type, c.name)
                for c in checks
            ]
        else:
            allowed = [True] * len(checks)
        return js({"principal": principal, "authorization": authorization, "allowed": allowed})

    @app.post("/v1/security/scram")
    def scram_credential(body: Any = Body()) -> Response:
        cred = security.scram_credential(_field(body, "name"), _field(body, "mechanism"))
        return js({"credential": scram_to_json(cred)})

    @app.get("/v1/security/users")
    def list_users() -> Response:
        return js({"users": [user_to_json(u) for u in security.list_users()]})

    @app.post("/v1/security/users/create")
    def create_user(body: Any = Body()) -> Response:
        user = security.create_user(_field(body, "name"), _field(body, "password"))
        return js(user_to_json(user), 201)

    @app.post("/v1/security/users/password", status_code=204)
    def set_password(body: Any = Body()) -> Response:
        security.set_password(_field(body, "name"), _field(body, "password"))
        return Response(status_code=204)

    @app.post("/v1/security/users/delete", status_code=204)
    def delete_user(body: Any = Body()) -> Response:
        security.delete_user(_field(body, "name"))
        return Response(status_code=204)

    @app.post("/v1/security/api-keys/list")
    def list_api_keys(body: Any = Body()) -> Response:
        owner = body.get("owner") if isinstance(body, dict) else None
        keys = security.list_api_keys(owner if isinstance(owner, str) else None)
        return js({"api_keys": [key_to_json(k) for k in keys]})

    def made(key: ApiKeySecret, status: int) -> Response:
        return js({"api_key": key_to_json(key.key), "secret": key.secret}, status)

    @app.post("/v1/security/api-keys/create")
    def create_api_key(body: Any = Body()) -> Response:
        description = body.get("description", "") if isinstance(body, dict) else ""
        return made(security.create_api_key(_field(body, "owner"), description), 201)

    @app.post("/v1/security/api-keys/rotate")
    def rotate_api_key(body: Any = Body()) -> Response:
        return made(security.rotate_api_key(_field(body, "key_id")), 200)

    @app.post("/v1/security/api-keys/delete", status_code=204)
    def delete_api_key(body: Any = Body()) -> Response:
        security.delete_api_key(_field(body, "key_id"))
        return Response(status_code=204)

    @app.post("/v1/security/acls/create", status_code=204)
    def create_acls(body: Any = Body()) -> Response:
        security.create_acls([acl_from_json(a) for a in _items(body, "acls")])
        return Response(status_code=204)

    @app.post("/v1/security/acls/describe")
    def describe_acls(body: Any = Body()) -> Response:
        filters = [filter_from_json(f) for f in _items(body, "filters")]
        return js({"acls": [acl_to_json(b) for b in security.describe_acls(filters)]})

    @app.post("/v1/security/acls/delete")
    def delete_acls(body: Any = Body()) -> Response:
        filters = [filter_from_json(f) for f in _items(body, "filters")]
        return js({"acls": [acl_to_json(b) for b in security.delete_acls(filters)]})


# -- client ---------------------------------------------------------------------------


class HttpSecurityStore:
    """:class:`SecurityStore` over a coordinator's HTTP API, through an HttpCoordinator's
    transport (its failover, its credential: an agent's shared secret or a user's).

    ``credential``: a principal's own credential sent with every call
    (``X-Lakelog-Principal``, ``coordinator.security.access``), as an agent's management calls
    need: see :meth:`acting_for`.
    """

    def __init__(self, coordinator: HttpCoordinator, credential: str | None = None) -> None:
        self._coordinator = coordinator
        self._headers = forwarded(credential)

    def acting_for(self, credential: str | None) -> HttpSecurityStore:
        """This store, its calls carrying ``credential`` (an agent's client's own)."""
        return HttpSecurityStore(self._coordinator, credential)

    def settings(self) -> dict[str, Any]:
        """The coordinator's security settings (``GET /v1/security/settings``)."""
        data: dict[str, Any] = self._coordinator.request(
            "GET", "/v1/security/settings", idempotent=True
        )
        return data

    def _post(self, path: str, body: Any, *, idempotent: bool) -> Any:
        return self._coordinator.request(  # the one transport, kept private there
            "POST",
            "/v1/security/" + path,
            body=body,
            idempotent=idempotent,
            headers=self._headers,
        )

    def create_user(self, name: str, password: str) -> UserInfo:
        body = {"name": name, "password": password}
        return user_from_json(self._post("users/create", body, idempotent=False))

    def set_password(self, name: str, password: str) -> None:
        self._post("users/password", {"name": name, "password": password}, idempotent=True)

    def delete_user(self, name: str) -> None:
        self._post("users/delete", {"name": name}, idempotent=False)

    def list_users(self) -> list[UserInfo]:
        data = self._coordinator.request(
            "GET", "/v1/security/users", idempotent=True, headers=self._headers
        )
        return [user_from_json(u) for u in data["users"]]

    @staticmethod
    def _made(data: Any) -> ApiKeySecret:
        return ApiKeySecret(key_from_json(data["api_key"]), str(data["secret"]))

    def create_api_key(self, owner: str, description: str = "") -> ApiKeySecret:
        body = {"owner": owner, "description": description}
        return self._made(self._post("api-keys/create", body, idempotent=False))

    def list_api_keys(self, owner: str | None = None) -> list[ApiKeyInfo]:
        data = self._post("api-keys/list", {"owner": owner}, idempotent=True)
        return [key_from_json(k) for k in data["api_keys"]]

    def rotate_api_key(self, key_id: str) -> ApiKeySecret:
        return self._made(self._post("api-keys/rotate", {"key_id": key_id}, idempotent=False))

    def delete_api_key(self, key_id: str) -> None:
        self._post("api-keys/delete", {"key_id": key_id}, idempotent=False)

    def authenticate(self, name: str, secret: str) -> str:
        data = self._post("authenticate", {"name": name, "secret": secret}, idempotent=True)
        principal = data.get("principal") if isinstance(data, dict) else None
        if not isinstance(principal, str):
            raise AuthenticationError("the coordinator did not name a principal")
        return principal

    def authorize(
        self, name: str | None, secret: str | None, checks: Sequence[Check]
    ) -> Authorized:
        """The coordinator's decision on each check for this credential (None and None:
        no credential). Raises AuthenticationError for a bad or missing credential."""
        body = {"name": name, "secret": secret, "checks": [check_to_json(c) for c in checks]}
        data = self._post("authorize", body, idempotent=True)
        allowed = data.get("allowed") if isinstance(data, dict) else None
        if not isinstance(allowed, list) or len(allowed) != len(checks):
            raise AuthenticationError("the coordinator did not decide every check")
        return Authorized(
            str(data["principal"]), str(data["authorization"]), tuple(a is True for a in allowed)
        )

    def scram_credential(self, name: str, mechanism: str) -> ScramCredential:
        body = {"name": name, "mechanism": mechanism}
        return scram_from_json(self._post("scram", body, idempotent=True)["credential"])

    def create_acls(self, bindings: Sequence[AclBinding]) -> None:
        self._post("acls/create", {"acls": [acl_to_json(b) for b in bindings]}, idempotent=True)

    def describe_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        body = {"filters": [filter_to_json(f) for f in filters]}
        return [
            acl_from_json(a) for a in self._post("acls/describe", body, idempotent=True)["acls"]
        ]

    def delete_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        body = {"filters": [filter_to_json(f) for f in filters]}
        return [acl_from_json(a) for a in self._post("acls/delete", body, idempotent=True)["acls"]]
