"""Log passes for one pair: logs grow in place on the persistent side.

A TensorBoard or a person reading the persistent copy sees new lines as they come; a local
file that started over (a new inode, shorter, other bytes) never overwrites the longer
persistent copy, which is kept under another name first (``log-restarted``). The copier
decides that per file, on the file it copies (``_pycopy.grow``): a decision made before the
copy let a log that appeared in between grow over the earlier attempt's (issue 30). Failures raise to the engine
(``_pair.py``), which backs off.
"""

from __future__ import annotations

import time
from typing import Callable

from supervisor.sync import _fsops
from supervisor.sync._backend import CopyResult, GrowResult
from supervisor.sync._complete import snapshot
from supervisor.sync._state import PairState, to_thread


class LogPass:
    """What one log pair has copied, and the pass that copies what grew.

    ``recheck(at)`` asks the schedule for another pass then (a batch skipped for now)."""

    def __init__(self, state: PairState, *, recheck: Callable[[float], None]) -> None:
        self.state = state
        self.recheck = recheck
        self._copied: dict[str, tuple[int, int]] = {}  # log file → (size, mtime) copied
        self._next = 0.0                               # monotonic time before which watch passes wait
        self._inodes: dict[str, int] = {}              # log file → local inode at the last pass

    async def run(self, stats: CopyResult, trigger: str, *, batch: float) -> None:
        """Logs grow in place. A file event copies only the files whose size or mtime changed
        since they were last copied, at most every ``batch`` s (the ticker comes back for what
        a skipped event left); every other trigger (start, flush, request, the periodic net)
        compares the whole tree with the persistent side, as rsync does, and at once."""
        s = self.state
        p = s.pair
        now = time.monotonic()
        if trigger in ("watch", "settle") and now < self._next:
            self.recheck(self._next)
            return
        snap = await to_thread(snapshot, p.src, p.exclude)
        files = dict(snap.files) if snap else {}
        if trigger in ("watch", "settle"):
            grown = sorted(rel for rel, sig in files.items() if self._copied.get(rel) != sig)
            if not grown:
                return
            self._next = now + batch
            r = await s.backend.grow(p.src, p.dst, exclude=p.exclude, fsync=p.fsync, only=grown, inodes=self._inodes)
            self._copied.update((rel, files[rel]) for rel in grown)
            s.pending = []
        else:
            r = await s.backend.grow(p.src, p.dst, exclude=p.exclude, fsync=p.fsync, inodes=self._inodes)
            self._copied = files
            behind = await to_thread(_fsops.log_lag, p.src, p.dst, p.exclude)
            s.pending = [f"{p.name}: {b}" for b in behind]
        self._kept(r)
        stats += r
        if r.files:
            s.last_activity = time.monotonic()

    def _kept(self, r: GrowResult) -> None:
        """The inodes the copier saw, for the next pass; each log it set aside, journaled."""
        self._inodes.update(r.inodes)
        for rel, kept_as in r.restarted:
            self.state.emit("log-restarted", pair=self.state.pair.name, file=rel, kept_as=kept_as,
                            why="the local file started over: the persistent copy is kept, not overwritten")
