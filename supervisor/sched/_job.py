"""What every scheduler shares: the ``Job`` it finds in the environment, the ``Scheduler``
protocol each one (``slurm.py``, ``pbs.py``, ``local.py``) fills in, and the small readers of
device lists and numbers their environment maps use.

A ``Job`` is plain data (frozen, comparable, built from an environment alone); its
``scheduler`` is the name the journal carries. ``job.sched`` is the scheduler object that
knows what that name means, so no caller ever compares the name (docs/design.md).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from supervisor.sched._tool import Report

# The schedulers by name (the journal's ``scheduler``), filled by ``supervisor.sched`` once
# each module is loaded; ``Job.sched`` reads it.
SCHEDULERS: dict[str, Scheduler] = {}


@dataclass(frozen=True)
class Job:
    """What the environment says about the job we run in. Scheduler tools are not consulted."""

    scheduler: str                      # its name: 'slurm' | 'pbs' | 'local' (journaled as it is)
    job_id: str | None = None
    job_name: str | None = None
    restart_count: int = 0              # requeues before this run (0 on the first)
    nodes: tuple[str, ...] = ()
    gpus_per_node: int | None = None
    ntasks: int | None = None           # world-size hint: SLURM_NTASKS, PBS nodefile lines
    tasks_per_node: int | None = None
    cpus_per_node: int | None = None
    submit_dir: str | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    nodefile: str | None = None         # PBS_NODEFILE
    env_end_time: float | None = None   # SLURM_JOB_END_TIME (Slurm >= 23.02), a launch snapshot
    queue: str | None = None            # PBS_QUEUE (the queue's kill_delay is the TERM→KILL wait)
    allocation: tuple[str, ...] = ()    # every node the scheduler gave the job, when ``nodes`` is fewer (spares)
    lost: tuple[str, ...] = ()          # nodes of the allocation that died in an earlier attempt of it

    @property
    def spares(self) -> tuple[str, ...]:
        """The allocation's nodes this attempt keeps aside, alive as far as supervise knows."""
        return tuple(n for n in self.allocation if n not in self.nodes and n not in self.lost)

    @property
    def sched(self) -> Scheduler:
        """The scheduler this job runs under: every fact and action that differs between them."""
        return SCHEDULERS[self.scheduler]

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def all_nodes(self) -> tuple[str, ...]:
        """Every node of the allocation, spares and dead ones included."""
        return self.allocation or self.nodes

    @property
    def requeue_id(self) -> str | None:
        """The id the scheduler's requeue wants (Slurm: ``ARRAYID_TASKID`` for an array task);
        None where there is no queue."""
        return self.sched.requeue_id(self)


@dataclass(frozen=True)
class JobKey:
    """What names one job in the environment of every process its scheduler starts for it (every
    task of every step, every process a mom starts): how a process that is not their parent tells
    the job's processes on its node (jobprocs.py). ``step``: the asker's own step, whose processes
    are its own, not the training's; None where the scheduler has no steps."""

    variable: str
    value: str
    step_variable: str | None = None
    step: str | None = None


@dataclass(frozen=True)
class Recorded:
    """What a journaled environment (the ``start`` event's ``scheduler_env``) says of its job,
    for the report, which has nothing else of the scheduler; None where it does not say."""

    gpus: int | None = None                # the job's GPUs, every node's
    start: float | None = None             # when the batch job started, unix seconds
    mem_per_node_mib: float | None = None  # the memory the job asked per node
    node: str | None = None                # the scheduler's name for the node (what an exclusion takes)


@dataclass(frozen=True)
class Refined:
    """What the scheduler's view says of a stop signal (``Scheduler.refine_reason``): the
    reason, whether the scheduler itself requeued the job, the ``reason`` event's fields as
    that scheduler journals them, and the words the trigger's detail gains."""

    reason: str
    requeued: bool
    fields: dict[str, Any]
    said: str


