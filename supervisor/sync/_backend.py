"""How bytes move: rsync when it is on PATH, the pure-Python copier otherwise.

One small interface, chosen once (as httpx chooses a transport). Both backends run the copy
in a child process at lowered CPU and I/O priority, as an argv list (docs/design.md, invariant 5), through
``run_copier``: a cancelled await kills the copier's process group, so a flush cut
short by its deadline leaves nothing writing behind our back. Neither backend ever deletes.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import anyio

from supervisor import proctree
from supervisor._units import signal_name
from supervisor.child import spawn_process
from supervisor.sync._complete import PARTIAL_DIR

OK_CODES = (0, 24)  # 24: some source files vanished (rotation) — normal, not a failure
PYCOPY = Path(__file__).with_name("_pycopy.py")


class CopyError(Exception):
    """A copy that did not finish; ``errno`` when the cause is known (ENOSPC, EROFS, ...)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno

    @property
    def code(self) -> str | None:
        return _errno.errorcode.get(self.errno) if self.errno else None


@dataclass
class CopyResult:
    files: int = 0
    bytes: int = 0
    vanished: bool = False

    def __iadd__(self, other: "CopyResult") -> "CopyResult":
        self.files += other.files
        self.bytes += other.bytes
        self.vanished = self.vanished or other.vanished
        return self


class Backend(Protocol):
    """Copies that never delete. Paths are absolute; ``src``/``dst`` of trees are directories."""

    name: str

    async def copy_tree(self, src: Path, dst: Path, *, exclude: Sequence[str] = (),
                        skip: Sequence[str] = (), fsync: bool = False, fresh: bool = False) -> CopyResult:
        """Contents of ``src`` into ``dst``, files through temp names, ``skip`` (the markers,
        which the mirror copies itself afterwards) left out. ``fresh``: ``dst`` is a staging
        directory this publish made, hidden and all ours, so it is itself the temp name and
        files are written in place (a rename per file costs a third of a small-file copy); a
        file cut short keeps a fresh mtime, so the next copy's quick check redoes it."""

    async def copy_file(self, src: Path, dst: Path, *, fsync: bool = False) -> CopyResult:
        """One file to one path, through a temp name."""

    async def grow(self, src: Path, dst: Path, *, exclude: Sequence[str] = (), fsync: bool = False,
                   only: Sequence[str] | None = None) -> CopyResult:
        """Logs: grow destination files in place (same inode); ``only``: just these files
        (relative to ``src``), not a walk of the whole tree."""


def priority_prefix(nice: int, ionice: str) -> list[str]:
    """``ionice -t -c3 nice -n10``: copies yield to the training's own I/O and CPU.

    ``-t`` makes ionice run the command even where the class cannot be set (containers).
    """
    out: list[str] = []
    if ionice != "none" and shutil.which("ionice"):
        out += ["ionice", "-t", "-c", "3"] if ionice == "idle" else ["ionice", "-t", "-c", "2", "-n", "7"]
    if nice > 0 and shutil.which("nice"):
        out += ["nice", "-n", str(nice)]
    return out


@dataclass
class _Done:
    returncode: int
    stdout: bytes
    stderr: bytes


COPIER_STALL = 120.0  # seconds without a byte read or written: a hung copier (a stuck Lustre stat)
STALL_ENV = "SUPERVISE_COPIER_STALL"  # tests and sites with slow metadata servers change it
REAP_BOUND = 2.0  # after SIGKILL: a process in uninterruptible sleep may never go; we do not wait on it


def copier_stall() -> float:
    """The stall bound, from SUPERVISE_COPIER_STALL when it holds a positive number."""
    try:
        value = float(os.environ.get(STALL_ENV, ""))
    except ValueError:
        return COPIER_STALL
    return value if 0 < value < float("inf") else COPIER_STALL


