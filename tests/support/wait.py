"""The one way a test waits: poll a condition with a generous bound, never sleep and hope.

Every wait of the suite goes through ``wait_for`` (threads, subprocesses, clusters) or
``wait_for_async`` (inside an event loop), with one signature: the condition, how long at
most, what is awaited (said when the bound runs out), and keywords for how often to look."""

from __future__ import annotations

import time
from typing import Callable, Generator, TypeVar

INTERVAL = 0.02  # between two looks, unless a caller polls something dear (a cluster's client)
T = TypeVar("T")


def _polls(cond: Callable[[], T], timeout: float, what: str | Callable[[], str],
           error: type[Exception]) -> Generator[None, None, T]:
    """Check ``cond`` once per step; the generator returns its first truthy value, and raises
    ``error`` naming ``what`` once ``timeout`` seconds have passed. Its callers sleep between."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g}s waiting for {what() if callable(what) else what}")
        yield


def wait_for(cond: Callable[[], T], timeout: float = 20.0, what: str | Callable[[], str] = "condition", *,
             interval: float = INTERVAL, error: type[Exception] = AssertionError) -> T:
    """Poll ``cond`` until it returns something truthy, and return that; after ``timeout`` seconds
    raise ``error`` naming ``what`` (a callable is asked then, to say what was seen)."""
    steps = _polls(cond, timeout, what, error)
    try:
        while True:
            next(steps)
            time.sleep(interval)
    except StopIteration as done:
        return done.value


async def wait_for_async(cond: Callable[[], T], timeout: float = 20.0, what: str | Callable[[], str] = "condition",
                         *, interval: float = INTERVAL, error: type[Exception] = AssertionError) -> T:
    """``wait_for`` inside an event loop: the same bound and message, sleeping with anyio."""
    import anyio

    steps = _polls(cond, timeout, what, error)
    try:
        while True:
            next(steps)
            await anyio.sleep(interval)
    except StopIteration as done:
        return done.value
