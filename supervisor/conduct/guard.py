"""Running a part (mirror, notifier, samplers, watches) so that it cannot take the run down.

``guarded`` is started with ``tg.start``: the part is ready when it says so, or, when its
start-up fails, the failure is journaled and the run goes on without waiting for it. A part
that fails later is retried with backoff (docs/design.md, invariant 4).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import anyio
from anyio.abc import TaskStatus

from supervisor.journal import Emit

if TYPE_CHECKING:
    from supervisor.ports import ChildPort

log = logging.getLogger("supervise")
PART_RESTARTS = 5


async def guarded(name: str, run: Callable[..., Awaitable[Any]], emit: Emit, *,
                  task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    started = False

    def ready() -> None:
        nonlocal started
        if not started:
            started = True
            task_status.started()

    for n in range(PART_RESTARTS + 1):
        try:
            if n == 0 and task_status is not anyio.TASK_STATUS_IGNORED:
                await run(task_status=_Ready(ready))
            else:
                ready()
                await run()
            return
        except Exception as e:  # noqa: BLE001 - a part's failure is journaled, never fatal
            ready()  # a part that failed to start must not hold the run back
            delay = min(60.0, 2.0 * 2**n)
            emit("part-failed", part=name, error=f"{type(e).__name__}: {e}", retry_in=delay if n < PART_RESTARTS else None)
            log.warning("%s failed: %s%s", name, e, f"; retrying in {delay:g}s" if n < PART_RESTARTS else "; giving up")
            if n < PART_RESTARTS:
                await anyio.sleep(delay)


class _Ready:
    """A TaskStatus that may be told twice (a part, then its guard after a failure)."""

    def __init__(self, ready: Callable[[], None]) -> None:
        self._ready = ready

    def started(self, value: Any = None) -> None:
        self._ready()


async def cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once ``event`` is set (a restore that a stop must not wait for)."""
    await event.wait()
    scope.cancel()


async def reap_orphans(child_of: Callable[[], ChildPort | None], emit: Emit) -> None:
    """Reap orphans re-parented to us (a child subreaper), so none lingers as a zombie."""
    while True:
        child = child_of()
        if child is not None and child.zombie_orphan_waiting():
            for pid in await anyio.to_thread.run_sync(child.reap_orphans):
                emit("orphan-reaped", pid=pid)
        await anyio.sleep(1.0)
