"""Restore for one checkpoint pair: before the spawn, the newest complete checkpoint from
persistent storage back to local disk, so a requeued attempt resumes from fast local disk.

Pointers and links that name it come back with it; a profile pointer that names a torn
checkpoint is rewritten to name the one restored (``repointed``). A newer complete local
checkpoint is kept and published, never overwritten.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from functools import partial
from typing import Any, Callable, Collection, Mapping, Sequence

from supervisor.sync import _content, _fsops
from supervisor.sync._backend import CopyError, CopyResult
from supervisor.sync._fill import ChoiceUnverified, Fetch, Mismatch, Unverified, copy_verified, fill, local_candidates
from supervisor.sync._manifest import entry_of
from supervisor.sync._complete import STAGING_PREFIX, Entry, Listing, identical, matches, newest_complete, snapshot
from supervisor.sync._exclude import within
from supervisor.sync._profiles import Profile
from supervisor.sync._state import PairState, to_thread


class Restorer:
    """Restores one checkpoint pair. ``judge(root)`` lists a side as finished (nothing writes
    it before the spawn; blocking: run in a thread); ``adopt_profile(listing, where)`` lets
    the engine take the profile a listing shows."""

    def __init__(self, state: PairState, *, judge: Callable[[Path], Listing],
                 adopt_profile: Callable[[Listing, str], None]) -> None:
        self.state = state
        self.pair, self.emit, self.backend = state.pair, state.emit, state.backend
        self.judge = judge
        self.adopt_profile = adopt_profile
        self.chosen: Entry | None = None  # what ``choose`` found newest on persistent storage
        self.slow = False                 # ``choose`` waited in vain for the persistent side's listing

    async def choose(self, without: Collection[str] = ()) -> str | None:
        """The checkpoint a restore now would bring back: the newest complete one on
        persistent storage (a multi-node leader's choice for every node), but for those
        named in ``without`` (versions that verified nowhere a node could reach)."""
        listing: Listing = await to_thread(self.judge, self.pair.dst)
        self.adopt_profile(listing, "persistent")
        self.chosen = best = newest(leaving_out(listing, without), self.state.profile)
        return best.name if best is not None else None

    async def run(self, want: str | None = None, *, keep_newer: bool = True, doc: Mapping[str, Any] | None = None,
                  peers: Sequence[tuple[str, Fetch]] = ()) -> Path | None:
        """Newest complete checkpoint persistent → local, unless local has it or a newer one.

        Both sides are judged as finished (nothing writes them before the spawn): a checkpoint
        its profile calls torn is never chosen, nor a file that is not one of the profile's
        checkpoints, nor a link out of the pair. A newer complete local checkpoint (a requeue
        onto the same node keeps node-local disk) is kept and published, never overwritten
        (``keep_newer``; a per-node pair instead restores the leader's choice, ``want``, on
        every node). ``doc``: the choice is a version only the nodes hold (``_peers``), its
        files fetched from ``peers`` (other nodes, tried before persistent storage).
        """
        p = self.pair
        t0 = time.monotonic()
        listing: Listing = await to_thread(self.judge, p.dst)
        self.adopt_profile(listing, "persistent")
        local: Listing = await to_thread(self.judge, p.src)
        best, mine = newest(listing, self.state.profile), newest(local, self.state.profile)
        if doc is not None:
            best = entry_of(doc)
        elif want is not None:
            best = listing.entries.get(want) if want in listing.entries and listing.entries[want].complete else None
        if not keep_newer:
            mine = None
        skipped = {"torn": sorted(n for n, e in listing.entries.items() if e.torn)} if any(
            e.torn for e in listing.entries.values()) else {}
        if listing.outside:
            skipped["links_out"] = sorted(listing.outside)
        if mine is not None and (best is None or is_newer(mine, best)):
            why = (f"the local {mine.name} is newer than the persistent {best.name}" if best is not None
                   else f"nothing on persistent storage; the local {mine.name} is complete")
            repointed = await to_thread(self._repoint, local, mine)
            self.emit("restore", pair=p.name, checkpoint=None, kept=mine.name, reason=f"{why}: kept, and published first",
                      **skipped, **repointed)
            return p.src / mine.name
        if best is None:
            self.emit("restore", pair=p.name, checkpoint=None, reason="no complete checkpoint on persistent storage",
                      **skipped)
            return None
        # The newest first; one whose bytes do not verify against its content manifest is
        # skipped for the next newest, never restored mixed. The leader's choice for every
        # node (``want``) is that version or nothing.
        order = [best] if want is not None else [best] + sorted(
            (e for e in listing.entries.values() if e.complete and e.restorable and e.name != best.name),
            key=lambda e: e.order, reverse=True)
        failed: list[str] = []
        for best in order:
            try:
                return await self._bring_back(best, listing, local, keep_newer, t0, {**skipped, **(
                    {"unverified": failed} if failed else {})}, doc=doc, peers=peers)
            except Unverified as u:
                self.emit("restore-verify", pair=p.name, checkpoint=best.name, result="failed", failed=u.failed,
                          reason="no copy of it verifies against its manifest: the next newest is tried"
                          if want is None else "no copy of the version every node restores verifies here")
                if want is not None:
                    raise ChoiceUnverified(best.name, str(u)) from u
                failed.append(best.name)
        self.emit("restore", pair=p.name, checkpoint=None, unverified=failed, **skipped,
                  reason="no checkpoint on persistent storage verifies against its manifest")
        return None

    async def _bring_back(self, best: Entry, listing: Listing, local: Listing, keep_newer: bool, t0: float,
                          skipped: dict[str, Any], *, doc: Mapping[str, Any] | None = None,
                          peers: Sequence[tuple[str, Fetch]] = ()) -> Path:
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
        links = await to_thread(self._restore_pointers, listing, local, best)
        repointed = await to_thread(self._repoint, listing, best)
        self.emit("restore", pair=p.name, checkpoint=best.name, source=p.dst / best.name if same else "nodes", to=dest,
                  files=stats.files, bytes=stats.bytes, seconds=round(time.monotonic() - t0, 3),
                  copied=bool(stats.files), why=best.why, step=best.step, pointers=links, **skipped, **repointed)
        return dest

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

    def _repoint(self, listing: Listing, best: Entry) -> dict[str, Any]:
        """The profile's pointer (DeepSpeed ``latest``, Megatron's tracker) names a checkpoint
        that is not whole (torn: a late rank's shard missing) while ``best``, an older whole
        one, is restored: the local pointer is rewritten to name ``best``, or the training's
        own loader would follow it to the torn one and crash at every requeue."""
        prof = self.state.profile
        if prof is None or not prof.pointer or not best.restorable:
            return {}
        ptr = listing.pointers.get(prof.pointer)
        if ptr is None or ptr.link or ptr.target == best.name:
            return {}
        was = ptr.content.decode("utf-8", errors="replace").strip()
        _fsops.write_atomic(self.pair.src / prof.pointer, prof.pointer_text(best.name), time.time_ns(), fsync=False,
                            mode=ptr.mode)
        return {"repointed": {"pointer": prof.pointer, "was": was, "now": best.name}}

    def _restore_pointers(self, listing: Listing, local: Listing, best: Entry) -> list[str]:
        """Pointers and links that name ``best`` come back with it. With Lightning, a
        ``last.ckpt`` that is not the newest checkpoint comes back as the newest, so
        ``ckpt_path="last"`` resumes there: a copy of it (``save_last=True`` rewrites
        ``last.ckpt`` in place, and would write through a link into the restored file), or a
        link where the persistent ``last.ckpt`` is one (``save_last="link"``, which replaces
        its link before it writes)."""
        p = self.pair
        done = []
        for ptr in listing.pointers.values():
            if ptr.target != best.name:
                continue
            if ptr.link:
                _fsops.write_link(p.src / ptr.name, best.name)
            else:
                _fsops.write_atomic(p.src / ptr.name, ptr.content, ptr.mtime_ns, fsync=False, mode=ptr.mode)
            done.append(ptr.name)
        prof = self.state.profile
        if prof is not None and prof.links and not any(fnmatch.fnmatchcase(best.name, g) for g in prof.links):
            # a persistent last.ckpt that is a link (to an older file) is one of them too: without
            # it, ckpt_path="last" finds nothing on a new node and training starts over (D5)
            stale = [n for n in (*listing.entries, *listing.pointers) if n != best.name and n not in done
                     and any(fnmatch.fnmatchcase(n, g) for g in prof.links)]
            for name in stale:
                if name not in local.entries and name not in local.pointers and not (p.src / name).is_symlink():
                    if listing.pointers.get(name) is not None and listing.pointers[name].link:
                        _fsops.write_link(p.src / name, best.name)  # save_last="link": Lightning replaces links
                    else:
                        # save_last=True writes last.ckpt in place: a link would be written
                        # through into the restored checkpoint (issue 29, D4), so a copy.
                        _copy_local(p.src / best.name, p.src / name)
                    done.append(name)
        return done



def same_files(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Do two manifests name the same files with the same sha256?"""
    fa, fb = a["files"], b["files"]
    return fa.keys() == fb.keys() and all(fa[r]["sha256"] == fb[r]["sha256"] for r in fa)


def _copy_local(src: Path, dst: Path) -> None:
    """A regular file of its own at ``dst`` (temp + rename), mtime kept: ``last.ckpt``."""
    tmp = dst.with_name(f"{STAGING_PREFIX}{dst.name}")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def leaving_out(listing: Listing, names: Collection[str]) -> Listing:
    """``listing`` without the entries ``names`` names (the leader's choice again, after a
    version verified nowhere: ``choose``)."""
    if not names:
        return listing
    return replace(listing, entries={n: e for n, e in listing.entries.items() if n not in names})


def newest(listing: Listing, profile: Profile | None) -> Entry | None:
    """``newest_complete``; with Lightning, a complete ``last.ckpt`` written after the newest
    ``step=N`` file is the newest (Lightning saves it after the top-k ones)."""
    best = newest_complete(listing)
    if best is None or profile is None or not profile.links:
        return best
    lasts = [e for n, e in listing.entries.items() if e.complete and any(fnmatch.fnmatchcase(n, g) for g in profile.links)]
    written = lambda e: max(m for _, m in e.snap.files.values())  # noqa: E731 - mtimes: a copy's ctime is its copying
    later = [e for e in lasts if written(e) > written(best)]
    return max(later, key=written) if later else best


def is_newer(a: Entry, b: Entry) -> bool:
    """Is local checkpoint ``a`` newer than persistent ``b``? The same name: a different,
    later-written version; otherwise the later step (or name)."""
    if a.name == b.name:
        return not matches(b.snap, a.snap) and a.snap.newest_ns > b.snap.newest_ns + 1_000_000_000
    return a.order[:3] > b.order[:3]

