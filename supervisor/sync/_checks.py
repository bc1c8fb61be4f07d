"""What a sync pair means, checked before anything starts: hard errors raise, doubts are warnings.

Config checks a pair's syntax (types, paths, durations); this is the one place that checks
its meaning (a known profile, unique names, sides that do not overlap and are safe, an
``exclude`` that keeps every marker), run by the plan through ``Mirror.check``: exit 2,
nothing started. Errors name the file that set the pair (``SyncPair.origin``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from supervisor import sched
from supervisor.config import SyncPair
from supervisor.errors import ConfigError
from supervisor.sync._exclude import excluded_path
from supervisor.sync._profiles import NAMES, marker_examples

# Filesystems that are shared between nodes: anything else under a persistent side is suspect.
SHARED_FS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "panfs", "wekafs",
                       "cifs", "smb3", "glusterfs", "fuse.glusterfs", "fuse.sshfs", "fuse.s3fs",
                       "fuse.gcsfuse", "fuse.juicefs", "fuse.ceph", "afs", "orangefs", "9p"})
LOCAL_HINTS = ("/tmp", "/dev/shm", "/var/tmp", "/local", "/scratch/local", "/lscratch", "/run")


def _existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _mount_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem type) holding ``path``, from /proc/self/mountinfo."""
    real = os.path.realpath(_existing(path))
    best, fstype = "/", "?"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if " - " not in line or len(parts) < 5:
                    continue
                mnt = parts[4].replace("\\040", " ")
                typ = line.split(" - ", 1)[1].split()[0]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, fstype = mnt, typ
    except OSError:
        pass
    return best, fstype


def check_pairs(pairs: Sequence[SyncPair], env: dict[str, str] | None = None) -> list[str]:
    env = dict(os.environ if env is None else env)
    warnings: list[str] = []
    names: set[str] = set()
    local_dirs = sched.local_dirs(env)
    for i, p in enumerate(pairs):
        key = f"sync {p.name or i}"
        if p.kind not in ("checkpoint", "log"):
            raise ConfigError(f"{key}.kind", p.kind, "expected checkpoint or log", p.origin)
        if p.name in names:
            raise ConfigError(key, p.name, "names of [[sync]] pairs must be unique", p.origin)
        if p.profile not in ("auto", *NAMES):
            raise ConfigError(f"{key}.profile", p.profile, "expected auto or one of " + ", ".join(NAMES),
                              p.origin or "--profile")
        if p.kind == "checkpoint" and p.exclude:
            _check_markers_kept(p, key)
        names.add(p.name)
        if p.store is not None:
            _check_store_side(p, key, pairs[:i])
        else:
            _check_dir_side(p, key, pairs[:i])
        if p.keep_local is not None and p.kind != "checkpoint":
            raise ConfigError(f"{key}.keep_local", p.keep_local, "only checkpoint pairs keep a number of local copies", p.origin)
        if not p.src.exists():
            parent = _existing(p.src)
            if os.access(parent, os.W_OK):
                warnings.append(f"sync {p.name}: local side {p.src} does not exist yet; it will be created at start")
            else:
                warnings.append(f"sync {p.name}: local side {p.src} does not exist and cannot be created here; "
                                "waiting for the training to create it")
        if p.store is None:
            warnings += _dir_side_doubts(p, local_dirs)
    return warnings


