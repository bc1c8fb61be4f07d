"""The stop policy: what the conductor decides, apart from how it acts (docs/design.md).

As torch elastic's agent keeps ``_invoke_run`` (deciding) apart from ``PContext`` (acting),
every decision of the stop sequence is a pure function here: why a signal came, how long
each step may take, which signal stops the training, whether a published checkpoint is
the one that was asked for, whether to signal a tree that is already leaving, whether to
requeue, which notification tells the end, and the exit status. No I/O, no clock: every
time is an argument. tests/core/test_conductor.py drives them through a fake run.
"""

from __future__ import annotations

import enum
import math
import signal
from dataclasses import dataclass
from typing import Mapping

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
PASS_SIGNALS = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
SAFETY = 5.0  # seconds kept in hand before the job's end for the last steps


class State(str, enum.Enum):
    """The worker group's states, named as torch.distributed.elastic names its own."""

    STARTING = "starting"
    RESTORING = "restoring"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Reason(str, enum.Enum):
    """Why the run ended. Each is distinct in the journal and in the report."""

    DEADLINE = "deadline"  # the time limit approached (our watch, or the warn signal)
    PREEMPTED = "preempted"  # SIGTERM before the deadline: the scheduler wants the node back
    CANCELLED = "cancelled"  # scancel, qdel, Ctrl-C (INT), QUIT
    CHILD_EXIT = "child-exit"  # the training ended by itself with status 0
    CHILD_FAILED = "child-failed"  # the training ended by itself with a non-zero status
    SPAWN_FAILED = "spawn-failed"  # the command could not be started (127/126)
    HANG = "hang"  # the hang watchdog stopped the run (hang_action = stop)
    ERROR = "supervisor-error"  # the supervisor itself failed; the child is stopped safely
    NODE_FAILED = "node-failed"  # a node of the job died (the scheduler calls it down): not the training's fault


REQUEUE_REASONS = frozenset({Reason.DEADLINE, Reason.PREEMPTED, Reason.HANG, Reason.NODE_FAILED})
# A hung training cannot answer a checkpoint request: the hang stop is checkpoint-free; nor can
# ranks whose collective lost a node.
NO_CHECKPOINT = frozenset({Reason.CHILD_EXIT, Reason.CHILD_FAILED, Reason.SPAWN_FAILED, Reason.CANCELLED, Reason.HANG,
                           Reason.NODE_FAILED})
END_NOTICE = {Reason.CHILD_EXIT: "finished", Reason.CHILD_FAILED: "failed", Reason.SPAWN_FAILED: "failed",
              Reason.ERROR: "failed", Reason.HANG: "failed", Reason.PREEMPTED: "preempted",
              Reason.DEADLINE: "preempted", Reason.CANCELLED: "preempted", Reason.NODE_FAILED: "preempted"}


@dataclass(frozen=True)
class Trigger:
    """What started the stop sequence."""

    reason: Reason
    detail: str = ""
    signal: signal.Signals | None = None
    at: float = 0.0  # time.monotonic()


NO_TRIGGER = Trigger(Reason.ERROR, "ended without a trigger")


def caught_signals(warn: signal.Signals | None, checkpoint: signal.Signals | None) -> set[signal.Signals]:
    """What the agent's receiver takes: stop and pass-on signals, SIGCONT (Slurm's tell), and
    the warn and checkpoint signals, which may be any of _units.OPTION_SIGNALS (ALRM killed us)."""
    return {*STOP_SIGNALS, *PASS_SIGNALS, signal.SIGCONT, *(s for s in (warn, checkpoint) if s is not None)}


def classify_signal(sig: signal.Signals, *, warn_signal: signal.Signals | None, end: float | None,
                    now: float) -> Reason:
    """TERM near the end is the time limit; TERM before it a preemption; the warn signal the
    deadline; INT and QUIT a person. The scheduler's view refines it later (``job.sched.refine_reason``)."""
    if sig == warn_signal:
        return Reason.DEADLINE
    if sig != signal.SIGTERM:
        return Reason.CANCELLED
    if end is not None and now >= end - 2 * SAFETY:
        return Reason.DEADLINE
    return Reason.PREEMPTED


