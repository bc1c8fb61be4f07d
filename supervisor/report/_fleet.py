"""``supervise report DIR…`` over many run directories: where a project's GPU-hours went.

A sweep, a long pretraining split into 12-hour jobs, a week of preemptible jobs: the questions
are about all of them. Each run directory is read as the single-run report reads it
(``_run.facts_of``, the same facts and goodput), so a row, and the totals, are the sums of the
single-run reports; only the sample files are not streamed (the GPU count comes from the head
of ``gpu.csv``), which keeps a thousand runs in seconds and bounded memory: one run's facts are
held at a time, a row keeps a few numbers.

Badput by cause (docs/report.md, "The fleet view"): every attempt's held time that was not
productive (``wall − productive``, what ``lost_gpu_hours`` counts) is split, so the causes add
up to the lost GPU-hours:

* ``startup``: the attempt's start → its first training step (start-up, restore);
* ``overhead``: the time after the training's last kept progress that is not lost work: the
  checkpoint and stop sequence, the exit after the final checkpoint;
* the **lost work** (training after the last durable checkpoint) by why the attempt ended:
  ``interrupted`` (a time limit, a preemption, a cancel), ``hang``, ``failed`` (the training or
  supervise failed) — or ``suspect_node`` when the attempt ran on a node that the fleet shows
  with a hardware fault (a suspect XID, a lost GPU, uncorrected ECC, a health-gate refusal) at
  the attempt's start or later. An attempt that never reached a first step counts whole as
  start-up, unless it hung or failed.

``queue_wait`` (the previous attempt's end → this one's start) holds no GPUs: it is shown in
hours beside the others, never in the GPU-hours.

This module renders the text and builds the JSON document; ``_fleet_html`` draws the page
from that document (neither imports the other).
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from supervisor.journal import EVENTS_FILE
from supervisor.policy import SUSPECT_XIDS
from supervisor.report._facts import FAILED, Facts
from supervisor.report._run import ReportError, facts_of
from supervisor.sched import recorded

SCHEMA = 1
MAX_DEPTH = 8  # folders below each path searched for run directories
MAX_JOURNAL_BYTES = 128 << 20  # a month of a busy run is ~40 MiB; past this, not a journal a run wrote
RUN_MARKS = (EVENTS_FILE, "supervise.log", "gpu.csv", "host.csv")  # any of them: a run directory, whole or not
CAUSES: dict[str, str] = {  # JSON key → label, in the order of the breakdown
    "queue_wait": "queue wait between attempts",
    "startup": "start-up and restore until the first step",
    "overhead": "checkpoint and stop overhead",
    "interrupted": "work lost to interruptions",
    "hang": "hangs",
    "failed": "failed attempts",
    "suspect_node": "time on nodes later found suspect",
}
HELD = tuple(c for c in CAUSES if c != "queue_wait")  # causes while the GPUs were held
PROBLEM_STATES = ("corrupt", "unreadable", "partial", "missing")
SORTS = {"start", "name", "lost", "ettr", "wall", "gpu-hours", "attempts", "state"}


@dataclass
class Row:
    """One run directory, as the fleet table shows it (also one object of ``runs`` in the JSON)."""

    name: str
    path: str
    state: str  # the verdict's status, or corrupt, unreadable, partial, missing
    headline: str
    job_ids: list[str] = field(default_factory=list)
    job_name: str | None = None
    attempts: int = 0
    requeues: int = 0
    start: float | None = None  # the first event's time
    end: float | None = None  # the last event's time (the journal's mtime for a row that could not be read)
    wall_s: float | None = None
    gpus: int | None = None
    gpu_hours: float | None = None  # GPUs × the attempts' wall time (queue waits hold none)
    productive_gpu_hours: float | None = None
    productive_s: float | None = None
    ettr: float | None = None
    lost_gpu_hours: float | None = None
    top_cause: str | None = None
    badput_s: dict[str, float] = field(default_factory=dict)
    badput_gpu_hours: dict[str, float] = field(default_factory=dict)
    last_checkpoint: str | None = None
    fix: str | None = None
    nodes: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class _Attempt:
    """What the second pass needs of an attempt: its lost work may move to ``suspect_node``."""

    node: str | None
    start: float
    lost_s: float
    cause: str


@dataclass
class _Hit:
    node: str
    kind: str  # xid, gpu-lost, ecc, health-gate, hang, crash
    detail: str
    hardware: bool
    t: float
    run: str
    job_id: str | None


# ------------------------------------------------------------------------------ finding runs

def has_magic(path: str) -> bool:
    return glob.has_magic(path)


def discover(paths: Sequence[str]) -> tuple[list[Path], list[Row]]:
    """The run directories under ``paths`` (folders, run directories, globs), each once, and a
    row for each path that names nothing or cannot be searched."""
    runs: dict[str, Path] = {}
    bad: list[Row] = []
    for arg in paths:
        matches = sorted(glob.glob(arg)) if glob.has_magic(arg) else [arg]
        if not matches:
            bad.append(Row(arg, arg, "missing", "MISSING: no such path" if not glob.has_magic(arg)
                           else "MISSING: the pattern matches nothing", error="no such path"))
        for m in matches:
            p = Path(m)
            if p.name == EVENTS_FILE and p.is_file():
                p = p.parent
            if not p.exists():
                bad.append(Row(str(p), str(p), "missing", "MISSING: no such path", error="no such path"))
            elif not p.is_dir():
                bad.append(Row(str(p), str(p), "corrupt", "NOT A RUN DIRECTORY: a file", error="not a directory"))
            else:
                _walk(p, 0, runs, bad)
    return list(runs.values()), bad


def _is_run(p: Path) -> bool:
    return any(os.path.lexists(p / mark) for mark in RUN_MARKS)


def _walk(p: Path, depth: int, runs: dict[str, Path], bad: list[Row]) -> None:
    if _is_run(p):
        runs.setdefault(os.path.realpath(p), p)  # a run directory is not searched further (its nodes/ are its own)
        return
    if depth >= MAX_DEPTH:
        return
    try:
        with os.scandir(p) as it:
            children = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
            dirs = [Path(e.path) for e in children if e.is_dir(follow_symlinks=False)]
    except OSError as e:
        bad.append(Row(str(p), str(p), "unreadable", f"UNREADABLE: {e.strerror or e}", error=str(e.strerror or e)))
        return
    for d in dirs:
        _walk(d, depth + 1, runs, bad)


def _names(runs: list[Path]) -> list[str]:
    """Short, distinct names: each run's path below the folder all of them are in."""
    if not runs:
        return []
    parents = [os.path.abspath(r.parent) for r in runs]
    base = os.path.commonpath(parents) if len(set(parents)) > 1 else parents[0]
    return [os.path.relpath(os.path.abspath(r), base) for r in runs]


