"""A checkpoint pair written by several nodes, each to its own local disk (``nodes = N``).

Every node's mirror (the leader, node 0, in the main ``supervise``; node K in
``supervise node-agent``) runs the same engine over its own local side: the completeness
rules are the usual ones, judged on this node's files, but a complete checkpoint becomes a
*part* (``_parts.py``): node K's files staged under ``.supervise-parts/<name>/node-K/`` on
the persistent side and a manifest written last. No node publishes a checkpoint itself. The
leader also watches the parts (one ``listdir`` a second: inotify does not see other nodes'
writes on a network filesystem) and, once all N manifests are there, assembles them into the
ordinary staging directory and renames it into place, then writes the pointer files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import socket
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

import anyio

from supervisor import stacks
from supervisor.config import SyncPair
from supervisor.journal import Emit
from supervisor.sync import _fsops
from supervisor.sync._backend import Backend, CopyError, CopyResult
from supervisor.sync._complete import (Context, Entry, Listing, Pointer, Snap, classify, identical, matches,
                                      missing_shards, natural_key, pointer_target, snapshot)
from supervisor.sync._exclude import within
from supervisor.sync._writers import open_for_write
from supervisor.sync._pair import PairEngine
from supervisor.sync._publish import RECOPY_TRIES, Publisher, complete_newest_first
from supervisor.sync._state import PairState, to_thread
from supervisor.sync._profiles import Profile
from supervisor.sync._space import SpaceWatch
from supervisor.sync._parts import (PartConflict, PartsChanged, assemble, assembled_snap, manifest_path, manifest_snap,
                                    part_dir, part_source, read_manifest, release_parts, waiting, withdraw, write_manifest)

log = logging.getLogger("supervise")


def contains(there: Snap | None, mine: Snap) -> bool:
    """Does the published ``there`` hold every file of this node's ``mine``, same size and
    mtime (within 1 s)? Other nodes' files may be there too."""
    if there is None:
        return False
    for rel, (size, mt) in mine.files.items():
        got = there.files.get(rel)
        if got is None or got[0] != size or abs(got[1] - mt) > 1_000_000_000:
            return False
    return True


SAME_SECOND_NS = 1_000_000_000  # mtimes this close may be one version (filesystems that keep whole seconds)


def written(snap: Snap) -> int:
    """When a version was written: its newest file's mtime (not ctime: a copy's is its copying)."""
    return max((mt for _size, mt in snap.files.values()), default=0)


SET_ASIDE_DIR = ".supervise-set-aside"  # hidden: never a checkpoint, never copied


def role_before(previous_start: dict | None, host: str) -> int | None:
    """This host's node index in the attempt before (its leader's ``start`` event), or None."""
    nodes = [str(n).split(".")[0] for n in (previous_start or {}).get("nodes") or []]
    short = host.split(".")[0]
    return nodes.index(short) if short in nodes else None


def set_aside_other_role(pairs: list[SyncPair], was: int | None, now: int, emit: Emit) -> list[str]:
    """A host that was node ``was`` in the previous attempt and is node ``now`` in this one
    holds, on its local side, the files it wrote in the other role: taken as this role's part
    they would mix other ranks' shards into it (a part of ranks 0-1 twice and none of ranks
    2-3 would look whole). Its local checkpoints not published yet are set aside."""
    if was is None or was == now:
        return []
    return [name for p in pairs if p.kind == "checkpoint" and p.nodes > 1
            for name in set_aside(p, now, emit, f"written as node {was}; this host is node {now} now")]


def set_aside(p: SyncPair, node: int, emit: Emit, why: str) -> list[str]:
    """Move every local checkpoint of ``p`` that is not on persistent storage under the hidden
    ``.supervise-set-aside/`` (kept for you, never copied, never restored): ``part-set-aside``."""
    try:
        names = sorted(os.listdir(p.src))
    except OSError:
        return []
    moved = []
    for name in names:
        if name.startswith(".") or os.path.lexists(p.dst / name) or os.path.islink(p.src / name) \
                or not os.path.isdir(p.src / name) and not os.path.isfile(p.src / name):
            continue
        if _move_aside(p, name, node, emit, why):
            moved.append(name)
    return moved


