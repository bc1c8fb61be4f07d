"""Benchmark of the sync room against what it replaces, side by side in one run.

1. Durability lag: a writer produces N checkpoints (4 shards + DCP ``.metadata`` written
   last) at a fixed interval; a poller thread notes when each becomes complete on the
   destination. Measured for the Mirror (each backend) and for the seed job script's loop
   (``rsync -a src/ dst/; sleep PERIOD``). The seed's 600 s period cannot be waited out 20
   times in a benchmark, so it runs with ``--seed-every`` and the 600 s figures are
   modelled from the same copy time (uniform phase: p50 = 300 s + copy, p95 = 570 s + copy).
   The poller also counts torn views: a visible checkpoint directory with a short or missing
   file or no marker.
2. Throughput: one 2 GB file and 20 000 small files, plain ``rsync -a`` against
   ``Mirror.flush`` (scan, stage, re-check, rename) per backend, both at normal priority;
   ratio = plain time / ours (≥ 1 means we are faster).
3. Final flush: with the Mirror running, a checkpoint is written and ``flush("stop")`` is
   called at once; the time until it returns with the checkpoint published.

    .venv/bin/python bench/sync.py            # full size (several minutes, ~6 GB of disk)
    .venv/bin/python bench/sync.py --quick    # small, for development
    .venv/bin/python bench/sync.py --work /mnt/bench   # on a freshly made filesystem

Many-file figures move with what the filesystem just freed (ext4 steers new inodes away from
recently deleted ones): docs/benchmarks.md shows how the recorded ones were taken.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.config import SyncPair  # noqa: E402
from supervisor.sync import Mirror  # noqa: E402

SHARDS = 4


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def write_ckpt(root: Path, name: str, size: int) -> float:
    """Write one checkpoint, marker last; return the wall time the marker landed."""
    d = root / name
    d.mkdir(parents=True)
    block = os.urandom(1 << 20)
    per = size // SHARDS
    for i in range(SHARDS):
        with open(d / f"shard_{i}.distcp", "wb") as f:
            left = per
            while left > 0:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
    (d / ".metadata.tmp").write_bytes(b"metadata")
    os.replace(d / ".metadata.tmp", d / ".metadata")
    return time.time()


class Poller:
    """Watches the destination from a thread: when each checkpoint is whole, and torn views."""

    def __init__(self, dst: Path, per_shard: int) -> None:
        self.dst, self.per = dst, per_shard
        self.durable: dict[str, float] = {}
        self.torn: set[str] = set()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _complete(self, d: Path) -> bool:
        try:
            if not (d / ".metadata").exists():
                return False
            return all((d / f"shard_{i}.distcp").stat().st_size == self.per for i in range(SHARDS))
        except FileNotFoundError:
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                names = [n for n in os.listdir(self.dst) if not n.startswith(".")]
            except FileNotFoundError:
                names = []
            for n in names:
                if n in self.durable:
                    continue
                if self._complete(self.dst / n):
                    self.durable[n] = time.time()
                else:
                    self.torn.add(n)
            time.sleep(0.01)

    def __enter__(self) -> "Poller":
        self._t.start()
        return self

    def __exit__(self, *a: object) -> None:
        self._stop.set()
        self._t.join()


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def lag_mirror(work: Path, backend: str, n: int, size: int, interval: float) -> dict:
    src, dst = fresh(work / "lag-src"), work / "lag-dst"
    shutil.rmtree(dst, ignore_errors=True)
    events: list[dict] = []
    mirror = Mirror([SyncPair("ckpt", "checkpoint", src, dst)], emit=lambda k, durable=False, **f: events.append({"kind": k, **f}),
                    sync_every=600, backend=backend)
    marks: dict[str, float] = {}

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run)
            await anyio.sleep(0.5)
            for k in range(n):
                t_next = time.monotonic() + interval
                name = f"step_{k:04d}"
                marks[name] = await anyio.to_thread.run_sync(write_ckpt, src, name, size)
                await anyio.sleep(max(0.0, t_next - time.monotonic()))
            with anyio.fail_after(120):
                while mirror.published < n:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    with Poller(dst, size // SHARDS) as poller:
        anyio.run(main)
        time.sleep(0.05)
    lags = [poller.durable[k] - marks[k] for k in marks if k in poller.durable]
    return {"lags": lags, "torn": len(poller.torn), "lost": n - len(lags),
            "journal_lag": [e["lag_s"] for e in events if e["kind"] == "publish"]}


def lag_seed(work: Path, n: int, size: int, interval: float, period: float) -> dict:
    """The seed job script's loop: ``while :; do rsync -a src/ dst/; sleep PERIOD; done``."""
    src, dst = fresh(work / "seed-src"), fresh(work / "seed-dst")
    marks: dict[str, float] = {}
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            subprocess.run(["rsync", "-a", "--", f"{src}/", f"{dst}/"], capture_output=True)
            stop.wait(period)

    with Poller(dst, size // SHARDS) as poller:
        t = threading.Thread(target=loop, daemon=True)
        t.start()
        for k in range(n):
            t_next = time.monotonic() + interval
            name = f"step_{k:04d}"
            marks[name] = write_ckpt(src, name, size)
            time.sleep(max(0.0, t_next - time.monotonic()))
        deadline = time.monotonic() + period + 120
        while len(poller.durable) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        t.join()
    lags = [poller.durable[k] - marks[k] for k in marks if k in poller.durable]
    return {"lags": lags, "torn": len(poller.torn), "lost": n - len(lags)}


def timed(argv: list[str]) -> float:
    t = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    return time.monotonic() - t


def mirror_flush_time(src: Path, dst: Path, backend: str) -> float:
    """At the plain rsync's priority: this compares work done, not how politely it yields."""
    mirror = Mirror([SyncPair("t", "checkpoint", src, dst)], emit=lambda k, durable=False, **f: f, backend=backend,
                    nice=0, ionice="none")
    t = time.monotonic()
    out = anyio.run(mirror.flush, "bench")
    took = time.monotonic() - t
    assert out["ok"] and mirror.published == 1, out
    return took


# ext4 steers new inodes away from ones freed in the last 60-300 s (ialloc.c, recently_deleted),
# scanning the bitmaps to do so: creating 20 000 files right after deleting 20 000 took 3-5x
# longer here (perf: most of the copy's time in recently_deleted). Every run of a many-file case
# therefore copies to a new directory, and the copies are deleted only after the case; the few
# big files are deleted at once (disk space).
MANY_FILES = 1000


def throughput(work: Path, backends: list[str], big: int, small: int, reps: int) -> list[tuple[str, str, float, float]]:
    rows = []
    cases = []
    if big:
        d = fresh(work / "tp-big") / "ckpt"
        d.mkdir()
        with open(d / "model.bin", "wb") as f:
            block = os.urandom(8 << 20)
            for _ in range(big // len(block)):
                f.write(block)
        (d / ".metadata").write_bytes(b"m")
        cases.append((f"one {big / 2**30:.1f} GiB file", work / "tp-big", 2))
    d = fresh(work / "tp-small") / "ckpt"
    d.mkdir()
    blob = os.urandom(4096)
    for i in range(small):
        (d / f"f{i:06d}.bin").write_bytes(blob)
    (d / ".metadata").write_bytes(b"m")
    cases.append((f"{small} files of 4 KiB", work / "tp-small", small + 1))
    for label, src, files in cases:
        times: dict[str, list[float]] = {"plain": [], **{b: [] for b in backends}}
        order = ["plain", *backends]
        outs = fresh(work / "tp-dst")
        for rep in range(reps):  # interleaved and rotated: cache and neighbours' load hit all alike
            for who in order[rep % len(order):] + order[:rep % len(order)]:
                out_dir = outs / f"{who}-{rep}"
                os.sync()
                if who == "plain":
                    times[who].append(timed(["rsync", "-a", "--", f"{src}/", f"{out_dir}/"]))
                else:
                    times[who].append(mirror_flush_time(src, out_dir, who))
                if files < MANY_FILES:
                    shutil.rmtree(out_dir)
        shutil.rmtree(outs, ignore_errors=True)
        for b in backends:
            rows.append((label, b, times["plain"], times[b]))
        shutil.rmtree(src, ignore_errors=True)
    return rows


def final_flush(work: Path, backend: str, size: int, reps: int) -> list[float]:
    src, dst = fresh(work / "ff-src"), work / "ff-dst"
    shutil.rmtree(dst, ignore_errors=True)
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=lambda k, durable=False, **f: f,
                    sync_every=600, backend=backend)
    times: list[float] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run)
            await anyio.sleep(0.3)
            for k in range(reps):
                before = mirror.published
                await anyio.to_thread.run_sync(write_ckpt, src, f"step_{k:04d}", size)
                t = time.monotonic()
                with anyio.fail_after(120):
                    await mirror.flush("stop")
                times.append(time.monotonic() - t)
                assert mirror.published > before and (dst / f"step_{k:04d}" / ".metadata").exists()
                await anyio.sleep(0.5)
            tg.cancel_scope.cancel()

    anyio.run(main)
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(dst, ignore_errors=True)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for development")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between checkpoints")
    ap.add_argument("--seed-every", type=float, default=20.0, help="period of the simulated seed loop")
    ap.add_argument("--big-gb", type=float, default=2.0)
    ap.add_argument("--small", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backends", default="rsync,python")
    ap.add_argument("--sections", default="lag,throughput,flush", help="which of lag, throughput, flush to run")
    a = ap.parse_args()
    if a.quick:
        a.count, a.size_mb, a.interval, a.seed_every, a.big_gb, a.small, a.reps = 5, 8, 1.0, 3.0, 0.25, 2000, 2
    backends = [b for b in a.backends.split(",") if b != "rsync" or shutil.which("rsync")]
    work = a.work or Path(tempfile.mkdtemp(prefix="supervise-bench-sync-"))
    size = a.size_mb << 20
    try:
        print(f"# bench/sync.py — {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
              f"{subprocess.run(['rsync', '--version'], capture_output=True, text=True).stdout.splitlines()[0]}")
        print(f"work dir {work} (source and destination on the same filesystem)\n")

        sections = set(a.sections.split(","))
        src1 = fresh(work / "copy1")
        write_ckpt(src1, "one", size)
        copy = statistics.median(timed(["rsync", "-a", "--", f"{src1}/", f"{work}/copy1-dst-{i}/"]) for i in range(3))
        shutil.rmtree(src1)
        for i in range(3):
            shutil.rmtree(work / f"copy1-dst-{i}", ignore_errors=True)
        if "lag" in sections:
            lag_section(a, work, backends, size, copy)
        if "throughput" in sections:
            throughput_section(a, work, backends)
        if "flush" in sections:
            flush_section(a, work, backends, size)
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)


