"""The leader↔node conversation, whole: every word, line, file and request/answer pair the
leader (node 0, ``conduct/fleet.py``, ``conduct/link.py``) and its node agents
(``conduct/node.py``) say to each other, named once (issue 46; docs/multinode.md, "The
conversation, whole", is checked against ``TABLE``).

It runs over six channels, each the one that fits what it carries:

- **the line** (``conduct/link.py``): one TCP port, one word a line, saying *when* to look at
  shared storage, never *what* is there; but a request and its answer, which are said whole
  (``message``: ``KIND REQUEST {fields}``), so that no side tails the other's journal for them;
- **an agent's lines** (``READY_LINE …``): on stdout, which ``srun`` brings back, or appended to
  the agent's said file (PBS: a TM task's stdout goes to the job's output);
- **the environment** the leader hands its agents (``CHOICE_VAR``, ``SAY_VAR``);
- **files** under ``RUN/nodes/``: the line's address, the choice, each node's offer, the said
  files, each agent's lock;
- **the journals**: a request in the leader's ``events.jsonl``, each node's answer with the
  same ``request`` in its own (``ANSWERS``): the record, read by ``supervise report``, not a
  mailbox; read by the other side only for what the line did not carry (an agent off it, an
  answer too long for it);
- **parts** on persistent storage (``sync/_parts.py`` spells them: ``sync/`` sits below the
  conductor and may not import it; the table names them and a test holds the two together).

Nothing here does I/O: the names, the table, and the small helpers that format and read a
line, a file name and a request. The rule the structure test keeps (``tests/core/
test_structure.py``): in ``conduct/`` and ``sched/`` a name of a row marked ``own`` is spelled
as a string only here; ``sched/`` is handed what it needs (``AgentLaunch.said_file``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

from supervisor.config import STORE_KEYS_FILE

# ---------------------------------------------------------------------------- the line

HELLO = "hello"      # node → leader, first: ``hello TOKEN K``
OK = "ok"            # leader → node: the hello was this job's; words follow
JOURNAL = "journal"  # leader → nodes: a request is in its journal; node → leader: its answer is in its own
CHOICE = "choice"    # leader → nodes: the choice file is written (each round), or it stands
GO = "go"            # leader → nodes: ``complete-on-node-0`` written (the mirror says it)
TAKEN = "taken"      # leader → nodes: parts published and released (the mirror says it)
PART = "part"        # node → leader: a part staged, its manifest written (the mirror says it)
LINK = "link"        # never said: heard by an agent from its own end when the line is made or lost
LEADER_WORDS = frozenset({JOURNAL, CHOICE, GO, TAKEN})
NODE_WORDS = frozenset({PART, JOURNAL})
MAX_LINE = 128


def hello(token: str, node: int) -> str:
    return f"{HELLO} {token} {node}\n"


def read_hello(line: bytes) -> tuple[str, int] | None:
    """(token, node) of an agent's hello, or None for anything else."""
    words = line.decode("ascii", "replace").split()
    if len(words) == 3 and words[0] == HELLO and words[2].isdigit():
        return words[1], int(words[2])
    return None


def words_line(words: set[str]) -> bytes:
    """Words owed to the other side, one a line, in a steady order."""
    return "".join(f"{w}\n" for w in sorted(words)).encode()


def read_word(line: bytes) -> str:
    return line.decode("ascii", "replace").strip()


# ---------------------------------------------------------------------------- an agent's lines

READY_LINE = "supervise-node-agent"  # "<READY_LINE> WHAT K HOST [MORE]"
OFFERED = "offered"      # its offer is written: the leader may choose
RESTORED = "restored"    # MORE: {"round": R, "holds": …}: the round's choice restored, what it holds
READY = "ready"          # MORE: what it holds: it mirrors; the training may start
LEADER = "leader"        # node 0's agent: the leader's node, nothing to do
DUPLICATE = "duplicate"  # another agent for node K runs (``LOCK_FILE``)
SAID = frozenset({OFFERED, RESTORED, READY, LEADER, DUPLICATE})
DONE = frozenset({READY, LEADER, DUPLICATE})  # an agent that said one of these has offered and is ready


class Said(NamedTuple):
    """One line an agent said: what, its node, its host, and what it carries (JSON or "")."""

    what: str
    node: int
    host: str
    more: str


def said_line(what: str, node: int, host: str, more: str = "") -> str:
    return f"{READY_LINE} {what} {node} {host} {more}".rstrip()


def read_said(line: str) -> Said | None:
    """An agent's line, or None for any other line (srun passes on whatever its tasks print)."""
    words = line.split(maxsplit=4)
    if len(words) < 3 or words[0] != READY_LINE or not words[2].isdigit():
        return None
    return Said(words[1], int(words[2]), words[3] if len(words) > 3 else "", words[4] if len(words) > 4 else "")


