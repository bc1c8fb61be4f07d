"""The persistent side as a directory (``to = "/path"``): ``Directory``, the ``_side.Storage``
a pair's jobs are given, and its answers for a filesystem (``Side``, ``PartSide``,
``GatherSide``, ``RestoreSide``; a log pair's pass is ``_logs.LogPass``).

A checkpoint is copied through a staging name (``.supervise-staging-<name>``), checked that
nothing changed while copying, its content manifest written (``_content``), then renamed into
place; pointers are written atomically, links as links (docs/design.md, invariant 1). A
node's part goes under ``.supervise-parts/<name>/node-K/``, verified, then its part manifest,
written last (``_parts.py``); node 0's word is a go file, and the leader assembles every
node's part into a staging directory by hard links and renames it into place. A restore
fills a version from the nearest copy that verifies against its content manifest (``_fill``).
"""
from __future__ import annotations

import os
import shutil
from functools import partial
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

from supervisor.config import SyncPair
from supervisor.sync import _content, _fsops, _stall
from supervisor.sync._backend import CopyError, CopyResult
from supervisor.sync._complete import (STAGING_PREFIX, Entry, Listing, Pointer, Snap, identical, matches, missing_shards, natural_key,
                                       pointer_target, snapshot)
from supervisor.sync._exclude import within
from supervisor.sync._fill import Fetch, Mismatch, copy_verified, fill, local_candidates
from supervisor.sync._logs import LogPass
from supervisor.sync._parts import (PARTS_DIR, Ident, assemble, assembled_snap, go_path, manifest_path, manifest_snap, part_dir, part_source,
                                    parts_root, read_manifest, release_parts, taken, tidy, waiting, withdraw, write_go, write_manifest)
from supervisor.sync._side import RECOPY_TRIES, Brought, Landed, Ledger, Whole, same_files
from supervisor.sync._state import PairState, to_thread
from supervisor.sync._versions import contains, written


def inside_published(p: SyncPair, e: Entry) -> bool:
    """Are this node's files of ``e`` all in the published ``e.name`` (same size and mtime)?
    Blocking: a stat of the persistent side's files."""
    if not os.path.lexists(p.dst / e.name):
        return False
    return contains(snapshot(p.dst / e.name, within(e.name, p.exclude)), e.snap)


