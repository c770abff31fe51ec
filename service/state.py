"""What one agent process holds while it runs, and the dependency that hands it out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from coordinator.client import Coordinator, TransactionCoordinator
from coordinator.groups.model import GroupCoordinator
from index.log import LogWriter
from segments.store import ObjectStore
from service.consume.metrics import ConsumeMetrics
from service.consume.notify import Notifier
from service.consume.sessions import ConsumerSessions
from service.executors import Executors
from service.metrics import Metrics
from service.produce.batcher import Batcher
from service.produce.idempotence import ProducerGate
from service.produce.topic_cache import TopicCache
from service.read_cache import CachingLogReader
from service.registry.core import SchemaRegistry
from service.security.quotas import Quotas
from service.settings import Settings


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
    #: The same client as ``coordinator``, seen through its consumer-group interface.
    groups: GroupCoordinator
    #: The same client again, seen through its transactions' interface.
    txns: TransactionCoordinator
    #: The read path: caching reader, fetch wake-ups, and their metrics.
    reader: CachingLogReader
    notifier: Notifier
    consume_metrics: ConsumeMetrics
    #: The schema registry (its API and the REST Proxy's schema formats).
    registry: SchemaRegistry
    #: Bounded thread pools, one per kind of blocking work.
    executors: Executors
    #: The consumer instances this agent serves: local fetch locks, heartbeats, fetch budget.
    consumers: ConsumerSessions
    #: (host, port) of this agent's Kafka listener as clients reach it; None when off.
    kafka_address: tuple[str, int] | None = None
    #: Idempotent produce's pre-check, shared by the Kafka and REST doors.
    gate: ProducerGate = field(init=False)
    #: Client quotas (``service.security.quotas``), shared by the REST and Kafka doors.
    quotas: Quotas = field(init=False)

    def __post_init__(self) -> None:
        self.gate = ProducerGate(self.coordinator)
        self.quotas = Quotas(self.settings, self.metrics)


async def get_state(request: Request) -> AgentState:
    """FastAPI dependency: the running agent's state.

    ``async`` although it awaits nothing: FastAPI runs a plain ``def`` dependency on its
    thread pool, a thread hop (and a GIL hand-over) on every request."""
    state: AgentState = request.app.state.agent
    return state


#: A route parameter ``state: StateDep`` is the running agent's state.
StateDep = Annotated[AgentState, Depends(get_state)]
