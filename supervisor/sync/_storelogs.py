"""Log pairs whose persistent side is an object store: each log uploaded whole as it grows.

An object store has no append: a log that grew is uploaded again, whole, under its own key
(``<prefix>/<path>``), at most once every ``batch`` seconds while the training writes (a
flush, a request and the periodic net at once). A reader of the bucket (a TensorBoard
pointed at ``s3://…``) sees each file as it was at its last upload: new points arrive in
steps of that batch, never a torn file (each PUT is atomic). A local log that started over (a
requeue onto a new disk, a file reopened with ``"w"``: shorter, or other first or last bytes
than the object where it had them) first has the object copied to ``<path>.attempt-N`` (``log-restarted``), so every
attempt's log is kept. Rules: docs/sync.md, "Object stores".
"""

from __future__ import annotations

import os
import time
from typing import Callable

from supervisor.sync._backend import CopyResult
from supervisor.sync._complete import snapshot
from supervisor.sync._state import PairState, to_thread
from supervisor.sync._store import Store

EDGE = 4096  # bytes at each end compared to tell a continuation from a log that started over


class StoreLogs:
    """What one log pair has uploaded, and the pass that uploads what grew."""

    def __init__(self, state: PairState, store: Store, *, recheck: Callable[[float], None]) -> None:
        self.state = state
        self.store = store
        self.recheck = recheck
        self._sent: dict[str, tuple[int, int]] = {}     # log file → (size, mtime) uploaded
        self._ends: dict[str, tuple[bytes, bytes]] = {}  # log file → first and last bytes of its object
        self._objects: dict[str, int] | None = None     # key → size on the store, read once per attempt
        self._next = 0.0

    async def run(self, stats: CopyResult, trigger: str, *, batch: float) -> None:
        s, p = self.state, self.state.pair
        now = time.monotonic()
        if trigger in ("watch", "settle") and now < self._next:
            self.recheck(self._next)
            return
        snap = await to_thread(snapshot, p.src, p.exclude)
        files = dict(snap.files) if snap else {}
        grown = sorted(rel for rel, sig in files.items() if self._sent.get(rel) != sig)
        if self._objects is None:
            self._objects = {m["path"]: int(m["size"]) for m in await self.store.list("")}
        if grown and trigger in ("watch", "settle"):
            self._next = now + batch
        for rel in grown:
            stats += await self._upload(rel)
        s.pending = [f"{p.name}: {rel} ({sig[0] - self._sent.get(rel, (0, 0))[0]} bytes behind)"
                     for rel, sig in sorted(files.items()) if self._sent.get(rel) != sig]
        if grown:
            s.last_activity = time.monotonic()

    async def _upload(self, rel: str) -> CopyResult:
        p = self.state.pair
        path, key = p.src / rel, self.store.key(rel)
        try:
            st = await to_thread(os.stat, path)
        except FileNotFoundError:
            return CopyResult()  # rotated away: not a failure
        await self._keep_earlier(rel, key, path, st)
        ends = await to_thread(_ends, path, st.st_size)
        size, _digest = await self.store.put_file(path, key)
        assert self._objects is not None
        self._objects[key] = size
        self._ends[rel] = ends if size == st.st_size else await self._ends_there(key, size)
        self._sent[rel] = (st.st_size, st.st_mtime_ns)
        return CopyResult(files=1, bytes=size)

    async def _ends_there(self, key: str, size: int) -> tuple[bytes, bytes]:
        """The first and last ``EDGE`` bytes of the object (its size: ``size``)."""
        head = await self.store.head_bytes(key, min(EDGE, size))
        tail = await self.store.range_bytes(key, max(0, size - EDGE), size) if size > EDGE else head
        return head, tail

    async def _keep_earlier(self, rel: str, key: str, path: os.PathLike[str], st: os.stat_result) -> None:
        """The object is an earlier log, not what this file continues (shorter here, or other
        first or last bytes of the object's length): copied aside first."""
        assert self._objects is not None
        there = self._objects.get(key)
        if there is None:
            return
        if rel not in self._ends:
            self._ends[rel] = await self._ends_there(key, there)
        head, tail = self._ends[rel]
        if st.st_size >= there and await to_thread(_continues, path, there, head, tail):
            return
        k = 1
        while f"{key}.attempt-{k}" in self._objects:
            k += 1
        await self.store.copy(key, f"{key}.attempt-{k}")
        self._objects[f"{key}.attempt-{k}"] = there
        self.state.emit("log-restarted", pair=self.state.pair.name, file=rel, kept_as=f"{rel}.attempt-{k}",
                        why="the local file started over: the object is kept, not overwritten")


def _ends(path: os.PathLike[str], size: int) -> tuple[bytes, bytes]:
    with open(path, "rb") as f:
        head = f.read(min(EDGE, size))
        if size <= EDGE:
            return head, head
        f.seek(size - EDGE)
        return head, f.read(EDGE)


def _continues(path: os.PathLike[str], there: int, head: bytes, tail: bytes) -> bool:
    """Does the local file begin with the object's first bytes and hold its last ones where it
    had them (a log that grew, not one written again)?"""
    with open(path, "rb") as f:
        if f.read(len(head)) != head:
            return False
        f.seek(max(0, there - len(tail)))
        return f.read(len(tail)) == tail