def killed_at(trigger: Trigger | None, *, scheduler_signalled_all: bool, kill_wait: float | None,
              now: float, mono: float) -> float | None:
    """Unix time of the SIGKILL that follows a job-wide TERM from the scheduler, when one came."""
    if trigger is None or kill_wait is None or not scheduler_signalled_all:
        return None
    return now - (mono - trigger.at) + kill_wait


def hard_kill(*, end: float | None, kill: float | None) -> float | None:
    """When the SIGKILL comes: KillWait after a job-wide TERM, else the job's end. The TERM's
    KillWait holds even past the end: the time limit's TERM can come late (docs/slurm.md), and
    its SIGKILL still follows it by KillWait, so "past the end" is not "already killed"."""
    return kill if kill is not None else end


def kill_fields(*, end: float | None, kill: float | None, kill_wait: float | None, now: float) -> dict[str, object]:
    """For the ``stop`` event (the report's margins): when the hard kill comes, and why."""
    if kill is None:
        return {}
    if kill != end:
        return {"kill_in_s": round(kill - now, 3), "kill_by": "kill-wait", "kill_wait_s": kill_wait}
    return {"kill_in_s": round(kill - now, 3), "kill_by": "time-limit"}


STOP_BUDGET = 30.0  # seconds a signalled stop has when neither the end nor the kill delay is known (docs/slurm.md)


def stop_budget(*, end: float | None, kill_wait: float | None, now: float) -> float:
    """The time a stop started by a signal has (issue 22): until the known end; else the
    scheduler's kill delay (Slurm ``KillWait``, PBS ``kill_delay``), since the signal that
    asked us to stop is followed by SIGKILL that much later; else ``STOP_BUDGET``. A copier
    hung on a stale mount must not keep ``end`` from being written."""
    if end is not None:
        return max(0.0, end - now)
    return kill_wait if kill_wait is not None else STOP_BUDGET


BUDGETED_EXITS = frozenset({Reason.CHILD_EXIT, Reason.CHILD_FAILED})


def has_stop_budget(trigger: Trigger) -> bool:
    """Is this stop bounded by ``stop_budget`` when the end is unknown? One a stop signal
    started (a SIGKILL follows it), and one the training's own exit started (issue 30: a
    copier hung on a stale mount held the job past a normal exit, with no ``end``)."""
    return trigger.signal in STOP_SIGNALS or trigger.reason in BUDGETED_EXITS


def time_left(*, end: float | None, kill: float | None, lead: float, kill_wait: float | None, now: float,
              signalled_for: float | None = None) -> float:
    """Seconds the remaining steps may take before the job is killed (inf if never). A few
    seconds are kept in hand for the journal's last lines; less when the window is short.
    ``signalled_for``: seconds since the start of a stop that has a budget
    (``has_stop_budget``: a stop signal, the training's own exit); then an unknown end
    still leaves only ``stop_budget``."""
    if kill is not None:
        return max(0.0, kill - now - min(SAFETY, 0.2 * (kill_wait or 0.0)))
    if end is None:
        if signalled_for is None:
            return math.inf
        budget = stop_budget(end=None, kill_wait=kill_wait, now=now)
        return max(0.0, budget - signalled_for - min(SAFETY, 0.2 * budget))
    return max(0.0, end - now - min(SAFETY, 0.1 * lead))


def checkpoint_bound(timeout: float, left: float, grace: float) -> float:
    """How long to wait for the requested checkpoint: time is kept to stop the training."""
    return min(timeout, left - min(grace, 0.25 * left))


SPARE_FLUSH_S = 15.0  # a node died and a spare is there: each flush (before and after the stop) waits no longer


