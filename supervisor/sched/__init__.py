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
    SCHEDULERS, AgentLaunch, Agents, Job, Refined, Scheduler, ScriptChoices, count_devices, gpu_count,
)
from supervisor.sched._tool import Report
from supervisor.sched.local import Local
from supervisor.sched.pbs import Pbs
from supervisor.sched.slurm import Slurm

__all__ = ["AgentLaunch", "Agents", "BATCH", "GONE_STATES", "Job", "RANK_VARIABLES", "Refined", "Report",
           "SCHEDULERS", "Scheduler", "ScriptChoices", "count_devices", "detect_job", "expand_hostlist",
           "expand_tasks_per_node", "for_submit", "gpu_count", "label_of", "node_rank", "run_dir_id"]

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


def detect_job(env: Mapping[str, str] | None = None) -> Job:
    """The job we run in, from the environment only."""
    env = os.environ if env is None else env
    job = next(s for s in DETECTION if s.active(env)).job(env)
    given = env.get(childenv.JOB_NODES, "")
    if given:  # a node agent of a job with spares: the leader says which nodes this attempt uses
        job = replace(job, allocation=job.nodes, nodes=tuple(given.split(",")))
    return job


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
    here = env.get("SLURMD_NODENAME") or os.uname().nodename
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
