"""The batch script that runs the PyTorch DDP tutorial's multi-node pattern under supervise on
the multi-node test cluster (tests/multinode/ddp_tutorial.py: ``srun torchrun --nnodes 2
--nproc-per-node 2``, rendezvous on the batch node), as test_ddp_tutorial, test_spare_nodes and
bench/recovery.py submit it; only its ``#SBATCH`` lines differ."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.paths import ROOT

SCRIPT = ROOT / "tests" / "multinode" / "ddp_tutorial.py"

# What the tutorial prints, found anywhere in a line: its ``print`` is two writes under
# PYTHONUNBUFFERED (the text, then "\n"), and the two ranks of a node share srun's stdout, so
# their lines can come out as "…Epoch 20Resuming training … Epoch 20\n\n" (CI: 3 of 4 found
# when anchored at a line's start).
RESUMED = re.compile(r"Resuming training from snapshot at Epoch (\d+)")
SAVED = re.compile(r"Epoch (\d+) \| Training snapshot saved")
TRAINING = re.compile(r"\[GPU\d\] Epoch \d+ \|")


def resumed_epochs(text: str) -> list[int]:
    """The epoch each rank resumed from, in the order printed."""
    return [int(x) for x in RESUMED.findall(text)]


def saved_epochs(text: str) -> list[int]:
    """The epochs rank 0 saved, in order."""
    return [int(x) for x in SAVED.findall(text)]


TORCHRUN = Path(sys.executable).parent / "torchrun"

BODY = """cd {repo}
echo "attempt ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST"
# unbuffered: a rank killed with its node has printed its "Resuming" line already (CI once had 3 of 4)
export EPOCH_SLEEP=1.0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
exec {python} -m supervisor --config {cfg} --run-dir {run} -- \\
  srun --ntasks-per-node=1 --chdir={local}/ckpt {torchrun} --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d \\
  --rdzv-endpoint=$HEAD:29500 --rdzv-id=$SLURM_JOB_ID-$SLURM_RESTART_COUNT {train} {epochs} {every}
"""


def tutorial_job(directives: list[str], *, cfg: Path, run: Path, local: str, epochs: int, every: int = 1,
                 train: Path = SCRIPT) -> str:
    """The script: ``#SBATCH`` + each of ``directives``, then the tutorial under supervise."""
    head = "#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives)
    return head + BODY.format(repo=ROOT, python=sys.executable, cfg=cfg, run=run, local=local, torchrun=TORCHRUN,
                              train=train, epochs=epochs, every=every)


def replay(epochs: list[int], out: Path) -> dict[str, Any]:
    """The weights of an uninterrupted run of these epochs, in this order (``ddp_replay.py``: four
    ranks on this machine), to compare with what the job's attempts trained."""
    import torch

    proc = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node=4", str(SCRIPT.with_name("ddp_replay.py")),
                           str(out), *map(str, epochs)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)
