"""Publishing one big checkpoint beside plain ``rsync -a`` of the same tree, side by side.

Two shapes (issue 25): many small files (100 000 × 4 KiB) and a few large ones (2 × 4 GiB).
Each run writes the checkpoint's data on local disk, then, in turn:

1. plain ``rsync -a TREE/ COPY/`` (timed, then the copy removed);
2. the real ``supervise --checkpoints LOCAL PERSISTENT`` for each stream count asked for
   (``--streams 1,2``): it is started with the data already there and no marker (``--settle
   1h``, so quiet time never completes it), then the DCP marker ``.metadata`` is written and
   the time until ``.metadata`` appears on the persistent side is measured (marker → published,
   which includes the listing, the copy, the re-check and the rename). The copier runs at
   rsync's priority (``SUPERVISE_SYNC_NICE=0``, ``SUPERVISE_SYNC_IONICE=none``); peak RSS is
   ``VmHWM`` of the supervise process, polled every 10 ms;
3. plain ``rsync -a`` again.

The baseline of a run is the mean of the two plain copies that bracket it (the disk of a
shared VM drifts within minutes); ``ratio`` = supervise / baseline (≤ 1.2 many files, ≤ 1.1
large files is the goal), ``vs best`` = supervise / the faster plain copy. Every copy is
``sync``ed before the next starts and removed after, so each starts from the same page cache.

    .venv/bin/python bench/manyfiles.py                       # 5 runs of each shape, streams 1 and 2
    .venv/bin/python bench/manyfiles.py --quick               # 10 000 files, 2 × 256 MiB, 2 runs
    .venv/bin/python bench/manyfiles.py --shapes many --streams 1,2,4 --runs 3
    .venv/bin/python bench/manyfiles.py --backend python      # the pure-Python copier
    .venv/bin/python bench/manyfiles.py --tree /work/main --streams 1   # another checkout, for before/after

Each run gets a fresh ext4 (a sparse file under ``--work``, loop-mounted, removed after the
run; ``--fs dir`` to use ``--work`` as it is, e.g. as non-root): on a shared VM whatever the
other engineers just deleted otherwise decides how fast 100 000 new inodes are made. Disk:
the large shape needs 2.5 × its size (the tree and one copy at a time), the many-file shape
keeps its copies until the run ends; the script refuses to start when ``--work`` has less.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUPERVISE = [sys.executable, "-m", "supervisor"]
MIB = 1 << 20
TREE = ROOT  # the supervise checkout timed (--tree)


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(TREE), **extra}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def write_many(step: Path, n: int, size: int) -> None:
    step.mkdir(parents=True)
    blob = os.urandom(size)
    for i in range(n):
        with open(step / f"f{i:06d}.bin", "wb") as f:
            f.write(blob)


def write_large(step: Path, count: int, size: int) -> None:
    step.mkdir(parents=True)
    block = os.urandom(64 * MIB)
    for i in range(count):
        with open(step / f"shard_{i}.bin", "wb") as f:
            left = size
            while left > 0:
                left -= f.write(block[: min(left, len(block))])


def _hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def _rm(path: Path, keep: bool) -> None:
    """Large copies go at once (quick, and the disk is shared); on a fresh filesystem many
    small files stay until it is unmounted: deleting 100 000 files takes minutes here, and
    ext4 then steers new inodes around what was just freed (docs/benchmarks.md)."""
    if not keep:
        shutil.rmtree(path, ignore_errors=True)
    os.sync()


class FreshFs:
    """A new ext4 in a sparse file for each run (root, mkfs.ext4): every run starts from the
    same empty filesystem, not from whatever the other engineers' tests just freed."""

    def __init__(self, base: Path, gib: float, inodes: int) -> None:
        self.img, self.mnt, self.gib, self.dev, self.inodes = base / "fs.img", base / "fs", gib, "", inodes

    def __enter__(self) -> Path:
        with open(self.img, "wb") as f:
            f.truncate(int(self.gib * 1024 * MIB))
        subprocess.run(["mkfs.ext4", "-q", "-F", "-N", str(self.inodes), str(self.img)], check=True)
        self.dev = subprocess.run(["losetup", "--direct-io=on", "--find", "--show", str(self.img)], check=True,
                                  capture_output=True, text=True).stdout.strip()
        self.mnt.mkdir(exist_ok=True)
        subprocess.run(["mount", self.dev, str(self.mnt)], check=True)
        return self.mnt

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", str(self.mnt)], check=False)
        subprocess.run(["losetup", "-d", self.dev], check=False)
        self.img.unlink(missing_ok=True)


