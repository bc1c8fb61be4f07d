"""A torchrun rank that trains a tiny gloo DDP model and checkpoints on request.

All ranks agree on the step to checkpoint at with an all_reduce(MAX) of the request flag
(the pattern in docs/training.md), so a signal sent to one rank only still makes every rank
save at the same step. argv: OUT_DIR. Writes OUT_DIR/ready.<pid>, OUT_DIR/ckpt.<rank>
("<step>") per checkpoint, exits when OUT_DIR/stop exists (agreed the same way).
"""

import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message=".*NumPy.*")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from supervisor import training  # noqa: E402

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
tmp = os.path.join(out, f".ready.{os.getpid()}")
with open(tmp, "w") as f:
    f.write(str(rank))
os.replace(tmp, os.path.join(out, f"ready.{os.getpid()}"))
end = time.monotonic() + 120
step = 0
while True:
    x = torch.randn(16, 8)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    flags = torch.tensor([float(training.checkpoint_requested()),
                          float(os.path.exists(os.path.join(out, "stop")) or time.monotonic() > end)])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    if flags[0] > 0:
        if rank == 0:
            torch.save({"model": model.state_dict(), "step": step}, os.path.join(out, "model.pt"))
        with open(os.path.join(out, f"ckpt.{rank}"), "a") as f:
            f.write(f"{step}\n")
        training.acknowledge()
    if flags[1] > 0:
        break
    time.sleep(0.02)
dist.barrier()
# Leave without tearing gloo down, as examples/ddp_train.py does: the teardown aborted a rank
# here ("terminate called without an active exception", SIGABRT; 1 CI run) and can deadlock
# (pytorch#75097). Every rank has written what it writes and passed the barrier.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
