"""A fine-tuning with a frozen base, as its checkpoints look to supervise (issue 45).

Every --every steps it writes step_<N>/ with ``base.bin`` (--base bytes, the same every time:
the frozen weights), ``config.json`` (the same), ``adapter.bin`` (--adapter bytes of the step:
what training changed), ``rank_0.bin`` and ``rank_1.bin`` (two replicas of one state, the same
bytes: HF's ``save_on_each_node``), with --model ``model.bin`` (--model frozen bytes, then
the step's --adapter bytes: a whole state dict in one file), then the ``.metadata`` marker last. With --snapshot it also
rewrites ``snapshot/`` in place each time (the base and the step's adapter). --distinct N:
instead, N files of --adapter bytes each, all different (nothing to share). --safetensors:
instead, one ``model.safetensors`` (``SAFETENSORS``: tensors in name order, float32) in which
only ``b.weight``, in the middle, changes from step to step. Resumes from the newest step;
prints "resumed N", "checkpoint N", "done N".
"""

import argparse
import os
import time
from pathlib import Path

from supervisor import training

p = argparse.ArgumentParser()
p.add_argument("ckpt_dir")
p.add_argument("--steps", type=int, default=3)
p.add_argument("--every", type=int, default=1)
p.add_argument("--base", type=int, default=9 << 20)
p.add_argument("--adapter", type=int, default=1 << 20)
p.add_argument("--step-time", type=float, default=0.3)
p.add_argument("--snapshot", action="store_true")
p.add_argument("--model", type=int, default=0, help="also model.bin: this many frozen bytes, then --adapter trained ones")
p.add_argument("--distinct", type=int, default=0)
p.add_argument("--safetensors", action="store_true")
a = p.parse_args()

ckpt = Path(a.ckpt_dir)
ckpt.mkdir(parents=True, exist_ok=True)
training.install_stop_handler()


def fill(n: int, seed: int) -> bytes:
    block = seed.to_bytes(8, "little") * 512
    return (block * (n // len(block) + 1))[:n]


# name → bytes: norms and biases of 2 KiB between weights, one over 8 MiB; b.weight straddles 8 MiB
SAFETENSORS = {"a.embed": 6656 << 10, "a.norm": 2048, "b.bias": 2048, "b.weight": 3 << 20, "c.norm": 2048,
               "c.weight": 10 << 20, "d.head": 1536 << 10}
CHANGED = "b.weight"


def tensors(step: int) -> dict:
    import numpy as np

    return {name: np.frombuffer(np.random.default_rng(step if name == CHANGED else i).bytes(n), dtype=np.float32)
            for i, (name, n) in enumerate(SAFETENSORS.items(), 1000)}


def write(d: Path, step: int) -> None:
    d.mkdir(exist_ok=True)
    (d / ".metadata").unlink(missing_ok=True)  # rewritten in place: incomplete until the marker again
    if a.safetensors:
        from safetensors.numpy import save_file

        save_file(tensors(step), str(d / "model.safetensors"))
    elif a.distinct:
        for i in range(a.distinct):
            (d / f"part_{i}.bin").write_bytes(fill(a.adapter, step * 1000 + i + 7))
    else:
        (d / "base.bin").write_bytes(fill(a.base, 1))
        (d / "config.json").write_text('{"hidden": 64, "layers": 2}\n')
        (d / "adapter.bin").write_bytes(fill(a.adapter, 1000 + step))
        if a.model:  # one file of the whole state: its frozen tensors first, the trained ones after
            (d / "model.bin").write_bytes(fill(a.model, 2) + fill(a.adapter, 3000 + step))
        for r in (0, 1):
            (d / f"rank_{r}.bin").write_bytes(fill(4096, 5000 + step))
    (d / ".metadata").write_text(str(step))


steps = [int(d.name.split("_")[1]) for d in ckpt.glob("step_*") if (d / ".metadata").exists()]
step = max(steps, default=0)
if step:
    print(f"resumed {step}", flush=True)
while step < a.steps:
    time.sleep(a.step_time)
    step += 1
    if step % a.every == 0:
        write(ckpt / f"step_{step:06d}", step)
        if a.snapshot:
            write(ckpt / "snapshot", step)
        os.utime(ckpt)
        print(f"checkpoint {step}", flush=True)
    if training.stop_requested():
        break
print(f"done {step}", flush=True)
