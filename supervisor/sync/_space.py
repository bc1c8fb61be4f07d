"""Will this node's next checkpoint fit on its local disk?

On a multi-node job each node's ranks write their shards to that node's own disk; when one
of them fills, the next save fails there (DCP raises on every rank) and the training dies
with an ``ENOSPC`` in one rank's traceback among many. Each node's per-node role looks at its
local side's free space on every pass and journals ``local-disk-full`` once, naming the node
and its host, when less is free than the largest checkpoint there: the next one will not fit.
It says so again only after the space came back and ran out again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from supervisor.sync._complete import Listing


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use under ``path``; None when it cannot tell."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class SpaceWatch:
    """One per-node pair's local side: says once when its next checkpoint will not fit."""

    def __init__(self) -> None:
        self.full = False

    def check(self, path: Path, listing: Listing) -> dict[str, Any] | None:
        """The ``local-disk-full`` fields when the disk has just become too full, else None.
        Blocking (statvfs): call it from a worker thread."""
        sizes = {name: e.snap.bytes for name, e in listing.entries.items() if e.snap.bytes > 0}
        if not sizes:
            return None
        name = max(sizes, key=lambda n: sizes[n])
        free = free_bytes(path)
        if free is None:
            return None
        full = free < sizes[name]
        said, self.full = self.full, full
        if full and not said:
            return {"free_bytes": free, "need_bytes": sizes[name], "checkpoint": name, "path": str(path)}
        return None
