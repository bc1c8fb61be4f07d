"""Turn what was read into the facts a researcher asks for after the job.

Did it finish, how often was it requeued and why, is every checkpoint safe, did the GPUs
work. Everything here is plain data (dataclasses), rendered as text, JSON or HTML by
the other modules, so the three outputs can never disagree.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from supervisor._units import natural_key
from supervisor.report._goodput import Goodput, goodput, is_checkpoint, step_of
from supervisor.report._load import GpuAcc, RunData
from supervisor.report._nodes import NodeRow, node_events, partless_nodes, silent_node
from supervisor.sched import label_of, recorded

FAILED = {"child-failed", "spawn-failed", "supervisor-error", "hang"}
EARLY = {"deadline", "preempted"}  # the work is not done; a next attempt resumes it
LEARNED_STEPS = ("checkpoint", "flush")  # the steps --warn-before must leave time for
GPU_KINDS = frozenset({"gpu-start", "gpu-end", "gpu-xid", "gpu-lost"})  # the events _gpu reads
THROTTLE_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")


@dataclass
class StopStep:
    step: str
    seconds: float
    outcome: str | None  # published, done, timeout, … or the reason a step was skipped
    graceful: bool | None = None
    killed: list[int] = field(default_factory=list)


@dataclass
class StopSequence:
    attempt: int
    t: float
    reason: str
    detail: str | None
    signal: str | None
    time_left_s: float | None  # before the job's end, when the stop began
    steps: list[StopStep]
    seconds: float  # from the stop's start to the last step's end
    margin_s: float | None  # left before the hard kill when the sequence was done
    kill_in_s: float | None = None  # the hard kill came this long after the stop's start
    kill_by: str | None = None  # "kill-wait" (KillWait after the scheduler's TERM) or "time-limit"


@dataclass
class Attempt:
    number: int
    start: float | None
    end: float | None
    seconds: float | None
    host: str | None
    job_id: str | None
    scheduler: str | None
    reason: str | None  # the end's reason; None while running (or killed before `end`)
    detail: str | None
    exit_status: int | None
    restarts: int  # in-place restarts of a crashed training
    requeued: bool | None  # the job went back to the queue after it: by supervise or by the scheduler
    restored_from: str | None
    time_limit_s: float | None
    warn_lead_s: float | None
    signals: list[str]
    gpu_none: str | None
    came_by: str | None = None  # how an attempt after the first came: "requeue" (the scheduler's) or "rerun"
    restore: str | None = None  # what became of the restored checkpoint (RestoreOutcome.text)
    exit_note: str | None = None  # why an exit status that looks like a failure is not one
    nodes: list[str] = field(default_factory=list)  # the allocation, when several nodes (multi-node jobs)
    lost_nodes: list[str] = field(default_factory=list)  # nodes of the attempt before that died (`node-lost`)
    replaced: list[str] = field(default_factory=list)  # dead nodes this attempt replaced with spares (`node-replaced`)


@dataclass
class Verdict:
    status: str  # finished, failed, cancelled, stopped, requeued, running, killed (torn, no end), empty
    headline: str
    attempts: int
    requeues: int  # attempts the scheduler requeued
    reasons: list[str]  # each attempt's end reason, in order
    reruns: int = 0  # attempts started again into the same run directory without a requeue
    local_only: str | None = None  # said first: what is only on local disk at the end


@dataclass
class LastCheckpoint:
    pair: str
    name: str
    t: float
    attempt: int


@dataclass
class RestoreOutcome:
    attempt: int
    pair: str
    checkpoint: str | None
    outcome: str  # resumed, not-resumed, unverified, refused, failed, none; nodes-agree, nodes-differ (multi-node)
    text: str  # one line for the report


@dataclass
class Checkpoints:
    pairs: list[str]
    published: int  # distinct checkpoints made durable
    versions: int  # publishes: a checkpoint rewritten and published again is another version
    lag_p50_s: float | None
    lag_p95_s: float | None
    interval_s: float | None  # median time between two new checkpoints
    last: LastCheckpoint | None
    not_durable: list[str]  # what the last attempt could not make durable
    sync_failures: int
    restores: list[RestoreOutcome]
    copy_p95_s: float | None = None  # the sync passes that published: the copy alone
    settled: int = 0  # checkpoints with no marker: durable only after the settle time
    torn: list[str] = field(default_factory=list)  # checkpoints the training died in the middle of
    profiles: list[str] = field(default_factory=list)  # sync-profile: what completeness rests on
    peer: PeerCopies | None = None  # the ring's copies (peer_copies), from every node's journal


@dataclass
class PeerCopies:
    """The ring (``peer-copy``, ``peer-copy-failed`` in every node's journal): versions copied
    to a partner node, and each one's single-copy exposure (its save → the partner's whole copy)."""

    copies: int
    exposure_p50_s: float | None
    exposure_p99_s: float | None
    failed: int


@dataclass
class Gpu:
    index: int  # the job's GPU (NVML index), over all attempts
    uuids: list[str]  # the devices it was, attempt after attempt (one, unless a requeue moved nodes)
    name: str | None
    samples: int
    util_mean_pct: float | None
    util_p95_pct: float | None
    mem_peak_mib: float | None
    mem_total_mib: float | None
    mem_peak_pct: float | None
    proc_mem_peak_mib: float | None
    power_mean_w: float | None
    power_max_w: float | None
    energy_kwh: float | None
    temp_max_c: float | None
    sampled_s: float
    throttled_s: dict[str, float]  # clock-event reason → seconds
    xids: list[int]
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    lost: bool
    faulty: list[str]  # "<uuid> on <host>" of each device with an XID, uncorrected ECC or loss


@dataclass
class Host:
    samples: int
    cpu_mean_pct: float | None  # % of one core
    cpu_max_pct: float | None
    rss_peak_mib: float | None
    nprocs_max: int
    node_mem_total_mib: float | None
    node_mem_min_available_mib: float | None
    mem_requested_mib: float | None  # from the scheduler's environment, when it says


@dataclass
class Note:
    level: str  # bad, warn, info
    text: str  # what was seen, and the concrete fix


@dataclass
class Facts:
    run_dir: str
    job: dict[str, Any]
    verdict: Verdict
    attempts: list[Attempt]
    stops: list[StopSequence]
    checkpoints: Checkpoints
    gpus: list[Gpu]
    gpu_none: list[str]
    host: Host | None
    journal: dict[str, Any]
    requeue_refused: list[dict[str, Any]] = field(default_factory=list)
    goodput: Goodput | None = None
    notes: list[Note] = field(default_factory=list)
    nodes: list[NodeRow] = field(default_factory=list)  # multi-node runs: one row per host (_nodes)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of a small list."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, -(-int(q * 100) * len(s) // 100) - 1))]


PEER_KINDS = frozenset({"peer-copy", "peer-copy-failed"})


def _peer_copies(events: list[dict[str, Any]]) -> PeerCopies | None:
    copies = [float(e["exposure_s"]) for e in events if e.get("kind") == "peer-copy" and _num(e.get("exposure_s")) is not None]
    failed = sum(1 for e in events if e.get("kind") == "peer-copy-failed")
    if not copies and not failed:
        return None
    return PeerCopies(copies=len(copies), exposure_p50_s=pct(copies, 0.50), exposure_p99_s=pct(copies, 0.99), failed=failed)


def build(data: RunData) -> Facts:
    events = data.journal.events
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        by_attempt.setdefault(int(e.get("attempt") or 0), []).append(e)
    attempts = [_attempt(n, evs) for n, evs in sorted(by_attempt.items())]
    _how_they_came(attempts, by_attempt)
    stops = [s for n, evs in sorted(by_attempt.items()) for s in _stops(n, evs)]
    first_start = next((e for e in events if e.get("kind") == "start"), {})
    checkpoints = _checkpoints(events, attempts, partless_nodes(data.run_dir, events))
    checkpoints.peer = _peer_copies(events + node_events(data.run_dir, PEER_KINDS))
    gpu_events = [e for e in events if e.get("kind") in GPU_KINDS]  # _gpu's, once, not once per GPU
    for r in checkpoints.restores:
        for a in attempts:
            if a.number == r.attempt and r.checkpoint and r.outcome != "nodes-agree":
                a.restore = r.text.split(": ", 1)[1]
    return Facts(
        run_dir=str(data.run_dir),
        job={k: first_start.get(k) for k in ("job_id", "job_name", "scheduler", "user", "host", "command", "cwd", "version")},
        verdict=_verdict(attempts, torn=data.journal.torn_last_line is not None, not_durable=checkpoints.not_durable,
                         kept=_kept(events, attempts)),
        attempts=attempts,
        stops=stops,
        checkpoints=checkpoints,
        gpus=[_gpu(g, gpu_events, {a.number: a.host for a in attempts}) for g in data.gpus],
        gpu_none=_gpu_none(attempts),
        goodput=goodput(events, len(data.gpus)),
        host=_host(data, first_start),
        journal={"events": len(events), "torn_last_line": data.journal.torn_last_line is not None,
                 "bad_lines": data.journal.bad_lines, "gpu_bad_rows": data.gpu_bad_rows,
                 "host_bad_rows": data.host_bad_rows, "malformed_events": data.malformed_events},
        requeue_refused=[{k: e.get(k) for k in ("attempt", "restart_count", "max_requeues", "why", "attempts")}
                         for e in events if e.get("kind") == "requeue-refused"],
    )


def _attempt(n: int, evs: list[dict[str, Any]]) -> Attempt:
    def first(kind: str) -> dict[str, Any]:
        return next((e for e in evs if e.get("kind") == kind), {})

    start, end = first("start"), first("end")
    deadlines = [e for e in evs if e.get("kind") == "deadline"]
    last_deadline = deadlines[-1] if deadlines else {}
    t_start = _num(start.get("t")) or _num(evs[0].get("t"))
    limit = None
    if _num(last_deadline.get("end")) and t_start is not None and last_deadline.get("source") != "none":
        limit = last_deadline["end"] - t_start
    requeue = next((e for e in evs if e.get("kind") == "stop-step" and e.get("step") == "requeue"), {})
    restore = next((e for e in evs if e.get("kind") == "restore" and e.get("checkpoint")), {})
    gpu_none = first("gpu-none").get("reason") if not first("gpu-start") else None
    return Attempt(
        number=n, start=t_start, end=_num(end.get("t")),
        seconds=_num(end.get("seconds")) or (evs[-1]["t"] - t_start if t_start is not None else None),
        host=start.get("host"), job_id=start.get("job_id"), scheduler=start.get("scheduler"),
        reason=end.get("reason"), detail=end.get("detail"), exit_status=end.get("exit_status"),
        restarts=sum(1 for e in evs if e.get("kind") == "restart"),
        requeued=requeue.get("requeued") if "requeued" in requeue else None,
        restored_from=restore.get("checkpoint"), time_limit_s=limit, warn_lead_s=_num(last_deadline.get("lead_s")),
        signals=[str(e.get("signal")) for e in evs if e.get("kind") == "signal"],
        gpu_none=gpu_none,
        exit_note=_exit_note(start, end, evs),
        nodes=[str(n) for n in start.get("nodes") or []] if len(start.get("nodes") or []) > 1 else [],
        lost_nodes=[_lost_node(e) for e in evs if e.get("kind") == "node-lost"],
        replaced=[_replacement(e) for e in evs if e.get("kind") == "node-replaced"],
    )


def _replacement(e: dict[str, Any]) -> str:
    """One `node-replaced` event as the report says it: what died, what took its place, and how
    long the job trained nowhere (a requeue adds its queue wait and a new allocation to that)."""
    s = e.get("seconds") or {}
    lost = ", ".join(str(h) for h in e.get("lost") or {}) or "?"
    spares = ", ".join(str(h) for h in e.get("spares") or []) or "?"
    phases = ", ".join(f"{k.replace('_', ' and ')} {v:.1f}s" for k, v in s.items() if k != "total" and isinstance(v, (int, float)))
    total = f"training started again {s['total']:.1f}s after the first sign of the death" if isinstance(s.get("total"), (int, float)) else ""
    return (f"node {lost} replaced by spare {spares} inside the allocation, no requeue, no queue wait"
            + (f": {total} ({phases})" if total else "") + f"; spares left: {', '.join(e.get('spares_left') or []) or 'none'}")


def _lost_node(e: dict[str, Any]) -> str:
    """One `node-lost` event as the report says it."""
    why = ", ".join(str(x) for x in (e.get("state"), e.get("reason")) if x)
    lost = e.get("lost") or []
    said_by = label_of(str(e.get("scheduler") or "slurm"))  # who called it down; before the field: Slurm
    text = f"node {e.get('node')} (node {e.get('index')} of attempt {e.get('in_attempt')}) is gone" + (f" ({said_by}: {why})" if why else "")
    if lost:
        text += f"; lost with it, never published: {', '.join(str(x) for x in lost)}"
    return text


def _exit_note(start: dict[str, Any], end: dict[str, Any], evs: list[dict[str, Any]]) -> str | None:
    """torchrun exits 1 when a signal stops it, even after every rank saved and exited 0."""
    stop_child = next((e for e in evs if e.get("kind") == "stop-step" and e.get("step") == "stop-child"), {})
    launcher = start.get("launcher") or next((e.get("launcher") for e in evs if e.get("kind") == "spawn"), None)
    argv = next((e.get("argv") for e in evs if e.get("kind") == "spawn"), None) or []
    torchrun = launcher == "torchrun" or any(str(a).rsplit("/", 1)[-1] == "torchrun" for a in argv[:1])
    if (end.get("exit_status") == 1 and torchrun and end.get("reason") in EARLY | {"cancelled"}
            and stop_child.get("graceful") and not stop_child.get("killed")):
        return ("torchrun exits 1 when a signal stops it, even when every rank saved and exited 0; "
                "the stop was graceful")
    return None


def _how_they_came(attempts: list[Attempt], by_attempt: dict[int, list[dict[str, Any]]]) -> None:
    """An attempt after the first is a requeue only when the scheduler requeued the job (the
    previous attempt's requeue step or the controller said so, or the scheduler's restart
    counter grew); starting again into the same run directory by hand is a rerun."""
    for prev, a in zip(attempts, attempts[1:]):
        evs, before = by_attempt.get(a.number, []), by_attempt.get(prev.number, [])
        count = next((e.get("restart_count") for e in evs if e.get("kind") == "start"), None)
        was = next((e.get("restart_count") for e in before if e.get("kind") == "start"), None)
        by_scheduler = any(e.get("kind") == "reason" and e.get("requeued_by_scheduler") for e in before)
        grew = isinstance(count, int) and isinstance(was, int) and count > was
        replaced = any(e.get("kind") == "node-replaced" for e in evs) or _replacing(before)
        a.came_by = "replacement" if replaced else "requeue" if prev.requeued or by_scheduler or grew else "rerun"
        if by_scheduler or grew:
            prev.requeued = True


def _replacing(evs: list[dict[str, Any]]) -> bool:
    """The attempt's stop decided to go on inside the allocation (its `replace` step)."""
    return any(e.get("kind") == "stop-step" and e.get("step") == "replace" and e.get("replaced") for e in evs)


