"""The supervised child: spawn, signal routing, stopping the whole tree, exit status.

The child runs in its own session (so a terminal's or a scheduler's signal to our group
does not reach it behind our back) with stdio passed through untouched. The supervisor
is a child subreaper, so processes the launcher orphans are re-parented to us rather than
to init: we can still find and stop them, and we reap them ourselves. We only ever reap
those orphans by pid, never with ``waitpid(-1)``, so the event loop's child watcher keeps
the launcher's own exit status (and the statuses of our helper processes such as rsync).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import secrets
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import anyio

from supervisor import childenv, keeper, proctree
from supervisor.launchers import aborting
from supervisor._units import signal_name
from supervisor.journal import EVENTS_FILE

log = logging.getLogger("supervise")

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
# The training's launcher gets TERM when we die, as on a preemption: launchers (torchrun,
# srun, mpirun) take their ranks down on it. KILL would end the launcher alone and leave
# its ranks orphaned; our own helpers (copiers, samplers) get KILL.
TRAINING_DEATH_SIGNAL = signal.SIGTERM
# Kept at their defaults: the kernel's fault reports, and what the runtime itself needs.
_LEFT_ALONE = frozenset(getattr(signal, n) for n in (
    "SIGKILL", "SIGSTOP", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGTRAP", "SIGSYS",
    "SIGCHLD", "SIGCONT", "SIGURG", "SIGWINCH", "SIGPIPE", "SIGXFSZ") if hasattr(signal, n))
# Ending an aborting mpirun whose ranks are gone (Child._finish): how long after its last rank,
# and between its two sightings asleep and its two TERMs.
FINISH_SETTLE, FINISH_GAP = 0.5, 0.2
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


_inherited_fds: tuple[int, ...] = ()


def remember_inherited_fds() -> tuple[int, ...]:
    """Note the descriptors we were started with (call first thing, before any of ours).

    They are passed on to the child: launchers under srun or Hydra find their PMI
    socket through an inherited descriptor (PMI_FD), and a wrapper must not close it.
    """
    global _inherited_fds
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return ()
    keep = []
    for fd in fds:
        if fd > 2:
            try:
                os.fstat(fd)
            except OSError:
                continue  # the descriptor listdir itself used
            keep.append(fd)
    _inherited_fds = tuple(sorted(keep))
    return _inherited_fds


class SpawnError(Exception):
    """The command could not be started; ``exit_status`` is 127 or 126 as a shell would say."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


_libc: ctypes.CDLL | None = None


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, loaded in the parent (a forked child only calls it)."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        return _libc.prctl
    except (OSError, AttributeError):
        return None


def die_with_us(sig: int | None = signal.SIGKILL, *, own_group: bool = False) -> Callable[[], None] | None:
    """A ``preexec_fn``: the child gets ``sig`` when we die, even by SIGKILL; ``own_group``
    also makes it a process-group leader in *our* session.

    Our helpers (copiers, nvidia-smi) lead a group of their own so one killpg ends all they
    fork, but stay in our session: a process of ours in another session is taken for an
    orphan of the training (``Child.tree``), and the stop would wait out the grace for it.
    The kernel sends ``sig`` when the *thread* that forked dies, so it is only for processes
    started from the event loop's thread or from a worker thread that waits for them.
    A parent that died between fork and prctl is caught by comparing the parent pid.
    """
    prctl = _prctl() if sig is not None else None
    parent = os.getpid()

    def preexec() -> None:
        if own_group:
            os.setpgid(0, 0)
        if prctl is not None and sig is not None:
            prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
            if os.getppid() != parent:
                os.kill(os.getpid(), sig)
    return preexec if (own_group or prctl is not None) else None


