"""``HttpCoordinator``: the Coordinator Protocol over the coordinator's HTTP API.

The wire format lives here too (``*_to_json`` / ``*_from_json``), so the server
(``coordinator.http.server``) and this client cannot drift apart. On the wire:

- bytes (topic ids) travel as lowercase hex strings;
- value types travel as JSON objects whose keys are the dataclass field names;
- topic partitions travel as ``{"topic", "partition"}`` objects, positions and
  committed offsets as such objects with ``"offset"`` (and ``"metadata"``);
- errors travel as ``{"error": <class name>, "message": ..., "retriable": bool}``
  and the client raises the same ``segments.errors`` class again.

Failure handling: a request that never reached a coordinator (connection
refused, connect timeout) is sent to the next URL, whatever it was. A request
that may have reached one (read timeout, reset, a 5xx without our error body)
is re-sent only when it is idempotent: reads, heartbeats, and commits, which
the coordinator de-duplicates by object key. Anything else surfaces as
``CoordinatorUnavailableError`` (retriable) for the caller to decide.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from coordinator.client import ChunkCommit
from coordinator.groups.assignors import Assignment
from coordinator.groups.kafka import (
    ConsumerMember,
    HeartbeatResult,
    JoinResult,
    KafkaGroup,
    KafkaGroupCoordinator,
    Member,
)
from coordinator.groups.model import (
    CommittedOffset,
    ConsumerConfig,
    ConsumerHeartbeat,
    ConsumerState,
    FetchLease,
    GroupCoordinator,
    GroupInfo,
)
from coordinator.log.producers import ProducerBatch, ProducerPartitionState, RequestKey, StoredKey
from coordinator.schemas.model import (
    LATEST,
    SchemaReference,
    SchemaStore,
    StoredSchema,
    SubjectVersion,
)
from segments.errors import (
    ERRORS_BY_NAME,
    CoordinatorUnavailableError,
    LakelogError,
    PartialCommitError,
)
from segments.store import ObjectInfo
from segments.types import (
    AgentInfo,
    ChunkRef,
    PartitionOffsets,
    StoreLocation,
    TopicInfo,
    TopicPartition,
)

log = logging.getLogger(__name__)

JSON = dict[str, Any]

# -- wire format ---------------------------------------------------------------


def _partial_commit(data: JSON) -> PartialCommitError:
    """A PartialCommitError from its body (``coordinator.http.server.error_body``)."""
    failures: list[LakelogError | None] = []
    for f in data.get("failures") or []:
        if f is None:
            failures.append(None)
        else:
            cls = ERRORS_BY_NAME.get(str(f.get("error")), LakelogError)
            failures.append(cls(str(f.get("message", ""))))
    bases = [None if b is None else int(b) for b in data.get("base_offsets") or []]
    return PartialCommitError(str(data.get("message", "")), bases, failures)


def topic_to_json(t: TopicInfo) -> JSON:
    return {
        "name": t.name,
        "topic_id": t.topic_id.hex(),
        "partitions": t.partitions,
        "configs": dict(t.configs),
        "defaults": dict(t.defaults),
    }


def topic_from_json(d: JSON) -> TopicInfo:
    return TopicInfo(
        name=d["name"],
        topic_id=bytes.fromhex(d["topic_id"]),
        partitions=int(d["partitions"]),
        configs=dict(d["configs"]),
        defaults=dict(d.get("defaults") or {}),
    )


def chunk_commit_to_json(c: ChunkCommit) -> JSON:
    out: JSON = {
        "topic_id": c.topic_id.hex(),
        "partition": c.partition,
        "position": c.position,
        "length": c.length,
        "record_count": c.record_count,
        "min_timestamp_ms": c.min_timestamp_ms,
        "max_timestamp_ms": c.max_timestamp_ms,
    }
    if c.producer_batches:
        # [producer id, epoch, base sequence, record count, relative offset]
        out["producer_batches"] = [
            [b.producer_id, b.epoch, b.base_sequence, b.record_count, b.relative_offset]
            for b in c.producer_batches
        ]
    if c.request_keys:
        # [key, digest, relative offset, record count, created ms, expires ms, partitions]
        out["request_keys"] = [
            [
                k.key,
                k.digest,
                k.relative_offset,
                k.record_count,
                k.created_ms,
                k.expires_ms,
                k.partitions,
            ]
            for k in c.request_keys
        ]
    return out


def chunk_commit_from_json(d: JSON) -> ChunkCommit:
    """Raises KeyError, TypeError or ValueError on a malformed entry."""
    return ChunkCommit(
        topic_id=bytes.fromhex(d["topic_id"]),
        partition=_int(d["partition"]),
        position=_int(d["position"]),
        length=_int(d["length"]),
        record_count=_int(d["record_count"]),
        min_timestamp_ms=_int(d["min_timestamp_ms"]),
        max_timestamp_ms=_int(d["max_timestamp_ms"]),
        producer_batches=tuple(
            ProducerBatch(*(_int(v) for v in b)) for b in d.get("producer_batches") or ()
        ),
        request_keys=tuple(_request_key(k) for k in d.get("request_keys") or ()),
    )


def _request_key(k: list[object]) -> RequestKey:
    # Six fields from an agent that did not send the partition count yet.
    key, digest, relative, count, created, expires, *partitions = k
    if type(key) is not str or type(digest) is not str or len(partitions) > 1:
        raise TypeError(f"expected a key and a digest, got {k!r}")
    return RequestKey(
        key,
        digest,
        _int(relative),
        _int(count),
        _int(created),
        _int(expires),
        _int(partitions[0]) if partitions else 0,
    )


def _int(v: object) -> int:
    # bool is an int subclass, and int("3") would accept strings: both are malformed here.
    if type(v) is not int:
        raise TypeError(f"expected an integer, got {v!r}")
    return v


def chunk_ref_to_json(c: ChunkRef) -> JSON:
    return {
        "object_key": c.object_key,
        "position": c.position,
        "length": c.length,
        "base_offset": c.base_offset,
        "record_count": c.record_count,
        "min_timestamp_ms": c.min_timestamp_ms,
        "max_timestamp_ms": c.max_timestamp_ms,
        "kind": c.kind,
    }


def chunk_ref_from_json(d: JSON) -> ChunkRef:
    return ChunkRef(**d)


def agent_to_json(a: AgentInfo) -> JSON:
    return {
        "broker_id": a.broker_id,
        "agent_id": a.agent_id,
        "host": a.host,
        "port": a.port,
        "last_seen": a.last_seen,
        "kafka_host": a.kafka_host,
        "kafka_port": a.kafka_port,
    }


def agent_from_json(d: JSON) -> AgentInfo:
    return AgentInfo(**d)


def object_info_to_json(o: ObjectInfo) -> JSON:
    return {"key": o.key, "size": o.size, "last_modified": o.last_modified}


def object_info_from_json(d: JSON) -> ObjectInfo:
    return ObjectInfo(**d)


def store_location_to_json(location: StoreLocation | None) -> JSON:
    """``{"url", "endpoint", "region"}``; every field null for a coordinator without a store."""
    if location is None:
        return {"url": None, "endpoint": None, "region": None}
    return {"url": location.url, "endpoint": location.endpoint, "region": location.region}


def store_location_from_json(d: JSON) -> StoreLocation | None:
    return None if d["url"] is None else StoreLocation(d["url"], d["endpoint"], d["region"])


def tp_to_json(tp: TopicPartition) -> JSON:
    return {"topic": tp.topic, "partition": tp.partition}


def tp_from_json(d: JSON) -> TopicPartition:
    """Raises KeyError, TypeError on a malformed entry."""
    topic = d["topic"]
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a string, got {topic!r}")
    return TopicPartition(topic, _int(d["partition"]))


def positions_to_json(positions: Mapping[TopicPartition, int]) -> list[JSON]:
    return [
        {"topic": tp.topic, "partition": tp.partition, "offset": o} for tp, o in positions.items()
    ]


def positions_from_json(items: list[JSON]) -> dict[TopicPartition, int]:
    """Raises KeyError, TypeError on a malformed entry. An offset's type is the store's to
    judge, so a non-integer offset passes through (and is refused there)."""
    return {tp_from_json(d): d["offset"] for d in items}


def committed_to_json(offsets: Mapping[TopicPartition, CommittedOffset]) -> list[JSON]:
    return [
        {"topic": tp.topic, "partition": tp.partition, "offset": c.offset, "metadata": c.metadata}
        for tp, c in offsets.items()
    ]


def committed_from_json(items: list[JSON]) -> dict[TopicPartition, CommittedOffset]:
    """Raises KeyError, TypeError on a malformed entry."""
    result = {}
    for d in items:
        metadata = d.get("metadata") or ""
        if not isinstance(metadata, str):
            raise TypeError(f"metadata must be a string, got {metadata!r}")
        result[tp_from_json(d)] = CommittedOffset(d["offset"], metadata)
    return result


_CONFIG_FIELDS = frozenset(ConsumerConfig.__dataclass_fields__)


def consumer_config_to_json(c: ConsumerConfig) -> JSON:
    return {name: getattr(c, name) for name in ConsumerConfig.__dataclass_fields__}


def consumer_config_from_json(d: JSON) -> ConsumerConfig:
    """Missing fields take their defaults; values are the store's to validate.

    Raises:
        TypeError: not an object, or an unknown field.
    """
    if not isinstance(d, dict):
        raise TypeError(f"config must be an object, got {d!r}")
    unknown = sorted(set(d) - _CONFIG_FIELDS)
    if unknown:
        raise TypeError(f"unknown consumer config fields: {', '.join(unknown)}")
    return ConsumerConfig(**d)


def consumer_state_to_json(s: ConsumerState) -> JSON:
    return {
        "group": s.group,
        "name": s.name,
        "config": consumer_config_to_json(s.config),
        "subscription": list(s.subscription),
        "pattern": s.pattern,
        "manual": s.manual,
        "generation": s.generation,
        "assignment": [tp_to_json(tp) for tp in s.assignment],
        "positions": positions_to_json(s.positions),
        "unresolved": [tp_to_json(tp) for tp in s.unresolved],
        "last_seen": s.last_seen,
    }


def consumer_state_from_json(d: JSON) -> ConsumerState:
    return ConsumerState(
        group=d["group"],
        name=d["name"],
        config=consumer_config_from_json(d["config"]),
        subscription=tuple(d["subscription"]),
        pattern=d["pattern"],
        manual=d["manual"],
        generation=d["generation"],
        assignment=tuple(tp_from_json(tp) for tp in d["assignment"]),
        positions=positions_from_json(d["positions"]),
        unresolved=tuple(tp_from_json(tp) for tp in d["unresolved"]),
        last_seen=d["last_seen"],
    )


def fetch_lease_to_json(f: FetchLease) -> JSON:
    return {
        "state": consumer_state_to_json(f.state),
        "token": f.token,
        "ok": f.ok,
        "busy_for_s": f.busy_for_s,
    }


def fetch_lease_from_json(d: JSON) -> FetchLease:
    return FetchLease(
        state=consumer_state_from_json(d["state"]),
        token=d["token"],
        ok=bool(d["ok"]),
        busy_for_s=float(d["busy_for_s"]),
    )


def heartbeat_to_json(h: ConsumerHeartbeat) -> JSON:
    return {"group": h.group, "name": h.name, "token": h.token}


def heartbeat_from_json(d: JSON) -> ConsumerHeartbeat:
    """Raises KeyError, TypeError on a malformed entry."""
    group, name, token = d["group"], d["name"], d.get("token")
    if not isinstance(group, str) or not isinstance(name, str):
        raise TypeError(f"group and name must be strings, got {group!r}, {name!r}")
    if token is not None and not isinstance(token, str):
        raise TypeError(f"token must be a string or null, got {token!r}")
    return ConsumerHeartbeat(group, name, token)


def partition_offsets_to_json(o: PartitionOffsets) -> JSON:
    return {
        "log_start": o.log_start,
        "high_watermark": o.high_watermark,
        "topic_id": o.topic_id.hex(),
    }


def partition_offsets_from_json(d: JSON) -> PartitionOffsets:
    # "topic_id" is absent in answers of coordinators older than the field.
    return PartitionOffsets(
        int(d["log_start"]), int(d["high_watermark"]), bytes.fromhex(d.get("topic_id", ""))
    )


def offsets_to_json(offsets: Mapping[TopicPartition, PartitionOffsets]) -> list[JSON]:
    return [
        {"topic": tp.topic, "partition": tp.partition, **partition_offsets_to_json(o)}
        for tp, o in offsets.items()
    ]


def offsets_from_json(items: list[JSON]) -> dict[TopicPartition, PartitionOffsets]:
    return {tp_from_json(d): partition_offsets_from_json(d) for d in items}


def group_info_to_json(g: GroupInfo) -> JSON:
    return {
        "group": g.group,
        "generation": g.generation,
        "state": g.state,
        "assignor": g.assignor,
        "members": [consumer_state_to_json(m) for m in g.members],
        "committed": committed_to_json(g.committed),
        "group_type": g.group_type,
    }


def group_info_from_json(d: JSON) -> GroupInfo:
    return GroupInfo(
        group=d["group"],
        generation=d["generation"],
        state=d["state"],
        assignor=d["assignor"],
        members=tuple(consumer_state_from_json(m) for m in d["members"]),
        committed=committed_from_json(d["committed"]),
        group_type=d["group_type"],
    )


def join_result_to_json(r: JoinResult) -> JSON:
    return {
        "status": r.status,
        "member_id": r.member_id,
        "generation": r.generation,
        "protocol": r.protocol,
        "leader": r.leader,
        "members": [[m, i, meta.hex()] for m, i, meta in r.members],
    }


def join_result_from_json(d: JSON) -> JoinResult:
    return JoinResult(
        d["status"],
        d["member_id"],
        d["generation"],
        d["protocol"],
        d["leader"],
        tuple((m, i, bytes.fromhex(meta)) for m, i, meta in d["members"]),
    )


def assignment_to_json(a: Assignment) -> JSON:
    return {bytes(t).hex(): list(ps) for t, ps in a.items()}


def assignment_from_json(d: JSON) -> Assignment:
    return {bytes.fromhex(t): tuple(_int(p) for p in ps) for t, ps in d.items()}


def heartbeat_result_to_json(r: HeartbeatResult) -> JSON:
    return {
        "member_id": r.member_id,
        "member_epoch": r.member_epoch,
        "assignment": None if r.assignment is None else assignment_to_json(r.assignment),
    }


def heartbeat_result_from_json(d: JSON) -> HeartbeatResult:
    a = d["assignment"]
    return HeartbeatResult(
        d["member_id"], _int(d["member_epoch"]), None if a is None else assignment_from_json(a)
    )


def kafka_group_to_json(g: KafkaGroup) -> JSON:
    return {
        "group_id": g.group_id,
        "group_type": g.group_type,
        "assignment_epoch": g.assignment_epoch,
        "topology": g.topology,
        "topic_names": {t.hex(): n for t, n in g.topic_names.items()},
        "state": g.state,
        "generation": g.generation,
        "protocol_type": g.protocol_type,
        "protocol": g.protocol,
        "leader": g.leader,
        "rebalance_started": g.rebalance_started,
        "stored": g.stored,
        "members": [
            {
                **{k: getattr(m, k) for k in _MEMBER_SCALARS},
                "protocols": [[n, meta.hex()] for n, meta in m.protocols],
                "assignment": m.assignment.hex(),
                "consumer": m.consumer.to_json() if m.consumer is not None else "",
            }
            for m in g.members.values()
        ],
    }


_MEMBER_SCALARS = (
    "member_id",
    "instance_id",
    "client_id",
    "client_host",
    "session_timeout_ms",
    "rebalance_timeout_ms",
    "joined",
    "generation",
    "joined_at",
    "last_heartbeat",
)


def kafka_group_from_json(d: JSON) -> KafkaGroup:
    members = {}
    for m in d["members"]:
        member = Member(
            **{k: m[k] for k in _MEMBER_SCALARS if k not in ("joined",)},
            protocols=[(n, bytes.fromhex(meta)) for n, meta in m["protocols"]],
            assignment=bytes.fromhex(m["assignment"]),
            joined=m["joined"],
            consumer=ConsumerMember.from_json(m["consumer"]),
        )
        members[member.member_id] = member
    return KafkaGroup(
        d["group_id"],
        d["state"],
        d["generation"],
        d["protocol_type"],
        d["protocol"],
        d["leader"],
        d["rebalance_started"],
        members,
        d["stored"],
        d["group_type"],
        d["assignment_epoch"],
        d["topology"],
        {bytes.fromhex(t): n for t, n in d["topic_names"].items()},
    )


def reference_to_json(r: SchemaReference) -> JSON:
    return {"name": r.name, "subject": r.subject, "version": r.version}


def reference_from_json(d: JSON) -> SchemaReference:
    """Raises KeyError, TypeError on a malformed entry."""
    name, subject = d["name"], d["subject"]
    if not isinstance(name, str) or not isinstance(subject, str):
        raise TypeError(f"reference name and subject must be strings, got {d!r}")
    return SchemaReference(name, subject, _int(d["version"]))


def stored_schema_to_json(s: StoredSchema) -> JSON:
    return {
        "schema_id": s.schema_id,
        "schema_type": s.schema_type,
        "schema": s.schema,
        "references": [reference_to_json(r) for r in s.references],
    }


def stored_schema_from_json(d: JSON) -> StoredSchema:
    return StoredSchema(
        schema_id=d["schema_id"],
        schema_type=d["schema_type"],
        schema=d["schema"],
        references=tuple(reference_from_json(r) for r in d["references"]),
    )


def subject_version_to_json(v: SubjectVersion) -> JSON:
    return {
        "subject": v.subject,
        "version": v.version,
        "schema": stored_schema_to_json(v.schema),
        "deleted": v.deleted,
    }


def subject_version_from_json(d: JSON) -> SubjectVersion:
    return SubjectVersion(
        subject=d["subject"],
        version=d["version"],
        schema=stored_schema_from_json(d["schema"]),
        deleted=d["deleted"],
    )


def topic_path(name: str) -> str:
    """``/v1/topics/<name>`` with the name as one safe path segment.

    ``/`` is percent-encoded; ``.`` and ``..`` are too, or URL normalisation would
    turn them into a different path instead of reaching the server as names.
    """
    seg = quote(name, safe="")
    if seg in (".", ".."):
        seg = seg.replace(".", "%2E")
    return f"/v1/topics/{seg}"


# -- the client ----------------------------------------------------------------

_COMMIT_ATTEMPTS = 4
_BACKOFF_S = (0.05, 0.2, 0.5)


class _MaybeDelivered(Exception):
    """A transport failure after the request may have reached the server."""


class HttpCoordinator:
    """The Coordinator Protocol over HTTP; thread-safe, one connection pool.

    Args:
        urls: one base URL (``http://host:8083``) or several; on transport errors
            the client fails over to the next one and stays there.
        timeout: seconds for connect, read and write of one request.
        client: an ``httpx.Client`` to use instead of building one (tests pass a
            Starlette ``TestClient`` to run the real client against an app in-process).
        headers: sent with every request (the coordinator's shared secret).
        verify: how https:// coordinators are verified (a context with their CA).
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        timeout: float = 10.0,
        *,
        client: httpx.Client | None = None,
        headers: Mapping[str, str] | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("HttpCoordinator needs at least one URL")
        self.urls = [u.rstrip("/") for u in self.urls]
        self._current = 0
        self._lock = threading.Lock()
        self._own_client = client is None
        # ~32 agent threads share the pool; keep every connection alive between calls.
        self._client = client or httpx.Client(
            timeout=timeout,
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
            headers=headers,  # the shared secret (coordinator.security.http)
            verify=verify,
        )
        self._cluster_id: str | None = None

    def close(self) -> None:
        if self._own_client:
            self._client.close()

    def __enter__(self) -> HttpCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str | int | float] | None = None,
        idempotent: bool,
        attempts: int = 1,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one request with failover; return the decoded JSON body (None for 204).

        Raises the server's ``LakelogError`` class, or CoordinatorUnavailableError
        when no coordinator answered.
        """
        content = None if body is None else orjson.dumps(body)
        if content is not None:
            headers = {**(headers or {}), "content-type": "application/json"}
        last: Exception | None = None
        for attempt in range(attempts):
            if attempt:
                time.sleep(_BACKOFF_S[min(attempt - 1, len(_BACKOFF_S) - 1)])
            # One round tries each URL once, starting at the one that last worked.
            with self._lock:
                start = self._current
            for i in range(len(self.urls)):
                idx = (start + i) % len(self.urls)
                url = self.urls[idx] + path
                try:
                    resp = self._client.request(
                        method, url, content=content, headers=headers, params=params
                    )
                    result = self._decode(resp)
                except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                    last = e  # never reached a server: any request may go elsewhere
                    continue
                except (httpx.TransportError, _MaybeDelivered) as e:
                    last = e
                    if not idempotent:
                        raise CoordinatorUnavailableError(
                            f"{method} {url} failed and may or may not have been applied: {e}"
                        ) from e
                    continue
                if idx != start:
                    with self._lock:
                        self._current = idx
                    log.warning("coordinator failover: now using %s", self.urls[idx])
                return result
        raise CoordinatorUnavailableError(
            f"no coordinator answered {method} {path} (tried {', '.join(self.urls)}): {last}"
        ) from last

    @staticmethod
    def _decode(resp: httpx.Response) -> Any:
        if resp.status_code == 204:
            return None
        try:
            data = orjson.loads(resp.content) if resp.content else None
        except orjson.JSONDecodeError:
            data = None
        if resp.is_success:
            return data
        if isinstance(data, dict) and isinstance(data.get("error"), str):
            cls = ERRORS_BY_NAME.get(data["error"], LakelogError)
            if cls is PartialCommitError:
                raise _partial_commit(data)
            raise cls(str(data.get("message", "")))
        if resp.status_code >= 500:
            # A proxy, a crash, anything that is not our coordinator speaking.
            raise _MaybeDelivered(f"HTTP {resp.status_code} without an error body")
        raise LakelogError(f"unexpected HTTP {resp.status_code}: {resp.text[:200]}")

    # -- Coordinator Protocol -------------------------------------------------

    def cluster_id(self) -> str:
        # Stable for the life of the cluster, so one round trip is enough.
        if self._cluster_id is None:
            data = self._request("GET", "/v1/cluster", idempotent=True)
            self._cluster_id = str(data["cluster_id"])
        return self._cluster_id

    def create_topic(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        body = {
            "name": name,
            "partitions": partitions,
            "configs": dict(configs or {}),
            "validate_only": validate_only,
        }
        return topic_from_json(
            self._request("POST", "/v1/topics", body=body, idempotent=validate_only)
        )

    def get_topic(self, name: str) -> TopicInfo:
        return topic_from_json(self._request("GET", topic_path(name), idempotent=True))

    def get_topic_by_id(self, topic_id: bytes) -> TopicInfo:
        data = self._request("GET", f"/v1/topic-ids/{topic_id.hex()}", idempotent=True)
        return topic_from_json(data)

    def list_topics(self) -> list[TopicInfo]:
        data = self._request("GET", "/v1/topics", idempotent=True)
        return [topic_from_json(t) for t in data["topics"]]

    def delete_topic(self, name: str, *, topic_id: bytes | None = None) -> None:
        params = {} if topic_id is None else {"topic_id": bytes(topic_id).hex()}
        self._request("DELETE", topic_path(name), params=params, idempotent=False)

    def add_partitions(self, name: str, partitions: int) -> TopicInfo:
        data = self._request(
            "POST",
            topic_path(name) + "/partitions",
            body={"partitions": partitions},
            idempotent=False,
        )
        return topic_from_json(data)

    def alter_configs(
        self,
        name: str,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Sequence[str] = (),
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        body = {
            "set": dict(set_configs or {}),
            "delete": list(delete_configs),
            "validate_only": validate_only,
        }
        # Setting and deleting the same overrides twice ends in the same state.
        data = self._request("POST", topic_path(name) + "/configs", body=body, idempotent=True)
        return topic_from_json(data)

    def broker_configs(self) -> dict[str, str]:
        return dict(self._request("GET", "/v1/broker-configs", idempotent=True)["configs"])

    def alter_broker_configs(
        self,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Sequence[str] = (),
        *,
        validate_only: bool = False,
    ) -> dict[str, str]:
        body = {
            "set": dict(set_configs or {}),
            "delete": list(delete_configs),
            "validate_only": validate_only,
        }
        data = self._request("POST", "/v1/broker-configs", body=body, idempotent=True)
        return dict(data["configs"])

    def commit(self, object_key: str, chunks: Sequence[ChunkCommit]) -> list[int]:
        body = {"object_key": object_key, "chunks": [chunk_commit_to_json(c) for c in chunks]}
        # A commit that timed out may have been applied; the coordinator answers a
        # repeat of the same object key and chunks with the same offsets.
        data = self._request(
            "POST", "/v1/commit", body=body, idempotent=True, attempts=_COMMIT_ATTEMPTS
        )
        return [int(o) for o in data["base_offsets"]]

    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        data = self._request(
            "GET", f"{topic_path(topic)}/partitions/{partition}/offsets", idempotent=True
        )
        return partition_offsets_from_json(data)

    def offsets_many(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, PartitionOffsets]:
        body = {"partitions": [tp_to_json(tp) for tp in partitions]}
        data = self._request("POST", "/v1/offsets", body=body, idempotent=True)
        return offsets_from_json(data["offsets"])

    def lookup(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_chunks: int = 16,
        *,
        topic_id: bytes | None = None,
    ) -> list[ChunkRef]:
        params: dict[str, str | int] = {"offset": offset, "max_chunks": max_chunks}
        if topic_id is not None:
            params["topic_id"] = topic_id.hex()
        data = self._request(
            "GET",
            f"{topic_path(topic)}/partitions/{partition}/lookup",
            params=params,
            idempotent=True,
        )
        return [chunk_ref_from_json(c) for c in data["chunks"]]

    def lookup_timestamp(
        self, topic: str, partition: int, timestamp_ms: int, from_offset: int = 0
    ) -> ChunkRef | None:
        data = self._request(
            "GET",
            f"{topic_path(topic)}/partitions/{partition}/lookup-timestamp",
            params={"ts": timestamp_ms, "from_offset": from_offset},
            idempotent=True,
        )
        chunk = data["chunk"]
        return None if chunk is None else chunk_ref_from_json(chunk)

    def committed_object_keys(self, keys: Sequence[str]) -> set[str]:
        data = self._request(
            "POST", "/v1/objects/committed", body={"keys": list(keys)}, idempotent=True
        )
        return set(data["committed"])

    def keep_pending(
        self, lease_id: str, keys: Sequence[str], ttl_s: float, *, principal: str | None = None
    ) -> set[str]:
        # ``principal`` is not sent: the coordinator takes it from this client's credential.
        data = self._request(
            "POST",
            "/v1/objects/pending",
            body={"lease_id": lease_id, "keys": list(keys), "ttl_s": ttl_s},
            idempotent=True,
        )
        return set(data["deleted"])

    def release_pending(self, lease_id: str, *, principal: str | None = None) -> None:
        self._request(
            "POST", "/v1/objects/pending/release", body={"lease_id": lease_id}, idempotent=True
        )

    def pending_object_keys(self, keys: Sequence[str]) -> set[str]:
        data = self._request(
            "POST", "/v1/objects/pending/live", body={"keys": list(keys)}, idempotent=True
        )
        return set(data["pending"])

    def init_producer_id(self, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
        # Not idempotent: a repeat allocates another id (harmless, never reused).
        data = self._request(
            "POST",
            "/v1/producers/init",
            body={"producer_id": producer_id, "epoch": epoch},
            idempotent=False,
        )
        return int(data["producer_id"]), int(data["epoch"])

    def producer_state(
        self, producer_id: int, partitions: Sequence[tuple[bytes, int]]
    ) -> dict[tuple[bytes, int], ProducerPartitionState]:
        body = {
            "producer_id": producer_id,
            "partitions": [{"topic_id": t.hex(), "partition": p} for t, p in partitions],
        }
        data = self._request("POST", "/v1/producers/state", body=body, idempotent=True)
        return {
            (bytes.fromhex(d["topic_id"]), d["partition"]): ProducerPartitionState(
                d["epoch"], [tuple(b) for b in d["batches"]]
            )
            for d in data["states"]
        }

    def request_key(self, topic_id: bytes, key: str, now_ms: int) -> StoredKey | None:
        body = {"topic_id": topic_id.hex(), "key": key, "now_ms": now_ms}
        data = self._request("POST", "/v1/request-keys/get", body=body, idempotent=True)
        found = data.get("found")
        if found is None:
            return None
        return StoredKey(
            found["digest"],
            int(found["created_ms"]),
            tuple(tuple(p) for p in found["parts"]),
            int(found.get("partitions") or 0),
        )

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        # Moving log-start to the same offset twice ends in the same state.
        data = self._request(
            "POST",
            f"{topic_path(topic)}/partitions/{partition}/delete-records",
            body={"offset": offset},
            idempotent=True,
        )
        return int(data["log_start"])

    def heartbeat_agent(
        self, agent_id: str, host: str, port: int, kafka_host: str = "", kafka_port: int = 0
    ) -> int:
        body = {
            "agent_id": agent_id,
            "host": host,
            "port": port,
            "kafka_host": kafka_host,
            "kafka_port": kafka_port,
        }
        data = self._request(
            "POST",
            "/v1/agents/heartbeat",
            body=body,
            idempotent=True,
        )
        return int(data["broker_id"])

    def list_agents(self, max_age_s: float = 30.0) -> list[AgentInfo]:
        data = self._request("GET", "/v1/agents", params={"max_age_s": max_age_s}, idempotent=True)
        return [agent_from_json(a) for a in data["agents"]]

    # -- GroupCoordinator Protocol --------------------------------------------
    # Every group call is a POST naming the group and instance in the body (see
    # coordinator.http.server). Only create and delete are not idempotent: repeating any
    # other call with the same arguments ends in the same state.

    def _group_call(self, path: str, body: JSON, *, idempotent: bool = True) -> Any:
        return self._request("POST", path, body=body, idempotent=idempotent)

    def create_consumer(self, group: str, name: str, config: ConsumerConfig) -> ConsumerState:
        body = {"group": group, "name": name, "config": consumer_config_to_json(config)}
        data = self._group_call("/v1/consumers/create", body, idempotent=False)
        return consumer_state_from_json(data)

    def delete_consumer(self, group: str, name: str) -> None:
        self._group_call("/v1/consumers/delete", {"group": group, "name": name}, idempotent=False)

    def consumer(self, group: str, name: str, *, touch: bool = True) -> ConsumerState:
        body = {"group": group, "name": name, "touch": touch}
        return consumer_state_from_json(self._group_call("/v1/consumers/get", body))

    def subscribe(
        self, group: str, name: str, topics: Sequence[str] = (), pattern: str | None = None
    ) -> ConsumerState:
        body = {"group": group, "name": name, "topics": list(topics), "pattern": pattern}
        return consumer_state_from_json(self._group_call("/v1/consumers/subscribe", body))

    def unsubscribe(self, group: str, name: str) -> None:
        self._group_call("/v1/consumers/unsubscribe", {"group": group, "name": name})

    def assign(self, group: str, name: str, partitions: Sequence[TopicPartition]) -> ConsumerState:
        body = {"group": group, "name": name, "partitions": [tp_to_json(tp) for tp in partitions]}
        return consumer_state_from_json(self._group_call("/v1/consumers/assign", body))

    def seek(self, group: str, name: str, positions: Mapping[TopicPartition, int]) -> None:
        body = {"group": group, "name": name, "positions": positions_to_json(positions)}
        self._group_call("/v1/consumers/seek", body)

    def advance(
        self, group: str, name: str, generation: int, positions: Mapping[TopicPartition, int]
    ) -> ConsumerState:
        body = {
            "group": group,
            "name": name,
            "generation": generation,
            "positions": positions_to_json(positions),
        }
        return consumer_state_from_json(self._group_call("/v1/consumers/advance", body))

    # The fetch calls are idempotent: the caller chooses the token, so a repeated
    # begin_fetch finds its own lease; confirm and end check the token.

    def begin_fetch(self, group: str, name: str, token: str, lease_ms: int) -> FetchLease:
        body = {"group": group, "name": name, "token": token, "lease_ms": lease_ms}
        return fetch_lease_from_json(self._group_call("/v1/consumers/fetch/begin", body))

    def confirm_fetch(
        self, group: str, name: str, token: str, start: Mapping[TopicPartition, int], lease_ms: int
    ) -> FetchLease:
        body = {
            "group": group,
            "name": name,
            "token": token,
            "start": positions_to_json(start),
            "lease_ms": lease_ms,
        }
        return fetch_lease_from_json(self._group_call("/v1/consumers/fetch/confirm", body))

    def end_fetch(
        self, group: str, name: str, token: str, positions: Mapping[TopicPartition, int] | None
    ) -> None:
        body = {
            "group": group,
            "name": name,
            "token": token,
            "positions": None if positions is None else positions_to_json(positions),
        }
        self._group_call("/v1/consumers/fetch/end", body)

    def heartbeat_consumers(
        self, members: Sequence[ConsumerHeartbeat], lease_ms: int
    ) -> list[tuple[str, str]]:
        body = {"members": [heartbeat_to_json(m) for m in members], "lease_ms": lease_ms}
        data = self._group_call("/v1/consumers/heartbeat", body)
        return [(str(g["group"]), str(g["name"])) for g in data["gone"]]

    def commit_offsets(
        self,
        group: str,
        name: str,
        offsets: Mapping[TopicPartition, CommittedOffset],
        generation: int | None = None,
    ) -> None:
        body = {
            "group": group,
            "name": name,
            "offsets": committed_to_json(offsets),
            "generation": generation,
        }
        self._group_call("/v1/consumers/commit", body)

    def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, CommittedOffset]:
        body = {"group": group, "partitions": [tp_to_json(tp) for tp in partitions]}
        return committed_from_json(self._group_call("/v1/groups/committed", body)["offsets"])

    def list_groups(self) -> list[str]:
        return [str(g) for g in self._request("GET", "/v1/groups", idempotent=True)["groups"]]

    def describe_group(self, group: str) -> GroupInfo:
        return group_info_from_json(self._group_call("/v1/groups/describe", {"group": group}))

    def alter_group_offsets(
        self, group: str, offsets: Mapping[TopicPartition, CommittedOffset]
    ) -> None:
        # Idempotent: sending the same offsets again leaves the same state.
        body = {"group": group, "offsets": committed_to_json(offsets)}
        self._group_call("/v1/groups/alter-offsets", body)

    def delete_group(self, group: str) -> None:
        self._group_call("/v1/groups/delete", {"group": group}, idempotent=False)

    # -- Kafka consumer groups (KafkaGroupCoordinator) ------------------------
    # Join, sync and heartbeat are idempotent for their member (a repeat finds the
    # state the first one left); leave and commits too.

    def kafka_join(self, group: str, member_id: str, **options: Any) -> JoinResult:
        opts = dict(options)
        if "protocols" in opts:
            opts["protocols"] = [[n, bytes(m).hex()] for n, m in opts["protocols"]]
        body = {"group": group, "member_id": member_id, "options": opts}
        return join_result_from_json(self._group_call("/v1/kafka-groups/join", body))

    def kafka_sync(
        self,
        group: str,
        member_id: str,
        generation: int,
        assignments: Mapping[str, bytes] | None = None,
    ) -> bytes | None:
        body = {
            "group": group,
            "member_id": member_id,
            "generation": generation,
            "assignments": None
            if assignments is None
            else {m: bytes(a).hex() for m, a in assignments.items()},
        }
        data = self._group_call("/v1/kafka-groups/sync", body)
        return None if data["assignment"] is None else bytes.fromhex(data["assignment"])

    def kafka_heartbeat(self, group: str, member_id: str, generation: int) -> None:
        body = {"group": group, "member_id": member_id, "generation": generation}
        self._group_call("/v1/kafka-groups/heartbeat", body)

    def kafka_leave(self, group: str, member_ids: Sequence[str]) -> list[str | None]:
        body = {"group": group, "member_ids": list(member_ids)}
        return list(self._group_call("/v1/kafka-groups/leave", body)["results"])

    def kafka_commit_offsets(
        self,
        group: str,
        member_id: str,
        generation: int,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> None:
        body = {
            "group": group,
            "member_id": member_id,
            "generation": generation,
            "offsets": committed_to_json(offsets),
        }
        self._group_call("/v1/kafka-groups/commit", body)

    def kafka_committed(
        self,
        group: str,
        partitions: Sequence[TopicPartition] | None = None,
        *,
        member_id: str = "",
        member_epoch: int = -1,
    ) -> dict[TopicPartition, CommittedOffset]:
        body = {
            "group": group,
            "partitions": None if partitions is None else [tp_to_json(tp) for tp in partitions],
            "member_id": member_id,
            "member_epoch": member_epoch,
        }
        return committed_from_json(self._group_call("/v1/kafka-groups/committed", body)["offsets"])

    def kafka_consumer_heartbeat(
        self, group: str, member_id: str, member_epoch: int, **options: Any
    ) -> HeartbeatResult:
        # Safe to repeat: a repeat after a lost answer finds the member a step further
        # and answers from there (an epoch one behind is accepted, as Kafka accepts it).
        opts = dict(options)
        if opts.get("owned") is not None:
            opts["owned"] = assignment_to_json(opts["owned"])
        if opts.get("subscribed_topic_names") is not None:
            opts["subscribed_topic_names"] = list(opts["subscribed_topic_names"])
        body = {"group": group, "member_id": member_id, "member_epoch": member_epoch, **opts}
        data = self._group_call("/v1/kafka-groups/consumer-heartbeat", body)
        return heartbeat_result_from_json(data)

    def kafka_describe(self, group: str) -> KafkaGroup | None:
        data = self._group_call("/v1/kafka-groups/describe", {"group": group})
        return None if data["group"] is None else kafka_group_from_json(data["group"])

    def kafka_delete_group(self, group: str) -> None:
        self._group_call("/v1/kafka-groups/delete", {"group": group})

    # -- SchemaStore Protocol -------------------------------------------------
    # Subjects travel in bodies (they may hold any character), so every call is a POST;
    # all but the deletes are idempotent (a repeated registration finds its version).

    def _schema_call(self, path: str, body: JSON, *, idempotent: bool = True) -> Any:
        return self._request("POST", "/v1/schemas/" + path, body=body, idempotent=idempotent)

    def register_schema(
        self,
        subject: str,
        schema_type: str,
        schema: str,
        references: Sequence[SchemaReference] = (),
        *,
        expected_versions: Sequence[int] | None = None,
    ) -> SubjectVersion:
        body = {
            "subject": subject,
            "schema_type": schema_type,
            "schema": schema,
            "references": [reference_to_json(r) for r in references],
            "expected_versions": None if expected_versions is None else list(expected_versions),
        }
        return subject_version_from_json(self._schema_call("register", body))

    def get_schema(self, schema_id: int) -> StoredSchema:
        return stored_schema_from_json(self._schema_call("get", {"schema_id": schema_id}))

    def schema_versions(self, schema_id: int, *, deleted: bool = False) -> list[tuple[str, int]]:
        data = self._schema_call("uses", {"schema_id": schema_id, "deleted": deleted})
        return [(str(s), int(v)) for s, v in data["versions"]]

    def list_subjects(self, *, deleted: bool = False) -> list[str]:
        return [str(s) for s in self._schema_call("subjects", {"deleted": deleted})["subjects"]]

    def subject_versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        data = self._schema_call("versions", {"subject": subject, "deleted": deleted})
        return [int(v) for v in data["versions"]]

    def get_subject_version(
        self, subject: str, version: int = LATEST, *, deleted: bool = False
    ) -> SubjectVersion:
        body = {"subject": subject, "version": version, "deleted": deleted}
        return subject_version_from_json(self._schema_call("version", body))

    def find_schema(
        self,
        subject: str,
        schema_type: str,
        schema: str,
        references: Sequence[SchemaReference] = (),
        *,
        deleted: bool = False,
    ) -> SubjectVersion:
        body = {
            "subject": subject,
            "schema_type": schema_type,
            "schema": schema,
            "references": [reference_to_json(r) for r in references],
            "deleted": deleted,
        }
        return subject_version_from_json(self._schema_call("find", body))

    def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        body = {"subject": subject, "permanent": permanent}
        data = self._schema_call("delete-subject", body, idempotent=False)
        return [int(v) for v in data["versions"]]

    def delete_subject_version(
        self, subject: str, version: int = LATEST, *, permanent: bool = False
    ) -> int:
        body = {"subject": subject, "version": version, "permanent": permanent}
        return int(self._schema_call("delete-version", body, idempotent=False)["version"])

    def referenced_by(self, subject: str, version: int) -> list[int]:
        data = self._schema_call("referenced-by", {"subject": subject, "version": version})
        return [int(i) for i in data["ids"]]

    def get_compatibility(self, subject: str | None = None) -> str | None:
        data = self._schema_call("config/get", {"subject": subject})
        return None if data["compatibility"] is None else str(data["compatibility"])

    def set_compatibility(self, level: str, subject: str | None = None) -> str:
        data = self._schema_call("config/set", {"subject": subject, "level": level})
        return str(data["compatibility"])

    def delete_compatibility(self, subject: str | None = None) -> str:
        data = self._schema_call("config/delete", {"subject": subject}, idempotent=False)
        return str(data["compatibility"])

    # -- beyond the Protocol --------------------------------------------------

    def store_location(self) -> StoreLocation | None:
        """The object store the cluster writes to (None: the coordinator has no store).

        What Spark jobs read and write the bucket with: URL, endpoint and region, never
        credentials (those come from the reader's own AWS chain).
        """
        return store_location_from_json(self._request("GET", "/v1/store", idempotent=True))

    def find_orphans(self, grace_s: float, prefix: str = "segments/") -> list[ObjectInfo]:
        """The server's orphan report (needs a coordinator started with a store)."""
        data = self._request(
            "GET",
            "/v1/orphans",
            params={"grace_s": grace_s, "prefix": prefix},
            idempotent=True,
        )
        return [object_info_from_json(o) for o in data["orphans"]]


def _conforms_groups(c: HttpCoordinator) -> GroupCoordinator:
    # mypy checks here that HttpCoordinator implements the group protocol exactly.
    return c


def _conforms_kafka_groups(c: HttpCoordinator) -> KafkaGroupCoordinator:
    return c


def _conforms_schemas(c: HttpCoordinator) -> SchemaStore:
    return c
