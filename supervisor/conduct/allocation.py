"""One allocation, one or more attempts: a dead node replaced by a spare, without the queue (issue 41).

The leader runs one ``Agent`` per attempt. An attempt that ends because a node died, with a
spare left for it (``StopResult.replace``, decided by ``policy.replace_decision``), is followed
here, in the same process and the same allocation, by the next attempt: a new plan over the
nodes left (``make_plan(lost=…)``: the dead node out, the first spare in), its own node agents,
the same offer, choice and restore on every node, the new one included, and the launcher again,
told the new node list (``nodeset.on_nodes``). It is a requeued attempt in every way the
journal and the report see (a new attempt number, ``node-lost`` for the dead node), less the
queue wait and the new allocation. A node that dies during that start is handled the same way.
"""

from __future__ import annotations

import logging
import signal
import time
from functools import partial
from pathlib import Path
from typing import Callable

import anyio

from supervisor import logs, nodeset
from supervisor.conduct.agent import Agent
from supervisor.conduct.leader import LeaderRole
from supervisor.config import Config
from supervisor.errors import ConfigError
from supervisor.journal import EVENTS_FILE, Journal, node_dir, read_journal
from supervisor.plan import Plan, make_plan

log = logging.getLogger("supervise")
WIND_DOWN_S = 15.0  # at most this long the next attempt waits for the last one's node agents to end
HELD = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


async def supervise(cfg: Config, plan: Plan | None = None, early: list[int] | None = None) -> int:
    """Run the attempts of this allocation; the entry point the CLI calls inside ``anyio.run``.
    ``early``: signals that came before the first agent listened, replayed in order."""
    lost: tuple[str, ...] = ()
    plan = plan or make_plan(cfg)
    logs.add_file(plan.run_dir, cfg.verbosity)
    replacing: Callable[[Journal], None] = _not_a_replacement
    while True:
        await anyio.to_thread.run_sync(_nodefile, plan)
        agent = Agent(plan, LeaderRole(plan, early=early, replacing=replacing))
        status = await agent.run()
        leader = agent.role
        if not leader.replace:
            return status
        early = _hold()  # a TERM between two attempts is the next one's, never lost
        ended = time.monotonic()
        lost += leader.replace
        await _wind_down(leader)
        before = plan
        try:
            plan = await anyio.to_thread.run_sync(partial(make_plan, cfg, lost=lost))
        except ConfigError as e:  # the allocation cannot hold the next attempt after all
            log.error("cannot go on inside the allocation: %s", e)
            return status
        log.info("attempt %d on %s (%s lost; %.1fs between the attempts)", plan.attempt, ", ".join(plan.job.nodes),
                 ", ".join(lost), time.monotonic() - ended)
        replacing = partial(_journal_replaced, leader, before, plan, ended, time.monotonic())


def _not_a_replacement(journal: Journal) -> None:
    """The first attempt of an allocation replaces nothing."""


def _journal_replaced(old: LeaderRole, before: Plan, now: Plan, ended: float, planned: float, journal: Journal) -> None:
    """``node-replaced``, at the new attempt's spawn: the dead node(s), the spare(s) taken, the
    new node list, the launcher's command as it now runs, and the seconds of each phase since
    the first evidence of the death (the watch's or the training's exit): the stop (the last
    attempt's steps, its final flush publishing what the survivors held whole), the wind-down
    and the new plan, then the new node agents, the choice and restore, and the spawn."""
    spawned = time.monotonic()
    trigger = old.replace and old.run_state.trigger
    evidence = trigger.at if trigger else ended
    taken = [n for n in now.job.nodes if n not in before.job.nodes]
    journal.emit("node-replaced", lost={h: old.run_state.lost.get(h, {}) for h in old.replace}, spares=taken,
                 nodes=list(now.job.nodes), spares_left=list(now.job.spares), attempt_before=before.attempt,
                 replacements=len(now.job.lost), argv=list(now.command),
                 seconds={"stop": round(ended - evidence, 3), "between": round(planned - ended, 3),
                          "restore_launch": round(spawned - planned, 3), "total": round(spawned - evidence, 3)})


def _nodefile(plan: Plan) -> None:
    """The attempt's own nodefile, when it trains on fewer nodes than a job with a nodefile has
    (PBS): the job's nodefile variable, in the command and the training's environment, names it."""
    j = plan.job
    if j.nodefile and j.allocation:
        nodeset.write_nodefile(j.nodefile, str(nodeset.nodefile_path(plan.run_dir, j.nodes)), j.nodes)


def _hold() -> list[int]:
    """Keep the stop and pass-on signals that come until the next agent listens (as the CLI
    does before the first): the last agent's receiver is closed and its end ignored them."""
    held: list[int] = []
    for sig in HELD:
        signal.signal(sig, lambda n, _frame: held.append(n))
    return held


async def _wind_down(agent: LeaderRole) -> None:
    """The last attempt's node agents end before the next one's start (each node's agent holds
    its node index's lock): their launch ends (Slurm ends the step with the dead node), or each
    survivor's agent journals its ``end`` after the leader's ``end`` (PBS: the moms' tasks
    end one by one); bounded, never a reason to stop."""
    fleet = agent.run_state.agents
    if fleet is None:
        return
    dead = {fleet.nodes.index(h) for h in agent.replace if h in fleet.nodes}
    alive = sorted((set(fleet.ready) & fleet.want) - dead)
    with anyio.move_on_after(WIND_DOWN_S):
        while not fleet.agents.ended() and not await anyio.to_thread.run_sync(_all_ended, agent.plan.run_dir, alive):
            await anyio.sleep(0.2)


def _all_ended(run_dir: Path, nodes: list[int]) -> bool:
    """Each of these nodes' agents journaled its end after its last start."""
    for k in nodes:
        kinds = [e.get("kind") for e in read_journal(node_dir(run_dir, k) / EVENTS_FILE).events
                 if e.get("kind") in ("node-start", "end")]
        if not kinds or kinds[-1] != "end":
            return False
    return True
