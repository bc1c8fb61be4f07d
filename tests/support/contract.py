"""The journal/notification contract of a whole test run: what docs/ document, and what the real
``supervise`` runs of the tests produced (tests/test_contract.py; checked by tests/conftest.py
once a whole run is done)."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

from tests.support.paths import ROOT

DOCS = ROOT / "docs"


# Defensive paths no real run can be steered into from a test; each is covered by a unit test of its part.
NOT_END_TO_END = {
    "orphans-killed": "stop-child already SIGKILLs every process of the tree; this is the check after it "
                      "(test_signals.py's detached grandchild is killed by stop-child itself)",
    "host-error": "host.csv cannot be written (the run directory's disk failed under the sampler): "
                  "tests/test_host.py",
    "part-failed": "a part raising where none is expected (each part journals its own errors); "
                   "tests/core/test_conductor.py breaks the child's wait instead",
    "sync-watch-failed": "watchfiles ends or raises (inotify limits): tests/sync",
    "peer-copy-failed": "a partner node that refuses or does not answer while the training saves (a node agent "
                        "not up yet, a dead node before the leader ends the attempt): tests/sync/test_ring.py",
}


def documented(first_cell: str, pages: list[Path] | None = None) -> set[str]:
    """Backticked names in the first column of markdown tables whose header's first cell is ``first_cell``."""
    names: set[str] = set()
    for page in pages or sorted(DOCS.glob("*.md")):
        inside = False
        for line in page.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
            if not cells:
                inside = False
                continue
            if cells[0] == first_cell:
                inside = True
                continue
            if inside:
                names |= set(re.findall(r"`([a-z][a-z0-9-]*)`", cells[0]))
    return names


JOURNAL_READ_MAX = 64 << 20  # the largest journal a test's supervise writes is well under 1 MiB


def journal_kinds(base: Path) -> tuple[set[str], set[str]]:
    """The journal kinds, and the notified events, that real supervise runs under ``base`` wrote."""
    kinds: set[str] = set()
    notices: set[str] = set()
    for journal in base.rglob("events.jsonl"):
        # Only a real supervise's journal: a regular file, not a link, of a sane size. The tests
        # plant hostile ones (a link to /dev/zero, a FIFO, 200 MB of spaces: tests/report/test_fleet.py)
        # that would read forever or block (CI, stop 28: this check was OOM-killed at 24 GB).
        try:
            st = journal.lstat()
            if not stat.S_ISREG(st.st_mode) or st.st_size > JOURNAL_READ_MAX:
                continue
            lines = journal.read_text(errors="replace").splitlines()
        except OSError:
            continue
        if not lines or '"kind":"start"' not in lines[0] and '"kind":"node-start"' not in lines[0]:
            continue  # a journal a unit test wrote by hand, not a real supervise's
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("kind"), str):
                kinds.add(event["kind"])
                if event["kind"] == "notify" and isinstance(event.get("event"), str):
                    notices.add(event["event"])
    return kinds, notices
