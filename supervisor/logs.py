"""The human log: UTC timestamps, on stderr and in ``<run-dir>/supervise.log``.

The journal is for machines and the report; this log is for a person reading the batch
job's output. ``-q`` shows warnings only, ``-v`` adds debug detail; the file always
keeps info and above so a post-mortem does not depend on how the job was launched.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from pathlib import Path

LOG_FILE = "supervise.log"
LOGGER = "supervise"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def escape_control(text: str) -> str:
    """Control characters shown, not obeyed: a checkpoint named with terminal escapes (or a
    newline that would forge a log line) reaches the terminal as ``\x1b``."""
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


class _UTCFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        return escape_control(super().formatMessage(record))

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{t}.{int(record.msecs):03d}Z"


def _formatter() -> logging.Formatter:
    return _UTCFormatter(f"%(asctime)s supervise[{os.getpid()}] %(levelname)s %(message)s")


def reopen_closed_std_streams() -> list[int]:
    """Put /dev/null on a closed stdin, stdout or stderr (call first thing).

    Started with ``>&-``, Python's ``sys.stderr`` is None (the log crashed on it), and the
    first file we open would take descriptor 1 or 2: the journal would become the
    training's stdout. Returns the descriptors that were closed.
    """
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    for fd in closed:
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        os.set_inheritable(fd, True)  # os.open's descriptors close on exec: the training needs it
    if 1 in closed or sys.stdout is None:
        sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    if 2 in closed or sys.stderr is None:
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    return closed


def setup(verbosity: int = 0) -> logging.Logger:
    """stderr logging, before the run directory is known (config errors go here too)."""
    logger = logging.getLogger(LOGGER)
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter())
    handler.setLevel(logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO)
    logger.addHandler(handler)
    return logger


class _RunDirHandler(logging.StreamHandler):
    """``supervise.log``: opened without following links (O_NOFOLLOW, ours only), and quiet
    when the run directory is full: the journal already says so once, and logging's own
    handleError would print a traceback for every line."""

    def __init__(self, path: Path) -> None:
        from supervisor.journal import open_own_file, unsafe_file

        try:
            fd = open_own_file(path)
        except OSError as e:
            raise unsafe_file(path, e) from None
        super().__init__(open(fd, "a", encoding="utf-8", errors="backslashreplace"))

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802
        pass

    def flush(self) -> None:
        try:
            super().flush()
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.stream.close()
        except OSError:
            pass
        super().close()


def add_file(run_dir: Path, verbosity: int = 0) -> logging.Handler:
    """Also log to ``<run_dir>/supervise.log`` (appending across attempts)."""
    logger = logging.getLogger(LOGGER)
    handler = _RunDirHandler(Path(run_dir) / LOG_FILE)
    handler.setFormatter(_formatter())
    handler.setLevel(logging.DEBUG if verbosity > 0 else logging.INFO)
    logger.addHandler(handler)
    return handler


def close() -> None:
    logger = logging.getLogger(LOGGER)
    for handler in list(logger.handlers):
        handler.flush()
        if isinstance(handler, (logging.FileHandler, _RunDirHandler)):
            handler.close()
            logger.removeHandler(handler)
