"""Node 0 (the leader) and node 1 of a per-node pair, as two real mirrors in one process: each
its own local directory and peer server, one persistent side and one run directory shared, as
the nodes of a job share them (tests/sync/test_peer_restore.py, tests/sync/test_ring.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import anyio

from supervisor.config import SyncPair
from supervisor.sync import Mirror
from tests.support.emit import Events


def pair(local: Path, dst: Path) -> SyncPair:
    return SyncPair("ckpt", "checkpoint", local, dst, restore=True, nodes=2, settle=0.2)


def save(local: Path, data: bytes) -> None:
    """The DDP tutorial's save: rank 0 ``torch.save``s snapshot.pt on its node (whole, then renamed)."""
    local.mkdir(parents=True, exist_ok=True)
    tmp = local / ".snapshot.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, local / "snapshot.pt")


def flip(path: Path) -> None:
    """One byte of ``path`` flipped, its size and mtime kept (what a sizes-and-mtimes check misses)."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[7] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def mirrors(tmp_path: Path, dst: Path, events: tuple[Events, Events]) -> tuple[Mirror, Mirror]:
    """Node 0's and node 1's mirrors over ``tmp_path/n0`` and ``tmp_path/n1``."""
    return (Mirror([pair(tmp_path / "n0", dst)], emit=events[0], node_rank=0, backend="python"),
            Mirror([pair(tmp_path / "n1", dst)], emit=events[1], node_rank=1, backend="python"))


async def before_the_spawn(tmp_path: Path, dst: Path, events: tuple[Events, Events],
                           spoil: Callable[[], Any] | None = None) -> tuple[dict, Path | None, Path | None]:
    """The leader's and node 1's offer, choice and restore, as ``fleet.restore_everywhere`` runs
    them, with both peer servers up. ``spoil`` runs between the offers and the restores."""
    m0, m1 = mirrors(tmp_path, dst, events)
    async with anyio.create_task_group() as tg:
        await tg.start(m0.serve_peers, tmp_path / "run")
        await tg.start(m1.serve_peers, tmp_path / "run")
        offered = await m1.offer()
        choice = await m0.choose({1: offered})
        if spoil is not None:
            spoil()
        got1 = await m1.restore(choice)
        got0 = await m0.restore(choice)
        tg.cancel_scope.cancel()
    return choice, got0, got1
