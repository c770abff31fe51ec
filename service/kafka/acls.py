"""Kafka's ACL APIs: CreateAcls, DescribeAcls, DeleteAcls (versions 1-3).

They keep the coordinator's ACLs, the ones REST v3 ``/acls`` and ``lakelog acls``
manage (``coordinator.security.store``), and drop this agent's ACL cache at once after
a change. Who may call them is ``service.kafka.acl``'s business (ALTER on the cluster
to create and delete, DESCRIBE to describe). Without an authorizer (authorization off)
Kafka answers SECURITY_DISABLED, and so do these.

Filters are Kafka's: ANY (or a null name, principal or host) matches every value;
pattern type MATCH matches the bindings that apply to the name (literal equal,
literal ``*``, or a prefix of it). DeleteAcls answers, per filter, the ACLs it deleted.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.security.model import AclBinding, AclFilter
from coordinator.security.store import SecurityStore
from segments.errors import InvalidSecurityRequestError, LakelogError
from service.executors import call
from service.kafka.acl import CLUSTER_DENIED, Access
from service.kafka.errors import code_for
from service.kafka.framing import Request, build, nested
from service.kafka.handlers import KafkaContext, response_cls
from service.security.install import acting_for

#: Kafka's wire codes (org.apache.kafka.common.resource / acl): code -> our name.
RESOURCE_TYPES = {1: "ANY", 2: "TOPIC", 3: "GROUP", 4: "CLUSTER", 5: "TRANSACTIONAL_ID"}
PATTERN_TYPES = {1: "ANY", 2: "MATCH", 3: "LITERAL", 4: "PREFIXED"}
OPERATIONS = {
    1: "ANY",
    2: "ALL",
    3: "READ",
    4: "WRITE",
    5: "CREATE",
    6: "DELETE",
    7: "ALTER",
    8: "DESCRIBE",
    9: "CLUSTER_ACTION",
    10: "DESCRIBE_CONFIGS",
    11: "ALTER_CONFIGS",
    12: "IDEMPOTENT_WRITE",
}
PERMISSIONS = {1: "ANY", 2: "DENY", 3: "ALLOW"}
_CODES = {
    table: {name: code for code, name in names.items()}
    for table, names in (
        ("resource", RESOURCE_TYPES),
        ("pattern", PATTERN_TYPES),
        ("operation", OPERATIONS),
        ("permission", PERMISSIONS),
    )
}
_DISABLED = "No Authorizer is configured on the broker."


def _name(table: dict[int, str], code: int, what: str) -> str:
    try:
        return table[int(code)]
    except KeyError:
        raise InvalidSecurityRequestError(f"unknown {what} {code}") from None


def _wire(b: AclBinding) -> dict[str, Any]:
    """The binding in Kafka's wire codes (the fields DeleteAclsMatchingAcl names)."""
    return dict(
        resource_type=_CODES["resource"][b.resource_type.value],
        resource_name=b.resource_name,
        pattern_type=_CODES["pattern"][b.pattern_type.value],
        principal=b.principal,
        host=b.host,
        operation=_CODES["operation"][b.operation.value],
        permission_type=_CODES["permission"][b.permission.value],
    )


def _filter(f: Any) -> AclFilter:
    """An AclFilter from DescribeAclsRequest's or DeleteAclsFilter's fields."""
    return AclFilter.of(
        principal=f.principal_filter,
        host=f.host_filter,
        resource_type=_name(RESOURCE_TYPES, f.resource_type_filter, "resource type"),
        resource_name=f.resource_name_filter,
        pattern_type=_name(PATTERN_TYPES, f.pattern_type_filter, "pattern type"),
        operation=_name(OPERATIONS, f.operation, "operation"),
        permission=_name(PERMISSIONS, f.permission_type, "permission type"),
    )


def _store(ctx: KafkaContext) -> SecurityStore | None:
    return ctx.acl.store if ctx.acl is not None else None


