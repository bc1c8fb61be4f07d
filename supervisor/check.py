"""``supervise check``: the run's validation plus what supervise sees on this node.

Nothing is started and nothing is created: the run directory is probed, not made. Exit
status 0 when the run would start, 2 when something would stop it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

from supervisor.child import SpawnError, resolve_command
from supervisor.config import Config

OK, WARN, FAIL = "ok", "warn", "FAIL"


def probe_run_dir(path: Path) -> tuple[str, str]:
    """Writable, or creatable under a writable ancestor, without creating anything."""
    if path.exists():
        if not path.is_dir():
            return FAIL, f"{path} exists and is not a directory"
        if os.access(path, os.W_OK | os.X_OK):
            return OK, f"{path} (exists, writable)"
        return FAIL, f"{path} is not writable"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if os.access(parent, os.W_OK | os.X_OK):
        return OK, f"{path} (will be created under {parent})"
    return FAIL, f"{path} cannot be created: {parent} is not writable"


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = out.stdout or out.stderr
    return text.splitlines()[0].strip() if text else ""


def probe_rsync() -> tuple[str, str]:
    path = shutil.which("rsync")
    if path is None:
        return WARN, "not on PATH: the pure-Python copy backend will be used"
    return OK, f"{path} ({_first_line([path, '--version'])})"


def probe_nvml() -> tuple[str, str]:
    """Load NVML the way the sampler will; a missing driver is a note, not a failure."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        smi = shutil.which("nvidia-smi")
        return WARN, "nvidia-ml-py not installed (a dependency of supervise-hpc: pip install supervise-hpc)" + (f"; {smi} will be used" if smi else "; no GPU sampling")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        smi = shutil.which("nvidia-smi")
        return WARN, f"NVML: {e}" + (f"; {smi} will be used" if smi else "; no GPU sampling")
    try:
        n = pynvml.nvmlDeviceGetCount()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return OK, f"{n} GPU(s), driver {driver}"
    finally:
        pynvml.nvmlShutdown()


def probe_scheduler() -> tuple[str, str]:
    try:
        from supervisor.sched import detect_job
    except ImportError:
        return WARN, "scheduler detection not available"
    job = detect_job(os.environ)
    if not job.sched.is_batch:
        return OK, "none (local run)"
    return OK, f"{job.scheduler} job {job.job_id} (restart count {job.restart_count})"


def probe_session(env: Mapping[str, str]) -> tuple[str, str]:
    """In a PBS job: who leads the job's session. A script job's leader is the user's login shell
    (``-bash``), which ``qsig -s USR1|USR2`` (sent to the whole session) kills, and the job with it;
    an executable job (``qsub … -- /bin/bash SCRIPT`` whose script execs supervise) is led by supervise."""
    from supervisor.sched import present

    if not any(s.signals_session for s in present(env)):
        return OK, "not in a PBS job"
    sid = os.getsid(0)
    try:
        leader = Path(f"/proc/{sid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return WARN, f"PBS job: its session leader (PID {sid}) cannot be read"
    if leader.startswith("-"):
        return WARN, (f"PBS job led by the login shell (PID {sid}, {leader}): qsig -s USR1|USR2 kills it and the job; "
                      "submit an executable job instead (qsub … -- /bin/bash SCRIPT; a script from supervise init "
                      "does it when run: ./SCRIPT)")
    return OK, f"PBS job led by PID {sid} ({Path(leader).name}), not a login shell: qsig leaves it running"


def probe_script(path: Path) -> list[tuple[str, str]]:
    """What a job script's own lines say about requeue and signals (PBS; a Slurm script is only named)."""
    try:
        text = path.read_text()
    except OSError as e:
        return [(FAIL, f"{path}: {e.strerror or e}")]
    directives = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("#PBS ")]
    if not directives:
        return _slurm_signal(path, text) or [(OK, f"{path}: no #PBS lines (only PBS scripts and Slurm's --signal are read)")]
    out = []
    if not any(re.fullmatch(r"-r\s+y", d) for d in directives):
        out.append((WARN, f"{path}: no `#PBS -r y`: the job is not rerunnable, and its requeue (qrerun) is refused"))
    self_submit = re.search(r"^\s*(exec\s+)?qsub\b.*\s--\s", text, re.M)
    if self_submit:
        out.append((OK, f"{path}: run, it submits itself as an executable job, whose leader qsig does not kill"))
    else:
        out.append((WARN, f"{path}: `qsub {path.name}` runs it under your login shell, which qsig -s USR1|USR2 kills "
                          "(and the job); submit it as an executable job: qsub [options] -- /bin/bash SCRIPT"))
    if not re.search(r"^exec\s+supervise\b", text, re.M):
        out.append((WARN, f"{path}: no `exec supervise …` line: supervise will not get PBS's signals itself"))
    return out


def _slurm_signal(path: Path, text: str) -> list[tuple[str, str]]:
    """A Slurm script's ``--signal=USR1@N`` without ``B:``: Slurm sends it to the tasks, never to
    supervise; a Lightning training then requeues the job itself (docs/slurm.md, "Lightning's own
    requeue"), any other dies of it unless it handles USR1."""
    out = []
    for m in re.finditer(r"^#SBATCH\s+--signal[=\s]+(\S+)", text, re.M):
        value = m.group(1)
        where, _, sig = value.rpartition(":")
        if "B" not in where.upper() and re.match(r"(SIG)?USR1(@|$)", sig.upper()):
            out.append((WARN, f"{path}: `#SBATCH --signal={value}` goes to the training's tasks, not to supervise: "
                              "a Lightning training requeues the job itself then (its auto_requeue); "
                              "write --signal=B:USR2@N (docs/slurm.md)"))
    return out


