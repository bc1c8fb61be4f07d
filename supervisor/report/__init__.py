"""``supervise report RUN_DIR [--json] [--html FILE]``: the story of a run, after the job.

Reads only the run directory (``events.jsonl``, ``gpu.csv``, ``host.csv``), never the live
process, so it works on a finished run, a requeued one, a run still in progress and a
journal whose last line was torn by a SIGKILL. The sample files are streamed once in
bounded memory (see ``_load``). Text, JSON and HTML are three views of one set of facts
(``_facts``); the notes (``_notes``) say what to change in the job script. The plotting
library is imported only for ``--html``, so the agent stays light to import.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from supervisor.journal import EVENTS_FILE
from supervisor.report._facts import Facts, build
from supervisor.report._load import RunData, load
from supervisor.report._notes import notes

__all__ = ["main", "facts_of", "to_json"]


class ReportError(Exception):
    """A run directory that cannot be reported on: one line for stderr, exit status 2."""


def facts_of(run_dir: Path) -> tuple[Facts, RunData]:
    """Read ``run_dir`` and derive every fact and note from it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory")
    events = run_dir / EVENTS_FILE
    if not events.is_file():
        raise ReportError(f"{run_dir}: no {EVENTS_FILE} here, so not a supervise run directory")
    if not os.access(events, os.R_OK):
        raise ReportError(f"{events}: not readable")
    try:
        data = load(run_dir)
    except OSError as e:
        raise ReportError(f"{run_dir}: cannot read it: {e.strerror or e}") from None
    try:
        f = build(data)
        f.notes = notes(f)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, ZeroDivisionError, IndexError) as e:
        # Events are typed on loading; a value that still does not fit (a hand-edited journal)
        # is one line, never a traceback.
        raise ReportError(f"{events}: an event the report cannot read ({type(e).__name__}: {e})") from None
    return f, data


def to_json(f: Facts) -> dict[str, Any]:
    return {"schema": 1, **dataclasses.asdict(f)}


def main(run_dir: Path, *, as_json: bool = False, html: Path | None = None) -> int:
    """The CLI's entry point: 0 on success, 2 with one line on stderr when it cannot report."""
    try:
        f, data = facts_of(run_dir)
        if html is not None:
            from supervisor.report._html import write_html  # plotly is needed only here

            write_html(f, data, Path(html))
    except ReportError as e:
        print(f"supervise report: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"supervise report: --html needs the plotting library: pip install 'supervise-hpc[report]' ({e})", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"supervise report: cannot write {html}: {e.strerror or e}", file=sys.stderr)
        return 2
    if as_json:
        sys.stdout.write(json.dumps(to_json(f), indent=1, ensure_ascii=False) + "\n")
    else:
        from supervisor.report._text import render

        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        sys.stdout.write(render(f, colour=colour))
        if html is not None:
            print(f"HTML report: {html}")
    return 0
