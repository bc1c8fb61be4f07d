"""The run's one record: ``events.jsonl`` in the run directory.

One JSON object a line: ``{"v": 1, "t": <unix s>, "attempt": N, "kind": "...", ...}``.
Every append is flushed; events that must survive a SIGKILL right after them (``signal``,
``end`` and whatever a caller marks durable) are fsynced too. The writer may be killed
mid-line, so the reader tolerates and reports a torn last line. Event kinds and their
fields are documented in ``docs/journal.md``; bump ``SCHEMA_VERSION`` when they change.
"""

from __future__ import annotations

import errno as _errno
import json
import os
import re
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Protocol

SCHEMA_VERSION = 1
EVENTS_FILE = "events.jsonl"
NODES_DIR = "nodes"  # RUN/nodes/node-K/: each node agent's journal and samples (docs/multinode.md)


def node_dir(run_dir: Path, rank: int) -> Path:
    """Node K's agent's directory in the run directory (its journal, log and samples)."""
    return run_dir / NODES_DIR / f"node-{rank}"
DURABLE_KINDS = frozenset({"signal", "end"})

_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSWD|KEY|WEBHOOK|CREDENTIAL|AUTH|COOKIE|SESSION_ID|URL|NOTIFY", re.I)


class Emit(Protocol):
    """What parts are given instead of the Journal: ``emit("kind", field=value, ...)``."""

    def __call__(self, kind: str, /, *, durable: bool = False, **fields: Any) -> dict[str, Any]: ...


def redact_env(env: Mapping[str, str], prefixes: Iterable[str]) -> dict[str, str]:
    """Keep the variables that start with one of ``prefixes``, hiding secret-looking ones.

    Scheduler variables are what a post-mortem needs; tokens and webhook URLs are not, and
    docs/design.md's invariant 5 says they never reach the journal.
    """
    prefixes = tuple(prefixes)
    return {
        k: ("<redacted>" if _SECRET_NAME.search(k) else v)
        for k, v in sorted(env.items())
        if k.startswith(prefixes)
    }


def check_run_dir_safe(run_dir: Path) -> str | None:
    """Why ``run_dir`` is unsafe to write in, or None (it need not exist yet).

    Anyone who can write in it can plant ``events.jsonl -> ~victim/.bashrc`` before we
    create it: a directory writable by all is refused unless it is sticky and ours (then
    others cannot rename or remove our files, and O_NOFOLLOW/O_EXCL do the rest). Anyone
    who can write in a parent without the sticky bit can swap the directory itself for
    theirs, so such a parent is refused too (``/tmp`` is sticky).
    """
    path = Path(os.path.abspath(run_dir))
    for p in (path, *path.parents):
        try:
            st = os.stat(p)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"cannot be read: {e.strerror}"
        if not st.st_mode & stat.S_IWOTH:
            continue
        mode = "%o" % stat.S_IMODE(st.st_mode)
        if p == path and not (st.st_mode & stat.S_ISVTX and st.st_uid == os.geteuid()):
            return (f"is writable by every user (mode {mode}): another user could plant links in it; "
                    "use a directory of your own (chmod o-w, or chmod +t on one you own)")
        if p != path and not st.st_mode & stat.S_ISVTX:
            return (f"is inside {p}, writable by every user without the sticky bit (mode {mode}): "
                    "another user could replace it; use a directory of your own")
    return None


