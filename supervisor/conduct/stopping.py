"""The one stop sequence (docs/design.md), acted out step by step; ``policy`` decides.

trigger → checkpoint (request it, wait for one completed after the request, or the
child's exit) → flush → stop-child (stop signal once → grace → SIGKILL of the tree) →
final-flush → (a multi-node job: which nodes died) → the scheduler's view → end notice → a
dead node replaced by a spare (issue 41), else the requeue. Each step is bounded by what is
left before the hard kill and journaled with its outcome and duration, so the report and
the next attempt's deadline learning can read them.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any, Awaitable, Callable

import anyio

from supervisor import policy, stacks, suspects
from supervisor._units import format_duration
from supervisor.child import exit_status
from supervisor.policy import Reason, Trigger
from supervisor.conduct.fleet import last_flush_wait
from supervisor.conduct.routing import request_checkpoint
from supervisor.conduct.state import RunState, StopResult

log = logging.getLogger("supervise")
EXCLUDE_BOUND = 4.0  # seconds for the node exclusion after the requeue (KillWait is 30 s by default, 5 in tests)
REQUEST_SLACK = 0.02  # a file's mtime can trail the wall clock by a tick


async def emergency_stop(run: RunState) -> None:
    """After a supervisor error: stop the tree, bounded, whatever else is broken."""
    if run.child is not None:
        with anyio.move_on_after(policy.emergency_bound(run.cfg.grace)):
            await run.child.stop(run.stop_signal(), run.cfg.grace)


async def last_flush(run: RunState, bound: float, *, exited: bool) -> dict[str, Any]:
    """The leader's last flush with node agents, in turn: its own pass; then the fleet asks
    every agent for its last (``nodes-flush``) and waits for their answers (most of ``bound``,
    the step's budget); then, if any answered, its pass once more, so a part node K's rank
    saved a moment before the exit is assembled before the end (docs/multinode.md, "The end
    waits for every node's last part"). ``exited``: the training's whole tree is gone."""
    assert run.mirror is not None and run.agents is not None
    t0 = time.monotonic()
    result = await run.mirror.flush("final")
    nodes = await run.agents.flush_nodes("final", exited=exited, within=last_flush_wait(bound))
    if nodes["answered"]:
        result = await run.mirror.flush("final")
    pending = run.pending()
    return {**result, "seconds": round(time.monotonic() - t0, 3),
            "ok": all(r["ok"] for r in result["pairs"].values()) and not pending, "pending": pending, "nodes": nodes}


async def notice(run: RunState, event: str, **fields: Any) -> None:
    """A notification the stop delivers before it goes on (the end's, a requeue's), bounded by
    ``notify_timeout`` and the time left; shielded: a requeue's TERM must not cut it."""
    if run.notifier is None:
        return
    run.notifier.post(event, **fields)
    with anyio.CancelScope(shield=True):
        await run.notifier.drain(min(run.cfg.notify_timeout, max(0.0, run.time_left())))


def no_progress(run: RunState) -> bool:
    """No checkpoint published over the last ``no_progress_attempts`` attempts (this one
    included): a requeue would only repeat the failure (issue 15). Unknowable without a
    checkpoint pair, so never then."""
    if run.mirror is None or not any(p.kind == "checkpoint" for p in run.cfg.sync):
        return False
    earlier = [e for e in run.plan.previous_events if e.get("attempt") != run.plan.attempt]
    progress = policy.progress_by_attempt(earlier) + [run.mirror.published > 0]
    return policy.no_progress(progress, run.cfg.no_progress_attempts)


class StopSequence:
    """Runs the steps for one run; reads its state, never decides alone, and returns what it
    found out (``StopResult``) instead of writing the conductor."""

    def __init__(self, run: RunState) -> None:
        assert run.trigger is not None
        self.run = run
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.exited = False  # the training's whole tree is gone (told the mirror and the node agents)
        self.result = StopResult(trigger=run.trigger, exit_status=run.exit_status)

    async def __call__(self) -> StopResult:
        run, result = self.run, self.result
        self.journal_stop()
        if result.trigger.reason == Reason.HANG:
            await self.step("stacks", self.stacks)
        await self.step("checkpoint", self.checkpoint)
        await self.step("flush", lambda: self.flush("stop"))
        await self.step("stop-child", self.stop_child)
        await self.no_orphans()
        if run.mirror is not None and not run.tree_pids():
            run.mirror.training_exited()  # nothing can change now: no checkpoint waits for quiescence
            self.exited = True
        await self.step("final-flush", lambda: self.flush("final"))
        if run.agents is not None and result.trigger.reason in (Reason.CHILD_FAILED, Reason.NODE_FAILED):
            await self.step("nodes", self.nodes_gone)
        with anyio.move_on_after(10):
            await self.refine_reason()
        result.stopped_cleanly = policy.stopped_cleanly(result.trigger.reason, self.outcomes)
        await self.tell_end()
        if result.trigger.reason == Reason.NODE_FAILED:
            await self.step("replace", self.replace)
        if not result.replace:
            result.requeued = bool((await self.step("requeue", self.requeue)).get("requeued"))
        return result

    def journal_stop(self) -> None:
        """The ``stop`` event: why, and how long is left before the job's end and its hard kill."""
        run, t = self.run, self.result.trigger
        now = time.time()
        run.journal.emit("stop", reason=t.reason.value, detail=t.detail, signal=t.signal.name if t.signal else None,
                         time_left_s=None if run.end is None else round(run.end - now, 3),
                         longest_gap_s=run.gaps.longest,
                         **policy.kill_fields(end=run.end, kill=run.kill(), kill_wait=run.kill_wait, now=now))

    async def step(self, name: str, fn: Callable[[], Awaitable[dict[str, Any] | None]]) -> dict[str, Any]:
        """Run one stop step, journaling its outcome and duration (deadline learning reads them)."""
        t0 = time.monotonic()
        try:
            outcome = await fn() or {}
        except Exception as e:  # noqa: BLE001 - a failed step must not skip the ones after it
            log.exception("stop step %s failed", name)
            outcome = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        seconds = round(time.monotonic() - t0, 3)
        self.outcomes[name] = outcome
        self.run.journal.emit("stop-step", **{**outcome, "step": name, "seconds": seconds})
        if not outcome.get("skipped"):
            log.info("stop step %s: %s", name, format_duration(seconds))
        return outcome

    async def stacks(self) -> dict[str, Any]:
        """Where it hangs: every rank's Python stacks into the run directory (stacks.py), before the stop."""
        run = self.run
        pids = await anyio.to_thread.run_sync(run.tree_pids)
        out = run.plan.run_dir / stacks.STACKS_DIR / f"attempt-{run.plan.attempt}"
        bound = max(1.0, min(60.0, run.time_left() / 4))
        with anyio.move_on_after(bound + 5):
            return await anyio.to_thread.run_sync(partial(stacks.dump, pids, out, timeout=bound), abandon_on_cancel=True)
        return {"outcome": "timeout", "bound_s": round(bound, 3)}

    async def checkpoint(self) -> dict[str, Any]:
        """Ask for a checkpoint and wait until one completed after the request is durable."""
        run, trigger = self.run, self.result.trigger
        if not policy.wants_checkpoint(trigger.reason):
            return {"skipped": f"not wanted after {trigger.reason.value}"}
        child = run.child
        if child is None or child.returncode is not None:
            return {"skipped": "the training is not running"}
        mirror = run.mirror
        # What is being written at the request cannot answer it (policy.started_after_request).
        in_progress = await mirror.in_progress() if mirror is not None else frozenset()
        asked_at = time.time()
        request = await request_checkpoint(run.plan, child, run.journal.emit, trigger.detail or trigger.reason.value,
                                           signal=policy.signal_checkpoint(scheduler_signalled_all=run.signalled_all()))
        if mirror is None or not any(p.kind == "checkpoint" for p in run.cfg.sync):
            return {"outcome": "requested", "why": "no checkpoint pair: completion cannot be seen", **request}
        bound = policy.checkpoint_bound(run.cfg.checkpoint_timeout, run.time_left(), run.cfg.grace)
        if bound <= 0:
            return {"outcome": "no-time", "bound_s": round(bound, 3), **request}
        before = mirror.published
        outcome, answer = "timeout", None
        # a pass now, and no file event waits out a failed copy's backoff: the stop cannot wait that long
        with mirror.hurry("stop-checkpoint"), anyio.move_on_after(bound):
            async with anyio.create_task_group() as tg:
                async def completed() -> None:
                    nonlocal outcome, answer
                    answer = await mirror.wait_completed(asked_at - REQUEST_SLACK, policy.is_requested,
                                                         partial(policy.started_after_request, in_progress=in_progress))
                    outcome = "published"
                    tg.cancel_scope.cancel()

                async def exited() -> None:
                    nonlocal outcome
                    await child.exited.wait()
                    outcome = "child-exited"
                    tg.cancel_scope.cancel()

                tg.start_soon(completed)
                tg.start_soon(exited)
        if outcome == "timeout":
            log.warning("no checkpoint completed after the request within %s", format_duration(bound))
        answered = None
        if outcome == "published":
            # when this attempt's checkpoints were saved (completion evidence, a marker's mtime;
            # not pointers, nor files beside them): not their publish times, whose copy lag
            # jitters under load by more than the rhythm's tolerance (CI, issue 31)
            saves = [p.saved_at for p in mirror.publishes]
            done = min((t for t in saves if t >= asked_at), default=None)  # the first completed after the request
            answered = policy.answered_request(saves, asked_at, done)
            if answered is False:
                log.warning("the stop waited %s for the training's next periodic save: it does not answer checkpoint "
                            "requests (docs/training.md)", format_duration(time.time() - asked_at))
        return {"outcome": outcome, "bound_s": round(bound, 3), "published": mirror.published - before,
                "signalled": request.get("signal") is not None, "answered": answered,
                "answer": answer.ident[0] if answer is not None and answer.ident else None,
                "in_progress": sorted(n for n, _ in in_progress)}

    async def flush(self, reason: str) -> dict[str, Any]:
        run = self.run
        if run.mirror is None:
            return {"skipped": "no sync pairs"}
        spare = self.result.trigger.reason == Reason.NODE_FAILED and bool(run.plan.job.spares)
        bound = policy.flush_bound(run.time_left(), run.cfg.grace, child_running=reason == "stop" and run.child_running(),
                                   spare=spare)
        if bound <= 0:
            return {"outcome": "no-time", "pending": run.pending()}
        with anyio.move_on_after(bound) as scope:
            if reason == "final" and run.agents is not None:
                result = await last_flush(run, bound, exited=self.exited)
            else:
                result = await run.mirror.flush(reason)
        if scope.cancelled_caught:
            return {"outcome": "timeout", "bound_s": round(bound, 3), "pending": run.pending()}
        return {"outcome": "done", **(result or {})}

    async def stop_child(self) -> dict[str, Any]:
        """Stop signal once → grace → SIGKILL of the whole tree; also ends leftovers after an exit."""
        run = self.run
        child, trigger = run.child, self.result.trigger
        if child is None:
            return {"skipped": "no child was started"}
        launcher = run.plan.launcher
        sig = run.stop_signal()
        already = run.signalled_all()
        grace = policy.grace_for(run.cfg.grace, run.time_left(), already_signalled=already,
                                 since_trigger=time.monotonic() - trigger.at)
        targets = None
        if child.returncode is None:
            targets = await anyio.to_thread.run_sync(launcher.stop_targets, child.pid)
        steps = None  # srun: TERM to srun SIGKILLs its tasks; Slurm delivers it to them instead
        if launcher.stop_steps and run.cfg.stop_signal is None and not already and targets is not None:
            ok, text = await run.plan.job.sched.signal_steps(run.plan.job, sig, report=log.warning)
            steps = {"ok": ok, "message": text}
        sisters = await run.agents.signal_ranks(sig) if run.agents and targets is not None and not already else None
        result = await child.stop(sig, grace, targets=set(targets.pids) if targets else None,
                                  route=targets.route if targets else run.cfg.forward,
                                  already_signalled=already or bool(steps and steps["ok"]),
                                  finish=targets.finish if targets else None)
        if steps is not None:
            result["steps_signalled"] = steps
        if sisters is not None:
            result["nodes_signalled"] = sisters  # PBS: what each node agent sent to its node's ranks
        if already:
            result["already_signalled"] = "the scheduler sent SIGTERM to every process of the job; not sent twice"
        with anyio.move_on_after(policy.exit_wait(grace)):
            await child.exited.wait()
        if child.returncode is not None:
            self.result.exit_status = exit_status(child.returncode)
        return result

    async def no_orphans(self) -> None:
        """Nothing of the tree survives us (docs/design.md, invariant 7), whatever the steps did."""
        child = self.run.child
        if child is None:
            return
        if await anyio.to_thread.run_sync(child.tree):
            killed = await child.kill_all()
            self.run.journal.emit("orphans-killed", pids=killed)
            log.warning("killed %d leftover process(es) of the training", len(killed))

    async def nodes_gone(self) -> dict[str, Any]:
        """Which nodes of the attempt died (issue 41, and 42: a failed training with a node the
        scheduler calls down is a node failure, requeued or replaced as one): the ones the
        watch found, else those the scheduler calls gone now, waiting for its word on a
        silent node (``Fleet.gone``) no longer than the time left allows."""
        run = self.run
        if not run.lost:
            within = min(policy.NODE_DOWN_WAIT, max(0.0, run.time_left() / 2))
            for k, state in (await run.agents.gone(within)).items():
                run.lost[run.agents.nodes[k]] = {"node": k, "state": state[0], "reason": state[1]}
        if not run.lost:
            return {"lost": {}}
        t = self.result.trigger
        if t.reason != Reason.NODE_FAILED:
            said = ", ".join(f"{h} ({v['state']})" for h, v in run.lost.items())
            self.result.trigger = Trigger(Reason.NODE_FAILED, f"{t.detail}; {run.plan.job.sched.label} calls {said} gone",
                                          t.signal, t.at)
        return {"lost": run.lost}

    async def replace(self) -> dict[str, Any]:
        """Go on inside the allocation on spare nodes, or leave it to the requeue (``policy.replace_decision``)."""
        run, cfg, job = self.run, self.run.cfg, self.run.plan.job
        lost = sorted(run.lost)
        ok, why = policy.replace_decision(self.result.trigger.reason, lost=lost, leader_lost=job.nodes[0] in run.lost,
                                          spares=len(job.spares), replaced=len(job.lost),
                                          max_replacements=cfg.max_node_replacements)
        if not ok:
            log.warning("node(s) %s died; not replacing them inside the allocation: %s", ", ".join(lost), why)
            return {"replaced": False, "why": why, "spares": list(job.spares)}
        self.result.replace = tuple(lost)
        log.warning("node(s) %s died; going on inside the allocation on spare node(s) %s", ", ".join(lost),
                    ", ".join(job.spares[:len(lost)]))
        return {"replaced": True, "lost": lost, "spares": list(job.spares)}

    async def refine_reason(self) -> None:
        """After a SIGTERM the scheduler's view tells cancel, requeue, preemption and the time
        limit apart (they all send the same TERM); under Slurm also when the training died of a
        stop signal before supervise's own TERM arrived (``Scheduler.refine_reason``)."""
        run, trigger, job = self.run, self.result.trigger, self.run.plan.job
        termed = trigger.signal is not None and trigger.signal.name == "SIGTERM"
        died = trigger.reason == Reason.CHILD_FAILED and policy.died_of_stop_signal(self.result.exit_status)
        found = await job.sched.refine_reason(job, trigger.reason.value, termed=termed, died=died, report=log.warning)
        if found is None:
            return
        self.result.requeued_by_scheduler = found.requeued
        run.journal.emit("reason", **found.fields)
        if found.reason != trigger.reason.value:
            self.result.trigger = Trigger(Reason(found.reason), f"{trigger.detail}; {found.said}", trigger.signal, trigger.at)

    async def tell_end(self) -> None:
        """The end's notice (finished, failed, preempted), delivered before a requeue's TERM."""
        run = self.run
        if run.notifier is None:
            return
        reason = self.result.trigger.reason
        status = self.result.status(run.cfg.stopped_status)
        await notice(run, policy.END_NOTICE[reason], reason=reason.value, exit_status=status, attempt=run.plan.attempt)

    async def requeue(self) -> dict[str, Any]:
        run, cfg, trigger = self.run, self.run.cfg, self.result.trigger
        job = run.plan.job
        suspect, node = policy.exclude_node(trigger.reason, run.faults.reasons), job.sched.node_name(run.plan.env)
        listed: list[str] = []
        with anyio.move_on_after(suspects.BOUND_S):  # the shared list on a hung file system never holds the stop
            listed = await anyio.to_thread.run_sync(partial(  # this node added, the others read
                suspects.on_requeue, cfg.suspect_nodes, cfg.suspect_nodes_ttl, node, suspect, run.journal.emit,
                job_id=job.job_id, run_dir=str(run.plan.run_dir)), abandon_on_cancel=True)
        wanted, why = policy.requeue_decision(trigger.reason, requeue=cfg.requeue, on_failure=cfg.requeue_on_failure,
                                              queued=job.sched.is_batch, already=self.result.requeued_by_scheduler,
                                              restart_count=job.restart_count, max_requeues=cfg.max_requeues,
                                              suspect=bool(run.faults.reasons))
        if wanted and await anyio.to_thread.run_sync(no_progress, run):
            self.result.no_progress = True
            k = cfg.no_progress_attempts
            run.journal.emit("requeue-refused", why="no-progress", attempts=k, restart_count=job.restart_count,
                             max_requeues=cfg.max_requeues)
            log.error("not requeueing: no new checkpoint in the last %d attempt(s); the run cannot progress", k)
            await notice(run, "no-progress", attempts=k, attempt=run.plan.attempt, reason=trigger.reason.value)
            return {"requeued": False, "why": f"no checkpoint published in {k} attempt(s)"}
        if not wanted:
            if why.startswith("max_requeues"):
                run.journal.emit("requeue-refused", restart_count=job.restart_count, max_requeues=cfg.max_requeues)
                log.warning("not requeueing: %d requeues already (max %d)", job.restart_count, cfg.max_requeues)
                return {"requeued": False, "why": why}
            return {"skipped": why}
        await notice(run, "requeued", attempt=run.plan.attempt, reason=trigger.reason.value)
        # Requeueing sends us SIGTERM at once (Slurm): it is the very last thing we do, and
        # that TERM must not cut the journal's `end` (the training is already stopped).
        run.dispositions.ignore_stop()
        ok, message = await job.sched.requeue(job, timeout=min(60.0, max(5.0, run.time_left())), report=log.warning)
        log.info("requeue: %s", message)
        result: dict[str, Any] = {"requeued": ok, "message": message, "restart_count": job.restart_count}
        if not ok:
            hint = job.sched.requeue_hint(message)
            run.journal.emit("requeue-failed", message=message, hint=hint, restart_count=job.restart_count)
            log.error("could not requeue: %s%s", message, f" ({hint})" if hint else "")
            if hint:
                result["hint"] = hint
        nodes = list(dict.fromkeys(([node] if suspect else []) + listed))
        if ok and nodes:  # after the requeue: Slurm changes ExcNodeList only on a pending job
            done, text = await job.sched.exclude_nodes(job, nodes, timeout=EXCLUDE_BOUND, report=log.warning)
            if suspect:
                log.warning("node %s is suspect (%s): %s", node, "; ".join(suspect), "excluded" if done else text)
            if listed:
                log.warning("nodes on the shared suspect-node list: %s: %s", ", ".join(listed), "excluded" if done else text)
            result.update(excluded=nodes if done else [], suspect=suspect, exclude_message=text)
            if listed:
                result["listed"] = listed
        return result
