"""The scheduler we run in: Slurm, PBS or none ("local"), one class each.

In the shape of submitit's ``JobEnvironment``/``SlurmJobEnvironment``: each scheduler is one
class (``slurm.Slurm``, ``pbs.Pbs``, ``local.Local``) that owns its environment map, its end
time and kill wait, its requeue and node exclusion, its node state, how the node agents are
started on its nodes, its signal facts and its job script. ``detect_job(env)`` reads only the
environment (cheap, pure, testable with recorded environments) and returns a frozen ``Job``;
``job.sched`` is its scheduler, and every caller asks it rather than compare the job's
``scheduler`` name (tests/core/test_structure.py fails on such a comparison outside this
package). The facts that need the scheduler's own tools run argv lists through anyio with a
timeout and never raise into the caller: a scheduler that is slow, missing or answers nonsense
must not take the supervision down (docs/design.md, invariant 4), so failures come back as
``None`` / ``(False, why)`` and are said through ``report`` (default: the module's logger).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from typing import Mapping

from supervisor import childenv
from supervisor.errors import ConfigError
from supervisor.sched._hostlist import expand_hostlist, expand_tasks_per_node
from supervisor.sched._job import (
    SCHEDULERS, AgentLaunch, Agents, Environment, Job, JobKey, Recorded, Refined, Scheduler, ScriptChoices,
    count_devices, gpu_count,
)
from supervisor.sched._pbs_output import pbs_gpus_per_node
from supervisor.sched._tool import Report
from supervisor.sched.local import Local
from supervisor.sched.pbs import Pbs
from supervisor.sched.slurm import Slurm

__all__ = ["AgentLaunch", "Agents", "BATCH", "ENV_PREFIXES", "Environment", "GONE_STATES", "JOB_VARIABLES", "Job",
           "JobKey", "RANK_VARIABLES", "Recorded", "Refined", "Report", "SCHEDULERS", "SRUN_RANK_VARIABLES",
           "Scheduler", "ScriptChoices", "count_devices", "detect_job", "expand_hostlist", "expand_tasks_per_node",
           "for_submit", "gpu_count", "job_key", "label_of", "local_dirs", "node_rank", "pbs_gpus_per_node", "present",
           "recorded", "restart_count", "run_dir_id", "visible_gpus"]

# In the order they are trusted: Slurm first (a PBS-to-Slurm wrapper site exports both), then
# PBS; Local is always active.
DETECTION: tuple[Scheduler, ...] = (Slurm(), Pbs(), Local())
SCHEDULERS.update({s.name: s for s in DETECTION})
BATCH = tuple(s.name for s in DETECTION if s.is_batch)  # the schedulers `supervise init` writes scripts for
# Node states that mean a node is gone, every scheduler's (a node of the previous attempt in
# one of them is lost: conduct/fleet.py's node-lost).
GONE_STATES = tuple(dict.fromkeys(state for s in DETECTION for state in s.gone_states))
# Where a launcher tells a process its place, in the order they are trusted. With one task per
# node (srun --ntasks-per-node=1, mpiexec --ppn 1) a task's rank is its node's index.
RANK_VARIABLES = (childenv.NODE_RANK, "SLURM_NODEID", "PMIX_RANK", "PMI_RANK", "PALS_RANKID",
                  "OMPI_COMM_WORLD_RANK")
SRUN_RANK_VARIABLES = ("SLURM_PROCID",)  # a task's rank, as srun gives it (launchers.py: srun's profile)
# The variables the journal keeps of the job (the ``start`` event's ``scheduler_env``), and the
# variables that name a job in each of its processes, every scheduler's.
ENV_PREFIXES = tuple(p for s in DETECTION for p in s.env_prefixes)
JOB_VARIABLES = tuple(s.job_variable for s in DETECTION if s.job_variable)
# Where a site tells a job its node-local scratch, whatever the scheduler.
LOCAL_DIR_VARIABLES = ("TMPDIR", "LOCAL_SCRATCH")
CUDA_DEVICES = "CUDA_VISIBLE_DEVICES"


def detect_job(env: Mapping[str, str] | None = None) -> Job:
    """The job we run in, from the environment only."""
    env = os.environ if env is None else env
    job = next(s for s in DETECTION if s.active(env)).job(env)
    given = env.get(childenv.JOB_NODES, "")
    if given:  # a node agent of a job with spares: the leader says which nodes this attempt uses
        job = replace(job, allocation=job.nodes, nodes=tuple(given.split(",")))
    return job


def present(env: Mapping[str, str]) -> tuple[Scheduler, ...]:
    """Every batch scheduler whose job ``env`` is in, in the order they are trusted (a
    PBS-to-Slurm wrapper site exports both): what a check about one of them asks."""
    return tuple(s for s in DETECTION if s.is_batch and s.active(env))


def job_key(env: Mapping[str, str]) -> JobKey | None:
    """What names the job ``env`` is in, in every process of it (with the step of ``env``'s
    process, where the scheduler has steps); None outside a job, where no process can be told
    to be the job's. Asked of every scheduler, in the order they are trusted."""
    for s in DETECTION:
        value = env.get(s.job_variable, "").strip() if s.job_variable else ""
        if s.job_variable and value:
            step = (env.get(s.step_variable, "").strip() or None) if s.step_variable else None
            return JobKey(s.job_variable, value, s.step_variable, step)
    return None


