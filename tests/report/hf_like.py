"""A stand-in training that checkpoints the way HF ``Trainer`` does by default, for the golden runs.

``checkpoint-<N>/`` directories (``pytorch_model.bin``, ``training_args.bin``) with no
completion marker, so supervise can only publish them once unchanged for the settle time;
the last one is written just before the process exits. Options make the cases
``tests/report/make_golden.py`` needs: ``--from-scratch`` ignores the restored checkpoint
(the training starts over), ``--rewrite`` saves one file ``model.pt`` by rename at every
checkpoint instead (one name, many versions), ``--prefix`` names the checkpoints, ``--linger``
waits before the exit.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor import training  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("ckpt_dir", type=Path)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--every", type=int, default=20)
p.add_argument("--step-time", type=float, default=0.05)
p.add_argument("--prefix", default="checkpoint-")
p.add_argument("--from-scratch", action="store_true")
p.add_argument("--rewrite", action="store_true")
p.add_argument("--linger", type=float, default=0.0, help="seconds to wait after the last checkpoint")
a = p.parse_args()
a.ckpt_dir.mkdir(parents=True, exist_ok=True)
training.install_stop_handler()

start = 0
restored = training.restored_from()
if restored and not a.from_scratch:
    m = re.search(r"(\d+)$", Path(restored).name)
    start = int(m.group(1)) if m else 0
print(f"starting at step {start + 1}", flush=True)


def save(step: int) -> None:
    if a.rewrite:
        tmp = a.ckpt_dir / ".model.pt.tmp"
        tmp.write_bytes(step.to_bytes(8, "little") * 512)
        os.replace(tmp, a.ckpt_dir / "model.pt")
        return
    d = a.ckpt_dir / f"{a.prefix}{step}"
    d.mkdir(exist_ok=True)
    (d / "pytorch_model.bin").write_bytes(step.to_bytes(8, "little") * 1024 + repr(time.time()).encode())
    (d / "training_args.bin").write_bytes(b"args")


for step in range(start + 1, a.steps + 1):
    time.sleep(a.step_time)
    if step % a.every == 0 or step == a.steps:
        save(step)
    if training.stop_requested():
        print(f"stopped at step {step}", flush=True)
        sys.exit(0)
time.sleep(a.linger)
print(f"done at step {a.steps}", flush=True)
