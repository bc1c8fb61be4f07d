"""What is a checkpoint, and is it complete? Pure functions over a directory listing.

Everything here does blocking I/O (``os.scandir``, ``stat``) and is called through
``anyio.to_thread.run_sync`` by the pair engine (invariant 6). The rules are in docs/sync.md:

* each top-level entry of the local checkpoint directory (a directory such as ``step_100/``
  or a single file such as ``model_100.pt``) is one checkpoint;
* top-level pointer files (DeepSpeed ``latest``, Megatron ``latest_checkpointed_iteration.txt``)
  are not checkpoints: they name one, and land after it;
* hidden names, temp names and Orbax's ``*.orbax-checkpoint-tmp*`` are work in progress;
* a directory is complete when a marker says so (``.metadata``, ``commit_success.txt``, Orbax
  metadata in a renamed directory, the user's globs), when a pointer names it or a newer
  sibling of the same shape, or, in a pair that has never shown a marker, when nothing in it
  changed for the settle time;
* a single file is complete when it was renamed into place (ctime after mtime) or settled.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

STAGING_PREFIX = ".supervise-staging-"
PARTIAL_DIR = ".supervise-partial"
OURS_PREFIX = ".supervise-"

# Pointer files at the top of a checkpoint directory: they name the newest complete one.
POINTER_FILES = ("latest", "latest_checkpointed_iteration.txt")
# Files inside a checkpoint directory whose presence says the directory is complete.
INSIDE_MARKERS = (".metadata", "commit_success.txt")
# Orbax writes these inside the temporary directory and renames it into place when done.
ORBAX_RENAMED = ("_CHECKPOINT_METADATA", "orbax.checkpoint")
# Top-level names that are someone's work in progress, never a checkpoint.
TEMP_GLOBS = (".*", "*.tmp", "*.temp", "*.part", "*.partial", "*.incomplete", "*~",
              "*.orbax-checkpoint-tmp*", "*.lock")

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """``step_9`` < ``step_10``: digits compare as numbers, so "newest" means the highest step."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in _DIGITS.split(name) if p)


def shape(name: str) -> str:
    """``global_step200`` → ``global_step#``: siblings of one series share a shape."""
    return _DIGITS.sub("#", name)


