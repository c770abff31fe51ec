"""Transactions (issue 30) in the segments layer: markers, transactional batches, and
decoders that skip markers while counting their offsets."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatch

from segments.batches import control_batch, read_marker


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
    from tests.unit.test_kafka_batches import producer_batch

    assert read_marker(producer_batch(2, producer_id=4, seq=0)) is None
