"""The leader's line to its node agents (conduct/link.py), in-process over real TCP on this
machine: who may join, that words go both ways and collapse, that an agent that loses the line
says so and makes it again with the next leader; and the ``Bell`` that keeps a word until
it is heard."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import anyio
import pytest

from supervisor.bell import Bell
from supervisor.conduct import wire
from supervisor.conduct.link import LINK, LeaderLine, NodeLine, link_path
from tests.support.wait import wait_for_async

pytestmark = pytest.mark.asyncio


class Heard:
    def __init__(self) -> None:
        self.words: list[tuple[int, str]] = []
        self.linked: list[bool] = []


def leader(run_dir: Path, nodes: int) -> tuple[LeaderLine, Heard]:
    h = Heard()
    return LeaderLine(run_dir, nodes, heard=lambda node, word: h.words.append((node, word)),
                      linked=h.linked.append), h


def node(run_dir: Path, rank: int) -> tuple[NodeLine, Heard]:
    h = Heard()
    return NodeLine(run_dir, rank, heard=lambda word: h.words.append((rank, word)), linked=h.linked.append), h


async def test_a_bell_rung_while_nobody_waits_is_heard_once_by_the_next_wait() -> None:
    bell = Bell()
    bell.ring()
    bell.ring()
    assert await bell.wait(10.0) is True           # at once: rung before anyone waited
    assert await bell.wait(0.05) is False          # twice rung, heard once
    async with anyio.create_task_group() as tg:
        tg.start_soon(bell.wait, 10.0)
        await anyio.sleep(0.05)
        bell.ring()
    assert await bell.wait(0.05) is False


async def test_words_go_both_ways_once_every_node_has_joined(tmp_path: Path) -> None:
    line, lh = leader(tmp_path, nodes=3)
    one, h1 = node(tmp_path, 1)
    two, h2 = node(tmp_path, 2)
    async with anyio.create_task_group() as tg:
        await tg.start(line.run)
        told = json.loads(link_path(tmp_path).read_text())
        assert told["port"] == line.port and told["hosts"][0] == socket.gethostname()
        assert link_path(tmp_path).stat().st_mode & 0o077 == 0, "the token is the job owner's alone"
        await tg.start(one.run)
        await wait_for_async(lambda: line.connected == [1], 10, "node 1 on the line")
        assert lh.linked[-1] is False, "one of two nodes: the leader still looks for itself"
        await tg.start(two.run)
        await wait_for_async(lambda: lh.linked and lh.linked[-1] is True, 10, "every node on the line")
        assert (1, LINK) in h1.words and h1.linked == [True]

        line.ring("go")
        line.ring("go")
        line.ring("taken")
        await wait_for_async(lambda: (2, "taken") in h2.words, 10, "node 2 hearing taken")
        await wait_for_async(lambda: (1, "taken") in h1.words, 10, "node 1 hearing taken")
        assert [w for _, w in h1.words if w != LINK] == ["go", "taken"], "go said twice before it was sent: sent once"
        one.say("part")
        two.say("journal")
        await wait_for_async(lambda: {(1, "part"), (2, "journal")} <= set(lh.words), 10, "the nodes' words")
        tg.cancel_scope.cancel()


async def test_a_request_and_its_answer_are_said_on_the_line_to_the_nodes_asked(tmp_path: Path) -> None:
    """Issue 46, item 4: the leader's request goes on the line with what it asks (not a word
    to go and read its journal), to the nodes it asks alone; the answer comes back the same way,
    and an answer too long for a line is not said (the node says ``journal``)."""
    line, lh = leader(tmp_path, nodes=3)
    one, h1 = node(tmp_path, 1)
    two, h2 = node(tmp_path, 2)
    async with anyio.create_task_group() as tg:
        await tg.start(line.run)
        await tg.start(one.run)
        await tg.start(two.run)
        await wait_for_async(lambda: line.whole, 10, "every node on the line")
        asked = wire.message(wire.NODES_SIGNAL, "7.1", {"signal": "SIGTERM"})
        assert asked is not None and line.tell([2, 5], asked) == [2]
        await wait_for_async(lambda: any(w.startswith(wire.NODES_SIGNAL) for _, w in h2.words), 10, "node 2 asked")
        said = next(w for _, w in h2.words if w.startswith(wire.NODES_SIGNAL))
        assert wire.read_message(said, wire.REQUESTS) == {"kind": wire.NODES_SIGNAL, "request": "7.1", "signal": "SIGTERM"}
        answer = wire.message(wire.NODE_SIGNAL, "7.1", {"pids": [12, 13]})
        assert answer is not None
        two.say(answer)
        await wait_for_async(lambda: (2, answer) in lh.words, 10, "node 2's answer")
        assert wire.read_message(answer, wire.REPLIES) == {"kind": wire.NODE_SIGNAL, "request": "7.1", "pids": [12, 13]}
        assert not any(w.startswith(wire.NODES_SIGNAL) for _, w in h1.words), "node 1 was not asked"
        assert wire.message(wire.NODE_FLUSH, "7.2", {"not_durable": ["x" * wire.MAX_MESSAGE]}) is None
        assert wire.read_message(answer, wire.REQUESTS) is None, "an answer is no request"
        tg.cancel_scope.cancel()


async def test_a_stranger_or_a_wrong_token_never_joins(tmp_path: Path) -> None:
    line, lh = leader(tmp_path, nodes=2)
    async with anyio.create_task_group() as tg:
        await tg.start(line.run)
        assert line.port is not None
        for hello in (b"hello 0123 1\n", f"hello {line.token} 7\n".encode(), b"GET / HTTP/1.1\r\n\r\n"):
            async with await anyio.connect_tcp("127.0.0.1", line.port) as s:
                await s.send(hello)
                with anyio.fail_after(10):
                    try:
                        got = await s.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                        got = b""
                assert got == b"", f"{hello!r} was answered {got!r}"
        assert line.connected == [] and lh.words == []
        tg.cancel_scope.cancel()


async def test_an_agent_that_loses_the_leader_says_so_and_joins_the_next_one(tmp_path: Path) -> None:
    one, h1 = node(tmp_path, 1)
    async with anyio.create_task_group() as tg:
        await tg.start(one.run)  # before any leader: it keeps trying
        await anyio.sleep(0.5)
        assert one.linked is False and h1.linked == []
        first, _ = leader(tmp_path, nodes=2)
        async with anyio.create_task_group() as served:
            served.start_soon(first.run)
            await wait_for_async(lambda: one.linked, 15, "node 1 on the first leader's line")
            served.cancel_scope.cancel()  # the leader is gone: its connections close with it
        await wait_for_async(lambda: h1.linked == [True, False], 15, "node 1 hearing the line lost")
        assert h1.words.count((1, LINK)) == 2, "made and lost: each time it looks at everything"
        second, lh = leader(tmp_path, nodes=2)  # the next attempt's leader: a new port, a new token
        tg.start_soon(second.run)
        # both ends: the leader counts node 1 once it has sent its ``ok``, node 1 has a line to
        # speak on once it has read it (CI: the word said in between went nowhere, by design)
        await wait_for_async(lambda: second.connected == [1] and one.linked, 15, "node 1 on the next leader's line")
        one.say("part")
        await wait_for_async(lambda: (1, "part") in lh.words, 10, "node 1's word to the next leader")
        tg.cancel_scope.cancel()
