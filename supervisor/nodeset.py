"""Which of the allocation's nodes an attempt trains on, and the launcher's node list to match.

A job may hold spare nodes (``spare_nodes = K``, issue 41): the training runs on the
allocation less K nodes, and when a node dies the next attempt runs inside the same
allocation on a spare instead of going back to the queue. This module is pure: the leader's
plan asks it for the attempt's nodes (``attempt_nodes``), and the conductor for the command
that runs there (``on_nodes``). The nodes an attempt uses travel to its node agents in
``childenv.JOB_NODES`` (the scheduler's own variables still name the whole allocation).
"""

from __future__ import annotations

import os
from typing import Sequence


def attempt_nodes(allocation: Sequence[str], *, spares: int, lost: Sequence[str] = (),
                  leader: str | None = None) -> tuple[str, ...] | None:
    """The nodes this attempt trains on: the allocation's width less ``spares``, the leader's
    own node first (the batch script runs there: it is node 0), then the other nodes that are
    not ``lost`` in allocation order (spares are taken in order). None when too few are left."""
    width = len(allocation) - spares
    healthy = [n for n in allocation if n not in lost]
    if leader in healthy:
        healthy.remove(leader)
        healthy.insert(0, leader)
    if width < 1 or len(healthy) < width:
        return None
    return tuple(healthy[:width])


def on_nodes(argv: Sequence[str], nodes: Sequence[str], allocation: Sequence[str]) -> tuple[str, ...]:
    """The command, told to run on ``nodes`` when they are not the whole allocation. Only what
    must change changes: ``srun`` gets ``--nodes=N --nodelist=… --overlap`` (by itself it would
    start a task on every node of the allocation, spares included). Other launchers name their hosts
    in the command the user wrote from the job's node list; they are left as they are."""
    argv = tuple(argv)
    if not nodes or tuple(nodes) == tuple(allocation):
        return argv
    at = _launcher_index(argv, "srun")
    if at is None:
        return argv
    # --overlap: the last attempt's step may still hold the survivors' CPUs while Slurm completes it
    # on the dead node ("Requested nodes are busy"); its tasks are gone, the new step takes them
    spread = (f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}", "--overlap")
    return (*argv[: at + 1], *spread, *argv[at + 1:])


def _launcher_index(argv: Sequence[str], name: str) -> int | None:
    """Where ``name`` is in the command, past ``env`` and its assignments."""
    for i, arg in enumerate(argv):
        base = os.path.basename(arg)
        if base == name:
            return i
        if base == "env" or ("=" in arg and not arg.startswith("-")) or (i > 0 and argv[0].endswith("env") and arg.startswith("-")):
            continue
        return None
    return None