def excluded(rel: str, patterns: Iterable[str]) -> bool:
    """rsync-like matching for simple patterns: a pattern with ``/`` matches the relative
    path, one without matches any path component's name."""
    name = rel.rsplit("/", 1)[-1]
    for p in patterns:
        p = p.rstrip("/")
        if "/" in p:
            if fnmatch.fnmatchcase(rel, p.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(name, p) or any(fnmatch.fnmatchcase(part, p) for part in rel.split("/")[:-1]):
            return True
    return False


def is_temp(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in TEMP_GLOBS)


@dataclass(frozen=True)
class Snap:
    """Sizes and mtimes of every file in one checkpoint; ``""`` is the entry itself for a file."""

    files: Mapping[str, tuple[int, int]]
    newest_ns: int  # max of mtime and ctime over files and directories: the last change
    bytes: int

    def same_content(self, other: "Snap") -> bool:
        return dict(self.files) == dict(other.files)


def snapshot(path: Path, exclude: Iterable[str] = ()) -> Snap | None:
    """Stat every file under ``path`` (or ``path`` itself when it is a file). None if it vanished."""
    exclude = tuple(exclude)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return Snap({"": (st.st_size, st.st_mtime_ns)}, max(st.st_mtime_ns, st.st_ctime_ns), st.st_size)
    files: dict[str, tuple[int, int]] = {}
    newest = max(st.st_mtime_ns, st.st_ctime_ns)
    total = 0
    stack = [("", str(path))]
    while stack:
        rel, full = stack.pop()
        try:
            it = os.scandir(full)
        except (FileNotFoundError, NotADirectoryError):
            if not rel:
                return None
            continue
        prefix = rel + "/" if rel else ""
        with it:  # the hot loop of every pass: kept lean (20 000 files ≈ 0.1 s)
            for e in it:
                name = e.name
                r = prefix + name
                if name == PARTIAL_DIR or (exclude and excluded(r, exclude)):
                    continue
                try:
                    s = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                m, c = s.st_mtime_ns, s.st_ctime_ns
                if m > newest:
                    newest = m
                if c > newest:
                    newest = c
                if e.is_dir(follow_symlinks=False):
                    stack.append((r, e.path))
                else:
                    size = s.st_size
                    files[r] = (size, m)
                    total += size
    return Snap(files, newest, total)


@dataclass
class Entry:
    """One top-level checkpoint and the verdict on it."""

    name: str
    is_dir: bool
    snap: Snap
    complete: bool
    why: str                        # "marker .metadata", "pointer latest", "settled", "waiting for marker", ...
    done_at: float | None = None    # wall time it became complete (marker mtime ...): the lag's start
    markers: tuple[str, ...] = ()   # files inside that land last
    ready_at: float | None = None   # wall time quiescence would be reached, to schedule a re-check


@dataclass
class Pointer:
    name: str
    content: bytes
    mtime_ns: int
    target: str | None


Sig = tuple[int, int, int]  # (inode, mtime_ns, ctime_ns) of a top-level entry


@dataclass
class Listing:
    entries: dict[str, Entry] = field(default_factory=dict)
    pointers: dict[str, Pointer] = field(default_factory=dict)
    marker_seen: bool = False  # a built-in marker or pointer exists: quiescence is off for directories
    sigs: dict[str, Sig] = field(default_factory=dict)


def pointer_target(name: str, content: bytes, names: Iterable[str]) -> str | None:
    """The entry a pointer file names, if it exists in ``names``."""
    text = content.decode("utf-8", errors="replace").strip()
    names = set(names)
    if name == "latest_checkpointed_iteration.txt":
        cand = f"iter_{int(text):07d}" if text.isdigit() else text
    else:
        cand = text
    return cand if cand in names else None


def _marker_files(snap: Snap, globs: tuple[str, ...]) -> list[str]:
    out = []
    for rel in snap.files:
        base = rel.rsplit("/", 1)[-1]
        if rel in INSIDE_MARKERS or any(fnmatch.fnmatchcase(rel, g) or fnmatch.fnmatchcase(base, g) for g in globs):
            out.append(rel)
    return out


def classify(root: Path, *, markers: tuple[str, ...] = (), exclude: tuple[str, ...] = (),
             settle: float = 5.0, now: float, marker_seen: bool = False,
             only: str | None = None, reuse: Mapping[str, tuple[Sig, Snap]] | None = None) -> Listing:
    """List ``root`` and decide, for each top-level entry, whether it is a complete checkpoint.

    ``marker_seen`` carries over from earlier scans: once a pair has shown a marker, a
    directory without one is never taken for complete just because it went quiet (a slow
    writer pausing is not a finished checkpoint). ``only`` re-checks one entry (after a copy)
    but still reads the pointers, since they decide it. ``reuse`` holds snapshots of
    published checkpoints: one whose top-level stat is unchanged is not walked again (a
    watch-triggered pass then costs one stat per old checkpoint, not one per file).
    """
    out = Listing(marker_seen=marker_seen or bool(markers))
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return out
    candidates: list[str] = []
    for name in names:
        if name in POINTER_FILES:
            try:
                with open(root / name, "rb") as f:
                    content = f.read(4096)
                st = os.stat(root / name)
            except (FileNotFoundError, IsADirectoryError):
                continue
            out.pointers[name] = Pointer(name, content, st.st_mtime_ns, None)
            out.marker_seen = True
        elif not is_temp(name) and not excluded(name, exclude):
            candidates.append(name)
    for p in out.pointers.values():
        p.target = pointer_target(p.name, p.content, candidates)
    snaps: dict[str, Snap] = {}
    for name in candidates:
        if only is not None and name != only:
            continue
        try:
            st = os.lstat(root / name)
        except FileNotFoundError:
            continue
        sig = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        hit = reuse.get(name) if reuse else None
        snap = hit[1] if hit is not None and hit[0] == sig else snapshot(root / name, exclude)
        if snap is not None:
            out.sigs[name] = sig
            snaps[name] = snap
            if "" not in snap.files and any(r in INSIDE_MARKERS for r in snap.files):
                out.marker_seen = True
    for name, snap in snaps.items():
        out.entries[name] = _judge(root, name, snap, out, markers, settle, now)
    return out


def _judge(root: Path, name: str, snap: Snap, listing: Listing, globs: tuple[str, ...],
           settle: float, now: float) -> Entry:
    if "" in snap.files:  # a single file
        try:
            st = os.lstat(root / name)
        except FileNotFoundError:
            return Entry(name, False, snap, False, "vanished")
        if st.st_ctime_ns > st.st_mtime_ns:
            return Entry(name, False, snap, True, "renamed into place", st.st_ctime_ns / 1e9)
        return _settled(name, False, snap, settle, now)
    found = _marker_files(snap, globs)
    if found:
        when = max(snap.files[m][1] for m in found) / 1e9
        return Entry(name, True, snap, True, f"marker {found[0]}", when, tuple(sorted(found)))
    for p in listing.pointers.values():
        if p.target == name:
            return Entry(name, True, snap, True, f"pointer {p.name}", p.mtime_ns / 1e9)
    for p in listing.pointers.values():
        if p.target is not None and shape(p.target) == shape(name):
            if natural_key(name) < natural_key(p.target):
                return Entry(name, True, snap, True, f"older than {p.name}", snap.newest_ns / 1e9)
            return Entry(name, True, snap, False, f"waiting for {p.name}")
    if any(r in ORBAX_RENAMED for r in snap.files):
        return Entry(name, True, snap, True, "renamed into place (Orbax)", snap.newest_ns / 1e9)
    if listing.marker_seen:
        return Entry(name, True, snap, False, "waiting for marker")
    return _settled(name, True, snap, settle, now)


def _settled(name: str, is_dir: bool, snap: Snap, settle: float, now: float) -> Entry:
    last = snap.newest_ns / 1e9
    if now - last >= settle:
        return Entry(name, is_dir, snap, True, "settled", last)
    return Entry(name, is_dir, snap, False, "settling", ready_at=last + settle)


def newest_complete(listing: Listing) -> Entry | None:
    """The checkpoint to resume from: a pointer's target if complete, else the highest step."""
    for pname in POINTER_FILES:
        p = listing.pointers.get(pname)
        if p is not None and p.target in listing.entries and listing.entries[p.target].complete:
            return listing.entries[p.target]
    done = [e for e in listing.entries.values() if e.complete]
    return max(done, key=lambda e: (natural_key(e.name), e.snap.newest_ns)) if done else None


def matches(staged: Snap | None, source: Snap) -> bool:
    """Is ``staged`` a faithful copy of ``source``? Same files, same sizes, mtimes within 1 s
    (some persistent filesystems keep whole seconds)."""
    if staged is None or staged.files.keys() != source.files.keys():
        return False
    for rel, (size, mt) in source.files.items():
        s2, m2 = staged.files[rel]
        if s2 != size or abs(m2 - mt) > 1_000_000_000:
            return False
    return True
