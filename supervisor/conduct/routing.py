"""Where a delivered signal goes: a stop, a deferred warning, a checkpoint request, passed on,
or dropped (docs/slurm.md, "Signals"); ``policy.signal_action`` decides, this acts.

``request_checkpoint`` is also the stop sequence's first act ("checkpoint now": the request
file, then the checkpoint signal to the ranks).
"""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

import anyio

from supervisor import childenv, policy
from supervisor._units import format_duration
from supervisor.policy import STOP_SIGNALS, Reason, Trigger

if TYPE_CHECKING:
    from supervisor.journal import Emit
    from supervisor.plan import Plan
    from supervisor.ports import ChildPort, DeliveryPort
    from supervisor.conduct.state import RunState

log = logging.getLogger("supervise")


async def intake(deliver: Callable[[signal.Signals], Awaitable[None]], signals: AsyncIterator[int]) -> None:
    """Every signal the receiver gets, one at a time, in the order it came."""
    async for sig in signals:
        await deliver(signal.Signals(sig))


async def deliver(run: RunState, sig: signal.Signals, received: float, request_stop: Callable[[Trigger], None]) -> None:
    """Route one delivered signal; each delivery is passed on at most once."""
    name, cfg = sig.name, run.cfg
    if sig == signal.SIGCONT:
        run.last_cont = received  # slurmstepd sends it with the TERM to every process
        return
    action = "stop" if sig in STOP_SIGNALS else policy.signal_action(
        sig, warn_signal=cfg.warn_signal, checkpoint_signal=run.plan.checkpoint_signal, end=run.end,
        now=time.time(), lead=run.lead)
    if action == "defer" and run.trigger is None:  # docs/slurm.md, "Warning signals"
        run.journal.emit("signal", signal=name, action="deferred", stop_at=run.end - run.lead)  # type: ignore[operator]
        log.warning("received %s: the end is near; stopping %s before it", name, format_duration(run.lead))
    elif action in ("stop", "defer"):
        if run.trigger is None:
            reason = Reason.DEADLINE if sig not in STOP_SIGNALS else policy.classify_signal(
                sig, warn_signal=cfg.warn_signal, end=run.end, now=time.time())
            run.journal.emit("signal", signal=name, action="stop", reason=reason.value)
            log.warning("received %s: stopping (%s)", name, reason.value)
            request_stop(Trigger(reason, f"received {name}", sig, received))
        else:  # a second TERM during the grace period would make mpiexec abandon its ranks
            run.journal.emit("signal", signal=name, action="ignored", why="stop already in progress; not sent twice")
            log.warning("received %s during the stop (%s): not passed on", name, run.trigger.reason.value)
    elif not run.child_running():
        run.journal.emit("signal", signal=name, action="dropped", why="no running child")
    elif sig == run.plan.checkpoint_signal:
        await request_checkpoint(run.plan, run.child, run.journal.emit, f"received {name}", received=received)
    else:
        delivery = await pass_on(run.plan, run.child, sig, cfg.forward)
        run.journal.emit("signal", signal=name, action="forwarded", route=delivery.route, to=delivery.targets,
                         latency_ms=round((time.monotonic() - received) * 1000, 3))
        log.info("forwarded %s to %s %s", name, delivery.route, delivery.targets)


async def pass_on(plan: Plan, child: ChildPort, sig: int, forward: str) -> DeliveryPort:
    """A passed-on signal: to the launcher process itself (found behind a wrapper shell:
    ``horovodrun --mpi`` execs ``sh -c mpirun``), or to the launcher's whole process group."""
    if forward == "group":
        return child.send(sig, "group")
    pid = await anyio.to_thread.run_sync(plan.launcher.find_launcher, child.pid)
    return child.send_to({pid}, sig, "launcher")


async def request_checkpoint(plan: Plan, child: ChildPort, emit: Emit, why: str, *, received: float | None = None,
                             signal: bool = True) -> dict[str, Any]:
    """"Checkpoint now": a fresh request file, plus the checkpoint signal to the ranks when
    ``signal`` (policy.signal_checkpoint); journaled as ``checkpoint-request``."""
    def prepare() -> Any:
        # The file first: a rank that saw the signal must not count the file of the same
        # request as a second one. Finding ranks reads /proc: off the loop, in one hop.
        try:
            childenv.write_request(plan.request_path, why)
        except OSError as e:  # a full run directory: the signal still goes
            request_error.append(f"{e.strerror or e}")
        return plan.launcher.checkpoint_targets(child.pid, plan.checkpoint_signal) if signal else None

    request_error: list[str] = []
    targets = await anyio.to_thread.run_sync(prepare)
    fields: dict[str, Any] = {"request_file": str(plan.request_path), "signal": None}
    if request_error:
        fields["request_file_error"] = request_error[0]
    if targets is not None:
        delivery = child.send_to(set(targets.pids), plan.checkpoint_signal, targets.route)
        fields.update(signal=plan.checkpoint_signal.name, route=targets.route, to=delivery.targets,
                      skipped={str(k): v for k, v in targets.skipped.items()})
    else:
        fields["why_no_signal"] = "the scheduler already sent SIGTERM to every process: the training is leaving"
    if received is not None:
        fields["latency_ms"] = round((time.monotonic() - received) * 1000, 3)
    emit("checkpoint-request", why=why, **fields)
    log.info("checkpoint requested (%s)%s", why, f": {fields['signal']} to {fields['to']}" if targets else "")
    return fields
