"""The conductor: one task group, the parts, and the one stop sequence.

Data flows one way: Config → Agent → parts → Journal. Parts never import each other;
the agent wires them and owns every decision about stopping. The run moves through
named states (``starting → restoring → running → stopping → stopped``), and every
transition and every stop step is a journal event, so the report (and the next attempt's
deadline learning) can tell exactly what happened and how long each step took.

The stop sequence (DESIGN.md), in one place, ``_stop_sequence``:
trigger → checkpoint (request it, wait for a new complete one or the child's exit) →
flush → stop-child (stop signal once → grace → SIGKILL of the tree) → final-flush →
requeue → ``end``. Each step is bounded by what is left before the job's end.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

import anyio
from anyio.abc import TaskGroup

from supervisor import __version__, deadline, job as jobs, launchers, logs
from supervisor._units import format_duration
from supervisor.child import Child, SpawnError, exit_status, quiet_stray_signals
from supervisor.config import Config, public_view
from supervisor.journal import Journal, next_attempt, open_own_file, read_journal, redact_argv, redact_env

log = logging.getLogger("supervise")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
JOB_WIDE = 2.0  # a SIGCONT this close to a TERM means the scheduler signalled every process
PASS_SIGNALS = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
SCHEDULER_ENV_PREFIXES = ("SLURM_", "PBS_", "SUPERVISE_", "CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD", "PMI_", "CS_")
REQUEST_FILE = "checkpoint.request"
END_REFRESH = 300.0  # re-read the scheduler's end time this often: limits change (scontrol update)
SAFETY = 5.0  # seconds kept in hand before the job's end for the last steps
PART_RESTARTS = 5


class State(str, enum.Enum):
    """The worker group's states, named as torch.distributed.elastic names its own."""

    STARTING = "starting"
    RESTORING = "restoring"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Reason(str, enum.Enum):
    """Why the run ended. Each is distinct in the journal and in the report."""

    DEADLINE = "deadline"  # the time limit approached (our watch, or the warn signal)
    PREEMPTED = "preempted"  # SIGTERM before the deadline: the scheduler wants the node back
    CANCELLED = "cancelled"  # scancel, qdel, Ctrl-C (INT), QUIT
    CHILD_EXIT = "child-exit"  # the training ended by itself with status 0
    CHILD_FAILED = "child-failed"  # the training ended by itself with a non-zero status
    SPAWN_FAILED = "spawn-failed"  # the command could not be started (127/126)
    HANG = "hang"  # the hang watchdog stopped the run (hang_action = stop)
    ERROR = "supervisor-error"  # the supervisor itself failed; the child is stopped safely