async def spawn_process(argv: Sequence[str], *, death_signal: int | None = signal.SIGKILL, own_group: bool = False,
                        **kwargs: object) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec`` with a death signal (anyio's open_process takes no
    ``preexec_fn``). supervise always runs on anyio's asyncio backend.

    Shielded: a cancel that lands between fork and the return would leave a process that
    no one holds (asyncio kills only the direct child, not its group, and waits on nothing);
    the caller sees the cancel at its next await, holding the process it must kill.
    """
    with anyio.CancelScope(shield=True):
        proc = await asyncio.create_subprocess_exec(*argv, preexec_fn=die_with_us(death_signal, own_group=own_group),
                                                    **kwargs)  # type: ignore[arg-type]
    return proc


def _ignore_signal(signum: int, frame: object) -> None:
    """A handler, not SIG_IGN: handlers are reset by exec, so children start with defaults."""


def quiet_stray_signals(handled: Iterable[int] = ()) -> list[int]:
    """Give every catchable signal a meaning: those not ``handled`` are ignored.

    Left at their default, ALRM, VTALRM, PROF, XCPU, PWR, IO, STKFLT and the real-time
    signals would kill supervise without an ``end`` and orphan the training, and TSTP,
    TTIN, TTOU would stop it. Faults (SEGV, BUS, ...) keep their default. Returns the
    signals quieted, for the docs and tests.
    """
    keep = set(handled) | set(_LEFT_ALONE)
    quieted = []
    for sig in sorted(signal.valid_signals()):
        if sig in keep:
            continue
        try:
            signal.signal(sig, _ignore_signal)
        except (OSError, ValueError, RuntimeError):
            continue  # reserved by the C library (NPTL's real-time signals)
        quieted.append(int(sig))
    return quieted


def become_subreaper() -> bool:
    """Make orphaned descendants ours (Linux ≥ 3.4). Returns False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def resolve_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The executable's path, or SpawnError with the shell's exit status and one clear line."""
    name = argv[0]
    if os.sep in name:
        path = Path(name)
        if not path.exists():
            raise SpawnError(f"command not found: {name} (no such file)", EXIT_NOT_FOUND)
        if path.is_dir():
            raise SpawnError(f"cannot execute {name}: it is a directory", EXIT_NOT_EXECUTABLE)
        if not os.access(path, os.X_OK):
            raise SpawnError(f"cannot execute {name}: permission denied (chmod +x?)", EXIT_NOT_EXECUTABLE)
        return str(path)
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found is None:
        raise SpawnError(f"command not found: {name} (not on PATH)", EXIT_NOT_FOUND)
    return found


def exit_status(returncode: int) -> int:
    """A shell's convention: 128+N when signal N killed the process."""
    return 128 - returncode if returncode < 0 else returncode


class Keeper:
    """supervise's end of the keeper (``supervisor/keeper.py``): the process that ends the
    training when supervise dies, however it dies (invariant 7 after a ``kill -9``).

    One per supervise process, started before the first launcher: it holds the read end of a
    pipe whose write end only supervise holds (``os.pipe`` descriptors are not inherited), and
    is told each launcher supervise starts. No death signal: it must outlive us. A session of
    its own: a terminal's ^C is not for it, and a PBS MOM without the cgroup hook, which ends a
    job by killing the job's session, cannot cut its work short (it ends once that is done);
    ``Child.tree`` knows it is no orphan of the training.
    """

    def __init__(self, process: asyncio.subprocess.Process, pipe: int, token: str) -> None:
        self.process, self.token, self._pipe = process, token, pipe

    @classmethod
    async def start(cls) -> "Keeper | None":
        """The keeper, running; None (said once in the log) where it cannot start: the training
        then has only its launcher's death signal, as before."""
        token = secrets.token_hex(16)
        read, write = os.pipe()
        try:
            process = await spawn_process([sys.executable, "-I", "-S", keeper.__file__, token], death_signal=None,
                                          start_new_session=True, stdin=read, stdout=asyncio.subprocess.DEVNULL,
                                          stderr=None)
        except OSError as e:
            os.close(write)
            log.warning("cannot start the keeper (%s): a SIGKILL of supervise would leave the training's "
                        "orphans running", e)
            return None
        finally:
            os.close(read)
        return cls(process, write, token)

    def tell(self, pid: int, env: Mapping[str, str]) -> None:
        """A launcher was started: its session and group are the training's too."""
        info = proctree.read_stat(pid)
        run_dir, attempt = env.get(childenv.RUN_DIR, ""), env.get(childenv.ATTEMPT, "0")
        journal = os.path.join(run_dir, EVENTS_FILE) if run_dir and "\n" not in run_dir else ""
        line = f"{pid} {info.start if info is not None else 0} {int(attempt) if attempt.isdigit() else 0} {journal}\n"
        try:
            os.write(self._pipe, os.fsencode(line))
        except OSError as e:  # the keeper is gone: the token still names the training, but no one looks
            log.warning("the keeper is gone (%s): a SIGKILL of supervise would leave the training's orphans running", e)


