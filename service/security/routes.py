"""Principals over the agent's REST API (a lakelog extension; super users only).

::

    GET    /security/users                      {"users": [{"name", "created_at"}]}
    POST   /security/users                      201 user  <- {"name", "password"}
    PUT    /security/users/{name}/password      204  <- {"password"}
    DELETE /security/users/{name}               204 (and the user's API keys)
    GET    /security/api-keys?owner=            {"api_keys": [key]}
    POST   /security/api-keys                   201 {"api_key": key, "secret"}  <- {"owner",
                                                "description"}; the secret is shown only here
    POST   /security/api-keys/{key_id}/rotate   200 {"api_key": key, "secret"}
    DELETE /security/api-keys/{key_id}          204

``lakelog users`` and ``lakelog api-keys`` with ``--url`` call these.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request, Response
from fastapi.responses import JSONResponse

from coordinator.security.store import ApiKeySecret
from coordinator.security.wire import key_to_json, user_to_json
from segments.errors import InvalidSecurityRequestError
from service.executors import call
from service.security.install import SuperUserStore

router = APIRouter(tags=["security"])


def _text(body: Any, key: str, default: str | None = None) -> str:
    value = body.get(key, default) if isinstance(body, dict) else default
    if not isinstance(value, str):
        raise InvalidSecurityRequestError(f"{key} must be a string")
    return value


def _forget(request: Request) -> None:
    request.app.state.authenticator.forget()


@router.get("/security/users")
async def list_users(store: SuperUserStore) -> JSONResponse:
    users = await call(store.list_users)
    return JSONResponse({"users": [user_to_json(u) for u in users]})


@router.post("/security/users", status_code=201)
async def create_user(store: SuperUserStore, body: Any = Body()) -> JSONResponse:
    user = await call(store.create_user, _text(body, "name"), _text(body, "password"))
    return JSONResponse(user_to_json(user), status_code=201)


@router.put("/security/users/{name}/password", status_code=204)
async def set_password(
    name: str, request: Request, store: SuperUserStore, body: Any = Body()
) -> Response:
    await call(store.set_password, name, _text(body, "password"))
    _forget(request)
    return Response(status_code=204)


@router.delete("/security/users/{name}", status_code=204)
async def delete_user(name: str, request: Request, store: SuperUserStore) -> Response:
    await call(store.delete_user, name)
    _forget(request)
    return Response(status_code=204)


@router.get("/security/api-keys")
async def list_api_keys(store: SuperUserStore, owner: str | None = None) -> JSONResponse:
    keys = await call(store.list_api_keys, owner)
    return JSONResponse({"api_keys": [key_to_json(k) for k in keys]})


def _made(key: ApiKeySecret, status: int) -> JSONResponse:
    return JSONResponse({"api_key": key_to_json(key.key), "secret": key.secret}, status_code=status)


@router.post("/security/api-keys", status_code=201)
async def create_api_key(store: SuperUserStore, body: Any = Body()) -> JSONResponse:
    key = await call(store.create_api_key, _text(body, "owner"), _text(body, "description", ""))
    return _made(key, 201)


@router.post("/security/api-keys/{key_id}/rotate")
async def rotate_api_key(key_id: str, request: Request, store: SuperUserStore) -> JSONResponse:
    key = await call(store.rotate_api_key, key_id)
    _forget(request)
    return _made(key, 200)


@router.delete("/security/api-keys/{key_id}", status_code=204)
async def delete_api_key(key_id: str, request: Request, store: SuperUserStore) -> Response:
    await call(store.delete_api_key, key_id)
    _forget(request)
    return Response(status_code=204)