def _move_aside(p: SyncPair, name: str, node: int, emit: Emit, why: str) -> bool:
    where = p.src / SET_ASIDE_DIR
    where.mkdir(parents=True, exist_ok=True)
    target, n = where / name, 1
    while os.path.lexists(target):
        target, n = where / f"{name}.{n}", n + 1
    try:
        os.rename(p.src / name, target)
    except OSError:
        return False
    emit("part-set-aside", pair=p.name, checkpoint=name, node=node, to=str(target), why=why)
    return True


def set_aside_versions(p: SyncPair, node: int, emit: Emit, why: str) -> list[str]:
    """Set aside every local entry of ``p`` whose name is published with another content
    (``snapshot.pt`` saved again after the version on persistent storage): a rank loading
    it would resume from a version the other nodes do not have."""
    moved = []
    try:
        names = sorted(os.listdir(p.src))
    except OSError:
        return []
    for name in names:
        if name.startswith(".") or os.path.islink(p.src / name) or not os.path.lexists(p.dst / name):
            continue
        there = snapshot(p.dst / name, within(name, p.exclude))
        mine = snapshot(p.src / name, within(name, p.exclude))
        whole = there is not None and mine is not None and there.files.keys() == mine.files.keys()
        if mine is None or there is None or (identical(p.src / name, p.dst / name, mine, there) if whole
                                             else contains(there, mine)):
            continue
        if _move_aside(p, name, node, emit, why):
            moved.append(name)
    return moved


def version_of(path: Path) -> dict[str, object]:
    """A version's identity on one node: name, bytes, newest mtime (ns) and sha256 (of a
    file's content; of a directory's sorted listing of names, sizes and mtimes)."""
    snap = snapshot(path)
    h = hashlib.sha256()
    if snap is not None and path.is_file():
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    elif snap is not None:
        for rel, (size, mt) in sorted(snap.files.items()):
            h.update(f"{rel}\0{size}\0{mt // 1_000_000_000}\n".encode())
    return {"name": path.name, "bytes": snap.bytes if snap else None, "mtime_ns": written(snap) if snap else None,
            "sha256": h.hexdigest()}


GO_FILE = "complete-on-node-0"  # in .supervise-parts/<checkpoint>/: the leader saw it complete
GO_POLL_S = 0.1                  # node K, while a part waits: how often it looks for the leader's word
WAITING_POLL_S = 0.2             # the leader, while a checkpoint waits for parts


def go_path(dst: Path, name: str) -> Path:
    return part_dir(dst, name, 0).parent / GO_FILE


