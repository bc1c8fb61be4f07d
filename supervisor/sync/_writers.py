"""Which files is the training writing right now? Asked of the kernel, not guessed from clocks.

A file is being written while a process of the training's tree holds it open for writing:
``/proc/PID/fd/N`` names the file and ``/proc/PID/fdinfo/N``'s ``flags`` say how it was
opened. This is the evidence that lets a checkpoint be published the moment its writer
closes it, instead of after a quiet period (docs/sync.md, "What a checkpoint is").

Limits: only this node's processes are seen (another node's writes to a shared local side
are not), a writer outside the tree is not seen, and a file written through a shared
writable ``mmap`` after its descriptor was closed is not seen. Blocking reads of /proc:
call from a worker thread.
"""

from __future__ import annotations

import os
from typing import Iterable

_WRITE_MODES = (os.O_WRONLY, os.O_RDWR)


def _opened_for_write(pid: int, fd: str) -> bool:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as f:
            for line in f:
                if line.startswith(b"flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE in _WRITE_MODES
    except (OSError, ValueError, IndexError):
        return False
    return False


def open_for_write(pids: Iterable[int], under: str) -> dict[str, int] | None:
    """Paths below the directory ``under`` (a real path) that one of ``pids`` holds open for
    writing, each with one such pid. None when a process's descriptors cannot be read
    (another user's process): then the writer is not visible and callers fall back."""
    prefix = under.rstrip("/") + "/"
    found: dict[str, int] = {}
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            continue  # exited meanwhile: it holds nothing any more
        except PermissionError:
            return None
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith(prefix) and _opened_for_write(pid, fd):
                found[target.removesuffix(" (deleted)")] = pid
    return found