class DirSide:
    """Whole checkpoints into a directory. ``rescan(name)`` lists that one local entry again
    (blocking), to tell a copy of a checkpoint that changed meanwhile."""

    def __init__(self, state: PairState, *, rescan: Callable[[str], Listing]) -> None:
        self.state = state
        self.pair, self.emit, self.backend = state.pair, state.emit, state.backend
        self.rescan = rescan

    async def there(self, name: str) -> Snap | None:
        return await to_thread(snapshot, self.pair.dst / name, within(name, self.pair.exclude))

    async def drop(self, name: str) -> None:
        await to_thread(_fsops.remove_ours, self.pair.dst / f"{STAGING_PREFIX}{name}")

    async def pointer_there(self, name: str) -> bool:
        return await to_thread(os.path.lexists, self.pair.dst / name)

    async def write_pointer(self, ptr: Pointer, target: str) -> bool:
        p = self.pair
        if ptr.link:
            return await to_thread(_fsops.write_link, p.dst / ptr.name, target)
        return await to_thread(_fsops.write_atomic, p.dst / ptr.name, ptr.content, ptr.mtime_ns, fsync=p.fsync,
                               mode=ptr.mode)

    async def land(self, e: Entry, stats: CopyResult) -> Landed | None:
        """Stage, verify, rename."""
        p = self.pair
        src, final = p.src / e.name, p.dst / e.name
        staging = p.dst / f"{STAGING_PREFIX}{e.name}"
        # Staging left by a killed run is resumed (rsync skips what is already whole) but then
        # always verified: it may hold files the source no longer has.
        with _stall.op(f"claim {staging}"):
            leftover = await to_thread(_fsops.claim_staging, staging, is_dir=e.is_dir)
        for attempt in range(RECOPY_TRIES):
            got = CopyResult()
            try:
                if e.is_dir:
                    # the snapshot's files, not a second walk; shared among the copy streams
                    got += await self.backend.copy_tree(src, staging, exclude=within(e.name, p.exclude), skip=e.markers, fsync=p.fsync,
                                                        fresh=not leftover, files=e.snap.files, hash=True)
                    got.bytes += await to_thread(_fsops.copy_markers, src, staging, e.markers, fsync=p.fsync)
                    got.files += len(e.markers)
                else:
                    got += await self.backend.copy_file(src, staging, fsync=p.fsync, hash=True)
            except (CopyError, FileNotFoundError):
                if await to_thread(os.path.lexists, src):
                    raise
                # the whole checkpoint was rotated away under the copier: not a failure
                await to_thread(_fsops.remove_ours, staging)
                return None
            stats += got
            hashes, again, now = await _hashed_then_listed(src, e, got, self.rescan)
            if now is None or not now.complete or hashes is None:  # rotated away, or not what we thought: not a failure
                await to_thread(_fsops.remove_ours, staging)
                return None
            if now.snap.files != e.snap.files:  # changed while copied: copy again before it counts (no copies of 100 000-entry dicts)
                e = now
                continue
            # A clean first copy of an unchanged source is whole (the copier exits non-zero
            # otherwise); a retry into a used staging area, or files that vanished, get checked.
            if attempt or got.vanished or leftover:
                staged = await to_thread(snapshot, staging, within(e.name, p.exclude))
                if not matches(staged, e.snap):
                    await to_thread(_fsops.prune_staging, staging, e.snap)
                    continue
            # the content manifest before the rename: every version published has one (``_content``)
            doc = _content.doc_for(e, e.snap, hashes, profile=self.state.profile)
            with _stall.op(f"write the manifest of {final}"):
                await to_thread(_content.write, p.dst, doc, fsync=p.fsync)
            with _stall.op(f"rename {staging} to {final}"):
                await to_thread(_fsops.swap_in, staging, final, is_dir=e.is_dir, fsync=p.fsync)
            return Landed(e, again, {})
        self.emit("sync-deferred", pair=p.name, checkpoint=e.name,
                  reason=f"changed while being copied, {RECOPY_TRIES} times; trying again on the next pass")
        return None


async def _hashed_then_listed(src: Path, e: Entry, got: CopyResult, rescan: Callable[[str], Listing],
                              ) -> tuple[dict[str, str] | None, Listing, Entry | None]:
    """After a copy of ``e`` from ``src``: each file's sha256 (the copier's, else read now; None
    when a file is gone), then ``e.name`` listed again. Hashed before the rescan, so a file
    changed meanwhile is caught by it."""
    try:
        hashes = await to_thread(_content.hash_files, src, e.snap, got.hashes)
    except FileNotFoundError:
        hashes = None
    again: Listing = await to_thread(rescan, e.name)
    return hashes, again, again.entries.get(e.name)