# ------------------------------------------------------------------------------- one run

def _node(start: dict[str, Any]) -> str | None:
    """The scheduler's name for the node (what --exclude takes), else the host name."""
    env = start.get("scheduler_env") if isinstance(start.get("scheduler_env"), dict) else {}
    name = recorded(env).node or start.get("host")
    return str(name).split(".")[0] if isinstance(name, str) and name else None


def _hits(events: list[dict[str, Any]], nodes: dict[int, str | None], run: str, job_ids: dict[int, str | None]) -> list[_Hit]:
    """Failures of this run that implicate the node they happened on."""
    out: list[_Hit] = []

    def hit(e: dict[str, Any], kind: str, detail: str, hardware: bool) -> None:
        a = int(e.get("attempt") or 0)
        node = nodes.get(a)
        if node:
            out.append(_Hit(node, kind, detail, hardware, float(e["t"]), run, job_ids.get(a)))

    for e in events:
        kind = e.get("kind")
        if kind == "gpu-xid":
            xid = e.get("xid")
            hit(e, "xid", f"XID {xid}", xid in SUSPECT_XIDS)
        elif kind == "gpu-lost":
            hit(e, "gpu-lost", f"GPU {e.get('device', '?')} lost", True)
        elif kind == "gpu-end":
            for d in e.get("devices") or []:
                if isinstance(d, dict) and isinstance(d.get("ecc_uncorrected_delta"), int) and d["ecc_uncorrected_delta"] > 0:
                    hit(e, "ecc", f"{d['ecc_uncorrected_delta']} uncorrected ECC errors", True)
        elif kind == "health-gate" and e.get("ok") is False:
            hit(e, "health-gate", f"health gate: {e.get('why') or 'GPU memory not freed'}", True)
        elif kind == "hang":
            hit(e, "hang", "hang", False)
        elif kind == "end" and e.get("reason") == "child-failed":
            hit(e, "crash", f"crash (exit status {e.get('exit_status')})", False)
    return out


