"""One sync pair: what its local side shows, composed with the jobs that act on it.

A pass is the unit of work: scan (in a thread), copy what is complete through a staging
name, check nothing changed while copying, rename into place, then pointers. The engine is
split by job, each in its own module and given what it shares explicitly (``_state.py``):
when passes run (``_schedule.py``: triggers, one pass at a time, coalescing, backoff, the
watcher), checkpoint publishing (``_publish.py``), log passes (``_logs.py``) and restore
(``_restore.py``). Where the pair is mirrored from (one node, or node 0 or node K of a
per-node pair) is the engine's role (``_roles.py``): it builds the publisher, adds its
watchers, shapes the scan and runs the restore; the engine asks it and never tells roles
apart. What the persistent side is (a directory, an object store) is chosen once, here
(``storage_for``): every job is given its side (``_side.py``) and never asks which kind it is. The engine itself keeps the local side's listing and profile and turns a pass's
failure into a journal line and a retry with capped exponential backoff: failures never leave
this module (docs/design.md, invariant 4).
"""

from __future__ import annotations

import errno as _errno
import os
import time
from functools import partial
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

import anyio

from supervisor import stacks
from supervisor.config import SyncPair
from supervisor.journal import Emit
from supervisor.sync._backend import Backend, CopyError, CopyResult
from supervisor.sync._complete import Context, Listing, Snap, classify
from supervisor.sync._dirside import Directory
from supervisor.sync._profiles import GENERIC, Profile, torn_file
from supervisor.sync._restore import Restorer
from supervisor.sync._roles import Role, Single
from supervisor.sync import _stall
from supervisor.sync._schedule import Schedule
from supervisor.sync._side import Storage
from supervisor.sync._state import PairState, to_thread
from supervisor.sync._writers import open_for_write

LOG_BATCH = 10.0  # s: while logs are written, a log pair copies what grew at most this often


def storage_for(state: PairState, *, rescan: Callable[[str], Listing], judge: Callable[[Path], Listing]) -> Storage:
    """The one place a pair's persistent storage is chosen: an object store for ``to =
    "s3://…"`` (``_storeroles.ObjectStore``), else a directory (``_dirside.Directory``). Every
    job of the pair is given its sides by it, and none asks which kind it is."""
    if state.pair.store is None:
        return Directory(state, rescan=rescan, judge=judge)
    from supervisor.sync._storeroles import ObjectStore  # a store's modules only where a pair has one (issue 44)

    return ObjectStore(state, open_store(state.pair), rescan=rescan)


def open_store(pair: SyncPair) -> Any:
    """The client of a pair's object store; None when the s3 extra (obstore) is not
    installed, or the store is refused, which ``Mirror.check`` says before anything starts."""
    try:
        from supervisor.sync._store import Store, StoreError
    except ImportError:
        return None
    try:
        return Store(pair.store)
    except (ImportError, StoreError):
        return None  # Mirror.check says why, in one line


