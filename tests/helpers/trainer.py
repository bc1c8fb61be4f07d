"""A small stand-in training that behaves like a real one towards supervise.

Each step sleeps --step-time; every --every steps, on "checkpoint now" (signal or request
file) and on TERM/INT it writes step_<N>/ with --files shards of --size bytes, the
torch.distributed.checkpoint marker ``.metadata`` last, and a top-level ``latest``
pointer. It resumes from $SUPERVISE_RESTORED_FROM (or the newest local checkpoint).
Prints one line per event to stdout: "resumed N", "checkpoint N", "stopped N", "done N".
"""

import argparse
import os
import sys
import time
from pathlib import Path

from supervisor import training

p = argparse.ArgumentParser()
p.add_argument("ckpt_dir")
p.add_argument("--steps", type=int, default=10**9)
p.add_argument("--step-time", type=float, default=0.05)
p.add_argument("--every", type=int, default=0)
p.add_argument("--files", type=int, default=2)
p.add_argument("--size", type=int, default=4096)
p.add_argument("--write-time", type=float, default=0.0, help="seconds spent writing each checkpoint")
p.add_argument("--fail-at", type=int, default=0, help="exit 3 at this step (a crash)")
p.add_argument("--ignore-stop", action="store_true")
p.add_argument("--stopped-status", type=int, default=0, help="exit status after a stop (torchrun exits 1)")
p.add_argument("--no-answer", action="store_true", help="ignore checkpoint requests: save only every --every steps")
p.add_argument("--check", action="store_true", help="on resume, read every shard back: 'loaded N good' or 'loaded N bad'")
a = p.parse_args()

ckpt = Path(a.ckpt_dir)
ckpt.mkdir(parents=True, exist_ok=True)
if not a.ignore_stop:
    training.install_stop_handler()


def newest() -> int:
    steps = [int(d.name.split("_")[1]) for d in ckpt.glob("step_*") if (d / ".metadata").exists()]
    return max(steps, default=0)


def save(step: int) -> None:
    d = ckpt / f"step_{step:06d}"
    d.mkdir(exist_ok=True)
    for i in range(a.files):
        with open(d / f"shard_{i}.bin", "wb") as f:
            f.write(step.to_bytes(8, "little") * (a.size // 8))
        if a.write_time:
            time.sleep(a.write_time / a.files)
    (d / ".metadata").write_text(str(step))
    tmp = ckpt / ".latest.tmp"
    tmp.write_text(d.name)
    os.replace(tmp, ckpt / "latest")
    print(f"checkpoint {step}", flush=True)


restored = training.restored_from()
step = newest()
if restored or step:
    print(f"resumed {step}", flush=True)
    if a.check and step:
        shards = sorted((ckpt / f"step_{step:06d}").glob("shard_*.bin"))
        good = len(shards) == a.files and all(s.read_bytes() == step.to_bytes(8, "little") * (a.size // 8) for s in shards)
        print(f"loaded {step} {'good' if good else 'bad'}", flush=True)
while step < a.steps:
    time.sleep(a.step_time)
    step += 1
    if a.fail_at and step == a.fail_at:
        print(f"crash {step}", flush=True)
        sys.exit(3)
    if (a.every and step % a.every == 0) or (not a.no_answer and training.checkpoint_requested()):
        save(step)
        training.acknowledge()
    if training.stop_requested():
        save(step)
        print(f"stopped {step}", flush=True)
        sys.exit(a.stopped_status)
print(f"done {step}", flush=True)