def _gpu_none(attempts: list[Attempt]) -> list[str]:
    """One line per distinct reason the GPUs could not be sampled, naming its attempts."""
    by_reason: dict[str, list[int]] = {}
    for a in attempts:
        if a.gpu_none:
            by_reason.setdefault(a.gpu_none, []).append(a.number)
    out = []
    for reason, nums in by_reason.items():
        which = "" if len(nums) == len(attempts) else f" (attempt{'s' if len(nums) > 1 else ''} {', '.join(map(str, nums))})"
        out.append(f"{reason}{which}")
    return out


def _stops(n: int, evs: list[dict[str, Any]]) -> list[StopSequence]:
    out: list[StopSequence] = []
    current: dict[str, Any] | None = None
    steps: list[StopStep] = []
    last_t = None

    def close() -> None:
        if current is None:
            return
        seconds = (last_t or current["t"]) - current["t"]
        left = _num(current.get("time_left_s"))
        kill = _num(current.get("kill_in_s"))
        to_kill = kill if kill is not None else left  # journals before kill_in_s: the job's end
        out.append(StopSequence(n, current["t"], str(current.get("reason")), current.get("detail"),
                                current.get("signal"), left, list(steps), round(seconds, 3),
                                round(to_kill - seconds, 3) if to_kill is not None else None,
                                kill_in_s=kill, kill_by=current.get("kill_by")))

    for e in evs:
        kind = e.get("kind")
        if kind == "stop":
            close()
            current, steps, last_t = e, [], e["t"]
        elif kind == "reason" and current is not None and e.get("reason"):
            current = {**current, "reason": e["reason"]}  # the scheduler's view refined it (scancel: cancelled)
        elif kind == "stop-step" and current is not None:
            steps.append(StopStep(str(e.get("step")), float(e.get("seconds") or 0.0), _outcome(e),
                                  e.get("graceful"), list(e.get("killed") or [])))
            if e.get("step") != "requeue":  # the margin is to the hard kill: the requeue call may come after
                last_t = e["t"]
    close()
    return out


