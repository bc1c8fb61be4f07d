"""Local versions set aside on a per-node pair, so no rank loads one the other nodes lack.

Before a per-node pair restores, every local version that is not the one every node restores
is moved under the hidden ``LOCAL/.supervise-set-aside/`` (kept for you, never copied, never
restored; journaled as ``part-set-aside``): a checkpoint never published (this node's part
alone: its other parts may be on nodes that are gone), another version of a published name,
and what a host wrote while it held another node's role in the attempt before. Blocking.
Rules: docs/multinode.md, "One version on every node".
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from supervisor.config import SyncPair
from supervisor.journal import Emit
from supervisor.sync import _content
from supervisor.sync._complete import Snap, identical, snapshot
from supervisor.sync._exclude import within
from supervisor.sync._versions import contains

SET_ASIDE_DIR = ".supervise-set-aside"  # hidden: never a checkpoint, never copied


def role_before(previous_start: Mapping[str, Any] | None, host: str) -> int | None:
    """This host's node index in the attempt before (its leader's ``start`` event), or None."""
    nodes = [str(n).split(".")[0] for n in (previous_start or {}).get("nodes") or []]
    short = host.split(".")[0]
    return nodes.index(short) if short in nodes else None


def set_aside(p: SyncPair, node: int, emit: Emit, why: str, keep: str | None = None) -> list[str]:
    """Move every local checkpoint of ``p`` that is not on persistent storage under the hidden
    ``.supervise-set-aside/`` (kept for you, never copied, never restored): ``part-set-aside``.
    ``keep``: the version every node restores (chosen from the nodes' copies: not published)."""
    try:
        names = sorted(os.listdir(p.src))
    except OSError:
        return []
    moved = []
    for name in names:
        if name.startswith(".") or name == keep or os.path.lexists(p.dst / name) or os.path.islink(p.src / name) \
                or not os.path.isdir(p.src / name) and not os.path.isfile(p.src / name):
            continue
        if _move_aside(p, name, node, emit, why):
            moved.append(name)
    return moved


def set_aside_names(p: SyncPair, node: int, emit: Emit, names: list[str], why: str) -> list[str]:
    """Move the local entries ``names`` names aside, whatever they are (versions the leader
    passed over: no copy of one verified on some node, and a rank loading the newest it finds
    would load it here and an older one there)."""
    return [n for n in names if os.path.lexists(p.src / n) and _move_aside(p, n, node, emit, why)]


def _move_aside(p: SyncPair, name: str, node: int, emit: Emit, why: str) -> bool:
    where = p.src / SET_ASIDE_DIR
    where.mkdir(parents=True, exist_ok=True)
    target, n = where / name, 1
    while os.path.lexists(target):
        target, n = where / f"{name}.{n}", n + 1
    try:
        os.rename(p.src / name, target)
    except OSError:
        return False
    emit("part-set-aside", pair=p.name, checkpoint=name, node=node, to=str(target), why=why)
    return True


def set_aside_versions(p: SyncPair, node: int, emit: Emit, why: str, keep: str | None = None) -> list[str]:
    """Set aside every local entry of ``p`` whose name is published with another content
    (``snapshot.pt`` saved again after the version on persistent storage): a rank loading
    it would resume from a version the other nodes do not have. ``keep``: a version chosen
    from the nodes' copies, newer than the published one of its name: the restore verifies it."""
    moved = []
    try:
        names = sorted(os.listdir(p.src))
    except OSError:
        return []
    for name in names:
        if name.startswith(".") or name == keep or os.path.islink(p.src / name) or not os.path.lexists(p.dst / name):
            continue
        there = snapshot(p.dst / name, within(name, p.exclude))
        mine = snapshot(p.src / name, within(name, p.exclude))
        whole = there is not None and mine is not None and there.files.keys() == mine.files.keys()
        if mine is None or there is None or (_same_version(p, name, mine, there) if whole else contains(there, mine)):
            continue
        if _move_aside(p, name, node, emit, why):
            moved.append(name)
    return moved


def _same_version(p: SyncPair, name: str, mine: Snap, there: Snap) -> bool:
    """Is the local ``name`` the published version? By the content manifest where one describes
    the published copy (this node's bytes hashed, nothing read back from persistent storage),
    else byte for byte against it."""
    doc = _content.read(p.dst, name)
    if not _content.describes(doc, there):
        return identical(p.src / name, p.dst / name, mine, there)
    assert doc is not None
    return _content.holds_version(p.src / name, doc)
