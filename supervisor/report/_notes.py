"""Plain-language notes, each with the concrete change to make (Princeton jobstats style).

Every rule is a small function of the facts that returns notes or nothing; the thresholds
are named constants here so a site can see (and change) what triggers what.
"""

from __future__ import annotations

import math
from typing import Callable

from supervisor.report._facts import LEARNED_STEPS, Facts, Note, pct, throttled

GPU_UNUSED_PCT = 5.0  # mean utilisation: the GPU did essentially nothing
GPU_LOW_PCT = 25.0  # jobstats' "GPU_UTIL_BLACK": idle most of the time
GPU_MEM_LOW_PCT = 50.0  # peak memory of capacity
HOST_MEM_LOW_PCT = 50.0  # peak RSS of what the job asked for
NODE_MEM_TIGHT_PCT = 5.0  # available node memory at its lowest
THROTTLE_PCT = 10.0  # share of sampled time slowed by power or heat
TIME_USED_LOW = 0.5  # a finished run that used less than this share of its time limit
MIN_SAMPLES = 6  # fewer GPU samples say nothing about utilisation


def _dur(s: float) -> str:
    s = max(0, int(math.ceil(s)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{sec}s" if sec or not (h or m) else "")


def _gpus(idx: list[int]) -> str:
    return ("GPU " if len(idx) == 1 else "GPUs ") + ", ".join(str(i) for i in idx)


def _slurm_time(seconds: float) -> str:
    """A Slurm --time value rounded up to 10 minutes: D-HH:MM:SS."""
    minutes = int(math.ceil(seconds / 600.0)) * 10
    d, rem = divmod(minutes, 24 * 60)
    h, m = divmod(rem, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:00"


def gpu_use(f: Facts) -> list[Note]:
    sampled = [g for g in f.gpus if g.util_mean_pct is not None and g.samples >= MIN_SAMPLES]
    unused = [g.index for g in sampled if (g.util_mean_pct or 0.0) < GPU_UNUSED_PCT]  # `or`: for the type checker
    low = [g for g in sampled if GPU_UNUSED_PCT <= (g.util_mean_pct or 0.0) < GPU_LOW_PCT]
    notes = []
    if unused:
        n = len(unused)
        notes.append(Note("bad", f"{_gpus(unused)} did almost no work (mean utilisation under {GPU_UNUSED_PCT:g} %). "
                                 f"Check that every rank uses its own GPU (LOCAL_RANK → cuda:N), or ask for "
                                 f"{len(f.gpus) - n} GPU{'s' if len(f.gpus) - n != 1 else ''} instead of {len(f.gpus)} "
                                 f"(--gpus={len(f.gpus) - n})."))
    if low:
        desc = ", ".join(f"GPU {g.index}: {g.util_mean_pct:.0f} %" for g in low)
        were = "was" if len(low) == 1 else "were"
        notes.append(Note("warn", f"{_gpus([g.index for g in low])} {were} idle most of the time (mean utilisation {desc}; "
                                  f"under {GPU_LOW_PCT:g} % is low). Usually the input pipeline starves them: raise "
                                  f"DataLoader num_workers, use pin_memory and prefetching, or a larger batch."))
    return notes


def gpu_memory(f: Facts) -> list[Note]:
    with_mem = [g for g in f.gpus if g.mem_peak_pct is not None]
    peaks = [g.mem_peak_pct for g in with_mem if g.mem_peak_pct is not None]
    if not peaks or any(p >= GPU_MEM_LOW_PCT for p in peaks):
        return []
    peak = max(peaks)
    peak_gib = max(g.mem_peak_mib or 0 for g in with_mem) / 1024
    total_gib = max(g.mem_total_mib or 0 for g in with_mem) / 1024
    return [Note("info", f"GPU memory peaked at {peak:.0f} % of capacity ({peak_gib:.1f} of {total_gib:.0f} GiB). "
                         f"A larger batch would use the GPUs better, or ask for a smaller GPU or a MIG slice "
                         f"(e.g. --gres=gpu:<smaller type>) and start sooner.")]


def host_memory(f: Facts) -> list[Note]:
    h = f.host
    notes = []
    if h and h.mem_requested_mib and h.rss_peak_mib is not None and h.rss_peak_mib < h.mem_requested_mib * HOST_MEM_LOW_PCT / 100:
        ask = int(math.ceil(h.rss_peak_mib * 1.25 / 1024))
        notes.append(Note("info", f"The training used at most {h.rss_peak_mib / 1024:.1f} GiB of the "
                                  f"{h.mem_requested_mib / 1024:.0f} GiB of memory asked for: ask for --mem={max(1, ask)}G."))
    if h and h.node_mem_total_mib and h.node_mem_min_available_mib is not None and \
            h.node_mem_min_available_mib < h.node_mem_total_mib * NODE_MEM_TIGHT_PCT / 100:
        notes.append(Note("warn", f"The node's available memory fell to {h.node_mem_min_available_mib:.0f} MiB "
                                  f"(under {NODE_MEM_TIGHT_PCT:g} % of {h.node_mem_total_mib:.0f} MiB): close to an OOM kill. "
                                  f"Ask for more memory (--mem) or fewer DataLoader workers."))
    return notes


def warn_lead(f: Facts) -> list[Note]:
    """The warning must leave time for the checkpoint and the flush, as measured.

    Checked on the stops at the time limit, against the lead their attempt had; the time
    the steps take is a property of the training, so every stop's measurement counts.
    """
    needs = [sum(s.seconds for s in st.steps if s.step in LEARNED_STEPS) for st in f.stops if st.steps]
    lead_of = {a.number: a.warn_lead_s for a in f.attempts}
    need = pct(needs, 0.95) or 0.0
    why: list[str] = []
    suggest = need * 1.25 + 30  # the rule --warn-before auto learns by (docs/journal.md)
    for st in (s for s in f.stops if s.reason == "deadline"):
        lead = lead_of.get(st.attempt)
        if lead is None:
            continue
        short = [s.outcome for s in st.steps if s.step in LEARNED_STEPS and s.outcome in ("timeout", "no-time")]
        if need > lead:
            why.append(f"attempt {st.attempt}: checkpoint + flush take up to {need:.1f}s but the warning came "
                       f"{lead:.1f}s before the end")
        elif short:
            why.append(f"attempt {st.attempt}: with a {lead:.1f}s warning the stop ran out of time "
                       f"({', '.join(str(o) for o in short)})")
            suggest = max(suggest, 2 * lead)
        elif st.margin_s is not None and st.margin_s < 0:
            why.append(f"attempt {st.attempt}: the stop sequence ended {-st.margin_s:.1f}s after the job's end")
        else:
            continue
    if not why:
        return []
    return [Note("bad", "The warning before the time limit is too short (" + "; ".join(why) +
                 f"). Raise --warn-before to {_dur(suggest)}, or use --warn-before auto, which learns it.")]


def _not_durable_advice(f: Facts) -> str:
    """What to change for what the last attempt left on local disk, by its cause (issue 30:
    "write a completion marker last" was said of a complete file that was only not copied
    again in time): the warning too short, a copy that failed, another run's name, a
    checkpoint not complete, else one complete but not yet copied."""
    lines, last = f.checkpoints.not_durable, f.attempts[-1].number if f.attempts else None
    timed_out = any(st.attempt == last and any(s.step in ("checkpoint", "flush", "final-flush")
                                               and s.outcome in ("timeout", "no-time") for s in st.steps)
                    for st in f.stops)
    if timed_out and any(st.attempt == last and st.reason == "deadline" for st in f.stops):
        return "raise --warn-before so the final flush has time"
    if any("last sync failed" in line for line in lines):
        return ("its copy failed (sync-failed above): fix the persistent storage (space, permissions, a hung mount); "
                "the next attempt copies it if it still holds it")
    if any("(refused:" in line for line in lines):
        return "another run's checkpoint of that name is on persistent storage: give each run its own directory"
    if any("(incomplete:" in line or "(torn:" in line for line in lines):
        return ("it was not complete when the attempt ended (see why above), not short of time: write a completion "
                "marker last (docs/sync.md) so the newest checkpoint is published as soon as it is written")
    why = ("the stop's copy ran out of time (a slow or hung persistent file system, or a stop with too little time)"
           if timed_out else "it was completed or rewritten as the attempt ended")
    return f"it was complete but not yet copied when the attempt ended: {why}"


def checkpoint_pace(f: Facts) -> list[Note]:
    c = f.checkpoints
    notes = []
    copy = c.copy_p95_s
    if c.interval_s and copy is not None and copy > c.interval_s:
        notes.append(Note("warn", f"Checkpoints come every {_dur(c.interval_s)} but copying one takes {copy:.1f}s (p95): "
                                  f"they pile up on local disk. Checkpoint less often (every ≥ {_dur(copy * 2)}) "
                                  f"or write smaller ones."))
    elif c.interval_s and c.lag_p95_s is not None and c.lag_p95_s > c.interval_s and c.settled:
        notes.append(Note("warn", f"{c.settled} checkpoint{'s' if c.settled != 1 else ''} had no completion marker, so "
                                  f"each became durable only after the settle time (lag p95 {c.lag_p95_s:.1f}s, "
                                  f"the copy itself {copy or 0:.1f}s): the newest is always at risk. Write a marker "
                                  f"last (markers = [...] in the [[sync]] table, docs/sync.md) so it is published at once."))
    writes = [s.seconds for st in f.stops for s in st.steps if s.step == "checkpoint" and s.outcome == "published"]
    if c.interval_s and writes and max(writes) > c.interval_s:
        notes.append(Note("warn", f"Writing a checkpoint took {max(writes):.1f}s, longer than the {_dur(c.interval_s)} "
                                  f"between checkpoints: the training spends most of its time checkpointing. "
                                  f"Checkpoint every ≥ {_dur(max(writes) * 5)}."))
    if c.not_durable:
        notes.append(Note("bad", "Left only on local disk at the end (not on persistent storage): "
                                 + "; ".join(c.not_durable) + ". Copy it by hand before the node is cleaned; "
                                 + _not_durable_advice(f) + "."))
    for r in c.restores:
        if r.outcome in ("not-resumed", "refused", "failed", "nodes-differ"):
            notes.append(Note("bad" if r.outcome != "refused" else "warn", f"Restore, {r.text}."))
    if c.sync_failures:
        notes.append(Note("warn", f"{c.sync_failures} sync pass{'es' if c.sync_failures != 1 else ''} failed "
                                  f"(see sync-failed in events.jsonl); check quota and the persistent path."))
    return notes


def time_limit(f: Facts) -> list[Note]:
    if f.verdict.status != "finished" or not f.attempts:
        return []
    last = f.attempts[-1]
    if not last.time_limit_s or last.seconds is None or last.seconds >= last.time_limit_s * TIME_USED_LOW:
        return []
    if math.ceil(last.seconds * 1.25 / 600.0) * 600 >= last.time_limit_s:
        return []  # nothing shorter to suggest at 10-minute steps
    return [Note("info", f"The last attempt ran {_dur(last.seconds)} of its {_dur(last.time_limit_s)} time limit "
                         f"({100 * last.seconds / last.time_limit_s:.0f} %). Ask for --time={_slurm_time(last.seconds * 1.25)} "
                         f"(run time + 25 %): shorter jobs start sooner (backfill).")]


def gpu_health(f: Facts) -> list[Note]:
    notes = []
    slowed: dict[str, list[tuple[int, float]]] = {}  # reason → (GPU, share of its sampled time)
    for g in f.gpus:
        for reason, seconds in throttled(g).items():
            if g.sampled_s and 100 * seconds / g.sampled_s >= THROTTLE_PCT:
                slowed.setdefault(reason, []).append((g.index, 100 * seconds / g.sampled_s))
    for reason, hit in sorted(slowed.items()):
        lo, hi = min(s for _, s in hit), max(s for _, s in hit)
        share = f"{hi:.0f} %" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f} %"
        notes.append(Note("warn", f"{_gpus([i for i, _ in hit])} {'was' if len(hit) == 1 else 'were'} slowed by "
                                  f"{reason} {share} of the time: the node's power or cooling limits "
                                  f"{'it' if len(hit) == 1 else 'them'}; tell the site's admins."))
    for g in f.gpus:
        trouble = []
        if g.xids:
            trouble.append("XID " + ", ".join(str(x) for x in sorted(set(g.xids))))
        if g.ecc_uncorrected:
            trouble.append(f"{g.ecc_uncorrected} uncorrected ECC error{'s' if g.ecc_uncorrected > 1 else ''}")
        if g.lost:
            trouble.append("fell off the bus (lost)")
        if trouble:
            nodes = sorted({w.rsplit(" on ", 1)[-1] for w in g.faulty})
            notes.append(Note("bad", f"GPU {g.index} ({'; '.join(g.faulty)}) reported {', '.join(trouble)}: a hardware "
                                     f"fault. Tell the admins and keep off the node until fixed "
                                     f"(--exclude={','.join(nodes) or '<node>'})."))
    return notes


def run_shape(f: Facts) -> list[Note]:
    notes = []
    restarts = sum(a.restarts for a in f.attempts)
    if restarts:
        notes.append(Note("warn", f"The training crashed and was restarted in place {restarts} time"
                                  f"{'s' if restarts > 1 else ''}: see supervise.log for its last lines."))
    if f.verdict.status == "stopped":
        notes.append(Note("bad", "The run stopped before its work was done and was not requeued: resubmit with the same "
                                 "--run-dir (it resumes from the last durable checkpoint), or add --requeue."))
    refused = [e for e in f.requeue_refused]
    if refused and refused[-1].get("why") == "no-progress":
        r = refused[-1]
        notes.append(Note("bad", f"Not requeued: no new checkpoint reached persistent storage in the last "
                                 f"{r.get('attempts')} attempts, so another attempt would fail the same way (exit status "
                                 f"3). See supervise.log for how each attempt ended; fix the crash or hang, or "
                                 f"checkpoint more often, then resubmit with the same --run-dir."))
    elif refused:
        r = refused[-1]
        notes.append(Note("bad", f"A requeue was refused: {r.get('restart_count')} requeues already, --max-requeues "
                                 f"{r.get('max_requeues')}. Raise --max-requeues, or resubmit with the same --run-dir."))
    if f.journal["torn_last_line"]:
        notes.append(Note("info", "The journal's last line is torn: the supervisor was killed while writing it "
                                  "(SIGKILL or a full disk). Everything before it is reported."))
    return notes


def requests_ignored(f: Facts) -> list[Note]:
    waited = [(s.attempt, st.seconds) for s in f.stops for st in s.steps
              if st.step == "checkpoint" and (st.outcome or "").startswith("published (the next periodic save")]
    if not waited:
        return []
    n, seconds = waited[-1]
    return [Note("warn", f"The training does not answer checkpoint requests: the stop of attempt {n} waited "
                         f"{seconds:.1f}s for its next periodic save. Save when supervisor.training."
                         f"checkpoint_requested() is true (or on $SUPERVISE_CHECKPOINT_SIGNAL), then call acknowledge() "
                         f"(docs/training.md): stops get shorter and the warning lead can be learned.")]


RULES: list[Callable[[Facts], list[Note]]] = [run_shape, requests_ignored, warn_lead, checkpoint_pace, gpu_health, gpu_use,
                                              gpu_memory, host_memory, time_limit]


def notes(f: Facts) -> list[Note]:
    order = {"bad": 0, "warn": 1, "info": 2}
    out = [n for rule in RULES for n in rule(f)]
    return sorted(out, key=lambda n: order.get(n.level, 3))
