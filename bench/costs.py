"""The three costs of issue 17, each beside its baseline, in one run.

    .venv/bin/python bench/costs.py                 # ~10 minutes: 180 s trainings, 100 000 files
    .venv/bin/python bench/costs.py --quick         # ~2 minutes: 40 s trainings, 20 000 files

1. **CPU while training**: a training stand-in writes a TensorBoard-like event record every
   second and a checkpoint (4 shards of 8 MiB, DCP ``.metadata`` last) every minute to node-local
   directories, for ``--seconds``. Supervised (``supervise --checkpoints … --logs …``, defaults
   otherwise) against the seed job script's loop (``rsync -a`` of both, ``sleep 60``, while the training runs; then a final
   one). The cost is the job's CPU minus the training's own: every process of the job is reaped
   into this process's ``RUSAGE_CHILDREN`` (supervise is a subreaper; bash waits for its
   children), and the training reports its own ``getrusage`` at exit. Goal: < 1 % of a core.
2. **Start-up** added by ``supervise -- true`` against bare ``true``, median of ``--runs``
   (``bench/core.py``'s measurement). Goal: < 150 ms.
3. **One checkpoint of ``--files`` small files**: the time from its marker to its publication
   on the persistent side by a running supervise (default backend, its copier at plain rsync's
   priority: sync_nice 0, sync_ionice none), against plain ``rsync -a``
   of the same tree (run before and after; the better is the baseline), and supervise's peak
   RSS (``VmHWM``). Goals: ≤ 1.2× rsync, < 100 MB.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core import SUPERVISE  # noqa: E402 - the sibling benchmark's command line


def _env() -> dict[str, str]:
    """No scheduler, and bytecode caching on: a pip-installed supervise has its .pyc files
    (a PYTHONDONTWRITEBYTECODE=1 shell would make every start compile the package anew)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_")) and k != "PYTHONDONTWRITEBYTECODE"}

TRAINER = r"""
import os, resource, sys, time
ckpt, logs, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
os.makedirs(ckpt, exist_ok=True); os.makedirs(logs + "/run", exist_ok=True)
shard = os.urandom(8 << 20)
start = time.monotonic()
next_ckpt = start + 60.0
with open(logs + "/run/events.out.tfevents.1", "ab", buffering=0) as ev:
    step = 0
    while time.monotonic() - start < seconds:
        step += 1
        ev.write(b"scalar loss %d\n" % step * 8)        # one event record a second
        if time.monotonic() >= next_ckpt:               # a checkpoint a minute, marker last
            d = f"{ckpt}/step_{step:06d}"
            os.makedirs(d)
            for i in range(4):
                with open(f"{d}/shard_{i}.distcp", "wb") as f:
                    f.write(shard)
            with open(f"{d}/.metadata.tmp", "wb") as f:
                f.write(b"m")
            os.replace(f"{d}/.metadata.tmp", f"{d}/.metadata")
            next_ckpt += 60.0
        time.sleep(1.0)
r = resource.getrusage(resource.RUSAGE_SELF)
with open(out, "w") as f:
    f.write(str(r.ru_utime + r.ru_stime))
"""

SEED = r"""
python3 "$TRAINER" "$CKPT" "$LOGS" "$SECONDS_" "$OWN" & pid=$!
while [ -n "$(ps -o stat= -p $pid | grep -v Z)" ]; do
  rsync -a "$CKPT/" "$PCKPT/"; rsync -a "$LOGS/" "$PLOGS/"
  sleep 60
done
wait $pid; rsync -a "$CKPT/" "$PCKPT/"; rsync -a "$LOGS/" "$PLOGS/"
"""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def training_cpu(work: Path, seconds: float) -> tuple[float, float]:
    """(seed loop, supervise): CPU seconds of the job beyond the training's own."""
    work.mkdir(parents=True)
    trainer = work / "trainer.py"
    trainer.write_text(TRAINER)
    out = []
    for who in ("seed", "supervise"):
        d = work / who
        ckpt, logs, own = d / "local" / "ckpt", d / "local" / "logs", d / "own-cpu"
        before = _children_cpu()
        if who == "seed":
            env = {**_env(), "TRAINER": str(trainer), "CKPT": str(ckpt), "LOGS": str(logs), "SECONDS_": str(seconds),
                   "OWN": str(own), "PCKPT": str(d / "persistent" / "ckpt"), "PLOGS": str(d / "persistent" / "logs")}
            (d / "persistent").mkdir(parents=True)
            ckpt.mkdir(parents=True)
            logs.mkdir(parents=True)
            subprocess.run(["bash", "-c", SEED], env=env, check=True)
        else:
            subprocess.run([*SUPERVISE, "-q", "--run-dir", str(d / "run"),
                            "--checkpoints", str(ckpt), str(d / "persistent" / "ckpt"),
                            "--logs", str(logs), str(d / "persistent" / "logs"),
                            "--", sys.executable, str(trainer), str(ckpt), str(logs), str(seconds), str(own)],
                           env=_env(), check=True, stderr=subprocess.DEVNULL)
        out.append(_children_cpu() - before - float(own.read_text()))
    return out[0], out[1]


