"""What is a checkpoint, and is it complete? Pure functions over a directory listing.

Everything here does blocking I/O (``os.scandir``, ``stat``) and is called through
``anyio.to_thread.run_sync`` by the pair engine. The rules are in docs/sync.md:

* each top-level entry of the local checkpoint directory (a directory such as ``step_100/``
  or a single file such as ``model_100.pt``) is one checkpoint; the pair's framework
  profile (``_profiles.py``) says which of them a restore may choose, and in what order;
* top-level pointer files (DeepSpeed ``latest``, Megatron ``latest_checkpointed_iteration.txt``)
  and top-level symlinks (Lightning's ``last.ckpt``) are not checkpoints: they name one, and
  land after it; a link out of the pair's directory is never followed nor copied;
* hidden names, temp names and Orbax's ``*.orbax-checkpoint-tmp*`` are work in progress;
* evidence first: nothing a process of the training holds open for writing is complete;
  once the training's tree is gone nothing can change, so nothing waits for quiescence;
* a directory is complete when a marker says so (the profile's, ``.metadata``,
  ``commit_success.txt``, the user's globs), when a pointer names it or a newer sibling of
  the same shape, when Orbax metadata sits in a renamed directory, or, where no marker is
  expected, when nothing in it changed for the settle time;
* a single file is complete when its writer closed it (the writer is visible), when its
  name changed inode (renamed into place; writer not visible), or when it settled; a zip or
  safetensors file that its format calls cut short is torn, never complete.
"""

from __future__ import annotations

import filecmp
import fnmatch
import functools
import os
import re
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

from supervisor._units import natural_key
from supervisor.sync._exclude import excluded, within
from supervisor.sync._profiles import GENERIC, Profile, detect, torn_file

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


def shape(name: str) -> str:
    """``global_step200`` → ``global_step#``: siblings of one series share a shape."""
    return _DIGITS.sub("#", name)


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
    """Stat every file under ``path`` (or ``path`` itself when it is a file). None if it vanished.
    ``exclude`` patterns are rooted at ``path`` (``_exclude.within``)."""
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
                if name == PARTIAL_DIR or (exclude and excluded(r, exclude, e.is_dir(follow_symlinks=False))):
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



WRITE_POLL = 0.2  # a checkpoint being written is looked at again this soon (a close is not a file event)


@dataclass
class Entry:
    """One top-level checkpoint and the verdict on it."""

    name: str
    is_dir: bool
    snap: Snap
    complete: bool
    why: str                        # "marker .metadata", "closed by its writer", "settled", "waiting for marker", ...
    done_at: float | None = None    # wall time it became complete (marker mtime ...): the lag's start
    markers: tuple[str, ...] = ()   # files inside that land last
    ready_at: float | None = None   # wall time to look again (quiescence due, a writer may have closed)
    torn: str | None = None         # the profile calls it torn: the training died in the middle of writing it
    step: int | None = None         # its step, from its name (the profile's rule)
    restorable: bool = True         # the profile calls it a checkpoint, not a file beside them

    @property
    def order(self) -> tuple:
        """Newest last: by step where the name gives one, then by name, then by time."""
        return (self.step is not None, self.step or 0, natural_key(self.name), self.snap.newest_ns)


@dataclass
class Pointer:
    name: str
    content: bytes
    mtime_ns: int
    target: str | None
    link: bool = False              # a symlink (content: the target's name), not a file
    mode: int = 0o644               # its permission bits, copied as they are (a 600 stays 600)


def pointer_owed(pair: str, ptr: Pointer, listing: Listing) -> str:
    """The ``pending`` line of a pointer not yet on persistent storage. An empty pointer file
    is torn: DeepSpeed writes ``latest`` with ``open(path, "w")``, truncated first and named at
    close, so a rank killed between the two leaves it empty; nothing of it can be made durable
    (like a checkpoint the training died in, ``policy.owed`` does not count it). So is a pointer
    naming a torn checkpoint: DeepSpeed's rank 0 writes ``latest`` before the other ranks'
    shards, and a training stopped while a rank is late leaves ``latest`` naming a checkpoint
    that will never be whole (it was counted owed, and the run exited 74)."""
    if not ptr.link and not ptr.content.strip():
        return f"{pair}: {ptr.name} (torn: empty; never published)"
    named = listing.entries.get(ptr.target) if ptr.target else None
    if named is not None and named.torn:
        return f"{pair}: {ptr.name} (torn: names {ptr.target}, which is torn; never published)"
    return f"{pair}: {ptr.name} ({'link' if ptr.link else 'pointer'} to {ptr.target or 'a missing checkpoint'})"


