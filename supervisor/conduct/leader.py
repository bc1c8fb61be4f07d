"""The leader's role (node 0, or the only node): the training, the signals, the stop sequence.

The conductor (``agent.Agent``) runs it; it decides nothing alone: ``policy`` decides,
``stopping.StopSequence`` acts out the stop and returns what it found, ``routing`` routes each
delivered signal, the watches (``watches.py``) learn the job's clock, ``fleet`` starts the node
agents of a multi-node job and agrees with them on what every node restores. What they share is
one ``state.RunState``; its ``trigger`` is the stop asked (the first one wins).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import contextmanager
from functools import partial
from typing import Any, Awaitable, Callable, Iterator

import anyio
from anyio.abc import TaskGroup

from supervisor import childenv, policy, suspects
from supervisor._units import format_duration
from supervisor.child import Child, SpawnError
from supervisor.conduct import fleet, relay, routing, watches
from supervisor.conduct.dispositions import Dispositions, ProcessDispositions
from supervisor.conduct.guard import cancel_when, reap_orphans
from supervisor.conduct.role import Conductor
from supervisor.conduct.state import RunState, StopResult
from supervisor.conduct.stopping import StopSequence, emergency_stop
from supervisor.journal import Emit, Journal
from supervisor.plan import Plan, job_label, start_fields
from supervisor.policy import STOP_SIGNALS, Reason, State, Trigger
from supervisor.ports import ChildPort, NotifierPort, SamplerPort

log = logging.getLogger("supervise")
Spawn = Callable[[tuple[str, ...], dict[str, str]], Awaitable[ChildPort]]  # Child.spawn: the command, its environment


class LeaderRole:
    """The leader's collaborators: ``run_state`` is what it shares with the stop sequence and
    the watches; the stop sequence's ``StopResult`` (even a partial one, after an error) is what
    the end reads."""

    conductor: Conductor

    def __init__(self, plan: Plan, *, spawn: Spawn = Child.spawn, notifier: NotifierPort | None = None,
                 early: list[int] | None = None, dispositions: Dispositions | None = None,
                 replacing: Callable[[Journal], None] = lambda _journal: None) -> None:
        """``spawn``, ``notifier`` and ``dispositions`` are seams for the in-process tests
        (tests/core/test_conductor.py): the real ones change the whole process. ``replacing``
        journals, at the spawn, the replacement this attempt is (``conduct/allocation.py``)."""
        self.plan, self.cfg, self._replacing = plan, plan.cfg, replacing
        self._spawner, self._early = spawn, early if early is not None else []
        self.journal = journal = Journal(plan.run_dir, plan.attempt)
        for url in self.cfg.notify:  # before `start`, whose argv may hold them
            journal.add_secret(url)
        self.run_state = RunState(plan, journal, dispositions or ProcessDispositions(), mirror=plan.mirror,
                                  notifier=notifier)
        self._stop: StopSequence | None = None
        self._signals: Any = None
        self._started_wall = time.time()

    @contextmanager
    def held(self) -> Iterator[bool]:
        try:
            yield True
        finally:
            self.journal.close()

    def journal_start(self) -> None:
        self.journal.emit("start", durable=True, **start_fields(self.plan))
        suspects.at_start(self.cfg.suspect_nodes, self.cfg.suspect_nodes_ttl, self.plan.job.sched.node_name(self.plan.env),
                          self.journal.emit)
        log.info("run directory %s, attempt %d", self.plan.run_dir, self.plan.attempt)

    @contextmanager
    def listening(self) -> Iterator[object]:
        """The receiver outlives the task group: while its parts wind down (a worker thread may
        sit in a slow NVML call), a TERM must still find a handler, not the default."""
        run = self.run_state
        caught = policy.caught_signals(self.cfg.warn_signal, self.plan.checkpoint_signal)
        run.dispositions.quiet_stray(caught)  # every other catchable signal is ignored, not left to kill us
        with anyio.open_signal_receiver(*caught) as self._signals:
            yield self._signals
        run.dispositions.ignore_stop()  # the receiver's exit restored the defaults
        run.dispositions.quiet_stray(STOP_SIGNALS)  # nor may a HUP or ALRM cut `end`

    # ------------------------------------------------------------------ the parts

    async def start(self, tg: TaskGroup) -> None:
        """Signals first (those that came before we listened, in order, before anything starts),
        then the notifier."""
        cfg, run = self.cfg, self.run_state
        tg.start_soon(routing.intake, self.deliver, self._signals)
        while self._early:
            await self.deliver(signal.Signals(self._early.pop(0)))
        if cfg.notify and run.notifier is None:
            from supervisor.notify import Notifier

            run.notifier = Notifier(self.plan.notify_urls, fmt=cfg.notify_format, timeout=cfg.notify_timeout,
                                    emit=self.journal.emit, job_label=job_label(self.plan), add_secret=self.journal.add_secret)
        if run.notifier is not None:
            await tg.start(self.conductor.guarded("notify", run.notifier.run))
            run.notifier.post("start", attempt=self.plan.attempt, command=" ".join(cfg.command), host=os.uname().nodename)

    def gpu_emit(self) -> Emit:
        return self.run_state.faults.through(self.journal.emit)

    def sampled(self, gpu: SamplerPort) -> None:
        self.run_state.gpu = gpu

    def tree_pids(self) -> set[int]:
        return self.run_state.tree_pids()

    async def begin(self, tg: TaskGroup) -> None:
        """The watches, the mirror (the node agents first, then every node's restore), then the
        training, unless a stop was asked before."""
        cfg, run, guarded, wanted = self.cfg, self.run_state, self.conductor.guarded, self.conductor.stop_wanted
        tg.start_soon(guarded("deadline", partial(watches.deadline_watch, run, started_wall=self._started_wall,
                                                  stopping=wanted, request_stop=self.request_stop)))
        if self.plan.job.sched.is_batch:  # a batch job: its TERM has a KILL after it
            tg.start_soon(guarded("kill-wait", partial(watches.learn_kill_wait, run)))
        if cfg.hang_after != 0.0:  # on by default: the learned bound alone (docs/slurm.md, "Hangs")
            tg.start_soon(guarded("hang", partial(watches.progress_watch, run, started=self.conductor.started,
                                                  request_stop=self.request_stop)))
        if run.mirror is not None:
            run.mirror.attach(relay.relaying(self.journal.emit, run.notifier), writers=run.tree_pids)
            self.journal.emit("sync-start", backend=run.mirror.backend_name,
                              pairs=[{"name": p.name, "kind": p.kind, "from": str(p.src), "to": p.where, "nodes": p.nodes,
                                      "profile": p.profile} for p in cfg.sync])
            with anyio.CancelScope() as restore_scope:
                tg.start_soon(cancel_when, wanted, restore_scope)
                run.agents = agents = await fleet.start(self.plan, tg, guarded, self.journal.emit)  # multi-node
                self.conductor.set_state(State.RESTORING)
                run.restored_from, differ = await fleet.restore_everywhere(agents, run.mirror, self.journal.emit)
                if differ is not None:  # nodes that would resume from different versions: never started
                    log.error("%s: not starting the training", differ)
                    self.request_stop(Trigger(Reason.ERROR, differ, at=time.monotonic()))
            await tg.start(guarded("sync", run.mirror.run))
        if run.trigger is None:
            await self._spawn(tg)

    # ------------------------------------------------------------------ the child

    async def _spawn(self, tg: TaskGroup) -> None:
        run = self.run_state
        env = {**self.plan.env, **self.plan.launcher.child_env(self.cfg.grace),
               **childenv.for_child(run_dir=self.plan.run_dir, attempt=self.plan.attempt, request=self.plan.request_path,
                                    checkpoint_signal=self.plan.checkpoint_signal.name, restored_from=run.restored_from)}
        try:
            self.plan.request_path.unlink()
        except FileNotFoundError:
            pass
        try:
            run.child = child = await self._spawner(self.plan.command, env)
        except SpawnError as e:
            log.error("%s", e)
            self.journal.emit("spawn-failed", error=str(e), exit_status=e.exit_status)
            run.exit_status = e.exit_status
            self.request_stop(Trigger(Reason.SPAWN_FAILED, str(e), at=time.monotonic()))
            return
        self.journal.emit("spawn", pid=child.pid, pgid=child.pgid, argv=list(self.plan.command),
                          launcher=self.plan.launcher.name, restart=run.restarts)
        log.info("started %s (pid %d, launcher %s)", " ".join(self.plan.command), child.pid, self.plan.launcher.name)
        self.conductor.set_state(State.RUNNING)
        tg.start_soon(self._watch_child, tg, child)
        if run.restarts == 0:
            tg.start_soon(reap_orphans, lambda: self.run_state.child, self.journal.emit)
            self._replacing(self.journal)
            if run.agents is not None:  # a node that dies is noticed while the training runs (issue 41)
                tg.start_soon(self.conductor.guarded("node-watch", partial(fleet.watch_nodes, run, self.request_stop)))

    async def _watch_child(self, tg: TaskGroup, child: ChildPort) -> None:
        run, cfg = self.run_state, self.cfg
        status = await child.wait()
        self.journal.emit("child-exit", pid=child.pid, exit_status=status, returncode=child.returncode)
        log.info("training exited with status %d", status)
        if run.trigger is not None or child is not run.child:
            return
        if policy.restart_in_place(status, restarts=run.restarts, max_restarts=cfg.max_restarts, faults=run.faults.reasons):
            self.conductor.set_state(State.RESTARTING)
            await child.stop(run.stop_signal(), policy.restart_grace(cfg.grace))
            delay = cfg.restart_backoff * 2**run.restarts
            run.restarts += 1
            self.journal.emit("restart", number=run.restarts, of=cfg.max_restarts, exit_status=status, backoff_s=delay)
            log.warning("training failed with status %d: restart %d of %d in %s", status, run.restarts,
                        cfg.max_restarts, format_duration(delay))
            since = time.monotonic()
            with anyio.move_on_after(delay):
                await self.conductor.stop_wanted.wait()
            if run.trigger is None and await run.faults.gate(run.gpu, since, 2 * cfg.gpu_every):
                await self._spawn(tg)
            if run.trigger is not None or run.child is not child:
                return
        reason = Reason.CHILD_EXIT if status == 0 else Reason.CHILD_FAILED
        self.request_stop(Trigger(reason, f"exit status {status}", at=time.monotonic()))

    # ------------------------------------------------------------------ signals and the stop

    async def deliver(self, sig: signal.Signals, received: float | None = None) -> None:
        """Route one delivered signal (routing.deliver); each delivery is passed on at most once."""
        await routing.deliver(self.run_state, sig, time.monotonic() if received is None else received, self.request_stop)

    def request_stop(self, trigger: Trigger) -> None:
        if self.run_state.trigger is None:
            self.run_state.trigger = trigger
            self.conductor.stop_wanted.set()

    def why(self) -> dict[str, Any]:
        trigger = self.run_state.trigger
        assert trigger is not None
        return {"reason": trigger.reason.value, "detail": trigger.detail}

    async def stop(self) -> None:
        self._stop = StopSequence(self.run_state)
        await self._stop()
        self.run_state.dispositions.ignore_stop()

    async def failed(self, cause: BaseException) -> None:
        run = self.run_state
        await emergency_stop(run)
        run.trigger = run.trigger or Trigger(Reason.ERROR, f"{type(cause).__name__}: {cause}", at=time.monotonic())

    @property
    def replace(self) -> tuple[str, ...]:
        """The dead nodes the next attempt replaces with spares (``conduct/allocation.py``); () when none."""
        return self._stop.result.replace if self._stop else ()

    def outcome(self) -> tuple[dict[str, Any], int]:
        run = self.run_state
        result = self._stop.result if self._stop else StopResult(run.trigger or policy.NO_TRIGGER, run.exit_status)
        pending = run.pending()
        status = result.status(self.cfg.stopped_status, not_durable=policy.owed(pending),
                               not_durable_status=self.cfg.not_durable_status)
        if pending:
            log.warning("not yet on persistent storage: %s", ", ".join(pending))
        log.info("done: %s, exit status %d after %s", result.trigger.reason.value, status,
                 format_duration(time.monotonic() - self.conductor.started))
        return {"reason": result.trigger.reason.value, "detail": result.trigger.detail, "exit_status": status,
                "launcher_status": result.exit_status, "stopped_cleanly": result.stopped_cleanly,
                "restarts": run.restarts, "not_durable": pending,
                **({"replace": list(result.replace)} if result.replace else {})}, status
