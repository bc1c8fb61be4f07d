"""The one-screen text report: verdict first, then the story, then what to change."""

from __future__ import annotations

import dataclasses
import re
import textwrap
import time
from pathlib import Path
from typing import Any

from supervisor.report._facts import Facts, Gpu, throttled
from supervisor.report._nodes import NodeRow

WIDTH = 100
STATUS_COLOUR = {"finished": "32", "local-only": "31", "failed": "31", "cancelled": "33", "stopped": "31", "requeued": "33", "running": "36", "killed": "31"}
NOTE_MARK = {"bad": ("✗", "31"), "warn": ("!", "33"), "info": ("·", "36")}


class Style:
    """ANSI colour only when asked (a terminal, and no NO_COLOR)."""

    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def __call__(self, code: str, s: str) -> str:
        return f"\033[{code}m{s}\033[0m" if self.colour else s

    def head(self, s: str) -> str:
        return self("1", s)


def utc(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) if t is not None else "?"


def dur(s: float | None) -> str:
    if s is None:
        return "?"
    if abs(s) < 60:
        return f"{s:.1f}s"
    s = int(round(s))
    sign = "-" if s < 0 else ""
    h, rem = divmod(abs(s), 3600)
    m, sec = divmod(rem, 60)
    d, h = divmod(h, 24)
    return sign + (f"{d}d" if d else "") + (f"{h}h" if h or d else "") + f"{m:02d}m" + (f"{sec:02d}s" if not d else "")


def _gib(mib: float | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f}"


def mem(mib: float | None) -> str:
    if mib is None:
        return "?"
    return f"{mib:.0f} MiB" if mib < 1024 else f"{mib / 1024:.1f} GiB"


def meter(p: float | None, width: int = 20) -> str:
    if p is None:
        return "[" + " " * width + "]   n/a"
    n = int(round(width * min(100.0, max(0.0, p)) / 100))
    return "[" + "|" * n + " " * (width - n) + f"] {p:3.0f}%"


CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def escape(s: str) -> str:
    """Control characters from the journal (a checkpoint's name, a detail) shown, not obeyed."""
    return CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), s)


def sanitized(obj: Any) -> Any:
    """A copy of the facts with every string's control characters escaped (text and HTML views)."""
    if isinstance(obj, str):
        return escape(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: sanitized(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                           if f.init})
    if isinstance(obj, list):
        return [sanitized(x) for x in obj]
    if isinstance(obj, dict):
        return {k: sanitized(v) for k, v in obj.items()}
    return obj


def render(f: Facts, *, colour: bool = False) -> str:
    f = sanitized(f)
    st = Style(colour)
    out: list[str] = []
    v = f.verdict
    if v.local_only:
        out.append(st("31;1", v.local_only))
    out.append(st(STATUS_COLOUR.get(v.status, "1") + ";1", v.headline))
    for a in f.attempts:
        how = a.reason or "no end recorded"
        extra = f" ({a.detail})" if a.detail and a.detail != a.reason else ""
        status = f", exit status {a.exit_status}" if a.exit_status is not None and "exit status" not in extra else ""
        req = ", requeued" if a.requeued else ""
        came = {"requeue": " (requeued)", "rerun": " (rerun into the same run directory)",
                "replacement": " (a dead node replaced inside the allocation)"}.get(a.came_by or "", "")
        on = f" on {', '.join(a.nodes)}" if a.nodes else ""
        out.append(f"  attempt {a.number}{came}{on}: {how}{extra}{status}{req}")
        out += [f"    {line}" for line in a.lost_nodes]
        out += [f"    {line}" for line in a.replaced]
        if a.exit_note:
            out.append(f"    ({a.exit_note})")
    out += [f"  {line}" for line in summary(f)]
    job = f.job
    out.append(f"run dir {f.run_dir}" + (f" · job {job['job_id']}" if job.get("job_id") else "")
               + (f" ({job['job_name']})" if job.get("job_name") else "") + (f" · {job['scheduler']}" if job.get("scheduler") else ""))
    out += (_timeline(f, st) + _stops(f, st) + _stacks(f, st) + _checkpoints(f, st) + _goodput(f, st) + _gpus(f, st) + _nodes(f, st)
            + _host(f, st) + _notes(f, st))
    j = f.journal
    if j["torn_last_line"] or j["bad_lines"] or j["malformed_events"]:
        out.append(st("2", f"journal: {j['events']} events; torn last line: {'yes' if j['torn_last_line'] else 'no'}; "
                           f"unreadable lines: {j['bad_lines'] or 'none'}; left out (no time or attempt): "
                           f"{j['malformed_events']}"))
    return "\n".join(out) + "\n"


