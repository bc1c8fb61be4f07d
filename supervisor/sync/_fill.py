"""One version brought back onto this node from the nearest copy that verifies (issue 43).

A restore used to read the chosen version whole from persistent storage, even when the node
already held it (a requeue onto the same nodes keeps node-local disk), and on a directory pair
it trusted sizes. Now every file of the version's content manifest (size, sha256: ``_content``
on a directory, the object store's own manifest) is taken, in order, from:

1. the node's live copy at the checkpoint's own path;
2. the copies of that name set aside on this node (``LOCAL/.supervise-set-aside/``), and the
   copies partner nodes pushed here (``LOCAL/.supervise-peer/node-K/``: ``_ring``);
3. the other nodes that hold it (``peers``: ``_peers.remote``, over ``_peer``);
4. the persistent side (``fetch``: a copy or a download that hashes as it reads).

A local candidate counts only once its bytes hash to the manifest's; a mismatch is recorded
(``failed``: where, which file, why) and the next source is tried. Only what is missing or
failed moves, into the usual local staging name, linked where the bytes are already on this
disk, and the whole is renamed into place. A file no source gives with the manifest's bytes
raises ``Unverified``: the caller falls back to the next newest version, never to a mix.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence

import anyio

from supervisor.sync import _fsops
from supervisor.sync._aside import SET_ASIDE_DIR
from supervisor.sync._backend import CopyError, first_failure
from supervisor.sync._complete import STAGING_PREFIX, snapshot
from supervisor.sync._content import CHUNK, sha256_of
from supervisor.sync._state import to_thread

# rel, the manifest's entry for it, where to write it → bytes written; raises Mismatch
Fetch = Callable[[str, Mapping[str, Any], Path], Awaitable[int]]
FETCHES = 8  # files brought from the persistent side at once
PEER_DIR = ".supervise-peer"   # LOCAL/.supervise-peer/node-K/: copies partner node K pushed here (hidden: never a checkpoint)


class Mismatch(Exception):
    """A copy whose bytes are not the manifest's (size or sha256)."""


class NotHeld(Mismatch):
    """A node that did not offer this file: not asked (nothing failed)."""


