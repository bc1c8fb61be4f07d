"""The shared suspect-node list: a node that broke one job is left out of the project's next ones.

Opt-in (``suspect_nodes = "/project/shared/suspect-nodes.jsonl"``, docs/slurm.md "The shared
suspect-node list"). When an attempt finds its node suspect (a GPU fault, a failed health gate,
a hang: ``policy.exclude_node``), its stop appends one line to the list; every job of the
project reads the list at its start (journaled, with a warning when its own node is on it) and
again at its requeue, and adds the listed nodes to the requeued job's ``ExcNodeList`` beside its
own suspect node. Entries expire ``suspect_nodes_ttl`` after they were written (24 h by default).

Many jobs write at once: a line is appended with one ``write`` under ``flock`` on the file, and
a writer that finds the file replaced by a compaction (another inode at the path) reopens it.
The list is kept small: past ``COMPACT_BYTES`` a writer rewrites it (temp file, fsync, rename)
with only the newest unexpired entry per node.

The list is input from the file system, so it is not trusted: opened with ``O_NOFOLLOW`` (a
link is refused), only a regular file, not writable by everyone, at most ``MAX_BYTES``; each
line must be a JSON object with a plain node name (no Slurm hostlist syntax: ``,``, ``[``),
a time that is not in the future; what fails is ignored with one warning. At most
``MAX_EXCLUDE`` listed nodes (the newest) are excluded, so a list naming every node cannot make
a job unschedulable.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("supervise.suspects")

MAX_BYTES = 1024 * 1024  # a longer list is not one a project writes: ignored
COMPACT_BYTES = 256 * 1024  # past this, a writer keeps only the newest unexpired entry per node
MAX_EXCLUDE = 32  # listed nodes a requeue excludes at most (the newest)
MAX_WHY = 200
BOUND_S = 5.0  # the requeue step waits this long for the list at most (a hung shared file system)
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
FUTURE_SLACK = 300.0  # clocks differ between nodes; an entry further in the future is refused


@dataclass
class Entry:
    node: str
    t: float
    why: str
    job_id: str | None = None
    run_dir: str | None = None


@dataclass
class Listing:
    """What was read: the unexpired entries (newest per node, newest first) and what was not used."""

    entries: list[Entry] = field(default_factory=list)
    expired: int = 0
    bad: int = 0  # lines that were not a valid entry
    ignored: str | None = None  # why the whole file was ignored

    @property
    def nodes(self) -> list[str]:
        return [e.node for e in self.entries]


def _entry(line: str, now: float) -> Entry | None:
    try:
        d = json.loads(line)
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    node, t, why = d.get("node"), d.get("t"), d.get("why")
    if not isinstance(node, str) or not NODE_NAME.fullmatch(node):
        return None
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t > now + FUTURE_SLACK or t < 0:
        return None
    job, run = d.get("job_id"), d.get("run_dir")
    return Entry(node, float(t), (why if isinstance(why, str) else "?")[:MAX_WHY],
                 job if isinstance(job, str) else None, run if isinstance(run, str) else None)


def _open_checked(path: Path, flags: int) -> int:
    """An fd on ``path``, refused when it is a link, not a regular file, or writable by everyone."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_mode & stat.S_IWOTH:
            raise OSError(errno.EPERM, "writable by everyone, so anyone could exclude any node")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _why(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "it is a symbolic link (never followed)"
    return str(e.strerror or e)


def parse(text: str, now: float, ttl: float) -> Listing:
    out = Listing()
    newest: dict[str, Entry] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        e = _entry(line, now)
        if e is None:
            out.bad += 1
        elif now - e.t > ttl:
            out.expired += 1
        elif e.node not in newest or e.t > newest[e.node].t:
            newest[e.node] = e
    out.entries = sorted(newest.values(), key=lambda e: -e.t)
    return out


def read(path: Path, ttl: float, *, now: float | None = None) -> Listing:
    """The unexpired entries of the list; a missing list is an empty one, a bad one is ignored."""
    now = time.time() if now is None else now
    try:
        fd = _open_checked(path, os.O_RDONLY)
    except FileNotFoundError:
        return Listing()
    except OSError as e:
        return Listing(ignored=f"{path}: {_why(e)}")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        return Listing(ignored=f"{path}: larger than {MAX_BYTES // 1024} KiB, not a list a project writes")
    if b"\0" in data:
        return Listing(ignored=f"{path}: binary, not a list of JSON lines")
    return parse(data.decode("utf-8", "replace"), now, ttl)


def add(path: Path, entry: Entry, ttl: float) -> None:
    """Append ``entry`` under the list's lock; compact the list when it grew past ``COMPACT_BYTES``.
    Raises OSError (a link, a directory, no permission) for the caller to journal."""
    line = json.dumps({"v": 1, "node": entry.node, "t": round(entry.t, 3), "why": entry.why[:MAX_WHY],
                       "job_id": entry.job_id, "run_dir": entry.run_dir}, ensure_ascii=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(20):
        fd = _open_checked(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                here = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                continue
            mine = os.fstat(fd)
            if (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino):
                continue  # compacted (renamed over) since we opened it: append to the new one
            os.write(fd, line.encode())
            if mine.st_size + len(line) > COMPACT_BYTES:
                _compact(path, fd, ttl)
            os.fsync(fd)
            return
        finally:
            os.close(fd)  # closing drops the lock
    raise OSError(errno.EAGAIN, "the list kept being replaced while appending")


def _compact(path: Path, fd: int, ttl: float) -> None:
    """Under the lock: rewrite the list with the newest unexpired entry per node."""
    with open(path, "rb", opener=lambda p, fl: os.open(p, fl | os.O_NOFOLLOW)) as f:
        text = f.read(MAX_BYTES * 4).decode("utf-8", "replace")
    kept = parse(text, time.time(), ttl).entries
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for e in sorted(kept, key=lambda e: e.t):
            out.write(json.dumps({"v": 1, "node": e.node, "t": e.t, "why": e.why, "job_id": e.job_id,
                                  "run_dir": e.run_dir}) + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.chmod(tmp, stat.S_IMODE(os.fstat(fd).st_mode))
    os.replace(tmp, path)


# ----------------------------------------------------------------------- the agent's side

Emit = Callable[..., None]


def at_start(path: Path | None, ttl: float, node: str, emit: Emit) -> Listing | None:
    """Read the list at an attempt's start: journaled (``suspect-nodes``, ``action: read``); a
    warning when this node is on it (the allocation cannot change now; the requeue leaves it)."""
    if path is None:
        return None
    listing = read(path, ttl)
    _journal(emit, "read", path, listing, node, when="start")
    mine = next((e for e in listing.entries if e.node == node), None)
    if mine is not None:
        log.warning("this node, %s, is on the shared suspect-node list %s (%s, %s ago): a requeue will leave it out",
                    node, path, mine.why, _ago(mine.t))
    return listing


def on_requeue(path: Path | None, ttl: float, node: str, suspect: list[str], emit: Emit, *,
               job_id: str | None, run_dir: str) -> list[str]:
    """At the requeue step: add this node when the attempt found it suspect, then re-read the list
    (other jobs wrote meanwhile). Returns the listed nodes the requeued job must leave out."""
    if path is None:
        return []
    if suspect:
        try:
            add(path, Entry(node, time.time(), "; ".join(suspect), job_id, run_dir), ttl)
            emit("suspect-nodes", action="added", path=str(path), node=node, why="; ".join(suspect)[:MAX_WHY])
        except OSError as e:
            log.warning("could not add %s to the shared suspect-node list %s: %s", node, path, _why(e))
            emit("suspect-nodes", action="add-failed", path=str(path), node=node, error=_why(e))
    listing = read(path, ttl)
    _journal(emit, "read", path, listing, node, when="requeue")
    return listing.nodes[:MAX_EXCLUDE]


def _journal(emit: Emit, action: str, path: Path, listing: Listing, node: str, **extra: Any) -> None:
    if listing.ignored:
        log.warning("shared suspect-node list ignored: %s", listing.ignored)
    elif listing.bad:
        log.warning("shared suspect-node list %s: %d line(s) ignored (not a valid entry)", path, listing.bad)
    emit("suspect-nodes", action=action, path=str(path), nodes=listing.nodes[:MAX_EXCLUDE],
         listed=len(listing.entries), expired=listing.expired, bad_lines=listing.bad, ignored=listing.ignored,
         here=node in listing.nodes, **extra)


def _ago(t: float) -> str:
    s = max(0, int(time.time() - t))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