def restart_count(env: Mapping[str, str]) -> int:
    """The job's requeues before this run that ``env`` counts (Slurm's, unset on a first run),
    whichever scheduler detection picks; 0 where no variable counts them (PBS: its count is
    ``qstat``'s, ``restart_count_now``)."""
    counts = [env.get(s.restart_variable, "") for s in DETECTION if s.restart_variable]
    return max((int(c) for c in counts if c.isdigit()), default=0)


def local_dirs(env: Mapping[str, str]) -> list[str]:
    """The node-local directories ``env`` names (``TMPDIR``, a site's scratch, every scheduler's
    job scratch): a persistent side under one will not outlive the node (sync/_checks.py)."""
    names = (*LOCAL_DIR_VARIABLES, *(v for s in DETECTION for v in s.local_dir_variables))
    return [env[k] for k in names if env.get(k)]


def visible_gpus(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, device list) that says which GPUs the job may use: ``CUDA_VISIBLE_DEVICES``
    when set at all (empty: none), else the first non-empty list a scheduler grants; None when
    nothing constrains them (gpu/_select.py then takes every device)."""
    if CUDA_DEVICES in env:
        return CUDA_DEVICES, env[CUDA_DEVICES]
    return next(((v, env[v]) for s in DETECTION for v in s.gpu_variables if env.get(v, "").strip()), None)


def recorded(env: Mapping[str, str], nodes: object = None) -> Recorded:
    """What a journaled environment (``scheduler_env``) says of its job, each fact from the first
    scheduler, in the order they are trusted, that says it. ``nodes``: the job's node count, as
    the ``start`` event has it."""
    said = [s.recorded(env, nodes) for s in DETECTION]
    return Recorded(gpus=next((r.gpus for r in said if r.gpus is not None), None),
                    start=next((r.start for r in said if r.start is not None), None),
                    mem_per_node_mib=next((r.mem_per_node_mib for r in said if r.mem_per_node_mib is not None), None),
                    node=next((r.node for r in said if r.node is not None), None))


def run_dir_id(env: Mapping[str, str]) -> str | None:
    """The job id the default run directory is named by, stable across requeues (so attempts
    append); None outside a batch job (config.default_run_dir then makes one per run)."""
    return next((i for s in DETECTION if (i := s.run_dir_id(env))), None)


def for_submit(env: Mapping[str, str]) -> Scheduler | None:
    """The scheduler of the job we are in, else the one whose submit command is on PATH
    (``supervise init``); None when there is neither."""
    batch = [s for s in DETECTION if s.is_batch]
    return next((s for s in batch if s.active(env)), None) or next((s for s in batch if shutil.which(s.submit)), None)


def label_of(name: str) -> str:
    """How a person calls the scheduler a journal names (``Slurm``, ``PBS``); an unknown name as it is."""
    known = SCHEDULERS.get(name)
    return known.label if known is not None else name


def node_rank(given: str | None, env: Mapping[str, str]) -> int:
    """A node agent's index: ``--node-rank``, else the launcher's variables; ConfigError when nothing says."""
    source, raw = "--node-rank", given
    nodes = env.get(childenv.JOB_NODES, "").split(",")
    here = env.get(Slurm.node_variable) or os.uname().nodename
    if raw is None and not env.get(childenv.NODE_RANK) and here in nodes:
        # spares kept aside: the attempt's nodes in the leader's order, not the step's (issue 41)
        source, raw = f"environment {childenv.JOB_NODES}", str(nodes.index(here))
    if raw is None:
        for var in RANK_VARIABLES:
            if env.get(var, "").strip():
                source, raw = f"environment {var}", env[var].strip()
                break
    if raw is None:
        raise ConfigError("node_rank", None, "missing: give --node-rank K (or start the agent with "
                          "srun --ntasks-per-node=1 / mpiexec --ppn 1, which set it)")
    if not raw.isdigit():
        raise ConfigError("node_rank", raw, "expected a whole number, 0 or more", source)
    return int(raw)
