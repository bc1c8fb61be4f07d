"""The conductor's watches: the job's end, and a training that stopped making progress.

Each watch runs until cancelled or until it asks for a stop once (``stop``), and tells the
conductor through plain callbacks; neither reads the conductor's state.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

import anyio

from supervisor import deadline, job as jobs, policy
from supervisor._units import format_duration
from supervisor.config import Config
from supervisor.journal import Emit

log = logging.getLogger("supervise")

HANG_POLL = 1.0  # seconds between looks at the progress marks: the gaps are measured at this grain
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


class ProgressGaps:
    """The gaps between successive progress marks of this attempt, and the longest gaps of
    earlier ones (their ``stop`` events' ``longest_gap_s``): what the hang bound learns from."""

    def __init__(self, earlier_events: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        self.earlier = [float(e["longest_gap_s"]) for e in earlier_events
                        if e.get("kind") == "stop" and isinstance(e.get("longest_gap_s"), (int, float))]
        self.gaps: list[float] = []
        self._last: float | None = None
        self._changes = 0

    def see(self, mark: float) -> None:
        """A newest progress mark; the first change (start-up to the first progress) is no gap."""
        if self._last is not None and mark > self._last:
            self._changes += 1
            if self._changes > 1:
                self.gaps.append(mark - self._last)
        if self._last is None or mark > self._last:
            self._last = mark

    @property
    def longest(self) -> float | None:
        return round(max(self.gaps), 3) if self.gaps else None


async def hang_watch(*, limit: float | None, floor: float, marks: Callable[[], list[float]], running: Callable[[], bool],
                     hang: Callable[[float, float], bool], gaps: ProgressGaps | None = None) -> None:
    """No new checkpoint, no log growth (and idle GPUs when sampled) for the bound → ``hang``,
    once per idle spell; a ``hang`` that returns True (it stopped the run) ends the watch. The
    bound is learned from the gaps between progress marks (policy.hang_bound), ``floor`` at
    least, ``limit`` at most (None: no hang before a bound is learned)."""
    gaps = gaps or ProgressGaps()
    reported = False
    bound = math.inf if limit is None else limit
    while True:
        await anyio.sleep(max(0.1, min(30.0, bound / 4, HANG_POLL)))
        if not running():
            continue
        newest = max(marks())
        gaps.see(newest)
        bound, _ = policy.hang_bound(limit, gaps.gaps, gaps.earlier, floor)
        idle = time.monotonic() - newest
        if idle < bound:
            reported = False
            continue
        if not reported:
            reported = True
            if hang(idle, bound):
                return
