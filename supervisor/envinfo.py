"""``supervise env``: what the supervisor sees of the job it runs in, and how to launch in it.

Answers the questions a researcher asks at the top of a job script (which scheduler, which
attempt, how many nodes and GPUs, how long is left, what launch line fits) in one place, the
way ezpz's ``ezpz_setup_job`` does, so the answer can be pasted or checked before a long run.
Pure: reads the environment (and the PBS nodefile it names); the caller may pass an end time
it already fetched, since asking the scheduler is the slow part.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import subprocess
import time
from typing import Any, Mapping, Sequence

from supervisor.sched import Job, detect_job
from supervisor.sched import pbs_gpus_per_node


def _launcher_name(argv: Sequence[str]) -> str | None:
    """The launcher supervise would pick for argv; 'unknown' when it cannot be told."""
    if not argv:
        return None
    try:  # written in parallel by another room; absent or failing → 'unknown'
        from supervisor import launchers

        return str(launchers.detect(list(argv)).name)
    except Exception:  # noqa: BLE001 - `env` is a diagnostic; it must always answer
        return "unknown"


def world_layout(job: Job) -> tuple[int, int]:
    """(world size, ranks per node) for a one-rank-per-GPU launch.

    GPUs per node when known (the usual layout for training), else the scheduler's task
    counts, else one rank per node.
    """
    nnodes = max(1, job.num_nodes)
    if job.gpus_per_node:
        return nnodes * job.gpus_per_node, job.gpus_per_node
    if job.tasks_per_node:
        return nnodes * job.tasks_per_node, job.tasks_per_node
    if job.ntasks:
        return job.ntasks, max(1, job.ntasks // nnodes)
    return nnodes, 1


MPI_FLAVORS = ("openmpi", "mpich")  # mpich: Cray PALS (Polaris, Aurora), MPICH Hydra, Intel MPI: all take --ppn


def mpi_flavor(version_text: str) -> str:
    """The family of an ``mpiexec`` from what ``mpiexec --version`` printed: ``openmpi``
    ("mpiexec (OpenRTE) 4.1.4", "mpiexec (Open MPI) 5.0.3") or ``mpich`` (everything else)."""
    return "openmpi" if re.search(r"Open ?MPI|OpenRTE|open-mpi\.org", version_text, re.I) else "mpich"


def detect_mpi(path: str | None = None) -> str | None:
    """The flavor of the ``mpiexec`` on PATH (or ``path``); None when there is none or it does not answer."""
    exe = path or shutil.which("mpiexec")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout + out.stderr
    return mpi_flavor(text) if text.strip() else None


def launch_command(job: Job, mpi: str | None = None) -> list[str] | None:
    """A launch line that uses the whole allocation (ezpz's ``ezpz_setup_job``); argv form,
    the scheduler's (``Scheduler.launch_line``: srun, mpiexec over the PBS nodefile, or
    torchrun on this machine). ``mpi`` is the installed ``mpiexec``'s family (:func:`detect_mpi`),
    which an mpiexec line depends on."""
    world, ppn = world_layout(job)
    return job.sched.launch_line(job, world, ppn, mpi)


def gather(
    env: Mapping[str, str],
    argv: Sequence[str] = (),
    *,
    end_time: float | None = None,
    qstat: Mapping[str, str] | None = None,
    now: float | None = None,
    mpi: str | None = None,
) -> dict[str, Any]:
    """Everything ``supervise env`` prints, as a JSON-ready dict.

    ``end_time``: unix seconds the caller already fetched (``job.end_time``); without it
    only the environment's own end time is used (Slurm's: ``Job.env_end_time``). ``qstat``: the
    job's ``qstat -f`` attributes, for PBS GPUs per node (``Resource_List.select`` … ``ngpus=N``). ``mpi``: the installed
    ``mpiexec``'s family (``detect_mpi()``), which decides the PBS launch line.
    """
    job = detect_job(env)
    if job.gpus_per_node is None and qstat:
        job = dataclasses.replace(job, gpus_per_node=pbs_gpus_per_node(qstat))
    now = time.time() if now is None else now
    end = end_time if end_time is not None else job.env_end_time
    world, ppn = world_layout(job)
    launch = launch_command(job, mpi)
    return {
        "scheduler": job.scheduler,
        "job_id": job.job_id,
        "job_name": job.job_name,
        "attempt": job.restart_count + 1,
        "restart_count": job.restart_count,
        "end_time": end,
        "end_time_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(end)) if end is not None else None,
        "seconds_left": max(0.0, round(end - now, 1)) if end is not None else None,
        "nodes": list(job.nodes),
        "num_nodes": job.num_nodes,
        "gpus_per_node": job.gpus_per_node,
        "world_size": world,
        "ranks_per_node": ppn,
        "scheduler_ntasks": job.ntasks,
        "submit_dir": job.submit_dir,
        "nodefile": job.nodefile,
        "launcher": _launcher_name(argv),
        "command": list(argv),
        "mpi": mpi,
        "launch_command": launch,
        "launch_command_text": shlex.join(launch) if launch else None,
        "requeue_id": job.requeue_id,
    }


def _nodes_text(nodes: list[str], limit: int = 8) -> str:
    if len(nodes) <= limit:
        return " ".join(nodes) or "-"
    return " ".join(nodes[:limit]) + f" … (+{len(nodes) - limit})"


def render_text(info: Mapping[str, Any]) -> str:
    """The human form: one ``name: value`` line each, aligned."""
    def show(v: Any) -> str:
        return "-" if v is None or v == "" else str(v)

    left = info.get("seconds_left")
    end = show(info.get("end_time_iso"))
    if left is not None:
        end += f" ({int(left) // 3600}h{int(left) % 3600 // 60:02d}m left)"
    rows = [
        ("scheduler", show(info.get("scheduler"))),
        ("job", show(info.get("job_id")) + (f" ({info['job_name']})" if info.get("job_name") else "")),
        ("attempt", show(info.get("attempt"))),
        ("end time", end if info.get("end_time") is not None else "none known"),
        ("nodes", f"{info.get('num_nodes', 0)}: {_nodes_text(list(info.get('nodes') or []))}"),
        ("gpus per node", show(info.get("gpus_per_node"))),
        ("world size", f"{show(info.get('world_size'))} ({show(info.get('ranks_per_node'))} per node)"),
        ("launcher", show(info.get("launcher"))),
        ("launch with", show(info.get("launch_command_text"))
         + (f" ({info['mpi']} mpiexec)" if info.get("mpi") and (info.get("launch_command") or [""])[0] == "mpiexec" else "")),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in rows) + "\n"