class DirParts:
    """This node's parts of a per-node pair in the shared directory (``_parts.py``)."""

    def __init__(self, state: PairState, *, node: int, rescan: Callable[[str], Listing]) -> None:
        self.state = state
        self.pair, self.emit, self.backend = state.pair, state.emit, state.backend
        self.node = node
        self.nodes = state.pair.nodes
        self.rescan = rescan

    async def published_as(self, e: Entry) -> tuple[Snap | None, bool] | None:
        p = self.pair
        if not await to_thread(os.path.lexists, p.dst / e.name):
            return None
        there = await to_thread(snapshot, p.dst / e.name, within(e.name, p.exclude))
        return there, await to_thread(self._same, e, there)

    def _same(self, e: Entry, there: Snap | None) -> bool:
        """Does the published ``e.name`` hold this node's ``e``? A directory: this node's files
        among every node's; a file: that very version (``identical``). Blocking."""
        if e.is_dir:
            return contains(there, e.snap)
        return identical(self.pair.src / e.name, self.pair.dst / e.name, e.snap, there)

    async def inside_published(self, e: Entry) -> bool:
        return await to_thread(inside_published, self.pair, e)

    async def drop_part(self, name: str) -> None:
        await to_thread(shutil.rmtree, part_dir(self.pair.dst, name, self.node), True)

    async def part_there(self, e: Entry) -> bool:
        p, name = self.pair, e.name
        old = await to_thread(read_manifest, manifest_path(p.dst, name, self.node))
        if old is not None and manifest_snap(old).same_content(e.snap) and old.get("nodes") == self.nodes:
            return True
        if await to_thread(withdraw, p.dst, name, self.node):
            self.emit("part-withdrawn", pair=p.name, checkpoint=name, node=self.node,
                      reason="this node's files changed after its part was written; copying it again")
        return False

    async def stage_part(self, e: Entry, stats: CopyResult) -> Landed | None:
        """This node's files of ``e`` into its part directory, verified, then the manifest."""
        p = self.pair
        name = e.name
        src, pdir = p.src / name, part_dir(p.dst, name, self.node)
        leftover = await to_thread(os.path.lexists, pdir)
        await to_thread(pdir.mkdir, parents=True, exist_ok=True)
        for attempt in range(RECOPY_TRIES):
            got = CopyResult()
            try:
                if e.is_dir:
                    got += await self.backend.copy_tree(src, pdir, exclude=within(e.name, p.exclude), skip=e.markers, fsync=p.fsync,
                                                        hash=True)
                    got.bytes += await to_thread(_fsops.copy_markers, src, pdir, e.markers, fsync=p.fsync)
                    got.files += len(e.markers)
                else:
                    got += await self.backend.copy_file(src, pdir / name, fsync=p.fsync, hash=True)
            except (CopyError, FileNotFoundError):
                if await to_thread(os.path.lexists, src):
                    raise
                await to_thread(shutil.rmtree, pdir, True)  # rotated away under the copier
                return None
            stats += got
            hashes, again, now = await _hashed_then_listed(src, e, got, self.rescan)
            if now is None or not now.complete or hashes is None:
                await to_thread(shutil.rmtree, pdir, True)
                return None
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
                            markers=e.markers, why=e.why, done_at=e.done_at, hashes=hashes)
            return Landed(e, again, {})
        self.emit("sync-deferred", pair=p.name, checkpoint=name, node=self.node,
                  reason=f"changed while being copied, {RECOPY_TRIES} times; trying again on the next pass")
        return None


