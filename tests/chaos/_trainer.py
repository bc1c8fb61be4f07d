"""The chaos trials' training: runs until told to end, checkpoints in the sync tests' format.

Every --every steps, on "checkpoint now" (signal or request file) and on TERM/INT it writes
``step_<N>/`` with --files shards of --size bytes through ``tests.sync._util.write_checkpoint``
(dcp style: each shard's content names its checkpoint and index, ``.metadata`` last), then
moves a top-level ``latest`` pointer. It resumes from the newest complete local checkpoint.
The harness steers it with files, never with timing: --ready is written once the stop
handler is installed; when --until appears it exits with --exit-status (0: the training
reached its end; anything else: a crash). A stop signal saves and exits 0.
"""

import argparse
import os
import time
from pathlib import Path

from supervisor import training  # installs the checkpoint-signal handler on import
from tests.support.checkpoints import write_checkpoint

p = argparse.ArgumentParser()
p.add_argument("ckpt_dir")
p.add_argument("--every", type=int, default=5)
p.add_argument("--files", type=int, default=2)
p.add_argument("--size", type=int, default=65536)
p.add_argument("--step-time", type=float, default=0.05)
p.add_argument("--write-time", type=float, default=0.0, help="seconds spent writing each checkpoint")
p.add_argument("--ready", required=True)
p.add_argument("--until", required=True)
p.add_argument("--exit-status", type=int, default=0)
a = p.parse_args()

ckpt = Path(a.ckpt_dir)
ckpt.mkdir(parents=True, exist_ok=True)
training.install_stop_handler()
Path(a.ready).write_text(str(os.getpid()))
chunks = a.files * max(1, -(-a.size // (1 << 16)))


def newest() -> int:
    return max((int(d.name.split("_")[1]) for d in ckpt.glob("step_*") if (d / ".metadata").exists()), default=0)


def save(step: int) -> None:
    name = f"step_{step:06d}"
    write_checkpoint(ckpt, name, style="dcp", shards=a.files, size=a.size, delay=a.write_time / chunks)
    tmp = ckpt / ".latest.tmp"
    tmp.write_text(name)
    os.replace(tmp, ckpt / "latest")
    print(f"checkpoint {step}", flush=True)


step = newest()
print(f"resumed {step}", flush=True)
while True:
    time.sleep(a.step_time)
    step += 1
    if step % a.every == 0 or training.checkpoint_requested():
        save(step)
        training.acknowledge()
    if training.stop_requested():
        save(step)
        print(f"stopped {step}", flush=True)
        raise SystemExit(0)
    if os.path.exists(a.until):
        print(f"done {step} (exit {a.exit_status})", flush=True)
        raise SystemExit(a.exit_status)