def open_own_file(path: Path, *, append: bool = True, mode: int = 0o644) -> int:
    """Open (or create) a file in a directory others might write: never through a link, and
    never one another user created. Returns the descriptor; raises OSError."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_EXCL)
    fd = os.open(path, flags, mode)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise OSError(_errno.EPERM, "not a regular file of ours", str(path))
    return fd


def unsafe_file(path: Path, e: OSError) -> Exception:
    """One line (exit 2, nothing started) for a run-directory file we will not write."""
    from supervisor.errors import ConfigError

    why = "it is a link" if e.errno == _errno.ELOOP else (e.strerror or str(e))
    return ConfigError("run_dir", str(path.parent), f"cannot open {path.name} there: {why} "
                       "(a link or another user's file is never written through)")


class Journal:
    """Appends events to ``<run_dir>/events.jsonl``; safe to call from worker threads.

    A full or failing run directory (ENOSPC, EDQUOT, EIO) never stops the supervision:
    the failure is said once on stderr, later events are tried again (space may come
    back; a torn line is ended first), and an ``end`` that cannot be written goes to stderr.
    """

    def __init__(self, run_dir: Path, attempt: int) -> None:
        self.path = Path(run_dir) / EVENTS_FILE
        self.attempt = attempt
        self._lock = threading.Lock()
        self._secrets: list[str] = []
        try:
            self._fd: int | None = open_own_file(self.path)
        except OSError as e:
            raise unsafe_file(self.path, e) from None
        self._torn = os.fstat(self._fd).st_size > 0 and not _ends_with_newline(self.path)
        self._failing: str | None = None
        self.lost = 0  # events that could not be written

    def add_secret(self, secret: str) -> None:
        """Never write ``secret`` (a webhook URL, a token): it is replaced by ``<redacted>``."""
        if secret and secret not in self._secrets:
            self._secrets.append(secret)

    def emit(self, kind: str, /, *, durable: bool = False, **fields: Any) -> dict[str, Any]:
        """Append one event and return it. ``durable`` (or a durable kind) fsyncs it."""
        event: dict[str, Any] = {"v": SCHEMA_VERSION, "t": round(time.time(), 6), "attempt": self.attempt, "kind": kind}
        event.update(fields)
        line = json.dumps(event, default=_jsonable, separators=(",", ":"), ensure_ascii=False)
        line = redact_text(line, self._secrets)
        with self._lock:
            if self._fd is None:
                return event
            if not self._append((line + "\n").encode("utf-8", "backslashreplace"), durable or kind in DURABLE_KINDS):
                self.lost += 1
                if kind == "end":
                    _say(f"supervise: the journal could not take its last line: {line}")
        return event

    def _append(self, data: bytes, sync: bool) -> bool:
        """One whole line or, on failure, a torn one that the next success ends first."""
        assert self._fd is not None
        if self._torn:
            data = b"\n" + data
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, data[written:])
            self._torn = False
            if sync:
                os.fsync(self._fd)
        except OSError as e:
            self._torn = self._torn or 0 < written < len(data)
            if self._failing is None:
                self._failing = _errno.errorcode.get(e.errno or 0, str(e.errno))
                _say(f"supervise: cannot write {self.path}: {e.strerror} ({self._failing}); supervising on")
            return False
        if self._failing is not None:
            _say(f"supervise: {self.path} is writable again")
            self._failing = None
        return True

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                try:
                    os.fsync(self._fd)
                except OSError:
                    pass
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret (as written raw or inside a JSON string) replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(json.dumps(secret)[1:-1], "<redacted>").replace(secret, "<redacted>")
    return text


_SECRET_FLAGS = ("--notify",)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """Our command line for the journal: a ``--notify`` URL holds a webhook token. After
    ``--`` comes the training's own command, written as given (it is journaled as such)."""
    args = list(argv)
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        if out and out[-1] in _SECRET_FLAGS and not arg.startswith("-"):
            out.append("<redacted>")
        elif arg.startswith(tuple(f + "=" for f in _SECRET_FLAGS)):
            out.append(arg.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(arg)
    return out


def _say(message: str) -> None:
    """One line on stderr, whatever state stderr is in."""
    try:
        os.write(2, (message.replace("\n", " ") + "\n").encode("utf-8", "backslashreplace"))
    except OSError:
        pass


def _ends_with_newline(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"
    except OSError:
        return True


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "name") and hasattr(value, "value"):  # enums, signals
        return value.name
    return repr(value)


@dataclass
class JournalRead:
    """What the tolerant reader found: the events, and what it had to skip."""

    events: list[dict[str, Any]] = field(default_factory=list)
    torn_last_line: str | None = None
    bad_lines: list[int] = field(default_factory=list)

    @property
    def attempts(self) -> list[int]:
        return sorted({int(e.get("attempt", 0)) for e in self.events})


def iter_events(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """Yield ``(line number, event or None, raw line)`` without loading the whole file."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            text = raw.decode("utf-8", errors="replace")
            try:
                obj = json.loads(text)
            except ValueError:
                yield n, None, text
                continue
            yield n, (obj if isinstance(obj, dict) and "kind" in obj else None), text


def read_journal(path: Path) -> JournalRead:
    """Read every good event. A bad final line is the torn write of a killed writer."""
    result = JournalRead()
    path = Path(path)
    # Anything but a file is a run directory, made or not yet: asking is_dir() and then opening
    # the path raced with a starting run creating it (a reader polling saw IsADirectoryError).
    if not path.is_file():
        path = path / EVENTS_FILE
    if not path.exists():
        return result
    last_bad: tuple[int, str] | None = None
    for n, event, raw in iter_events(path):
        if event is None:
            if raw.strip():
                if last_bad is not None:
                    result.bad_lines.append(last_bad[0])
                last_bad = (n, raw)
            continue
        if last_bad is not None:
            result.bad_lines.append(last_bad[0])
            last_bad = None
        result.events.append(event)
    if last_bad is not None:
        if last_bad[1].endswith("\n"):
            result.bad_lines.append(last_bad[0])
        else:
            result.torn_last_line = last_bad[1]
    return result


class JournalTail:
    """Another writer's journal, read on from where it was when this was made: what it
    appends after (the leader's ``end`` for a node agent; an agent's answer for the leader).
    A line not yet whole stays for the next read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.offset = path.stat().st_size
        except OSError:
            self.offset = 0
        self.tail = b""

    def appended(self) -> list[dict[str, Any]]:
        """The events appended since the last call. Blocking: run in a thread."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        lines = (self.tail + data).split(b"\n")
        self.tail = lines.pop()
        out = []
        for raw in lines:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if isinstance(ev, dict):
                out.append(ev)
        return out


def last_attempt(run_dir: Path) -> int:
    """The highest attempt number already in the run directory's journal (0 if none)."""
    path = Path(run_dir) / EVENTS_FILE
    if not path.exists():
        return 0
    best = 0
    for _, event, _ in iter_events(path):
        if event is not None:
            try:
                best = max(best, int(event.get("attempt", 0)))
            except (TypeError, ValueError):
                continue
    return best


def next_attempt(run_dir: Path, restart_count: int | None = None) -> int:
    """Attempt numbers start at 1 and never repeat within a run directory.

    ``restart_count`` is the scheduler's count of requeues before this run (``sched.restart_count``
    of the environment, and PBS's ``run_count`` − 1 from ``qstat -f``: ``Job.restart_count``); None
    or 0 on a first run. The journal covers schedulers without a counter and a run directory
    reused by a new submission.
    """
    from_scheduler = restart_count + 1 if restart_count is not None and restart_count > 0 else 1
    return max(last_attempt(run_dir) + 1, from_scheduler)
