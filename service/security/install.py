"""The agent's security, put together: which middleware, which store, what is logged.

``install(app, settings)`` (from ``create_app``) adds authentication and ACL checks
when they are on; ``start(app, settings, coordinator, registry)`` (from the lifespan)
builds what they use: the security store (in-process or over the coordinator's API),
the credential cache and the ACL cache. With authentication off it logs a warning:
then anyone who reaches the agent may read, write and delete every topic.

Against coordinator processes, ``start`` first compares the coordinators' security
settings (authentication, authorization, super users) with the agent's and refuses to
start on any difference: an agent checking credentials in front of a coordinator that
checks none would guard nothing. Management calls (users, API keys, ACL changes) carry
the caller's own credential to the coordinator (:func:`acting_for`), which checks it
itself: the agents' shared secret manages nothing.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from prometheus_client import CollectorRegistry

from coordinator.client import Coordinator
from coordinator.security.logins import AuthMetrics
from coordinator.security.model import ANONYMOUS, parse_super_users
from coordinator.security.store import SecurityStore, SqlSecurityStore
from segments.errors import AuthorizationError, LakelogError, SecurityDisabledError
from service.security.acl import AclCache, AclMiddleware, missing_rules
from service.security.auth import Authenticator, BasicAuthMiddleware, open_paths
from service.settings import Settings

log = logging.getLogger(__name__)


def security_store(coordinator: Coordinator) -> SecurityStore:
    """The security store behind ``coordinator``: its database in-process, else its API."""
    from coordinator.local import LocalCoordinator

    if isinstance(coordinator, LocalCoordinator):
        return SqlSecurityStore(coordinator.db)
    from coordinator.http.client import is_http_coordinator
    from coordinator.security.http import HttpSecurityStore

    if is_http_coordinator(coordinator):
        return HttpSecurityStore(coordinator)
    raise TypeError(f"no security store behind {coordinator!r}")


def acting_for(store: SecurityStore, credential: str | None) -> SecurityStore:
    """``store`` as the caller's own principal manages with it: over a coordinator's API,
    each call carries the caller's credential (the coordinator checks it); in-process, the
    store itself (this agent's checks are the only ones).

    Raises:
        AuthorizationError: over a coordinator's API, a caller without a credential to
            forward (an OAuth or certificate principal: it cannot prove itself there).
    """
    from coordinator.security.http import HttpSecurityStore

    if not isinstance(store, HttpSecurityStore):
        return store
    if credential is None:
        raise AuthorizationError(
            "Managing users, API keys and ACLs through an agent of coordinator processes "
            "needs a password, API key or SCRAM login, which the coordinator checks itself; "
            "an OAuth token or a client certificate cannot be."
        )
    return store.acting_for(credential)


def check_coordinator(settings: Settings, store: SecurityStore) -> None:
    """Refuse to serve in front of coordinators whose security settings differ.

    Raises:
        RuntimeError: they differ, or the coordinator does not say (it is older, or
            refuses this agent's secret).
    """
    from coordinator.security.http import HttpSecurityStore

    if not isinstance(store, HttpSecurityStore):
        return  # in-process: one set of settings
    mine = {
        "authentication": settings.authentication,
        "authorization": settings.authorization,
        "super_users": sorted(parse_super_users(settings.super_users)),
    }
    try:
        theirs = store.settings()
    except LakelogError as e:
        raise RuntimeError(
            f"cannot read the coordinators' security settings ({e.message}): refusing to "
            "serve without knowing they match this agent's"
        ) from None
    differ = sorted(k for k in mine if theirs.get(k) != mine[k])
    if differ:
        detail = "; ".join(f"{k}: agent {mine[k]!r}, coordinator {theirs.get(k)!r}" for k in differ)
        raise RuntimeError(
            "the coordinators' security settings differ from this agent's, which would leave "
            f"a door open: {detail}. Give agents and coordinators the same authentication, "
            "authorization and super_users."
        )


def install(app: FastAPI, settings: Settings) -> None:
    """Add the security middleware the settings ask for (call before the other middleware:
    these must run inside the body limit and the proxy-header rewriting).

    Raises:
        ValueError: the security settings do not go together.
    """
    problems = settings.security_problems()
    if problems:
        raise ValueError("; ".join(problems))
    app.state.open_paths = open_paths(
        settings.protect_metrics and settings.authentication != "none"
    )
    if settings.authorization == "acl":
        app.add_middleware(AclMiddleware)
    if settings.authentication == "basic":
        app.add_middleware(BasicAuthMiddleware)


def start(
    app: FastAPI, settings: Settings, coordinator: Coordinator, registry: CollectorRegistry
) -> None:
    """Build the stores and caches the middleware uses (lifespan, before serving).

    Raises:
        RuntimeError: authorization is on and a route has no rule in ``service.security.acl``.
    """
    if settings.authorization == "acl":
        missing = missing_rules(app)
        if missing:
            raise RuntimeError(f"routes without an authorization rule: {missing}")
    store = security_store(coordinator)
    check_coordinator(settings, store)
    app.state.security_store = store
    app.state.authenticator = Authenticator(
        store,
        cache_ttl_s=settings.auth_cache_ttl_s,
        max_failures=settings.auth_max_failures,
        failure_window_s=settings.auth_failure_window_s,
        metrics=AuthMetrics(registry),
    )
    if settings.oauth_jwks:
        # Imported only here: the JOSE library costs a quarter second at every start.
        from service.security.oauth import BearerVerifier

        app.state.authenticator.bearer = BearerVerifier(
            settings.oauth_jwks,
            issuer=settings.oauth_issuer,
            audience=settings.oauth_audience,
            principal_claim=settings.oauth_principal_claim,
        )
    app.state.acl_cache = AclCache(
        store, parse_super_users(settings.super_users), settings.auth_cache_ttl_s
    )
    if settings.authentication == "none":
        log.warning(
            "authentication is OFF: anyone who reaches this agent may read, write and delete "
            "every topic (set authentication=basic, LAKELOG_AUTHENTICATION)"
        )
    else:
        log.info(
            "authentication %s, authorization %s, %d super user(s)",
            settings.authentication,
            settings.authorization,
            len(parse_super_users(settings.super_users)),
        )


def require_super_user(request: Request) -> SecurityStore:
    """Dependency of the principal-management routes: the store, for a super user only.

    Raises:
        SecurityDisabledError: authentication is off (no one is a super user then).
        AuthorizationError: the principal is not a super user.
    """
    settings: Settings = request.app.state.settings
    if settings.authentication == "none":
        raise SecurityDisabledError("Authentication is off: principals cannot be managed.")
    principal = getattr(request.state, "principal", ANONYMOUS)
    if principal not in parse_super_users(settings.super_users):
        raise AuthorizationError("Only super users manage principals.")
    return acting_for(request.app.state.security_store, credential_of(request))


def credential_of(request: Request) -> str | None:
    """The request's own credential (HTTP Basic), which management calls forward."""
    return getattr(request.state, "credential", None)


def require_authorizer(request: Request) -> SecurityStore:
    """Dependency of the v3 ACL routes: the store while authorization is on.

    Raises:
        SecurityDisabledError: authorization is off (Kafka's answer without an authorizer).
    """
    settings: Settings = request.app.state.settings
    if settings.authorization != "acl":
        raise SecurityDisabledError("No Authorizer is configured on the broker.")
    store: SecurityStore = request.app.state.security_store
    if request.method == "GET":  # describing ACLs is an agent's own business
        return store
    return acting_for(store, credential_of(request))


#: Route parameters: the security store, for super users only / once authorization is on.
SuperUserStore = Annotated[SecurityStore, Depends(require_super_user)]
AuthorizerStore = Annotated[SecurityStore, Depends(require_authorizer)]
