"""Small blocking filesystem steps of publishing; called through ``anyio.to_thread``."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from supervisor.sync._complete import OURS_PREFIX, STAGING_PREFIX, Snap, snapshot
from supervisor.sync._pycopy import place_symlink

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _renameat2() -> Any:
    """libc's renameat2, loaded at the first swap (ctypes costs every node agent's start
    7 ms otherwise, issue 44); None where glibc lacks it."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # pragma: no cover - very old glibc
        return None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2). False where the filesystem cannot."""
    call = _renameat2()
    if call is None:
        return False
    rc = call(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    import ctypes

    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_in(staging: Path, final: Path, *, is_dir: bool, fsync: bool) -> None:
    """Make ``staging`` visible as ``final`` in one step.

    A new checkpoint is one ``rename(2)``. A directory that replaces an older copy of the same
    name (the local one changed after it was published) is swapped with ``RENAME_EXCHANGE``
    so readers see old or new, never neither; only then is the old copy, now under the
    staging name, removed — that is an update of one checkpoint, not a deletion of one.
    """
    if fsync:
        fsync_dir(staging if is_dir else staging.parent)
    if not is_dir:
        os.replace(staging, final)
    else:
        try:
            os.rename(staging, final)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            if not _exchange(staging, final):
                old = final.with_name(f"{OURS_PREFIX}old-{final.name}")
                os.rename(final, old)
                os.rename(staging, final)
                staging = old
            shutil.rmtree(staging, ignore_errors=True)
    if fsync:
        fsync_dir(final.parent)


def create_exclusive(path: Path) -> int:
    """A new file of ours at ``path`` (a temp name in a directory others may write): a
    leftover of ours there is removed first (unlinking a planted link removes the link, not
    its target), then O_EXCL|O_NOFOLLOW, mode 600 until the caller sets the source's."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def write_atomic(path: Path, content: bytes, mtime_ns: int, *, fsync: bool, mode: int = 0o644) -> bool:
    """A pointer file through temp + rename, with the source's mode; False when ``path``
    already holds ``content``."""
    try:
        if path.read_bytes() == content:
            return False
    except (FileNotFoundError, IsADirectoryError):
        pass
    tmp = path.with_name(f"{STAGING_PREFIX}{path.name}")
    try:
        with open(create_exclusive(tmp), "wb") as f:
            f.write(content)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode & 0o7777)
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.replace(tmp, path)
    except BaseException:
        # A full or failing disk: no temp name of ours stays behind on persistent storage.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(path.parent)
    return True


def write_link(path: Path, target: str) -> bool:
    """A symlink to ``target`` (a sibling's name) through temp + rename; False when ``path``
    already is that link. Lightning's ``last.ckpt`` lands this way, after its target."""
    try:
        if os.readlink(path) == target:
            return False
    except OSError:
        pass
    place_symlink(target, str(path.with_name(f"{STAGING_PREFIX}{path.name}")), str(path))
    return True


def copy_markers(src: Path, dst: Path, rels: tuple[str, ...], *, fsync: bool) -> int:
    """Copy the small marker files last, in this thread: a second copier process would add
    its start-up time to every checkpoint's exposure window. Temp name, mtime kept, rename."""
    n = 0
    for rel in rels:
        s, d = src / rel, dst / rel
        st = os.lstat(s)
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = d.with_name(f".{d.name.lstrip('.')}.supervise-tmp")
        with open(s, "rb", opener=_nofollow) as fi, open(create_exclusive(tmp), "wb") as fo:
            shutil.copyfileobj(fi, fo, 1 << 20)
            if fsync:
                fo.flush()
                os.fsync(fo.fileno())
            os.fchmod(fo.fileno(), st.st_mode & 0o7777)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(tmp, d)
        n += st.st_size
    return n


def _nofollow(path: str, flags: int) -> int:
    """A marker that is a symlink is refused (ELOOP), never copied as its target's content."""
    return os.open(path, flags | os.O_NOFOLLOW)


def claim_staging(path: Path, *, is_dir: bool) -> bool:
    """Make sure the staging name is ours before copying into it; True when it holds a
    leftover of ours to resume.

    The name is predictable and lives on the persistent side: a link or a directory that
    another user planted there is removed (where the directory lets us) and never written
    through; a new staging directory is created here, mode 700 until its copy sets the
    source's, so the copier never creates it through a planted link.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and st.st_uid == os.geteuid() and not stat.S_ISLNK(st.st_mode) \
            and stat.S_ISDIR(st.st_mode) == is_dir:
        return True
    if st is not None:
        remove_ours(path)
    if is_dir:
        os.mkdir(path, 0o700)  # EEXIST if something not ours could not be removed: the publish fails
    return False


def remove_ours(path: Path) -> None:
    """Remove a staging entry of ours (never anything published)."""
    assert path.name.startswith(OURS_PREFIX), path
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def prune_staging(staging: Path, source: Snap) -> None:
    """Drop files from a staging directory that the source no longer has (renamed shards)."""
    if not staging.is_dir():
        return
    for d, _dirs, files in os.walk(staging):
        for f in files:
            full = Path(d) / f
            rel = full.relative_to(staging).as_posix()
            if rel not in source.files and not rel.startswith(".supervise-partial"):
                full.unlink(missing_ok=True)


def stale_staging(root: Path) -> list[Path]:
    """Our leftovers in ``root`` from a run that was killed mid-transfer."""
    try:
        return [root / n for n in os.listdir(root) if n.startswith(OURS_PREFIX)]
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def log_lag(src: Path, dst: Path, exclude: tuple[str, ...]) -> list[str]:
    """Log files whose persistent copy is shorter than the local one."""
    s = snapshot(src, exclude)
    if s is None:
        return []
    d = snapshot(dst, exclude)
    have = dict(d.files) if d else {}
    out = []
    for rel, (size, _m) in sorted(s.files.items()):
        got = have.get(rel, (-1, 0))[0]
        if got < size:
            out.append(f"{rel} ({size - max(got, 0)} bytes behind)")
    return out
