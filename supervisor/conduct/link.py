"""The leader's line to its node agents: words that say when to look, never what is there.

A multi-node job's record stays on shared storage: the leader's journal, its go files, every
node's manifests (docs/multinode.md). Without a line, each side learns of the other's writes by
looking: every node agent reads the leader's journal 5 times a second and, while a part waits,
looks for the leader's go file 10 times a second; the leader lists every node's manifests once
a second. At 1,000 nodes that is thousands of metadata operations a second on the parallel
filesystem from one idle job (issue 33).

With the line, the leader serves one TCP port (``LeaderLine``), written with a token to
``RUN/nodes/link.json`` before any agent starts; every agent (``NodeLine``) connects, says
its node and the token, and from then on each side *tells* the other when there is something
to read, in one word a line:

- leader → node: ``journal`` (a ``nodes-flush`` or ``nodes-signal`` for the nodes), ``choice``
  (the version every node restores), ``go`` (node 0's part is complete), ``taken`` (parts
  published);
- node → leader: ``part`` (a part staged: its manifest is there), ``journal`` (an answer).

Whoever hears a word looks once, as its poll would have; a word never carries what it
announces, so a word lost or repeated costs a look, never a wrong answer. While the line
holds, the looks that stand in for words are rare (``bell.LINKED_LOOK_S``); without
it (no route between nodes, the port refused, the leader gone) each side polls as before, and
an agent tries the line again, pausing from ``RETRY_S[0]`` doubling to ``RETRY_S[1]``. The
line is made or lost: the agent looks at everything at once (``link``), so a word said while
it was not connected is never waited for.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import secrets
from pathlib import Path
from typing import Any, Callable, Iterator

import anyio
from anyio.abc import SocketAttribute, SocketStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from supervisor.conduct.wire import (LEADER_WORDS, LINK, LINK_FILE, MAX_LINE, MAX_MESSAGE, NODE_WORDS, OK, REPLIES, REQUESTS,
                                     hello, link_path, read_hello, read_word, words_line)
from supervisor.reach import addresses

log = logging.getLogger("supervise")

CONNECT_S = 2.0               # one try at one of the leader's addresses
HELLO_S = 5.0                 # a connection that has not said who it is by then is dropped
RETRY_S = (0.2, 5.0)          # an agent's pause between tries: from, doubling to


class LeaderLine:
    """Served by the leader for its node agents: ``ring(word)`` tells every connected node;
    ``heard(node, word)`` is called for each word a node says; ``linked(on)`` whenever every
    node ``1 … nodes-1`` is connected (True) or one of them is not (False)."""

    def __init__(self, run_dir: Path, nodes: int, heard: Callable[[int, str], None],
                 linked: Callable[[bool], None]) -> None:
        self.path = link_path(run_dir)
        self.want = set(range(1, nodes))
        self.token = secrets.token_hex(16)
        self.heard, self.on_linked = heard, linked
        self.port: int | None = None
        self._boxes: dict[int, _Outbox] = {}  # node → the words not yet sent to it

    @property
    def connected(self) -> list[int]:
        return sorted(self._boxes)

    @property
    def whole(self) -> bool:
        return bool(self.want) and self.want <= set(self._boxes)

    def ring(self, word: str) -> None:
        for box in self._boxes.values():
            box.put(word)

    def tell(self, nodes: list[int], line: str) -> list[int]:
        """``line`` (a request, ``wire.message``) to those of ``nodes`` on the line now; which."""
        told = [k for k in nodes if k in self._boxes]
        for k in told:
            self._boxes[k].put(line)
        return told

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen and say where (``link.json``); ``started`` then, or once it is clear that no
        line can be served (the agents poll: a warning, never a reason to stop)."""
        _room_for(len(self.want))
        try:
            listener = await anyio.create_tcp_listener(local_host="0.0.0.0", local_port=0)
            self.port = listener.extra(SocketAttribute.local_port)
            await anyio.to_thread.run_sync(self._publish, self.port)
        except OSError as e:
            log.warning("no line to the node agents (%s): they look at shared storage for the leader's words", e)
            task_status.started()
            return
        log.info("the leader's line to its node agents: port %d (%s)", self.port, self.path)
        task_status.started()
        async with listener:
            await listener.serve(self._serve)

    def _publish(self, port: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{LINK_FILE}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the token: the job's owner only
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"hosts": addresses(), "port": port, "token": self.token, "pid": os.getpid()}, f)
        os.replace(tmp, self.path)

    async def _serve(self, stream: SocketStream) -> None:
        async with stream:
            node = await _hello(stream, self.token, self.want)
            if node is None:
                return
            box = _Outbox()
            old, self._boxes[node] = self._boxes.get(node), box
            if old is not None:
                old.close()  # an agent that came back: its old connection's words go nowhere
            self._changed()
            try:
                await _converse(stream, box, NODE_WORDS, REPLIES, lambda word: self.heard(node, word))
            finally:
                if self._boxes.get(node) is box:
                    del self._boxes[node]
                    self._changed()

    def _changed(self) -> None:
        self.on_linked(self.whole)


