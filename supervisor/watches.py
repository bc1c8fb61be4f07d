"""The conductor's watches: the job's end, and a training that stopped making progress.

Each watch runs until cancelled or until it asks for a stop once (``stop``), and tells the
conductor through plain callbacks; neither reads the conductor's state.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import anyio

from supervisor import deadline, job as jobs
from supervisor._units import format_duration
from supervisor.config import Config
from supervisor.journal import Emit

log = logging.getLogger("supervise")

END_REFRESH = 300.0  # re-read the scheduler's end time this often: limits change (scontrol update)


async def deadline_watch(*, cfg: Config, job: jobs.Job, lead: float, basis: deadline.Lead | None, started_wall: float,
                         emit: Emit, set_end: Callable[[float | None], None], set_lead: Callable[[float], None],
                         stopping: anyio.Event, warn: Callable[[float, str], None]) -> None:
    """Sleep until end − lead, re-reading the scheduler's end every few minutes; then ``warn``.
    A learned (``auto``) lead is fitted to the allocation once the end is known (deadline.fit)."""
    overridden = cfg.time_limit is not None or cfg.deadline is not None
    if job.scheduler == "local" and not overridden:
        return
    shown: tuple[float | None, str] | None = None
    while True:
        scheduler_end = None if overridden else await jobs.end_time(job, report=log.warning)
        end, source = deadline.resolve_end(time.time(), started_wall, cfg.time_limit, cfg.deadline, scheduler_end)
        set_end(end)
        if (end, source) != shown:
            shown = (end, source)
            fields: dict[str, object] = {}
            if basis is not None:
                allocation = None if end is None else end - started_wall
                lead, bound = deadline.fit(basis, allocation)
                set_lead(lead)
                fields = {**basis.fields(), "unfitted_s": round(basis.seconds, 3), "bound": bound,
                          "allocation_s": None if allocation is None else round(allocation, 3)}
            emit("deadline", end=end, source=source, lead_s=round(lead, 3),
                 warn_at=None if end is None else end - lead, **{"learned": False, **fields})
            if end is not None:
                log.info("the job ends at %s (%s); warning %s before",
                         time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(end)), source, format_duration(lead))
        wait = END_REFRESH if end is None else min(END_REFRESH, max(0.0, end - lead - time.time()))
        if overridden and end is not None:
            wait = max(0.0, end - lead - time.time())
        with anyio.move_on_after(wait):
            await stopping.wait()
        if stopping.is_set():
            return
        if end is not None and time.time() >= end - lead:
            warn(end - time.time(), source)
            return


async def hang_watch(*, limit: float, marks: Callable[[], list[float]], running: Callable[[], bool],
                     hang: Callable[[float], bool]) -> None:
    """No new checkpoint, no log growth (and idle GPUs when sampled) for ``limit`` → ``hang``,
    once per idle spell; a ``hang`` that returns True (it stopped the run) ends the watch."""
    reported = False
    while True:
        await anyio.sleep(min(30.0, limit / 4))
        if not running():
            continue
        idle = time.monotonic() - max(marks())
        if idle < limit:
            reported = False
            continue
        if not reported:
            reported = True
            if hang(idle):
                return