def _split(f: Facts) -> tuple[dict[str, float], list[_Attempt]]:
    """Per cause, the seconds of this run's held time that were not productive (module doc),
    and the attempts whose lost work the fleet may move to ``suspect_node``."""
    gp = f.goodput
    by: dict[str, float] = {c: 0.0 for c in CAUSES}
    attempts: list[_Attempt] = []
    if gp is None:
        return by, attempts
    starts = {a.number: a.start for a in f.attempts}
    for a in gp.attempts:
        by["queue_wait"] += a.queue_wait_s or 0.0
        lost_held = max(0.0, (a.wall_s or 0.0) - a.productive_s)
        reason = a.interrupted_by
        cause = "hang" if reason == "hang" else "failed" if reason in FAILED else "interrupted"
        if a.first_step_s is None and cause == "interrupted":  # stopped before it trained: all start-up
            startup, lost = lost_held, 0.0
        elif a.first_step_s is None:  # hung or failed before a first step: all of it
            startup, lost = 0.0, lost_held
        else:
            startup = min(lost_held, max(0.0, a.first_step_s))
            lost = min(lost_held - startup, a.lost_work_s)
        by["startup"] += startup
        by[cause] += lost
        by["overhead"] += max(0.0, lost_held - startup - lost)
        attempts.append(_Attempt(None, starts.get(a.attempt) or 0.0, lost, cause))
    return by, attempts


def _fix(f: Facts) -> str | None:
    """The first thing to change: the worst note (the single-run report has the rest)."""
    for level in ("bad", "warn"):
        for n in f.notes:
            if n.level == level:
                return n.text
    return None


