"""Client certificates (mTLS) on the agent's HTTP listener.

With ``tls_client_ca_file`` the agent asks HTTPS clients for a certificate and verifies
any it gets against that CA (optional: clients without one still use HTTP Basic or a
bearer token). uvicorn does not hand the peer's certificate to the app, so the agent
serves with :class:`ClientCertProtocol`, uvicorn's h11 protocol that, per connection,
puts the certificate's principal (``User:<its subject's CN>``, or what
``tls_principal_mapping_rules`` make of its DN, as on the Kafka listener) in each
request's scope under the ASGI TLS extension. ``BasicAuthMiddleware`` takes it
when the request carries no ``Authorization`` header (a credential given wins, as SASL
does over a certificate on Kafka's SASL_SSL).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from coordinator.security.model import PrincipalMapper
from coordinator.security.settings import AgentSecuritySettings
from segments.errors import LakelogError
from service.security.auth import CERT_PRINCIPAL_KEY

log = logging.getLogger(__name__)


class ClientCertProtocol(H11Protocol):
    """uvicorn's h11 protocol, adding the verified client certificate's principal to the
    scope of every request of the connection (``mapper``: the agent's mapping rules)."""

    mapper: PrincipalMapper | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        from service.kafka.sasl import certificate_principal

        peercert = transport.get_extra_info("peercert")  # only once the CA verified it
        try:
            principal = certificate_principal(peercert, self.mapper) if peercert else None
        except LakelogError as e:  # a common name that is no user name: no principal
            log.warning("client certificate not used as a principal: %s", e.message)
            principal = None
        if principal is not None:
            self.app = _with_principal(self.app, principal)


def _with_principal(app: ASGIApp, principal: str) -> ASGIApp:
    async def app_with_principal(scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("extensions", {}).setdefault("tls", {})[CERT_PRINCIPAL_KEY] = principal
        await app(scope, receive, send)

    return app_with_principal


def uvicorn_tls(settings: AgentSecuritySettings) -> dict[str, Any]:
    """uvicorn's keyword arguments for the agent's TLS (none for plain HTTP)."""
    if not settings.tls_cert_file:
        return {}
    options: dict[str, Any] = {
        "ssl_certfile": settings.tls_cert_file,
        "ssl_keyfile": settings.tls_key_file,
    }
    if settings.tls_client_ca_file:
        protocol = type(
            "MappedClientCertProtocol",
            (ClientCertProtocol,),
            {"mapper": settings.principal_mapper()},
        )
        options.update(
            ssl_ca_certs=settings.tls_client_ca_file,
            ssl_cert_reqs=ssl.CERT_OPTIONAL,
            http=protocol,
        )
    return options
