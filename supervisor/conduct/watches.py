"""The conductor's watches: the job's end, its kill delay, and a training that stopped
making progress.

Each watch runs until cancelled or until it asks for a stop once (``request_stop``). The
clock's facts they learn (the end, the fitted lead, KillWait) go into the run's state
(``state.RunState``), their one home; ``hang_watch`` itself is state-free (its inputs are
callbacks, tests/core/test_stop_sequence.py drives the real binary).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

import anyio

from supervisor import deadline, policy
from supervisor._units import format_duration
from supervisor.policy import Reason, Trigger
from supervisor.conduct.state import ProgressGaps, RunState

RequestStop = Callable[[Trigger], None]

log = logging.getLogger("supervise")

HANG_POLL = 1.0  # seconds between looks at the progress marks: the gaps are measured at this grain
END_REFRESH = 300.0  # re-read the scheduler's end time this often: limits change (scontrol update)


async def deadline_watch(run: RunState, *, started_wall: float, stopping: anyio.Event, request_stop: RequestStop) -> None:
    """Sleep until end − lead, re-reading the scheduler's end every few minutes; then warn
    (journal, notification) and ask for the stop. A learned (``auto``) lead is fitted to the
    allocation once the end is known (deadline.fit); ``run.end`` and ``run.lead`` are kept."""
    cfg, job, basis, lead, emit = run.cfg, run.plan.job, run.plan.lead_basis, run.plan.lead, run.journal.emit
    overridden = cfg.time_limit is not None or cfg.deadline is not None
    if not job.sched.is_batch and not overridden:  # no scheduler: no end but the one configured
        return
    shown: tuple[float | None, str] | None = None
    while True:
        scheduler_end = None if overridden else await job.sched.end_time(job, report=log.warning)
        end, source = deadline.resolve_end(time.time(), started_wall, cfg.time_limit, cfg.deadline, scheduler_end)
        run.end = end
        if (end, source) != shown:
            shown = (end, source)
            fields: dict[str, object] = {}
            if basis is not None:
                allocation = None if end is None else end - started_wall
                lead, bound = deadline.fit(basis, allocation)
                run.lead = lead
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
            left = end - time.time()
            shown_left = format_duration(max(0.0, left))
            log.warning("%s left before the job's end: stopping with a checkpoint", shown_left)
            emit("warning", left_s=round(left, 3), source=source)
            if run.notifier is not None:
                run.notifier.post("warning", left=shown_left)
            request_stop(Trigger(Reason.DEADLINE, f"{shown_left} before the end ({source})", at=time.monotonic()))
            return


async def learn_kill_wait(run: RunState) -> None:
    """KillWait, read once at start: after Slurm's TERM to the whole job it is all we have
    (PBS: the queue's kill_delay less MoM's early KILL). Journaled (``kill-wait``)."""
    learned = await run.plan.job.sched.kill_wait(run.plan.job, report=log.warning)
    run.kill_wait = learned or run.kill_wait
    run.journal.emit("kill-wait", seconds=run.kill_wait, scheduler=run.plan.job.scheduler)


async def progress_watch(run: RunState, *, started: float, request_stop: RequestStop) -> None:
    """The hang watch over this run's progress marks (start, mirror activity, busy GPUs):
    journaled and told once per idle spell; with ``hang_action = stop``, a stop."""
    cfg = run.cfg

    def marks() -> list[float]:
        seen = [started, run.mirror.last_activity() if run.mirror else None, run.gpu.last_busy() if run.gpu else None]
        return [m for m in seen if m is not None]

    def hang(idle: float, bound: float) -> bool:
        run.journal.emit("hang", idle_s=round(idle, 1), action=cfg.hang_action, bound_s=round(bound, 3),
                         longest_gap_s=run.gaps.longest, earlier_gaps_s=run.gaps.earlier)
        log.warning("no checkpoint, log growth or GPU work for %s: the training may hang", format_duration(idle))
        if run.notifier is not None:
            run.notifier.post("hang", idle=format_duration(idle))
        if cfg.hang_action == "stop":
            request_stop(Trigger(Reason.HANG, f"idle for {format_duration(idle)}", at=time.monotonic()))
        return cfg.hang_action == "stop"

    await hang_watch(limit=cfg.hang_after, floor=cfg.hang_floor, marks=marks, running=run.child_running, hang=hang,
                     gaps=run.gaps)


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
