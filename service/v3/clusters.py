"""v3 clusters: ``GET /v3/clusters`` and ``GET /v3/clusters/{cluster_id}``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.state import AgentState, StateDep
from service.v3.common import JSON, Links, LinksDep, base_url, live_agents, related

router = APIRouter(tags=["v3 clusters"])


async def cluster_data(links: Links, state: AgentState) -> JSON:
    """A KafkaCluster resource; the controller is the lowest live broker id."""
    agents = await live_agents(state)
    controller = agents[0].broker_id if agents else state.broker_id
    return Links.resource(
        "KafkaCluster",
        links.cluster(),
        links.crn(),
        cluster_id=links.cluster_id,
        controller=related(links.broker(controller)),
        acls=related(links.cluster("/acls")),
        brokers=related(links.cluster("/brokers")),
        broker_configs=related(links.cluster("/broker-configs")),
        consumer_groups=related(links.cluster("/consumer-groups")),
        topics=related(links.cluster("/topics")),
        partition_reassignments=related(links.cluster("/topics/-/partitions/-/reassignment")),
    )


@router.get("/v3/clusters")
async def list_clusters(request: Request, state: StateDep) -> JSON:
    """KafkaClusterList: exactly this cluster."""
    links = Links(base_url(request, state), state.cluster_id)
    return Links.collection(
        "KafkaClusterList", links.clusters(), [await cluster_data(links, state)]
    )


@router.get("/v3/clusters/{cluster_id}")
async def get_cluster(links: LinksDep, state: StateDep) -> JSON:
    """KafkaCluster."""
    return await cluster_data(links, state)
