"""Per-launcher knowledge: how "checkpoint now" and "stop" reach every rank.

Launchers disagree about signals, and getting it wrong loses the run (measured on this
project's machine, docs/launchers.md):

* OpenMPI ``mpiexec`` forwards SIGUSR1/USR2 to every rank and keeps running; on SIGTERM it
  sends the ranks SIGCONT, then SIGTERM after ``odls_base_sigkill_timeout`` (1 s by default)
  and SIGKILL after twice that; a *second* SIGTERM/SIGINT makes it exit at once and orphan
  the ranks.
* ``torchrun`` dies on SIGUSR1 and orphans its workers; on SIGTERM it forwards TERM and kills
  after ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``.
* ``horovodrun --gloo`` and ``deepspeed`` die on SIGUSR1 too; ``srun`` forwards USR1 but turns
  SIGTERM (and a second SIGINT within a second) into SIGKILL of its tasks and takes one SIGINT
  as "print the tasks' state": under Slurm its stop TERM goes to the tasks through slurmstepd
  (``scancel --signal=TERM JOBID``: every step but the batch shell, i.e. not supervise).
* ``horovodrun --mpi`` replaces itself with ``/bin/sh -c "mpirun …"``, a shell that passes no
  signal on (TERM kills it and orphans mpirun and the ranks), so the profile walks down to
  mpirun; and after a TERM to mpirun, Horovod's ranks hang in ``MPI_Finalize`` until mpirun's
  SIGKILL, so its stop goes to the ranks themselves.
* OpenMPI ``mpirun`` whose ranks called ``MPI_Init`` (mpi4py, ezpz) behaves the same way: after
  its TERM they save and exit, and mpirun stays until its own SIGKILL at twice the timeout (exit
  1, or 137 when supervise's grace ends first). So when every local rank has ``libmpi`` mapped
  (``/proc/PID/maps``: the evidence that it is an MPI process), the stop goes to the ranks. When
  they die of it (no TERM handler) mpirun aborts and sleeps out that same timer with no rank
  left; once they are gone, the stop ends it with two TERMs (``Targets.finish``, ``aborting``).
* ALCF's ``ezpz launch`` is a Python process around the launcher it composes (``mpiexec``,
  ``mpirun``, ``srun``) that dies of TERM and USR1 and orphans it: its profile looks through it,
  at each message, to that launcher, and routes as that launcher's profile does.

So each launcher gets a :class:`LauncherProfile` that says where each message goes: to the
launcher pid (``'launcher'``), to the rank processes found below it (``'ranks'``; for the stop,
``'local-ranks'``: the ranks when all of them are on this node, else the launcher), or nowhere
but the request file (``'file'``; the request file is always written as well). Ranks are
found from ``/proc`` (:mod:`supervisor.proctree`): a rank is the first process below the
launcher, past shells, container runtimes and MPI daemons, whose environment carries a rank
variable the launcher sets (``OMPI_COMM_WORLD_RANK``, ``LOCAL_RANK``, ``HOROVOD_RANK``, …).
Before a checkpoint signal is sent, :meth:`LauncherProfile.checkpoint_targets` checks in
``/proc/PID/status`` that every target catches it: the default action of SIGUSR1 is to die,
and a script that never installed a handler must get the file, not a fatal signal.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from supervisor import proctree
from supervisor.proctree import ProcInfo
from supervisor.sched import SRUN_RANK_VARIABLES


# Processes that stand between a launcher and the real rank: walk through them.
_WRAPPERS = frozenset({
    "sh", "bash", "dash", "zsh", "ksh", "env", "numactl", "taskset", "nice", "ionice", "stdbuf",
    "timeout", "nohup", "time", "chrt", "singularity", "apptainer", "starter", "starter-suid",
    "orted", "prted", "prte", "hydra_pmi_proxy", "pmi_proxy", "ssh", "rsh",
})
_WRAPPER_PREFIXES = ("Apptainer", "Singularity", "apptainer", "singularity")
_RANK_VARS_MPI = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "PALS_RANKID")
_RANK_VARS_TORCH = ("RANK", "LOCAL_RANK")


@dataclass(frozen=True)
class Targets:
    """Where one message goes now: the pids to signal, and the ones left out and why.

    An empty ``pids`` means "the request file only". ``skipped`` is for the journal.
    ``finish``: for a stop sent to the ranks, the launcher to end once they are gone, if it
    then only waits out its own kill timer (OpenMPI's mpirun: ``aborting``).
    """

    route: str
    pids: frozenset[int]
    skipped: Mapping[int, str] = field(default_factory=dict)
    finish: int | None = None


@dataclass(frozen=True)
class LauncherProfile:
    """How "checkpoint now" and "stop" reach every rank under one kind of launcher."""

    name: str
    checkpoint_route: str
    checkpoint_signal: signal.Signals
    stop_route: str
    stop_signal: signal.Signals
    programs: tuple[str, ...] = ()        # argv basenames that are this launcher
    modules: tuple[str, ...] = ()         # ``python -m MODULE`` forms
    rank_vars: tuple[str, ...] = ()       # env vars only a rank has
    env_from_grace: Mapping[str, Callable[[float], str]] = field(default_factory=dict)
    note: str = ""                         # one line for docs and `supervise check`
    stop_steps: bool = False               # under Slurm the stop signal goes to the job's steps (scancel --signal)
    stop_route_mpi: str = ""               # the stop route when every local rank has libmpi mapped (MPI_Init)
    wraps: bool = False                    # a launcher around another (ezpz launch): route as the one below

    def child_env(self, grace: float) -> dict[str, str]:
        """Variables that make the launcher's own kill timer fit inside our ``--grace``.

        Without them mpiexec gives the ranks 1 s and torchrun 30 s, whatever we were told.
        """
        return {k: fn(grace) for k, fn in self.env_from_grace.items()}

    def find_launcher(self, pid: int, procs: list[ProcInfo] | None = None) -> int:
        """The pid of the launcher process itself: ``pid`` or, when ``pid`` is a wrapper
        (``singularity exec``, a shell), the shallowest descendant that runs the launcher."""
        if not self.programs and not self.modules:
            return pid
        procs = proctree.all_processes() if procs is None else procs
        children = _children(procs)
        queue = deque([pid])
        seen: set[int] = set()
        while queue:
            p = queue.popleft()
            if p in seen:
                continue
            seen.add(p)
            if _runs(_cmdline(p), self.programs, self.modules):
                return p
            queue.extend(children.get(p, ()))
        return pid

    def ranks(self, launcher_pid: int) -> set[int]:
        """The training processes below the launcher on this node (best effort).

        Not the launcher's helpers (orted, hydra_pmi_proxy, a shell, a container runtime),
        not a rank's own children (data loader workers inherit the rank's environment).
        Processes that exit meanwhile are simply absent.
        """
        if self.wraps:
            inner = self.inner(launcher_pid)
            return inner[0].ranks(inner[1]) if inner else set()
        procs = proctree.all_processes()
        if self.name == "python":
            return {launcher_pid} if proctree.alive(launcher_pid) else set()
        root = self.find_launcher(launcher_pid, procs)
        children = _children(procs)
        state = {p.pid: p.state for p in procs}
        if self.name == "csrun":
            return _first_below(root, children, lambda pid: _base(_cmdline(pid)) == "srun", state) or \
                _first_below(root, children, lambda pid: not _is_wrapper(pid), state)
        rank_vars = self.rank_vars or _RANK_VARS_MPI + _RANK_VARS_TORCH + ("HOROVOD_RANK",)
        root_key = _env_key(root, rank_vars)
        found: set[int] = set()
        direct = set(children.get(root, ()))
        queue = deque(direct)
        while queue:
            pid = queue.popleft()
            if state.get(pid) == "Z":
                continue
            key = _env_key(pid, rank_vars)
            keyed = bool(key) and key != root_key
            if keyed and not _is_wrapper(pid):
                found.add(pid)
                continue
            below = [c for c in children.get(pid, ()) if state.get(c) != "Z"]
            if keyed and not below:
                found.add(pid)  # a wrapper whose rank we cannot see: it forwards signals
                continue
            if key is None and pid in direct and not _is_wrapper(pid):
                found.add(pid)  # environment unreadable: a direct child is the best guess
                continue
            queue.extend(below)
        return found

    def inner(self, launcher_pid: int) -> tuple[LauncherProfile, int] | None:
        """For a launcher that wraps another (``wraps``): the profile and pid of the launcher
        it started, detected from that process's command line; None until it runs."""
        pid = self.find_launcher(launcher_pid)
        argv = _cmdline(pid)
        if pid == launcher_pid or not argv or "--help" in argv:  # ezpz runs `mpirun --help` to probe its flags
            return None
        found = _detect(unwrap(argv))
        return None if found.wraps or found.name in ("python", "generic") else (found, pid)

    def _launcher_alive(self, launcher_pid: int) -> int | None:
        pid = self.find_launcher(launcher_pid)
        return pid if proctree.alive(pid) else (launcher_pid if proctree.alive(launcher_pid) else None)

    def checkpoint_targets(self, launcher_pid: int, sig: signal.Signals | None = None) -> Targets:
        """The pids to send "checkpoint now" to, now; empty means the request file only.

        A process that does not catch ``sig`` would die of it (SIGUSR1's default action),
        so it is left out, and on the ``'launcher'`` route one such local rank keeps the
        signal from the launcher too, since the launcher would forward it to that rank.
        """
        sig = sig or self.checkpoint_signal
        skipped: dict[int, str] = {}
        if self.wraps:
            inner = self.inner(launcher_pid)
            if inner is None:
                return Targets("file", frozenset(), {launcher_pid: f"no launcher below {self.name} yet"})
            return inner[0].checkpoint_targets(inner[1], sig)
        if self.checkpoint_route == "file":
            return Targets("file", frozenset())
        if self.checkpoint_route == "launcher":
            pid = self._launcher_alive(launcher_pid)
            if pid is None:
                return Targets("launcher", frozenset(), {launcher_pid: "launcher gone"})
            ranks = self.ranks(launcher_pid) - {pid}
            if not catches(pid, sig):
                skipped[pid] = f"launcher does not handle {sig.name}"
            for r in ranks:
                if not catches(r, sig):
                    skipped[r] = f"rank does not handle {sig.name}; the launcher would forward it"
            return Targets("launcher", frozenset() if skipped else frozenset({pid}), skipped)
        pids = set()
        for r in self.ranks(launcher_pid):
            if catches(r, sig):
                pids.add(r)
            else:
                skipped[r] = f"rank does not handle {sig.name}"
        return Targets("ranks", frozenset(pids), skipped)

    def stop_targets(self, launcher_pid: int) -> Targets:
        """The pids to send the stop signal to (once). Falls back to the launcher when no
        rank is found, so a stop always reaches somebody.

        ``'local-ranks'`` is ``'ranks'`` when every rank the launcher started (its ``-np``) is
        below it on this node, else ``'launcher'``: horovodrun --gloo SIGKILLs its ranks 5 s
        after its own TERM (a constant), so TERMing the ranks themselves gives them the whole
        grace; ranks on other hosts are reached only through horovodrun.

        ``stop_route_mpi`` (OpenMPI): when every rank found here has ``libmpi`` mapped, i.e.
        called ``MPI_Init``, the stop goes to the ranks: TERMed, mpirun would hold them (and
        itself) until its own SIGKILL. Ranks on other nodes learn of the stop through the
        training's collective on the stop flag, as under ``horovodrun --mpi``. ``finish`` is
        then mpirun: when a rank died of the TERM (no handler) or failed, mpirun aborts and
        sleeps out 2 × ``odls_base_sigkill_timeout`` with no rank left to kill; the stop ends
        it once its ranks are gone (``aborting``, ``Child.stop``).
        """
        if self.wraps:
            inner = self.inner(launcher_pid)
            if inner is not None:
                return inner[0].stop_targets(inner[1])
            return Targets("launcher", frozenset({launcher_pid}))
        if self.stop_route_mpi:
            ranks = self.ranks(launcher_pid)
            if ranks and all(maps_libmpi(r) for r in ranks):
                return Targets(self.stop_route_mpi, frozenset(ranks), finish=self._launcher_alive(launcher_pid))
        if self.stop_route in ("ranks", "local-ranks"):
            ranks = self.ranks(launcher_pid)
            if ranks and self.stop_route == "local-ranks":
                started = _num_proc(launcher_pid, self)
                ranks = ranks if started is not None and len(ranks) >= started else set()
            if ranks:
                return Targets("ranks", frozenset(ranks))
        pid = self._launcher_alive(launcher_pid) or launcher_pid
        return Targets("launcher", frozenset({pid}))


