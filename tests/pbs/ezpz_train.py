"""A tiny DDP training written the way ALCF users write theirs with ezpz: ``ezpz.setup_torch()``
finds rank, world size and the rendezvous (MPI), then plain torch DDP on CPU (gloo).

Started by an MPI launcher (``mpirun``, or ``ezpz launch``, which composes one). Each rank
prints ``EZPZ rank=R world=W local=L host=H`` from ezpz's own view. Rank 0 writes
``step_<N>/model.pt`` then the marker ``.metadata`` and a top-level ``latest`` pointer, every
``--every`` steps, on "checkpoint now" (signal or request file, ``supervisor.training``) and on
TERM/INT; the ranks agree on both with one all_reduce per step, so a signal that reaches one
node first still gives one checkpoint and one clean exit. Lines: "resumed N", "checkpoint N",
"stopped N", "done N" (rank 0).

Each rank's batch at each step is drawn from its own seed (``batch``), and the restored weights
are rank 0's before DDP broadcasts them, so a run stopped and resumed from any checkpoint ends
with the weights of an uninterrupted one: ``--replay N OUT`` computes those in one process (no
MPI: each step the ranks' gradients averaged as DDP averages them) and saves them to OUT.
"""

import argparse
import os
import socket
import time
from pathlib import Path

import ezpz
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from supervisor import training



def batch(step: int, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s batch at ``step`` (from 0): the same in any run that reaches that step."""
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(step * world + rank))


def replay(steps: int, world: int, out: str) -> None:
    """The weights after ``steps`` steps of an uninterrupted run of ``world`` ranks, in one process."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        grads = [torch.autograd.grad(model(batch(step, r, world)).pow(2).mean(), list(model.parameters()))
                 for r in range(world)]
        for i, param in enumerate(model.parameters()):
            param.grad = sum(g[i] / world for g in grads)  # DDP: each rank's gradient / world, summed
        opt.step()
    torch.save(model.state_dict(), out)


p = argparse.ArgumentParser()
p.add_argument("ckpt_dir", nargs="?")
p.add_argument("--steps", type=int, default=10**9)
p.add_argument("--step-time", type=float, default=0.05)
p.add_argument("--every", type=int, default=0)
p.add_argument("--replay", nargs=3, metavar=("STEPS", "WORLD", "OUT"))
a = p.parse_args()
if a.replay:
    replay(int(a.replay[0]), int(a.replay[1]), a.replay[2])
    raise SystemExit(0)

training.install_stop_handler()
rank = ezpz.setup_torch()
world = ezpz.get_world_size()
print(f"EZPZ rank={rank} world={world} local={ezpz.get_local_rank()} host={socket.gethostname()}"
      f" ezpz={ezpz.__version__}", flush=True)

torch.manual_seed(0)
net = torch.nn.Linear(8, 1)
ckpt = Path(a.ckpt_dir)
step = 0
if rank == 0:
    ckpt.mkdir(parents=True, exist_ok=True)
    restored = training.restored_from()
    pointer = ckpt / "latest"
    latest = Path(restored) if restored else (ckpt / pointer.read_text().strip()) if pointer.exists() else None
    if latest is not None and (latest / ".metadata").exists():
        state = torch.load(latest / "model.pt")
        net.load_state_dict(state["model"])
        step = int(state["step"])
        print(f"resumed {step}", flush=True)
model = DDP(net)  # broadcasts rank 0's weights (restored or not) to every rank
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = torch.tensor([float(step)])
dist.broadcast(start, 0)
step = int(start.item())


def save(step: int) -> None:
    if rank == 0:
        d = ckpt / f"step_{step:06d}"
        d.mkdir(exist_ok=True)
        torch.save({"model": model.module.state_dict(), "step": step}, d / "model.pt")
        (d / ".metadata").write_text(f"{step} {world} {os.getpid()}")
        tmp = ckpt / ".latest.tmp"
        tmp.write_text(d.name)
        os.replace(tmp, ckpt / "latest")
        print(f"checkpoint {step}", flush=True)
    dist.barrier()


stop = False
while step < a.steps:
    time.sleep(a.step_time)
    loss = model(batch(step, rank, world)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    flags = torch.tensor([float(training.stop_requested()), float(training.checkpoint_requested())])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    stop, asked = bool(flags[0].item()), bool(flags[1].item())
    if (a.every and step % a.every == 0) or asked or stop:
        save(step)
        if asked:
            training.acknowledge()
    if stop:
        if rank == 0:
            print(f"stopped {step}", flush=True)
        break
if not stop and rank == 0:
    print(f"done {step}", flush=True)
dist.destroy_process_group()
print(f"rank {rank} leaves", flush=True)
# Not SystemExit: under CI's load a rank aborted in Python 3.11's finalization, a C++
# thread of torch's (std::thread → PyEval_AcquireThread) taking the GIL after it was gone
# (pthread_exit through a noexcept frame: std::terminate), so mpirun said 1 after a clean
# stop. MPI is finalized here, as mpi4py's atexit would (a rank that leaves without it
# is one mpirun aborts the job for), then the process leaves without finalizing Python.
from mpi4py import MPI  # noqa: E402

if MPI.Is_initialized() and not MPI.Is_finalized():
    MPI.Finalize()
os._exit(0)
