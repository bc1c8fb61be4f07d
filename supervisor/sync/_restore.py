"""Restore for one checkpoint pair: before the spawn, the newest complete checkpoint from
persistent storage back to local disk, so a requeued attempt resumes from fast local disk.

What to restore is decided here, alike for every persistent side; the side the restorer is
given (``_side.RestoreSide``) lists what it holds and brings one version back, verified.
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
from typing import Any, Callable, Collection, Mapping, Sequence

from supervisor.sync import _fsops
from supervisor.sync._fill import ChoiceUnverified, Fetch, Unverified
from supervisor.sync._manifest import entry_of
from supervisor.sync._complete import STAGING_PREFIX, Entry, Listing, matches, newest_complete
from supervisor.sync._profiles import Profile
from supervisor.sync._side import RestoreSide
from supervisor.sync._state import PairState, to_thread


class Restorer:
    """Restores one checkpoint pair from the persistent side it is given (``side``, a
    ``_side.RestoreSide``: a directory, an object store), never asking which kind it is.
    ``judge(root)`` lists a side as finished (nothing writes it before the spawn; blocking:
    run in a thread); ``adopt_profile(listing, where)`` lets the engine take the profile a
    listing shows."""

    def __init__(self, state: PairState, side: RestoreSide, *, judge: Callable[[Path], Listing],
                 adopt_profile: Callable[[Listing, str], None]) -> None:
        self.state = state
        self.pair, self.emit = state.pair, state.emit
        self.side = side
        self.judge = judge
        self.adopt_profile = adopt_profile
        self.chosen: Entry | None = None  # what ``choose`` found newest on persistent storage
        self.slow = False                 # ``choose`` waited in vain for the persistent side's listing

    async def choose(self, without: Collection[str] = ()) -> str | None:
        """The checkpoint a restore now would bring back: the newest complete one on
        persistent storage (a multi-node leader's choice for every node), but for those
        named in ``without`` (versions that verified nowhere a node could reach)."""
        listing, _docs = await self.side.listing(None, False)
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
        p, side = self.pair, self.side
        t0 = time.monotonic()
        listing, docs = await side.listing(doc, self.slow)
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
            repointed = await to_thread(self._repoint, local, mine) if side.repoints_kept else {}
            self.emit("restore", pair=p.name, checkpoint=None, kept=mine.name, reason=f"{why}: kept, and published first",
                      **skipped, **repointed)
            return p.src / mine.name
        if best is None:
            self.emit("restore", pair=p.name, checkpoint=None, reason="no complete checkpoint on persistent storage",
                      **skipped)
            return None
        # The newest first; one whose bytes do not verify against its content manifest is
        # skipped for the next newest, never restored mixed. The leader's choice for every
        # node (``want``; ``doc``, a version only the nodes hold, is one) is that version or nothing.
        order = [best] if want is not None or doc is not None else [best] + sorted(
            (e for e in listing.entries.values() if e.complete and e.restorable and e.name != best.name),
            key=lambda e: e.order, reverse=True)
        failed: list[str] = []
        for best in order:
            try:
                brought = await side.bring(best, docs, listing, local, keep_newer=keep_newer, doc=doc, peers=peers)
            except Unverified as u:
                self.emit("restore-verify", pair=p.name, checkpoint=best.name, result="failed", failed=u.failed,
                          reason=side.failed_reason(want is not None))
                if want is not None:
                    raise ChoiceUnverified(best.name, str(u)) from u
                failed.append(best.name)
                continue
            links = await to_thread(self._restore_pointers, listing, local, best)
            repointed = await to_thread(self._repoint, listing, best)
            self.emit("restore", pair=p.name, checkpoint=best.name, source=brought.source, to=brought.dest,
                      files=brought.stats.files, bytes=brought.stats.bytes, seconds=round(time.monotonic() - t0, 3),
                      copied=brought.copied, why=best.why, step=best.step, pointers=links, **skipped,
                      **({side.unverified_as: failed} if failed else {}), **repointed)
            return brought.dest
        self.emit("restore", pair=p.name, checkpoint=None, **{side.unverified_as: failed}, **skipped,
                  reason=side.none_verified)
        return None

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

