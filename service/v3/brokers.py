"""v3 brokers: one per live agent, with the broker views their links lead to; broker configs.

``GET .../brokers[/{broker_id}]``; ``.../brokers/{id}/partition-replicas`` (the
replicas a broker is shown to lead, see ``leader_for``). Every link a v3 answer
carries leads to a route that exists.

Broker configs are cluster-wide: the coordinator keeps them (``cluster_configs``) and
every topic without an override inherits them (``coordinator.log.topic_configs``).

- ``.../broker-configs`` (KafkaClusterConfig): the dynamic cluster-wide configs set,
  get/set/reset one, ``:alter`` several; an unknown name or bad value is 400 40002.
- ``.../brokers/{id}/configs`` and ``.../brokers/-/configs`` (KafkaBrokerConfig):
  every broker config as it applies to that broker (the cluster-wide value, else the
  default). Per-broker overrides (PUT, DELETE, ``:alter`` there) are refused with
  400 40002: every agent serves every partition, so a value for one agent alone would
  make a topic's config depend on which agent answers.
"""

from __future__ import annotations

from typing import NoReturn

from fastapi import APIRouter, Response

from coordinator.client import AgentInfo
from coordinator.log.topic_configs import BROKER_CONFIG_DEFS, ConfigEntry, describe_broker_configs
from segments.errors import BrokerNotFoundError, ConfigNotFoundError, InvalidConfigError
from service.state import AgentState, StateDep
from service.v3.common import JSON, Links, LinksDep, call, leader_for, live_agents, related
from service.v3.configs import (
    AlterConfigBatchRequest,
    UpdateConfigRequest,
    config_fields,
    split_alter,
)
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
async def list_brokers(links: LinksDep, state: StateDep) -> JSON:
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
async def get_broker(broker_id: int, links: LinksDep, state: StateDep) -> JSON:
    """KafkaBroker. Raises BrokerNotFoundError (404) for an id no live agent has."""
    agent, _ = await _live_broker(state, broker_id)
    return broker_data(links, agent)


# -- broker configs: as they apply to each broker ------------------------------------


def broker_config_data(links: Links, broker_id: int, entry: ConfigEntry) -> JSON:
    """A KafkaBrokerConfig resource."""
    return Links.resource(
        "KafkaBrokerConfig",
        links.broker(broker_id, f"/configs/{entry.name}"),
        links.crn(("broker", broker_id), ("config", entry.name)),
        cluster_id=links.cluster_id,
        broker_id=broker_id,
        **config_fields(entry),
    )


async def _broker_configs(links: Links, state: AgentState, broker_ids: list[int]) -> list[JSON]:
    entries = describe_broker_configs(await call(state.coordinator.broker_configs))
    return [broker_config_data(links, b, e) for b in broker_ids for e in entries]


# "-" must come before "{broker_id}" (which would answer 404 for it).
@router.get("/v3/clusters/{cluster_id}/brokers/-/configs")
async def list_all_broker_configs(links: LinksDep, state: StateDep) -> JSON:
    """KafkaBrokerConfigList of every live broker, by broker id then name."""
    brokers = [a.broker_id for a in await live_agents(state)]
    data = await _broker_configs(links, state, brokers)
    return Links.collection("KafkaBrokerConfigList", links.cluster("/brokers/-/configs"), data)


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}/configs")
async def list_broker_configs(broker_id: int, links: LinksDep, state: StateDep) -> JSON:
    """KafkaBrokerConfigList: every broker config, with its value and source."""
    await _live_broker(state, broker_id)
    data = await _broker_configs(links, state, [broker_id])
    return Links.collection("KafkaBrokerConfigList", links.broker(broker_id, "/configs"), data)


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}/configs/{name}")
async def get_broker_config(broker_id: int, name: str, links: LinksDep, state: StateDep) -> JSON:
    """KafkaBrokerConfig; 404 for a name that is not a broker config."""
    await _live_broker(state, broker_id)
    if name not in BROKER_CONFIG_DEFS:
        raise ConfigNotFoundError(
            f"Config {name} cannot be found for broker {broker_id} in cluster {links.cluster_id}."
        )
    (entry,) = describe_broker_configs(await call(state.coordinator.broker_configs), [name])
    return broker_config_data(links, broker_id, entry)


async def _refuse_per_broker(state: AgentState, broker_id: int) -> NoReturn:
    """404 for an unknown broker, else 400 40002: per-broker overrides are not supported."""
    await _live_broker(state, broker_id)
    raise InvalidConfigError(
        "Per-broker config overrides are not supported: every agent serves every partition, "
        "so broker configs are cluster-wide. Set them with /broker-configs."
    )