REQUEUE_REASONS = frozenset({Reason.DEADLINE, Reason.PREEMPTED})


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
        assert cfg.run_dir is not None
        self.cfg = cfg
        self.env = dict(os.environ if env is None else env)
        self.run_dir: Path = cfg.run_dir
        self.request_path = self.run_dir / REQUEST_FILE
        self.job = jobs.detect_job(self.env)
        self.profile = launchers.detect(cfg.command, cfg.launcher)
        self.checkpoint_signal = cfg.checkpoint_signal or self.profile.checkpoint_signal
        self.previous_events = read_journal(self.run_dir).events
        self.attempt = next_attempt(self.run_dir, self.env)
        self.journal = Journal(self.run_dir, self.attempt)
        for url in cfg.notify:  # issue 14: before `start`, whose argv may hold them
            self.journal.add_secret(url)
        self.state = State.STARTING
        self.child: Child | None = None
        self.mirror: Any = None
        self.notifier: Any = None
        self.gpu: Any = None
        self.end: float | None = None  # unix seconds when the job ends, when known
        self.restored_from: Path | None = None
        self._trigger: Trigger | None = None
        self._stop_wanted = anyio.Event()
        self._exit_status: int | None = None
        self._started_wall = time.time()
        self._started = time.monotonic()
        self._restarts = 0
        self._last_cont: float | None = None
        self._requeued_by_scheduler = False
        self.kill_wait = jobs.DEFAULT_KILL_WAIT.get(self.job.scheduler)  # refined by _learn_kill_wait
        self.lead = cfg.warn_before if cfg.warn_before is not None else deadline.learn_lead(self.previous_events)

    # ------------------------------------------------------------------ the run

    async def run(self) -> int:
        """Start, supervise until something ends the run, stop safely, return the status."""
        self._journal_start()
        # The receiver outlives the task group: while its parts wind down (a worker thread
        # may sit in a slow NVML call), a TERM must still find a handler, not the default.
        # issue 14: the warn and checkpoint signals may be any OPTION_SIGNALS (ALRM killed us);
        # every other catchable signal is ignored rather than left to kill or stop us.
        caught = {*STOP_SIGNALS, *PASS_SIGNALS, signal.SIGCONT,
                  *(s for s in (self.cfg.warn_signal, self.checkpoint_signal) if s is not None)}
        quiet_stray_signals(caught)
        with anyio.open_signal_receiver(*caught) as signals:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._signal_intake, signals)
                    await self._start_parts(tg)
                    with anyio.CancelScope() as restore_scope:
                        tg.start_soon(self._cancel_on_stop, restore_scope)
                        await self._restore()
                    if self.mirror is not None:
                        tg.start_soon(self._guarded, "sync", self.mirror.run)
                    if self._trigger is None:
                        await self._spawn(tg)
                    await self._stop_wanted.wait()
                    await self._stop_sequence()
                    _ignore_stop_signals()
                    tg.cancel_scope.cancel()
            except Exception as e:  # noqa: BLE001 - invariant 4: never leave the child unsupervised
                log.exception("supervisor error: %s", e)
                self.journal.emit("error", error=f"{type(e).__name__}: {e}")
                with anyio.CancelScope(shield=True):
                    await self._emergency_stop()
                self._trigger = self._trigger or Trigger(Reason.ERROR, str(e), at=time.monotonic())
        _ignore_stop_signals()  # the receiver's exit restored the defaults
        quiet_stray_signals(STOP_SIGNALS)  # issue 14: nor may a HUP or ALRM cut `end`
        return self._finish()

    async def _cancel_on_stop(self, scope: anyio.CancelScope) -> None:
        await self._stop_wanted.wait()
        scope.cancel()

    async def _start_parts(self, tg: TaskGroup) -> None:
        """Build and start every configured part; none of them can take the run down."""
        cfg = self.cfg
        if cfg.sync:
            from supervisor.sync import Mirror

            self.mirror = Mirror(cfg.sync, emit=self.journal.emit, sync_every=cfg.sync_every,
                                 backend=cfg.sync_backend, nice=cfg.sync_nice, ionice=cfg.sync_ionice,
                                 writers=self._tree_pids,
                                 published_before=Mirror.published_in(self.previous_events))  # issue 14
            for warning in self.mirror.check():
                log.warning("%s", warning)
            self.journal.emit("sync-start", backend=self.mirror.backend_name,
                              pairs=[{"name": p.name, "kind": p.kind, "from": str(p.src), "to": str(p.dst), "nodes": p.nodes}
                                     for p in cfg.sync])
        if cfg.notify:
            from supervisor.notify import Notifier, resolve_urls

            self.notifier = Notifier(resolve_urls(cfg.notify), fmt=cfg.notify_format, timeout=cfg.notify_timeout,
                                     emit=self.journal.emit, job_label=self._job_label(), add_secret=self.journal.add_secret)
            tg.start_soon(self._guarded, "notify", self.notifier.run)
            self.notifier.post("start", attempt=self.attempt, command=" ".join(cfg.command), host=os.uname().nodename)
        if cfg.gpu_every > 0:
            from supervisor.gpu import GpuSampler
            from supervisor.host import HostSampler

            self.gpu = GpuSampler(run_dir=self.run_dir, emit=self.journal.emit, every=cfg.gpu_every,
                                  backend=cfg.gpu_backend, env=self.env, dmon_log=cfg.dmon_log)
            host = HostSampler(run_dir=self.run_dir, emit=self.journal.emit, every=cfg.gpu_every)
            tg.start_soon(self._guarded, "gpu", lambda: self.gpu.run(tree_pids=self._tree_pids))
            tg.start_soon(self._guarded, "host", lambda: host.run(tree_pids=self._tree_pids))
        tg.start_soon(self._guarded, "deadline", self._deadline_watch)
        if self.job.scheduler != "local":
            tg.start_soon(self._guarded, "kill-wait", self._learn_kill_wait)
        if cfg.hang_after:
            tg.start_soon(self._guarded, "hang", self._hang_watch)

    async def _restore(self) -> None:
        if self.mirror is None:
            return
        self._set_state(State.RESTORING)
        t0 = time.monotonic()
        self.restored_from = await self.mirror.restore()
        if self.restored_from is not None:
            log.info("restored %s in %s", self.restored_from, format_duration(time.monotonic() - t0))

    async def _guarded(self, name: str, run: Callable[[], Awaitable[Any]]) -> None:
        """Run a part; a failure is journaled and retried with backoff, never fatal (invariant 4)."""
        for n in range(PART_RESTARTS + 1):
            try:
                await run()
                return
            except Exception as e:  # noqa: BLE001
                delay = min(60.0, 2.0 * 2**n)
                self.journal.emit("part-failed", part=name, error=f"{type(e).__name__}: {e}",
                                  retry_in=delay if n < PART_RESTARTS else None)
                log.warning("%s failed: %s%s", name, e, f"; retrying in {delay:g}s" if n < PART_RESTARTS else "; giving up")
                if n < PART_RESTARTS:
                    await anyio.sleep(delay)

    def _tree_pids(self) -> set[int]:
        return self.child.tree() if self.child is not None else set()

    # ------------------------------------------------------------------ the child

    async def _spawn(self, tg: TaskGroup) -> None:
        try:
            self.child = await Child.spawn(self.cfg.command, self._child_env())
        except SpawnError as e:
            log.error("%s", e)
            self.journal.emit("spawn-failed", error=str(e), exit_status=e.exit_status)
            self._exit_status = e.exit_status
            self._request_stop(Trigger(Reason.SPAWN_FAILED, str(e), at=time.monotonic()))
            return
        self.journal.emit("spawn", pid=self.child.pid, pgid=self.child.pgid, argv=list(self.cfg.command),
                          launcher=self.profile.name, restart=self._restarts)
        log.info("started %s (pid %d, launcher %s)", " ".join(self.cfg.command), self.child.pid, self.profile.name)
        self._set_state(State.RUNNING)
        tg.start_soon(self._watch_child, tg, self.child)
        if self._restarts == 0:
            tg.start_soon(self._reaper)

    def _child_env(self) -> dict[str, str]:
        env = dict(self.env)
        env.update(self.profile.child_env(self.cfg.grace))
        env.update(
            SUPERVISE_RUN_DIR=str(self.run_dir),
            SUPERVISE_ATTEMPT=str(self.attempt),
            SUPERVISE_CHECKPOINT_REQUEST=str(self.request_path),
            SUPERVISE_CHECKPOINT_SIGNAL=self.checkpoint_signal.name.removeprefix("SIG"),
        )
        if self.restored_from is not None:
            env["SUPERVISE_RESTORED_FROM"] = str(self.restored_from)
        try:
            self.request_path.unlink()
        except FileNotFoundError:
            pass
        return env

    async def _watch_child(self, tg: TaskGroup, child: Child) -> None:
        status = await child.wait()
        self.journal.emit("child-exit", pid=child.pid, exit_status=status, returncode=child.returncode)
        log.info("training exited with status %d", status)
        if self._trigger is not None or child is not self.child:
            return
        if status != 0 and self._restarts < self.cfg.max_restarts:
            await self._restart(tg, child, status)
            return
        reason = Reason.CHILD_EXIT if status == 0 else Reason.CHILD_FAILED
        self._request_stop(Trigger(reason, f"exit status {status}", at=time.monotonic()))

    async def _restart(self, tg: TaskGroup, child: Child, status: int) -> None:
        """In-place restart after a crash, like torchrun's: clear the old tree, back off, spawn."""
        self._set_state(State.RESTARTING)
        await child.stop(self.cfg.stop_signal, min(self.cfg.grace, 10.0))
        delay = self.cfg.restart_backoff * 2**self._restarts
        self._restarts += 1
        self.journal.emit("restart", number=self._restarts, of=self.cfg.max_restarts, exit_status=status, backoff_s=delay)
        log.warning("training failed with status %d: restart %d of %d in %s", status, self._restarts,
                    self.cfg.max_restarts, format_duration(delay))
        with anyio.move_on_after(delay):
            await self._stop_wanted.wait()
        if self._trigger is None:
            await self._spawn(tg)

    async def _reaper(self) -> None:
        """Reap orphans re-parented to us, so none lingers as a zombie."""
        while True:
            child = self.child
            if child is not None and child.zombie_orphan_waiting():
                for pid in await anyio.to_thread.run_sync(child.reap_orphans):
                    self.journal.emit("orphan-reaped", pid=pid)
            await anyio.sleep(1.0)

    # ------------------------------------------------------------------ signals

    async def _signal_intake(self, signals: AsyncIterator[int]) -> None:
        async for sig in signals:
            if sig == signal.SIGCONT:
                # slurmstepd sends SIGCONT with the SIGTERM it sends to every process of the job.
                self._last_cont = time.monotonic()
                continue
            await self._on_signal(signal.Signals(sig), time.monotonic())

    async def _on_signal(self, sig: signal.Signals, received: float) -> None:
        """Route one delivered signal; each delivery is passed on at most once."""
        name = sig.name
        if sig in STOP_SIGNALS or sig == self.cfg.warn_signal:
            if self._trigger is None:
                reason = self._classify(sig)
                self.journal.emit("signal", signal=name, action="stop", reason=reason.value)
                log.warning("received %s: stopping (%s)", name, reason.value)
                self._request_stop(Trigger(reason, f"received {name}", sig, received))
            else:
                # A second TERM during the grace period would make mpiexec abandon its ranks.
                self.journal.emit("signal", signal=name, action="ignored", why="stop already in progress; not sent twice")
                log.warning("received %s again: the stop is already under way", name)
            return
        if self.child is None or self.child.returncode is not None:
            self.journal.emit("signal", signal=name, action="dropped", why="no running child")
            return
        if sig == self.checkpoint_signal:
            await self._request_checkpoint(f"received {name}", received)
            return
        delivery = self.child.send(sig, self.cfg.forward)
        self.journal.emit("signal", signal=name, action="forwarded", route=delivery.route, to=delivery.targets,
                          latency_ms=round((time.monotonic() - received) * 1000, 3))
        log.info("forwarded %s to %s %s", name, delivery.route, delivery.targets)

    def _classify(self, sig: signal.Signals) -> Reason:
        """Why a stop signal came. TERM near the end is the time limit; TERM before it is a
        preemption; INT and QUIT are a person; the scheduler's view refines it later."""
        if sig == self.cfg.warn_signal:
            return Reason.DEADLINE
        if sig != signal.SIGTERM:
            return Reason.CANCELLED
        if self.end is not None and time.time() >= self.end - 2 * SAFETY:
            return Reason.DEADLINE
        return Reason.PREEMPTED

    async def _request_checkpoint(self, why: str, received: float | None = None) -> dict[str, Any]:
        """"Checkpoint now": a fresh request file, plus the checkpoint signal where it is safe."""
        assert self.child is not None
        child = self.child
        def prepare() -> launchers.Targets:
            # The file first: a rank that saw the signal and acknowledged must not count the
            # file of the same request as a second one. Finding ranks reads /proc for every
            # descendant: both off the event loop (invariant 6), in one hop (latency).
            try:
                _write_request(self.request_path, why)
            except OSError as e:  # issue 14: a full run directory; the signal still goes
                request_error.append(f"{e.strerror or e}")
            return self.profile.checkpoint_targets(child.pid, self.checkpoint_signal)

        request_error: list[str] = []
        targets = await anyio.to_thread.run_sync(prepare)
        delivery = self.child.send_to(set(targets.pids), self.checkpoint_signal, targets.route)
        fields = {"signal": self.checkpoint_signal.name, "route": targets.route, "to": delivery.targets,
                  "skipped": {str(k): v for k, v in targets.skipped.items()}, "request_file": str(self.request_path)}
        if request_error:
            fields["request_file_error"] = request_error[0]
        if received is not None:
            fields["latency_ms"] = round((time.monotonic() - received) * 1000, 3)
        self.journal.emit("checkpoint-request", why=why, **fields)
        log.info("checkpoint requested (%s): %s to %s %s", why, self.checkpoint_signal.name, targets.route, delivery.targets)
        return fields

    def _request_stop(self, trigger: Trigger) -> None:
        if self._trigger is None:
            self._trigger = trigger
            self._stop_wanted.set()

    # ------------------------------------------------------------------ watches

    async def _deadline_watch(self) -> None:
        """Sleep until end − lead, re-reading the scheduler's end every few minutes."""
        lead = self.lead
        overridden = self.cfg.time_limit is not None or self.cfg.deadline is not None
        if self.job.scheduler == "local" and not overridden:
            return
        shown: tuple[float | None, str] | None = None
        while True:
            scheduler_end = None if overridden else await jobs.end_time(self.job, report=log.warning)
            end, source = deadline.resolve_end(time.time(), self._started_wall, self.cfg.time_limit,
                                               self.cfg.deadline, scheduler_end)
            self.end = end
            if (end, source) != shown:
                shown = (end, source)
                self.journal.emit("deadline", end=end, source=source, lead_s=round(lead, 3),
                                  warn_at=None if end is None else end - lead,
                                  learned=self.cfg.warn_before is None)
                if end is not None:
                    log.info("the job ends at %s (%s); warning %s before", _clock(end), source, format_duration(lead))
            wait = END_REFRESH if end is None else min(END_REFRESH, max(0.0, end - lead - time.time()))
            if overridden and end is not None:
                wait = max(0.0, end - lead - time.time())
            with anyio.move_on_after(wait):
                await self._stop_wanted.wait()
            if self._trigger is not None:
                return
            if end is not None and time.time() >= end - lead:
                left = end - time.time()
                log.warning("%s left before the job's end: stopping with a checkpoint", format_duration(max(0, left)))
                self.journal.emit("warning", left_s=round(left, 3), source=source)
                if self.notifier is not None:
                    self.notifier.post("warning", left=format_duration(max(0.0, left)))
                self._request_stop(Trigger(Reason.DEADLINE, f"{format_duration(max(0.0, left))} before the end ({source})",
                                           at=time.monotonic()))
                return

    async def _learn_kill_wait(self) -> None:
        """KillWait, read once at start: after Slurm's TERM to the whole job it is all we have."""
        learned = await jobs.kill_wait(self.job, report=log.warning)
        if learned is not None:
            self.kill_wait = learned

    async def _hang_watch(self) -> None:
        """No new checkpoint, no log growth (and idle GPUs when sampled) for hang_after → hang."""
        assert self.cfg.hang_after
        limit = self.cfg.hang_after
        reported = False
        while True:
            await anyio.sleep(min(30.0, limit / 4))
            if self.child is None or self.child.returncode is not None:
                continue
            marks = [self._started]
            if self.mirror is not None and self.mirror.last_activity() is not None:
                marks.append(self.mirror.last_activity())
            if self.gpu is not None and self.gpu.last_busy() is not None:
                marks.append(self.gpu.last_busy())
            idle = time.monotonic() - max(marks)
            if idle < limit:
                reported = False
                continue
            if not reported:
                reported = True
                self.journal.emit("hang", idle_s=round(idle, 1), action=self.cfg.hang_action)
                log.warning("no checkpoint, log growth or GPU work for %s: the training may hang", format_duration(idle))
                if self.notifier is not None:
                    self.notifier.post("hang", idle=format_duration(idle))
                if self.cfg.hang_action == "stop":
                    self._request_stop(Trigger(Reason.HANG, f"idle for {format_duration(idle)}", at=time.monotonic()))
                    return

    # ------------------------------------------------------------------ the stop sequence

    def _time_left(self) -> float:
        """Seconds the remaining steps may take before the job is killed (inf if never).

        After Slurm's TERM to the whole job (scancel, preemption, the time limit, a requeue)
        SIGKILL follows KillWait later, however far the job's end is. A few seconds are kept
        in hand for the journal's last lines; less when the window itself is short (a tight
        --warn-before, or a small KillWait).
        """
        end, reserve = self.end, min(SAFETY, 0.1 * self.lead)
        killed_at = self._killed_at()
        if killed_at is not None and (end is None or killed_at < end):
            end, reserve = killed_at, min(SAFETY, 0.2 * (self.kill_wait or 0.0))
        if end is None:
            return float("inf")
        return max(0.0, end - time.time() - reserve)

    def _killed_at(self) -> float | None:
        """Unix time of the SIGKILL that follows a job-wide TERM from Slurm, when one came."""
        trigger = self._trigger
        if self.kill_wait is None or trigger is None or not self._scheduler_signalled_all():
            return None
        return time.time() - (time.monotonic() - trigger.at) + self.kill_wait

    def _hard_kill(self) -> dict[str, Any]:
        """When the SIGKILL will come, for the report's margin: KillWait after Slurm's
        job-wide TERM, else the job's end (none known: no fields)."""
        killed_at = self._killed_at()
        if killed_at is not None and (self.end is None or killed_at < self.end):
            return {"kill_in_s": round(killed_at - time.time(), 3), "kill_by": "kill-wait", "kill_wait_s": self.kill_wait}
        if self.end is not None:
            return {"kill_in_s": round(self.end - time.time(), 3), "kill_by": "time-limit"}
        return {}

    async def _stop_sequence(self) -> None:
        trigger = self._trigger
        assert trigger is not None
        self._set_state(State.STOPPING, reason=trigger.reason.value, detail=trigger.detail)
        self.journal.emit("stop", reason=trigger.reason.value, detail=trigger.detail,
                          signal=trigger.signal.name if trigger.signal else None,
                          time_left_s=None if self.end is None else round(self.end - time.time(), 3),
                          **self._hard_kill())
        await self._step("checkpoint", self._checkpoint)
        await self._step("flush", lambda: self._flush("stop"))
        await self._step("stop-child", self._stop_child)
        await self._no_orphans()
        if self.mirror is not None and not self._tree_pids():
            self.mirror.training_exited()  # nothing can change now: no checkpoint waits for quiescence
        await self._step("final-flush", lambda: self._flush("final"))
        with anyio.move_on_after(10):
            await self._refine_reason()
        await self._step("requeue", self._requeue)
        self._set_state(State.STOPPED)

    async def _step(self, name: str, fn: Callable[[], Awaitable[dict[str, Any] | None]]) -> dict[str, Any]:
        """Run one stop step, journaling its outcome and duration (deadline learning reads them)."""
        t0 = time.monotonic()
        try:
            outcome = await fn() or {}
        except Exception as e:  # noqa: BLE001 - a failed step must not skip the ones after it
            log.exception("stop step %s failed", name)
            outcome = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        seconds = round(time.monotonic() - t0, 3)
        self.journal.emit("stop-step", **{**outcome, "step": name, "seconds": seconds})
        if not outcome.get("skipped"):
            log.info("stop step %s: %s", name, format_duration(seconds))
        return outcome

    async def _checkpoint(self) -> dict[str, Any]:
        """Ask for a checkpoint and wait for it to be complete (or for the child to end)."""
        trigger = self._trigger
        assert trigger is not None
        if trigger.reason in (Reason.CHILD_EXIT, Reason.CHILD_FAILED, Reason.SPAWN_FAILED, Reason.CANCELLED):
            return {"skipped": f"not wanted after {trigger.reason.value}"}
        child = self.child
        if child is None or child.returncode is not None:
            return {"skipped": "the training is not running"}
        before = self.mirror.published if self.mirror is not None else 0
        request = await self._request_checkpoint(trigger.detail or trigger.reason.value)
        watching = self.mirror is not None and any(p.kind == "checkpoint" for p in self.cfg.sync)
        left = self._time_left()
        bound = min(self.cfg.checkpoint_timeout, left - min(self.cfg.grace, 0.25 * left))  # keep time to stop
        if not watching:
            return {"outcome": "requested", "why": "no checkpoint pair: completion cannot be seen", **request}
        if bound <= 0:
            return {"outcome": "no-time", "bound_s": round(bound, 3), **request}
        outcome = "timeout"
        with anyio.move_on_after(bound):
            async with anyio.create_task_group() as tg:
                async def published() -> None:
                    nonlocal outcome
                    await self.mirror.wait_published(before)
                    outcome = "published"
                    tg.cancel_scope.cancel()

                async def exited() -> None:
                    nonlocal outcome
                    await child.exited.wait()
                    outcome = "child-exited"
                    tg.cancel_scope.cancel()

                async def nudge() -> None:
                    # Watch events wait out a failed copy's backoff; the stop cannot wait that long.
                    while True:
                        self.mirror.request("stop-checkpoint")
                        await anyio.sleep(1.0)

                tg.start_soon(published)
                tg.start_soon(exited)
                tg.start_soon(nudge)
        if outcome == "timeout":
            log.warning("no new complete checkpoint within %s", format_duration(bound))
        return {"outcome": outcome, "bound_s": round(bound, 3), "published": self.mirror.published - before}

    async def _flush(self, reason: str) -> dict[str, Any]:
        if self.mirror is None:
            return {"skipped": "no sync pairs"}
        left = self._time_left()
        bound = left - (min(self.cfg.grace, 0.25 * left) if reason == "stop" and self._child_running() else 0.0)
        if bound <= 0:
            return {"outcome": "no-time", "pending": self.mirror.pending()}
        with anyio.move_on_after(bound) as scope:
            result = await self.mirror.flush(reason)
        if scope.cancelled_caught:
            return {"outcome": "timeout", "bound_s": round(bound, 3), "pending": self.mirror.pending()}
        return {"outcome": "done", **(result or {})}

    def _child_running(self) -> bool:
        return self.child is not None and self.child.returncode is None

    async def _stop_child(self) -> dict[str, Any]:
        """Stop signal once → grace → SIGKILL of the whole tree; also ends leftovers after an exit."""
        child = self.child
        if child is None:
            return {"skipped": "no child was started"}
        trigger = self._trigger
        # A plain process gets the signal the person sent (INT stays INT); a launcher gets the
        # one its profile says stops it cleanly (srun only prints its status on a single INT).
        sig = self.profile.stop_signal
        if trigger and trigger.signal in STOP_SIGNALS and self.profile.name in ("python", "generic"):
            sig = trigger.signal
        grace = min(self.cfg.grace, max(1.0, self._time_left()))
        already = self._scheduler_signalled_all()
        if already and trigger is not None:
            # The grace runs from the scheduler's TERM, which the training got with ours.
            grace = max(0.0, min(grace, self.cfg.grace - (time.monotonic() - trigger.at)))
        grace = round(grace, 3)
        targets = None
        if child.returncode is None:
            targets = await anyio.to_thread.run_sync(self.profile.stop_targets, child.pid)
        result = await child.stop(sig, grace, targets=set(targets.pids) if targets else None,
                                  route=targets.route if targets else self.cfg.forward, already_signalled=already)
        if already:
            result["already_signalled"] = "the scheduler sent SIGTERM to every process of the job; not sent twice"
        with anyio.move_on_after(grace + 5):
            await child.exited.wait()
        if child.returncode is not None:
            self._exit_status = exit_status(child.returncode)
        return result

    def _scheduler_signalled_all(self) -> bool:
        """Did Slurm's SIGCONT+SIGTERM to every process (scancel, time limit, requeue) also
        reach the launcher? Then a TERM of ours would be its second (mpiexec abandons its
        ranks on a second TERM), so we only wait and kill."""
        trigger = self._trigger
        if trigger is None or trigger.signal != signal.SIGTERM or self.job.scheduler != "slurm":
            return False
        return self._last_cont is not None and abs(self._last_cont - trigger.at) <= JOB_WIDE

    async def _refine_reason(self) -> None:
        """After a SIGTERM under Slurm, the controller tells cancel, requeue, preemption and
        the time limit apart (they all send the same TERM)."""
        trigger = self._trigger
        if trigger is None or trigger.signal != signal.SIGTERM or self.job.scheduler != "slurm":
            return
        view = await jobs.job_view(self.job, report=log.warning)
        reason, requeued = _reason_from_view(view, trigger.reason, self.job.restart_count)
        self._requeued_by_scheduler = requeued
        state = view.state if view else None
        self.journal.emit("reason", state=state, reason=reason.value, was=trigger.reason.value,
                          requeued_by_scheduler=requeued, restarts=view.restarts if view else None,
                          preempted=bool(view and view.preempt_time))
        if reason != trigger.reason:
            self._trigger = Trigger(reason, f"{trigger.detail}; scheduler state {state}", trigger.signal, trigger.at)

    async def _no_orphans(self) -> None:
        """Invariant 7, checked whatever the steps did: nothing of the tree survives us."""
        if self.child is None:
            return
        left = await anyio.to_thread.run_sync(self.child.tree)
        if left:
            killed = await self.child.kill_all()
            self.journal.emit("orphans-killed", pids=killed)
            log.warning("killed %d leftover process(es) of the training", len(killed))

    async def _requeue(self) -> dict[str, Any]:
        trigger = self._trigger
        assert trigger is not None
        cfg = self.cfg
        wanted = cfg.requeue and (trigger.reason in REQUEUE_REASONS or
                                  (cfg.requeue_on_failure and trigger.reason == Reason.CHILD_FAILED))
        if not wanted:
            return {"skipped": "requeue is off" if not cfg.requeue else f"not after {trigger.reason.value}"}
        if self.job.scheduler == "local":
            return {"skipped": "no scheduler to requeue with"}
        if self._requeued_by_scheduler:
            return {"skipped": "the scheduler already requeued the job"}
        if self.job.restart_count >= cfg.max_requeues:
            self.journal.emit("requeue-refused", restart_count=self.job.restart_count, max_requeues=cfg.max_requeues)
            log.warning("not requeueing: %d requeues already (max %d)", self.job.restart_count, cfg.max_requeues)
            return {"requeued": False, "why": f"max_requeues {cfg.max_requeues} reached"}
        if self.notifier is not None:
            self.notifier.post("requeued", attempt=self.attempt, reason=trigger.reason.value)
            with anyio.CancelScope(shield=True):
                await self.notifier.drain(min(cfg.notify_timeout, max(0.0, self._time_left())))
        # Requeueing sends us SIGTERM at once (Slurm): it is the very last thing we do, and
        # that TERM must not cut the journal's `end` (the training is already stopped).
        _ignore_stop_signals()
        ok, message = await jobs.requeue(self.job, timeout=min(60.0, max(5.0, self._time_left())), report=log.warning)
        log.info("requeue: %s", message)
        return {"requeued": ok, "message": message, "restart_count": self.job.restart_count}

    async def _emergency_stop(self) -> None:
        if self.child is not None:
            with anyio.move_on_after(self.cfg.grace + 10):
                await self.child.stop(self.cfg.stop_signal, self.cfg.grace)

    # ------------------------------------------------------------------ journal

    def _set_state(self, new: State, **fields: Any) -> None:
        old, self.state = self.state, new
        self.journal.emit("state", **{"from": old.value, "to": new.value}, **fields)

    def _job_label(self) -> str:
        if self.job.job_id:
            return f"{self.job.scheduler} job {self.job.job_id}" + (f" ({self.job.job_name})" if self.job.job_name else "")
        return f"{os.uname().nodename}:{self.run_dir.name}"

    def _journal_start(self) -> None:
        j = self.job
        self.journal.emit(
            "start",
            durable=True,
            version=__version__,
            argv=redact_argv(sys.argv),
            command=list(self.cfg.command),
            cwd=os.getcwd(),
            host=os.uname().nodename,
            user=_user(),
            pid=os.getpid(),
            python=".".join(map(str, sys.version_info[:3])),
            scheduler=j.scheduler,
            job_id=j.job_id,
            job_name=j.job_name,
            restart_count=j.restart_count,
            nodes=list(j.nodes),
            launcher=self.profile.name,
            checkpoint_signal=self.checkpoint_signal.name,
            config=public_view(self.cfg),
            scheduler_env=redact_env(self.env, SCHEDULER_ENV_PREFIXES),
        )
        log.info("run directory %s, attempt %d", self.run_dir, self.attempt)

    def _finish(self) -> int:
        trigger = self._trigger or Trigger(Reason.ERROR, "ended without a trigger")
        status = self._exit_status
        if status is None and trigger.signal is not None:
            status = 128 + trigger.signal  # stopped by signal N before the training ran: as if N ended it
        if status is None:
            status = 1
        duration = round(time.monotonic() - self._started, 3)
        pending = self.mirror.pending() if self.mirror is not None else []
        self.journal.emit("end", reason=trigger.reason.value, detail=trigger.detail, exit_status=status,
                          seconds=duration, restarts=self._restarts, not_durable=pending)
        if pending:
            log.warning("not yet on persistent storage: %s", ", ".join(pending))
        log.info("done: %s, exit status %d after %s", trigger.reason.value, status, format_duration(duration))
        self.journal.close()
        return status


