"""The scheduler we are in: Slurm, PBS or none ("local").

One small interface in the style of submitit's JobEnvironment: ``detect_job(env)`` reads only
the environment (cheap, pure, testable with recorded environments) and returns a frozen
``Job``; the few facts that need the scheduler's own tools (the end time, requeue) are async
functions that run argv lists through anyio with a timeout. They never raise into the
caller: a scheduler that is slow, missing or answers nonsense must not take the supervision
down (docs/design.md, invariant 4), so failures come back as ``None`` / ``(False, why)`` and are reported
through ``report`` (default: this module's logger).

Facts relied on (docs/slurm.md, docs/pbs.md):
* ``SLURM_JOB_END_TIME`` exists only from Slurm 23.02; on 22.05 the end time comes from
  ``squeue -h -j ID -o "%e %S %l"`` (local time, no zone, ``NONE`` without a limit) or
  ``scontrol show job`` (``EndTime=``); a scancel moves EndTime to the cancel time, so the
  time limit is StartTime + TimeLimit.
* ``SLURM_RESTART_COUNT`` is unset on a job's first run.
* PBS has no end-time variable; ``qstat -f`` gives ``stime`` and ``Resource_List.walltime``.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Protocol

import anyio

log = logging.getLogger(__name__)

Report = Callable[[str], None]
QUERY_TIMEOUT = 15.0     # squeue/scontrol/qstat answer in milliseconds when the controller is well
REQUEUE_TIMEOUT = 60.0   # submitit's bound for scontrol requeue (#1713)


@dataclass(frozen=True)
class Job:
    """What the environment says about the job we run in. Scheduler tools are not consulted."""

    scheduler: str                      # 'slurm' | 'pbs' | 'local'
    job_id: str | None = None
    job_name: str | None = None
    restart_count: int = 0              # requeues before this run (0 on the first)
    nodes: tuple[str, ...] = ()
    gpus_per_node: int | None = None
    ntasks: int | None = None           # world-size hint: SLURM_NTASKS, PBS nodefile lines
    tasks_per_node: int | None = None
    cpus_per_node: int | None = None
    submit_dir: str | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    nodefile: str | None = None         # PBS_NODEFILE
    env_end_time: float | None = None   # SLURM_JOB_END_TIME (Slurm >= 23.02), a launch snapshot
    queue: str | None = None            # PBS_QUEUE (the queue's kill_delay is the TERM→KILL wait)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def requeue_id(self) -> str | None:
        """The id ``scontrol requeue`` wants: ``ARRAYID_TASKID`` for an array task."""
        if self.scheduler == "slurm" and self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id


# ---------------------------------------------------------------------------- parsing helpers

def expand_hostlist(text: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist: ``gpu[01-04,07]``, ``a[1-2]-b[3-4]``, ``n1,gpu[1-2],x``.

    Zero padding follows the range's lower bound (``01`` → width 2). Several bracket groups
    in one name give their product, in the order Slurm prints them. Raises ValueError on
    an unbalanced bracket or a malformed range, so callers can fall back.
    """
    out: list[str] = []
    for name in _split_top_level(text.strip()):
        if name:
            out.extend(_expand_one(name))
    return tuple(out)


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _expand_one(name: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", name)
    if not m:
        return [name]
    head, tail = name[: m.start()], name[m.end():]
    out = []
    for piece in m.group(1).split(","):
        lo, sep, hi = piece.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {piece!r} in hostlist {name!r}")
        width = len(lo)
        for i in range(int(lo), int(hi if sep else lo) + 1):
            for rest in _expand_one(tail):
                out.append(f"{head}{i:0{width}d}{rest}")
    return out


def expand_tasks_per_node(text: str) -> tuple[int, ...]:
    """``2(x3),1`` (SLURM_TASKS_PER_NODE) → ``(2, 2, 2, 1)``."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"bad tasks-per-node {text!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return tuple(out)


def count_devices(text: str | None) -> int | None:
    """GPUs in a device list (``0,1,2,3``, ``GPU-uuid,…``: CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS).

    None when unset or empty (unknown); 0 for ``NoDevFiles`` (Slurm's "none granted")."""
    if text is None or not text.strip():
        return None
    if text.strip().lower() in ("nodevfiles", "none", "(null)"):
        return 0
    return len([x for x in text.split(",") if x.strip()])


def gpu_count(text: str | None) -> int | None:
    """A GPU count: ``4`` (SLURM_GPUS_ON_NODE), ``a100:4`` or ``gpu:a100:4(x2)`` (per node)."""
    m = re.fullmatch(r"\s*(?:[\w.-]+:)*(\d+)(?:\(x\d+\))?\s*", text or "")
    return int(m.group(1)) if m else None


def _int(text: str | None) -> int | None:
    try:
        return int(str(text).strip()) if text not in (None, "") else None
    except ValueError:
        return None


def read_nodefile(path: str | os.PathLike[str]) -> list[str]:
    """Lines of a PBS nodefile (one per MPI rank; hosts repeat). Missing file → []."""
    try:
        return [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    except OSError:
        return []


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


# ---------------------------------------------------------------------------- the interface

class Scheduler(Protocol):
    """One scheduler's knowledge. Implementations are stateless singletons."""

    name: str

    def active(self, env: Mapping[str, str]) -> bool: ...
    def job(self, env: Mapping[str, str]) -> Job: ...
    async def end_time(self, job: Job, report: Report) -> float | None: ...
    def requeue_command(self, job: Job) -> list[str] | None: ...


class Slurm:
    name = "slurm"

    def active(self, env: Mapping[str, str]) -> bool:
        return bool(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))

    def job(self, env: Mapping[str, str]) -> Job:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        try:
            nodes = expand_hostlist(nodelist) if nodelist else ()
        except ValueError:
            log.warning("cannot expand SLURM_JOB_NODELIST=%r; using it as one name", nodelist)
            nodes = (nodelist,)
        tpn: int | None = _int(env.get("SLURM_NTASKS_PER_NODE"))
        if tpn is None and env.get("SLURM_TASKS_PER_NODE"):
            try:
                counts = expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"])
                tpn = counts[0] if len(set(counts)) == 1 else None
            except ValueError:
                pass
        gpus = gpu_count(env.get("SLURM_GPUS_ON_NODE"))
        if gpus is None:
            gpus = gpu_count(env.get("SLURM_GPUS_PER_NODE"))
        for key in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
            if gpus is None:
                gpus = count_devices(env.get(key))
        end = env.get("SLURM_JOB_END_TIME")
        return Job(
            scheduler="slurm",
            job_id=env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"),
            job_name=env.get("SLURM_JOB_NAME"),
            restart_count=_int(env.get("SLURM_RESTART_COUNT")) or 0,
            nodes=nodes,
            gpus_per_node=gpus,
            ntasks=_int(env.get("SLURM_NTASKS")) or _int(env.get("SLURM_NPROCS")),
            tasks_per_node=tpn,
            cpus_per_node=_int(env.get("SLURM_CPUS_ON_NODE")),
            submit_dir=env.get("SLURM_SUBMIT_DIR"),
            array_job_id=env.get("SLURM_ARRAY_JOB_ID"),
            array_task_id=env.get("SLURM_ARRAY_TASK_ID"),
            env_end_time=float(end) if end and end.strip().isdigit() and int(end) > 0 else None,
        )

    async def end_time(self, job: Job, report: Report) -> float | None:
        if job.env_end_time is not None:
            return job.env_end_time
        if not job.job_id:
            return None
        # EndTime with StartTime and TimeLimit: a scancel moves EndTime, the time limit does not.
        rc, out = await _run(["squeue", "-h", "-j", job.job_id, "-o", "%e %S %l"], QUERY_TIMEOUT, report)
        if rc == 0 and out.strip():
            value, *rest = out.strip().splitlines()[0].split()
            if value.upper() in ("NONE", "UNLIMITED", "N/A", "UNKNOWN"):
                return None
            parsed = parse_slurm_time(value)
            if parsed is not None:
                start, limit = (rest + ["", ""])[:2]
                return time_limit_end(parsed, parse_slurm_time(start), parse_slurm_duration(limit))
            report(f"squeue printed an end time we cannot read: {value!r}")
        rc, out = await _run(["scontrol", "show", "job", job.job_id], QUERY_TIMEOUT, report)
        if rc == 0:
            view = parse_job_view(out)
            if view is not None and view.end is not None:
                return time_limit_end(view.end, view.start, view.limit)
            m = re.search(r"\bEndTime=(\S+)", out)
            if m:
                return parse_slurm_time(m.group(1))
        return None

    def requeue_command(self, job: Job) -> list[str] | None:
        jid = job.requeue_id
        return ["scontrol", "requeue", jid] if jid else None


class Pbs:
    name = "pbs"

    def active(self, env: Mapping[str, str]) -> bool:
        return bool(env.get("PBS_JOBID"))

    def job(self, env: Mapping[str, str]) -> Job:
        nodefile = env.get("PBS_NODEFILE")
        lines = read_nodefile(nodefile) if nodefile else []
        nodes = _unique(lines)
        ncpus = _int(env.get("NCPUS"))
        gpus = count_devices(env.get("CUDA_VISIBLE_DEVICES"))
        if gpus is None:
            gpus = gpu_count(env.get("NGPUS"))
        tpn = len(lines) // len(nodes) if nodes and len(lines) % len(nodes) == 0 else None
        array_index = env.get("PBS_ARRAY_INDEX")
        return Job(
            scheduler="pbs",
            job_id=env.get("PBS_JOBID"),
            job_name=env.get("PBS_JOBNAME"),
            # PBS has no restart counter in the environment (qstat's run_count is the
            # server's); the journal counts attempts (journal.next_attempt).
            restart_count=0,
            nodes=nodes,
            gpus_per_node=gpus,
            ntasks=len(lines) or None,
            tasks_per_node=tpn,
            cpus_per_node=ncpus,
            submit_dir=env.get("PBS_O_WORKDIR"),
            array_job_id=env.get("PBS_ARRAY_ID") if array_index else None,
            array_task_id=array_index,
            nodefile=nodefile,
            queue=env.get("PBS_QUEUE"),
        )

    async def end_time(self, job: Job, report: Report) -> float | None:
        if not job.job_id:
            return None
        # A rerun's first moment can lack ``stime`` (measured, OpenPBS 23.06) and
        # ``resources_used.walltime`` comes only with MoM's first sample: ask again shortly
        # rather than wait END_REFRESH with no end (the walltime would then arrive unwarned).
        for attempt in range(START_RETRIES + 1):
            attrs = await pbs_attrs(job, report)
            if attrs is None:
                return None
            end = pbs_end_time(attrs, now=time.time())
            if end is not None or not attrs.get("Resource_List.walltime"):
                return end
            if attempt < START_RETRIES:
                await anyio.sleep(START_RETRY)
        report(f"qstat -f {job.job_id} shows a walltime but no start time yet")
        return None

    def requeue_command(self, job: Job) -> list[str] | None:
        return ["qrerun", job.job_id] if job.job_id else None


class Local:
    name = "local"

    def active(self, env: Mapping[str, str]) -> bool:
        return True

    def job(self, env: Mapping[str, str]) -> Job:
        gpus = count_devices(env.get("CUDA_VISIBLE_DEVICES"))
        return Job(scheduler="local", nodes=(os.uname().nodename.split(".")[0],), gpus_per_node=gpus,
                   submit_dir=env.get("PWD"))

    async def end_time(self, job: Job, report: Report) -> float | None:
        return None

    def requeue_command(self, job: Job) -> list[str] | None:
        return None


SCHEDULERS: dict[str, Scheduler] = {s.name: s for s in (Slurm(), Pbs(), Local())}


# ---------------------------------------------------------------------------- public functions

def detect_job(env: Mapping[str, str] | None = None) -> Job:
    """The job we run in, from the environment only. Slurm first (a PBS-to-Slurm wrapper
    site exports both), then PBS, else local."""
    env = os.environ if env is None else env
    for name in ("slurm", "pbs", "local"):
        if SCHEDULERS[name].active(env):
            return SCHEDULERS[name].job(env)
    raise AssertionError("unreachable: Local is always active")


async def end_time(job: Job, report: Report | None = None) -> float | None:
    """Unix seconds when the scheduler ends the job; None without a limit or on any failure."""
    report = report or log.warning
    try:
        return await SCHEDULERS[job.scheduler].end_time(job, report)
    except Exception as exc:  # noqa: BLE001 - a scheduler query must never end the supervision
        report(f"end time of {job.scheduler} job {job.job_id}: {exc!r}")
        return None


@dataclass(frozen=True)
class JobView:
    """What the controller says of the job while it is being stopped (Slurm only).

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


async def job_view(job: Job, report: Report | None = None, timeout: float = 5.0) -> JobView | None:
    """The controller's view of this job now, or None (not Slurm, or no answer). Never raises."""
    if job.scheduler != "slurm" or not job.job_id:
        return None
    rc, out = await _run(["scontrol", "show", "job", "-o", job.job_id], timeout, report or log.warning)
    return parse_job_view(out) if rc == 0 else None


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


END_TOLERANCE = 2.0  # s: Slurm's times have a 1 s grain; an EndTime this close to the time limit is it


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


DEFAULT_KILL_WAIT = {"slurm": 30.0}  # KillWait (slurm.conf); "pbs" is set below, from PBS_KILL_DELAY
JOB_WIDE = 2.0  # a SIGCONT this close to a TERM means the scheduler signalled every process


def signalled_all(scheduler: str, sig: int | None, received: float | None, last_cont: float | None) -> bool:
    """Did Slurm's SIGCONT+SIGTERM to every process of the job (scancel, the time limit, a
    requeue) come, rather than a TERM to us alone? slurmstepd sends SIGCONT with it; then the
    launcher got that TERM too, and a TERM of ours would be its second (mpiexec abandons its
    ranks on a second TERM). Times are ``time.monotonic()``."""
    if scheduler != "slurm" or sig != signal.SIGTERM or received is None or last_cont is None:
        return False
    return abs(last_cont - received) <= JOB_WIDE


def kill_follows(scheduler: str, sig: int | None) -> bool:
    """Does MoM's SIGKILL follow this signal kill_delay later, with no SIGCONT to tell (PBS)?
    A qdel, the walltime and a qrerun all send SIGTERM to the job's session on the first node
    (supervise, when it is the session leader or the job script's exec'd child) and SIGKILL
    kill_delay later; the training, in its own session, gets neither. A TERM from elsewhere
    cannot be told apart: taken for one, the stop is only hurried."""
    return scheduler == "pbs" and sig == signal.SIGTERM


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


async def kill_wait(job: Job, report: Report | None = None) -> float | None:
    """Seconds from the scheduler's SIGTERM to the whole job to its SIGKILL; None without a
    scheduler. Slurm: ``KillWait`` from ``scontrol show config``; PBS: the job's queue's
    ``kill_delay`` (``qstat -Qf QUEUE``; a queue attribute only, default 10) less MoM's early
    KILL (``pbs_kill_wait``); else the documented default."""
    default = DEFAULT_KILL_WAIT.get(job.scheduler)
    report = report or log.warning
    if job.scheduler == "pbs":
        # PBS_QUEUE is in every job's environment (measured); qstat -f only where it is not.
        queue = job.queue or getattr(await pbs_view(job, report), "queue", None)
        delay = None
        if queue:
            rc, out = await _run(["qstat", "-Qf", queue], QUERY_TIMEOUT, report)
            delay = parse_kill_delay(out) if rc == 0 else None
        return pbs_kill_wait(delay if delay is not None else PBS_KILL_DELAY)
    if job.scheduler != "slurm":
        return default
    rc, out = await _run(["scontrol", "show", "config"], QUERY_TIMEOUT, report)
    m = re.search(r"^KillWait\s*=\s*(\d+)", out, re.M) if rc == 0 else None
    return float(m.group(1)) if m else default


async def signal_steps(job: Job, sig: int, report: Report | None = None) -> tuple[bool, str]:
    """``scancel --signal=SIG JOBID``: the signal to the tasks of every step of the job, not
    the batch shell (supervise): how srun's tasks are stopped gracefully (docs/launchers.md)."""
    if job.scheduler != "slurm" or not job.job_id:
        return False, "not a Slurm job"
    name = signal.Signals(sig).name.removeprefix("SIG")
    rc, out = await _run(["scancel", f"--signal={name}", job.job_id], QUERY_TIMEOUT, report or log.warning)
    return rc == 0, out.strip()


def requeue_command(job: Job) -> list[str] | None:
    """The argv that puts this job back in the queue; None where there is no queue."""
    return SCHEDULERS[job.scheduler].requeue_command(job)


async def requeue(job: Job, timeout: float = REQUEUE_TIMEOUT, report: Report | None = None) -> tuple[bool, str]:
    """Run the requeue command. Returns (ran, message): ran is True only on exit status 0.

    On Slurm the requeue at once sends SIGTERM to the batch shell, i.e. to us when the job
    script ``exec``s supervise: call this as the very last step of the stop sequence.
    """
    argv = requeue_command(job)
    if argv is None:
        return False, f"no requeue on a {job.scheduler} job"
    report = report or log.warning
    if job.scheduler == "pbs":
        rc, out = await _pbs_rerun(job, argv, timeout, report)
        if rc == RERUN_ACCEPTED:
            return True, f"{' '.join(argv)}: accepted (the server is rerunning the job: substate {out})"
    else:
        rc, out = await _run(argv, timeout, report)
    text = " ".join(out.split())[:500]
    if rc == 0:
        return True, f"{' '.join(argv)}: ok" + (f" ({text})" if text else "")
    return False, f"{' '.join(argv)}: " + (f"exit {rc}" if rc is not None else "did not run") + (f": {text}" if text else "")


def requeue_hint(job: Job, message: str) -> str | None:
    """What the site must change when the scheduler refused our requeue (measured messages)."""
    if job.scheduler == "pbs":
        if "Unauthorized Request" in message:
            return ("PBS lets only managers and operators qrerun a job: the site must list the job's user in the "
                    "server's operators (qmgr -c 'set server operators += USER@*'), or requeue it by hand")
        if "not rerunnable" in message:
            return "the job was submitted with qsub -r n: submit it rerunnable (-r y, the default)"
    if job.scheduler == "slurm" and "presently disabled" in message:
        return "the site disabled requeueing (JobRequeue=0) or the job was submitted with --no-requeue"
    return None


RERUN_ACCEPTED = -1  # _pbs_rerun's status when the server took the rerun before qrerun returned
RERUN_POLL = 0.25    # seconds between looks at the job's substate while qrerun runs


async def _pbs_rerun(job: Job, argv: list[str], timeout: float, report: Report) -> tuple[int | None, str]:
    """``qrerun`` of our own job. It answers only when the run has ended (measured: 6.2 s with
    kill_delay 5: the TERM, then MoM's KILL), so waiting for it would have us killed inside it.
    It is done when the server shows the job rerunning (substate 60, at once) or qrerun exits
    first (a refusal: ``Unauthorized Request``, rc 159, for a user who is not an operator;
    ``job is not rerunnable``, rc 190, with ``-r n``). Then the run may end: the server
    requeues the job when it does (cancelling the qrerun client does not undo that)."""
    result: tuple[int | None, str] = (None, f"timed out after {timeout:g}s")
    with anyio.move_on_after(timeout):
        async with anyio.create_task_group() as tg:
            async def rerun() -> None:
                nonlocal result
                result = await _run(argv, timeout, report)
                tg.cancel_scope.cancel()

            async def watch() -> None:
                nonlocal result
                while True:
                    await anyio.sleep(RERUN_POLL)
                    view = await pbs_view(job, lambda _: None)
                    if view is not None and view.rerunning:
                        result = (RERUN_ACCEPTED, str(view.substate))
                        tg.cancel_scope.cancel()

            tg.start_soon(rerun)
            tg.start_soon(watch)
    return result


EXCLUDE_RETRY = 0.25  # seconds between tries while the requeued job is still leaving RUNNING


def excluded_nodes(view_text: str) -> tuple[str, ...]:
    """``ExcNodeList=`` of ``scontrol show job -o`` output, expanded; () for ``(null)``."""
    m = re.search(r"\bExcNodeList=(\S*)", view_text)
    return () if not m or m.group(1) in ("", "(null)") else expand_hostlist(m.group(1))


async def exclude_nodes(job: Job, nodes: list[str], *, timeout: float, report: Report | None = None) -> tuple[bool, str]:
    """Add ``nodes`` to the requeued job's ``ExcNodeList`` (docs/slurm.md, "Suspect nodes").

    Slurm 22.05 refuses ``ExcNodeList+=`` ("does not accept [+|-]= syntax") and any change to a
    running job ("Job is no longer pending execution"), both measured: so this runs *after*
    ``scontrol requeue``, reads the list, and sets the union, retried until the job is pending
    (bounded by ``timeout``). PBS has no per-job exclusion a job can set on itself: (False, why)."""
    if job.scheduler != "slurm" or not job.job_id:
        return False, f"no node exclusion on a {job.scheduler} job (docs/pbs.md)"
    report = report or log.warning
    message = "not tried"
    with anyio.move_on_after(timeout):
        while True:
            rc, out = await _run(["scontrol", "show", "job", "-o", job.job_id], 5.0, report)
            if rc == 0:
                wanted = ",".join(dict.fromkeys([*excluded_nodes(out), *nodes]))
                argv = ["scontrol", "update", f"JobId={job.job_id}", f"ExcNodeList={wanted}"]
                rc, out = await _run(argv, 5.0, lambda _: None)
                message = f"{' '.join(argv)}: " + ("ok" if rc == 0 else " ".join(out.split())[:300])
                if rc == 0:
                    return True, message
            await anyio.sleep(EXCLUDE_RETRY)
    report(f"could not exclude {', '.join(nodes)}: {message}")
    return False, message


# ---------------------------------------------------------------------------- time parsing

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


def parse_walltime(text: str) -> float | None:
    """PBS ``HH:MM:SS`` (hours may exceed 24), ``MM:SS`` or plain seconds → seconds."""
    parts = text.strip().split(":")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        return None
    if not 1 <= len(nums) <= 3 or any(n < 0 for n in nums):
        return None
    total = 0.0
    for n in nums:
        total = total * 60 + n
    return total


def parse_pbs_time(text: str) -> float | None:
    """``Thu Nov 20 10:15:32 2025`` (ctime, local time) or epoch seconds → unix seconds."""
    s = " ".join(text.split())
    if s.isdigit():
        return float(s)
    try:
        return time.mktime(time.strptime(s, "%a %b %d %H:%M:%S %Y"))
    except (ValueError, OverflowError):
        return None


def parse_qstat_f(text: str) -> dict[str, dict[str, str]]:
    """``qstat -f`` output → {job id: {attribute: value}}.

    Attribute lines are ``    name = value``; a long value goes on in lines that start with
    a tab, which are glued to it without a separator (PBS breaks values anywhere, even inside
    a word). Blank lines separate jobs.
    """
    jobs: dict[str, dict[str, str]] = {}
    cur: dict[str, str] | None = None
    last: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip("\n")
        if line.startswith("Job Id:"):
            cur = jobs.setdefault(line.split(":", 1)[1].strip(), {})
            last = None
        elif cur is None or not line.strip():
            last = None if not line.strip() else last
        elif line.startswith("\t") and last is not None:
            cur[last] += line[1:].rstrip()
        else:
            name, sep, value = line.strip().partition(" = ")
            if sep:
                last = name
                cur[name] = value.rstrip()
    return jobs


def pbs_end_time(attrs: Mapping[str, str], now: float) -> float | None:
    """End of a PBS job from its ``qstat -f`` attributes: start + walltime limit.

    The start is ``stime`` (PBS Pro) or ``start_time`` (Torque-style); without one, the
    walltime already used is taken off the limit. None when there is no walltime limit.
    """
    limit = attrs.get("Resource_List.walltime")
    walltime = parse_walltime(limit) if limit else None
    if walltime is None:
        return None
    for key in ("stime", "start_time"):
        if attrs.get(key):
            start = parse_pbs_time(attrs[key])
            if start is not None:
                return start + walltime
    used = attrs.get("resources_used.walltime")
    used_s = parse_walltime(used) if used else None
    if used_s is not None:
        return now + walltime - used_s
    return None


def pbs_gpus_per_node(attrs: Mapping[str, str]) -> int | None:
    """GPUs per node from ``qstat -f`` attributes.

    ``ngpus=N`` in the first chunk of ``Resource_List.select`` (``2:ncpus=64:ngpus=4``), else
    in the first vnode of ``exec_vnode`` (Polaris' select names only ``system=polaris``),
    else ``Resource_List.ngpus`` (a job total) over ``Resource_List.nodect``.
    """
    for key in ("Resource_List.select", "exec_vnode"):
        first_chunk = attrs.get(key, "").split("+")[0]
        m = re.search(r"\bngpus=(\d+)", first_chunk)
        if m:
            return int(m.group(1))
    total, nodes = _int(attrs.get("Resource_List.ngpus")), _int(attrs.get("Resource_List.nodect"))
    if total is not None and nodes:
        return total // nodes
    return None


# ---------------------------------------------------------------------------- PBS: the job's own view

START_RETRIES, START_RETRY = 10, 1.0  # a rerun's first moment has no stime: ask again, 10 s at most
# JOB_SUBSTATE_RERUN..RERUN3 (OpenPBS src/include/job.h): the server is rerunning the job
# (``qrerun``; measured: substate 60 from the qrerun until the run ends, job_state still R).
PBS_RERUN_SUBSTATES = frozenset({60, 61, 62, 63})
# MoM's SIGKILL after its TERM comes kill_delay later by MoM's loop clock, which can be stale:
# measured gaps 0.9-3.0 s for kill_delay 3 and 5.0 s for 5 (OpenPBS 23.06, MoM polls 1/2 s),
# 11-17 s for 10 with the default polls. The wait counted on is the smaller of
# kill_delay less this and a quarter of kill_delay.
PBS_KILL_EARLY = 2.2
PBS_KILL_DELAY = 10.0  # a queue's kill_delay when unset (OpenPBS req_runjob.c)


async def pbs_attrs(job: Job, report: Report) -> dict[str, str] | None:
    """``qstat -f JOBID`` of this job as attributes; None when qstat fails or lists no such job."""
    if not job.job_id:
        return None
    rc, out = await _run(["qstat", "-f", job.job_id], QUERY_TIMEOUT, report)
    if rc != 0:
        return None
    return pbs_job_attrs(out, job.job_id, report)


def pbs_job_attrs(text: str, job_id: str, report: Report | None = None) -> dict[str, str] | None:
    """The attributes of ``job_id`` in ``qstat -f`` output (the only job listed will do)."""
    jobs = parse_qstat_f(text)
    attrs = jobs.get(job_id) or (next(iter(jobs.values())) if len(jobs) == 1 else None)
    if attrs is None and report is not None:
        report(f"qstat -f {job_id} did not list the job")
    return attrs


@dataclass(frozen=True)
class PbsView:
    """What ``qstat -f`` says of the job while it is being stopped (measured, OpenPBS 23.06).

    During a ``qdel``'s kill_delay the job stays ``job_state = R`` (substate 42) with no
    ``Exit_status``; only the ``comment`` changes, at once, to ``... and terminated by
    USER@HOST``. During a ``qrerun`` it is ``R`` with substate 60 (RERUN); ``run_count`` rises
    only when the next run starts. At the walltime's TERM nothing changes (the comment says
    ``exceeded resource walltime`` only once the job has finished)."""

    state: str | None           # job_state: R, E, Q, F, ...
    substate: int | None
    run_count: int | None       # runs so far, this one included (1 on the first)
    terminated_by: str | None   # USER@HOST of a qdel, from the comment
    queue: str | None

    @property
    def rerunning(self) -> bool:
        return self.substate in PBS_RERUN_SUBSTATES


def parse_pbs_view(attrs: Mapping[str, str] | None) -> PbsView | None:
    """``qstat -f`` attributes (``pbs_job_attrs``) → PbsView; None without a job_state."""
    if not attrs or not attrs.get("job_state"):
        return None
    # parse_qstat_f glues continuation lines without a separator: "terminated by" + "alice@head"
    m = re.search(r"\bterminated by\s*(\S+)", attrs.get("comment", ""))
    return PbsView(state=attrs["job_state"].strip(), substate=_int(attrs.get("substate")),
                   run_count=_int(attrs.get("run_count")), terminated_by=m.group(1) if m else None,
                   queue=attrs.get("queue") or None)


def pbs_reason(view: PbsView | None, was: str) -> tuple[str, bool]:
    """(reason, requeued by the scheduler) from ``qstat -f`` after a SIGTERM under PBS: a
    ``qdel`` is ``cancelled``; a ``qrerun`` (an operator's) requeues the job, whatever we took
    the TERM for (kept, as under Slurm: a deadline stays one, else a preemption); anything else
    (the walltime: nothing changes) stays what the signal's timing said."""
    if view is None:
        return was, False
    if view.rerunning:
        return ("deadline" if was == "deadline" else "preempted"), True
    if view.terminated_by is not None:
        return "cancelled", False
    return was, False


def pbs_restart_count(attrs: Mapping[str, str] | None) -> int | None:
    """Reruns before this run: ``run_count`` − 1 (qstat -f only; PBS sets no variable)."""
    count = _int((attrs or {}).get("run_count"))
    return max(0, count - 1) if count is not None else None


def parse_kill_delay(text: str) -> float | None:
    """``kill_delay`` of ``qstat -Qf QUEUE`` output (seconds); None when the queue has none set."""
    m = re.search(r"^\s*kill_delay\s*=\s*(\d+)\s*$", text, re.M)
    return float(m.group(1)) if m else None


def pbs_kill_wait(kill_delay: float) -> float:
    """The TERM→KILL wait to count on for a queue's ``kill_delay`` (PBS_KILL_EARLY)."""
    return round(max(0.25 * kill_delay, kill_delay - PBS_KILL_EARLY), 3)


DEFAULT_KILL_WAIT["pbs"] = pbs_kill_wait(PBS_KILL_DELAY)  # 7.8 s: a queue that sets no kill_delay


def pbs_restart_count_now(job: Job, timeout: float = QUERY_TIMEOUT) -> int | None:
    """This PBS job's reruns so far, from ``qstat -f`` (blocking: for the plan, before the
    event loop). None when not PBS or qstat does not answer."""
    if job.scheduler != "pbs" or not job.job_id:
        return None
    try:
        proc = subprocess.run(["qstat", "-f", job.job_id], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("qstat -f %s: %s", job.job_id, exc)
        return None
    if proc.returncode != 0:
        log.warning("qstat -f %s exited %d: %s", job.job_id, proc.returncode, " ".join(proc.stderr.split())[:200])
        return None
    return pbs_restart_count(pbs_job_attrs(proc.stdout, job.job_id, log.warning))


async def pbs_view(job: Job, report: Report | None = None) -> PbsView | None:
    """What ``qstat -f`` says of this PBS job now; None when not PBS or no answer. Never raises."""
    if job.scheduler != "pbs" or not job.job_id:
        return None
    return parse_pbs_view(await pbs_attrs(job, report or log.warning))


# ---------------------------------------------------------------------------- subprocess

async def _run(argv: list[str], timeout: float, report: Report) -> tuple[int | None, str]:
    """Run argv with a deadline, stdin closed: (exit status, stdout), or (status, stderr +
    stdout) when it failed, or (None, why) when it did not run or answer in time."""
    try:
        with anyio.fail_after(timeout):
            # Its own session: PBS's TERM goes to every process of the job's session (a qstat in
            # flight at a qdel died of it, measured), and the answer is wanted after that TERM.
            result = await anyio.run_process(argv, check=False, stdin=subprocess.DEVNULL, start_new_session=True)
    except TimeoutError:
        report(f"{argv[0]} did not answer within {timeout:g}s")
        return None, f"timed out after {timeout:g}s"
    except OSError as exc:
        report(f"cannot run {argv[0]}: {exc.strerror or exc}")
        return None, str(exc.strerror or exc)
    out = result.stdout.decode(errors="replace")
    if result.returncode != 0:
        out = result.stderr.decode(errors="replace") + out
        report(f"{' '.join(argv)} exited {result.returncode}: {' '.join(out.split())[:200]}")
    return result.returncode, out
