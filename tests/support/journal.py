"""A run's journal as the tests read it."""

from __future__ import annotations

from pathlib import Path

from supervisor.journal import read_journal


def events(run_or_path: Path, kind: str | None = None) -> list[dict]:
    """The good events of a journal (a run directory, or its ``events.jsonl``), of one ``kind``
    or all; none where there is no journal yet. A torn last line (a killed writer) is left out."""
    return [e for e in read_journal(run_or_path).events if kind is None or e.get("kind") == kind]
