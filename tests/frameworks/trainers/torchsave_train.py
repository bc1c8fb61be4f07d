"""Plain ``torch.save`` of one file: rewritten in place every ``--save-every`` steps
(``--mode inplace``, the common ``snapshot.pt``), through a temp name and ``os.replace``
(``--mode replace``), or one file per step (``--mode perstep``, ``model_N.pt``); resumed with
``torch.load`` of the restored file (``SUPERVISE_RESTORED_FROM``) or the one at its usual name."""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import parse, progress  # noqa: E402

import torch  # noqa: E402

args = parse({"mode": "inplace", "width": 64})


class SlowFile:
    """A file object whose writes pause halfway: a slow disk or a gather inside ``torch.save``."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "wb")
        self.written = 0

    def write(self, b: bytes) -> int:  # noqa: D401
        if self.written < 4096 <= self.written + len(b):
            self.f.flush()
            time.sleep(args.save_pause)
        self.written += len(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def save(state: dict, path: str) -> None:
    if not args.save_pause:
        torch.save(state, path)
        return
    f = SlowFile(path)
    try:
        torch.save(state, f)
    finally:
        f.close()


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
os.makedirs(args.out, exist_ok=True)
snapshot = os.path.join(args.out, "snapshot.pt")
resume = os.environ.get("SUPERVISE_RESTORED_FROM") or (snapshot if os.path.exists(snapshot) else None)
step = 0
if resume:
    state = torch.load(resume, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    step = state["step"]
progress(args.progress, "start", step=step, restored=os.environ.get("SUPERVISE_RESTORED_FROM"))
while step < args.steps:
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    step += 1
    progress(args.progress, "step", step=step)
    time.sleep(args.step_sleep)
    if step % args.save_every == 0:
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        if args.mode == "inplace":
            save(state, snapshot)
        elif args.mode == "replace":
            save(state, snapshot + ".tmp")
            os.replace(snapshot + ".tmp", snapshot)
        else:
            save(state, os.path.join(args.out, f"model_{step}.pt"))
        progress(args.progress, "saved", step=step)
progress(args.progress, "done", step=step)
