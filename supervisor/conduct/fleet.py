"""The node agents of a multi-node job, started by the leader: no line in the job script.

A checkpoint pair with ``nodes > 1`` needs one ``supervise node-agent`` on every other node
of the allocation (docs/sync.md, docs/multinode.md). The leader (the main ``supervise``, node
0, in the batch script) starts them itself, before its restore, the way its scheduler starts
a task on each node (``Scheduler.agents``: Slurm one ``srun --overlap`` task per node, whose
stdout brings their lines back; PBS one ``pbsdsh -o -h HOST`` TM task per other node, which say
their lines by appending to their own file under ``RUN/nodes/said-…/``, ``SAY_VAR``). It waits
until each agent has restored its node's local side (each says one ``ready`` line), so the
training never starts on a node whose shards are not back yet; an agent that does not answer
within ``READY_TIMEOUT_S`` is journaled and the run goes on (its part will be missing, never
published partial). The agents end by themselves once the leader's ``end`` is journaled.

At the start of an attempt it also says which nodes of the previous attempt are gone
(``node-lost``): the scheduler calls them down or drained, and the checkpoints whose parts only
they could give were never published (docs/multinode.md, the failure table).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import anyio
from anyio.abc import TaskGroup, TaskStatus

from supervisor import childenv
from supervisor.bell import Bell
from supervisor.conduct.link import LeaderLine
from supervisor.config import Config, agent_view
from supervisor.conduct import wire
from supervisor.conduct.choice import CHOICE_ROUNDS, READY_TIMEOUT_S, offer_path, read_offer, write_choice
from supervisor.conduct.wire import CHOICE_VAR, SAY_VAR
from supervisor.journal import EVENTS_FILE, Emit, JournalTail, node_dir
from supervisor.policy import NODE_DOWN_WAIT, Reason, Trigger
from supervisor.ports import MirrorPort
from supervisor.sched import GONE_STATES, AgentLaunch, Scheduler

if TYPE_CHECKING:
    from supervisor.plan import Plan

log = logging.getLogger("supervise")

SIGNAL_ANSWER_S = 1.5  # PBS: the stop signal to the other nodes' ranks waits this long for their agents' word


def agent_argv(cfg: Config, python: str = sys.executable) -> list[str]:
    """The agents' command: the leader's resolved configuration, whole (``config.agent_view``:
    every pair with all its fields, every setting an agent runs by), whether it came from a
    file, ``SUPERVISE_*`` variables or flags. Re-expressing it as the agent's own flags would
    lose what flags cannot say (pairs that differ, keys only a file or the environment sets);
    a config file read again on another node might not read the same."""
    assert cfg.run_dir is not None
    loud = ["-v"] * cfg.verbosity if cfg.verbosity > 0 else ["-q"] * -cfg.verbosity
    return [python, "-m", "supervisor", "node-agent", "--run-dir", str(cfg.run_dir), *loud,
            "--leader-config", json.dumps(agent_view(cfg), separators=(",", ":"))]


class Fleet:
    """Starts, awaits and watches the node agents of one attempt."""

    def __init__(self, argv: list[str], nodes: tuple[str, ...], emit: Emit, env: dict[str, str], run_dir: Path,
                 sched: Scheduler, ready_timeout: float = READY_TIMEOUT_S) -> None:
        self.argv, self.nodes, self.emit, self.env = argv, nodes, emit, env
        self.sched = sched
        self.ready_timeout = ready_timeout
        self.ready: dict[int, float] = {}
        self.offered: dict[int, float] = {}
        self.holds: dict[int, Any] = {}
        self.restored: dict[int, tuple[int, Any]] = {}  # node → (round, what it holds) after each choice's restore
        self.pending: list[str] = []  # what the agents said at the last flush they could not make durable, and who did not answer
        self.run_dir = run_dir  # the agents' journals: RUN/nodes/node-K/
        self.choice_path = wire.choice_path(run_dir, wire.attempt_stamp())
        self.say_dir = wire.said_dir(run_dir, wire.attempt_stamp())
        self.env = {**env, CHOICE_VAR: str(self.choice_path)}
        agents = sched.agents(AgentLaunch(argv=argv, ranked=self.ranked_argv, nodes=nodes, env=self.env,
                                          carry=(CHOICE_VAR, *(v for v in (childenv.JOB_NODES,) if v in self.env)),
                                          say=(SAY_VAR, self.say_dir), said_file=partial(wire.said_file, self.say_dir),
                                          timeout=ready_timeout, report=log.warning))
        assert agents is not None, f"no node agents under {sched.label}"
        self.agents = agents  # how its scheduler starts and hears them
        self._heard_any = anyio.Event()
        self._t0 = time.monotonic()
        self.line = LeaderLine(run_dir, len(nodes), heard=self._said, linked=self._linked)
        self.asking = Asking(run_dir, emit, self.line)  # the requests journaled for them, and their answers
        self._mirror: MirrorPort | None = None

    def connect(self, mirror: MirrorPort) -> None:
        """The leader's mirror hears the nodes' words (``part``) and says its own (``go``,
        ``taken``) on the line. Its last flush is the stop's: ``flush_nodes`` between two of
        the mirror's (``stopping.last_flush``)."""
        self._mirror = mirror
        mirror.link(self.line.ring)

    def _said(self, node: int, word: str) -> None:
        answer = wire.read_message(word, wire.REPLIES)
        if answer is not None:
            self.asking.answered(node, answer)
        elif word == wire.JOURNAL:
            self.asking.heard(node)
        elif self._mirror is not None:
            self._mirror.heard(word)

    def _linked(self, whole: bool) -> None:
        if self._mirror is not None:
            self._mirror.link(on=whole)

    @classmethod
    def from_plan(cls, plan: Plan, emit: Emit) -> Fleet | None:
        """A fleet where one is needed: a batch job of several nodes with a per-node pair."""
        cfg = plan.cfg
        if not plan.job.sched.is_batch or plan.job.num_nodes < 2:
            return None
        if plan.nodes < 2:  # no per-node pair
            return None
        if plan.env.get("SUPERVISE_NODE_AGENTS", "").lower() in ("0", "off", "false", "no"):
            return None
        assert cfg.run_dir is not None
        return cls(agent_argv(cfg), plan.job.nodes, emit, dict(plan.env), cfg.run_dir, plan.job.sched)

    def ranked_argv(self, k: int) -> list[str]:
        """Node ``k``'s agent command, its index given (where the launch sets no rank variable)."""
        at = self.argv.index("node-agent") + 1
        return [*self.argv[:at], "--node-rank", str(k), *self.argv[at:]]

    @property
    def spawn_failed(self) -> dict[int, str]:
        """Nodes whose agent the scheduler could not start (PBS: pbsdsh failed), and why."""
        return self.agents.failed

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the agents; ``started`` once every node other than the leader's has offered
        its versions (or the wait ran out: ``agree`` says which); then hear them until their
        launch ends (srun: a node died, or srun could not reach one) or the run does."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.line.run)  # served before any agent looks for it
            self._t0 = t0 = time.monotonic()
            error = await self.agents.start()
            if error is not None:
                self.emit("node-agents", started=False, error=error, nodes=list(self.nodes))
                task_status.started()
                tg.cancel_scope.cancel()
                return
            tg.start_soon(self.agents.hear, lambda line: self._heard(line, t0), self._poke)
            await self._until(lambda: self.want <= set(self.offered) | set(self.spawn_failed), self.ready_timeout)
            task_status.started()
            status = await self.agents.wait()  # PBS: never (the agents are the moms' tasks)
            log.warning("the node agents' %s ended with status %d before the run did", self.agents.launcher, status)
            tg.cancel_scope.cancel()

    @property
    def want(self) -> set[int]:
        return set(range(1, len(self.nodes)))

    async def _until(self, done: Callable[[], bool], within: float) -> None:
        with anyio.move_on_after(within):
            while not done():
                await self._heard_any.wait()

    def offers(self) -> dict[int, dict[str, Any]]:
        """What each node that offered holds (``offer_path``, written by this attempt's
        agents before their ``offered`` line). Blocking."""
        out: dict[int, dict[str, Any]] = {}
        for k in sorted(self.offered):
            body = read_offer(offer_path(self.run_dir, k), self.choice_path)
            if body is not None:
                out[k] = body
        return out

    async def propose(self, choice: dict[str, Any], turn: int) -> dict[int, Any]:
        """Tell every agent the leader's choice (one version per pair, for every node) and wait
        until each has restored it and said what it holds (``restored``): a node that could
        verify no copy of it holds ``{"unverified": name}``, and the leader chooses again."""
        await anyio.to_thread.run_sync(write_choice, self.choice_path, choice, turn, False)
        self.line.ring(wire.CHOICE)
        said = lambda: {k for k, (r, _h) in self.restored.items() if r == turn}  # noqa: E731
        await self._until(lambda: self.want <= said() | set(self.spawn_failed), self.ready_timeout)
        return {k: h for k, (r, h) in sorted(self.restored.items()) if r == turn}

    async def agree(self, choice: dict[str, Any], turn: int, answered: set[int]) -> dict[int, Any]:
        """The choice of round ``turn`` stands: every agent goes on (a late one restores it first),
        and the leader waits until each that ``answered`` the round has said what it holds
        (``ready``; the others were waited for already)."""
        await anyio.to_thread.run_sync(write_choice, self.choice_path, choice, turn, True)
        self.line.ring(wire.CHOICE)
        await self._until(lambda: answered <= set(self.ready) | set(self.spawn_failed), self.ready_timeout)
        missing = sorted(self.want - set(self.ready))
        more = {"spawn_failed": {str(k): v for k, v in sorted(self.spawn_failed.items())}} if self.spawn_failed else {}
        self.emit("node-agents", started=True, nodes=list(self.nodes), pid=self.agents.pid,
                  argv=self.agents.argv(), launcher=self.agents.launcher,
                  ready=sorted(self.ready), ready_s={str(k): s for k, s in sorted(self.ready.items())},
                  missing=missing, seconds=round(time.monotonic() - self._t0, 3), linked=self.line.connected, **more)
        if missing:
            log.warning("node agents not ready after %.0fs on node(s) %s; their parts may be missing",
                        time.monotonic() - self._t0, ", ".join(str(k) for k in missing))
        else:
            log.info("node agents ready on %d node(s) in %.2fs", len(self.want), time.monotonic() - self._t0)
        return dict(self.holds)

    async def flush_nodes(self, reason: str, *, exited: bool, within: float) -> dict[str, Any]:
        """Ask every ready agent for one last pass now and wait (at most ``within`` seconds)
        until each has journaled its answer: a part node K's rank saved a moment before the
        training exited is then on persistent storage before the leader's own last pass
        assembles it (``nodes-flush`` here, ``node-flush`` with the same ``request`` in
        ``RUN/nodes/node-K/events.jsonl``). Nodes that do not answer in time are named."""
        nodes = sorted(set(self.ready) & self.want)  # node 0's "leader" line is no agent
        request, watches = self.asking.ask(wire.NODES_FLUSH, nodes, reason=reason, exited=exited)
        t0 = time.monotonic()
        answers: dict[int, dict[str, Any]] = {}
        down: dict[int, str] = {}  # nodes whose agent cannot answer: srun said its task ended; PBS calls the node down
        next_look = time.monotonic() + DOWN_POLL_S
        everyone = not self.line.whole  # on the line, the answers come on it: a journal is read for what it did not carry
        with anyio.move_on_after(max(0.0, within)):
            while len(answers) < len(nodes):
                await self.asking.read(watches, wire.NODES_FLUSH, request, answers, everyone=everyone)
                if len(answers) < len(nodes):
                    if self.agents.ended():
                        break  # the agents' srun has ended: nobody is left to answer
                    if time.monotonic() >= next_look:
                        next_look = time.monotonic() + DOWN_POLL_S
                        down.update(await self.agents.down([k for k in nodes if k not in answers and k not in down]))
                        if all(k in answers or k in down for k in nodes):
                            break
                    everyone = not await self.asking.pause()
        missing = [k for k in nodes if k not in answers]
        pending = [line for k in sorted(answers) for line in answers[k].get("not_durable") or []]
        ended = self.agents.ended()
        pending += [f"node {k} ({self.nodes[k]}): {down[k]}; its newest part may be missing"
                    if k in down else f"node {k} ({self.nodes[k]}): its agent ended before it answered the final flush; "
                    "its newest part may be missing" if ended
                    else f"node {k}: did not answer the final flush in {within:.1f}s; its newest part may be missing"
                    for k in missing]
        self.pending = pending
        return {"request": request, "answered": sorted(answers), "missing": missing, "pending": pending,
                "seconds": round(time.monotonic() - t0, 3)}

    async def signal_ranks(self, sig: int, within: float = SIGNAL_ANSWER_S) -> dict[str, Any] | None:
        """PBS: the leader's stop signal for the training's ranks on the other nodes (PBS
        signals only the first node's processes; OpenMPI's remote daemons end their ranks
        without one). Journaled as ``nodes-signal`` (the signal, a request id, the nodes);
        each ready agent sends it to the job's ranks on its node and answers ``node-signal``
        with the same request and the pids in its own journal. Waits at most ``within``
        seconds for the answers, so the leader's own signal to its child follows right after;
        returns what each node signalled. None under Slurm (``scancel --signal`` reaches every
        step's tasks) or without agents."""
        nodes = sorted(set(self.ready) & self.want)
        if self.sched.signals_every_node or not nodes:
            return None
        name = signal.Signals(sig).name
        request, watches = self.asking.ask(wire.NODES_SIGNAL, nodes, signal=name)
        t0 = time.monotonic()
        answers: dict[int, dict[str, Any]] = {}
        everyone = not self.line.whole  # on the line, the answers come on it: a journal is read for what it did not carry
        with anyio.move_on_after(within):
            while len(answers) < len(nodes):
                await self.asking.read(watches, wire.NODES_SIGNAL, request, answers, everyone=everyone)
                if len(answers) < len(nodes):
                    everyone = not await self.asking.pause()
        missing = [k for k in nodes if k not in answers]
        if missing:
            log.warning("the node agents of node(s) %s did not say in %.1fs that they sent %s to their ranks",
                        ", ".join(map(str, missing)), within, name)
        return {"request": request, "signal": name, "seconds": round(time.monotonic() - t0, 3), "missing": missing,
                "nodes": {str(k): {"host": self.nodes[k], "pids": a.get("pids", []),
                                   **({"error": a["error"]} if a.get("error") else {}),
                                   **({"failed": a["failed"]} if a.get("failed") else {})}
                          for k, a in sorted(answers.items())}}

    def silent(self) -> list[int]:
        """Nodes whose agent said it was ready but is off the line now, or all of them once their
        launch ended: the first evidence that a node may have died (its processes, the agent's
        connection with them, are gone before the scheduler calls the node down)."""
        if self.agents.ended():
            return sorted(self.want)
        if not self.line.port:  # no line served: nobody is known to be off it
            return []
        on = set(self.line.connected)
        return sorted(k for k in self.want if k in self.ready and k not in on)

    async def gone(self, within: float) -> dict[int, tuple[str, str]]:
        """Nodes of this attempt that the scheduler calls gone (down, drained, failing), with
        (state, reason): every node asked at once (``Scheduler.node_states``: one ``scontrol`` for
        all of them), and the silent ones (``silent``) again every
        ``DOWN_POLL_S`` for at most ``within`` seconds until one is called gone (the scheduler
        needs its node timeout to say so: Slurm's SlurmdTimeout, PBS's mom heartbeat)."""
        found: dict[int, tuple[str, str]] = {}
        ask = sorted(self.want)
        with anyio.move_on_after(max(0.0, within)):
            while True:
                states = await anyio.to_thread.run_sync(self.sched.node_states, [self.nodes[k] for k in ask])
                for k in ask:
                    state = states.get(self.nodes[k])
                    if state is not None and any(s in state[0].upper() for s in GONE_STATES):
                        found[k] = state
                ask = [k for k in self.silent() if k not in found]
                if found or not ask:
                    break
                await anyio.sleep(DOWN_POLL_S)
        return found

    async def watch(self, died: Callable[[dict[int, tuple[str, str]]], None], within: float) -> None:
        """While the training runs: once a node falls silent, ask the scheduler (``gone``); a node
        it calls gone is ``died`` at once, whether or not the training noticed (a rank blocked in
        a collective can wait minutes for its dead peer). Costs nothing while every node talks."""
        cleared: set[int] = set()  # silent, but the scheduler kept calling them up: asked again once they talk
        while True:
            await anyio.sleep(WATCH_S)
            silent = set(self.silent())
            cleared &= silent
            if silent - cleared:
                found = await self.gone(within)
                if found:
                    died(found)
                    return
                cleared |= silent

    def _heard(self, line: str, t0: float) -> None:
        said = wire.read_said(line)
        if said is not None:
            node, at = said.node, round(time.monotonic() - t0, 3)
            if said.what == wire.OFFERED:
                self.offered.setdefault(node, at)
            elif said.what == wire.RESTORED and said.more:
                try:
                    more = json.loads(said.more)
                    self.restored[node] = (int(more["round"]), more["holds"])
                except (ValueError, KeyError, TypeError):
                    pass
            elif said.what in wire.DONE:
                self.offered.setdefault(node, at)
                self.ready.setdefault(node, at)
                if said.what == wire.READY and said.more:
                    try:
                        self.holds[node] = json.loads(said.more)
                    except ValueError:
                        pass
        self._poke()

    def _poke(self) -> None:
        """Wake whatever waits on what the agents said (or on a spawn that failed)."""
        self._heard_any.set()
        self._heard_any = anyio.Event()


