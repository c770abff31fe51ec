"""REST v3 consume by offset (lakelog's; Confluent never shipped a v3 consume, kafka-rest #1010).

``GET /v3/clusters/{c}/topics/{t}/partitions/{p}/records?offset=&max_bytes=&timeout_ms=&format=``
is stateless: no consumer instance, no group. It answers the records of one partition
from ``offset`` (default: the log start) up to ``max_bytes`` of keys and values (at
least one record, as Kafka's fetch; ``consumer_request_max_bytes`` by default and at
most, within the agent's ``consumer_fetch_memory_bytes`` shared by every fetch), in the
v2 consumer's shape and formats (``format``: binary (base64, the default), json, avro,
jsonschema, protobuf), with ``next_offset`` to ask from next and the partition's offsets::

    {"records": [{"topic", "key", "value", "partition", "offset", "timestamp",
                  "headers": [{"key", "value"}]}, ...],
     "next_offset": 42, "log_start_offset": 0, "high_watermark": 57}

At the high watermark it long-polls up to ``timeout_ms`` (capped by
``consumer_max_wait_ms``), woken by commits as the v2 consumer's fetch is
(``service.consume.notify``). An offset below the log start or beyond the high watermark is
400 40002 naming both; an unknown topic 404 40403, partition 404 40402. One read serves
one log: the topic's incarnation its first offsets came from (their topic id); a topic
deleted while it reads, or deleted and created again under its name, ends it with 404
40403, never with the records of one incarnation and the offsets of another. A binary answer
over 1 MiB streams (its records rendered a slice at a time), so the agent does not hold
the whole body.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Query, Response
from starlette.responses import StreamingResponse

from coordinator.client import PartitionOffsets, TopicPartition
from segments.errors import MalformedRequestError, OffsetOutOfRangeError, TopicNotFoundError
from segments.types import ConsumedRecord
from service.consume.sessions import FetchBudget
from service.executors import Kind, call, run
from service.registry.rest import SCHEMA_TYPE_OF_FORMAT
from service.registry.rest import render_records as render_schema_records
from service.state import AgentState, StateDep
from service.v2.consumers import (
    FETCH_MIN_GRANT,
    encode_records,
    fetch_limit,
    read_round_robin,
    record_size,
    render_records,
)
from service.v3.partitions import check_partition

router = APIRouter(tags=["v3 consume (lakelog)"])

FORMATS = ("binary", "json", *SCHEMA_TYPE_OF_FORMAT)
#: Key and value bytes of the records rendered at a time in a streamed answer.
STREAM_SLICE_BYTES = 1 << 20


async def render(state: AgentState, records: list[ConsumedRecord], fmt: str) -> list[Any]:
    """Records in the v2 consumer's shape for ``fmt``."""
    if fmt in SCHEMA_TYPE_OF_FORMAT:
        return await render_schema_records(state.registry, records, fmt)
    return render_records(records, fmt)


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise MalformedRequestError(f"Bad Request: format must be one of {', '.join(FORMATS)}.")


@router.get(
    "/v3/clusters/{cluster_id}/topics/{topic_name}/partitions/{partition_id}/records",
    summary="Read records of a partition from an offset (lakelog)",
)
async def read_partition_records(
    cluster_id: str,
    topic_name: str,
    partition_id: int,
    state: StateDep,
    offset: int | None = Query(default=None, description="First offset; default: log start."),
    max_bytes: int | None = Query(
        default=None,
        gt=0,
        description="Key + value bytes; consumer_request_max_bytes by default and at most.",
    ),
    timeout_ms: int = Query(
        default=0, ge=0, description="Long-poll this long at the high watermark."
    ),
    format: str = Query(default="binary", description="binary, json, avro, jsonschema, protobuf"),
    isolation_level: str = Query(
        default="read_uncommitted",
        pattern="^(read_uncommitted|read_committed)$",
        description="read_committed: up to the last stable offset, no aborted record.",
    ),
) -> Response:
    """Stateless read by offset; see the module docstring."""
    check_format(format)
    topic = await state.topics.get(topic_name)
    check_partition(topic, partition_id)
    tp = TopicPartition(topic_name, partition_id)
    offsets = await call(state.coordinator.offsets, topic_name, partition_id)
    start = offsets.log_start if offset is None else offset
    if not offsets.log_start <= start <= offsets.high_watermark:
        raise OffsetOutOfRangeError(
            f"Offset {start} is out of range for partition {partition_id} of {topic_name}: "
            f"the log holds offsets {offsets.log_start} to "
            f"{offsets.high_watermark - 1} (high watermark {offsets.high_watermark})."
        )
    limit = fetch_limit(state, max_bytes)
    deadline = time.monotonic() + min(timeout_ms, state.settings.consumer_max_wait_ms) / 1000
    key = (topic.topic_id, partition_id)
    # The agent's fetch memory budget, shared with the v2 consumers' fetches.
    budget = state.consumers.budget
    grant = await budget.acquire(limit, FETCH_MIN_GRANT, deadline - time.monotonic())
    records: list[ConsumedRecord] = []

    async def bounds() -> PartitionOffsets:
        """The partition's offsets now, of the incarnation the read began in."""
        now = await call(state.coordinator.offsets, topic_name, partition_id)
        if now.topic_id != offsets.topic_id:
            raise TopicNotFoundError(
                f"Topic {topic_name} was deleted while it was read (a topic created since "
                "under its name is another log)."
            )
        return now

    try:
        with state.notifier.watch({key: (topic_name, start)}) as waiter:
            while grant:
                records, _, _ = await run(
                    Kind.READ,
                    read_round_robin,
                    state.reader,
                    {tp: start},
                    grant,
                    bounds={tp: await bounds()},
                    read_committed=isolation_level == "read_committed",
                )
                remaining = deadline - time.monotonic()
                if records or remaining <= 0:
                    break
                await state.notifier.wait(waiter, remaining)
        if records:
            state.consume_metrics.consumed_records.inc(len(records))
        latest = await bounds()
        tail = {
            "next_offset": records[-1].offset + 1 if records else start,
            "log_start_offset": latest.log_start,
            "high_watermark": latest.high_watermark,
        }
        if format == "binary" and sum(map(record_size, records)) > STREAM_SLICE_BYTES:
            # Base64 cannot fail: the answer streams, a slice of records at a time, so
            # the agent holds the records and one slice's JSON, not the whole body.
            streamed = StreamingResponse(
                _stream(records, tail, budget, grant), media_type="application/json"
            )
            grant = 0  # released by the stream once sent
            return streamed
        body: dict[str, Any] = {"records": await render(state, records, format), **tail}
        del records
        data = orjson.dumps(body)
    finally:
        await budget.release(grant)
    return Response(data, media_type="application/json")


async def _stream(
    records: list[ConsumedRecord], tail: dict[str, int], budget: FetchBudget, grant: int
) -> AsyncIterator[bytes]:
    """``{"records": [...], ...tail}``, records rendered a slice at a time (binary format);
    the fetch budget's grant is given back once the last byte went (or the client left)."""
    try:
        yield b'{"records":['
        at, first = 0, True
        while at < len(records):
            size, end = 0, at
            while end < len(records) and (end == at or size < STREAM_SLICE_BYTES):
                size += record_size(records[end])
                end += 1
            piece = encode_records(records[at:end], "binary")[1:-1]
            records[at:end] = [None] * (end - at)  # type: ignore[list-item]
            yield piece if first else b"," + piece
            first, at = False, end
        yield b"]," + orjson.dumps(tail)[1:]
    finally:
        await budget.release(grant)
