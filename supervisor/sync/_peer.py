"""Files between node agents, directly over TCP, every byte verified (issue 43).

Each node of a multi-node job keeps its checkpoint files on its own local disk. To survive the
loss of a node without a trip through shared storage, a node *pushes* copies of its files to a
partner's local disk and, at restore time, *fetches* a file another node holds. This module is
the transport only: which files go where, and when, is the caller's.

One connection carries one request, a JSON line (at most ``MAX_LINE`` bytes; a longer one is
dropped unanswered) whose first field is the job's ``token``; every answer is a JSON line
``{"ok": true, …}`` or ``{"ok": false, "why": WORD}``, a refusal then closes the connection:

- ``{"token", "op": "get", "root": NAME, "rel": "a/b", "size": N}``: answered
  ``{"ok": true, "size": N, "mtime_ns": M}`` and exactly N raw bytes. The server does not hash:
  ``fetch`` does, against the sha256 its caller expects, and renames only a whole, matching file.
- ``{"token", "op": "put", "root": NAME, "rel": "node-1/x", "size": N, "mtime_ns": M}`` (``root``
  one of the inboxes, the first when absent): answered
  ``{"ok": true}`` (go ahead), or refused before any byte is sent (``quota``, ``path``); then
  the client sends N raw bytes and a trailing line ``{"sha256": HEX}``: the hash trails the
  body so that the pusher reads its file once, hashing as it sends. The server writes into a
  ``.tmp-<random>`` beside the final name, hashing as it receives, and answers ``{"ok": true}``
  once the file is fsynced, its mtime set and renamed into place; ``sha256`` (wrong hash) or
  ``short`` (the stream ended early) with the temp removed otherwise.
- ``{"token", "op": "drop", "root": NAME, "rel": "node-1/old"}``: that file or tree under the
  inbox removed (already gone is ``ok`` too).

Pushes land under the *inboxes* only (one per per-node pair); gets may read any named root. A ``rel`` is
refused (``path``) if it is absolute, has an empty, ``.`` or ``..`` component, or meets a
symlink anywhere on the way: each component is opened relative to its parent with
``O_NOFOLLOW``, so no check can be raced by a link swapped in after it. Waits are bounded one by
one (a client's ``timeout``, the server's ``IDLE_S``), never the whole transfer: a stalled peer
is noticed, a large file that keeps moving is never cut off.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import stat
from pathlib import Path
from functools import partial
from typing import Any, Awaitable, Callable, Iterator, Mapping, NamedTuple, Sequence, TypeVar

import anyio
from anyio.abc import SocketAttribute, SocketStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

log = logging.getLogger("supervise")

CHUNK = 1 << 20              # one read, one write, one hand-over to a worker thread
MAX_LINE = 4096              # a request, an answer or a trailer
IDLE_S = 60.0                # the server drops a peer silent this long on one wait
TMP = ".tmp-"                # a file still arriving; a rel may not name one
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
T = TypeVar("T")


class PeerError(OSError):
    """A transfer that did not happen, ``why`` one word (``token``, ``path``, ``missing``,
    ``size``, ``sha256``, ``short``, ``quota``, ``timeout``, ``closed``, ``connection``, ``io``…).
    An ``OSError``: to a restore, a peer that refuses or vanishes is one more way a copy could not
    be read, and the ``except OSError`` that falls back to another copy catches it too."""

    def __init__(self, why: str, detail: str = "") -> None:
        super().__init__(f"{why}: {detail}" if detail else why)
        self.why = why


def new_token() -> str:
    return secrets.token_hex(16)


class Sent(NamedTuple):
    """A file pushed: its bytes and the sha256 of what was sent (computed while sending)."""

    size: int
    sha256: str


class PeerServer:
    """Serves ``roots`` (name → directory) to the peers that know ``token``: gets from any
    root, puts and drops in the ``inbox`` roots only (a name or several; a request names one,
    else the first), a put refused when the files under that inbox and the pushes under way
    would come to more than ``quota_bytes``."""

    def __init__(self, roots: Mapping[str, Path], token: str, inbox: str | Sequence[str], quota_bytes: int,
                 host: str = "0.0.0.0") -> None:
        names = [inbox] if isinstance(inbox, str) else list(inbox)
        if not names or any(n not in roots for n in names):
            raise ValueError(f"the inbox {inbox!r} is not one of the roots {sorted(roots)}")
        self.roots = {name: Path(p) for name, p in roots.items()}
        self.inboxes = {n: self.roots[n] for n in names}
        self.inbox = self.inboxes[names[0]]
        self.quota = quota_bytes
        self.host = host
        self._token = token.encode()
        self._reserved = 0            # bytes of the pushes under way, not yet renamed into place
        self._arriving: set[tuple[int, int]] = set()   # their temp files (dev, ino): counted as reserved
        self._quota_lock: anyio.Lock | None = None

    async def serve(self, *, task_status: TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen on a free port, ``started((host, port))``, answer every connection at once
        until cancelled."""
        self._quota_lock = anyio.Lock()
        for inbox in self.inboxes.values():
            await _fs(partial(inbox.mkdir, parents=True, exist_ok=True))
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=0)
        port = listener.extra(SocketAttribute.local_port)
        log.info("peer files served on %s:%d (inbox %s)", self.host, port, self.inbox)
        task_status.started((self.host, port))
        async with listener:
            await listener.serve(self._serve)

    async def _serve(self, stream: SocketStream) -> None:
        """One connection; nothing a peer sends or fails to send stops the server."""
        async with stream:
            try:
                await self._request(stream)
            except (TimeoutError, *_GONE):
                pass                  # gone, silent, or a line too long: nothing to answer
            except Exception:
                log.exception("peer server: a request failed")

    async def _request(self, stream: SocketStream) -> None:
        reader = BufferedByteReceiveStream(stream)
        try:
            req = _json(await _line_in(reader, IDLE_S), "request")
            if not secrets.compare_digest(str(req.get("token", "")).encode(), self._token):
                raise PeerError("token")
            op = {"get": self._get, "put": self._put, "drop": self._drop}.get(str(req.get("op")))
            if op is None:
                raise PeerError("op")
            await op(stream, reader, req)
        except PeerError as e:
            await _within(IDLE_S, stream.send(_line(ok=False, why=e.why)))

    async def _get(self, stream: SocketStream, reader: BufferedByteReceiveStream, req: dict[str, Any]) -> None:
        name = req.get("root")
        root = self.roots.get(name) if isinstance(name, str) else None
        if root is None:
            raise PeerError("root")
        size = _count(req.get("size"))
        fd, mtime_ns = await _fs(_open_file, root, _parts(req.get("rel")), size)
        try:
            await _within(IDLE_S, stream.send(_line(ok=True, size=size, mtime_ns=mtime_ns)))
            left = size
            while left:  # from here on no answer can be said: a failure is a short stream, and the peer keeps nothing
                try:
                    data = await _fs(os.read, fd, min(CHUNK, left))
                except PeerError as e:
                    data, why = b"", str(e)
                else:
                    why = "it shrank"
                if not data:
                    log.warning("peer server: %s/%s not sent whole: %s", root, req.get("rel"), why)
                    return
                left -= len(data)
                await _within(IDLE_S, stream.send(data))
        finally:
            os.close(fd)

    def _inbox(self, req: Mapping[str, Any]) -> Path:
        name = req.get("root")
        inbox = self.inbox if name is None else self.inboxes.get(name) if isinstance(name, str) else None
        if inbox is None:
            raise PeerError("root")
        return inbox

    async def _put(self, stream: SocketStream, reader: BufferedByteReceiveStream, req: dict[str, Any]) -> None:
        inbox = self._inbox(req)
        parts = _parts(req.get("rel"))
        size, mtime_ns = _count(req.get("size")), _count(req.get("mtime_ns"))
        assert self._quota_lock is not None
        async with self._quota_lock:  # one decision at a time, so two pushes cannot both take the last room
            used = await _fs(_usage, inbox, set(self._arriving))
            if used + self._reserved + size > self.quota:
                raise PeerError("quota")
            self._reserved += size
        try:
            landing = await _fs(_Landing.under, inbox, parts)
            self._arriving.add(landing.key)
            try:
                await _within(IDLE_S, stream.send(_line(ok=True)))
                await _receive_into(reader, landing, size, IDLE_S)
                trailer = _json(await _line_in(reader, IDLE_S), "sha256")
                if trailer.get("sha256") != landing.sha.hexdigest():
                    raise PeerError("sha256")
                await _fs(landing.commit, mtime_ns)
            finally:
                self._arriving.discard(landing.key)
                landing.close()       # the temp removed unless renamed; synchronous, so a cancel cannot skip it
        finally:
            self._reserved -= size
        await _within(IDLE_S, stream.send(_line(ok=True)))

    async def _drop(self, stream: SocketStream, reader: BufferedByteReceiveStream, req: dict[str, Any]) -> None:
        await _fs(_remove, self._inbox(req), _parts(req.get("rel")))
        await _within(IDLE_S, stream.send(_line(ok=True)))


