"""The conductor, one class on every node: one task group, the parts, the one stop, the end.

It runs a ``plan.Plan`` (built and validated before anything starts, the leader's or node
K's: ``make_plan(…, node_rank=K)``) through a role (``role.Role``): the leader's
(``leader.LeaderRole``: the training, the signal routing, the stop sequence) or node K's
(``node.NodeRole``: its end of the leader's line, the training's processes here, the stop the
leader's ``end`` asks for). As torch elastic's ``SimpleElasticAgent`` is one class on every
node, the conductor is the same on both: the parts are started with ``tg.start`` so each is
ready, or has failed, before what follows (the leader's training); the run moves through
named states (``starting → restoring → running → stopping → stopped``), each a ``state``
event; the first stop asked wins (``stop_wanted``); an error is journaled and the role makes
the node safe; the end is one ``end`` event, which the role fills in (node K's carries
``node``) (docs/design.md, docs/journal.md).
"""

from __future__ import annotations

import logging
import signal
import time
from functools import partial
from typing import Any, Awaitable, Callable, Generic, TypeVar

import anyio

from supervisor.conduct.guard import guarded
from supervisor.conduct.role import Role
from supervisor.errors import root_cause
from supervisor.plan import Plan
from supervisor.policy import State

log = logging.getLogger("supervise")
R = TypeVar("R", bound=Role)


class Agent(Generic[R]):
    """Conducts one attempt, the leader's or node K's. ``await Agent(plan, role).run()``
    returns the exit status; ``role`` is ``leader.LeaderRole(plan, …)`` or ``node.NodeRole(plan)``."""

    def __init__(self, plan: Plan, role: R) -> None:
        self.plan, self.cfg, self.role = plan, plan.cfg, role
        role.conductor = self
        self.state = State.STARTING
        self.stop_wanted = anyio.Event()
        self.started = time.monotonic()

    async def run(self) -> int:
        """Start, conduct until a stop is asked, stop safely, end; the exit status."""
        role = self.role
        with role.held() as held:
            if not held:
                return 0
            for warning in self.plan.warnings:
                log.warning("%s", warning)
            role.journal_start()
            with role.listening():
                try:
                    async with anyio.create_task_group() as tg:
                        await role.start(tg)
                        await self._start_samplers(tg)
                        await role.begin(tg)
                        await self.stop_wanted.wait()
                        self.set_state(State.STOPPING, **role.why())
                        await role.stop()
                        self.set_state(State.STOPPED)
                        tg.cancel_scope.cancel()
                except Exception as e:  # noqa: BLE001 - docs/design.md, invariant 4: never leave the child unsupervised
                    cause = root_cause(e)
                    log.error("supervisor error: %s: %s", type(cause).__name__, cause, exc_info=cause)
                    role.journal.emit("error", error=f"{type(cause).__name__}: {cause}")
                    with anyio.CancelScope(shield=True):
                        await role.failed(cause)
            fields, status = role.outcome()
            role.journal.emit("end", **fields, seconds=round(time.monotonic() - self.started, 3))
            return status

    async def _start_samplers(self, tg: anyio.abc.TaskGroup) -> None:
        """This node's GPUs and host, sampled into its journal directory (the run directory, or
        ``nodes/node-K/``): ``gpu.csv``, ``host.csv``, their events in its journal."""
        cfg = self.cfg
        if cfg.gpu_every <= 0:
            return
        from supervisor.gpu import GpuSampler
        from supervisor.host import HostSampler

        where, role = self.plan.journal_dir, self.role
        gpu = GpuSampler(run_dir=where, emit=role.gpu_emit(), every=cfg.gpu_every, backend=cfg.gpu_backend,
                         env=self.plan.env, dmon_log=cfg.dmon_log)
        role.sampled(gpu)
        host = HostSampler(run_dir=where, emit=role.journal.emit, every=cfg.gpu_every)
        await tg.start(self.guarded("gpu", partial(gpu.run, tree_pids=role.tree_pids)))
        await tg.start(self.guarded("host", partial(host.run, tree_pids=role.tree_pids)))

    def guarded(self, name: str, run: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]:
        """A part run so that it cannot take the conductor down (``guard.guarded``)."""
        return partial(guarded, name, run, self.role.journal.emit)

    def set_state(self, new: State, **fields: Any) -> None:
        old, self.state = self.state, new
        self.role.journal.emit("state", **{"from": old.value, "to": new.value}, **fields)

    async def deliver(self, sig: signal.Signals, received: float | None = None) -> None:
        """One delivered signal, as the role takes it (the leader's: ``routing.deliver``)."""
        await self.role.deliver(sig, received)
