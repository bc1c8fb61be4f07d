"""Multi-node costs on the real multi-node test cluster (``scripts/slurm-up.sh ROOT --nodes 2``),
beside a single-node run of the same job (issue 21, docs/multinode.md).

The job: ``supervise`` in the batch script with a per-node DCP-shaped pair, and an ``srun``
step of 2 writer tasks. Each task writes its shard ``__R_0.distcp`` (``--mib`` MiB) of
``step_N/`` to its node's local disk, then a barrier file; rank 0 writes ``.metadata`` last,
once every rank's barrier is there (DCP's order). ``--saves`` checkpoints, ``--gap`` s apart.

* two nodes: ``--nodes=2``, one writer per node; ``nodes = 2`` (node agents, parts);
* one node: ``--nodes=1``, both writers on one node; ``nodes = 1`` (the ordinary pair).

Figures, from the leader's journal and the files:

* agents up: the ``node-agents`` event's ``seconds`` (srun started → every agent restored and
  ready) and the time from the leader's ``start`` to it (goal: < 2 s);
* publish lag per checkpoint: the ``publish`` event's time − the ``.metadata`` mtime (the
  checkpoint's last byte), beside the slowest node's copy of its own shards (the ``seconds``
  of the sync pass that staged each node's part, from its journal) (goal: lag ≤ slowest copy
  + 1 s). Node K's part is complete once the leader saw rank 0's marker (its word in
  ``.supervise-parts/``), else by quiescence (``settle``, 1 s here).

    .venv/bin/python bench/multinode.py              # 3 saves of 2 × 256 MiB
    .venv/bin/python bench/multinode.py --quick      # 2 saves of 2 × 16 MiB

Needs root (namespaces) and Slurm; the cluster lives under /var/tmp and is torn down after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WRITER = r'''
import os, sys, time
out, saves, mib, gap, barrier = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
block = os.urandom(1 << 20)
for k in range(1, saves + 1):
    d = os.path.join(out, f"step_{k:05d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"__{rank}_0.distcp"), "wb") as f:
        for _ in range(mib):
            f.write(block)
    open(os.path.join(barrier, f"{k}.{rank}"), "w").close()
    if rank == 0:
        while len([n for n in os.listdir(barrier) if n.startswith(f"{k}.")]) < world:
            time.sleep(0.01)
        with open(os.path.join(d, ".metadata.tmp"), "w") as f:
            f.write("meta")
        os.rename(os.path.join(d, ".metadata.tmp"), os.path.join(d, ".metadata"))
    time.sleep(gap)
'''

JOB = """#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks=2
cd {repo}
exec {python} -m supervisor --config {cfg} --run-dir {run} -- srun --ntasks=2 {python} {writer} {local}/ckpt-{mode} {saves} {mib} {gap} {barrier}
"""


def sh(*argv: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, **kw)


def events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def one(root: Path, mode: str, a: argparse.Namespace) -> dict:
    nodes = 2 if mode == "two" else 1
    shared, local = root / "shared", root / "local"
    run, barrier, dst = shared / f"run-{mode}", shared / f"barrier-{mode}", shared / f"persist-{mode}"
    barrier.mkdir(parents=True)
    cfg = shared / f"run-{mode}.toml"
    cfg.write_text(f'[[sync]]\nname = "ckpt"\nfrom = "{local}/ckpt-{mode}"\nto = "{dst}"\nnodes = {nodes}\n'
                   f'settle = "{a.settle}s"\nprofile = "dcp"\n')
    writer = shared / "writer.py"
    writer.write_text(WRITER)
    script = shared / f"job-{mode}.sh"
    script.write_text(JOB.format(nodes=nodes, repo=REPO, python=sys.executable, cfg=cfg, run=run, writer=writer,
                                 local=local, mode=mode, saves=a.saves, mib=a.mib, gap=a.gap, barrier=barrier))
    job = sh(str(root / "in-cluster"), "sbatch", "--parsable", "-o", str(shared / f"job-{mode}.out"),
             str(script), check=True).stdout.strip()
    deadline = time.monotonic() + 600
    while sh(str(root / "in-cluster"), "squeue", "-h", "-j", job).stdout.strip():
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job} ({mode}) did not end")
        time.sleep(0.5)
    ev = events(run / "events.jsonl")
    start = next(e for e in ev if e["kind"] == "start")
    agents = next((e for e in ev if e["kind"] == "node-agents"), None)
    lags, copies = [], []
    for e in ev:
        if e["kind"] != "publish" or not e["checkpoint"].startswith("step_"):
            continue
        meta = dst / e["checkpoint"] / ".metadata"
        lags.append(e["t"] - meta.stat().st_mtime)
        per_node = []
        journals = [run / "events.jsonl"] + ([run / "nodes" / "node-1" / "events.jsonl"] if nodes == 2 else [])
        for path in journals:  # the pass that staged this node's part (or published it): its copy time
            evs = events(path)
            made = next((x for x in evs if x["kind"] in ("part", "publish") and x.get("checkpoint") == e["checkpoint"]
                         and (nodes == 1 or x["kind"] == "part")), None)
            if made is None:
                continue
            done = next((x for x in evs if x["kind"] == "sync" and x["t"] >= made["t"]), None)
            if done is not None:
                per_node.append(float(done["seconds"]))
        copies.append(max(per_node))
    return {"mode": mode, "nodes": nodes, "published": len(lags), "lags": lags, "slowest_copy": copies,
            "agents_s": agents and agents["seconds"], "agents_from_start_s": agents and round(agents["t"] - start["t"], 3),
            "ready": agents and agents["ready"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--gap", type=float, default=4.0)
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--keep", action="store_true", help="keep the cluster's directory (journals, logs)")
    a = ap.parse_args()
    if a.quick:
        a.saves, a.mib = 2, 16
    if os.geteuid() != 0:
        raise SystemExit("needs root (the multi-node cluster uses network namespaces)")
    root = Path(tempfile.mkdtemp(prefix="supervise-mn-bench-", dir="/var/tmp"))
    t = time.perf_counter()
    up = sh("bash", str(REPO / "scripts" / "slurm-up.sh"), str(root), "--nodes", "2")
    up_s = time.perf_counter() - t
    if up.returncode != 0:
        raise SystemExit(f"slurm-up.sh --nodes 2 failed: {up.stderr[-800:]}")
    try:
        results = [one(root, mode, a) for mode in ("one", "two")]
    finally:
        t = time.perf_counter()
        sh("bash", str(REPO / "scripts" / "slurm-down.sh"), str(root))
        down_s = time.perf_counter() - t
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"cluster: up {up_s:.2f} s, down {down_s:.2f} s; {a.saves} saves of 2 x {a.mib} MiB, settle {a.settle:g} s")
    print(f"{'run':<22}{'published':>10}{'lag p50 s':>11}{'lag max s':>11}{'slowest copy max s':>20}{'max lag - copy s':>18}")
    for r in results:
        over = [lag - c for lag, c in zip(r["lags"], r["slowest_copy"])]
        print(f"{('one node, 2 writers' if r['nodes'] == 1 else 'two nodes, 1 writer each'):<22}{r['published']:>10}"
              f"{statistics.median(r['lags']):>11.2f}{max(r['lags']):>11.2f}{max(r['slowest_copy']):>20.2f}{max(over):>18.2f}")
    two = results[1]
    print(f"node agents: ready {two['ready']} {two['agents_s']:.2f} s after srun started, "
          f"{two['agents_from_start_s']:.2f} s after the leader's start (goal < 2 s)")
    one_lag, two_lag = statistics.median(results[0]["lags"]), statistics.median(two["lags"])
    print(f"ratio two-node / one-node publish lag (p50): {two_lag / one_lag:.2f}")
    bound = all(lag <= c + 1.0 for lag, c in zip(two["lags"], two["slowest_copy"]))
    print(f"publish lag <= slowest node's copy + 1 s on every checkpoint: {'yes' if bound else 'no'}")


if __name__ == "__main__":
    main()
