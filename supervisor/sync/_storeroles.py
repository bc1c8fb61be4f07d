"""The roles of a pair whose persistent side is an object store (``to = "s3://…"``).

``StoreSingle`` publishes this node's checkpoints whole (``_publish.Publisher`` given a ``_storepub.StoreSide``).
A per-node pair needs no shared filesystem at all: every node uploads its own part straight
to the bucket, under the checkpoint's keys, then its part manifest
(``.supervise/parts/<checkpoint>/node-K.json``); the leader (``StoreLeader``) publishes the
checkpoint's manifest, the union of every node's, once all N are there (one, for a single
file such as rank 0's ``snapshot.pt``), then removes the part manifests: their nodes see that
as "taken". Node 0's word that a checkpoint is complete (rank 0's marker is written on node 0
only) is an object too (``.supervise/parts/<checkpoint>/go``). The words on the leader's line
(``part``, ``go``, ``taken``) say when to look, as for a directory. Rules: docs/sync.md,
"Object stores"; the roles they extend: ``_roles.py``.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from supervisor.sync._backend import CopyResult
from supervisor.sync._complete import Entry, Listing, Pointer, Snap, natural_key
from supervisor.sync._manifest import PARTS, checkpoint_doc, dumps, entry_of, go_rel, loads, manifest_rel, part_rel
from supervisor.sync._assembly import Assembly
from supervisor.sync._partpublish import Handover, PartPublisher
from supervisor.sync._publish import Publisher
from supervisor.sync._side import RECOPY_TRIES, Landed, Ledger
from supervisor.sync._roles import WAITING_POLL_S, GO_POLL_S, Host, Leader, Node, Single, settled_here
from supervisor.sync._state import to_thread
from supervisor.sync._storepub import StoreSide, file_is, upload, uploaded_whole
from supervisor.sync._store import Store
from supervisor.sync._versions import contains, written


class StoreSingle(Single):
    """A pair mirrored from this node alone into an object store."""

    def compose(self, host: Host, *, on_publish: Callable[..., None], ours: set[str] | None) -> Publisher:
        self.host = host
        ledger = Ledger(host.state, ours)
        side = StoreSide(host.state, host.state.store, ledger=ledger, rescan=host.rescan)
        return Publisher(host.state, side, ledger=ledger, recheck=host.schedule.recheck, on_publish=on_publish,
                         wanted=host.schedule.wanted)

    def leftovers(self) -> list[Path]:
        return []  # nothing of ours is visible on a store without a manifest


async def parts_there(store: Store) -> dict[str, set[str]]:
    """Checkpoint → the names under ``.supervise/parts/<checkpoint>/`` (``node-K.json``, ``go``): one listing."""
    out: dict[str, set[str]] = {}
    for meta in await store.list(PARTS):
        name, _, leaf = store.rel(meta["path"])[len(PARTS):].partition("/")
        out.setdefault(name, set()).add(leaf)
    return out


class StoreParts:
    """This node's parts of a per-node pair on an object store (``_side.PartSide``): its files
    uploaded under the checkpoint's keys, checked, then its part manifest. ``side``: the
    pair's ``StoreSide`` (the published manifests, this run's claims, what it may replace)."""

    def __init__(self, side: StoreSide, *, node: int) -> None:
        self.side = side
        self.state, self.pair, self.emit, self.store = side.state, side.pair, side.emit, side.store
        self.node = node
        self.nodes = side.pair.nodes

    async def published_as(self, e: Entry) -> tuple[Snap | None, bool] | None:
        there = await self.side.there(e.name)
        if there is None:
            return None
        same = contains(there, e.snap) if e.is_dir else await to_thread(file_is, self.pair.src / e.name, self.side.docs[e.name])
        return there, same

    async def drop_part(self, name: str) -> None:
        return None  # objects without a part manifest are never gathered; the next upload writes over them

    async def inside_published(self, e: Entry) -> bool:
        """Asked of the published manifest: a directory incomplete here may be this node's
        files of a checkpoint published whole (HF's ``rng_state_R.pth``)."""
        return contains(await self.side.there(e.name), e.snap)

    async def part_there(self, e: Entry) -> bool:
        p, name = self.pair, e.name
        rel = part_rel(name, self.node)
        old = await self.side.manifests.read(rel)
        if old is not None and entry_of(old[0]).snap.same_content(e.snap) and old[0].get("nodes") == self.nodes:
            return True
        if old is not None:
            await self.store.delete([self.store.key(rel)])
            self.emit("part-withdrawn", pair=p.name, checkpoint=name, node=self.node,
                      reason="this node's files changed after its part was written; uploading it again")
        return False

    async def stage_part(self, e: Entry, stats: CopyResult) -> Landed | None:
        """This node's files of ``e`` uploaded, checked, then its part manifest."""
        p, name = self.pair, e.name
        rel = part_rel(name, self.node)
        token = await self.side.place(name, self.state.owner)
        if token is False:
            self.side.ledger.refuse(name)  # another run's claim on the name
            return None
        if token is None and not e.is_dir:
            # A single file may be whole on several nodes at once (each node's version of one
            # name): each its own place, never one key that another node's upload overwrites.
            token = f"node-{self.node}-{secrets.token_hex(4)}"
        for _attempt in range(RECOPY_TRIES):
            try:
                files = await upload(self.store, p.src / name, e, name, token)
            except FileNotFoundError:
                if await to_thread(Path.exists, p.src / name):
                    raise
                return None
            again: Listing = await to_thread(self.side.rescan, name)
            now = again.entries.get(name)
            if now is None or not now.complete:
                return None
            if not now.snap.same_content(e.snap) or not uploaded_whole(files, e.snap):
                e = now
                continue
            stats.files += len(files)
            stats.bytes += sum(int(f["size"]) for f in files.values())
            doc = checkpoint_doc(e, files, profile=self.state.profile, nodes=self.nodes, extra={"node": self.node})
            await self.store.put_bytes(self.store.key(rel), dumps(doc))
            return Landed(e, again, {})
        self.emit("sync-deferred", pair=p.name, checkpoint=name, node=self.node,
                  reason=f"changed while being uploaded, {RECOPY_TRIES} times; trying again on the next pass")
        return None


class StoreAssembly(Assembly):
    """The leader's ``Gather`` on a store (``Assembly``'s, but for): the go objects, the
    checkpoint's manifest once every part manifest is there, the pointers after it."""

    def __init__(self, pub: PartPublisher, side: StoreSide, trigger: Callable[[str], None],
                 tell: Callable[[str], None]) -> None:
        super().__init__(pub, trigger, tell)
        self.side = side
        self.store = side.store
        self._went: set[str] = set()

    async def before_stage(self, e: Entry) -> None:
        if self._go_applies(e) and e.name not in self._went:
            await self.store.put_bytes(self.store.key(go_rel(e.name)), b"node 0 saw it complete\n")
            self._went.add(e.name)
            self.tell("go")

    def behind(self, ptr: Pointer) -> bool:
        return False  # the leader's pointer follows what it published; never another node's

    async def _assemble_ready(self, trigger: str, published: list[str], listing: Listing) -> None:
        self.missing = {}
        for name, leaves in sorted((await parts_there(self.store)).items(), key=lambda kv: natural_key(kv[0]), reverse=True):
            manifests = await self._current(name, leaves)
            if "go" in leaves and name not in self._went and 0 not in manifests:
                await self._drop_go(name)
            if not manifests:
                continue
            single = all(m.get("is_dir") is False for m in manifests.values())
            if single and len(manifests) > 1:  # one file whole on each of several nodes: the newest is the checkpoint
                newest = max(manifests, key=lambda k: written(entry_of(manifests[k]).snap))
                manifests = {newest: manifests[newest]}
            missing = [] if single else [k for k in range(self.nodes) if k not in manifests]
            if missing:
                self.say_missing(name, sorted(manifests), missing)
                continue
            merged = self._merge(name, manifests)
            if merged is None:
                continue
            if not await self._commit_whole(name, merged, manifests, trigger, single, listing):
                continue
            published.append(name)

    async def _drop_go(self, name: str) -> None:
        """A go object that neither this leader wrote (its passes put one before staging node
        0's part of a version it holds) nor a current part of node 0's stands behind: a killed
        leader's, left between the checkpoint's manifest and the removals after it (or before
        its own part went up). Removed: node K would take it as node 0's word on a version of
        that name it writes later (a directory reused), before node 0 saw that one complete."""
        await self.store.delete([self.store.key(go_rel(name))])

    async def _current(self, name: str, leaves: set[str]) -> dict[int, dict[str, Any]]:
        """The part manifests of ``name`` holding a version not yet published; those the
        published manifest already holds (or a newer one replaced) are removed here."""
        manifests: dict[int, dict[str, Any]] = {}
        for k in range(self.nodes):
            if f"node-{k}.json" in leaves:
                got = await self.store.get(self.store.key(part_rel(name, k)))
                doc = loads(got[0]) if got is not None else None
                if doc is not None and doc.get("nodes") == self.nodes:
                    manifests[k] = doc
        there = await self.side.there(name)
        if not manifests or there is None:
            return manifests
        pub_files = self.side.docs[name]["files"]
        old = [k for k, m in manifests.items()
               if all(pub_files.get(r, {}).get("sha256") == f["sha256"] for r, f in m["files"].items())
               or written(entry_of(m).snap) <= written(there)]
        await self.store.delete([self.store.key(part_rel(name, k)) for k in old])
        return {k: m for k, m in manifests.items() if k not in old}

    def _merge(self, name: str, manifests: Mapping[int, Mapping[str, Any]]) -> dict[str, Any] | None:
        """Every node's files together; two nodes holding one path with other bytes: a conflict."""
        files: dict[str, dict[str, Any]] = {}
        owner: dict[str, int] = {}
        for k in sorted(manifests):
            for rel, f in manifests[k]["files"].items():
                if rel in files and files[rel]["sha256"] != f["sha256"]:
                    error = f"{name}: {rel or name} differs between nodes {owner[rel]}, {k}"
                    if self.conflicts.get(name) != error:
                        self.emit("part-conflict", pair=self.pair.name, checkpoint=name, path=rel,
                                  nodes=[owner[rel], k], error=error)
                    self.conflicts[name] = error
                    return None
                files.setdefault(rel, dict(f))
                owner.setdefault(rel, k)
        self.conflicts.pop(name, None)
        return files

    async def _commit_whole(self, name: str, files: dict[str, Any], manifests: Mapping[int, Mapping[str, Any]],
                            trigger: str, single: bool, listing: Listing) -> bool:
        p = self.pair
        first = manifests[min(manifests)]
        docs = list(manifests.values())
        done = [d["done_at"] for d in docs if d.get("done_at")]
        e = Entry(name=name, is_dir=bool(first["is_dir"]), snap=Snap({}, max(int(d["newest_ns"]) for d in docs), 0),
                  complete=True, why=f"all {self.nodes} parts" if not single else f"whole on node {min(manifests)}",
                  done_at=max(done) if done else None, step=first.get("step"),
                  markers=tuple(sorted({m for d in docs for m in d.get("markers") or ()})),
                  restorable=bool(first.get("restorable", True)))
        doc = checkpoint_doc(e, files, profile=self.state.profile, nodes=self.nodes,
                             extra={"parts": {str(k): len(m["files"]) for k, m in manifests.items()}})
        rel = manifest_rel(name)
        before = self.side.docs.get(name)
        if before is not None and not self.pub.ledger.owns(name):
            self.pub.ledger.refuse(name)
            return False
        if await self.side.commit(rel, dumps(doc), self.side.etags.get(rel) if before is not None else None) is None:
            self.pub.ledger.refuse(name)
            return False
        await self.side.superseded(before, doc)
        self.side.docs[name] = doc
        self.now_published(name, entry_of(doc).snap, listing)
        await self.store.delete([self.store.key(part_rel(name, k)) for k in manifests] + [self.store.key(go_rel(name))])
        self._went.discard(name)
        self.tell("taken")
        lag = round(time.time() - e.done_at, 3) if e.done_at else None
        self.emit("publish", pair=p.name, checkpoint=name, trigger=trigger, files=len(files), bytes=doc["bytes"],
                  why=e.why, lag_s=lag, nodes=self.nodes, parts=doc["parts"], manifest=self.store.key(rel))
        self.pub.on_publish(e.done_at)
        return True


class StoreHandover(Handover):
    """Node K's ``Gather`` on a store: once the leader has taken a part (its part manifest
    gone), this node owes nothing more for that version, and node 0's word on it is spent
    (``spent``: the leader removed the go object with the part manifests)."""

    def __init__(self, pub: PartPublisher, store: Store, tell: Callable[[str], None],
                 spent: Callable[[str], None] = lambda name: None) -> None:
        super().__init__(pub, tell)
        self.store = store
        self.spent = spent

    async def begin(self) -> None:
        pub = self.pub
        if not pub.parted:
            return
        there = await parts_there(self.store)
        for name in [n for n in pub.parted if f"node-{pub.node}.json" not in there.get(n, set())]:
            pub.state.published[name] = pub.parted.pop(name)
            self.spent(name)


class _OnStore:
    """What the leader and node K share on a store: their publisher, no leftovers."""

    host: Host
    node: int
    parts: PartPublisher

    def compose(self, host: Host, *, on_publish: Callable[..., None], ours: set[str] | None) -> Publisher:
        self.host = host
        self.pair, self.emit = host.state.pair, host.state.emit
        self.store: Store = host.state.store
        ledger = Ledger(host.state)
        self.side = StoreSide(host.state, self.store, ledger=ledger, rescan=host.rescan)
        self.parts = PartPublisher(host.state, self.side, StoreParts(self.side, node=self.node), ledger=ledger,
                                   node=self.node, recheck=host.schedule.recheck, on_publish=on_publish,
                                   gather=self._gather)  # type: ignore[attr-defined]
        return self.parts

    def leftovers(self) -> list[Path]:
        return []


class StoreLeader(_OnStore, Leader):
    """Node 0 of a per-node pair on a store."""

    def _gather(self, pub: PartPublisher) -> StoreAssembly:  # type: ignore[override]
        assembly = StoreAssembly(pub, self.side, trigger=self.host.trigger, tell=lambda word: self.tell(word))
        self.assembly = assembly  # type: ignore[assignment]  # what parts_watch reads of it: ``missing``
        return assembly

    async def parts_watch(self) -> None:
        """A pass when a node says it uploaded a part, else when the part manifests change
        (one listing of ``.supervise/parts/`` per look)."""
        last: dict[str, set[str]] | None = None
        while True:
            fast = min(self.parts_poll, WAITING_POLL_S) if self.assembly.missing else self.parts_poll
            if await self.bell.wait(self._pause(fast)):
                self.host.trigger("parts")
                continue
            try:
                now = await parts_there(self.store)
            except OSError:
                continue
            if now != last:
                last = now
                if any(any(leaf.startswith("node-") for leaf in leaves) for leaves in now.values()):
                    self.host.trigger("parts")


class StoreNode(_OnStore, Node):
    """Node K > 0 of a per-node pair on a store."""

    def __init__(self, node: int, parts_poll: float = 1.0) -> None:
        super().__init__(node, parts_poll)
        self.went: set[str] = set()   # checkpoints node 0 saw complete (their go objects), until taken

    def _gather(self, pub: PartPublisher) -> StoreHandover:  # type: ignore[override]
        # A part taken: the word that made it complete is spent. Kept, a directory rewritten
        # in place would be complete here at once, on the word for the version before.
        return StoreHandover(pub, self.store, tell=lambda word: self.tell(word), spent=self.went.discard)

    def judged(self, listing: Listing, *, settle: float, finished: bool, whole_local: bool) -> None:
        go = {n for n, e in listing.entries.items() if not e.complete and e.is_dir and n in self.went}
        settled_here(listing, settle, time.time(), finished=finished, go=go)
        if whole_local:
            self.awaiting_go = {n for n, e in listing.entries.items() if not e.complete and e.is_dir}

    async def parts_watch(self) -> None:
        """A pass when node 0 says a checkpoint this node waits on is complete, or the leader
        took a part of this node's (its part manifest gone)."""
        while True:
            await self.bell.wait(self._pause(GO_POLL_S if self.awaiting_go else self.parts_poll))
            if not self.awaiting_go and not self.parts.parted:
                continue
            try:
                there = await parts_there(self.store)
            except OSError:
                continue
            said = {n for n in self.awaiting_go if "go" in there.get(n, set())} - self.went
            taken = [n for n in self.parts.parted if f"node-{self.node}.json" not in there.get(n, set())]
            if said or taken:
                self.went |= said
                self.host.trigger("parts")
