"""Multi-node PBS jobs as the tests submit them (tests/pbs/test_nodes.py, test_spare.py): OpenMPI's
``mpirun --hostfile $PBS_NODEFILE`` over ``pbs_tmrsh``, each rank a small torch training through
``ompi_rank.py``; and how the tests read the leader's journal by attempt."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.pbs import PbsCluster

HERE = ROOT / "tests" / "pbs"  # ompi_rank.py and tmrsh
MPIRUN = ("mpirun --mca plm_rsh_agent {tmrsh} --hostfile $PBS_NODEFILE -np 2 --map-by node "
          "--mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "
          "-x PATH -x PYTHONPATH -x MASTER_ADDR -x MASTER_PORT -x OMP_NUM_THREADS -x EPOCH_SLEEP "
          "{python} {rank} --log {logs}")
JOB = """#!/bin/bash
#PBS -l select=2:ncpus=1
#PBS -l place=scatter
#PBS -l walltime=00:01:00
#PBS -j oe
#PBS -o {work}/job.out
cd {work}
export PYTHONPATH={repo} OMP_NUM_THREADS=1 EPOCH_SLEEP=0.4
export MASTER_ADDR=$(head -1 $PBS_NODEFILE) MASTER_PORT=29{port}
echo "run on $(sort -u $PBS_NODEFILE | paste -sd' ')" >> {work}/runs.txt
exec {python} -m supervisor --config {work}/run.toml --run-dir {work}/run -- {mpirun}
"""


def number(evs: list[dict], nth: int) -> int | None:
    """The attempt number of the leader's ``nth`` start (1: its first). Not ``nth`` itself: under
    PBS an attempt is numbered by the job's run_count, which also counts starts that never
    reached the script (measured: attempt 5 for the second run of the script, under load)."""
    starts = [e["attempt"] for e in evs if e.get("kind") == "start"]
    return starts[nth - 1] if len(starts) >= nth else None


def kinds(evs: list[dict], kind: str, nth: int | None = None) -> list[dict]:
    """The events of one kind; with ``nth``, of the leader's ``nth`` attempt only."""
    want = None if nth is None else number(evs, nth)
    return [e for e in evs if e.get("kind") == kind and (nth is None or (want is not None and e.get("attempt") == want))]


def pbs_torch() -> None:
    pytest.importorskip("torch")
    if shutil.which("mpirun") is None:
        pytest.skip("OpenMPI's mpirun is needed for the multi-node PBS tests")


def setup_job(pbs: PbsCluster, name: str, sync_to: str, train: str, port: int, extra: str = "") -> tuple[Path, Path]:
    work = pbs.workdir(name)
    local = pbs.root / "local" / work.name  # node-local on every node (ROOT/nodes/nK/local)
    logs = work / "logs"
    logs.mkdir()
    (work / "run.toml").write_text(f'{extra}\n[[sync]]\nname = "ckpt"\nfrom = "{local}/ckpt"\nto = "{work}/{sync_to}"\n'
                                   'nodes = "auto"\nsettle = "1s"\nrestore = true\n')
    mpirun = MPIRUN.format(tmrsh=HERE / "tmrsh", python=sys.executable, rank=HERE / "ompi_rank.py", logs=logs)
    script = JOB.format(work=work, repo=ROOT, python=sys.executable, port=port, mpirun=f"{mpirun} {train.format(local=local, work=work)}")
    (work / "job.pbs").write_text(script)
    pbs.own(work)
    return work, local
