"""Which version of a checkpoint a node holds, compared with another (blocking where it reads).

A per-node pair restores one version on every node and publishes a newer one only from its
own evidence: these compare a node's snapshot with the published one (``contains``), say when
a version was written (``written``) and what a node holds, to compare across nodes
(``version_of``). Rules: docs/multinode.md, "One version on every node".
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from supervisor.sync._complete import Snap, snapshot

SAME_SECOND_NS = 1_000_000_000  # mtimes this close may be one version (filesystems that keep whole seconds)


def contains(there: Snap | None, mine: Snap) -> bool:
    """Does the published ``there`` hold every file of this node's ``mine``, same size and
    mtime (within 1 s)? Other nodes' files may be there too."""
    if there is None:
        return False
    for rel, (size, mt) in mine.files.items():
        got = there.files.get(rel)
        if got is None or got[0] != size or abs(got[1] - mt) > SAME_SECOND_NS:
            return False
    return True


def written(snap: Snap) -> int:
    """When a version was written: its newest file's mtime (not ctime: a copy's is its copying)."""
    return max((mt for _size, mt in snap.files.values()), default=0)


def version_of(path: Path) -> dict[str, object]:
    """A version's identity on one node: name, bytes, newest mtime (ns) and sha256 (of a
    file's content; of a directory's sorted listing of names, sizes and mtimes). Blocking."""
    snap = snapshot(path)
    h = hashlib.sha256()
    if snap is not None and path.is_file():
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    elif snap is not None:
        for rel, (size, mt) in sorted(snap.files.items()):
            h.update(f"{rel}\0{size}\0{mt // 1_000_000_000}\n".encode())
    return {"name": path.name, "bytes": snap.bytes if snap else None, "mtime_ns": written(snap) if snap else None,
            "sha256": h.hexdigest()}