def plain(step: Path, work: Path, keep: bool, k: int) -> float:
    out = work / f"plain-{k}"
    os.sync()
    t = time.monotonic()
    subprocess.run(["rsync", "-a", "--", f"{step}/", f"{out}/"], check=True)
    took = time.monotonic() - t
    _rm(out, keep)
    return took


def supervised(local: Path, step: Path, work: Path, streams: int, backend: str, keep: bool) -> tuple[float, int]:
    """(marker → published s, peak RSS KiB of supervise) for the checkpoint already at ``step``."""
    persistent = work / f"persistent-{streams}"
    published = persistent / step.name / ".metadata"
    os.sync()
    wait = f"import os, time\nwhile not os.path.exists({str(published)!r}): time.sleep(0.05)"
    env = _env(SUPERVISE_SYNC_NICE="0", SUPERVISE_SYNC_IONICE="none", SUPERVISE_SYNC_STREAMS=str(streams),
               SUPERVISE_SYNC_BACKEND=backend)
    p = subprocess.Popen([*SUPERVISE, "-q", "--gpu-every", "0", "--run-dir", str(work / "run"), "--settle", "1h",
                          "--checkpoints", str(local), str(persistent), "--", sys.executable, "-c", wait],
                         env=env, stderr=subprocess.DEVNULL)
    try:
        # started, watching, and its first pass (which finds the checkpoint without its marker) done
        deadline = time.monotonic() + 600
        journal = work / "run" / "events.jsonl"
        while not (journal.exists() and b'"sync-profile"' in journal.read_bytes()):
            if time.monotonic() > deadline or p.poll() is not None:
                raise RuntimeError("supervise did not start watching")
            time.sleep(0.05)
        time.sleep(1.0)
        (step / ".metadata").write_bytes(b"m")
        t0 = time.monotonic()
        hwm = 0
        while not published.exists():
            hwm = max(hwm, _hwm_kib(p.pid))
            if time.monotonic() - t0 > 1800 or p.poll() is not None:
                raise RuntimeError("the checkpoint was not published")
            time.sleep(0.01)
        took = time.monotonic() - t0
        hwm = max(hwm, _hwm_kib(p.pid))
    finally:
        if p.wait(timeout=600) != 0:
            raise RuntimeError(f"supervise exited {p.returncode}")
        (step / ".metadata").unlink(missing_ok=True)
        _rm(persistent, keep)
        shutil.rmtree(work / "run", ignore_errors=True)
    return took, hwm


