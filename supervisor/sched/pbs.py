"""PBS Pro / OpenPBS: its environment map, its tools (qrerun, pbsdsh; qstat and pbsnodes are
asked in ``_pbs_server.py``, their output read in ``_pbs_output.py``) and its job script.

Facts relied on (measured on OpenPBS 23.06, docs/pbs.md):
* PBS has no end-time variable; ``qstat -f`` gives ``stime`` and ``Resource_List.walltime``.
* No variable counts reruns: ``run_count`` of ``qstat -f`` does (1 on the first run).
* A qdel, the walltime and a qrerun send SIGTERM to the job's session on the first node only,
  and SIGKILL the queue's ``kill_delay`` later, with no SIGCONT to tell them from another TERM.
* A TM task (``pbsdsh``) gets the job's base environment, not its spawner's, and its stdout
  goes to the job's output file.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Callable, Mapping

import anyio

from supervisor import childenv
from supervisor.sched import _pbs_server as server
from supervisor.sched._job import (
    AgentLaunch, Job, Recorded, Refined, ScriptChoices, as_int, count_devices, gpu_count, set_directive, short_host,
)
from supervisor.sched._pbs_output import parse_kill_delay, pbs_reason, pbs_restart_count
from supervisor.sched._tool import QUERY_TIMEOUT, REQUEUE_TIMEOUT, Report, outcome, run_tool

log = logging.getLogger(__name__)

# MoM's SIGKILL after its TERM comes kill_delay later by MoM's loop clock, which can be stale:
# measured gaps 0.9-3.0 s for kill_delay 3 and 5.0 s for 5 (OpenPBS 23.06, MoM polls 1/2 s),
# 11-17 s for 10 with the default polls. The wait counted on is the smaller of
# kill_delay less this and a quarter of kill_delay.
PBS_KILL_EARLY = 2.2
PBS_KILL_DELAY = 10.0  # a queue's kill_delay when unset (OpenPBS req_runjob.c)
# What a TM task must get from the leader to run the same Python and package: the leader's own
# values travel on the agent's command line (pbsdsh passes no environment).
FORWARDED = ("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "VIRTUAL_ENV", "CONDA_PREFIX",
             "LD_LIBRARY_PATH", "TMPDIR")
SAY_POLL_S = 0.1  # the leader, reading its PBS agents' lines


def pbs_kill_wait(kill_delay: float) -> float:
    """The TERM→KILL wait to count on for a queue's ``kill_delay`` (PBS_KILL_EARLY)."""
    return round(max(0.25 * kill_delay, kill_delay - PBS_KILL_EARLY), 3)