def last_flush_wait(budget: float) -> float:
    """Of the stop's budget for its last flush, the most the leader waits for its agents' answers."""
    return min(budget * NODES_FLUSH_SHARE, NODES_FLUSH_CAP_S)


NODES_FLUSH_SHARE = 0.75  # of the last flush's budget, the most the leader waits for its agents' answers
NODES_FLUSH_CAP_S = 300.0  # ... and never more (hours left before the time limit: a hung agent is not waited out)
class Asking:
    """The leader's requests to its node agents (``wire.ANSWERS``: ``nodes-flush``,
    ``nodes-signal``) and their answers. A request is journaled, the record, and said on the
    line to every node on it (``wire.message``: what it asks, not a word to go and look); node
    K journals its answer with the same ``request`` and says it on the line too (or only
    ``journal`` when it is too long to say). The journals are read only for what the line
    did not carry: the nodes that said ``journal``, and every node yet to answer after a pause
    that ran out (a node off the line finds the request in the leader's journal)."""

    def __init__(self, run_dir: Path, emit: Emit, line: LeaderLine) -> None:
        self.run_dir, self.emit, self.line = run_dir, emit, line
        self.count = 0
        self._said = Bell()  # a node said it journaled an answer (``journal`` on the line)
        self._journaled: set[int] = set()  # the nodes that said so since their journals were last read
        self._told: dict[str, dict[int, dict[str, Any]]] = {}  # request → node → its answer, said on the line

    def heard(self, node: int) -> None:
        """Node ``node`` said ``journal``: its answer is in its journal."""
        self._journaled.add(node)
        self._said.ring()

    def answered(self, node: int, answer: dict[str, Any]) -> None:
        """Node ``node`` said its answer on the line (``wire.read_message``)."""
        told = self._told.get(str(answer["request"]))
        if told is not None:
            told[node] = answer
            self._said.ring()

    def ask(self, kind: str, nodes: list[int], **fields: Any) -> tuple[str, dict[int, JournalTail]]:
        """A request to the agents of ``nodes``: journaled (the record, and where an agent off the
        line finds it), then said on the line to each of them on it; its id, and where each
        node's answer will be if the line does not carry it (its journal, read from here on)."""
        self.count += 1
        request = wire.request_id(self.count)
        watches = {k: JournalTail(node_dir(self.run_dir, k) / EVENTS_FILE) for k in nodes}
        self._told[request] = {}
        self.emit(kind, request=request, **fields, nodes=nodes, durable=True)
        said = wire.message(kind, request, fields)
        if said is not None:
            self.line.tell(nodes, said)
        else:
            self.line.ring(wire.JOURNAL)
        return request, watches

    async def read(self, watches: Mapping[int, JournalTail], kind: str, request: str,
                   answers: dict[int, dict[str, Any]], *, everyone: bool) -> None:
        """The answers to ``request`` (a ``kind`` request) in the journals of the nodes that said
        they answered, or of every node yet to answer (``everyone``: the first look, a pause that
        ran out, a node off the line). One read per answer, not one per node for each answer: at 1,024 nodes a
        last flush read a thousand journals on shared storage each time a node answered (issue 44)."""
        said, self._journaled = self._journaled, set()
        for k, ev in self._told.get(request, {}).items():
            if k in watches and k not in answers and ev.get("kind") == wire.ANSWERS[kind]:
                answers[k] = ev
        for k, w in watches.items():
            if k in answers or not (everyone or k in said):
                continue
            for ev in await anyio.to_thread.run_sync(w.appended):
                if wire.is_answer(ev, kind, request):
                    answers[k] = ev

    async def pause(self) -> bool:
        """Until a node says it answered, or a look at their journals anyway: rarely while every
        node is on the line, else every ``ANSWER_POLL_S``. True when a node said so (and the
        line holds every node: then only those nodes' journals need reading)."""
        return await self._said.wait(LINKED_ANSWER_S if self.line.whole else ANSWER_POLL_S) and self.line.whole