class ChoiceUnverified(CopyError):
    """The version every node restores (the leader's choice) verifies in no copy this node can
    reach: the node restores nothing, and says so (``holds``), and the leader chooses again
    without it (conduct/fleet.py, ``restore_everywhere``)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name}: {why}")
        self.name = name


class Unverified(Exception):
    """No source gave a file of the version with its manifest's bytes."""

    def __init__(self, failed: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{f['file'] or '(file)'} from {f['from']}: {f['why']}" for f in failed))
        self.failed = failed


@dataclass
class Filled:
    """Where the version's bytes came from (source → bytes, source → files), the bytes that
    moved (copied or downloaded; a link moves none), what failed verification, and whether
    the local copy was replaced."""

    came: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    moved: int = 0
    failed: list[dict[str, str]] = field(default_factory=list)
    replaced: bool = False
    seconds: float = 0.0

    def took(self, source: str, size: int) -> None:
        self.came[source] = self.came.get(source, 0) + size
        self.files[source] = self.files.get(source, 0) + 1

    def fields(self) -> dict[str, Any]:
        """The ``restore-verify`` event's fields."""
        return {"verified": True, "from": self.came, "files": self.files, "moved": self.moved,
                "failed": self.failed, "replaced": self.replaced, "seconds": round(self.seconds, 3)}


def local_candidates(src: Path, name: str) -> list[tuple[str, Path]]:
    """Where this node may already hold ``name``: its live path, then every copy of it set
    aside (``name``, ``name.1``, …; the most recently set aside first), then the copies of it
    partner nodes pushed here (``copy``)."""
    out: list[tuple[str, Path]] = [("live", src / name)]
    aside = src / SET_ASIDE_DIR
    try:
        names = [n for n in os.listdir(aside) if n == name or n.startswith(f"{name}.") and n[len(name) + 1:].isdigit()]
    except OSError:
        names = []
    names.sort(key=lambda n: int(n[len(name) + 1:] or 0) if n != name else 0, reverse=True)
    try:
        writers = sorted(n for n in os.listdir(src / PEER_DIR) if n.startswith("node-"))
    except OSError:
        writers = []
    return out + [("aside", aside / n) for n in names] + [("copy", src / PEER_DIR / w / name) for w in writers]


def _at(root: Path, rel: str) -> Path:
    return root / rel if rel else root


def _regular_size(path: Path) -> int | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _verify_local(doc: Mapping[str, Any], candidates: list[tuple[str, Path]],
                  filled: Filled) -> dict[str, tuple[str, Path]]:
    """rel → (source, path) of every file a local candidate holds with the manifest's bytes.
    Blocking: hashes each candidate whose size matches."""
    found: dict[str, tuple[str, Path]] = {}
    for rel, f in doc["files"].items():
        if "link" in f:  # a symlink inside the checkpoint: made again from its target, nothing to verify
            continue
        size, want = int(f["size"]), str(f["sha256"])
        for source, root in candidates:
            path = _at(root, rel)
            if _regular_size(path) != size:
                continue
            try:
                got = sha256_of(path)
            except OSError as e:
                filled.failed.append({"file": rel, "from": source, "why": e.strerror or str(e)})
                continue
            if got == want:
                found[rel] = (source, path)
                break
            filled.failed.append({"file": rel, "from": source, "why": f"sha256 {got[:12]}…, not {want[:12]}…"})
    return found


def _in_place(doc: Mapping[str, Any], dest: Path, found: Mapping[str, tuple[str, Path]],
              exclude: tuple[str, ...]) -> bool:
    """Is the live copy at ``dest`` the version already: every file verified there, no other?"""
    links = {rel: f["link"] for rel, f in doc["files"].items() if "link" in f}
    if not all(src == "live" for src, _ in found.values()) or found.keys() | links.keys() != doc["files"].keys():
        return False
    for rel, target in links.items():
        try:
            if os.readlink(_at(dest, rel)) != target:
                return False
        except OSError:
            return False
    have = snapshot(dest, exclude)
    return have is not None and have.files.keys() == doc["files"].keys() and ("" in have.files) != bool(doc["is_dir"])


def _set_mtimes(root: Path, doc: Mapping[str, Any]) -> None:
    for rel, f in doc["files"].items():
        path, mt = _at(root, rel), int(f["mtime_ns"])
        if os.lstat(path).st_mtime_ns != mt:
            os.utime(path, ns=(mt, mt), follow_symlinks=False)


def _link(link: str, target: Path) -> None:
    """A symlink of the checkpoint, made again in the new staging directory (ours alone)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(link, target)


def _place_local(path: Path, target: Path) -> bool:
    """``path``'s bytes at ``target``: a hard link (same disk, nothing moves), else a copy.
    True when it was copied. Blocking."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(path, target, follow_symlinks=False)
        return False
    except OSError:
        copy_verified(path, target, size=os.lstat(path).st_size, sha256=None)
        return True


def copy_verified(src: Path, target: Path, *, size: int, sha256: str | None) -> int:
    """Copy ``src`` to a new ``target`` hashing as it reads (one read); raises ``Mismatch``
    (``target`` removed) when the bytes are not ``size`` long or do not hash to ``sha256``.
    The source's mode is kept. Blocking."""
    h = hashlib.sha256()
    n = 0
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        with open(fd, "rb") as fi, open(_fsops.create_exclusive(target), "wb") as fo:
            while chunk := fi.read(CHUNK):
                h.update(chunk)
                fo.write(chunk)
                n += len(chunk)
            os.fchmod(fo.fileno(), stat.S_IMODE(os.fstat(fi.fileno()).st_mode))
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    why = f"{n} bytes, not {size}" if n != size else (
        f"sha256 {h.hexdigest()[:12]}…, not {sha256[:12]}…" if sha256 is not None and h.hexdigest() != sha256 else None)
    if why is not None:
        target.unlink(missing_ok=True)
        raise Mismatch(why)
    return n


async def fill(doc: Mapping[str, Any], dest: Path, *, candidates: list[tuple[str, Path]], fetch: Fetch | None,
               where: str = "persistent", peers: Sequence[tuple[str, Fetch]] = (), mode: int = 0o755,
               exclude: tuple[str, ...] = ()) -> Filled:
    """Make ``dest`` the version ``doc`` describes, each file from the nearest verified copy
    (module docstring). Raises ``Unverified`` (nothing changed at ``dest``) when a file is
    neither held here with its manifest's bytes nor fetched with them. ``peers``: other nodes
    to ask first, in order (``_peers.remote``); ``fetch``: the persistent side (None: the
    version is not published). ``exclude``: the pair's patterns rooted at ``dest`` (files the
    manifest leaves out by design)."""
    remote = [*peers, *([(where, fetch)] if fetch is not None else [])]
    t0 = time.monotonic()
    filled = Filled()
    found = await to_thread(_verify_local, doc, candidates, filled)
    if await to_thread(_in_place, doc, dest, found, exclude):
        await to_thread(_set_mtimes, dest, doc)
        for f in doc["files"].values():
            filled.took("live", int(f["size"]))
        filled.seconds = time.monotonic() - t0
        return filled
    is_dir = bool(doc["is_dir"])
    staging = dest.parent / f"{STAGING_PREFIX}{dest.name}"
    await to_thread(dest.parent.mkdir, parents=True, exist_ok=True)
    await to_thread(_fsops.remove_ours, staging)
    limit = anyio.CapacityLimiter(FETCHES)

    async def bring(rel: str, f: Mapping[str, Any]) -> None:
        target = _at(staging, rel)
        if "link" in f:
            await to_thread(_link, str(f["link"]), target)
            return
        if rel in found:
            source, path = found[rel]
            if await to_thread(_place_local, path, target):
                filled.moved += int(f["size"])
            filled.took(source, int(f["size"]))
            return
        async with limit:
            await to_thread(target.parent.mkdir, parents=True, exist_ok=True)
            for source, get in remote:
                try:
                    n = await get(rel, f, target)
                except NotHeld:
                    continue
                except Mismatch as e:
                    filled.failed.append({"file": rel, "from": source, "why": str(e)})
                    continue
                filled.moved += n
                filled.took(source, n)
                return
        if not remote:
            filled.failed.append({"file": rel, "from": "-", "why": "held by no node, and not published"})
        raise Unverified(filled.failed)

    try:
        if is_dir:
            await to_thread(staging.mkdir, mode=0o700)
        await first_failure([partial(bring, rel, f) for rel, f in doc["files"].items()])
        await to_thread(_set_mtimes, staging, doc)
        if is_dir:
            await to_thread(os.chmod, staging, mode & 0o7777)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await to_thread(_fsops.remove_ours, staging)
        raise
    await to_thread(_fsops.swap_in, staging, dest, is_dir=is_dir, fsync=False)
    filled.replaced = True
    filled.seconds = time.monotonic() - t0
    return filled
