"""v3 topics: list, get, create (with ``validate_only``), grow (PATCH) and delete."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from coordinator.client import TopicInfo
from segments.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    TopicExistsError,
)
from service.state import StateDep
from service.v3.common import JSON, Links, LinksDep, call, related

router = APIRouter(tags=["v3 topics"])

#: What every topic reports, on create as on every read: one replica per partition
#: (the object store keeps the copies), as the v3 replica views and v2 metadata show.
REPLICATION_FACTOR = 1


class ConfigEntryIn(BaseModel):
    name: str
    value: str | None = None


class CreateTopicRequest(BaseModel):
    """CreateTopicRequestData of the v3 spec."""

    topic_name: str
    partitions_count: int | None = None
    replication_factor: int | None = None
    replicas_assignments: dict[str, list[int]] | None = None
    configs: list[ConfigEntryIn] = Field(default_factory=list)
    validate_only: bool = False


class UpdatePartitionCountRequest(BaseModel):
    partitions_count: int


def topic_data(links: Links, info: TopicInfo) -> JSON:
    """A KafkaTopic resource."""
    t = info.name
    return Links.resource(
        "KafkaTopic",
        links.topic(t),
        links.crn(("topic", t)),
        cluster_id=links.cluster_id,
        topic_name=t,
        is_internal=False,
        replication_factor=REPLICATION_FACTOR,
        partitions_count=info.partitions,
        partitions=related(links.topic(t, "/partitions")),
        configs=related(links.topic(t, "/configs")),
        partition_reassignments=related(links.topic(t, "/partitions/-/reassignment")),
    )


@router.get("/v3/clusters/{cluster_id}/topics")
async def list_topics(links: LinksDep, state: StateDep) -> JSON:
    """KafkaTopicList, by name."""
    topics = sorted(await call(state.coordinator.list_topics), key=lambda t: t.name)
    data = [topic_data(links, t) for t in topics]
    return Links.collection("KafkaTopicList", links.cluster("/topics"), data)


@router.post("/v3/clusters/{cluster_id}/topics", status_code=201)
async def create_topic(body: CreateTopicRequest, links: LinksDep, state: StateDep) -> JSONResponse:
    """Create a topic: 201 with ``Location``, or 200 and nothing created with ``validate_only``.

    ``replication_factor`` (1 or more, or -1 for the default) is accepted, and the
    answer carries the value in force, 1, as every later read does: kafka-rest
    answers what the cluster applied, not what was asked, and the replica views list
    one replica per partition (the object store keeps the copies). Echoing the request
    would make a create and the next GET of the same topic disagree.
    ``replicas_assignments`` sets the partition count.
    """
    partitions = body.partitions_count
    if body.replicas_assignments:
        partitions = len(body.replicas_assignments)
    if partitions is None or partitions == -1:
        partitions = state.settings.default_partitions
    rf = body.replication_factor
    if rf is not None and rf != -1 and rf < 1:
        raise InvalidConfigError("Replication factor must be larger than 0.")
    configs = {c.name: c.value for c in body.configs if c.value is not None}
    try:
        info = await call(
            state.coordinator.create_topic,
            body.topic_name,
            partitions,
            configs,
            validate_only=body.validate_only,
        )
    except TopicExistsError as e:
        raise TopicExistsError(f"Topic '{body.topic_name}' already exists.") from e
    data = topic_data(links, info)
    if body.validate_only:
        return JSONResponse(data, status_code=200)
    state.topics.invalidate(info.name)
    return JSONResponse(data, status_code=201, headers={"Location": links.topic(info.name)})


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}")
async def get_topic(
    topic_name: str,
    links: LinksDep,
    state: StateDep,
    include_authorized_operations: bool | None = None,
) -> JSON:
    """KafkaTopic. Unknown topic: 404 40403. ``include_authorized_operations`` is checked
    (a boolean) and otherwise ignored: with no authorizer there are no operations to list."""
    return topic_data(links, await call(state.coordinator.get_topic, topic_name))


@router.patch("/v3/clusters/{cluster_id}/topics/{topic_name}")
async def update_partition_count(
    topic_name: str, body: UpdatePartitionCountRequest, links: LinksDep, state: StateDep
) -> JSON:
    """Grow a topic to ``partitions_count`` partitions; the same or fewer is 400 40002."""
    current = await call(state.coordinator.get_topic, topic_name)
    if body.partitions_count <= current.partitions:
        raise InvalidPartitionsError(f"Topic already has {current.partitions} partitions.")
    info = await call(state.coordinator.add_partitions, topic_name, body.partitions_count)
    state.topics.invalidate(topic_name)
    return topic_data(links, info)


@router.delete("/v3/clusters/{cluster_id}/topics/{topic_name}", status_code=204)
async def delete_topic(topic_name: str, links: LinksDep, state: StateDep) -> Response:
    """Delete a topic: 204. Unknown topic: 404 40403."""
    await call(state.coordinator.delete_topic, topic_name)
    state.topics.invalidate(topic_name)
    return Response(status_code=204)
