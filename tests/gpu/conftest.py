"""Fixtures of the GPU tests: an in-memory emit and a real process tree."""

from __future__ import annotations

import subprocess
import time
from typing import Iterator

import pytest

from supervisor.proctree import descendants
from tests.support.emit import Events


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A real training-like tree: a shell whose child is a sleeping grandchild."""
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 60 & wait"])
    deadline = time.monotonic() + 10
    kids: set[int] = set()
    while not kids and time.monotonic() < deadline:
        kids = descendants(proc.pid)
        time.sleep(0.01)
    assert kids, "the shell did not start its child"
    try:
        yield proc, next(iter(kids))
    finally:
        for pid in descendants(proc.pid):
            try:
                import os
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()

