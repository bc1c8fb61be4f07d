"""The leader's piece of a per-node pair's publishing: every node's parts into the checkpoint.

Node 0 (the leader, the main ``supervise``) stages its own part like every node
(``_partpublish.py``); besides, it says when node 0's part is complete by rank 0's own
marker (the go file or object: node K need not wait for ``settle``), and once every node's
manifest of a checkpoint is there (one, for a single file; with every rank's shard, for
DeepSpeed) it publishes them whole, then the pointers: a checkpoint appears complete or not at
all (docs/design.md, invariant 1). How is the persistent side's (``_side.GatherSide``): in a
directory, assembled into the staging directory and renamed into place (``_parts.assemble``);
on an object store, the checkpoint's manifest, the union of every node's, put conditionally.
Parts the published version already holds are released. While a checkpoint
waits, it says which nodes it waits for (``parts-waiting``). Rules and events: docs/sync.md,
"Multi-node checkpoints".
"""

from __future__ import annotations

import time
from typing import Callable

from supervisor.sync._complete import Entry, Listing, Pointer, Snap, natural_key, pointer_owed
from supervisor.sync._partpublish import PartPublisher
from supervisor.sync._parts import PartConflict, PartsChanged
from supervisor.sync._side import GatherSide
from supervisor.sync._versions import contains, written


def _nodes_text(missing: list[int]) -> str:
    return ("node " if len(missing) == 1 else "nodes ") + ", ".join(str(n) for n in missing)