def run_shape(name: str, base_dir: Path, runs: int, streams: list[int], backend: str, goal: float,
              write, gib: float, fresh: bool, keep: bool, files: int) -> list[tuple[int, float, float]]:
    """Print one line per run and stream count; return (streams, ratio, RSS MB) of each."""
    out = []
    for r in range(1, runs + 1):
        inodes = (3 + len(streams)) * files + 65536
        with (FreshFs(base_dir, gib, inodes) if fresh else contextlib.nullcontext(base_dir)) as work:
            local = work / "local"
            step = local / "step_000001"
            write(step)
            os.sync()
            before = plain(step, work, keep, 0)
            took = {s: supervised(local, step, work, s, backend, keep) for s in streams}
            after = plain(step, work, keep, 1)
            if not fresh:
                shutil.rmtree(local, ignore_errors=True)
            base = (before + after) / 2
            for s, (t, hwm) in took.items():
                ratio = t / base
                out.append((s, ratio, hwm / 1024))
                print(f"{name:5} run {r}  plain rsync -a {before:6.2f} / {after:6.2f} s   supervise ({backend}, "
                      f"{s} stream{'s' if s > 1 else ' '}) {t:6.2f} s   ratio {ratio:.2f} (vs best {t / min(before, after):.2f}; "
                      f"goal ≤ {goal})   peak RSS {hwm / 1024:5.1f} MB   load {os.getloadavg()[0]:.2f}", flush=True)
    for s in streams:
        rs = [x[1] for x in out if x[0] == s]
        mb = [x[2] for x in out if x[0] == s]
        print(f"{name:5} {s} stream(s): ratio {min(rs):.2f}–{max(rs):.2f} (median {statistics.median(rs):.2f}), "
              f"{sum(x <= goal for x in rs)}/{len(rs)} ≤ {goal}; peak RSS {min(mb):.1f}–{max(mb):.1f} MB", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 000 files, 2 × 256 MiB, 2 runs")
    ap.add_argument("--files", type=int, default=100_000, help="files in the many-file checkpoint")
    ap.add_argument("--file-size", type=int, default=4096, help="bytes per small file")
    ap.add_argument("--large", type=float, default=4.0, help="GiB per file of the large-file checkpoint")
    ap.add_argument("--large-count", type=int, default=2, help="files in the large-file checkpoint")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--streams", default="1,2", help="stream counts to time supervise with (sync_streams)")
    ap.add_argument("--backend", default="auto", choices=("auto", "rsync", "python"))
    ap.add_argument("--shapes", default="many,large", help="many, large or both")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir, removed)")
    ap.add_argument("--fs", choices=("fresh", "dir"), default="fresh" if os.geteuid() == 0 and shutil.which("mkfs.ext4")
                    else "dir", help="fresh: a new loop-mounted ext4 per run (root); dir: --work as it is")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the supervise checkout to time (default: this one)")
    a = ap.parse_args()
    global TREE
    TREE = a.tree.resolve()
    if a.quick:
        a.files, a.large, a.runs = 10_000, 0.25, 2
    streams = [int(s) for s in a.streams.split(",")]
    shapes = set(a.shapes.split(","))
    work = Path(tempfile.mkdtemp(prefix="manyfiles-", dir=a.work))
    need = max(2.5 * a.large * a.large_count * 1024 if "large" in shapes else 0,
               (3 + len(streams)) * a.files * (a.file_size + 4096) / MIB if "many" in shapes else 0)
    free = shutil.disk_usage(work).free / MIB
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} uptime: {os.popen('uptime').read().strip()}; "
          f"{os.cpu_count()} CPUs; free on {work}: {free / 1024:.1f} GiB (needs {need / 1024:.1f})", flush=True)
    if free < need:
        shutil.rmtree(work)
        sys.exit(f"not enough free disk on {work}: {free / 1024:.1f} GiB, {need / 1024:.1f} needed")
    fresh = a.fs == "fresh"
    copies = 3 + len(streams)
    try:
        if "many" in shapes:
            gib = copies * a.files * (a.file_size + 4096) / (1024 * MIB) + 1
            run_shape("many", work, a.runs, streams, a.backend, 1.2,
                      lambda step: write_many(step, a.files, a.file_size), gib, fresh, keep=fresh, files=a.files)
        if "large" in shapes:
            size = int(a.large * 1024 * MIB)
            run_shape("large", work, a.runs, streams, a.backend, 1.1,
                      lambda step: write_large(step, a.large_count, size), 2.5 * a.large * a.large_count + 1,
                      fresh, keep=False, files=a.large_count)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"# done {time.strftime('%H:%M:%S')}; uptime: {os.popen('uptime').read().strip()}", flush=True)


if __name__ == "__main__":
    main()
