"""Lightning ``ModelCheckpoint`` (``every_n_train_steps``, ``save_last`` True or "link"), resumed
with ``trainer.fit(model, ckpt_path="last")``."""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import parse, progress  # noqa: E402

import shutil  # noqa: E402

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

args = parse({"save-last": "true"})


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, i):  # noqa: ANN001, ANN201
        # The step's batch is a function of the step: a run resumed mid-epoch trains on the
        # batches an uninterrupted one does (this DataLoader is not resumable; Lightning warns that
        # a mid-epoch resume then repeats or skips batches).
        g = torch.Generator().manual_seed(self.trainer.global_step)
        x, y = torch.randn(4, 16, generator=g), torch.randn(4, 1, generator=g)
        time.sleep(args.step_sleep)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def on_train_start(self) -> None:
        progress(args.progress, "start", step=self.trainer.global_step,
                 restored=os.environ.get("SUPERVISE_RESTORED_FROM"))

    def on_train_batch_end(self, *a) -> None:  # noqa: ANN002
        progress(args.progress, "step", step=self.trainer.global_step)


class Logged(ModelCheckpoint):
    def _save_checkpoint(self, trainer, filepath) -> None:  # noqa: ANN001
        super()._save_checkpoint(trainer, filepath)
        if os.path.basename(filepath) != "last.ckpt":
            progress(args.progress, "saved", step=trainer.global_step)


def slow_cross_device_move(src: str, dst: str) -> None:
    """What ``shutil.move`` does when $TMPDIR is another filesystem (fsspec's commit), on a
    slow disk: the final name is written in place, with a pause halfway."""
    with open(src, "rb") as s, open(dst, "wb") as d:
        data = s.read()
        d.write(data[: len(data) // 2])
        d.flush()
        time.sleep(args.save_pause)
        d.write(data[len(data) // 2:])
    shutil.copystat(src, dst)
    os.unlink(src)


if args.save_pause:
    shutil.move = slow_cross_device_move


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
ckpt = Logged(dirpath=args.out, filename="{step}", every_n_train_steps=args.save_every, save_top_k=-1,
                       save_last={"true": True, "link": "link", "false": False}[args.save_last])
trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False, callbacks=[ckpt],
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                    default_root_dir=os.path.dirname(args.progress))
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4), ckpt_path="last")
progress(args.progress, "done", step=trainer.global_step)