@dataclass(frozen=True)
class AgentLaunch:
    """What the leader hands its scheduler to start one node agent on every other node
    (conduct/fleet.py): the leader says what runs, the scheduler how it gets there."""

    argv: list[str]                       # the agents' command, the same on every node
    ranked: Callable[[int], list[str]]    # node k's command with its rank on it
    nodes: tuple[str, ...]                # node 0 is the leader's own
    env: dict[str, str]                   # the leader's environment, with what every agent must get
    carry: tuple[str, ...]                # names in env an agent needs where a launch hands it no environment
    say: tuple[str, Path]                 # (variable, directory): where an agent with no pipe back appends its lines
    said_file: Callable[[int], Path]      # node k's file in that directory (conduct/wire.py names it)
    timeout: float                        # a spawn that takes longer failed
    report: Report                        # the leader's log, for a node whose agent could not start


class Agents(Protocol):
    """The node agents of one attempt as their scheduler starts and hears them."""

    launcher: str              # the ``node-agents`` event's launcher
    failed: dict[int, str]     # nodes whose agent could not be started, and why

    @property
    def pid(self) -> int | None: ...
    def argv(self) -> list[str]: ...
    async def start(self) -> str | None: ...
    async def hear(self, heard: Callable[[str], None], changed: Callable[[], None]) -> None: ...
    async def wait(self) -> int: ...
    def ended(self) -> bool: ...
    async def down(self, nodes: list[int]) -> dict[int, str]: ...  # node → why its agent cannot answer, in words


class ScriptChoices(Protocol):
    """What ``supervise init`` chose, as a scheduler's job-script lines read it."""

    name: str
    nodes: int | None
    gpus: int | None
    time: str | None
    account: str | None
    queue: str | None
    select: str | None
    filesystems: str | None


class Environment(Protocol):
    """A scheduler's own variables, as any environment holds them: its job's (``job``), another
    process's (``job_variable``), a node's (``local_dir_variables``) or a journaled one
    (``recorded``). The package's ``job_key``, ``local_dirs``, ``visible_gpus`` and ``recorded``
    ask every scheduler, in the order they are trusted, so nothing outside sched/ names one."""

    env_prefixes: tuple[str, ...]         # the variables the journal's ``start`` keeps (``scheduler_env``)
    job_variable: str | None              # the job's id, in every process of the job
    step_variable: str | None             # the step's id, in every process of the step
    restart_variable: str | None          # its count of the job's requeues before this run, where it has one
    local_dir_variables: tuple[str, ...]  # node-local scratch a site gives the job
    gpu_variables: tuple[str, ...]        # device lists it grants (after CUDA_VISIBLE_DEVICES), most specific first

    def recorded(self, env: Mapping[str, str], nodes: object) -> Recorded: ...


