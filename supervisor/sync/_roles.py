"""Where a pair is mirrored from: the role one pair engine (``_pair.py``) composes.

A pair of one node (``nodes = 1``, and every log pair) is ``Single``: this node's files are the
checkpoint, published whole. A per-node pair (``nodes = N``: every node writes its shards to
its own local disk) is ``Leader`` on node 0 (the main ``supervise``) and ``Node(k)`` on node K
(``supervise node-agent``): each node's complete checkpoints become its *parts*
(``_partpublish.py``), which the leader gathers into the checkpoint (``_assembly.py``); every
node restores the one version the leader chose (``_aside.py`` sets the others aside).

The role is what differs between them, and the engine asks it instead of telling them apart:
the rules a side is judged by, what a scan may trust and knows of the writers, the publisher
it builds, the watchers it adds, what of the persistent side is our leftover, and the restore
(its preface, the offer, the choice, what this node holds). What the persistent side is
(a directory, an object store) is not the role's: it builds its publisher from the sides the
engine's ``storage`` gives it (``_side.Storage``). Rules: docs/sync.md,
"Multi-node checkpoints"; docs/multinode.md.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Collection, Mapping, Protocol

import anyio

from supervisor.bell import LINKED_LOOK_S, Bell
from supervisor.sync._aside import set_aside, set_aside_names, set_aside_versions
from supervisor.sync._assembly import Assembly
from supervisor.sync._complete import Listing
from supervisor.sync._fill import ChoiceUnverified
from supervisor.sync._partpublish import Gather, Handover, PartPublisher
from supervisor.sync._peers import COPIES, PERSISTENT_WAIT_S, SLOW_LOOK_S, Book, across, choose_across, copies, holdings, remote, wanted
from supervisor.sync._profiles import Profile
from supervisor.sync._publish import Publisher
from supervisor.sync._restore import Restorer
from supervisor.sync._ring import Ring
from supervisor.sync._schedule import Schedule
from supervisor.sync._side import GatherSide, Ledger, Storage
from supervisor.sync._space import SpaceWatch
from supervisor.sync._state import PairState, to_thread
from supervisor.sync._versions import version_of

log = logging.getLogger("supervise")

GO_POLL_S = 0.1                  # node K, while a part waits: how often it looks for the leader's word
WAITING_POLL_S = 0.2             # the leader, while a checkpoint waits for parts


class Host(Protocol):
    """What a role uses of the engine it is composed into (``_pair.PairEngine``)."""

    state: PairState
    storage: Storage
    schedule: Schedule
    restorer: Restorer
    exited: bool

    def trigger(self, reason: str) -> None: ...
    def rescan(self, name: str) -> Listing: ...
    async def run_pass(self, trigger: str) -> dict[str, Any]: ...


class Role(Protocol):
    """What differs between the places a pair is mirrored from (``Single``, ``Leader``, ``Node``).

    ``marker_here``: rank 0's markers and pointers are written on this node. ``owns_writers``:
    the writers are this supervisor's own child tree, so none found means no training runs
    (else: none found yet, nothing known of them). ``identifies``: a publish names its
    checkpoint's identity (name, inode), so what was being written at a request can be told
    from the answer to it (a part's assembly has none)."""

    marker_here: bool
    owns_writers: bool
    identifies: bool

    def compose(self, host: Host, *, on_publish: Callable[..., None], ours: set[str] | None) -> Publisher:
        """Bind to the engine; the checkpoint publisher it composes."""
    def rules(self, profile: Profile | None, local: bool) -> Profile | None:
        """The profile a side is judged by, from the pair's."""
    def reusable(self, published: dict[str, Any]) -> dict[str, Any]:
        """The snapshots a cheap scan may trust (of those, ``reusable`` keeps the unchanged)."""
    def judged(self, listing: Listing, *, settle: float, finished: bool, whole_local: bool) -> None:
        """After ``classify``: what this node's own evidence changes in ``listing``."""
    def keeps_inodes(self, cheap: bool) -> bool:
        """Does a scan of the whole local side (cheap or not) remember its inodes (renames)?"""
    async def listed(self, listing: Listing) -> None:
        """What this role does with each checkpoint pass's listing of the local side."""
    def watchers(self) -> list[Callable[[], Awaitable[None]]]:
        """Tasks besides the watcher, the pass loop and the ticker, until cancelled."""
    def leftovers(self) -> list[Path]:
        """Our leftovers on the persistent side to remove at start. Blocking."""
    def set_aside_role(self, was: int | None) -> list[str]:
        """This host was node ``was`` in the attempt before: what it wrote in another role is
        set aside (names). Blocking."""
    async def offer(self) -> dict[str, Any]:
        """Before the leader chooses: this node's whole versions not yet published go up;
        returns what it holds (``_peers.holdings``)."""
    async def choose(self, offers: Mapping[int, Mapping[str, Any]] | None, without: Collection[str] = ()) -> dict[str, Any]:
        """Pair name → the version every node restores ({}: not a pair restored alike
        everywhere); never one named in ``without`` (it verified nowhere a node could reach)."""
    def meet(self, book: Book) -> None:
        """The other nodes' peer servers (``_peers.Book``), for the restore."""
    async def restore(self, choice: Mapping[str, Any] | None) -> Path | None:
        """Before the spawn: a checkpoint back to local disk; its local path, or None."""
    def holds(self) -> dict[str, Any]:
        """Pair name → what this node holds of the restored version ({}: not compared). Blocking."""
    def link(self, tell: Callable[[str], None] | None, linked: bool) -> None:
        """The leader's line (conduct/link.py): ``tell`` says a word to the other side (None:
        keep the one given before); ``linked``: its words arrive, so the shared-storage looks
        that stand in for them can be rare."""
    def heard(self, word: str) -> None:
        """A word from the other side: look now (``go``, ``taken``, ``part``)."""


class Single:
    """A pair mirrored from this node alone: its complete checkpoints are published whole."""

    marker_here = True
    owns_writers = True
    identifies = True

    def compose(self, host: Host, *, on_publish: Callable[..., None], ours: set[str] | None) -> Publisher:
        self.host = host
        ledger = Ledger(host.state, ours)
        return Publisher(host.state, host.storage.whole(ledger), ledger=ledger, recheck=host.schedule.recheck,
                         on_publish=on_publish, wanted=host.schedule.wanted)

    def rules(self, profile: Profile | None, local: bool) -> Profile | None:
        return profile

    def reusable(self, published: dict[str, Any]) -> dict[str, Any]:
        return published

    def judged(self, listing: Listing, *, settle: float, finished: bool, whole_local: bool) -> None:
        return None

    def keeps_inodes(self, cheap: bool) -> bool:
        return True

    async def listed(self, listing: Listing) -> None:
        return None

    def watchers(self) -> list[Callable[[], Awaitable[None]]]:
        return []

    def leftovers(self) -> list[Path]:
        """The persistent side's (``Storage.leftovers``: a directory's staging leftovers)."""
        return self.host.storage.leftovers()

    def set_aside_role(self, was: int | None) -> list[str]:
        return []

    async def offer(self) -> dict[str, Any]:
        return {}

    async def choose(self, offers: Mapping[int, Mapping[str, Any]] | None, without: Collection[str] = ()) -> dict[str, Any]:
        return {}

    def meet(self, book: Book) -> None:
        return None

    async def restore(self, choice: Mapping[str, Any] | None) -> Path | None:
        """The newest complete checkpoint; a newer complete local one is kept (``Restorer.run``)."""
        return await self.host.restorer.run()

    def holds(self) -> dict[str, Any]:
        return {}

    def link(self, tell: Callable[[str], None] | None, linked: bool) -> None:
        return None

    def heard(self, word: str) -> None:
        return None


def _silent(word: str) -> None:
    return None


class _PerNode:
    """What the leader and node K share: this node's parts, its disk, one version restored."""

    identifies = False
    marker_here: bool
    owns_writers: bool
    gather_side: GatherSide                    # the persistent side of this pair's gathering (``compose``)

    def __init__(self, node: int, parts_poll: float) -> None:
        self.node = node
        self.parts_poll = parts_poll
        self.space = SpaceWatch()                  # this node's local disk: will the next checkpoint fit?
        self.restored: Path | None = None          # the version this node restored (``holds``)
        self.unverified: str | None = None         # the leader's choice, when no copy of it verified here (``holds``)
        self.bell = Bell()                         # a word from the other side: look now
        self.tell: Callable[[str], None] = _silent
        self.linked = False
        self.book: Book | None = None               # the other nodes' peer servers (``meet``)
        self.ring: Ring | None = None               # this node's copies to the next node (``meet``, ``peer_copies``)

    def link(self, tell: Callable[[str], None] | None, linked: bool) -> None:
        if tell is not None:
            self.tell = tell
        self.linked = linked

    def heard(self, word: str) -> None:
        self.bell.ring()

    def _pause(self, fast: float) -> float:
        """How long a watcher waits for a word before it looks anyway: ``fast`` while no line
        carries the words (every look is then a poll of shared storage), else rarely."""
        return LINKED_LOOK_S if self.linked else fast

    def _gather(self, pub: PartPublisher) -> Gather:
        """The role's piece of the parts publisher (the leader's assembly, node K's hand-over)."""
        raise NotImplementedError

    def compose(self, host: Host, *, on_publish: Callable[..., None], ours: set[str] | None) -> Publisher:
        self.host = host
        self.pair, self.emit = host.state.pair, host.state.emit
        ledger = Ledger(host.state)
        side, part_side, self.gather_side = host.storage.per_node(ledger, self.node)
        self.parts = PartPublisher(host.state, side, part_side, ledger=ledger, node=self.node,
                                   recheck=host.schedule.recheck, on_publish=on_publish, gather=self._gather)
        return self.parts

    def rules(self, profile: Profile | None, local: bool) -> Profile | None:
        """This node's rules (``local_profile``); the persistent side holds every node's
        files, so every rank's shard is asked of it there."""
        return local_profile(profile, self.marker_here, local=local)

    def reusable(self, published: dict[str, Any]) -> dict[str, Any]:
        return {**self.parts.parted, **published}

    def keeps_inodes(self, cheap: bool) -> bool:
        return not cheap

    async def listed(self, listing: Listing) -> None:
        """Will this node's next checkpoint fit on its local disk? Said once (``local-disk-full``)."""
        p = self.pair
        if self.ring is not None:
            self.ring.bell.ring()
        full = await to_thread(self.space.check, p.src, listing)
        if full is not None:
            host = socket.gethostname()
            self.emit("local-disk-full", pair=p.name, node=self.node, host=host, **full)
            log.warning("node %d (%s): %s has %d bytes free, less than %s takes (%d): the next checkpoint will not fit",
                        self.node, host, full["path"], full["free_bytes"], full["checkpoint"], full["need_bytes"])

    def set_aside_role(self, was: int | None) -> list[str]:
        """A host that was node ``was`` in the previous attempt and is this node now holds, on
        its local side, the files it wrote in the other role: taken as this role's part they
        would mix other ranks' shards into it (a part of ranks 0-1 twice and none of ranks
        2-3 would look whole). Its local checkpoints not published yet are set aside."""
        if was is None or was == self.node:
            return []
        return set_aside(self.pair, self.node, self.emit, f"written as node {was}; this host is node {self.node} now")

    def meet(self, book: Book) -> None:
        self.book = book
        if self.pair.peer_copies and self.pair.nodes > 1:
            self.ring = Ring(self.pair, self.node, book, rescan=self.host.rescan, emit=self.emit,
                             profile=lambda: self.host.state.profile)

    def _ringed(self) -> list[Callable[[], Awaitable[None]]]:
        """The ring's pusher (``_ring``), where this pair keeps peer copies."""
        ring = self.ring
        return [lambda: ring.run(self.restored)] if ring is not None else []

    async def offer(self) -> dict[str, Any]:
        """Before the leader chooses what every node restores: this node's whole versions not
        yet on persistent storage (a last save the previous attempt's end did not publish) go
        up as parts, judged as finished (nothing writes before the spawn), so the newest
        complete version anywhere can be chosen, and is published first, truly. The leader's
        pass also assembles every part that is whole. A persistent side that does not answer
        is waited for ``PERSISTENT_WAIT_S`` at most: the nodes' copies are offered anyway.
        Returns what this node holds, hashed (``_peers.holdings``)."""
        host = self.host
        exited, host.exited = host.exited, True
        try:
            with anyio.move_on_after(PERSISTENT_WAIT_S) as waited:
                await host.run_pass("offer")
            if waited.cancelled_caught:
                host.restorer.slow = True
                self.emit("restore-slow", pair=self.pair.name, node=self.node, seconds=PERSISTENT_WAIT_S,
                          what="offer", reason="the persistent side did not answer: the nodes' copies count")
        finally:
            host.exited = exited
        local = await to_thread(host.restorer.judge, self.pair.src)
        mine = await to_thread(holdings, self.pair, local, host.state.profile, host.storage.content_manifest)
        return {**mine, COPIES: await to_thread(copies, self.pair)}

    async def _choice(self, without: Collection[str]) -> tuple[str | None, dict[str, Any]]:
        """After ``offer``, the newest complete version on persistent storage (waited for
        ``PERSISTENT_WAIT_S`` at most) but for those ``without`` names, and what this node holds."""
        mine = await self.offer()
        wait = SLOW_LOOK_S if self.host.restorer.slow else PERSISTENT_WAIT_S  # the offer waited in vain already
        with anyio.move_on_after(wait):
            return await self.host.restorer.choose(without), mine
        self.emit("restore-slow", pair=self.pair.name, node=self.node, seconds=wait, what="choose",
                  reason="the persistent side's listing did not come: the nodes' copies count")
        self.host.restorer.chosen, self.host.restorer.slow = None, True
        return None, mine

    async def choose(self, offers: Mapping[int, Mapping[str, Any]] | None, without: Collection[str] = ()) -> dict[str, Any]:
        """The leader's choice for every node: the newest version whole across the nodes'
        ``offers`` and its own copies when newer than the newest published, else that one, with
        the nodes that hold its files (``_peers.choose_across``). Never one named in
        ``without``: a version no copy of which verified on some node (chosen again)."""
        name, mine = await self._choice(without)
        offered = {**{k: o.get(self.pair.name) or {} for k, o in (offers or {}).items()}, self.node: mine}
        held = {k: {n: d for n, d in o.items() if n != COPIES and n not in without} for k, o in offered.items()}
        kept = {k: {w: {n: d for n, d in c.items() if n not in without} for w, c in (o.get(COPIES) or {}).items()}
                for k, o in offered.items()}
        if self.host.restorer.slow and not across(held, self.pair.nodes, kept):
            # nothing whole on the nodes either: persistent storage is the only copy, waited for as before
            name, self.host.restorer.slow = await self.host.restorer.choose(without), False
        if offers is None:
            return {self.pair.name: name}
        want, said = choose_across(held, self.pair.nodes, name, self.host.restorer.chosen, silent=self.host.restorer.slow,
                                   copies=kept)
        if without:  # every node moves those aside: none is left where a rank would load the newest it finds
            want = {**(want or {"checkpoint": None, "source": None}), "passed_over": sorted(without)}
        self.emit("restore-choice", pair=self.pair.name, **said, **({"excluded": sorted(without)} if without else {}))
        return {self.pair.name: want}

    async def restore(self, choice: Mapping[str, Any] | None) -> Path | None:
        """This node brings back exactly one version, the same on every node: the leader's
        ``choice``, else the newest published one (after this node's own offer). Every other
        local version is set aside first, never left where a rank would load it: a checkpoint
        never published (this node's part alone) and a different version of a published name
        (an unpublished ``snapshot.pt`` rewritten in place). Its files come from the nearest
        copy that verifies: this node's, the nodes that hold them, persistent storage."""
        want = choice[self.pair.name] if choice is not None and self.pair.name in choice else \
            (await self.choose(None))[self.pair.name]
        name, doc, holders = wanted(want)
        if isinstance(want, Mapping) and want.get("silent"):
            self.host.restorer.slow = True  # the leader waited for the persistent side in vain: no second wait here
        why = "not the version every node restores: set aside"
        if isinstance(want, Mapping) and want.get("passed_over"):
            await to_thread(set_aside_names, self.pair, self.node, self.emit, list(want["passed_over"]),
                            "passed over: no copy of it verified on some node")
        await to_thread(set_aside, self.pair, self.node, self.emit, why, keep=name)
        await to_thread(set_aside_versions, self.pair, self.node, self.emit, why, keep=name if doc is not None else None)
        peers = remote(self.book, self.pair.name, name, holders, self.pair.nodes) if name else []
        self.restored = self.unverified = None
        try:
            self.restored = await self.host.restorer.run(name, keep_newer=False, doc=doc, peers=peers) \
                if name is not None else None
        except ChoiceUnverified as e:
            self.unverified = e.name  # said to the leader (``holds``), which chooses again without it
            raise
        if name is None:
            self.emit("restore", pair=self.pair.name, checkpoint=None, node=self.node,
                      reason="no complete checkpoint on persistent storage, nor whole across the nodes")
        return self.restored

    def holds(self) -> dict[str, Any]:
        """What this node holds of the restored version, to compare across nodes: its name,
        size, newest mtime and a hash (a file's content; a directory's listing, its shards'
        names, sizes and mtimes), ``{"unverified": name}`` when no copy of the leader's choice
        verified here, or None."""
        if self.restored is None and self.unverified is not None:
            return {self.pair.name: {"unverified": self.unverified}}
        return {self.pair.name: version_of(self.restored) if self.restored is not None else None}


class Leader(_PerNode):
    """Node 0 of a per-node pair: stages its own part and gathers every node's into the
    checkpoint (``Assembly``); its writers are its own child tree."""

    marker_here = True
    owns_writers = True

    def __init__(self, parts_poll: float = 1.0) -> None:
        super().__init__(0, parts_poll)

    def _gather(self, pub: PartPublisher) -> Assembly:
        self.assembly = Assembly(pub, self.gather_side, trigger=self.host.trigger, tell=lambda word: self.tell(word))
        return self.assembly

    def judged(self, listing: Listing, *, settle: float, finished: bool, whole_local: bool) -> None:
        return None

    def watchers(self) -> list[Callable[[], Awaitable[None]]]:
        return [self.parts_watch, *self._ringed()]

    async def parts_watch(self) -> None:
        """A pass whenever a node says it staged a part (``part``, on the leader's line), or
        its manifest appears or goes: other nodes' writes on shared storage raise no
        inotify event here, so without the line the parts are polled, more often while a
        checkpoint waits for them; with it, a listing of every node's manifests is rare
        (``bell.LINKED_LOOK_S``), so the leader's looks grow with the checkpoints, not with time."""
        last: Any = None
        while True:
            fast = min(self.parts_poll, WAITING_POLL_S) if self.assembly.missing else self.parts_poll
            if await self.bell.wait(self._pause(fast)):
                self.host.trigger("parts")  # the pass reads the manifests it needs; no listing here
                continue
            try:
                now, any_part = await self.gather_side.parts_now()
            except OSError:
                continue
            if now != last:
                last = now
                if any_part:
                    self.host.trigger("parts")

    def leftovers(self) -> list[Path]:
        """The persistent side's (``GatherSide.leftovers``): never parts, which other nodes
        may be writing now, and a complete one still counts after a requeue."""
        return self.gather_side.leftovers()


class Node(_PerNode):
    """Node K > 0 of a per-node pair: stages its own part and hands it over (``Handover``).
    Rank 0's marker is never written here: a part waiting for it settles instead, or is
    complete at once when the leader says node 0's is (its go file or object). Its writers are the
    job's processes it found on this node, once it found them."""

    marker_here = False
    owns_writers = False

    def __init__(self, node: int, parts_poll: float = 1.0) -> None:
        super().__init__(node, parts_poll)
        self.awaiting_go: set[str] = set()         # directories not complete yet (the leader may say go)

    def _gather(self, pub: PartPublisher) -> Handover:
        return Handover(pub, self.gather_side, tell=lambda word: self.tell(word))

    def judged(self, listing: Listing, *, settle: float, finished: bool, whole_local: bool) -> None:
        """``settled_here``, with the leader's word for the checkpoints it gave it (blocking:
        one stat each, in a directory). ``whole_local``: a scan of the whole local side says which wait."""
        go = {n for n, e in listing.entries.items() if not e.complete and e.is_dir and self.gather_side.said_go(n)}
        settled_here(listing, settle, time.time(), finished=finished, go=go)
        if whole_local:
            self.awaiting_go = {n for n, e in listing.entries.items() if not e.complete and e.is_dir}

    def watchers(self) -> list[Callable[[], Awaitable[None]]]:
        return [self.parts_watch, *self._ringed()]

    async def parts_watch(self) -> None:
        """A pass when the leader says a checkpoint this node is waiting on is complete
        (its go file or object), or has taken a part of this node's (its manifest gone: the
        pass tidies what is left of it away): ``GatherSide.look``. The leader's words ``go``
        and ``taken`` on its line say when to look; without the line, it looks every
        ``GO_POLL_S`` while a part waits."""
        while True:
            await self.bell.wait(self._pause(GO_POLL_S if self.awaiting_go else self.parts_poll))
            if await self.gather_side.look(set(self.awaiting_go), list(self.parts.parted)):
                self.host.trigger("parts")

    def leftovers(self) -> list[Path]:
        """None: the leader's staging is the leader's."""
        return []


def local_profile(profile: Profile | None, marker_here: bool, *, local: bool = True) -> Profile | None:
    """The rules a node's own files are judged by. DCP's ``.metadata``, DeepSpeed's and
    Megatron's pointers are written by global rank 0, on node 0: on node K they never appear
    (not ``marker_here``), so a profile that needs them would keep node K's part waiting for
    ever. There the part is complete when it settles (docs/sync.md), and a marker seen on
    node K (a restored checkpoint has one) makes no later part wait for it. On every node's
    ``local`` side, each node holds its own ranks' shards only (DeepSpeed's node-local mode):
    asking it for every rank's kept node 0's part waiting for ever too; the parts together
    are asked for them, at assembly."""
    if profile is None:
        return None
    if local and profile.shards:
        profile = dataclasses.replace(profile, shards="", world=("", ""))
    if marker_here or not profile.needs_marker:
        return profile
    return dataclasses.replace(profile, needs_marker=False)


def settled_here(listing: Listing, settle: float, now: float, *, finished: bool, go: Collection[str] = ()) -> None:
    """Node K: a directory that waits for rank 0's marker or pointer (or is called torn for
    lacking it, or for being newer than the pointer here) is judged by quiescence instead
    (local_profile's rule), or at once when node 0 saw that checkpoint complete (``go``).
    ``classify`` itself still asks for the marker once any directory here has one, which a
    restored checkpoint does, and for a newer pointer than the one restored here (DeepSpeed's
    ``latest``), which only node 0 ever rewrites."""
    for name, e in list(listing.entries.items()):
        if not e.is_dir or e.complete:
            continue
        waits = e.why == "waiting for marker" or e.why.startswith("waiting for ") and (
            not listing.pointers or e.why.removeprefix("waiting for ") in listing.pointers)
        said = name in go and not finished and (waits or e.why == "settling")
        if not said and not waits and not (e.torn or "").startswith(("the training ended before writing", "newer than ")):
            continue
        last = e.snap.newest_ns / 1e9
        if said:
            listing.entries[name] = dataclasses.replace(e, complete=True, why="node 0 saw it complete", done_at=last,
                                                        torn=None, ready_at=None)
        elif finished:
            listing.entries[name] = dataclasses.replace(e, complete=True, why="training exited", done_at=last,
                                                        torn=None, ready_at=None)
        elif now - last >= settle:
            listing.entries[name] = dataclasses.replace(e, complete=True, why="settled", done_at=last, ready_at=None)
        else:
            listing.entries[name] = dataclasses.replace(e, why="settling", ready_at=max(now, last) + settle)