def flush_bound(left: float, grace: float, *, child_running: bool, spare: bool = False) -> float:
    """The flush before the stop keeps time for the grace period; the final one takes all.
    After a node's death with a spare to go on with (``spare``), at most ``SPARE_FLUSH_S`` each: a
    hung persistent side would otherwise hold the spare back for the whole time left, while
    what it did not take is on the nodes' disks, where the next attempt chooses it from (issue 43)."""
    bound = left - (min(grace, 0.25 * left) if child_running else 0.0)
    return min(bound, SPARE_FLUSH_S) if spare else bound


def grace_for(grace: float, left: float, *, already_signalled: bool, since_trigger: float) -> float:
    """The one place the grace period is computed: ``--grace``, no more than the time left
    (at least 1 s), and when the scheduler already sent its TERM to the whole tree, what is
    left of the grace since then."""
    g = min(grace, max(1.0, left))
    if already_signalled:
        g = max(0.0, min(g, grace - since_trigger))
    return round(g, 3)


RESTART_GRACE = 10.0  # seconds at most a crashed training's leftovers get before an in-place restart
EXIT_WAIT = 5.0  # seconds past the grace (and its SIGKILL) to see the launcher's exit
EMERGENCY_SLACK = 10.0  # seconds past the grace an emergency stop (after a supervisor error) may take


def restart_grace(grace: float) -> float:
    """The grace of a restart in place: the training already exited, only leftovers remain."""
    return min(grace, RESTART_GRACE)


def exit_wait(grace: float) -> float:
    """How long the stop step waits for the launcher's exit after its stop with ``grace``."""
    return grace + EXIT_WAIT


def emergency_bound(grace: float) -> float:
    """The whole emergency stop's bound: the grace, then the SIGKILL of the tree."""
    return grace + EMERGENCY_SLACK


def stop_signal_for(*, configured: signal.Signals | None, launcher_signal: signal.Signals, plain: bool,
                    trigger_signal: signal.Signals | None) -> signal.Signals:
    """``--stop-signal`` when given; else a plain process gets the stop signal the person
    sent (INT stays INT), and a launcher the one its profile says stops it cleanly."""
    if configured is not None:
        return configured
    if plain and trigger_signal in STOP_SIGNALS:
        return trigger_signal  # type: ignore[return-value]
    return launcher_signal


def signal_checkpoint(*, scheduler_signalled_all: bool) -> bool:
    """After the scheduler's TERM to every process, the training is already saving and
    leaving: a checkpoint signal now could kill a rank past its handler (it exits 138)."""
    return not scheduler_signalled_all


def is_requested(done_at: float | None, requested_at: float) -> bool:
    """A published checkpoint answers the request only when it was completed after it."""
    return done_at is not None and done_at >= requested_at


Ident = tuple[str, int]  # a checkpoint's top-level name and inode (a rename keeps the inode)


def started_after_request(ident: Ident | None, in_progress: frozenset[Ident]) -> bool:
    """The answer to a checkpoint request is a checkpoint that *started* after it (issue 22):
    never one already being written when it came (``in_progress``: the entries incomplete at
    the request), under its name or, renamed into place (``tmp-checkpoint-N`` →
    ``checkpoint-N``), its inode. A periodic save finishing just after the request is due
    anyway and says nothing about the request. No identity (a multi-node part) is no evidence
    against it."""
    if ident is None:
        return True
    name, inode = ident
    return all(name != n and inode != i for n, i in in_progress)


def wants_checkpoint(reason: Reason) -> bool:
    return reason not in NO_CHECKPOINT


def requeue_decision(reason: Reason, *, requeue: bool, on_failure: bool, queued: bool, already: bool,
                     restart_count: int, max_requeues: int, suspect: bool = False) -> tuple[bool, str]:
    """(requeue?, why not). ``queued``: the run is a batch job, with a queue to go back to
    (``Scheduler.is_batch``). A crash on a suspect node (a GPU fault) is requeued elsewhere."""
    if not requeue:
        return False, "requeue is off"
    if reason not in REQUEUE_REASONS and not ((on_failure or suspect) and reason == Reason.CHILD_FAILED):
        return False, f"not after {reason.value}"
    if not queued:
        return False, "no scheduler to requeue with"
    if already:
        return False, "the scheduler already requeued the job"
    if restart_count >= max_requeues:
        return False, f"max_requeues {max_requeues} reached"
    return True, ""


