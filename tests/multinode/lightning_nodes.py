"""A Lightning training across nodes, written as its documentation has users write it for Slurm.

``Trainer(num_nodes=2, devices=2, strategy="ddp")`` started by ``srun`` (one task per device),
``ModelCheckpoint(save_last=True, every_n_epochs=1)`` into ``checkpoints/`` under the working
directory (each node's own local disk: global rank 0 writes there), resumed the standard way,
``trainer.fit(..., ckpt_path="last")``, which every rank resolves on its own node's disk. Each
rank prints the epoch it starts at and the checkpoint ``ckpt_path`` led it to.

    srun python lightning_nodes.py MAX_EPOCHS
"""

from __future__ import annotations

import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_epoch_end(self) -> None:
        time.sleep(float(os.environ.get("EPOCH_SLEEP", "0")))  # a real epoch takes a while

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_start(self) -> None:
        # one write: the ranks of a node share srun's stdout
        print(f"rank {self.global_rank} starts at epoch {self.current_epoch} from "
              f"{os.path.basename(str(self.trainer.ckpt_path))}\n", end="", flush=True)


def main() -> None:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", max_epochs=int(sys.argv[1]),
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[ModelCheckpoint(dirpath="checkpoints", save_last=True, every_n_epochs=1)])
    trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=8), ckpt_path="last")


if __name__ == "__main__":
    main()