def write_go(dst: Path, name: str) -> None:
    """Leader: node 0's part of ``name`` is complete by rank 0's own marker (written after a
    barrier behind every rank's writes): the other nodes' shards are final, they need not
    wait for ``settle``."""
    path = go_path(dst, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def local_profile(profile: Profile | None, leader: bool, *, local: bool = True) -> Profile | None:
    """The rules a node's own files are judged by. DCP's ``.metadata``, DeepSpeed's and
    Megatron's pointers are written by global rank 0, on node 0: on node K they never appear,
    so a profile that needs them would keep node K's part waiting for ever. There the part is
    complete when it settles (docs/sync.md), and a marker seen on node K (a restored checkpoint
    has one) makes no later part wait for it. On every node's ``local`` side, each node holds
    its own ranks' shards only (DeepSpeed's node-local mode): asking it for every rank's kept
    node 0's part waiting for ever too; the parts together are asked for them, at assembly."""
    if profile is None:
        return None
    if local and profile.shards:
        profile = dataclasses.replace(profile, shards="", world=("", ""))
    if leader or not profile.needs_marker:
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


def taken(dst: Path, names: list[str], node: int) -> list[str]:
    """Node K: those of its parts ``names`` whose manifest the leader has removed
    (published, or superseded by a newer version). Blocking: one stat per part."""
    return [n for n in names if not os.path.lexists(manifest_path(dst, n, node))]


def tidy(dst: Path, taken: list[str], node: int) -> None:
    """Node K: the part directories of parts the leader has taken go; what they held is
    published (hard links) or superseded. Blocking."""
    for name in taken:
        shutil.rmtree(part_dir(dst, name, node), ignore_errors=True)
        try:
            os.rmdir(part_dir(dst, name, node).parent)
        except OSError:
            pass  # another node's part, or the leader's word, is still there


def persistent_target(p: SyncPair, name: str) -> str | None:
    """The checkpoint the persistent pointer ``name`` names, or None. Blocking."""
    try:
        with open(p.dst / name, "rb") as f:
            return pointer_target(name, f.read(4096), os.listdir(p.dst))
    except OSError:
        return None


def inside_published(p: SyncPair, e: Entry) -> bool:
    """Are this node's files of ``e`` all in the published ``e.name`` (same size and mtime)?
    Blocking: a stat of the persistent side's files."""
    if not os.path.lexists(p.dst / e.name):
        return False
    return contains(snapshot(p.dst / e.name, within(e.name, p.exclude)), e.snap)


def _nodes_text(missing: list[int]) -> str:
    return ("node " if len(missing) == 1 else "nodes ") + ", ".join(str(n) for n in missing)


class PartEngine(PairEngine):
    """One per-node checkpoint pair on one node; node 0 (the leader) also assembles."""

    def __init__(self, pair: SyncPair, backend: Backend, emit: Emit, *, node: int, every: float,
                 retry_base: float, retry_cap: float, on_publish: Callable[[float | None], None],
                 parts_poll: float = 1.0, writers: Callable[[], set[int]] | None = None) -> None:
        self.node = node
        self.leader = node == 0
        self.parts_poll = parts_poll
        self.awaiting_go: set[str] = set()         # node K: directories not complete yet (the leader may say go)
        self.space = SpaceWatch()                  # this node's local disk: will the next checkpoint fit?
        self.restored: Path | None = None          # the version this node restored (``holds``)
        self.writers_seen = False                  # the training's processes were found here (writer_view)
        super().__init__(pair, backend, emit, every=every, retry_base=retry_base, retry_cap=retry_cap,
                         on_publish=on_publish, writers=writers)

    def _publisher(self, on_publish: Callable[..., None], ours: set[str] | None) -> Publisher:
        self.parts = PartPublisher(self.state, node=self.node, rescan=self.rescan, recheck=self.schedule.recheck,
                                   on_publish=on_publish, trigger=self.trigger)
        return self.parts

    @property
    def missing(self) -> dict[str, list[int]]:
        """The leader: checkpoint → the nodes whose part is not there yet."""
        return self.parts.missing

    async def offer(self) -> None:
        """Before the leader chooses what every node restores: this node's whole versions not
        yet on persistent storage (a last save the previous attempt's end did not publish) go
        up as parts, judged as finished (nothing writes before the spawn), so the newest
        complete version anywhere can be chosen, and is published first, truly. The leader's
        pass also assembles every part that is whole."""
        exited, self.exited = self.exited, True
        try:
            await self.run_pass("offer")
        finally:
            self.exited = exited

    async def choose(self) -> str | None:
        """After ``offer``, the version to restore: the newest complete one on persistent
        storage (the leader's choice for every node)."""
        await self.offer()
        return await self.restorer.choose()

    async def restore(self, want: str | None = None, *, chosen: bool = False) -> Path | None:
        """This node brings back exactly one version, the same on every node: the leader's
        choice (``want``, ``chosen``), else the newest published one (after this node's own
        offer). Every other local version is set aside first, never left where a rank would
        load it: a checkpoint never published (this node's part alone) and a different version
        of a published name (an unpublished ``snapshot.pt`` rewritten in place)."""
        if not chosen:
            want = await self.choose()
        why = "not the version every node restores: set aside"
        await to_thread(set_aside, self.pair, self.node, self.emit, why)
        await to_thread(set_aside_versions, self.pair, self.node, self.emit, why)
        self.restored = await self.restorer.run(want, keep_newer=False) if want is not None else None
        if want is None:
            self.emit("restore", pair=self.pair.name, checkpoint=None, node=self.node,
                      reason="no complete checkpoint on persistent storage")
        return self.restored

    def holds(self) -> dict[str, object] | None:
        """What this node holds of the restored version, to compare across nodes: its name,
        size, newest mtime and a hash (a file's content; a directory's listing, its shards'
        names, sizes and mtimes). Blocking."""
        if self.restored is None:
            return None
        return version_of(self.restored)

    # ---- triggers -------------------------------------------------------------------

    async def parts_watch(self) -> None:
        """Leader: a pass whenever a node's manifest appears or goes (polled: other nodes'
        writes on a network filesystem raise no inotify event here), more often while a
        checkpoint waits for parts. Node K: a pass when the leader says a checkpoint this node
        is waiting on is complete (``GO_FILE``), or has taken a part of this node's (its
        manifest gone: the pass tidies the part directory away)."""
        if not self.leader:
            told: set[str] = set()
            while True:
                await anyio.sleep(GO_POLL_S if self.awaiting_go else self.parts_poll)
                names = set(self.awaiting_go) - told
                said = {n for n in names if await to_thread(go_path(self.pair.dst, n).exists)}
                if said or await to_thread(taken, self.pair.dst, list(self.parts.parted), self.node):
                    told |= said
                    self.trigger("parts")
        last: dict[str, dict[int, float]] | None = None
        while True:
            await anyio.sleep(min(self.parts_poll, WAITING_POLL_S) if self.missing else self.parts_poll)
            try:
                now = await to_thread(waiting, self.pair.dst)
            except OSError:
                continue
            if now != last:
                last = now
                if now:
                    self.trigger("parts")

    # ---- one pass -------------------------------------------------------------------

    def scan(self, *, root: Path | None = None, only: str | None = None, settle: float | None = None,
             cheap: bool = False, pids: set[int] | None = None, finished: bool = False) -> Listing:
        if not self.leader:
            self.marker_seen = False  # rank 0's marker is never written here (local_profile)
        if not cheap and self.leader:
            return super().scan(root=root, only=only, settle=settle, pids=pids, finished=finished)
        p = self.pair
        reuse = self.reusable({**self.parts.parted, **self.state.published}) if cheap else None
        local = root is None
        ctx = self._context(local, finished, pids)
        listing = classify(root or p.src, markers=p.markers, exclude=p.exclude,
                           settle=p.settle if settle is None else settle, now=time.time(),
                           marker_seen=self.marker_seen if local else False, only=only, reuse=reuse, ctx=ctx)
        if not self.leader:
            go = {n for n, e in listing.entries.items() if not e.complete and e.is_dir and go_path(p.dst, n).exists()}
            settled_here(listing, p.settle if settle is None else settle, time.time(),
                         finished=finished or (local and self.exited), go=go)
            if local and only is None:
                self.awaiting_go = {n for n, e in listing.entries.items() if not e.complete and e.is_dir}
        if local and only is None and not cheap:
            self._inodes = {n: sig[0] for n, sig in listing.sigs.items()}
        return listing

    # ---- evidence: who writes this node's files -----------------------------------

    def _context(self, local: bool, finished: bool, pids: set[int] | None) -> Context:
        """This node's rules (``local_profile``) and what is known of the writers of its files,
        as ``PairEngine.scan`` has it: the training's processes on this node (the leader's
        child tree; node K's agent finds the job's, supervisor/jobprocs.py) and the files they
        hold open for writing, so a file its writer closed is complete at once. Node K finding
        none of them (not started here yet, or not visible) knows nothing of writers: quiet
        time decides, as before; the leader's empty tree is a training not running."""
        p = self.pair
        writing = None
        if local and pids is not None and (pids or self.leader) and not self.exited:
            writing = open_for_write(pids, os.path.realpath(p.src))
        saving = partial(stacks.inside, set(pids)) if writing is not None and pids else None
        return Context(profile=self.rules(local), writing=writing,
                       exited=finished or (local and self.exited), inodes=self._inodes if local else {},
                       torn_check=self._torn_check, saving=saving)

    def rules(self, local: bool) -> Profile | None:
        """This node's rules (``local_profile``); the persistent side holds every node's
        files, so every rank's shard is asked of it there."""
        return local_profile(super().rules(local), self.leader, local=local)

    def _pids(self) -> set[int] | None:
        pids = super()._pids()
        self.writers_seen = self.writers_seen or bool(pids)
        return pids

    def writer_view(self) -> str:
        """The leader's are its child tree; node K's are visible once its agent found the job's
        processes here."""
        return "visible" if self.writers is not None and (self.leader or self.writers_seen) else "unseen"

    async def _pass_listing(self, trigger: str) -> Listing:
        listing: Listing = await to_thread(lambda: self.scan(cheap=trigger in ("watch", "parts"), pids=self._pids()))
        self.take_listing(listing)
        p = self.pair
        full = await to_thread(self.space.check, p.src, listing)
        if full is not None:
            host = socket.gethostname()
            self.emit("local-disk-full", pair=p.name, node=self.node, host=host, **full)
            log.warning("node %d (%s): %s has %d bytes free, less than %s takes (%d): the next checkpoint will not fit",
                        self.node, host, full["path"], full["free_bytes"], full["checkpoint"], full["need_bytes"])
        return listing


class PartPublisher(Publisher):
    """Publishing for a per-node pair on one node: this node's complete checkpoints become
    parts; node 0 (the leader) also assembles and publishes them, then the pointers."""

    def __init__(self, state: PairState, *, node: int, rescan: Callable[[str], Listing],
                 recheck: Callable[[float], None], on_publish: Callable[[float | None], None],
                 trigger: Callable[[str], None]) -> None:
        super().__init__(state, rescan=rescan, recheck=recheck, on_publish=on_publish)
        self.node = node
        self.nodes = state.pair.nodes
        self.leader = node == 0
        self.trigger = trigger                     # the leader: a pass once its own part is staged
        self.parted: dict[str, Snap] = {}          # checkpoint → local snapshot whose part manifest is written
        self.missing: dict[str, list[int]] = {}    # leader: checkpoint → nodes whose part is not there
        self._told_missing: dict[str, tuple[int, ...]] = {}
        self.conflicts: dict[str, str] = {}
        self.short: dict[str, str] = {}            # leader: checkpoint → the ranks' shards no part holds
        self.behind: dict[str, bytes] = {}         # leader: pointer → its local content older than the persistent one
        self.stale: dict[str, Snap] = {}           # older here than the version published (by another node)
        self.seen: dict[str, Snap] = {}            # checkpoint → the local version last accounted for here
        self.inside: dict[str, tuple[Snap, bool]] = {}  # incomplete here → (that version, inside the published one)

    async def run(self, listing: Listing, trigger: str, stats: CopyResult, published: list[str]) -> None:
        p = self.pair
        if not self.leader:  # inside the pass: never while this node stages
            gone = await to_thread(taken, self.pair.dst, list(self.parted), self.node)
            for name in gone:  # published or superseded: this version is owed nothing more
                self.state.published[name] = self.parted.pop(name)
            await to_thread(tidy, p.dst, gone, self.node)
        todo: list[Entry] = []
        for e in complete_newest_first(listing):
            if self._accounted(e):
                continue
            if await to_thread(os.path.lexists, p.dst / e.name):
                there = await to_thread(snapshot, p.dst / e.name, within(e.name, p.exclude))
                same = await to_thread(self._same, e, there)
                if not self._new_version(e, there, same, listing):
                    continue
            todo.append(e)
        await self._look_inside_published(listing)
        self._note_pending(listing)
        for e in todo:  # newest first: the one most at risk
            if self.leader and self._go_applies(e):
                await to_thread(write_go, p.dst, e.name)
            try:
                await self._stage_part(e, trigger, stats)
            except (OSError, CopyError):
                # Never published: dropped, so that a full disk gets its space back for the retry.
                with anyio.CancelScope(shield=True):
                    await to_thread(shutil.rmtree, part_dir(p.dst, e.name, self.node), True)
                raise
            self._note_pending(listing)
        if self.leader:
            await self._assemble_ready(trigger, published, listing)
            await self._publish_pointers(listing)
        await self._end_pass(listing)

    def _accounted(self, e: Entry) -> bool:
        """This very version of ``e`` was already dealt with here: published (or found on
        persistent storage), staged as this node's part, or found older than the published one."""
        for known in (self.state.published.get(e.name), self.stale.get(e.name), self.parted.get(e.name)):
            if known is not None and known.same_content(e.snap):
                return True
        return False

    def _same(self, e: Entry, there: Snap | None) -> bool:
        """Does the published ``e.name`` hold this node's ``e``? A directory: this node's files
        among every node's; a file: that very version (``identical``). Blocking."""
        if e.is_dir:
            return contains(there, e.snap)
        return identical(self.pair.src / e.name, self.pair.dst / e.name, e.snap, there)

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
        changed_here = e.name in self.seen and not self.seen[e.name].same_content(e.snap)
        slack = SAME_SECOND_NS if e.is_dir else 0  # a file's sameness was read byte for byte
        if changed_here or (there is not None and written(e.snap) > written(there) + slack):
            return True
        if e.name not in self.stale:
            self.emit("sync-deferred", pair=self.pair.name, checkpoint=e.name, node=self.node,
                      reason="older than the version on persistent storage (published from another node or "
                             "attempt): never published over it")
        self.stale[e.name] = self.seen[e.name] = e.snap
        return False

    def _go_applies(self, e: Entry) -> bool:
        """Node 0's completeness speaks for every node only where rank 0's own marker or
        pointer says so (DCP, DeepSpeed, Megatron, HF, Accelerate); with your markers every
        node writes its own (docs/sync.md), so each node judges its part alone."""
        prof = self.state.profile
        return bool(e.is_dir and not self.pair.markers and prof is not None and prof.needs_marker
                    and (e.why.startswith(("marker ", "pointer ", "older than "))))

    async def _stage_part(self, e: Entry, trigger: str, stats: CopyResult) -> bool:
        """This node's files of ``e`` into its part directory, verified, then the manifest."""
        p = self.pair
        name = e.name
        src, pdir = p.src / name, part_dir(p.dst, name, self.node)
        old = await to_thread(read_manifest, manifest_path(p.dst, name, self.node))
        if old is not None and manifest_snap(old).same_content(e.snap) and old.get("nodes") == self.nodes:
            self.parted[name] = self.seen[name] = e.snap  # written by an earlier attempt, from these very files
            return True
        if await to_thread(withdraw, p.dst, name, self.node):
            self.emit("part-withdrawn", pair=p.name, checkpoint=name, node=self.node,
                      reason="this node's files changed after its part was written; copying it again")
        self.parted.pop(name, None)
        leftover = await to_thread(os.path.lexists, pdir)
        await to_thread(pdir.mkdir, parents=True, exist_ok=True)
        for attempt in range(RECOPY_TRIES):
            got = CopyResult()
            try:
                if e.is_dir:
                    got += await self.backend.copy_tree(src, pdir, exclude=within(e.name, p.exclude), skip=e.markers, fsync=p.fsync)
                    got.bytes += await to_thread(_fsops.copy_markers, src, pdir, e.markers, fsync=p.fsync)
                    got.files += len(e.markers)
                else:
                    got += await self.backend.copy_file(src, pdir / name, fsync=p.fsync)
            except (CopyError, FileNotFoundError):
                if await to_thread(os.path.lexists, src):
                    raise
                await to_thread(shutil.rmtree, pdir, True)  # rotated away under the copier
                return False
            stats += got
            again: Listing = await to_thread(self.rescan, name)
            now = again.entries.get(name)
            if now is None or not now.complete:
                await to_thread(shutil.rmtree, pdir, True)
                return False
            if not now.snap.same_content(e.snap):
                e = now
                continue
            if attempt or got.vanished or leftover:
                staged = await to_thread(snapshot, pdir if e.is_dir else pdir / name, within(e.name, p.exclude))
                if not matches(staged, e.snap):
                    if e.is_dir:
                        await to_thread(_fsops.prune_staging, pdir, e.snap)
                    continue
            if p.fsync:
                await to_thread(_fsops.fsync_dir, pdir)
            await to_thread(write_manifest, p.dst, name, self.node, self.nodes, e.snap, is_dir=e.is_dir,
                            markers=e.markers, why=e.why, done_at=e.done_at)
            self.parted[name] = self.seen[name] = e.snap
            if name in again.sigs:
                self.state.sigs[name] = again.sigs[name]
            lag = round(time.time() - e.done_at, 3) if e.done_at else None
            self.emit("part", pair=p.name, checkpoint=name, node=self.node, nodes=self.nodes, trigger=trigger,
                      files=len(e.snap.files), bytes=e.snap.bytes, why=e.why, lag_s=lag, durable=True)
            if self.leader:
                self.trigger("parts")
            return True
        self.emit("sync-deferred", pair=p.name, checkpoint=name, node=self.node,
                  reason=f"changed while being copied, {RECOPY_TRIES} times; trying again on the next pass")
        return False

    async def _assemble_ready(self, trigger: str, published: list[str], listing: Listing) -> None:
        """Leader: publish every checkpoint whose parts are all there (every node's manifest;
        one, for a single file), including a newer version of one published before."""
        p = self.pair
        state = await to_thread(waiting, p.dst)
        self.missing = {}
        for name in sorted(state, key=natural_key, reverse=True):
            manifests = await to_thread(self.current_parts, name, state[name])
            if not manifests:
                continue  # a part being copied, no manifest yet, or only older versions: nothing to say
            single = all(m.get("is_dir") is False for m in manifests.values())
            if single and len(manifests) > 1:
                # A single file is whole on the one node that wrote it (rank 0's torch.save);
                # two nodes' versions of one name: the newest is the checkpoint.
                newest = max(manifests, key=lambda k: written(manifest_snap(manifests[k])))
                manifests = {newest: manifests[newest]}
            missing = [] if single else [k for k in range(self.nodes) if k not in manifests]
            short = None if single or missing else await to_thread(self._short, name, manifests)
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
                self.missing[name] = missing
                if self._told_missing.get(name) != tuple(missing):
                    self._told_missing[name] = tuple(missing)
                    self.emit("parts-waiting", pair=p.name, checkpoint=name, nodes=self.nodes,
                              have=sorted(manifests), missing=missing)
                continue
            try:
                got = await to_thread(assemble, p.dst, name, manifests, fsync=p.fsync)
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
            self._told_missing.pop(name, None)
            version = assembled_snap(manifests)
            local = listing.entries.get(name)
            mine = local is not None and local.complete and contains(version, local.snap)
            self.state.published[name] = local.snap if mine and local is not None else version
            if mine and name in listing.sigs:
                self.state.sigs[name] = listing.sigs[name]
            self.parted.pop(name, None)
            self.stale.pop(name, None)
            await to_thread(release_parts, p.dst, name, manifests, GO_FILE)
            lag = round(time.time() - got.done_at, 3) if got.done_at else None
            self.emit("publish", pair=p.name, checkpoint=name, trigger=trigger, files=got.files, bytes=got.bytes,
                      why=f"all {self.nodes} parts" if not single else f"whole on node {min(manifests)}",
                      lag_s=lag, nodes=self.nodes, parts={str(k): n for k, n in got.parts.items()}, shared=got.shared,
                      linked=got.linked, **({"differing": got.differing} if got.differing else {}))
            self.on_publish(got.done_at)
            published.append(name)

    def _behind(self, ptr: Pointer) -> bool:
        """Leader: a local pointer naming an older checkpoint than the persistent one names
        (which is there) is never published over it. A host that was node K before holds the
        ``latest`` it restored then, which nothing rewrote there; as node 0 it turned the
        persistent pointer back past every checkpoint published since, and the restore called
        them torn ("newer than latest, which never named it"). Blocking."""
        p = self.pair
        if ptr.link or ptr.target is None:
            return False
        there = persistent_target(p, ptr.name)
        if there is None or natural_key(there) <= natural_key(ptr.target):
            return False
        if self.behind.get(ptr.name) != ptr.content:
            self.behind[ptr.name] = ptr.content
            self.emit("sync-deferred", pair=p.name, checkpoint=ptr.name, node=self.node,
                      reason=f"names {ptr.target}, older than the {there} it names on persistent storage: "
                             "never published over it")
        return True

    def _short(self, name: str, manifests: Mapping[int, Mapping[str, Any]]) -> str | None:
        """Leader: the ranks' shards that no node's part of ``name`` holds. DeepSpeed writes
        ``latest`` with no barrier behind the other ranks' shards, so a node's part may be
        taken before its late rank wrote one; never published without it: that node's part
        is taken again once its shard is there (its files changed). Blocking: reads the
        model states' rank count."""
        owner = {rel: node for node in sorted(manifests, reverse=True) for rel in manifest_snap(manifests[node]).files}
        return missing_shards(assembled_snap(manifests), self.state.profile,
                              lambda rel: part_source(self.pair.dst, name, owner[rel], rel))

    def _waiting(self, name: str, missing: list[int]) -> str:
        if missing:
            return f"{_nodes_text(missing)} missing"
        return self.short.get(name) or "all parts there, not yet assembled"

    def current_parts(self, name: str, have: Collection[int]) -> dict[int, dict]:
        """The manifests of ``name`` that hold a version not yet published. Blocking. Parts
        the published ``name`` already holds (or a newer one replaced) are released here:
        their manifests dropped, node 0's files too (node K's part directory is node K's: it
        may be staging a newer version there now, and reuses it)."""
        p = self.pair
        manifests = {k: m for k in sorted(have) if k < self.nodes
                     and (m := read_manifest(manifest_path(p.dst, name, k))) is not None}
        if not manifests or not os.path.lexists(p.dst / name):
            return manifests
        there = snapshot(p.dst / name, within(name, p.exclude))
        old = {k: m for k, m in manifests.items() if self._superseded(name, k, m, there)}
        if old:
            release_parts(p.dst, name, old, GO_FILE)
        return {k: m for k, m in manifests.items() if k not in old}

    def _superseded(self, name: str, node: int, m: dict, there: Snap | None) -> bool:
        """Is node ``node``'s part of ``name`` the published version already, or older? A single
        file is compared byte for byte with the published one when the two look alike
        (``identical``); a directory's part by ``contains``. Blocking."""
        mine = manifest_snap(m)
        if there is None:
            return False
        if m.get("is_dir") is False:
            src = part_source(self.pair.dst, name, node, "")
            return written(mine) < written(there) or identical(src, self.pair.dst / name, mine, there)
        return contains(there, mine) or written(mine) <= written(there)

    async def _look_inside_published(self, listing: Listing) -> None:
        """A directory incomplete by itself here may be this node's part of a checkpoint that
        is published whole: HF's ``checkpoint-N/`` holding only the ``rng_state_R.pth`` of this
        node's ranks, left from an attempt where this node was not global rank 0's, and read
        by a leader now. Looked up once per local version, so the end does not call it torn."""
        for e in listing.entries.values():
            known = self.inside.get(e.name)
            if not (e.complete or not e.is_dir or (known is not None and known[0].same_content(e.snap))):
                self.inside[e.name] = (e.snap, await to_thread(inside_published, self.pair, e))

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
            elif e.name in self.stale:
                out.append(f"{name_}: {e.name} (changed on node {self.node} after it was published; not published again)")
            elif done is not None and done.same_content(e.snap):
                continue
            elif e.name in self.conflicts:
                out.append(f"{name_}: {e.name} (parts conflict: {self.conflicts[e.name]})")
            elif staged is not None and staged.same_content(e.snap):
                if self.leader:
                    out.append(f"{name_}: {e.name} (waiting for parts: {self._waiting(e.name, self.missing.get(e.name) or [])})")
                # a node's own part is durable: nothing owed here
            else:
                out.append(f"{name_}: {e.name} (complete, not yet on persistent storage)")
        if self.leader:
            for name, missing in sorted(self.missing.items(), key=lambda kv: natural_key(kv[0])):
                if name not in local:
                    out.append(f"{name_}: {name} (waiting for parts: {self._waiting(name, missing)})")
            for ptr in listing.pointers.values():
                if self.pointers_done.get(ptr.name) != ptr.content:
                    out.append(f"{name_}: {ptr.name} (pointer to {ptr.target or 'a missing checkpoint'})")
        self.state.pending = out

    def _holds(self, there: Snap | None, local: Snap) -> bool:
        """The published checkpoint holds every node's files: this node's must be among them."""
        return contains(there, local)

    def _retention_fields(self) -> dict[str, object]:
        return {"node": self.node}
