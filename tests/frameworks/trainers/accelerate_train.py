"""Accelerate ``save_state`` with ``ProjectConfiguration(automatic_checkpoint_naming=True)``
(``checkpoints/checkpoint_N/``), resumed with ``accelerator.load_state(newest checkpoint_N)``."""

from __future__ import annotations

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import parse, progress  # noqa: E402

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import ProjectConfiguration  # noqa: E402

args = parse()
torch.manual_seed(0)
acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
    project_dir=args.out, automatic_checkpoint_naming=True, total_limit=None))
model = torch.nn.Linear(16, 1)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
model, opt = acc.prepare(model, opt)


class Step:
    """Registered for checkpointing so the step resumes with the state (``custom_checkpoint_0.pkl``)."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, int]:
        time.sleep(args.save_pause)  # inside save_state: model and optimizer are on disk, RNG state not yet
        return {"n": self.n}

    def load_state_dict(self, d: dict[str, int]) -> None:
        self.n = d["n"]


step = Step()
acc.register_for_checkpointing(step)
ckdir = os.path.join(args.out, "checkpoints")
if os.path.isdir(ckdir) and os.listdir(ckdir):
    acc.load_state()  # the newest checkpoints/checkpoint_N, by N
    newest = max(int(m.group(1)) for d in os.listdir(ckdir) if (m := re.fullmatch(r"checkpoint_(\d+)", d)))
    acc.project_configuration.iteration = newest + 1  # save_state refuses to overwrite checkpoint_N
progress(args.progress, "start", step=step.n, restored=os.environ.get("SUPERVISE_RESTORED_FROM"))
while step.n < args.steps:
    x = torch.randn(4, 16)
    loss = model(x).pow(2).mean()
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    step.n += 1
    progress(args.progress, "step", step=step.n)
    time.sleep(args.step_sleep)
    if step.n % args.save_every == 0:
        acc.save_state()
        progress(args.progress, "saved", step=step.n)
progress(args.progress, "done", step=step.n)
