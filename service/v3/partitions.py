"""v3 partitions: list, get, earliest/latest offsets, and the replica/reassignment views.

Every partition has one replica, on the broker shown as its leader, always in
sync: the object store holds the data, any agent serves any partition.
Reassignments never happen, so their lists are empty.
"""

from __future__ import annotations

from fastapi import APIRouter

from coordinator.client import TopicInfo
from segments.errors import (
    BrokerNotFoundError,
    MalformedRequestError,
    PartitionNotFoundError,
    ReassignmentNotFoundError,
)
from service.state import AgentState, StateDep
from service.v3.common import (
    JSON,
    Links,
    LinksDep,
    call,
    leader_for,
    live_agents,
    related,
)

router = APIRouter(tags=["v3 partitions"])

OFFSET_TYPE = "earliest_and_latest"


def partition_data(links: Links, topic: str, partition: int, leader: int) -> JSON:
    """A KafkaPartition resource."""
    return Links.resource(
        "KafkaPartition",
        links.partition(topic, partition),
        links.crn(("topic", topic), ("partition", partition)),
        cluster_id=links.cluster_id,
        topic_name=topic,
        partition_id=partition,
        leader=related(links.partition(topic, partition, f"/replicas/{leader}")),
        replicas=related(links.partition(topic, partition, "/replicas")),
        reassignment=related(links.partition(topic, partition, "/reassignment")),
    )


def replica_data(links: Links, topic: str, partition: int, broker: int) -> JSON:
    """A KafkaReplica resource: the one, leading, in-sync replica."""
    return Links.resource(
        "KafkaReplica",
        links.partition(topic, partition, f"/replicas/{broker}"),
        links.crn(("topic", topic), ("partition", partition), ("replica", broker)),
        cluster_id=links.cluster_id,
        topic_name=topic,
        partition_id=partition,
        broker_id=broker,
        is_leader=True,
        is_in_sync=True,
        broker=related(links.broker(broker)),
    )


def check_partition(info: TopicInfo, partition: int) -> None:
    """Raises PartitionNotFoundError (404 40402) unless 0 <= partition < count."""
    if not 0 <= partition < info.partitions:
        raise PartitionNotFoundError(f"Partition {partition} of topic '{info.name}' not found.")


async def _leaders(state: AgentState) -> list[int]:
    return [a.broker_id for a in await live_agents(state)]


async def _partition_leader(state: AgentState, topic_name: str, partition_id: int) -> int:
    """The partition's leader broker; 404 for an unknown topic or partition."""
    check_partition(await call(state.coordinator.get_topic, topic_name), partition_id)
    return leader_for(partition_id, await _leaders(state), state.broker_id)


# Routes with "-" first: "-" is a legal topic name and would match "{topic_name}".
@router.get("/v3/clusters/{cluster_id}/topics/-/partitions/-/reassignment")
async def list_all_reassignments(links: LinksDep) -> JSON:
    """KafkaReassignmentList: always empty."""
    url = links.cluster("/topics/-/partitions/-/reassignment")
    return Links.collection("KafkaReassignmentList", url, [])


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/partitions/-/reassignment")
async def list_topic_reassignments(topic_name: str, links: LinksDep, state: StateDep) -> JSON:
    """KafkaReassignmentList of one topic: always empty."""
    await call(state.coordinator.get_topic, topic_name)
    url = links.topic(topic_name, "/partitions/-/reassignment")
    return Links.collection("KafkaReassignmentList", url, [])


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/partitions")
async def list_partitions(topic_name: str, links: LinksDep, state: StateDep) -> JSON:
    """KafkaPartitionList, by partition id."""
    info = await call(state.coordinator.get_topic, topic_name)
    brokers = await _leaders(state)
    data = [
        partition_data(links, topic_name, p, leader_for(p, brokers, state.broker_id))
        for p in range(info.partitions)
    ]
    return Links.collection("KafkaPartitionList", links.topic(topic_name, "/partitions"), data)


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/partitions/{partition_id}")
async def get_partition(
    topic_name: str, partition_id: int, links: LinksDep, state: StateDep
) -> JSON:
    """KafkaPartition. Unknown partition: 404 40402."""
    leader = await _partition_leader(state, topic_name, partition_id)
    return partition_data(links, topic_name, partition_id, leader)


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/partitions/{partition_id}/offset")
async def get_partition_offsets(
    topic_name: str,
    partition_id: int,
    links: LinksDep,
    state: StateDep,
    offset_type: str = OFFSET_TYPE,
) -> JSON:
    """KafkaPartitionWithOffsets: log-start (earliest) and high watermark (latest).

    Only ``offset_type=earliest_and_latest`` (the default) exists; others are 400.
    """
    if offset_type != OFFSET_TYPE:
        raise MalformedRequestError(
            f"Bad Request: offset_type must be {OFFSET_TYPE}, got {offset_type!r}."
        )
    info = await call(state.coordinator.get_topic, topic_name)
    check_partition(info, partition_id)
    offsets = await call(state.coordinator.offsets, topic_name, partition_id)
    return Links.resource(
        "KafkaPartitionWithOffsets",
        links.partition(topic_name, partition_id, "/offset"),
        links.crn(("topic", topic_name), ("partition", partition_id)) + "/offset",
        cluster_id=links.cluster_id,
        topic_name=topic_name,
        partition_id=partition_id,
        earliest_offset=offsets.log_start,
        latest_offset=offsets.high_watermark,
    )


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/partitions/{partition_id}/replicas")
async def list_replicas(
    topic_name: str, partition_id: int, links: LinksDep, state: StateDep
) -> JSON:
    """KafkaReplicaList: the partition's one replica."""
    leader = await _partition_leader(state, topic_name, partition_id)
    url = links.partition(topic_name, partition_id, "/replicas")
    return Links.collection(
        "KafkaReplicaList", url, [replica_data(links, topic_name, partition_id, leader)]
    )


@router.get(
    "/v3/clusters/{cluster_id}/topics/{topic_name}/partitions/{partition_id}/replicas/{broker_id}"
)
async def get_replica(
    topic_name: str, partition_id: int, broker_id: int, links: LinksDep, state: StateDep
) -> JSON:
    """KafkaReplica, if ``broker_id`` is the partition's leader; else 404."""
    leader = await _partition_leader(state, topic_name, partition_id)
    if broker_id != leader:
        raise BrokerNotFoundError(
            f"Replica {broker_id} of partition {partition_id} of topic {topic_name} "
            "cannot be found."
        )
    return replica_data(links, topic_name, partition_id, leader)


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/partitions/{partition_id}/reassignment")
async def get_reassignment(
    topic_name: str, partition_id: int, links: LinksDep, state: StateDep
) -> JSON:
    """A partition's ongoing reassignment: there never is one, so 404 (as kafka-rest
    answers for a partition that is not being reassigned); unknown partition: 40402."""
    check_partition(await call(state.coordinator.get_topic, topic_name), partition_id)
    raise ReassignmentNotFoundError(
        f"There is no ongoing reassignment for partition {partition_id} of topic {topic_name}."
    )
