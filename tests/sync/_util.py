"""The sync tests' mirror in a task group, and many small files to copy (checkpoint writers and
the checker: tests/support/checkpoints.py)."""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import anyio

from supervisor.sync import Mirror


@asynccontextmanager
async def running(mirror: Mirror) -> AsyncIterator[Mirror]:
    async with anyio.create_task_group() as tg:
        await tg.start(mirror.run)
        yield mirror
        tg.cancel_scope.cancel()


def many_files(d: Path, n: int, size: int = 64) -> None:
    d.mkdir(parents=True, exist_ok=True)
    blob = b"s" * size
    for i in range(n):
        with open(d / f"f{i:05d}", "wb") as f:
            f.write(blob)


def visible(dst: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(dst) if not n.startswith("."))
    except FileNotFoundError:
        return []