async def fetch(addr: tuple[str, int], token: str, root: str, rel: str, *, size: int, sha256: str,
                dest: Path, timeout: float) -> int:
    """``rel`` under the peer's ``root`` into ``dest``, which appears only whole and matching
    ``size`` and ``sha256`` (with the peer's mtime); the bytes fetched. ``PeerError`` otherwise,
    and nothing left behind. ``timeout`` bounds each wait (``PeerError("timeout")``)."""
    dest = Path(dest)
    landing = await _fs(_Landing.beside, dest)
    try:
        with _as_peer_error():
            async with await _connect(addr, timeout) as stream:
                reader = BufferedByteReceiveStream(stream)
                await _within(timeout, stream.send(_line(token=token, op="get", root=root, rel=rel, size=size)))
                answer = await _answer(reader, timeout)
                if answer.get("size") != size:
                    raise PeerError("size")
                await _receive_into(reader, landing, size, timeout)
            if landing.sha.hexdigest() != sha256.lower():
                raise PeerError("sha256", f"{root}/{rel} from {addr[0]}:{addr[1]}")
            mtime_ns = answer.get("mtime_ns")
            await _fs(landing.commit, mtime_ns if isinstance(mtime_ns, int) else None)
    finally:
        landing.close()
    return size


async def push(addr: tuple[str, int], token: str, src: Path, rel: str, *, timeout: float,
               rate: float | None = None, root: str | None = None) -> Sent:
    """``src`` to ``rel`` under the peer's inbox (``root``, else its first), read once and
    hashed as it is sent, its mtime kept; the bytes sent and their sha256. ``rate`` (bytes/s)
    keeps a background copy from crowding out the persistent one. ``PeerError`` on a refusal
    (``quota``, ``path``, ``sha256``…) or a lost peer."""
    fd, size, mtime_ns = await _fs(_open_source, Path(src))
    chunk = CHUNK if rate is None else max(1 << 16, min(CHUNK, int(rate)))  # each chunk well inside the peer's IDLE_S
    sha = hashlib.sha256()
    try:
        with _as_peer_error():
            async with await _connect(addr, timeout) as stream:
                reader = BufferedByteReceiveStream(stream)
                await _within(timeout, stream.send(_line(token=token, op="put", rel=rel, size=size, mtime_ns=mtime_ns,
                                                         **({"root": root} if root else {}))))
                await _answer(reader, timeout)   # the go-ahead: a refusal comes before any byte
                sent, start = 0, anyio.current_time()
                while sent < size:
                    data = await _fs(_read_hashing, fd, min(chunk, size - sent), sha)
                    if not data:
                        raise PeerError("changed", f"{src} shrank while being sent")
                    await _within(timeout, stream.send(data))
                    sent += len(data)
                    if rate:
                        await anyio.sleep(max(0.0, start + sent / rate - anyio.current_time()))
                await _within(timeout, stream.send(_line(sha256=sha.hexdigest())))
                await _answer(reader, timeout)
    finally:
        os.close(fd)
    return Sent(size, sha.hexdigest())


