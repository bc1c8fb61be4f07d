"""Orbax ``CheckpointManager`` at its default settings (async saves, ``N/`` renamed into place
from ``N.orbax-checkpoint-tmp-*``) around a tiny jax training loop on the CPU; resumed with
``manager.restore(manager.latest_step())``.

``--save-pause S`` pauses inside each save, after every file of the step is written and
before Orbax renames the temporary directory into place (its completion signal on POSIX).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import parse, progress  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from orbax.checkpoint._src.path import atomicity  # noqa: E402

args = parse()

if args.save_pause:
    plain_finalize = atomicity.AtomicRenameTemporaryPath.finalize

    def slow_finalize(self, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202 - Orbax's own signature
        time.sleep(args.save_pause)
        return plain_finalize(self, *a, **kw)

    atomicity.AtomicRenameTemporaryPath.finalize = slow_finalize


def loss_fn(params, x):  # noqa: ANN001, ANN201
    return jnp.mean((x @ params["w"] + params["b"]) ** 2)


grad = jax.jit(jax.grad(loss_fn))
key = jax.random.PRNGKey(0)
state = {"params": {"w": jax.random.normal(key, (16, 1)) * 0.1, "b": jnp.zeros((1,))}, "step": jnp.int32(0)}
manager = ocp.CheckpointManager(os.path.abspath(args.out))
step = 0
if manager.latest_step() is not None:
    state = manager.restore(manager.latest_step(), args=ocp.args.StandardRestore(state))
    step = int(state["step"])
progress(args.progress, "start", step=step, restored=os.environ.get("SUPERVISE_RESTORED_FROM"))
while step < args.steps:
    sub = jax.random.fold_in(key, step)  # a function of the step: a resumed run sees the same batches
    g = grad(state["params"], jax.random.normal(sub, (4, 16)))
    step += 1
    state = {"params": jax.tree_util.tree_map(lambda p, d: p - 1e-3 * d, state["params"], g), "step": jnp.int32(step)}
    progress(args.progress, "step", step=step)
    time.sleep(args.step_sleep)
    if step % args.save_every == 0:
        manager.save(step, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()  # "saved" means on disk; the next save would wait for it anyway
        progress(args.progress, "saved", step=step)
manager.wait_until_finished()
manager.close()
progress(args.progress, "done", step=step)
