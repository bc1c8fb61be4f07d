"""One sync pair: its triggers, its passes, what it has published, what it still owes.

A pass is the unit of work: scan (in a thread), copy what is complete through a staging
name, check nothing changed while copying, rename into place, then pointers. One pass per
pair at a time (``lock``); triggers that arrive meanwhile set one flag and so coalesce into
exactly one more pass. Failures never leave this module: they are journaled and retried
with capped exponential backoff (docs/design.md, invariant 4).
"""

from __future__ import annotations

import errno as _errno
import fnmatch
import os
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

import anyio
from watchfiles import awatch

from supervisor import stacks
from supervisor.config import SyncPair
from supervisor.journal import Emit
from supervisor.sync import _fsops
from supervisor.sync._backend import Backend, CopyError, CopyResult
from supervisor.sync._complete import (STAGING_PREFIX, Context, Entry, Listing, Snap, classify, matches,
                                       natural_key, newest_complete, snapshot)
from supervisor.sync._exclude import within
from supervisor.sync._profiles import GENERIC, PROFILES, Profile, torn_file
from supervisor.sync._writers import open_for_write

# Triggers that go ahead even while backing off after a failure.
URGENT = ("start", "retry", "request", "flush", "appeared")
RECOPY_TRIES = 3
REPLACED_POLL = 1.0  # seconds between checks that the watched directory is still the same inode
WATCH_GAP = {"checkpoint": 0.05, "log": 1.0}  # gather a burst of file events into one pass
LOG_BATCH = 10.0  # s: while logs are written, a log pair copies what grew at most this often


