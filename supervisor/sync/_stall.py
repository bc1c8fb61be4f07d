"""Whether a pair's persistent side moves: what is in flight there, and how long nothing moved.

A hung object store or persistent directory left no trace in the journal until its requests
timed out (120 s, ``_store.REQUEST_TIMEOUT``) or its copier was killed (``SUPERVISE_COPIER_STALL``,
120 s): a 20 s outage showed only as a 20.5 s ``lag_s`` afterwards. So every operation on the
persistent side is *in flight* while it runs (``op``: a copier, a store request, a rename into
place), and *moves* when it ends or does I/O (``moved``: a copier's bytes, a multipart upload's
next part, a download's next chunk). While something is in flight and nothing moved for
``STALL_AFTER_S``, the pair journals ``sync-stalled``; when it moves again (or what was in flight
ends, done or failed), ``sync-resumed``. Nothing in flight is no stall: a pass that waits for
another node's part, or a pair with nothing to copy, is idle.

The pass sets its pair's ``Progress`` as the current one (``tracking``); the copiers and the
store client, shared by every pair, report to whichever pass runs them (a context variable:
tasks and worker threads a pass starts inherit it).
"""

from __future__ import annotations

import itertools
import time
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import ContextManager, Iterator

import anyio

from supervisor.journal import Emit

# Seconds with an operation on the persistent side in flight and none of it moving: a stall.
# Well under the store's request timeout and the copier's stall bound (120 s each), well over
# what one request or one part takes on a working link (a multipart part of 8 MiB at 1 MB/s: 8 s).
STALL_AFTER_S = 10.0
CHECK_EVERY_S = 1.0  # how often the watch looks: a stall is journaled within STALL_AFTER_S + this
SHOWN = 5  # operations named in an event, the oldest first


class Progress:
    """One pair's persistent side: the operations in flight, the last time any moved, and the
    stall the watch reported (its start), if one is open."""

    def __init__(self) -> None:
        self._flight: dict[int, tuple[str, float]] = {}
        self._ids = itertools.count()
        self.last_moved = time.monotonic()
        self.stalled_since: float | None = None

    @contextmanager
    def op(self, what: str) -> Iterator[None]:
        """``what`` is in flight for the block; its end is progress (done or failed)."""
        now = time.monotonic()
        if not self._flight:
            self.last_moved = now  # nothing was in flight: the clock starts with this one
        key = next(self._ids)
        self._flight[key] = (what, now)
        try:
            yield
        finally:
            del self._flight[key]
            self.moved()

    def moved(self) -> None:
        self.last_moved = time.monotonic()

    def in_flight(self) -> list[str]:
        """What is in flight now, the oldest first (at most ``SHOWN``, and how many more)."""
        names = [what for what, _since in sorted(self._flight.values(), key=lambda item: item[1])]
        return names[:SHOWN] + ([f"and {len(names) - SHOWN} more"] if len(names) > SHOWN else [])

    def still_for(self, now: float) -> float | None:
        """Seconds without progress while something is in flight; None when nothing is."""
        return now - self.last_moved if self._flight else None


_CURRENT: ContextVar[Progress | None] = ContextVar("supervise_sync_progress", default=None)


@contextmanager
def tracking(progress: Progress) -> Iterator[None]:
    """Operations started in this block (and the tasks and threads it starts) are ``progress``'s."""
    token = _CURRENT.set(progress)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> Progress | None:
    """The current pass's ``Progress`` (for a callback that runs outside its context: obstore
    pulls an upload's parts from its own runtime)."""
    return _CURRENT.get()


def op(what: str) -> ContextManager[None]:
    """``what`` is in flight on the current pass's persistent side (nothing outside a pass)."""
    progress = _CURRENT.get()
    return progress.op(what) if progress is not None else nullcontext()


def moved() -> None:
    """The current pass's persistent side moved (bytes written, a part taken, a chunk read)."""
    progress = _CURRENT.get()
    if progress is not None:
        progress.moved()


async def watch(progress: Progress, pair: str, emit: Emit) -> None:
    """Journal a stall of ``pair``'s persistent side once it lasts ``STALL_AFTER_S``, and its end."""
    while True:
        await anyio.sleep(CHECK_EVERY_S)
        now, wall = time.monotonic(), time.time()
        still = progress.still_for(now)
        began = progress.stalled_since
        if began is None:
            if still is not None and still >= STALL_AFTER_S:
                progress.stalled_since = progress.last_moved
                emit("sync-stalled", pair=pair, in_flight=progress.in_flight(), stalled_s=round(still, 1),
                     since=round(wall - still, 3), after_s=STALL_AFTER_S)
        elif still is None or progress.last_moved > began:
            progress.stalled_since = None
            emit("sync-resumed", pair=pair, stalled_s=round(progress.last_moved - began, 1),
                 how="moving" if still is not None else "ended", in_flight=progress.in_flight())
