"""Replays the DDP tutorial's training, epoch by epoch, as one uninterrupted run.

A job resumed from snapshots trains a sequence of epochs, some of them twice (the tutorial
saves ``EPOCHS_RUN = epoch`` after training ``epoch`` and starts again *at* it). Given that
sequence, this runs the same epochs in the same order with the tutorial's own ``Trainer``,
data and seed, and saves the final weights: equal to the job's, bit for bit, when every
resume loaded exactly the snapshot it should have.

    torchrun --standalone --nproc-per-node 4 ddp_replay.py OUT EPOCH [EPOCH ...]
"""

from __future__ import annotations

import os
import sys

import torch
from torch.distributed import destroy_process_group

sys.path.insert(0, os.path.dirname(__file__))
from ddp_tutorial import Trainer, ddp_setup, load_train_objs, prepare_dataloader  # noqa: E402


def main(out: str, epochs: list[int]) -> None:
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    trainer = Trainer(model, prepare_dataloader(dataset, 32), optimizer, save_every=1, snapshot_path=out + ".none")
    for epoch in epochs:
        trainer._run_epoch(epoch)
    if trainer.global_rank == 0:
        torch.save(trainer.model.module.state_dict(), out)
    destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], [int(e) for e in sys.argv[2:]])