Sig = tuple[int, int, int]  # (inode, mtime_ns, ctime_ns) of a top-level entry


@dataclass
class Listing:
    entries: dict[str, Entry] = field(default_factory=dict)
    pointers: dict[str, Pointer] = field(default_factory=dict)
    marker_seen: bool = False  # a built-in marker or pointer exists: quiescence is off for directories
    sigs: dict[str, Sig] = field(default_factory=dict)
    profile: Profile | None = None
    evidence: str = ""              # what the profile was detected from
    outside: list[str] = field(default_factory=list)  # top-level links that leave the pair's directory
    names: list[str] = field(default_factory=list)    # every candidate top-level name (also those ``only`` skipped)


@dataclass
class Context:
    """What the engine knows beyond the directory: the profile, who is writing, whether the
    training is gone, and the inodes names had at the last scan."""

    profile: Profile | None = None
    writing: Mapping[str, int] | None = None  # real path → pid holding it open for writing; None: writers unseen
    exited: bool = False
    inodes: Mapping[str, int] = field(default_factory=dict)
    torn_check: Callable[[Path, Snap], str | None] | None = None
    # Is a rank of the training inside one of these calls now? (its Python stack, stacks.inside;
    # None: cannot tell). Asked only of a save that writes no marker and has no earlier one.
    saving: Callable[[tuple[str, ...]], bool | None] | None = None


def pointer_target(name: str, content: bytes, names: Iterable[str]) -> str | None:
    """The entry a pointer file names, if it exists in ``names``."""
    text = content.decode("utf-8", errors="replace").strip()
    names = set(names)
    if name == "latest_checkpointed_iteration.txt":
        cand = f"iter_{int(text):07d}" if text.isdigit() else text
    else:
        cand = text
    return cand if cand in names else None


def link_target(root: Path, name: str, text: str) -> str | None:
    """The top-level entry a symlink names, or None when it leaves ``root`` (never followed)."""
    real_root = os.path.realpath(root)
    dest = os.path.normpath(os.path.join(real_root, text)) if not os.path.isabs(text) else os.path.normpath(text)
    if os.path.dirname(dest) != real_root:
        return None
    return os.path.basename(dest)


def _marker_files(snap: Snap, globs: tuple[str, ...]) -> list[str]:
    out = []
    for rel in snap.files:
        base = rel.rsplit("/", 1)[-1]
        if rel in INSIDE_MARKERS or any(fnmatch.fnmatchcase(rel, g) or fnmatch.fnmatchcase(base, g) for g in globs):
            out.append(rel)
    return out


