"""A short-lived cache of topic metadata for the produce path.

Produce looks up the same topics on every request; a round trip to the
coordinator each time would cost more than the produce itself. Entries live
for ``metadata_ttl_s`` so a topic created, grown or deleted through another
agent is seen within that time. Misses are never cached: a topic created
elsewhere is usable at once. Admin routes read the coordinator directly and
call ``invalidate`` after they change a topic.
"""

from __future__ import annotations

import time

from coordinator.client import Coordinator, TopicInfo
from coordinator.log.topic_configs import max_decompressed_bytes
from segments.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from segments.errors import TopicExistsError, TopicNotFoundError
from service.executors import call


class TopicCache:
    """``TopicInfo`` by name, cached for ``ttl_s`` seconds; coordinator calls run in a thread."""

    def __init__(
        self,
        coordinator: Coordinator,
        ttl_s: float,
        *,
        auto_create: bool = False,
        default_partitions: int = 1,
    ) -> None:
        self.coordinator = coordinator
        self.ttl_s = ttl_s
        self.auto_create = auto_create
        self.default_partitions = default_partitions
        self._entries: dict[str, tuple[float, TopicInfo]] = {}
        self._by_id: dict[bytes, tuple[float, TopicInfo]] = {}

    async def get(self, name: str) -> TopicInfo:
        """The topic, from the cache if fresh enough.

        Raises:
            TopicNotFoundError: no such topic.
        """
        hit = self._entries.get(name)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        info = await call(self.coordinator.get_topic, name)
        self._entries[name] = (now, info)
        return info

    def max_decompressed_bytes(self, name: str) -> int:
        """The topic's ``lakelog.max.decompressed.bytes`` as last looked up (readers look
        the topic up before reading), else the default; never a coordinator call."""
        hit = self._entries.get(name)
        if hit is None:
            return DEFAULT_MAX_DECOMPRESSED_BYTES
        return max_decompressed_bytes(hit[1])

    async def by_id(self, topic_id: bytes) -> TopicInfo:
        """The topic whose id is ``topic_id`` (Kafka's topic ids), from the cache if fresh.

        A topic deleted and created again under its name has a new id: the old id is
        not found, whatever the name.

        Raises:
            TopicNotFoundError: no topic has that id.
        """
        key = bytes(topic_id)
        hit = self._by_id.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        info = await call(self.coordinator.get_topic_by_id, key)
        self._by_id[key] = self._entries[info.name] = (now, info)
        return info

    async def get_or_create(self, name: str) -> TopicInfo:
        """The topic; created with ``default_partitions`` first when auto-create is on.

        Two agents (or two requests) may race to create it: the loser's
        TopicExistsError just means the topic is there now.

        Raises:
            TopicNotFoundError: no such topic and auto-create is off.
            InvalidTopicNameError: auto-create is on and the name is illegal.
        """
        try:
            return await self.get(name)
        except TopicNotFoundError:
            if not self.auto_create:
                raise
        try:
            info = await call(self.coordinator.create_topic, name, self.default_partitions)
        except TopicExistsError:
            info = await call(self.coordinator.get_topic, name)
        self._entries[name] = (time.monotonic(), info)
        return info

    def put(self, info: TopicInfo) -> None:
        """Remember a topic this agent just read or changed."""
        self._entries[info.name] = (time.monotonic(), info)

    def invalidate(self, name: str) -> None:
        """Forget ``name`` so the next ``get`` (or ``by_id`` of its id) asks the coordinator."""
        self._entries.pop(name, None)
        for key in [k for k, (_, info) in self._by_id.items() if info.name == name]:
            del self._by_id[key]

    def forget_if_gone(self, info: TopicInfo, exc: BaseException) -> None:
        """A write to ``info`` failed: if its topic id is gone (deleted, perhaps created
        again under its name through another agent), forget the name, so the client's
        next request finds the topic as it is now rather than failing until the TTL."""
        if isinstance(exc, TopicNotFoundError):
            hit = self._entries.get(info.name)
            if hit is None or hit[1].topic_id == info.topic_id:
                self.invalidate(info.name)

    def invalidate_all(self) -> None:
        """Forget every topic (the cluster-wide configs they inherit changed)."""
        self._entries.clear()
        self._by_id.clear()