NODE_DOWN_WAIT = 30.0  # seconds at most a silent node waits for the scheduler to call it down (Slurm here: 6-12 s)


def replace_decision(reason: Reason, *, lost: list[str], leader_lost: bool, spares: int, replaced: int,
                     max_replacements: int | None) -> tuple[bool, str]:
    """(go on inside the allocation on spare nodes?, why not) after a stop (issue 41). Only a
    node's death, never the batch node's (the batch script, and supervise, died with it), with a
    spare for each dead node, and fewer than ``max_replacements`` (None: as many as the spares
    the job started with) replacements so far; otherwise the requeue decides as without spares."""
    if reason != Reason.NODE_FAILED or not lost:
        return False, f"not after {reason.value}"
    if leader_lost:
        return False, "the batch node died"
    if spares < len(lost):
        return False, "no spare node left" if spares == 0 else f"{len(lost)} nodes lost, {spares} spare left"
    limit = replaced + spares if max_replacements is None else max_replacements
    if replaced + len(lost) > limit:
        return False, f"max_node_replacements {limit} reached"
    return True, ""


STOPPED_AUTO = "auto"  # ``stopped_status`` left to supervise: 0 when requeued, UNFINISHED_STATUS when not
# Reasons after which the training did not finish by itself: supervise, the scheduler or a person stopped it.
UNFINISHED = frozenset({Reason.DEADLINE, Reason.PREEMPTED, Reason.CANCELLED, Reason.HANG, Reason.ERROR,
                        Reason.NODE_FAILED})
UNFINISHED_STATUS = 75  # stopped before it finished and not requeued (sysexits' EX_TEMPFAIL: go on later; docs/slurm.md)
NOT_DURABLE_STATUS = 74  # ended with checkpoints or logs not on persistent storage (sysexits' EX_IOERR; docs/slurm.md)


def exit_status(child_status: int | None, trigger: Trigger, *, stopped_cleanly: bool = False,
                stopped_status: int | str | None = STOPPED_AUTO, requeued: bool = False, no_progress: bool = False,
                not_durable: bool = False, not_durable_status: int | None = NOT_DURABLE_STATUS) -> int:
    """What supervise exits with (docs/slurm.md, "Exit status of a stop"), the first rule that holds:

    1. ``NO_PROGRESS_STATUS`` (3) for a run given up on;
    2. a requeued job (by supervise, or already by the scheduler) keeps what the requeue needs:
       0 after a clean stop (``stopped_cleanly``), or ``stopped_status`` when set to a status
       or "child" (None: the launcher's); else the training's;
    3. ``not_durable_status`` (74; None: no such rule) when something is not on persistent
       storage at the end (``end.not_durable``) and the run would otherwise look successful:
       a clean stop, or a training that said 0 (a training that failed keeps its status);
    4. a clean stop: ``stopped_status`` when set to a status, whatever the launcher said
       (torchrun exits 1 after a TERM even when every rank saved and exited 0); None
       ("child") keeps the launcher's;
    5. with ``stopped_status`` "auto", ``UNFINISHED_STATUS`` (75) for a training left
       unfinished (``UNFINISHED``) by a clean stop or one it answered with 0: 0 would tell
       ``--dependency=afterok`` that the training is done;
    6. the training's status; 128+N when signal N stopped us before it ran; else 1."""
    if no_progress:
        return NO_PROGRESS_STATUS
    explicit = stopped_status != STOPPED_AUTO
    if child_status is not None:
        status = child_status
    else:
        status = 128 + trigger.signal if trigger.signal is not None else 1
    if requeued:
        if stopped_cleanly and stopped_status is not None:
            return int(stopped_status) if explicit else 0
        return status
    if not_durable and not_durable_status is not None and (stopped_cleanly or status == 0):
        return not_durable_status
    if stopped_cleanly and explicit:
        return status if stopped_status is None else int(stopped_status)
    if not explicit and trigger.reason in UNFINISHED and (stopped_cleanly or status == 0):
        return UNFINISHED_STATUS
    return status