@router.put("/v3/clusters/{cluster_id}/brokers/{broker_id}/configs/{name}", status_code=204)
async def update_broker_config(
    broker_id: int, name: str, body: UpdateConfigRequest, links: LinksDep, state: StateDep
) -> Response:
    """400 40002 (per-broker overrides are not supported); 404 for an unknown broker."""
    await _refuse_per_broker(state, broker_id)


@router.delete("/v3/clusters/{cluster_id}/brokers/{broker_id}/configs/{name}", status_code=204)
async def reset_broker_config(
    broker_id: int, name: str, links: LinksDep, state: StateDep
) -> Response:
    """400 40002 (per-broker overrides are not supported); 404 for an unknown broker."""
    await _refuse_per_broker(state, broker_id)


@router.post("/v3/clusters/{cluster_id}/brokers/{broker_id}/configs:alter", status_code=204)
async def alter_broker_configs(
    broker_id: int, body: AlterConfigBatchRequest, links: LinksDep, state: StateDep
) -> Response:
    """400 40002 (per-broker overrides are not supported); 404 for an unknown broker."""
    await _refuse_per_broker(state, broker_id)


# -- cluster-wide broker configs -------------------------------------------------------


def cluster_config_data(links: Links, entry: ConfigEntry) -> JSON:
    """A KafkaClusterConfig resource (a dynamic cluster-wide broker config)."""
    return Links.resource(
        "KafkaClusterConfig",
        links.cluster(f"/broker-configs/{entry.name}"),
        links.crn(("broker-config", entry.name)),
        cluster_id=links.cluster_id,
        config_type="BROKER",
        **config_fields(entry),
    )


async def _alter_cluster_configs(
    state: AgentState,
    set_configs: dict[str, str],
    delete_configs: list[str],
    *,
    validate_only: bool = False,
) -> None:
    await call(
        state.coordinator.alter_broker_configs,
        set_configs,
        delete_configs,
        validate_only=validate_only,
    )
    if not validate_only:
        state.topics.invalidate_all()  # cached topics carry the configs they inherit


@router.get("/v3/clusters/{cluster_id}/broker-configs")
async def list_cluster_configs(links: LinksDep, state: StateDep) -> JSON:
    """KafkaClusterConfigList: the dynamic cluster-wide broker configs set, by name."""
    dynamic = await call(state.coordinator.broker_configs)
    data = [cluster_config_data(links, e) for e in describe_broker_configs(dynamic, dynamic)]
    return Links.collection("KafkaClusterConfigList", links.cluster("/broker-configs"), data)


@router.post("/v3/clusters/{cluster_id}/broker-configs:alter", status_code=204)
async def alter_cluster_configs(
    body: AlterConfigBatchRequest, links: LinksDep, state: StateDep
) -> Response:
    """Set and reset several in one step: 204 (also with ``validate_only``); any bad
    entry fails the batch (400 40002)."""
    set_configs, delete_configs = split_alter(body)
    await _alter_cluster_configs(
        state, set_configs, delete_configs, validate_only=body.validate_only
    )
    return Response(status_code=204)


@router.get("/v3/clusters/{cluster_id}/broker-configs/{name}")
async def get_cluster_config(name: str, links: LinksDep, state: StateDep) -> JSON:
    """KafkaClusterConfig; 404 unless set cluster-wide."""
    dynamic = await call(state.coordinator.broker_configs)
    if name not in dynamic:
        raise ConfigNotFoundError(f"Config {name} cannot be found for cluster {links.cluster_id}.")
    (entry,) = describe_broker_configs(dynamic, [name])
    return cluster_config_data(links, entry)


@router.put("/v3/clusters/{cluster_id}/broker-configs/{name}", status_code=204)
async def update_cluster_config(
    name: str, body: UpdateConfigRequest, links: LinksDep, state: StateDep
) -> Response:
    """Set it cluster-wide: 204 (a null value resets it). 400 40002 for a bad name/value."""
    if body.value is None:
        await _alter_cluster_configs(state, {}, [name])
    else:
        await _alter_cluster_configs(state, {name: body.value}, [])
    return Response(status_code=204)


@router.delete("/v3/clusters/{cluster_id}/broker-configs/{name}", status_code=204)
async def reset_cluster_config(name: str, links: LinksDep, state: StateDep) -> Response:
    """Reset it to the default: 204 (also when it was not set); 400 40002 for a bad name."""
    await _alter_cluster_configs(state, {}, [name])
    return Response(status_code=204)


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}/partition-replicas")
async def list_partition_replicas(broker_id: int, links: LinksDep, state: StateDep) -> JSON:
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
