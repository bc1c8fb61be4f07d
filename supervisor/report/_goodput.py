"""Goodput: what share of the job's wall time trained the model, and what each interruption cost.

ETTR (effective training time ratio, Meta's HPCA'25 reliability study, ByteCheckpoint) is
productive training time over wall time. The journal gives the wall clock of every attempt,
its checkpoints (when each was complete locally: ``publish.t - publish.lag_s``) and its stop;
from these, per attempt:

* **first step**: supervise cannot see the training's steps, so it is estimated. With numbered
  checkpoints (``step_300``, ``checkpoint-40``): the first new checkpoint's completion minus
  its steps since the resumed one at the step rate (steps per second between two checkpoints
  of this attempt, else of all attempts). Else the first log growth (a ``sync`` of a ``log`` pair that
  copied files, at its start), else the first new checkpoint: upper bounds, so start-up
  looks longer and productive time shorter than they were;
* **productive**: first step → the completion of the last checkpoint of this attempt that
  became durable (→ the training's exit when nothing is checkpointed and it finished well);
* **training**: first step → the stop (or, when a checkpoint the stop asked for became
  durable, that checkpoint's completion: the training went on until it saved), or the
  training's exit when it ended by itself. The exit after the stop's checkpoint is overhead;
* **lost work**: the training's time after the last durable checkpoint: it is redone by the
  next attempt, or is only on local disk. Steps: from the checkpoint names, exactly when a
  checkpoint taken at the stop stayed local, else estimated from the attempt's step rate;
* **queue wait**: from the previous attempt's end to this one's start (the batch job's start,
  where the scheduler's journaled environment records it: ``sched.recorded``);
* **lost GPU-hours**: GPUs × (the attempt's wall time − its productive time): start-up,
  restore, lost work and the stop sequence, while the GPUs were held. Queue wait holds none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from supervisor.sched import recorded

STEP_IN_NAME = re.compile(r"(\d+)(?!.*\d)")  # the last number in a checkpoint's name: step_000300, checkpoint-40


@dataclass
class AttemptGoodput:
    attempt: int
    wall_s: float | None  # the attempt's start → its end (or its last event)
    queue_wait_s: float | None  # the previous attempt's end → this one's start
    startup_s: float | None  # start → spawn (restore included)
    restore_s: float | None
    first_step_s: float | None  # start → the first sign of training (upper bound)
    first_step_by: str | None  # the evidence: "log growth", "checkpoint", or None (none seen)
    training_s: float | None  # first step → the training's exit (or the attempt's end)
    productive_s: float
    lost_work_s: float  # training after the last durable checkpoint: redone, or only on local disk
    lost_steps: int | None
    lost_steps_exact: bool  # from checkpoint names (a local-only checkpoint at the stop), else estimated
    interrupted_by: str | None  # the end reason when the work was not done
    ettr: float | None
    lost_gpu_hours: float | None


@dataclass
class Goodput:
    gpus: int | None
    gpus_from: str | None  # "gpu samples", "scheduler", or None
    wall_s: float | None  # the first attempt's start → the last one's end, queue waits included
    queue_wait_s: float
    productive_s: float
    lost_work_s: float
    lost_gpu_hours: float | None
    ettr: float | None
    attempts: list[AttemptGoodput] = field(default_factory=list)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def is_checkpoint(e: dict[str, Any]) -> bool:
    """A ``publish`` event of a checkpoint: not a pointer, nor a file beside the checkpoints
    (``restorable: false``: DeepSpeed's ``zero_to_fp32.py``, HF's ``training_args.bin``),
    which the mirror copies as plain files and the report never counts nor names as one."""
    return e.get("kind") == "publish" and not e.get("pointer") and e.get("restorable") is not False


def step_of(name: Any) -> int | None:
    m = STEP_IN_NAME.search(str(name or ""))
    return int(m.group(1)) if m else None


def step_rate(by_attempt: dict[int, list[dict[str, Any]]]) -> float | None:
    """Steps per second of the training, from consecutive numbered checkpoints of one attempt
    (their names and completion times); None when fewer than two are known."""
    steps = seconds = 0.0
    for evs in by_attempt.values():
        spawn = next((e["t"] for e in evs if e.get("kind") == "spawn"), None)
        if spawn is None:
            continue
        done = sorted({(e["t"] - (_num(e.get("lag_s")) or 0.0), step_of(e.get("checkpoint"))) for e in evs
                       if is_checkpoint(e) and step_of(e.get("checkpoint")) is not None
                       and e["t"] - (_num(e.get("lag_s")) or 0.0) >= spawn})
        for (t1, s1), (t2, s2) in zip(done, done[1:]):
            if s2 > s1 and t2 > t1:  # type: ignore[operator]
                steps += s2 - s1  # type: ignore[operator]
                seconds += t2 - t1
    return steps / seconds if steps and seconds else None


def _gpu_count(events: list[dict[str, Any]], sampled: int) -> tuple[int | None, str | None]:
    if sampled:
        return sampled, "gpu samples"
    start = next((e for e in events if e.get("kind") == "start"), {})
    env = start.get("scheduler_env") or {}
    gpus = recorded(env, start.get("nodes")).gpus
    if gpus is not None:
        return gpus, "scheduler"
    cvd = str(env.get("CUDA_VISIBLE_DEVICES", ""))
    if cvd and cvd not in ("-1", "NoDevFiles"):
        return len([d for d in cvd.split(",") if d.strip()]), "scheduler"
    return None, None


def _scheduler_start(start: dict[str, Any]) -> float | None:
    return recorded(start.get("scheduler_env") or {}).start


def _first_step(evs: list[dict[str, Any]], written: list[tuple[float, str]], log_pairs: set[str],
                spawn: float | None, restored_step: int | None, rate: float | None) -> tuple[float | None, str | None]:
    """When the attempt's training took its first step, and the evidence (see the module's doc)."""
    if spawn is None:
        return None, None
    first_ckpt = step_of(written[0][1]) if written else None
    if written and rate and first_ckpt is not None:
        resumed = restored_step if restored_step is not None and first_ckpt > restored_step else 0
        return max(spawn, written[0][0] - (first_ckpt - resumed) / rate), "step rate"
    grew = [max(spawn, e["t"] - (_num(e.get("seconds")) or 0.0)) for e in evs
            if e.get("kind") == "sync" and str(e.get("pair")) in log_pairs and (e.get("files") or 0) > 0
            and e["t"] >= spawn]
    if grew:
        return grew[0], "log growth"
    if written:
        return written[0][0], "checkpoint"
    return None, None


def _lost_steps(lost: float, written: list[tuple[float, str]], not_durable: list[str], restored_step: int | None,
                rate: float | None) -> tuple[int | None, bool]:
    """Steps of the lost work: exact when a newer checkpoint stayed only on local disk, else
    lost time × the step rate; None when the names carry no step."""
    if lost <= 0:
        return None, False
    last_durable = step_of(written[-1][1]) if written else restored_step
    local = [s for s in (step_of(x.split(": ", 1)[-1].split(" (")[0]) for x in not_durable) if s is not None]
    if local and last_durable is not None and max(local) > last_durable:
        return max(local) - last_durable, True
    return (int(round(lost * rate)), False) if rate else (None, False)


def _attempt(n: int, evs: list[dict[str, Any]], log_pairs: set[str], previous_end: float | None,
             finished_clean: bool, gpus: int | None, rate: float | None) -> AttemptGoodput:
    def first(kind: str) -> dict[str, Any]:
        return next((e for e in evs if e.get("kind") == kind), {})

    start_ev, end_ev = first("start"), first("end")
    t0 = _num(start_ev.get("t")) or evs[0]["t"]
    t_end = _num(end_ev.get("t")) or evs[-1]["t"]
    spawn = _num(first("spawn").get("t"))
    queue = None
    if previous_end is not None:
        began = _scheduler_start(start_ev)
        queue = max(0.0, (began if began is not None and previous_end <= began <= t0 else t0) - previous_end)
    restores = [e for e in evs if e.get("kind") == "restore" and e.get("checkpoint")]
    restore_s = sum(_num(e.get("seconds")) or 0.0 for e in restores) if restores else None
    restored_step = step_of(restores[-1].get("checkpoint")) if restores else None

    # Checkpoints this attempt's training wrote (complete locally after the spawn) that became durable.
    written: list[tuple[float, str]] = []  # every version: a file rewritten in place is progress too
    for e in evs:
        if not is_checkpoint(e) or spawn is None:
            continue
        done = e["t"] - (_num(e.get("lag_s")) or 0.0)
        if done >= spawn:
            written.append((done, str(e.get("checkpoint"))))
    written.sort()
    rate = step_rate({n: evs}) or rate  # this attempt's own pace when it has two numbered checkpoints
    first_step, first_by = _first_step(evs, written, log_pairs, spawn, restored_step, rate)

    exits = [e["t"] for e in evs if e.get("kind") == "child-exit"]
    stops = [e["t"] for e in evs if e.get("kind") == "stop" and e.get("reason") not in ("child-exit", "child-failed")]
    trained_to = stops[0] if stops else exits[-1] if exits else t_end
    if stops and written and written[-1][0] > trained_to:  # it trained on until its stop checkpoint was complete
        trained_to = min(written[-1][0], exits[-1] if exits else t_end)
    not_durable = [str(x) for x in (end_ev.get("not_durable") or [])]
    training = max(0.0, trained_to - first_step) if first_step is not None else None
    if first_step is None:
        productive = 0.0
    elif written:
        productive = max(0.0, min(written[-1][0], trained_to) - first_step)
    elif finished_clean and not not_durable:
        productive = training or 0.0  # nothing to checkpoint: the training's whole run counts
    else:
        productive = 0.0
    kept_to = written[-1][0] if written else (trained_to if productive else first_step)
    lost = max(0.0, trained_to - max(kept_to or trained_to, first_step or trained_to))
    if finished_clean and not not_durable:
        lost = 0.0  # after the final checkpoint of a finished training comes only its exit
    lost_steps, exact = _lost_steps(lost, written, not_durable, restored_step, rate)
    wall = max(0.0, t_end - t0)
    reason = end_ev.get("reason")
    return AttemptGoodput(
        attempt=n, wall_s=round(wall, 3), queue_wait_s=None if queue is None else round(queue, 3),
        startup_s=None if spawn is None else round(spawn - t0, 3),
        restore_s=None if restore_s is None else round(restore_s, 3),
        first_step_s=None if first_step is None else round(first_step - t0, 3), first_step_by=first_by,
        training_s=None if training is None else round(training, 3),
        productive_s=round(productive, 3), lost_work_s=round(lost, 3), lost_steps=lost_steps, lost_steps_exact=exact,
        interrupted_by=None if reason == "child-exit" and not not_durable else (reason or "no end recorded"),
        ettr=round(productive / wall, 4) if wall > 0 else None,
        lost_gpu_hours=None if gpus is None else round(gpus * (wall - productive) / 3600, 4),
    )


def goodput(events: list[dict[str, Any]], sampled_gpus: int) -> Goodput:
    """The job's goodput from its journal (``sampled_gpus``: GPUs seen in gpu.csv)."""
    log_pairs = {str(p.get("name")) for e in events if e.get("kind") == "sync-start" for p in e.get("pairs") or []
                 if p.get("kind") == "log"}
    gpus, gpus_from = _gpu_count(events, sampled_gpus)
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        by_attempt.setdefault(int(e.get("attempt") or 0), []).append(e)
    rate = step_rate(by_attempt)
    out: list[AttemptGoodput] = []
    previous_end: float | None = None
    for n, evs in sorted(by_attempt.items()):
        end = next((e for e in evs if e.get("kind") == "end"), {})
        clean = end.get("reason") == "child-exit"
        out.append(_attempt(n, evs, log_pairs, previous_end, clean, gpus, rate))
        previous_end = _num(end.get("t")) or evs[-1]["t"]
    if not out:
        return Goodput(gpus, gpus_from, None, 0.0, 0.0, 0.0, None, None, [])
    first_t = min(e["t"] for e in by_attempt[min(by_attempt)])
    wall = max(0.0, (previous_end or first_t) - first_t)
    productive = sum(a.productive_s for a in out)
    return Goodput(
        gpus=gpus, gpus_from=gpus_from, wall_s=round(wall, 3),
        queue_wait_s=round(sum(a.queue_wait_s or 0.0 for a in out), 3), productive_s=round(productive, 3),
        lost_work_s=round(sum(a.lost_work_s for a in out), 3),
        lost_gpu_hours=None if gpus is None else round(sum(a.lost_gpu_hours or 0.0 for a in out), 4),
        ettr=round(productive / wall, 4) if wall > 0 else None, attempts=out,
    )
