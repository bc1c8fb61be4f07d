"""Content manifests on a directory pair: every published version names each file's size,
mtime and sha256, so a restore can verify what it loads and take it from the nearest copy.

An object store's manifest is its commit point (``_manifest.py``); a directory's commit point
stays the rename. Beside it, under the persistent side's hidden ``.supervise/manifests/``
(hidden names are never checkpoints, and ``.supervise`` is not one of our ``.supervise-*``
leftovers that a start removes), the same document is written through a temp name **before**
the rename: every version published from now on has one. A manifest describes the copy on
disk only while that copy's sizes and mtimes are the manifest's (the publish keeps the
source's mtimes): a newer version renamed over an older one, or a crash between the manifest
and the rename, leaves a manifest that ``describes`` refuses, and the restore then trusts
sizes as before (``restore-verify`` says ``verified: false``). Issue 43; docs/sync.md,
"Restore".
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any, Mapping

from supervisor.sync import _fsops
from supervisor.sync._complete import Entry, Snap
from supervisor.sync._manifest import ROOT, checkpoint_doc, dumps, loads
from supervisor.sync._profiles import Profile

CHUNK = 1 << 20
DIR = f"{ROOT}/manifests"  # under the pair's persistent directory


def path_of(dst: Path, name: str) -> Path:
    return dst / DIR / f"{name}.json"


def sha256_of(path: Path) -> str:
    """The sha256 of one file's bytes, read in 1 MiB chunks. Blocking; raises OSError."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with open(fd, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


LINK = "link:"  # a symlink's "hash" in ``hash_files``: its target, never followed


def hash_files(root: Path, snap: Snap, known: Mapping[str, str] | None = None) -> dict[str, str]:
    """rel → sha256 of every file of the checkpoint at ``root`` (``""``: ``root`` is the file);
    a symlink inside (copied as a link, never followed) → ``link:<target>``. ``known`` hashes
    (the copier's, read while it copied) are taken as they are. Blocking."""
    out = dict(known or {})
    for rel in snap.files:
        if rel not in out:
            path = root / rel if rel else root
            out[rel] = f"{LINK}{os.readlink(path)}" if os.path.islink(path) else sha256_of(path)
    return {rel: out[rel] for rel in snap.files}


def entry(size: int, mtime_ns: int, digest: str) -> dict[str, Any]:
    """One file of a manifest: a regular file's size, mtime, sha256; a link's target too."""
    if digest.startswith(LINK):
        target = digest[len(LINK):]
        return {"size": size, "mtime_ns": mtime_ns, "link": target,
                "sha256": hashlib.sha256(target.encode()).hexdigest()}
    return {"size": size, "mtime_ns": mtime_ns, "sha256": digest}


def holds_version(root: Path, doc: Mapping[str, Any]) -> bool:
    """Is the local copy at ``root`` the very version ``doc`` describes (each file's size, then
    its sha256)? Nothing read back from persistent storage. Blocking."""
    files = doc["files"]
    try:
        if any(os.lstat(root / rel if rel else root).st_size != int(f["size"]) for rel, f in files.items()):
            return False
        return all(sha256_of(root / rel if rel else root) == f["sha256"] for rel, f in files.items())
    except OSError:
        return False


def doc_for(e: Entry, snap: Snap, hashes: Mapping[str, str], *, profile: Profile | None,
            nodes: int = 1, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of ``e`` as published with ``snap`` (sizes, mtimes) and ``hashes``."""
    files = {rel: entry(size, mt, hashes[rel]) for rel, (size, mt) in snap.files.items()}
    return checkpoint_doc(e, files, profile=profile, nodes=nodes, extra=extra)


def write(dst: Path, doc: Mapping[str, Any], *, fsync: bool) -> Path:
    """``.supervise/manifests/<name>.json`` through a temp name (``write_atomic``). Blocking."""
    path = path_of(dst, str(doc["checkpoint"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    _fsops.write_atomic(path, dumps(doc), time.time_ns(), fsync=fsync)
    return path


def read(dst: Path, name: str) -> dict[str, Any] | None:
    """The manifest of ``name``, or None (none written, unreadable, or not ours). Blocking."""
    try:
        with open(path_of(dst, name), "rb") as f:
            doc = loads(f.read())
    except OSError:
        return None
    if doc is None or doc.get("checkpoint") != name or not isinstance(doc.get("files"), dict):
        return None
    return doc


def describes(doc: Mapping[str, Any] | None, snap: Snap | None) -> bool:
    """Does ``doc`` describe the copy whose sizes and mtimes are ``snap``? Every file, no more."""
    if doc is None or snap is None:
        return False
    files = doc["files"]
    return files.keys() == snap.files.keys() and all(
        (int(f["size"]), int(f["mtime_ns"])) == snap.files[rel] for rel, f in files.items())


def drop(dst: Path, name: str) -> None:
    """Remove ``name``'s manifest, if any. Blocking."""
    try:
        os.unlink(path_of(dst, name))
    except FileNotFoundError:
        pass
