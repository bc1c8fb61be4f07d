"""The pure-Python copier: rsync's semantics for what the mirror asks of rsync.

Run as a separate process (``python -I _pycopy.py`` with a JSON request on stdin), not in
a thread, for the same reasons rsync is: ``nice``/``ionice`` apply to a whole process, a
cancelled flush kills it and is done (no thread left writing), and a 2 GB copy does not
compete with the supervisor for the GIL. Standard library only, so it starts in ~20 ms.

Modes, mirroring the rsync invocations in ``_backend.py``:

* ``tree``: copy ``src/`` into ``dst/`` (``rsync -a --partial-dir``): each file through a
  temp name and ``os.replace``, mtime and mode preserved, skipped when size and mtime match;
  ``skip`` names relative paths left out (markers, which the mirror copies last itself).
  ``in_place`` (``rsync --inplace``, for a staging directory that is itself the temp name):
  a file not yet there is created with ``O_EXCL`` and written at its name, no rename.
* ``file``: one file to one path, through a temp name.
* ``grow``: logs in place: a longer source is appended to the same inode. Whether the local
  file started over (a new inode since the last pass, fewer bytes, other first or last bytes)
  is decided on the same open file that is then copied, one step per file: a file that
  started over never grows over its persistent copy, which is renamed ``<name>.attempt-N``
  first (``"inodes"``: the inodes of the last pass; the result adds ``"inodes"`` and
  ``"restarted"``). Both backends grow logs this way (rsync cannot decide per file).

``tree`` with ``"listed": true``: the request's line is followed by the files to copy
(NUL-separated, relative to ``src``, one stream's share of the checkpoint's snapshot):
those are copied, no walk.

``"hash": true`` (``tree``, ``file``): each regular file copied is read through this process
(no ``copy_file_range``) and its sha256 taken over the very bytes written, in the same read
loop; the result adds ``"hashes"`` (path relative to ``src`` → hex digest, ``""`` for
``file``). A file skipped as already whole at the destination is not read, so not hashed.

Result on stdout: ``{"files", "bytes", "vanished", "error", "errno"}``; exit status as
rsync's: 0 ok, 24 some sources vanished, 23 partial failure, 11 I/O error.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys

PARTIAL_DIR = ".supervise-partial"
VERIFY_TAIL = 1 << 20  # bytes at the end of a log's persistent copy compared before appending
LOG_PROBE = 4096       # bytes at the start of a log compared with its persistent copy


class Stats:
    def __init__(self) -> None:
        self.files = 0
        self.bytes = 0
        self.vanished = 0
        self.inodes: dict[str, int] = {}              # grow: each log's local inode now
        self.restarted: list[tuple[str, str]] = []    # grow: (log, name its persistent copy was kept as)
        self.hashes: dict[str, str] | None = None     # "hash": sha256 of each file copied, by relative path


_EXCLUDE = None


def _excluded(rel: str, patterns: list[str], is_dir: bool) -> bool:
    """The mirror's own matcher (``_exclude.py``, standard library only), loaded by path:
    ``-I`` keeps this file's directory off ``sys.path``, and one meaning must serve both backends."""
    global _EXCLUDE
    if _EXCLUDE is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "_supervise_exclude", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_exclude.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        _EXCLUDE = mod.excluded
    return _EXCLUDE(rel, patterns, is_dir)


def _copy_one(src: str, dst: str, st: os.stat_result, fsync: bool, stats: Stats, in_place: bool = False,
              key: str | None = None) -> None:
    """src → temp in dst's directory → rename; a killed copy leaves only a temp name.

    ``in_place``: a regular file new at ``dst`` is written there directly; its mtime is set
    last, so a copy cut short fails the next quick check and is redone. ``key``: the name a
    regular file's sha256 is kept under in ``stats.hashes`` when the request asked for them.
    """
    digest = _hasher() if key is not None and stats.hashes is not None and stat.S_ISREG(st.st_mode) else None
    if in_place and stat.S_ISREG(st.st_mode) and _copy_new(src, dst, st, fsync, stats, digest):
        _keep(stats, key, digest)
        return
    d, base = os.path.split(dst)
    tmp = os.path.join(d, f".{base.lstrip('.')}.supervise-tmp")
    if stat.S_ISLNK(st.st_mode):
        place_symlink(os.readlink(src), tmp, dst)
        stats.files += 1
        return
    stats.bytes += _write_copy(src, tmp, tmp, st, fsync, rename_to=dst, digest=digest)
    stats.files += 1
    _keep(stats, key, digest)


