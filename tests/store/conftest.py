"""The object-store tests' fixtures: one SeaweedFS per test session (per xdist worker), a
fresh bucket per test (tests/support/s3.py)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.s3 import Bucket, S3Server, skip_without_s3

_n = itertools.count()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    skip_without_s3()
    server = S3Server(tmp_path_factory.mktemp("s3")).up()
    try:
        yield server
    finally:
        server.down()


@pytest.fixture
def s3_own(tmp_path: Path) -> Iterator[S3Server]:
    """A server of the test's own, for a test that kills and restarts it."""
    skip_without_s3()
    server = S3Server(tmp_path / "s3").up()
    try:
        yield server
    finally:
        server.down()


@pytest.fixture
def bucket(s3_server: S3Server) -> Bucket:
    return s3_server.make_bucket(f"test-{os.getpid()}-{next(_n)}")
