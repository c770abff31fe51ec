"""Fixtures shared by the whole suite: real processes live in ``tests/procs.py``."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.procs import start_moto

# boto3 inside tests and in child processes: fake credentials, never a real account.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Endpoint URL of one moto S3 server process shared by the run."""
    proc, endpoint = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        yield endpoint
    finally:
        proc.stop()


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> str:
    """A fresh bucket on the moto server; returns its name."""
    name = f"lakelog-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_url(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/lakelog"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d
