"""Costs of the agent core, each beside its baseline in the same invocation.

    python bench/core.py [--runs 20] [--signals 200] [--idle 60]

1. startup: ``supervise -- true`` against bare ``true`` (median of --runs each);
2. signal forwarding: USR1 sent to supervise → seen by the child, against USR1 sent to
   the same child directly (p50/p99 over --signals, one at a time);
3. idle cost: CPU seconds and peak RSS of supervise while it supervises ``sleep``
   for --idle seconds, against the seed's bash (``sleep & wait``).
Prints figures and ratios; docs/benchmarks.md records them with this command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUPERVISE = [sys.executable, "-m", "supervisor"]
CHILD = r"""
import os, signal, sys, time
fd = int(sys.argv[1])
def on_usr1(sig, frame):
    os.write(fd, f"{time.time():.9f}\n".encode())
signal.signal(signal.SIGUSR1, on_usr1)
os.write(fd, b"ready\n")
while True:
    signal.pause()
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_"))}


def startup(runs: int, tmp: Path) -> tuple[float, float]:
    def once(argv: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t0

    true = shutil.which("true") or "/bin/true"
    bare, sup = [], []
    for i in range(runs):  # interleaved so load changes hit both alike
        bare.append(once([true]))
        sup.append(once([*SUPERVISE, "-q", "--gpu-every", "0", "--run-dir", str(tmp / f"startup-{i}"), "--", true]))
    return statistics.median(bare), statistics.median(sup)


def _latencies(target_pid_of, popen_argv: list[str], n: int, read_fd: int, write_fd: int) -> list[float]:
    p = subprocess.Popen(popen_argv, pass_fds=(write_fd,), env=_env(), stderr=subprocess.DEVNULL)
    os.close(write_fd)
    reader = os.fdopen(read_fd, "r")
    assert reader.readline().strip() == "ready"
    target = target_pid_of(p)
    out = []
    try:
        for _ in range(n):
            t0 = time.time()
            os.kill(target, signal.SIGUSR1)
            line = reader.readline()
            out.append(float(line) - t0)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        reader.close()
    return out


def forwarding(n: int, tmp: Path) -> tuple[list[float], list[float]]:
    r, w = os.pipe()
    direct = _latencies(lambda p: p.pid, [sys.executable, "-c", CHILD, str(w)], n, r, w)
    r, w = os.pipe()
    via = _latencies(lambda p: p.pid, [*SUPERVISE, "-q", "--gpu-every", "0", "--grace", "5s", "--run-dir", str(tmp / "fwd"),
                                       "--", sys.executable, "-c", CHILD, str(w)], n, r, w)
    return direct, via


def _cpu_and_hwm(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return cpu, hwm


SETTLE = 5.0  # seconds after the start before the steady-state window opens (imports, spawn)


def idle(seconds: int, tmp: Path) -> tuple[tuple[float, int, float], tuple[float, int, float]]:
    """(total CPU, peak RSS, CPU per minute once settled) of the supervising process itself,
    read just before it exits. The total includes start-up (imports: the startup figure);
    the rate is measured from SETTLE s after the start to the end, so it is the cost of
    supervising, not of starting."""

    def measure(argv: list[str]) -> tuple[float, int, float]:
        p = subprocess.Popen(argv, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(SETTLE)
        settled, _ = _cpu_and_hwm(p.pid)
        t0 = time.monotonic()
        time.sleep(seconds - 1 - SETTLE)
        # The child (sleep) still runs for ~1 s: read our process's totals now.
        cpu, hwm = _cpu_and_hwm(p.pid)
        rate = (cpu - settled) * 60 / (time.monotonic() - t0)
        p.wait(timeout=seconds + 30)
        return cpu, hwm, rate

    bash = measure(["bash", "-c", f"sleep {seconds} & wait"])
    sup = measure([*SUPERVISE, "-q", "--run-dir", str(tmp / "idle"), "--", "sleep", str(seconds)])
    return bash, sup


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--signals", type=int, default=200)
    ap.add_argument("--idle", type=int, default=60)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        bare, sup = startup(a.runs, tmp)
        print(f"startup   median of {a.runs}: bare true {bare*1000:.1f} ms, supervise -- true {sup*1000:.1f} ms, "
              f"added {(sup-bare)*1000:.1f} ms (goal < 150 ms)")
        direct, via = forwarding(a.signals, tmp)
        print(f"signals   {a.signals} x USR1: direct p50 {pct(direct,.5)*1000:.3f} ms p99 {pct(direct,.99)*1000:.3f} ms; "
              f"via supervise p50 {pct(via,.5)*1000:.3f} ms p99 {pct(via,.99)*1000:.3f} ms "
              f"(ratio p99 {pct(via,.99)/max(pct(direct,.99),1e-9):.1f}x; goal p99 < 10 ms)")
        (bcpu, bhwm, brate), (scpu, shwm, srate) = idle(a.idle, tmp)
        print(f"idle      {a.idle} s of sleep: bash {bcpu:.2f} s CPU in all ({brate:.3f} s/min settled), "
              f"{bhwm/1024:.1f} MB peak RSS; supervise {scpu:.2f} s CPU in all, start-up included, "
              f"{srate:.3f} s/min settled (goal < 0.2), {shwm/1024:.1f} MB peak RSS (goal < 60 MB)")


if __name__ == "__main__":
    main()
