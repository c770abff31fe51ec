"""v3 ACLs while no authorizer is configured: Kafka's answer, 400 40002.

Kafka without an authorizer refuses every ACL request with a
SecurityDisabledException, which kafka-rest answers with 400 40002 (REST-API.md
section 3.8). The cluster resource links here (``acls`` is a required field of
KafkaCluster), so the routes exist and give that answer rather than a 404. Issue 15
(security) replaces them with real ACLs.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from segments.errors import SecurityDisabledError
from service.v3.common import Links, cluster_links

router = APIRouter(tags=["v3 acls"])

_ACLS = "/v3/clusters/{cluster_id}/acls"


@router.get(_ACLS)
@router.post(_ACLS)
@router.delete(_ACLS)
@router.post(_ACLS + ":batch")
async def acls_disabled(links: Links = Depends(cluster_links)) -> None:
    """List, create, delete ACLs: 400 40002, no authorizer is configured."""
    raise SecurityDisabledError("No Authorizer is configured on the broker.")