class Scheduler(Environment, Protocol):
    """One scheduler's knowledge: its environment map, its tools, its signals, its job scripts.
    Implementations are stateless singletons; methods that need the job take it."""

    name: str                   # the journal's ``scheduler`` field
    label: str                  # how a person calls it (the log, the report)
    is_batch: bool              # a batch job: an end, a queue to requeue into, nodes the leader starts agents on
    default_kill_wait: float | None  # TERM → KILL when the scheduler cannot be asked; None: no KILL comes
    signals_every_node: bool    # its signal reaches the training's ranks on every node (PBS: the first node's only)
    signals_session: bool       # its signal command goes to the job's whole session, a login shell leading it too (qsig)
    gone_states: tuple[str, ...]  # node states (upper case, as substrings) that mean the node is gone
    node_failure_note: str        # what the scheduler does to the job when one of its nodes fails (supervise check)
    # supervise init's job script
    script_suffix: str          # NAME.sbatch, NAME.pbs
    submit: str                 # the submit command whose presence on PATH says the scheduler is here
    script_options: tuple[str, ...]  # init's options that become this scheduler's directives
    directive: str              # how a job script's own lines start (#SBATCH, #PBS)
    keep_on_node_failure: str   # the job-script line that keeps a job whose node died (spare nodes, issue 41)

    def active(self, env: Mapping[str, str]) -> bool: ...
    def job(self, env: Mapping[str, str]) -> Job: ...
    def run_dir_id(self, env: Mapping[str, str]) -> str | None: ...
    def node_name(self, env: Mapping[str, str]) -> str: ...
    def requeue_id(self, job: Job) -> str | None: ...
    async def end_time(self, job: Job, report: Report | None = None) -> float | None: ...
    async def kill_wait(self, job: Job, report: Report | None = None) -> float | None: ...
    def restart_count_now(self, job: Job) -> int | None: ...
    def signalled_all(self, sig: int | None, received: float | None, last_cont: float | None) -> bool: ...
    def kill_follows(self, sig: int | None) -> bool: ...
    async def signal_steps(self, job: Job, sig: int, report: Report | None = None) -> tuple[bool, str]: ...
    async def refine_reason(self, job: Job, was: str, *, termed: bool, died: bool,
                            report: Report | None = None) -> Refined | None: ...
    def requeue_command(self, job: Job) -> list[str] | None: ...
    async def requeue(self, job: Job, timeout: float = ..., report: Report | None = None) -> tuple[bool, str]: ...
    def requeue_hint(self, message: str) -> str | None: ...
    async def exclude_nodes(self, job: Job, nodes: list[str], *, timeout: float,
                            report: Report | None = None) -> tuple[bool, str]: ...
    def node_state(self, host: str) -> tuple[str, str] | None: ...
    def node_states(self, hosts: list[str]) -> dict[str, tuple[str, str]]: ...
    def on_fewer_nodes(self, env: Mapping[str, str]) -> dict[str, str]: ...
    def agents(self, launch: AgentLaunch) -> Agents | None: ...
    def launch_line(self, job: Job, world: int, per_node: int, mpi: str | None) -> list[str] | None: ...
    def job_script(self, launcher: str) -> tuple[str, str]: ...
    def submit_notes(self, script_name: str, config_name: str, account: bool) -> list[str]: ...
    def submit_line(self, script: str, account: bool) -> str: ...
    def set_directives(self, lines: list[str], c: ScriptChoices, template: str) -> None: ...


# ---------------------------------------------------------------------------- environment readers

def count_devices(text: str | None) -> int | None:
    """GPUs in a device list (``0,1,2,3``, ``GPU-uuid,…``: CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS).

    None when unset or empty (unknown); 0 for ``NoDevFiles`` (Slurm's "none granted")."""
    if text is None or not text.strip():
        return None
    if text.strip().lower() in ("nodevfiles", "none", "(null)"):
        return 0
    return len([x for x in text.split(",") if x.strip()])


def gpu_count(text: str | None) -> int | None:
    """A GPU count: ``4`` (SLURM_GPUS_ON_NODE), ``a100:4`` or ``gpu:a100:4(x2)`` (per node)."""
    m = re.fullmatch(r"\s*(?:[\w.-]+:)*(\d+)(?:\(x\d+\))?\s*", text or "")
    return int(m.group(1)) if m else None


def as_int(text: str | None) -> int | None:
    """A whole number from the environment or a tool's field; None when absent or not one."""
    try:
        return int(str(text).strip()) if text not in (None, "") else None
    except ValueError:
        return None


def short_host() -> str:
    """This machine's name as schedulers list nodes: the host name up to its first dot."""
    return os.uname().nodename.split(".")[0]


def set_directive(lines: list[str], pattern: str, new: str | None) -> None:
    """Replace what ``pattern`` matches in the first line it matches (the rest kept); None deletes it."""
    rx = re.compile(pattern)
    for i, line in enumerate(lines):
        m = rx.match(line)
        if m:
            if new is None:
                del lines[i]
            else:
                lines[i] = new + line[m.end():]
            return
