"""The scale benchmark's training (bench/scale.py): one process per node, no torch, so what is
measured is supervise, not the training.

Every ``--every`` seconds each node writes its shard of a DCP-shaped checkpoint into its own
node-local ``OUT/step_N/__K_0.distcp``; then it says so on shared storage (``BARRIER/step_N/K``,
the training's own coordination, as a collective would be); node 0, once every node has said
so, writes ``.metadata`` last and appends ``{"step": N, "marker_at": t}`` to ``MARKS``. A TERM
(or ``--saves`` reached) ends it.

    srun --ntasks-per-node=1 python bench/_scale_writer.py OUT --barrier B --marks M --every 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--barrier", type=Path, required=True)
    p.add_argument("--marks", type=Path, required=True)
    p.add_argument("--every", type=float, default=5.0)
    p.add_argument("--saves", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=64 << 10, help="bytes of each node's shard")
    a = p.parse_args()
    rank, world = int(os.environ["SLURM_NODEID"]), int(os.environ["SLURM_JOB_NUM_NODES"])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    t0 = time.time()
    for n in range(1, a.saves + 1):
        while not stop and time.time() < t0 + n * a.every:
            time.sleep(0.05)
        if stop:
            break
        step = a.out / f"step_{n:06d}"
        step.mkdir(parents=True, exist_ok=True)
        with open(step / f"__{rank}_0.distcp", "wb") as f:
            f.write(bytes([n % 256]) * a.size)
        said = a.barrier / f"step_{n:06d}"
        said.mkdir(parents=True, exist_ok=True)
        (said / str(rank)).touch()
        if rank == 0:
            while not stop and len(os.listdir(said)) < world:
                time.sleep(0.05)
            if stop:
                break
            (step / ".metadata").write_text(f"{n} {world}")
            with open(a.marks, "a") as f:
                f.write(json.dumps({"step": n, "marker_at": time.time()}) + "\n")


if __name__ == "__main__":
    main()
