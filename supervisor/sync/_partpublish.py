"""Publishing a per-node pair on one node: its complete checkpoints become this node's parts.

A per-node pair (``nodes = N``: every node writes its shards to its own local disk) publishes
no checkpoint from one node. Each node's complete checkpoints are staged as *parts* on the
persistent side it is given (``_side.PartSide``): this node's files (in a directory, under
``.supervise-parts/<name>/node-K/``, ``_parts.py``; on an object store, under the
checkpoint's keys), verified, then its manifest, written last. A node stages a version it has not accounted
for yet (published, staged, restored, or found older than the published one). What happens
beyond that is the role's piece (``Gather``): the leader gathers every node's parts into the
checkpoint (``_assembly.py``), node K hands its parts over (``Handover``).
Rules and events: docs/sync.md, "Multi-node checkpoints".
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

import anyio

from supervisor.sync._backend import CopyError, CopyResult
from supervisor.sync._complete import Entry, Listing, Pointer, Snap, natural_key
from supervisor.sync._publish import Publisher, complete_newest_first
from supervisor.sync._side import GatherSide, Ledger, PartSide, Side
from supervisor.sync._state import PairState
from supervisor.sync._versions import SAME_SECOND_NS, contains, written


class Gather(Protocol):
    """What a per-node pair's publishing does besides staging this node's parts: the leader
    gathers every node's into the checkpoint (``_assembly.Assembly``); node K hands its own
    over (``Handover``)."""

    async def begin(self) -> None:
        """At the start of a pass, before anything is staged."""

    async def before_stage(self, e: Entry) -> None:
        """Before this node's part of ``e`` is staged."""

    def staged(self) -> None:
        """This node's part of a checkpoint is durable."""

    async def finish(self, trigger: str, published: list[str], listing: Listing) -> None:
        """At the end of a pass: what is whole is published (the names to ``published``)."""

    def conflict(self, name: str) -> str | None:
        """Why the parts of ``name`` cannot be published together, if they cannot."""

    def waiting(self, name: str) -> str | None:
        """What this node's staged ``name`` waits for, in words; None: nothing is owed here."""

    def pending(self, listing: Listing, local: set[str]) -> list[str]:
        """``pending`` lines beyond this node's own checkpoints (``local``: their names)."""

    def behind(self, ptr: Pointer) -> bool:
        """Is this local pointer one never to publish over the persistent one? Blocking."""