# ---------------------------------------------------------------------------- the environment

CHOICE_VAR = "SUPERVISE_NODE_CHOICE"  # the choice file: the agent offers, then restores exactly the leader's choice
SAY_VAR = "SUPERVISE_NODE_SAY"        # a directory: each agent appends its lines to its said file there (PBS)


# ---------------------------------------------------------------------------- files under RUN/nodes/

_NODES = "nodes"  # RUN/nodes/: the run directory's layout (journal.node_dir's too), not the conversation's
LINK_FILE = "link.json"    # where the leader's line listens, and its token (0600)
OFFER_FILE = "offer.json"  # in nodes/node-K/: what node K holds before the leader chooses
LOCK_FILE = "agent.lock"   # in nodes/node-K/: held (flock) by node K's running agent
CHOICE_PREFIX = "choice-"  # nodes/choice-<pid>-<ns>.json: the leader's choice, one file an attempt
SAID_PREFIX = "said-"      # nodes/said-<pid>-<ns>/: the PBS agents' said files
SAID_FILE = "node-"        # in the said directory: node-K, node K's lines


def link_path(run_dir: Path) -> Path:
    return run_dir / _NODES / LINK_FILE


def attempt_stamp() -> str:
    """This leader's attempt, in a file name: its pid and the time (a requeue's files differ)."""
    return f"{os.getpid()}-{time.time_ns()}"


def choice_path(run_dir: Path, stamp: str) -> Path:
    return run_dir / _NODES / f"{CHOICE_PREFIX}{stamp}.json"


def said_dir(run_dir: Path, stamp: str) -> Path:
    return run_dir / _NODES / f"{SAID_PREFIX}{stamp}"


def said_file(say_dir: Path, node: int) -> Path:
    return say_dir / f"{SAID_FILE}{node}"


# ---------------------------------------------------------------------------- requests and answers

NODES_FLUSH = "nodes-flush"    # the leader's journal: one last pass on every node, now
NODE_FLUSH = "node-flush"      # node K's journal: done (the same ``request``), what is not durable
NODES_SIGNAL = "nodes-signal"  # the leader's journal (PBS): the stop signal for the ranks on every node
NODE_SIGNAL = "node-signal"    # node K's journal: sent (the same ``request``), to which pids
END = "end"                    # the leader's journal: its end; each agent's last flush, then its own end
ANSWERS = {NODES_FLUSH: NODE_FLUSH, NODES_SIGNAL: NODE_SIGNAL}
REQUESTS = frozenset(ANSWERS)
REPLIES = frozenset(ANSWERS.values())
MAX_MESSAGE = 16384  # a request or an answer said on the line, at most; a longer answer is journaled and ``journal`` said
FOR_LEADER = "leader"          # the reason of a node's pass that answers ``nodes-flush`` (``flush:leader``)


def request_id(n: int) -> str:
    """The ``request`` of this leader's n-th request: its answers name it."""
    return f"{os.getpid()}.{n}"


def is_answer(ev: dict[str, object], kind: str, request: str) -> bool:
    """Is this journal event node K's answer to the leader's ``kind`` request ``request``?"""
    return ev.get("kind") == ANSWERS[kind] and ev.get("request") == request


def message(kind: str, request: str, fields: dict[str, Any]) -> str | None:
    """A request or an answer as one line of the line: ``KIND REQUEST {fields}``, the same
    as its journal event says (the journal stays the record); None when it would not fit
    (``MAX_MESSAGE``: then only ``journal`` is said, and the other side reads the journal)."""
    line = f"{kind} {request} {json.dumps(fields, separators=(',', ':'))}"
    return line if len(line) < MAX_MESSAGE else None


def read_message(line: str, kinds: frozenset[str]) -> dict[str, Any] | None:
    """A request or an answer said on the line, as the journal event it stands for (``kind``,
    ``request`` and its fields), if its kind is one of ``kinds``; None for anything else."""
    parts = line.split(" ", 2)
    if len(parts) != 3 or parts[0] not in kinds:
        return None
    try:
        fields = json.loads(parts[2])
    except ValueError:
        return None
    return {**fields, "kind": parts[0], "request": parts[1]} if isinstance(fields, dict) else None


# ---------------------------------------------------------------------------- the table


class Says(NamedTuple):
    """One row of the conversation: the name as it is spelled (with ``<…>`` and ``K`` for what
    varies), what it is, who says it to whom, over which channel, what it carries, and where it
    is spelled (``wire`` here; a module path where a room below the conductor spells it).
    ``own``: the name belongs to the conversation alone, so the structure test finds it
    spelled nowhere else in ``conduct/`` and ``sched/`` (``ok`` and ``end`` are words every room
    uses)."""

    name: str
    what: str
    way: str
    over: str
    carries: str
    spelled: str = "wire"
    own: bool = True