ANSWER_POLL_S = 0.1  # the leader, while it waits for the agents' answers to its last flush
LINKED_ANSWER_S = 1.0  # the same while every agent is on the line: each says when it answered
DOWN_POLL_S = 1.0  # how often that wait asks the scheduler whether a silent node is down (PBS: pbsnodes)
WATCH_S = 1.0  # how often the watch while the training runs looks whether a node fell silent (no scheduler call)


def lost_nodes(previous: list[dict[str, Any]], now: tuple[str, ...], persistent: list[Path],
               node_states: Callable[[list[str]], dict[str, tuple[str, str]]]) -> list[dict[str, Any]]:
    """The nodes of the previous attempt that this one lacks and the scheduler calls gone, each with
    the checkpoints whose parts from it are missing on persistent storage (never published).
    The scheduler is asked once for all of them (``Scheduler.node_states``): a job requeued
    onto other nodes lacks every one of them, 1,023 calls at 1,024 nodes (issue 44)."""
    from supervisor.sync import Mirror  # here only: a run without per-node pairs never imports sync for this

    start = next((e for e in reversed(previous) if e.get("kind") == "start"), None)
    if start is None or not start.get("nodes"):
        return []
    before = [str(n) for n in start["nodes"]]
    states = node_states([host for host in before if host not in now])
    out = []
    for index, host in enumerate(before):
        if host in now:
            continue
        state = states.get(host)
        if state is None or not any(s in state[0].upper() for s in GONE_STATES):
            continue
        lost = [f"{dst.name}/{name}" if len(persistent) > 1 else name
                for dst in persistent for name in Mirror.parts_missing(dst, index)]
        out.append({"node": host, "index": index, "in_attempt": start.get("attempt"), "state": state[0],
                    "reason": state[1], "lost": lost})
    return out


