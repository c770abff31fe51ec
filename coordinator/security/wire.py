"""The JSON form of the security values (users, API keys, SCRAM credentials, ACLs, ACL
filters, access checks) on the coordinator's ``/v1/security`` routes, and the header an
agent sends them with: what the routes (``coordinator.security.http``), the agents' REST
v3 ACL routes and the ``lakelog`` command share.

May import ``coordinator.security.model`` and ``coordinator.security.store`` (the
values) and ``segments.errors``; no web framework, so the command line stays quick to
start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coordinator.security.model import AclBinding, AclFilter, Check
from coordinator.security.store import ApiKeyInfo, ScramCredential, UserInfo
from segments.errors import InvalidSecurityRequestError

#: An ACL's fields as every JSON form names them (the v3 API's too).
ACL_KEYS = (
    "principal",
    "host",
    "resource_type",
    "resource_name",
    "pattern_type",
    "operation",
    "permission",
)


def secret_headers(secret: str | None) -> dict[str, str]:
    """The headers an agent sends so a coordinator with ``secret`` serves it."""
    return {"authorization": f"Bearer {secret}"} if secret else {}


def user_to_json(u: UserInfo) -> dict[str, Any]:
    return {"name": u.name, "created_at": u.created_at}


def user_from_json(d: Mapping[str, Any]) -> UserInfo:
    return UserInfo(str(d["name"]), float(d["created_at"]))


def key_to_json(k: ApiKeyInfo) -> dict[str, Any]:
    return {
        "key_id": k.key_id,
        "owner": k.owner,
        "description": k.description,
        "created_at": k.created_at,
    }


def key_from_json(d: Mapping[str, Any]) -> ApiKeyInfo:
    return ApiKeyInfo(
        str(d["key_id"]), str(d["owner"]), str(d["description"]), float(d["created_at"])
    )


def scram_to_json(c: ScramCredential) -> dict[str, Any]:
    return {
        "salt": c.salt.hex(),
        "stored_key": c.stored_key.hex(),
        "server_key": c.server_key.hex(),
        "iterations": c.iterations,
    }


def scram_from_json(d: Mapping[str, Any]) -> ScramCredential:
    return ScramCredential(
        bytes.fromhex(d["salt"]),
        bytes.fromhex(d["stored_key"]),
        bytes.fromhex(d["server_key"]),
        int(d["iterations"]),
    )


def acl_to_json(b: AclBinding) -> dict[str, str]:
    return dict(zip(ACL_KEYS, b.row(), strict=True))


def acl_from_json(d: Any) -> AclBinding:
    if not isinstance(d, dict):
        raise InvalidSecurityRequestError(f"an ACL is an object, not {d!r}")
    return AclBinding.of(*(d.get(k) for k in ACL_KEYS))


def filter_to_json(f: AclFilter) -> dict[str, str | None]:
    def text(v: object) -> str | None:
        return None if v is None else str(v)

    return {k: text(getattr(f, k)) for k in ACL_KEYS}


def filter_from_json(d: Any) -> AclFilter:
    if not isinstance(d, dict):
        raise InvalidSecurityRequestError(f"an ACL filter is an object, not {d!r}")
    return AclFilter.of(*(d.get(k) for k in ACL_KEYS))


def check_to_json(c: Check) -> dict[str, str]:
    return {
        "operation": c.operation.value,
        "resource_type": c.resource_type.value,
        "resource_name": c.name,
    }


def check_from_json(d: Any) -> Check:
    if not isinstance(d, dict):
        raise InvalidSecurityRequestError(f"a check is an object, not {d!r}")
    return Check.of(d.get("operation"), d.get("resource_type"), d.get("resource_name"))
