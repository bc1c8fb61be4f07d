"""Node K's role (``supervise node-agent``): one per node of a multi-node job, mirroring that node's part.

When every node writes its shards of a checkpoint to its own local disk, the main
``supervise`` (the leader, node 0) can only see node 0's. The leader starts one node agent
on every other node (conduct/fleet.py; or the job script does: ``mpiexec --ppn 1 …``). Node
K's agent is the same conductor (``agent.Agent``) with this role: ``make_plan(cfg, env,
node_rank=K)`` builds its plan from the same configuration (the per-node checkpoint pairs, the
``Mirror`` with ``node_rank=K``), and ``Agent(plan, NodeRole(plan)).run()`` runs it: it stages
node K's part of each complete checkpoint on persistent storage and writes its manifest; the
leader publishes once every part is there (docs/sync.md).

The agent journals into ``<run-dir>/nodes/node-K/events.jsonl`` (and ``supervise.log``
beside it), never into the leader's ``events.jsonl``. It runs until the leader's ``end`` is in
``<run-dir>/events.jsonl`` (then one last flush, bounded, so a part that lands late still
counts for the next attempt), or until a second TERM/INT; a first one asks for a flush and
goes on mirroring, because the leader's stop sequence may still be waiting for a checkpoint
that needs this node. Node rank 0 is the leader's: an agent started there (a uniform ``srun``
line) exits at once (``choice.leaders_node``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import anyio
from anyio.abc import TaskGroup

from supervisor import logs, proctree
from supervisor.conduct import routing, wire
from supervisor.conduct.choice import READY_TIMEOUT_S, offer_path, say, write_offer
from supervisor.conduct.leader_words import LeaderWords
from supervisor.conduct.role import Conductor
from supervisor.conduct.wire import LOCK_FILE
from supervisor.errors import ConfigError
from supervisor.jobprocs import JobProcesses
from supervisor.journal import Emit, Journal
from supervisor.plan import Plan, node_start_fields
from supervisor.policy import State
from supervisor.ports import SamplerPort

log = logging.getLogger("supervise")

FINAL_FLUSH_S = 60.0
TRAINING_POLL_S = 1.0  # how often the agent looks for the job's processes on its node (_follow_training)
LEADER_ENDED, SIGNALLED, ERROR = "leader-ended", "signal", "error"  # why node K's agent ends (its ``end``)


class NodeRole:
    """Node K's collaborators: its end of the leader's conversation (``leader_words.LeaderWords``:
    the line, the choice, the leader's requests answered), the job's processes here. Its stop is asked by the leader's ``end`` or a second stop
    signal (the first reason asked wins; an error overrides it); the exit status is 0, or 1
    after an error (journaled; the leader decides what it means)."""

    conductor: Conductor
    journal: Journal

    def __init__(self, plan: Plan) -> None:
        assert plan.node_rank > 0 and plan.mirror is not None, "a node plan: make_plan(cfg, env, node_rank=K)"
        self.plan, self.cfg, self.rank, self.mirror = plan, plan.cfg, plan.node_rank, plan.mirror
        self.reason, self.detail = LEADER_ENDED, ""
        self.training = JobProcesses.from_env(plan.env)  # None outside a job: no writer can be seen, quiet time decides
        self.words = LeaderWords(plan.run_dir, self.rank, self.mirror, self.training,
                                 ended=lambda detail: self.end(LEADER_ENDED, detail))
        self.signals_seen = 0

    @contextmanager
    def held(self) -> Iterator[bool]:
        """The node's journal directory, locked (a second agent for the same node: False), its
        log file and its journal."""
        where = self.plan.journal_dir
        try:
            where.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError("run_dir", str(where), f"cannot be created: {e.strerror}") from None
        lock = _hold(where)
        if lock is None:
            log.info("another node agent for node %d is running (%s): nothing to do", self.rank, where / LOCK_FILE)
            say(wire.DUPLICATE, self.rank)
            yield False
            return
        try:
            logs.add_file(where, self.cfg.verbosity)
            with Journal(where, self.plan.attempt) as self.journal:
                yield True
        finally:
            os.close(lock)

    def journal_start(self) -> None:
        plan = self.plan
        self.mirror.attach(self.journal.emit, writers=self.training)
        self.words.journal = self.journal
        self.mirror.link(self.words.line.say)
        self.journal.emit("node-start", durable=True, **node_start_fields(
            plan, self.training.describe() if self.training is not None else None))
        log.info("node agent %d of %d on %s, journal %s", self.rank, plan.nodes, socket.gethostname(), plan.journal_dir)
        self.words.from_here()  # what the leader says while we restore counts

    def listening(self) -> nullcontext[None]:
        return nullcontext()  # the signals are taken once the node mirrors (``begin``)

    async def start(self, tg: TaskGroup) -> None:
        """The leader's line, the mirror prepared, the peers served, the restore, the mirror
        running; then the leader that started us (conduct/fleet.py) is told what this node
        holds: it compares what every node holds, then spawns the training."""
        mirror, guarded = self.mirror, self.conductor.guarded
        await tg.start(self.words.line.run)
        await mirror.prepare(previous_start=self.plan.previous_start, host=socket.gethostname())
        await tg.start(guarded("peers", partial(mirror.serve_peers, self.plan.run_dir)))  # before any node restores
        self.conductor.set_state(State.RESTORING)
        await self._restore()
        holds = await anyio.to_thread.run_sync(mirror.holds)
        await tg.start(guarded("sync", mirror.run))
        say(wire.READY, self.rank, json.dumps(holds, separators=(",", ":")))

    def gpu_emit(self) -> Emit:
        return self.journal.emit

    def sampled(self, gpu: SamplerPort) -> None:
        """Sampled as the leader samples its own, into this node's directory; not the agent's
        children: the host sampler records the node (memory), not a process tree."""

    def tree_pids(self) -> set[int]:
        return set()

    async def begin(self, tg: TaskGroup) -> None:
        """The training's processes here, followed; the signals; the leader's words."""
        if self.training is not None:
            tg.start_soon(self.conductor.guarded("training", partial(self._follow_training, self.training)))
        tg.start_soon(self._signals)
        tg.start_soon(self.words.run)
        self.conductor.set_state(State.RUNNING)

    def end(self, reason: str, detail: str) -> None:
        """The stop asked: the first reason wins."""
        if not self.conductor.stop_wanted.is_set():
            self.reason, self.detail = reason, detail
            self.conductor.stop_wanted.set()

    def why(self) -> dict[str, Any]:
        return {"reason": self.reason, "detail": self.detail}

    async def failed(self, cause: BaseException) -> None:
        self.reason, self.detail = ERROR, f"{type(cause).__name__}: {cause}"

    def outcome(self) -> tuple[dict[str, Any], int]:
        return {"node": self.rank, "reason": self.reason, "detail": self.detail,
                "not_durable": self.mirror.pending()}, 0 if self.reason != ERROR else 1

    async def _restore(self) -> None:
        """Started by the leader: offer this node's unpublished whole versions, say so, then
        restore exactly the leader's choice (every node the same version) and say what it holds,
        again for each new choice (a version no copy of which verified on some node is passed
        over), until the leader says the choice stands. Started by the job script (no choice
        file named): the newest published version, as the leader's own restore picks it."""
        path = self.plan.env.get(wire.CHOICE_VAR)
        if not path:
            await self.mirror.restore()
            return
        offered = await self.mirror.offer()
        await anyio.to_thread.run_sync(write_offer, offer_path(self.plan.run_dir, self.rank), path, offered)
        say(wire.OFFERED, self.rank)
        done = 0  # the round of the last choice restored here
        while (said := await self.words.choice(Path(path), after=done)) is not None:
            if said.round > done:
                await self.mirror.restore(said.choice)
                done = said.round
            if said.final:
                return
            holds = await anyio.to_thread.run_sync(self.mirror.holds)
            say(wire.RESTORED, self.rank, json.dumps({"round": done, "holds": holds}, separators=(",", ":")))
        if not done:
            log.warning("no choice from the leader in %.0fs (%s): restoring the newest published version",
                        2 * READY_TIMEOUT_S, path)
            await self.mirror.restore()

    async def _follow_training(self, training: JobProcesses) -> None:
        """The job's processes on this node, looked for every ``TRAINING_POLL_S``: once found and
        then all gone, the training here has exited, and nothing can change its files any more
        (``node-training``); found again (the leader restarted it in place), it runs again.
        While it runs, a look reads only the processes found (``_still_there``); all of /proc
        is read again only once one of them is gone, so an idle agent beside a long training
        costs next to nothing (issue 33)."""
        running = False
        found: dict[int, int] = {}
        while True:
            if not running or not await anyio.to_thread.run_sync(_still_there, found):
                pids = await anyio.to_thread.run_sync(training)
                found = await anyio.to_thread.run_sync(_starts, pids)
                if bool(pids) != running:
                    running = bool(pids)
                    if running:
                        self.mirror.training_resumed()
                    else:
                        self.mirror.training_exited()
                        self.mirror.request("training-exited")  # what waited for quiet time is judged now
                    self.journal.emit("node-training", node=self.rank, state="running" if running else "exited",
                                      processes=len(pids))
                    log.info("node %d: the training's processes here %s", self.rank,
                             f"found ({len(pids)})" if running else "are gone: it has exited")
            await anyio.sleep(TRAINING_POLL_S)

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as received:
            await routing.intake(self.deliver, received)

    async def deliver(self, sig: signal.Signals, received: float | None = None) -> None:
        """A first TERM/INT asks for a flush and goes on (the leader may still wait for this
        node's part); HUP asks for a flush; a second TERM/INT ends the agent."""
        self.signals_seen += 1
        if self.signals_seen == 1 and sig != signal.SIGHUP:
            self.journal.emit("signal", signal=sig.name, action="flush",
                              why="going on until the leader ends; a second one stops the agent")
            self.mirror.request(f"signal:{sig.name}")
        elif sig == signal.SIGHUP:
            self.mirror.request("signal:SIGHUP")
        else:
            self.journal.emit("signal", signal=sig.name, action="stop")
            self.end(SIGNALLED, sig.name)

    async def stop(self) -> None:
        """The node's stop: one last flush, bounded (``FINAL_FLUSH_S``), so a part that lands
        late still counts for the next attempt."""
        with anyio.move_on_after(FINAL_FLUSH_S):
            result = await self.mirror.flush(self.reason)
            self.journal.emit(wire.NODE_FLUSH, ok=result["ok"], seconds=result["seconds"], pairs=result["pairs"])


def _starts(pids: set[int]) -> dict[int, int]:
    """Each process's start time (with its pid, it names one process over time)."""
    return {pid: info.start for pid in pids if (info := proctree.read_stat(pid)) is not None}


def _still_there(found: dict[int, int]) -> bool:
    """Is every process found still there (the same one: pids are reused)? Blocking."""
    return bool(found) and all((info := proctree.read_stat(pid)) is not None and info.start == start
                               and info.state != "Z" for pid, start in found.items())


def _hold(where: Path) -> int | None:
    """An exclusive lock on the node's journal directory: a second agent for the same node
    (the job script's own ``srun … node-agent`` line beside the leader's) gets None."""
    fd = os.open(where / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        pass  # a filesystem without flock (Lustre mounted without it): no guard, not a refusal
    return fd