def _outcome(e: dict[str, Any]) -> str | None:
    """One word or phrase for a stop step: its outcome, why it was skipped, or how the child ended."""
    if e.get("step") == "checkpoint" and e.get("answered") is False:
        return "published (the next periodic save: the request was not answered)"
    if e.get("outcome"):
        return str(e["outcome"])
    if e.get("skipped"):
        return f"skipped: {e['skipped']}"
    if e.get("killed"):
        return f"SIGKILLed {len(e['killed'])} after the grace"
    if e.get("step") == "requeue" and "requeued" in e:
        return "requeued" if e["requeued"] else f"not requeued: {e.get('why') or e.get('message') or '?'}"
    return "graceful" if e.get("graceful") else None


def _times(n: int) -> str:
    return f"{n} time{'s' if n != 1 else ''}"


def _kept(events: list[dict[str, Any]], attempts: list[Attempt]) -> int | None:
    """How many processes of the last attempt's training its keeper ended after supervise was
    killed (``keeper-killed``, supervisor/keeper.py); None when it did not have to."""
    last = attempts[-1].number if attempts else None
    kept = [e for e in events if e.get("kind") == "keeper-killed" and e.get("attempt") == last]
    return len(kept[-1].get("pids") or []) if kept else None


def _verdict(attempts: list[Attempt], *, torn: bool = False, not_durable: list[str] | None = None,
             kept: int | None = None) -> Verdict:
    reasons = [a.reason or "no end recorded" for a in attempts]
    requeues = sum(1 for a in attempts if a.came_by == "requeue")
    reruns = sum(1 for a in attempts if a.came_by == "rerun")
    last = attempts[-1] if attempts else None
    if last is None:
        return Verdict("empty", "NO EVENTS: the journal is empty (the supervisor never started?)", 0, 0, [])
    if last.reason is None and kept is not None:  # its keeper's line follows the (maybe torn) last one of supervise
        status, head = "killed", (f"NO END RECORDED in attempt {last.number}: supervise was killed; its keeper then "
                                  f"ended {kept} process{'es' if kept != 1 else ''} of the training")
    elif last.reason is None and torn:
        status, head = "killed", f"NO END RECORDED in attempt {last.number}: the journal's last line is torn (killed mid-write)"
    elif last.reason is None:
        status, head = "running", f"RUNNING (or killed before it could record its end) in attempt {last.number}"
    elif last.reason == "child-exit" and not_durable:
        status, head = "local-only", "NOT SAFE: the training finished, but its newest checkpoint is only on local disk"
    elif last.reason == "child-exit":
        status, head = "finished", "FINISHED"
    elif last.reason in FAILED:
        status, head = "failed", f"FAILED: {last.reason}" + (f", exit status {last.exit_status}" if last.exit_status is not None else "")
    elif last.reason == "cancelled":
        status, head = "cancelled", "CANCELLED"
    elif last.requeued:
        status, head = "requeued", f"REQUEUED after {last.reason}: waiting for attempt {last.number + 1}"
    else:
        status, head = "stopped", f"STOPPED by {last.reason}, not requeued: the work is not done"
    local_only = "ONLY ON LOCAL DISK: " + "; ".join(not_durable) if not_durable and status not in ("running", "killed") else None
    if requeues:
        head += f" · requeued {_times(requeues)}"
    if reruns:
        head += f" · rerun {_times(reruns)}"
    replaced = sum(1 for a in attempts if a.came_by == "replacement")
    if replaced:
        head += f" · {_times(replaced).replace('time', 'node')} replaced inside the allocation"
    if len(attempts) > 1 or status != "finished":
        head += f" · {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}"
    return Verdict(status, head, len(attempts), requeues, reasons, reruns, local_only)


