"""torch.distributed.checkpoint (one process, no process group): ``step_N/`` with ``.metadata``
written last; resumed with ``dcp.load`` of the restored directory (``SUPERVISE_RESTORED_FROM``)."""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import parse, progress  # noqa: E402

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.filesystem import FileSystemWriter  # noqa: E402

args = parse({"width": 64})


class PausingWriter(FileSystemWriter):
    """A slow shard write: the ``.distcp`` files are on disk, ``.metadata`` is not yet."""

    def finish(self, metadata, results):  # noqa: ANN001, ANN201
        time.sleep(args.save_pause)
        return super().finish(metadata, results)


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
step = torch.zeros((), dtype=torch.int64)
restored = os.environ.get("SUPERVISE_RESTORED_FROM")
if restored:
    state = {"model": model.state_dict(), "step": step}
    dcp.load(state, checkpoint_id=restored)
    model.load_state_dict(state["model"])
progress(args.progress, "start", step=int(step), restored=restored)
while int(step) < args.steps:
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    step += 1
    progress(args.progress, "step", step=int(step))
    time.sleep(args.step_sleep)
    if int(step) % args.save_every == 0:
        path = os.path.join(args.out, f"step_{int(step):05d}")
        dcp.save({"model": model.state_dict(), "step": step}, storage_writer=PausingWriter(path))
        progress(args.progress, "saved", step=int(step))
progress(args.progress, "done", step=int(step))