class Assembly:
    """The leader's ``Gather``: node 0's word, the checkpoint once every part is there, the
    pointers after it, and what is still missing, on the persistent side it is given
    (``side``). ``trigger``: a pass once its own part is staged."""

    def __init__(self, pub: PartPublisher, side: GatherSide, trigger: Callable[[str], None],
                 tell: Callable[[str], None] = lambda word: None) -> None:
        self.pub = pub
        self.side = side
        self.pair, self.emit, self.state = pub.pair, pub.emit, pub.state
        self.nodes = pub.nodes
        self.node = pub.node
        self.trigger = trigger
        self.tell = tell                           # a word to the nodes (conduct/link.py): go, taken
        self.missing: dict[str, list[int]] = {}    # checkpoint → nodes whose part is not there
        self._told_missing: dict[str, tuple[int, ...]] = {}
        self.conflicts: dict[str, str] = {}
        self.short: dict[str, str] = {}            # checkpoint → the ranks' shards no part holds
        self.held_back: dict[str, bytes] = {}      # pointer → its local content older than the persistent one

    async def begin(self) -> None:
        return None

    async def before_stage(self, e: Entry) -> None:
        if self._go_applies(e) and await self.side.write_go(e.name):
            self.tell("go")

    def staged(self) -> None:
        self.trigger("parts")

    async def finish(self, trigger: str, published: list[str], listing: Listing) -> None:
        await self._assemble_ready(trigger, published, listing)
        await self.pub.publish_pointers(listing)

    def conflict(self, name: str) -> str | None:
        return self.conflicts.get(name)

    def waiting(self, name: str) -> str | None:
        return self._waiting(name, self.missing.get(name) or [])

    def pending(self, listing: Listing, local: set[str]) -> list[str]:
        name_ = self.pair.name
        out = []
        for name, missing in sorted(self.missing.items(), key=lambda kv: natural_key(kv[0])):
            if name not in local:
                out.append(f"{name_}: {name} (waiting for parts: {self._waiting(name, missing)})")
        for ptr in listing.pointers.values():
            if self.pub.pointers_done.get(ptr.name) != ptr.content:
                out.append(pointer_owed(name_, ptr, listing))
        return out

    def _go_applies(self, e: Entry) -> bool:
        """Node 0's completeness speaks for every node only where rank 0's own marker or
        pointer says so (DCP, DeepSpeed, Megatron, HF, Accelerate); with your markers every
        node writes its own (docs/sync.md), so each node judges its part alone."""
        prof = self.state.profile
        return bool(e.is_dir and not self.pair.markers and prof is not None and prof.needs_marker
                    and (e.why.startswith(("marker ", "pointer ", "older than "))))

    async def _assemble_ready(self, trigger: str, published: list[str], listing: Listing) -> None:
        """Publish every checkpoint whose parts are all there (every node's manifest;
        one, for a single file), including a newer version of one published before."""
        p, side = self.pair, self.side
        self.missing = {}
        for name, have in await side.parts_waiting():
            manifests = await side.current(name, have)
            if not manifests:
                continue  # a part being copied, no manifest yet, or only older versions: nothing to say
            single = all(m.get("is_dir") is False for m in manifests.values())
            if single and len(manifests) > 1:
                # A single file is whole on the one node that wrote it (rank 0's torch.save);
                # two nodes' versions of one name: the newest is the checkpoint.
                newest = max(manifests, key=lambda k: written(side.snap_of(manifests[k])))
                manifests = {newest: manifests[newest]}
            missing = [] if single else [k for k in range(self.nodes) if k not in manifests]
            short = None if single or missing else await side.short(name, manifests)
            if short:
                self.missing[name] = []
                self.short[name] = short
                if self._told_missing.get(name) != ():
                    self._told_missing[name] = ()
                    self.emit("parts-waiting", pair=p.name, checkpoint=name, nodes=self.nodes,
                              have=sorted(manifests), missing=[], shards=short)
                continue
            self.short.pop(name, None)
            if missing:
                self.say_missing(name, sorted(manifests), missing)
                continue
            try:
                whole = await side.assemble(name, manifests, single)
            except PartConflict as c:
                if self.conflicts.get(name) != str(c):
                    self.emit("part-conflict", pair=p.name, checkpoint=name, path=c.path, nodes=c.nodes,
                              error=str(c))
                self.conflicts[name] = str(c)
                continue
            except (PartsChanged, FileNotFoundError):
                self.missing[name] = []  # a node is copying its part again; its new manifest triggers us
                continue
            self.conflicts.pop(name, None)
            if whole is None:
                continue  # refused: another run's
            self.now_published(name, whole.version, listing)
            await side.release(name, manifests)
            self.tell("taken")
            lag = round(time.time() - whole.done_at, 3) if whole.done_at else None
            self.emit("publish", pair=p.name, checkpoint=name, trigger=trigger, files=whole.files, bytes=whole.bytes,
                      why=f"all {self.nodes} parts" if not single else f"whole on node {min(manifests)}",
                      lag_s=lag, nodes=self.nodes, **whole.fields)
            self.pub.on_publish(whole.done_at)
            published.append(name)

    def now_published(self, name: str, version: Snap, listing: Listing) -> None:
        """``name`` is published as ``version``: this node's local copy, where the published
        one holds it, is what is published now (its part is no longer owed)."""
        self._told_missing.pop(name, None)
        local = listing.entries.get(name)
        mine = local is not None and local.complete and contains(version, local.snap)
        self.state.published[name] = local.snap if mine and local is not None else version
        if mine and name in listing.sigs:
            self.state.sigs[name] = listing.sigs[name]
        self.pub.parted.pop(name, None)
        self.pub.stale.pop(name, None)

    def say_missing(self, name: str, have: list[int], missing: list[int]) -> None:
        """``name`` waits for the parts of ``missing``: journaled each time that set changes."""
        self.missing[name] = missing
        if self._told_missing.get(name) != tuple(missing):
            self._told_missing[name] = tuple(missing)
            self.emit("parts-waiting", pair=self.pair.name, checkpoint=name, nodes=self.nodes, have=have, missing=missing)

    def behind(self, ptr: Pointer) -> bool:
        """A local pointer naming an older checkpoint than the persistent one names
        (which is there) is never published over it. A host that was node K before holds the
        ``latest`` it restored then, which nothing rewrote there; as node 0 it turned the
        persistent pointer back past every checkpoint published since, and the restore called
        them torn ("newer than latest, which never named it"). Blocking."""
        p = self.pair
        if ptr.link or ptr.target is None:
            return False
        there = self.side.persistent_target(ptr.name)
        if there is None or natural_key(there) <= natural_key(ptr.target):
            return False
        if self.held_back.get(ptr.name) != ptr.content:
            self.held_back[ptr.name] = ptr.content
            self.emit("sync-deferred", pair=p.name, checkpoint=ptr.name, node=self.node,
                      reason=f"names {ptr.target}, older than the {there} it names on persistent storage: "
                             "never published over it")
        return True

    def _waiting(self, name: str, missing: list[int]) -> str:
        if missing:
            return f"{_nodes_text(missing)} missing"
        return self.short.get(name) or "all parts there, not yet assembled"
