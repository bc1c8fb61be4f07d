"""Sample files written in batches: bounded memory for week-long runs, few small writes.

Rows are kept in memory until ``max_rows`` or ``max_age`` seconds, then appended in one
write (the caller does that in a worker thread: the run directory may be on a slow
parallel file system). A requeued attempt appends to the same file; a torn last line
left by a SIGKILLed writer is ended first, and a file with another header is set aside
rather than mixed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3f}".rstrip("0").rstrip(".") if v == v else ""
    return str(v)


class BatchWriter:
    """Appends lines to ``path``; ``header`` lines are written once per file."""

    def __init__(self, path: Path, header: Sequence[str], *, max_rows: int = 256, max_age: float = 30.0,
                 rewrite_header_on_open: bool = False) -> None:
        self.path = Path(path)
        self.header = list(header)
        self.max_rows = max_rows
        self.max_age = max_age
        self._rewrite = rewrite_header_on_open
        self._buf: list[str] = []
        self._since = time.monotonic()
        self._opened = False
        self.rows_written = 0

    def add(self, line: str) -> None:
        if not self._buf:
            self._since = time.monotonic()
        self._buf.append(line)

    def due(self) -> bool:
        return len(self._buf) >= self.max_rows or (bool(self._buf) and time.monotonic() - self._since >= self.max_age)

    def pending(self) -> int:
        return len(self._buf)

    def _prepare(self) -> str:
        """What to write before the first batch: header and/or a newline ending a torn line."""
        self._opened = True
        head = "".join(h + "\n" for h in self.header)
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return head
        if size == 0:
            return head
        with open(self.path, "rb") as f:
            first = f.readline().decode("utf-8", "replace")
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
        if self.header and first.rstrip("\n") != self.header[0]:
            # Written by another version: keep it, under another name, and start afresh.
            n = 1
            while self.path.with_name(f"{self.path.name}.{n}").exists():
                n += 1
            self.path.rename(self.path.with_name(f"{self.path.name}.{n}"))
            return head
        return ("\n" if torn else "") + (head if self._rewrite else "")

    def flush(self) -> None:
        """Append the buffered lines (blocking: call it off the event loop)."""
        lines, self._buf = self._buf, []
        prefix = "" if self._opened else self._prepare()
        if not lines and not prefix:
            return
        from supervisor.journal import open_own_file

        # O_NOFOLLOW, ours only (issue 14): a sticky run directory lets others plant names
        with open(open_own_file(self.path), "a", encoding="utf-8") as f:
            f.write(prefix + "".join(line + "\n" for line in lines))
        self.rows_written += len(lines)


class CsvWriter(BatchWriter):
    """A CSV file with one header row; values are numbers or plain words (no quoting needed)."""

    def __init__(self, path: Path, columns: Sequence[str], **kw: Any) -> None:
        super().__init__(path, [",".join(columns)], **kw)
        self.columns = list(columns)

    def add_row(self, row: dict[str, Any]) -> None:
        self.add(",".join(_fmt(row.get(c)).replace(",", ";") for c in self.columns))
