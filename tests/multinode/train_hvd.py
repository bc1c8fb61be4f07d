"""A Horovod training written the way Horovod's own examples write it (``horovod.torch``).

As ``examples/pytorch/pytorch_imagenet_resnet50.py`` in Horovod's repository does:

* at start every rank looks for the newest ``--checkpoint-format`` file (``checkpoint-{epoch}.pth.tar``)
  on its own disk, and ``hvd.broadcast`` makes rank 0's answer everybody's;
* rank 0 alone loads it, then ``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state``
  from rank 0;
* after each epoch rank 0 ``torch.save``s ``checkpoint-{epoch+1}.pth.tar`` (a new file, written in
  place) on its node's local disk;
* no signal handler: a TERM kills it.

For the test, each rank appends what it did to ``--progress`` (shared storage): where it
started (the epoch and a digest of the weights after the broadcast) and, on rank 0, what it
saved (the epoch and the digest of the weights saved).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import time


def main() -> None:
    import torch
    import horovod.torch as hvd

    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint-format", default="./checkpoint-{epoch}.pth.tar")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--epoch-sleep", type=float, default=1.0)
    ap.add_argument("--progress", required=True)
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)

    def say(what: str, **fields: object) -> None:
        with open(args.progress, "a") as f:
            f.write(json.dumps({"what": what, "rank": hvd.rank(), "size": hvd.size(), "host": socket.gethostname(),
                                "attempt": int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1,
                                "step_id": os.environ.get("SLURM_STEP_ID"), "t": time.time(), **fields}) + "\n")

    def digest() -> str:
        return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.state_dict().values())).hexdigest()[:16]

    # If set > 0, will resume training from a given checkpoint.
    resume_from_epoch = 0
    for try_epoch in range(args.epochs, 0, -1):
        if os.path.exists(args.checkpoint_format.format(epoch=try_epoch)):
            resume_from_epoch = try_epoch
            break
    # Horovod: broadcast resume_from_epoch from rank 0 (which will have checkpoints) to other ranks.
    resume_from_epoch = hvd.broadcast(torch.tensor(resume_from_epoch), root_rank=0, name="resume_from_epoch").item()

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    # Horovod: scale learning rate by the number of workers.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    # Restore from a previous checkpoint, if initial_epoch is specified.
    # Horovod: restore on the first worker which will broadcast weights to other workers.
    if resume_from_epoch > 0 and hvd.rank() == 0:
        filepath = args.checkpoint_format.format(epoch=resume_from_epoch)
        checkpoint = torch.load(filepath)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    say("start", epoch=resume_from_epoch, digest=digest())
    print(f"rank {hvd.rank()} on {socket.gethostname()} starts at epoch {resume_from_epoch}", flush=True)

    def save_checkpoint(epoch: int) -> None:
        if hvd.rank() == 0:
            filepath = args.checkpoint_format.format(epoch=epoch + 1)
            os.makedirs(os.path.dirname(filepath) or ".", exist_ok=True)
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, filepath)
            say("saved", epoch=epoch + 1, digest=digest())
            print(f"saved {filepath}", flush=True)

    for epoch in range(resume_from_epoch, args.epochs):
        g = torch.Generator().manual_seed(epoch * 1000 + hvd.rank())
        for _ in range(4):
            x = torch.randn(16, 32, generator=g)
            y = x.sum(dim=1, keepdim=True)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        time.sleep(args.epoch_sleep)
        save_checkpoint(epoch)
    say("done", digest=digest())


if __name__ == "__main__":
    main()