def startup(runs: int, tmp: Path) -> tuple[tuple[float, float], tuple[float, float]]:
    """((wall, CPU) of bare true, (wall, CPU) of supervise -- true): medians, interleaved.
    CPU (user + sys, from RUSAGE_CHILDREN) moves little with the machine's load; wall does."""
    true = shutil.which("true") or "/bin/true"

    def once(argv: list[str]) -> tuple[float, float]:
        c, t = _children_cpu(), time.perf_counter()
        subprocess.run(argv, check=True, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t, _children_cpu() - c

    def sup(i: int) -> list[str]:
        return [*SUPERVISE, "-q", "--gpu-every", "0", "--run-dir", str(tmp / f"startup-{i}"), "--", true]

    once(sup(-1))  # writes the .pyc files, as pip does at install time
    bare, ours = [], []
    for i in range(runs):
        bare.append(once([true]))
        ours.append(once(sup(i)))

    def med(xs: list[tuple[float, float]]) -> tuple[float, float]:
        return statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)

    return med(bare), med(ours)


def _hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def many_files(work: Path, n: int) -> tuple[float, float, int]:
    """(plain rsync -a s, marker → published s, supervise peak RSS KiB) for one n-file checkpoint."""
    local = work / "many" / "local"
    step = local / "step_000001"
    step.mkdir(parents=True)
    blob = os.urandom(4096)
    for i in range(n):
        (step / f"f{i:06d}.bin").write_bytes(blob)

    def plain(k: int) -> float:
        os.sync()
        t = time.monotonic()
        subprocess.run(["rsync", "-a", "--", f"{step}/", f"{work / 'many' / f'plain-{k}'}/"], check=True)
        return time.monotonic() - t

    before = plain(0)
    persistent = work / "many" / "persistent"
    published = persistent / step.name / ".metadata"
    os.sync()
    # the supervised command waits for the publication and exits; supervise then ends as it does
    wait = f"import os, time\nwhile not os.path.exists({str(published)!r}): time.sleep(0.05)"
    p = subprocess.Popen([*SUPERVISE, "-q", "--gpu-every", "0", "--run-dir", str(work / "many" / "run"),
                          "--checkpoints", str(local), str(persistent), "--", sys.executable, "-c", wait],
                         env={**_env(), "SUPERVISE_SYNC_NICE": "0", "SUPERVISE_SYNC_IONICE": "none"},
                         stderr=subprocess.DEVNULL)
    try:
        time.sleep(3.0)  # started, watching, the initial pass done
        (step / ".metadata").write_bytes(b"m")
        t0 = time.monotonic()
        hwm = 0
        while not published.exists():
            hwm = max(hwm, _hwm_kib(p.pid))
            if time.monotonic() - t0 > 600 or p.poll() is not None:
                raise RuntimeError("the checkpoint was not published")
            time.sleep(0.01)
        took = time.monotonic() - t0
        hwm = max(hwm, _hwm_kib(p.pid))
    finally:
        if p.wait(timeout=600) != 0:
            raise RuntimeError(f"supervise exited {p.returncode}")
    after = plain(1)
    return min(before, after), took, hwm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="40 s trainings, 20 000 files, 10 start-ups")
    ap.add_argument("--seconds", type=float, default=180.0, help="length of each training")
    ap.add_argument("--runs", type=int, default=20, help="start-ups measured")
    ap.add_argument("--files", type=int, default=100_000, help="files in the many-file checkpoint")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir, removed)")
    ap.add_argument("--sections", default="cpu,startup,files", help="which of cpu, startup, files to run")
    a = ap.parse_args()
    sections = set(a.sections.split(","))
    if a.quick:
        a.seconds, a.runs, a.files = 40.0, 10, 20_000
    work = Path(tempfile.mkdtemp(prefix="costs-", dir=a.work))
    try:
        if "cpu" in sections:
            seed, sup = training_cpu(work / "train", a.seconds)
            print(f"cpu       {a.seconds:.0f} s training (log every 1 s, checkpoint every 60 s): seed loop "
                  f"{seed:.2f} s CPU ({100 * seed / a.seconds:.2f} % of a core); supervise {sup:.2f} s CPU "
                  f"({100 * sup / a.seconds:.2f} % of a core; goal < 1 %)", flush=True)
        if "startup" in sections:
            (bw, bc), (sw, sc) = startup(a.runs, work)
            print(f"startup   median of {a.runs}: bare true {bw * 1000:.1f} ms wall; supervise -- true {sw * 1000:.1f} ms "
                  f"wall, {sc * 1000:.1f} ms CPU: added {(sw - bw) * 1000:.1f} ms wall, {(sc - bc) * 1000:.1f} ms CPU "
                  f"(goal < 150 ms; load {os.getloadavg()[0]:.2f})", flush=True)
        if "files" in sections:
            plain, took, hwm = many_files(work, a.files)
            print(f"files     one checkpoint of {a.files} x 4 KiB: plain rsync -a {plain:.2f} s; supervise marker → "
                  f"published {took:.2f} s ({took / plain:.2f}x; goal ≤ 1.2x), peak RSS {hwm / 1024:.1f} MB "
                  f"(goal < 100 MB)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
