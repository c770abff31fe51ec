"""The security settings of ``lakelog serve``, ``agent`` and ``coordinator`` (issue 15).

Mixed into the per-process settings classes (``coordinator.settings``,
``service.settings``); everything is off by default. Secrets are ``SecretStr``, so a
settings object printed or logged shows ``**********``.
"""

from __future__ import annotations

import ipaddress
import ssl
from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

from coordinator.security import parse_super_users
from segments.errors import InvalidSecurityRequestError

Authentication = Literal["none", "basic"]
Authorization = Literal["none", "acl"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen address) is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


class CoordinatorSecuritySettings(BaseModel):
    """What a coordinator process needs: whether callers must authenticate, and how, and
    whether it decides by ACLs (for Spark jobs, ``POST /v1/security/authorize``)."""

    authentication: Authentication = Field(
        default="none",
        description="none, or basic: REST clients need HTTP Basic (a user's password or an API "
        "key), and a coordinator serves only agents presenting coordinator_secret.",
    )
    coordinator_secret: SecretStr | None = Field(
        default=None,
        description="Shared secret agents present to coordinators (required on both when "
        "authentication is on and agents use a coordinator process).",
    )

    authorization: Authorization = Field(
        default="none",
        description="none, or acl: every REST request and Kafka API (agent) and every Spark "
        "job's topic (coordinator) is checked against the coordinator's ACLs (default deny; "
        "super_users may do anything).",
    )
    super_users: str = Field(
        default="",
        description="Principals allowed everything, semicolon-separated: User:admin;User:ops.",
    )

    allow_unauthenticated: bool = Field(
        default=False,
        description="Listen on a host other than loopback with authentication none (anyone "
        "who reaches it may read, write and delete every topic); refused without it.",
    )

    tls_cert_file: str | None = Field(
        default=None,
        description="PEM certificate (chain) to serve TLS with: HTTPS, and on an agent also its "
        "Kafka listener (SSL / SASL_SSL). Needs tls_key_file.",
    )
    tls_key_file: str | None = Field(default=None, description="PEM private key of tls_cert_file.")

    @field_validator("super_users")
    @classmethod
    def _check_super_users(cls, v: str) -> str:
        try:
            parse_super_users(v)
        except InvalidSecurityRequestError as e:
            raise ValueError(e.message) from None
        return v

    def server_tls(self) -> ssl.SSLContext | None:
        """The TLS context to serve with, or None for plaintext. With
        ``tls_client_ca_file``, clients may present certificates signed by it (verified
        when presented)."""
        if not self.tls_cert_file:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        client_ca = self.__dict__.get("tls_client_ca_file")  # agents only
        if client_ca:
            context.load_verify_locations(cafile=client_ca)
            context.verify_mode = ssl.CERT_OPTIONAL
        return context

    def shared_secret(self) -> str | None:
        return self.coordinator_secret.get_secret_value() if self.coordinator_secret else None

    def super_user_set(self) -> frozenset[str]:
        return parse_super_users(self.super_users)

    def security_problems(self) -> list[str]:
        """What is wrong with the security settings taken together (each one alone is
        checked by its field); a process refuses to start with any."""
        problems = []
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            problems.append("tls_cert_file and tls_key_file go together")
        if self.authorization == "acl" and self.authentication == "none":
            problems.append("authorization acl needs authentication (basic): whom would it check?")
        host = str(self.__dict__.get("host", "127.0.0.1"))
        open_to_all = self.authentication == "none" and not self.allow_unauthenticated
        if open_to_all and not is_loopback(host):
            problems.append(
                f"host {host} listens beyond this machine with authentication none: anyone who "
                "reaches it could read, write and delete every topic. Turn authentication on "
                "(authentication=basic), listen on 127.0.0.1, or accept that with "
                "--allow-unauthenticated (LAKELOG_ALLOW_UNAUTHENTICATED=true)"
            )
        is_coordinator = getattr(self, "process", "") == "coordinator"
        if is_coordinator and self.authentication != "none" and not self.shared_secret():
            problems.append(
                "authentication on a coordinator needs coordinator_secret "
                "(LAKELOG_COORDINATOR_SECRET): it must never serve an unauthenticated agent"
            )
        return problems


class AgentSecuritySettings(CoordinatorSecuritySettings):
    """An agent's (and ``serve``'s): authentication of clients (the coordinator's settings
    plus the caches, throttling, OAuth and mTLS)."""

    auth_cache_ttl_s: Annotated[float, Field(ge=0, le=300)] = Field(
        default=5.0,
        description="How long an agent trusts a verified credential and its copy of the ACLs "
        "(the staleness bound of a password change, key rotation or ACL change).",
    )
    auth_max_failures: Annotated[int, Field(ge=1)] = Field(
        default=10,
        description="Failed logins allowed per principal and per client address within "
        "auth_failure_window_s; more are refused with 429 until the window passes.",
    )
    auth_failure_window_s: Annotated[float, Field(gt=0)] = Field(
        default=60.0, description="The window failed logins are counted in."
    )

    oauth_jwks: str | None = Field(
        default=None,
        description="JWKS (file path or http(s) URL) whose keys sign accepted OAuth bearer JWTs: "
        "enables Authorization: Bearer on REST and SASL/OAUTHBEARER on Kafka.",
    )
    oauth_issuer: str | None = Field(
        default=None, description="Required iss of bearer tokens (unset: any)."
    )
    oauth_audience: str | None = Field(
        default=None, description="Required aud of bearer tokens (unset: any)."
    )
    oauth_principal_claim: str = Field(
        default="sub", description="The bearer token claim that names the principal (User:<it>)."
    )
    tls_client_ca_file: str | None = Field(
        default=None,
        description="PEM CA certificates of client certificates (mTLS) on an agent's Kafka "
        "listener: a connection presenting one is authenticated as User:<its subject's CN>, "
        "without SASL.",
    )

    tls_ca_file: str | None = Field(
        default=None,
        description="PEM CA certificates an agent trusts for https:// coordinator URLs "
        "(default: the system's).",
    )

    def coordinator_verify(self) -> ssl.SSLContext | bool:
        """What an agent verifies https:// coordinators with."""
        if not self.tls_ca_file:
            return True
        return ssl.create_default_context(cafile=self.tls_ca_file)

    def security_problems(self) -> list[str]:
        problems = super().security_problems()
        if self.tls_client_ca_file and not self.tls_cert_file:
            problems.append("tls_client_ca_file needs TLS (tls_cert_file, tls_key_file)")
        coordinators = str(self.__dict__.get("coordinator", ""))
        if self.authentication != "none" and coordinators and not self.shared_secret():
            problems.append(
                "authentication on an agent of coordinator processes needs coordinator_secret "
                "(LAKELOG_COORDINATOR_SECRET): the coordinators refuse agents without it"
            )
        return problems