def summary(f: Facts) -> list[str]:
    """The overall meters under the verdict: are the checkpoints safe, did the GPUs work."""
    c = f.checkpoints
    if c.last:
        ck = f"checkpoints: {c.published} durable, last {c.last.name} (attempt {c.last.attempt})"
        if c.versions != c.published:
            ck += f", {c.versions} versions published"
    else:
        ck = "checkpoints: none durable" if c.pairs else "checkpoints: not mirrored"
    if c.not_durable:
        ck += f"; {len(c.not_durable)} left only on local disk"
    lines = [ck]
    utils = [g.util_mean_pct for g in f.gpus if g.util_mean_pct is not None]
    if utils:
        energy = sum(g.energy_kwh for g in f.gpus if g.energy_kwh is not None)
        lines.append(f"GPUs: {len(f.gpus)}, utilisation {meter(sum(utils) / len(utils))} mean of all, {energy:.3f} kWh")
    elif not f.gpus:
        lines.append("GPUs: no data")
    g = f.goodput
    if g is not None and g.ettr is not None:
        gpu_h = f", {g.lost_gpu_hours:.3f} GPU-hours lost on {g.gpus} GPUs" if g.lost_gpu_hours is not None else ""
        lines.append(f"goodput: ETTR {100 * g.ettr:.0f}% ({dur(g.productive_s)} productive of {dur(g.wall_s)} wall)"
                     f", work lost {dur(g.lost_work_s)}, queue wait {dur(g.queue_wait_s)}{gpu_h}")
    return lines


def _timeline(f: Facts, st: Style) -> list[str]:
    out = ["", st.head("Attempts"), f"  {'#':>2}  {'start (UTC)':19}  {'ran':>9}  {'host':14}  {'ended':14}  {'exit':>4}  what else"]
    for a in f.attempts:
        what = []
        if a.restore:
            what.append(a.restore.split(" (")[0] if a.restore.startswith("resumed") else a.restore)
        if a.restarts:
            what.append(f"{a.restarts} in-place restart{'s' if a.restarts > 1 else ''}")
        if a.signals:
            what.append("signals " + " ".join(a.signals))
        if a.time_limit_s:
            what.append(f"limit {dur(a.time_limit_s)}")
        out.append(f"  {a.number:>2}  {utc(a.start):19}  {dur(a.seconds):>9}  {str(a.host or '?')[:14]:14}  "
                   f"{str(a.reason or 'running?')[:14]:14}  {'' if a.exit_status is None else a.exit_status:>4}  {'; '.join(what)}")
    return out


def _stops(f: Facts, st: Style) -> list[str]:
    if not f.stops:
        return []
    out = ["", st.head("Stop sequences")]
    for s in f.stops:
        left = f", {dur(s.time_left_s)} before the job's end" if s.time_left_s is not None else ", no known end"
        out.append(f"  attempt {s.attempt} at {utc(s.t)}: {s.reason}" + (f" ({s.detail})" if s.detail else "") + left)
        for step in s.steps:
            outcome = step.outcome or ""
            bad = outcome.startswith(("timeout", "no-time")) or bool(step.killed)
            out.append(f"    {step.step:12} {dur(step.seconds):>7}  " + (st("31", outcome) if bad else outcome))
        margin = ""
        if s.margin_s is not None:
            by = {"kill-wait": " (KillWait after the scheduler's TERM)", "time-limit": " (the job's end)"}.get(s.kill_by or "", "")
            text = f"{dur(s.margin_s)} left before the hard kill{by}"
            margin = " · " + (st("31", text) if s.margin_s < 0 else text)
        out.append(f"    {'total':12} {dur(s.seconds):>7}{margin}")
    return out


def _stacks(f: Facts, st: Style) -> list[str]:
    """A hang's stack dumps (supervisor/stacks.py), threads grouped by identical stack."""
    from supervisor.stacks import group

    groups = group(Path(f.run_dir))
    if not groups:
        return []
    out = ["", st.head("Where it hung (py-spy, threads grouped by identical stack, innermost frame first)")]
    for g in groups:
        pids = ", ".join(str(p) for p in g["pids"])
        out.append(f"  attempt {g['attempt']}: {g['count']} thread{'s' if g['count'] != 1 else ''} (pid {pids})")
        out += [f"    {frame}" for frame in g["frames"][:STACK_FRAMES]]
        if len(g["frames"]) > STACK_FRAMES:
            out.append(f"    … {len(g['frames']) - STACK_FRAMES} more")
    return out


STACK_FRAMES = 12  # frames shown per group; the JSON dumps in the run directory have them all


