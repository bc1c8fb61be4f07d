"""The human log: UTC timestamps, on stderr and in ``<run-dir>/supervise.log``.

The journal is for machines and the report; this log is for a person reading the batch
job's output. ``-q`` shows warnings only, ``-v`` adds debug detail; the file always
keeps info and above so a post-mortem does not depend on how the job was launched.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

LOG_FILE = "supervise.log"
LOGGER = "supervise"


class _UTCFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{t}.{int(record.msecs):03d}Z"


def _formatter() -> logging.Formatter:
    return _UTCFormatter(f"%(asctime)s supervise[{os.getpid()}] %(levelname)s %(message)s")


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


def add_file(run_dir: Path, verbosity: int = 0) -> logging.Handler:
    """Also log to ``<run_dir>/supervise.log`` (appending across attempts)."""
    logger = logging.getLogger(LOGGER)
    handler = logging.FileHandler(Path(run_dir) / LOG_FILE, encoding="utf-8")
    handler.setFormatter(_formatter())
    handler.setLevel(logging.DEBUG if verbosity > 0 else logging.INFO)
    logger.addHandler(handler)
    return handler


def close() -> None:
    logger = logging.getLogger(LOGGER)
    for handler in list(logger.handlers):
        handler.flush()
        if isinstance(handler, logging.FileHandler):
            handler.close()
            logger.removeHandler(handler)