class PartPublisher(Publisher):
    """Publishing for a per-node pair on one node: this node's complete checkpoints become
    parts on the persistent side it is given (``part_side``, a ``_side.PartSide``; ``side``,
    where ``Publisher`` writes pointers); ``gather(self)`` builds the role's piece (``Gather``)
    that does the rest."""

    def __init__(self, state: PairState, side: Side, part_side: PartSide, *, ledger: Ledger, node: int,
                 recheck: Callable[[float], None], on_publish: Callable[..., None],
                 gather: Callable[[PartPublisher], Gather]) -> None:
        super().__init__(state, side, ledger=ledger, recheck=recheck, on_publish=on_publish)
        self.part_side = part_side
        self.node = node
        self.nodes = state.pair.nodes
        self.parted: dict[str, Snap] = {}          # checkpoint → local snapshot whose part manifest is written
        self.stale: dict[str, Snap] = {}           # older here than the version published (by another node)
        self.seen: dict[str, Snap] = {}            # checkpoint → the local version last accounted for here
        self.inside: dict[str, tuple[Snap, bool]] = {}  # incomplete here → (that version, inside the published one)
        self.gather = gather(self)

    async def run(self, listing: Listing, trigger: str, stats: CopyResult, published: list[str]) -> None:
        await self.gather.begin()
        todo: list[Entry] = []
        for e in complete_newest_first(listing):
            if self._accounted(e):
                continue
            seen = await self.part_side.published_as(e)
            if seen is not None and not self._new_version(e, *seen, listing):
                continue
            todo.append(e)
        await self._look_inside_published(listing)
        self._note_pending(listing)
        for e in todo:  # newest first: the one most at risk
            await self.gather.before_stage(e)
            try:
                await self._stage_part(e, trigger, stats)
            except (OSError, CopyError):
                with anyio.CancelScope(shield=True):
                    await self.part_side.drop_part(e.name)
                raise
            self._note_pending(listing)
        await self.gather.finish(trigger, published, listing)
        await self._end_pass(listing)

    def _accounted(self, e: Entry) -> bool:
        """This very version of ``e`` was already dealt with here: published (or found on
        persistent storage), staged as this node's part, or found older than the published one."""
        for known in (self.state.published.get(e.name), self.stale.get(e.name), self.parted.get(e.name)):
            if known is not None and known.same_content(e.snap):
                return True
        return False

    def _new_version(self, e: Entry, there: Snap | None, same: bool, listing: Listing) -> bool:
        """``e.name`` is on persistent storage already: is this node's ``e`` a newer version
        of it, to publish as such (a ``snapshot.pt`` rewritten in place every epoch, a
        ``last.ckpt``)? The evidence is this node's own: the file changed here since this node
        last accounted for it (published, staged, restored), so the training wrote it in this
        attempt. A version this node never saw before counts only if it was written after the
        published one (mtime; for a directory's part, a whole second later: some filesystems
        keep no more, and a file's sameness was read byte for byte). Otherwise it is
        the published one (recorded), or an older one, never published over a newer."""
        if same:
            self.parted.pop(e.name, None)
            self.stale.pop(e.name, None)
            self.state.published[e.name] = self.seen[e.name] = e.snap
            if e.name in listing.sigs:
                self.state.sigs[e.name] = listing.sigs[e.name]
            return False
        if not self._behind_published(e, there):
            return True
        if e.name not in self.stale:
            self.emit("sync-deferred", pair=self.pair.name, checkpoint=e.name, node=self.node,
                      reason="older than the version on persistent storage (published from another node or "
                             "attempt): never published over it")
        self.stale[e.name] = self.seen[e.name] = e.snap
        return False

    def _behind_published(self, e: Entry, there: Snap | None) -> bool:
        """Is this node's ``e`` older than ``there``, the version of its name published (by
        another node), and unchanged here since this node accounted for it? Then it is
        superseded, never published over the newer one, and owed nothing."""
        changed_here = e.name in self.seen and not self.seen[e.name].same_content(e.snap)
        slack = SAME_SECOND_NS if e.is_dir else 0  # a file's sameness was read byte for byte
        return not changed_here and (there is None or written(e.snap) <= written(there) + slack)

    async def _stage_part(self, e: Entry, trigger: str, stats: CopyResult) -> bool:
        """This node's files of ``e`` staged on the persistent side (``PartSide``), verified,
        then its part manifest; noted as ``part_durable``."""
        if await self.part_side.part_there(e):
            self.parted[e.name] = self.seen[e.name] = e.snap  # written by an earlier attempt, from these very files
            return True
        self.parted.pop(e.name, None)
        landed = await self.part_side.stage_part(e, stats)
        if landed is None:
            return False
        self.part_durable(landed.entry, landed.again, trigger)
        return True

    def part_durable(self, e: Entry, again: Listing, trigger: str) -> None:
        """This node's part of ``e`` is durable with its manifest: noted, journaled (``part``), handed on."""
        name = e.name
        self.parted[name] = self.seen[name] = e.snap
        if name in again.sigs:
            self.state.sigs[name] = again.sigs[name]
        lag = round(time.time() - e.done_at, 3) if e.done_at else None
        self.emit("part", pair=self.pair.name, checkpoint=name, node=self.node, nodes=self.nodes, trigger=trigger,
                  files=len(e.snap.files), bytes=e.snap.bytes, why=e.why, lag_s=lag, durable=True)
        self.gather.staged()

    async def _look_inside_published(self, listing: Listing) -> None:
        """A directory incomplete by itself here may be this node's part of a checkpoint that
        is published whole: HF's ``checkpoint-N/`` holding only the ``rng_state_R.pth`` of this
        node's ranks, left from an attempt where this node was not global rank 0's, and read
        by a leader now. Looked up once per local version, so the end does not call it torn."""
        for e in listing.entries.values():
            known = self.inside.get(e.name)
            if not (e.complete or not e.is_dir or (known is not None and known[0].same_content(e.snap))):
                self.inside[e.name] = (e.snap, await self.part_side.inside_published(e))

    def _note_pending(self, listing: Listing) -> None:
        name_ = self.pair.name
        out = []
        local = set()
        for e in sorted(listing.entries.values(), key=lambda e: natural_key(e.name)):
            local.add(e.name)
            done = self.state.published.get(e.name)
            staged = self.parted.get(e.name)
            inside = self.inside.get(e.name)
            if not e.complete and inside is not None and inside[1] and inside[0].same_content(e.snap):
                continue  # this node's files of a published checkpoint (HF's rng_state_R.pth): owed nothing
            if not e.complete:
                out.append(f"{name_}: {e.name} (incomplete: {e.why})")
            elif e.name in self.stale or done is not None and self._behind_published(e, done):
                # older here than the version on persistent storage (a restored copy the run moved
                # past), also when that version was published in this very pass (the last one)
                continue
            elif done is not None and done.same_content(e.snap):
                continue
            elif (conflict := self.gather.conflict(e.name)) is not None:
                out.append(f"{name_}: {e.name} (parts conflict: {conflict})")
            elif staged is not None and staged.same_content(e.snap):
                waits = self.gather.waiting(e.name)
                if waits is not None:
                    out.append(f"{name_}: {e.name} (waiting for parts: {waits})")
                # a node's own part is durable: nothing owed here
            else:
                out.append(f"{name_}: {e.name} (complete, not yet on persistent storage)")
        self.state.pending = out + self.gather.pending(listing, local)

    def _behind(self, ptr: Pointer) -> bool:
        return self.gather.behind(ptr)

    def _holds(self, there: Snap | None, local: Snap) -> bool:
        """The published checkpoint holds every node's files: this node's must be among them."""
        return contains(there, local)

    def _retention_fields(self) -> dict[str, object]:
        return {"node": self.node}