def _checkpoints(f: Facts, st: Style) -> list[str]:
    c = f.checkpoints
    out = ["", st.head("Checkpoints")]
    if not c.pairs and not c.published:
        return out + ["  no checkpoint mirroring configured (--checkpoints LOCAL PERSISTENT)"]
    lag = f" · lag to persistent storage p50 {dur(c.lag_p50_s)} p95 {dur(c.lag_p95_s)}" if c.lag_p50_s is not None else ""
    every = f" · one every {dur(c.interval_s)} (median)" if c.interval_s else ""
    versions = f", {c.versions} versions" if c.versions != c.published else ""
    copy = f" · copy p95 {dur(c.copy_p95_s)}" if c.copy_p95_s is not None else ""
    settled = f" · {c.settled} with no marker (durable only after the settle time)" if c.settled else ""
    out.append(f"  {c.published} published{versions} ({', '.join(c.pairs) or '?'}){lag}{copy}{every}{settled}")
    if c.peer is not None:
        failed = f" · {st('33', f'{c.peer.failed} failed')} (tried again at the next look)" if c.peer.failed else ""
        exposure = f" · single-copy exposure p50 {dur(c.peer.exposure_p50_s)} p99 {dur(c.peer.exposure_p99_s)}" \
            if c.peer.copies else ""
        out.append(f"  peer copies: {c.peer.copies} versions on a partner node's disk{exposure}{failed}")
    if c.last:
        out.append(f"  last durable: {st('1', c.last.name)} ({c.last.pair}) at {utc(c.last.t)} UTC, attempt {c.last.attempt}")
    else:
        out.append("  " + st("31", "no checkpoint reached persistent storage"))
    if f.verdict.status in ("running", "killed"):
        out.append("  only on local disk: unknown until the attempt ends")
    elif c.not_durable:
        out.append("  " + st("31", "only on local disk: " + "; ".join(c.not_durable)))
    else:
        out.append("  only on local disk: nothing")
    if c.sync_failures:
        out.append("  " + st("33", f"{c.sync_failures} failed sync passes"))
    for r in c.restores:
        line = f"  restore, {r.text}"
        out.append(st("31", line) if r.outcome in ("not-resumed", "failed", "refused", "nodes-differ") else line)
    for t in c.torn:
        out.append("  " + st("31", f"torn (the training died writing it; never published): {t}"))
    for p in c.profiles:
        out.append(f"  completeness, {p}")
    return out


def _goodput(f: Facts, st: Style) -> list[str]:
    g = f.goodput
    if g is None or not g.attempts:
        return []
    gpus = f"{g.gpus} GPUs ({g.gpus_from})" if g.gpus else "GPU count unknown"
    out = ["", st.head("Goodput") + f" (ETTR = productive training time / wall time; {gpus})",
           f"  {'#':>2}  {'queued':>8}  {'wall':>8}  {'1st step':>8}  {'training':>8}  {'productive':>10}  "
           f"{'lost work':>9}  {'ETTR':>5}  lost GPU-h"]
    for a in g.attempts:
        steps = ""
        if a.lost_steps:
            steps = f" ({'' if a.lost_steps_exact else '≈'}{a.lost_steps} steps)"
        first = dur(a.first_step_s) + ("*" if a.first_step_by in ("log growth", "checkpoint") else "")
        out.append(f"  {a.attempt:>2}  {dur(a.queue_wait_s) if a.queue_wait_s is not None else '':>8}  {dur(a.wall_s):>8}  "
                   f"{first:>8}  {dur(a.training_s):>8}  {dur(a.productive_s):>10}  {dur(a.lost_work_s):>9}  "
                   f"{'' if a.ettr is None else f'{100 * a.ettr:.0f}%':>5}  "
                   f"{'' if a.lost_gpu_hours is None else f'{a.lost_gpu_hours:.3f}'}{steps}")
    out.append(f"  job: {dur(g.wall_s)} wall ({dur(g.queue_wait_s)} queued between attempts), {dur(g.productive_s)} "
               f"productive, {dur(g.lost_work_s)} of work lost, ETTR "
               f"{'?' if g.ettr is None else f'{100 * g.ettr:.1f}%'}"
               + (f", {g.lost_gpu_hours:.3f} GPU-hours not productive" if g.lost_gpu_hours is not None else ""))
    if any(a.first_step_by in ("log growth", "checkpoint") for a in g.attempts):
        out.append("  * first step seen only at the first log growth or checkpoint: an upper bound")
    return out


