"""`supervise init`: the job script and config it writes, driven through the real command.

What the written script does under a real Slurm is tests/slurm/test_init_wheel.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.supervise import run_supervise

TORCHRUN = ["torchrun", "--standalone", "--nproc-per-node", "2", "train.py", "--lr", "3e-4"]


def init(tmp: Path, *args: str, command: list[str] = TORCHRUN, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run_supervise("init", "--dir", str(tmp), *args, "--", *command, cwd=tmp, env=env)


def test_slurm_torchrun_script_keeps_the_signal_and_requeue_lines_and_runs_the_command(tmp_path: Path) -> None:
    r = init(tmp_path, "--scheduler", "slurm", "--nodes", "2", "--gpus", "8", "--time", "4:00:00",
             "--local", "/tmp/$USER/$SLURM_JOB_ID", "--persistent", "/scratch/me/run1", "--name", "run1")
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "run1.sbatch").read_text()
    assert "launcher torchrun" in r.stdout and "slurm-torchrun.sbatch" in r.stdout
    assert subprocess.run(["bash", "-n", str(tmp_path / "run1.sbatch")]).returncode == 0
    for line in ("#SBATCH --job-name=run1", "#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --time=4:00:00", "#SBATCH --signal=B:USR2@600", "#SBATCH --requeue",
                 "#SBATCH --open-mode=append",
                 "export LOCAL_DIR=${LOCAL_DIR:-/tmp/$USER/$SLURM_JOB_ID}",
                 "export PERSISTENT_DIR=${PERSISTENT_DIR:-/scratch/me/run1}",
                 f"CONFIG=${{CONFIG:-{tmp_path / 'run1.toml'}}}"):
        assert re.search(rf"^{re.escape(line)}(\s|$)", script, re.M), line
    assert script.rstrip().endswith("    torchrun --standalone --nproc-per-node 2 train.py --lr 3e-4")
    assert 'exec supervise --config "$CONFIG"' in script
    # the template's example (examples/ddp_train.py and its STEPS, NPROC) is gone
    for gone in ("STEPS", "NPROC", "ddp_train", "examples/", "REPO="):
        assert gone not in script, gone
    config = (tmp_path / "run1.toml").read_text()
    assert 'warn_signal = "USR2"' in config and "requeue = true" in config
    assert (tmp_path / "run1.sbatch").stat().st_mode & 0o111


def test_check_accepts_what_init_wrote_and_names_an_unset_directory_variable(tmp_path: Path) -> None:
    assert init(tmp_path, "--scheduler", "slurm").returncode == 0
    cfg = str(tmp_path / "train.toml")
    unset = run_supervise("check", "--config", cfg, "--", "true", cwd=tmp_path)
    assert unset.returncode == 2
    assert "$LOCAL_DIR is not set" in unset.stderr and len(unset.stderr.strip().splitlines()) == 1
    dirs = {"LOCAL_DIR": str(tmp_path / "local"), "PERSISTENT_DIR": str(tmp_path / "persistent")}
    ok = run_supervise("check", "--config", cfg, "--", "true", env=dirs, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # every pair, with its resolved paths
    assert f"checkpoint {tmp_path}/local/checkpoints -> {tmp_path}/persistent/checkpoints" in ok.stdout
    assert f"log {tmp_path}/local/logs -> {tmp_path}/persistent/logs" in ok.stdout
    assert "checkpoints: checkpoint" in ok.stdout and ", profile " in ok.stdout
    assert "backend rsync (sync_backend = auto)" in ok.stdout or "backend python" in ok.stdout


def test_srun_command_gets_one_task_per_gpu(tmp_path: Path) -> None:
    r = init(tmp_path, "--scheduler", "slurm", "--gpus", "4", command=["srun", "python", "train.py"])
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "train.sbatch").read_text()
    assert "from slurm-srun.sbatch" in script
    assert re.search(r"^#SBATCH --ntasks-per-node=4\b", script, re.M)
    assert "MASTER_ADDR" in script  # the rendezvous lines of the template stay
    assert script.rstrip().endswith("    srun python train.py")


def test_zero_gpus_drops_the_gpu_request(tmp_path: Path) -> None:
    assert init(tmp_path, "--scheduler", "slurm", "--gpus", "0").returncode == 0
    assert "--gpus-per-node" not in (tmp_path / "train.sbatch").read_text()


def test_pbs_script_has_walltime_select_and_rerunnable(tmp_path: Path) -> None:
    r = init(tmp_path, "--scheduler", "pbs", "--nodes", "4", "--time", "02:00:00",
             command=["mpiexec", "-n", "16", "python", "train.py"], env={"MACHINE": "polaris"})  # at ALCF
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "train.pbs").read_text()
    assert subprocess.run(["bash", "-n", str(tmp_path / "train.pbs")]).returncode == 0
    for line in ("#PBS -N train", "#PBS -l select=4:system=polaris", "#PBS -l walltime=02:00:00", "#PBS -r y"):
        assert line in script, line
    assert "\n#PBS -W" not in script and "supervise reads the walltime end" in script  # no warning signal in PBS
    assert script.rstrip().endswith("    mpiexec -n 16 python train.py")


@pytest.mark.parametrize(("args", "words"), [
    (["--scheduler", "slurm", "--"], ["needs the training command after --"]),
    (["--scheduler", "lsf", "--", "python", "t.py"], ["--scheduler", "lsf"]),
    (["--scheduler", "slurm", "--name", "a/b", "--", "python", "t.py"], ["--name", "a/b"]),
    (["--scheduler", "slurm", "--nodes", "0", "--", "python", "t.py"], ["--nodes 0"]),
    (["--scheduler", "slurm", "--launcher", "torchrn", "--", "python", "t.py"], ["--launcher 'torchrn'", "torchrun"]),
])
def test_bad_init_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], words: list[str]) -> None:
    r = run_supervise("init", "--dir", str(tmp_path), *args, cwd=tmp_path)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words:
        assert w in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_existing_files_are_kept_unless_forced(tmp_path: Path) -> None:
    assert init(tmp_path, "--scheduler", "slurm").returncode == 0
    (tmp_path / "train.toml").write_text("# mine\n")
    again = init(tmp_path, "--scheduler", "slurm")
    assert again.returncode == 2 and "--force" in again.stderr
    assert (tmp_path / "train.toml").read_text() == "# mine\n"
    assert init(tmp_path, "--scheduler", "slurm", "--force").returncode == 0
    assert (tmp_path / "train.toml").read_text() != "# mine\n"


def test_scheduler_is_detected_from_the_job(tmp_path: Path) -> None:
    (tmp_path / "nodes").write_text("x3001\nx3002\n")
    r = run_supervise(
        "init", "--dir", str(tmp_path), "--", "python", "train.py",
        env={"PBS_JOBID": "123.pbs01", "PBS_NODEFILE": str(tmp_path / "nodes")}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "train.pbs").is_file()
    assert re.search(r"^#PBS -l select=2\b", (tmp_path / "train.pbs").read_text(), re.M)  # the job's node count
