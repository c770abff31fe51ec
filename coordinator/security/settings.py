"""The security settings of ``lakelog serve``, ``agent`` and ``coordinator`` (issue 15).

Mixed into the per-process settings classes (``coordinator.settings``,
``service.settings``); everything is off by default. Secrets are ``SecretStr``, so a
settings object printed or logged shows ``**********``.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator

from coordinator.security.model import (
    PrincipalMapper,
    parse_super_users,
    placeholder,
    plaintext_remote,
)
from segments.errors import InvalidSecurityRequestError

Authentication = Literal["none", "basic"]
Authorization = Literal["none", "acl"]

#: The shortest shared secret a process accepts (bytes, as Kafka's delegation-token
#: master key advice and ``openssl rand -hex 16`` give).
MIN_SECRET_BYTES = 32


@dataclass(frozen=True, slots=True)
class AccessSettings:
    """A coordinator's security settings, as its HTTP API applies them (and as
    ``GET /v1/security/settings`` tells agents, but for the secret)."""

    authentication: str = "none"
    secret: str | None = None
    authorization: str = "none"
    super_users: frozenset[str] = frozenset()
    protect_metrics: bool = False

    def public(self) -> dict[str, Any]:
        """What an agent compares with its own settings at start."""
        return {
            "authentication": self.authentication,
            "authorization": self.authorization,
            "super_users": sorted(self.super_users),
        }


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
        "key), and a coordinator serves agents presenting coordinator_secret and users (Spark "
        "jobs) by their own credentials.",
    )
    coordinator_secret: SecretStr | None = Field(
        default=None,
        description="Shared secret agents present to coordinators (required on both when "
        "authentication is on and agents use a coordinator process); at least 32 bytes. It "
        "lets an agent do what agents do, nothing more: managing users, API keys and ACLs "
        "needs a principal's own credential, and Spark jobs use their user's.",
    )
    protect_metrics: bool = Field(
        default=False,
        description="With authentication on, /metrics (group and topic names) needs a "
        "credential too: an agent's clients DESCRIBE on the cluster, a coordinator's the "
        "shared secret or such a user.",
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

    @field_validator("coordinator_secret")
    @classmethod
    def _check_secret(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None or not v.get_secret_value():
            return None
        secret = v.get_secret_value()
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(
                f"coordinator_secret must be at least {MIN_SECRET_BYTES} bytes (e.g. "
                "`openssl rand -hex 32`)"
            )
        if placeholder(secret):
            raise ValueError(
                "coordinator_secret is an example value from the documentation: set your own "
                "(e.g. `openssl rand -hex 32`)"
            )
        return v

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

    def access(self) -> AccessSettings:
        """These settings as a coordinator's HTTP API applies them."""
        return AccessSettings(
            self.authentication,
            self.shared_secret(),
            self.authorization,
            self.super_user_set(),
            self.protect_metrics,
        )

    def _example_values(self) -> list[str]:
        """The example secrets of the deployment files (docker-compose's .env.example,
        deploy/k8s) left in place: the metadata database's password, the S3 secret key."""
        problems = []
        db = str(self.__dict__.get("db") or "")
        if db.startswith("postgres") and placeholder(urlsplit(db).password or ""):
            problems.append("the db URL's password is an example value: set your own")
        store = str(self.__dict__.get("store") or "")
        if store.startswith("s3://") and placeholder(os.environ.get("AWS_SECRET_ACCESS_KEY", "")):
            problems.append("AWS_SECRET_ACCESS_KEY is an example value: set your own")
        return problems

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
        problems += self._example_values()
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
        "(the staleness bound of a password change, key rotation, ACL change, or a user or "
        "API key deleted through another process).",
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
    oauth_allow_http_jwks: bool = Field(
        default=False,
        description="Accept an http:// oauth_jwks URL to another host (off: refused at start).",
    )
    oauth_allow_any_issuer: bool = Field(
        default=False,
        description="Accept bearer tokens without oauth_issuer and oauth_audience set (off: "
        "both are required with oauth_jwks).",
    )
    tls_client_ca_file: str | None = Field(
        default=None,
        description="PEM CA certificates of client certificates (mTLS) on an agent's Kafka "
        "listener: a connection presenting one is authenticated as User:<its subject's CN>, "
        "without SASL.",
    )
    tls_principal_mapping_rules: str | None = Field(
        default=None,
        description="Kafka's ssl.principal.mapping.rules for client certificates: "
        "RULE:pattern/replacement/[L|U] and DEFAULT, comma-separated, matched against the "
        "subject's RFC 2253 DN (CN=bob,OU=eng,O=acme); unset: the CN.",
    )

    @field_validator("tls_principal_mapping_rules")
    @classmethod
    def _check_mapping_rules(cls, v: str | None) -> str | None:
        if v:
            try:
                PrincipalMapper(v)
            except InvalidSecurityRequestError as e:
                raise ValueError(e.message) from None
        return v or None

    def principal_mapper(self) -> PrincipalMapper | None:
        """The certificate principal rules, or None (the subject's CN)."""
        rules = self.tls_principal_mapping_rules
        return PrincipalMapper(rules) if rules else None

    tls_ca_file: str | None = Field(
        default=None,
        description="PEM CA certificates an agent trusts for https:// coordinator URLs "
        "(default: the system's).",
    )
    allow_plaintext_coordinator: bool = Field(
        default=False,
        description="With authentication on, allow http:// coordinator URLs to other hosts: "
        "the agent sends its clients' passwords there to be verified. Off: refused at start "
        "(use https://, or a loopback address).",
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
        clear = [u for u in coordinators.split(",") if u.strip() and plaintext_remote(u)]
        if self.authentication != "none" and clear and not self.allow_plaintext_coordinator:
            problems.append(
                f"coordinator {clear[0].strip()} is http:// to another host: this agent would "
                "send its clients' passwords there in clear; use https:// (tls_ca_file), or "
                "set allow_plaintext_coordinator on a private network"
            )
        if self.oauth_jwks and plaintext_remote(self.oauth_jwks) and not self.oauth_allow_http_jwks:
            problems.append(
                "oauth_jwks is http://: anyone on the way could swap the keys that sign accepted "
                "tokens; use https://, a file, or set oauth_allow_http_jwks"
            )
        anyone = not (self.oauth_issuer and self.oauth_audience)
        if self.oauth_jwks and anyone and not self.oauth_allow_any_issuer:
            problems.append(
                "oauth_jwks needs oauth_issuer and oauth_audience: without them a token the "
                "same keys signed for another service is accepted here; or set "
                "oauth_allow_any_issuer"
            )
        return problems
