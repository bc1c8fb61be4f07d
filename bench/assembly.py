"""The leader's assembly of one per-node checkpoint at N parts (issue 44): what it asks of
shared storage, and its CPU, against the floor (a bare loop: one ``link`` per file, then one
``rename``), side by side in the same invocation.

For each N (``--nodes``, default 64 256 1024): N node parts of a DCP-shaped checkpoint are
staged as node agents leave them (each its shard of ``--size`` bytes, node 0 the marker too,
then each part's manifest), under ``--dir`` (default /var/tmp: a disk; shared storage's
latency is not modelled, so the figures that carry over are the counts). Then, in a child
process, the leader's own calls (``DirGather``, as ``_assembly.py`` makes them): a pass that
finds half the parts, a pass that finds all, the assembly (with ``fsync``) and the release.
Printed: the calls naming the shared directory (``strace -f -e trace=%file,getdents64,fsync``)
per checkpoint and per node, by kind; the child's CPU seconds and wall seconds for the passes,
the assembly and the release (a second, untraced run); the same for the floor; their ratio.

    .venv/bin/python bench/assembly.py
    .venv/bin/python bench/assembly.py --nodes 1024 --dir /dev/shm
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NAME = "step_000010"

LEADER = """
import json, os, sys, time, anyio
sys.path.insert(0, {repo!r})
from pathlib import Path
from supervisor.config import SyncPair
from supervisor.sync._dirside import DirGather
from supervisor.sync._parts import waiting
from supervisor.sync._state import PairState
dst, n, half = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
pair = SyncPair("ckpt", "checkpoint", dst.parent / "local", dst, nodes=n, fsync=True)
g = DirGather(PairState(pair, backend=None, emit=lambda *a, **k: None), node=0)
c0, w0 = time.process_time(), time.perf_counter()
g.current_parts({name!r}, waiting(dst)[{name!r}])       # the pass that finds half
c_half, w_half = time.process_time(), time.perf_counter()
half.rename(half.with_suffix(".done"))                      # the bench stages the rest
while not (half.parent / "all").exists():
    time.sleep(0.001)
c1, w1 = time.process_time(), time.perf_counter()
ms = g.current_parts({name!r}, waiting(dst)[{name!r}])
assert len(ms) == n, len(ms)
anyio.run(g.assemble, {name!r}, ms, False)
anyio.run(g.release, {name!r}, ms)
print(json.dumps({{"cpu_s": (c_half - c0) + time.process_time() - c1, "wall_s": (w_half - w0) + time.perf_counter() - w1}}))
"""

FLOOR = """
import json, os, sys, time
from pathlib import Path
dst, n = Path(sys.argv[1]), int(sys.argv[2])
c0, w0 = time.process_time(), time.perf_counter()
parts = dst / ".supervise-parts" / {name!r}
staging = dst / ".floor-staging"
os.mkdir(staging)
for k in range(n):
    os.link(parts / f"node-{{k}}" / f"__{{k}}_0.distcp", staging / f"__{{k}}_0.distcp")
os.link(parts / "node-0" / ".metadata", staging / ".metadata")
os.rename(staging, dst / "floor")
print(json.dumps({{"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0}}))
"""


def stage(dst: Path, nodes: range, total: int, size: int) -> None:
    from supervisor.sync._complete import Snap
    from supervisor.sync._parts import part_dir, write_manifest

    for k in nodes:
        d = part_dir(dst, NAME, k)
        d.mkdir(parents=True, exist_ok=True)
        files = {}
        for rel in [f"__{k}_0.distcp"] + ([".metadata"] if k == 0 else []):
            (d / rel).write_bytes(bytes([k % 256]) * size)
            st = (d / rel).stat()
            files[rel] = (st.st_size, st.st_mtime_ns)
        write_manifest(dst, NAME, k, total, Snap(files, max(m for _s, m in files.values()), size * len(files)),
                       is_dir=True, markers=(".metadata",) if k == 0 else (), why="marker", done_at=time.time(),
                       hashes={rel: "0" * 64 for rel in files})


def calls_by_kind(trace: Path, dst: Path) -> dict[str, int]:
    """The traced calls that name the shared directory, by system call."""
    by: dict[str, int] = {}
    for line in trace.read_text(errors="replace").splitlines():
        if str(dst) in line and " " in line:
            call = line.split(None, 1)[1].split("(", 1)[0]
            by[call] = by.get(call, 0) + 1
    return by


def leader_run(root: Path, n: int, size: int, traced: bool) -> tuple[dict, dict[str, int]]:
    """One assembly by the leader's code: its figures and (traced) its calls by kind."""
    shutil.rmtree(root, ignore_errors=True)
    dst = root / "persist"
    dst.mkdir(parents=True)
    stage(dst, range(n // 2, n), n, size)
    script, half, trace = root / "leader.py", root / "half", root / "leader.strace"
    script.write_text(LEADER.format(repo=str(REPO), name=NAME))
    half.touch()
    argv = [sys.executable, str(script), str(dst), str(n), str(half)]
    if traced:
        argv = ["strace", "-f", "-qq", "-y", "-e", "trace=%file,getdents64,fsync", "-o", str(trace), *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    while half.exists():
        time.sleep(0.001)
    stage(dst, range(0, n // 2), n, size)
    (root / "all").touch()
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the leader's assembly failed at N={n}")
    by = calls_by_kind(trace, dst) if traced else {}
    return json.loads(out.strip().splitlines()[-1]), by


def floor_run(root: Path, n: int, size: int, traced: bool) -> tuple[dict, dict[str, int]]:
    shutil.rmtree(root, ignore_errors=True)
    dst = root / "persist"
    dst.mkdir(parents=True)
    stage(dst, range(n), n, size)
    script, trace = root / "floor.py", root / "floor.strace"
    script.write_text(FLOOR.format(name=NAME))
    argv = [sys.executable, str(script), str(dst), str(n)]
    if traced:
        argv = ["strace", "-f", "-qq", "-y", "-e", "trace=%file,getdents64,fsync", "-o", str(trace), *argv]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    by = calls_by_kind(trace, dst) if traced else {}
    return json.loads(out.strip().splitlines()[-1]), by


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--size", type=int, default=4096, help="bytes of each node's shard")
    p.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    a = p.parse_args()
    if shutil.which("strace") is None:
        sys.exit("needs strace")
    print(f"{'N':>5} {'who':>7} {'calls':>7} {'/node':>6} {'cpu_s':>6} {'wall_s':>6}  calls by kind")
    for n in a.nodes:
        root = Path(tempfile.mkdtemp(prefix="supervise-assembly-", dir=a.dir))
        try:
            rows = {}
            for who, run in (("leader", leader_run), ("floor", floor_run)):
                _, by = run(root, n, a.size, True)
                figs, _ = run(root, n, a.size, False)
                rows[who] = (sum(by.values()), figs)
                kinds = " ".join(f"{k}={v}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))
                print(f"{n:>5} {who:>7} {sum(by.values()):>7} {sum(by.values()) / n:>6.2f} {figs['cpu_s']:>6.3f} "
                      f"{figs['wall_s']:>6.3f}  {kinds}")
            (lc, lf), (fc, ff) = rows["leader"], rows["floor"]
            print(f"{n:>5} {'ratio':>7} {lc / fc:>7.2f} {'':>6} {lf['cpu_s'] / max(ff['cpu_s'], 1e-6):>6.1f} "
                  f"{lf['wall_s'] / max(ff['wall_s'], 1e-6):>6.1f}  leader / floor", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
