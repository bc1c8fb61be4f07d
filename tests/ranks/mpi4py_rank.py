"""An mpi4py rank using the docs/training.md pattern: allreduce(LOR) of the request flag,
so a signal to ONE rank makes every rank checkpoint at the same step.
argv: OUT_DIR. Writes OUT_DIR/ready.<pid>, OUT_DIR/ckpt.<rank> ("<step>" lines)."""

import os
import sys
import time

from mpi4py import MPI

from supervisor import training

out = sys.argv[1]
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
with open(os.path.join(out, f".ready.{os.getpid()}"), "w") as f:
    f.write(str(rank))
os.replace(os.path.join(out, f".ready.{os.getpid()}"), os.path.join(out, f"ready.{os.getpid()}"))
end = time.monotonic() + 120
step = 0
while True:
    step += 1
    want = comm.allreduce(training.checkpoint_requested(), op=MPI.LOR)
    stop = comm.allreduce(os.path.exists(os.path.join(out, "stop")) or time.monotonic() > end, op=MPI.LOR)
    if want:
        with open(os.path.join(out, f"ckpt.{rank}"), "a") as f:
            f.write(f"{step}\n")
        training.acknowledge()
    if stop:
        break
    time.sleep(0.01)
