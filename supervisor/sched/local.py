"""No scheduler: a run on a workstation or a login node. No end, no queue, no KILL after a
TERM, no other nodes: every question has its empty answer here, so callers need not ask
which scheduler they are under."""

from __future__ import annotations

from typing import Mapping

from supervisor.sched._job import AgentLaunch, Agents, Job, Recorded, Refined, ScriptChoices, count_devices, short_host
from supervisor.sched._tool import REQUEUE_TIMEOUT, Report


class Local:
    """The run outside any batch job."""

    name = "local"
    label = "local"
    is_batch = False
    default_kill_wait: float | None = None
    signals_every_node = True  # one node: a signal to the training reaches all of it
    signals_session = False
    node_failure_note: str = "no scheduler: spare nodes mean nothing here"
    gone_states: tuple[str, ...] = ()
    script_suffix = ""
    submit = ""
    script_options: tuple[str, ...] = ()
    directive = ""
    keep_on_node_failure = ""
    env_prefixes: tuple[str, ...] = ()
    job_variable: str | None = None  # no job: no process can be told to be its
    step_variable: str | None = None
    restart_variable: str | None = None
    local_dir_variables: tuple[str, ...] = ()
    gpu_variables: tuple[str, ...] = ()

    def active(self, env: Mapping[str, str]) -> bool:
        return True

    def job(self, env: Mapping[str, str]) -> Job:
        gpus = count_devices(env.get("CUDA_VISIBLE_DEVICES"))
        return Job(scheduler=self.name, nodes=(short_host(),), gpus_per_node=gpus, submit_dir=env.get("PWD"))

    def run_dir_id(self, env: Mapping[str, str]) -> str | None:
        return None  # a new run directory per run

    def node_name(self, env: Mapping[str, str]) -> str:
        return short_host()

    def recorded(self, env: Mapping[str, str], nodes: object) -> Recorded:
        return Recorded()

    def requeue_id(self, job: Job) -> str | None:
        return None

    async def end_time(self, job: Job, report: Report | None = None) -> float | None:
        return None

    async def kill_wait(self, job: Job, report: Report | None = None) -> float | None:
        return None

    def restart_count_now(self, job: Job) -> int | None:
        return None

    def signalled_all(self, sig: int | None, received: float | None, last_cont: float | None) -> bool:
        return False

    def kill_follows(self, sig: int | None) -> bool:
        return False

    async def signal_steps(self, job: Job, sig: int, report: Report | None = None) -> tuple[bool, str]:
        return False, "not a Slurm job"

    async def refine_reason(self, job: Job, was: str, *, termed: bool, died: bool,
                            report: Report | None = None) -> Refined | None:
        return None  # nobody to ask: the signal's own reading stands

    def requeue_command(self, job: Job) -> list[str] | None:
        return None

    async def requeue(self, job: Job, timeout: float = REQUEUE_TIMEOUT, report: Report | None = None) -> tuple[bool, str]:
        return False, f"no requeue on a {self.name} job"

    def requeue_hint(self, message: str) -> str | None:
        return None

    async def exclude_nodes(self, job: Job, nodes: list[str], *, timeout: float,
                            report: Report | None = None) -> tuple[bool, str]:
        return False, f"no node exclusion on a {self.name} job (docs/pbs.md)"

    def node_state(self, host: str) -> tuple[str, str] | None:
        return None

    def node_states(self, hosts: list[str]) -> dict[str, tuple[str, str]]:
        return {}

    def on_fewer_nodes(self, env: Mapping[str, str]) -> dict[str, str]:
        return dict(env)

    def agents(self, launch: AgentLaunch) -> Agents | None:
        return None

    def launch_line(self, job: Job, world: int, per_node: int, mpi: str | None) -> list[str] | None:
        """torchrun on this machine's GPUs, when it has several."""
        if job.gpus_per_node and job.gpus_per_node > 1:
            return ["torchrun", "--standalone", "--nproc-per-node", str(job.gpus_per_node)]
        return None

    def job_script(self, launcher: str) -> tuple[str, str]:
        raise ValueError("no job script without a scheduler")

    def submit_notes(self, script_name: str, config_name: str, account: bool) -> list[str]:
        raise ValueError("no job script without a scheduler")

    def submit_line(self, script: str, account: bool) -> str:
        raise ValueError("no job script without a scheduler")

    def set_directives(self, lines: list[str], c: ScriptChoices, template: str) -> None:
        raise ValueError("no job script without a scheduler")
