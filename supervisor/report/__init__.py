"""``supervise report RUN_DIR [--json] [--html FILE]``: the story of a run, after the job.
``supervise report DIR…`` (several paths, a folder of run directories, a glob): the fleet
view, one row per run (``main_many``, ``_fleet``).

Reads only the run directory (``events.jsonl``, ``gpu.csv``, ``host.csv``), never the live
process, so it works on a finished run, a requeued one, a run still in progress and a
journal whose last line was torn by a SIGKILL. The sample files are streamed once in
bounded memory (see ``_load``). Text, JSON and HTML are three views of one set of facts
(``_facts``); the notes (``_notes``) say what to change in the job script. The plotting
library is imported only for ``--html``, so the agent stays light to import.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Sequence

from supervisor.report._run import ReportError, facts_of, to_json

__all__ = ["main", "main_many", "facts_of", "to_json", "ReportError"]


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


def is_one_run(path: str) -> bool:
    """Does ``supervise report PATH`` mean today's single-run report? Yes for a run directory,
    and for a path that is none and holds none (the single-run report says why, exit 2); a
    folder with run directories below it, or a glob, is the fleet view."""
    from supervisor.report import _fleet

    p = Path(path)
    if _fleet.has_magic(path):
        return False
    if not p.is_dir() or (p / "events.jsonl").exists():
        return True
    found, _ = _fleet.discover([path])
    return not found


def main_many(paths: Sequence[str], *, as_json: bool = False, html: Path | None = None, since: str | None = None,
              states: Sequence[str] = (), sort: str = "start", jobs: int | None = None) -> int:
    """``supervise report DIR…`` over many run directories (``_fleet``): 0 on success, 2 with one
    line on stderr for a bad option or an HTML file that cannot be written. A run directory that
    cannot be read is a row that says so, never a failure of the whole report."""
    from supervisor.report import _fleet

    if sort not in _fleet.SORTS:
        print(f"supervise report: --sort {sort}: expected one of {', '.join(sorted(_fleet.SORTS))}", file=sys.stderr)
        return 2
    try:
        cutoff = _fleet.parse_since(since) if since is not None else None
    except ValueError as e:
        print(f"supervise report: --since {since}: expected {e}", file=sys.stderr)
        return 2
    doc = _fleet.collect(paths, since=cutoff, states=[s for v in states for s in v.split(",")], sort=sort, jobs=jobs)
    if html is not None:
        try:
            from supervisor.report._fleet_html import write_fleet_html  # plotly is needed only here

            write_fleet_html(doc, Path(html))
        except ImportError as e:
            print(f"supervise report: --html needs the plotting library: pip install 'supervise-hpc[report]' ({e})",
                  file=sys.stderr)
            return 2
        except OSError as e:
            print(f"supervise report: cannot write {html}: {e.strerror or e}", file=sys.stderr)
            return 2
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    else:
        import shutil

        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        width = shutil.get_terminal_size((160, 24)).columns if sys.stdout.isatty() else 160
        sys.stdout.write(_fleet.render(doc, colour=colour, width=width))
        if html is not None:
            print(f"HTML report: {html}")
    return 0