def classify(root: Path, *, markers: tuple[str, ...] = (), exclude: tuple[str, ...] = (),
             settle: float = 5.0, now: float, marker_seen: bool = False,
             only: str | None = None, reuse: Mapping[str, tuple[Sig, Snap]] | None = None,
             ctx: Context | None = None) -> Listing:
    """List ``root`` and decide, for each top-level entry, whether it is a complete checkpoint.

    ``marker_seen`` carries over from earlier scans: once a pair has shown a marker, a
    directory without one is never taken for complete just because it went quiet (a slow
    writer pausing is not a finished checkpoint). ``only`` re-checks one entry (after a copy)
    but still reads the pointers, since they decide it. ``reuse`` holds snapshots of
    published checkpoints: one whose top-level stat is unchanged is not walked again (a
    watch-triggered pass then costs one stat per old checkpoint, not one per file).
    ``exclude`` patterns are rooted at ``root`` (gitignore-style, ``_exclude.py``).
    """
    ctx = ctx or Context()
    out = Listing(marker_seen=marker_seen or bool(markers))
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return out
    candidates: list[str] = []
    links: list[tuple[str, os.stat_result]] = []
    for name in names:
        try:
            st = os.lstat(root / name)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            if not is_temp(name) and not excluded(name, exclude):
                links.append((name, st))
        elif name in POINTER_FILES and stat.S_ISREG(st.st_mode):
            try:
                with open(root / name, "rb", opener=_nofollow) as f:
                    content = f.read(4096)
            except (FileNotFoundError, IsADirectoryError, OSError):
                continue
            out.pointers[name] = Pointer(name, content, st.st_mtime_ns, None, mode=stat.S_IMODE(st.st_mode))
            out.marker_seen = True
        elif not is_temp(name) and not excluded(name, exclude, stat.S_ISDIR(st.st_mode)):
            candidates.append(name)
    out.names = candidates
    for p in out.pointers.values():
        p.target = pointer_target(p.name, p.content, candidates)
    for name, st in links:
        try:
            text = os.readlink(root / name)
        except OSError:
            continue
        target = link_target(root, name, text)
        if target is None:
            out.outside.append(name)
        elif target in candidates:
            out.pointers[name] = Pointer(name, target.encode(), st.st_mtime_ns, target, link=True)
    snaps: dict[str, Snap] = {}
    wanted = _only_and_its_elder(only, candidates) if only is not None else None
    for name in candidates:
        if wanted is not None and name not in wanted:
            continue
        try:
            st = os.lstat(root / name)
        except FileNotFoundError:
            continue
        sig = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        hit = reuse.get(name) if reuse else None
        snap = hit[1] if hit is not None and hit[0] == sig else snapshot(root / name, within(name, exclude))
        if snap is not None:
            out.sigs[name] = sig
            snaps[name] = snap
            if "" not in snap.files and any(r in INSIDE_MARKERS for r in snap.files):
                out.marker_seen = True
    out.profile = ctx.profile
    if out.profile is None:
        inside = {n: [r.split("/", 1)[0] for r in s.files] for n, s in snaps.items() if "" not in s.files}
        found = detect(((n, "" not in s.files) for n, s in snaps.items()), out.pointers, inside)
        if found is not None:
            out.profile, out.evidence = found
    busy = _busy(root, ctx.writing)
    for name in sorted(snaps, key=natural_key):  # an earlier sibling first: a later one may need its verdict
        out.entries[name] = _judge(root, name, snaps[name], out, markers, settle, now, ctx, busy)
    return out


def _only_and_its_elder(only: str, candidates: list[str]) -> set[str]:
    """A re-check of one entry also looks at the sibling saved just before it: a save's
    completeness may be judged against the previous one's files (``_files_may_follow``)."""
    elder = [n for n in candidates if shape(n) == shape(only) and natural_key(n) < natural_key(only)]
    return {only, max(elder, key=natural_key)} if elder else {only}


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


def _busy(root: Path, writing: Mapping[str, int] | None) -> dict[str, tuple[str, int]]:
    """Top-level name → (a path inside it being written, its writer's pid)."""
    if not writing:
        return {}
    prefix = os.path.realpath(root) + "/"
    out: dict[str, tuple[str, int]] = {}
    for path, pid in writing.items():
        if path.startswith(prefix):
            rel = path[len(prefix):]
            out.setdefault(rel.split("/", 1)[0], (rel, pid))
    return out