async def journal_lost_nodes(plan: Plan, emit: Emit) -> None:
    """``node-lost`` for each node of the previous attempt that is gone (batch jobs: the scheduler says)."""
    sched = plan.job.sched
    if not sched.is_batch or plan.nodes < 2:
        return
    dsts = [p.dst for p in plan.cfg.sync if p.kind == "checkpoint" and p.nodes > 1 and p.store is None]
    for lost in await anyio.to_thread.run_sync(lost_nodes, plan.previous_events, plan.job.nodes, dsts, sched.node_states):
        emit("node-lost", scheduler=plan.job.scheduler, **lost)
        log.warning("node %s of attempt %s is gone (%s: %s%s)%s", lost["node"], lost["in_attempt"],
                    sched.label, lost["state"],
                    f", {lost['reason']}" if lost["reason"] else "",
                    f": {', '.join(lost['lost'])} only partly saved, never published" if lost["lost"] else "")


async def watch_nodes(run: Any, request_stop: Callable[[Trigger], None]) -> None:
    """The leader's node watch while the training runs (``Fleet.watch``): a node the scheduler
    calls gone stops the attempt as ``node-failed`` at once, noted in ``run.lost`` (RunState)."""
    fleet: Fleet = run.agents

    def died(found: dict[int, tuple[str, str]]) -> None:
        for k, (state, reason) in found.items():
            run.lost[fleet.nodes[k]] = {"node": k, "state": state, "reason": reason}
        said = ", ".join(f"node {k} ({fleet.nodes[k]}): {fleet.sched.label} calls it {s}" for k, (s, _) in sorted(found.items()))
        log.error("%s: stopping the training", said)
        request_stop(Trigger(Reason.NODE_FAILED, said, at=time.monotonic()))

    await fleet.watch(died, NODE_DOWN_WAIT)


