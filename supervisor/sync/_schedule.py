"""When one pair's passes run: triggers, the pass loop, the safety-net ticker, the watcher.

One pass per pair at a time (``lock``); triggers that arrive meanwhile set one flag and so
coalesce into exactly one more pass. After a failure, passes back off exponentially (capped)
except for urgent triggers, and for every trigger while a stop waits for its checkpoint
(``hurry``); the ticker fires the retry, the periodic net and the settle re-checks the passes
ask for (``recheck``). What a pass does is the engine's (``_pair.py``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import anyio
from watchfiles import awatch

from supervisor.sync._state import PairState, to_thread

# Triggers that go ahead even while backing off after a failure.
URGENT = ("start", "retry", "request", "flush", "appeared")
HURRY_RETRY_S = 1.0  # while a stop waits for its checkpoint, a failed pass is retried this soon at the latest
REPLACED_POLL = 1.0  # seconds between checks that the watched directory is still the same inode
WATCH_GAP = {"checkpoint": 0.05, "log": 1.0}  # gather a burst of file events into one pass


class Schedule:
    """The triggers of one pair and when they turn into passes."""

    def __init__(self, state: PairState, *, every: float, retry_base: float, retry_cap: float) -> None:
        self.state = state
        self.every = every
        self.retry_base, self.retry_cap = retry_base, retry_cap
        self.lock = anyio.Lock()
        self._wake = anyio.Event()
        self._reason: str | None = None
        self._resched = anyio.Event()
        self.next_periodic = time.monotonic() + self.every
        self.recheck_at: float | None = None   # a settling checkpoint's quiescence is due
        self.retry_at: float | None = None     # the ticker fires "retry" then
        self.backoff_until: float | None = None
        self.failures = 0
        self.hurried = False                   # a stop waits for its checkpoint: no trigger waits out the backoff
        self._dirty: set[str] = set()          # top-level names with file events since the last cheap scan

    def trigger(self, reason: str) -> None:
        """Ask for a pass; never blocks. A watch event never displaces a weightier reason."""
        if self._reason is None or self._reason == "watch":
            self._reason = reason
        self._wake.set()

    def recheck(self, at: float) -> None:
        """A pass wants another at ``at`` (``time.monotonic()``): a checkpoint settles then, or
        a log batch is due, a file beside the checkpoints may be published again. The
        earliest asked for stands: a later one never pushes back a due re-check."""
        if self.recheck_at is None or at < self.recheck_at:
            self.recheck_at = at
        self._resched.set()

    def failed(self) -> float:
        """A pass failed: back off (capped exponential); the ticker fires "retry" when it ends,
        or within ``HURRY_RETRY_S`` while hurried. Returns the delay."""
        self.failures += 1
        delay = min(self.retry_cap, self.retry_base * 2 ** (self.failures - 1))
        now = time.monotonic()
        self.backoff_until = self.retry_at = now + delay
        if self.hurried:
            self.retry_at = now + min(delay, HURRY_RETRY_S)
        self._resched.set()
        return delay

    def hurry(self, on: bool) -> None:
        """A stop waits for its checkpoint (``on``) or no longer does: while it waits, a watch
        event or a settle re-check during a failed pass's backoff runs a pass (a backoff of
        seconds was all a stop's checkpoint waited for, in chaos trials), and a failure is
        retried within ``HURRY_RETRY_S``."""
        self.hurried = on
        if on and self.retry_at is not None:
            self.retry_at = min(self.retry_at, time.monotonic() + HURRY_RETRY_S)
            self._resched.set()

    def succeeded(self) -> int:
        """A pass went through: the backoff ends. Returns how many failures came before it."""
        was = self.failures
        self.failures, self.backoff_until, self.retry_at = 0, None, None
        return was

    def wanted(self) -> bool:
        """Something waits for this pair while a pass runs: a trigger came (a file event, a
        request, a settle re-check) or a flush waits for the lock. A long pass over older
        checkpoints yields to it, so the newest is never kept waiting behind them."""
        return self._wake.is_set() or self.lock.statistics().tasks_waiting > 0

    def take_dirty(self) -> set[str]:
        """The top-level names file events touched since the last call (a cheap scan walks them)."""
        dirty, self._dirty = self._dirty, set()
        return dirty

    async def loop(self, run_pass: Callable[[str], Awaitable[Any]]) -> None:
        while True:
            await self._wake.wait()
            if self._reason == "watch":
                await anyio.sleep(WATCH_GAP[self.state.pair.kind])
            self._wake = anyio.Event()
            reason, self._reason = self._reason or "periodic", None
            if self.backoff_until is not None and time.monotonic() < self.backoff_until \
                    and not reason.startswith(URGENT) and not self.hurried:
                continue  # the ticker fires "retry" when the backoff ends
            async with self.lock:
                await run_pass(reason)

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
        pair, emit = self.state.pair, self.state.emit
        src = pair.src
        started = False
        quiet = 1.0
        while True:
            if not await to_thread(src.is_dir):
                if not started:
                    task_status.started()
                    started = True
                while not await to_thread(src.is_dir):
                    await anyio.sleep(1.0)
                emit("sync-source", pair=pair.name, path=src, action="appeared")
                self.trigger("appeared")
            if not started:
                task_status.started()
                started = True
            try:
                if await self._watch_once(src):
                    # Removed and made again (a new inode): the old watch sees nothing more.
                    emit("sync-source", pair=pair.name, path=src, action="replaced")
                    self.trigger("appeared")
                    continue
            except Exception as e:  # noqa: BLE001 - a watcher failure must not end supervision
                emit("sync-watch-failed", pair=pair.name, error=f"{type(e).__name__}: {e}", retry_in=quiet)
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
        inode = (await to_thread(os.stat, src)).st_ino

        async def same_directory() -> None:
            nonlocal replaced
            while True:
                await anyio.sleep(REPLACED_POLL)
                try:
                    now = (await to_thread(os.stat, src)).st_ino
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
                    self.state.last_activity = time.monotonic()
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
                self._dirty.add(path[len(root):].split("/", 1)[0])