class DirRestore:
    """A restore from a directory (``_side.RestoreSide``): its listing is a scan judged as
    finished (``judge``, blocking); a version comes back from the nearest copy that verifies
    against its content manifest (``_content``), or, published before manifests, copied
    whole through a local staging name, sizes and mtimes trusted."""

    unverified_as = "unverified"
    none_verified = "no checkpoint on persistent storage verifies against its manifest"
    repoints_kept = True

    def __init__(self, state: PairState, *, judge: Callable[[Path], Listing]) -> None:
        self.state = state
        self.pair, self.emit, self.backend = state.pair, state.emit, state.backend
        self.judge = judge

    async def listing(self, doc: Mapping[str, Any] | None, slow: bool) -> tuple[Listing, dict[str, Any]]:
        return await to_thread(self.judge, self.pair.dst), {}

    def failed_reason(self, chosen: bool) -> str:
        return ("no copy of the version every node restores verifies here" if chosen
                else "no copy of it verifies against its manifest: the next newest is tried")

    async def bring(self, best: Entry, docs: Mapping[str, Any], listing: Listing, local: Listing, *,
                    keep_newer: bool, doc: Mapping[str, Any] | None,
                    peers: Sequence[tuple[str, Fetch]]) -> Brought:
        """``best`` onto local disk: from the nearest copy that verifies against its content
        manifest (``_fill``), else, for a version published before manifests, as before.
        ``doc``: a version only the nodes hold; persistent storage serves it only where its
        published copy of that name has the very same bytes."""
        p = self.pair
        dest = p.src / best.name
        there = listing.entries.get(best.name)
        published = await to_thread(_content.read, p.dst, best.name)
        published = published if there is not None and _content.describes(published, there.snap) else None
        same = published is not None and (doc is None or same_files(published, doc))
        doc = doc if doc is not None else published
        if doc is not None:
            mode = (await to_thread(os.stat, p.dst / best.name)).st_mode if same else 0o755
            filled = await fill(doc, dest, candidates=local_candidates(p.src, best.name), peers=peers,
                                fetch=partial(self._fetch, best.name) if same else None, mode=mode,
                                exclude=tuple(within(best.name, p.exclude)))
            self.emit("restore-verify", pair=p.name, checkpoint=best.name, result="verified", **filled.fields())
            stats = CopyResult(files=sum(n for s, n in filled.files.items() if s == "persistent"),
                               bytes=filled.came.get("persistent", 0))
        else:
            self.emit("restore-verify", pair=p.name, checkpoint=best.name, result="unverified",
                      reason="no content manifest describes the persistent copy (published before issue 43, "
                             "or renamed over since): sizes and mtimes trusted")
            stats = await self._copy_back(best, dest, keep_newer)
        return Brought(dest, stats, p.dst / best.name if same else "nodes", bool(stats.files))

    async def _fetch(self, name: str, rel: str, f: Mapping[str, Any], target: Path) -> int:
        """One file of ``name`` from the persistent directory, hashed as it is read."""
        src = self.pair.dst / name
        try:
            return await to_thread(partial(copy_verified, src / rel if rel else src, target, size=int(f["size"]),
                                           sha256=str(f["sha256"])))
        except FileNotFoundError as e:
            raise Mismatch("gone from persistent storage") from e

    async def _copy_back(self, best: Entry, dest: Path, keep_newer: bool) -> CopyResult:
        """A version without a content manifest: copied whole unless the local copy looks the
        same (sizes and mtimes; byte for byte on a per-node pair, where it must be that very version)."""
        p = self.pair
        have = await to_thread(snapshot, dest, within(best.name, p.exclude))
        stats = CopyResult()
        same = matches(have, best.snap) if keep_newer else await to_thread(identical, dest, p.dst / best.name, have, best.snap)
        if same:
            return stats
        await to_thread(p.src.mkdir, parents=True, exist_ok=True)
        staging = p.src / f"{STAGING_PREFIX}{best.name}"
        await to_thread(_fsops.remove_ours, staging)
        exclude = within(best.name, p.exclude)
        if best.is_dir:
            stats += await self.backend.copy_tree(p.dst / best.name, staging, exclude=exclude, skip=best.markers)
            stats.bytes += await to_thread(_fsops.copy_markers, p.dst / best.name, staging, best.markers, fsync=False)
            stats.files += len(best.markers)
        else:
            stats += await self.backend.copy_file(p.dst / best.name, staging)
        staged = await to_thread(snapshot, staging, exclude)
        if not matches(staged, best.snap):
            await to_thread(_fsops.remove_ours, staging)
            raise CopyError(f"restored copy of {best.name} does not match the persistent one")
        await to_thread(_fsops.swap_in, staging, dest, is_dir=best.is_dir, fsync=False)
        return stats


