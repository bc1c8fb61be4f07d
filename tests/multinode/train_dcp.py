"""A 2-node torchrun job that writes DCP checkpoints to each node's own local disk.

Every rank holds one shard of a ``DTensor`` (``Shard(0)`` over all ranks), so every rank
writes its own ``__R_0.distcp`` into ``OUT/step_N/`` on its node's local disk; rank 0 writes
``.metadata`` last. The update is exact integer arithmetic in float64 with an all-reduce
coupling every rank, so ``reference(steps)`` (one process, no torch.distributed) gives the
uninterrupted run's weights bit for bit: a resume that loads a wrong or stale shard, or
repeats or skips a step, ends with other weights. Rank 0 appends what happened to
``--progress`` (on shared storage) and, at the end, saves the full tensor to ``--final``.
While the file ``--hold`` names exists, no rank takes a step (a test's pause between saves).

    torchrun ... train_dcp.py --out LOCAL --steps N --save-every K --progress FILE --final FILE
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PER_RANK = 256
MOD = 1_000_003.0


def update(chunk: torch.Tensor, step: int, total: float) -> torch.Tensor:
    import torch

    return torch.remainder(chunk * 3 + step + total, MOD)


def reference(steps: int, world: int = 4) -> torch.Tensor:
    """The uninterrupted run's final weights, computed in one process. torch is imported
    here, not with the module: the tests import it, and they must collect without torch."""
    import torch

    chunks = [torch.arange(PER_RANK, dtype=torch.float64) + r * PER_RANK for r in range(world)]
    for step in range(1, steps + 1):
        total = float(sum(c.sum() for c in chunks)) % MOD
        chunks = [update(c, step, total) for c in chunks]
    return torch.cat(chunks)


def main() -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--step-sleep", type=float, default=0.2)
    ap.add_argument("--progress", required=True)
    ap.add_argument("--final", required=True)
    ap.add_argument("--hold", help="a file on shared storage: while it exists, no rank takes a step")
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(PER_RANK * world, dtype=torch.float64)
    w = distribute_tensor(full, mesh, [Shard(0)])
    step = torch.zeros((), dtype=torch.int64)
    restored = os.environ.get("SUPERVISE_RESTORED_FROM") or None

    def say(what: str, **fields: object) -> None:
        if rank == 0:
            with open(a.progress, "a") as f:
                f.write(json.dumps({"what": what, "host": socket.gethostname(), "t": time.time(),
                                    "job_restart": os.environ.get("SLURM_RESTART_COUNT", "0"), **fields}) + "\n")

    if restored:
        state = {"w": w, "step": step}
        dcp.load(state, checkpoint_id=restored)
        w, step = state["w"], state["step"]
    say("start", step=int(step), restored=restored, world=world)
    while int(step) < a.steps:
        while a.hold and os.path.exists(a.hold):  # the test holds the training still (no new save)
            time.sleep(0.2)
        local = w.to_local()
        total = local.sum()
        dist.all_reduce(total)
        s = int(step) + 1
        local.copy_(update(local, s, float(total) % MOD))
        step.fill_(s)
        time.sleep(a.step_sleep)
        if s % a.save_every == 0:
            dcp.save({"w": w, "step": step}, checkpoint_id=os.path.join(a.out, f"step_{s:05d}"))
            say("saved", step=s)
    final = w.full_tensor()
    if rank == 0:
        torch.save(final, a.final)
    say("done", step=int(step))
    # every rank waits for rank 0's save: a rank that exited first took its torchrun agent,
    # and with it the workers' TCPStore when that agent hosted it, and rank 0's teardown
    # aborted on the lost store (SIGABRT, seen once in test_ring_nodes on the spare's attempt)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
