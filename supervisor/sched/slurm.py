"""Slurm: its environment map, its tools (squeue, scontrol, scancel, srun; what they print is
read in ``_slurm_output.py``) and its job script.

Facts relied on (docs/slurm.md):
* ``SLURM_JOB_END_TIME`` exists only from Slurm 23.02; on 22.05 the end time comes from
  ``squeue -h -j ID -o "%e %S %l"`` (local time, no zone, ``NONE`` without a limit) or
  ``scontrol show job`` (``EndTime=``); a scancel moves EndTime to the cancel time, so the
  time limit is StartTime + TimeLimit.
* ``SLURM_RESTART_COUNT`` is unset on a job's first run.
* scancel, the time limit and a requeue send SIGCONT + SIGTERM to every process of the job;
  KillWait later, SIGKILL.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from typing import Callable, Mapping

import anyio

from supervisor.sched._hostlist import expand_hostlist, expand_tasks_per_node
from supervisor.sched._job import (
    AgentLaunch, Job, Recorded, Refined, ScriptChoices, as_int, count_devices, gpu_count, set_directive, short_host,
)
from supervisor.sched._slurm_output import (
    JobView, excluded_nodes, node_line, parse_job_view, parse_kill_wait, parse_squeue_end, reason_after_signal_death,
    reason_from_view, scontrol_end, slurm_seconds, task_ended,
)
from supervisor.sched._tool import QUERY_TIMEOUT, REQUEUE_TIMEOUT, Report, outcome, run_tool

log = logging.getLogger(__name__)

KILL_WAIT = 30.0  # KillWait's default (slurm.conf)
JOB_WIDE = 2.0  # a SIGCONT this close to a TERM means the scheduler signalled every process
EXCLUDE_RETRY = 0.25  # seconds between tries while the requeued job is still leaving RUNNING
# supervise init: the templates' --signal=B:USR2@600, scaled to a short job
LEAD_MAX = 600     # seconds: the templates' --signal=B:USR2@600, for jobs of 40 min and more
LEAD_SHARE = 0.25  # a shorter job is warned this share of its time limit before the end…
LEAD_FLOOR = 45    # …but never less (Slurm checks about every 30 s and may send it up to 60 s early)


class Slurm:
    """A Slurm job (submitit's ``SlurmJobEnvironment``)."""

    name = "slurm"
    label = "Slurm"
    is_batch = True
    default_kill_wait: float | None = KILL_WAIT
    signals_every_node = True  # scancel --signal and its own TERM reach every step's tasks
    signals_session = False    # scancel reaches the steps' tasks (or, with --batch, the batch shell), not a session
    node_failure_note: str = ("Slurm ends the whole job when a node fails unless the job script says "
                              "#SBATCH --no-kill (then it ends only the steps on that node)")
    gone_states: tuple[str, ...] = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER_DOWN", "FUTURE", "UNKNOWN")
    script_suffix = "sbatch"
    keep_on_node_failure = "#SBATCH --no-kill                  # a node's death ends its steps, not the job (spare_nodes)"
    submit = "sbatch"
    script_options: tuple[str, ...] = ()
    directive = "#SBATCH"
    # the environment
    env_prefixes: tuple[str, ...] = ("SLURM_",)
    job_variable: str | None = "SLURM_JOB_ID"    # in every task of every step…
    step_variable: str | None = "SLURM_STEP_ID"  # …with its step's
    restart_variable: str | None = "SLURM_RESTART_COUNT"  # unset on the first run
    local_dir_variables: tuple[str, ...] = ("SLURM_TMPDIR",)  # a site's node-local scratch (Compute Canada's…)
    gpu_variables: tuple[str, ...] = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
    node_variable = "SLURMD_NODENAME"

    # ------------------------------------------------------------------------ the environment
    def active(self, env: Mapping[str, str]) -> bool:
        return bool(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))

    def job(self, env: Mapping[str, str]) -> Job:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        try:
            nodes = expand_hostlist(nodelist) if nodelist else ()
        except ValueError:
            log.warning("cannot expand SLURM_JOB_NODELIST=%r; using it as one name", nodelist)
            nodes = (nodelist,)
        tpn: int | None = as_int(env.get("SLURM_NTASKS_PER_NODE"))
        if tpn is None and env.get("SLURM_TASKS_PER_NODE"):
            try:
                counts = expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"])
                tpn = counts[0] if len(set(counts)) == 1 else None
            except ValueError:
                pass
        gpus = gpu_count(env.get("SLURM_GPUS_ON_NODE"))
        if gpus is None:
            gpus = gpu_count(env.get("SLURM_GPUS_PER_NODE"))
        for key in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
            if gpus is None:
                gpus = count_devices(env.get(key))
        end = env.get("SLURM_JOB_END_TIME")
        return Job(
            scheduler=self.name,
            job_id=env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"),
            job_name=env.get("SLURM_JOB_NAME"),
            restart_count=as_int(env.get(self.restart_variable)) or 0,
            nodes=nodes,
            gpus_per_node=gpus,
            ntasks=as_int(env.get("SLURM_NTASKS")) or as_int(env.get("SLURM_NPROCS")),
            tasks_per_node=tpn,
            cpus_per_node=as_int(env.get("SLURM_CPUS_ON_NODE")),
            submit_dir=env.get("SLURM_SUBMIT_DIR"),
            array_job_id=env.get("SLURM_ARRAY_JOB_ID"),
            array_task_id=env.get("SLURM_ARRAY_TASK_ID"),
            env_end_time=float(end) if end and end.strip().isdigit() and int(end) > 0 else None,
        )

    def run_dir_id(self, env: Mapping[str, str]) -> str | None:
        """The job id the default run directory is named by (the same for every requeue)."""
        return env.get("SLURM_JOB_ID") or None

    def node_name(self, env: Mapping[str, str]) -> str:
        """Slurm's name for the node supervise runs on (what ExcNodeList takes)."""
        return env.get(self.node_variable) or short_host()

    def recorded(self, env: Mapping[str, str], nodes: object) -> Recorded:
        """What a journaled Slurm environment says: GPUs (``SLURM_GPUS_ON_NODE`` times the
        nodes, else the job's ``SLURM_GPUS``), the job's start, ``--mem`` (MiB), the node."""
        gpus = None
        for key in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS"):
            v = str(env.get(key, ""))
            if v.isdigit() and int(v) > 0:
                n = str(nodes or env.get("SLURM_JOB_NUM_NODES") or "1")
                gpus = int(v) * (int(n) if n.isdigit() and key == "SLURM_GPUS_ON_NODE" else 1)
                break
        start, mem, node = str(env.get("SLURM_JOB_START_TIME", "")), str(env.get("SLURM_MEM_PER_NODE", "")), env.get(self.node_variable)
        return Recorded(gpus=gpus, start=float(start) if start.isdigit() else None,
                        mem_per_node_mib=float(mem) if mem.isdigit() else None,
                        node=node if isinstance(node, str) and node else None)

    def requeue_id(self, job: Job) -> str | None:
        """The id ``scontrol requeue`` wants: ``ARRAYID_TASKID`` for an array task."""
        if job.array_job_id and job.array_task_id:
            return f"{job.array_job_id}_{job.array_task_id}"
        return job.job_id

    # ------------------------------------------------------------------------ the clock
    async def end_time(self, job: Job, report: Report | None = None) -> float | None:
        """Unix seconds when Slurm ends the job; None without a limit or on any failure."""
        report = report or log.warning
        try:
            return await _end_time(job, report)
        except Exception as exc:  # noqa: BLE001 - a scheduler query must never end the supervision
            report(f"end time of {self.name} job {job.job_id}: {exc!r}")
            return None

    async def kill_wait(self, job: Job, report: Report | None = None) -> float | None:
        """``KillWait`` from ``scontrol show config``: the TERM → KILL wait after a job-wide
        TERM; else its default."""
        rc, out = await run_tool(["scontrol", "show", "config"], QUERY_TIMEOUT, report or log.warning)
        wait = parse_kill_wait(out) if rc == 0 else None
        return wait if wait is not None else self.default_kill_wait

    def restart_count_now(self, job: Job) -> int | None:
        """None: ``SLURM_RESTART_COUNT`` already said it (``job.restart_count``)."""
        return None

    # ------------------------------------------------------------------------ signals
    def signalled_all(self, sig: int | None, received: float | None, last_cont: float | None) -> bool:
        """Did Slurm's SIGCONT+SIGTERM to every process of the job (scancel, the time limit, a
        requeue) come, rather than a TERM to us alone? slurmstepd sends SIGCONT with it; then the
        launcher got that TERM too, and a TERM of ours would be its second (mpiexec abandons its
        ranks on a second TERM). Times are ``time.monotonic()``."""
        if sig != signal.SIGTERM or received is None or last_cont is None:
            return False
        return abs(last_cont - received) <= JOB_WIDE

    def kill_follows(self, sig: int | None) -> bool:
        """False: Slurm's KILL follows only its job-wide TERM, which ``signalled_all`` tells."""
        return False

    async def signal_steps(self, job: Job, sig: int, report: Report | None = None) -> tuple[bool, str]:
        """``scancel --signal=SIG JOBID``: the signal to the tasks of every step of the job, not
        the batch shell (supervise): how srun's tasks are stopped gracefully (docs/launchers.md)."""
        if not job.job_id:
            return False, "not a Slurm job"
        name = signal.Signals(sig).name.removeprefix("SIG")
        rc, out = await run_tool(["scancel", f"--signal={name}", job.job_id], QUERY_TIMEOUT, report or log.warning)
        return rc == 0, out.strip()

    async def refine_reason(self, job: Job, was: str, *, termed: bool, died: bool,
                            report: Report | None = None) -> Refined | None:
        """After a SIGTERM the controller tells cancel, requeue, preemption and the time limit
        apart (they all send the same TERM). So it does when the training died of a stop signal
        before supervise's own TERM arrived (``reason_after_signal_death``)."""
        if not (termed or died):
            return None
        view = await job_view(job, report=report or log.warning)
        if termed:
            reason, requeued = reason_from_view(view, was, job.restart_count)
        else:
            reason, requeued = reason_after_signal_death(view, job.restart_count) or (was, False)
        state = view.state if view else None
        fields = {"state": state, "reason": reason, "was": was, "requeued_by_scheduler": requeued,
                  "restarts": view.restarts if view else None, "preempted": bool(view and view.preempt_time)}
        return Refined(reason, requeued, fields, f"scheduler state {state}")

    # ------------------------------------------------------------------------ the queue
    def requeue_command(self, job: Job) -> list[str] | None:
        jid = self.requeue_id(job)
        return ["scontrol", "requeue", jid] if jid else None

    async def requeue(self, job: Job, timeout: float = REQUEUE_TIMEOUT, report: Report | None = None) -> tuple[bool, str]:
        """``scontrol requeue``. Returns (ran, message): ran is True only on exit status 0.

        The requeue at once sends SIGTERM to the batch shell, i.e. to us when the job script
        ``exec``s supervise: call this as the very last step of the stop sequence."""
        argv = self.requeue_command(job)
        if argv is None:
            return False, f"no requeue on a {self.name} job"
        rc, out = await run_tool(argv, timeout, report or log.warning)
        return outcome(argv, rc, out)

    def requeue_hint(self, message: str) -> str | None:
        """What the site must change when Slurm refused our requeue (measured message)."""
        if "presently disabled" in message:
            return "the site disabled requeueing (JobRequeue=0) or the job was submitted with --no-requeue"
        return None

    async def exclude_nodes(self, job: Job, nodes: list[str], *, timeout: float,
                            report: Report | None = None) -> tuple[bool, str]:
        """Add ``nodes`` to the requeued job's ``ExcNodeList`` (docs/slurm.md, "Suspect nodes").

        Slurm 22.05 refuses ``ExcNodeList+=`` ("does not accept [+|-]= syntax") and any change to a
        running job ("Job is no longer pending execution"), both measured: so this runs *after*
        ``scontrol requeue``, reads the list, and sets the union, retried until the job is pending
        (bounded by ``timeout``)."""
        if not job.job_id:
            return False, f"no node exclusion on a {self.name} job (docs/pbs.md)"
        report = report or log.warning
        message = "not tried"
        with anyio.move_on_after(timeout):
            while True:
                rc, out = await run_tool(["scontrol", "show", "job", "-o", job.job_id], 5.0, report)
                if rc == 0:
                    wanted = ",".join(dict.fromkeys([*excluded_nodes(out), *nodes]))
                    argv = ["scontrol", "update", f"JobId={job.job_id}", f"ExcNodeList={wanted}"]
                    rc, out = await run_tool(argv, 5.0, lambda _: None)
                    message = f"{' '.join(argv)}: " + ("ok" if rc == 0 else " ".join(out.split())[:300])
                    if rc == 0:
                        return True, message
                await anyio.sleep(EXCLUDE_RETRY)
        report(f"could not exclude {', '.join(nodes)}: {message}")
        return False, message

    # ------------------------------------------------------------------------ nodes
    def node_state(self, host: str) -> tuple[str, str] | None:
        """(State, Reason) of a node from ``scontrol show node`` (blocking); None when it cannot tell."""
        return self.node_states([host]).get(host)

    def node_states(self, hosts: list[str]) -> dict[str, tuple[str, str]]:
        """(State, Reason) of each of ``hosts`` that ``scontrol`` knows, from one ``scontrol -o show
        node h1,h2,…``: one request to the controller, whatever the number of nodes (one per node
        took 1,023 processes and requests at 1,024 nodes, one after another; issue 44). Blocking."""
        if not hosts:
            return {}
        try:
            out = subprocess.run(["scontrol", "-o", "show", "node", ",".join(hosts)], capture_output=True,
                                 text=True, timeout=10 + len(hosts) / 100, stdin=subprocess.DEVNULL).stdout
        except (OSError, subprocess.TimeoutExpired):
            return {}
        return {host: state for line in out.splitlines() if (got := node_line(line)) for host, state in [got]}

    def on_fewer_nodes(self, env: Mapping[str, str]) -> dict[str, str]:
        """The environment of a launcher that runs on fewer nodes than the allocation (spares kept
        aside, issue 41): without the allocation's task count, which ``srun`` reads as its own
        ``--ntasks`` ("More processors requested than permitted" on the nodes it is told), so it
        counts its tasks from its nodes and ``--ntasks-per-node``."""
        return {k: v for k, v in env.items() if k not in ("SLURM_NTASKS", "SLURM_NPROCS")}

    def agents(self, launch: AgentLaunch) -> SrunAgents:
        return SrunAgents(launch)

    def launch_line(self, job: Job, world: int, per_node: int, mpi: str | None) -> list[str] | None:
        """``srun`` over the whole allocation, one task per GPU."""
        argv = ["srun", "-N", str(max(1, job.num_nodes)), "-n", str(world), "--ntasks-per-node", str(per_node)]
        if job.gpus_per_node:
            argv += ["--gpus-per-node", str(job.gpus_per_node)]
        return argv

    # ------------------------------------------------------------------------ supervise init
    def job_script(self, launcher: str) -> tuple[str, str]:
        """(template, preset) for a launcher (a close one when there is no exact one)."""
        if launcher.startswith("horovodrun"):
            return "slurm-horovodrun.sbatch", "ibex.toml"
        if launcher == "csrun":
            return "cerebras-csrun.sbatch", "cerebras.toml"
        if launcher == "srun" or launcher.startswith("mpiexec"):
            return "slurm-srun.sbatch", "slurm.toml"  # one task per GPU, started by the allocation
        return "slurm-torchrun.sbatch", "slurm.toml"  # one task that starts the ranks itself

    def submit_notes(self, script_name: str, config_name: str, account: bool) -> list[str]:
        return [f"submit: sbatch {script_name}   (check first: supervise check --config {config_name} -- …)"]

    def submit_line(self, script: str, account: bool) -> str:
        return f"sbatch {script}"

    def set_directives(self, lines: list[str], c: ScriptChoices, template: str) -> None:
        """The template's #SBATCH lines for these choices; the warning signal's lead scaled to the time."""
        set_directive(lines, r"^#SBATCH --job-name=\S+", f"#SBATCH --job-name={c.name}")
        if c.nodes:
            set_directive(lines, r"^#SBATCH --nodes=\S+", f"#SBATCH --nodes={c.nodes}")
        if c.gpus is not None:
            set_directive(lines, r"^#SBATCH --gpus-per-node=\S+", f"#SBATCH --gpus-per-node={c.gpus}" if c.gpus else None)
            if template == "slurm-srun.sbatch" and c.gpus:
                set_directive(lines, r"^#SBATCH --ntasks-per-node=\S+", f"#SBATCH --ntasks-per-node={c.gpus}")
        if c.time:
            set_directive(lines, r"^#SBATCH --time=\S+", f"#SBATCH --time={c.time}")
            limit = slurm_seconds(c.time)
            lead = warning_lead(limit) if limit else LEAD_MAX
            if lead < LEAD_MAX:
                set_directive(lines, r"^#SBATCH --signal=B:USR2@\d+.*$",
                              f"#SBATCH --signal=B:USR2@{lead}           # USR2 to the batch shell (= supervise) {lead} s "
                              f"before the end: a quarter of the {c.time} limit, at least {LEAD_FLOOR} s (not the "
                              f"templates' {LEAD_MAX} s: longer than the job, it would come at once)")