async def run_copier(argv: list[str], *, stdin: bytes | None = None, env: dict[str, str] | None = None) -> _Done:
    """Run one copier in its own process group (in our session) and collect its output.

    On cancellation, or when the group has read and written nothing for ``copier_stall()``
    seconds, the whole group is SIGKILLed (rsync forks a receiver and a generator; killing
    only the parent leaves them writing for a while) and reaped, shielded and bounded, so a
    flush cut short returns with nothing of ours still writing, and a copier stuck in the
    kernel is given up on rather than waited for. The copier gets SIGKILL if we die.
    """
    proc = await spawn_process(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, own_group=True)
    out: list[bytes] = []
    err: list[bytes] = []
    stalled = False

    async def drain(stream: asyncio.StreamReader | None, into: list[bytes]) -> None:
        while stream is not None and (chunk := await stream.read(65536)):
            into.append(chunk)

    async def feed() -> None:
        if proc.stdin is None:
            return
        try:
            if stdin:
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass

    async def watch(scope: anyio.CancelScope) -> None:
        nonlocal stalled
        bound, last, since = copier_stall(), -1, time.monotonic()
        while True:
            await anyio.sleep(min(1.0, bound / 4))
            io = await anyio.to_thread.run_sync(_group_io, proc.pid)
            if io != last:
                last, since = io, time.monotonic()
            elif time.monotonic() - since >= bound:
                stalled = True
                scope.cancel()
                return

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, tg.cancel_scope)
            async with anyio.create_task_group() as io_tg:
                io_tg.start_soon(drain, proc.stdout, out)
                io_tg.start_soon(drain, proc.stderr, err)
                io_tg.start_soon(feed)
            await proc.wait()
            tg.cancel_scope.cancel()
        if stalled:
            raise CopyError(f"copier stalled: nothing read or written for {copier_stall():g}s; killed")
        rc = proc.returncode
        assert rc is not None
    except BaseException:
        with anyio.CancelScope(shield=True):
            _killpg(proc.pid)
            with anyio.move_on_after(REAP_BOUND):
                await proc.wait()
            with anyio.move_on_after(0.5):  # the group's other members, reaped by init
                while _group_alive(proc.pid):
                    await anyio.sleep(0.01)
        raise
    return _Done(rc, b"".join(out), b"".join(err))


def _group_io(pgid: int) -> int:
    """Bytes read and written so far by the live members of a process group (rchar+wchar:
    they count metadata-free progress too, such as a checksum pass over a local file)."""
    total = 0
    for p in proctree.all_processes():
        if p.pgid != pgid:
            continue
        try:
            with open(f"/proc/{p.pid}/io", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
            total += int(fields.get(b"rchar", 0)) + int(fields.get(b"wchar", 0)) + p.pid
        except (OSError, ValueError):
            total += p.pid  # gone, or /proc/PID/io not ours to read: a new member counts as change
    return total


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _failure(what: str, rc: int, stderr: str) -> CopyError:
    if rc < 0:
        return CopyError(f"{what} killed by {signal_name(-rc)}")
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and "vanished" not in ln]
    errno = None
    for ln in lines:
        m = re.search(r"\((\d+)\)\s*$", ln)
        if m:
            errno = int(m.group(1))
            break
    if errno is None:
        for code, needle in ((_errno.ENOSPC, "No space left"), (_errno.EROFS, "Read-only file system"),
                             (_errno.EACCES, "Permission denied"), (_errno.ENOENT, "No such file or directory")):
            if any(needle in ln for ln in lines):
                errno = code
                break
    detail = next((ln for ln in lines if re.search(r"\(\d+\)\s*$", ln)), lines[0] if lines else "")
    return CopyError(f"{what} exit {rc}: {detail}"[:500], errno)


