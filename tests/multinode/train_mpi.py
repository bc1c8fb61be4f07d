"""An MPI training where only rank 0 saves (``torch.save``, one file per checkpoint).

Launched by ``mpiexec`` (OpenMPI, its remote ranks started through Slurm); every rank steps
in lock-step (``Allreduce``), and rank 0, wherever the rankfile put it, saves
``--out/model_<step>.pt`` every ``--save-every`` steps (written beside, then renamed) and logs
to ``--progress`` on shared storage.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time


def main() -> None:
    import torch
    from mpi4py import MPI

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--step-sleep", type=float, default=0.2)
    ap.add_argument("--progress", required=True)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    w = torch.arange(64, dtype=torch.float64)

    def say(what: str, **fields: object) -> None:
        with open(a.progress, "a") as f:
            f.write(json.dumps({"what": what, "rank": rank, "host": socket.gethostname(), "t": time.time(), **fields}) + "\n")

    say("start", world=comm.Get_size())
    os.makedirs(a.out, exist_ok=True)
    for step in range(1, a.steps + 1):
        total = comm.allreduce(float(w.sum()), op=MPI.SUM)
        w = torch.remainder(w * 3 + step + total, 1_000_003.0)
        time.sleep(a.step_sleep)
        if rank == 0 and step % a.save_every == 0:
            path = os.path.join(a.out, f"model_{step:05d}.pt")
            torch.save({"w": w, "step": step}, path + ".tmp")
            os.rename(path + ".tmp", path)
            say("saved", step=step)
    say("done")


if __name__ == "__main__":
    main()
