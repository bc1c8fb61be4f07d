"""The scale benchmark's training (bench/scale.py), and the 16-node test's
(tests/multinode/test_sixteen.py): one process per node, no torch, so what is measured is
supervise, not the training.

Every ``--every`` seconds each node writes its shard of a DCP-shaped checkpoint into its own
node-local ``OUT/step_N/__K_0.distcp`` (its content: the step, repeated); then it says so on
shared storage (``BARRIER/<attempt>/step_N/K``, the training's own coordination, as a collective
would be); node 0, once every node has said so, writes ``.metadata`` last and appends
``{"step": N, "marker_at": t}`` to ``--marks``. At the start each node resumes after the step
whose shard supervise restored to its local disk, and says what it found in ``--progress``
(attempt, node, host, the restored step, whether the shard held that step). After step
``--saves`` it idles (the benchmark measures the agents' idle cost then), or exits with
``--exit``; a TERM ends it at once.

    srun --ntasks-per-node=1 python bench/_scale_writer.py OUT --barrier B --marks M --every 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time
from pathlib import Path


def restored(out: Path, rank: int) -> tuple[int, bool]:
    """The newest step whose shard of this node is on its local disk, and whether it holds that step."""
    steps = sorted(int(d.name.split("_")[1]) for d in out.glob("step_*") if (d / f"__{rank}_0.distcp").exists())
    if not steps:
        return 0, True
    data = (out / f"step_{steps[-1]:06d}" / f"__{rank}_0.distcp").read_bytes()
    return steps[-1], len(data) > 0 and data == bytes([steps[-1] % 256]) * len(data)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--barrier", type=Path, required=True)
    p.add_argument("--marks", type=Path)
    p.add_argument("--progress", type=Path)
    p.add_argument("--every", type=float, default=5.0)
    p.add_argument("--saves", type=int, default=1_000_000, help="the last step")
    p.add_argument("--exit", action="store_true", help="exit after the last step (default: idle until a TERM)")
    p.add_argument("--size", type=int, default=64 << 10, help="bytes of each node's shard")
    a = p.parse_args()
    rank, world = int(os.environ["SLURM_NODEID"]), int(os.environ["SLURM_JOB_NUM_NODES"])
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    first, intact = restored(a.out, rank)
    if a.progress:
        with open(a.progress, "a") as f:
            f.write(json.dumps({"attempt": attempt, "node": rank, "host": socket.gethostname(), "restored": first,
                                "intact": intact}) + "\n")
    t0 = time.time()
    for n in range(first + 1, a.saves + 1):
        while not stop and time.time() < t0 + (n - first) * a.every:
            time.sleep(0.05)
        if stop:
            return
        step = a.out / f"step_{n:06d}"
        step.mkdir(parents=True, exist_ok=True)
        with open(step / f"__{rank}_0.distcp", "wb") as f:
            f.write(bytes([n % 256]) * a.size)
        said = a.barrier / str(attempt) / f"step_{n:06d}"
        said.mkdir(parents=True, exist_ok=True)
        (said / str(rank)).touch()
        if rank == 0:
            while not stop and len(os.listdir(said)) < world:
                time.sleep(0.05)
            if stop:
                return
            (step / ".metadata").write_text(f"{n} {world}")
            if a.marks:
                with open(a.marks, "a") as f:
                    f.write(json.dumps({"step": n, "marker_at": time.time()}) + "\n")
    while not stop and not a.exit:
        time.sleep(0.2)


if __name__ == "__main__":
    main()