class RsyncBackend:
    """rsync with argv lists, ``--`` before paths, exit 24 accepted, never ``--delete``.

    Paths are always absolute, so a ``:`` in a name is never read as ``host:path``.
    Checkpoint copies use ``--modify-window=-1`` (nanosecond quick check): on a recopy, a
    shard rewritten within the same second at the same size is not skipped as unchanged.
    """

    name = "rsync"

    def __init__(self, rsync: str, nice: int = 10, ionice: str = "idle") -> None:
        self.rsync = rsync
        self.prefix = priority_prefix(nice, ionice)
        self._has_fsync: bool | None = None

    async def _fsync_flag(self, fsync: bool) -> list[str]:
        if not fsync:
            return []
        if self._has_fsync is None:  # --fsync arrived in 3.2.4
            r = await anyio.run_process([self.rsync, "--version"], check=False)
            m = re.search(rb"version (\d+)\.(\d+)\.(\d+)", r.stdout)
            self._has_fsync = bool(m) and tuple(int(x) for x in m.groups()) >= (3, 2, 4)
        return ["--fsync"] if self._has_fsync else []

    async def _run(self, args: list[str], stdin: bytes | None = None, fsync_tree: Path | None = None) -> CopyResult:
        argv = [*self.prefix, self.rsync, "-a", "--stats", *args]
        r = await run_copier(argv, stdin=stdin, env={**os.environ, "LC_ALL": "C"})
        err = r.stderr.decode("utf-8", "replace")
        if r.returncode not in OK_CODES:
            raise _failure("rsync", r.returncode, err)
        out = r.stdout.decode("utf-8", "replace")
        files = re.search(r"Number of regular files transferred:\s*([\d,]+)", out)
        size = re.search(r"Total transferred file size:\s*([\d,]+)", out)
        res = CopyResult(int(files.group(1).replace(",", "")) if files else 0,
                         int(size.group(1).replace(",", "")) if size else 0,
                         r.returncode == 24)
        if fsync_tree is not None and self._has_fsync is False:
            await anyio.to_thread.run_sync(fsync_all, fsync_tree)
        return res

    async def copy_tree(self, src, dst, *, exclude=(), skip=(), fsync=False, fresh=False):
        where = "--inplace" if fresh else f"--partial-dir={PARTIAL_DIR}"
        args = [where, "--modify-window=-1", *await self._fsync_flag(fsync)]
        args += [f"--exclude={p}" for p in exclude]
        args += [f"--exclude=/{_escape(s)}" for s in skip]
        return await self._run([*args, "--", f"{src}/", f"{dst}/"], fsync_tree=dst if fsync else None)

    async def copy_file(self, src, dst, *, fsync=False):
        args = [f"--partial-dir={PARTIAL_DIR}", "--modify-window=-1", *await self._fsync_flag(fsync)]
        return await self._run([*args, "--", str(src), str(dst)], fsync_tree=dst if fsync else None)

    async def grow(self, src, dst, *, exclude=(), fsync=False, only=None):
        # --append-verify implies --inplace: same inode, so open readers see new data.
        args = ["--append-verify", *await self._fsync_flag(fsync), *[f"--exclude={p}" for p in exclude]]
        listed = None
        if only is not None:  # NUL-separated names on stdin: any byte but NUL is allowed in a name
            args += ["--from0", "--files-from=-"]
            listed = b"\0".join(os.fsencode(rel) for rel in only)
        return await self._run([*args, "--", f"{src}/", f"{dst}/"], stdin=listed, fsync_tree=dst if fsync else None)


def _escape(rel: str) -> str:
    """An exact path as an rsync filter pattern (wildcards escaped)."""
    return re.sub(r"([*?\[\\])", r"\\\1", rel)


class PythonBackend:
    """The same operations through ``_pycopy.py`` in a child process (see its docstring)."""

    name = "python"

    def __init__(self, nice: int = 10, ionice: str = "idle") -> None:
        self.prefix = priority_prefix(nice, ionice)

    async def _run(self, req: dict) -> CopyResult:
        argv = [*self.prefix, sys.executable, "-I", "-S", str(PYCOPY)]  # -S: no site, faster start
        r = await run_copier(argv, stdin=json.dumps(req, default=str).encode())
        try:
            out = json.loads(r.stdout or b"{}")
        except ValueError:
            out = {}
        if r.returncode not in OK_CODES:
            if r.returncode < 0 or not out:
                raise _failure("python copy", r.returncode, r.stderr.decode("utf-8", "replace"))
            raise CopyError(f"python copy: {out.get('error')}", out.get("errno"))
        return CopyResult(out.get("files", 0), out.get("bytes", 0), r.returncode == 24)

    async def copy_tree(self, src, dst, *, exclude=(), skip=(), fsync=False, fresh=False):
        return await self._run({"mode": "tree", "src": src, "dst": dst, "exclude": list(exclude),
                                "skip": list(skip), "fsync": fsync, "in_place": fresh})

    async def copy_file(self, src, dst, *, fsync=False):
        return await self._run({"mode": "file", "src": src, "dst": dst, "fsync": fsync})

    async def grow(self, src, dst, *, exclude=(), fsync=False, only=None):
        req = {"mode": "grow", "src": src, "dst": dst, "exclude": list(exclude), "fsync": fsync}
        if only is not None:
            req["only"] = list(only)
        return await self._run(req)


def choose_backend(name: str = "auto", *, nice: int = 10, ionice: str = "idle") -> Backend:
    """``auto``: rsync when on PATH; ``rsync`` insists on it (ConfigError-worthy if missing)."""
    rsync = shutil.which("rsync")
    if name == "python" or (name == "auto" and rsync is None):
        return PythonBackend(nice, ionice)
    if rsync is None:
        raise FileNotFoundError("rsync is not on PATH")
    return RsyncBackend(rsync, nice, ionice)


def fsync_all(root: Path) -> None:
    """fsync every file and directory under ``root`` (rsync < 3.2.4 has no --fsync)."""
    if root.is_file():
        _fsync(root)
        return
    for d, _dirs, files in os.walk(root):
        for f in files:
            _fsync(Path(d) / f)
        _fsync(Path(d))


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

