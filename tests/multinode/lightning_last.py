"""A Lightning training resumed the standard way: ``ModelCheckpoint(save_last=True,
every_n_epochs=1)`` and ``trainer.fit(..., ckpt_path="last")``. It prints the epoch it starts
at and where ``ckpt_path`` led, and saves nothing else.

    python lightning_last.py CKPT_DIR MAX_EPOCHS
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
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        time.sleep(0.3)
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_start(self) -> None:
        print(f"starts at epoch {self.trainer.current_epoch} from {os.path.basename(str(self.trainer.ckpt_path))}",
              flush=True)


def main() -> None:
    ckpt, epochs = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 4)), batch_size=1)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, logger=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        callbacks=[ModelCheckpoint(dirpath=ckpt, save_last=True, every_n_epochs=1)])
    trainer.fit(Model(), data, ckpt_path="last")


if __name__ == "__main__":
    main()