class PairEngine:
    """One pair on this node: its listing and profile, composed with its role, its schedule,
    its checkpoint publisher (the role's) or log pass, and its restorer. ``writers``: the
    training's processes on this node (None: not visible); ``ours``: what this run directory
    published in earlier attempts (``Publisher``)."""

    def __init__(self, pair: SyncPair, backend: Backend, emit: Emit, *, every: float,
                 retry_base: float, retry_cap: float, on_publish: Callable[..., None],
                 writers: Callable[[], set[int]] | None = None, ours: set[str] | None = None,
                 role: Role | None = None) -> None:
        self.pair = pair
        self.emit = emit
        self.state = PairState(pair, backend, emit)
        self.role: Role = role if role is not None else Single()
        self.writers = writers
        self.writers_seen = False              # the training's processes were found here (writer_view)
        self.exited = False                    # the training's whole tree is gone: nothing can change
        self.marker_seen = False
        self._inodes: dict[str, int] = {}      # top-level name → inode at the last scan (renames)
        self._moved: set[str] = set()          # walked last and found other than its known snapshot
        self._torn_cache: dict[tuple[str, Any], str | None] = {}
        self._told_generic = False
        self._newest_ns = 0
        self.schedule = Schedule(self.state, every=pair.every or every, retry_base=retry_base, retry_cap=retry_cap)
        self.storage = storage_for(self.state, rescan=self.rescan, judge=self._judge_side)
        self.publisher = self.role.compose(self, on_publish=on_publish, ours=ours)
        self.logs = self.storage.logs(self.schedule.recheck)
        self.restorer = Restorer(self.state, self.storage.restore(), judge=self._judge_side, adopt_profile=self.adopt_profile)

    # ---- what the mirror reads ------------------------------------------------------

    @property
    def profile(self) -> Profile | None:
        return self.state.profile

    @property
    def pending(self) -> list[str]:
        """What is not yet durable, one line each."""
        return self.state.pending

    @property
    def last_activity(self) -> float | None:
        return self.state.last_activity

    @property
    def lock(self) -> anyio.Lock:
        """Held for the whole of each pass: one at a time per pair."""
        return self.schedule.lock

    # ---- triggers (the schedule's) --------------------------------------------------

    def trigger(self, reason: str) -> None:
        self.schedule.trigger(reason)

    def hurry(self, on: bool) -> None:
        """A stop waits for its checkpoint: no trigger waits out a failed pass's backoff."""
        self.schedule.hurry(on)

    async def loop(self) -> None:
        await self.schedule.loop(self.run_pass)

    async def ticker(self) -> None:
        await self.schedule.ticker()

    async def watch(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self.schedule.watch(task_status=task_status)

    def tasks(self) -> list[Callable[[], Awaitable[None]]]:
        """What runs beside the watcher until cancelled: the pass loop, the ticker, the stall
        watch of the persistent side, the role's watchers."""
        return [self.loop, self.ticker, partial(_stall.watch, self.state.progress, self.pair.name, self.emit),
                *self.role.watchers()]

    def reusable(self, known: dict[str, Any]) -> dict[str, Any]:
        """Snapshots a cheap scan may trust: unchanged top-level stat, no file event inside, and
        the last walk found that very snapshot. A file rewritten in place leaves the directory's
        stat as it was; its event makes one scan walk it, and the next ones too while what they
        find is not the known snapshot (a new version not yet published): trusted again, they
        would read the old version back (node K's part of a directory reused, complete on node
        0's word in a ``parts`` pass, taken for the one published before, never staged)."""
        dirty, sigs = self.schedule.take_dirty(), self.state.sigs
        return {n: (sigs[n], snap) for n, snap in known.items() if n in sigs and n not in dirty and n not in self._moved}

    def _note_moved(self, listing: Listing, known: Mapping[str, Any]) -> None:
        """After a scan of the local side: which names it found other than their known snapshot."""
        for n, e in listing.entries.items():
            k = known.get(n)
            if k is not None and k is not e.snap and not k.same_content(e.snap):
                self._moved.add(n)
            else:
                self._moved.discard(n)

    # ---- one pass -------------------------------------------------------------------

    async def run_pass(self, trigger: str) -> dict[str, Any]:
        """Sync this pair once; return what happened. Only cancellation escapes. What it does on
        the persistent side is this pair's (``_stall.tracking``), watched for stalls."""
        with _stall.tracking(self.state.progress):
            return await self._run_pass(trigger)

    async def _run_pass(self, trigger: str) -> dict[str, Any]:
        t0 = time.monotonic()
        stats = CopyResult()
        published: list[str] = []
        try:
            if not await to_thread(self.pair.src.is_dir):
                self.state.pending = [f"{self.pair.name}: local side {self.pair.src} does not exist"]
                return {"ok": True, "files": 0, "bytes": 0, "published": [], "seconds": 0.0}
            await self.storage.prepare()
            if self.pair.kind == "checkpoint":
                listing = await self._pass_listing(trigger)
                await self.publisher.run(listing, trigger, stats, published)
            else:
                await self.logs.run(stats, trigger, batch=LOG_BATCH)
        except (OSError, CopyError) as e:
            return self._failed(trigger, e, time.monotonic() - t0)
        seconds = round(time.monotonic() - t0, 3)
        failures = self.schedule.succeeded()
        if failures:
            self.emit("sync-recovered", pair=self.pair.name, after_failures=failures)
        if stats.files or published or not trigger.startswith(("watch", "periodic", "settle", "parts")):
            self.emit("sync", pair=self.pair.name, trigger=trigger, files=stats.files, bytes=stats.bytes,
                      seconds=seconds, published=published, backend=self.storage.backend)
        return {"ok": True, "files": stats.files, "bytes": stats.bytes, "published": published, "seconds": seconds}

    async def note_owed(self) -> None:
        """A flush cut short before its pass finished (a hung object store, a copier stuck in
        the kernel): ``pending`` from the local side as it is now, so the end names a
        checkpoint that never landed rather than what the last finished pass left there."""
        if self.pair.kind != "checkpoint" or not await to_thread(self.pair.src.is_dir):
            return
        listing: Listing = await to_thread(lambda: self.scan(pids=self._pids()))
        self.publisher.owed(listing)
        self.state.pending.append(f"{self.pair.name}: the last pass did not finish in the time left")

    def _failed(self, trigger: str, e: Exception, seconds: float) -> dict[str, Any]:
        delay = self.schedule.failed()
        code = getattr(e, "code", None) or (_errno.errorcode.get(e.errno) if isinstance(e, OSError) and e.errno else None)
        self.emit("sync-failed", pair=self.pair.name, trigger=trigger, error=str(e), errno=code,
                  failures=self.schedule.failures, retry_in=round(delay, 3), seconds=round(seconds, 3))
        self.state.pending = [p for p in self.state.pending if "last sync failed" not in p] + \
            [f"{self.pair.name}: last sync failed ({e})"]
        return {"ok": False, "error": str(e), "errno": code, "files": 0, "bytes": 0, "published": [],
                "seconds": round(seconds, 3)}

    async def _pass_listing(self, trigger: str) -> Listing:
        """The local side for a checkpoint pass. Watch events fire many times a second while a
        checkpoint is written (and a per-node pair's parts watch often): those passes trust
        unchanged top-level stats of published checkpoints; every other pass walks all."""
        listing: Listing = await to_thread(lambda: self.scan(cheap=trigger in ("watch", "parts"), pids=self._pids()))
        self.take_listing(listing)
        await self.role.listed(listing)
        return listing

    def _pids(self) -> set[int] | None:
        pids = self.writers() if self.writers is not None else None
        self.writers_seen = self.writers_seen or bool(pids)
        return pids

    def rescan(self, name: str) -> Listing:
        """The local side's ``name`` alone, judged now (after copying it). Blocking."""
        return self.scan(only=name, pids=self._pids())

    def _judge_side(self, root: Path) -> Listing:
        """A side as finished: nothing writes it before the spawn (restore). Blocking."""
        return self.scan(root=root, settle=0.0, finished=True)

    def scan(self, *, root: Path | None = None, only: str | None = None, settle: float | None = None,
             cheap: bool = False, pids: set[int] | None = None, finished: bool = False) -> Listing:
        """Classify the local side (or ``root``). ``pids``: the training's processes, whose
        open files are the evidence; ``finished``: judge as if nothing can change any more
        (the training is gone, or ``root`` is a side nobody writes)."""
        p, role = self.pair, self.role
        known = role.reusable(self.state.published)
        reuse = self.reusable(known) if cheap else None
        local = root is None
        settle = p.settle if settle is None else settle
        exited = finished or (local and self.exited)
        writing = None
        # none found by a node agent is nothing known of them; none in our own tree is no training
        if local and pids is not None and (pids or role.owns_writers) and not self.exited:
            writing = open_for_write(pids, os.path.realpath(p.src))
        saving = partial(stacks.inside, set(pids)) if writing is not None and pids else None
        ctx = Context(profile=self.rules(local), writing=writing, exited=exited,
                      inodes=self._inodes if local else {}, torn_check=self._torn_check, saving=saving)
        listing = classify(root or p.src, markers=p.markers, exclude=p.exclude, settle=settle, now=time.time(),
                           marker_seen=self.marker_seen if local and role.marker_here else False, only=only,
                           reuse=reuse, ctx=ctx)
        if local:
            self._note_moved(listing, known)
        role.judged(listing, settle=settle, finished=exited, whole_local=local and only is None)
        if local and only is None and role.keeps_inodes(cheap):
            self._inodes = {n: sig[0] for n, sig in listing.sigs.items()}
        return listing

    def rules(self, local: bool) -> Profile | None:
        """The profile a side is judged by (the role's, from the pair's); None while a guess
        (``torch-save`` under ``auto``) may still give way to what the listing shows."""
        provisional = self.profile is not None and self.profile.name == "torch-save" and self.pair.profile == "auto"
        return self.role.rules(None if provisional else self.profile, local)

    def in_progress(self) -> set[tuple[str, int]]:
        """(name, inode) of each checkpoint being written now: none of them can answer a
        request made now (policy.started_after_request). Blocking: scans the local side."""
        listing = self.scan(pids=self._pids())
        return {(n, listing.sigs[n][0]) for n, e in listing.entries.items() if not e.complete and n in listing.sigs}

    def _torn_check(self, path: Path, snap: Snap) -> str | None:
        """``torn_file``, once per file version (it reads the file's tail)."""
        key = (str(path), tuple(snap.files.values()))
        if key not in self._torn_cache:
            if len(self._torn_cache) > 4096:
                self._torn_cache.clear()
            self._torn_cache[key] = torn_file(str(path))
        return self._torn_cache[key]

    def take_listing(self, listing: Listing) -> None:
        """A local pass's listing: the marker seen, the profile it shows, the last local change."""
        self.marker_seen = listing.marker_seen
        self.adopt_profile(listing, "local")
        newest = max((e.snap.newest_ns for e in listing.entries.values()), default=0)
        if newest != self._newest_ns:
            self._newest_ns = newest
            self.state.last_activity = time.monotonic()

    def adopt_profile(self, listing: Listing, where: str) -> None:
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
        self.state.profile = listing.profile
        self.emit("sync-profile", pair=self.pair.name, profile=listing.profile.name, evidence=listing.evidence,
                  where=where, writers=self.writer_view(), quiescence=self.relies_on_quiescence())

    def writer_view(self) -> str:
        """Our own child tree is visible; a node agent's are once it found the job's processes here."""
        return "visible" if self.writers is not None and (self.role.owns_writers or self.writers_seen) else "unseen"

    def relies_on_quiescence(self, profile: Profile | None = None) -> bool:
        """True when nothing but a quiet period can say a checkpoint is complete here."""
        prof = profile or self.profile
        if self.pair.markers or (prof is not None and (prof.markers or prof.name in ("deepspeed", "megatron", "orbax"))):
            return False
        if prof is not None and prof.is_dir is False:
            return self.writer_view() == "unseen"
        return True

    def training_exited(self) -> None:
        """The training's whole tree is gone: every later pass judges without waiting."""
        self.exited = True