def read_run(path: Path, name: str) -> tuple[Row, list[_Attempt], list[_Hit]]:
    """One run directory → its row, its attempts and the failures that implicate a node. Never
    raises for what is in the directory: a run that cannot be read is a row that says why."""
    events_path = path / EVENTS_FILE
    try:
        mtime: float | None = os.stat(events_path).st_mtime
    except OSError:
        mtime = None
    if not os.path.lexists(events_path):
        return (Row(name, str(path), "partial", f"PARTIAL: no {EVENTS_FILE} (the supervisor never journaled here?)",
                    end=mtime, error=f"no {EVENTS_FILE}"), [], [])
    st = os.lstat(events_path)
    if not stat.S_ISREG(st.st_mode):  # a link, a FIFO, a directory: never followed, never blocked on
        return Row(name, str(path), "corrupt", f"CORRUPT: {EVENTS_FILE} is not a plain file", end=mtime,
                   error=f"{EVENTS_FILE} is not a plain file"), [], []
    if st.st_size > MAX_JOURNAL_BYTES:
        why = f"{EVENTS_FILE} is {st.st_size / 2**20:.0f} MiB, past the fleet view's {MAX_JOURNAL_BYTES >> 20} MiB"
        return Row(name, str(path), "corrupt", f"CORRUPT: {why} (the single-run report reads it)", end=mtime,
                   error=why), [], []
    try:
        f, data = facts_of(path, samples=False)
    except ReportError as e:
        text = str(e)
        state = "unreadable" if ("not readable" in text or "cannot read" in text) else "corrupt"
        return Row(name, str(path), state, f"{state.upper()}: {text}", end=mtime, error=text), [], []
    j = f.journal
    if f.verdict.status == "empty":
        why = (f"no readable event ({len(j['bad_lines'])} unreadable lines, {j['malformed_events']} without a time)"
               if j["bad_lines"] or j["malformed_events"] or j["torn_last_line"] else "the journal is empty")
        return Row(name, str(path), "corrupt", f"CORRUPT: {why}", end=mtime, error=why), [], []
    events = data.journal.events
    starts = {int(e.get("attempt") or 0): e for e in events if e.get("kind") == "start"}
    nodes = {n: _node(s) for n, s in starts.items()}
    job_ids = {a.number: a.job_id for a in f.attempts}
    by, attempts = _split(f)
    for att, a in zip(attempts, f.attempts):
        att.node = nodes.get(a.number)
    gp = f.goodput
    gpus = gp.gpus if gp is not None else None
    held_s = sum(a.wall_s or 0.0 for a in gp.attempts) if gp is not None else 0.0
    times = [float(e["t"]) for e in events]
    row = Row(
        name=name, path=str(path), state=f.verdict.status, headline=f.verdict.headline,
        job_ids=list(dict.fromkeys(str(a.job_id) for a in f.attempts if a.job_id)),
        job_name=f.job.get("job_name") if isinstance(f.job.get("job_name"), str) else None,
        attempts=f.verdict.attempts, requeues=f.verdict.requeues,
        start=min(times) if times else None, end=max(times) if times else mtime,
        wall_s=gp.wall_s if gp is not None else None, gpus=gpus,
        gpu_hours=None if gpus is None else round(gpus * held_s / 3600, 4),
        productive_gpu_hours=None if gpus is None or gp is None else round(gpus * gp.productive_s / 3600, 4),
        productive_s=gp.productive_s if gp is not None else None,
        ettr=gp.ettr if gp is not None else None,
        lost_gpu_hours=gp.lost_gpu_hours if gp is not None else None,
        badput_s={k: round(v, 3) for k, v in by.items()},
        last_checkpoint=f.checkpoints.last.name if f.checkpoints.last else None,
        fix=_fix(f),
        nodes=list(dict.fromkeys(n for n in nodes.values() if n)),
        error=(f"{len(j['bad_lines'])} unreadable journal lines" if j["bad_lines"] else None),
    )
    return row, attempts, _hits(events, nodes, name, job_ids)


# --------------------------------------------------------------------------------- the set

