"""The documented on-disk layouts of libraries not installed here (DeepSpeed needs an op build,
Orbax needs jax), written file by file in the libraries' order by a small torch loop:

* ``deepspeed``: ``engine.save_checkpoint(out, tag="global_stepN")`` → ``global_stepN/
  mp_rank_00_model_states.pt``, ``global_stepN/zero_pp_rank_0_mp_rank_00_optim_states.pt``,
  the recovery script ``zero_to_fp32.py`` copied beside them, then ``latest`` (the tag);
  resumed by reading ``latest`` (``engine.load_checkpoint(out)``).
* ``megatron``: ``iter_000000N/mp_rank_00/model_optim_rng.pt``, then
  ``latest_checkpointed_iteration.txt`` (the number); resumed from the tracker (``--load``).
* ``generic``: a layout no profile knows, ``ckpt_N/weights.pt`` then a ``DONE`` file of the
  user's own (``--marker DONE``); resumed from the highest ``ckpt_N/`` that has ``DONE``.
* ``orbax``: ``N.orbax-checkpoint-tmp-<ns>/`` with the items and ``_CHECKPOINT_METADATA``,
  renamed to ``N/`` when done (the default on POSIX); resumed from the highest ``N/``
  (``CheckpointManager.latest_step()``).
"""

from __future__ import annotations

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import parse, progress  # noqa: E402

import torch  # noqa: E402

args = parse({"layout": "deepspeed"})
out = args.out
os.makedirs(out, exist_ok=True)
model = torch.nn.Linear(16, 8)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)


def newest() -> tuple[int, str] | None:
    """Where the library's own loader would resume from."""
    if args.layout == "deepspeed" and os.path.exists(os.path.join(out, "latest")):
        tag = open(os.path.join(out, "latest")).read().strip()
        return int(tag.removeprefix("global_step")), os.path.join(out, tag, "mp_rank_00_model_states.pt")
    if args.layout == "megatron" and os.path.exists(os.path.join(out, "latest_checkpointed_iteration.txt")):
        n = int(open(os.path.join(out, "latest_checkpointed_iteration.txt")).read().strip())
        return n, os.path.join(out, f"iter_{n:07d}", "mp_rank_00", "model_optim_rng.pt")
    if args.layout == "generic":
        steps = [int(d[5:]) for d in os.listdir(out) if re.fullmatch(r"ckpt_\d+", d)
                 and os.path.exists(os.path.join(out, d, "DONE"))]
        if steps:
            return max(steps), os.path.join(out, f"ckpt_{max(steps)}", "weights.pt")
    if args.layout == "orbax":
        steps = [int(d) for d in os.listdir(out) if re.fullmatch(r"\d+", d)]
        if steps:
            return max(steps), os.path.join(out, str(max(steps)), "default", "state.pt")
    return None


def save(step: int) -> None:
    state = {"model": model.state_dict(), "step": step}
    optim = {"optim": opt.state_dict(), "step": step}
    if args.layout == "deepspeed":
        d = os.path.join(out, f"global_step{step}")
        os.makedirs(d, exist_ok=True)
        torch.save(state, os.path.join(d, "mp_rank_00_model_states.pt"))
        time.sleep(args.save_pause)  # the ZeRO optimizer-state gather
        torch.save(optim, os.path.join(d, "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
        with open(os.path.join(out, "zero_to_fp32.py"), "w") as f:
            f.write("# DeepSpeed's recovery script, copied beside the checkpoints at every save\n")
        with open(os.path.join(out, "latest"), "w") as f:
            f.write(f"global_step{step}")
    elif args.layout == "megatron":
        d = os.path.join(out, f"iter_{step:07d}", "mp_rank_00")
        os.makedirs(d, exist_ok=True)
        time.sleep(args.save_pause)
        torch.save({**state, **optim}, os.path.join(d, "model_optim_rng.pt"))
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(step))
    elif args.layout == "generic":
        d = os.path.join(out, f"ckpt_{step}")
        os.makedirs(d, exist_ok=True)
        torch.save(state, os.path.join(d, "weights.pt"))
        time.sleep(args.save_pause)
        torch.save(optim, os.path.join(d, "optim.pt"))
        open(os.path.join(d, "DONE"), "w").close()
    else:
        tmp = os.path.join(out, f"{step}.orbax-checkpoint-tmp-{time.time_ns()}")
        os.makedirs(os.path.join(tmp, "default"))
        torch.save(state, os.path.join(tmp, "default", "state.pt"))
        time.sleep(args.save_pause)
        with open(os.path.join(tmp, "_CHECKPOINT_METADATA"), "w") as f:
            f.write('{"step": %d}' % step)
        os.rename(tmp, os.path.join(out, str(step)))


step = 0
found = newest()
if found:
    state = torch.load(found[1], weights_only=True)
    model.load_state_dict(state["model"])
    step = state["step"]
progress(args.progress, "start", step=step, restored=os.environ.get("SUPERVISE_RESTORED_FROM"))
while step < args.steps:
    loss = model(torch.randn(4, 16)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    step += 1
    progress(args.progress, "step", step=step)
    time.sleep(args.step_sleep)
    if step % args.save_every == 0:
        save(step)
        progress(args.progress, "saved", step=step)
progress(args.progress, "done", step=step)
