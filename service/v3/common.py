"""Shared pieces of the v3 admin API: absolute URLs, CRNs, the cluster check, brokers.

Every v3 resource carries ``metadata.self`` (an absolute URL built from
``advertised_url``, else from the request's base URL) and, for single
resources, ``metadata.resource_name`` (a CRN such as
``crn:///kafka=<cluster>/topic=<t>/partition=<p>``). Related resources are
``{"related": <absolute URL>}``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from coordinator.client import AgentInfo
from segments.errors import ClusterNotFoundError
from service.executors import call as call
from service.state import AgentState, StateDep

JSON = dict[str, Any]


class Links:
    """Absolute URLs and CRNs of one request's v3 resources."""

    def __init__(self, base: str, cluster_id: str) -> None:
        self.base = base.rstrip("/")
        self.cluster_id = cluster_id

    # -- URLs -------------------------------------------------------------------
    def clusters(self) -> str:
        return f"{self.base}/v3/clusters"

    def cluster(self, suffix: str = "") -> str:
        return f"{self.base}/v3/clusters/{self.cluster_id}{suffix}"

    def broker(self, broker_id: int, suffix: str = "") -> str:
        return self.cluster(f"/brokers/{broker_id}{suffix}")

    def topic(self, topic: str, suffix: str = "") -> str:
        return self.cluster(f"/topics/{topic}{suffix}")

    def partition(self, topic: str, partition: int, suffix: str = "") -> str:
        return self.topic(topic, f"/partitions/{partition}{suffix}")

    # -- CRNs -------------------------------------------------------------------
    def crn(self, *parts: tuple[str, object]) -> str:
        tail = "".join(f"/{k}={v}" for k, v in parts)
        return f"crn:///kafka={self.cluster_id}{tail}"

    # -- envelopes --------------------------------------------------------------
    @staticmethod
    def resource(kind: str, self_url: str, resource_name: str | None, **fields: Any) -> JSON:
        return {
            "kind": kind,
            "metadata": {"self": self_url, "resource_name": resource_name},
            **fields,
        }

    @staticmethod
    def collection(kind: str, self_url: str, data: list[JSON]) -> JSON:
        return {"kind": kind, "metadata": {"self": self_url, "next": None}, "data": data}


def related(url: str) -> JSON:
    return {"related": url}


def base_url(request: Request, state: AgentState) -> str:
    """The advertised URL if configured, else the URL this request came in on."""
    return state.settings.advertised_url or str(request.base_url).rstrip("/")


async def cluster_links(cluster_id: str, request: Request, state: StateDep) -> Links:
    """Dependency of every ``/v3/clusters/{cluster_id}/...`` route: checks the id.

    Raises:
        ClusterNotFoundError: ``cluster_id`` is not this cluster's.
    """
    if cluster_id != state.cluster_id:
        raise ClusterNotFoundError(f"Cluster {cluster_id} cannot be found.")
    return Links(base_url(request, state), cluster_id)


#: A route parameter ``links: LinksDep`` is the checked cluster's links (``cluster_links``).
LinksDep = Annotated[Links, Depends(cluster_links)]

# -- brokers ---------------------------------------------------------------------


def broker_max_age_s(state: AgentState) -> float:
    """An agent counts as live while its last heartbeat is younger than this."""
    return max(10.0, 3 * state.settings.heartbeat_interval_s)


async def live_agents(state: AgentState) -> list[AgentInfo]:
    """The live agents (the cluster's brokers), by broker id."""
    agents = await call(state.coordinator.list_agents, broker_max_age_s(state))
    return sorted(agents, key=lambda a: a.broker_id)


def leader_for(partition: int, broker_ids: list[int], own_id: int) -> int:
    """The broker shown as a partition's leader.

    Any agent serves any partition; spreading leaders over the live brokers
    keeps clients that pin work to a leader balanced.
    """
    if not broker_ids:
        return own_id
    return broker_ids[partition % len(broker_ids)]