LINE, LINES, ENV, FILES, JOURNALS, PARTS = ("the line", "an agent's lines", "the environment", "files",
                                            "the journals", "parts")
LINE_AND_JOURNALS = "the line and the journals"
TO_NODES, TO_LEADER = "leader → nodes", "node → leader"

TABLE: tuple[Says, ...] = (
    Says(HELLO, "word", TO_LEADER, LINE, "`hello TOKEN K`: node K, with the token of `link.json`"),
    Says(OK, "word", TO_NODES, LINE, "the hello was this job's: words follow", own=False),
    Says(JOURNAL, "word", TO_NODES, LINE, "something for them is journaled that the line did not carry"),
    Says(CHOICE, "word", TO_NODES, LINE, "the choice file is written (each round), or the choice stands"),
    Says(GO, "word", TO_NODES, LINE, "`complete-on-node-0` is written", spelled="sync/_assembly.py"),
    Says(TAKEN, "word", TO_NODES, LINE, "parts published and released", spelled="sync/_assembly.py"),
    Says(PART, "word", TO_LEADER, LINE, "a part staged, its manifest written", spelled="sync/_partpublish.py"),
    Says(JOURNAL, "word", TO_LEADER, LINE, "its `node-flush`/`node-signal` answer is journaled, too long for the line"),
    Says(LINK, "word", "node's line → node", LINE, "never said: the line was made or lost, look at everything"),
    Says(READY_LINE, "line", TO_LEADER, LINES, "the first word of each line: `supervise-node-agent WHAT K HOST [MORE]`"),
    Says(OFFERED, "line", TO_LEADER, LINES, "its offer is written"),
    Says(RESTORED, "line", TO_LEADER, LINES, "`{\"round\": R, \"holds\": …}`: the round's choice restored, what it holds"),
    Says(READY, "line", TO_LEADER, LINES, "what it holds: it mirrors, the training may start"),
    Says(LEADER, "line", TO_LEADER, LINES, "node 0's agent: the leader's node, nothing to do"),
    Says(DUPLICATE, "line", TO_LEADER, LINES, "another agent for node K runs (`agent.lock`)"),
    Says(CHOICE_VAR, "variable", TO_NODES, ENV, "the choice file: offer, then restore exactly the leader's choice"),
    Says(SAY_VAR, "variable", TO_NODES, ENV, "PBS: the said directory"),
    Says(f"{_NODES}/{LINK_FILE}", "file", TO_NODES, FILES, "where the line listens, and its token (0600)"),
    Says(f"{_NODES}/{CHOICE_PREFIX}<pid>-<ns>.json", "file", TO_NODES, FILES,
         "the version every node restores, its round, whether it stands"),
    Says(f"{_NODES}/node-K/{OFFER_FILE}", "file", TO_LEADER, FILES, "what node K holds before the leader chooses"),
    Says(f"{_NODES}/{SAID_PREFIX}<pid>-<ns>/{SAID_FILE}K", "file", TO_LEADER, FILES,
         "PBS: node K's lines, appended"),
    Says(f"{_NODES}/node-K/{LOCK_FILE}", "file", "node K's agent → a second one", FILES,
         "held (flock) by node K's running agent: a second one says `duplicate` and exits"),
    Says(f"{_NODES}/{STORE_KEYS_FILE}", "file", TO_NODES, FILES, "how the leader reached each object store (0600)",
         spelled="config.py"),
    Says(NODES_FLUSH, "request", TO_NODES, LINE_AND_JOURNALS,
         "`request`, `reason`, `exited` (`nodes` in the journal): one last pass each, now"),
    Says(NODE_FLUSH, "answer", TO_LEADER, LINE_AND_JOURNALS, "the same `request`; `ok`, `not_durable` (`pairs` in the journal)"),
    Says(NODES_SIGNAL, "request", TO_NODES, LINE_AND_JOURNALS,
         "PBS: `request`, `signal` (`nodes` in the journal): send it to the ranks there"),
    Says(NODE_SIGNAL, "answer", TO_LEADER, LINE_AND_JOURNALS, "the same `request`; the `pids` signalled"),
    Says(END, "event", TO_NODES, JOURNALS, "the leader ended: each agent's last flush, then its own end", own=False),
    Says(".supervise-parts/<checkpoint>/node-K/", "file", TO_LEADER, PARTS, "node K's files of the checkpoint",
         spelled="sync/_parts.py"),
    Says(".supervise-parts/<checkpoint>/node-K.json", "file", TO_LEADER, PARTS,
         "node K's manifest, written last: its part is there", spelled="sync/_parts.py"),
    Says(".supervise-parts/<checkpoint>/complete-on-node-0", "file", TO_NODES, PARTS,
         "node 0 saw the checkpoint complete: a directory part goes without `settle`", spelled="sync/_parts.py"),
)
