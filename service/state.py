"""What one agent process holds while it runs, and the dependency that hands it out."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from coordinator.client import Coordinator
from index.log import LogWriter
from segments.store import ObjectStore
from service.batcher import Batcher
from service.metrics import Metrics
from service.settings import Settings
from service.topic_cache import TopicCache


@dataclass
class AgentState:
    """Built by the app's lifespan, stored on ``app.state.agent``.

    ``broker_id`` is -1 until the coordinator first answers a heartbeat.
    """

    settings: Settings
    coordinator: Coordinator
    store: ObjectStore
    writer: LogWriter
    batcher: Batcher
    topics: TopicCache
    metrics: Metrics
    broker_id: int
    cluster_id: str


def get_state(request: Request) -> AgentState:
    """FastAPI dependency: the running agent's state."""
    state: AgentState = request.app.state.agent
    return state
