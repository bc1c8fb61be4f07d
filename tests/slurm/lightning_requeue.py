"""A Lightning training as Lightning's documentation has it for Slurm, with its defaults.

``Trainer`` with its defaults (``SLURMEnvironment(auto_requeue=True)`` under ``srun``: a USR1
handler that saves ``hpc_ckpt_N.ckpt`` into ``default_root_dir`` and runs ``scontrol requeue``),
a tiny model built here, on the CPU, ``ModelCheckpoint(save_last=True)`` every few steps.
Resumed Lightning's way: ``trainer.fit(model, ckpt_path="last")`` (``RESUME=last``) or its own
HPC resume, ``trainer.fit(model)``, which loads the newest ``hpc_ckpt_N.ckpt`` of
``default_root_dir`` under Slurm (``RESUME=hpc``). It prints the step it starts at and from
what, and every step it finishes, to stdout (one line each).

    srun python lightning_requeue.py ROOT_DIR MAX_STEPS

``lightning_requeue_off.py`` is the same training with Lightning's auto-requeue turned off.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, i):  # noqa: ANN001, ANN201
        x, y = batch
        time.sleep(float(os.environ.get("STEP_SLEEP", "0.2")))  # a real step takes a while
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_start(self) -> None:
        handler = signal.getsignal(signal.SIGUSR1)
        print(f"start step={self.global_step} from={os.path.basename(str(self.trainer.ckpt_path))} "
              f"usr1={type(handler).__name__}", flush=True)

    def on_train_batch_end(self, *a) -> None:  # noqa: ANN002
        print(f"step {self.global_step}", flush=True)


def main(plugins: list | None = None) -> None:
    root, steps = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
    ckpt = ModelCheckpoint(dirpath=os.path.join(root, os.environ.get("CKPT_SUBDIR", "checkpoints")), filename="{step}", save_last=True,
                           every_n_train_steps=int(os.environ.get("SAVE_EVERY", "50")), save_top_k=-1)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, default_root_dir=root, callbacks=[ckpt],
                        plugins=plugins,
                        enable_progress_bar=False, enable_model_summary=False)
    resume = os.environ.get("RESUME", "last")
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8), ckpt_path="last" if resume == "last" else None)
    print(f"done step={trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
