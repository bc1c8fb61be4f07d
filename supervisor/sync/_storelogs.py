"""Log pairs whose persistent side is an object store: each log a sequence of objects, each
upload only the bytes that grew.

An object store has no append, and a log uploaded whole at each step costs the sum of its
sizes: an event file that grows to 1 GB over a day, uploaded every 10 s, is terabytes. So a
log is laid out in the bucket as its segments, in order, each written once and never again:

    <path>                        the bytes of its first upload
    <path>.seg-00000001           the bytes that grew before the second upload
    <path>.seg-00000002 …         and so on (8 digits: name order is upload order)
    <path>.attempt-N[.seg-…]      an earlier attempt's log, kept the same way (below)

**The whole log is ``<path>`` followed by its ``.seg-*`` objects in the order of their names**:
that is what a user concatenates (``aws s3 cp --recursive``, then ``cat <path> <path>.seg-*``)
and what ``supervise`` reads back (its size is the sum, its first bytes the first object's,
its last bytes the last one's). Each upload happens at most once every ``batch`` seconds while
the training writes (a flush, a request and the periodic net at once) and sends what grew
since the last one, so the client sends each byte once, plus one request per upload
(``bench/s3_logs.py``).

A TensorBoard event file (a name with ``tfevents``) is cut at the last whole TFRecord record
(``_tfrecord.py``): each of its objects is then an event file of its own, every name holds
``tfevents``, and TensorBoard reads the event files of one directory as one run, in name order,
never going back to an earlier one; the record being written waits for the next upload, except
in the stop's last pass, which sends every byte there is. Any other log is cut where its bytes
end. The price is one object per upload (4 320 for 12 h of writing): TensorBoard reading
``s3://`` itself opens each (measured: about 0.15 s an object), so a long run is better read
from a copy (``aws s3 sync`` fetches only the objects it lacks, where a log uploaded whole
was fetched whole again at each change).

A local log that started over (a requeue onto a new disk, a file reopened with ``"w"``:
shorter than what is there, or other first or last bytes where those objects had them) first
has its objects copied, on the server, to ``<path>.attempt-N`` and ``<path>.attempt-N.seg-…``
(``log-restarted``), and removed, so every attempt's log is kept and the new one starts at
``<path>``. Rules: docs/sync.md, "Object stores".
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable

from supervisor.sync._backend import CopyResult
from supervisor.sync._complete import snapshot
from supervisor.sync._state import PairState, to_thread
from supervisor.sync._store import Store
from supervisor.sync._tfrecord import is_event_file, whole_records

EDGE = 4096  # bytes at each end compared to tell a continuation from a log that started over
SEG = re.compile(r"\.seg-(\d{8})$")
FINAL = "flush:final"  # the stop's last pass: the training is gone, every byte goes up


def segment_key(key: str, n: int) -> str:
    """The object of a log's ``n``-th upload (0: the log's own key)."""
    return key if n == 0 else f"{key}.seg-{n:08d}"


def segments(objects: dict[str, int], key: str) -> list[tuple[str, int]]:
    """The objects that make up the log at ``key``, in order, with their sizes (empty: none).
    Segments without the first object are no log (a removal cut short): none."""
    if key not in objects:
        return []
    return [(key, objects[key])] + [(k, objects[k]) for k in _segment_keys(objects, key)]


def _segment_keys(objects: dict[str, int], key: str) -> list[str]:
    """The ``.seg-NNNNNNNN`` objects of the log at ``key``, in order (its first object aside)."""
    return sorted(k for k in objects if k[:-13] == key and SEG.search(k))


@dataclass
class Log:
    """What is in the bucket of one log: its objects in order, and its first and last bytes."""

    parts: list[tuple[str, int]] = field(default_factory=list)
    head: bytes = b""
    tail: bytes = b""

    @property
    def size(self) -> int:
        return sum(n for _k, n in self.parts)


class StoreLogs:
    """What one log pair has uploaded, and the pass that uploads what grew."""

    def __init__(self, state: PairState, store: Store, *, recheck: Callable[[float], None]) -> None:
        self.state = state
        self.store = store
        self.recheck = recheck
        self._sent: dict[str, tuple[int, int]] = {}     # log file → (size, mtime) at its last upload
        self._logs: dict[str, Log] = {}                  # log file → what the bucket holds of it
        self._unframed: set[str] = set()                 # event-file names whose bytes are not TFRecord
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
        final = trigger == FINAL  # and a record held back before is sent now, though the file did not change
        grown = sorted(rel for rel, sig in files.items()
                       if self._sent.get(rel) != sig or (final and sig[0] != self._there(rel)))
        if self._objects is None:
            self._objects = {m["path"]: int(m["size"]) for m in await self.store.list("")}
        if grown and trigger in ("watch", "settle"):
            self._next = now + batch
        for rel in grown:
            stats += await self._upload(rel, final=final)
        s.pending = [f"{p.name}: {rel} ({sig[0] - self._there(rel)} bytes behind)"
                     for rel, sig in sorted(files.items()) if sig[0] != self._there(rel)]
        if grown:
            s.last_activity = time.monotonic()

    def _there(self, rel: str) -> int:
        log = self._logs.get(rel)
        return log.size if log is not None else 0

    async def _upload(self, rel: str, *, final: bool) -> CopyResult:
        """What grew of one log since its last upload, as its next object."""
        path, key = self.state.pair.src / rel, self.store.key(rel)
        try:
            st = await to_thread(os.stat, path)
        except FileNotFoundError:
            return CopyResult()  # rotated away: not a failure
        log = await self._log(rel, key)
        if log.parts and not (st.st_size >= log.size and await to_thread(_continues, path, log.size, log.head, log.tail)):
            await self._keep_earlier(rel, key, log)
            log = self._logs[rel] = Log()
        start, end = log.size, st.st_size
        if is_event_file(rel) and rel not in self._unframed and not final:
            cut = await to_thread(whole_records, path, start, end)
            if cut is None:
                self._unframed.add(rel)
            else:
                end = cut
        if end <= start and (log.parts or st.st_size):
            self._sent[rel] = (st.st_size, st.st_mtime_ns)
            return CopyResult()  # a record still being written: the next upload takes it
        part = segment_key(key, len(log.parts))
        sent = await self.store.put_range(path, part, start, end)
        assert self._objects is not None
        self._objects[part] = sent
        log.parts.append((part, sent))
        log.head, log.tail = await to_thread(_ends, path, end)
        self._sent[rel] = (st.st_size, st.st_mtime_ns)
        return CopyResult(files=1, bytes=sent)

    async def _log(self, rel: str, key: str) -> Log:
        """What the bucket holds of ``rel``: known from this attempt's uploads, else from the
        listing and its first and last objects' ends (a requeue continuing a log)."""
        log = self._logs.get(rel)
        if log is None:
            assert self._objects is not None
            parts = segments(self._objects, key)
            log = Log(parts)
            if not parts:
                await self._drop_strays(key)
            else:
                first, n = parts[0]
                log.head = await self.store.head_bytes(first, min(EDGE, n))
                last, m = parts[-1]
                log.tail = await self.store.range_bytes(last, max(0, m - EDGE), m) if m else b""
            self._logs[rel] = log
        return log

    async def _drop_strays(self, key: str) -> None:
        """Segments whose first object is gone (a removal cut short) belong to no log: removed
        before the log at ``key`` starts again, or a reader would take them as its continuation."""
        assert self._objects is not None
        strays = _segment_keys(self._objects, key)
        await self.store.delete(strays)
        for k in strays:
            del self._objects[k]

    async def _keep_earlier(self, rel: str, key: str, log: Log) -> None:
        """The objects are an earlier log, not what this file continues: copied, on the
        server, to the first free ``.attempt-N`` name, then removed."""
        assert self._objects is not None
        k = 1
        while f"{key}.attempt-{k}" in self._objects:
            k += 1
        aside = f"{key}.attempt-{k}"
        for n, (part, size) in enumerate(log.parts):
            await self.store.copy(part, segment_key(aside, n))
            self._objects[segment_key(aside, n)] = size
        await self.store.delete([part for part, _size in reversed(log.parts)])
        for part, _size in log.parts:
            self._objects.pop(part, None)
        self.state.emit("log-restarted", pair=self.state.pair.name, file=rel, kept_as=f"{rel}.attempt-{k}",
                        why="the local file started over: the objects are kept, not overwritten")


def _ends(path: os.PathLike[str], size: int) -> tuple[bytes, bytes]:
    """The first and last ``EDGE`` bytes of the file's first ``size`` bytes."""
    with open(path, "rb") as f:
        head = f.read(min(EDGE, size))
        f.seek(max(0, size - EDGE))
        return head, f.read(min(EDGE, size))


def _continues(path: os.PathLike[str], there: int, head: bytes, tail: bytes) -> bool:
    """Does the local file begin with the log's first bytes and hold its last ones where it
    had them (a log that grew, not one written again)?"""
    with open(path, "rb") as f:
        if f.read(len(head)) != head:
            return False
        f.seek(max(0, there - len(tail)))
        return f.read(len(tail)) == tail