def _hasher():
    import hashlib  # only when asked: a copy without hashes starts as before

    return hashlib.sha256()


def _keep(stats: Stats, key: str | None, digest) -> None:
    if digest is not None and stats.hashes is not None and key is not None:
        stats.hashes[key] = digest.hexdigest()


def _copy_new(src: str, dst: str, st: os.stat_result, fsync: bool, stats: Stats, digest=None) -> bool:
    """Create ``dst`` (never through a symlink or over a file) and copy into it; False if it exists."""
    try:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    except FileExistsError:
        return False
    stats.bytes += _write_copy(src, fd, dst, st, fsync, digest=digest)
    stats.files += 1
    return True


def _write_copy(src: str, out: str | int, path: str, st: os.stat_result, fsync: bool,
                rename_to: str | None = None, digest=None) -> int:
    """Copy ``src`` into ``out`` (the path ``path``, or a descriptor open on it), then its mode
    and times last, then rename it to ``rename_to`` if given. On any failure ``path`` is
    removed: it is a temp name, or a file this copy created. ``digest``: a hash object fed
    every byte written (the copy then reads through this process)."""
    if isinstance(out, str):
        out = _create_exclusive(out)  # a temp name: never through a planted link
    try:
        with open(src, "rb") as fi, open(out, "wb") as fo:
            n = _copy_stream(fi, fo) if digest is None else _copy_hashing(fi, fo, digest)
            if fsync:
                fo.flush()
                os.fsync(fo.fileno())
            os.fchmod(fo.fileno(), stat.S_IMODE(st.st_mode))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        if rename_to is not None:
            os.replace(path, rename_to)
    except BaseException:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    return n


def _create_exclusive(path: str) -> int:
    """Our temp file at ``path``: a leftover removed first (a planted link goes, not its
    target), then O_EXCL|O_NOFOLLOW, so nothing another user put there is written through."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)


def _copy_stream(fi, fo) -> int:
    """Kernel-side copy where possible (copy_file_range/sendfile), as shutil does."""
    try:
        size = os.fstat(fi.fileno()).st_size
        total = 0
        while True:
            n = os.copy_file_range(fi.fileno(), fo.fileno(), 1 << 30) if hasattr(os, "copy_file_range") else 0
            if n == 0:
                break
            total += n
        if total or size == 0:
            # copy_file_range stops at EOF; a file that grew meanwhile is caught by the caller's re-check
            return total
    except OSError:
        fi.seek(0)
        fo.seek(0)
        fo.truncate()
    shutil.copyfileobj(fi, fo, 1 << 20)
    return fo.tell()


HASH_CHUNK = 128 << 10  # fits the L2 cache it is read into, hashed from and written from: 1 MiB was 1.4× slower


def _copy_hashing(fi, fo, digest, chunk: int = HASH_CHUNK) -> int:
    """One read of the source: each chunk is fed to ``digest`` and written, so the hash is of
    exactly the bytes copied (a file growing meanwhile: of what was read, as the copy)."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    src, dst, total = fi.fileno(), fo.fileno(), 0
    while n := os.readv(src, [buf]):
        part = view[:n]
        digest.update(part)
        while part:
            part = part[os.write(dst, part):]
        total += n
    return total


def _same(st: os.stat_result, dst: str) -> bool:
    try:
        d = os.lstat(dst)
    except FileNotFoundError:
        return False
    return d.st_size == st.st_size and d.st_mtime_ns == st.st_mtime_ns


def _walk(src: str, exclude: list[str]):
    """(relative path, stat) of every entry, parents before children."""
    stack = [""]
    while stack:
        rel = stack.pop()
        full = os.path.join(src, rel) if rel else src
        try:
            with os.scandir(full) as it:
                items = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            if not rel:
                raise
            continue
        for e in items:
            r = f"{rel}/{e.name}" if rel else e.name
            if e.name == PARTIAL_DIR or (exclude and _excluded(r, exclude, e.is_dir(follow_symlinks=False))):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                yield r, None
                continue
            yield r, st
            if stat.S_ISDIR(st.st_mode):
                stack.append(r)