def _gpu_line(g: Gpu) -> list[str]:
    name = f" {g.name}" if g.name else ""
    memory = f"mem peak {_gib(g.mem_peak_mib)}/{_gib(g.mem_total_mib)} GiB" + (f" ({g.mem_peak_pct:.0f}%)" if g.mem_peak_pct is not None else "")
    power = f"{g.power_mean_w:.0f} W avg, {g.power_max_w:.0f} max" if g.power_mean_w is not None and g.power_max_w is not None else "power n/a"
    energy = f"{g.energy_kwh:.3f} kWh" if g.energy_kwh is not None else "energy n/a"
    slow = throttled(g)
    thr = ", ".join(f"{k} {100 * v / g.sampled_s:.0f}%" for k, v in slow.items()) if slow and g.sampled_s else "none"
    errs = []
    if g.xids:
        errs.append("XID " + ",".join(str(x) for x in g.xids))
    if g.ecc_uncorrected or g.ecc_corrected:
        errs.append(f"ECC {g.ecc_corrected or 0} corrected / {g.ecc_uncorrected or 0} uncorrected")
    if g.lost:
        errs.append("LOST")
    p95 = f" p95 {g.util_p95_pct:.0f}%" if g.util_p95_pct is not None else ""
    devices = g.uuids[0] if len(g.uuids) == 1 else f"{len(g.uuids)} devices over the attempts"
    return [f"  GPU {g.index}{name} ({devices})",
            f"    util {meter(g.util_mean_pct)} mean{p95} · {memory}",
            f"    {power} · {energy} · throttled: {thr} · errors: {', '.join(errs) or 'none'}"]


def _gpus(f: Facts, st: Style) -> list[str]:
    out = ["", st.head("GPUs")]
    if not f.gpus:
        return out + ["  no GPU data" + (": " + "; ".join(f.gpu_none) if f.gpu_none else "")]  # the one place it is said
    for g in f.gpus:
        lines = _gpu_line(g)
        if g.util_mean_pct is not None and g.util_mean_pct < 25:
            lines[1] = st("33", lines[1])
        if g.xids or g.ecc_uncorrected or g.lost:
            lines[2] = st("31", lines[2])
        out += lines
    total = [g.energy_kwh for g in f.gpus if g.energy_kwh is not None]
    if total:
        out.append(f"  all GPUs: {sum(total):.3f} kWh")
    return out


def roles(r: NodeRow) -> str:
    """``1 (node 0), 3 (node 1)``: the attempts a host was in, with its node rank in each."""
    return ", ".join(f"{a} (node {k})" for a, k in r.roles) or "none"


def node_samples(r: NodeRow) -> tuple[str, str]:
    """What a node's GPU and host samples say, as two short cells."""
    gpu = (f"{r.gpu_samples} GPU samples ({r.gpus} GPU{'s' if r.gpus != 1 else ''}), util {r.util_mean_pct:.0f}% mean"
           if r.util_mean_pct is not None else f"{r.gpu_samples} GPU samples" if r.gpu_samples else "no GPU samples")
    host = f"{r.host_samples} host samples" if r.host_samples else "no host samples"
    if r.mem_min_available_mib is not None and r.mem_total_mib:
        host += f", memory available ≥ {mem(r.mem_min_available_mib)} of {mem(r.mem_total_mib)}"
    if r.load1_mean is not None:
        host += f", load {r.load1_mean:.1f} mean"
    return gpu, host


def _nodes(f: Facts, st: Style) -> list[str]:
    """One row per node of a multi-node run (``_nodes``), with what went wrong on it."""
    if not f.nodes:
        return []
    out = ["", st.head("Nodes") + " (attempt (node rank); samples from the run directory and nodes/node-K/)"]
    for r in f.nodes:
        gpu, host = node_samples(r)
        flags = "; ".join(r.problems) or "ok"
        bad = r.lost or r.suspect or any(not p.startswith("not in ") for p in r.problems)
        out.append(f"  node {r.node}: attempts {roles(r)} · " + (st("31", flags) if bad else flags))
        out.append(f"    {gpu} · {host}")
    return out


def _host(f: Facts, st: Style) -> list[str]:
    h = f.host
    if h is None:
        return []
    cpu = f"CPU mean {h.cpu_mean_pct:.0f}% of a core, max {h.cpu_max_pct:.0f}%" if h.cpu_mean_pct is not None and h.cpu_max_pct is not None else "CPU n/a"
    asked = f" of {mem(h.mem_requested_mib)} asked for" if h.mem_requested_mib else ""
    node = ""
    if h.node_mem_total_mib and h.node_mem_min_available_mib is not None:
        node = f" · node memory available at least {mem(h.node_mem_min_available_mib)} of {mem(h.node_mem_total_mib)}"
    return ["", st.head("Training processes (host)"),
            f"  {cpu} · RSS peak {mem(h.rss_peak_mib)}{asked} · up to {h.nprocs_max} processes{node}"]


def _notes(f: Facts, st: Style) -> list[str]:
    out = ["", st.head("Notes")]
    if not f.notes:
        return out + ["  nothing to change"]
    for n in f.notes:
        mark, code = NOTE_MARK.get(n.level, ("·", "0"))
        wrapped = textwrap.wrap(n.text, WIDTH - 4) or [""]
        out.append(f"  {st(code, mark)} " + wrapped[0])
        out += ["    " + w for w in wrapped[1:]]
    return out
