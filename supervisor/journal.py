"""The run's one record: ``events.jsonl`` in the run directory.

One JSON object a line: ``{"v": 1, "t": <unix s>, "attempt": N, "kind": "...", ...}``.
Every append is flushed; events that must survive a SIGKILL right after them (``signal``,
``end`` and whatever a caller marks durable) are fsynced too. The writer may be killed
mid-line, so the reader tolerates and reports a torn last line. Event kinds and their
fields are documented in ``docs/journal.md``; bump ``SCHEMA_VERSION`` when they change.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Protocol

SCHEMA_VERSION = 1
EVENTS_FILE = "events.jsonl"
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


class Journal:
    """Appends events to ``<run_dir>/events.jsonl``; safe to call from worker threads."""

    def __init__(self, run_dir: Path, attempt: int) -> None:
        self.path = Path(run_dir) / EVENTS_FILE
        self.attempt = attempt
        self._lock = threading.Lock()
        self._secrets: list[str] = []
        self._file = open(self.path, "a", encoding="utf-8")
        if self._file.tell() > 0 and not _ends_with_newline(self.path):
            # A killed writer left a torn line: end it, so our first event stays whole.
            self._file.write("\n")

    def add_secret(self, secret: str) -> None:
        """Never write ``secret`` (a webhook URL, a token): it is replaced by ``<redacted>``."""
        if secret and secret not in self._secrets:
            self._secrets.append(secret)

    def emit(self, kind: str, /, *, durable: bool = False, **fields: Any) -> dict[str, Any]:
        """Append one event and return it. ``durable`` (or a durable kind) fsyncs it."""
        event: dict[str, Any] = {"v": SCHEMA_VERSION, "t": round(time.time(), 6), "attempt": self.attempt, "kind": kind}
        event.update(fields)
        line = json.dumps(event, default=_jsonable, separators=(",", ":"), ensure_ascii=False)
        for secret in self._secrets:
            line = line.replace(json.dumps(secret)[1:-1], "<redacted>")
        with self._lock:
            if self._file.closed:
                return event
            self._file.write(line + "\n")
            self._file.flush()
            if durable or kind in DURABLE_KINDS:
                os.fsync(self._file.fileno())
        return event

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


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


def next_attempt(run_dir: Path, env: Mapping[str, str]) -> int:
    """Attempt numbers start at 1 and never repeat within a run directory.

    ``SLURM_RESTART_COUNT`` is unset on a job's first run and counts requeues after that;
    the journal covers schedulers without such a counter and a run directory reused by a
    new submission.
    """
    restarts = env.get("SLURM_RESTART_COUNT", "")
    from_scheduler = int(restarts) + 1 if restarts.isdigit() else 1
    return max(last_attempt(run_dir) + 1, from_scheduler)
