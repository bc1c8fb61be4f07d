"""Multi-node DeepSpeed written the way its users write it, on the CPU (gloo), nothing of supervise.

``deepspeed.initialize`` with ZeRO stage 1 (every rank writes its own optimizer shard) and
``"checkpoint": {"use_node_local_storage": true}``: the save directory is on each node's own
local disk, so DeepSpeed has each node's **local** rank 0 write the model states there. Every
``SAVE_EVERY`` steps, ``engine.save_checkpoint(DIR, tag="global_stepN")`` (DeepSpeed 0.19:
local rank 0 ``mp_rank_00_model_states.pt``, every rank ``zero_pp_rank_R_mp_rank_00_optim_states.pt``,
then global rank 0 alone ``zero_to_fp32.py`` and ``latest``, on node 0 only, without a barrier
behind the other ranks' shards). At start, every rank loads from its own node's disk with
``engine.load_checkpoint(DIR)`` when ``DIR/latest`` exists there.

Each step's batch is a function of the step and the rank, so a run resumed from a checkpoint
and an uninterrupted one end with the same weights. Each rank prints
``rank R starts at step S from TAG`` (``-`` for a fresh start) and rank 0 ``saved global_stepN``.

    torchrun --nnodes 2 --nproc-per-node 2 ... deepspeed_nodes.py STEPS SAVE_EVERY [--dir checkpoints]
"""

from __future__ import annotations

import argparse
import os
import time

import deepspeed
import torch


def batch(step: int, rank: int) -> torch.Tensor:
    """This rank's batch at ``step``: the same in a resumed run as in an uninterrupted one."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(4, 16, generator=g)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("steps", type=int)
    p.add_argument("save_every", type=int)
    p.add_argument("--dir", default="checkpoints", help="the checkpoint directory, on this node's local disk")
    args = p.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 1}, "checkpoint": {"use_node_local_storage": True},
              "steps_per_print": 10 ** 9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)

    step, tag = 0, "-"
    if os.path.exists(os.path.join(args.dir, "latest")):
        path, client = engine.load_checkpoint(args.dir)
        if path is None:
            raise SystemExit(f"load_checkpoint({args.dir}) found nothing to load")
        step = int(client["step"])
        tag = open(os.path.join(args.dir, "latest")).read().strip()
    print(f"rank {rank} starts at step {step} from {tag}", flush=True)
    while step < args.steps:
        loss = engine(batch(step, rank)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        step += 1
        time.sleep(float(os.environ.get("STEP_SLEEP", "0")))  # a real step takes a while
        if step % args.save_every == 0:
            engine.save_checkpoint(args.dir, tag=f"global_step{step}", client_state={"step": step})
            if rank == 0:
                print(f"saved global_step{step}", flush=True)


if __name__ == "__main__":
    main()