def lag_section(a: argparse.Namespace, work: Path, backends: list[str], size: int, copy: float) -> None:
    print(f"## 1. Durability lag, {a.count} checkpoints of {a.size_mb} MiB every {a.interval:g} s\n")
    print(f"copy time of one checkpoint with plain `rsync -a`: {copy:.2f} s; goal p95 < {copy + 1:.2f} s\n")
    print("| method | p50 lag (s) | p95 lag (s) | max (s) | not durable at end | checkpoints seen torn |")
    print("|---|---|---|---|---|---|")
    for b in backends:
        r = lag_mirror(work, b, a.count, size, a.interval)
        print(f"| Mirror ({b}) | {pct(r['lags'], .5):.2f} | {pct(r['lags'], .95):.2f} | {max(r['lags'], default=float('nan')):.2f} "
              f"| {r['lost']} | {r['torn']} |", flush=True)
    r = lag_seed(work, a.count, size, a.interval, a.seed_every)
    print(f"| seed loop, rsync every {a.seed_every:g} s (measured) | {pct(r['lags'], .5):.2f} | {pct(r['lags'], .95):.2f} "
          f"| {max(r['lags'], default=float('nan')):.2f} | {r['lost']} | {r['torn']} |")
    print(f"| seed loop, rsync every 600 s (modelled) | {300 + copy:.0f} | {570 + copy:.0f} | {600 + copy:.0f} | — | — |\n", flush=True)
    shutil.rmtree(work / "seed-src", ignore_errors=True)
    shutil.rmtree(work / "seed-dst", ignore_errors=True)
    shutil.rmtree(work / "lag-src", ignore_errors=True)
    shutil.rmtree(work / "lag-dst", ignore_errors=True)


