"""Two (or more) gloo ranks that train in step until one stops calling allreduce.

Every step each rank calls ``sync_gradients`` (an allreduce) and rank 0 appends a line to
LOG_DIR/train.log (the progress supervise sees); at --hang-at, the last rank goes off into
``stuck_elsewhere`` and never calls allreduce again, so every other rank blocks in
``sync_gradients``: the shape of a real collective hang. Run under torchrun.
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("log_dir")
p.add_argument("--hang-at", type=int, default=40)
p.add_argument("--step-time", type=float, default=0.2)
a = p.parse_args()


def sync_gradients(t: torch.Tensor) -> None:
    dist.all_reduce(t)


def stuck_elsewhere() -> None:
    while True:
        time.sleep(1)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
log = Path(a.log_dir)
log.mkdir(parents=True, exist_ok=True)
step = 0
while True:
    step += 1
    if rank == world - 1 and step == a.hang_at:
        print(f"rank {rank} stops calling allreduce at step {step}", flush=True)
        stuck_elsewhere()
    sync_gradients(torch.ones(4))
    if rank == 0:
        with open(log / "train.log", "a") as f:
            f.write(f"step {step} pid {os.getpid()}\n")
    time.sleep(a.step_time)
