"""``s3://bucket/prefix``: objects in S3 or anything that speaks its API (MinIO, moto).

One boto3 client per store (clients are thread-safe), built from its own session so
that stores opened from several threads do not share boto3's default session.
Credentials come from the standard AWS chain. botocore retries throttling, 5xx,
timeouts and connection errors itself (``standard`` mode, ``max_attempts`` in all).

Every botocore/boto3 exception is translated here, at the boundary, into
``segments.errors``: nothing from botocore escapes this module::

    404 / NoSuchKey                          -> ObjectNotFoundError
    412 / PreconditionFailed                 -> PreconditionFailedError
    5xx, throttling, 409 conditional-write
    conflict, connection errors, timeouts,
    broken response bodies                   -> StorageUnavailableError (after the retries)
    anything else (NoSuchBucket, AccessDenied,
    missing credentials, ...)                -> StorageError
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Literal, NoReturn

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ChecksumError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from segments.errors import (
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
    StorageUnavailableError,
)
from segments.store import ObjectInfo, ObjectStore, check_key, check_range

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

# Error codes S3 (and S3-compatible stores) use for "try again later".
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "ConditionalRequestConflict",  # a racing conditional write is in flight: retry
    }
)
#: Keys per DeleteObjects request (S3's limit).
_DELETE_BATCH = 1000
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})

# Failures of the connection or of the response body: retriable by nature.
_TRANSIENT_BOTOCORE = (BotoConnectionError, HTTPClientError, IncompleteReadError, ChecksumError)


class S3Store(ObjectStore):
    """Objects under ``prefix`` in one bucket; the keys callers see are relative to it.

    Args:
        bucket: the bucket, which must exist.
        prefix: joined to every key with "/"; "" for the bucket's root.
        endpoint_url: MinIO, a moto server, ...; None lets boto3 decide
            (``AWS_ENDPOINT_URL``, then AWS). A given endpoint uses path-style addressing.
        region: None lets the AWS chain decide (``AWS_DEFAULT_REGION``, profile).
        max_attempts: attempts per request in all, the first included.
        retry_mode: botocore's "standard" or "adaptive" (client-side rate limiting).
        connect_timeout, read_timeout: seconds, per attempt.
        max_pool_connections: HTTP connections kept; enough for the threads that share
            the store (a pool smaller than the thread count makes threads queue).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_attempts: int = 5,
        retry_mode: Literal["standard", "adaptive"] = "standard",
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_pool_connections: int = 64,
    ) -> None:
        if not bucket:
            raise ValueError("an S3 store needs a bucket")
        self.bucket = bucket
        prefix = prefix.strip("/")
        self._prefix = f"{prefix}/" if prefix else ""
        self.url = f"s3://{bucket}/{prefix}"
        self._max_attempts = max_attempts
        config = Config(
            region_name=region,
            retries={"total_max_attempts": max_attempts, "mode": retry_mode},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
            s3={"addressing_style": "path"} if endpoint_url else None,
        )
        try:
            session = boto3.session.Session()
            self._client: S3Client = session.client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=config
            )
        except (BotoCoreError, ValueError) as e:
            raise StorageError(f"cannot create an S3 client for {self.url}: {e}") from e

    def _full(self, key: str) -> str:
        return self._prefix + check_key(key)

    def get(self, key: str) -> bytes:
        data, _ = self._get_object("get", key, None)
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        check_range(start, length)
        if length == 0:
            self.head(key)  # still raise ObjectNotFoundError for a missing key
            return b""
        try:
            data, ranged = self._get_object("get_range", key, f"bytes={start}-{start + length - 1}")
        except _RangeNotSatisfiable:
            return b""  # the range starts at or past the end: the object has nothing there
        # A server that ignores Range answers 200 with the whole object.
        return data if ranged else data[start : start + length]

    def _get_object(self, op: str, key: str, byte_range: str | None) -> tuple[bytes, bool]:
        """GET an object (or a range); return (body, whether the answer was a range).

        botocore retries the request but not the read of its body: a body that breaks
        off mid-read is fetched again here, up to ``max_attempts`` times in all.

        Raises:
            _RangeNotSatisfiable: 416, the range starts past the end.
        """
        full = self._full(key)
        for attempt in range(1, self._max_attempts + 1):
            try:
                if byte_range is None:
                    resp = self._client.get_object(Bucket=self.bucket, Key=full)
                else:
                    resp = self._client.get_object(Bucket=self.bucket, Key=full, Range=byte_range)
            except ClientError as e:
                if byte_range is not None and _status(e) == 416:
                    raise _RangeNotSatisfiable from e
                self._raise(op, key, e)
            except BotoCoreError as e:
                self._raise(op, key, e)
            try:
                return resp["Body"].read(), "ContentRange" in resp
            except (*_TRANSIENT_BOTOCORE, OSError) as e:
                if attempt == self._max_attempts:
                    raise StorageUnavailableError(
                        f"{op} {key!r} in {self.url}: the response body broke off "
                        f"{attempt} times: {e}"
                    ) from e
            except BotoCoreError as e:
                self._raise(op, key, e)
            finally:
                resp["Body"].close()
        raise AssertionError("unreachable")  # pragma: no cover

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> None:
        full = self._full(key)
        try:
            if if_none_match:
                self._client.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")
            else:
                self._client.put_object(Bucket=self.bucket, Key=full, Body=data)
        except (ClientError, BotoCoreError) as e:
            self._raise("put", key, e)

    def head(self, key: str) -> ObjectInfo:
        full = self._full(key)
        try:
            resp = self._client.head_object(Bucket=self.bucket, Key=full)
        except (ClientError, BotoCoreError) as e:
            self._raise("head", key, e)
        return ObjectInfo(key, resp["ContentLength"], resp["LastModified"].timestamp())

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        skip = len(self._prefix)
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._prefix + prefix
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    yield ObjectInfo(
                        obj["Key"][skip:], obj["Size"], obj["LastModified"].timestamp()
                    )
        except (ClientError, BotoCoreError) as e:
            self._raise("list", prefix, e)

    def delete(self, key: str) -> None:
        full = self._full(key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=full)
        except (ClientError, BotoCoreError) as e:
            self._raise("delete", key, e)

    def delete_many(self, keys: Sequence[str]) -> None:
        """DeleteObjects, up to 1,000 keys a request. S3 answers 200 with a list of the
        keys it could not delete: any such key raises StorageError (the caller keeps its
        record of the object, as for a failed ``delete``)."""
        for i in range(0, len(keys), _DELETE_BATCH):
            part: list[ObjectIdentifierTypeDef] = [
                {"Key": self._full(k)} for k in keys[i : i + _DELETE_BATCH]
            ]
            try:
                answer = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": part, "Quiet": True}
                )
            except (ClientError, BotoCoreError) as e:
                self._raise("delete", part[0]["Key"], e)
            failed = answer.get("Errors", [])
            if failed:
                first = failed[0]
                raise StorageError(
                    f"delete {first.get('Key')!r} in {self.url}: {first.get('Code')} "
                    f"{first.get('Message', '')} ({len(failed)} of {len(part)} keys failed)"
                )

    def close(self) -> None:
        self._client.close()

    def _raise(self, op: str, key: str, e: ClientError | BotoCoreError) -> NoReturn:
        """Raise the ``segments.errors`` class for a botocore exception (see module doc)."""
        where = f"{op} {key!r} in {self.url}"
        if isinstance(e, ClientError):
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = _status(e)
            message = e.response.get("Error", {}).get("Message", "") or str(e)
            if code == "NoSuchBucket":
                raise StorageError(f"{where}: bucket {self.bucket!r} does not exist") from e
            if code in _NOT_FOUND_CODES or status == 404:
                raise ObjectNotFoundError(f"{where}: no such object") from e
            if code == "PreconditionFailed" or status == 412:
                raise PreconditionFailedError(f"{where}: object already exists") from e
            if code in _TRANSIENT_CODES or status >= 500:
                raise StorageUnavailableError(
                    f"{where}: S3 unavailable after {self._max_attempts} attempts: "
                    f"{code or status} {message}"
                ) from e
            raise StorageError(f"{where}: {code or status}: {message}") from e
        if isinstance(e, _TRANSIENT_BOTOCORE):
            raise StorageUnavailableError(
                f"{where}: S3 unreachable after {self._max_attempts} attempts: {e}"
            ) from e
        if isinstance(e, NoCredentialsError | PartialCredentialsError):
            raise StorageError(f"{where}: no usable AWS credentials: {e}") from e
        raise StorageError(f"{where}: {type(e).__name__}: {e}") from e


class _RangeNotSatisfiable(Exception):
    """Internal: S3 answered 416 to a ranged GET."""


def _status(e: ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
