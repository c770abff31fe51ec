"""v3 brokers: one per live agent, with the broker views their links lead to.

``GET .../brokers[/{broker_id}]``; ``.../brokers/{id}/partition-replicas`` (the
replicas a broker is shown to lead, see ``leader_for``); ``.../brokers/{id}/configs``
and the cluster-wide ``.../broker-configs``, both empty lists: agents have no
Kafka-named broker configs yet (issue 14 brings them, with ``:alter``). Every link a
v3 answer carries leads to a route that exists.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from segments.errors import BrokerNotFoundError
from segments.types import AgentInfo
from service.state import AgentState, get_state
from service.v3.common import JSON, Links, call, cluster_links, leader_for, live_agents, related
from service.v3.partitions import replica_data

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


async def _live_broker(state: AgentState, broker_id: int) -> tuple[AgentInfo, list[int]]:
    """The live agent with ``broker_id`` and every live broker id; else 404."""
    agents = await live_agents(state)
    for agent in agents:
        if agent.broker_id == broker_id:
            return agent, [a.broker_id for a in agents]
    raise BrokerNotFoundError(f"Broker {broker_id} cannot be found.")


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}")
async def get_broker(
    broker_id: int, links: Links = Depends(cluster_links), state: AgentState = Depends(get_state)
) -> JSON:
    """KafkaBroker. Raises BrokerNotFoundError (404) for an id no live agent has."""
    agent, _ = await _live_broker(state, broker_id)
    return broker_data(links, agent)


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}/configs")
async def list_broker_configs(
    broker_id: int, links: Links = Depends(cluster_links), state: AgentState = Depends(get_state)
) -> JSON:
    """KafkaBrokerConfigList: empty (no Kafka-named broker configs yet)."""
    await _live_broker(state, broker_id)
    return Links.collection("KafkaBrokerConfigList", links.broker(broker_id, "/configs"), [])


@router.get("/v3/clusters/{cluster_id}/broker-configs")
async def list_cluster_configs(links: Links = Depends(cluster_links)) -> JSON:
    """KafkaClusterConfigList of dynamic cluster-wide broker configs: empty."""
    return Links.collection("KafkaClusterConfigList", links.cluster("/broker-configs"), [])


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}/partition-replicas")
async def list_partition_replicas(
    broker_id: int, links: Links = Depends(cluster_links), state: AgentState = Depends(get_state)
) -> JSON:
    """KafkaReplicaList: the replicas on this broker (the partitions it is shown to lead)."""
    _, brokers = await _live_broker(state, broker_id)
    topics = sorted(await call(state.coordinator.list_topics), key=lambda t: t.name)
    data = [
        replica_data(links, t.name, p, broker_id)
        for t in topics
        for p in range(t.partitions)
        if leader_for(p, brokers, state.broker_id) == broker_id
    ]
    return Links.collection(
        "KafkaReplicaList", links.broker(broker_id, "/partition-replicas"), data
    )