def _judge(root: Path, name: str, snap: Snap, listing: Listing, globs: tuple[str, ...],
           settle: float, now: float, ctx: Context, busy: Mapping[str, tuple[str, int]]) -> Entry:
    prof = listing.profile or GENERIC
    is_dir = "" not in snap.files
    kw = {"step": prof.step_of(name), "restorable": prof.is_checkpoint(name, is_dir)}
    if name in busy:
        rel, pid = busy[name]
        return Entry(name, is_dir, snap, False, f"being written ({rel} open by pid {pid})",
                     ready_at=now + WRITE_POLL, **kw)
    seen = ctx.writing is not None or ctx.exited
    if not is_dir:
        torn = ctx.torn_check(root / name, snap) if ctx.torn_check else torn_file(str(root / name))
        if torn:
            if seen:
                return Entry(name, False, snap, False, f"torn: {torn}", torn=torn, **kw)
            return _settled(name, False, snap, max(settle, WRITE_POLL), now, kw, why_not=f"incomplete ({torn})")
        if ctx.exited:
            return Entry(name, False, snap, True, "training exited", snap.newest_ns / 1e9, **kw)
        if ctx.writing is not None:
            return Entry(name, False, snap, True, "closed by its writer", snap.newest_ns / 1e9, **kw)
        sig = listing.sigs.get(name)
        before = ctx.inodes.get(name)
        if sig is not None and before is not None and before != sig[0]:
            return Entry(name, False, snap, True, "renamed into place", sig[2] / 1e9, **kw)
        return _settled(name, False, snap, settle, now, kw)
    found = _marker_files(snap, globs + prof.markers)
    if found:
        when = max(snap.files[m][1] for m in found) / 1e9
        if prof.after_marker and ctx.exited:
            gap = _lacks_what_the_save_before_had(name, snap, listing)
            if gap is not None:  # the training is gone: what follows the marker will never come
                torn = f"the training ended before writing {gap[1]} ({gap[0]} had them)"
                return Entry(name, True, snap, False, f"torn: {torn}", torn=torn, markers=tuple(sorted(found)), **kw)
        elif prof.after_marker:
            waiting = _files_may_follow(name, snap, listing, prof, settle, now, ctx)
            if waiting is not None:
                why, ready = waiting
                return Entry(name, True, snap, False, why, ready_at=ready, markers=tuple(sorted(found)), **kw)
        return Entry(name, True, snap, True, f"marker {found[0]}", when, tuple(sorted(found)), **kw)
    for p in listing.pointers.values():
        if p.target == name and not p.link:
            short = _missing_shards(root, name, snap, listing, prof)
            if short:
                return _short(name, snap, short, ctx, kw, now)
            return Entry(name, True, snap, True, f"pointer {p.name}", p.mtime_ns / 1e9, **kw)
    for p in listing.pointers.values():
        if p.target is not None and not p.link and shape(p.target) == shape(name):
            if natural_key(name) < natural_key(p.target):
                short = _missing_shards(root, name, snap, listing, prof)
                if short:
                    return _short(name, snap, short, ctx, kw, now)
                return Entry(name, True, snap, True, f"older than {p.name}", snap.newest_ns / 1e9, **kw)
            if ctx.exited:
                return Entry(name, True, snap, False, f"torn: newer than {p.name}, which never named it",
                             torn=f"newer than {p.name}, which never named it", **kw)
            return Entry(name, True, snap, False, f"waiting for {p.name}", **kw)
    if any(r in ORBAX_RENAMED for r in snap.files):
        return Entry(name, True, snap, True, "renamed into place (Orbax)", snap.newest_ns / 1e9, **kw)
    if prof.needs_marker or listing.marker_seen:
        want = " or ".join((*prof.markers, *globs)) or prof.pointer or "its marker"
        if ctx.exited and kw["restorable"]:
            torn = f"the training ended before writing {want}"
            return Entry(name, True, snap, False, f"torn: {torn}", torn=torn, **kw)
        return Entry(name, True, snap, False, f"waiting for {prof.pointer}" if prof.pointer and not prof.markers
                     else "waiting for marker", **kw)
    if ctx.exited:
        return Entry(name, True, snap, True, "training exited", snap.newest_ns / 1e9, **kw)
    return _settled(name, True, snap, settle, now, kw)


