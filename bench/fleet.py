"""Time and peak memory of ``supervise report DIR`` over a thousand run directories (issue 24).

    .venv/bin/python bench/fleet.py [--runs 1000] [--gpu-rows 2000] [--keep DIR] [--single 20]

Writes ``--runs`` run directories in the real formats under ``project/sweep-NN/`` (nested, as a
project keeps them), a realistic mix: finished 12-hour jobs, jobs requeued at the time limit,
preempted ones with work lost after the last checkpoint, failed ones, hung ones, one on a node
with an XID 79, and corrupt or partial directories (a few in a hundred). Each readable run has
a journal of a few hundred events (checkpoints every 30 min, a log pair synced every 5 min, the
stop sequences) and a ``gpu.csv`` of ``--gpu-rows`` rows.

Then, each in a fresh interpreter, with the child's own peak RSS (``os.wait4``: ``ru_maxrss``):

* the fleet view, as text and as ``--json`` (the goal: < 10 s and < 500 MB), with the default
  worker processes (the CPUs this process may use, at most 8) and with ``--jobs 1``;
* baselines in the same invocation: ``cat`` of every journal (reading them, nothing more), and
  the single-run report (``supervise report RUN --json``) on ``--single`` of the runs one after
  the other, scaled to all of them (what a shell loop over the runs would cost).
"""

from __future__ import annotations

import argparse
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

HOUR = 3600.0
KINDS = (("finished", 35), ("requeued", 20), ("preempted", 15), ("failed", 10), ("hung", 6), ("xid", 4),
         ("corrupt", 5), ("partial", 5))


def _kind(rng: random.Random) -> str:
    return rng.choices([k for k, _ in KINDS], weights=[w for _, w in KINDS])[0]


