"""What the checkpoint manifest's hashes cost (issue 43), beside the copy they ride on, in one run.

1. Hash throughput from memory: ``hashlib.sha256``, ``blake2b`` and ``md5`` over ``--size-mib``
   MiB fed in 1 MiB chunks (the copier's read size), best of ``--runs``.
2. The copy of one ``--size-mib`` file, page-cached, into a directory on the same filesystem:
   the Python copier (``PythonBackend.copy_file``, a ``_pycopy.py`` child as the mirror runs
   it, at normal priority) with ``hash=False`` (``copy_file_range``, as today) and with
   ``hash=True`` (one read: each chunk hashed and written), and the rsync backend (the
   baseline: what ``auto`` picks where rsync is installed). The variants run in turn within
   each round, each from a clean page cache state (destination removed, ``sync`` untimed),
   so a drifting disk weighs on all alike. Without ``--fsync`` the copy ends in the page
   cache: the hash's share is then at its largest (a copy that also waits for the disk
   hides more of it).

Printed side by side: each figure, the hash's share of the hashed copy
(``(t_hash - t_plain) / t_hash``, goal ≤ 10 %), and each copy against plain rsync
(``time / rsync time``, < 1 faster). Also whether the CPU has SHA instructions (``sha_ni``):
with them sha256 beats blake2b, without it is slower.

    .venv/bin/python bench/hashes.py                  # 1 GiB, 3 rounds (~2 GiB of disk)
    .venv/bin/python bench/hashes.py --size-mib 64    # quick
    .venv/bin/python bench/hashes.py --fsync          # each copy fsyncs its file, as fsync = true
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.sync._backend import CopyResult, choose_backend  # noqa: E402

MIB = 1 << 20
MB = 1e6  # throughputs in MB/s (10^6 bytes), as disks and hashlib benchmarks quote them


def cpu_line() -> str:
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
        with open("/proc/cpuinfo") as f:
            sha_ni = any("sha_ni" in ln.split() for ln in f if ln.startswith("flags"))
    except OSError:
        sha_ni = False
    return (f"CPU: {model}, {os.cpu_count()} cores, SHA instructions (sha_ni): {'yes' if sha_ni else 'no'}; "
            f"{ssl.OPENSSL_VERSION}; Python {platform.python_version()}")


def hash_rates(size_mib: int, runs: int) -> dict[str, float]:
    """MB/s of each hash over ``size_mib`` MiB of 1 MiB chunks from memory (best of ``runs``)."""
    chunk = os.urandom(MIB)
    out: dict[str, float] = {}
    for name in ("sha256", "blake2b", "md5"):
        best = float("inf")
        for _ in range(runs):
            h = hashlib.new(name)
            t0 = time.perf_counter()
            for _ in range(size_mib):
                h.update(chunk)
            h.hexdigest()
            best = min(best, time.perf_counter() - t0)
        out[name] = size_mib * MIB / MB / best
    return out


def make_source(path: Path, size_mib: int) -> str:
    """A file of random bytes (nothing compresses or dedups it); returns its sha256. Read once
    more afterwards so the copies start from a page-cached source."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(size_mib):
            block = os.urandom(MIB)
            h.update(block)
            f.write(block)
    os.sync()
    with open(path, "rb") as f:
        while f.read(8 * MIB):
            pass
    return h.hexdigest()


async def time_copies(src: Path, work: Path, runs: int, fsync: bool, want: str) -> dict[str, list[float]]:
    python = choose_backend("python", nice=0, ionice="none")
    variants: dict[str, Callable[[Path], Awaitable[CopyResult]]] = {
        "python, hash=False": lambda dst: python.copy_file(src, dst, fsync=fsync),
        "python, hash=True": lambda dst: python.copy_file(src, dst, fsync=fsync, hash=True),
    }
    if shutil.which("rsync"):
        rsync = choose_backend("rsync", nice=0, ionice="none")
        variants["rsync"] = lambda dst: rsync.copy_file(src, dst, fsync=fsync)
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(runs):
        for name in names[r % len(names):] + names[:r % len(names)]:  # each variant leads a round in turn
            dst = work / "copy.bin"
            dst.unlink(missing_ok=True)
            os.sync()
            t0 = time.perf_counter()
            got = await variants[name](dst)
            times[name].append(time.perf_counter() - t0)
            if name == "python, hash=True" and got.hashes != {"": want}:
                raise SystemExit(f"the copy's hash {got.hashes} is not the source's {want}")
            if dst.stat().st_size != src.stat().st_size:
                raise SystemExit(f"{name}: the copy is {dst.stat().st_size} bytes, not {src.stat().st_size}")
    (work / "copy.bin").unlink(missing_ok=True)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024, help="MiB hashed from memory and copied (default 1024)")
    ap.add_argument("--runs", type=int, default=3, help="rounds of each measurement (default 3)")
    ap.add_argument("--fsync", action="store_true", help="each copy fsyncs its file before it returns")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir, removed)")
    a = ap.parse_args()

    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} uptime: {os.popen('uptime').read().strip()}")
    print(f"# {cpu_line()}")
    print(f"# size {a.size_mib} MiB, {a.runs} runs, fsync {'on' if a.fsync else 'off'}", flush=True)

    rates = hash_rates(a.size_mib, a.runs)
    print(f"\n## Hash throughput from memory (1 MiB chunks, best of {a.runs})")
    for name, rate in rates.items():
        print(f"{name:8} {rate:8.0f} MB/s   ({rate / rates['sha256']:.2f}× sha256)")

    work = Path(tempfile.mkdtemp(prefix="bench-hashes-", dir=a.work))
    try:
        src = work / "source.bin"
        want = make_source(src, a.size_mib)
        times = anyio.run(time_copies, src, work, a.runs, a.fsync, want)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    nbytes = a.size_mib * MIB
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}
    base = "rsync" if "rsync" in times else "python, hash=False"
    print(f"\n## Copy of {a.size_mib} MiB, page-cached source, same filesystem (median of {a.runs}; best)")
    print(f"{'copy':20} {'median s':>9} {'MB/s':>7} {'best s':>8}   vs {base} (median, best)")
    for name in times:
        print(f"{name:20} {med[name]:9.3f} {nbytes / MB / med[name]:7.0f} {best[name]:8.3f}   "
              f"{med[name] / med[base]:.2f}, {best[name] / best[base]:.2f}   runs: "
              + " ".join(f"{t:.3f}" for t in times[name]))
    plain, hashed = "python, hash=False", "python, hash=True"
    share_med = (med[hashed] - med[plain]) / med[hashed]
    share_best = (best[hashed] - best[plain]) / best[hashed]
    print(f"\nhash share of the hashed copy (t_hash - t_plain) / t_hash: {share_med:.1%} (medians), "
          f"{share_best:.1%} (best) — goal ≤ 10 %")
    print(f"sha256 of {a.size_mib} MiB alone from memory: {nbytes / MB / rates['sha256']:.3f} s "
          f"(hashing after a copy would add about that: rsync + it = {med[base] + nbytes / MB / rates['sha256']:.3f} s)")
    print(f"# done {time.strftime('%H:%M:%S')}; uptime: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
