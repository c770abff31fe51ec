"""v2 metadata: the root, topics, partitions, partition offsets and brokers.

Shapes as in kafka-rest (REST-API.md §2): unknown topic 404 40401, unknown
partition 404 40402, a non-integer partition 404 404 (no such route).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from coordinator.client import TopicInfo
from coordinator.log.topic_configs import effective_configs
from segments.errors import PartitionNotFoundError
from service.errors import V2_CONTENT_TYPE
from service.state import AgentState, StateDep
from service.v3.common import JSON, call, leader_for, live_agents


class V2JSONResponse(JSONResponse):
    """JSON with v2's content type, ``application/vnd.kafka.v2+json``."""

    media_type = V2_CONTENT_TYPE


router = APIRouter(tags=["v2 metadata"], default_response_class=V2JSONResponse)


def partition_json(partition: int, leader: int) -> JSON:
    return {
        "partition": partition,
        "leader": leader,
        "replicas": [{"broker": leader, "leader": True, "in_sync": True}],
    }


def _check_partition(info: TopicInfo, partition: int) -> None:
    if not 0 <= partition < info.partitions:
        raise PartitionNotFoundError(f"Partition {partition} of topic '{info.name}' not found.")


async def _broker_ids(state: AgentState) -> list[int]:
    return [a.broker_id for a in await live_agents(state)]


@router.get("/")
async def root_get() -> JSON:
    """``{}``: kafka-rest's root, used as a liveness probe."""
    return {}


@router.post("/")
async def root_post() -> JSON:
    """``{}``, as kafka-rest answers."""
    return {}


@router.get("/topics")
async def list_topics(state: StateDep) -> list[str]:
    """Every topic name, sorted."""
    return sorted(t.name for t in await call(state.coordinator.list_topics))


@router.get("/topics/{topic}")
async def get_topic(topic: str, state: StateDep) -> JSON:
    """Name, the full effective config map, and the partitions with their leaders."""
    info = await call(state.coordinator.get_topic, topic)
    brokers = await _broker_ids(state)
    return {
        "name": info.name,
        "configs": effective_configs(info.configs, info.defaults),
        "partitions": [
            partition_json(p, leader_for(p, brokers, state.broker_id))
            for p in range(info.partitions)
        ],
    }


@router.get("/topics/{topic}/partitions")
async def list_partitions(topic: str, state: StateDep) -> list[JSON]:
    info = await call(state.coordinator.get_topic, topic)
    brokers = await _broker_ids(state)
    return [
        partition_json(p, leader_for(p, brokers, state.broker_id)) for p in range(info.partitions)
    ]


@router.get("/topics/{topic}/partitions/{partition}")
async def get_partition(topic: str, partition: int, state: StateDep) -> JSON:
    info = await call(state.coordinator.get_topic, topic)
    _check_partition(info, partition)
    return partition_json(
        partition, leader_for(partition, await _broker_ids(state), state.broker_id)
    )


@router.get("/topics/{topic}/partitions/{partition}/offsets")
async def get_partition_offsets(topic: str, partition: int, state: StateDep) -> JSON:
    """``{"beginning_offset": log-start, "end_offset": high watermark}``."""
    info = await call(state.coordinator.get_topic, topic)
    _check_partition(info, partition)
    offsets = await call(state.coordinator.offsets, topic, partition)
    return {"beginning_offset": offsets.log_start, "end_offset": offsets.high_watermark}


@router.get("/brokers")
async def list_brokers(state: StateDep) -> JSON:
    """``{"brokers": [ids]}``: one per live agent."""
    return {"brokers": await _broker_ids(state)}
