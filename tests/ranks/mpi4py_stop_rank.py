"""An mpi4py rank (``from mpi4py import MPI``: MPI_Init) that checkpoints on request and saves
and leaves on the stop signal.

argv: OUT_DIR CKPT_DIR [no-term]. Writes OUT_DIR/ready.<pid> (its rank), then steps; every step the ranks
agree with one allreduce(MAX) on "checkpoint now" (``training.checkpoint_requested()``) and on
the stop (``training.stop_requested()``: TERM/INT to any one rank, or OUT_DIR/stop), so a signal
that reaches one rank first still gives one checkpoint and one stop at the same step. Rank 0
saves CKPT_DIR/step_<N>/ (``weights`` then the ``.metadata`` marker, written last). On the stop
each rank writes OUT_DIR/saved.<rank> ("<step> <pid>") and exits 0 (mpi4py finalizes MPI at
exit). A leak guard ends it after 120 s. With ``no-term`` it installs no stop handler: TERM
kills it, as it does the PyTorch DDP tutorial (it still answers "checkpoint now").
"""

import os
import sys
import time

from mpi4py import MPI

from supervisor import training

out, ckpt = sys.argv[1], sys.argv[2]
if sys.argv[3:] != ["no-term"]:
    training.install_stop_handler()
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
pid = os.getpid()
with open(os.path.join(out, f".ready.{pid}"), "w") as f:
    f.write(str(rank))
os.replace(os.path.join(out, f".ready.{pid}"), os.path.join(out, f"ready.{pid}"))


def save(step: int) -> None:
    if rank == 0:
        d = os.path.join(ckpt, f"step_{step:06d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "weights"), "w") as f:
            f.write(f"{step}\n" * 100)
        with open(os.path.join(d, ".metadata"), "w") as f:
            f.write(f"{step} {comm.Get_size()}\n")
    comm.Barrier()


end = time.monotonic() + 120
step = 0
while True:
    step += 1
    stop = training.stop_requested() or os.path.exists(os.path.join(out, "stop")) or time.monotonic() > end
    asked, stop = comm.allreduce((training.checkpoint_requested(), stop), op=MPI.MAX)
    if asked or stop:
        save(step)
    if asked:
        training.acknowledge()
    if stop:
        break
    time.sleep(0.02)
with open(os.path.join(out, f"saved.{rank}"), "w") as f:
    f.write(f"{step} {pid}\n")