def owed(not_durable: list[str]) -> bool:
    """Is anything in ``end.not_durable`` something that could have been made durable? Every line
    but a torn checkpoint's (``… (torn: …; never published)``: the training died writing it, so
    nothing of it can be): a torn leftover of an earlier attempt must not fail a run whose own
    checkpoints all landed."""
    return any(" (torn: " not in line for line in not_durable)


def died_of_stop_signal(status: int | None) -> bool:
    """The training's exit status says a stop signal (TERM, INT, HUP, KILL) ended it: 128+N,
    as ``exit_status`` turns a death by signal N. A scheduler's job-wide TERM looks like this."""
    return status is not None and status - 128 in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL)


# ---- issue 15: warning signals, answered requests, clean stops, runs that cannot progress ----

NEAR_END = 300.0  # a checkpoint signal this close to a known end means "the end is near" (docs/slurm.md)
PERIODIC_TOLERANCE = 0.15  # share of the save period within which a save is "the next periodic one"


def signal_action(sig: signal.Signals, *, warn_signal: signal.Signals | None, checkpoint_signal: signal.Signals,
                  end: float | None, now: float, lead: float) -> str:
    """What a delivered warning-like signal means (docs/slurm.md, "Warning signals").

    The warn signal (USR2 by default), and the checkpoint signal (USR1) within ``NEAR_END``
    (or twice the lead) of a known end, say "the end is near": ``stop`` at once, or ``defer``
    when the end is known and further away than the lead: the deadline watch stops at end −
    lead, so an early ``--signal=B:USR1@N`` (Slurm sends it up to 60 s early) does not cut
    the training short. Anything else with the checkpoint signal is a ``checkpoint`` request;
    other signals are ``forward``ed (STOP_SIGNALS never reach here)."""
    near = end is not None and end - now <= max(NEAR_END, 2 * lead)
    if sig == warn_signal or (sig == checkpoint_signal and near):
        return "defer" if end is not None and end - now > lead + 1.0 else "stop"
    return "checkpoint" if sig == checkpoint_signal else "forward"