async def drop(addr: tuple[str, int], token: str, rel: str, *, timeout: float, root: str | None = None) -> None:
    """``rel`` (a file or a tree) removed from the peer's inbox (``root``, else its first)."""
    with _as_peer_error():
        async with await _connect(addr, timeout) as stream:
            reader = BufferedByteReceiveStream(stream)
            await _within(timeout, stream.send(_line(token=token, op="drop", rel=rel, **({"root": root} if root else {}))))
            await _answer(reader, timeout)


class _Landing:
    """A file arriving: a ``.tmp-<random>`` beside its final name (``O_EXCL|O_NOFOLLOW``),
    hashed as written, renamed into place only by ``commit``; ``close`` removes it otherwise."""

    def __init__(self, dir_fd: int, name: str) -> None:
        self.dir_fd, self.name = dir_fd, name
        self.tmp: str | None = f"{TMP}{secrets.token_hex(8)}"
        try:
            self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                              0o666, dir_fd=dir_fd)
        except BaseException:
            os.close(dir_fd)
            raise
        st = os.fstat(self.fd)
        self.key = (st.st_dev, st.st_ino)
        self.sha = hashlib.sha256()

    @classmethod
    def under(cls, root: Path, parts: list[str]) -> _Landing:
        if parts[-1].startswith(TMP):
            raise PeerError("path")
        return cls(_walk_to(root, parts, make=True), parts[-1])

    @classmethod
    def beside(cls, dest: Path) -> _Landing:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return cls(os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), dest.name)

    def write(self, data: bytes) -> None:
        self.sha.update(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def commit(self, mtime_ns: int | None) -> None:
        assert self.tmp is not None
        os.fsync(self.fd)
        if mtime_ns is not None:
            os.utime(self.fd, ns=(mtime_ns, mtime_ns))
        os.rename(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        self.tmp = None
        os.fsync(self.dir_fd)  # the rename itself durable

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp, dir_fd=self.dir_fd)
            self.tmp = None
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


def _parts(rel: object) -> list[str]:
    """``rel``'s components; ``PeerError("path")`` for anything that could leave the root."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        raise PeerError("path")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise PeerError("path")
    return parts


def _walk_to(root: Path, parts: list[str], *, make: bool) -> int:
    """A descriptor of the directory that holds ``parts[-1]``, each step below ``root`` opened
    relative to the last with ``O_NOFOLLOW`` (made first if ``make``)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=fd)
            below = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_file(root: Path, parts: list[str], size: int) -> tuple[int, int]:
    """The regular file at ``parts`` (its descriptor and mtime), if it has ``size`` bytes."""
    d = _walk_to(root, parts, make=False)
    try:  # O_NONBLOCK: a FIFO planted there must not hang the open
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d)
    finally:
        os.close(d)
    st = os.fstat(fd)
    why = "path" if not stat.S_ISREG(st.st_mode) else "size" if st.st_size != size else ""
    if why:
        os.close(fd)
        raise PeerError(why)
    return fd, st.st_mtime_ns


