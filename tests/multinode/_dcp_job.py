"""The 2-node torchrun DCP job of the multi-node tests (test_bar, test_batch_node,
test_agent_hang, test_disk_full): ``train_dcp.py`` on two nodes, 2 ranks each, every rank's shard
on its own node's local disk, checkpoints mirrored to ``shared/persist/ckpt``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.slurm import SlurmCluster

STEPS, SAVE_EVERY = 40, 5
SHARDS = {".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"}

JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --requeue
#SBATCH --open-mode=append
cd {repo}
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
exec {python} -m supervisor --config {cfg} --run-dir {run} -- \\
  srun --ntasks-per-node=1 {torchrun} --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d \\
  --rdzv-endpoint=$HEAD:29500 --rdzv-id=$SLURM_JOB_ID-$SLURM_RESTART_COUNT {train} --out {local}/ckpt \\
  --steps {steps} --save-every {every} --step-sleep 0.3 --progress {progress} --final {final}
"""


def published(c: SlurmCluster) -> dict[str, set[str]]:
    dst = c.shared / "persist" / "ckpt"
    if not dst.exists():
        return {}
    return {d.name: {f.name for f in d.iterdir()} for d in dst.iterdir() if d.is_dir() and not d.name.startswith(".")}


class PublishedWatch:
    """``published(c)`` each time it is called, remembering every checkpoint it ever saw on
    persistent storage without all of its ranks' shards (``torn``: must stay empty)."""

    def __init__(self, c: SlurmCluster) -> None:
        self.c = c
        self.torn: list[str] = []

    def __call__(self) -> dict[str, set[str]]:
        now = published(self.c)
        self.torn.extend(f"{n}: {sorted(SHARDS - files)}" for n, files in now.items() if not SHARDS <= files)
        return now


def submit_job(c: SlurmCluster) -> tuple[str, Path, Path, Path]:
    """The 2-node torchrun DCP job; (job id, run dir, progress file, final weights file).
    Skipped at run time without torch (the job's torchrun and the check need it)."""
    pytest.importorskip("torch", reason="the 2-node DCP job runs torchrun: torch is not installed")
    run, progress, final = c.shared / "run", c.shared / "progress.jsonl", c.shared / "final.pt"
    cfg = c.shared / "run.toml"
    cfg.write_text(f'[[sync]]\nname = "ckpt"\nfrom = "{c.local}/ckpt"\nto = "{c.shared}/persist/ckpt"\n'
                   'nodes = 2\nsettle = "2s"\nrestore = true\n')
    script = JOB.format(repo=ROOT, python=sys.executable, cfg=cfg, run=run, torchrun=Path(sys.executable).parent / "torchrun",
                        train=Path(__file__).parent / "train_dcp.py", local=c.local, steps=STEPS, every=SAVE_EVERY,
                        progress=progress, final=final)
    return c.submit(script, "-o", str(c.shared / "job.out")), run, progress, final
