"""The conductor: one task group, the parts, the child, and the one stop sequence.

It runs a ``plan.Plan`` (built and validated before anything starts) and decides nothing
alone: ``policy`` decides, ``stopping.StopSequence`` acts out the stop, the parts
(mirror, notifier, samplers, watches) are started with ``tg.start`` so each is ready, or
has failed, before the training is spawned. The run moves through named states
(``starting → restoring → running → stopping → stopped``); every transition and every
stop step is a journal event (docs/design.md, docs/journal.md).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from functools import partial
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
from anyio.abc import TaskGroup

from supervisor import childenv, fleet, job as jobs, logs, policy, suspects
from supervisor._units import format_duration
from supervisor.child import Child, SpawnError, quiet_stray_signals
from supervisor.config import Config
from supervisor.errors import root_cause
from supervisor.health import Faults, this_node
from supervisor.journal import Journal
from supervisor.plan import Plan, job_label, make_plan, start_fields
from supervisor.parts import guarded, reap_orphans
from supervisor.policy import STOP_SIGNALS, Reason, State, Trigger
from supervisor.stopping import StopSequence, emergency_stop, ignore_stop_signals, pass_on, request_checkpoint
from supervisor.watches import ProgressGaps, deadline_watch, hang_watch

log = logging.getLogger("supervise")


class Agent:
    """Conducts one attempt of one run. ``await Agent(plan).run()`` returns the exit status.

    Its public attributes are the run's state, read by the stop sequence and the tests."""

    def __init__(self, plan: Plan, *, spawn: Callable[..., Awaitable[Any]] = Child.spawn, notifier: Any = None,
                 early: list[int] | None = None) -> None:
        """``spawn`` and ``notifier`` are seams for the in-process tests (tests/core/test_conductor.py)."""
        self.plan, self.cfg = plan, plan.cfg
        self._spawner, self._early = spawn, early if early is not None else []
        self.journal = Journal(plan.run_dir, plan.attempt)
        for url in self.cfg.notify:  # before `start`, whose argv may hold them
            self.journal.add_secret(url)
        self.state, self.mirror = State.STARTING, plan.mirror
        self.child: Child | None = None
        self.notifier: Any = notifier
        self.gpu: Any = None
        self.end: float | None = None  # unix seconds when the job ends, when known
        self.lead = plan.lead  # fitted to the allocation once the end is known (deadline.fit)
        self.kill_wait = jobs.DEFAULT_KILL_WAIT.get(plan.job.scheduler)
        self.trigger: Trigger | None = None
        self.exit_status: int | None = None  # the launcher's own; the end's may differ (status())
        self.stopped_cleanly = self.no_progress = False  # set by the stop sequence
        self.faults = Faults(self.journal.emit)  # GPU faults that make this node suspect (health.py)
        self.gaps = ProgressGaps(plan.previous_events)  # the hang bound learns from them
        self.requeued_by_scheduler, self.restarts = False, 0
        self.last_cont: float | None = None
        self.restored_from = None
        self._stop_wanted = anyio.Event()
        self._started_wall, self._started = time.time(), time.monotonic()

    # ------------------------------------------------------------------ the run

    async def run(self) -> int:
        """Start, supervise until something ends the run, stop safely, return the status."""
        self._journal_start()
        # The receiver outlives the task group: while its parts wind down (a worker thread
        # may sit in a slow NVML call), a TERM must still find a handler, not the default.
        caught = policy.caught_signals(self.cfg.warn_signal, self.plan.checkpoint_signal)
        quiet_stray_signals(caught)  # every other catchable signal is ignored, not left to kill us
        with anyio.open_signal_receiver(*caught) as signals:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._signal_intake, signals)
                    while self._early:  # what came before we listened, in order
                        await self.deliver(signal.Signals(self._early.pop(0)))
                    await self._start_parts(tg)
                    if self.trigger is None:
                        await self._spawn(tg)
                    await self._stop_wanted.wait()
                    self._set_state(State.STOPPING, reason=self.trigger.reason.value, detail=self.trigger.detail)
                    await StopSequence(self)()
                    self._set_state(State.STOPPED)
                    ignore_stop_signals()
                    tg.cancel_scope.cancel()
            except Exception as e:  # noqa: BLE001 - docs/design.md, invariant 4: never leave the child unsupervised
                cause = root_cause(e)
                log.error("supervisor error: %s: %s", type(cause).__name__, cause, exc_info=cause)
                self.journal.emit("error", error=f"{type(cause).__name__}: {cause}")
                with anyio.CancelScope(shield=True):
                    await emergency_stop(self.child, self.cfg.stop_signal or self.plan.launcher.stop_signal,
                                         self.cfg.grace)
                self.trigger = self.trigger or Trigger(Reason.ERROR, f"{type(cause).__name__}: {cause}", at=time.monotonic())
        ignore_stop_signals()  # the receiver's exit restored the defaults
        quiet_stray_signals(STOP_SIGNALS)  # nor may a HUP or ALRM cut `end`
        return self._finish()

    async def _start_parts(self, tg: TaskGroup) -> None:
        """Start every part with ``tg.start``: each is ready (or its start-up error is out)
        before the training is spawned; afterwards none of them can take the run down."""
        cfg = self.cfg
        if cfg.notify and self.notifier is None:
            from supervisor.notify import Notifier

            self.notifier = Notifier(self.plan.notify_urls, fmt=cfg.notify_format, timeout=cfg.notify_timeout,
                                     emit=self.journal.emit, job_label=job_label(self.plan), add_secret=self.journal.add_secret)
        if self.notifier is not None:
            await tg.start(self._guarded("notify", self.notifier.run))
            self.notifier.post("start", attempt=self.plan.attempt, command=" ".join(cfg.command), host=os.uname().nodename)
        if cfg.gpu_every > 0:
            from supervisor.gpu import GpuSampler
            from supervisor.host import HostSampler

            self.gpu = GpuSampler(run_dir=self.plan.run_dir, emit=self.faults.through(self.journal.emit), every=cfg.gpu_every,
                                  backend=cfg.gpu_backend, env=self.plan.env, dmon_log=cfg.dmon_log)
            host = HostSampler(run_dir=self.plan.run_dir, emit=self.journal.emit, every=cfg.gpu_every)
            await tg.start(self._guarded("gpu", partial(self.gpu.run, tree_pids=self.tree_pids)))
            await tg.start(self._guarded("host", partial(host.run, tree_pids=self.tree_pids)))
        tg.start_soon(self._guarded("deadline", self._deadline_watch))
        if self.plan.job.scheduler != "local":
            tg.start_soon(self._guarded("kill-wait", self._learn_kill_wait))
        if cfg.hang_after != 0.0:  # on by default: the learned bound alone (docs/slurm.md, "Hangs")
            tg.start_soon(self._guarded("hang", self._hang_watch))
        if self.mirror is not None:
            self.mirror.attach(self.journal.emit, writers=self.tree_pids)
            self.journal.emit("sync-start", backend=self.mirror.backend_name,
                              pairs=[{"name": p.name, "kind": p.kind, "from": str(p.src), "to": str(p.dst), "nodes": p.nodes,
                                      "profile": p.profile} for p in cfg.sync])
            with anyio.CancelScope() as restore_scope:
                tg.start_soon(self._cancel_on_stop, restore_scope)
                await fleet.start(self.plan, tg, self._guarded, self.journal.emit)  # multi-node: the node agents
                self._set_state(State.RESTORING)
                self.restored_from = await self.mirror.restore()
            await tg.start(self._guarded("sync", self.mirror.run))

    async def _cancel_on_stop(self, scope: anyio.CancelScope) -> None:
        await self._stop_wanted.wait()
        scope.cancel()

    def _guarded(self, name: str, run: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]:
        return partial(guarded, name, run, self.journal.emit)

    def tree_pids(self) -> set[int]:
        return self.child.tree() if self.child is not None else set()

    def child_running(self) -> bool:
        return self.child is not None and self.child.returncode is None

    # ------------------------------------------------------------------ the child

    async def _spawn(self, tg: TaskGroup) -> None:
        env = {**self.plan.env, **self.plan.launcher.child_env(self.cfg.grace),
               **childenv.for_child(run_dir=self.plan.run_dir, attempt=self.plan.attempt, request=self.plan.request_path,
                                    checkpoint_signal=self.plan.checkpoint_signal.name, restored_from=self.restored_from)}
        try:
            self.plan.request_path.unlink()
        except FileNotFoundError:
            pass
        try:
            self.child = await self._spawner(self.cfg.command, env)
        except SpawnError as e:
            log.error("%s", e)
            self.journal.emit("spawn-failed", error=str(e), exit_status=e.exit_status)
            self.exit_status = e.exit_status
            self._request_stop(Trigger(Reason.SPAWN_FAILED, str(e), at=time.monotonic()))
            return
        self.journal.emit("spawn", pid=self.child.pid, pgid=self.child.pgid, argv=list(self.cfg.command),
                          launcher=self.plan.launcher.name, restart=self.restarts)
        log.info("started %s (pid %d, launcher %s)", " ".join(self.cfg.command), self.child.pid, self.plan.launcher.name)
        self._set_state(State.RUNNING)
        tg.start_soon(self._watch_child, tg, self.child)
        if self.restarts == 0:
            tg.start_soon(reap_orphans, lambda: self.child, self.journal.emit)

    async def _watch_child(self, tg: TaskGroup, child: Child) -> None:
        status = await child.wait()
        self.journal.emit("child-exit", pid=child.pid, exit_status=status, returncode=child.returncode)
        log.info("training exited with status %d", status)
        if self.trigger is not None or child is not self.child:
            return
        if policy.restart_in_place(status, restarts=self.restarts, max_restarts=self.cfg.max_restarts,
                                   faults=self.faults.reasons):
            self._set_state(State.RESTARTING)
            await child.stop(self.cfg.stop_signal or self.plan.launcher.stop_signal, min(self.cfg.grace, 10.0))
            delay = self.cfg.restart_backoff * 2**self.restarts
            self.restarts += 1
            self.journal.emit("restart", number=self.restarts, of=self.cfg.max_restarts, exit_status=status, backoff_s=delay)
            log.warning("training failed with status %d: restart %d of %d in %s", status, self.restarts,
                        self.cfg.max_restarts, format_duration(delay))
            since = time.monotonic()
            with anyio.move_on_after(delay):
                await self._stop_wanted.wait()
            if self.trigger is None and await self.faults.gate(self.gpu, since, 2 * self.cfg.gpu_every):
                await self._spawn(tg)
            if self.trigger is not None or self.child is not child:
                return
        reason = Reason.CHILD_EXIT if status == 0 else Reason.CHILD_FAILED
        self._request_stop(Trigger(reason, f"exit status {status}", at=time.monotonic()))

    # ------------------------------------------------------------------ signals

    async def _signal_intake(self, signals: AsyncIterator[int]) -> None:
        async for sig in signals:
            await self.deliver(signal.Signals(sig))

    async def deliver(self, sig: signal.Signals, received: float | None = None) -> None:
        """Route one delivered signal; each delivery is passed on at most once."""
        name, received = sig.name, time.monotonic() if received is None else received
        if sig == signal.SIGCONT:
            self.last_cont = received  # slurmstepd sends it with the TERM to every process
            return
        action = "stop" if sig in STOP_SIGNALS else policy.signal_action(
            sig, warn_signal=self.cfg.warn_signal, checkpoint_signal=self.plan.checkpoint_signal, end=self.end,
            now=time.time(), lead=self.lead)
        if action == "defer" and self.trigger is None:  # docs/slurm.md, "Warning signals"
            self.journal.emit("signal", signal=name, action="deferred", stop_at=self.end - self.lead)  # type: ignore[operator]
            log.warning("received %s: the end is near; stopping %s before it", name, format_duration(self.lead))
        elif action in ("stop", "defer"):
            if self.trigger is None:
                reason = Reason.DEADLINE if sig not in STOP_SIGNALS else policy.classify_signal(
                    sig, warn_signal=self.cfg.warn_signal, end=self.end, now=time.time())
                self.journal.emit("signal", signal=name, action="stop", reason=reason.value)
                log.warning("received %s: stopping (%s)", name, reason.value)
                self._request_stop(Trigger(reason, f"received {name}", sig, received))
            else:  # a second TERM during the grace period would make mpiexec abandon its ranks
                self.journal.emit("signal", signal=name, action="ignored", why="stop already in progress; not sent twice")
                log.warning("received %s again: the stop is already under way", name)
        elif not self.child_running():
            self.journal.emit("signal", signal=name, action="dropped", why="no running child")
        elif sig == self.plan.checkpoint_signal:
            await request_checkpoint(self.plan, self.child, self.journal.emit, f"received {name}", received=received)
        else:
            delivery = await pass_on(self.plan, self.child, sig, self.cfg.forward)
            self.journal.emit("signal", signal=name, action="forwarded", route=delivery.route, to=delivery.targets,
                              latency_ms=round((time.monotonic() - received) * 1000, 3))
            log.info("forwarded %s to %s %s", name, delivery.route, delivery.targets)

    def _request_stop(self, trigger: Trigger) -> None:
        if self.trigger is None:
            self.trigger = trigger
            self._stop_wanted.set()

    # ------------------------------------------------------------------ watches

    async def _deadline_watch(self) -> None:
        def warn(left: float, source: str) -> None:
            shown = format_duration(max(0.0, left))
            log.warning("%s left before the job's end: stopping with a checkpoint", shown)
            self.journal.emit("warning", left_s=round(left, 3), source=source)
            if self.notifier is not None:
                self.notifier.post("warning", left=shown)
            self._request_stop(Trigger(Reason.DEADLINE, f"{shown} before the end ({source})", at=time.monotonic()))

        await deadline_watch(cfg=self.cfg, job=self.plan.job, lead=self.plan.lead, basis=self.plan.lead_basis,
                             started_wall=self._started_wall, emit=self.journal.emit, set_end=partial(setattr, self, "end"),
                             set_lead=partial(setattr, self, "lead"), stopping=self._stop_wanted, warn=warn)

    async def _learn_kill_wait(self) -> None:
        """KillWait, read once at start: after Slurm's TERM to the whole job it is all we have."""
        self.kill_wait = await jobs.kill_wait(self.plan.job, report=log.warning) or self.kill_wait

    async def _hang_watch(self) -> None:
        def marks() -> list[float]:
            seen = [self._started, self.mirror.last_activity() if self.mirror else None, self.gpu.last_busy() if self.gpu else None]
            return [m for m in seen if m is not None]

        def hang(idle: float, bound: float) -> bool:
            self.journal.emit("hang", idle_s=round(idle, 1), action=self.cfg.hang_action, bound_s=round(bound, 3),
                              longest_gap_s=self.gaps.longest, earlier_gaps_s=self.gaps.earlier)
            log.warning("no checkpoint, log growth or GPU work for %s: the training may hang", format_duration(idle))
            if self.notifier is not None:
                self.notifier.post("hang", idle=format_duration(idle))
            if self.cfg.hang_action == "stop":
                self._request_stop(Trigger(Reason.HANG, f"idle for {format_duration(idle)}", at=time.monotonic()))
            return self.cfg.hang_action == "stop"

        await hang_watch(limit=self.cfg.hang_after, floor=self.cfg.hang_floor, marks=marks, running=self.child_running, hang=hang, gaps=self.gaps)

    # ------------------------------------------------------------------ time

    def signalled_all(self) -> bool:
        t = self.trigger
        return jobs.signalled_all(self.plan.job.scheduler, t.signal if t else None, t.at if t else None, self.last_cont)

    def kill(self) -> float | None:
        return policy.hard_kill(end=self.end, kill=policy.killed_at(
            self.trigger, scheduler_signalled_all=self.signalled_all(), kill_wait=self.kill_wait,
            now=time.time(), mono=time.monotonic()))

    def time_left(self) -> float:
        """Seconds the remaining steps may take before the job is killed (inf if never)."""
        kill = self.kill()
        t = self.trigger
        return policy.time_left(end=self.end, kill=kill if kill != self.end else None, lead=self.lead, kill_wait=self.kill_wait,
                                now=time.time(), signalled_for=time.monotonic() - t.at if t and t.signal in STOP_SIGNALS else None)

    def _set_state(self, new: State, **fields: Any) -> None:
        old, self.state = self.state, new
        self.journal.emit("state", **{"from": old.value, "to": new.value}, **fields)

    def _journal_start(self) -> None:
        self.journal.emit("start", durable=True, **start_fields(self.plan))
        suspects.at_start(self.cfg.suspect_nodes, self.cfg.suspect_nodes_ttl, this_node(self.plan.env), self.journal.emit)
        log.info("run directory %s, attempt %d", self.plan.run_dir, self.plan.attempt)

    def status(self) -> int:
        """The exit status (policy.exit_status); the launcher's own stays in the journal."""
        clean = self.cfg.stopped_status if self.stopped_cleanly else None
        return policy.exit_status(self.exit_status, self.trigger or policy.NO_TRIGGER, clean_status=clean,
                                  no_progress=self.no_progress)

    def _finish(self) -> int:
        trigger, status = self.trigger or policy.NO_TRIGGER, self.status()
        duration = round(time.monotonic() - self._started, 3)
        pending = self.mirror.pending() if self.mirror is not None else []
        self.journal.emit("end", reason=trigger.reason.value, detail=trigger.detail, exit_status=status,
                          launcher_status=self.exit_status, stopped_cleanly=self.stopped_cleanly,
                          seconds=duration, restarts=self.restarts, not_durable=pending)
        if pending:
            log.warning("not yet on persistent storage: %s", ", ".join(pending))
        log.info("done: %s, exit status %d after %s", trigger.reason.value, status, format_duration(duration))
        self.journal.close()
        return status


async def supervise(cfg: Config, plan: Plan | None = None, early: list[int] | None = None) -> int:
    """Run one supervised attempt; the entry point the CLI calls inside ``anyio.run``.
    ``early``: signals that came before the agent listened, replayed in order."""
    plan = plan or make_plan(cfg)
    logs.add_file(plan.run_dir, cfg.verbosity)
    for warning in plan.warnings:
        log.warning("%s", warning)
    return await Agent(plan, early=early).run()
