"""Checkpoint publishing for one pair: what a checkpoint pass does with the listing it is given.

Each complete checkpoint, newest first, lands whole on the persistent side it is given
(``_side.Side.land``: for a directory, copied through a staging name, checked that nothing
changed while copying, and renamed into place; for an object store, uploaded, checked, then
its manifest); pointers land only once what they name is there (docs/design.md, invariant 1). An entry this run directory never
published is never replaced (issue 22). With ``keep_local``, older local copies go once their
persistent copy is verified. Failures raise to the engine (``_pair.py``), which backs off.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import anyio

from supervisor.sync._backend import CopyError, CopyResult
from supervisor.sync._complete import Entry, Listing, Pointer, Snap, matches, natural_key, pointer_owed
from supervisor.sync._side import Ledger, Side
from supervisor.sync._state import PairState, to_thread
# s: a file beside the checkpoints (DeepSpeed's zero_to_fp32.py, rewritten at every save) is
# published again at most this often while the training runs; a flush takes it at once.
BESIDE_BATCH = 10.0


class Publisher:
    """Publishes one checkpoint pair's complete checkpoints and their pointers.

    ``side``: the persistent side it publishes to (``_side.Side``: a directory, an object
    store), never asked which kind it is. ``ledger``: what this run directory may replace
    there and what it refused (``_side.Ledger``, which the side is given too; its ``ours``:
    names this run directory published in earlier attempts, None: history unknown, every entry
    may be replaced as before); a name on the persistent side in neither this nor what is
    published now is another run's and is never replaced. ``recheck(at)``
    asks the schedule for another pass then, ``on_publish(done_at, ident)`` tells the mirror,
    ``wanted()`` says another pass or a flush is waiting (a pass then stops after the entry it
    has published: the next one starts again from the newest).
    """

    def __init__(self, state: PairState, side: Side, *, ledger: Ledger, recheck: Callable[[float], None],
                 on_publish: Callable[..., None], wanted: Callable[[], bool] = lambda: False) -> None:
        self.state = state
        self.pair, self.emit = state.pair, state.emit
        self.side = side
        self.ledger = ledger
        self.recheck = recheck
        self.on_publish = on_publish
        self.wanted = wanted
        self.refused = ledger.refused              # names refused on the persistent side (another run's)
        self.pointers_done = ledger.pointers_done  # pointer → the content published
        self._torn: dict[str, Any] = {}         # checkpoint → Snap journaled as torn
        self._beside_at: dict[str, float] = {}  # file beside the checkpoints → time.monotonic() of its last publish

    def _journal_torn(self, listing: Listing) -> None:
        for e in listing.entries.values():
            if e.torn and (self._torn.get(e.name) is None or not self._torn[e.name].same_content(e.snap)):
                self._torn[e.name] = e.snap
                self.emit("torn", pair=self.pair.name, checkpoint=e.name, why=e.torn)

    async def run(self, listing: Listing, trigger: str, stats: CopyResult, published: list[str]) -> None:
        """One checkpoint pass over ``listing``, the local side as the engine just scanned it:
        copies add to ``stats``, the names published now to ``published``."""
        self._journal_torn(listing)
        todo: list[Entry] = []
        for e in complete_newest_first(listing):
            prev = self.state.published.get(e.name)
            if prev is not None and prev.same_content(e.snap):
                continue
            if prev is None:  # already there from an earlier attempt?
                there = await self.side.there(e.name)
                if matches(there, e.snap):
                    self.state.published[e.name] = e.snap
                    if e.name in listing.sigs:
                        self.state.sigs[e.name] = listing.sigs[e.name]
                    continue
                if there is not None and not self.ledger.owns(e.name):
                    self.ledger.refuse(e.name)
                    continue
            todo.append(e)
        self._note_pending(listing)
        flushing = trigger.startswith("flush")
        todo = self._beside_due(todo, flushing)
        landed = False  # a checkpoint (not a file beside them) was published in this pass
        for e in todo:  # the newest checkpoint first: the one most at risk
            if landed and e.restorable and not flushing and self.wanted():
                # A newer checkpoint, a request or a flush is waiting: at a slow copier a pass
                # over older ones took 11 s after a stop's checkpoint (chaos trial, CI load).
                # Each pass publishes at least one, so the older ones still get their turn.
                break
            try:
                ok = await self._publish(e, trigger, stats)
            except (OSError, CopyError):
                # Never published, so ours to drop: a full disk gets its space back for the retry.
                with anyio.CancelScope(shield=True):
                    await self.side.drop(e.name)
                raise
            if ok:
                published.append(e.name)
                landed = landed or e.restorable
                if not e.restorable:
                    self._beside_at[e.name] = time.monotonic()
                self._note_pending(listing)  # before the pointers: a failure there must not leave this one owed
            await self.publish_pointers(listing)
            self._note_pending(listing)
        await self.publish_pointers(listing)
        await self._end_pass(listing)

    def _beside_due(self, todo: list[Entry], flushing: bool) -> list[Entry]:
        """The files beside the checkpoints that are due: one published less than
        ``BESIDE_BATCH`` ago waits (a pass is asked for when it is due), unless a flush wants
        everything. DeepSpeed rewrites two at every save; copied in every pass, they cost two
        copier starts each time the newest checkpoint is published."""
        now, out = time.monotonic(), []
        for e in todo:
            at = self._beside_at.get(e.name)
            if e.restorable or flushing or at is None or now - at >= BESIDE_BATCH:
                out.append(e)
            else:
                self.recheck(at + BESIDE_BATCH)
        return out

    def _behind(self, ptr: Pointer) -> bool:
        """Is this local pointer one never to publish, older than the persistent one? Here
        never: the training rewrote it (a restore that fell back past a torn checkpoint
        repoints it, on purpose, to an older one). Blocking."""
        return False

    async def _end_pass(self, listing: Listing) -> None:
        """After a checkpoint pass: what is pending, when to look again, what local copies to keep."""
        self._note_pending(listing)
        ready = [e.ready_at for e in listing.entries.values() if e.ready_at is not None]
        if ready:
            self.recheck(time.monotonic() + max(0.05, min(ready) - time.time() + 0.05))
        if self.pair.keep_local:
            await self._retain(listing)

    async def _publish(self, e: Entry, trigger: str, stats: CopyResult) -> bool:
        """``e`` landed whole on the persistent side (``Side.land``), then noted, journaled
        (``publish``) and told. False when the checkpoint vanished, stopped being complete,
        kept changing, or another run holds the name."""
        landed = await self.side.land(e, stats)
        if landed is None:
            return False
        e, again = landed.entry, landed.again
        self.state.published[e.name] = e.snap
        if e.name in again.sigs:
            self.state.sigs[e.name] = again.sigs[e.name]
        lag = round(time.time() - e.done_at, 3) if e.done_at else None
        # A file beside the checkpoints (DeepSpeed's zero_to_fp32.py, HF's training_args.bin)
        # is mirrored but is no checkpoint: it never answers a request nor sets the save rhythm.
        stray = {} if e.restorable else {"restorable": False}
        self.emit("publish", pair=self.pair.name, checkpoint=e.name, trigger=trigger, files=len(e.snap.files),
                  bytes=e.snap.bytes, why=e.why, lag_s=lag, **landed.fields, **stray)
        if e.restorable:
            self.on_publish(e.done_at, (e.name, again.sigs[e.name][0]) if e.name in again.sigs else None)
        return True

    async def publish_pointers(self, listing: Listing) -> None:
        """A pointer lands only once the checkpoint it names is published (docs/design.md, invariant 1)."""
        p = self.pair
        for ptr in listing.pointers.values():
            target = ptr.target
            if target is None or target not in self.state.published or self.pointers_done.get(ptr.name) == ptr.content:
                continue
            cur = listing.entries.get(target)
            if cur is not None and not self.state.published[target].same_content(cur.snap):
                continue
            if not self.ledger.owns(ptr.name) and await self.side.pointer_there(ptr.name):
                self.ledger.refuse(ptr.name, "pointer")  # another run's `latest` sharing the directory
                continue
            if await to_thread(self._behind, ptr):
                continue
            wrote = await self.side.write_pointer(ptr, target)
            self.pointers_done[ptr.name] = ptr.content
            if wrote:
                self.emit("publish", pair=p.name, checkpoint=ptr.name, pointer=True, target=target,
                          lag_s=round(time.time() - ptr.mtime_ns / 1e9, 3))

    def owed(self, listing: Listing) -> None:
        """What is not yet durable, from ``listing`` (the local side judged now)."""
        self._note_pending(listing)

    def _note_pending(self, listing: Listing) -> None:
        out = []
        for e in sorted(listing.entries.values(), key=lambda e: natural_key(e.name)):
            prev = self.state.published.get(e.name)
            if e.torn:
                out.append(f"{self.pair.name}: {e.name} (torn: {e.torn}; never published)")
            elif not e.complete:
                out.append(f"{self.pair.name}: {e.name} (incomplete: {e.why})")
            elif e.name in self.refused and prev is None:
                out.append(f"{self.pair.name}: {e.name} (refused: another run's {e.name} is on persistent storage)")
            elif prev is None or not prev.same_content(e.snap):
                out.append(f"{self.pair.name}: {e.name} (complete, not yet on persistent storage)")
        for ptr in listing.pointers.values():
            if ptr.name in self.refused:
                out.append(f"{self.pair.name}: {ptr.name} (refused: another run's {ptr.name} is on persistent storage)")
            elif self.pointers_done.get(ptr.name) != ptr.content:
                out.append(pointer_owed(self.pair.name, ptr, listing))
        for name in listing.outside:
            out.append(f"{self.pair.name}: {name} (a link out of the pair's directory: never followed, not mirrored)")
        self.state.pending = out

    async def _retain(self, listing: Listing) -> None:
        """keep_local = N: delete local checkpoints beyond the newest N, each only once its
        persistent copy is verified against it. Never the one a pointer names."""
        p = self.pair
        assert p.keep_local
        done = sorted((e for e in listing.entries.values() if e.complete), key=lambda e: natural_key(e.name), reverse=True)
        named = {ptr.target for ptr in listing.pointers.values()}
        removed = []
        for e in done[p.keep_local:]:
            if e.name in named or e.name not in self.state.published or not self.state.published[e.name].same_content(e.snap):
                continue
            there = await self.side.there(e.name)
            if not self._holds(there, e.snap):
                continue
            await to_thread(_remove_local, p.src / e.name)
            self.state.published.pop(e.name, None)
            self.state.sigs.pop(e.name, None)
            removed.append(e.name)
        if removed:
            self.emit("retention", pair=p.name, removed=removed, kept=p.keep_local, where="local", **self._retention_fields())

    def _holds(self, there: Snap | None, local: Snap) -> bool:
        """Does the published copy hold this local checkpoint? (Here: exactly it.)"""
        return matches(there, local)

    def _retention_fields(self) -> dict[str, object]:
        return {}


def complete_newest_first(listing: Listing) -> list[Entry]:
    """The complete entries of a pass: the newest checkpoint first (a stop wants the newest
    soonest), then the files beside the checkpoints (DeepSpeed's ``zero_to_fp32.py``, HF's
    ``training_args.bin``: plain files, mirrored, never checkpoints), then the older
    checkpoints, newest first. By name alone ``zero_to_fp32.py`` came before every
    ``global_stepN`` and, rewritten at every save, was all a yielding pass published (issue 30)."""
    done = sorted((e for e in listing.entries.values() if e.complete), key=lambda e: natural_key(e.name), reverse=True)
    checkpoints = [e for e in done if e.restorable]
    return checkpoints[:1] + [e for e in done if not e.restorable] + checkpoints[1:]


def _remove_local(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        os.unlink(path)
