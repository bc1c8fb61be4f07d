"""Which of the allocation's nodes an attempt trains on, and the launcher's node list to match.

A job may hold spare nodes (``spare_nodes = K``, issue 41): the training runs on the
allocation less K nodes, and when a node dies the next attempt runs inside the same
allocation on a spare instead of going back to the queue. The leader's plan asks it for the
attempt's nodes (``attempt_nodes``) and the command that runs there (``on_nodes``); the one file
it writes is an attempt's nodefile (``write_nodefile``, PBS). The nodes an attempt uses travel
to its node agents in ``childenv.JOB_NODES`` (the scheduler's own variables still name the
whole allocation).
"""

from __future__ import annotations

import os
from pathlib import Path
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


def on_nodes(argv: Sequence[str], nodes: Sequence[str], allocation: Sequence[str],
             nodefile: tuple[str, str] | None = None) -> tuple[str, ...]:
    """The command, told to run on ``nodes`` when they are not the whole allocation. Only what
    must change changes: ``srun`` gets ``--nodes=N --nodelist=… --overlap`` (by itself it would
    start a task on every node of the allocation, spares included); the job's nodefile (PBS's
    ``Job.nodefile``, which ``mpiexec --hostfile`` reads), wherever the command names it, becomes
    the attempt's own (``nodefile``: (the job's, the attempt's), written by ``write_nodefile``).
    A host list the user spelled out (``-H n1,n2``) is left as it is."""
    argv = tuple(argv)
    if not nodes or tuple(nodes) == tuple(allocation):
        return argv
    if nodefile is not None:
        argv = tuple(_nodefile_arg(a, *nodefile) for a in argv)
    at = _launcher_index(argv, "srun")
    if at is None:
        return argv
    # --overlap: the last attempt's step may still hold the survivors' CPUs while Slurm completes it
    # on the dead node ("Requested nodes are busy"); its tasks are gone, the new step takes them
    spread = (f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}", "--overlap")
    return (*argv[: at + 1], *spread, *argv[at + 1:])


def write_nodefile(job_file: str, ours: str, nodes: Sequence[str]) -> None:
    """The attempt's nodefile: the job's lines (one per slot) of the attempt's nodes only, the
    leader's first, the others in the job's order; whole or not at all (temp + rename)."""
    order = {n: i for i, n in enumerate(nodes)}
    lines = [ln.strip() for ln in Path(job_file).read_text().splitlines() if ln.strip()]
    kept = sorted((ln for ln in lines if ln in order or _short(ln) in order),
                  key=lambda ln: order.get(ln, order.get(_short(ln), 0)))  # stable: slots keep their order
    path = Path(ours)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{ln}\n" for ln in kept))
    os.replace(tmp, path)


def nodefile_path(run_dir: Path, nodes: Sequence[str]) -> Path:
    """Where an attempt on ``nodes`` keeps its nodefile (one per node set, in the run directory
    every node sees)."""
    return run_dir / "nodes" / f"nodefile-{'-'.join(nodes)}"


def _nodefile_arg(arg: str, job_file: str, ours: str) -> str:
    """One word of the command with the job's nodefile, alone (``--hostfile PATH``) or after
    ``=`` (``--hostfile=PATH``), turned into the attempt's."""
    if arg == job_file:
        return ours
    if arg.endswith(f"={job_file}"):
        return arg[: -len(job_file)] + ours
    return arg


def _short(host: str) -> str:
    return host.split(".", 1)[0]


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
