"""v3 ACLs: list, create (one or a batch) and delete by filter (REST-API.md section 3.8).

With ``authorization = acl`` they manage the coordinator's ACLs (``coordinator.security.model``);
without an authorizer Kafka refuses every ACL request with a SecurityDisabledException,
which kafka-rest answers with 400 40002, and so do these. Who may call them is the
ACL middleware's business (``service.security.acl``: DESCRIBE or ALTER on the cluster).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Body, Request, Response
from fastapi.responses import JSONResponse

from coordinator.security.model import AclBinding, AclFilter
from coordinator.security.wire import acl_from_json, acl_to_json
from segments.errors import InvalidSecurityRequestError
from service.executors import call
from service.security.install import AuthorizerStore
from service.v3.common import Links, LinksDep

router = APIRouter(tags=["v3 acls"])

_ACLS = "/v3/clusters/{cluster_id}/acls"


def _acl_data(links: Links, b: AclBinding) -> dict[str, Any]:
    fields = acl_to_json(b)
    return {
        "kind": "KafkaAcl",
        "metadata": {"self": links.cluster("/acls?" + urlencode(fields))},
        "cluster_id": links.cluster_id,
        **fields,
    }


def _filter(request: Request, *, required: tuple[str, ...] = ()) -> AclFilter:
    q = request.query_params
    for name in required:
        if q.get(name, "").upper() in ("", "UNKNOWN"):
            raise InvalidSecurityRequestError(f"{name} cannot be unspecified or UNKNOWN")
    if q.get("resource_type", "").upper() == "UNKNOWN":
        raise InvalidSecurityRequestError("resource_type cannot be UNKNOWN")
    return AclFilter.of(
        principal=q.get("principal") or None,
        host=q.get("host") or None,
        resource_type=q.get("resource_type") or None,
        resource_name=q.get("resource_name") or None,
        pattern_type=q.get("pattern_type") or None,
        operation=q.get("operation") or None,
        permission=q.get("permission") or None,
    )


def _invalidate(request: Request) -> None:
    request.app.state.acl_cache.invalidate()


@router.get(_ACLS)
async def list_acls(request: Request, links: LinksDep, store: AuthorizerStore) -> JSONResponse:
    """The ACLs matching the query (every parameter optional; ANY or absent: any)."""
    found = await call(store.describe_acls, [_filter(request)])
    self_url = links.cluster("/acls") + (f"?{request.url.query}" if request.url.query else "")
    return JSONResponse(
        {
            "kind": "KafkaAclList",
            "metadata": {"self": self_url, "next": None},
            "data": [_acl_data(links, b) for b in found],
        }
    )


@router.post(_ACLS, status_code=201)
async def create_acl(
    request: Request, links: LinksDep, store: AuthorizerStore, body: Any = Body()
) -> Response:
    """One ACL (CreateAclRequestData): 201, no body."""
    await call(store.create_acls, [acl_from_json(body)])
    _invalidate(request)
    return Response(status_code=201)


@router.post(_ACLS + ":batch", status_code=201)
async def create_acls(
    request: Request, links: LinksDep, store: AuthorizerStore, body: Any = Body()
) -> Response:
    """``{"data": [CreateAclRequestData]}``: all or none. 201, no body."""
    items = body.get("data") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise InvalidSecurityRequestError("the body needs data: a list of ACLs")
    await call(store.create_acls, [acl_from_json(i) for i in items])
    _invalidate(request)
    return Response(status_code=201)


@router.delete(_ACLS)
async def delete_acls(request: Request, links: LinksDep, store: AuthorizerStore) -> JSONResponse:
    """Delete what the filter matches (resource_type, pattern_type, operation and
    permission required); 200 with the ACLs deleted."""
    f = _filter(request, required=("resource_type", "pattern_type", "operation", "permission"))
    deleted = await call(store.delete_acls, [f])
    _invalidate(request)
    return JSONResponse({"data": [_acl_data(links, b) for b in deleted]})