def disagreement(holds: dict[int, Any]) -> str | None:
    """Nodes that hold different versions of a pair at the spawn, in words; None if all agree
    (a node that said nothing is not a disagreement: ``node-agents`` names it missing)."""
    by_pair: dict[str, dict[int, Any]] = {}
    for node, pairs in holds.items():
        for pair, version in (pairs or {}).items():
            by_pair.setdefault(pair, {})[node] = version
    for pair, versions in sorted(by_pair.items()):
        ids = {json.dumps(v, sort_keys=True) for v in versions.values()}
        if len(ids) > 1:
            said = "; ".join(f"node {k}: {_version_text(v)}" for k, v in sorted(versions.items()))
            return f"sync {pair}: the nodes hold different versions ({said})"
    return None


def _version_text(v: Any) -> str:
    if not v:
        return "nothing"
    if v.get("unverified"):
        return f"nothing (no copy of {v['unverified']} verified)"
    return f"{v.get('name')} ({v.get('bytes')} bytes, sha256 {str(v.get('sha256'))[:12]})"


async def restore_everywhere(agents: Fleet | None, mirror: Any, emit: Emit) -> tuple[Path | None, str | None]:
    """One version on every node: the leader chooses (after every node offered what it had),
    each agent restores exactly that, then the leader. What each node holds is journaled
    (``restore-versions``); returns the leader's restored path and, when nodes hold different
    versions, the words that stop the start. Without agents, the leader's own restore."""
    if agents is None:
        return await mirror.restore(), None
    offers = await anyio.to_thread.run_sync(agents.offers)
    choice, without, turn = await mirror.choose(offers), {}, 1  # type: dict[str, Any], dict[str, list[str]], int
    while True:
        theirs = await agents.propose(choice, turn)
        restored = await mirror.restore(choice)
        failed = unverified({0: await anyio.to_thread.run_sync(mirror.holds), **theirs})
        if not failed or turn == CHOICE_ROUNDS:
            break
        for pair, name in failed.items():
            without.setdefault(pair, []).append(name)
        log.warning("no copy of %s verified on some node: every node restores the version before it",
                    ", ".join(f"{p}/{n}" for p, n in sorted(failed.items())))
        choice, turn = await mirror.choose(offers, without), turn + 1
    theirs = await agents.agree(choice, turn, answered=set(theirs))
    holds = {0: await anyio.to_thread.run_sync(mirror.holds), **theirs}
    differ = disagreement(holds)
    names = {pair: v.get("checkpoint") if isinstance(v, dict) else v for pair, v in choice.items()}
    emit("restore-versions", choice=names, nodes={str(k): v for k, v in sorted(holds.items())},
         agree=differ is None, missing=sorted(agents.want - set(theirs)), **({"rounds": turn, "passed_over": without} if turn > 1 else {}))
    return restored, differ


