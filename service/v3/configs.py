"""v3 topic configs: list (one topic or all), get, update (PUT), reset (DELETE), batch alter.

Values are the effective ones; ``source`` says where each comes from:
``DYNAMIC_TOPIC_CONFIG`` for the topic's override, ``DYNAMIC_DEFAULT_BROKER_CONFIG`` for
a cluster-wide broker config it inherits (``/broker-configs``), ``DEFAULT_CONFIG`` for
Kafka's default; ``synonyms`` lists every layer that has a value, the one in force first.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from pydantic import BaseModel, StrictBool

from coordinator.client import TopicInfo
from coordinator.log.topic_configs import CONFIG_DEFS, ConfigEntry, describe_configs
from segments.errors import ConfigNotFoundError, InvalidConfigError, MalformedRequestError
from service.state import AgentState, StateDep
from service.v3.common import JSON, Links, LinksDep, call

router = APIRouter(tags=["v3 topic configs"])


class UpdateConfigRequest(BaseModel):
    value: str | None = None


class AlterConfigEntry(BaseModel):
    name: str
    value: str | None = None
    operation: str | None = None


class AlterConfigBatchRequest(BaseModel):
    data: list[AlterConfigEntry]
    #: A JSON boolean only: "false" or 1 would be a dry run or an alter by accident.
    validate_only: StrictBool = False


def config_fields(entry: ConfigEntry) -> JSON:
    """The fields every v3 config resource has (AbstractConfigData)."""
    return {
        "name": entry.name,
        "value": entry.value,
        "is_default": entry.is_default,
        "is_read_only": entry.is_read_only,
        "is_sensitive": entry.is_sensitive,
        "source": entry.source,
        "synonyms": [
            {"name": s.name, "value": s.value, "source": s.source} for s in entry.synonyms
        ],
    }


def config_data(links: Links, topic: str, entry: ConfigEntry) -> JSON:
    """A KafkaTopicConfig resource."""
    return Links.resource(
        "KafkaTopicConfig",
        links.topic(topic, f"/configs/{entry.name}"),
        links.crn(("topic", topic), ("config", entry.name)),
        cluster_id=links.cluster_id,
        topic_name=topic,
        **config_fields(entry),
    )


def topic_configs(links: Links, info: TopicInfo) -> list[JSON]:
    entries = describe_configs(info.configs, defaults=info.defaults)
    return [config_data(links, info.name, e) for e in entries]


def split_alter(body: AlterConfigBatchRequest) -> tuple[dict[str, str], list[str]]:
    """A batch alter's entries as (configs to set, configs to reset).

    Raises:
        InvalidConfigError: SET without a value. MalformedRequestError: another operation.
    """
    set_configs: dict[str, str] = {}
    delete_configs: list[str] = []
    for entry in body.data:
        op = (entry.operation or "SET").upper()
        if op == "DELETE":
            delete_configs.append(entry.name)
        elif op == "SET":
            if entry.value is None:
                raise InvalidConfigError(
                    f"Invalid value null for configuration {entry.name}: SET needs a value"
                )
            set_configs[entry.name] = entry.value
        else:
            raise MalformedRequestError(
                f"Bad Request: operation must be SET or DELETE, got {entry.operation!r}."
            )
    return set_configs, delete_configs


def _not_found(links: Links, topic: str, name: str) -> ConfigNotFoundError:
    return ConfigNotFoundError(
        f"Config {name} cannot be found for topic {topic} in cluster {links.cluster_id}."
    )


async def _require_config(state: AgentState, links: Links, topic: str, name: str) -> None:
    """404 for a config name topics do not have; an unknown topic wins (404 40403)."""
    if name not in CONFIG_DEFS:
        await call(state.coordinator.get_topic, topic)
        raise _not_found(links, topic, name)


async def _set_topic_config(
    state: AgentState, links: Links, topic: str, name: str, value: str | None
) -> Response:
    """Set ``name``'s override on ``topic``, or drop it (``value`` None): 204."""
    await _require_config(state, links, topic, name)
    if value is None:
        await call(state.coordinator.alter_configs, topic, None, [name])
    else:
        await call(state.coordinator.alter_configs, topic, {name: value})
    state.topics.invalidate(topic)
    return Response(status_code=204)


# "-" must come before "{topic_name}": "-" is also a legal topic name.
@router.get("/v3/clusters/{cluster_id}/topics/-/configs")
async def list_all_topic_configs(links: LinksDep, state: StateDep) -> JSON:
    """KafkaTopicConfigList of every topic, by topic then config name."""
    topics = sorted(await call(state.coordinator.list_topics), key=lambda t: t.name)
    data = [c for t in topics for c in topic_configs(links, t)]
    return Links.collection("KafkaTopicConfigList", links.cluster("/topics/-/configs"), data)


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/configs")
async def list_topic_configs(topic_name: str, links: LinksDep, state: StateDep) -> JSON:
    """KafkaTopicConfigList: every config of the topic, defaults included."""
    info = await call(state.coordinator.get_topic, topic_name)
    return Links.collection(
        "KafkaTopicConfigList", links.topic(topic_name, "/configs"), topic_configs(links, info)
    )


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/configs/{name}")
async def get_topic_config(topic_name: str, name: str, links: LinksDep, state: StateDep) -> JSON:
    """KafkaTopicConfig. Unknown config name: 404."""
    info = await call(state.coordinator.get_topic, topic_name)
    if name not in CONFIG_DEFS:
        raise _not_found(links, topic_name, name)
    (entry,) = describe_configs(info.configs, [name], info.defaults)
    return config_data(links, topic_name, entry)


@router.put("/v3/clusters/{cluster_id}/topics/{topic_name}/configs/{name}", status_code=204)
async def update_topic_config(
    topic_name: str, name: str, body: UpdateConfigRequest, links: LinksDep, state: StateDep
) -> Response:
    """Set an override: 204. A null value resets it. Bad value: 400 40002."""
    return await _set_topic_config(state, links, topic_name, name, body.value)


@router.delete("/v3/clusters/{cluster_id}/topics/{topic_name}/configs/{name}", status_code=204)
async def reset_topic_config(
    topic_name: str, name: str, links: LinksDep, state: StateDep
) -> Response:
    """Drop an override so the default applies again: 204."""
    return await _set_topic_config(state, links, topic_name, name, None)


@router.post("/v3/clusters/{cluster_id}/topics/{topic_name}/configs:alter", status_code=204)
async def alter_topic_configs(
    topic_name: str, body: AlterConfigBatchRequest, links: LinksDep, state: StateDep
) -> Response:
    """Set and reset several configs in one step: 204 (also with ``validate_only``).

    ``operation`` is SET (the default) or DELETE. Any bad entry fails the whole batch.
    """
    set_configs, delete_configs = split_alter(body)
    await call(
        state.coordinator.alter_configs,
        topic_name,
        set_configs,
        delete_configs,
        validate_only=body.validate_only,
    )
    if not body.validate_only:
        state.topics.invalidate(topic_name)
    return Response(status_code=204)
