"""`supervise init` where the templates' defaults do not hold (issue 42): a PBS site that is not
ALCF's, a command that says how many GPUs per node it uses, a job of several nodes, an
``mpiexec`` that is OpenMPI or MPICH; and `supervise check` on a multi-node job whose checkpoint
pair mirrors one node. Through the real command."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.supervise import run_supervise


def init(tmp: Path, *args: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    r = run_supervise("init", "--dir", str(tmp), *args, "--", *command, cwd=tmp, env=env)
    assert r.returncode == 0, r.stderr
    return r


# ---------------------------------------------------------------------------- a PBS site that is not ALCF

def test_pbs_away_from_alcf_writes_generic_defaults_and_names_the_lines_to_edit(tmp_path: Path) -> None:
    r = init(tmp_path, "--scheduler", "pbs", "--nodes", "2", command=["torchrun", "--nproc-per-node", "2", "train.py"])
    script, config = (tmp_path / "train.pbs").read_text(), (tmp_path / "train.toml").read_text()
    for polaris in ("/lus/eagle", "/lus/flare", "/local/scratch", "system=polaris", "filesystems", "#PBS -q"):
        assert polaris not in script and polaris not in config, polaris
    assert "from pbs.toml" in r.stdout and "not an ALCF machine" in r.stdout and "EDIT" in r.stdout, r.stdout
    edit = [ln for ln in script.splitlines() if "# EDIT" in ln]
    assert [ln.split("=")[0] for ln in edit[1:]] == ["NODE_LOCAL", "PERSISTENT_BASE"], edit
    assert re.search(r"^#PBS -l select=2:ngpus=2$", script, re.M), script
    assert subprocess.run(["bash", "-n", str(tmp_path / "train.pbs")]).returncode == 0
    # Run in a (stand-in) PBS job up to its exec: the generic directories are made, not refused under set -e.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "supervise").write_text("#!/bin/sh\necho \"SUPERVISE $*\"\n")
    (bindir / "supervise").chmod(0o755)
    (tmp_path / "nodes").write_text("n1\nn2\n")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path), "USER": "tester", "PBS_JOBID": "77.server",
           "PBS_JOBNAME": "train", "PBS_O_WORKDIR": str(tmp_path), "PBS_NODEFILE": str(tmp_path / "nodes"),
           "TMPDIR": str(tmp_path / "tmp"), "VENV": str(tmp_path / "no-venv")}
    ran = subprocess.run(["bash", str(tmp_path / "train.pbs")], env=env, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert ran.returncode == 0 and "SUPERVISE --config" in ran.stdout, ran.stderr
    assert (tmp_path / "tmp" / "tester" / "77").is_dir() and (tmp_path / "runs" / "train").is_dir()


@pytest.mark.parametrize(("env", "host", "dirs", "expected"), [
    ({}, "x3001c0s1b0n0", set(), "polaris"),
    ({}, "polaris-login-01", set(), "polaris"),
    ({}, "x4102c5s0b0n0", set(), "aurora"),
    ({}, "aurora-uan-0010", set(), "aurora"),
    ({}, "login1.cluster.example.edu", set(), None),
    ({}, "login1", {"/lus/eagle"}, "polaris"),
    ({"MACHINE": "pbs"}, "x3001c0s1b0n0", set(), None),
    ({"MACHINE": "aurora"}, "login1", set(), "aurora"),
])
def test_which_alcf_machine_init_runs_on(env: dict[str, str], host: str, dirs: set[str], expected: str | None) -> None:
    from supervisor.init import alcf_machine

    assert alcf_machine(env, host, exists=lambda p: p in dirs) == expected


@pytest.mark.parametrize("machine", ["polaris", "aurora"])
def test_pbs_at_alcf_keeps_the_machines_paths_and_preset(tmp_path: Path, machine: str) -> None:
    r = init(tmp_path, "--scheduler", "pbs", command=["mpiexec", "-n", "8", "python", "train.py"], env={"MACHINE": machine})
    script = (tmp_path / "train.pbs").read_text()
    assert f"from {machine}.toml" in r.stdout and "not an ALCF machine" not in r.stdout
    assert "/lus/eagle" in script and "/lus/flare" in script and "#PBS -l select=2:system=polaris" in script


# ---------------------------------------------------------------------------- GPUs per node from the command

@pytest.mark.parametrize(("command", "gpus"), [
    (["torchrun", "--standalone", "--nproc-per-node", "2", "train.py", "-n", "5"], 2),
    (["torchrun", "--nproc_per_node=3", "train.py"], 3),
    (["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py"], 2),
    (["mpiexec", "--ppn", "2", "-n", "4", "python", "train.py"], 2),
    (["mpiexec", "-n", "8", "python", "train.py"], 4),  # over --nodes 2
    (["deepspeed", "--num_gpus", "1", "train.py"], 1),
])
def test_gpus_per_node_follow_the_command(tmp_path: Path, command: list[str], gpus: int) -> None:
    r = init(tmp_path, "--scheduler", "slurm", "--nodes", "2", command=command, env={"PATH": "/usr/bin:/bin"})
    script = (tmp_path / "train.sbatch").read_text()
    assert re.search(rf"^#SBATCH --gpus-per-node={gpus}\b", script, re.M), script
    assert f"GPUs per node {gpus}" in r.stdout
    # --gpus still wins
    init(tmp_path, "--scheduler", "slurm", "--force", "--gpus", "8", command=command, env={"PATH": "/usr/bin:/bin"})
    assert re.search(r"^#SBATCH --gpus-per-node=8\b", (tmp_path / "train.sbatch").read_text(), re.M)


# ---------------------------------------------------------------------------- several nodes

def test_several_nodes_get_a_per_node_checkpoint_pair_that_check_accepts(tmp_path: Path) -> None:
    init(tmp_path, "--scheduler", "slurm", "--nodes", "2", command=["torchrun", "--nproc-per-node", "2", "train.py"])
    config = (tmp_path / "train.toml").read_text()
    checkpoint, log = re.split(r"^\[\[sync\]\]$", config, flags=re.M)[1:3]
    assert 'kind = "checkpoint"' in checkpoint and re.search(r'^nodes = "auto"', checkpoint, re.M), config
    assert "nodes =" not in log, "a log pair is the leader's"
    job = {"LOCAL_DIR": str(tmp_path / "local"), "PERSISTENT_DIR": str(tmp_path / "persistent"), "SLURM_JOB_ID": "7",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2"}
    ok = run_supervise("check", "--config", str(tmp_path / "train.toml"), "--", "true", env=job, cwd=tmp_path)
    assert "mirrors one node's local disk" not in ok.stdout, ok.stdout
    init(tmp_path, "--scheduler", "slurm", "--force", "--nodes", "1", command=["python", "train.py"])
    assert "nodes =" not in (tmp_path / "train.toml").read_text()


@pytest.mark.parametrize(("flags", "env", "why"), [
    ([], {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2"},
     "the job has 2 nodes"),
    (["--", "torchrun", "--nnodes", "2", "--nproc-per-node", "2", "train.py"], {}, "the command asks for 2 nodes"),
])
def test_check_warns_about_a_single_node_pair_in_a_multi_node_job(tmp_path: Path, flags: list[str],
                                                                    env: dict[str, str], why: str) -> None:
    args = ["check", "--checkpoints", str(tmp_path / "local"), str(tmp_path / "persistent"), *(flags or ["--", "true"])]
    r = run_supervise(*args, env=env, cwd=tmp_path)
    warned = [ln for ln in r.stdout.splitlines() if "mirrors one node's local disk" in ln]
    assert len(warned) == 1 and warned[0].startswith("warn") and why in warned[0] and 'nodes = "auto"' in warned[0], r.stdout
    r = run_supervise(*args[:1], "--nodes", "2", *args[1:], env=env, cwd=tmp_path)
    assert "mirrors one node's local disk" not in r.stdout, r.stdout


# ---------------------------------------------------------------------------- the mpiexec installed here

OPENMPI = "#!/bin/sh\necho 'mpiexec (Open MPI) 4.1.4'\n"
MPICH = "#!/bin/sh\necho 'HYDRA build details:'\necho '    Version:                                 4.0.2'\n"


@pytest.mark.parametrize(("stand_in", "given", "written"), [
    (OPENMPI, ["--ppn", "2"], ["--map-by", "ppr:2:node"]),
    (MPICH, ["--map-by", "ppr:2:node"], ["--ppn", "2"]),
    (MPICH, ["-npernode", "2"], ["--ppn", "2"]),
    (OPENMPI, ["--map-by", "ppr:2:node"], ["--map-by", "ppr:2:node"]),
    (MPICH, ["--ppn", "2"], ["--ppn", "2"]),
])
def test_ranks_per_node_in_the_form_the_installed_mpiexec_takes(tmp_path: Path, stand_in: str, given: list[str],
                                                                written: list[str]) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "mpiexec").write_text(stand_in)
    (bindir / "mpiexec").chmod(0o755)
    r = init(tmp_path, "--scheduler", "pbs", "--nodes", "2", command=["mpiexec", *given, "-n", "4", "python", "train.py"],
             env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    script = (tmp_path / "train.pbs").read_text()
    assert script.rstrip().endswith(f"    mpiexec {' '.join(written)} -n 4 python train.py"), script[-300:]
    assert ("takes other flags" in r.stdout) == (given != written), r.stdout