def unverified(holds: Mapping[int, Mapping[str, Any]]) -> dict[str, str]:
    """Pair → the chosen version no copy of which verified on some node (``holds``)."""
    return {pair: str(v["unverified"]) for h in holds.values() for pair, v in (h or {}).items()
            if isinstance(v, Mapping) and v.get("unverified")}


async def start(plan: Plan, tg: TaskGroup, guarded: Callable[..., Any], emit: Emit) -> Fleet | None:
    """The agent's one call, before its restore: say which nodes are gone, then start the
    node agents and wait until they have offered their versions (each bounded; never
    fatal). The fleet it returns, if any, then hears the leader's choice (``agree``)."""
    try:
        await journal_lost_nodes(plan, emit)
    except Exception as e:  # noqa: BLE001 - a report line, never a reason to stop
        log.warning("could not tell which nodes are gone: %s", e)
    if plan.job.num_nodes > 1 and plan.mirror is not None:  # this host's files from another node's role are no part of node 0's
        await plan.mirror.prepare(previous_start=plan.previous_start, host=os.uname().nodename)
        await tg.start(guarded("peers", partial(plan.mirror.serve_peers, plan.run_dir)))  # before any node restores
    fleet = Fleet.from_plan(plan, emit)
    if fleet is not None:
        if plan.mirror is not None:
            await anyio.to_thread.run_sync(plan.mirror.share_access, plan.run_dir)  # before any agent reads its pairs
            fleet.connect(plan.mirror)
        await tg.start(guarded("node-agents", fleet.run))
    return fleet