_keeper: Keeper | None = None
_keeper_tried = False


def keeper_pid() -> int | None:
    """The keeper's pid, once started: a child of ours in another session that is no orphan."""
    return _keeper.process.pid if _keeper is not None else None


async def the_keeper() -> Keeper | None:
    """This process's keeper, started on first use."""
    global _keeper, _keeper_tried
    if not _keeper_tried:
        _keeper_tried = True
        _keeper = await Keeper.start()
    return _keeper


@dataclass(frozen=True)
class Delivery:
    """One signal sent: to whom, by which route (for the journal)."""

    signal: str
    targets: list[int]
    route: str


class Child:
    """One spawned training command and everything it starts.

    Knows the training tree: the child, its process group, its descendants, and orphans
    re-parented to us that are not in our own session (our helpers, such as rsync, are).
    """

    def __init__(self, process: asyncio.subprocess.Process, argv: Sequence[str]) -> None:
        self._process = process
        self.argv = tuple(argv)
        self.pid: int = process.pid
        self.pgid: int = process.pid  # start_new_session makes it a group leader
        self._me = os.getpid()
        self._my_sid = os.getsid(0)
        self._members: set[int] = {self.pid}
        self._returncode: int | None = None
        self.exited = anyio.Event()

    @classmethod
    async def spawn(cls, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None) -> "Child":
        """Start ``argv`` in its own session, stdio inherited. Raises SpawnError (127/126).

        The launcher gets TRAINING_DEATH_SIGNAL if supervise dies (SIGKILL included), and the
        keeper ends everything else of the training then (``Keeper``), so the tree does not
        outlive us even where no cgroup would end it.
        """
        executable = resolve_command(argv, env)
        guard = await the_keeper()
        if guard is not None:
            env = {**env, childenv.TREE_ID: guard.token}
        try:
            process = await spawn_process(
                [executable, *argv[1:]], death_signal=TRAINING_DEATH_SIGNAL, stdin=None, stdout=None, stderr=None,
                env=dict(env), cwd=cwd, start_new_session=True, pass_fds=_inherited_fds,
            )
        except FileNotFoundError:
            raise SpawnError(f"command not found: {argv[0]}", EXIT_NOT_FOUND) from None
        except PermissionError:
            raise SpawnError(f"cannot execute {argv[0]}: permission denied", EXIT_NOT_EXECUTABLE) from None
        except OSError as e:
            if e.errno == errno.ENOEXEC:
                raise SpawnError(f"cannot execute {argv[0]}: not an executable format (missing #! line?)", EXIT_NOT_EXECUTABLE) from None
            raise
        if guard is not None:
            guard.tell(process.pid, env)
        return cls(process, argv)

    # --- status ---

    @property
    def returncode(self) -> int | None:
        return self._settled()

    def _settled(self) -> int | None:
        """The launcher's return code, even when no task awaits ``wait()`` any more (the
        event loop's child watcher records it): an error path that lost the watching task
        must not wait out the grace and the kill bound for an exit that already happened."""
        if self._returncode is None and self._process.returncode is not None:
            self._returncode = self._process.returncode
            self.exited.set()
        return self._returncode

    async def wait(self) -> int:
        """Wait for the launcher itself to exit; returns the shell-style exit status."""
        rc = await self._process.wait()
        self._returncode = rc
        self.exited.set()
        return exit_status(rc)

    def tree(self) -> set[int]:
        """Live processes of the training tree (refreshes the remembered members)."""
        procs = proctree.all_processes()
        by_pid = {p.pid: p for p in procs}
        found = proctree.in_groups({self.pgid}, procs)
        keeper = keeper_pid()
        roots = {self.pid} | {p.pid for p in procs if p.ppid == self._me and p.sid != self._my_sid and p.pid != keeper}
        roots |= {pid for pid in self._members if pid in by_pid}
        for root in roots:
            found.add(root)
            found |= proctree.descendants(root, procs)
        live = {pid for pid in found if pid in by_pid and by_pid[pid].state != "Z" and pid != self._me}
        self._members = (self._members | live) & set(by_pid)
        return live

    def zombie_orphan_waiting(self) -> bool:
        """One cheap syscall: is any child of ours, other than the launcher, a zombie?

        ``WNOWAIT`` peeks without reaping, so the event loop still collects the statuses
        of the processes it started.
        """
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        return info is not None and info.si_pid != self.pid

    def reap_orphans(self) -> list[int]:
        """Collect exited orphans re-parented to us, by pid (never ``waitpid(-1)``)."""
        reaped, keeper = [], keeper_pid()
        for p in proctree.all_processes():
            if p.ppid != self._me or p.pid in (self.pid, keeper) or p.sid == self._my_sid or p.state != "Z":
                continue
            try:
                pid, _ = os.waitpid(p.pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if pid:
                reaped.append(pid)
        return reaped

    # --- signals ---

    def send(self, sig: int, route: str = "launcher") -> Delivery:
        """Send ``sig`` once: to the launcher pid, or to its whole process group."""
        targets: list[int] = []
        if self._returncode is None:
            try:
                if route == "group":
                    os.killpg(self.pgid, sig)
                else:
                    os.kill(self.pid, sig)
                targets.append(self.pid)
            except ProcessLookupError:
                pass
        return Delivery(signal=signal_name(sig), targets=targets, route=route)

    def send_to(self, pids: set[int], sig: int, route: str) -> Delivery:
        """Send ``sig`` to each of ``pids`` (ranks found as descendants, orphans)."""
        sent = []
        for pid in sorted(pids):
            try:
                os.kill(pid, sig)
                sent.append(pid)
            except ProcessLookupError:
                continue
        return Delivery(signal=signal_name(sig), targets=sent, route=route)

    async def stop(self, sig: int, grace: float, *, targets: set[int] | None = None, route: str = "launcher",
                   already_signalled: bool = False, finish: int | None = None) -> dict:
        """Stop signal → up to ``grace`` s → SIGKILL to every process of the tree.

        The launcher gets ``sig`` once (a second TERM makes mpiexec abandon its ranks);
        if the launcher is already gone, leftover tree members get it instead. ``finish``
        (``Targets.finish``, OpenMPI's mpirun when the stop went to its ranks): once every
        target is gone and it is only sleeping out its own kill timer, it gets TERM twice,
        which ends it at once (``_finish``). Returns what happened, for the journal.
        """
        result: dict = {"signal": signal_name(sig), "grace_s": grace, "killed": [], "sent_to": []}
        if self._settled() is not None and not self.tree():
            result["graceful"] = True  # it ended by itself and left nothing behind
            return result
        if not already_signalled:
            if self._returncode is None and targets:
                result["sent_to"] = self.send_to(targets, sig, route).targets
                result["route"] = route
            elif self._returncode is None:
                result["sent_to"] = self.send(sig, route).targets
                result["route"] = route
            else:
                leftovers = self.tree()
                result["sent_to"] = self.send_to(leftovers, sig, "leftovers").targets
        finishing = finish is not None and bool(targets) and not already_signalled and bool(result["sent_to"])
        gone_at: float | None = None
        finished_at: float | None = None
        with anyio.move_on_after(grace):
            while True:
                self.reap_orphans()
                if self._settled() is not None and not self.tree():
                    break
                if finishing and targets is not None and finish is not None:
                    if gone_at is None and not any(proctree.alive(p) for p in targets):
                        gone_at = time.monotonic()
                    if gone_at is not None and await self._finish(finish, time.monotonic() - gone_at, sig, result):
                        finishing, finished_at = False, time.monotonic()
                if finished_at is not None and "finished" in result and time.monotonic() - finished_at >= FINISH_SETTLE:
                    finished_at = None
                    # what mpirun left behind: its rsh agents (pbs_tmrsh, ssh) to daemons on other nodes, which
                    # sleep out the same timer; they had no signal yet, and get this one once
                    leftovers = self.tree() - set(targets or ())
                    if self._settled() is not None and leftovers:
                        result["finished"]["leftovers"] = self.send_to(leftovers, sig, "leftovers").targets
                await anyio.sleep(0.05)
        result["graceful"] = self._settled() is not None and not self.tree()
        if not result["graceful"]:
            result["killed"] = await self.kill_all()
        return result

    async def _finish(self, pid: int, since: float, sig: int, result: dict) -> bool:
        """OpenMPI's mpirun after its ranks got the stop and are gone: when a rank died of it (a
        training without a TERM handler) or failed, mpirun aborts the job and sleeps out
        2 × ``odls_base_sigkill_timeout`` (half the grace) before it exits, with no rank left:
        measured 52 s for T = 27 (docs/launchers.md), past what the stop has. One TERM then only
        prints "abort is already in progress"; a second ends it at once (exit 1, 0.2 s), harmless
        now that its ranks are gone. Done only once mpirun is seen asleep in that timer
        (``launchers.aborting``) ``FINISH_SETTLE`` s after its last rank, so a mpirun that is
        exiting by itself (ranks that saved and exited 0), or one that waits for ranks on other
        nodes, keeps its own way; where /proc does not tell, nothing is sent (its timer, then the
        grace, end it as before). True once done (or the launcher is gone)."""
        if not proctree.alive(pid):
            return True
        asleep = aborting(pid) if since >= FINISH_SETTLE else False
        if asleep:  # its kill timer sleeps T ≥ 1 s: seen asleep twice, not in a short sleep of its own exit
            await anyio.sleep(FINISH_GAP)
            asleep = aborting(pid)
            if not asleep:
                return not proctree.alive(pid)
        if not asleep:
            return False
        sent = 0
        for _ in range(2):
            if not proctree.alive(pid):
                break
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            sent += 1
            await anyio.sleep(FINISH_GAP)
        result["finished"] = {"pid": pid, "signals": sent, "after_ranks_s": round(since, 3),
                              "why": "aborting: asleep in its kill timer"}
        log.info("the launcher %d outlived its ranks by %.1f s in its own kill timer: %d %s sent to end it",
                 pid, since, sent, signal_name(sig))
        return True

    async def kill_all(self, bound: float = 10.0) -> list[int]:
        """SIGKILL the group and every member until none is left (bounded)."""
        killed: set[int] = set()
        with anyio.move_on_after(bound):
            while True:
                live = self.tree()
                try:
                    os.killpg(self.pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                killed.update(self.send_to(live, signal.SIGKILL, "kill").targets)
                self.reap_orphans()
                if not live and self._settled() is not None:
                    break
                await anyio.sleep(0.02)
        return sorted(killed)
