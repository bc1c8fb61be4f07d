"""Which processes on this node are the job's, for a node agent that is not their parent
(supervisor/jobprocs.py). Real processes started with crafted environments, real /proc.

The "agent" is a shell started the way srun starts a step's task: its parent is another
process of the job (in another step, as the step daemon would be an ancestor), and it has a
child in yet another step (as its copiers are its own). Neither may count as the training.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from supervisor import proctree
from supervisor.jobprocs import JobProcesses
from supervisor.sched import JobKey, job_key

BASE = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
# Job ids of this process alone: other tests beside it (xdist) start processes as job 4242 too,
# and the finder rightly counts every process of the machine that carries the id (CI: five extra).
JOB, OTHER = str(4_000_000 + os.getpid()), str(4_000_001 + os.getpid())
PBS_JOB, PBS_OTHER = f"{JOB}.pbs-server", f"{OTHER}.pbs-server"
SLURM_AGENT = {"SLURM_JOB_ID": JOB, "SLURM_STEP_ID": "1"}
PBS_AGENT = {"PBS_JOBID": PBS_JOB}

# (what it is, its environment, is it the job's as the agent sees it)
SLURM_ROWS = [
    ("a rank in the training's step", {"SLURM_JOB_ID": JOB, "SLURM_STEP_ID": "0"}, True),
    ("the batch step (no step id)", {"SLURM_JOB_ID": JOB}, True),
    ("a process of the agent's own step", {"SLURM_JOB_ID": JOB, "SLURM_STEP_ID": "1"}, False),
    ("another job's rank", {"SLURM_JOB_ID": OTHER, "SLURM_STEP_ID": "0"}, False),
    ("a job id that only starts like ours", {"SLURM_JOB_ID": f"{JOB}0", "SLURM_STEP_ID": "0"}, False),
    ("no scheduler variables", {}, False),
    ("PBS_JOBID with our number (Slurm's job: SLURM_JOB_ID decides)", {"PBS_JOBID": JOB}, False),
]
PBS_ROWS = [
    ("a rank of the job", {"PBS_JOBID": PBS_JOB}, True),
    ("a rank of the job that carries a Slurm step id", {"PBS_JOBID": PBS_JOB, "SLURM_STEP_ID": "1"}, True),
    ("another job's rank", {"PBS_JOBID": PBS_OTHER}, False),
    ("no scheduler variables", {}, False),
]


def _sleep(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], env={**BASE, **env}, stdin=subprocess.DEVNULL)


def _agent(env: dict[str, str], parent_env: dict[str, str], child_env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """A parent (``parent_env``) whose child is the agent (``env``), itself the parent of a
    process in ``child_env``'s step. Returns the parent and the agent's pid."""
    inner = " ".join(f"{k}={v}" for k, v in child_env.items())
    outer = " ".join(f"{k}={v}" for k, v in env.items())
    script = f"env {outer} sh -c 'env {inner} sleep 300 & echo $$; wait' & wait"
    parent = subprocess.Popen(["sh", "-c", script], env={**BASE, **parent_env}, stdout=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        try:
            os.killpg(p.pid, 9) if p.args[0] == "sh" else p.kill()
        except ProcessLookupError:
            pass
        p.wait()


@pytest.mark.parametrize("agent_env,rows", [(SLURM_AGENT, SLURM_ROWS), (PBS_AGENT, PBS_ROWS)], ids=["slurm", "pbs"])
def test_the_jobs_processes_are_found_by_the_job_id_in_their_environment(agent_env, rows, procs) -> None:
    others = {**agent_env, "SLURM_STEP_ID": "9"} if "SLURM_JOB_ID" in agent_env else agent_env
    parent, me = _agent(agent_env, parent_env=others, child_env={"SLURM_STEP_ID": "7"})
    procs.append(parent)
    rows = [(what, env, want, _sleep(env)) for what, env, want in rows]
    procs.extend(p for *_, p in rows)
    finder = JobProcesses.from_env(agent_env, me=me)
    assert finder is not None
    found = finder()
    for what, _env, want, p in rows:
        assert (p.pid in found) == want, what
    child = proctree.descendants(me)
    assert parent.pid not in found, "the agent's ancestor (another step of the job) is the agent's own"
    assert child and not child & found, "the agent's child (another step of the job) is the agent's own"
    assert me not in found
    assert found <= {p.pid for *_, p in rows} | {os.getpid()}
    # the second call judges from what it kept: a process gone is gone from it
    rows[0][3].kill()
    rows[0][3].wait()
    assert finder() == found - {rows[0][3].pid}


def test_outside_a_job_there_is_nothing_to_find() -> None:
    assert JobProcesses.from_env({"SLURM_STEP_ID": "3", "HOME": "/root"}) is None
    assert job_key({"SLURM_JOB_ID": " ", "PBS_JOBID": "9.s"}) == JobKey("PBS_JOBID", "9.s")
    assert job_key({"SLURM_JOB_ID": "4", "SLURM_STEP_ID": "2"}) == JobKey("SLURM_JOB_ID", "4", "SLURM_STEP_ID", "2")
    assert job_key({"PBS_JOBID": "9.s", "SLURM_STEP_ID": "2"}) == JobKey("PBS_JOBID", "9.s")  # PBS has no steps


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_process_whose_environment_cannot_be_read_is_not_the_jobs(tmp_path: Path, procs) -> None:
    """Asked by an unprivileged agent, another user's process with the same SLURM_JOB_ID is not
    the job's (its /proc/PID/environ is unreadable); the agent's own user's is."""
    theirs = _sleep({"SLURM_JOB_ID": JOB, "SLURM_STEP_ID": "0"})  # root's
    ours = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "300"],
                            env={**BASE, "SLURM_JOB_ID": JOB, "SLURM_STEP_ID": "0"}, stdin=subprocess.DEVNULL)
    procs.extend([theirs, ours])
    code = ("import sys; from supervisor.jobprocs import JobProcesses; "
            "from supervisor.sched import JobKey; "
            "print(sorted(JobProcesses(JobKey('SLURM_JOB_ID', '" + JOB + "', 'SLURM_STEP_ID', '1'))()))")
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                         env={**BASE, "PYTHONPATH": root}, cwd="/", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    found = set(eval(out.stdout))  # noqa: S307 - a list of ints we printed
    assert ours.pid in found and theirs.pid not in found