def _checkpoints(events: list[dict[str, Any]], attempts: list[Attempt], partless: dict[int, str]) -> Checkpoints:
    """``partless``: node ranks that held no part (``_nodes.partless_nodes``): the leader's "its
    newest part may be missing" of such a node is no checkpoint left on local disk (its node
    row says what became of it)."""
    first_seen: dict[tuple[str, str], dict[str, Any]] = {}
    for e in events:
        if is_checkpoint(e):
            first_seen.setdefault((str(e.get("pair")), str(e.get("checkpoint"))), e)
    pubs = sorted(first_seen.values(), key=lambda e: e["t"])
    lags = [float(e["lag_s"]) for e in pubs if _num(e.get("lag_s")) is not None]
    gaps: list[float] = []
    by_pair: dict[str, list[float]] = {}
    for e in pubs:
        by_pair.setdefault(str(e.get("pair")), []).append(e["t"])
    for ts in by_pair.values():
        gaps += [b - a for a, b in zip(ts, ts[1:])]
    pairs = sorted({p["name"] for e in events if e.get("kind") == "sync-start" for p in e.get("pairs") or []
                    if p.get("kind") == "checkpoint"})
    # The latest attempt's newest by step, not by when it landed: a pass publishes the newest first.
    last = max((e for e in events if is_checkpoint(e)),
               key=lambda e: (int(e.get("attempt") or 0), natural_key(str(e.get("checkpoint"))), e["t"]), default=None)
    ends = [e for e in events if e.get("kind") == "end"]
    last_attempt = attempts[-1].number if attempts else None
    not_durable = [str(x) for x in (ends[-1].get("not_durable") or [])] if ends and ends[-1].get("attempt") == last_attempt else []
    not_durable = [line for line in not_durable if silent_node(line) not in partless]
    versions = [e for e in events if is_checkpoint(e)]
    copies = [float(e["seconds"]) for e in events if e.get("kind") == "sync" and e.get("published")
              and _num(e.get("seconds")) is not None]
    return Checkpoints(
        pairs=pairs, published=len(pubs), versions=len(versions),
        lag_p50_s=pct(lags, 0.50), lag_p95_s=pct(lags, 0.95),
        interval_s=round(statistics.median(gaps), 3) if gaps else None,
        last=LastCheckpoint(str(last.get("pair")), str(last.get("checkpoint")), last["t"], int(last.get("attempt") or 0)) if last else None,
        not_durable=not_durable,
        sync_failures=sum(1 for e in events if e.get("kind") == "sync-failed"),
        restores=_restores(events),
        copy_p95_s=pct(copies, 0.95),
        settled=sum(1 for e in pubs if e.get("why") == "settled"),
        torn=[f"attempt {e.get('attempt')}: {e.get('pair')}: {e.get('checkpoint')}" + (f" ({e['why']})" if e.get("why") else "")
              for e in events if e.get("kind") == "torn"],
        profiles=_profiles(events),
    )


