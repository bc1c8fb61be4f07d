"""Where a hung training hangs: every rank's Python stacks, dumped with py-spy, and grouped.

On a hang (docs/slurm.md, "Hangs") the stop sequence's ``stacks`` step runs ``py-spy dump
--json --native`` (native frames where py-spy can read them; without ``--native`` when that
fails) on every process of the training's tree, bounded in time, and writes one JSON file
per process under ``<run-dir>/stacks/attempt-<N>/``. py-spy is optional (``pip install
py-spy``); without it the step says so and the stop goes on. ``supervise report`` groups the
threads by identical stack (``group``), so "7 ranks in allreduce, 1 in save" reads at once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PER_PROCESS = 10.0  # seconds for one py-spy dump
STACKS_DIR = "stacks"


def py_spy() -> str | None:
    """py-spy on PATH, else beside this Python (a virtual environment's bin/)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if os.access(beside, os.X_OK) else None


def _is_python(pid: int) -> bool:
    try:
        return "python" in os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False


def dump(pids: set[int], out_dir: Path, *, timeout: float) -> dict[str, Any]:
    """Dump the Python processes among ``pids`` into ``out_dir``; blocking (run it in a thread).
    Returns the step's outcome: ``dumped`` pids, ``failed`` {pid: why}, ``dir``."""
    exe = py_spy()
    if exe is None:
        return {"skipped": "py-spy is not installed (pip install py-spy)"}
    targets = sorted(p for p in pids if _is_python(p))
    out_dir.mkdir(parents=True, exist_ok=True)
    dumped, failed = [], {}
    budget = max(1.0, timeout)
    for pid in targets:
        for native in (["--native"], []):
            try:
                r = subprocess.run([exe, "dump", "--json", *native, "--pid", str(pid)], capture_output=True, text=True,
                                   timeout=min(PER_PROCESS, budget), stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                failed[str(pid)] = "py-spy timed out"
                break
            if r.returncode == 0:
                (out_dir / f"pid-{pid}.json").write_text(r.stdout)
                dumped.append(pid)
                failed.pop(str(pid), None)
                break
            failed[str(pid)] = " ".join((r.stderr or r.stdout).split())[:300]
    return {"outcome": "dumped" if dumped else "failed", "dumped": dumped, "failed": failed, "dir": str(out_dir)}


INSIDE_TIMEOUT = 2.0  # seconds for one py-spy dump when asking whether a save is under way


def inside(pids: set[int], calls: tuple[str, ...], *, timeout: float = INSIDE_TIMEOUT) -> bool | None:
    """Is any thread of the Python processes among ``pids`` inside one of ``calls`` right now?

    ``calls`` are ``"file.py:function"`` (the file's name, not its directory): Accelerate's
    ``accelerator.py:save_state``. The sync engine asks this about a save that writes no
    marker of its own (docs/sync.md, Accelerate): the save is complete once no rank is inside
    it. One ``py-spy dump`` (Python frames only, about 10–40 ms) per process; blocking (call
    it from a worker thread). None when it cannot tell: py-spy missing, or a dump failed for
    a process that is still there."""
    exe = py_spy()
    if exe is None:
        return None
    wanted = [tuple(c.rsplit(":", 1)) for c in calls]
    for pid in sorted(p for p in pids if _is_python(p)):
        try:
            r = subprocess.run([exe, "dump", "--json", "--pid", str(pid)], capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL)
            threads = json.loads(r.stdout) if r.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            threads = None
        if threads is None:
            if os.path.exists(f"/proc/{pid}"):
                return None
            continue  # exited meanwhile: it is inside nothing
        for t in threads if isinstance(threads, list) else []:
            for f in t.get("frames") or []:
                file, name = os.path.basename(str(f.get("filename") or "")), str(f.get("name"))
                # Python 3.11+ frames carry the qualified name: Accelerator.save_state
                if any(file == wf and (name == wn or name.endswith("." + wn)) for wf, wn in wanted):
                    return True
    return False


def group(run_dir: Path) -> list[dict[str, Any]]:
    """Every dumped thread of the run, grouped by identical stack (function and file, innermost
    first), the most common first: ``{"attempt", "count", "pids", "frames"}``."""
    groups: dict[tuple[int, tuple[str, ...]], dict[str, Any]] = {}
    for path in sorted((run_dir / STACKS_DIR).glob("attempt-*/pid-*.json")):
        try:
            attempt = int(path.parent.name.split("-")[1])
            threads = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
        for t in threads if isinstance(threads, list) else []:
            frames = tuple(f"{f.get('name')} ({f.get('short_filename')}:{f.get('line')})" for f in t.get("frames") or [])
            g = groups.setdefault((attempt, frames), {"attempt": attempt, "count": 0, "pids": [], "frames": list(frames)})
            g["count"] += 1
            if t.get("pid") not in g["pids"]:
                g["pids"].append(t.get("pid"))
    return sorted(groups.values(), key=lambda g: (g["attempt"], -g["count"]))
