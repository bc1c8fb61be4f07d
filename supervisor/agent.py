"""The conductor: one task group, the parts, and the one stop sequence.

Data flows one way: Config → Agent → parts → Journal. Parts never import each other;
the agent wires them and owns every decision about stopping. The run moves through
named states (``starting → running → stopping → stopped``), and every transition and
every stop step is a journal event, so the report (and the next attempt's deadline
learning) can tell exactly what happened and how long each step took.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

import anyio
from anyio.abc import TaskStatus

from supervisor import __version__, logs
from supervisor._units import format_duration, signal_name
from supervisor.child import Child, SpawnError, exit_status
from supervisor.config import Config, public_view
from supervisor.journal import Journal, next_attempt, redact_env

log = logging.getLogger("supervise")

# Signals we take in. Stop signals start the stop sequence; the others are passed on.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
PASS_SIGNALS = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
SCHEDULER_ENV_PREFIXES = ("SLURM_", "PBS_", "SUPERVISE_", "CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD", "PMI_", "CS_")
REQUEST_FILE = "checkpoint.request"
PART_RESTART_LIMIT = 5


class State(str, enum.Enum):
    """The worker group's states, as torch.distributed.elastic names its own."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Reason(str, enum.Enum):
    """Why the run ended. Each is distinct in the journal and in the report."""

    CHILD_EXIT = "child-exit"  # the training ended by itself with status 0
    CHILD_FAILED = "child-failed"  # the training ended by itself with a non-zero status
    SIGNAL = "signal"  # a stop signal reached the supervisor
    SPAWN_FAILED = "spawn-failed"  # the command could not be started (127/126)
    ERROR = "supervisor-error"  # the supervisor itself failed; the child is stopped safely


@dataclass(frozen=True)
class Trigger:
    """What started the stop sequence."""

    reason: Reason
    detail: str = ""
    signal: signal.Signals | None = None
    at: float = 0.0  # time.monotonic()