def _profiles(events: list[dict[str, Any]]) -> list[str]:
    """What completeness rests on, each description once, with the attempts that used it."""
    seen: dict[str, list[int]] = {}
    for e in events:
        if e.get("kind") == "sync-profile":
            text = (f"{e.get('pair')}: {e.get('profile')}" + (f" ({e['evidence']})" if e.get("evidence") else "")
                    + (f"; writers {e['writers']}" if e.get("writers") else "")
                    + ("; waits for quiescence" if e.get("quiescence") else ""))
            seen.setdefault(text, []).append(int(e.get("attempt") or 0))
    out = []
    for text, attempts in seen.items():
        ns = sorted(set(attempts))
        which = f"attempt {ns[0]}" if len(ns) == 1 else f"attempts {_span(ns)}"
        out.append(f"{which}: {text}")
    return out


def _span(ns: list[int]) -> str:
    """1, 2, 3, 5 → "1–3, 5"."""
    parts, start = [], ns[0]
    for a, b in zip(ns, [*ns[1:], None]):
        if b != a + 1:
            parts.append(str(start) if start == a else f"{start}–{a}")
            start = b if b is not None else a
    return ", ".join(parts)


def _restores(events: list[dict[str, Any]]) -> list[RestoreOutcome]:
    """Each restore, verified: resumed only when the training's next durable checkpoint is newer."""
    out: list[RestoreOutcome] = []
    for e in events:
        kind, n, pair = e.get("kind"), int(e.get("attempt") or 0), str(e.get("pair"))
        if kind == "restore-failed":
            out.append(RestoreOutcome(n, pair, None, "failed", f"attempt {n}: restore failed: {e.get('error')}"))
            continue
        if kind == "restore-versions":
            out.extend(_node_versions(n, e))
            continue
        if kind != "restore":
            continue
        name = e.get("checkpoint")
        if not name:
            why = str(e.get("reason") or "nothing to restore")
            nothing = why.startswith("no complete checkpoint")
            out.append(RestoreOutcome(n, pair, None, "none" if nothing else "refused",
                                      f"attempt {n}: {'nothing restored' if nothing else 'restore refused'}: {why}"))
            continue
        mine = [x for x in events if x.get("attempt") == n and x["t"] > e["t"]]
        spawn = next((x["t"] for x in mine if x.get("kind") == "spawn"), e["t"])
        later = [x for x in mine if is_checkpoint(x) and x.get("pair") == pair
                 and x["t"] - (_num(x.get("lag_s")) or 0.0) >= spawn]  # completed after the training started
        nxt = next((x for x in later if x.get("checkpoint") != name), None)
        versions = sum(1 for x in later if x.get("checkpoint") == name)  # the same file rewritten in place
        torn = next((x for x in events if x.get("kind") == "torn" and x.get("pair") == pair
                     and x.get("checkpoint") == name), None)  # the restored checkpoint itself was torn
        end = next((x for x in mine if x.get("kind") == "end"), {})
        a, b = step_of(name), step_of(nxt.get("checkpoint")) if nxt else None
        if nxt is not None and a is not None and b is not None and b > a:
            outcome, text = "resumed", (f"resumed from {name} (verified: the next checkpoint this attempt made durable, "
                                        f"{nxt['checkpoint']}, is a later step)")
        elif nxt is not None and a is not None and b is not None:
            outcome, text = "not-resumed", (f"did NOT resume from {name}: its next checkpoint, {nxt['checkpoint']}, "
                                            f"is not newer (the training started over or loaded something else)")
        elif torn is not None:
            outcome, text = "not-resumed", (f"did NOT resume from {name}: it is torn, the training died writing it"
                                            + (f" ({torn['why']})" if torn.get("why") else ""))
        elif end.get("reason") in FAILED:
            outcome, text = "not-resumed", (f"restored {name}, but the training failed ({end.get('reason')}, exit status "
                                            f"{end.get('exit_status')}) before a newer checkpoint was durable")
        elif nxt is not None:
            outcome, text = "unverified", f"restored {name}; its next checkpoint {nxt['checkpoint']} cannot be ordered by name"
        elif versions:
            outcome, text = "unverified", (f"restored {name}; {versions} newer version{'s' if versions > 1 else ''} of it "
                                           f"became durable in this attempt (rewritten in place: the name carries no step "
                                           f"to verify the resume by)")
        else:
            outcome, text = "unverified", f"restored {name}; not verified: no newer checkpoint became durable in this attempt"
        out.append(RestoreOutcome(n, pair, str(name), outcome, f"attempt {n}: {text}"))
    return out