def probe_command(command: Sequence[str]) -> tuple[str, str]:
    if not command:
        return WARN, "none given (add -- COMMAND to check it)"
    try:
        return OK, resolve_command(command, os.environ)
    except SpawnError as e:
        return FAIL, str(e)


def _check_plan(cfg: Config) -> bool:
    """The plan the run would follow (plan.describe): the same validation, the same lines."""
    from supervisor.errors import ConfigError
    from supervisor.plan import describe, make_plan

    try:
        plan = make_plan(cfg)
    except ConfigError as e:
        print(f"{FAIL:4}  {'plan':10} {e}")
        return True
    for w in plan.warnings[len(cfg.warnings):]:
        print(f"{WARN:4}  {'plan':10} {w}")
    for status, topic, text in describe(plan):
        print(f"{status:4}  {topic:10} {text}")
    for text in single_node_pairs(cfg, plan.job.num_nodes):
        print(f"{WARN:4}  {'plan':10} {text}")
    for status, text in node_evidence(plan.cfg, plan.env):
        print(f"{status:4}  {'evidence':10} {text}")
    if plan.nodes > 1:  # what node 1's agent would run by: its plan, as `supervise node-agent` makes it
        try:
            node = make_plan(cfg, plan.env, node_rank=1)
        except ConfigError as e:
            print(f"{FAIL:4}  {'node 1':10} {e}")
            return True
        for status, topic, text in describe(node):
            print(f"{status:4}  {topic:10} {text}")
    return False


def single_node_pairs(cfg: Config, job_nodes: int) -> list[str]:
    """A job of several nodes (the job's, or what the command asks for: ``torchrun --nnodes 2``)
    whose checkpoint pair mirrors one node's disk (``nodes`` 1, the default): the other nodes'
    parts of each checkpoint never reach persistent storage, and nothing else would say so
    before the first restore. ``nodes = "auto"`` (0 here, unresolved) follows the job."""
    from supervisor.launchers import command_nodes

    asked = command_nodes(cfg.command) or 1
    nodes = max(job_nodes, asked)
    if nodes < 2:
        return []
    why = f"the job has {job_nodes} nodes" if job_nodes >= asked else f"the command asks for {asked} nodes"
    return [f"{why}, but checkpoint pair {p.name} mirrors one node's local disk: the other nodes' parts of each "
            f"checkpoint never reach persistent storage; give nodes = \"auto\" in its [[sync]] table (with "
            f"--checkpoints: --nodes {nodes}), docs/multinode.md"
            for p in cfg.sync if p.kind == "checkpoint" and p.nodes == 1]


def node_evidence(cfg: Config, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """With per-node pairs: what tells each node that its part of a checkpoint is complete.
    Node 0 is the leader's (its child tree); the others' agents find the job's processes by
    what the scheduler puts in every process's environment, as a node agent (``conduct/node.py``) does with the
    environment srun (or the job script's launcher) hands it, this one's."""
    from supervisor.jobprocs import JobProcesses
    from supervisor.sched import JOB_VARIABLES

    nodes = max((p.nodes for p in cfg.sync if p.kind == "checkpoint" and p.nodes > 1), default=1)
    if nodes < 2:
        return []
    others = "node 1 (its node agent)" if nodes == 2 else f"nodes 1-{nodes - 1} (their node agents)"
    out = [(OK, "node 0 (the leader, supervise itself): open files of its child tree, the training's processes there")]
    finder = JobProcesses.from_env(env)
    if finder is None:
        out.append((WARN, f"{others}: quiet time alone (settle), or node 0's word for a directory part: "
                          f"no {' or '.join(JOB_VARIABLES)} here to find the training's processes by"))
    else:
        out.append((OK, f"{others}: open files of the job's processes found by {finder.key.variable} in "
                        "/proc/PID/environ (the agent's own step left out); a directory part also waits for node 0's "
                        "word or settle"))
    return out


def run_check(cfg: Config, command: Sequence[str], script: str | os.PathLike[str] | None = None) -> int:
    """Print one line per probe; 0 when the run would start, 2 otherwise. ``script``: the job
    script, whose PBS lines are read too (``probe_script``)."""
    assert cfg.run_dir is not None
    probes: list[tuple[str, Callable[[], tuple[str, str]]]] = [
        ("config", lambda: (OK, str(cfg.config_file) if cfg.config_file else "flags and environment only")),
        ("run dir", lambda: probe_run_dir(cfg.run_dir)),  # type: ignore[arg-type]
        ("command", lambda: probe_command(command)),
        ("scheduler", probe_scheduler),
        ("session", lambda: probe_session(os.environ)),
        ("rsync", probe_rsync),
        ("gpu", probe_nvml),
    ]
    failed = False
    for warning in cfg.warnings:
        print(f"{WARN:4}  {'env':10} {warning}")
    failed |= _check_plan(cfg)
    for name, probe in probes:
        try:
            status, text = probe()
        except Exception as e:  # noqa: BLE001 - a probe's bug is a line, not a traceback
            status, text = WARN, f"could not check: {type(e).__name__}: {e}"
        failed |= status == FAIL
        print(f"{status:4}  {name:10} {text}")
    for status, text in probe_script(Path(script)) if script is not None else []:
        failed |= status == FAIL
        print(f"{status:4}  {'script':10} {text}")
    print("check: " + ("problems found; supervise would not start" if failed else "ready"), file=sys.stderr)
    return 2 if failed else 0
