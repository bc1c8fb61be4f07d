"""What Slurm's tools print, read: ``squeue``'s end, start and limit, ``scontrol show job``
(the controller's view of a job being stopped, its excluded nodes), ``scontrol show node`` and
``show config``; Slurm's times and durations; and what the view means for a stop's reason.
Pure functions of the output: asking the controller is ``slurm.py``'s.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from supervisor.sched._hostlist import expand_hostlist

NO_LIMIT = ("NONE", "UNLIMITED", "N/A", "UNKNOWN")  # squeue's %e of a job without an end

END_TOLERANCE = 2.0  # s: Slurm's times have a 1 s grain; an EndTime this close to the time limit is it


def parse_slurm_time(text: str) -> float | None:
    """``2026-11-21T13:44:55`` (local time, Slurm prints no zone) → unix seconds."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def parse_slurm_duration(text: str) -> float | None:
    """A Slurm time limit (``TimeLimit=``, squeue ``%l``) → seconds: ``MM:SS``, ``HH:MM:SS``,
    ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``; None for ``UNLIMITED``, ``Partition_Limit`` and
    anything else."""
    days, dash, rest = text.strip().rpartition("-")
    parts = rest.split(":")
    if (dash and not days.isdigit()) or not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    nums = [int(p) for p in parts]
    if days:
        nums += [0] * (3 - len(nums))  # D-HH, D-HH:MM: hours first
        return float(int(days) * 86400 + nums[0] * 3600 + nums[1] * 60 + nums[2])
    if len(nums) == 1:
        return float(nums[0] * 60)  # minutes
    total = 0
    for n in nums:
        total = total * 60 + n
    return float(total)


def ended_early(end: float | None, start: float | None, limit: float | None) -> bool:
    """EndTime before StartTime + TimeLimit (by more than the clock's grain): the job is being
    ended before its time limit, by a scancel (issue 30: read as the time limit). Unknowable
    without all three."""
    if end is None or start is None or limit is None:
        return False
    return end < start + limit - END_TOLERANCE


def time_limit_end(end: float | None, start: float | None, limit: float | None) -> float | None:
    """The job's end as its time limit sets it: StartTime + TimeLimit when EndTime was moved
    earlier (a scancel landing while supervise reads the end at start-up would otherwise be
    taken for a time limit reached, and warned and requeued as one), else EndTime."""
    if ended_early(end, start, limit):
        return start + limit  # type: ignore[operator]
    return end


@dataclass(frozen=True)
class JobView:
    """What the controller says of the job while it is being stopped.

    After a job-wide SIGTERM, Slurm 22.05 shows ``JobState=COMPLETING`` for the whole
    KillWait, whatever the cause; the other fields tell the causes apart (measured on the
    local cluster, docs/slurm.md): ``scancel`` moves ``EndTime`` to the cancel time,
    ``scontrol requeue`` raises ``Restarts`` at once, a preemption sets ``PreemptTime``.
    """

    state: str                 # JobState, e.g. RUNNING, COMPLETING, CANCELLED, REQUEUED, TIMEOUT
    restarts: int | None       # Restarts: the requeue counter (SLURM_RESTART_COUNT of the next run)
    end: float | None          # EndTime, unix seconds
    preempt_time: float | None  # PreemptTime, unix seconds; None when not preempted
    start: float | None = None  # StartTime, unix seconds
    limit: float | None = None  # TimeLimit, seconds; None when unlimited or unreadable

    def ended_early(self) -> bool:
        """EndTime before StartTime + TimeLimit: the job ends before its time limit (a scancel
        moves EndTime to the cancel time; the time limit leaves it there or later)."""
        return ended_early(self.end, self.start, self.limit)


def parse_job_view(text: str) -> JobView | None:
    """``scontrol show job -o`` output → JobView; None without a JobState."""
    fields = dict(re.findall(r"\b(JobState|Restarts|EndTime|PreemptTime|StartTime|TimeLimit)=(\S+)", text))
    if "JobState" not in fields:
        return None
    restarts = fields.get("Restarts")
    return JobView(
        state=fields["JobState"].upper(),
        restarts=int(restarts) if restarts and restarts.isdigit() else None,
        end=parse_slurm_time(fields.get("EndTime", "")),
        preempt_time=parse_slurm_time(fields.get("PreemptTime", "")),
        start=parse_slurm_time(fields.get("StartTime", "")),
        limit=parse_slurm_duration(fields.get("TimeLimit", "")),
    )


_STATE_REASONS = {"CANCELLED": "cancelled", "TIMEOUT": "deadline", "DEADLINE": "deadline", "PREEMPTED": "preempted"}