def make_run(run: Path, kind: str, rng: random.Random, now: float, gpu_rows: int) -> None:
    run.mkdir(parents=True)
    if kind == "corrupt":
        (run / "events.jsonl").write_bytes(rng.randbytes(4096) + b'\n{"v":1,"t":')
        return
    if kind == "partial":
        (run / "supervise.log").write_text("2026-11-20T10:00:00Z supervise[1] INFO run directory …\n")
        return
    ev: list[dict] = []

    def emit(t: float, attempt: int, k: str, **f: object) -> None:
        ev.append({"v": 1, "t": round(t, 6), "attempt": attempt, "kind": k, **f})

    gpus = rng.choice((4, 8))
    node0 = rng.randrange(200)
    attempts = {"requeued": rng.randint(2, 4), "preempted": 2, "xid": 2}.get(kind, 1)
    t = now - rng.uniform(0, 14 * 24 * HOUR)
    step = 0
    job = str(100000 + rng.randrange(900000))
    for a in range(1, attempts + 1):
        last = a == attempts
        node = f"gpu{(node0 + a) % 200:03d}"
        start = t
        limit = 12 * HOUR
        emit(start, a, "start", host=node, job_id=job, job_name="pretrain", scheduler="slurm", restart_count=a - 1,
             scheduler_env={"SLURMD_NODENAME": node, "SLURM_GPUS_ON_NODE": str(gpus), "SLURM_JOB_NUM_NODES": "1"},
             launcher="torchrun", command=["torchrun", "train.py"])
        emit(start + 0.1, a, "sync-start", backend="rsync", pairs=[{"name": "ckpt", "kind": "checkpoint", "from": "/l/c", "to": "/p/c"},
                                                                    {"name": "tb", "kind": "log", "from": "/l/tb", "to": "/p/tb"}])
        emit(start + 0.2, a, "deadline", end=start + limit, source="scheduler", lead_s=300.0, warn_at=start + limit - 300)
        if a > 1:
            emit(start + 5, a, "restore", pair="ckpt", checkpoint=f"step_{step:07d}", seconds=round(rng.uniform(20, 90), 1))
        spawn = start + rng.uniform(30, 120)
        emit(spawn, a, "spawn", pid=1000 + a, pgid=1000 + a, argv=["torchrun", "train.py"], launcher="torchrun", restart=0)
        emit(spawn + 1, a, "gpu-start", backend="nvml", every=10.0, devices=[
            {"index": i, "uuid": f"GPU-{node}-{i}", "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559} for i in range(gpus)])
        run_for = {"failed": rng.uniform(0.5, 3) * HOUR, "hung": rng.uniform(1, 6) * HOUR}.get(kind, limit - 600)
        if kind == "preempted" and not last:
            run_for = rng.uniform(1, 8) * HOUR
        if kind == "xid" and not last:
            run_for = rng.uniform(1, 5) * HOUR
        if kind == "finished":
            run_for = rng.uniform(2, 11.5) * HOUR
        x, end_t = spawn + 60, spawn + run_for
        while x < end_t:
            if int(x - spawn) // 1800 != int(x - spawn - 300) // 1800:
                step += 1500
                emit(x, a, "publish", pair="ckpt", checkpoint=f"step_{step:07d}", files=9, bytes=40 << 30,
                     why="marker .metadata", lag_s=round(rng.uniform(20, 90), 3))
                emit(x + 0.01, a, "sync", pair="ckpt", files=9, bytes=40 << 30, seconds=60.0, published=[f"step_{step:07d}"])
            emit(x + 0.02, a, "sync", pair="tb", files=2, bytes=81920, seconds=0.2)
            x += 300
        if kind == "xid" and not last:
            emit(end_t - 30, a, "gpu-xid", device=3, uuid=f"GPU-{node}-3", xid=79)
        if kind == "hung":
            emit(end_t, a, "hang", idle_s=600.0, action="stop", bound_s=600.0)
        reason = {"failed": "child-failed", "hung": "hang"}.get(kind, "child-exit" if last else "deadline")
        if kind == "preempted" and not last:
            reason = "preempted"
        if kind == "xid" and not last:
            reason = "child-failed"
        if kind == "requeued" and last:
            reason = "deadline"
        stop_t = end_t
        if reason == "child-failed" or reason == "child-exit":
            emit(stop_t, a, "child-exit", pid=1000 + a, exit_status=0 if reason == "child-exit" else 1)
        emit(stop_t, a, "stop", reason=reason, detail="", signal="SIGTERM" if reason == "preempted" else None,
             time_left_s=round(start + limit - stop_t, 3))
        requeued = not last or kind == "requeued"
        for name, secs in (("checkpoint", 95.0), ("flush", 40.0), ("stop-child", 12.0), ("final-flush", 8.0), ("requeue", 0.4)):
            stop_t += secs
            extra: dict[str, object] = {"outcome": "published"} if name == "checkpoint" and reason in ("deadline",) else {}
            if name == "requeue":
                extra = {"requeued": requeued, "message": "ok"} if requeued else {"skipped": "not wanted"}
                if kind == "xid" and not last:
                    extra.update(suspect=["XID 79 on GPU 3"], excluded=[node])
            emit(stop_t, a, "stop-step", step=name, seconds=secs, **extra)
        emit(stop_t + 0.1, a, "end", reason=reason, detail="", exit_status=0 if reason in ("child-exit", "deadline") else 1,
             seconds=round(stop_t - start, 3), restarts=0, not_durable=[])
        t = stop_t + rng.uniform(60, 4 * HOUR)  # the queue before the next attempt
    (run / "events.jsonl").write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in ev))
    head = ",".join(GPU_COLUMNS) + "\n"
    t0 = ev[0]["t"]
    rows = []
    for k in range(gpu_rows // gpus):
        for i in range(gpus):
            rows.append(f"{t0 + 10 * k:.3f},{i},GPU-gpu-{i},85,40,52000,81559,580.0,{1000.0 * k:.1f},70,1980,2619,,51000\n")
    (run / "gpu.csv").write_text(head + "".join(rows))
    (run / "supervise.log").write_text("started\n")


def make_fleet(root: Path, runs: int, gpu_rows: int) -> dict[str, int]:
    rng = random.Random(24)
    now = time.time()
    counts: dict[str, int] = {}
    for n in range(runs):
        kind = _kind(rng) if n else "xid"
        counts[kind] = counts.get(kind, 0) + 1
        make_run(root / "project" / f"sweep-{n // 100:02d}" / f"run-{n:04d}-{kind}", kind, rng, now, gpu_rows)
    return counts


def _tree_rss(pid: int) -> float:
    """MiB resident in ``pid`` and its children (the fleet view's worker processes)."""
    total = 0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
    return total / 2**20


def measure(argv: list[str]) -> tuple[float, float, float, int]:
    """Wall seconds, CPU seconds (children included), peak RSS (MiB: the process, or the sum over it
    and its worker processes, sampled every 20 ms, whichever is larger) and stdout bytes."""
    import threading

    t = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(argv, cwd=ROOT, stdout=out, env={**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"})
        peak = [0.0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.02):
                peak[0] = max(peak[0], _tree_rss(p.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(p.pid, 0)
        done.set()
        sampler.join()
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"{' '.join(argv[:4])}… failed: {os.waitstatus_to_exitcode(status)}")
        size = out.tell()
    return wall, usage.ru_utime + usage.ru_stime, max(peak[0], usage.ru_maxrss / 1024), size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--gpu-rows", type=int, default=2000, help="rows of each run's gpu.csv")
    ap.add_argument("--single", type=int, default=20, help="runs the single-run baseline reports on, one by one")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each fleet figure (the median is shown)")
    ap.add_argument("--keep", type=Path, help="make the run directories here and keep them")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = a.keep or Path(tmp)
        t = time.perf_counter()
        counts = make_fleet(base, a.runs, a.gpu_rows)
        journals = sorted(str(p) for p in (base / "project").glob("*/*/events.jsonl"))
        size = sum(os.path.getsize(p) for p in journals)
        print(f"{a.runs} run directories in {time.perf_counter() - t:.1f} s: "
              + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
              + f"; journals {size / 2**20:.1f} MiB, load {open('/proc/loadavg').read().split()[0]}")
        report = [sys.executable, "-m", "supervisor", "report", str(base / "project")]
        print(f"each fleet figure: median of {a.repeat} runs, interleaved (min in brackets)")
        print("| what | wall s | CPU s | peak RSS MiB | output |\n|---|---|---|---|---|")
        jobs = min(8, len(os.sched_getaffinity(0)))
        configs = ((f"fleet view, text (--jobs {jobs}, the default here)", report),
                   (f"fleet view, --json (--jobs {jobs})", [*report, "--json"]),
                   ("fleet view, text, --jobs 1", [*report, "--jobs", "1"]),
                   ("fleet view, --json, --jobs 1", [*report, "--json", "--jobs", "1"]))
        got: dict[str, list[tuple[float, float, float, int]]] = {label: [] for label, _ in configs}
        for _ in range(a.repeat):
            for label, argv in configs:
                got[label].append(measure(argv))
        fleet = {}
        for label, runs in got.items():
            walls_, cpus_ = sorted(r[0] for r in runs), sorted(r[1] for r in runs)
            wall, cpu = walls_[len(runs) // 2], cpus_[len(runs) // 2]
            fleet[label] = wall
            print(f"| {label} | {wall:.2f} ({walls_[0]:.2f}) | {cpu:.2f} ({cpus_[0]:.2f}) | {max(r[2] for r in runs):.0f} | "
                  f"{runs[0][3] / 1024:.0f} KiB |", flush=True)
        wall, cpu, rss, out = measure(["cat", *journals])
        print(f"| baseline: cat of every journal | {wall:.2f} | {cpu:.2f} | {rss:.0f} | {out / 2**20:.1f} MiB |")
        readable = [str(Path(p).parent) for p in journals if "corrupt" not in p][: a.single]
        walls = cpus = 0.0
        peak = 0.0
        for run in readable:
            w, c, r, _ = measure([sys.executable, "-m", "supervisor", "report", run, "--json"])
            walls, cpus, peak = walls + w, cpus + c, max(peak, r)
        scale = a.runs / max(1, len(readable))
        print(f"| baseline: single-run report × {len(readable)}, scaled to {a.runs} | {walls * scale:.2f} | "
              f"{cpus * scale:.2f} | {peak:.0f} (each) | |")
        for label, wall in fleet.items():
            print(f"{label}: {wall:.2f} s, {walls * scale / wall:.1f}× faster than a loop of single-run reports; "
                  f"goal < 10 s: {'met' if wall < 10 else 'NOT met'}")
        print(f"load after: {open('/proc/loadavg').read().split()[0]}")


if __name__ == "__main__":
    main()