def _node_versions(n: int, e: dict[str, Any]) -> list[RestoreOutcome]:
    """What each node of a multi-node attempt held at the spawn (``restore-versions``), per pair:
    one version on every node, or, plainly, which node held what when they differed."""
    nodes = e.get("nodes") if isinstance(e.get("nodes"), dict) else {}
    pairs = sorted({p for held in nodes.values() if isinstance(held, dict) for p in held})
    out = []
    for pair in pairs:
        held = {k: (v or {}).get(pair) for k, v in sorted(nodes.items(), key=lambda kv: int(kv[0]))}
        ids = {(h or {}).get("sha256") for h in held.values()}
        first = next(iter(held.values()))
        name = (first or {}).get("name")
        passed = (e.get("passed_over") or {}).get(pair) if isinstance(e.get("passed_over"), dict) else None
        over = f"; passed over {', '.join(map(str, passed))}: no copy of it verified on some node" if passed else ""
        if len(ids) == 1 and name:
            text = (f"every node ({', '.join(held)}) resumed from the same {name} "
                    f"(sha256 {str(first.get('sha256'))[:12]}){over}" if first else "")
            out.append(RestoreOutcome(n, pair, name, "nodes-agree", f"attempt {n}: {text}"))
        elif len(ids) > 1:
            said = "; ".join(f"node {k}: " + (f"{h.get('name')} (sha256 {str(h.get('sha256'))[:12]})" if h else "nothing")
                             for k, h in held.items())
            out.append(RestoreOutcome(n, pair, name, "nodes-differ",
                                      f"attempt {n}: the nodes held DIFFERENT versions ({said}); the training was not started"))
    return out


