"""Time and peak memory of ``supervise report`` on a long run: 7 days, 8 GPUs, every 10 s.

    .venv/bin/python bench/report.py [--days 7] [--gpus 8] [--every 10] [--keep DIR]

Writes a synthetic run directory in the real formats (``gpu.csv`` with the sampler's
columns, ``host.csv``, ``events.jsonl`` with one attempt a day at a 24 h limit, a stop
sequence at each, a checkpoint every 30 min with its publish events), then runs the
report three times, each in a fresh interpreter (``python -m supervisor report``): text,
``--json`` and ``--html``. For each: wall seconds, CPU seconds and the child's own peak
RSS (``os.wait4``: ``ru_maxrss``). The same on a 1-day run shows that memory does not grow with the run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from supervisor.gpu import GPU_COLUMNS  # noqa: E402

T0 = 1_790_000_000.0
DAY = 86400.0


def make_run(run: Path, *, days: float, gpus: int, every: float) -> dict[str, int]:
    """A run directory of ``days`` attempts of 24 h (the last one finishes)."""
    run.mkdir(parents=True)
    rng = random.Random(0)
    ev: list[dict] = []

    def emit(t: float, attempt: int, kind: str, **f: object) -> None:
        ev.append({"v": 1, "t": round(t, 6), "attempt": attempt, "kind": kind, **f})

    attempts = max(1, int(round(days)))
    ticks = int(days * DAY / every)
    step = 0  # the training's step goes on across attempts (it resumes from its checkpoint)
    for a in range(1, attempts + 1):
        start = T0 + (a - 1) * DAY
        end = min(T0 + days * DAY, start + DAY) - 60
        emit(start, a, "start", host=f"gpu-node-{a:02d}", job_id="4242", scheduler="slurm", restart_count=a - 1,
             scheduler_env={"SLURM_MEM_PER_NODE": "512000"})
        emit(start + 0.1, a, "sync-start", backend="rsync", pairs=[{"name": "ckpt", "kind": "checkpoint", "from": "/l", "to": "/p"}])
        emit(start + 0.2, a, "deadline", end=start + DAY, source="time-limit", lead_s=300.0, warn_at=start + DAY - 300, learned=False)
        emit(start + 1, a, "spawn", pid=1000 + a, pgid=1000 + a, argv=["torchrun", "train.py"], launcher="torchrun", restart=0)
        emit(start + 2, a, "gpu-start", backend="nvml", driver="550.54.15", source="CUDA_VISIBLE_DEVICES", every=every,
             xid=True, devices=[{"index": i, "uuid": f"GPU-{a}-{i}", "name": "NVIDIA H100 80GB HBM3",
                                 "memory_total_mib": 81559} for i in range(gpus)])
        t = start + 1800
        while t < end - 400:
            step += 1000
            emit(t, a, "publish", pair="ckpt", checkpoint=f"step_{step:07d}", trigger="watch", files=9,
                 bytes=40 << 30, why="marker .metadata", lag_s=round(rng.uniform(20, 90), 3))
            emit(t + 0.01, a, "sync", pair="ckpt", trigger="watch", files=9, bytes=40 << 30, seconds=60.0,
                 published=[f"step_{step:07d}"], backend="rsync")
            t += 1800
        last = a == attempts
        stop_t = end if last else start + DAY - 300
        reason = "child-exit" if last else "deadline"
        emit(stop_t, a, "stop", reason=reason, detail="", signal=None, time_left_s=300.0 if not last else None)
        for name, secs in (("checkpoint", 95.0), ("flush", 40.0), ("stop-child", 12.0), ("final-flush", 8.0), ("requeue", 0.4)):
            stop_t += secs
            emit(stop_t, a, "stop-step", step=name, seconds=secs, outcome="published" if name == "checkpoint" else "done")
        emit(stop_t + 0.1, a, "end", reason=reason, detail="", exit_status=0, seconds=stop_t - start, restarts=0, not_durable=[])
    (run / "events.jsonl").write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in ev))

    with open(run / "gpu.csv", "w", newline="") as g, open(run / "host.csv", "w", newline="") as h:
        gw, hw = csv.writer(g), csv.writer(h)
        gw.writerow(GPU_COLUMNS)
        hw.writerow(["time", "nprocs", "cpu_pct", "rss_mib", "node_mem_total_mib", "node_mem_available_mib", "load1"])
        energy = [0.0] * gpus
        for k in range(ticks):
            t = T0 + k * every
            a = int(k * every // DAY) + 1
            if k and int((k - 1) * every // DAY) + 1 != a:
                energy = [0.0] * gpus
            for i in range(gpus):
                util = 0 if i == 7 else min(100, max(0, int(rng.gauss(78, 15))))
                power = 120 + 5.5 * util
                energy[i] += power * every
                gw.writerow([f"{t:.3f}", i, f"GPU-{a}-{i}", util, util // 2, 52000 + (k % 100), 81559, f"{power:.1f}",
                             f"{energy[i]:.3f}", 60 + util // 10, 1980, 2619, "sw_power_cap" if util > 95 else "", 51000])
            hw.writerow([f"{t:.3f}", 41, f"{rng.uniform(700, 900):.1f}", 120000, 2063000, 1700000, 9.5])
    return {"gpu_rows": ticks * gpus, "host_rows": ticks, "events": len(ev),
            "bytes": sum(p.stat().st_size for p in run.iterdir())}


def measure(run: Path, *args: str) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MiB) of one ``supervise report`` in a fresh interpreter.

    CPU time (user + system) is the steadier figure on a shared machine.
    """
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "supervisor", "report", str(run), *args], cwd=ROOT,
                         stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    _, status, usage = os.wait4(p.pid, 0)  # this child's own rusage, not the largest child's so far
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"supervise report failed: {p.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--every", type=float, default=10)
    ap.add_argument("--keep", type=Path, help="make the run directory here and keep it")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = a.keep or Path(tmp)
        print("| run | rows (gpu.csv) | files | output | wall s | CPU s | peak RSS MiB |\n|---|---|---|---|---|---|---|")
        for days in sorted({1.0, a.days}):
            run = base / f"run-{days:g}d"
            size = make_run(run, days=days, gpus=a.gpus, every=a.every)
            for label, args in (("text", ()), ("--json", ("--json",)), ("--html", ("--html", str(base / f"r{days:g}.html")))):
                wall, cpu, peak = measure(run, *args)
                print(f"| {days:g} d × {a.gpus} GPUs / {a.every:g} s | {size['gpu_rows']:,} | "
                      f"{size['bytes'] / 2**20:.0f} MiB | {label} | {wall:.2f} | {cpu:.2f} | {peak:.0f} |", flush=True)


if __name__ == "__main__":
    main()