def _files_may_follow(name: str, snap: Snap, listing: Listing, prof: Profile, settle: float,
                      now: float, ctx: Context) -> tuple[str, float] | None:
    """Files the save writes after its marker (Accelerate's registered objects): the previous
    save of the series (one with its marker) says which. The first save has none to compare
    with: it is complete once a newer save of the series began (saves follow one another), or
    once no rank of the training is inside the library's save call (its Python stack); only
    where neither can be seen (py-spy missing, writers not visible), quiet time (the longer of
    the profile's and ``settle``). None when nothing more is expected."""
    if _save_before(name, listing) is not None:
        gap = _lacks_what_the_save_before_had(name, snap, listing)
        return (f"waiting for the files {gap[0]} had: {gap[1]}", now + WRITE_POLL) if gap else None
    if any(shape(n) == shape(name) and natural_key(n) > natural_key(name) for n in listing.names):
        return None
    if prof.save_calls and ctx.saving is not None:
        inside = ctx.saving(prof.save_calls)
        if inside is True:
            return f"marker there; a rank is still inside {' or '.join(prof.save_calls)}", now + WRITE_POLL
        if inside is False:
            return None
    quiet_until = snap.newest_ns / 1e9 + max(prof.after_marker, settle)
    return ("marker there; files may follow it", quiet_until) if now < quiet_until else None


def _save_before(name: str, listing: Listing) -> Entry | None:
    """The newest earlier save of ``name``'s series that has its marker."""
    before = [e for e in listing.entries.values() if e.is_dir and e.markers and shape(e.name) == shape(name)
              and natural_key(e.name) < natural_key(name)]
    return max(before, key=lambda e: natural_key(e.name)) if before else None


def _lacks_what_the_save_before_had(name: str, snap: Snap, listing: Listing) -> tuple[str, str] | None:
    """(the earlier save, the kinds of file it had that ``name`` lacks), or None: a save of the
    same series writes the same kinds of file (Accelerate: one ``custom_checkpoint_<i>.pkl`` per
    registered object, after the marker)."""
    prev = _save_before(name, listing)
    if prev is None:
        return None
    missing = sorted({shape(r) for r in prev.snap.files} - {shape(r) for r in snap.files})
    return (prev.name, ", ".join(missing)) if missing else None


def _short(name: str, snap: Snap, short: str, ctx: Context, kw: dict, now: float) -> Entry:
    """A checkpoint its pointer calls done that still lacks a rank's shard: a late rank is
    waited for; once the training is gone, nothing will write it: torn."""
    if ctx.exited:
        return Entry(name, True, snap, False, f"torn: {short}", torn=short, **kw)
    return Entry(name, True, snap, False, f"waiting for {short}", ready_at=now + WRITE_POLL, **kw)


def _missing_shards(root: Path, name: str, snap: Snap, listing: Listing, prof: Profile) -> str | None:
    """The ranks' shards a checkpoint still lacks (DeepSpeed: one ZeRO file per data-parallel
    rank, written in place by each rank, with no barrier before rank 0's ``latest``). How many
    ranks: the count the model-states file records (``dp_world_size``), else the previous
    save's shards. None when nothing is missing (or the profile has no shards)."""
    if not prof.shards:
        return None
    rx = re.compile(prof.shards)
    have = _shard_ranks(snap, rx)
    world = _world_size(lambda rel: root / name / rel, snap, prof)
    prev = [e for e in listing.entries.values() if e.complete and e.is_dir and shape(e.name) == shape(name)
            and natural_key(e.name) < natural_key(name)]
    want: dict[str, set[int]] = {}
    if prev:
        want = _shard_ranks(max(prev, key=lambda e: natural_key(e.name)).snap, rx)
    if world:
        for kind in set(have) | set(want):
            want[kind] = set(range(world))
    missing = sorted(f"{kind.replace('#', str(r))}" for kind, ranks in want.items() for r in ranks - have.get(kind, set()))
    return _missing_text(missing)


def missing_shards(snap: Snap, prof: Profile | None, path_of: Callable[[str], Path]) -> str | None:
    """The ranks' shards a checkpoint assembled from several nodes' parts lacks, by the count
    its model-states file records (``path_of(rel)``: where that file is). Each node holds only
    its own ranks' shards (DeepSpeed's node-local mode), so every rank's is asked of the parts
    together, not of one node's. None when nothing is missing or the count is unknown."""
    if prof is None or not prof.shards:
        return None
    have = _shard_ranks(snap, re.compile(prof.shards))
    world = _world_size(path_of, snap, prof)
    if not world:
        return None
    return _missing_text(sorted(kind.replace("#", str(r)) for kind, ranks in have.items() for r in set(range(world)) - ranks))