def _targets(entries, dst: str, stats: Stats):
    """Each walked or listed entry with its path under ``dst``: a vanished one (no stat) is
    counted and left out, a directory is made."""
    for rel, st in entries:
        if st is None:
            stats.vanished += 1
            continue
        target = os.path.join(dst, rel)
        if stat.S_ISDIR(st.st_mode):
            os.makedirs(target, exist_ok=True)
        yield rel, st, target


def place_symlink(target: str, tmp: str, path: str) -> None:
    """A link to ``target`` at ``path``, whole or not at all: made at ``tmp``, then renamed."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(target, tmp)
    try:
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # no temp name stays behind on persistent storage
        raise


def tree(req: dict, stats: Stats) -> None:
    src, dst, fsync, in_place = req["src"], req["dst"], bool(req.get("fsync")), bool(req.get("in_place"))
    skip = set(req.get("skip", ()))
    new = not os.path.lexists(dst)  # nothing inside to compare with
    os.makedirs(dst, exist_ok=True)
    dirs: list[tuple[str, os.stat_result]] = []
    for rel, st, target in _targets(_walk(src, list(req.get("exclude", ()))), dst, stats):
        if stat.S_ISDIR(st.st_mode):
            dirs.append((target, st))
            continue
        if rel in skip or (not new and _same(st, target)):
            continue
        try:
            _copy_one(os.path.join(src, rel), target, st, fsync, stats, in_place, key=rel)
        except FileNotFoundError:
            if os.path.exists(os.path.join(src, rel)):
                raise
            stats.vanished += 1
    root = os.lstat(src)
    if stat.S_ISDIR(root.st_mode):
        dirs.insert(0, (dst, root))  # the top directory's own mode too: a 700 checkpoint stays 700
    for target, st in reversed(dirs):  # after the files, whose creation touched them
        os.chmod(target, stat.S_IMODE(st.st_mode))
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def listed_tree(req: dict, names: list[str], stats: Stats) -> None:
    """``tree`` for exactly the files named (one stream's share of a checkpoint's snapshot):
    no walk; parents made as needed (their attributes are set by the caller once every
    stream is done)."""
    src, dst, fsync, in_place = req["src"], req["dst"], bool(req.get("fsync")), bool(req.get("in_place"))
    made = {""}
    os.makedirs(dst, exist_ok=True)
    for rel in names:
        source = os.path.join(src, rel)
        try:
            st = os.lstat(source)
        except FileNotFoundError:
            stats.vanished += 1
            continue
        parent = os.path.dirname(rel)
        if parent not in made:
            os.makedirs(os.path.join(dst, parent), exist_ok=True)
            made.add(parent)
        target = os.path.join(dst, rel)
        if _same(st, target):
            continue
        try:
            _copy_one(source, target, st, fsync, stats, in_place, key=rel)
        except FileNotFoundError:
            if os.path.exists(source):
                raise
            stats.vanished += 1


def one_file(req: dict, stats: Stats) -> None:
    try:
        st = os.lstat(req["src"])
    except FileNotFoundError:
        stats.vanished += 1
        return
    if not _same(st, req["dst"]):
        _copy_one(req["src"], req["dst"], st, bool(req.get("fsync")), stats, key="")


def _listed(src: str, names: list[str]):
    """``(rel, lstat or None)`` for the named files only (``grow``'s ``only``), parents created."""
    for rel in names:
        try:
            yield rel, os.lstat(os.path.join(src, rel))
        except FileNotFoundError:
            yield rel, None


def grow(req: dict, stats: Stats) -> None:
    src, dst, fsync = req["src"], req["dst"], bool(req.get("fsync"))
    known = req.get("inodes") or {}
    os.makedirs(dst, exist_ok=True)
    only = req.get("only")
    entries = _walk(src, list(req.get("exclude", ()))) if only is None else _listed(src, only)
    for rel, st, target in _targets(entries, dst, stats):
        if stat.S_ISDIR(st.st_mode):
            continue
        if only is not None and "/" in rel:
            os.makedirs(os.path.dirname(target), exist_ok=True)
        if stat.S_ISLNK(st.st_mode):
            if not os.path.lexists(target):
                _copy_one(os.path.join(src, rel), target, st, fsync, stats)
            continue
        try:
            _grow_one(rel, os.path.join(src, rel), target, known.get(rel), fsync, stats)
        except FileNotFoundError:
            if os.path.exists(os.path.join(src, rel)):
                raise
            stats.vanished += 1


def _grow_one(rel: str, src: str, dst: str, known: int | None, fsync: bool, stats: Stats) -> None:
    """Append to the same inode, so a TensorBoard reading ``dst`` sees new points.

    The source is opened once: whether it started over and what is appended are read from
    that one open file, so a log that appears or is replaced while the pass runs is judged
    as it is copied (issue 30: a check made before the copy let a new attempt's log that
    appeared in between overwrite the earlier attempt's lines). A link at ``dst`` for a
    regular source is not ours (another user planted it in a shared directory): it is
    removed, never written through."""
    with open(src, "rb") as fi:
        st = os.fstat(fi.fileno())
        stats.inodes[rel] = st.st_ino
        have = _have(dst)
        if have > 0 and _started_over(fi, st, dst, have, known):
            stats.restarted.append((rel, _set_aside(dst)))
            have = -1
        if have >= st.st_size:
            return  # a destination as long as the source is skipped
        out = _create_exclusive(dst) if have < 0 else os.open(dst, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        with open(out, "r+b") as fo:
            start = max(have, 0)
            fi.seek(start)
            fo.seek(start)
            shutil.copyfileobj(fi, fo, 1 << 20)
            written = fo.tell() - start
            fo.truncate()
            if fsync:
                fo.flush()
                os.fsync(fo.fileno())
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    stats.files += 1
    stats.bytes += written


def _have(dst: str) -> int:
    """Bytes of the persistent copy, -1 when there is none (a planted link is removed)."""
    try:
        d = os.lstat(dst)
    except FileNotFoundError:
        return -1
    if stat.S_ISLNK(d.st_mode):
        os.unlink(dst)
        return -1
    return d.st_size


def _started_over(fi, st: os.stat_result, dst: str, have: int, known: int | None) -> bool:
    """The open local log is not a continuation of its persistent copy: another inode than
    at the last pass, fewer bytes, or other bytes at the start or at the end of the copy."""
    if (known is not None and known != st.st_ino) or st.st_size < have:
        return True
    with open(dst, "rb", opener=_nofollow_read) as fd:
        for at, n in ((0, min(LOG_PROBE, have)), (have - min(VERIFY_TAIL, have), min(VERIFY_TAIL, have))):
            fi.seek(at)
            fd.seek(at)
            if fi.read(n) != fd.read(n):
                return True
    return False


def _nofollow_read(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


def _set_aside(dst: str) -> str:
    """Rename the persistent copy to ``<name>.attempt-N`` (the lowest free N from 1): the
    earlier lines are kept, and the new file starts beside them. Returns the name kept as."""
    d, base = os.path.split(dst)
    n = 1
    while os.path.lexists(os.path.join(d, f"{base}.attempt-{n}")):
        n += 1
    os.rename(dst, os.path.join(d, f"{base}.attempt-{n}"))
    return f"{base}.attempt-{n}"


MODES = {"tree": tree, "file": one_file, "grow": grow}


def main() -> int:
    # The request is one JSON line; with "listed", the files to copy follow it, NUL-separated.
    head, _, rest = sys.stdin.buffer.read().partition(b"\n")
    req = json.loads(head)
    names = [os.fsdecode(n) for n in rest.split(b"\0") if n] if req.get("listed") else None
    del rest
    stats = Stats()
    if req.get("hash"):
        stats.hashes = {}
    error, errno_ = None, None
    try:
        if names is not None:
            listed_tree(req, names, stats)
        else:
            MODES[req["mode"]](req, stats)
    except OSError as e:
        error, errno_ = f"{e.strerror or e}: {e.filename or ''}".rstrip(": "), e.errno
    out: dict[str, object] = {"files": stats.files, "bytes": stats.bytes, "vanished": stats.vanished, "error": error,
                              "errno": errno_, "inodes": stats.inodes, "restarted": stats.restarted}
    if stats.hashes is not None:
        out["hashes"] = stats.hashes
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()
    if error:
        return 11 if errno_ is not None else 23
    return 24 if stats.vanished else 0


if __name__ == "__main__":
    sys.exit(main())
