"""The seed's job script and ``supervise``, side by side on one synthetic training with a time limit.

    .venv/bin/python bench/vs_seed.py            # T = 240 s each, seed rsync every 60 s (~9 minutes)
    .venv/bin/python bench/vs_seed.py --quick    # T = 70 s each, rsync every 20 s (~2.5 minutes)

Both runs get the same synthetic training (``train.py``, written to a temp dir): a step every
``--step-time`` s; every ``--every`` s a checkpoint ``step_NNNNNN/`` of ``--files`` shards
(``--size-mib`` in all, written at a paced rate over ``--write-seconds`` like a real save) to a
node-local directory, its DCP marker ``.metadata`` written last (temp name + rename); a
TensorBoard stand-in log that grows. It uses ``supervisor.training``: on the checkpoint
request (signal or request file) it saves at once; on SIGTERM it saves once more and exits.
It writes an oracle file outside both systems: every step, every marker (wall time), its own
CPU time.

1. **seed**: the seed's bash script, its structure kept: a ``nvidia-smi dmon`` stand-in in the
   background (a Python process printing one line every ``--dmon-every`` s), the training in
   the background, ``while`` the training's ``ps`` state is not empty: ``rsync -a`` checkpoints
   and logs, ``sleep PERIOD``; then the final ``rsync -a`` of both and ``kill`` of the dmon.
2. **supervise**: ``supervise --checkpoints … --logs … --time-limit T --warn-before W
   --gpu-every DMON_EVERY -- python train.py``: it starts its stop sequence W seconds before the
   limit **on its own** (that is its point): checkpoint request, wait until it is durable, flush,
   stop the training.

The time limit is played the same way for both, like Slurm: at T seconds after the start every
process of the job gets SIGTERM (``--term-scope job``, what slurmstepd does; ``root``: only the
job's process, bash resp. supervise), SIGKILL after ``--kill-wait`` s; and when the job's process
ends, whatever it leaves running is SIGKILLed at once (Slurm ends the job when the batch script
ends). Node-local disk is then gone: only the persistent side counts.

Figures (per run, then the ratio seed ÷ supervise):

* work lost at the limit: last step trained vs last step whose checkpoint is complete on the
  persistent side at the end (what the next job resumes from); checkpoints written, durable, not;
* torn checkpoints on the persistent side at the end (a directory without its marker, or with a
  missing or short shard; "look complete" = has the marker but is torn), and torn views seen by
  the watcher during the run;
* durability lag p50/p95/max: marker written (training's clock) → complete copy visible on the
  persistent side (a watcher thread polls it at 20 Hz);
* supervisor CPU seconds: the harness is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so
  every process of the job, orphans included, is reaped by it or by a descendant it reaps; the
  job's CPU = the harness's ``RUSAGE_CHILDREN`` (user + sys) after the run minus before; the
  training reports its own ``getrusage(RUSAGE_SELF)`` in the oracle after every step and every
  shard; supervisor CPU = job CPU − training CPU (bash + ps/head/sleep + rsync + dmon stand-in,
  resp. supervise + its rsync);
* peak RSS: the job's process itself (``VmHWM`` of bash resp. supervise), and the summed
  ``VmRSS`` of every process of the job except the training, sampled at 10 Hz from /proc
  (short-lived helpers between two samples are missed).

The seed's real period is 600 s, which a benchmark cannot wait out many times; it runs with
``--period`` and the 600 s figures are modelled from the measured copy time: lag p50 = 300 s +
copy, p95 = 570 s + copy; at the limit everything since the last rsync is lost: on average 300 s
of training plus half a checkpoint interval, up to 600 s + one interval.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PR_SET_CHILD_SUBREAPER = 36
MARKER = ".metadata"

TRAIN = r'''
import argparse, os, resource, sys, time
sys.path.insert(0, sys.argv.pop(1))
from supervisor import training

ap = argparse.ArgumentParser()
ap.add_argument("--ckpt-dir", "--write-checkpoints-to", required=True)
ap.add_argument("--log-dir", "--tensorboard-logging-dir", required=True)
ap.add_argument("--oracle", required=True)
for name in ("--every", "--step-time", "--write-seconds"):
    ap.add_argument(name, type=float, required=True)
ap.add_argument("--size-mib", type=int, required=True)
ap.add_argument("--files", type=int, required=True)
a = ap.parse_args()
training.install_stop_handler()
oracle = open(a.oracle, "a", buffering=1)


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def note(*fields):
    oracle.write(" ".join(str(f) for f in fields) + "\n")


block = os.urandom(1 << 20)
chunks = max(1, a.size_mib // a.files)
pause = a.write_seconds / max(1, a.files * chunks)


def save(step, why):
    d = os.path.join(a.ckpt_dir, f"step_{step:06d}")
    if os.path.exists(d):
        return
    os.makedirs(d)
    for i in range(a.files):
        with open(os.path.join(d, f"shard_{i}.distcp"), "wb") as f:
            for _ in range(chunks):
                f.write(block)
                f.flush()
                time.sleep(pause)
        note("cpu", f"{cpu():.4f}")
    with open(os.path.join(d, ".metadata.tmp"), "w") as f:
        f.write(f"step {step}\n")
    os.replace(os.path.join(d, ".metadata.tmp"), os.path.join(d, ".metadata"))
    note("ckpt", step, f"{time.time():.6f}", why, f"{cpu():.4f}")


os.makedirs(a.ckpt_dir, exist_ok=True)
os.makedirs(a.log_dir, exist_ok=True)
tb = open(os.path.join(a.log_dir, "events.out.tfevents"), "a", buffering=1)
note("start", os.getpid(), f"{time.time():.6f}")
step = 0
next_ckpt = time.monotonic() + a.every
while True:
    time.sleep(a.step_time)
    step += 1
    note("step", step, f"{time.time():.6f}", f"{cpu():.4f}")
    if step % 10 == 0:
        tb.write(f"step {step} loss {1.0 / step:.6f}\n")
    if training.checkpoint_requested():
        save(step, "request")
        training.acknowledge()
        next_ckpt = time.monotonic() + a.every
    elif time.monotonic() >= next_ckpt:
        save(step, "periodic")
        next_ckpt = max(next_ckpt + a.every, time.monotonic())
    if training.stop_requested():
        save(step, "term")
        note("exit", step, f"{time.time():.6f}", f"{cpu():.4f}")
        sys.exit(0)
'''

DMON = r'''
import sys, time
every = float(sys.argv[1])
print("# gpu   pwr  gtemp  mtemp     sm    mem    enc    dec   mclk   pclk    date    time", flush=True)
while True:
    t = time.time()
    print(time.strftime("%Y%m%d %H:%M:%S"), "    0    43     30     -      0      0      0      0    877    135", flush=True)
    time.sleep(max(0.0, every - (time.time() - t)))
'''

# The seed's job script (seeds/003), its structure kept: paths and commands are arguments.
SEED = r'''#!/bin/bash
PERSISTENT_LOGGING_DIR=$1
LOCAL_LOGGING_DIR=$2
RSYNC_DELAY_SECONDS=$3
NVIDIA_SMI_DELAY_SECONDS=$4
PYTHON=$5
DMON=$6
shift 6
PERSISTENT_CHECKPOINTS_DIR=$PERSISTENT_LOGGING_DIR/checkpoints
PERSISTENT_TENSORBOARD_DIR=$PERSISTENT_LOGGING_DIR/tensorboard
mkdir -p $PERSISTENT_CHECKPOINTS_DIR
mkdir -p $PERSISTENT_TENSORBOARD_DIR
LOCAL_CHECKPOINTS_DIR=$LOCAL_LOGGING_DIR/checkpoints
LOCAL_TENSORBOARD_DIR=$LOCAL_LOGGING_DIR/tensorboard
mkdir -p $LOCAL_CHECKPOINTS_DIR
mkdir -p $LOCAL_TENSORBOARD_DIR

# start the nvidia-smi process in the background (a stand-in: no GPU here)
$PYTHON $DMON $NVIDIA_SMI_DELAY_SECONDS >> $PERSISTENT_LOGGING_DIR/nvidia-smi.log &
NVIDIA_SMI_PID=$!

# start the training process in the background
$PYTHON "$@" --write-checkpoints-to $LOCAL_CHECKPOINTS_DIR --tensorboard-logging-dir $LOCAL_TENSORBOARD_DIR &
HOROVODRUN_PID=$!

# asynchronous rsync of training logs between local and persistent storage
HOROVODRUN_STATE=$(ps -h --pid $HOROVODRUN_PID -o state | head -n 1)
while [ "${HOROVODRUN_STATE}" != "" ]
    do
        rsync -a $LOCAL_CHECKPOINTS_DIR/ $PERSISTENT_CHECKPOINTS_DIR
        rsync -a $LOCAL_TENSORBOARD_DIR/ $PERSISTENT_TENSORBOARD_DIR
        sleep $RSYNC_DELAY_SECONDS
        HOROVODRUN_STATE=$(ps -h --pid $HOROVODRUN_PID -o state | head -n 1)
done

# make sure to get any new files written since last rsync
rsync -a $LOCAL_CHECKPOINTS_DIR/ $PERSISTENT_CHECKPOINTS_DIR
rsync -a $LOCAL_TENSORBOARD_DIR/ $PERSISTENT_TENSORBOARD_DIR

# kill off the nvidia-smi process
kill $NVIDIA_SMI_PID
'''


# ----------------------------------------------------------------------------- processes

def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start time in ticks) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def descendants(root: int) -> list[int]:
    """Every process under ``root`` by parent links (zombies included)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st:
                children.setdefault(st[0], []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, IndexError, ValueError):
        return 0