def reason_from_view(view: JobView | None, was: str, restart_count: int) -> tuple[str, bool]:
    """(reason, requeued by the scheduler) from the controller's view after a SIGTERM.

    A job-wide TERM shows as COMPLETING for all of KillWait; then a raised ``Restarts``
    means a requeue (a preemption with PreemptMode=REQUEUE, or an admin's), a
    ``PreemptTime`` a preemption, and a TERM we took for a preemption with neither is
    a cancel; so is one we took for the time limit when EndTime is before StartTime +
    TimeLimit (the cancel moved it: ``ended_early``). A job still RUNNING got its TERM at the batch shell only (a site's
    preemption script, ``scancel --signal=TERM --batch``): it stays a preemption.
    """
    if view is None:
        return was, False
    requeued = view.state.startswith("REQUEUE") or (view.restarts is not None and view.restarts > restart_count)
    base = view.state.split("+")[0]
    if base in _STATE_REASONS:
        return _STATE_REASONS[base], requeued
    if requeued or view.preempt_time is not None:
        return ("deadline" if was == "deadline" else "preempted"), requeued
    if base == "COMPLETING" and (was == "preempted" or view.ended_early()):
        return "cancelled", False  # a TERM near an end that a scancel moved is no time limit
    return was, False


def reason_after_signal_death(view: JobView | None, restart_count: int) -> tuple[str, bool] | None:
    """(reason, requeued by the scheduler) when the training died of a signal supervise did not
    send, before any TERM reached supervise: a scancel, the time limit or a requeue signals every
    process of the job at once, and the child may be seen dead first (CI: exit 143 33 ms before
    supervise's own TERM). The controller has changed the job's state before it signals, so a job
    that is no longer RUNNING says which; a RUNNING one (or no view) means something else killed
    the training (the OOM killer, a user's ``kill``): None, the failure stands."""
    if view is None or view.state.split("+")[0] in ("RUNNING", "PENDING", "SUSPENDED"):
        return None
    return reason_from_view(view, "preempted", restart_count)


def excluded_nodes(view_text: str) -> tuple[str, ...]:
    """``ExcNodeList=`` of ``scontrol show job -o`` output, expanded; () for ``(null)``."""
    m = re.search(r"\bExcNodeList=(\S*)", view_text)
    return () if not m or m.group(1) in ("", "(null)") else expand_hostlist(m.group(1))


def node_line(line: str) -> tuple[str, tuple[str, str]] | None:
    """(NodeName, (State, Reason)) from one line of ``scontrol -o show node``."""
    fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
    if "NodeName" not in fields or "State" not in fields:
        return None
    reason = line.split("Reason=", 1)[1].split(" [", 1)[0].strip() if "Reason=" in line else ""
    return fields["NodeName"], (fields["State"], reason)


def slurm_seconds(text: str) -> float | None:
    """Slurm's ``--time``: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS → seconds."""
    days, _, rest = text.strip().rpartition("-")
    try:
        d = int(days) if days else 0
        parts = [int(p) for p in rest.split(":")]
    except ValueError:
        return None
    if days:  # D-HH[:MM[:SS]]
        parts = (parts + [0, 0])[:3] if 1 <= len(parts) <= 3 else []
    elif len(parts) == 1:  # minutes
        parts = [0, parts[0], 0]
    elif len(parts) == 2:  # MM:SS
        parts = [0, *parts]
    if len(parts) != 3 or min(parts) < 0 or d < 0:
        return None
    return float(((d * 24 + parts[0]) * 60 + parts[1]) * 60 + parts[2])


def parse_squeue_end(out: str) -> tuple[bool, float | None]:
    """``squeue -h -j ID -o "%e %S %l"`` output → (read, end): the end its time limit sets
    (``time_limit_end``: a scancel moves EndTime, the time limit does not), None without a limit;
    read is False when the end is no time (then ``scontrol show job`` is asked)."""
    value, *rest = out.strip().splitlines()[0].split()
    if value.upper() in NO_LIMIT:
        return True, None
    parsed = parse_slurm_time(value)
    if parsed is None:
        return False, None
    start, limit = (rest + ["", ""])[:2]
    return True, time_limit_end(parsed, parse_slurm_time(start), parse_slurm_duration(limit))


def scontrol_end(out: str) -> float | None:
    """``scontrol show job`` output → the end its time limit sets; its EndTime alone where there is
    no JobState to make a view of; None without one."""
    view = parse_job_view(out)
    if view is not None and view.end is not None:
        return time_limit_end(view.end, view.start, view.limit)
    m = re.search(r"\bEndTime=(\S+)", out)
    return parse_slurm_time(m.group(1)) if m else None


def parse_kill_wait(out: str) -> float | None:
    """``KillWait`` of ``scontrol show config`` output (seconds); None when it says none."""
    m = re.search(r"^KillWait\s*=\s*(\d+)", out, re.M)
    return float(m.group(1)) if m else None


# srun's line for a task that ended while the others go on, one per host:
# "srun: error: n3: task 2: Killed", "srun: error: n3: task 2: Exited with exit code 1"
_TASK_END = re.compile(r"^srun: error: (\S+): tasks? (\d+)(?:[-,]\S*)?: (.+)$")


def task_ended(line: str, nodes: list[str]) -> tuple[int, str] | None:
    """(node index, srun's words) when ``line`` is srun saying that the agent's task on one of
    ``nodes`` ended; the host names the node (srun numbers tasks in its own node order)."""
    m = _TASK_END.match(line.strip())
    if m is None or m.group(1) not in nodes:
        return None
    host, task, what = m.groups()
    return nodes.index(host), f"srun: {host}: task {task}: {what}"
