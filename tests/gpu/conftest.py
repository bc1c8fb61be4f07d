"""Shared helpers for the GPU tests: a list-backed emit and a real process tree."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from supervisor.proctree import descendants
from tests.support.wait import wait_for_async


class Events:
    """An ``Emit`` that keeps events in memory (thread-safe enough: list.append)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, kind: str, /, *, durable: bool = False, **fields: Any) -> dict[str, Any]:
        event = {"kind": kind, **fields}
        self.events.append(event)
        return event

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]


@pytest.fixture
def events() -> Events:
    return Events()


def read_csv(path: Path) -> list[dict[str, str]]:
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    return [dict(zip(header, line.split(","))) for line in lines[1:] if line]


async def wait_for(cond: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll ``cond`` until true; fail after a generous ``timeout``."""
    await wait_for_async(cond, timeout, what)


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


PYTHON = sys.executable
