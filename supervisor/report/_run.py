"""One run directory read into its facts: the step both the single-run report and the fleet
view (``_fleet``) take, so a row of the fleet and the run's own report cannot disagree."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from supervisor.journal import EVENTS_FILE
from supervisor.report._facts import Facts, build
from supervisor.report._load import RunData, load
from supervisor.report._nodes import node_rows
from supervisor.report._notes import notes


class ReportError(Exception):
    """A run directory that cannot be reported on: one line for stderr, exit status 2."""


def facts_of(run_dir: Path, *, samples: bool = True) -> tuple[Facts, RunData]:
    """Read ``run_dir`` and derive every fact and note from it. ``samples=False`` reads only the
    GPU indices from the head of ``gpu.csv`` (the fleet view: the journal carries every figure
    it shows, and streaming a thousand sample files would not fit its time budget)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory")
    events = run_dir / EVENTS_FILE
    if not events.is_file():
        raise ReportError(f"{run_dir}: no {EVENTS_FILE} here, so not a supervise run directory")
    if not os.access(events, os.R_OK):
        raise ReportError(f"{events}: not readable")
    try:
        data = load(run_dir, samples=samples)
    except OSError as e:
        raise ReportError(f"{run_dir}: cannot read it: {e.strerror or e}") from None
    except (UnicodeDecodeError, ValueError, RecursionError, MemoryError) as e:
        raise ReportError(f"{events}: cannot read it ({type(e).__name__})") from None
    try:
        f = build(data)
        f.nodes = node_rows(run_dir, data.journal.events, samples=samples)
        f.notes = notes(f)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, ZeroDivisionError, IndexError) as e:
        # Events are typed on loading; a value that still does not fit (a hand-edited journal)
        # is one line, never a traceback.
        raise ReportError(f"{events}: an event the report cannot read ({type(e).__name__}: {e})") from None
    return f, data


def to_json(f: Facts) -> dict[str, Any]:
    return {"schema": 1, **dataclasses.asdict(f)}