def answered_request(saves: list[float], asked_at: float, done_at: float | None) -> bool | None:
    """Whether the checkpoint completed after the request answered it (True), or was only the
    training's next periodic save, due then anyway (False); None when no rhythm is known (fewer
    than two saves before the request). ``saves``: when earlier checkpoints were published. A
    save done within the tolerance of the request cannot be told from a prompt answer by its
    time; it counts as answered (the stop already took only a checkpoint *started* after the
    request: ``started_after_request``)."""
    before = sorted(t for t in saves if t < asked_at)
    if done_at is None or len(before) < 2:
        return None
    gaps = sorted(b - a for a, b in zip(before, before[1:]))
    period = gaps[len(gaps) // 2]
    tolerance = max(PERIODIC_TOLERANCE * period, 0.2)
    due = before[-1] + period
    while due < asked_at - tolerance:  # a save may have been skipped
        due += period
    return not (done_at - asked_at > tolerance and abs(done_at - due) <= tolerance)


def stopped_cleanly(reason: Reason, steps: dict[str, dict[str, object]]) -> bool:
    """supervise stopped the training for a deadline or a preemption, the requested checkpoint is
    durable, the flushes finished, and every process ended within the grace (no SIGKILL). A stop
    without a requested checkpoint (Ctrl-C, scancel, a hang: a hung training cannot save) keeps the
    child's status."""
    if reason in NO_CHECKPOINT or reason == Reason.ERROR:
        return False
    cp, stop = steps.get("checkpoint", {}), steps.get("stop-child", {})
    if cp.get("outcome") != "published":
        return False
    if any(steps.get(s, {}).get("outcome") not in (None, "done") for s in ("flush", "final-flush")):
        return False
    return bool(stop.get("graceful")) and not stop.get("killed") and "error" not in stop


def no_progress(progress: list[bool], attempts: int) -> bool:
    """The newest durable checkpoint has not advanced over the last ``attempts`` attempts
    (``progress``: one bool per attempt, oldest first, this one last); 0 turns it off."""
    return attempts > 0 and len(progress) >= attempts and not any(progress[-attempts:])


NO_PROGRESS_STATUS = 3  # the exit status of a run not requeued because it made no progress (docs/slurm.md)


def progress_by_attempt(events: list[dict[str, object]]) -> list[bool]:
    """Per attempt seen in the journal (oldest first): was a checkpoint published in it?"""
    seen: dict[int, bool] = {}
    for e in events:
        a = e.get("attempt")
        if not isinstance(a, int):
            continue
        if e.get("kind") == "start":
            seen.setdefault(a, False)
        elif e.get("kind") == "publish" and not e.get("pointer"):
            seen[a] = True
    return [seen[a] for a in sorted(seen)]


# XIDs that say the GPU, not the training, failed: 48 double-bit ECC, 64 row-remap failure,
# 79 fallen off the bus, 94/95 contained/uncontained ECC (NVIDIA's XID catalogue).
SUSPECT_XIDS = frozenset({48, 64, 79, 94, 95})


def gpu_fault(kind: str, fields: Mapping[str, object]) -> str | None:
    """Why a GPU event makes this node suspect, or None."""
    if kind == "gpu-xid" and fields.get("xid") in SUSPECT_XIDS:
        return f"XID {fields['xid']} on GPU {fields.get('device')}"
    if kind == "gpu-lost":
        return f"GPU {fields.get('device')} lost"
    return None


def exclude_node(reason: Reason, faults: list[str]) -> list[str]:
    """Why the requeued job must leave this node behind: its GPU faults, or a hang here."""
    return faults + (["hang"] if reason == Reason.HANG else [])


def restart_in_place(status: int, *, restarts: int, max_restarts: int, faults: list[str]) -> bool:
    """The health gate: a crash is restarted on the same GPUs only when no GPU fault was seen."""
    return status != 0 and restarts < max_restarts and not faults


HANG_FACTOR = 5.0   # a hang is this many times the longest normal gap between progress marks…
HANG_MIN_GAPS = 5   # …once this attempt has seen this many gaps, or an earlier attempt taught one


def hang_bound(hang_after: float | None, gaps: list[float], earlier: list[float],
               floor: float) -> tuple[float, float | None]:
    """(seconds of no progress that make a hang, the learned part or None). Learned from the
    longest gap between progress marks (checkpoints, log growth, busy GPUs) of earlier attempts
    and, once it has ``HANG_MIN_GAPS``, of this one, smoothed (EWMA, oldest first), times
    ``HANG_FACTOR``, never under ``floor`` (``hang_floor``); ``hang_after`` is the upper bound,
    and with none (the default) nothing is a hang until progress marks were seen: a run that
    logs rarely or checkpoints hourly is never stopped for it (docs/slurm.md, "Hangs")."""
    limit = math.inf if hang_after is None else hang_after
    longest = [*earlier, max(gaps)] if len(gaps) >= HANG_MIN_GAPS else list(earlier)
    if not longest:
        return limit, None
    s = longest[0]
    for v in longest[1:]:
        s = 0.5 * v + 0.5 * s
    learned = HANG_FACTOR * s
    return min(limit, max(floor, learned)), round(learned, 3)


GATE_HELD = 256 * 2**20  # bytes: GPU memory still in use after a crash beyond this fails the health gate


def gpu_memory_freed(held: int | None) -> bool:
    """The crashed training's GPU memory is free again (unknown counts as free)."""
    return held is None or held <= GATE_HELD