def _hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _own_cpu(pid: int) -> float:
    """utime + stime of the process itself (its children not included), s."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# ----------------------------------------------------------------------------- watchers

class Watcher:
    """Polls the persistent checkpoint directory at 20 Hz: when each checkpoint is complete, torn views."""

    def __init__(self, dst: Path, files: int, shard_bytes: int) -> None:
        self.dst, self.files, self.shard = dst, files, shard_bytes
        self.durable: dict[str, float] = {}
        self.torn_seen: set[str] = set()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def state(self, d: Path) -> str:
        """complete, torn-marked (marker there, a shard missing/short), torn (no marker)."""
        shards_ok = True
        for i in range(self.files):
            try:
                shards_ok &= (d / f"shard_{i}.distcp").stat().st_size == self.shard
            except OSError:
                shards_ok = False
        if (d / MARKER).exists():
            return "complete" if shards_ok else "torn-marked"
        return "torn"

    def names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.dst) if not n.startswith("."))
        except OSError:
            return []

    def _run(self) -> None:
        while not self._stop.is_set():
            for n in self.names():
                if n in self.durable:
                    continue
                if self.state(self.dst / n) == "complete":
                    self.durable[n] = time.time()
                else:
                    self.torn_seen.add(n)
            self._stop.wait(0.05)

    def __enter__(self) -> "Watcher":
        self._t.start()
        return self

    def __exit__(self, *a: object) -> None:
        self._stop.set()
        self._t.join()


class ProcSampler:
    """10 Hz: summed RSS of the job's processes other than the training; VmHWM of the job's process."""

    def __init__(self, me: int, root: int, oracle: Path) -> None:
        self.me, self.root, self.oracle = me, root, oracle
        self.training: int | None = None
        self.peak_tree_kib = 0
        self.root_hwm_kib = 0
        self.root_cpu = 0.0  # user + sys of the job's process itself, last seen
        self.seen: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _training_pid(self) -> int | None:
        if self.training is None:
            try:
                with open(self.oracle) as f:
                    first = f.readline().split()
                if first[:1] == ["start"]:
                    self.training = int(first[1])
            except (OSError, IndexError, ValueError):
                pass
        return self.training

    def _run(self) -> None:
        while not self._stop.is_set():
            train = self._training_pid()
            pids = descendants(self.me)
            excluded = {train} | set(descendants(train)) if train else set()
            total = 0
            for pid in pids:
                if pid in excluded:
                    continue
                total += _rss_kib(pid)
                st = _stat(pid)
                if st:
                    self.seen.add((pid, st[1]))
            self.peak_tree_kib = max(self.peak_tree_kib, total)
            self.root_hwm_kib = max(self.root_hwm_kib, _hwm_kib(self.root))
            self.root_cpu = max(self.root_cpu, _own_cpu(self.root))
            self._stop.wait(0.1)

    def __enter__(self) -> "ProcSampler":
        self._t.start()
        return self

    def __exit__(self, *a: object) -> None:
        self._stop.set()
        self._t.join()


# ----------------------------------------------------------------------------- one run

@dataclass
class Run:
    name: str
    ended: str = ""
    root_exit_s: float = float("nan")
    exit_status: int | None = None
    left_running: int = 0
    steps: list[tuple[int, float]] = field(default_factory=list)
    ckpts: list[tuple[int, float, str]] = field(default_factory=list)
    train_cpu: float = 0.0
    train_exit: str = "killed"
    job_cpu: float = 0.0
    lags: list[float] = field(default_factory=list)
    durable_steps: list[int] = field(default_factory=list)
    final: dict[str, str] = field(default_factory=dict)
    torn_seen: int = 0
    root_hwm_mib: float = 0.0
    tree_peak_mib: float = 0.0
    helpers_seen: int = 0
    journal_end: dict | None = None
    t0: float = 0.0
    root_cpu: float = 0.0
    stop_at_s: float = float("nan")
    stop_reason: str = ""
    syncs: dict[str, int] = field(default_factory=dict)

    @property
    def last_step(self) -> int:
        return self.steps[-1][0] if self.steps else 0

    @property
    def stopped_training_s(self) -> float:
        return self.steps[-1][1] if self.steps else float("nan")

    @property
    def last_durable(self) -> int:
        return max(self.durable_steps, default=0)

    @property
    def supervisor_cpu(self) -> float:
        return self.job_cpu - self.train_cpu


def run_job(name: str, argv: list[str], a: argparse.Namespace, work: Path, oracle: Path, persistent_ckpt: Path,
            log: Path) -> Run:
    r = Run(name)
    me = os.getpid()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    shard = (a.size_mib // a.files) << 20
    cpu0 = _cpu_children()
    with Watcher(persistent_ckpt, a.files, shard) as watcher, open(log, "wb") as out:
        t0 = r.t0 = time.time()
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=work)
        with ProcSampler(me, p.pid, oracle) as sampler:
            try:
                p.wait(timeout=max(0.0, t0 + a.time_limit - time.time()))
                r.ended = "its own exit before the limit"
            except subprocess.TimeoutExpired:
                targets = [p.pid] if a.term_scope == "root" else [p.pid, *descendants(p.pid)]
                _signal_all(targets, signal.SIGTERM)
                try:
                    p.wait(timeout=a.kill_wait)
                    r.ended = f"SIGTERM at T (scope {a.term_scope}); its process exited"
                except subprocess.TimeoutExpired:
                    r.ended = f"SIGTERM at T (scope {a.term_scope}), SIGKILL {a.kill_wait:g} s later"
            r.root_exit_s = time.time() - t0
            r.exit_status = p.wait() if p.returncode is None else p.returncode
            # The job is over: Slurm kills what is left in it at once.
            rest = [pid for pid in descendants(me) if _stat(pid) is not None]
            r.left_running = sum(1 for pid in rest if not _is_zombie(pid))
            while True:
                rest = descendants(me)
                if not rest:
                    break
                _signal_all(rest, signal.SIGKILL)
                _reap(block=False)
                time.sleep(0.02)
        _reap(block=True)
        time.sleep(0.2)  # a last look by the watcher: nothing can change any more
    r.job_cpu = _cpu_children() - cpu0
    r.root_hwm_mib = sampler.root_hwm_kib / 1024
    r.root_cpu = sampler.root_cpu
    r.tree_peak_mib = sampler.peak_tree_kib / 1024
    r.helpers_seen = len(sampler.seen)
    _read_oracle(r, oracle, t0)
    marks = {f"step_{s:06d}": t for s, t, _ in r.ckpts}
    r.lags = [watcher.durable[n] - marks[n] for n in marks if n in watcher.durable]
    for n in watcher.names():
        r.final[n] = watcher.state(persistent_ckpt / n)
    r.durable_steps = [int(n.split("_")[1]) for n, st in r.final.items() if st == "complete"]
    r.torn_seen = len(watcher.torn_seen)
    return r


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def _reap(block: bool) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _read_oracle(r: Run, oracle: Path, t0: float) -> None:
    cpu = 0.0
    for line in oracle.read_text().splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "step" and len(f) == 4:
            r.steps.append((int(f[1]), float(f[2]) - t0))
            cpu = max(cpu, float(f[3]))
        elif f[0] == "cpu" and len(f) == 2:
            cpu = max(cpu, float(f[1]))
        elif f[0] == "ckpt" and len(f) == 5:
            r.ckpts.append((int(f[1]), float(f[2]), f[3]))
            cpu = max(cpu, float(f[4]))
        elif f[0] == "exit" and len(f) == 4:
            r.train_exit = "saved and exited"
            cpu = max(cpu, float(f[3]))
    r.train_cpu = cpu


# ----------------------------------------------------------------------------- the two systems

def prepare(work: Path, a: argparse.Namespace) -> tuple[Path, Path]:
    (work / "train.py").write_text(TRAIN)
    (work / "dmon.py").write_text(DMON)
    (work / "seed.sh").write_text(SEED)
    return work / "train.py", work / "dmon.py"


def train_args(a: argparse.Namespace, oracle: Path) -> list[str]:
    return [str(ROOT), "--oracle", str(oracle), "--every", str(a.every), "--step-time", str(a.step_time),
            "--write-seconds", str(a.write_seconds), "--size-mib", str(a.size_mib), "--files", str(a.files)]


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def run_seed(work: Path, a: argparse.Namespace) -> Run:
    base = fresh(work / "seed")
    local, pers, oracle = base / "local", base / "persistent", base / "oracle.txt"
    argv = ["bash", str(work / "seed.sh"), str(pers), str(local), f"{a.period:g}", f"{a.dmon_every:g}", sys.executable,
            str(work / "dmon.py"), str(work / "train.py"), *train_args(a, oracle)]
    return run_job("seed", argv, a, base, oracle, pers / "checkpoints", base / "job.log")


def run_supervise(work: Path, a: argparse.Namespace) -> Run:
    base = fresh(work / "supervise")
    local, pers, oracle = base / "local", base / "persistent", base / "oracle.txt"
    argv = [sys.executable, "-m", "supervisor", "-q", "--run-dir", str(pers / "run"),
            "--checkpoints", str(local / "checkpoints"), str(pers / "checkpoints"),
            "--logs", str(local / "tensorboard"), str(pers / "tensorboard"),
            "--time-limit", f"{a.time_limit:g}s", "--warn-before", f"{a.warn_before:g}s",
            "--gpu-every", f"{a.dmon_every:g}s", "--grace", f"{a.kill_wait:g}s",
            "--", sys.executable, str(work / "train.py"), *train_args(a, oracle),
            "--ckpt-dir", str(local / "checkpoints"), "--log-dir", str(local / "tensorboard")]
    r = run_job("supervise", argv, a, base, oracle, pers / "checkpoints", base / "job.log")
    try:
        for line in (pers / "run" / "events.jsonl").read_text().splitlines():
            ev = json.loads(line)
            if ev.get("kind") == "sync":
                key = f"{ev.get('pair')} ({ev.get('trigger', '?').split(':')[0]})"
                r.syncs[key] = r.syncs.get(key, 0) + 1
            elif ev.get("kind") == "end":
                r.journal_end = ev
            elif ev.get("kind") == "stop" and r.stop_at_s != r.stop_at_s:
                r.stop_at_s = float(ev["t"]) - r.t0
                r.stop_reason = str(ev.get("reason"))
    except (OSError, ValueError):
        pass
    return r


def copy_time(work: Path, a: argparse.Namespace) -> float:
    """Median of 3 plain ``rsync -a`` copies of one checkpoint of this size."""
    src = fresh(work / "copy-src") / "step_000000"
    src.mkdir()
    block = os.urandom(1 << 20)
    for i in range(a.files):
        with open(src / f"shard_{i}.distcp", "wb") as f:
            for _ in range(a.size_mib // a.files):
                f.write(block)
    (src / MARKER).write_text("m")
    times = []
    for i in range(3):
        t = time.monotonic()
        subprocess.run(["rsync", "-a", "--", f"{src.parent}/", f"{work}/copy-dst-{i}/"], check=True)
        times.append(time.monotonic() - t)
        shutil.rmtree(work / f"copy-dst-{i}")
    shutil.rmtree(src.parent)
    return statistics.median(times)


# ----------------------------------------------------------------------------- report

def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def ratio(s: float, o: float) -> str:
    if s != s or o != o:  # NaN
        return "—"
    if o == 0:
        return "—" if s == 0 else "∞"
    return f"{s / o:.2f}×" if s / o < 10 else f"{s / o:.0f}×"


def report(a: argparse.Namespace, seed: Run, sup: Run, copy: float) -> None:
    st = a.step_time

    def lost(r: Run) -> int:
        return r.last_step - r.last_durable

    def torn_final(r: Run) -> tuple[int, int]:
        return (sum(1 for v in r.final.values() if v != "complete"), sum(1 for v in r.final.values() if v == "torn-marked"))

    end = sup.journal_end or {}
    print(f"## Time limit T = {a.time_limit:g} s, SIGKILL {a.kill_wait:g} s after SIGTERM (scope: {a.term_scope})\n")
    print(f"* seed: rsync every {a.period:g} s (the seed's 600 s, scaled down; modelled below), dmon stand-in every "
          f"{a.dmon_every:g} s.")
    print(f"* supervise: `--time-limit {a.time_limit:g}s --warn-before {a.warn_before:g}s`: it **starts its stop "
          f"sequence on its own {a.warn_before:g} s before the limit**; the seed script has no such notion and "
          "learns of the limit from the SIGTERM.")
    print(f"* training: a step every {st:g} s, a checkpoint of {a.size_mib} MiB in {a.files} shards every {a.every:g} s, "
          f"written over {a.write_seconds:g} s, marker `{MARKER}` last.")
    print(f"* one checkpoint's copy with plain `rsync -a`: {copy:.2f} s (median of 3).\n")
    if a.only:
        print(f"(--only {a.only}: the other column was not run and reads 0 / nan)\n")
    print("| figure | seed script | supervise | seed ÷ supervise |")
    print("|---|---|---|---|")

    def row(label: str, s: str, o: str, rt: str = "") -> None:
        print(f"| {label} | {s} | {o} | {rt} |")

    row("how the job ended", f"{seed.ended}; exit {seed.exit_status}",
        f"{sup.ended} at {sup.root_exit_s:.1f} s; exit {sup.exit_status}"
        + (f"; journal end: {end.get('reason')}" if end else ""))
    row("stop sequence started at (s)", f"— (no notion of the limit; SIGTERM at {a.time_limit:g})",
        f"{sup.stop_at_s:.1f} (reason {sup.stop_reason or '?'}; T − W = {a.time_limit - a.warn_before:g})")
    row("job's process gone at (s)", f"{seed.root_exit_s:.1f}", f"{sup.root_exit_s:.1f}")
    row("processes left running at its exit (then SIGKILLed)", str(seed.left_running), str(sup.left_running))
    row("training: last step at (s) / how it ended", f"{seed.stopped_training_s:.1f} / {seed.train_exit}",
        f"{sup.stopped_training_s:.1f} / {sup.train_exit}")
    row("last step trained", str(seed.last_step), str(sup.last_step))
    row("**last durable step** (complete on persistent storage at the end)", f"**{seed.last_durable}**",
        f"**{sup.last_durable}**")
    row("training given up before the limit: T − last step (s)", f"{a.time_limit - seed.stopped_training_s:.1f}",
        f"{a.time_limit - sup.stopped_training_s:.1f}")
    row("**work lost at the limit**: steps trained − last durable (s of training)",
        f"**{lost(seed)}** ({lost(seed) * st:.1f} s)", f"**{lost(sup)}** ({lost(sup) * st:.1f} s)",
        ratio(lost(seed), lost(sup)))
    row("checkpoints written / durable at the end / not durable",
        f"{len(seed.ckpts)} / {len(seed.durable_steps)} / {len(seed.ckpts) - len(seed.durable_steps)}",
        f"{len(sup.ckpts)} / {len(sup.durable_steps)} / {len(sup.ckpts) - len(sup.durable_steps)}")
    ts, tsm = torn_final(seed)
    to, tom = torn_final(sup)
    row("**torn checkpoints on persistent storage at the end** (of which look complete: marker there)",
        f"**{ts}** ({tsm})", f"**{to}** ({tom})")
    row("checkpoints seen torn at some poll during the run (20 Hz)", str(seed.torn_seen), str(sup.torn_seen))
    row("**durability lag p50 / p95 / max (s)**, marker → complete copy visible",
        f"**{pct(seed.lags, .5):.2f} / {pct(seed.lags, .95):.2f}** / {max(seed.lags, default=float('nan')):.2f}",
        f"**{pct(sup.lags, .5):.2f} / {pct(sup.lags, .95):.2f}** / {max(sup.lags, default=float('nan')):.2f}",
        f"{ratio(pct(seed.lags, .5), pct(sup.lags, .5))} / {ratio(pct(seed.lags, .95), pct(sup.lags, .95))}")
    row("checkpoints in the lag figures", str(len(seed.lags)), str(len(sup.lags)))
    row("job CPU s (harness RUSAGE_CHILDREN) − training's own CPU s", f"{seed.job_cpu:.2f} − {seed.train_cpu:.2f}",
        f"{sup.job_cpu:.2f} − {sup.train_cpu:.2f}")
    ms, mo = seed.root_exit_s / 60, sup.root_exit_s / 60
    row("**supervisor CPU s** (per minute of job)", f"**{seed.supervisor_cpu:.2f}** ({seed.supervisor_cpu / ms:.3f})",
        f"**{sup.supervisor_cpu:.2f}** ({sup.supervisor_cpu / mo:.3f})", ratio(seed.supervisor_cpu, sup.supervisor_cpu))
    row("of which the job's process itself (bash / supervise; /proc, last 10 Hz sample)", f"{seed.root_cpu:.2f}",
        f"{sup.root_cpu:.2f}")
    row("**peak RSS, job's process** (VmHWM of bash / supervise, MiB)", f"**{seed.root_hwm_mib:.1f}**",
        f"**{sup.root_hwm_mib:.1f}**", ratio(seed.root_hwm_mib, sup.root_hwm_mib))
    row("peak RSS, all the job's processes but the training (summed, 10 Hz, MiB)", f"{seed.tree_peak_mib:.1f}",
        f"{sup.tree_peak_mib:.1f}", ratio(seed.tree_peak_mib, sup.tree_peak_mib))
    row("supervising processes seen by the 10 Hz sampler", str(seed.helpers_seen), str(sup.helpers_seen))

    if sup.syncs:
        print("\nsupervise's sync passes (journal `sync` events, by pair and trigger): "
              + ", ".join(f"{k} {v}" for k, v in sorted(sup.syncs.items()))
              + f"; the seed's loop ran 2 rsync per {a.period:g} s.")
    interval = a.every + a.write_seconds
    print(f"\n### The seed at its real period, 600 s (modelled from the copy time {copy:.2f} s)\n")
    print("| figure | seed, rsync every 600 s (modelled) | supervise (measured above) |")
    print("|---|---|---|")
    print(f"| durability lag p50 / p95 (s) | {300 + copy:.0f} / {570 + copy:.0f} | {pct(sup.lags, .5):.2f} / "
          f"{pct(sup.lags, .95):.2f} |")
    print(f"| training lost at the limit (s), mean / worst | {300 + interval / 2:.0f} / {600 + interval:.0f} | "
          f"{lost(sup) * st:.1f} |")
    print(f"| steps lost at {st:g} s a step, mean / worst | {(300 + interval / 2) / st:.0f} / "
          f"{(600 + interval) / st:.0f} | {lost(sup)} |")
    print("\nThe model: the seed's last rsync before the limit falls uniformly in the last 600 s; every checkpoint "
          "written after it, and the training since the last checkpoint before it, are lost; "
          "the final rsync never runs, because Slurm's SIGTERM ends bash first.")
    if a.time_limit % a.period == 0:
        print(f"\nHere T = {a.time_limit:g} s is a whole number of periods ({a.period:g} s), as a 24 h limit is of 600 s, "
              "so the seed's last rsync falls about one period before the limit (plus the loop's drift): "
              "near its worst case, which is where a real 24 h job with a 600 s loop lands too.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="T = 70 s, rsync every 20 s: under 3 minutes")
    ap.add_argument("--time-limit", type=float, default=240.0, help="the job's time limit T, s")
    ap.add_argument("--kill-wait", type=float, default=5.0, help="SIGTERM → SIGKILL at the limit (Slurm KillWait), s")
    ap.add_argument("--term-scope", choices=("job", "root"), default="job",
                    help="who gets SIGTERM at T: every process of the job (Slurm) or the job's process only")
    ap.add_argument("--period", type=float, default=60.0, help="the seed's rsync period (600 s in the seed)")
    ap.add_argument("--warn-before", type=float, default=20.0, help="supervise --warn-before, s")
    ap.add_argument("--dmon-every", type=float, default=1.0, help="dmon stand-in line / supervise --gpu-every, s")
    ap.add_argument("--every", type=float, default=15.0, help="the training's checkpoint interval, s")
    ap.add_argument("--step-time", type=float, default=0.1)
    ap.add_argument("--size-mib", type=int, default=32)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--write-seconds", type=float, default=2.0, help="how long one checkpoint takes to write")
    ap.add_argument("--only", choices=("seed", "supervise"), default=None)
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir, removed)")
    a = ap.parse_args()
    if a.quick:
        a.time_limit, a.period, a.every, a.warn_before, a.size_mib = 70.0, 20.0, 6.0, 15.0, 16
    if not shutil.which("rsync"):
        sys.exit("rsync not on PATH")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed: CPU figures would miss orphans")
    work = a.work or Path(tempfile.mkdtemp(prefix="supervise-bench-vs-seed-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        with open("/proc/loadavg") as f:
            load0 = f.read().split()[:3]
        print(f"# bench/vs_seed.py — {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
              f"{subprocess.run(['rsync', '--version'], capture_output=True, text=True).stdout.splitlines()[0]}, "
              f"load average at start {' '.join(load0)}")
        print(f"work dir {work} (node-local and persistent sides on the same filesystem)\n", flush=True)
        prepare(work, a)
        copy = copy_time(work, a)
        seed = run_seed(work, a) if a.only != "supervise" else Run("seed")
        print(f"(seed run done: {seed.root_exit_s:.0f} s)", file=sys.stderr, flush=True)
        sup = run_supervise(work, a) if a.only != "seed" else Run("supervise")
        with open("/proc/loadavg") as f:
            load1 = f.read().split()[:3]
        report(a, seed, sup, copy)
        print(f"\nload average at the end: {' '.join(load1)}")
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