class SrunAgents:
    """One ``srun --overlap`` task per node, sharing the nodes with the training's step; the
    agents' lines come back on srun's stdout, and srun's end is theirs."""

    launcher = "srun"

    def __init__(self, launch: AgentLaunch) -> None:
        self.launch = launch
        self.failed: dict[int, str] = {}  # srun starts every node's task or none
        self.gone: dict[int, str] = {}    # nodes whose agent's task ended while srun goes on, as srun said it
        self.proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def argv(self) -> list[str]:
        n = len(self.launch.nodes)
        return ["srun", "--overlap", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
                f"--nodelist={','.join(self.launch.nodes)}",  # this attempt's nodes: never a spare (issue 41)
                "--job-name=supervise-node-agents", *self.launch.argv]

    async def start(self) -> str | None:
        """Start srun; None, or why it could not start."""
        argv, env = self.argv(), self.launch.env
        try:
            self.proc = await anyio.to_thread.run_sync(lambda: subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))  # our session: not the training tree (Child.tree)
        except OSError as e:
            return str(e)
        return None

    async def hear(self, heard: Callable[[str], None], changed: Callable[[], None]) -> None:
        """Every line srun's tasks print, until srun's stdout closes; and srun's own lines
        (its stderr, passed on to the leader's), where it says that a node's task ended
        (``gone``)."""
        proc = self.proc
        assert proc is not None
        lines: anyio.abc.ObjectReceiveStream[str]
        send, lines = anyio.create_memory_object_stream[str](64)

        def read() -> None:
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    anyio.from_thread.run(send.send, line)
            finally:
                anyio.from_thread.run_sync(send.close)

        def read_errors() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                sys.stderr.write(line)  # where srun's lines went before: the job's error file
                ended = task_ended(line, self.launch.nodes)
                if ended is not None:
                    anyio.from_thread.run_sync(self._task_ended, *ended, changed)

        async def follow() -> None:
            async for line in lines:
                heard(line)

        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: anyio.to_thread.run_sync(read, abandon_on_cancel=True))
            tg.start_soon(lambda: anyio.to_thread.run_sync(read_errors, abandon_on_cancel=True))
            tg.start_soon(follow)

    def _task_ended(self, node: int, said: str, changed: Callable[[], None]) -> None:
        self.gone[node] = said
        changed()

    async def wait(self) -> int:
        """srun's exit status, when it ends (before the leader's end: a node died, or srun could not reach one)."""
        proc = self.proc
        assert proc is not None
        return await anyio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)

    def ended(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    async def down(self, nodes: list[int]) -> dict[int, str]:
        """Of these nodes, those whose agent's task srun said has ended (``--kill-on-bad-exit=0``:
        srun goes on without it), and what it said. An agent whose node died ends srun,
        which ``ended`` tells."""
        return {k: f"its agent ended ({self.gone[k]})" for k in nodes if k in self.gone}


# ---------------------------------------------------------------------------- the end time

async def _end_time(job: Job, report: Report) -> float | None:
    if job.env_end_time is not None:
        return job.env_end_time
    if not job.job_id:
        return None
    # EndTime with StartTime and TimeLimit: a scancel moves EndTime, the time limit does not.
    rc, out = await run_tool(["squeue", "-h", "-j", job.job_id, "-o", "%e %S %l"], QUERY_TIMEOUT, report)
    if rc == 0 and out.strip():
        read, end = parse_squeue_end(out)
        if read:
            return end
        report(f"squeue printed an end time we cannot read: {out.split()[0]!r}")
    rc, out = await run_tool(["scontrol", "show", "job", job.job_id], QUERY_TIMEOUT, report)
    return scontrol_end(out) if rc == 0 else None


# ---------------------------------------------------------------------------- the controller's view


async def job_view(job: Job, report: Report | None = None, timeout: float = 5.0) -> JobView | None:
    """The controller's view of this job now, or None (no job id, or no answer). Never raises."""
    if not job.job_id:
        return None
    rc, out = await run_tool(["scontrol", "show", "job", "-o", job.job_id], timeout, report or log.warning)
    return parse_job_view(out) if rc == 0 else None


# ---------------------------------------------------------------------------- supervise init


def warning_lead(limit: float) -> int:
    """How long before the end the Slurm warning signal is asked for: the templates' 600 s,
    scaled down for a short job (a 2-minute job must not be warned 10 minutes ahead, which is
    at once), at least ``LEAD_FLOOR`` and never more than half the limit."""
    return int(min(LEAD_MAX, max(LEAD_FLOOR, LEAD_SHARE * limit), limit / 2))