class NodeLine:
    """Node K's end: connects to the leader named in ``link.json`` and keeps trying while the
    agent runs. ``heard(word)`` for each of the leader's words, and ``link`` when the line is
    made or lost; ``linked(on)`` as it is; ``say(word)`` tells the leader (nothing while not
    connected: the leader then polls)."""

    def __init__(self, run_dir: Path, node: int, heard: Callable[[str], None], linked: Callable[[bool], None]) -> None:
        self.path = link_path(run_dir)
        self.node = node
        self.heard, self.on_linked = heard, linked
        self.linked = False
        self._box: _Outbox | None = None

    def say(self, word: str) -> None:
        if self._box is not None:
            self._box.put(word)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        pause = RETRY_S[0]
        while True:
            where = await anyio.to_thread.run_sync(_read, self.path)
            stream = await _connect(where, self.node) if where is not None else None
            if stream is None:
                await anyio.sleep(pause)
                pause = min(2 * pause, RETRY_S[1])
                continue
            pause = RETRY_S[0]
            self._box = box = _Outbox()
            self.linked = True
            self.on_linked(True)
            self.heard(LINK)
            try:
                async with stream:
                    await _converse(stream, box, LEADER_WORDS, REQUESTS, self.heard)
            finally:
                self._box, self.linked = None, False
            self.on_linked(False)  # lost, not ended by the agent's own end (a cancel passes through)
            self.heard(LINK)


class _Outbox:
    """The words one connection owes the other side: a set (a word said twice before it was
    sent is sent once), and an event for its sender. Not a ``Bell``: a bell's wait opens a
    cancel scope for its timeout, and the leader's every word wakes one sender per node (at
    1,024 nodes the senders' wakes were most of the leader's CPU per checkpoint; issue 44)."""

    def __init__(self) -> None:
        self.words: set[str] = set()
        self.closed = False
        self._said: anyio.Event | None = None

    def put(self, word: str) -> None:
        self.words.add(word)
        if self._said is not None:
            self._said.set()

    def close(self) -> None:
        self.closed = True
        if self._said is not None:
            self._said.set()

    async def take(self) -> set[str]:
        while not self.words and not self.closed:
            self._said = anyio.Event()
            await self._said.wait()
            self._said = None
        words, self.words = self.words, set()
        return words


async def _converse(stream: SocketStream, box: _Outbox, words: frozenset[str], messages: frozenset[str],
                    heard: Callable[[str], None]) -> None:
    """Send ``box``'s words and hear the other side's (``words``, and the lines of the kinds in
    ``messages``: a request or an answer with what it carries, ``wire.message``) until either
    side ends the connection (or says a line longer than any side says: ended too)."""
    reader = BufferedByteReceiveStream(stream)

    async def send() -> None:
        with _ended():
            while not box.closed:
                out = await box.take()
                if out:
                    await stream.send(words_line(out))
        tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(send)
        with _ended():
            while True:
                word = read_word(await reader.receive_until(b"\n", MAX_MESSAGE))
                if word in words or word.split(" ", 1)[0] in messages:
                    heard(word)
        tg.cancel_scope.cancel()


_GONE = (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound, anyio.BrokenResourceError,
         anyio.ClosedResourceError, OSError)


@contextlib.contextmanager
def _ended() -> Iterator[None]:
    """The connection's end, either side's doing, as the end of what runs inside."""
    try:
        yield
    except _GONE:
        pass


async def _hello(stream: SocketStream, token: str, want: set[int]) -> int | None:
    """``hello TOKEN NODE`` from an agent of this job, answered ``ok``; None for anyone else."""
    reader = BufferedByteReceiveStream(stream)
    try:
        with anyio.fail_after(HELLO_S):
            said = read_hello(await reader.receive_until(b"\n", MAX_LINE))
            ok = (said is not None and secrets.compare_digest(said[0], token) and said[1] in want
                  and not reader.buffer)  # nothing before our answer
            if not ok or said is None:
                return None
            await stream.send(words_line({OK}))
    except (TimeoutError, *_GONE):
        return None
    return said[1]


async def _connect(where: dict[str, Any], node: int) -> SocketStream | None:
    """The first of the leader's addresses that answers our hello with ``ok``."""
    for host in where["hosts"]:
        try:
            with anyio.fail_after(CONNECT_S):
                stream = await anyio.connect_tcp(host, where["port"])
                try:
                    await stream.send(hello(where["token"], node).encode())
                    reader = BufferedByteReceiveStream(stream)
                    if read_word(await reader.receive_until(b"\n", MAX_LINE)) == OK and not reader.buffer:
                        return stream
                except BaseException:
                    await anyio.aclose_forcefully(stream)
                    raise
                await anyio.aclose_forcefully(stream)
        except (TimeoutError, *_GONE):
            continue
    return None


def _read(path: Path) -> dict[str, Any] | None:
    """The leader's ``link.json``, or None (not written yet, or not whole)."""
    try:
        got = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = (isinstance(got, dict) and isinstance(got.get("hosts"), list) and isinstance(got.get("port"), int)
          and isinstance(got.get("token"), str))
    return got if ok else None


def _room_for(agents: int) -> None:
    """One descriptor per agent: raise the soft limit toward the hard one where 1,024 would not
    hold a thousand agents and everything else the leader has open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = agents + 512
    if soft != resource.RLIM_INFINITY and soft < need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(need, hard), hard))
        except (ValueError, OSError):
            pass
