"""The Kafka door's one table from lakelog's errors (``segments.errors``) to Kafka error codes.

Handlers never pick a code for a domain error by hand: they call :func:`code_for`.
A class missing from the table takes its nearest listed ancestor's code, as the
REST door's table does (``service.errors``).
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from segments import errors as e

log = logging.getLogger(__name__)

#: lakelog error class -> the Kafka error code a client gets for it.
KAFKA_ERROR_TABLE: dict[type[e.LakelogError], ErrorCode] = {
    e.LakelogError: ErrorCode.unknown_server_error,
    e.StorageError: ErrorCode.kafka_storage_error,
    e.StorageUnavailableError: ErrorCode.kafka_storage_error,  # retriable in every client
    e.CorruptSegmentError: ErrorCode.kafka_storage_error,
    e.MetadataError: ErrorCode.unknown_server_error,
    e.TopicNotFoundError: ErrorCode.unknown_topic_or_partition,
    e.PartitionNotFoundError: ErrorCode.unknown_topic_or_partition,
    e.TopicExistsError: ErrorCode.topic_already_exists,
    e.InvalidTopicNameError: ErrorCode.invalid_topic_exception,
    e.InvalidPartitionsError: ErrorCode.invalid_partitions,
    e.InvalidConfigError: ErrorCode.invalid_config,
    e.CommitConflictError: ErrorCode.unknown_server_error,
    e.CoordinatorUnavailableError: ErrorCode.request_timed_out,
    e.GroupNotFoundError: ErrorCode.group_id_not_found,
    e.StaleGenerationError: ErrorCode.illegal_generation,
    e.FencedMemberEpochError: ErrorCode.fenced_member_epoch,
    e.StaleMemberEpochError: ErrorCode.stale_member_epoch,
    e.UnreleasedInstanceIdError: ErrorCode.unreleased_instance_id,
    e.UnsupportedAssignorError: ErrorCode.unsupported_assignor,
    e.ConsumerNotFoundError: ErrorCode.unknown_member_id,
    e.InvalidConsumerConfigError: ErrorCode.invalid_group_id,
    e.OffsetOutOfRangeError: ErrorCode.offset_out_of_range,
    # Not KAFKA_STORAGE_ERROR: clients retry that one silently; this one they must report.
    e.IndexHoleError: ErrorCode.unknown_server_error,
    e.ProducerFencedError: ErrorCode.invalid_producer_epoch,
    # Every request of the flush gets it: a retriable code that means nothing else.
    e.ProducerConflictError: ErrorCode.request_timed_out,
    e.TransactionError: ErrorCode.invalid_txn_state,
    e.TransactionFencedError: ErrorCode.producer_fenced,
    e.InvalidTxnStateError: ErrorCode.invalid_txn_state,
    e.ConcurrentTransactionsError: ErrorCode.concurrent_transactions,
    e.InvalidProducerIdMappingError: ErrorCode.invalid_producer_id_mapping,
    e.InvalidTxnTimeoutError: ErrorCode.invalid_transaction_timeout,
    e.TransactionalIdNotFoundError: ErrorCode.transactional_id_not_found,
    e.GroupProtocolConflictError: ErrorCode.inconsistent_group_protocol,
    e.RebalanceInProgressError: ErrorCode.rebalance_in_progress,
    e.NonEmptyGroupError: ErrorCode.non_empty_group,
    e.BufferFullError: ErrorCode.request_timed_out,
    e.RequestError: ErrorCode.invalid_request,
    e.RecordTooLargeError: ErrorCode.message_too_large,
    e.RequestTooLargeError: ErrorCode.record_list_too_large,
    e.CorruptRecordError: ErrorCode.corrupt_message,
    e.InvalidRecordError: ErrorCode.invalid_record,
    e.SecurityDisabledError: ErrorCode.security_disabled,
    # Raised only where a coordinator refuses an ACL change (the handlers answer topic and
    # group denials with their own codes, service.kafka.acl).
    e.AuthorizationError: ErrorCode.cluster_authorization_failed,
    e.AuthenticationError: ErrorCode.sasl_authentication_failed,
    e.InvalidSecurityRequestError: ErrorCode.invalid_request,
    # A broker config resource naming no live broker (Kafka: "Unexpected broker id").
    e.BrokerNotFoundError: ErrorCode.invalid_request,
}


def code_for(exc: BaseException) -> ErrorCode:
    """The Kafka error code of ``exc``: its class's entry or its nearest ancestor's.

    Anything that is not a ``LakelogError`` is a bug: logged, answered as
    UNKNOWN_SERVER_ERROR.
    """
    if not isinstance(exc, e.LakelogError):
        log.error("unexpected error in a Kafka handler", exc_info=exc)
        return ErrorCode.unknown_server_error
    for cls in type(exc).__mro__:
        code = KAFKA_ERROR_TABLE.get(cls)
        if code is not None:
            return code
    return ErrorCode.unknown_server_error  # pragma: no cover: LakelogError is listed
