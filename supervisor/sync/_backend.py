"""How bytes move: rsync when it is on PATH, the pure-Python copier otherwise.

One small interface, chosen once (as httpx chooses a transport). Both backends run the copy
in a child process at lowered CPU and I/O priority, as an argv list (docs/design.md, invariant 5), through
``run_copier``: a cancelled await kills the copier's process group, so a flush cut
short by its deadline leaves nothing writing behind our back. Neither backend ever deletes.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import heapq
import itertools
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Awaitable, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

import anyio

from supervisor import proctree
from supervisor._units import signal_name
from supervisor.child import spawn_process
from supervisor.sync import _stall
from supervisor.sync._complete import PARTIAL_DIR

OK_CODES = (0, 24)  # 24: some source files vanished (rotation) — normal, not a failure
PYCOPY = Path(__file__).with_name("_pycopy.py")
# A checkpoint's files as its snapshot lists them: relative path → (size, mtime_ns).
Files = Mapping[str, tuple[int, int]]
PER_FILE_COST = 64 << 10  # bytes a file's create/stat/close is worth when sharing files among streams
LIST_CHUNK = 4096         # names per write of a --files-from list: the list is streamed, never built whole


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
    """What a copy did. ``hashes`` (asked with ``hash=True``): the sha256 hex digest of each
    file the copier itself copied, taken as it copied it, by path relative to the copy's
    source (``""`` for ``copy_file``); a file skipped as already whole, or a backend that
    cannot hash while copying (rsync), leaves it out: the caller hashes what is missing."""
    files: int = 0
    bytes: int = 0
    vanished: bool = False
    hashes: dict[str, str] = field(default_factory=dict)

    def __iadd__(self, other: "CopyResult") -> "CopyResult":
        self.files += other.files
        self.bytes += other.bytes
        self.vanished = self.vanished or other.vanished
        self.hashes.update(other.hashes)
        return self


@dataclass
class GrowResult(CopyResult):
    """A log pass's copy, with what the copier decided per file: each log's local inode now
    (the next pass's ``inodes``) and the logs that started over, as (log, kept as)."""
    inodes: dict[str, int] = field(default_factory=dict)
    restarted: list[tuple[str, str]] = field(default_factory=list)


class Backend(Protocol):
    """Copies that never delete. Paths are absolute; ``src``/``dst`` of trees are directories."""

    name: str

    async def copy_tree(self, src: Path, dst: Path, *, exclude: Sequence[str] = (),
                        skip: Sequence[str] = (), fsync: bool = False, fresh: bool = False,
                        files: Files | None = None, hash: bool = False) -> CopyResult:
        """Contents of ``src`` into ``dst``, files through temp names, ``skip`` (the markers,
        which the mirror copies itself afterwards) left out. ``fresh``: ``dst`` is a staging
        directory this publish made, hidden and all ours, so it is itself the temp name and
        files are written in place (a rename per file costs a third of a small-file copy); a
        file cut short keeps a fresh mtime, so the next copy's quick check redoes it.

        ``files``: the checkpoint's snapshot (excludes already applied): exactly these files
        are copied, without walking ``src`` again, shared among the backend's ``streams``
        copiers running at once; a directory with no file in it is not copied. One copier
        failing kills the others and fails the copy.

        ``hash``: the result's ``hashes`` holds the sha256 of each regular file copied, read
        once for both (the Python backend; rsync returns none, see ``CopyResult``)."""

    async def copy_file(self, src: Path, dst: Path, *, fsync: bool = False, hash: bool = False) -> CopyResult:
        """One file to one path, through a temp name; ``hash``: its sha256 under ``""``."""

    async def grow(self, src: Path, dst: Path, *, exclude: Sequence[str] = (), fsync: bool = False,
                   only: Sequence[str] | None = None, inodes: Mapping[str, int] | None = None) -> GrowResult:
        """Logs: grow destination files in place (same inode); ``only``: just these files
        (relative to ``src``), not a walk of the whole tree. Whether a local file started
        over (``inodes``: each log's inode at the last pass) is decided per file on the file
        being copied, and its persistent copy set aside first (``_pycopy.grow``)."""


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


async def run_copier(argv: list[str], *, stdin: bytes | Iterable[bytes] | None = None,
                     env: dict[str, str] | None = None, what: str = "copier") -> _Done:
    """Run one copier in its own process group (in our session) and collect its output.

    On cancellation, or when the group has read and written nothing for ``copier_stall()``
    seconds, the whole group is SIGKILLed (rsync forks a receiver and a generator; killing
    only the parent leaves them writing for a while) and reaped, shielded and bounded, so a
    flush cut short returns with nothing of ours still writing, and a copier stuck in the
    kernel is given up on rather than waited for. The copier gets SIGKILL if we die. It is
    ``what`` in flight on the pass's persistent side while it runs, moving while it does I/O
    (``_stall``).
    """
    with _stall.op(what):
        return await _run_copier(argv, stdin, env)


async def _run_copier(argv: list[str], stdin: bytes | Iterable[bytes] | None, env: dict[str, str] | None) -> _Done:
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
            for chunk in [stdin] if isinstance(stdin, bytes) else stdin or ():
                if chunk:
                    proc.stdin.write(chunk)
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
                if last != -1:  # the first look is no progress: it only starts the count
                    _stall.moved()
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
            if proc.returncode:  # killed, or failed: rsync's forked receiver must not write on
                await _kill_group(proc.pid)
            tg.cancel_scope.cancel()
        if stalled:
            raise CopyError(f"copier stalled: nothing read or written for {copier_stall():g}s; killed")
        rc = proc.returncode
        assert rc is not None
    except BaseException:
        with anyio.CancelScope(shield=True):
            members = _members(proc.pid)
            _killpg(proc.pid)
            with anyio.move_on_after(REAP_BOUND):
                await proc.wait()
            await _reap_members(proc.pid, members)
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


def _members(pgid: int) -> set[int]:
    """The group's processes other than its leader (rsync's forked receiver and generator)."""
    return {p.pid for p in proctree.all_processes() if p.pgid == pgid and p.pid != pgid}


async def _kill_group(pgid: int) -> None:
    members = _members(pgid)
    if members:
        _killpg(pgid)
        await _reap_members(pgid, members)


async def _reap_members(pgid: int, members: set[int]) -> None:
    """Wait (0.5 s at most) for the killed group to be gone. Its members outlive their leader
    and are re-parented to us (supervise is a child subreaper, and the orphan reaper leaves
    our own session's processes to whoever started them): each is reaped here by pid, or it
    would stay a zombie; one that is not ours (init took it) is init's to reap."""
    with anyio.move_on_after(0.5):
        while True:
            for pid in list(members):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        members.discard(pid)
                except ChildProcessError:
                    members.discard(pid)
            if not members and not _group_alive(pgid):
                return
            await anyio.sleep(0.01)


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


def share(files: Files, skip: Sequence[str], streams: int) -> list[list[str]]:
    """The files (less ``skip``) dealt among at most ``streams`` copiers, each about the same
    work: each file, in the snapshot's order, to the least loaded so far (bytes, plus
    ``PER_FILE_COST`` a file, since many small files cost their metadata operations more
    than their bytes). Two 4 GB shards go one to each stream; 100 000 small files split
    evenly. One pass, no sort and no per-file objects beyond the lists (100 000 files: ~1 MB)."""
    skipped = set(skip)
    if streams <= 1:
        names = [rel for rel in files if rel not in skipped]
        return [names] if names else []
    dealt: list[list[str]] = [[] for _ in range(streams)]
    loads = [(0, k) for k in range(streams)]
    for rel, (size, _mtime) in files.items():
        if rel in skipped:
            continue
        load, k = loads[0]
        dealt[k].append(rel)
        heapq.heapreplace(loads, (load + size + PER_FILE_COST, k))
    return [names for names in dealt if names]


def nul_list(names: Sequence[str]) -> Iterator[bytes]:
    """A ``--from0 --files-from`` list, in chunks (any byte but NUL may be in a name)."""
    for i in range(0, len(names), LIST_CHUNK):
        yield b"".join(os.fsencode(n) + b"\0" for n in names[i:i + LIST_CHUNK])


async def first_failure(calls: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run ``calls`` concurrently; the first to fail cancels the rest, and its exception (a
    copier's error, a ``StoreError``, a file gone) is raised as itself, not inside an exception
    group: the pair engine retries an ``OSError`` and would take a group for a crash."""
    failed: list[Exception] = []

    async def one(call: Callable[[], Awaitable[None]], scope: anyio.CancelScope) -> None:
        try:
            await call()
        except Exception as e:  # noqa: BLE001 - re-raised below, after the others are stopped
            if not failed:
                failed.append(e)
            scope.cancel()

    async with anyio.create_task_group() as tg:
        for call in calls:
            tg.start_soon(one, call, tg.cancel_scope)
    if failed:
        raise failed[0]


async def all_streams(jobs: Sequence[Callable[[], Awaitable[CopyResult]]]) -> CopyResult:
    """Run the copiers at once and add up what they did. The first to fail cancels the rest
    (``run_copier`` kills each one's process group) and its error is raised, as one copier's
    would be: the caller removes the staging directory, so nothing partial is published."""
    total = CopyResult()
    if len(jobs) == 1:
        total += await jobs[0]()
        return total

    async def one(job: Callable[[], Awaitable[CopyResult]]) -> None:
        nonlocal total
        total += await job()

    await first_failure([partial(one, job) for job in jobs])
    return total


def dir_attrs(src: Path, dst: Path, files: Iterable[str]) -> None:
    """Mode and times of the top directory and of every directory holding a file, as the
    source's, set after all streams are done (a stream still adding files to a directory
    would change its mtime after another set it). Deepest first, as rsync does."""
    dirs = {""}
    for rel in files:
        while "/" in rel:
            rel = rel.rsplit("/", 1)[0]
            if rel in dirs:
                break
            dirs.add(rel)
    for rel in sorted(dirs, key=lambda r: -r.count("/") if r else 1):
        try:
            st = os.lstat(src / rel if rel else src)
            os.chmod(dst / rel if rel else dst, stat.S_IMODE(st.st_mode))
            os.utime(dst / rel if rel else dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        except FileNotFoundError:
            continue  # gone from the source: the re-scan after the copy says so


class RsyncBackend:
    """rsync with argv lists, ``--`` before paths, exit 24 accepted, never ``--delete``.

    Paths are always absolute, so a ``:`` in a name is never read as ``host:path``.
    Checkpoint copies use ``--modify-window=-1`` (nanosecond quick check): on a recopy, a
    shard rewritten within the same second at the same size is not skipped as unchanged.
    ``hash=True`` is accepted and returns no hashes (rsync's own checksums are not sha256
    and are not reported): the caller hashes the local files itself.
    """

    name = "rsync"

    def __init__(self, rsync: str, nice: int = 10, ionice: str = "idle", streams: int = 1) -> None:
        self.rsync = rsync
        self.prefix = priority_prefix(nice, ionice)
        self.streams = streams
        self._has_fsync: bool | None = None
        self._logs = PythonBackend(nice, ionice)

    async def _fsync_flag(self, fsync: bool) -> list[str]:
        if not fsync:
            return []
        if self._has_fsync is None:  # --fsync arrived in 3.2.4
            r = await anyio.run_process([self.rsync, "--version"], check=False)
            m = re.search(rb"version (\d+)\.(\d+)\.(\d+)", r.stdout)
            self._has_fsync = bool(m) and tuple(int(x) for x in m.groups()) >= (3, 2, 4)
        return ["--fsync"] if self._has_fsync else []

    async def _run(self, args: list[str], stdin: bytes | Iterable[bytes] | None = None,
                   fsync_tree: Path | None = None) -> CopyResult:
        argv = [*self.prefix, self.rsync, "-a", "--stats", *args]
        r = await run_copier(argv, stdin=stdin, env={**os.environ, "LC_ALL": "C"}, what=f"rsync to {args[-1]}")
        err = r.stderr.decode("utf-8", "replace")
        if r.returncode == 23 and stdin is not None and _only_vanished(err):
            r.returncode = 24  # a listed file gone (rewritten under a new name): as a walk's exit 24
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

    async def copy_tree(self, src, dst, *, exclude=(), skip=(), fsync=False, fresh=False, files=None, hash=False):
        where = "--inplace" if fresh else f"--partial-dir={PARTIAL_DIR}"
        args = [where, "--modify-window=-1", *await self._fsync_flag(fsync)]
        if files is None:
            args += [f"--exclude={p}" for p in exclude]
            args += [f"--exclude=/{_escape(s)}" for s in skip]
            return await self._run([*args, "--", f"{src}/", f"{dst}/"], fsync_tree=dst if fsync else None)
        # The snapshot's list, one share per rsync (--files-from: no walk, no -r; the
        # parents of each file are made with the source's attributes, set again at the end).
        args += ["--from0", "--files-from=-", "--", f"{src}/", f"{dst}/"]
        await anyio.to_thread.run_sync(partial(os.makedirs, dst, exist_ok=True))
        shares = share(files, skip, self.streams)
        got = await all_streams([partial(self._run, args, stdin=nul_list(names)) for names in shares])
        await anyio.to_thread.run_sync(dir_attrs, src, dst, (n for names in shares for n in names))
        if fsync and self._has_fsync is False:
            await anyio.to_thread.run_sync(fsync_all, dst)
        return got

    async def copy_file(self, src, dst, *, fsync=False, hash=False):
        args = [f"--partial-dir={PARTIAL_DIR}", "--modify-window=-1", *await self._fsync_flag(fsync)]
        return await self._run([*args, "--", str(src), str(dst)], fsync_tree=dst if fsync else None)

    async def grow(self, src, dst, *, exclude=(), fsync=False, only=None, inodes=None):
        # The Python copier's grow: rsync --append-verify cannot set a restarted log aside
        # in the same step as it copies it, and it rereads the whole persistent copy to verify.
        return await self._logs.grow(src, dst, exclude=exclude, fsync=fsync, only=only, inodes=inodes)


_VANISHED = re.compile(r'^rsync: \[sender\] link_stat ".*" failed: No such file or directory \(2\)$'
                       r"|^rsync error: some files/attrs were not transferred|^file has vanished: ")


def _only_vanished(stderr: str) -> bool:
    """rsync exit 23 whose every complaint is a listed source file that is no longer there."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return bool(lines) and all(_VANISHED.search(ln) for ln in lines)


def _escape(rel: str) -> str:
    """An exact path as an rsync filter pattern (wildcards escaped)."""
    return re.sub(r"([*?\[\\])", r"\\\1", rel)


class PythonBackend:
    """The same operations through ``_pycopy.py`` in a child process (see its docstring)."""

    name = "python"

    def __init__(self, nice: int = 10, ionice: str = "idle", streams: int = 1) -> None:
        self.prefix = priority_prefix(nice, ionice)
        self.streams = streams

    async def _run(self, req: dict, listed: Sequence[str] | None = None) -> CopyResult:
        """One copier; ``listed``: names streamed after the request's line, NUL-separated."""
        out = await self._request(req, listed)
        return CopyResult(out.get("files", 0), out.get("bytes", 0), bool(out.get("vanished")),
                          dict(out.get("hashes") or {}))

    async def _request(self, req: dict, listed: Sequence[str] | None = None) -> dict:
        """One copier's result line (``_pycopy.main``); a failure raises ``CopyError``."""
        argv = [*self.prefix, sys.executable, "-I", "-S", str(PYCOPY)]  # -S: no site, faster start
        head = json.dumps({**req, "listed": listed is not None}, default=str).encode() + b"\n"
        r = await run_copier(argv, stdin=head if listed is None else itertools.chain([head], nul_list(listed)),
                             what=f"python copy to {req.get('dst')}")
        try:
            out = json.loads(r.stdout or b"{}")
        except ValueError:
            out = {}
        if r.returncode not in OK_CODES:
            if r.returncode < 0 or not out:
                raise _failure("python copy", r.returncode, r.stderr.decode("utf-8", "replace"))
            raise CopyError(f"python copy: {out.get('error')}", out.get("errno"))
        return {**out, "vanished": r.returncode == 24}

    async def copy_tree(self, src, dst, *, exclude=(), skip=(), fsync=False, fresh=False, files=None, hash=False):
        req = {"mode": "tree", "src": src, "dst": dst, "exclude": list(exclude), "skip": list(skip),
               "fsync": fsync, "in_place": fresh}
        if hash:  # read through the copier (no copy_file_range), hashed in the same loop
            req["hash"] = True
        if files is None:
            return await self._run(req)
        await anyio.to_thread.run_sync(partial(os.makedirs, dst, exist_ok=True))
        shares = share(files, skip, self.streams)
        got = await all_streams([partial(self._run, req, names) for names in shares])
        await anyio.to_thread.run_sync(dir_attrs, src, dst, (n for names in shares for n in names))
        return got

    async def copy_file(self, src, dst, *, fsync=False, hash=False):
        req = {"mode": "file", "src": src, "dst": dst, "fsync": fsync}
        if hash:
            req["hash"] = True
        return await self._run(req)

    async def grow(self, src, dst, *, exclude=(), fsync=False, only=None, inodes=None):
        req = {"mode": "grow", "src": src, "dst": dst, "exclude": list(exclude), "fsync": fsync,
               "inodes": dict(inodes or {})}
        if only is not None:
            req["only"] = list(only)
        out = await self._request(req)
        return GrowResult(out.get("files", 0), out.get("bytes", 0), bool(out.get("vanished")),
                          inodes=dict(out.get("inodes") or {}),
                          restarted=[(rel, kept) for rel, kept in out.get("restarted") or ()])


def choose_backend(name: str = "auto", *, nice: int = 10, ionice: str = "idle", streams: int = 1) -> Backend:
    """``auto``: rsync when on PATH; ``rsync`` insists on it (ConfigError-worthy if missing).
    ``streams``: copiers that share one checkpoint's files (``sync_streams``)."""
    rsync = shutil.which("rsync")
    if name == "python" or (name == "auto" and rsync is None):
        return PythonBackend(nice, ionice, streams)
    if rsync is None:
        raise FileNotFoundError("rsync is not on PATH")
    return RsyncBackend(rsync, nice, ionice, streams)


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

