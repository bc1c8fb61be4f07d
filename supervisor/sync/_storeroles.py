"""A pair whose persistent side is an object store (``to = "s3://…"``): ``ObjectStore``, the
``_side.Storage`` its jobs are given, and the store's answers for a per-node pair.

A pair of one node publishes its checkpoints whole to the ``_storepub.StoreSide``. A per-node
pair needs no shared filesystem at all: every node uploads its own part straight to the
bucket, under the checkpoint's keys, then its part manifest
(``.supervise/parts/<checkpoint>/node-K.json``: ``StoreParts``); the leader publishes the
checkpoint's manifest, the union of every node's, once all N are there (one, for a single
file such as rank 0's ``snapshot.pt``), then removes the part manifests: their nodes see that
as "taken" (``StoreGather``). Node 0's word that a checkpoint is complete (rank 0's marker is
written on node 0 only) is an object too (``.supervise/parts/<checkpoint>/go``). The words on
the leader's line (``part``, ``go``, ``taken``) say when to look, as for a directory. Rules:
docs/sync.md, "Object stores"; the roles that ask these: ``_roles.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from supervisor.errors import ConfigError
from supervisor.sync._backend import CopyResult
from supervisor.sync._complete import Entry, Listing, Snap, natural_key
from supervisor.sync._manifest import PARTS, checkpoint_doc, dumps, entry_of, go_rel, loads, manifest_rel, part_rel
from supervisor.sync._parts import PartConflict
from supervisor.sync._side import RECOPY_TRIES, Landed, Ledger, Whole
from supervisor.sync._state import PairState, to_thread
from supervisor.sync._storelogs import StoreLogs
from supervisor.sync._storepub import StoreRestore, StoreSide, collect, file_is, upload, uploaded_whole
from supervisor.sync._store import Store
from supervisor.sync._versions import contains, written


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
        if await self.side.place(name, self.state.owner) is False:
            self.side.ledger.refuse(name)  # another run's claim on the name
            return None
        for _attempt in range(RECOPY_TRIES):
            pins: list[str] = []
            try:
                files, sent, objects = await upload(self.store, p.src / name, e, self.state.owner, pins)
                again: Listing = await to_thread(self.side.rescan, name)
                now = again.entries.get(name)
                if now is None or not now.complete:
                    return None
                stats.files += objects
                stats.bytes += sent
                if not now.snap.same_content(e.snap) or not uploaded_whole(files, e.snap):
                    e = now
                    continue
                doc = checkpoint_doc(e, files, profile=self.state.profile, nodes=self.nodes, extra={"node": self.node})
                await self.store.put_bytes(self.store.key(rel), dumps(doc))
            except FileNotFoundError:
                if await to_thread(Path.exists, p.src / name):
                    raise
                return None
            finally:
                self.store.unpin(pins)
            return Landed(e, again, {})
        self.emit("sync-deferred", pair=p.name, checkpoint=name, node=self.node,
                  reason=f"changed while being uploaded, {RECOPY_TRIES} times; trying again on the next pass")
        return None


class StoreGather:
    """A per-node pair's gathering on a store (``_side.GatherSide``): node 0's word is a go
    object, each part a part manifest, the checkpoint its manifest, the union of every
    node's, put conditionally. ``side``: the pair's ``StoreSide`` (the published manifests,
    what this run may replace)."""

    def __init__(self, side: StoreSide, *, node: int) -> None:
        self.side = side
        self.state, self.pair, self.emit, self.store = side.state, side.pair, side.emit, side.store
        self.node = node
        self.nodes = side.pair.nodes
        self.wrote_go: set[str] = set()  # the leader: go objects it put, until their checkpoint is published
        self.went: set[str] = set()      # node K: checkpoints node 0 saw complete (their go objects), until taken

    # ---- the leader's -----------------------------------------------------------------

    async def write_go(self, name: str) -> bool:
        if name in self.wrote_go:
            return False
        await self.store.put_bytes(self.store.key(go_rel(name)), b"node 0 saw it complete\n")
        self.wrote_go.add(name)
        return True

    def persistent_target(self, name: str) -> str | None:
        return None  # the leader's pointer follows what it published; never another node's

    async def parts_waiting(self) -> list[tuple[str, Any]]:
        return sorted((await parts_there(self.store)).items(), key=lambda kv: natural_key(kv[0]), reverse=True)

    async def current(self, name: str, have: Any) -> dict[int, dict[str, Any]]:
        """The part manifests of ``name`` holding a version not yet published; those the
        published manifest already holds (or a newer one replaced) are removed here. A go
        object neither this leader wrote nor a current part of node 0's stands behind is
        dropped (``_drop_go``)."""
        manifests: dict[int, dict[str, Any]] = {}
        for k in range(self.nodes):
            if f"node-{k}.json" in have:
                got = await self.store.get(self.store.key(part_rel(name, k)))
                doc = loads(got[0]) if got is not None else None
                if doc is not None and doc.get("nodes") == self.nodes:
                    manifests[k] = doc
        there = await self.side.there(name)
        if manifests and there is not None:
            pub_files = self.side.docs[name]["files"]
            old = [k for k, m in manifests.items()
                   if all(pub_files.get(r, {}).get("sha256") == f["sha256"] for r, f in m["files"].items())
                   or written(entry_of(m).snap) <= written(there)]
            await self.store.delete([self.store.key(part_rel(name, k)) for k in old])
            manifests = {k: m for k, m in manifests.items() if k not in old}
        if "go" in have and name not in self.wrote_go and 0 not in manifests:
            await self._drop_go(name)
        return manifests

    async def _drop_go(self, name: str) -> None:
        """A go object that neither this leader wrote (its passes put one before staging node
        0's part of a version it holds) nor a current part of node 0's stands behind: a killed
        leader's, left between the checkpoint's manifest and the removals after it (or before
        its own part went up). Removed: node K would take it as node 0's word on a version of
        that name it writes later (a directory reused), before node 0 saw that one complete."""
        await self.store.delete([self.store.key(go_rel(name))])

    def snap_of(self, manifest: Mapping[str, Any]) -> Snap:
        return entry_of(manifest).snap

    async def short(self, name: str, manifests: Mapping[int, Mapping[str, Any]]) -> str | None:
        return None

    def _merge(self, name: str, manifests: Mapping[int, Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
        """Every node's files together, and the paths several nodes held, identical (the publish
        event's ``shared``, as for a directory); two nodes holding one path with other bytes: a conflict."""
        files: dict[str, dict[str, Any]] = {}
        owner: dict[str, int] = {}
        shared: set[str] = set()
        for k in sorted(manifests):
            for rel, f in manifests[k]["files"].items():
                if rel in files:
                    if files[rel]["sha256"] != f["sha256"]:
                        raise PartConflict(name, rel, [owner[rel], k])
                    shared.add(rel)
                files.setdefault(rel, dict(f))
                owner.setdefault(rel, k)
        return files, sorted(shared)

    async def assemble(self, name: str, manifests: Mapping[int, Mapping[str, Any]], single: bool) -> Whole | None:
        """The checkpoint's manifest, every part's files together, put with ``If-None-Match``
        (a name this run never published) or ``If-Match`` (a new version of its own); the
        objects of the version it replaced that it no longer names go. None: refused."""
        files, shared = self._merge(name, manifests)
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
        side = self.side
        before = side.docs.get(name)
        if before is not None and not side.ledger.owns(name):
            side.ledger.refuse(name)
            return None
        if await side.commit(rel, dumps(doc), side.etags.get(rel) if before is not None else None) is None:
            side.ledger.refuse(name)
            return None
        await side.superseded(before, doc)
        side.docs[name] = doc
        return Whole(entry_of(doc).snap, len(files), doc["bytes"], e.done_at,
                     {"parts": doc["parts"], "shared": shared, "manifest": self.store.key(rel)})

    async def release(self, name: str, manifests: Mapping[int, Mapping[str, Any]]) -> None:
        """The part manifests and the go object go: their nodes see that as "taken"."""
        await self.store.delete([self.store.key(part_rel(name, k)) for k in manifests] + [self.store.key(go_rel(name))])
        self.wrote_go.discard(name)

    async def parts_now(self) -> tuple[Any, bool]:
        """One listing of ``.supervise/parts/``; a part manifest there asks for a pass."""
        now = await parts_there(self.store)
        return now, any(any(leaf.startswith("node-") for leaf in leaves) for leaves in now.values())

    def leftovers(self) -> list[Path]:
        return []  # nothing of ours is visible on a store without a manifest

    # ---- node K's ---------------------------------------------------------------------

    def said_go(self, name: str) -> bool:
        return name in self.went

    async def look(self, awaiting: set[str], parted: list[str]) -> bool:
        """A look when node 0 may have said a checkpoint this node waits on is complete, or
        the leader may have taken a part of this node's (its part manifest gone)."""
        if not awaiting and not parted:
            return False
        try:
            there = await parts_there(self.store)
        except OSError:
            return False
        said = {n for n in awaiting if "go" in there.get(n, set())} - self.went
        gone = [n for n in parted if f"node-{self.node}.json" not in there.get(n, set())]
        if said or gone:
            self.went |= said
            return True
        return False

    async def taken(self, parted: list[str]) -> list[str]:
        if not parted:
            return []
        there = await parts_there(self.store)
        return [n for n in parted if f"node-{self.node}.json" not in there.get(n, set())]

    async def tidy(self, gone: list[str]) -> None:
        """A part taken: the word that made it complete is spent. Kept, a directory rewritten
        in place would be complete here at once, on the word for the version before."""
        for name in gone:
            self.went.discard(name)


class ObjectStore:
    """An object store as one pair's persistent storage (``_side.Storage``): ``store``, its
    client (``_store.Store``); ``rescan(name)`` lists one local entry again (blocking)."""

    def __init__(self, state: PairState, store: Store, *, rescan: Callable[[str], Listing]) -> None:
        self.state = state
        self.store = store
        self.rescan = rescan
        self.collects = True   # the leader's: this run's objects put before its start check that nothing names
        self.started: Any = None

    def whole(self, ledger: Ledger) -> StoreSide:
        return StoreSide(self.state, self.store, ledger=ledger, rescan=self.rescan)

    def per_node(self, ledger: Ledger, node: int) -> tuple[StoreSide, StoreParts, StoreGather]:
        side = StoreSide(self.state, self.store, ledger=ledger, rescan=self.rescan)
        self.collects = node == 0
        return side, StoreParts(side, node=node), StoreGather(side, node=node)

    def restore(self) -> StoreRestore:
        return StoreRestore(self.state, self.store)

    def logs(self, recheck: Callable[[float], None]) -> StoreLogs:
        return StoreLogs(self.state, self.store, recheck=recheck)

    async def prepare(self) -> None:
        """A bucket has no directory to make. The leader's first pass after its start check
        deletes this run's objects put before that check that no manifest names (a pass killed
        between its uploads and its manifest: ``_storepub.collect``), and says so (``store-collected``)."""
        if not self.collects or self.started is None:
            return
        before, self.started = self.started, None
        gone = await collect(self.store, self.state.owner, before=before)
        if gone:
            self.state.emit("store-collected", pair=self.state.pair.name, objects=len(gone),
                            reason="objects of this run that no manifest names, put before this attempt started")

    def probe(self) -> str | None:
        """Can this run list, write and delete under the pair's prefix? One line, exit 2,
        nothing started, when it cannot (the extra missing, no bucket, a wrong key, no
        endpoint); the secret is never part of it. An endpoint that accepts and does not answer
        (hung) is a warning: the training starts, its checkpoints wait on the nodes' disks, where a
        restore finds them (issue 43), until the store answers."""
        p = self.state.pair
        key = f"sync {p.name}.to"
        try:
            from supervisor.sync._store import PROBE_RETRIES, PROBE_TIMEOUT, StoreError

            import obstore  # noqa: F401 - the s3 extra
        except ImportError:
            raise ConfigError(key, p.where, "an s3:// persistent side needs the s3 extra: pip install 'supervise-hpc[s3]' (obstore)",
                              p.origin) from None

        try:
            probe = Store(p.store, retries=PROBE_RETRIES, timeout=PROBE_TIMEOUT)
            probe.probe()
            self.started = probe.started
        except StoreError as e:
            if e.code == "ETIMEDOUT":
                return f"sync {p.name}: {p.where} does not answer ({PROBE_TIMEOUT} a request): starting anyway"
            raise ConfigError(key, p.where, str(e).removeprefix(f"{p.where}: "), p.origin) from None
        return None

    @property
    def backend(self) -> str:
        return "s3"

    def leftovers(self) -> list[Path]:
        return []  # nothing of ours is visible on a store without a manifest

    def content_manifest(self, name: str) -> Mapping[str, Any] | None:
        return None  # a node's holdings are hashed here; the store's manifests are the restore's