def _open_source(src: Path) -> tuple[int, int, int]:
    fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    st = os.fstat(fd)
    return fd, st.st_size, st.st_mtime_ns


def _read_hashing(fd: int, n: int, sha: Any) -> bytes:
    data = os.read(fd, n)
    sha.update(data)
    return data


def _usage(root: Path, arriving: set[tuple[int, int]]) -> int:
    """Bytes of the files under ``root``, links not followed, the pushes under way left out
    (they are counted whole as reserved)."""
    total = 0
    for top, _dirs, files in os.walk(root):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(top, f))
                if (st.st_dev, st.st_ino) not in arriving:
                    total += st.st_size
    return total


def _remove(root: Path, parts: list[str]) -> None:
    try:
        d = _walk_to(root, parts, make=False)
    except FileNotFoundError:
        return
    try:
        _remove_entry(d, parts[-1])
    except FileNotFoundError:
        pass
    finally:
        os.close(d)


def _remove_entry(dir_fd: int, name: str) -> None:
    """``name`` under ``dir_fd``, a tree removed through descriptors: a link is removed, never followed."""
    if not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, _DIR, dir_fd=dir_fd)
    try:
        for child in os.listdir(fd):
            _remove_entry(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


async def _receive_into(reader: BufferedByteReceiveStream, landing: _Landing, size: int, timeout: float) -> None:
    """Exactly ``size`` bytes into ``landing``, handed to a worker thread a chunk at a time."""
    left, buf = size, bytearray()
    while left:
        try:
            data = await _within(timeout, reader.receive(min(left, CHUNK)))
        except (anyio.EndOfStream, anyio.IncompleteRead):
            raise PeerError("short", f"{size - left} of {size} bytes") from None
        buf += data
        left -= len(data)
        if len(buf) >= CHUNK or not left:
            await _fs(landing.write, bytes(buf))
            buf.clear()


async def _connect(addr: tuple[str, int], timeout: float) -> SocketStream:
    with anyio.fail_after(timeout):
        return await anyio.connect_tcp(addr[0], addr[1])


async def _answer(reader: BufferedByteReceiveStream, timeout: float) -> dict[str, Any]:
    got = _json(await _line_in(reader, timeout), "answer")
    if got.get("ok") is not True:
        raise PeerError(str(got.get("why", "refused")))
    return got


async def _line_in(reader: BufferedByteReceiveStream, timeout: float) -> bytes:
    """One line of at most ``MAX_LINE`` bytes (``receive_until`` alone returns a longer one
    that came in one read); ``DelimiterNotFound`` for a longer one: the connection dropped."""
    line = await _within(timeout, reader.receive_until(b"\n", MAX_LINE))
    if len(line) > MAX_LINE:
        raise anyio.DelimiterNotFound(MAX_LINE)
    return line


async def _within(timeout: float, step: Awaitable[T]) -> T:
    with anyio.fail_after(timeout):
        return await step


async def _fs(fn: Callable[..., T], *args: Any) -> T:
    """``fn`` in a worker thread; a file system's ``OSError`` as the ``PeerError`` a peer is told."""
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except PeerError:
        raise
    except OSError as e:
        why = {errno.ELOOP: "path", errno.ENOTDIR: "path", errno.ENOENT: "missing"}.get(e.errno or 0, "io")
        raise PeerError(why, str(e)) from e


@contextlib.contextmanager
def _as_peer_error() -> Iterator[None]:
    """A client's failures, each as one ``PeerError``."""
    try:
        yield
    except PeerError:
        raise
    except TimeoutError:
        raise PeerError("timeout") from None
    except (anyio.EndOfStream, anyio.IncompleteRead) as e:
        raise PeerError("closed", "the peer ended the connection") from e
    except _GONE as e:
        raise PeerError("connection", str(e)) from e


def _json(raw: bytes, why: str) -> dict[str, Any]:
    try:
        got = json.loads(raw)
    except ValueError:
        raise PeerError(why) from None
    if not isinstance(got, dict):
        raise PeerError(why)
    return got


def _line(**fields: Any) -> bytes:
    return json.dumps(fields).encode() + b"\n"


def _count(value: object) -> int:
    """A byte count or a time from a peer: a non-negative int, never a bool."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PeerError("request")
    return value


_GONE = (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound, anyio.BrokenResourceError,
         anyio.ClosedResourceError, OSError)
