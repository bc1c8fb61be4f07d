"""The contract with the training: the names of the variables supervise sets for its child.

Written once, here: the agent sets them (``for_child``), ``supervisor.training`` reads them,
and the configuration never mistakes them for its own ``SUPERVISE_*`` settings (docs/training.md).
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from supervisor.keeper import TREE_VARIABLE

RUN_DIR = "SUPERVISE_RUN_DIR"                        # the run directory (journal, samples)
ATTEMPT = "SUPERVISE_ATTEMPT"                        # 1, 2, … across requeues into one run directory
CHECKPOINT_REQUEST = "SUPERVISE_CHECKPOINT_REQUEST"  # a path that appears when a checkpoint is wanted now
CHECKPOINT_SIGNAL = "SUPERVISE_CHECKPOINT_SIGNAL"    # the signal that means the same, by name (USR1)
RESTORED_FROM = "SUPERVISE_RESTORED_FROM"            # the restored checkpoint's local path
NODE_RANK = "SUPERVISE_NODE_RANK"                    # a node agent's index (multi-node checkpoints)
JOB_NODES = "SUPERVISE_JOB_NODES"                    # the nodes this attempt runs on, when spares are kept aside
TREE_ID = TREE_VARIABLE                              # names this supervise's training: the keeper's evidence (keeper.py)
NAMES = frozenset({RUN_DIR, ATTEMPT, CHECKPOINT_REQUEST, CHECKPOINT_SIGNAL, RESTORED_FROM, NODE_RANK, JOB_NODES, TREE_ID})
REQUEST_FILE = "checkpoint.request"


def for_child(*, run_dir: Path, attempt: int, request: Path, checkpoint_signal: str,
              restored_from: Path | None) -> dict[str, str]:
    env = {RUN_DIR: str(run_dir), ATTEMPT: str(attempt), CHECKPOINT_REQUEST: str(request),
           CHECKPOINT_SIGNAL: checkpoint_signal.removeprefix("SIG")}
    if restored_from is not None:
        env[RESTORED_FROM] = str(restored_from)
    return env


_REQUEST_SEQ = itertools.count()


def write_request(path: Path, why: str) -> None:
    """A new file (new inode) each time, so every rank sees a new request. The temp name is
    unique per call: a signal's request and the stop sequence's may be written at once."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_REQUEST_SEQ)}")
    try:
        tmp.unlink()  # a leftover (or a planted link) of a killed earlier attempt with our pid
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)  # never a planted link
    try:
        os.write(fd, f"{time.time():.3f} {why}\n".encode())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full run directory: leave no temp name behind
        raise
    finally:
        os.close(fd)
