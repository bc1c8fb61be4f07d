"""The processes of the training tree, read from /proc (Linux).

Used to stop everything the child started, to sample the tree's CPU and memory, and to
find a launcher's ranks. Reads race with processes exiting; every reader tolerates that.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    comm: str
    start: int = 0  # clock ticks after boot (stat field 22): with the pid, names one process over time


def read_stat(pid: int) -> ProcInfo | None:
    """One process's /proc/PID/stat, or None if it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_bytes().decode("utf-8", "replace")
    except OSError:
        return None
    # comm is in parentheses and may itself hold spaces or parentheses.
    lpar, rpar = raw.find("("), raw.rfind(")")
    rest = raw[rpar + 2 :].split()
    try:
        return ProcInfo(pid=pid, ppid=int(rest[1]), pgid=int(rest[2]), sid=int(rest[3]), state=rest[0],
                        comm=raw[lpar + 1 : rpar], start=int(rest[19]))
    except (IndexError, ValueError):
        return None


def all_processes() -> list[ProcInfo]:
    out = []
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            info = read_stat(int(entry.name))
            if info is not None:
                out.append(info)
    return out


def descendants(root: int, procs: list[ProcInfo] | None = None) -> set[int]:
    """Every live process below ``root`` (not ``root`` itself)."""
    procs = all_processes() if procs is None else procs
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    out: set[int] = set()
    stack = [root]
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in out:
                out.add(c)
                stack.append(c)
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    info = read_stat(pid)
    return info is not None and info.state != "Z"


def in_groups(pgids: set[int], procs: list[ProcInfo] | None = None) -> set[int]:
    """Live, non-zombie processes whose process group is one of ``pgids``."""
    procs = all_processes() if procs is None else procs
    return {p.pid for p in procs if p.pgid in pgids and p.state != "Z"}