def _num_proc(launcher_pid: int, profile: LauncherProfile) -> int | None:
    """The launcher's ``-np N`` / ``--num-proc N`` (horovodrun's spelling); None when it is
    absent or not a positive number."""
    argv = _cmdline(profile.find_launcher(launcher_pid))
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in ("-np", "--num-proc"):
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            return int(value) if value.isdigit() and int(value) > 0 else None
    return None


# --- /proc helpers; every one tolerates the process being gone ---

def _children(procs: list[ProcInfo]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for p in procs:
        out.setdefault(p.ppid, []).append(p.pid)
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        raw = (proctree.PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _comm(pid: int) -> str:
    info = proctree.read_stat(pid)
    return info.comm if info else ""


def _base(argv: Sequence[str]) -> str:
    return os.path.basename(argv[0]) if argv else ""


def _is_wrapper(pid: int) -> bool:
    comm = _comm(pid)
    return comm in _WRAPPERS or comm.startswith(_WRAPPER_PREFIXES) or _base(_cmdline(pid)) in _WRAPPERS


def _env_key(pid: int, names: Sequence[str]) -> tuple[tuple[str, str], ...] | None:
    """The rank variables in the process's environment; None when it cannot be read."""
    try:
        raw = (proctree.PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    wanted = set(names)
    out = []
    for item in raw.split(b"\0"):
        k, _, v = item.partition(b"=")
        name = k.decode("utf-8", "replace")
        if name in wanted:
            out.append((name, v.decode("utf-8", "replace")))
    return tuple(sorted(out))


def _first_below(root: int, children: Mapping[int, list[int]], want: Callable[[int], bool],
                 state: Mapping[int, str]) -> set[int]:
    found: set[int] = set()
    queue = deque(children.get(root, ()))
    while queue:
        pid = queue.popleft()
        if state.get(pid) == "Z":
            continue
        if want(pid):
            found.add(pid)
        else:
            queue.extend(children.get(pid, ()))
    return found


def maps_libmpi(pid: int) -> bool:
    """True when ``pid`` has an MPI library mapped (``libmpi.so``, in ``/proc/PID/maps``).

    Measured under OpenMPI 4.1 ``mpirun``: a rank that ran ``from mpi4py import MPI`` (which
    calls ``MPI_Init``) maps ``libmpi.so.40``; a plain Python rank, a torch/gloo rank, and one
    that only imported the ``mpi4py`` package do not.
    """
    try:
        with open(proctree.PROC / str(pid) / "maps", "rb") as f:
            return any(b"/libmpi.so" in line for line in f)
    except OSError:
        return False


def aborting(pid: int) -> bool | None:
    """OpenMPI's ``mpirun`` is asleep in its kill timer: its main thread in a timed sleep
    (``/proc/PID/wchan`` ``hrtimer_nanosleep``, or ``/proc/PID/syscall`` nanosleep/clock_nanosleep).

    Measured under OpenMPI 4.1: running, or waiting for its ranks, mpirun's main thread polls
    (``poll_schedule_timeout``, syscall 7); once a rank died of a signal or exited non-zero it
    aborts the job and sleeps ``odls_base_sigkill_timeout`` twice (SIGCONT, sleep, SIGTERM,
    sleep, SIGKILL), even with no rank left, and only then exits. None when neither file tells.
    """
    try:
        wchan = (proctree.PROC / str(pid) / "wchan").read_text().strip()
    except OSError:
        return None
    if wchan and wchan != "0":
        return "nanosleep" in wchan
    try:
        nr = (proctree.PROC / str(pid) / "syscall").read_text().split()[0]
    except (OSError, IndexError):
        return None
    return nr in _SLEEP_SYSCALLS if nr.lstrip("-").isdigit() else None


# nanosleep, clock_nanosleep (x86_64; aarch64: 101, 115)
_SLEEP_SYSCALLS = {"35", "230"} if os.uname().machine == "x86_64" else {"101", "115"}


def catches(pid: int, sig: int) -> bool:
    """True when ``pid`` has a handler for ``sig`` (SigCgt in /proc/PID/status).

    A Python process that called ``signal.signal(sig, handler)`` shows up here, so this is
    how we know that ``supervisor.training`` (or the user's own handler) is in place.
    """
    try:
        text = (proctree.PROC / str(pid) / "status").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    return False


def _runs(argv: Sequence[str], programs: Sequence[str], modules: Sequence[str]) -> bool:
    """True when ``argv`` runs one of ``programs`` (directly or as a python script) or
    ``python -m`` one of ``modules``."""
    if not argv:
        return False
    if _base(argv) in programs:
        return True
    if _is_python(argv[0]):
        rest = list(argv[1:])
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest.pop(0)
        if len(rest) >= 2 and rest[0] == "-m" and rest[1] in modules:
            return True
        if rest and os.path.basename(rest[0]) in programs:
            return True
    return False


def _is_python(arg: str) -> bool:
    b = os.path.basename(arg)
    return b in ("python", "python3", "pypy", "pypy3") or (b.startswith("python3.") and b[8:].replace(".", "").isdigit())


# --- how long the launcher's own kill timer should be ---

def _launcher_grace(grace: float) -> int:
    """Whole seconds, a little short of ours, so the launcher's SIGKILL comes before our
    own SIGKILL of the whole tree and the launcher can report and clean up."""
    margin = min(5.0, max(2.0, 0.2 * grace))
    return max(1, int(grace - margin))


def _ompi_sigkill_timeout(grace: float) -> str:
    # OpenMPI sends SIGTERM only after this timeout and SIGKILL after twice it.
    return str(max(1, _launcher_grace(grace) // 2))


def _torch_timeout(grace: float) -> str:
    return str(_launcher_grace(grace))


_OMPI_ENV = {"OMPI_MCA_odls_base_sigkill_timeout": _ompi_sigkill_timeout}
_MPI_PROGRAMS = ("mpiexec", "mpirun", "orterun", "prterun", "mpiexec.openmpi", "mpirun.openmpi",
                 "mpiexec.hydra", "mpiexec.mpich", "mpirun.mpich", "mpiexec.mpd", "aprun")
USR1, TERM = signal.SIGUSR1, signal.SIGTERM


def _p(name: str, ckpt: str, stop: str, **kw: object) -> LauncherProfile:
    return LauncherProfile(name=name, checkpoint_route=ckpt, checkpoint_signal=USR1, stop_route=stop,
                           stop_signal=TERM, **kw)  # type: ignore[arg-type]


PROFILES: Mapping[str, LauncherProfile] = {p.name: p for p in (
    replace(_p("mpiexec-openmpi", "launcher", "launcher", programs=_MPI_PROGRAMS,
               rank_vars=("OMPI_COMM_WORLD_RANK", "PMIX_RANK"), env_from_grace=_OMPI_ENV,
               note="forwards USR1/USR2 to every rank; a second TERM orphans the ranks; ranks that called "
                    "MPI_Init (libmpi mapped) get the stop TERM themselves: after mpirun's they wait for its SIGKILL; "
                    "once they are gone, an aborting mpirun gets two TERMs"),
            stop_route_mpi="ranks"),
    _p("mpiexec-hydra", "ranks", "launcher", programs=_MPI_PROGRAMS, rank_vars=("PMI_RANK",),
       note="MPICH Hydra: USR1 forwarding not relied on; local ranks signalled, others read the file"),
    _p("mpiexec-pals", "ranks", "launcher", programs=_MPI_PROGRAMS, rank_vars=("PALS_RANKID", "PMI_RANK"),
       note="Cray PALS (Polaris, Aurora): local ranks signalled, other nodes read the file"),
    _p("mpiexec", "ranks", "launcher", programs=_MPI_PROGRAMS, rank_vars=_RANK_VARS_MPI,
       env_from_grace=_OMPI_ENV, note="MPI of unknown flavour: the cautious choices"),
    replace(_p("srun", "launcher", "launcher", programs=("srun",), rank_vars=SRUN_RANK_VARIABLES,
               note="forwards USR1; a TERM or a second INT to srun is SIGKILL of the tasks, one INT only prints "
                    "their state: the stop TERM goes to the tasks through Slurm (scancel --signal=TERM JOBID)"),
            stop_steps=True),
    _p("torchrun", "ranks", "launcher", programs=("torchrun",),
       modules=("torch.distributed.run", "torch.distributed.launch"), rank_vars=_RANK_VARS_TORCH,
       env_from_grace={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": _torch_timeout},
       note="dies on USR1 and orphans its workers: USR1 goes to the workers"),
    _p("deepspeed", "ranks", "launcher", programs=("deepspeed", "ds"),
       modules=("deepspeed.launcher.runner", "deepspeed.launcher.launch"), rank_vars=_RANK_VARS_TORCH,
       note="the runner dies on USR1: USR1 goes to the ranks"),
    _p("horovodrun-gloo", "ranks", "local-ranks", programs=("horovodrun",),
       modules=("horovod.runner.launch",), rank_vars=("HOROVOD_RANK",),
       note="dies on USR1 (its ranks get TERM, then KILL 5 s later): USR1 goes to the ranks; "
            "TERM to the ranks when all -np are on this node (its own TERM kills them after 5 s), "
            "else to horovodrun, which reaches every host"),
    _p("horovodrun-mpi", "launcher", "ranks", programs=("horovodrun", "mpirun", "mpiexec"),
       modules=("horovod.runner.launch",), rank_vars=("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"),
       env_from_grace=_OMPI_ENV,
       note="a /bin/sh around mpirun: USR1 to mpirun; TERM to the ranks (after mpirun's TERM they "
            "hang in MPI_Finalize until its SIGKILL)"),
    _p("horovodrun", "ranks", "ranks", programs=("horovodrun", "mpirun", "mpiexec"),
       modules=("horovod.runner.launch",), rank_vars=("HOROVOD_RANK",) + _RANK_VARS_MPI,
       env_from_grace=_OMPI_ENV, note="mode unknown (gloo or MPI): safe in both"),
    replace(_p("csrun", "file", "ranks", programs=("csrun_wse", "csrun_cpu"),
               note="bash scripts around srun + singularity: stop goes to their srun's tasks through Slurm"),
            stop_steps=True),
    replace(_p("ezpz", "file", "launcher", programs=_MPI_PROGRAMS + ("srun",), env_from_grace=_OMPI_ENV,
               note="ALCF's ezpz launch, a Python process around the mpiexec/mpirun/srun it composes (it dies "
                    "of TERM and USR1): routed as the launcher below it"),
            wraps=True),
    _p("python", "launcher", "launcher", note="the child is the one rank"),
    _p("generic", "file", "launcher", note="unknown launcher: the request file only"),
)}

# Config.launcher names (coarse) → profile, when argv does not say more.
_OVERRIDE_DEFAULT = {"horovodrun": "horovodrun", "mpiexec": "mpiexec", "srun": "srun", "torchrun": "torchrun",
                     "deepspeed": "deepspeed", "csrun": "csrun", "python": "python", "generic": "generic"}
_EZPZ_LAUNCH = ("ezpz-launch",)
_EZPZ_MODULES = ("ezpz.launch",)


# --- detection from argv ---

# Wrapper → options that take a value (as a separate word).
_SING_VALUE_OPTS = frozenset({"-B", "--bind", "--mount", "--env", "--env-file", "-H", "--home", "--overlay", "-o",
                              "--pwd", "-W", "--workdir", "-S", "--scratch", "--security", "--network",
                              "--network-args", "--hostname", "--app", "--dns", "--apply-cgroups", "--add-caps",
                              "--drop-caps", "--config", "--fusemount", "--cpus", "--memory", "--passphrase"})
_NUMACTL_VALUE_OPTS = frozenset({"-i", "--interleave", "-m", "--membind", "-N", "--cpunodebind", "-C",
                                 "--physcpubind", "-p", "--preferred", "-w", "--weighted-interleave"})


def unwrap(argv: Sequence[str]) -> list[str]:
    """Strip ``env VAR=…``, ``singularity/apptainer exec IMG``, ``numactl …`` and similar
    wrappers, repeatedly, and return the command they run."""
    argv = list(argv)
    for _ in range(16):
        if not argv:
            return argv
        b = os.path.basename(argv[0])
        rest = argv[1:]
        if b == "env":
            i = 0
            while i < len(rest) and (rest[i].startswith("-") or "=" in rest[i]):
                i += 2 if rest[i] in ("-u", "--unset", "-C", "--chdir") else 1
            argv = rest[i:]
        elif b in ("singularity", "apptainer"):
            if not rest or rest[0] not in ("exec", "run"):
                return argv
            i = 1
            while i < len(rest) and rest[i].startswith("-"):
                i += 2 if rest[i] in _SING_VALUE_OPTS else 1
            argv = rest[i + 1:]  # skip the image
        elif b == "numactl":
            i = 0
            while i < len(rest) and rest[i].startswith("-"):
                i += 2 if rest[i] in _NUMACTL_VALUE_OPTS else 1
            argv = rest[i:]
        elif b == "taskset":
            i = 0
            while i < len(rest) and rest[i].startswith("-"):
                i += 1
            argv = rest[i + 1:]  # skip the mask / cpu list
        elif b in ("nice", "ionice", "chrt"):
            i = 0
            while i < len(rest) and rest[i].startswith("-"):
                i += 2 if rest[i] in ("-n", "-c", "--adjustment", "--class", "--classdata", "-p") else 1
            if b == "chrt" and i < len(rest):
                i += 1  # priority
            argv = rest[i:]
        elif b in ("nohup", "time", "stdbuf"):
            i = 0
            while i < len(rest) and rest[i].startswith("-"):
                i += 2 if rest[i] in ("-i", "-o", "-e") else 1
            argv = rest[i:]
        elif b == "timeout":
            i = 0
            while i < len(rest) and rest[i].startswith("-"):
                i += 2 if rest[i] in ("-s", "--signal", "-k", "--kill-after") else 1
            argv = rest[i + 1:]  # skip the duration
        else:
            return argv
    return argv


def _mpi_flavour(argv: Sequence[str], which: Callable[[str], str | None] = shutil.which) -> str:
    """OpenMPI, MPICH Hydra or Cray PALS, from the name, the installed binary, or the flags."""
    b = os.path.basename(argv[0])
    if b in ("orterun", "prterun", "mpiexec.openmpi", "mpirun.openmpi"):
        return "mpiexec-openmpi"
    if b in ("mpiexec.hydra", "mpiexec.mpich", "mpirun.mpich"):
        return "mpiexec-hydra"
    if b == "aprun":
        return "mpiexec-pals"
    path = argv[0] if os.sep in argv[0] else which(argv[0])
    if path:
        real = Path(os.path.realpath(path))
        if real.name in ("orterun", "prterun", "mpiexec.openmpi", "mpirun.openmpi"):
            return "mpiexec-openmpi"
        if real.name in ("mpiexec.hydra", "mpiexec.mpich", "mpirun.mpich"):
            return "mpiexec-hydra"
        if "pals" in str(real).lower():
            return "mpiexec-pals"
        for d in {real.parent, Path(path).parent}:
            if (d / "ompi_info").exists() or (d / "prte").exists():
                return "mpiexec-openmpi"
            if (d / "hydra_pmi_proxy").exists():
                return "mpiexec-hydra"
    flags = set(argv[1:])
    if flags & {"--mca", "-mca", "--oversubscribe", "--map-by", "-npernode", "--npernode", "--prtemca"}:
        return "mpiexec-openmpi"
    if flags & {"--depth", "-d", "--cpu-bind"} and "--ppn" in flags:
        return "mpiexec-pals"
    return "mpiexec"


def _horovod_mode(argv: Sequence[str]) -> str:
    if "--gloo" in argv:
        return "horovodrun-gloo"
    if "--mpi" in argv:
        return "horovodrun-mpi"
    return "horovodrun"


def detect(argv: Sequence[str], override: str = "auto") -> LauncherProfile:
    """The profile for the training command ``argv``.

    ``override`` is ``Config.launcher``: ``'auto'`` reads argv; a coarse name (``mpiexec``,
    ``horovodrun``) is refined from argv when argv agrees; a profile name is taken as is.
    """
    cmd = unwrap(argv)
    found = _detect(cmd)
    if override in ("", "auto"):
        return found
    if override in PROFILES and override not in _OVERRIDE_DEFAULT:
        return PROFILES[override]
    if override == "mpiexec" and (found.name.startswith("mpiexec") or found.name == "ezpz"):
        return found
    if override == "horovodrun" and found.name.startswith("horovodrun"):
        return found
    if override in _OVERRIDE_DEFAULT:
        return PROFILES[_OVERRIDE_DEFAULT[override]]
    raise ValueError(f"unknown launcher {override!r}; one of auto, " + ", ".join(sorted(PROFILES)))


def _detect(cmd: Sequence[str]) -> LauncherProfile:
    if not cmd:
        return PROFILES["generic"]
    b = os.path.basename(cmd[0])
    if b in _MPI_PROGRAMS:
        return PROFILES[_mpi_flavour(cmd)]
    if b == "horovodrun":
        return PROFILES[_horovod_mode(cmd)]
    if b in ("csrun_wse", "csrun_cpu"):
        return PROFILES["csrun"]
    if _is_ezpz_launch(cmd):
        return PROFILES["ezpz"]
    for name in ("srun", "torchrun", "deepspeed"):
        if _runs(cmd, PROFILES[name].programs, PROFILES[name].modules):
            return PROFILES[name]
    if _runs(cmd, ("horovodrun",), ("horovod.runner.launch",)):
        return PROFILES[_horovod_mode(cmd)]
    if _is_python(cmd[0]):
        return PROFILES["python"]
    return PROFILES["generic"]


def _is_ezpz_launch(cmd: Sequence[str]) -> bool:
    """``ezpz launch …`` (the console script, or ``python …/bin/ezpz launch``), ``ezpz-launch``,
    ``python -m ezpz.launch``."""
    if _runs(cmd, _EZPZ_LAUNCH, _EZPZ_MODULES):
        return True
    rest = list(cmd)
    if rest and _is_python(rest[0]):
        rest.pop(0)
        while rest and rest[0].startswith("-"):
            rest.pop(0)
    if not rest or os.path.basename(rest[0]) != "ezpz":
        return False
    args = [a for a in rest[1:] if not a.startswith("-")]
    return bool(args) and args[0] == "launch"


# --- what the command asks of the job: nodes and ranks per node (supervise init, supervise check) ---

_PER_NODE_OPTS = frozenset({"--nproc-per-node", "--nproc_per_node", "--ppn", "-ppn", "--npernode", "-npernode",
                            "--ntasks-per-node", "--num_gpus", "--num-gpus"})
_TOTAL_OPTS = frozenset({"-n", "-np", "--np", "--n", "--ntasks"})
_NODES_OPTS = frozenset({"--nnodes", "--nodes", "--num_nodes", "--num-nodes"})


def launcher_options(argv: Sequence[str]) -> list[tuple[str, str]]:
    """The launcher's own ``(option, value)`` pairs, ``--opt=value`` and ``--opt value`` alike
    (every option is paired with the word after it: callers only read options that take one),
    up to the program it runs: a Python interpreter, a ``.py`` script, ``-m`` or ``--``. A
    launcher run as a module (``python -m torch.distributed.run …``) is read after its name."""
    cmd = unwrap(argv)
    start = 1
    if cmd and _is_python(cmd[0]):
        while start < len(cmd) and cmd[start].startswith("-") and cmd[start] != "-m":
            start += 1
        if start + 1 >= len(cmd) or cmd[start] != "-m":
            return []  # python train.py: no launcher options
        start += 2
    out: list[tuple[str, str]] = []
    for i, w in enumerate(cmd[start:], start):
        if w in ("--", "-m") or _is_python(w) or w.endswith(".py"):
            break
        if w.startswith("-"):
            name, eq, value = w.partition("=")
            out.append((name, value) if eq else (w, cmd[i + 1] if i + 1 < len(cmd) else ""))
    return out


def _count(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


def command_nodes(argv: Sequence[str]) -> int | None:
    """The nodes the command asks for (``torchrun --nnodes 2`` or ``1:4``, the upper bound;
    ``srun -N 2``/``--nodes``; ``deepspeed --num_nodes``; ``horovodrun -H a:4,b:4``), or None."""
    srun = os.path.basename(unwrap(argv)[0]) == "srun" if argv else False
    for name, value in launcher_options(argv):
        if name in _NODES_OPTS or (srun and name == "-N"):
            n = _count(value.rpartition(":")[2])
            if n is not None:
                return n
        if name in ("-H", "--hosts") and value:
            return len([h for h in value.split(",") if h.strip()])
    return None


def command_ranks_per_node(argv: Sequence[str], nodes: int | None) -> int | None:
    """Ranks (one a GPU) per node the command starts: ``--nproc-per-node``/``--nproc_per_node``
    (torchrun), ``--ppn``/``--npernode`` and ``--map-by ppr:N:node`` (mpiexec),
    ``--ntasks-per-node`` (srun), ``--num_gpus`` (deepspeed); else ``-n``/``-np`` (the world
    size) over ``nodes`` when they divide; None when it does not say (``--nproc-per-node gpu``)."""
    total = None
    for name, value in launcher_options(argv):
        if name in _PER_NODE_OPTS:
            return _count(value)
        m = re.fullmatch(r"ppr:(\d+):node", value) if name == "--map-by" else None
        if m:
            return _count(m.group(1))
        if name in _TOTAL_OPTS:
            total = _count(value)
    if total is not None and nodes and total % nodes == 0:
        return total // nodes
    return None
