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
from pathlib import Path
from typing import Any, Callable

from supervisor.sync import _fsops
from supervisor.sync._backend import CopyError, CopyResult
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

    async def choose(self) -> str | None:
        """The checkpoint a restore now would bring back: the newest complete one on
        persistent storage (a multi-node leader's choice for every node)."""
        listing: Listing = await to_thread(self.judge, self.pair.dst)
        self.adopt_profile(listing, "persistent")
        best = newest(listing, self.state.profile)
        return best.name if best is not None else None

    async def run(self, want: str | None = None, *, keep_newer: bool = True) -> Path | None:
        """Newest complete checkpoint persistent → local, unless local has it or a newer one.

        Both sides are judged as finished (nothing writes them before the spawn): a checkpoint
        its profile calls torn is never chosen, nor a file that is not one of the profile's
        checkpoints, nor a link out of the pair. A newer complete local checkpoint (a requeue
        onto the same node keeps node-local disk) is kept and published, never overwritten
        (``keep_newer``; a per-node pair instead restores the leader's choice, ``want``, on
        every node).
        """
        p = self.pair
        t0 = time.monotonic()
        listing: Listing = await to_thread(self.judge, p.dst)
        self.adopt_profile(listing, "persistent")
        local: Listing = await to_thread(self.judge, p.src)
        best, mine = newest(listing, self.state.profile), newest(local, self.state.profile)
        if want is not None:
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
        dest = p.src / best.name
        have = await to_thread(snapshot, dest, within(best.name, p.exclude))
        stats = CopyResult()
        # one version on every node (a per-node pair): this node's copy must be that very
        # version, not one alike (same size, saved within the same second)
        same = matches(have, best.snap) if keep_newer else await to_thread(identical, dest, p.dst / best.name, have, best.snap)
        if not same:
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
        links = await to_thread(self._restore_pointers, listing, local, best)
        repointed = await to_thread(self._repoint, listing, best)
        self.emit("restore", pair=p.name, checkpoint=best.name, source=p.dst / best.name, to=dest,
                  files=stats.files, bytes=stats.bytes, seconds=round(time.monotonic() - t0, 3),
                  copied=bool(stats.files), why=best.why, step=best.step, pointers=links, **skipped, **repointed)
        return dest

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



def _copy_local(src: Path, dst: Path) -> None:
    """A regular file of its own at ``dst`` (temp + rename), mtime kept: ``last.ckpt``."""
    tmp = dst.with_name(f"{STAGING_PREFIX}{dst.name}")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


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

