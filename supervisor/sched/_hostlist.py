"""Slurm's compressed lists: ``gpu[01-04,07]`` hostlists and ``2(x3),1`` task counts.

Slurm writes its node lists (``SLURM_JOB_NODELIST``, ``ExcNodeList=``) and tasks per node
(``SLURM_TASKS_PER_NODE``) in these forms; submitit keeps the same parser beside its
``SlurmJobEnvironment``. Both raise ValueError on what they cannot read, so callers can fall back.
"""

from __future__ import annotations

import re


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist: ``gpu[01-04,07]``, ``a[1-2]-b[3-4]``, ``n1,gpu[1-2],x``.

    Zero padding follows the range's lower bound (``01`` → width 2). Several bracket groups
    in one name give their product, in the order Slurm prints them. Raises ValueError on
    an unbalanced bracket or a malformed range, so callers can fall back.
    """
    out: list[str] = []
    for name in _split_top_level(text.strip()):
        if name:
            out.extend(_expand_one(name))
    return tuple(out)


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _expand_one(name: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", name)
    if not m:
        return [name]
    head, tail = name[: m.start()], name[m.end():]
    out = []
    for piece in m.group(1).split(","):
        lo, sep, hi = piece.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {piece!r} in hostlist {name!r}")
        width = len(lo)
        for i in range(int(lo), int(hi if sep else lo) + 1):
            for rest in _expand_one(tail):
                out.append(f"{head}{i:0{width}d}{rest}")
    return out


def expand_tasks_per_node(text: str) -> tuple[int, ...]:
    """``2(x3),1`` (SLURM_TASKS_PER_NODE) → ``(2, 2, 2, 1)``."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"bad tasks-per-node {text!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return tuple(out)
