"""``supervise init --spare-nodes K`` (issue 41): the job asks for K nodes more than the training
uses, keeps itself when a node fails (Slurm ``--no-kill``, PBS ``tolerate_node_failures``), and
the config says ``spare_nodes``; what it wrote passes ``supervise check`` in a job of that size,
which then names the spare."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.support.supervise import run_supervise

TRAIN = ["srun", "--ntasks-per-node=1", "torchrun", "--nnodes=2", "--nproc-per-node=4", "train.py"]


def test_slurm_spares_are_asked_for_kept_and_checked(tmp_path: Path) -> None:
    r = run_supervise("init", "--scheduler", "slurm", "--dir", str(tmp_path), "--nodes", "2", "--spare-nodes", "1",
                      "--", *TRAIN, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    script, config = (tmp_path / "train.sbatch").read_text(), (tmp_path / "train.toml").read_text()
    assert re.search(r"^#SBATCH --nodes=3\b", script, re.M) and re.search(r"^#SBATCH --no-kill\b", script, re.M), script
    assert re.search(r"^spare_nodes = 1\b", config, re.M) and 'nodes = "auto"' in config, config
    assert "the job asks for 3 nodes, the training runs on 2" in r.stdout, r.stdout
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURMD_NODENAME": "n1", "SLURM_NTASKS": "3",
           "LOCAL_DIR": str(tmp_path / "local"), "PERSISTENT_DIR": str(tmp_path / "persist")}
    r = run_supervise("check", "--config", str(tmp_path / "train.toml"), "--run-dir", str(tmp_path / "run"), "--", *TRAIN,
                      env=env)
    line = next((x for x in r.stdout.splitlines() if " spares " in x), "")
    assert "trains on n1, n2; spare n3" in line and "--nodelist=n1,n2" in line, r.stdout + r.stderr


def test_pbs_spares_keep_the_job_and_hand_qsub_a_clean_word(tmp_path: Path) -> None:
    r = run_supervise("init", "--scheduler", "pbs", "--dir", str(tmp_path), "--nodes", "2", "--spare-nodes", "2", "--",
                      "mpiexec", "-n", "8", "--ppn", "4", "python", "train.py")
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "train.pbs").read_text()
    assert re.search(r"^#PBS -l select=4\b", script, re.M), script
    assert "#PBS -W tolerate_node_failures=all\n" in script, script  # the line alone: the script hands it to qsub
    assert re.search(r"^spare_nodes = 2\b", (tmp_path / "train.toml").read_text(), re.M)


def test_a_negative_spare_count_is_one_line(tmp_path: Path) -> None:
    r = run_supervise("init", "--scheduler", "slurm", "--dir", str(tmp_path), "--spare-nodes", "-1", "--", "python", "t.py")
    assert r.returncode == 2 and "--spare-nodes -1: must be 0 or more" in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())