def _to_thread(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    return anyio.to_thread.run_sync(partial(fn, *args, **kw))


class PairEngine:
    def __init__(self, pair: SyncPair, backend: Backend, emit: Emit, *, every: float,
                 retry_base: float, retry_cap: float, on_publish: Callable[..., None],
                 writers: Callable[[], set[int]] | None = None) -> None:
        self.pair = pair
        # The training's processes on this node (None: not visible, e.g. a node agent).
        self.writers = writers
        self.exited = False                    # the training's whole tree is gone: nothing can change
        self.profile: Profile | None = PROFILES.get(pair.profile)
        self._inodes: dict[str, int] = {}      # top-level name → inode at the last scan (renames)
        self._torn: dict[str, Any] = {}         # checkpoint → Snap journaled as torn
        self._told_generic = False
        self.dirty: set[str] = set()           # top-level names with file events since the last cheap scan
        self._torn_cache: dict[tuple[str, Any], str | None] = {}
        self.backend = backend
        self.emit = emit
        self.every = pair.every or every
        self.retry_base, self.retry_cap = retry_base, retry_cap
        self.on_publish = on_publish
        self.lock = anyio.Lock()
        self._wake = anyio.Event()
        self._reason: str | None = None
        self._resched = anyio.Event()
        self.next_periodic = time.monotonic() + self.every
        self.recheck_at: float | None = None   # a settling checkpoint's quiescence is due
        self.retry_at: float | None = None     # the ticker fires "retry" then
        self.backoff_until: float | None = None
        self.failures = 0
        self.published: dict[str, Any] = {}    # checkpoint name → Snap of what was published
        self._sigs: dict[str, Any] = {}         # its top-level stat then, to skip re-walking it
        self.pointers_done: dict[str, bytes] = {}
        self.marker_seen = False
        self._newest_ns = 0
        self.last_activity: float | None = None
        self.pending: list[str] = [f"{pair.name}: not synced yet"]
        self._log_copied: dict[str, tuple[int, int]] = {}  # log file → (size, mtime) copied
        self._log_next = 0.0                   # monotonic time before which watch passes wait
        # Names this run directory published in earlier attempts (None: history unknown,
        # every entry may be replaced as before); a name on the persistent side in neither
        # this nor self.published is another run's and is never replaced.
        self.ours: set[str] | None = None
        self.refused: set[str] = set()
        self._log_inodes: dict[str, int] = {}  # log file → local inode at the last pass

    # ---- triggers -------------------------------------------------------------------

    def trigger(self, reason: str) -> None:
        """Ask for a pass; never blocks. A watch event never displaces a weightier reason."""
        if self._reason is None or self._reason == "watch":
            self._reason = reason
        self._wake.set()

    def _poke_ticker(self) -> None:
        self._resched.set()

    async def loop(self) -> None:
        while True:
            await self._wake.wait()
            if self._reason == "watch":
                await anyio.sleep(WATCH_GAP[self.pair.kind])
            self._wake = anyio.Event()
            reason, self._reason = self._reason or "periodic", None
            if self.backoff_until is not None and time.monotonic() < self.backoff_until \
                    and not reason.startswith(URGENT):
                continue  # the ticker fires "retry" when the backoff ends
            async with self.lock:
                await self.run_pass(reason)

    async def ticker(self) -> None:
        """The safety net, settle re-checks and retries: whichever is due first."""
        while True:
            now = time.monotonic()
            due = [(self.next_periodic, "periodic")]
            if self.recheck_at is not None:
                due.append((self.recheck_at, "settle"))
            if self.retry_at is not None:
                due.append((self.retry_at, "retry"))
            when, why = min(due)
            if when <= now:
                if why == "periodic":
                    self.next_periodic = now + self.every
                elif why == "settle":
                    self.recheck_at = None
                else:
                    self.retry_at = None
                self.trigger(why)
                continue
            with anyio.move_on_after(when - now):
                await self._resched.wait()
            self._resched = anyio.Event()

    async def watch(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """inotify on the local side (watchfiles); low latency, while the ticker stays the net.

        A missing source is waited for (and a pass triggered when it appears); a watcher
        that dies (directory removed, inotify limits) is journaled and restarted.
        """
        src = self.pair.src
        started = False
        quiet = 1.0
        while True:
            if not await _to_thread(src.is_dir):
                if not started:
                    task_status.started()
                    started = True
                while not await _to_thread(src.is_dir):
                    await anyio.sleep(1.0)
                self.emit("sync-source", pair=self.pair.name, path=src, action="appeared")
                self.trigger("appeared")
            if not started:
                task_status.started()
                started = True
            try:
                if await self._watch_once(src):
                    # Removed and made again (a new inode): the old watch sees nothing more.
                    self.emit("sync-source", pair=self.pair.name, path=src, action="replaced")
                    self.trigger("appeared")
                    continue
            except Exception as e:  # noqa: BLE001 - a watcher failure must not end supervision
                self.emit("sync-watch-failed", pair=self.pair.name, error=f"{type(e).__name__}: {e}", retry_in=quiet)
            await anyio.sleep(quiet)
            quiet = min(quiet * 2, 60.0)

    async def _watch_once(self, src: Path) -> bool:
        """One watchfiles session. awatch's worker thread only notices cancellation through
        its stop event, so a sibling sets it on cancel; otherwise cancelling run() would
        wait out watchfiles' 5 s Rust timeout. Returns True when ``src`` was removed or
        replaced (inotify keeps watching the old inode, silently)."""
        stop = anyio.Event()
        error: BaseException | None = None
        replaced = False
        inode = (await _to_thread(os.stat, src)).st_ino

        async def same_directory() -> None:
            nonlocal replaced
            while True:
                await anyio.sleep(REPLACED_POLL)
                try:
                    now = (await _to_thread(os.stat, src)).st_ino
                except OSError:
                    now = None
                if now != inode:
                    replaced = True
                    tg.cancel_scope.cancel()
                    return

        async def consume() -> None:
            nonlocal error
            try:
                async for changes in awatch(src, watch_filter=None, debounce=400, step=50, stop_event=stop,
                                            recursive=True, ignore_permission_denied=True):
                    self.last_activity = time.monotonic()
                    self._note_dirty(src, changes)
                    self.trigger("watch")
                error = RuntimeError(f"watching {src} stopped")
            except Exception as e:  # noqa: BLE001 - reported by the caller
                error = e
            finally:
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            tg.start_soon(same_directory)
            try:
                await anyio.sleep_forever()
            finally:
                stop.set()
        if replaced:
            return True
        if error is not None:
            raise error
        return False

    def _note_dirty(self, src: Path, changes: Any) -> None:
        """The top-level entries a batch of file events touched: a watch pass walks them again
        even when their own stat did not change (a file rewritten in place inside a directory)."""
        root = str(src).rstrip("/") + "/"
        for _change, path in changes:
            if path.startswith(root):
                self.dirty.add(path[len(root):].split("/", 1)[0])

    def reusable(self, known: dict[str, Any]) -> dict[str, Any]:
        """Snapshots a cheap scan may trust: unchanged top-level stat, and no file event inside."""
        dirty, self.dirty = self.dirty, set()
        return {n: (self._sigs[n], snap) for n, snap in known.items() if n in self._sigs and n not in dirty}

    # ---- one pass -------------------------------------------------------------------

    async def run_pass(self, trigger: str) -> dict[str, Any]:
        """Sync this pair once; return what happened. Only cancellation escapes."""
        t0 = time.monotonic()
        stats = CopyResult()
        published: list[str] = []
        try:
            if not await _to_thread(self.pair.src.is_dir):
                self.pending = [f"{self.pair.name}: local side {self.pair.src} does not exist"]
                return {"ok": True, "files": 0, "bytes": 0, "published": [], "seconds": 0.0}
            await _to_thread(self.pair.dst.mkdir, parents=True, exist_ok=True)
            if self.pair.kind == "checkpoint":
                await self._checkpoint_pass(trigger, stats, published)
            else:
                await self._log_pass(stats, trigger)
        except (OSError, CopyError) as e:
            return self._failed(trigger, e, time.monotonic() - t0)
        seconds = round(time.monotonic() - t0, 3)
        if self.failures:
            self.emit("sync-recovered", pair=self.pair.name, after_failures=self.failures)
        self.failures, self.backoff_until, self.retry_at = 0, None, None
        if stats.files or published or not trigger.startswith(("watch", "periodic", "settle", "parts")):
            self.emit("sync", pair=self.pair.name, trigger=trigger, files=stats.files, bytes=stats.bytes,
                      seconds=seconds, published=published, backend=self.backend.name)
        return {"ok": True, "files": stats.files, "bytes": stats.bytes, "published": published, "seconds": seconds}

    def _failed(self, trigger: str, e: Exception, seconds: float) -> dict[str, Any]:
        self.failures += 1
        delay = min(self.retry_cap, self.retry_base * 2 ** (self.failures - 1))
        now = time.monotonic()
        self.backoff_until = self.retry_at = now + delay
        self._poke_ticker()
        code = getattr(e, "code", None) or (_errno.errorcode.get(e.errno) if isinstance(e, OSError) and e.errno else None)
        self.emit("sync-failed", pair=self.pair.name, trigger=trigger, error=str(e), errno=code,
                  failures=self.failures, retry_in=round(delay, 3), seconds=round(seconds, 3))
        self.pending = [p for p in self.pending if "last sync failed" not in p] + [f"{self.pair.name}: last sync failed ({e})"]
        return {"ok": False, "error": str(e), "errno": code, "files": 0, "bytes": 0, "published": [],
                "seconds": round(seconds, 3)}

    def _scan(self, *, root: Path | None = None, only: str | None = None, settle: float | None = None,
              cheap: bool = False, pids: set[int] | None = None, finished: bool = False) -> Listing:
        """Classify the local side (or ``root``). ``pids``: the training's processes, whose
        open files are the evidence; ``finished``: judge as if nothing can change any more
        (the training is gone, or ``root`` is a side nobody writes)."""
        p = self.pair
        reuse = self.reusable(self.published) if cheap else None
        local = root is None
        writing = None
        if local and pids is not None and not self.exited:
            writing = open_for_write(pids, os.path.realpath(p.src))
        provisional = self.profile is not None and self.profile.name == "torch-save" and self.pair.profile == "auto"
        saving = partial(stacks.inside, set(pids)) if writing is not None and pids else None
        ctx = Context(profile=None if provisional else self.profile, writing=writing, exited=finished or (local and self.exited),
                      inodes=self._inodes if local else {}, torn_check=self._torn_check, saving=saving)
        listing = classify(root or p.src, markers=p.markers, exclude=p.exclude,
                           settle=p.settle if settle is None else settle, now=time.time(),
                           marker_seen=self.marker_seen if local else False, only=only, reuse=reuse, ctx=ctx)
        if local and only is None:
            self._inodes = {n: sig[0] for n, sig in listing.sigs.items()}
        return listing

    def in_progress(self) -> set[tuple[str, int]]:
        """(name, inode) of each checkpoint being written now: none of them can answer a
        request made now (policy.started_after_request). Blocking: scans the local side."""
        pids = self.writers() if self.writers is not None else None
        listing = self._scan(pids=pids)
        return {(n, listing.sigs[n][0]) for n, e in listing.entries.items() if not e.complete and n in listing.sigs}

    def _torn_check(self, path: Path, snap: Snap) -> str | None:
        """``torn_file``, once per file version (it reads the file's tail)."""
        key = (str(path), tuple(snap.files.values()))
        if key not in self._torn_cache:
            if len(self._torn_cache) > 4096:
                self._torn_cache.clear()
            self._torn_cache[key] = torn_file(str(path))
        return self._torn_cache[key]

    def _take_listing(self, listing: Listing) -> None:
        """A local pass's listing: the marker seen, the profile it shows, the last local change."""
        self.marker_seen = listing.marker_seen
        self._adopt_profile(listing, "local")
        newest = max((e.snap.newest_ns for e in listing.entries.values()), default=0)
        if newest != self._newest_ns:
            self._newest_ns = newest
            self.last_activity = time.monotonic()

    def _adopt_profile(self, listing: Listing, where: str) -> None:
        """Keep the detected profile; a file-only guess (torch-save) gives way to directories.
        Entries of no known layout are said once (generic rules: quiescence), not kept."""
        if listing.profile is None and listing.entries and self.profile is None and not self._told_generic:
            self._told_generic = True
            self.emit("sync-profile", pair=self.pair.name, profile=GENERIC.name, where=where,
                      evidence=f"no known layout: {sorted(listing.entries)[0]}", writers=self.writer_view(),
                      quiescence=self.relies_on_quiescence(GENERIC))
        if listing.profile is None or listing.profile is self.profile:
            return
        if self.profile is not None and (self.profile.name != "torch-save" or self.pair.profile != "auto"):
            return
        self.profile = listing.profile
        self.emit("sync-profile", pair=self.pair.name, profile=self.profile.name, evidence=listing.evidence,
                  where=where, writers=self.writer_view(), quiescence=self.relies_on_quiescence())

    def writer_view(self) -> str:
        return "visible" if self.writers is not None else "unseen"

    def relies_on_quiescence(self, profile: Profile | None = None) -> bool:
        """True when nothing but a quiet period can say a checkpoint is complete here."""
        prof = profile or self.profile
        if self.pair.markers or (prof is not None and (prof.markers or prof.name in ("deepspeed", "megatron", "orbax"))):
            return False
        if prof is not None and prof.is_dir is False:
            return self.writers is None
        return True

    def training_exited(self) -> None:
        """The training's whole tree is gone: every later pass judges without waiting."""
        self.exited = True

    def _journal_torn(self, listing: Listing) -> None:
        for e in listing.entries.values():
            if e.torn and (self._torn.get(e.name) is None or not self._torn[e.name].same_content(e.snap)):
                self._torn[e.name] = e.snap
                self.emit("torn", pair=self.pair.name, checkpoint=e.name, why=e.torn)

    async def _checkpoint_pass(self, trigger: str, stats: CopyResult, published: list[str]) -> None:
        p = self.pair
        # Watch events fire many times a second while a checkpoint is written: those passes
        # trust unchanged top-level stats of published checkpoints; every other pass walks all.
        pids = self.writers() if self.writers is not None else None
        listing: Listing = await _to_thread(self._scan, cheap=trigger == "watch", pids=pids)
        self._take_listing(listing)
        self._journal_torn(listing)
        todo: list[Entry] = []
        for e in _complete_newest_first(listing):
            prev = self.published.get(e.name)
            if prev is not None and prev.same_content(e.snap):
                continue
            if prev is None:  # already there from an earlier attempt?
                there = await _to_thread(snapshot, p.dst / e.name, within(e.name, p.exclude))
                if matches(there, e.snap):
                    self.published[e.name] = e.snap
                    if e.name in listing.sigs:
                        self._sigs[e.name] = listing.sigs[e.name]
                    continue
                if there is not None and not self._owns(e.name):
                    self._refuse(e.name)
                    continue
            todo.append(e)
        self._note_pending(listing)
        for e in todo:  # newest first: the one most at risk
            staging = p.dst / f"{STAGING_PREFIX}{e.name}"
            try:
                ok = await self._publish(e, trigger, stats)
            except (OSError, CopyError):
                # Never published, so ours to drop: a full disk gets its space back for the retry.
                with anyio.CancelScope(shield=True):
                    await _to_thread(_fsops.remove_ours, staging)
                raise
            if ok:
                published.append(e.name)
            await self._publish_pointers(listing)
            self._note_pending(listing)
        await self._publish_pointers(listing)
        await self._end_pass(listing)

    async def _end_pass(self, listing: Listing) -> None:
        """After a checkpoint pass: what is pending, when to look again, what local copies to keep."""
        self._note_pending(listing)
        ready = [e.ready_at for e in listing.entries.values() if e.ready_at is not None]
        if ready:
            self.recheck_at = time.monotonic() + max(0.05, min(ready) - time.time() + 0.05)
            self._poke_ticker()
        if self.pair.keep_local:
            await self._retain(listing)

    def _owns(self, name: str) -> bool:
        """This run directory published ``name`` (a checkpoint, or a pointer or link, in this
        attempt or an earlier one), whatever it has turned into since (a Lightning
        ``last.ckpt`` link replaced by a regular file): it may replace it (issue 22)."""
        return self.ours is None or name in self.ours or name in self.published or name in self.pointers_done

    def _refuse(self, name: str, what: str = "checkpoint") -> None:
        """An entry of that name is on the persistent side and this run never published it
        (another run's, sharing the directory): it is never replaced. Journaled once; the
        local one stays pending, so ``end.not_durable`` and the report name it."""
        if name not in self.refused:
            self.refused.add(name)
            self.emit("sync-refused", pair=self.pair.name, checkpoint=name, what=what,
                      why="on the persistent side already and not published by this run directory: not replaced")

    async def _publish(self, e: Entry, trigger: str, stats: CopyResult) -> bool:
        """Stage, verify, rename. False when the checkpoint vanished or stopped being complete."""
        p = self.pair
        src, final = p.src / e.name, p.dst / e.name
        staging = p.dst / f"{STAGING_PREFIX}{e.name}"
        # Staging left by a killed run is resumed (rsync skips what is already whole) but then
        # always verified: it may hold files the source no longer has.
        leftover = await _to_thread(_fsops.claim_staging, staging, is_dir=e.is_dir)
        for attempt in range(RECOPY_TRIES):
            got = CopyResult()
            try:
                if e.is_dir:
                    # the snapshot's files, not a second walk; shared among the copy streams
                    got += await self.backend.copy_tree(src, staging, exclude=within(e.name, p.exclude), skip=e.markers, fsync=p.fsync,
                                                        fresh=not leftover, files=e.snap.files)
                    got.bytes += await _to_thread(_fsops.copy_markers, src, staging, e.markers, fsync=p.fsync)
                    got.files += len(e.markers)
                else:
                    got += await self.backend.copy_file(src, staging, fsync=p.fsync)
            except (CopyError, FileNotFoundError):
                if await _to_thread(os.path.lexists, src):
                    raise
                # the whole checkpoint was rotated away under the copier: not a failure
                await _to_thread(_fsops.remove_ours, staging)
                return False
            stats += got
            pids = self.writers() if self.writers is not None else None
            again: Listing = await _to_thread(self._scan, only=e.name, pids=pids)
            now = again.entries.get(e.name)
            if now is None or not now.complete:  # rotated away, or not what we thought: not a failure
                await _to_thread(_fsops.remove_ours, staging)
                return False
            if now.snap.files != e.snap.files:  # changed while copied: copy again before it counts (no copies of 100 000-entry dicts)
                e = now
                continue
            # A clean first copy of an unchanged source is whole (the copier exits non-zero
            # otherwise); a retry into a used staging area, or files that vanished, get checked.
            if attempt or got.vanished or leftover:
                staged = await _to_thread(snapshot, staging, within(e.name, p.exclude))
                if not matches(staged, e.snap):
                    await _to_thread(_fsops.prune_staging, staging, e.snap)
                    continue
            await _to_thread(_fsops.swap_in, staging, final, is_dir=e.is_dir, fsync=p.fsync)
            self.published[e.name] = e.snap
            if e.name in again.sigs:
                self._sigs[e.name] = again.sigs[e.name]
            lag = round(time.time() - e.done_at, 3) if e.done_at else None
            # A file beside the checkpoints (DeepSpeed's zero_to_fp32.py, HF's training_args.bin)
            # is mirrored but is no checkpoint: it never answers a request nor sets the save rhythm.
            stray = {} if e.restorable else {"restorable": False}
            self.emit("publish", pair=p.name, checkpoint=e.name, trigger=trigger, files=len(e.snap.files),
                      bytes=e.snap.bytes, why=e.why, lag_s=lag, **stray)
            if e.restorable:
                self.on_publish(e.done_at, (e.name, again.sigs[e.name][0]) if e.name in again.sigs else None)
            return True
        self.emit("sync-deferred", pair=p.name, checkpoint=e.name,
                  reason=f"changed while being copied, {RECOPY_TRIES} times; trying again on the next pass")
        return False

    async def _publish_pointers(self, listing: Listing) -> None:
        """A pointer lands only once the checkpoint it names is published (docs/design.md, invariant 1)."""
        p = self.pair
        for ptr in listing.pointers.values():
            target = ptr.target
            if target is None or target not in self.published or self.pointers_done.get(ptr.name) == ptr.content:
                continue
            cur = listing.entries.get(target)
            if cur is not None and not self.published[target].same_content(cur.snap):
                continue
            if not self._owns(ptr.name) and await _to_thread(os.path.lexists, p.dst / ptr.name):
                self._refuse(ptr.name, "pointer")  # another run's `latest` sharing the directory
                continue
            if ptr.link:
                wrote = await _to_thread(_fsops.write_link, p.dst / ptr.name, target)
            else:
                wrote = await _to_thread(_fsops.write_atomic, p.dst / ptr.name, ptr.content, ptr.mtime_ns, fsync=p.fsync,
                                         mode=ptr.mode)
            self.pointers_done[ptr.name] = ptr.content
            if wrote:
                self.emit("publish", pair=p.name, checkpoint=ptr.name, pointer=True, target=target,
                          lag_s=round(time.time() - ptr.mtime_ns / 1e9, 3))

    def _note_pending(self, listing: Listing) -> None:
        out = []
        for e in sorted(listing.entries.values(), key=lambda e: natural_key(e.name)):
            prev = self.published.get(e.name)
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
                out.append(f"{self.pair.name}: {ptr.name} ({'link' if ptr.link else 'pointer'} to "
                           f"{ptr.target or 'a missing checkpoint'})")
        for name in listing.outside:
            out.append(f"{self.pair.name}: {name} (a link out of the pair's directory: never followed, not mirrored)")
        self.pending = out

    async def _retain(self, listing: Listing) -> None:
        """keep_local = N: delete local checkpoints beyond the newest N, each only once its
        persistent copy is verified against it. Never the one a pointer names."""
        p = self.pair
        assert p.keep_local
        done = sorted((e for e in listing.entries.values() if e.complete), key=lambda e: natural_key(e.name), reverse=True)
        named = {ptr.target for ptr in listing.pointers.values()}
        removed = []
        for e in done[p.keep_local:]:
            if e.name in named or e.name not in self.published or not self.published[e.name].same_content(e.snap):
                continue
            there = await _to_thread(snapshot, p.dst / e.name, within(e.name, p.exclude))
            if not self._holds(there, e.snap):
                continue
            await _to_thread(_remove_local, p.src / e.name)
            self.published.pop(e.name, None)
            self._sigs.pop(e.name, None)
            removed.append(e.name)
        if removed:
            self.emit("retention", pair=p.name, removed=removed, kept=p.keep_local, where="local", **self._retention_fields())

    def _holds(self, there: Snap | None, local: Snap) -> bool:
        """Does the published copy hold this local checkpoint? (Here: exactly it.)"""
        return matches(there, local)

    def _retention_fields(self) -> dict[str, object]:
        return {}

    async def _log_pass(self, stats: CopyResult, trigger: str) -> None:
        """Logs grow in place. A file event copies only the files whose size or mtime changed
        since they were last copied, at most every LOG_BATCH s (the ticker comes back for what
        a skipped event left); every other trigger (start, flush, request, the periodic net)
        compares the whole tree with the persistent side, as rsync does, and at once."""
        p = self.pair
        now = time.monotonic()
        if trigger in ("watch", "settle") and now < self._log_next:
            self.recheck_at = self._log_next
            self._poke_ticker()
            return
        for rel, kept_as in await _to_thread(_fsops.keep_restarted_logs, p.src, p.dst, p.exclude, self._log_inodes):
            self.emit("log-restarted", pair=p.name, file=rel, kept_as=kept_as,
                      why="the local file started over: the persistent copy is kept, not overwritten")
        snap = await _to_thread(snapshot, p.src, p.exclude)
        files = dict(snap.files) if snap else {}
        if trigger in ("watch", "settle"):
            grown = sorted(rel for rel, sig in files.items() if self._log_copied.get(rel) != sig)
            if not grown:
                return
            self._log_next = now + LOG_BATCH
            r = await self.backend.grow(p.src, p.dst, exclude=p.exclude, fsync=p.fsync, only=grown)
            self._log_copied.update((rel, files[rel]) for rel in grown)
            self.pending = []
        else:
            r = await self.backend.grow(p.src, p.dst, exclude=p.exclude, fsync=p.fsync)
            self._log_copied = files
            behind = await _to_thread(_fsops.log_lag, p.src, p.dst, p.exclude)
            self.pending = [f"{p.name}: {b}" for b in behind]
        stats += r
        if r.files:
            self.last_activity = time.monotonic()

    # ---- restore --------------------------------------------------------------------

    async def restore(self) -> Path | None:
        """Newest complete checkpoint persistent → local, unless local has it or a newer one.

        Both sides are judged as finished (nothing writes them before the spawn): a checkpoint
        its profile calls torn is never chosen, nor a file that is not one of the profile's
        checkpoints, nor a link out of the pair. A newer complete local checkpoint (a requeue
        onto the same node keeps node-local disk) is kept and published, never overwritten.
        """
        p = self.pair
        t0 = time.monotonic()
        listing: Listing = await _to_thread(self._scan, root=p.dst, settle=0.0, finished=True)
        self._adopt_profile(listing, "persistent")
        local: Listing = await _to_thread(self._scan, root=p.src, settle=0.0, finished=True)
        best, mine = _newest(listing, self.profile), _newest(local, self.profile)
        skipped = {"torn": sorted(n for n, e in listing.entries.items() if e.torn)} if any(
            e.torn for e in listing.entries.values()) else {}
        if listing.outside:
            skipped["links_out"] = sorted(listing.outside)
        if mine is not None and (best is None or _newer(mine, best)):
            why = (f"the local {mine.name} is newer than the persistent {best.name}" if best is not None
                   else f"nothing on persistent storage; the local {mine.name} is complete")
            repointed = await _to_thread(self._repoint, local, mine)
            self.emit("restore", pair=p.name, checkpoint=None, kept=mine.name, reason=f"{why}: kept, and published first",
                      **skipped, **repointed)
            return p.src / mine.name
        if best is None:
            self.emit("restore", pair=p.name, checkpoint=None, reason="no complete checkpoint on persistent storage",
                      **skipped)
            return None
        dest = p.src / best.name
        have = await _to_thread(snapshot, dest, within(best.name, p.exclude))
        stats = CopyResult()
        if not matches(have, best.snap):
            await _to_thread(p.src.mkdir, parents=True, exist_ok=True)
            staging = p.src / f"{STAGING_PREFIX}{best.name}"
            await _to_thread(_fsops.remove_ours, staging)
            exclude = within(best.name, p.exclude)
            if best.is_dir:
                stats += await self.backend.copy_tree(p.dst / best.name, staging, exclude=exclude, skip=best.markers)
                stats.bytes += await _to_thread(_fsops.copy_markers, p.dst / best.name, staging, best.markers, fsync=False)
                stats.files += len(best.markers)
            else:
                stats += await self.backend.copy_file(p.dst / best.name, staging)
            staged = await _to_thread(snapshot, staging, exclude)
            if not matches(staged, best.snap):
                await _to_thread(_fsops.remove_ours, staging)
                raise CopyError(f"restored copy of {best.name} does not match the persistent one")
            await _to_thread(_fsops.swap_in, staging, dest, is_dir=best.is_dir, fsync=False)
        links = await _to_thread(self._restore_pointers, listing, local, best)
        repointed = await _to_thread(self._repoint, listing, best)
        self.emit("restore", pair=p.name, checkpoint=best.name, source=p.dst / best.name, to=dest,
                  files=stats.files, bytes=stats.bytes, seconds=round(time.monotonic() - t0, 3),
                  copied=bool(stats.files), why=best.why, step=best.step, pointers=links, **skipped, **repointed)
        return dest

    def _repoint(self, listing: Listing, best: Entry) -> dict[str, Any]:
        """The profile's pointer (DeepSpeed ``latest``, Megatron's tracker) names a checkpoint
        that is not whole (torn: a late rank's shard missing) while ``best``, an older whole
        one, is restored: the local pointer is rewritten to name ``best``, or the training's
        own loader would follow it to the torn one and crash at every requeue."""
        prof = self.profile
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
        ``last.ckpt`` that is not the newest checkpoint comes back as a link to it (Lightning's
        own ``save_last="link"`` layout), so ``ckpt_path="last"`` resumes at the newest."""
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
        prof = self.profile
        if prof is not None and prof.links and not any(fnmatch.fnmatchcase(best.name, g) for g in prof.links):
            stale = [n for n in listing.entries if n != best.name and n not in done
                     and any(fnmatch.fnmatchcase(n, g) for g in prof.links)]
            for name in stale:
                if name not in local.entries and name not in local.pointers and not (p.src / name).is_symlink():
                    _fsops.write_link(p.src / name, best.name)
                    done.append(name)
        return done


def _complete_newest_first(listing: Listing) -> list[Entry]:
    """The complete entries of a pass, the newest name first (a stop wants the newest soonest)."""
    return [e for e in sorted(listing.entries.values(), key=lambda e: natural_key(e.name), reverse=True) if e.complete]


def _newest(listing: Listing, profile: Profile | None) -> Entry | None:
    """``newest_complete``; with Lightning, a complete ``last.ckpt`` written after the newest
    ``step=N`` file is the newest (Lightning saves it after the top-k ones)."""
    best = newest_complete(listing)
    if best is None or profile is None or not profile.links:
        return best
    lasts = [e for n, e in listing.entries.items() if e.complete and any(fnmatch.fnmatchcase(n, g) for g in profile.links)]
    written = lambda e: max(m for _, m in e.snap.files.values())  # noqa: E731 - mtimes: a copy's ctime is its copying
    later = [e for e in lasts if written(e) > written(best)]
    return max(later, key=written) if later else best


def _newer(a: Entry, b: Entry) -> bool:
    """Is local checkpoint ``a`` newer than persistent ``b``? The same name: a different,
    later-written version; otherwise the later step (or name)."""
    if a.name == b.name:
        return not matches(b.snap, a.snap) and a.snap.newest_ns > b.snap.newest_ns + 1_000_000_000
    return a.order[:3] > b.order[:3]


def _remove_local(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        os.unlink(path)