def _failure(e: LakelogError | None, denied: bool) -> tuple[ErrorCode, str | None]:
    if denied:
        return CLUSTER_DENIED, None
    if e is None:
        return ErrorCode.security_disabled, _DISABLED
    return code_for(e), e.message


async def create_acls(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Each creation on its own: a bad one gets its error, the others are stored."""
    resp = response_cls(type(req.body))
    result_cls = nested(resp, "AclCreationResult")
    store = _store(ctx)
    results = []
    for c in req.body.creations:
        code, message = ErrorCode.none, None
        try:
            if store is None or not access.cluster():
                code, message = _failure(None, store is not None)
            else:
                binding = AclBinding.of(
                    c.principal,
                    c.host,
                    _name(RESOURCE_TYPES, c.resource_type, "resource type"),
                    c.resource_name,
                    _name(PATTERN_TYPES, c.resource_pattern_type, "pattern type"),
                    _name(OPERATIONS, c.operation, "operation"),
                    _name(PERMISSIONS, c.permission_type, "permission type"),
                )
                # The connection's own credential goes to a coordinator process with it.
                await call(acting_for(store, access.credential).create_acls, [binding])
        except LakelogError as e:
            code, message = _failure(e, False)
        results.append(build(result_cls, error_code=code, error_message=message))
    if ctx.acl is not None:
        ctx.acl.invalidate()
    return build(resp, throttle_time=0, results=tuple(results))


async def describe_acls(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """The bindings the filter matches, grouped by resource pattern."""
    body = req.body
    resp = response_cls(type(body))
    resource_cls, acl_cls = nested(resp, "DescribeAclsResource"), nested(resp, "AclDescription")
    store = _store(ctx)
    code, message, found = ErrorCode.none, None, []
    try:
        if store is None or not access.cluster():
            code, message = _failure(None, store is not None)
        else:
            found = await call(store.describe_acls, [_filter(body)])
    except LakelogError as e:
        code, message = _failure(e, False)
    by_resource: dict[tuple[int, str, int], list[Any]] = {}
    for b in found:
        w = _wire(b)
        key = (w["resource_type"], w["resource_name"], w["pattern_type"])
        by_resource.setdefault(key, []).append(
            build(
                acl_cls,
                principal=b.principal,
                host=b.host,
                operation=w["operation"],
                permission_type=w["permission_type"],
            )
        )
    return build(
        resp,
        throttle_time=0,
        error_code=code,
        error_message=message,
        resources=tuple(
            build(
                resource_cls,
                resource_type=rtype,
                resource_name=name,
                pattern_type=pattern,
                acls=tuple(acls),
            )
            for (rtype, name, pattern), acls in by_resource.items()
        ),
    )


async def delete_acls(ctx: KafkaContext, req: Request, access: Access) -> Any:
    """Per filter, the ACLs it matched and deleted (a filter's error leaves the others)."""
    resp = response_cls(type(req.body))
    result_cls, matching_cls = (
        nested(resp, "DeleteAclsFilterResult"),
        nested(resp, "DeleteAclsMatchingAcl"),
    )
    store = _store(ctx)
    results = []
    for f in req.body.filters:
        code, message, deleted = ErrorCode.none, None, []
        try:
            if store is None or not access.cluster():
                code, message = _failure(None, store is not None)
            else:
                managing = acting_for(store, access.credential)
                deleted = await call(managing.delete_acls, [_filter(f)])
        except LakelogError as e:
            code, message = _failure(e, False)
        results.append(
            build(
                result_cls,
                error_code=code,
                error_message=message,
                matching_acls=tuple(
                    build(matching_cls, error_code=0, error_message=None, **_wire(b))
                    for b in deleted
                ),
            )
        )
    if ctx.acl is not None:
        ctx.acl.invalidate()
    return build(resp, throttle_time=0, filter_results=tuple(results))