class Pbs:
    """A PBS job."""

    name = "pbs"
    label = "PBS"
    is_batch = True
    default_kill_wait: float | None = pbs_kill_wait(PBS_KILL_DELAY)  # 7.8 s: a queue that sets no kill_delay
    signals_every_node = False  # qdel, qsig, the walltime: the first node's session only
    signals_session = True      # qsig: the whole session, which a script job's login shell leads and dies of USR1/USR2
    node_failure_note: str = ("submit with -W tolerate_node_failures=all, OpenPBS's word for a job that goes on "
                              "after a sister node fails")
    gone_states: tuple[str, ...] = ("DOWN", "OFFLINE", "UNKNOWN", "UNRESOLVABLE", "STALE")  # pbsnodes: down, offline, state-unknown…
    script_suffix = "pbs"
    submit = "qsub"
    script_options: tuple[str, ...] = ("account", "queue", "select", "filesystems")
    directive = "#PBS"
    keep_on_node_failure = "#PBS -W tolerate_node_failures=all"  # no comment: the script hands its #PBS words to qsub
    # the environment
    env_prefixes: tuple[str, ...] = ("PBS_",)
    job_variable: str | None = "PBS_JOBID"  # in every process a mom starts (pbsdsh, PALS' mpiexec)
    step_variable: str | None = None        # no steps
    restart_variable: str | None = None     # none: qstat's run_count (restart_count_now)
    local_dir_variables: tuple[str, ...] = ("PBS_JOBFS",)  # a site's node-local scratch (NCI's)
    gpu_variables: tuple[str, ...] = ()

    # ------------------------------------------------------------------------ the environment
    def active(self, env: Mapping[str, str]) -> bool:
        return bool(env.get("PBS_JOBID"))

    def job(self, env: Mapping[str, str]) -> Job:
        nodefile = env.get("PBS_NODEFILE")
        lines = read_nodefile(nodefile) if nodefile else []
        nodes = tuple(dict.fromkeys(lines))
        ncpus = as_int(env.get("NCPUS"))
        gpus = count_devices(env.get("CUDA_VISIBLE_DEVICES"))
        if gpus is None:
            gpus = gpu_count(env.get("NGPUS"))
        tpn = len(lines) // len(nodes) if nodes and len(lines) % len(nodes) == 0 else None
        array_index = env.get("PBS_ARRAY_INDEX")
        return Job(
            scheduler=self.name,
            job_id=env.get("PBS_JOBID"),
            job_name=env.get("PBS_JOBNAME"),
            # PBS has no restart counter in the environment (qstat's run_count is the
            # server's: restart_count_now); the journal counts attempts (journal.next_attempt).
            restart_count=0,
            nodes=nodes,
            gpus_per_node=gpus,
            ntasks=len(lines) or None,
            tasks_per_node=tpn,
            cpus_per_node=ncpus,
            submit_dir=env.get("PBS_O_WORKDIR"),
            array_job_id=env.get("PBS_ARRAY_ID") if array_index else None,
            array_task_id=array_index,
            nodefile=nodefile,
            queue=env.get("PBS_QUEUE"),
        )

    def run_dir_id(self, env: Mapping[str, str]) -> str | None:
        """The job id the default run directory is named by: its number (``1234`` of
        ``1234.polaris-pbs-01``), the same for every rerun."""
        return env.get("PBS_JOBID", "").split(".")[0] or None

    def node_name(self, env: Mapping[str, str]) -> str:
        return short_host()

    def recorded(self, env: Mapping[str, str], nodes: object) -> Recorded:
        """What a journaled PBS environment says: the job's GPUs (``PBS_NGPUS``), nothing else."""
        v = str(env.get("PBS_NGPUS", ""))
        return Recorded(gpus=int(v) if v.isdigit() and int(v) > 0 else None)

    def requeue_id(self, job: Job) -> str | None:
        return job.job_id

    # ------------------------------------------------------------------------ the clock
    async def end_time(self, job: Job, report: Report | None = None) -> float | None:
        """Unix seconds when PBS ends the job (``stime`` + walltime); None without a limit or
        on any failure."""
        report = report or log.warning
        try:
            return await server.end_time(job, report)
        except Exception as exc:  # noqa: BLE001 - a scheduler query must never end the supervision
            report(f"end time of {self.name} job {job.job_id}: {exc!r}")
            return None

    async def kill_wait(self, job: Job, report: Report | None = None) -> float | None:
        """The job's queue's ``kill_delay`` (``qstat -Qf QUEUE``; a queue attribute only, default
        10) less MoM's early KILL (``pbs_kill_wait``)."""
        report = report or log.warning
        # PBS_QUEUE is in every job's environment (measured); qstat -f only where it is not.
        queue = job.queue or getattr(await server.job_view(job, report), "queue", None)
        delay = None
        if queue:
            rc, out = await run_tool(["qstat", "-Qf", queue], QUERY_TIMEOUT, report)
            delay = parse_kill_delay(out) if rc == 0 else None
        return pbs_kill_wait(delay if delay is not None else PBS_KILL_DELAY)

    def restart_count_now(self, job: Job, timeout: float = QUERY_TIMEOUT) -> int | None:
        """This job's reruns so far, from ``qstat -f`` (blocking: for the plan, before the
        event loop). None when qstat does not answer."""
        return pbs_restart_count(server.job_attrs_now(job.job_id, timeout)) if job.job_id else None

    # ------------------------------------------------------------------------ signals
    def signalled_all(self, sig: int | None, received: float | None, last_cont: float | None) -> bool:
        """False: PBS's TERM reaches the first node's session only (supervise, not the training)."""
        return False

    def kill_follows(self, sig: int | None) -> bool:
        """Does MoM's SIGKILL follow this signal kill_delay later, with no SIGCONT to tell?
        A qdel, the walltime and a qrerun all send SIGTERM to the job's session on the first node
        (supervise, when it is the session leader or the job script's exec'd child) and SIGKILL
        kill_delay later; the training, in its own session, gets neither. A TERM from elsewhere
        cannot be told apart: taken for one, the stop is only hurried."""
        return sig == signal.SIGTERM

    async def signal_steps(self, job: Job, sig: int, report: Report | None = None) -> tuple[bool, str]:
        return False, "not a Slurm job"

    async def refine_reason(self, job: Job, was: str, *, termed: bool, died: bool,
                            report: Report | None = None) -> Refined | None:
        """After a SIGTERM, ``qstat -f`` tells a ``qdel`` (the comment gains ``terminated by
        USER@HOST`` at once) and a ``qrerun`` (substate 60) from the walltime (nothing changes)
        and any other TERM (``pbs_reason``)."""
        if not termed:
            return None
        view = await server.job_view(job, report=report or log.warning)
        reason, requeued = pbs_reason(view, was)
        state = None if view is None else f"{view.state}/{view.substate}"
        fields = {"state": state, "reason": reason, "was": was, "requeued_by_scheduler": requeued,
                  "restarts": None if view is None or view.run_count is None else view.run_count - 1,
                  "terminated_by": view.terminated_by if view else None}
        said = f"qstat: {state}" + (f", terminated by {view.terminated_by}" if view and view.terminated_by else "")
        return Refined(reason, requeued, fields, said)

    # ------------------------------------------------------------------------ the queue
    def requeue_command(self, job: Job) -> list[str] | None:
        return ["qrerun", job.job_id] if job.job_id else None

    async def requeue(self, job: Job, timeout: float = REQUEUE_TIMEOUT, report: Report | None = None) -> tuple[bool, str]:
        """``qrerun`` of our own job, done when the server shows it rerunning (``_pbs_server.rerun``)."""
        argv = self.requeue_command(job)
        if argv is None:
            return False, f"no requeue on a {self.name} job"
        rc, out = await server.rerun(job, argv, timeout, report or log.warning)
        if rc == server.RERUN_ACCEPTED:
            return True, f"{' '.join(argv)}: accepted (the server is rerunning the job: substate {out})"
        return outcome(argv, rc, out)

    def requeue_hint(self, message: str) -> str | None:
        """What the site must change when PBS refused our qrerun (measured messages)."""
        if "Unauthorized Request" in message:
            return ("PBS lets only managers and operators qrerun a job: the site must list the job's user in the "
                    "server's operators (qmgr -c 'set server operators += USER@*'), or requeue it by hand")
        if "not rerunnable" in message:
            return "the job was submitted with qsub -r n: submit it rerunnable (-r y, the default)"
        return None

    async def exclude_nodes(self, job: Job, nodes: list[str], *, timeout: float,
                            report: Report | None = None) -> tuple[bool, str]:
        """PBS has no per-job exclusion a job can set on itself: (False, why)."""
        return False, f"no node exclusion on a {self.name} job (docs/pbs.md)"

    # ------------------------------------------------------------------------ nodes
    def node_state(self, host: str) -> tuple[str, str] | None:
        return server.node_state(host)

    def node_states(self, hosts: list[str]) -> dict[str, tuple[str, str]]:
        """One ``pbsnodes`` per host (blocking): several hosts in one call are not measured here."""
        return {h: state for h in hosts if (state := server.node_state(h)) is not None}

    def on_fewer_nodes(self, env: Mapping[str, str]) -> dict[str, str]:
        """Unchanged: ``PBS_NODEFILE`` keeps naming the job's nodefile, whose line numbers are the
        TM node numbers ``pbsdsh -h`` and ``pbs_tmrsh`` look a host up by (measured: with the
        attempt's own file there, ``pbsdsh -h n3`` asked for the dead node and hung). The
        command's ``--hostfile $PBS_NODEFILE`` is rewritten to the attempt's file instead
        (``nodeset.on_nodes``)."""
        return dict(env)

    def agents(self, launch: AgentLaunch) -> PbsdshAgents:
        return PbsdshAgents(launch)

    def launch_line(self, job: Job, world: int, per_node: int, mpi: str | None) -> list[str] | None:
        """``mpiexec`` over the nodefile. ``mpi`` is the installed ``mpiexec``'s family
        (envinfo.detect_mpi): OpenMPI refuses ``--ppn`` ("unknown option") and takes
        ``--map-by ppr:G:node``, which places G ranks per node whatever slot count the nodefile
        gives; PALS and MPICH (and unknown) take ``--ppn``."""
        placed = ["--map-by", f"ppr:{per_node}:node"] if mpi == "openmpi" else ["--ppn", str(per_node)]
        argv = ["mpiexec", "--np", str(world), *placed]
        if job.nodefile:
            argv += ["--hostfile", job.nodefile]
        return argv

    # ------------------------------------------------------------------------ supervise init
    def job_script(self, launcher: str) -> tuple[str, str]:
        return "pbs-mpiexec.pbs", "polaris.toml"

    def submit_notes(self, script_name: str, config_name: str, account: bool) -> list[str]:
        """How the PBS script is submitted, and why that way (it says so itself at the top)."""
        a = "" if account else " -A PROJECT"
        return [f"submit: ./{script_name}{a} [more qsub options]",
                f"check first: supervise check --config {config_name} --script {script_name} -- …",
                "Run, it submits itself as an executable job (qsub with its #PBS lines and your options, then",
                "`-- /bin/bash THIS`, read again on the node when the job starts): supervise leads the job's session,",
                f"so qsig -s USR1|USR2 reaches it. `qsub {script_name}` works too, but then your login shell leads",
                "the session, and qsig kills it and the job (Exit_status 266)."]

    def submit_line(self, script: str, account: bool) -> str:
        return (f"{script}{'' if account else ' -A PROJECT'}   (it submits itself as an "
                "executable job, which qsig does not kill)")

    def set_directives(self, lines: list[str], c: ScriptChoices, template: str) -> None:
        """The template's #PBS lines (Polaris's) for these choices; '' drops a site directive."""
        set_directive(lines, r"^#PBS -N \S+", f"#PBS -N {c.name}")
        if c.select is not None:
            m = re.search(r"^#PBS -l select=(\d+)", "\n".join(lines), re.M)
            n = c.nodes or (int(m.group(1)) if m else 1)
            set_directive(lines, r"^#PBS -l select=\S*", f"#PBS -l select={n}" + (f":{c.select}" if c.select else ""))
        elif c.nodes:
            set_directive(lines, r"^#PBS -l select=\d+", f"#PBS -l select={c.nodes}")
        if c.queue is not None:
            set_directive(lines, r"^#PBS -q \S+", f"#PBS -q {c.queue}" if c.queue else None)
        if c.filesystems is not None:
            set_directive(lines, r"^#PBS -l filesystems=\S+",
                          f"#PBS -l filesystems={c.filesystems}" if c.filesystems else None)
        if c.account:
            i = next(i for i, ln in enumerate(lines) if ln.startswith("#PBS -N "))
            lines.insert(i + 1, f"#PBS -A {c.account}")
        if c.time:
            set_directive(lines, r"^#PBS -l walltime=\S+", f"#PBS -l walltime={c.time}")