def throughput_section(a: argparse.Namespace, work: Path, backends: list[str]) -> None:
    print(f"## 2. Throughput against plain `rsync -a` ({a.reps} runs each, interleaved; Mirror at nice 0, "
          "no ionice, like the plain rsync)\n")
    print("| data | backend | plain rsync -a, best / median (s) | Mirror.flush, best / median (s) "
          "| ratio of best (goal ≥ 0.9) | ratio of medians |")
    print("|---|---|---|---|---|---|")
    for label, b, p, o in throughput(work, backends, int(a.big_gb * (1 << 30)), a.small, a.reps):
        pm, om = statistics.median(p), statistics.median(o)
        print(f"| {label} | {b} | {min(p):.2f} / {pm:.2f} | {min(o):.2f} / {om:.2f} | {min(p) / min(o):.2f} "
              f"| {pm / om:.2f} |", flush=True)


def flush_section(a: argparse.Namespace, work: Path, backends: list[str], size: int) -> None:
    print(f"\n## 3. Final flush right after a {a.size_mb} MiB checkpoint was written (5 stops)\n")
    print("| backend | median (s) | max (s) |")
    print("|---|---|---|")
    for b in backends:
        t = final_flush(work, b, size, 5)
        print(f"| {b} | {statistics.median(t):.2f} | {max(t):.2f} |", flush=True)


if __name__ == "__main__":
    main()
