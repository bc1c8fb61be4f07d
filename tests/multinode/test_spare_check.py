"""``supervise check`` for a job with spare nodes (issue 41), no cluster: what the attempt trains
on, which node is spare, what the scheduler does when a node fails, the launcher's command as it
will run; and a spare count the allocation cannot hold refused with one line, exit 2."""

from __future__ import annotations

from pathlib import Path

from tests.support.supervise import run_supervise

SLURM = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-3]", "SLURMD_NODENAME": "n1", "SLURM_NTASKS": "3",
         "SLURM_JOB_NUM_NODES": "3"}
COMMAND = ["--", "srun", "--ntasks-per-node=1", "torchrun", "--nnodes=2", "train.py"]


def test_check_says_the_nodes_the_spare_and_the_command(tmp_path: Path) -> None:
    r = run_supervise("check", "--run-dir", str(tmp_path / "run"), "--spare-nodes", "1", "--max-node-replacements",
                      "1", *COMMAND, env=SLURM)
    assert r.returncode == 0, r.stderr + r.stdout
    line = next(x for x in r.stdout.splitlines() if "spares" in x)
    assert "trains on n1, n2; spare n3" in line and "1 time(s) at most" in line, line
    assert "#SBATCH --no-kill" in line, line
    assert "srun --nodes=2 --nodelist=n1,n2 --overlap --ntasks-per-node=1 torchrun" in line, line


def test_a_spare_count_the_allocation_cannot_hold_is_refused(tmp_path: Path) -> None:
    r = run_supervise("check", "--run-dir", str(tmp_path / "run"), "--spare-nodes", "3", *COMMAND, env=SLURM)
    assert r.returncode == 2, r.stderr + r.stdout
    fail = [x for x in r.stdout.splitlines() if x.startswith("FAIL")]
    assert len(fail) == 1 and "spare_nodes = 3: the job has 3 node(s) (n1,n2,n3)" in fail[0], r.stdout
    assert not (tmp_path / "run").exists()
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--spare-nodes", "3", *COMMAND, env=SLURM)
    said = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(said) == 1 and "at least one must be left to train on" in said[0], said
    assert not (tmp_path / "run").exists()  # the run itself: nothing started, nothing made
