"""Transactions (issue 30) in the segments layer: markers, transactional batches, and
decoders that skip markers while counting their offsets."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from segments.batches import check_batches, control_batch, read_marker
from segments.errors import CorruptRecordError
from segments.segment import SegmentBuilder, decode_chunk

TOPIC = bytes(range(16))


def data_batch(
    n: int,
    producer_id: int = 5,
    *,
    transactional: bool = True,
    codec: int = 0,
    start_ts: int = 1_000,
    seq: int = 0,
) -> bytes:
    """A batch as a Kafka producer builds it (base offset 0, leader epoch -1); values
    name their record: b"p<producer id>-<seq + i>"."""
    b = DefaultRecordBatchBuilder(
        2, codec, int(transactional), producer_id, 0 if producer_id >= 0 else -1, seq, 1 << 30
    )
    for i in range(n):
        b.append(i, start_ts + i, b"k%d" % i, b"p%d-%d" % (producer_id, seq + i), [])
    return bytes(b.build())


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_a_control_batch_reads_back_as_kafka_writes_markers(commit: bool) -> None:
    """aiokafka's reader (what Kafka clients run) sees a valid transactional control batch
    whose one record holds the ControlRecordType key and the EndTransactionMarker value."""
    raw = control_batch(7, 3, commit, 1_234, coordinator_epoch=9)
    batch = DefaultRecordBatch(raw)
    assert batch.validate_crc()
    assert batch.is_control_batch and batch.is_transactional
    assert (batch.base_offset, batch.magic, batch.compression_type) == (0, 2, 0)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 3, -1)
    assert (batch.first_timestamp, batch.max_timestamp) == (1_234, 1_234)
    assert batch.last_offset_delta == 0 and batch.next_offset == 1
    assert int.from_bytes(raw[12:16], "big", signed=True) == -1  # partition leader epoch
    (record,) = list(batch)
    assert record.key == b"\x00\x00\x00" + (b"\x01" if commit else b"\x00")
    assert record.value == b"\x00\x00" + (9).to_bytes(4, "big")
    assert read_marker(raw) == (7, 3, commit)


def test_read_marker_answers_none_for_a_data_batch() -> None:
    assert read_marker(data_batch(2, 4)) is None
    assert read_marker(data_batch(2, -1, transactional=False)) is None


@pytest.mark.parametrize("codec", [0, 1, 4], ids=["none", "gzip", "zstd"])
def test_transactional_batches_of_idempotent_producers_are_accepted(codec: int) -> None:
    """A transactional batch is checked like any other and says it is transactional;
    plain and idempotent batches say they are not."""
    raw = data_batch(3, 5, codec=codec, seq=7)
    (info,) = check_batches(raw)
    assert info.transactional and info.idempotent and info.codec == codec
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (5, 0, 7)
    assert (info.record_count, info.min_timestamp_ms, info.max_timestamp_ms) == (3, 1000, 1002)
    plain = data_batch(1, -1, transactional=False)
    idempotent = data_batch(1, 5, transactional=False)
    assert [i.transactional for i in check_batches(plain + raw + idempotent)] == [
        False,
        True,
        False,
    ]


def test_a_stored_transactional_batch_decodes() -> None:
    """The segment decoder accepts the transactional bit it now stores."""
    raw = data_batch(3, 5)
    seg = SegmentBuilder()
    seg.append_batch(TOPIC, 0, raw, 3, 1000, 1002, (5, 0, 0))
    data, (chunk,) = seg.build()
    got = decode_chunk(data[chunk.position : chunk.position + chunk.length], 10, 3)
    assert [(o, r.value) for o, r in got] == [(10, b"p5-0"), (11, b"p5-1"), (12, b"p5-2")]


def test_a_transactional_batch_without_a_producer_id_is_corrupt() -> None:
    with pytest.raises(CorruptRecordError, match="transactional batch without a producer id"):
        check_batches(data_batch(2, 5, transactional=False) + data_batch(2, -1))


def test_producers_may_not_write_control_batches() -> None:
    """Markers come from the transaction coordinator only: a producer's control batch,
    alone or after a good batch, refuses the whole record set."""
    marker = control_batch(5, 0, True, 1_000)
    with pytest.raises(CorruptRecordError, match="control batch"):
        check_batches(marker)
    with pytest.raises(CorruptRecordError, match=r"Batch at byte \d+: a control batch"):
        check_batches(data_batch(2, 5) + marker)