class Agent:
    """Supervises one attempt of one run. ``await Agent(cfg).run()`` returns the exit status."""

    def __init__(self, cfg: Config, *, env: Mapping[str, str] | None = None) -> None:
        self.cfg = cfg
        self.env = dict(os.environ if env is None else env)
        assert cfg.run_dir is not None
        self.run_dir: Path = cfg.run_dir
        self.attempt = next_attempt(self.run_dir, self.env)
        self.journal = Journal(self.run_dir, self.attempt)
        self.state = State.STARTING
        self.child: Child | None = None
        self._trigger: Trigger | None = None
        self._stop_wanted = anyio.Event()
        self._stop_signal_sent = False
        self._exit_status: int | None = None
        self._started = time.monotonic()
        self.request_path = self.run_dir / REQUEST_FILE

    # --- the run ---

    async def run(self) -> int:
        """Start, supervise until something ends the run, stop safely, return the status."""
        self._journal_start()
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self._signal_intake)
                try:
                    await self._spawn(tg)
                except SpawnError as e:
                    log.error("%s", e)
                    self.journal.emit("spawn-failed", error=str(e), exit_status=e.exit_status)
                    self._exit_status = e.exit_status
                    self._request_stop(Trigger(Reason.SPAWN_FAILED, str(e), at=time.monotonic()))
                await self._stop_wanted.wait()
                await self._stop_sequence()
                tg.cancel_scope.cancel()
        except Exception as e:  # noqa: BLE001 - invariant 4: never leave the child unsupervised
            log.exception("supervisor error: %s", e)
            self.journal.emit("error", error=f"{type(e).__name__}: {e}")
            with anyio.CancelScope(shield=True):
                await self._emergency_stop()
            self._trigger = self._trigger or Trigger(Reason.ERROR, str(e), at=time.monotonic())
        return self._finish()

    async def _spawn(self, tg: anyio.abc.TaskGroup) -> None:
        env = self._child_env()
        self.child = await Child.spawn(self.cfg.command, env)
        self.journal.emit("spawn", pid=self.child.pid, pgid=self.child.pgid, argv=list(self.cfg.command))
        log.info("started %s (pid %d)", " ".join(self.cfg.command), self.child.pid)
        self._set_state(State.RUNNING)
        tg.start_soon(self._watch_child)
        tg.start_soon(self._reaper)

    def _child_env(self) -> dict[str, str]:
        env = dict(self.env)
        env.update(
            SUPERVISE_RUN_DIR=str(self.run_dir),
            SUPERVISE_ATTEMPT=str(self.attempt),
            SUPERVISE_CHECKPOINT_REQUEST=str(self.request_path),
        )
        try:
            self.request_path.unlink()
        except FileNotFoundError:
            pass
        return env

    async def _watch_child(self) -> None:
        assert self.child is not None
        status = await self.child.wait()
        self.journal.emit("child-exit", pid=self.child.pid, exit_status=status, returncode=self.child.returncode)
        log.info("training exited with status %d", status)
        if self._trigger is None:
            reason = Reason.CHILD_EXIT if status == 0 else Reason.CHILD_FAILED
            self._request_stop(Trigger(reason, f"exit status {status}", at=time.monotonic()))

    async def _reaper(self) -> None:
        """Reap orphans re-parented to us, so none lingers as a zombie."""
        assert self.child is not None
        while True:
            if self.child.zombie_orphan_waiting():
                for pid in await anyio.to_thread.run_sync(self.child.reap_orphans):
                    self.journal.emit("orphan-reaped", pid=pid)
            await anyio.sleep(1.0)

    # --- signals ---

    async def _signal_intake(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.open_signal_receiver(*STOP_SIGNALS, *PASS_SIGNALS) as signals:
            task_status.started()
            async for sig in signals:
                self._on_signal(signal.Signals(sig), time.monotonic())

    def _on_signal(self, sig: signal.Signals, received: float) -> None:
        """Route one delivered signal; each delivery is passed on at most once."""
        name = sig.name
        if sig in STOP_SIGNALS:
            if self._trigger is None:
                self.journal.emit("signal", signal=name, action="stop")
                log.warning("received %s: stopping", name)
                self._request_stop(Trigger(Reason.SIGNAL, f"received {name}", sig, received))
            else:
                # A second TERM during the grace period would make mpiexec abandon its ranks.
                self.journal.emit("signal", signal=name, action="ignored", why="stop already in progress; not sent twice")
                log.warning("received %s again: the stop is already under way", name)
            return
        if self.child is None or self.child.returncode is not None:
            self.journal.emit("signal", signal=name, action="dropped", why="no running child")
            return
        delivery = self.child.send(sig, self.cfg.forward)
        latency = (time.monotonic() - received) * 1000
        self.journal.emit("signal", signal=name, action="forwarded", route=delivery.route,
                          to=delivery.targets, latency_ms=round(latency, 3))
        log.info("forwarded %s to %s %s", name, delivery.route, delivery.targets)

    def _request_stop(self, trigger: Trigger) -> None:
        if self._trigger is None:
            self._trigger = trigger
            self._stop_wanted.set()

    # --- the stop sequence: one place, named steps ---

    async def _stop_sequence(self) -> None:
        trigger = self._trigger
        assert trigger is not None
        self._set_state(State.STOPPING, reason=trigger.reason.value, detail=trigger.detail)
        self.journal.emit("stop", reason=trigger.reason.value, detail=trigger.detail,
                          signal=trigger.signal.name if trigger.signal else None)
        await self._step("stop-child", self._stop_child)
        await self._no_orphans()
        self._set_state(State.STOPPED)

    async def _step(self, name: str, fn: Callable[[], Awaitable[dict[str, Any] | None]]) -> dict[str, Any]:
        """Run one stop step, journaling its outcome and duration (deadline learning reads them)."""
        t0 = time.monotonic()
        outcome: dict[str, Any]
        try:
            outcome = await fn() or {}
        except Exception as e:  # noqa: BLE001 - a failed step must not skip the ones after it
            log.exception("stop step %s failed", name)
            outcome = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        seconds = round(time.monotonic() - t0, 3)
        self.journal.emit("stop-step", **{**outcome, "step": name, "seconds": seconds})
        log.info("stop step %s done in %s", name, format_duration(seconds))
        return outcome

    async def _stop_child(self) -> dict[str, Any]:
        """Stop signal → grace → SIGKILL of the whole tree; also ends orphans after a clean exit."""
        child = self.child
        if child is None:
            return {"skipped": "no child was started"}
        trigger = self._trigger
        sig = trigger.signal if trigger and trigger.signal else self.cfg.stop_signal
        result = await child.stop(sig, self.cfg.grace, route=self.cfg.forward)
        if result.get("sent_to"):
            self._stop_signal_sent = True
        with anyio.move_on_after(self.cfg.grace + 5):
            await child.exited.wait()
        if child.returncode is not None:
            self._exit_status = exit_status(child.returncode)
        return result

    async def _no_orphans(self) -> None:
        """Invariant 7, checked whatever the steps did: nothing of the tree survives us."""
        if self.child is None:
            return
        left = await anyio.to_thread.run_sync(self.child.tree)
        if left:
            killed = await self.child.kill_all()
            self.journal.emit("orphans-killed", pids=killed)
            log.warning("killed %d leftover process(es) of the training", len(killed))

    async def _emergency_stop(self) -> None:
        if self.child is not None:
            with anyio.move_on_after(self.cfg.grace + 10):
                await self.child.stop(self.cfg.stop_signal, self.cfg.grace, route=self.cfg.forward,
                                      already_signalled=self._stop_signal_sent)

    # --- journal ---

    def _set_state(self, new: State, **fields: Any) -> None:
        old, self.state = self.state, new
        self.journal.emit("state", **{"from": old.value, "to": new.value}, **fields)

    def _journal_start(self) -> None:
        self.journal.emit(
            "start",
            durable=True,
            version=__version__,
            argv=sys.argv,
            command=list(self.cfg.command),
            cwd=os.getcwd(),
            host=os.uname().nodename,
            user=_user(),
            pid=os.getpid(),
            python=".".join(map(str, sys.version_info[:3])),
            config=public_view(self.cfg),
            scheduler_env=redact_env(self.env, SCHEDULER_ENV_PREFIXES),
        )
        log.info("run directory %s, attempt %d", self.run_dir, self.attempt)

    def _finish(self) -> int:
        trigger = self._trigger or Trigger(Reason.ERROR, "ended without a trigger")
        status = self._exit_status
        if status is None:
            status = 1
        duration = round(time.monotonic() - self._started, 3)
        self.journal.emit("end", reason=trigger.reason.value, detail=trigger.detail,
                          exit_status=status, seconds=duration)
        log.info("done: %s, exit status %d after %s", trigger.reason.value, status, format_duration(duration))
        self.journal.close()
        return status


def _user() -> str:
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if name:
        return name
    import pwd  # only when the environment does not say

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


async def supervise(cfg: Config) -> int:
    """Run one supervised attempt; the entry point the CLI calls inside ``anyio.run``."""
    agent = Agent(cfg)
    logs.add_file(cfg.run_dir, cfg.verbosity)  # type: ignore[arg-type]
    for warning in cfg.warnings:
        log.warning("%s", warning)
    return await agent.run()