def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from now (``7d``, ``12h``, ``90m``, ``1d12h``) or a UTC date or
    time (``2026-11-20``, ``2026-11-20T08:00``); raises ValueError saying what is accepted."""
    from datetime import datetime, timezone

    from supervisor._units import parse_duration

    now = time.time() if now is None else now
    s = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)d(.*)", s.lower())
    try:
        if m:
            return now - float(m.group(1)) * 86400 - (parse_duration(m.group(2)) if m.group(2) else 0.0)
        return now - parse_duration(s)
    except ValueError:
        pass
    try:
        d = datetime.fromisoformat(s)
    except ValueError:
        raise ValueError("a duration back from now (7d, 12h, 90m) or a UTC date or time (2026-11-20, "
                         "2026-11-20T08:00)") from None
    return (d if d.tzinfo else d.replace(tzinfo=timezone.utc)).timestamp()


def _sort_key(sort: str) -> Any:
    def num(v: float | None, desc: bool) -> tuple[int, float]:
        if v is None:
            return (1, 0.0)
        return (0, -v if desc else v)

    keys = {
        "start": lambda r: num(r.start if r.start is not None else r.end, False),
        "name": lambda r: (0, r.name),
        "lost": lambda r: num(r.lost_gpu_hours, True),
        "ettr": lambda r: num(r.ettr, False),
        "wall": lambda r: num(r.wall_s, True),
        "gpu-hours": lambda r: num(r.gpu_hours, True),
        "attempts": lambda r: num(float(r.attempts) if r.state not in PROBLEM_STATES else None, True),
        "state": lambda r: (0, r.state),
    }
    return keys[sort]


def _read_one(item: tuple[Path, str]) -> tuple[Row, list[_Attempt], list[_Hit]]:
    path, name = item
    try:
        return read_run(path, name)
    except OSError as e:  # a directory that vanished or turned unreadable while it was read
        return Row(name, str(path), "unreadable", f"UNREADABLE: {e.strerror or e}", error=str(e.strerror or e)), [], []
    except Exception as e:  # noqa: BLE001 - one run the report cannot read never ends the view of the others
        why = f"the report failed on it ({type(e).__name__}: {e})"[:300]
        return Row(name, str(path), "corrupt", f"CORRUPT: {why}", error=why), [], []


PARALLEL_FROM = 64  # runs; fewer are read in this process (a worker costs ~50 ms to start)


def default_jobs() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def read_all(items: list[tuple[Path, str]], jobs: int | None) -> list[tuple[Row, list[_Attempt], list[_Hit]]]:
    """Every run, in order: in worker processes when there are many (a login node has the cores;
    each worker holds one run's facts at a time). ``jobs`` None: ``default_jobs()`` from
    ``PARALLEL_FROM`` runs on; a number: that many, whatever the count."""
    if jobs is None:
        jobs = default_jobs() if len(items) >= PARALLEL_FROM else 1
    if jobs <= 1 or len(items) < 2:
        return [_read_one(i) for i in items]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else methods[0])
    try:
        with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            return list(pool.map(_read_one, items, chunksize=max(4, len(items) // (jobs * 8))))
    except (OSError, RuntimeError):  # no processes to be had (a limit): the same, in this one
        return [_read_one(i) for i in items]


def collect(paths: Sequence[str], *, since: float | None = None, states: Iterable[str] = (),
            sort: str = "start", jobs: int | None = 1) -> dict[str, Any]:
    """The fleet document (``--json``; the text and HTML views render it)."""
    found, rows = discover(paths)
    attempts: dict[int, list[_Attempt]] = {}
    hits: list[_Hit] = []
    for row, atts, h in read_all(list(zip(found, _names(found))), jobs):
        attempts[id(row)] = atts
        hits += h
        rows.append(row)
    wanted = {s.strip() for s in states if s.strip()}
    if since is not None:
        rows = [r for r in rows if (r.end if r.end is not None else r.start) is None
                or (r.end if r.end is not None else r.start or 0.0) >= since]
    if wanted:
        rows = [r for r in rows if r.state in wanted]
    names = {r.name for r in rows}
    hits = [h for h in hits if h.run in names]
    _charge_suspect_nodes(rows, attempts, hits)
    rows.sort(key=_sort_key(sort))
    doc = {
        "schema": SCHEMA, "kind": "fleet", "generated": round(time.time(), 3), "paths": list(paths),
        "filters": {"since": since, "states": sorted(wanted), "sort": sort},
        "runs": [dataclasses.asdict(r) for r in rows],
        "totals": _totals(rows),
        "badput": _badput(rows),
        "nodes": _nodes_table(hits),
        "ettr_by_day": _ettr_by_day(rows),
    }
    return doc


def _charge_suspect_nodes(rows: list[Row], attempts: dict[int, list[_Attempt]], hits: list[_Hit]) -> None:
    """Move an attempt's lost work to ``suspect_node`` when its node shows a hardware fault at
    its start or later, anywhere in the set; then the GPU-hours of each cause."""
    last_fault: dict[str, float] = {}
    for h in hits:
        if h.hardware:
            last_fault[h.node] = max(last_fault.get(h.node, h.t), h.t)
    for r in rows:
        for a in attempts.get(id(r), []):
            if a.node in last_fault and last_fault[a.node] >= a.start and a.lost_s > 0:
                r.badput_s[a.cause] = round(max(0.0, r.badput_s.get(a.cause, 0.0) - a.lost_s), 3)
                r.badput_s["suspect_node"] = round(r.badput_s.get("suspect_node", 0.0) + a.lost_s, 3)
        if r.gpus is not None:
            r.badput_gpu_hours = {c: round(r.gpus * r.badput_s.get(c, 0.0) / 3600, 4) for c in HELD}
        held = r.badput_gpu_hours if r.gpus is not None else {c: r.badput_s.get(c, 0.0) for c in HELD}
        top = max(HELD, key=lambda c: held.get(c, 0.0))
        r.top_cause = top if held.get(top, 0.0) > 0 else None


def _sum(values: Iterable[float | None], nd: int) -> float:
    return round(math.fsum(v for v in values if v is not None), nd)


def _totals(rows: list[Row]) -> dict[str, Any]:
    """Sums over the rows: ETTR is Σ productive / Σ wall of the runs with a wall time (each
    run's ETTR weighted by its wall time), the lost GPU-hours the sum of the runs' own."""
    by_state: dict[str, int] = {}
    for r in rows:
        by_state[r.state] = by_state.get(r.state, 0) + 1
    timed = [r for r in rows if r.wall_s and r.productive_s is not None]
    wall = math.fsum(r.wall_s or 0.0 for r in timed)
    productive = math.fsum(r.productive_s or 0.0 for r in timed)
    return {
        "runs": len(rows), "by_state": dict(sorted(by_state.items())),
        "problems": sum(1 for r in rows if r.state in PROBLEM_STATES),
        "attempts": sum(r.attempts for r in rows), "requeues": sum(r.requeues for r in rows),
        "wall_s": round(wall, 3), "productive_s": round(productive, 3),
        "ettr": round(productive / wall, 4) if wall > 0 else None,
        "gpu_hours": _sum((r.gpu_hours for r in rows), 4),
        "productive_gpu_hours": _sum((r.productive_gpu_hours for r in rows), 4),
        "lost_gpu_hours": _sum((r.lost_gpu_hours for r in rows), 4),
        "queue_wait_s": _sum((r.badput_s.get("queue_wait") for r in rows), 3),
        "runs_without_gpu_count": sum(1 for r in rows if r.gpus is None and r.state not in PROBLEM_STATES),
    }


def _badput(rows: list[Row]) -> list[dict[str, Any]]:
    out = []
    for c, label in CAUSES.items():
        gh = None if c == "queue_wait" else _sum((r.badput_gpu_hours.get(c) for r in rows), 4)
        out.append({"cause": c, "label": label, "seconds": _sum((r.badput_s.get(c) for r in rows), 3), "gpu_hours": gh,
                    "runs": sum(1 for r in rows if r.badput_s.get(c))})
    return out


def _nodes_table(hits: list[_Hit]) -> list[dict[str, Any]]:
    nodes: dict[str, dict[str, Any]] = {}
    for h in sorted(hits, key=lambda h: h.t):
        n = nodes.setdefault(h.node, {"node": h.node, "failures": 0, "suspect": False, "counts": {}, "details": [],
                                      "runs": [], "jobs": [], "first": h.t, "last": h.t})
        n["failures"] += 1
        n["suspect"] = n["suspect"] or h.hardware
        n["counts"][h.kind] = n["counts"].get(h.kind, 0) + 1
        n["last"] = h.t
        for key, v in (("details", h.detail), ("runs", h.run), ("jobs", h.job_id)):
            if v and v not in n[key] and len(n[key]) < 50:
                n[key].append(v)
    return sorted(nodes.values(), key=lambda n: (not n["suspect"], -n["failures"], n["node"]))


def _ettr_by_day(rows: list[Row]) -> list[dict[str, Any]]:
    """ETTR of the runs that ended each UTC day (Σ productive / Σ wall): the trend."""
    days: dict[str, list[float]] = {}
    for r in rows:
        if r.wall_s and r.productive_s is not None and r.end is not None:
            d = days.setdefault(time.strftime("%Y-%m-%d", time.gmtime(r.end)), [0.0, 0.0, 0.0])
            d[0] += r.productive_s
            d[1] += r.wall_s
            d[2] += 1
    return [{"day": k, "ettr": round(p / w, 4) if w else None, "runs": int(n)} for k, (p, w, n) in sorted(days.items())]


# ---------------------------------------------------------------------------------- text

def render(doc: dict[str, Any], *, colour: bool = False, width: int = 160) -> str:
    from supervisor.report._text import STATUS_COLOUR, Style, dur, escape, utc

    st = Style(colour)
    out: list[str] = []
    runs = doc["runs"]
    cols = [("RUN", 28), ("JOB", 12), ("STATE", 10), ("ATT", 3), ("WALL", 8), ("GPU-H", 8), ("ETTR", 6),
            ("LOST GPU-H", 10), ("TOP CAUSE", 12), ("LAST CHECKPOINT", 16)]
    fix_w = max(20, width - sum(w + 1 for _, w in cols))

    def cell(s: str, w: int, right: bool = False) -> str:
        s = escape(s)
        if len(s) > w:
            s = s[: w - 1] + "…"
        return s.rjust(w) if right else s.ljust(w)

    def gh(v: float | None) -> str:
        return "?" if v is None else f"{v:.2f}" if v >= 1 else f"{v:.4f}"

    out.append(st.head(" ".join(cell(n, w, i in (3, 4, 5, 6, 7)) for i, (n, w) in enumerate(cols)) + " WHAT TO FIX"))
    for r in runs:
        bad = r["state"] in PROBLEM_STATES
        fix = r["error"] if bad else (r["fix"] or "")
        cells = [r["name"], ",".join(r["job_ids"]) or "-", r["state"], str(r["attempts"]) if not bad else "-",
                 dur(r["wall_s"]) if r["wall_s"] is not None else "-", gh(r["gpu_hours"]) if not bad else "-",
                 f"{100 * r['ettr']:.1f}%" if r["ettr"] is not None else "-",
                 gh(r["lost_gpu_hours"]) if not bad else "-", (r["top_cause"] or "-").replace("_", " "),
                 r["last_checkpoint"] or "-"]
        state_colour = "31" if bad else STATUS_COLOUR.get(r["state"], "0")
        line = " ".join(st(state_colour, cell(c, w)) if i == 2 else cell(c, w, i in (3, 4, 5, 6, 7))
                        for i, (c, (_, w)) in enumerate(zip(cells, cols)))
        out.append(line + " " + cell(fix, fix_w).rstrip())
    t = doc["totals"]
    states = ", ".join(f"{n} {s}" for s, n in t["by_state"].items())
    out.append("")
    out.append(st.head(f"{t['runs']} run{'s' if t['runs'] != 1 else ''}") + (f" ({states})" if states else "")
               + f" · {t['attempts']} attempts, {t['requeues']} requeues")
    ettr = f"{100 * t['ettr']:.1f} %" if t["ettr"] is not None else "?"
    held = t["gpu_hours"]
    out.append(f"  GPU-hours held {gh(held)} · productive {gh(t['productive_gpu_hours'])} · lost {gh(t['lost_gpu_hours'])}"
               f" · ETTR {ettr} (Σ productive / Σ wall) · queue wait {dur(t['queue_wait_s'])}")
    if t["runs_without_gpu_count"]:
        out.append(f"  ({t['runs_without_gpu_count']} run(s) without a known GPU count are left out of the GPU-hours)")
    if t["problems"]:
        out.append(st("31", f"  {t['problems']} run director{'ies' if t['problems'] != 1 else 'y'} could not be read "
                            "(the rows say why)"))
    out.append(st.head("Badput by cause") + " (GPU-hours; the queue wait holds no GPUs, so it is in hours)")
    lost = t["lost_gpu_hours"] or 0.0
    for b in doc["badput"]:
        if b["gpu_hours"] is None:
            amount, share = f"{dur(b['seconds']):>12}", ""
        else:
            amount = f"{gh(b['gpu_hours']):>8} GPU-h"
            share = f" {100 * b['gpu_hours'] / lost:5.1f} %" if lost else ""
        out.append(f"  {b['label']:<44} {amount}{share:8}  {b['runs']} run{'s' if b['runs'] != 1 else ''}")
    if doc["nodes"]:
        out.append(st.head("Nodes implicated in failures") + " (suspect: a hardware fault; exclude it with --exclude)")
        for n in doc["nodes"][:30]:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(n["counts"].items()))
            mark = st("31", "suspect") if n["suspect"] else "       "
            jobs = ",".join(n["jobs"][:6]) + ("…" if len(n["jobs"]) > 6 else "")
            out.append(f"  {cell(n['node'], 20)} {mark} {n['failures']:>4} × ({counts}) in {len(n['runs'])} run(s)"
                       + (f", jobs {jobs}" if jobs else "") + f", last {utc(n['last'])} UTC")
        if len(doc["nodes"]) > 30:
            out.append(f"  … and {len(doc['nodes']) - 30} more (--json has them all)")
    return "\n".join(out) + "\n"
