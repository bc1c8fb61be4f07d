"""What the leader and its node agents read of each other's files before the training
starts: each node's offer (what it holds), the leader's choice (what every node restores),
and the lines an agent says when it is ready (docs/multinode.md, "Every node restores the
same version").

Its own module so that a node agent imports only this of the leader's side
(``conduct/fleet.py``): an agent's start, from exec to ready, is paid on every node of the
job (issue 44).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, NamedTuple

from supervisor.conduct.wire import LEADER, OFFER_FILE, SAY_VAR, said_file, said_line
from supervisor.journal import node_dir
from supervisor.rawfile import read_once

log = logging.getLogger("supervise")

READY_TIMEOUT_S = 60.0
# choices at most per start: a version that verifies nowhere on some node is passed over for the
# one before it (the ring keeps two versions of each node's part), then the one before that
CHOICE_ROUNDS = 3


def write_choice(path: Path, choice: dict[str, Any], turn: int, final: bool) -> None:
    """Whole or not at all (temp + rename): an agent polling for it never reads half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"choice": choice, "round": turn, "final": final, "pid": os.getpid()}))
    os.replace(tmp, path)


def offer_path(run_dir: Path, node: int) -> Path:
    """Where node ``node``'s agent says what it holds before the leader chooses."""
    return node_dir(run_dir, node) / OFFER_FILE


def write_offer(path: Path, choice_path: str, pairs: dict[str, Any]) -> None:
    """What this node holds (``Mirror.offer``), for the attempt whose choice file is
    ``choice_path``; whole or not at all (temp + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"choice": choice_path, "pairs": pairs}, separators=(",", ":")))
    os.replace(tmp, path)


def read_offer(path: Path, choice_path: Path) -> dict[str, Any] | None:
    """A node's offer, if it is this attempt's (its choice file is ours). Read with one open
    (``rawfile``): the leader reads every node's at each start."""
    try:
        body = json.loads(read_once(path))
    except (OSError, ValueError):
        return None
    ok = isinstance(body, dict) and body.get("choice") == str(choice_path) and isinstance(body.get("pairs"), dict)
    return body["pairs"] if ok else None


class Choice(NamedTuple):
    """The leader's choice file: the version of each pair every node restores, its round (a
    version no copy of which verified on some node is chosen again without it), and whether
    it stands (``final``: go on)."""

    choice: dict[str, Any]
    round: int
    final: bool


def read_choice(path: Path) -> Choice | None:
    """The leader's choice, once written (None before, or unreadable)."""
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    choice = body.get("choice") if isinstance(body, dict) else None
    if not isinstance(choice, dict) or not isinstance(body.get("round"), int):
        return None
    return Choice(choice, body["round"], bool(body.get("final")))


def say(what: str, rank: int, more: str = "") -> None:
    """One line for the leader that started the agents (``wire.READY_LINE``): on stdout (srun
    brings it back), and appended to its said file in ``$SUPERVISE_NODE_SAY`` when the leader
    named that directory (a PBS TM task's stdout goes to the job's output file, not to the leader)."""
    line = said_line(what, rank, socket.gethostname(), more)
    try:  # one write, newline and all: every node's agent shares srun's stdout, and under
        # PYTHONUNBUFFERED print() writes the text, then the newline, so another node's line
        # could land between them and the leader would read neither (a pipe keeps a write of
        # up to 4 KiB whole)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass  # nobody reads it (an agent started by the job script with its stdout closed)
    where = os.environ.get(SAY_VAR)
    if where:
        try:
            with open(said_file(Path(where), rank), "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as e:
            log.warning("could not tell the leader %r (%s): %s", what, where, e)


def leaders_node() -> int:
    """Node rank 0 is the leader's: the main supervise mirrors this node's part; nothing to do.
    Said before a node agent's modules are imported: the task srun starts on the leader's node
    costs the interpreter and this module, not 0.13 CPU-seconds of imports it never uses."""
    log.info("node rank 0 is the leader's: the main supervise mirrors this node's part; nothing to do")
    say(LEADER, 0)
    return 0
