"""Node K's end of the leader's conversation: what it hears of its leader, and its answers.

A collaborator of node K's role (``node.NodeRole``): the leader's line (``link.NodeLine``), the
bells its words ring, the choice of what every node restores waited for, and the leader's
requests (said on the line, or found in its journal when this node is off it), each answered
once, journaled in this node's journal and said on the line (the names: ``wire.py``). The
leader's ``end`` in its journal is the stop it asks of node K.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping

import anyio

from supervisor.bell import LINKED_LOOK_S, Bell
from supervisor.conduct import wire
from supervisor.conduct.choice import READY_TIMEOUT_S, Choice, read_choice
from supervisor.conduct.link import NodeLine
from supervisor.conduct.wire import LINK
from supervisor.jobprocs import JobProcesses, signal_ranks
from supervisor.journal import EVENTS_FILE, Journal, JournalTail
from supervisor.ports import MirrorPort

log = logging.getLogger("supervise")

CHOICE_POLL_S = 0.1  # while the leader chooses what every node restores
LEADER_POLL_S = 0.2  # the leader's journal: its last flush's request waits on our answer


class LeaderWords:
    """What node K hears of its leader and answers. ``journal`` (node K's) is set once it is open;
    ``ended(detail)`` is called once the leader's ``end`` is found."""

    journal: Journal

    def __init__(self, run_dir: Path, rank: int, mirror: MirrorPort, training: JobProcesses | None,
                 ended: Callable[[str], None]) -> None:
        self.run_dir, self.rank, self.mirror, self.training, self._ended = run_dir, rank, mirror, training, ended
        self.line = NodeLine(run_dir, rank, heard=self._heard, linked=self._linked)
        self.journal_said = Bell()  # the leader asked something (on the line, or in its journal), or the line was made or lost
        self.choice_said = Bell()   # the leader wrote its choice
        self.asked: list[dict[str, Any]] = []  # the leader's requests said on the line, not yet answered
        self.answered: set[str] = set()        # the requests answered (found again in the leader's journal: once)
        self.look = True                       # the leader's journal is worth a look (``journal``, ``link``)
        self.leader: JournalTail | None = None

    def from_here(self) -> None:
        """What the leader journals from now on counts (while this node restores, too)."""
        self.leader = JournalTail(self.run_dir / EVENTS_FILE)

    def _heard(self, word: str) -> None:
        """A word on the leader's line: who looks now (``LINK``: the line was made or lost, so
        everyone looks, as a word may have been said while it was not there)."""
        asked = wire.read_message(word, wire.REQUESTS)
        if asked is not None:  # a request said on the line: answered without a look at the leader's journal
            self.asked.append(asked)
            self.journal_said.ring()
            return
        if word in (wire.JOURNAL, LINK):
            self.look = True
            self.journal_said.ring()
        if word in (wire.CHOICE, LINK):
            self.choice_said.ring()
        if word != wire.JOURNAL and word != wire.CHOICE:
            self.mirror.heard(word)

    def _linked(self, on: bool) -> None:
        self.mirror.link(on=on)
        self.journal.emit("node-link", node=self.rank, linked=on)
        log.info("node %d: the leader's line %s", self.rank, "is made" if on else "is lost: looking at shared storage instead")

    def _pause(self, fast: float) -> float:
        return LINKED_LOOK_S if self.line.linked else fast

    async def choice(self, path: Path, after: int) -> Choice | None:
        """The leader's next word on the choice: a new one (a round after ``after``), or that it
        stands; None when none came in ``2 × READY_TIMEOUT_S``."""
        with anyio.move_on_after(2 * READY_TIMEOUT_S):
            while True:
                said = await anyio.to_thread.run_sync(read_choice, path)
                if said is not None and (said.round > after or said.final):
                    return said
                await self.choice_said.wait(self._pause(CHOICE_POLL_S))
        return None

    async def run(self) -> None:
        """The leader's requests, said on the line (``asked``) or, off it, found in its journal:
        its last flush asks for ours (``nodes-flush``, answered ``node-flush`` with its
        ``request`` in this node's journal and on the line); its ``nodes-signal`` (PBS) is sent
        to this node's ranks (``node-signal``). Its journal is read when the leader says
        ``journal``, when the line is made or lost, and rarely else while the line holds (every
        ``LEADER_POLL_S`` off it): its ``end`` ends us."""
        assert self.leader is not None, "from_here() first"
        while True:
            told, self.asked = self.asked, []
            for ev in told:
                await self._request(ev, told=True)
            if self.look:
                self.look = False
                for ev in await anyio.to_thread.run_sync(self.leader.appended):
                    if ev.get("kind") in wire.REQUESTS:
                        await self._request(ev, told=False)
                    elif ev.get("kind") == wire.END:
                        self._ended(f"leader attempt {ev.get('attempt')}: {ev.get('reason')}")
                        return
            if not await self.journal_said.wait(self._pause(LEADER_POLL_S)):
                self.look = True  # the pause ran out: a look anyway

    async def _request(self, ev: Mapping[str, Any], *, told: bool) -> None:
        """One of the leader's requests, answered once (said on the line, then found in its
        journal too: the same ``request``). A ``nodes-signal`` in the journal is for the nodes
        it names; said on the line, it was said to this node."""
        request = str(ev.get("request"))
        if request in self.answered:
            return
        if ev.get("kind") == wire.NODES_FLUSH:
            self.answered.add(request)
            await self._answer(ev)
        elif ev.get("kind") == wire.NODES_SIGNAL and (told or self.rank in (ev.get("nodes") or [])):
            self.answered.add(request)
            done = await anyio.to_thread.run_sync(signal_ranks, self.training, str(ev.get("signal")))
            self.journal.emit(wire.NODE_SIGNAL, request=ev.get("request"), signal=ev.get("signal"), node=self.rank,
                              durable=True, **done)
            self._reply(wire.NODE_SIGNAL, request, {"signal": ev.get("signal"), **done})
            log.info("node %d: the leader's %s sent to %s", self.rank, ev.get("signal"), done["pids"] or "nobody")

    async def _answer(self, ev: Mapping[str, Any]) -> None:
        if ev.get("exited"):
            self.mirror.training_exited()  # every rank is gone: nothing here waits for quiescence
        result = await self.mirror.flush(wire.FOR_LEADER)
        not_durable = [f"node {self.rank}: {line}" for line in self.mirror.pending()]
        self.journal.emit(wire.NODE_FLUSH, request=ev.get("request"), ok=result["ok"], seconds=result["seconds"],
                          pairs=result["pairs"], not_durable=not_durable, durable=True)
        self._reply(wire.NODE_FLUSH, str(ev.get("request")), {"ok": result["ok"], "not_durable": not_durable})

    def _reply(self, kind: str, request: str, fields: dict[str, Any]) -> None:
        """An answer, journaled already, said on the line; only ``journal`` when it is too long
        to say (the leader reads it in this node's journal)."""
        self.line.say(wire.message(kind, request, fields) or wire.JOURNAL)