class DirGather:
    """A per-node pair's gathering in the shared directory (``_side.GatherSide``): node 0's
    word is a go file, each part a directory and its manifest (``_parts.py``), the checkpoint
    assembled by hard links into a staging directory and renamed into place."""

    def __init__(self, state: PairState, *, node: int) -> None:
        self.state = state
        self.pair = state.pair
        self.node = node
        self.nodes = state.pair.nodes
        self.told: set[str] = set()  # node K: the checkpoints whose go file it has seen
        # the leader: each manifest as last read, by its file's Ident (``waiting``), so a pass
        # while parts arrive reads only the new ones, not every node's again (issue 44)
        self._read: dict[tuple[str, int], tuple[Ident, dict[str, Any]]] = {}

    # ---- the leader's -----------------------------------------------------------------

    async def write_go(self, name: str) -> bool:
        await to_thread(write_go, self.pair.dst, name)
        return True

    def persistent_target(self, name: str) -> str | None:
        p = self.pair
        try:
            with open(p.dst / name, "rb") as f:
                return pointer_target(name, f.read(4096), os.listdir(p.dst))
        except OSError:
            return None

    async def parts_waiting(self) -> list[tuple[str, Any]]:
        state = await to_thread(waiting, self.pair.dst)
        for key in [key for key in self._read if key[1] not in state.get(key[0], ())]:
            del self._read[key]  # a manifest gone (released, withdrawn): its node's next one is read
        return [(name, state[name]) for name in sorted(state, key=natural_key, reverse=True)]

    async def current(self, name: str, have: Any) -> dict[int, dict[str, Any]]:
        return await to_thread(self.current_parts, name, have)

    def snap_of(self, manifest: Mapping[str, Any]) -> Snap:
        return manifest_snap(manifest)

    async def short(self, name: str, manifests: Mapping[int, Mapping[str, Any]]) -> str | None:
        return await to_thread(self._short, name, manifests)

    async def assemble(self, name: str, manifests: Mapping[int, Mapping[str, Any]], single: bool) -> Whole | None:
        got = await to_thread(assemble, self.pair.dst, name, manifests, fsync=self.pair.fsync)
        return Whole(assembled_snap(manifests), got.files, got.bytes, got.done_at,
                     {"parts": {str(k): n for k, n in got.parts.items()}, "shared": got.shared, "linked": got.linked,
                      **({"differing": got.differing} if got.differing else {})})

    async def release(self, name: str, manifests: Mapping[int, Mapping[str, Any]]) -> None:
        await to_thread(release_parts, self.pair.dst, name, manifests, self._idents(name, manifests))
        self._forget(name)

    def _idents(self, name: str, manifests: Mapping[int, Mapping[str, Any]]) -> dict[int, Ident]:
        """The file each of ``manifests`` was read from, where it is the one we cached."""
        out = {}
        for k, m in manifests.items():
            got = self._read.get((name, k))
            if got is not None and got[1] is m:
                out[k] = got[0]
        return out

    def _forget(self, name: str) -> None:
        for key in [key for key in self._read if key[0] == name]:
            del self._read[key]

    def _manifest(self, name: str, node: int, ident: Ident | None) -> dict[str, Any] | None:
        """Node ``node``'s manifest of ``name``: read again only when its file changed."""
        got = self._read.get((name, node))
        if ident is not None and got is not None and got[0] == ident:
            return got[1]
        body = read_manifest(manifest_path(self.pair.dst, name, node))
        if body is None or ident is None:
            self._read.pop((name, node), None)
        else:
            self._read[(name, node)] = (ident, body)
        return body

    async def parts_now(self) -> tuple[Any, bool]:
        now = await to_thread(waiting, self.pair.dst)
        return now, bool(now)

    def leftovers(self) -> list[Path]:
        """Parts are never leftovers: other nodes may be writing them now, and a complete one
        still counts after a requeue. An assembly staging whose parts are still there is kept
        (it may hold files renamed out of them); the parts that checkpoints already published
        hold are released."""
        p = self.pair
        parts = waiting(p.dst)
        for name in list(parts):
            # a newer version than the published one (the last attempt's last save, its
            # leader gone before assembling it) still counts; the rest is released
            if (p.dst / name).exists() and not self.current_parts(name, parts[name]):
                del parts[name]
        keep = {f"{STAGING_PREFIX}{n}" for n in parts} | {PARTS_DIR}
        return [s for s in _fsops.stale_staging(p.dst) if s.name not in keep]

    def _short(self, name: str, manifests: Mapping[int, Mapping[str, Any]]) -> str | None:
        """The ranks' shards that no node's part of ``name`` holds. DeepSpeed writes
        ``latest`` with no barrier behind the other ranks' shards, so a node's part may be
        taken before its late rank wrote one; never published without it: that node's part
        is taken again once its shard is there (its files changed). Blocking: reads the
        model states' rank count."""
        owner = {rel: node for node in sorted(manifests, reverse=True) for rel in manifest_snap(manifests[node]).files}
        return missing_shards(assembled_snap(manifests), self.state.profile,
                              lambda rel: part_source(self.pair.dst, name, owner[rel], rel))

    def current_parts(self, name: str, have: Mapping[int, Ident] | Collection[int]) -> dict[int, dict]:
        """The manifests of ``name`` that hold a version not yet published. Blocking. Parts
        the published ``name`` already holds (or a newer one replaced) are released here:
        their manifests dropped, node 0's files too (node K's part directory is node K's: it
        may be staging a newer version there now, and reuses it)."""
        p = self.pair
        idents = have if isinstance(have, Mapping) else {}
        manifests = {k: m for k in sorted(have) if k < self.nodes
                     and (m := self._manifest(name, k, idents.get(k))) is not None}
        if not manifests or not os.path.lexists(p.dst / name):
            return manifests
        there = snapshot(p.dst / name, within(name, p.exclude))
        old = {k: m for k, m in manifests.items() if self._superseded(name, k, m, there)}
        if old:
            release_parts(p.dst, name, old, self._idents(name, old))
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

    # ---- node K's ---------------------------------------------------------------------

    def said_go(self, name: str) -> bool:
        return go_path(self.pair.dst, name).exists()

    async def look(self, awaiting: set[str], parted: list[str]) -> bool:
        said = {n for n in awaiting - self.told if await to_thread(go_path(self.pair.dst, n).exists)}
        if said or await to_thread(taken, self.pair.dst, parted, self.node):
            self.told |= said
            return True
        return False

    async def taken(self, parted: list[str]) -> list[str]:
        return await to_thread(taken, self.pair.dst, parted, self.node)

    async def tidy(self, gone: list[str]) -> None:
        await to_thread(tidy, self.pair.dst, gone, self.node)