class Handover:
    """Node K's piece (``Gather``): its parts are the leader's to publish; once the leader has
    taken one (its manifest gone: published, or superseded by a newer version), this node
    owes nothing more for that version, and what it keeps of it goes (``GatherSide.tidy``:
    its part directory; on a store, node 0's spent word)."""

    def __init__(self, pub: PartPublisher, side: GatherSide, tell: Callable[[str], None] = lambda word: None) -> None:
        self.pub = pub
        self.side = side
        self.tell = tell  # a word to the leader (conduct/link.py): a part is staged

    async def begin(self) -> None:
        """Inside the pass: never while this node stages."""
        pub = self.pub
        gone = await self.side.taken(list(pub.parted))
        for name in gone:  # published or superseded: this version is owed nothing more
            pub.state.published[name] = pub.parted.pop(name)
        await self.side.tidy(gone)

    async def before_stage(self, e: Entry) -> None:
        return None

    def staged(self) -> None:
        self.tell("part")

    async def finish(self, trigger: str, published: list[str], listing: Listing) -> None:
        return None

    def conflict(self, name: str) -> str | None:
        return None

    def waiting(self, name: str) -> str | None:
        return None  # this node's own part is durable: nothing owed here

    def pending(self, listing: Listing, local: set[str]) -> list[str]:
        return []

    def behind(self, ptr: Pointer) -> bool:
        return False  # node K publishes no pointer