def _missing_text(missing: list[str]) -> str | None:
    if not missing:
        return None
    more = f" and {len(missing) - 2} more" if len(missing) > 2 else ""
    return f"the shards of every rank ({', '.join(missing[:2])}{more} missing)"


def _shard_ranks(snap: Snap, rx: re.Pattern[str]) -> dict[str, set[int]]:
    """Shard file name with its rank as ``#`` → the ranks present."""
    out: dict[str, set[int]] = {}
    for rel in snap.files:
        m = rx.search(rel)
        if m:
            kind = rel[:m.start("rank")] + "#" + rel[m.end("rank"):]
            out.setdefault(kind, set()).add(int(m.group("rank")))
    return out


def _world_size(path_of: Callable[[str], Path], snap: Snap, prof: Profile) -> int | None:
    glob, key = prof.world
    if not glob:
        return None
    for rel in sorted(snap.files):
        if fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], glob):
            size, mtime = snap.files[rel]
            got = _pickled_int(str(path_of(rel)), key, size, mtime)
            if got:
                return got
    return None


@functools.lru_cache(maxsize=256)
def _pickled_int(path: str, key: str, size: int, mtime_ns: int) -> int | None:
    """The int stored under ``key`` in a ``torch.save`` zip's pickle, read without torch and
    without running the pickle (its opcodes only). None when absent or unreadable."""
    del size, mtime_ns  # the cache key: a new version of the file is read again
    try:
        with zipfile.ZipFile(path) as z:
            pkl = next((n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if pkl is None:
                return None
            data = z.read(pkl)
        import pickletools  # here: 14 ms of pickle's opcode tables on every node agent's start (issue 44)

        after_key = False
        for op, arg, _pos in pickletools.genops(data):
            if op.name in ("BINPUT", "LONG_BINPUT", "MEMOIZE", "PUT"):
                continue
            if after_key:
                return int(arg) if op.name in ("BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG") else None
            after_key = isinstance(arg, str) and arg == key
    except (OSError, zipfile.BadZipFile, ValueError, KeyError, EOFError):
        return None
    return None


def _settled(name: str, is_dir: bool, snap: Snap, settle: float, now: float, kw: dict,
             why_not: str = "settling") -> Entry:
    last = snap.newest_ns / 1e9
    if now - last >= settle and why_not == "settling":
        return Entry(name, is_dir, snap, True, "settled", last, **kw)
    return Entry(name, is_dir, snap, False, why_not, ready_at=max(now, last) + settle, **kw)


def newest_complete(listing: Listing) -> Entry | None:
    """The checkpoint to resume from: a pointer's target if complete, else the newest of the
    profile's complete checkpoints by step (never a stray file beside them)."""
    for pname in POINTER_FILES:
        p = listing.pointers.get(pname)
        if p is not None and p.target in listing.entries and listing.entries[p.target].complete:
            return listing.entries[p.target]
    done = [e for e in listing.entries.values() if e.complete and e.restorable]
    return max(done, key=lambda e: e.order) if done else None


def identical(a: Path, b: Path, sa: Snap | None, sb: Snap | None) -> bool:
    """Are ``a`` and ``b`` the same version, not merely alike? ``matches`` allows mtimes 1 s
    apart (whole-second filesystems), and ``torch.save`` writes a file of the same size every
    epoch: two epochs saved within a second would pass. Same files and sizes, and each file's
    mtime equal to the nanosecond or else its bytes equal. Blocking: may read both."""
    if sa is None or sb is None or not matches(sa, sb):
        return False
    for rel, (_size, mt) in sa.files.items():
        if sb.files[rel][1] != mt and not filecmp.cmp(a / rel if rel else a, b / rel if rel else b, shallow=False):
            return False
    return True


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