class Directory:
    """A directory as one pair's persistent storage (``_side.Storage``). ``rescan(name)``
    lists one local entry again, ``judge(root)`` a side as finished (both blocking)."""

    def __init__(self, state: PairState, *, rescan: Callable[[str], Listing], judge: Callable[[Path], Listing]) -> None:
        self.state = state
        self.rescan = rescan
        self.judge = judge

    def whole(self, ledger: Ledger) -> DirSide:
        return DirSide(self.state, rescan=self.rescan)

    def per_node(self, ledger: Ledger, node: int) -> tuple[DirSide, DirParts, DirGather]:
        return (DirSide(self.state, rescan=self.rescan), DirParts(self.state, node=node, rescan=self.rescan),
                DirGather(self.state, node=node))

    def restore(self) -> DirRestore:
        return DirRestore(self.state, judge=self.judge)

    def logs(self, recheck: Callable[[float], None]) -> LogPass:
        return LogPass(self.state, recheck=recheck)

    async def prepare(self) -> None:
        dst = self.state.pair.dst
        with _stall.op(f"mkdir {dst}"):
            await to_thread(dst.mkdir, parents=True, exist_ok=True)

    def probe(self) -> str | None:
        return None  # a directory's sides are checked by the plan (``_checks.py``)

    @property
    def backend(self) -> str:
        return self.state.backend.name

    def leftovers(self) -> list[Path]:
        """Staging leftovers; never ``.supervise-parts`` (a per-node pair's, which its nodes still count)."""
        dst = self.state.pair.dst
        return [s for s in _fsops.stale_staging(dst) if s != parts_root(dst)]

    def content_manifest(self, name: str) -> Mapping[str, Any] | None:
        return _content.read(self.state.pair.dst, name)
