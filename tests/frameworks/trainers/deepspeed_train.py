"""DeepSpeed ``engine.save_checkpoint(out)`` on the CPU (gloo), run under torchrun with 2 ranks,
resumed with ``engine.load_checkpoint(out)`` (which reads ``latest``).

ZeRO 0 (``--zero 0``): rank 0 writes ``global_stepN/mp_rank_00_model_states.pt`` (the model
with its optimizer). ZeRO 1: the same file without the optimizer, then every rank its own
shard ``zero_pp_rank_R_mp_rank_00_optim_states.pt``; rank 0 then copies ``zero_to_fp32.py``
beside the checkpoints and writes ``latest`` without waiting for the other ranks' shards.

``--save-pause S`` makes rank ``--late-rank`` (1) late by S seconds inside each save, just
before it writes its shard (a slow disk, a straggler): what a late rank looks like on disk.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import parse, progress  # noqa: E402

import deepspeed  # noqa: E402
import torch  # noqa: E402

args = parse({"zero": 1, "late-rank": 1})
deepspeed.init_distributed(dist_backend="gloo")
rank = int(os.environ.get("RANK", "0"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": args.zero}, "steps_per_print": 10 ** 9}
engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)

if args.save_pause and rank == args.late_rank:
    ckpt = engine.checkpoint_engine
    plain_save = ckpt.save

    def late_save(state_dict, path):  # noqa: ANN001, ANN202 - DeepSpeed's own signature
        time.sleep(args.save_pause)
        return plain_save(state_dict, path)

    ckpt.save = late_save

step = 0
if os.path.exists(os.path.join(args.out, "latest")):
    path, client = engine.load_checkpoint(args.out)
    if path is None:
        raise SystemExit(f"load_checkpoint({args.out}) found nothing to load")
    step = int(client["step"])
if rank == 0:
    progress(args.progress, "start", step=step, restored=os.environ.get("SUPERVISE_RESTORED_FROM"))
while step < args.steps:
    # the step's batch is a function of the step: a resumed run sees the batches an uninterrupted one does
    loss = engine(torch.randn(4, 16, generator=torch.Generator().manual_seed(step))).pow(2).mean()
    engine.backward(loss)
    engine.step()
    step += 1
    if rank == 0:
        progress(args.progress, "step", step=step)
    time.sleep(args.step_sleep)
    if step % args.save_every == 0:
        engine.save_checkpoint(args.out, tag=f"global_step{step}", client_state={"step": step})
        if rank == 0:
            progress(args.progress, "saved", step=step)
if rank == 0:
    progress(args.progress, "done", step=step)
# Leave the process group, then the process without the interpreter's finalization: a rank
# aborted at times ("terminate called without an active exception", SIGABRT) after the
# training had finished (rank 0's last save and "done" written), once even after
# destroy_process_group (CI, 2026-12-07). Gloo's C++ threads can still hold objects whose
# destruction during finalization aborts (pytorch/pytorch#179291); os._exit skips it, as an
# MPI rank's end does (tests/pbs/ezpz_train.py).
torch.distributed.barrier()
torch.distributed.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
