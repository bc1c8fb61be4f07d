"""The scheduler's variables, as the package answers them to the rest of the house (issue 46):
which job a process belongs to, the node-local directories, the GPUs granted, what a journaled
environment says, and which schedulers a check is in. Each table is the answer the module read
itself before it asked ``supervisor.sched``."""

from __future__ import annotations

import pytest

from supervisor.sched import (
    ENV_PREFIXES, JOB_VARIABLES, SCHEDULERS, JobKey, Recorded, job_key, local_dirs, present, recorded, restart_count,
    visible_gpus,
)


def test_the_journal_keeps_every_schedulers_variables_and_a_process_is_told_by_each_ones_job_id() -> None:
    assert ENV_PREFIXES == ("SLURM_", "PBS_")
    assert JOB_VARIABLES == ("SLURM_JOB_ID", "PBS_JOBID")


@pytest.mark.parametrize("env, key", [
    ({}, None),
    ({"SLURM_STEP_ID": "3"}, None),
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": " 3 "}, JobKey("SLURM_JOB_ID", "7", "SLURM_STEP_ID", "3")),
    ({"SLURM_JOB_ID": "7"}, JobKey("SLURM_JOB_ID", "7", "SLURM_STEP_ID", None)),
    ({"SLURM_JOBID": "7", "PBS_JOBID": "9.head"}, JobKey("PBS_JOBID", "9.head")),  # only SLURM_JOB_ID names the job
    ({"SLURM_JOB_ID": "7", "PBS_JOBID": "9.head"}, JobKey("SLURM_JOB_ID", "7", "SLURM_STEP_ID", None)),  # Slurm first
])
def test_job_key(env: dict[str, str], key: JobKey | None) -> None:
    assert job_key(env) == key


@pytest.mark.parametrize("env, count", [
    ({}, 0),
    ({"SLURM_RESTART_COUNT": "2"}, 2),  # read whichever scheduler detection picks, as the journal did
    ({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"}, 0),
    ({"SLURM_RESTART_COUNT": " 3"}, 0),  # not a count
    ({"PBS_JOBID": "9.head"}, 0),        # PBS counts reruns in qstat only
])
def test_restart_count(env: dict[str, str], count: int) -> None:
    assert restart_count(env) == count


def test_local_dirs_are_every_schedulers_and_the_sites() -> None:
    env = {"TMPDIR": "/tmp/j", "SLURM_TMPDIR": "/l/s", "LOCAL_SCRATCH": "/l/x", "PBS_JOBFS": "/jobfs/9", "HOME": "/h"}
    assert sorted(local_dirs(env)) == ["/jobfs/9", "/l/s", "/l/x", "/tmp/j"]
    assert local_dirs({"TMPDIR": "", "PBS_JOBFS": "/jobfs/9"}) == ["/jobfs/9"]
    assert local_dirs({}) == []


@pytest.mark.parametrize("env, got", [
    ({}, None),
    ({"CUDA_VISIBLE_DEVICES": ""}, ("CUDA_VISIBLE_DEVICES", "")),  # set and empty: no GPU at all
    ({"CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "2"}, ("CUDA_VISIBLE_DEVICES", "1")),
    ({"SLURM_STEP_GPUS": " ", "SLURM_JOB_GPUS": "0,1"}, ("SLURM_JOB_GPUS", "0,1")),  # an empty grant says nothing
    ({"SLURM_STEP_GPUS": "2", "SLURM_JOB_GPUS": "0,1,2"}, ("SLURM_STEP_GPUS", "2")),  # the step's first
])
def test_visible_gpus(env: dict[str, str], got: tuple[str, str] | None) -> None:
    assert visible_gpus(env) == got


@pytest.mark.parametrize("env, nodes, got", [
    ({}, None, Recorded()),
    ({"SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_NUM_NODES": "2"}, None, Recorded(gpus=8)),
    ({"SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_NUM_NODES": "2"}, 3, Recorded(gpus=12)),  # the start's node count wins
    ({"SLURM_GPUS_ON_NODE": "0", "SLURM_GPUS": "6", "SLURM_JOB_NUM_NODES": "2"}, None, Recorded(gpus=6)),
    ({"PBS_NGPUS": "4"}, 2, Recorded(gpus=4)),  # a job total
    ({"SLURM_GPUS": "x", "PBS_NGPUS": "4"}, None, Recorded(gpus=4)),
    ({"SLURM_JOB_START_TIME": "1700000000", "SLURM_MEM_PER_NODE": "4096", "SLURMD_NODENAME": "gpu7"}, None,
     Recorded(start=1700000000.0, mem_per_node_mib=4096.0, node="gpu7")),
    ({"SLURM_JOB_START_TIME": "soon", "SLURM_MEM_PER_NODE": "4G", "SLURMD_NODENAME": ""}, None, Recorded()),
])
def test_recorded(env: dict[str, str], nodes: object, got: Recorded) -> None:
    assert recorded(env, nodes) == got


def test_a_check_about_the_session_finds_pbs_where_its_job_id_is_even_beside_slurms() -> None:
    assert [s.name for s in present({"SLURM_JOB_ID": "7", "PBS_JOBID": "9.head"})] == ["slurm", "pbs"]
    assert present({}) == ()
    assert [s.name for s in SCHEDULERS.values() if s.signals_session] == ["pbs"]
