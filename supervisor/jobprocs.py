"""The training's processes on this node, found by a process that is not their parent.

The leader (the main ``supervise``) knows the training's processes as its own child tree
(``Child.tree``), and judges a checkpoint complete by their open files (sync/_writers.py). A
node agent on node K started none of them: the scheduler did, in another step of the same
job. What the scheduler gives every process of a job is the job's id in its environment
(``sched.job_key``): Slurm into every task of every step (with the step's id), PBS into every
process its MOM starts (``pbsdsh``, PALS' ``mpiexec``). So
the job's processes here are the live ones whose ``/proc/PID/environ`` names this job, less
the asking agent's own: itself, its ancestors (its step's daemon, a launcher's proxy), its
descendants (its copiers) and, under Slurm, every process of its own step.

``/proc/PID/environ`` is the environment a process was started with (what it changes in
itself later is not seen), and only its own user (or root) may read it: a process that cannot
be read is not counted as the job's, so another user's processes never are. Not the cgroup:
Slurm puts steps in cgroups only with ``proctrack/cgroup``, and PBS mostly not at all.
Of the job's processes here, the training's ranks are those the leader's stop signal is for
(``ranks_here``, ``signal_ranks``: PBS signals only the first node's). Blocking reads of
/proc: call from a worker thread.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Mapping

from supervisor import proctree
from supervisor.sched import JobKey, job_key


def read_environ(pid: int, names: tuple[str, ...]) -> dict[str, str] | None:
    """``names`` as set in ``pid``'s starting environment (those unset are left out); None
    when it cannot be read: gone, or another user's process."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    wanted = tuple(n.encode() + b"=" for n in names)
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if item.startswith(wanted):
            name, _, value = item.partition(b"=")
            out[name.decode()] = value.decode("utf-8", "replace")
    return out


def own_processes(me: int, procs: list[proctree.ProcInfo]) -> set[int]:
    """``me``, its ancestors and its descendants: the asking agent's own, never the training's."""
    parent = {p.pid: p.ppid for p in procs}
    out = {me} | proctree.descendants(me, procs)
    pid = parent.get(me, 0)
    while pid > 0 and pid not in out:
        out.add(pid)
        pid = parent.get(pid, 0)
    return out


class JobProcesses:
    """Called, the job's processes on this node now (``writers`` of a node agent's mirror).

    Cheap enough for every sync pass: the verdict on each process is kept by (pid, start
    time, name), so a call reads one ``stat`` per process, as the leader's ``Child.tree``
    does, and the environment only of processes it has not judged yet. The name is in the key
    because a process forked by a step's daemon carries the daemon's environment until its
    ``exec``, which keeps the pid and the start time but changes the name. Safe to call from
    several threads at once: each call keeps a new map of verdicts, losing at most some reuse.
    """

    def __init__(self, key: JobKey, me: int | None = None) -> None:
        self.key = key
        self.me = os.getpid() if me is None else me
        self._verdicts: dict[tuple[int, int, str], bool] = {}
        # what is read of each process: the job's variable, and the step's where there are steps
        self._names = (key.variable, key.step_variable) if key.step_variable else (key.variable,)

    @classmethod
    def from_env(cls, env: Mapping[str, str], me: int | None = None) -> JobProcesses | None:
        """For an agent whose environment is ``env``; None outside a job (no evidence to find)."""
        key = job_key(env)
        return None if key is None else cls(key, me)

    def describe(self) -> str:
        """How they are found, for ``supervise check`` and the journal."""
        key = self.key
        mine = f", not of the agent's own step ({key.step_variable}={key.step})" if key.step else ""
        return f"the processes on this node whose /proc/PID/environ has {key.variable}={key.value}{mine}"

    def __call__(self) -> set[int]:
        procs = proctree.all_processes()
        own = own_processes(self.me, procs)
        verdicts: dict[tuple[int, int, str], bool] = {}
        found = set()
        for p in procs:
            if p.state == "Z" or p.pid in own:
                continue
            k = (p.pid, p.start, p.comm)
            verdict = self._verdicts.get(k)
            if verdict is None:
                verdict = self._is_job(p.pid)
            verdicts[k] = verdict
            if verdict:
                found.add(p.pid)
        self._verdicts = verdicts  # those gone are forgotten
        return found

    def _is_job(self, pid: int) -> bool:
        key = self.key
        env = read_environ(pid, self._names)
        if env is None or env.get(key.variable) != key.value:
            return False
        return key.step is None or key.step_variable is None or env.get(key.step_variable) != key.step


def ranks_here(training: JobProcesses) -> tuple[set[int], set[int]]:
    """(the training's ranks on this node, the job's processes here): what the leader's stop
    signal is for (PBS gives it only to the first node's processes). The job's processes are
    found from the system (``JobProcesses``: this job's id in /proc/PID/environ, this uid, not
    the agent nor its ancestors or descendants); of those, the ranks are the topmost that are
    no launcher helper or wrapper (orted, a shell, ``env``) and carry a rank variable (MPI's,
    torch's), as the leader finds its own (``LauncherProfile.ranks``): a rank's data loader
    workers are below it and get nothing from us, a torchrun is the top and forwards it. With
    no rank variable to be seen, the topmost processes that are no wrapper."""
    from supervisor.launchers import _RANK_VARS_MPI, _RANK_VARS_TORCH, _env_key, _is_wrapper

    job = training()
    uid = os.getuid()
    here = _uts("self")

    def mine(pid: int) -> bool:
        """This uid's, and on this node: in this UTS namespace (one machine's processes share
        one; the nodes of a test cluster are namespaces of one machine that share its pids)."""
        try:
            return os.stat(f"/proc/{pid}").st_uid == uid and (here is None or _uts(str(pid)) == here)
        except OSError:
            return False

    job = {p for p in job if mine(p)}
    parent = {p.pid: p.ppid for p in proctree.all_processes()}
    real = {p for p in job if not _is_wrapper(p)}
    keyed = {p for p in real if _env_key(p, _RANK_VARS_MPI + _RANK_VARS_TORCH)}

    def tops(among: set[int]) -> set[int]:
        out = set()
        for pid in among:
            up = parent.get(pid, 0)
            while up > 1 and up not in among:
                up = parent.get(up, 0)
            if up not in among:
                out.add(pid)
        return out

    return (tops(keyed) if keyed else tops(real)), job


def _uts(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def signal_ranks(training: JobProcesses | None, name: str) -> dict[str, Any]:
    """Send the leader's stop signal ``name`` to the training's ranks on this node, once."""
    if training is None:
        return {"pids": [], "error": "not in a job: the training's processes cannot be told apart"}
    try:
        sig = signal.Signals[name]
    except KeyError:
        return {"pids": [], "error": f"unknown signal {name!r}"}
    from supervisor.launchers import _cmdline

    ranks, job = ranks_here(training)
    sent, failed, what = [], {}, {}
    for pid in sorted(ranks):
        what[str(pid)] = " ".join(_cmdline(pid))[:200]
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except OSError as e:
            failed[str(pid)] = e.strerror or str(e)
    others = {str(p): " ".join(_cmdline(p))[:120] for p in sorted(job - ranks)}
    return {"pids": sent, "failed": failed, "commands": what, "not_signalled": others}