def _gpu(g: GpuAcc, events: list[dict[str, Any]], hosts: dict[int, str | None]) -> Gpu:
    mine = set(g.uuids)
    name = None
    ecc_c = ecc_u = None
    faulty: list[str] = []

    def fault(uuid: Any, attempt: Any) -> None:
        where = f"{uuid} on {hosts.get(int(attempt or 0)) or '?'}"
        if where not in faulty:
            faulty.append(where)

    for e in events:
        kind = e.get("kind")
        if kind == "gpu-start":
            name = next((d.get("name") for d in e.get("devices") or [] if d.get("uuid") in mine), name)
        elif kind == "gpu-end":
            for d in e.get("devices") or []:
                if d.get("uuid") not in mine:
                    continue
                if _num(d.get("ecc_corrected_delta")) is not None:
                    ecc_c = (ecc_c or 0) + int(d["ecc_corrected_delta"])
                if _num(d.get("ecc_uncorrected_delta")) is not None:
                    ecc_u = (ecc_u or 0) + int(d["ecc_uncorrected_delta"])
                    if d["ecc_uncorrected_delta"]:
                        fault(d.get("uuid"), e.get("attempt"))
        elif kind in ("gpu-xid", "gpu-lost") and e.get("uuid") in mine:
            fault(e.get("uuid"), e.get("attempt"))
    xids = [int(e["xid"]) for e in events if e.get("kind") == "gpu-xid" and e.get("uuid") in mine
            and _num(e.get("xid")) is not None]
    energy = g.energy_j
    return Gpu(
        index=g.index, uuids=list(g.uuids), name=name, samples=g.samples,
        util_mean_pct=round(g.util_sum / g.util_n, 1) if g.util_n else None,
        util_p95_pct=g.util_hist.quantile(0.95),
        mem_peak_mib=g.mem_peak, mem_total_mib=g.mem_total,
        mem_peak_pct=round(100 * g.mem_peak / g.mem_total, 1) if g.mem_peak is not None and g.mem_total else None,
        proc_mem_peak_mib=g.proc_mem_peak,
        power_mean_w=round(g.power_sum / g.power_n, 1) if g.power_n else None, power_max_w=g.power_max,
        energy_kwh=round(energy / 3.6e6, 4) if energy is not None else None, temp_max_c=g.temp_max,
        sampled_s=round(g.sampled_s, 1),
        throttled_s={k: round(v, 1) for k, v in sorted(g.throttle_s.items())},
        xids=xids, ecc_corrected=ecc_c, ecc_uncorrected=ecc_u,
        lost=any(e.get("kind") == "gpu-lost" and e.get("uuid") in mine for e in events),
        faulty=faulty,
    )


def _host(data: RunData, start: dict[str, Any]) -> Host | None:
    h = data.host
    if h is None:
        return None
    requested = recorded(start.get("scheduler_env") or {}).mem_per_node_mib
    return Host(
        samples=h.samples, cpu_mean_pct=round(h.cpu_sum / h.cpu_n, 1) if h.cpu_n else None, cpu_max_pct=h.cpu_max,
        rss_peak_mib=h.rss_peak, nprocs_max=h.nprocs_max, node_mem_total_mib=h.node_mem_total,
        node_mem_min_available_mib=h.node_avail_min, mem_requested_mib=requested,
    )


def throttled(g: Gpu) -> dict[str, float]:
    """The clock-event reasons that slow a busy GPU (idle and app clocks are not a slowdown)."""
    return {k: v for k, v in g.throttled_s.items() if k in THROTTLE_REASONS or k.startswith("0x")}
