"""The bar of issue 17: from the wheel alone to a supervised job under Slurm.

A fresh venv holds only `pip install <the built wheel>`; its `supervise init --scheduler slurm
--launcher torchrun` writes a job script and config; `supervise check` accepts them; sbatch runs
the script as written (only --cpus-per-task is sized down on the command line) and the training
ends with its checkpoint mirrored. The training's own environment (torch) is the test venv's,
given as torchrun's absolute path, as a user would point at theirs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import journal
from tests.support.paths import ROOT
from tests.support.slurm import Slurm
from tests.support.wheel import build_wheel, fresh_venv

pytestmark = pytest.mark.slurm
STEPS = 30


def test_init_from_the_wheel_runs_under_slurm(slurm: Slurm, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    torchrun = Path(sys.executable).parent / "torchrun"
    venv_bin = fresh_venv(tmp_path / "venv", build_wheel(tmp_path / "wheel"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_", "PYTHON"))}
    env["PATH"] = f"{venv_bin}:{env['PATH']}"
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    command = [str(torchrun), "--standalone", "--nproc-per-node", "2", str(ROOT / "examples" / "ddp_train.py"),
               "--steps", str(STEPS), "--ckpt-every", "10",
               "--ckpt-dir", "$LOCAL_DIR/checkpoints", "--log-dir", "$LOCAL_DIR/logs"]
    init = subprocess.run(["supervise", "init", "--scheduler", "slurm", "--launcher", "torchrun", "--gpus", "0",
                           "--time", "1:00:00", "--name", "tiny", "--local", str(tmp_path / "local"),
                           "--persistent", str(tmp_path / "persistent"), "--", *command],
                          cwd=job_dir, env=env, capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    dirs = {"LOCAL_DIR": str(tmp_path / "local"), "PERSISTENT_DIR": str(tmp_path / "persistent")}
    check = subprocess.run(["supervise", "check", "--config", "tiny.toml", "--", *command],
                           cwd=job_dir, env=env | dirs, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "check: ready" in check.stderr, check.stdout + check.stderr

    job = slurm.submit(job_dir / "tiny.sbatch", "--cpus-per-task=2", cwd=job_dir, env=env)
    state = slurm.wait_gone(job, timeout=300)
    out = job_dir / f"tiny-{job}.out"
    assert state == "COMPLETED", f"{state}\n{out.read_text()[-4000:] if out.exists() else '(no output)'}"
    ckpt = tmp_path / "persistent" / "checkpoints"
    assert (ckpt / "latest").read_text() == f"step_{STEPS}"
    assert (ckpt / f"step_{STEPS}" / ".metadata").is_file()
    ev = journal.events(tmp_path / "persistent" / f"supervise-{job}")
    start = next(e for e in ev if e["kind"] == "start")
    assert start["launcher"] == "torchrun", start
    assert [(e["reason"], e["exit_status"]) for e in ev if e["kind"] == "end"] == [("child-exit", 0)]
    # the supervise that ran is the wheel's: the job script activates the venv init ran from
    assert f"VENV=${{VENV:-{venv_bin.parent}}}" in (job_dir / "tiny.sbatch").read_text()