def _check_dir_side(p: SyncPair, key: str, before: Sequence[SyncPair]) -> None:
    """A directory as the persistent side: apart from the local side and every other pair's."""
    src, dst = Path(os.path.realpath(p.src)), Path(os.path.realpath(p.dst))
    if src == dst:
        raise ConfigError(key, f"{p.src} -> {p.dst}", "local and persistent sides are the same path", p.origin)
    if dst.is_relative_to(src) or src.is_relative_to(dst):
        raise ConfigError(key, f"{p.src} -> {p.dst}", "one side is inside the other; mirror into a separate directory", p.origin)
    for other in before:
        if other.store is not None:
            continue
        o = Path(os.path.realpath(other.dst))
        if o == dst or o.is_relative_to(dst) or dst.is_relative_to(o):
            raise ConfigError(key, str(p.dst), f"persistent side overlaps that of sync {other.name}", p.origin)
    if p.src.exists() and not p.src.is_dir():
        raise ConfigError(f"{key}.from", str(p.src), "exists and is not a directory", p.origin)
    if p.dst.exists() and not p.dst.is_dir():
        raise ConfigError(f"{key}.to", str(p.dst), "exists and is not a directory", p.origin)
    if p.dst.is_dir():
        from supervisor.journal import check_run_dir_safe

        unsafe = check_run_dir_safe(p.dst)  # issue 14: staging and temp names live there
        if unsafe:
            raise ConfigError(f"{key}.to", str(p.dst), f"persistent side {unsafe}", p.origin)


def _dir_side_doubts(p: SyncPair, local_dirs: list[str]) -> list[str]:
    """Will a directory outlive the node, and can we write it?"""
    warnings: list[str] = []
    dst = Path(os.path.realpath(p.dst))
    anc = _existing(p.dst)
    if not os.access(anc, os.W_OK):
        warnings.append(f"sync {p.name}: persistent side {p.dst} is not writable ({anc}); syncs will fail and be retried")
    mnt, fstype = _mount_of(p.dst)
    sdst = str(dst)
    if fstype in ("tmpfs", "ramfs") or any(sdst == h or sdst.startswith(h + "/") for h in (*LOCAL_HINTS, *local_dirs)):
        warnings.append(f"sync {p.name}: persistent side {p.dst} looks node-local ({fstype} at {mnt}); "
                        "it will not outlive the node")
    elif p.src.exists() and p.dst.exists() and os.stat(p.src).st_dev == os.stat(p.dst).st_dev:
        warnings.append(f"sync {p.name}: local and persistent sides are on the same filesystem ({fstype} at {mnt}); "
                        "the copy protects against nothing if that disk goes")
    elif fstype not in SHARED_FS and fstype != "?":
        warnings.append(f"sync {p.name}: persistent side {p.dst} is on {fstype} at {mnt}, not a shared filesystem; "
                        "check that it outlives the node")
    return warnings


def _check_store_side(p: SyncPair, key: str, before: Sequence[SyncPair]) -> None:
    """An object store as the persistent side (``s3://bucket/prefix``): no other pair's prefix
    overlaps it. Whether it can be reached and written is ``Mirror.check``'s probe."""
    assert p.store is not None
    mine = f"{p.store.bucket}/{p.store.prefix}".rstrip("/") + "/"
    for other in before:
        if other.store is None:
            continue
        theirs = f"{other.store.bucket}/{other.store.prefix}".rstrip("/") + "/"
        if mine.startswith(theirs) or theirs.startswith(mine):
            raise ConfigError(f"{key}.to", p.store.url, f"persistent side overlaps that of sync {other.name}", p.origin)
    if p.keep_local is not None and p.nodes > 1:
        raise ConfigError(f"{key}.keep_local", p.keep_local, "not yet for a per-node pair on an object store", p.origin)


def _check_markers_kept(p: SyncPair, key: str) -> None:
    """An ``exclude`` that hides a profile's marker would keep every checkpoint unpublished."""
    for profile, path in marker_examples(p.profile, p.markers):
        for pattern in p.exclude:
            if excluded_path(path, (pattern,)):
                hint = "" if p.profile != "auto" else f"; set profile = \"{profile}\" if only that one applies"
                raise ConfigError(f"{key}.exclude", pattern,
                                  f"would exclude {path}, the {profile} marker, and nothing would ever be published "
                                  f"(anchor it: /{pattern.lstrip('/')} matches only the pair's top level{hint})",
                                  p.origin)