class PbsdshAgents:
    """Node k's agent as a TM task of its mom: one ``pbsdsh -o -h HOST`` each (spawn, do not wait
    for its end), so PBS tracks it, accounts it and kills it with the job. A TM task starts with
    the job's base environment and its stdout goes to the job's output file: what it needs of
    the leader's is on its command line, and it says its lines by appending to its own file
    under the say directory (``SaidLines``), which the leader reads. ``pbsdsh -o`` returns once
    the task is spawned: the leader's wait for the agents is these lines, not the process."""

    launcher = "pbsdsh"
    pid = None  # one pbsdsh per node, each gone once its task is spawned

    def __init__(self, launch: AgentLaunch) -> None:
        self.launch = launch
        self.failed: dict[int, str] = {}  # a node whose pbsdsh could not spawn its agent

    def argv_for(self, k: int) -> list[str]:
        """Node ``k``'s agent: ``pbsdsh -o`` ``-h HOST`` (that node's line of PBS_NODEFILE)
        ``-- /usr/bin/env K=V … AGENT``."""
        launch = self.launch
        env = [f"{v}={launch.env[v]}" for v in FORWARDED if launch.env.get(v)]
        env += [f"{v}={launch.env[v]}" for v in launch.carry]
        say_var, say_dir = launch.say
        env += [f"{say_var}={say_dir}", f"{childenv.NODE_RANK}={k}"]
        return ["pbsdsh", "-o", "-h", launch.nodes[k], "--", "/usr/bin/env", *env, *launch.ranked(k)]

    def argv(self) -> list[str]:
        """Node 1's line (the others differ only in the host and the index)."""
        return self.argv_for(1)

    async def start(self) -> str | None:
        say_dir = self.launch.say[1]
        await anyio.to_thread.run_sync(lambda: say_dir.mkdir(parents=True, exist_ok=True))
        return None

    async def hear(self, heard: Callable[[str], None], changed: Callable[[], None]) -> None:
        """Spawn every other node's agent, then read their lines from their say files until cancelled."""
        launch, want = self.launch, list(range(1, len(self.launch.nodes)))

        def spawn(k: int) -> None:
            try:
                done = subprocess.run(self.argv_for(k), env=launch.env, stdin=subprocess.DEVNULL, capture_output=True,
                                      text=True, timeout=launch.timeout)
            except (OSError, subprocess.TimeoutExpired) as e:
                self.failed[k] = str(e)
            else:
                if done.returncode != 0:
                    self.failed[k] = f"pbsdsh exited {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
            if k in self.failed:
                launch.report(f"could not start the node agent on node {k} ({launch.nodes[k]}): {self.failed[k]}")
                anyio.from_thread.run_sync(changed)

        said = SaidLines(launch.said_file)

        async def follow() -> None:
            while True:
                for line in await anyio.to_thread.run_sync(said.read, want):
                    heard(line)
                await anyio.sleep(SAY_POLL_S)

        async with anyio.create_task_group() as tg:
            for k in want:
                tg.start_soon(anyio.to_thread.run_sync, spawn, k)
            tg.start_soon(follow)

    async def wait(self) -> int:
        """Never returns: the agents are the moms' tasks, they end with the leader's end."""
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    def ended(self) -> bool:
        return False

    async def down(self, nodes: list[int]) -> dict[int, str]:
        """Of these nodes, those PBS calls down, in words with their state: a TM task outlives
        no mom, so their agents cannot answer."""
        out = {}
        for k in nodes:
            state = await anyio.to_thread.run_sync(server.node_state, self.launch.nodes[k])
            if state is not None and "down" in state[0].lower():
                out[k] = f"PBS calls it {state[0]}"
        return out


class SaidLines:
    """What the PBS agents said: the lines appended to node K's said file (``said_file(K)``,
    in the say directory) since the last read, whole lines only (a line still being written
    waits for the next read), each once, in node order. A file not there yet is no line.
    Blocking: run in a thread."""

    def __init__(self, said_file: Callable[[int], Path]) -> None:
        self.said_file = said_file
        self.offsets: dict[int, int] = {}

    def read(self, nodes: list[int]) -> list[str]:
        lines = []
        for k in nodes:
            path = self.said_file(k)
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(k, 0))
                    raw = f.read()
            except OSError:
                continue
            whole = raw[:raw.rfind(b"\n") + 1]
            self.offsets[k] = self.offsets.get(k, 0) + len(whole)
            lines += whole.decode("utf-8", "replace").splitlines()
        return lines


def read_nodefile(path: str | os.PathLike[str]) -> list[str]:
    """Lines of a PBS nodefile (one per MPI rank; hosts repeat). Missing file → []."""
    try:
        return [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    except OSError:
        return []