_STATE_REASONS = {"CANCELLED": Reason.CANCELLED, "TIMEOUT": Reason.DEADLINE, "DEADLINE": Reason.DEADLINE,
                  "PREEMPTED": Reason.PREEMPTED}


def _reason_from_view(view: jobs.JobView | None, was: Reason, restart_count: int) -> tuple[Reason, bool]:
    """(reason, requeued by the scheduler) from the controller's view after a SIGTERM.

    A job-wide TERM shows as COMPLETING for all of KillWait; then a raised ``Restarts``
    means a requeue (a preemption with PreemptMode=REQUEUE, or an admin's), a
    ``PreemptTime`` a preemption, and a TERM we took for a preemption with neither is
    a cancel. A job still RUNNING got its TERM at the batch shell only (a site's
    preemption script, ``scancel --signal=TERM --batch``): it stays a preemption.
    """
    if view is None:
        return was, False
    requeued = view.state.startswith("REQUEUE") or (view.restarts is not None and view.restarts > restart_count)
    base = view.state.split("+")[0]
    if base in _STATE_REASONS:
        return _STATE_REASONS[base], requeued
    if requeued or view.preempt_time is not None:
        return (Reason.DEADLINE if was == Reason.DEADLINE else Reason.PREEMPTED), requeued
    if was == Reason.PREEMPTED and base == "COMPLETING":
        return Reason.CANCELLED, False
    return was, False  # e.g. still RUNNING: the TERM reached only the batch shell (scancel --batch)


def _ignore_stop_signals() -> None:
    """Once the stop sequence is over, a TERM (``scontrol requeue`` sends one at once) must
    not cut the journal's last line: nothing is left to stop."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


_REQUEST_SEQ = itertools.count()


def _write_request(path: Path, why: str) -> None:
    """A new file (new inode) each time, so every rank sees a new request. The temp name is
    unique per call: a signal's request and the stop sequence's may be written at once."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_REQUEST_SEQ)}")
    try:
        tmp.unlink()  # a leftover (or a planted link) of a killed earlier attempt with our pid
    except FileNotFoundError:
        pass
    fd = open_own_file(tmp, append=False)  # issue 14: O_EXCL|O_NOFOLLOW, never a planted link
    try:
        os.write(fd, f"{time.time():.3f} {why}\n".encode())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full run directory: leave no temp name behind
        raise
    finally:
        os.close(fd)


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


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
    logs.add_file(cfg.run_dir, cfg.verbosity)  # type: ignore[arg-type]
    for warning in cfg.warnings:
        log.warning("%s", warning)
    return await Agent(cfg).run()
