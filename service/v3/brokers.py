"""v3 brokers: one per live agent (``GET .../brokers`` and ``GET .../brokers/{broker_id}``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from segments.errors import BrokerNotFoundError
from segments.types import AgentInfo
from service.state import AgentState, get_state
from service.v3.common import JSON, Links, cluster_links, live_agents, related

router = APIRouter(tags=["v3 brokers"])


def broker_data(links: Links, agent: AgentInfo) -> JSON:
    """A KafkaBroker resource for one agent."""
    b = agent.broker_id
    return Links.resource(
        "KafkaBroker",
        links.broker(b),
        links.crn(("broker", b)),
        cluster_id=links.cluster_id,
        broker_id=b,
        host=agent.host,
        port=agent.port,
        rack=None,
        configs=related(links.broker(b, "/configs")),
        partition_replicas=related(links.broker(b, "/partition-replicas")),
    )


@router.get("/v3/clusters/{cluster_id}/brokers")
async def list_brokers(
    links: Links = Depends(cluster_links), state: AgentState = Depends(get_state)
) -> JSON:
    """KafkaBrokerList: the agents heard from recently, by broker id."""
    data = [broker_data(links, a) for a in await live_agents(state)]
    return Links.collection("KafkaBrokerList", links.cluster("/brokers"), data)


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}")
async def get_broker(
    broker_id: int, links: Links = Depends(cluster_links), state: AgentState = Depends(get_state)
) -> JSON:
    """KafkaBroker. Raises BrokerNotFoundError (404) for an id no live agent has."""
    for agent in await live_agents(state):
        if agent.broker_id == broker_id:
            return broker_data(links, agent)
    raise BrokerNotFoundError(f"Broker {broker_id} cannot be found.")
